# SPDX-License-Identifier: BSD-3-Clause
"""The Blackwell (sm_100 family) backend of ``fp4_gemm`` and of the W4A4 grouped GEMM: the
template kernels ``blockwise_gemm_fp4`` and ``blockwise_grouped_gemm_fp4`` (installed beside this
package), through their ``gemm`` and ``grouped_gemm`` launchers."""

from __future__ import annotations

import torch

from fp4_ops.layout import DSL_DTYPE_NAMES, SCALE_DTYPES, from_blocked, to_blocked


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


def contiguous_rows(offsets: torch.Tensor, rows: int, tile_m: int):
    """Where rows grouped by ``offsets`` (int32 [G + 1] on the device, group g's rows at
    offsets[g] .. offsets[g + 1] - 1) sit in the Blackwell grouped kernel's contiguous layout,
    each group padded to whole tiles of ``tile_m`` rows: (row_map int64 [rows], the padded row
    of each row; tile_group int32 [tiles]; num_m_tiles int32 [1]; tiles). ``tiles`` bounds the
    tiles in use for every routing of ``rows`` rows, so it is known on the host: no sync."""
    num_groups = offsets.shape[0] - 1
    counts = offsets[1:] - offsets[:-1]
    group_tiles = (counts + (tile_m - 1)) // tile_m
    tile_ends = torch.cumsum(group_tiles, 0, dtype=torch.int32)
    # (ceil(a) + ceil(b) <= ceil(a + b) + 1: the at most min(G, rows) groups with rows take
    # at most ceil(rows / tile_m) + min(G, rows) - 1 tiles)
    tiles = -(-rows // tile_m) + max(min(num_groups, rows) - 1, 0)
    tile_ids = torch.arange(tiles, dtype=torch.int32, device=offsets.device)
    tile_group = torch.searchsorted(tile_ends, tile_ids, right=True, out_int32=True)
    # (tiles past num_m_tiles are not read; clamped so that every entry names a group)
    tile_group = tile_group.clamp_(max=num_groups - 1)
    row_ids = torch.arange(rows, dtype=torch.int32, device=offsets.device)
    row_group = torch.searchsorted(offsets[1:].contiguous(), row_ids, right=True)
    group_start = (tile_ends - group_tiles).long() * tile_m - offsets[:-1].long()
    row_map = group_start.index_select(0, row_group) + row_ids
    return row_map, tile_group, tile_ends[-1:], tiles


def grouped_gemm_for_ops(a, a_scale, b, b_scale, alpha, offsets, sf_vec_size, out_dtype):
    """W4A4 grouped GEMM on the Blackwell grouped kernel: packed a [rows, K/2] (blocked scales
    of its rows), b [G, N, K/2] (blocked scales per group), alpha float32 [G], offsets int32
    [G + 1] on the device -> D [rows, N] contiguous. The rows are copied into the kernel's
    contiguous layout (``contiguous_rows``) and D's rows gathered back, on the device."""
    import blockwise_gemm_fp4
    import blockwise_grouped_gemm_fp4 as grouped

    (rows, half), (num_groups, n, _) = a.shape, b.shape
    k_scales = 2 * half // sf_vec_size
    config = grouped.grouped_config(n, sf_vec_size, DSL_DTYPE_NAMES[out_dtype])
    tile_m = config.mma_tiler_mn[0]
    row_map, tile_group, num_m_tiles, tiles = contiguous_rows(offsets, rows, tile_m)
    padded_rows = tiles * tile_m
    # (padding rows: zero codes and scales, so the kernel reads only initialised memory)
    a_padded = a.new_zeros((padded_rows, half), dtype=torch.uint8)
    a_padded.index_copy_(0, row_map, a.view(torch.uint8))
    sfa = from_blocked(a_scale.reshape(-1), rows, k_scales).view(torch.uint8)
    sfa_padded = sfa.new_zeros((padded_rows, k_scales)).index_copy_(0, row_map, sfa)
    sf_dtype = SCALE_DTYPES[sf_vec_size]
    sfa_blocked = to_blocked(sfa_padded).view(sf_dtype)
    sfb_blocked = b_scale.contiguous().view(sf_dtype).reshape(num_groups, -1)
    b = b.view(torch.uint8)
    d = blockwise_gemm_fp4.empty_d(1, padded_rows, n, config.c_dtype, a.device)[0]
    alpha = alpha.float().reshape(num_groups).contiguous()
    operands = (a_padded, b, sfa_blocked, sfb_blocked, alpha, tile_group, num_m_tiles, d)
    grouped.grouped_gemm(*operands, config)
    return d.index_select(0, row_map)
