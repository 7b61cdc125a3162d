# SPDX-License-Identifier: BSD-3-Clause
"""The Blackwell (sm_100 family) backend of ``fp4_gemm``: the template kernel
``blockwise_gemm_fp4`` (installed beside this package), through its ``gemm`` launcher."""

from __future__ import annotations

import torch

from fp4_ops.layout import DSL_DTYPE_NAMES, SCALE_DTYPES


def gemm_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype):
    """Packed a [L, M, K/2] and b [L, N, K/2] (or [M, K/2] and [N, K/2]: D [M, N]), their
    blocked scales contiguous in any shape, alpha a one-element fp32 device tensor that the
    kernel reads when it runs (no host sync) -> D [L, M, N] (or [M, N]) contiguous (a copy only
    where N leaves the kernel's rows padded to 16 bytes)."""
    import blockwise_gemm_fp4

    batched = a.dim() == 3
    l = a.shape[0] if batched else 1  # noqa: E741
    (m, half), n = a.shape[-2:], b.shape[-2]
    a, b = a.view(torch.uint8).reshape(l, m, half), b.view(torch.uint8).reshape(l, n, half)
    d = blockwise_gemm_fp4.empty_d(l, m, n, DSL_DTYPE_NAMES[out_dtype], a.device)
    sf_dtype = SCALE_DTYPES[sf_vec_size]
    sfa = sfa.contiguous().view(sf_dtype).reshape(l, -1)
    sfb = sfb.contiguous().view(sf_dtype).reshape(l, -1)
    blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1), d)
    d = d if d.is_contiguous() else d.contiguous()
    return d if batched else d[0]
