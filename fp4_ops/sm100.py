# SPDX-License-Identifier: BSD-3-Clause
"""The Blackwell (sm_100 family) backend of ``fp4_gemm``: the template kernel
``blockwise_gemm_fp4`` (installed beside this package), through its ``gemm`` launcher."""

from __future__ import annotations

from fp4_ops.layout import DSL_DTYPE_NAMES, SCALE_DTYPES


def gemm_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype):
    """Packed uint8 a [L, M, K/2] and b [L, N, K/2], blocked scales [L, n], alpha a 0-d fp32
    device tensor that the kernel reads when it runs (no host sync) -> D [L, M, N] contiguous
    (a copy only where N leaves the kernel's rows padded to 16 bytes)."""
    import blockwise_gemm_fp4

    (l, m, _), n = a.shape, b.shape[1]  # noqa: E741
    d = blockwise_gemm_fp4.empty_d(l, m, n, DSL_DTYPE_NAMES[out_dtype], a.device)
    sf_dtype = SCALE_DTYPES[sf_vec_size]
    sfa, sfb = sfa.contiguous().view(sf_dtype), sfb.contiguous().view(sf_dtype)
    blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1), d)
    return d if d.is_contiguous() else d.contiguous()
