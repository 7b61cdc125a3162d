# SPDX-License-Identifier: BSD-3-Clause
"""The Blackwell (sm_100 family) backend of ``fp4_gemm`` and of the W4A4 grouped GEMM: the
template kernels ``blockwise_gemm_fp4`` and ``blockwise_grouped_gemm_fp4`` (installed beside this
package), through their ``gemm`` and ``grouped_gemm`` launchers."""

from __future__ import annotations

import torch

from fp4_ops import moe_kernels
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


def grouped_gemm_for_ops(a, a_scale, b, b_scale, alpha, offsets, sf_vec_size, out_dtype):
    """W4A4 grouped GEMM on the Blackwell grouped kernel: packed a [rows, K/2] (blocked scales
    of its rows), b [G, N, K/2] (blocked scales per group), alpha float32 [G], offsets int32
    [G + 1] on the device -> D [rows, N] contiguous. The rows are copied into the kernel's
    tile-padded layout by one kernel (``moe_kernels.pad_rows``) and D's rows gathered back,
    on the device."""
    import blockwise_gemm_fp4
    import blockwise_grouped_gemm_fp4 as grouped

    (rows, half), (num_groups, n, _) = a.shape, b.shape
    if rows == 0:
        return torch.empty((0, n), dtype=out_dtype, device=a.device)
    config = grouped.grouped_config(n, sf_vec_size, DSL_DTYPE_NAMES[out_dtype])
    padded = moe_kernels.pad_rows(
        a, a_scale, offsets, config.mma_tiler_mn[0], 2 * half // sf_vec_size
    )
    sf_dtype = SCALE_DTYPES[sf_vec_size]
    sfb_blocked = b_scale.contiguous().view(sf_dtype).reshape(num_groups, -1)
    d = blockwise_gemm_fp4.empty_d(1, padded.codes.shape[0], n, config.c_dtype, a.device)[0]
    alpha = alpha.float().reshape(num_groups).contiguous()
    operands = (padded.codes, b.view(torch.uint8), padded.scale.view(sf_dtype), sfb_blocked, alpha)
    grouped.grouped_gemm(*operands, padded.tile_group, padded.num_m_tiles, d, config)
    return d.index_select(0, padded.row_map)
