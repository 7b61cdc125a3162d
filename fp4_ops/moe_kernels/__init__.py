# SPDX-License-Identifier: BSD-3-Clause
"""The MoE layer's kernels around its grouped GEMMs, for CUDA tensors on any GPU the DSL targets:

    routing = route(topk_ids, num_experts, x)        # one CTA: offsets, the row order and
    rows = routing.rows                              #   (decode) x's rows in that order
    h = <grouped GEMM of rows against w13, routing.offsets>
    a = activate(h, activation, w13_bias, routing.expert_of)
    y = <grouped GEMM of a against w2, routing.offsets>
    out = combine_tokens(y, topk_weights, routing, w2_bias)

Three kernels (``routing``, ``activation``, ``combine``, one class a file) in place of the two
dozen small torch kernels the same steps take as torch ops. W4A4 layers quantize each GEMM's
rows (on Hopper straight into the exact BF16 values that the grouped kernel takes:
``fp4_ops.quantizer.quantize_exact_rows``); on the sm_100 family a fourth kernel, ``pad_rows``
(``padded_rows.py``), puts them in the Blackwell grouped kernel's tile-padded layout, in place
of about twenty torch kernels. Each is compiled once per process
and configuration (the frozen ``*Config`` dataclasses, with the device index the cache key) and
launched through TVM-FFI on the current stream, with no host synchronization. The callers
(``fp4_ops.moe``) check the operands and make their device current; these functions only
shape what the kernels take (rows copied where they are not contiguous and 16-byte aligned).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp4_ops.layout import ATOM_COLS, DSL_DTYPE_NAMES, blocked_numel
from fp4_ops.memory import aligned_rows, stream_handle

_IDS = {torch.int32: "Int32", torch.int64: "Int64"}


# the routing kernel's count slots live in shared memory (48 KB without an opt-in)
MAX_EXPERTS = 8191
# rows the routing CTA gathers itself (decode); more go through one grid-wide gather
GATHER_BYTES = 64 * 1024


def experts_cap(num_experts: int) -> int:
    """The routing kernel's count slots for E experts: a power of two > E, at least a warp."""
    return max(32, 1 << num_experts.bit_length())


@dataclass(frozen=True)
class RoutingConfig:
    ids_dtype: str  # a key of routing.IDS_DTYPES
    experts_cap: int  # experts_cap(E)
    x_dtype: str | None = None  # the rows' (gathered by the kernel), a key of dtypes.DTYPES

    def compile(self, options: str):
        from fp4_ops.moe_kernels import routing  # (the DSL: imported when a kernel is built)

        return routing.compile_routing(self.ids_dtype, self.experts_cap, options, self.x_dtype)


@dataclass(frozen=True)
class ActivationConfig:
    dtype: str  # h's and a's, a key of dtypes.DTYPES
    activation: str  # a key of gating.ACTIVATIONS
    bias_dtype: str | None

    def compile(self, options: str):
        from fp4_ops.moe_kernels import activation

        return activation.compile_activation(self.dtype, self.activation, self.bias_dtype, options)


@dataclass(frozen=True)
class CombineConfig:
    dtype: str  # y's and out's
    weights_dtype: str  # topk_weights'
    bias_dtype: str | None

    def compile(self, options: str):
        from fp4_ops.moe_kernels import combine

        return combine.compile_combine(self.dtype, self.weights_dtype, self.bias_dtype, options)


@dataclass(frozen=True)
class PaddedRowsConfig:
    tile_m: int  # the grouped kernel's MMA tile M, a multiple of 128
    groups_cap: int  # experts_cap(G)
    rows_per_cta: int  # pad_rows_per_cta(K)

    def compile(self, options: str):
        from fp4_ops.moe_kernels import padded_rows

        args = (self.tile_m, self.groups_cap, self.rows_per_cta, options)
        return padded_rows.compile_padded_rows(*args)


# (config, device index) -> (compiled kernel, its TVM-FFI function, the SM count)
_KERNELS: dict[tuple, tuple] = {}


def _function(config, device: torch.device):
    """(TVM-FFI function, SM count) of ``config`` on ``device``, compiled at its first use."""
    found = _KERNELS.get((config, device.index))
    if found is None:
        with torch.cuda.device(device):
            compiled = config.compile("--enable-tvm-ffi")
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        found = _KERNELS[config, device.index] = (compiled, compiled.__tvm_ffi_object__(), sm_count)
    return found[1], found[2]


@dataclass(frozen=True)
class Routing:
    """``route``'s outputs (int32 tensors on the ids' device; P = T * k pairs)."""

    offsets: torch.Tensor  # [E + 1]: expert e's rows are offsets[e] .. offsets[e + 1] - 1
    row_of: torch.Tensor  # [P]: the row of pair t * k + s
    token_of: torch.Tensor  # [P]: the token of each row
    expert_of: torch.Tensor  # [P]: the expert of each row (0 for a pair whose id is out of range)
    ok: torch.Tensor  # [1]: 1 if every id lies in [0, E)
    rows: torch.Tensor | None = None  # [P, H]: x[token_of[r]] for each row r (from route)


def route(topk_ids: torch.Tensor, num_experts: int, x: torch.Tensor) -> Routing:
    """The row order of the grouped GEMMs for contiguous ``topk_ids`` [T, k] (int32 / int64,
    CUDA) with E = ``num_experts``, and x [T, H]'s rows in it (gathered by the routing kernel
    up to ``GATHER_BYTES``, else by ``index_select``); ids out of range are flagged in ``ok``,
    not raised."""
    if num_experts > MAX_EXPERTS:
        raise ValueError(
            f"the CUDA MoE layer routes at most {MAX_EXPERTS} experts, got {num_experts}"
        )
    device = topk_ids.device
    pairs, top_k = topk_ids.numel(), topk_ids.shape[1]
    row_bytes = x.shape[1] * x.element_size()
    gather = pairs * row_bytes <= GATHER_BYTES and row_bytes % 16 == 0
    x_dtype = DSL_DTYPE_NAMES[x.dtype] if gather else None
    config = RoutingConfig(_IDS[topk_ids.dtype], experts_cap(num_experts), x_dtype)
    fn, _ = _function(config, device)
    indices = [torch.empty(num_experts + 1, dtype=torch.int32, device=device)]
    indices += [torch.empty(pairs, dtype=torch.int32, device=device) for _ in range(3)]
    ok = torch.empty(1, dtype=torch.int32, device=device)
    x = aligned_rows(x) if gather else x
    rows = torch.empty((pairs, x.shape[1]), dtype=x.dtype, device=device) if gather else x
    fn(
        topk_ids.data_ptr(),
        *(t.data_ptr() for t in (*indices, ok, x, rows)),
        (pairs, top_k, num_experts, x.shape[1]),
        stream_handle(device.index),
    )
    if not gather:
        rows = x.index_select(0, indices[2])
    return Routing(*indices, ok, rows)


def activate(h: torch.Tensor, name: str, bias, expert_of: torch.Tensor) -> torch.Tensor:
    """a [P, I] in h's dtype from h [P, 2I] (contiguous, I a multiple of 32), the activation
    ``name`` and the optional bias [E, 2I] of each row's expert."""
    rows, inter = h.shape[0], h.shape[1] // 2
    h = aligned_rows(h)
    bias = None if bias is None else aligned_rows(bias)
    bias_dtype = None if bias is None else DSL_DTYPE_NAMES[bias.dtype]
    fn, sm_count = _function(ActivationConfig(DSL_DTYPE_NAMES[h.dtype], name, bias_dtype), h.device)
    out = torch.empty((rows, inter), dtype=h.dtype, device=h.device)
    experts = 1 if bias is None else bias.shape[0]
    fn(
        h.data_ptr(),
        out.data_ptr(),
        (h if bias is None else bias).data_ptr(),
        expert_of.data_ptr(),
        (rows, inter, experts),
        sm_count,
        stream_handle(h.device.index),
    )
    return out


def combine_tokens(
    y: torch.Tensor, topk_weights: torch.Tensor, routes: Routing, bias
) -> torch.Tensor:
    """out [T, H] in y's dtype: each token's rows of y [P, H] (contiguous, H a multiple of
    32) plus the optional bias [E, H] of their experts, weighted by ``topk_weights`` [T, k]."""
    tokens, top_k = topk_weights.shape
    hidden = y.shape[1]
    weights = topk_weights.contiguous()
    y = aligned_rows(y)
    bias = None if bias is None else aligned_rows(bias)
    bias_dtype = None if bias is None else DSL_DTYPE_NAMES[bias.dtype]
    config = CombineConfig(DSL_DTYPE_NAMES[y.dtype], DSL_DTYPE_NAMES[weights.dtype], bias_dtype)
    fn, sm_count = _function(config, y.device)
    out = torch.empty((tokens, hidden), dtype=y.dtype, device=y.device)
    experts = 1 if bias is None else bias.shape[0]
    fn(
        y.data_ptr(),
        weights.data_ptr(),
        routes.row_of.data_ptr(),
        (y if bias is None else bias).data_ptr(),
        routes.expert_of.data_ptr(),
        out.data_ptr(),
        (tokens, top_k, hidden, experts),
        sm_count,
        stream_handle(y.device.index),
    )
    return out


@dataclass(frozen=True)
class PaddedRows:
    """``pad_rows``' outputs, on the rows' device."""

    codes: torch.Tensor  # uint8 [tiles * tile_m, K/2]: each group's rows, padded to whole tiles
    scale: torch.Tensor  # uint8, the blocked scales of those rows
    tile_group: torch.Tensor  # int32 [tiles]: the group of each tile
    num_m_tiles: torch.Tensor  # int32 [1]: the tiles in use
    row_map: torch.Tensor  # int32 [rows]: the padded row of each row


# bytes of codes a padding CTA copies in one unrolled batch of loads (padded_rows.py: 128
# threads x 8 vectors of 16 bytes)
PAD_CTA_BYTES = 16 * 1024


def pad_rows_per_cta(k: int) -> int:
    """Rows a padding CTA copies, for rows of K codes: the most (a power of two, 1 .. 32) whose
    codes fit PAD_CTA_BYTES, so that each thread's copy is one round trip to memory."""
    fit = max(PAD_CTA_BYTES * 2 // max(k, 1), 1)
    return min(32, 1 << (fit.bit_length() - 1))


def padded_tiles(rows: int, groups: int, tile_m: int) -> int:
    """The most tiles of ``tile_m`` rows that ``rows`` rows in ``groups`` groups fill, each
    group padded to whole tiles: ceil(rows / tile_m) + min(groups, rows) - 1 (ceil(a) +
    ceil(b) <= ceil(a + b) + 1, over the at most min(groups, rows) groups holding rows)."""
    return -(-rows // tile_m) + max(min(groups, rows) - 1, 0)


def pad_rows(data, scale, offsets, tile_m: int, k_scales: int) -> PaddedRows:
    """The Blackwell grouped kernel's tile-padded layout (``padded_rows.py``) of packed FP4
    rows ``data`` [rows >= 1, K/2] (K a multiple of 32) with blocked ``scale`` (``k_scales``
    columns), grouped by ``offsets`` int32 [G + 1] on the device: one launch, no host sync
    (the buffers hold ``padded_tiles`` tiles, the bound for every routing)."""
    (rows, half), groups = data.shape, offsets.shape[0] - 1
    if rows == 0 or half % 16:
        raise ValueError(f"pad_rows takes rows of a multiple of 32 codes, got {tuple(data.shape)}")
    if scale.numel() != blocked_numel(rows, k_scales):
        raise ValueError(
            f"pad_rows takes the blocked scales of {rows} rows x {k_scales} columns "
            f"({blocked_numel(rows, k_scales)} bytes), got {scale.numel()}"
        )
    device = data.device
    tiles = padded_tiles(rows, groups, tile_m)
    atoms_k = -(-k_scales // ATOM_COLS)
    codes = torch.empty((tiles * tile_m, half), dtype=torch.uint8, device=device)
    blocked = torch.empty(tiles * tile_m * atoms_k * ATOM_COLS, dtype=torch.uint8, device=device)
    tile_group = torch.empty(tiles, dtype=torch.int32, device=device)
    num_m_tiles = torch.empty(1, dtype=torch.int32, device=device)
    row_map = torch.empty(rows, dtype=torch.int32, device=device)
    data = aligned_rows(data.view(torch.uint8))
    scale = aligned_rows(scale.reshape(-1).view(torch.uint8))
    config = PaddedRowsConfig(tile_m, experts_cap(groups), pad_rows_per_cta(2 * half))
    fn, _ = _function(config, device)
    fn(
        offsets.data_ptr(),
        data.data_ptr(),
        scale.data_ptr(),
        codes.data_ptr(),
        blocked.data_ptr(),
        tile_group.data_ptr(),
        num_m_tiles.data_ptr(),
        row_map.data_ptr(),
        (groups, rows, 2 * half, atoms_k, tiles),
        stream_handle(device.index),
    )
    return PaddedRows(codes, blocked, tile_group, num_m_tiles, row_map)
