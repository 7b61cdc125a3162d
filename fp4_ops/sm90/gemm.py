# SPDX-License-Identifier: BSD-3-Clause
"""Persistent, warp-specialized NVFP4 / MXFP4 GEMM for Hopper (sm_90a; run on H200 and H100):
W4A4, and W4A16 (BF16 / F16 activations with FP4 weights).

What it computes
----------------
    D[m, n, l] = alpha * sum_k (A[m, k, l] * SFA[m, k // V, l]) * (B[n, k, l] * SFB[n, k // V, l])

with the operands of the Blackwell kernel (``blockwise_gemm_fp4.py``): A [M, K/2, L] and
B [N, K/2, L] packed FP4 bytes, K-major; SFA / SFB in the 128x4 blocked layout of
``fp4_ops.layout``; NVFP4 = Float8E4M3FN scales per 16 elements, MXFP4 = Float8E8M0FNU per
32; alpha the fp32 product of two scalars in device memory (e.g. the operands' two global
scales: no kernel ahead multiplies them); D BFloat16 / Float16 / Float32, row-major [M, N] per
batch (row pitch N). W4A16 (``a_dtype``): A is BF16 / F16 [M, K, L] without scales, and B went
through ``k_order.prepack_weights`` (each 64-wide k-block permuted once, so that the dequantized
weights come out in plain K order). Hopper has no FP4 tensor cores: FP4 is dequantized exactly
to F16 or BF16 (every e2m1 x scale product is representable; ``fp4_ops/sm90/dequant.py`` holds
the conversions) and the tensor cores run F16 / BF16 ``wgmma`` with FP32 accumulation, so D
equals the exact GEMM of ``reference.py`` (the test oracle) up to the order of the fp32 sums.

The two paths (picked by ``default_config``; docs/sm90_design.md has the evidence)
-----------------------------------------------------------------------------
    =======  =======  ==========================  ===========================================
    path     M        kernel A / kernel B          mainloop
    =======  =======  ==========================  ===========================================
    decode   <= 2048  weights / tokens: D^T        RS wgmma (A from registers): weights
                      = B A^T, tiles of 8..128     dequantized from SMEM into the A fragment;
                      tokens x 64 or 128 rows      split-K (pairs on 2x1 clusters) or K groups
    prefill  > 2048   A / B, both converted once   SS wgmma over 128 x 256 tiles, 2x1 clusters
                                                   multicasting the B tile
    =======  =======  ==========================  ===========================================
A prologue grid, ``convert_operands``, converts the FP4 SMEM operand(s) once per launch into F16
/ BF16 copies in the wgmma's K order (W4A16: the prefill weights only; its decode has none). The
GEMM is launched with programmatic dependent launch (PDL): on W4A4 decode its producer requests
the first stage's weights before ``griddepcontrol.wait`` (the prologue ahead waited for the
kernel before it), elsewhere it waits first; the consumers wait before they read alpha.
``tokens_converted`` (W4A4 decode) drops the prologue grid: the quantizer's tokens mode, the grid
ahead, wrote the tokens' copy after the same wait, so the weights requested early are final.

Warp roles (128 x (1 + row warpgroups x k_groups) threads)
----------------------------------------------------------
    warp 0       TMA producer: per stage, packed kernel A + scales (decode) or converted
                 kernel A (prefill), and converted kernel B (multicast on a prefill cluster)
    warps 1-3    idle: give their registers back to the consumers (``setmaxregister``)
    warps 4-     consumers, 1-2 warpgroups of 64 rows per K group: ``_mainloop_decode`` or
                 ``_mainloop_prefill``, then (K group 0) ``_epilogue``: split-K fix-up, * alpha,
                 TMA stores of (rows x 32) subtiles (direct stores: D's row pitch not 16 B)

Pipelines and barriers
----------------------
    ab_pipeline  PipelineTmaAsync, ``num_stages`` deep: producer -> consumers (of both CTAs of a
                 prefill cluster); a stage is freed once the wgmma that read it has completed.
                 K groups: group g reads the stages s with s % k_groups == g.
    d_pipeline   PipelineTmaStore: consumers -> TMA store unit, one buffer per subtile in flight
    NamedBarrierId.EPILOGUE / SPLITK_FIXUP / K_GROUP_REDUCE: consumer threads only;
    ExchangeBarrier: a decode 2x1 cluster's split 1 hands its partial to split 0
Every role walks the same static persistent schedule (``StaticTileScheduler``), so they agree
on the order of the work units (tile x K split) without talking.

Grouped (MoE experts; W4A16 decode path, ``grouped``)
-----------------------------------------------------
L = E experts of weights [E, N, K] against token rows [M, K]: expert e takes rows offsets[e] ..
offsets[e + 1] - 1 (E + 1 int32 in device memory) and alpha[e]. Units are dense over the groups'
token tiles (``group_tile``), which every role finds from the offsets after the PDL wait: an empty
group costs nothing; kernel B's TMA box starts at the group's first row, the stores end with it.
Split-K partials sit at a unit's token tile among all groups', under ``grouped_tiles``' bound.

Constraints (``check_fp4_gemm_config`` explains each refusal)
------------------------------------------------------------
* K % 32 == 0 (16-byte TMA rows of packed FP4); M, N, L >= 1, ragged M and N welcome.
* kernel tile rows 64 or 128, cols 8..256 (powers of two); split_k 1..16 on tiles at most 128
  wide; K groups 2..4 on decode tiles of <= 32 tokens; cluster (1, 1), or (2, 1) on prefill and
  on decode with split_k 2 and no K groups (the splits summed through DSMEM).
* |alpha| * ``acc_scale`` finite (F16 FP4 operands carry 2^-7 each: W4A4 NVFP4 decode |alpha| <
  2^114); every tensor, copy and scale array below 2^31 elements (grouped: per expert); MXFP4
  W4A16 needs BF16 activations (E8M0 exceeds F16).
* Operands contiguous and 16-byte aligned (TMA); the blocked scales' padding holds zeros, as
  ``fp4_ops.layout.to_blocked`` writes it. An E8M0 NaN scale (255) reads as +inf.

Run: ``python -m fp4_ops.sm90 --mnkl 8192,8192,8192,1`` (H200 / H100; ``--a_dtype BFloat16``
for W4A16, ``--compile_only`` on any machine).
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.nvgpu.warpgroup import OperandSource
from cutlass.cutlass_dsl import Int32, Int64, Uint32
from cutlass.tensor_utils import LayoutEnum

from fp4_ops.layout import blocked_scale_numel, round_up
from fp4_ops.sm90 import dequant as dq
from fp4_ops.sm90 import k_order

# NOTE: sm_90 limits: 227 KiB of dynamic SMEM per CTA, 228 KiB and 64K registers per SM.
SM90_SMEM_CAPACITY = 232448
SM90_SMEM_PER_SM = 233472
SM90_REGS_PER_SM = 65536
# H200 (and H100 SXM): 132 SMs; sizes the persistent grid when compiling without a GPU.
H200_SM_COUNT = 132
# The compile target and the GPUs (compute capabilities) its cubin runs on.
GPU_ARCHS = {"sm_90a": ((9, 0),)}
DEFAULT_GPU_ARCH = "sm_90a"

SF_FORMATS = {
    # sf_vec_size: (scale dtype name, format name)
    16: ("Float8E4M3FN", "NVFP4"),
    32: ("Float8E8M0FNU", "MXFP4"),
}
# A (activations): packed FP4 (W4A4) or BF16 / F16 (W4A16, weight-only FP4)
A_DTYPES = ("Float4E2M1FN", "BFloat16", "Float16")
W4A4 = A_DTYPES[0]
C_DTYPES = {"BFloat16": cutlass.BFloat16, "Float16": cutlass.Float16, "Float32": cutlass.Float32}
SF_DTYPES = {"Float8E4M3FN": cutlass.Float8E4M3FN, "Float8E8M0FNU": cutlass.Float8E8M0FNU}
PATHS = ("prefill", "decode")
VALID_TILE_ROWS = (64, 128)
VALID_TILE_COLS = (8, 16, 32, 64, 128, 256)
# shfl.sync segments of 4 lanes (a wgmma A-fragment quad: one row), source lane 0..3 in it
QUAD_SHUFFLE = ((32 - 4) << 8) | 3
WARP = 32
LOG_WARP = 5
# K elements per pipeline stage over packed FP4 (64 bytes per row) and per wgmma k-block.
K_TILE = 128
K_BLOCK = 64
# One 128x4 scale atom: 128 rows x 4 scale columns = 512 bytes.
SF_ATOM_ROWS = 128
SF_ATOM_COLS = 4
SF_ATOM_BYTES = 512
# NOTE: two decode CTAs of 128 weight rows hold 2 x 384 threads x 80 registers of the SM's
# 65536: a prologue CTA of 128 threads fits beside them only at <= 32 registers per thread.
DECODE_CONVERT_MAX_REGS = 32
# 16-byte chunks in one converted 64-wide k-block row (64 x 2 bytes)
CHUNKS_PER_KBLOCK = 8
# The kernel's offsets are 32-bit: every tensor, copy and scale array holds fewer elements.
OFFSET_LIMIT = 2**31
# W4A16 decode: a token tile of >= TOKEN_BOX_MIN_COLS rows with a quarter wholly past M is read
# in TOKEN_BOXES boxes, those past M loading its first again (docs/sm90_design.md, section 2)
TOKEN_BOXES = 4
TOKEN_BOX_MIN_COLS = 64
# Ring depth caps (docs/sm90_design.md): decode at most 6 stages; K groups 16, four per group.
MAX_STAGES = 12
DECODE_MAX_STAGES = 6
DECODE_K_GROUP_MAX_STAGES = 16
# default_config: consumer warpgroup groups of the one-wave K-group configuration
DECODE_K_GROUPS = 4
# ... W4A4 only where the pick's units stream at most this many k-tiles (docs/sm90_design.md)
W4A4_K_GROUP_MAX_UNIT_K_TILES = 16
# default_config: the fixed cost of a decode work unit (fix-up and store), in weight rows x
# k-tiles of 128 (docs/sm90_design.md)
UNIT_COST = 384
# default_config, W4A16 decode: the busiest SM's units count at least this much each (its CTAs
# share the issue slots; docs/sm90_design.md)
W4A16_SM_SHARE = 0.75
# default_config, W4A16 decode: picks whose busiest SM is within this fraction of the least
# count as tied, and the fewest units wins among them (docs/sm90_design.md)
W4A16_NEAR_TIE = 0.02
# default_config, W4A16 on 64-token tiles: a 64-row pick whose units stream at least this many
# k-tiles of 128 rows runs as 128 rows, split twice as far (docs/sm90_design.md)
W4A16_TALL_MIN_K_TILES = 32
# default_config, one tile of 65-128 tokens on 128 rows: a unit's end costs four UNIT_COST (a
# 4x larger fp32 tile), and its units keep at least this many k-tiles
WIDE_UNIT_COST = 4 * UNIT_COST
WIDE_MIN_K_TILES = 24
# ... W4A4 only where the busiest SM streams at least this many k-tiles, or where the caller
# runs the split on 2x1 clusters (split_pairs; docs/sm90_design.md)
W4A4_WIDE_MIN_SM_K_TILES = 48
# default_config: the decode path's K splits, each unit keeping at least MIN_UNIT_K_TILES k-tiles
DECODE_SPLITS = (1, 2, 3, 4, 6, 8)
MIN_UNIT_K_TILES = 8
# default_config: the decode path up to this M, the prefill path beyond it
DECODE_MAX_M = 2048
# NVFP4 on F16: each FP4 operand converted to F16 carries 2^-7, so D = acc * 2^14 * alpha
# (W4A4; W4A16: acc * 2^7 * alpha).  W4A16 NVFP4 weights in BF16 on decode carry 2^-8.
NVFP4_ACC_SCALE = 2.0**14
W4A16_F16_ACC_SCALE = 2.0**7
W4A16_BF16_ACC_SCALE = 2.0**8
FP32_MAX = (2.0 - 2.0**-23) * 2.0**127


class ExchangeBarrier(enum.IntEnum):
    """``split_cluster``'s mbarriers (``xchg_mbar``), each completing one phase per unit."""

    FULL = 0  # split 0: split 1's partial has landed in the ring (st.async bytes)
    FREE = 1  # split 1: split 0's consumer warps have done with the ring
    DONE = 2  # split 0: its consumer warps have read the partial; its producer may load again


class NamedBarrierId(enum.IntEnum):
    """Hardware named barriers (id 0 is __syncthreads)."""

    EPILOGUE = 1  # consumers: a D subtile is in SMEM (TMA store) / its buffer is free again
    SPLITK_FIXUP = 2  # consumers: split-K partial tile written / counter read
    K_GROUP_REDUCE = 3  # consumers (k_groups > 1): partials parked in SMEM / read back


def scale_column(j, q, sf_vec_size: int):
    """Scale column, within a k-tile, of 16-group q of 64-wide k-block j."""
    if sf_vec_size == 16:
        return j * 4 + q
    return j * 2 + q // 2


def blocked_sf_byte(row, col, atoms_k):
    """Byte of scale (row, col) in 128x4 atoms stored row-block-major with ``atoms_k`` atoms per
    row block (``fp4_ops.layout``): atom byte of (r, c) is (r % 32) * 16 + (r // 32 % 4) * 4 +
    c % 4.  Python or DSL integers."""
    atom = (row // SF_ATOM_ROWS) * atoms_k + col // SF_ATOM_COLS
    r = row % SF_ATOM_ROWS
    return atom * SF_ATOM_BYTES + (r % 32) * 16 + (r // 32) * 4 + col % SF_ATOM_COLS


def blocked_sf_word(batch, row, col0, row_blocks, atoms_k):
    """Byte of the aligned 32-bit word holding scale columns col0 - col0 % 4 .. + 3 of ``row``
    of batch ``batch`` in ``fp4_ops.layout.to_blocked``'s layout (``row_blocks`` x ``atoms_k``
    atoms per batch).  Python or DSL integers."""
    r = row % SF_ATOM_ROWS
    return (
        ((batch * row_blocks + row // SF_ATOM_ROWS) * atoms_k + col0 // SF_ATOM_COLS)
        * SF_ATOM_BYTES
        + (r % 32) * 16
        + (r // 32) * 4
    )


def split_k_range(split, k_tiles, split_k: int):
    """K-tiles [begin, end) of split ``split`` of ``split_k``: the first k_tiles % split_k splits
    get one more.  Python or DSL integers."""
    base = k_tiles // split_k
    extra = k_tiles % split_k
    begin = split * base + cutlass.min(split, extra)
    end = begin + base + (split < extra)
    return begin, end


def _tma_partition(atom, smem, gmem, box_modes: int, cta=0, cta_layout=None):
    """(TMA, stage) / (TMA, tile coordinates) views of a TMA copy whose box is the first
    ``box_modes`` modes of ``smem`` and ``gmem``: for one CTA, or CTA ``cta`` of a multicast."""
    return cpasync.tma_partition(
        atom,
        cta,
        cute.make_layout(1) if cta_layout is None else cta_layout,
        cute.group_modes(smem, 0, box_modes),
        cute.group_modes(gmem, 0, box_modes),
    )


def _swizzle64(offset):
    # NOTE: TMA / wgmma 64B swizzle on byte offsets from a 512B-aligned base.
    return offset ^ ((offset >> 3) & 0x30)


# ---------------------------------------------------------------------------------------------
# Configuration: the path, tile, split and K groups for a problem
# ---------------------------------------------------------------------------------------------
def default_config(
    m: int,
    n: int,
    k: int,
    l: int,  # noqa: E741
    num_sms: int = H200_SM_COUNT,
    path: str | None = None,
    allow_k_groups: bool = True,
    a_dtype: str = W4A4,
    *,
    grouped: bool = False,
    split_pairs: bool = False,
):
    """(path, mma_tiler_mn, split_k, k_groups) for a problem; ``path`` given: that path's
    tile, split and K groups; ``allow_k_groups`` False: the pick without K groups (the CLI's
    base when the tile or the split is given); ``split_pairs``: the caller runs the pick on 2x1
    clusters where ``split_cluster_fits`` (``GemmConfig.for_problem`` with nothing given).  The
    evidence for each rule: docs/sm90_design.md.

    * M <= DECODE_MAX_M (and a padded token copy within the 32-bit offsets): decode, token tile
      the next power of two >= M in 8..128.  Work units (tiles x K splits) are dealt statically
      to the persistent CTAs, so the tile rows (128 or 64 weight rows) and split (1, 2, 3, 4,
      6 or 8, keeping >= 8 k-tiles of 128 per unit) minimize the busiest CTA's work,
      ceil(units / CTA slots) x (rows x ceil(k-tiles / split) + UNIT_COST).  Ties go to fewer
      units, then to 128 rows for tiles of <= 32 tokens and 64 rows for wider ones.  Several
      token tiles (M > 128) take 128 rows, split only while the tiles leave CTA slots idle.
    * W4A16 (not ``grouped``) on 33-64 tokens: a 64-row pick split s runs as 128 rows split 2s
      (as many units, as many weights each) where 2s is one of DECODE_SPLITS and its units
      stream at least W4A16_TALL_MIN_K_TILES k-tiles.  The busiest-CTA search never offers
      these tiles: they cannot stage D for TMA stores, and store it directly.
    * One wave of K groups: where the units of that pick have <= W4A4_K_GROUP_MAX_UNIT_K_TILES
      k-tiles (W4A16: any length) and one CTA per 64 weight rows (x a K split) fills 3/4 of the
      SMs or more, at most all of them, a token tile of <= 32 tokens runs as 64-row tiles with
      DECODE_K_GROUPS groups of consumer warpgroups splitting K inside the CTA.
    * Larger M: prefill, 128 x 256 tiles on 2x1 clusters.
    * W4A16 (``a_dtype`` BFloat16 / Float16; no token copy to bound): its decode mainloop is
      issue-bound, so two CTAs on one SM share its issue slots: a unit counts at least
      W4A16_SM_SHARE x ceil(units / SMs) times; picks whose busiest CTA is within W4A16_NEAR_TIE
      of the least tie, and the fewest units wins, then the least cost (not ``grouped``); one
      wave of K groups is taken whatever the units' length.
    * One tile of 65-128 tokens takes 128 rows (two warpgroups convert) where units of at least
      WIDE_MIN_K_TILES k-tiles fill 3/4 of the SMs (W4A4: where its busiest SM streams
      at least W4A4_WIDE_MIN_SM_K_TILES, or with ``split_pairs`` where ``split_cluster_fits``);
      not ``grouped`` (``GemmConfig.for_groups`` bounds its splits by any routing's units).
    """
    cols = min(128, max(8, 1 << (m - 1).bit_length()))
    if path is None:
        # (W4A4: the decode path's padded token copy within the 32-bit offsets)
        token_copy = decode_token_rows(m, cols) * round_up(k, K_BLOCK) * l
        fits = token_copy < 2**31 or a_dtype != W4A4
        path = "decode" if m <= DECODE_MAX_M and fits else "prefill"
    if path != "decode":
        return path, (128, 256), 1, 1
    slots = num_sms * occupancy("decode", (cols, 128))
    k_tiles = math.ceil(k / K_TILE)
    if cols == 128 and m <= cols and not grouped:
        wide_split, sm_k_tiles = _wide_split(n, l, k_tiles, num_sms)
        # (W4A4: a short round loses to 64-row tiles unless the split's fix-up stays in a cluster)
        long = sm_k_tiles >= W4A4_WIDE_MIN_SM_K_TILES
        paired = split_pairs and split_cluster_fits(
            (m, n, k, l), (cols, 128), wide_split, 1, num_sms
        )
        if wide_split is not None and (a_dtype != W4A4 or long or paired):
            return "decode", (cols, 128), wide_split, 1
    w4a16_dense = a_dtype != W4A4 and not grouped
    picks = []
    for rows in VALID_TILE_ROWS[::-1]:
        if m > cols and rows != 128:
            # several token tiles: compute-bound, both consumer warpgroups needed
            continue
        tiles = math.ceil(m / cols) * math.ceil(n / rows) * l
        for split in DECODE_SPLITS:
            if split > 1 and (k_tiles // split < MIN_UNIT_K_TILES or (m > cols and tiles >= slots)):
                continue
            # (split 128-row tiles of 64 tokens store D directly: offered by _tall_w4a16 only)
            if not epilogue_staging_fits("decode", (cols, rows), split):
                continue
            units = tiles * split
            rounds = math.ceil(units / slots)
            if a_dtype != W4A4:
                rounds = max(rounds, W4A16_SM_SHARE * math.ceil(units / num_sms))
            busiest = rounds * (rows * math.ceil(k_tiles / split) + UNIT_COST)
            picks.append((busiest, units, rows != (64 if cols >= 64 else 128), rows, split))
    if w4a16_dense:
        # (the SM share makes near-ties between an unsplit wave and a split one)
        least = min(busiest for busiest, *_ in picks)
        near = [pick for pick in picks if pick[0] <= least * (1 + W4A16_NEAR_TIE)]
        picks = [(units, busiest, *rest) for busiest, units, *rest in near]
    *_, rows, split = min(picks)
    if w4a16_dense and cols == 64 and rows == 64:
        rows, split = _tall_w4a16(k_tiles, split)
    tiler = (cols, rows)
    short_units = math.ceil(k_tiles / split) <= W4A4_K_GROUP_MAX_UNIT_K_TILES
    if allow_k_groups and cols <= 32 and (short_units or a_dtype != W4A4):
        kg_split = _one_wave_k_group_split(n, l, k_tiles, num_sms)
        if kg_split is not None:
            return "decode", (cols, 64), kg_split, DECODE_K_GROUPS
    return "decode", tiler, split, 1


def _tall_w4a16(k_tiles: int, split: int) -> tuple[int, int]:
    """(rows, split) for a W4A16 pick of 64-row units split ``split`` on 64-token tiles: 128
    rows split twice as far (two converting warpgroups per CTA) where that split is one of
    DECODE_SPLITS and its units stream at least W4A16_TALL_MIN_K_TILES k-tiles; else as
    picked."""
    tall_split = 2 * split
    # (units of >= W4A16_TALL_MIN_K_TILES keep MIN_UNIT_K_TILES)
    if tall_split not in DECODE_SPLITS or math.ceil(k_tiles / tall_split) < W4A16_TALL_MIN_K_TILES:
        return 64, split
    return 128, tall_split


def _wide_split(n, l, k_tiles, num_sms):  # noqa: E741
    """``default_config``'s pick for one tile of 65-128 tokens, as (split, k-tiles its busiest
    CTA streams): the K split of 128-row tiles (two converting warpgroups, one CTA per SM)
    whose busiest CTA streams the least, among splits whose units fill 3/4 of the SMs or more
    with at least WIDE_MIN_K_TILES k-tiles each; a unit's end costs WIDE_UNIT_COST.  (None, 0)
    if no split qualifies."""
    tiles = math.ceil(n / 128) * l
    best = None
    for split in DECODE_SPLITS:
        units = tiles * split
        if units < 0.75 * num_sms or k_tiles // split < WIDE_MIN_K_TILES:
            continue
        rounds, longest = math.ceil(units / num_sms), math.ceil(k_tiles / split)
        busiest = rounds * (128 * longest + WIDE_UNIT_COST)
        if best is None or (busiest, units) < best[0]:
            best = ((busiest, units), split, rounds * longest)
    return (None, 0) if best is None else best[1:]


def _one_wave_k_group_split(n, l, k_tiles, num_sms):  # noqa: E741
    """``default_config``'s K groups: the first K split (1, 2, 3, 4, 6, 8) at which one CTA per
    64 weight rows and split fills between 3/4 of the SMs and all of them, with at least two
    k-tiles per group; None if there is none."""
    tiles = math.ceil(n / 64) * l
    for kg_split in DECODE_SPLITS:
        if k_tiles // kg_split < 2 * DECODE_K_GROUPS:
            return None
        if 0.75 * num_sms <= tiles * kg_split <= num_sms:
            return kg_split
    return None


def default_cluster(path: str) -> tuple[int, int]:
    """Prefill pairs two M tiles in a cluster that multicasts their common B tile (half the
    L2 -> SMEM traffic of B); decode runs without clusters but for ``split_cluster_fits``."""
    return (2, 1) if path == "prefill" else (1, 1)


def split_cluster_fits(mnkl, mma_tiler_mn, split_k: int, k_groups: int, num_sms: int) -> bool:
    """Whether ``default_config``'s decode pick runs its two K splits of each tile as one 2x1
    cluster, split 1's partial summed through distributed SMEM instead of the global fix-up:
    128-token x 128-row tiles split 2 without K groups, one tile per cluster, all clusters in
    one wave (docs/sm90_design.md, section 3)."""
    m, n, _, l = mnkl  # noqa: E741
    tile = kernel_tile("decode", mma_tiler_mn)
    if tile != (128, 128) or (split_k, k_groups) != (2, 1):
        return False
    # (decode's kernel rows are the weights' N, its cols the tokens)
    return output_tiles(n, m, l, *tile, 1)[2] <= num_sms // 2


def occupancy(path: str, mma_tiler_mn: tuple[int, int], k_groups: int = 1) -> int:
    """CTAs per SM: 2 for decode tiles of <= 64 tokens with up to two consumer warpgroups (their
    consumers fit in 104 registers), so that two CTAs hide each other's per-k-block latency
    (SMEM load -> convert -> wgmma); 1 otherwise (docs/sm90_design.md)."""
    rows, cols = kernel_tile(path, mma_tiler_mn)
    return 2 if path == "decode" and cols <= 64 and rows // 64 * k_groups <= 2 else 1


def kernel_tile(path: str, mma_tiler_mn: tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of the kernel tile: rows = register operand, cols = SMEM operand."""
    tm, tn = mma_tiler_mn
    return (tn, tm) if path == "decode" else (tm, tn)


def epilogue_staging_fits(path: str, mma_tiler_mn: tuple[int, int], split_k: int) -> bool:
    """Whether the consumers have the registers to stage D subtiles in SMEM for TMA stores.

    NOTE: not for split-K decode tiles of 128 weight rows x 64 tokens, whose consumers (104
    registers at two CTAs per SM) would spill the subtile staging next to the fix-up."""
    return not (path == "decode" and kernel_tile(path, mma_tiler_mn) == (128, 64) and split_k > 1)


def decode_token_rows(m, tile_cols):
    """Rows of decode's converted token copy: the M tokens rounded up to whole token tiles.

    NOTE: TMA boxes running past a tensor's last row are slow (docs/sm90_design.md); the padding
    rows are never written and reach only columns of D^T past M, which are not stored."""
    return round_up(m, tile_cols)


def blocked_sf_bytes(rows: int, k: int, l: int, sf_vec_size: int) -> int:  # noqa: E741
    """Bytes of one operand's scales in the 128x4 blocked layout, all batches."""
    return l * blocked_scale_numel(rows, k, sf_vec_size)


# ---------------------------------------------------------------------------------------------
# Configuration checks (readable reasons; an empty list means the configuration can run)
# ---------------------------------------------------------------------------------------------
def check_fp4_gemm_config(
    mnkl: tuple[int, int, int, int],
    sf_vec_size: int = 16,
    sf_dtype: str = "Float8E4M3FN",
    c_dtype: str = "BFloat16",
    path: str = "prefill",
    mma_tiler_mn: tuple[int, int] = (128, 256),
    cluster_shape_mn: tuple[int, int] = (2, 1),
    split_k: int = 1,
    k_groups: int = 1,
    a_dtype: str = W4A4,
) -> list[str]:
    """Check a configuration and a problem against this kernel's rules.

    Returns a list of readable reasons why it cannot run; an empty list means it can.  Pure
    Python: it needs neither a GPU nor a compile."""
    config = (path, mma_tiler_mn, cluster_shape_mn, split_k, k_groups, a_dtype)
    return problem_reasons(mnkl, sf_vec_size, path, mma_tiler_mn, a_dtype) + config_reasons(
        sf_vec_size, sf_dtype, c_dtype, *config
    )


def problem_reasons(
    mnkl: tuple[int, int, int, int],
    sf_vec_size: int,
    path: str,
    mma_tiler_mn: tuple[int, int],
    a_dtype: str = W4A4,
    grouped: bool = False,
) -> list[str]:
    """The problem (M, N, K, L) part of ``check_fp4_gemm_config``: extents, K, 32-bit offsets.
    Grouped: M token rows of all L groups, so D and the activations hold M rows, not M x L."""
    if len(mnkl) != 4 or any(not isinstance(v, int) for v in mnkl):
        return [f"mnkl must be four integers M,N,K,L, got {mnkl!r}"]
    reasons = []
    m, n, k, l = mnkl  # noqa: E741
    for name, value in (("M", m), ("N", n), ("K", k), ("L", l)):
        if value < 1:
            reasons.append(f"{name} must be >= 1, got {value}")
    if k >= 1 and k % 32 != 0:
        reasons.append(
            f"K={k} is not a multiple of 32: a packed FP4 row of A and B must be a whole number "
            "of 16-byte TMA units (32 FP4 values)"
        )
    if min(m, n, k, l) < 1:
        return reasons
    # NOTE: tensor offsets are 32-bit: D, packed A and B, the blocked scales and the F16 / BF16
    # copies (K rounded up to 64; decode pads the token rows) each hold fewer than 2^31 elements.
    k_pad = round_up(k, K_BLOCK)
    extents = [("M*N*L", m * n * l), ("M*K/2*L", m * k // 2 * l), ("N*K/2*L", n * k // 2 * l)]
    if sf_vec_size in SF_FORMATS:
        for name, rows in (("SFA", m), ("SFB", n)):
            extents.append((f"{name} blocked bytes", blocked_sf_bytes(rows, k, l, sf_vec_size)))
    if grouped:
        # NOTE: the experts' weights and scales are read by TMA only, whose descriptor steps
        # from expert to expert in 64 bits: only one expert's must fit (its batch stride).
        sfb = blocked_sf_bytes(n, k, 1, sf_vec_size) if sf_vec_size in SF_FORMATS else 0
        extents = [("M*N", m * n), ("M*K", m * k), ("N*K_pad/2 (one expert)", n * k_pad // 2)]
        extents.append(("SFB blocked bytes (one expert)", sfb))
    elif a_dtype != W4A4:
        # W4A16: activations M*K*L, prepacked weights N*K_pad/2*L, converted on prefill
        extents[1] = ("M*K*L", m * k * l)
        extents[2] = ("N*K_pad/2*L", n * k_pad // 2 * l)
        if path == "prefill":
            extents.append(("N*K_pad*L (converted B)", n * k_pad * l))
    elif path == "prefill":
        extents.append(("M*K_pad*L (converted A)", m * k_pad * l))
        extents.append(("N*K_pad*L (converted B)", n * k_pad * l))
    elif path == "decode":
        m_pad = decode_token_rows(m, max(8, kernel_tile(path, mma_tiler_mn)[1]))
        extents.append((f"M_pad*K_pad*L (converted A, M_pad = {m_pad})", m_pad * k_pad * l))
    for name, extent in extents:
        if extent >= OFFSET_LIMIT:
            reasons.append(
                f"{name} = {extent} elements does not fit the kernel's 32-bit offsets "
                "(< 2^31); split the problem along M, N or L"
            )
    return reasons


def config_reasons(
    sf_vec_size: int,
    sf_dtype: str,
    c_dtype: str,
    path: str,
    mma_tiler_mn: tuple[int, int],
    cluster_shape_mn: tuple[int, int],
    split_k: int,
    k_groups: int = 1,
    a_dtype: str = W4A4,
) -> list[str]:
    """The configuration part of ``check_fp4_gemm_config`` (whatever the problem)."""
    reasons = []
    if a_dtype not in A_DTYPES:
        reasons.append(
            f"a_dtype={a_dtype} is not supported: use Float4E2M1FN (W4A4: FP4 activations with "
            "their scales) or BFloat16 / Float16 (W4A16: FP4 weights only)"
        )
    elif a_dtype == "Float16" and sf_vec_size == 32:
        # NOTE: E8M0 scales reach 2^-127 .. 2^127, beyond F16's range: not exact in F16.
        reasons.append(
            "a_dtype=Float16 with MXFP4 weights (sf_vec_size=32): E8M0 scales exceed Float16's "
            "range, so the weights cannot be dequantized exactly to F16; use BFloat16 activations"
        )
    if sf_vec_size not in SF_FORMATS:
        reasons.append(
            f"sf_vec_size={sf_vec_size} is not supported: use 16 (NVFP4, Float8E4M3FN scales) "
            "or 32 (MXFP4, Float8E8M0FNU scales)"
        )
    else:
        want_sf, fmt = SF_FORMATS[sf_vec_size]
        if sf_dtype not in SF_DTYPES:
            reasons.append(f"sf_dtype={sf_dtype} is not a scale-factor type ({list(SF_DTYPES)})")
        elif sf_dtype != want_sf:
            reasons.append(
                f"sf_dtype={sf_dtype} does not pair with sf_vec_size={sf_vec_size}: {fmt} uses "
                f"{want_sf} scales (NVFP4 = Float8E4M3FN x 16, MXFP4 = Float8E8M0FNU x 32)"
            )
    if c_dtype not in C_DTYPES:
        reasons.append(f"c_dtype={c_dtype} is not supported: use one of {list(C_DTYPES)}")
    if path not in PATHS:
        reasons.append(f"path={path} is not supported: use one of {list(PATHS)}")
        return reasons
    rows, cols = kernel_tile(path, mma_tiler_mn)
    if rows not in VALID_TILE_ROWS:
        what = "N (weight rows)" if path == "decode" else "M"
        reasons.append(
            f"MMA tile {what}={rows} is not supported: the register operand takes 64 or 128 "
            "rows (one or two consumer warpgroups of wgmma m64)"
        )
    if cols not in VALID_TILE_COLS:
        what = "M (tokens)" if path == "decode" else "N"
        reasons.append(
            f"MMA tile {what}={cols} is not supported: the SMEM operand takes "
            f"{list(VALID_TILE_COLS)} rows (wgmma N, and a divisor or multiple of the 128-row "
            "scale atom)"
        )
    reason = cluster_reason(path, tuple(cluster_shape_mn), split_k, k_groups)
    if reason:
        reasons.append(reason)
    if split_k < 1 or split_k > 16:
        reasons.append(f"split_k={split_k} is not supported: use 1..16")
    elif split_k > 1 and cols > 128:
        # NOTE: 128 fp32 accumulators per thread plus the fix-up's loads spill to local memory.
        reasons.append(
            f"split_k={split_k} with a {cols}-wide SMEM-operand tile: split-K needs tiles of "
            "at most 128 x 128"
        )
    reason = k_groups_reason(path, mma_tiler_mn, k_groups)
    if reason:
        reasons.append(reason)
    return reasons


def cluster_reason(path: str, cluster: tuple, split_k: int, k_groups: int) -> str | None:
    """Why ``cluster`` cannot run with this path, split and K groups, or None."""
    pair_ok = path == "prefill" or (path == "decode" and split_k == 2 and k_groups == 1)
    if cluster in ((1, 1), (2, 1)) and (cluster == (1, 1) or pair_ok):
        return None
    return (
        f"cluster shape {cluster} is not supported: this Hopper kernel takes (1, 1), or (2, 1) "
        "on the prefill path (two M tiles share one multicast B tile) and on decode with "
        "split_k=2 and no K groups (a tile's two K splits, summed through DSMEM)"
    )


def k_groups_reason(path: str, mma_tiler_mn: tuple[int, int], k_groups: int) -> str | None:
    """Why ``k_groups`` cannot run with this path and tile, or None."""
    if k_groups == 1:
        return None
    if k_groups < 1:
        return f"k_groups={k_groups} is not supported: use 1 (no K groups) or 2..4"
    rows, cols = kernel_tile(path, mma_tiler_mn)
    # NOTE: 640 threads per CTA at most (setmaxregister budgets), and the ring must hold at
    # least two stages per group next to the groups' parked accumulators.
    if path != "decode" or k_groups not in (2, 3, 4) or rows // 64 * k_groups > 4 or cols > 32:
        return (
            f"k_groups={k_groups} on the {path} path with a {rows} x {cols} kernel tile: "
            "K groups (2..4) run on the decode path, with tiles of at most 32 tokens and "
            "at most 4 consumer warpgroups (tile rows / 64 x k_groups)"
        )
    return None


def grouped_reason(grouped: bool, path: str, cluster: tuple, a_dtype: str) -> str | None:
    """Why the grouped kernel cannot run this way, or None (not grouped, or it can)."""
    if grouped and (a_dtype == W4A4 or path != "decode" or tuple(cluster) != (1, 1)):
        return (
            f"grouped with a_dtype={a_dtype}, path={path}, cluster {tuple(cluster)}: the grouped "
            "kernel runs W4A16 (BFloat16 / Float16 activations) on the decode path without "
            "clusters (its K splits sum through global memory)"
        )
    return None


def tokens_converted_reason(tokens_converted: bool, path: str, a_dtype: str) -> str | None:
    """Why the tokens' copy cannot come from the grid ahead, or None (it does not, or it can)."""
    if tokens_converted and (a_dtype != W4A4 or path != "decode"):
        return (
            f"tokens_converted with a_dtype={a_dtype} on the {path} path: only the W4A4 decode "
            "path reads a converted token copy that another grid can write"
        )
    return None


def acc_scale(sf_vec_size: int, path: str, a_dtype: str = W4A4) -> float:
    """The factor between the accumulator and alpha * sum: 2^7 per FP4 operand converted to F16
    (NVFP4 on the W4A4 decode path: both; W4A16 with F16 activations: the weights), 2^8 for
    W4A16 NVFP4 weights in BF16 on decode (``dequant.e4m3_low_factor``)."""
    if a_dtype != W4A4:
        if a_dtype == "Float16":
            return W4A16_F16_ACC_SCALE
        return W4A16_BF16_ACC_SCALE if sf_vec_size == 16 and path == "decode" else 1.0
    return NVFP4_ACC_SCALE if sf_vec_size == 16 and path == "decode" else 1.0


def alpha_reason(
    alpha: float, sf_vec_size: int, path: str = "decode", a_dtype: str = W4A4
) -> str | None:
    """Why ``alpha`` cannot be used, or None: it must be a finite fp32 number, and where the
    kernel runs F16 FP4 operands (``acc_scale``) its fp32 value times that scale too."""
    if not math.isfinite(alpha) or abs(alpha) > FP32_MAX:
        return f"alpha must be a finite fp32 number, got {alpha}"
    alpha32 = struct.unpack("f", struct.pack("f", alpha))[0]
    scale = acc_scale(sf_vec_size, path, a_dtype)
    if abs(alpha32) * scale > FP32_MAX:
        bound = 128 - int(math.log2(scale))
        return (
            f"NVFP4 here needs |alpha| < 2^{bound} (alpha * 2^{128 - bound} must stay finite), "
            f"got {alpha}"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Static persistent tile scheduler
# ---------------------------------------------------------------------------------------------
@dataclass
class StaticTileScheduler:
    """Work units (row tile, col tile, L x split_k) dealt statically to persistent clusters: unit
    u (row clusters fastest, then col tiles, then L x split_k) runs on cluster u mod the grid's
    clusters.  Built on the host (``create``), passed to the kernel as an argument."""

    num_units: Int32  # units (of clusters) in the problem
    row_clusters: cute.FastDivmodDivisorV2
    col_tiles: cute.FastDivmodDivisorV2

    @staticmethod
    def create(num_tiles, cluster_m: int, max_active_clusters: int):
        """(scheduler, grid) for (row tiles, col tiles, L x split_k) tiles on at most
        ``max_active_clusters`` clusters of ``cluster_m`` x 1 CTAs (host side)."""
        row_tiles, col_tiles, batches = num_tiles
        row_clusters = (row_tiles + cluster_m - 1) // cluster_m
        num_units = row_clusters * col_tiles * batches
        persistent = cutlass.min(num_units * cluster_m, max_active_clusters * cluster_m)
        grid = (cluster_m, 1, persistent // cluster_m)
        scheduler = StaticTileScheduler(
            num_units,
            cute.fast_divmod_create_divisor_v2(row_clusters),
            cute.fast_divmod_create_divisor_v2(col_tiles),
        )
        return scheduler, grid

    def first_unit(self):
        """This CTA's first unit (device side): its cluster's index in the grid."""
        return Int32(cute.arch.block_idx()[2])

    def next_unit(self, unit):
        return unit + Int32(cute.arch.grid_dim()[2])

    def is_valid(self, unit):
        return cutlass.Boolean(cute.arch.make_warp_uniform(unit < self.num_units))

    def coords(self, unit, cluster_m: int):
        """(row tile, col tile, L x split_k index) of ``unit`` for this CTA of its cluster."""
        rest, row_cluster = divmod(unit, self.row_clusters)
        lk, col_tile = divmod(rest, self.col_tiles)
        cta = Int32(cute.arch.block_idx()[0] % cluster_m)
        row_tile = row_cluster * Int32(cluster_m) + cta
        uniform = cute.arch.make_warp_uniform
        return uniform(row_tile), uniform(Int32(col_tile)), uniform(Int32(lk))


@cute.jit
def group_tile(tile: Int32, cursor: tuple, mOffsets: cute.Tensor, tile_cols: cutlass.Constexpr):
    """Grouped units, dense: (valid, group, token tile in the group, cursor) of token tile
    ``tile`` of all groups in group order, group e holding ceil(rows_e / ``tile_cols``) of them.

    Warp-collective: a warp sums 32 groups' tiles at a time from ``cursor`` = (the first group
    of a 32-group chunk, the tiles of the groups before it), which a warp's next call, for a
    larger ``tile``, passes back in: a call reads the cursor's chunk and the chunks it walks."""
    groups = cute.size(mOffsets) - 1
    base, before = cursor
    tiles, inclusive = _chunk_tiles(base, groups, mOffsets, tile_cols)
    total = cute.arch.shuffle_sync(inclusive, WARP - 1)
    while (base < groups) & (before + total <= tile):
        base += WARP
        before += total
        tiles, inclusive = _chunk_tiles(base, groups, mOffsets, tile_cols)
        total = cute.arch.shuffle_sync(inclusive, WARP - 1)
    # groups of this chunk that end at or before the tile: the tile is in the next one
    ended = cute.arch.popc(cute.arch.vote_ballot_sync(before + inclusive <= tile))
    group_first = before + cute.arch.shuffle_sync(inclusive - tiles, cutlass.min(ended, WARP - 1))
    return base < groups, base + ended, tile - group_first, (base, before)


@cute.jit
def _chunk_tiles(base: Int32, groups: Int32, mOffsets: cute.Tensor, tile_cols: cutlass.Constexpr):
    """(this lane's group's token tiles, the inclusive sum over the lanes up to it) for groups
    ``base`` + lane (none past the last group, or where offsets fall)."""
    lane = cute.arch.lane_idx()
    group = base + lane
    tiles = Int32(0)
    if group < groups:
        rows = mOffsets[group + 1] - mOffsets[group]
        tiles = cutlass.max(Int32(0), (rows + tile_cols - 1) // tile_cols)
    inclusive = tiles
    for step in cutlass.range_constexpr(LOG_WARP):
        below = cute.arch.shuffle_sync_up(inclusive, offset=1 << step)
        if lane >= (1 << step):
            inclusive += below
    return tiles, inclusive


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
class BlockwiseGemmFp4Sm90:
    """NVFP4 / MXFP4 GEMM on sm_90a: TMA ring of packed FP4 + scales or of converted tiles,
    exact dequantization, F16 / BF16 wgmma -> FP32.

    :param sf_vec_size: 16 (NVFP4) or 32 (MXFP4).
    :param path: "decode" (weights dequantized into the wgmma A registers) or "prefill".
    :param mma_tiler_mn: output tile (M, N); on decode M is the token tile, N the weight rows.
    :param cluster_shape_mn: (1, 1), or (2, 1): on prefill two M tiles sharing a multicast B
        tile; on decode with split_k 2 a tile's two K splits, summed through DSMEM.
    :param split_k: K splits summed by a deterministic fix-up through global memory (through
        DSMEM on a decode 2x1 cluster).
    :param tma_store: False compiles direct stores (D's row pitch not a multiple of 16 bytes).
    :param k_groups: decode: groups of consumer warpgroups splitting K inside a CTA.
    :param a_dtype: Float4E2M1FN (W4A4) or BFloat16 / Float16 activations (W4A16).
    :param grouped: W4A16 decode: expert e of the weights (batch e) against the token rows
        offsets[e] .. offsets[e + 1] - 1 (device offsets, E + 1 int32).
    :param tokens_converted: W4A4 decode: the grid ahead wrote the tokens' converted copy
        (``fp4_ops.quantizer``'s tokens mode), so no prologue grid; A and SFA are not read.
    """

    def __init__(
        self,
        sf_vec_size: int,
        path: str,
        mma_tiler_mn: tuple[int, int],
        cluster_shape_mn: tuple[int, int] = (1, 1),
        split_k: int = 1,
        tma_store: bool = True,
        k_groups: int = 1,
        a_dtype: str = W4A4,
        grouped: bool = False,
        tokens_converted: bool = False,
    ):
        reason = k_groups_reason(path, mma_tiler_mn, k_groups)
        reason = reason or cluster_reason(path, tuple(cluster_shape_mn), split_k, k_groups)
        reason = reason or grouped_reason(grouped, path, tuple(cluster_shape_mn), a_dtype)
        reason = reason or tokens_converted_reason(tokens_converted, path, a_dtype)
        if reason:
            raise ValueError(reason)
        self.sf_vec_size = sf_vec_size
        self.path = path
        # W4A16: BF16 / F16 activations, taken by TMA as they are; prepacked FP4 weights
        self.a_dtype = a_dtype
        self.w4a16 = a_dtype != W4A4
        # decode: the weights are the row operand (kernel A), so the kernel computes D^T
        self.swap_ab = path == "decode"
        # prefill: kernel A in SMEM in the MMA type (converted, or W4A16 activations), SS wgmma
        self.a_converted = path == "prefill"
        # what convert_operands converts: W4A4 tokens and prefill A; W4A16 prefill weights only
        self.convert_a = self.a_converted and not self.w4a16
        self.convert_b = not (self.w4a16 and path == "decode")
        # the prologue grid converts them, unless the grid ahead already wrote the tokens' copy
        self.prologue = self.convert_b and not tokens_converted
        self.mma_tiler_mn = tuple(mma_tiler_mn)
        self.cluster_shape_mn = tuple(cluster_shape_mn)
        self.cluster_m = self.cluster_shape_mn[0]
        # decode on a 2x1 cluster: its CTAs run the two K splits of one tile, and split 1 hands
        # its partial to split 0 through distributed SMEM instead of the global fix-up
        self.split_cluster = path == "decode" and self.cluster_m == 2
        # CTAs sharing one multicast kernel-B tile (prefill's 2x1 cluster)
        self.mcast = 1 if self.split_cluster else self.cluster_m
        self.split_k = split_k
        self.k_groups = k_groups
        self.tile_rows, self.tile_cols = kernel_tile(path, mma_tiler_mn)
        # W4A16 decode reads the activations as they are: a ragged token tile in smaller boxes
        boxed = self.w4a16 and self.swap_ab and not grouped and self.mcast == 1
        boxed = boxed and self.tile_cols >= TOKEN_BOX_MIN_COLS
        self.token_box_rows = self.tile_cols // TOKEN_BOXES if boxed else self.tile_cols
        # grouped: batch e of the weights meets token rows offsets[e] .. offsets[e + 1] - 1;
        # D's rows of one group end inside a tile, so the stores are predicated, not TMA
        self.grouped = grouped
        fits = epilogue_staging_fits(path, mma_tiler_mn, split_k)
        self.tma_store = tma_store and fits and not grouped
        self.threads_per_wg = 128
        # consumer warpgroups along the tile rows (one K group), and in all
        self.row_wgs = self.tile_rows // 64
        self.num_mma_wg = self.row_wgs * k_groups
        self.group_threads = self.row_wgs * self.threads_per_wg
        self.num_mma_threads = self.num_mma_wg * self.threads_per_wg
        self.threads_per_cta = (1 + self.num_mma_wg) * self.threads_per_wg
        self.occupancy = occupancy(path, mma_tiler_mn, k_groups)
        # 64-wide k-blocks per stage: two over packed FP4 (16-byte TMA rows), one over converted
        # F16 / BF16 tiles (128-byte rows)
        self.kblocks_per_stage = 1 if self.a_converted else K_TILE // K_BLOCK
        self.stage_k = K_BLOCK * self.kblocks_per_stage
        self.producer_warp = 0
        # NOTE: setmaxregister_increase only takes registers that other warps gave back: the
        # budgets stay within what ptxas gives a thread under the minctasm cap (<= 248, 8 | r).
        launch_regs = min(248, SM90_REGS_PER_SM // (self.occupancy * self.threads_per_cta) // 8 * 8)
        self.producer_regs = 40 if self.occupancy == 1 else 24
        budget = self.threads_per_cta * launch_regs - self.threads_per_wg * self.producer_regs
        self.mma_regs = min(240, budget // self.num_mma_threads // 8 * 8)
        # convert_operands: threads per CTA and 16-byte chunks per thread (prefill: whole
        # operands, many bytes in flight; decode: small CTAs that fit beside the GEMM's CTAs)
        self.convert_threads, self.convert_unroll = (128, 2) if path == "decode" else (256, 4)
        self.prologue_pdl = self._prologue_pdl(launch_regs)
        self.acc_dtype = cutlass.Float32
        # W4A4: NVFP4 on decode runs F16 wgmma (a cheaper exact conversion in the mainloop);
        # MXFP4, and prefill (converted once per launch), BF16 (docs/sm90_design.md).  W4A16: the
        # activations' type.
        w4a4_f16 = path == "decode" and dq.decode_tokens_f16(sf_vec_size)
        self.f16 = a_dtype == "Float16" if self.w4a16 else w4a4_f16
        self.mma_dtype = cutlass.Float16 if self.f16 else cutlass.BFloat16
        self.acc_scale = acc_scale(sf_vec_size, path, a_dtype)
        # W4A16 NVFP4 in BF16 on decode: scale factors hold the 2^126 of the e2m1 bits (2^-8 left)
        self.bf16_prescaled = self.acc_scale == W4A16_BF16_ACC_SCALE
        # MXFP4 on decode: stages whose scales are all <= 1 fold the 2^126 into them too (exact:
        # scale x 2^126 <= 2^126), one multiply per pair; other stages take two
        self.e8m0_fast = sf_vec_size == 32 and path == "decode" and not self.f16

    def _prologue_pdl(self, launch_regs: int) -> bool:
        """Whether ``convert_operands`` is PDL-launched too, so that it starts within the tail
        of the GEMM ahead of it: decode tiles of <= 32 tokens x 128 rows or <= 16 x 64 rows at
        two CTAs per SM, and K groups of <= 32 tokens where a prologue CTA fits beside the
        GEMM's CTA (docs/sm90_design.md)."""
        if self.path != "decode" or not self.prologue:
            return False
        if self.occupancy == 2 and self.tile_cols <= (32 if self.tile_rows == 128 else 16):
            return True
        gemm_regs = self.occupancy * self.threads_per_cta * launch_regs
        prologue_regs = self.convert_threads * DECODE_CONVERT_MAX_REGS
        fits = gemm_regs + prologue_regs <= SM90_REGS_PER_SM
        return self.k_groups > 1 and self.tile_cols <= 32 and fits

    def _setup_attributes(self):
        """Tiled MMA, SMEM layouts, stage count: everything fixed by the configuration."""
        self.tiled_mma = self._make_tiled_mma(self.tile_cols)
        # scale atoms per stage along K, and 128-row atom blocks per tile (rows <= 128 -> 1)
        self.sf_atoms_k = K_TILE // self.sf_vec_size // SF_ATOM_COLS
        self.sfa_row_blocks = max(1, self.tile_rows // SF_ATOM_ROWS)
        if self.a_converted:
            self.a_stage_bytes = self.tile_rows * self.stage_k * 2
            self.sfa_stage_bytes = 0
        else:
            self.a_stage_bytes = self.tile_rows * K_TILE // 2
            self.sfa_stage_bytes = SF_ATOM_BYTES * self.sf_atoms_k * self.sfa_row_blocks
        self.b_stage_bytes = self.tile_cols * self.stage_k * 2
        self.tx_bytes = self.a_stage_bytes + self.b_stage_bytes + self.sfa_stage_bytes
        # TMA-store epilogue: (rows, 32) subtiles of D in kernel coordinates, double-buffered in
        # SMEM; the decode tile is a tile of D^T, whose rows (D's columns) are contiguous.
        self.epi_tile = (self.tile_rows, min(self.tile_cols, 32))
        self.epi_subtiles = self.tile_cols // self.epi_tile[1]
        self.epi_stages = min(2, self.epi_subtiles)
        self.d_layout = LayoutEnum.COL_MAJOR if self.swap_ab else LayoutEnum.ROW_MAJOR
        epi_elems = self.epi_stages * self.epi_tile[0] * self.epi_tile[1]
        self.epi_bytes = epi_elems * self.c_dtype.width // 8 if self.tma_store else 0
        # k_groups > 1: the fp32 accumulators of groups 1 .. k_groups - 1, parked for group 0
        self.reduce_bytes = (self.k_groups - 1) * self.tile_rows * self.tile_cols * 4
        self.num_stages = self._compute_stages()
        converted_atom = warpgroup.make_smem_layout_atom(
            warpgroup.SmemLayoutAtomKind.K_SW128, self.mma_dtype
        )
        kblocks = self.kblocks_per_stage * self.num_stages
        if self.a_converted:
            # (rows, 64, k-blocks x stage): converted kernel A as wgmma reads it (K-major SW128)
            self.a_smem_layout_staged = cute.tile_to_shape(
                converted_atom, (self.tile_rows, K_BLOCK, kblocks), order=(0, 1, 2)
            )
        else:
            # (rows, 64 bytes, stage): SW64 so the 8-byte reads of a warp hit distinct banks
            packed_atom = warpgroup.make_smem_layout_atom(
                warpgroup.SmemLayoutAtomKind.K_SW64, cutlass.Uint8
            )
            self.a_smem_layout_staged = cute.tile_to_shape(
                packed_atom, (self.tile_rows, K_TILE // 2, self.num_stages), order=(0, 1, 2)
            )
        # (cols, 64, k-blocks x stage): converted kernel B as wgmma reads it (K-major SW128)
        self.b_smem_layout_staged = cute.tile_to_shape(
            converted_atom, (self.tile_cols, K_BLOCK, kblocks), order=(0, 1, 2)
        )
        # (box rows, 64, 1): one TMA box of kernel B, whole 8-row swizzle atoms of the above
        self.b_box_layout = cute.tile_to_shape(
            converted_atom, (self.token_box_rows, K_BLOCK, 1), order=(0, 1, 2)
        )
        # (256 bytes, 2 x atoms_k, row blocks, stage): whole 512-byte scale atoms
        self.sfa_smem_layout_staged = cute.make_ordered_layout(
            (256, 2 * self.sf_atoms_k, self.sfa_row_blocks, self.num_stages), order=(0, 1, 2, 3)
        )
        # (rows, epi cols, epi stage): D subtiles on their way to the TMA store
        self.d_smem_layout_staged = sm90_utils.make_smem_layout_epi(
            self.c_dtype, self.d_layout, self.epi_tile, self.epi_stages
        )
        self.smem_layouts = (
            self.a_smem_layout_staged,
            self.b_smem_layout_staged,
            self.sfa_smem_layout_staged,
            self.d_smem_layout_staged,
        )
        # The wgmma's accumulator partition restricted to one subtile: the values of subtile s
        # are the accumulator's values s * V .. s * V + V - 1 (8-column blocks walk slowest).
        self.epi_mma = self._make_tiled_mma(self.epi_tile[1])

    def _make_tiled_mma(self, cols: int) -> cute.TiledMma:
        """F16 / BF16 wgmma m64 x cols x k16 -> FP32 per row warpgroup; A from registers
        (decode) or SMEM (prefill), B from SMEM, both K-major."""
        return sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            OperandMajorMode.K,
            OperandMajorMode.K,
            self.acc_dtype,
            (self.row_wgs, 1, 1),
            tiler_mn=(64, cols),
            a_source=OperandSource.SMEM if self.a_converted else OperandSource.RMEM,
        )

    def _compute_stages(self) -> int:
        """Ring stages of ``tx_bytes`` that fit next to the D subtiles and the K groups' parked
        accumulators at ``occupancy`` CTAs per SM, capped (docs/sm90_design.md).

        NOTE: with K groups the ring holds a multiple of k_groups stages, each owned by one
        group: mbarrier waits test a phase's parity, so a group must see every fill of a stage.
        """
        reserved = 2048  # mbarriers + alignment padding
        # NOTE: 228 KiB per SM in all, of which 1 KiB per CTA is reserved by the hardware.
        per_cta = min(SM90_SMEM_CAPACITY, SM90_SMEM_PER_SM // self.occupancy - 1024)
        stages = (per_cta - self.epi_bytes - self.reduce_bytes - reserved) // self.tx_bytes
        max_stages = MAX_STAGES
        if self.path == "decode":
            max_stages = DECODE_K_GROUP_MAX_STAGES if self.k_groups > 1 else DECODE_MAX_STAGES
        stages = min(stages, max_stages) // self.k_groups * self.k_groups
        if stages < 2 * self.k_groups:
            raise ValueError(
                f"k_groups={self.k_groups}: {stages} stages of {self.tx_bytes} bytes fit, "
                "fewer than two per group"
            )
        return stages

    # ======================================= host side =========================================
    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,
        conv_b_ptr: cute.Pointer,
        conv_a_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        offsets_ptr: cute.Pointer,
        scale_ptr: cute.Pointer,
        problem_mnkl: tuple[Int32, Int32, Int32, Int32],
        num_sms: cutlass.Constexpr,
        stream,
    ):
        """Host side: global tensors, TMA atoms, shared storage, then the prologue grid and the
        GEMM grid, launched back to back (the GEMM with PDL).  Grouped: L = E experts, M the
        token rows of all groups, alpha [E] and the group offsets [E + 1] (else not read).
        ``scale_ptr``: one fp32 that multiplies alpha (the other operand's global scale)."""
        self.c_dtype = c_ptr.value_type
        self._setup_attributes()
        m, n, k, l = problem_mnkl  # noqa: E741
        k_pad = cute.assume((k + K_BLOCK - 1) // K_BLOCK * K_BLOCK, K_BLOCK)
        ptrs = (a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, workspace_ptr, conv_b_ptr, conv_a_ptr)
        tensors = self._global_tensors(ptrs, m, n, k, k_pad, l)
        mKApacked, mKBpacked, mKA, mKB, mSFKA, mSFKB, mD, mWork = tensors
        tma_ab = self._tma_atoms_ab(mKA, mKB, mSFKA)
        tma_atom_d, tma_tensor_d = self._tma_atom_d(mD, tma_ab[0], tma_ab[1])
        self.shared_storage = self._shared_storage()
        scheduler, grid = self._schedule(m, n, l, num_sms * self.occupancy // self.cluster_m)
        if cutlass.const_expr(self.prologue):
            kernel_b, kernel_a = (mKBpacked, mSFKB, mKB), (mKApacked, mSFKA, mKA)
            self._launch_prologue(kernel_b, kernel_a, k, k_pad, stream)
        # group offsets: E + 1 int32 in global memory, read when the kernel runs
        mOffsets = cute.make_tensor(offsets_ptr, cute.make_layout(l + 1))
        epi_tensors = (mD, tma_atom_d, tma_tensor_d, mWork, mOffsets)
        mmas = (self.tiled_mma, self.epi_mma)
        # alpha (grouped: one per expert) times one more fp32, in global memory, read when the
        # kernel runs: two global scales need no kernel ahead that multiplies them
        mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout(l if self.grouped else 1))
        alphas = (mAlpha, cute.make_tensor(scale_ptr, cute.make_layout(1)))
        self.kernel(tma_ab, epi_tensors, alphas, k, mmas, scheduler, self.smem_layouts).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(self.cluster_m, 1, 1),
            # programmatic dependent launch: this grid's start overlaps convert_operands
            use_pdl=True,
            min_blocks_per_mp=self.occupancy,
            # all of the SM's 228 KiB as SMEM (percent), so that ``occupancy`` CTAs fit
            preferred_smem_carveout=100,
            stream=stream,
        )

    def _schedule(self, m, n, l, max_clusters):  # noqa: E741
        """(scheduler, grid) of the persistent static schedule on at most ``max_clusters``
        clusters: tiles x K splits of D; grouped, the groups' token tiles, dense, at most
        ``grouped_tiles`` of them for any routing of M rows over L groups."""
        rows_a, rows_b = (n, m) if self.swap_ab else (m, n)
        row_tiles = (rows_a + self.tile_rows - 1) // self.tile_rows
        col_tiles = (rows_b + self.tile_cols - 1) // self.tile_cols
        if cutlass.const_expr(self.split_cluster):
            # one unit per tile: the cluster's CTAs are its K splits
            scheduler, grid = StaticTileScheduler.create((row_tiles, col_tiles, l), 1, max_clusters)
            return scheduler, (self.cluster_m, 1, grid[2])
        if cutlass.const_expr(self.grouped):
            tiles = (row_tiles, grouped_tiles(m, l, self.tile_cols), self.split_k)
            return StaticTileScheduler.create(tiles, self.cluster_m, max_clusters)
        tiles = (row_tiles, col_tiles, l * self.split_k)
        return StaticTileScheduler.create(tiles, self.cluster_m, max_clusters)

    def _global_tensors(self, ptrs, m, n, k, k_pad, l):  # noqa: E741
        """Packed kernel A / B (rows, K/2, L), the converted copies (rows, K_pad, L), the blocked
        scales, D in kernel coordinates and the split-K workspace."""
        a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, workspace_ptr, conv_b_ptr, conv_a_ptr = ptrs
        # the kernel's row / col operands (decode: the weights are the rows)
        rows_a, rows_b = (n, m) if self.swap_ab else (m, n)
        ptr_ka, ptr_kb = (b_ptr, a_ptr) if self.swap_ab else (a_ptr, b_ptr)
        ptr_sfka, ptr_sfkb = (sfb_ptr, sfa_ptr) if self.swap_ab else (sfa_ptr, sfb_ptr)
        kb = cute.assume(k // 2, 16)
        # grouped: the token rows of all groups and D are one [M, *] matrix each
        l_act = 1 if self.grouped else l
        if cutlass.const_expr(self.w4a16):
            # the activations as they are; the prepacked weights, K padded to whole k-blocks
            mAct = self._k_major(a_ptr, m, cute.assume(k, 32), l_act)
            mW = self._k_major(b_ptr, n, k_pad // 2, l)
            mKApacked, mKBpacked = (mW, mW) if self.swap_ab else (mAct, mW)
            mKA = mKApacked if self.swap_ab else mAct
            mKB = mAct if self.swap_ab else self._k_major(conv_b_ptr, n, k_pad, l)
        else:
            mKApacked = self._k_major(ptr_ka, rows_a, kb, l)
            mKBpacked = self._k_major(ptr_kb, rows_b, kb, l)
            # F16 / BF16 copies written by convert_operands in the mainloop's permuted K order
            mKA = self._k_major(conv_a_ptr, rows_a, k_pad, l) if self.a_converted else mKApacked
            mKB = self._k_major(conv_b_ptr, self.converted_rows_b(rows_b), k_pad, l)
        sf_atoms_k = (k // self.sf_vec_size + SF_ATOM_COLS - 1) // SF_ATOM_COLS
        mSFKA = self._blocked_sf_tensor(ptr_sfka, rows_a, sf_atoms_k, l)
        mSFKB = self._blocked_sf_tensor(ptr_sfkb, rows_b, sf_atoms_k, l)
        pitch = n
        if self.tma_store:
            # NOTE: TMA strides are multiples of 16 bytes; the launcher takes this variant only
            # when N * sizeof(D) is one.
            pitch = cute.assume(n, 128 // self.c_dtype.width)
        # D in kernel coordinates (rows, cols, L): decode writes D^T, i.e. D's columns
        if self.swap_ab:
            d_layout = cute.make_layout((n, m, l_act), stride=(1, pitch, m * pitch))
        else:
            d_layout = cute.make_layout((m, n, l_act), stride=(pitch, 1, m * pitch))
        mD = cute.make_tensor(c_ptr, d_layout)
        # split-K partials (fp32) and per-tile arrival counters (int32) share one workspace
        mWork = cute.make_tensor(workspace_ptr, cute.make_layout(1))
        return mKApacked, mKBpacked, mKA, mKB, mSFKA, mSFKB, mD, mWork

    def _tma_atoms_ab(self, mKA, mKB, mSFKA):
        """(atom, TMA tensor) of kernel A (packed or converted), converted kernel B, on decode
        kernel A's scales (kernel A's pair stands in for them on prefill), and kernel B's token
        boxes (kernel B's pair stands in where tiles are read whole)."""
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        a_tile = (self.tile_rows, K_BLOCK if self.a_converted else K_TILE // 2)
        a_stage = cute.slice_(self.a_smem_layout_staged, (None, None, 0))
        tma_atom_a, tma_tensor_a = cpasync.make_tiled_tma_atom(g2s, mKA, a_stage, a_tile)
        # NOTE: with a 2x1 cluster each CTA loads half of the shared B tile and multicasts it.
        tma_atom_b, tma_tensor_b = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SMulticastOp() if self.mcast > 1 else g2s,
            mKB,
            cute.slice_(self.b_smem_layout_staged, (None, None, 0)),
            (self.tile_cols, K_BLOCK),
            num_multicast=self.mcast,
        )
        # token boxes of kernel B for tiles that end past M (B's own pair stands in without)
        tma_atom_b_box, tma_tensor_b_box = tma_atom_b, tma_tensor_b
        if cutlass.const_expr(self.token_box_rows < self.tile_cols):
            tma_atom_b_box, tma_tensor_b_box = cpasync.make_tiled_tma_atom(
                g2s,
                mKB,
                cute.slice_(self.b_box_layout, (None, None, 0)),
                (self.token_box_rows, K_BLOCK),
            )
        tma_atom_sfa, tma_tensor_sfa = tma_atom_a, tma_tensor_a
        if not self.a_converted:
            tma_atom_sfa, tma_tensor_sfa = cpasync.make_tiled_tma_atom(
                g2s,
                mSFKA,
                cute.slice_(self.sfa_smem_layout_staged, (None, None, None, 0)),
                (256, 2 * self.sf_atoms_k, self.sfa_row_blocks),
            )
        pairs = (tma_atom_a, tma_tensor_a, tma_atom_b, tma_tensor_b, tma_atom_sfa, tma_tensor_sfa)
        return *pairs, tma_atom_b_box, tma_tensor_b_box

    def _tma_atom_d(self, mD, tma_atom_a, tma_tensor_a):
        """(atom, TMA tensor) of D's subtile stores; kernel A's pair with direct stores."""
        if not self.tma_store:
            return tma_atom_a, tma_tensor_a
        d_stage = cute.slice_(self.d_smem_layout_staged, (None, None, 0))
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mD, d_stage, self.epi_tile
        )

    @cute.jit
    def _shared_storage(self):
        """The CTA's shared storage: barriers, the A / B / scale ring, D subtiles, parked K-group
        accumulators (16-element placeholders where a buffer is not used)."""
        a_smem_dtype = self.mma_dtype if self.a_converted else cutlass.Uint8
        sfa_bytes = cute.cosize(self.sfa_smem_layout_staged) if self.sfa_stage_bytes else 16
        d_elems = cute.cosize(self.d_smem_layout_staged) if self.tma_store else 16
        a_elems = cute.cosize(self.a_smem_layout_staged)
        b_elems = cute.cosize(self.b_smem_layout_staged)

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            splitk_flag: cute.struct.MemRange[cutlass.Int32, 4]
            if cutlass.const_expr(self.split_cluster):
                xchg_mbar: cute.struct.MemRange[cutlass.Int64, len(ExchangeBarrier)]
            sA: cute.struct.Align[cute.struct.MemRange[a_smem_dtype, a_elems], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.mma_dtype, b_elems], 1024]
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, sfa_bytes], 128]
            sD: cute.struct.Align[cute.struct.MemRange[self.c_dtype, d_elems], 1024]
            if cutlass.const_expr(self.reduce_bytes > 0):
                # (no placeholder otherwise: its alignment could cost bytes two CTAs lack)
                sRed: cute.struct.Align[
                    cute.struct.MemRange[cutlass.Float32, self.reduce_bytes // 4], 128
                ]

        return SharedStorage

    def _launch_prologue(self, kernel_b, kernel_a, k, k_pad, stream):
        """Launch ``convert_operands`` over kernel B (and, on prefill, kernel A): each given as
        (packed, blocked scales, converted copy)."""
        rows_b, l = kernel_b[0].shape[0], kernel_b[0].shape[2]  # noqa: E741
        rows_a = kernel_a[0].shape[0]
        per_cta = self.convert_threads * self.convert_unroll
        chunks_b = l * rows_b * (k_pad // K_BLOCK) * CHUNKS_PER_KBLOCK
        ctas = (chunks_b + per_cta - 1) // per_cta
        if cutlass.const_expr(self.convert_a):
            chunks_a = l * rows_a * (k_pad // K_BLOCK) * CHUNKS_PER_KBLOCK
            ctas += (chunks_a + per_cta - 1) // per_cta
        # runtime divisors of the chunk index: a precomputed multiply-shift, no IDIV sequence
        blocks_per_row = cute.fast_divmod_create_divisor_v2(k_pad // K_BLOCK)
        rows_div_b = cute.fast_divmod_create_divisor_v2(rows_b)
        rows_div_a = cute.fast_divmod_create_divisor_v2(rows_a)
        divisors = (blocks_per_row, rows_div_b, rows_div_a)
        # decode: a register cap of DECODE_CONVERT_MAX_REGS and the GEMM's SMEM carveout, so
        # that these CTAs can share an SM with the GEMM's CTAs
        decode = self.path == "decode"
        min_blocks = SM90_REGS_PER_SM // (self.convert_threads * DECODE_CONVERT_MAX_REGS)
        self.convert_operands(kernel_b, kernel_a, k, k_pad, divisors).launch(
            grid=[ctas, 1, 1],
            block=[self.convert_threads, 1, 1],
            stream=stream,
            use_pdl=self.prologue_pdl,
            min_blocks_per_mp=min_blocks if decode else 0,
            preferred_smem_carveout=100 if decode else None,
        )

    # ======================================= the GEMM grid =====================================
    @cute.kernel
    def kernel(
        self,
        tma_ab: tuple,
        epi_tensors: tuple,
        alphas: tuple,
        k: Int32,
        mmas: tuple,
        scheduler: StaticTileScheduler,
        layouts: tuple,
    ):
        """Dispatcher: shared storage and the pipeline, then one branch per warp role."""
        tma_atom_a, _, tma_atom_b, _, tma_atom_sfa, _, tma_atom_b_box, _ = tma_ab
        tma_atom_d = epi_tensors[1]
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == self.producer_warp:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            if cutlass.const_expr(self.token_box_rows < self.tile_cols):
                cpasync.prefetch_descriptor(tma_atom_b_box)
            # (the scale and D atoms stand in for A's where they are not used)
            if cutlass.const_expr(not self.a_converted):
                cpasync.prefetch_descriptor(tma_atom_sfa)
            if cutlass.const_expr(self.tma_store):
                cpasync.prefetch_descriptor(tma_atom_d)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        if cutlass.const_expr(self.split_cluster):
            if warp_idx == 0:
                with cute.arch.elect_one():
                    xchg = storage.xchg_mbar.data_ptr()
                    consumer_warps = self.group_threads // 32
                    cute.arch.mbarrier_init(xchg + ExchangeBarrier.FULL, 1)
                    cute.arch.mbarrier_init(xchg + ExchangeBarrier.FREE, consumer_warps)
                    cute.arch.mbarrier_init(xchg + ExchangeBarrier.DONE, consumer_warps)
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.num_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # one arrive per consumer warp of the K group that reads the stage, in every CTA
            # whose producer writes into this one
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.group_threads // 32 * self.mcast
            ),
            tx_count=self.tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, self.mcast, 1, 1)),
        )
        if cutlass.const_expr(self.split_cluster):
            # NOTE: the peer signals this CTA's exchange barriers: their init (fenced by the
            # pipeline's creation) must be visible to it first.
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        k_tiles = (k + self.stage_k - 1) // self.stage_k

        mOffsets = epi_tensors[4]
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == self.producer_warp:
                self._producer(storage, ab_pipeline, k_tiles, layouts, tma_ab, scheduler, mOffsets)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            # NOTE: PDL launch: alpha and the group offsets (written by kernels ahead) are
            # complete only after this wait, which also orders every store of the consumers
            # (units without k-tiles too) after it.
            cute.arch.griddepcontrol_wait()
            self._consumer(
                storage, ab_pipeline, k_tiles, layouts, epi_tensors, alphas, mmas, scheduler
            )
        if cutlass.const_expr(self.cluster_m > 1):
            # NOTE: no CTA may exit while its peer can still multicast into its SMEM or
            # signal its barriers.
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()

    @cute.jit
    def _alpha(self, alphas, batch):
        """alpha (grouped: expert ``batch``'s) times the scale (one fp32 product, as the
        reference rounds it) times ``acc_scale``: exact where the product is finite
        (``alpha_reason``); undoes the 2^-7 of each F16 FP4 operand, so that acc * alpha rounds
        once, as in the reference."""
        mAlpha, mScale = alphas
        alpha = mAlpha[batch if cutlass.const_expr(self.grouped) else 0] * mScale[0]
        if cutlass.const_expr(self.acc_scale != 1.0):
            alpha = alpha * cutlass.Float32(self.acc_scale)
        return alpha

    @cute.jit
    def _unit(self, scheduler, unit, cursor, mOffsets):
        """Grouped: (valid, found, cursor) of ``unit``, ``found`` its (row tile, token tile in
        its group, group x split_k + K split, token tile among all groups') that ``group_tile``
        finds from ``cursor`` (None: from the first group); every role walks the same units, so
        finds the same ones.  Units: row clusters fastest, then K splits, then token tiles; none
        past the scheduler's bound (``grouped_tiles``: falling offsets cannot overrun the
        split-K workspace).  Else (None, None, None): the static schedule's ``_valid`` and
        ``_coords`` need nothing carried from unit to unit."""
        valid, found = None, None
        if cutlass.const_expr(self.grouped):
            cursor = (Int32(0), Int32(0)) if cursor is None else cursor
            tile, row_cluster = divmod(unit, scheduler.row_clusters)
            split = Int32(0)
            if cutlass.const_expr(self.split_k > 1):
                tile, split = tile // self.split_k, tile % self.split_k
            valid, group, col_tile, cursor = group_tile(tile, cursor, mOffsets, self.tile_cols)
            valid = valid & scheduler.is_valid(unit)
            cta = Int32(cute.arch.block_idx()[0] % self.cluster_m)
            uniform = cute.arch.make_warp_uniform
            found = (
                uniform(row_cluster * self.cluster_m + cta),
                uniform(col_tile),
                uniform(group * self.split_k + split),
                uniform(tile),
            )
        return valid, found, cursor

    def _valid(self, scheduler, unit, valid):
        """Whether ``unit`` is one of this launch's units (grouped: as ``_unit`` found)."""
        return valid if self.grouped else scheduler.is_valid(unit)

    def _coords(self, scheduler, unit, found):
        """(row tile, col tile, L x split_k index) of a valid ``unit``; grouped: as ``_unit``
        found, with the unit's token tile among all groups' (its split-K partials' place)."""
        return found if self.grouped else self._static_coords(scheduler, unit)

    def _static_coords(self, scheduler, unit):
        """The static schedule's (row tile, col tile, L x split_k index) of ``unit``; with
        ``split_cluster`` the split is this CTA's rank in its cluster."""
        if cutlass.const_expr(self.split_cluster):
            row_tile, col_tile, batch = scheduler.coords(unit, 1)
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            return row_tile, col_tile, batch * self.split_k + rank
        return scheduler.coords(unit, self.cluster_m)

    # ======================================= TMA producer ======================================
    @cute.jit
    def _producer(self, storage, ab_pipeline, k_tiles, layouts, tma, scheduler, mOffsets):
        """Warp 0: per work unit and k-tile, one ring stage of kernel A (and its scales on
        decode) and converted kernel B.  On decode the first stage's weights are requested
        before the PDL wait; every load of the prologue's output comes after it.  Grouped:
        kernel B's tile starts at its group's first token row."""
        a_smem_layout_staged, b_smem_layout_staged, sfa_smem_layout_staged, _ = layouts
        tma_atom_a, mA_mkl, tma_atom_b, mB_nkl, tma_atom_sfa, mSFA_mkl = tma[:6]
        tma_atom_b_box, mB_box_nkl = tma[6:]
        # packed: (rows, 64 bytes, stage); converted: (rows, 64, k-blocks x stage)
        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        # (cols, 64, k-blocks x stage)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        # packed: (rows, 64 bytes, RestRows, RestK, L); converted: (rows, 64, RestRows, RestK64, L)
        a_tile_k = K_BLOCK if self.a_converted else K_TILE // 2
        gA = cute.local_tile(mA_mkl, (self.tile_rows, a_tile_k), (None, None, None))
        # (cols, 64, RestCols, RestK64, L)
        gB = cute.local_tile(mB_nkl, (self.tile_cols, K_BLOCK), (None, None, None))
        # (TMA, stage) / (TMA, RestRows, RestK, L)
        tAsA, tAgA = _tma_partition(tma_atom_a, sA, gA, 2)
        # 2x1 cluster: this CTA loads its half of the B tile, multicast to both CTAs
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_layout_vmnk = cute.make_layout((1, self.mcast, 1, 1))
        b_mcast_mask = None
        if cutlass.const_expr(self.mcast > 1):
            b_mcast_mask = cpasync.create_tma_multicast_mask(
                cta_layout_vmnk, cta_layout_vmnk.get_flat_coord(cta_rank), mcast_mode=1
            )
        # (TMA, k-block x stage) / (TMA, RestCols, RestK64, L)
        tBsB, tBgB = self._partition_b(tma_atom_b, sB, gB, cta_rank)
        token_boxes = None
        if cutlass.const_expr(self.token_box_rows < self.tile_cols):
            # (box rows, 64, boxes, k-block x stage): whole 8-row swizzle atoms per box
            sB_boxes = cute.flat_divide(sB, (self.token_box_rows, K_BLOCK))
            # (box rows, 64, RestBoxes, RestK64, L)
            gB_box = cute.local_tile(mB_box_nkl, (self.token_box_rows, K_BLOCK), (None,) * 3)
            # (TMA, box, k-block x stage) / (TMA, RestBoxes, RestK64, L)
            tBsB_box, tBgB_box = _tma_partition(
                tma_atom_b_box, sB_boxes[(None, None, None, 0, None)], gB_box, 2
            )
            token_rows = cute.size(mB_nkl, mode=[0])
            token_boxes = (tma_atom_b_box, tBgB_box, tBsB_box, token_rows)
        tAsSFA, tAgSFA = None, None
        if cutlass.const_expr(not self.a_converted):
            # (256, 2 * atoms_k, row_blocks, stage)
            sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
            # (256, 2 * atoms_k, row_blocks, RestK, RestRowBlocks, L)
            gSFA = cute.local_tile(
                mSFA_mkl, (256, 2 * self.sf_atoms_k, self.sfa_row_blocks), (0, None, None, None)
            )
            # (TMA, stage) / (TMA, RestK, RestRowBlocks, L)
            tAsSFA, tAgSFA = _tma_partition(tma_atom_sfa, sSFA, gSFA, 3)
        a_copies = (tma_atom_a, tAgA, tAsA, tma_atom_sfa, tAgSFA, tAsSFA)
        b_copies = (tma_atom_b, tBgB, tBsB, b_mcast_mask, token_boxes)
        unit = scheduler.first_unit()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        # k-tiles of the first work unit already requested (decode: its first stage)
        issued = Int32(0)
        if cutlass.const_expr(self.swap_ab and self.convert_b):
            # (the grid ahead, the prologue or the quantizer's tokens grid, waited for the
            # kernel before it: the weights are final)
            issued, state = self._first_stage_across_pdl_wait(
                ab_pipeline, state, a_copies, b_copies, scheduler, unit, k_tiles
            )
        else:
            # NOTE: PDL launch: the converted operands, and (W4A16 decode, no prologue grid)
            # weights and group offsets a kernel ahead may still write, are complete only after
            # this wait.
            cute.arch.griddepcontrol_wait()
        valid, found, cursor = self._unit(scheduler, unit, None, mOffsets)
        # units this CTA has loaded
        units = Int32(0)
        while self._valid(scheduler, unit, valid):
            if cutlass.const_expr(self.split_cluster):
                self._wait_ring_free(storage, units)
            units += 1
            row_tile, col_tile, batch, kt_begin, kt_end, sfa_rb = self._producer_unit(
                self._coords(scheduler, unit, found), k_tiles
            )
            unit_b_copies, batch_b = b_copies, batch
            if cutlass.const_expr(self.grouped):
                # this group's token rows: a tile that runs past them reads the next group's
                # rows or TMA's zero fill beyond M, both masked off by the epilogue
                group_b = cute.domain_offset((mOffsets[batch], 0, 0), mB_nkl)
                gB_group = cute.local_tile(group_b, (self.tile_cols, K_BLOCK), (None, None, None))
                _, tBgB_group = self._partition_b(tma_atom_b, sB, gB_group, cta_rank)
                unit_b_copies = (tma_atom_b, tBgB_group, tBsB, b_mcast_mask, b_copies[4])
                batch_b = 0
            kt_first = kt_begin + issued
            issued = Int32(0)
            for kt in cutlass.range(kt_first, kt_end, unroll=1):
                ab_pipeline.producer_acquire(state)
                bar = ab_pipeline.producer_get_barrier(state)
                self._copy_a(a_copies, kt, state.index, bar, row_tile, sfa_rb, batch)
                self._copy_b(unit_b_copies, kt, state.index, bar, col_tile, batch_b)
                ab_pipeline.producer_commit(state)
                state.advance()
            unit = scheduler.next_unit(unit)
            valid, found, cursor = self._unit(scheduler, unit, cursor, mOffsets)
        # every load of this CTA is issued: a PDL-launched successor (the next prologue) may
        # start; it waits for this grid to complete before it touches memory
        cute.arch.griddepcontrol_launch_dependents()
        ab_pipeline.producer_tail(state)

    @cute.jit
    def _wait_ring_free(self, storage, units):
        """``split_cluster``, split 0: before the first load of its next unit, its consumers have
        read split 1's partial of the unit before out of the ring."""
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        if units > 0 and rank == 0:
            done = storage.xchg_mbar.data_ptr() + ExchangeBarrier.DONE
            cute.arch.mbarrier_wait(done, (units - 1) % 2)
            # NOTE: split 1's st.async wrote the ring through the generic proxy; TMA (the async
            # proxy) overwrites it next.
            cute.arch.fence_proxy("async.shared", space="cta")

    def _partition_b(self, tma_atom_b, sB, gB, cta_rank):
        """(TMA, k-block x stage) / (TMA, RestCols, RestK64, L) views of kernel B's copies for
        this CTA (its half of a tile multicast to a 2x1 cluster)."""
        cta_layout = cute.make_layout(self.mcast)
        return _tma_partition(tma_atom_b, sB, gB, 2, cta_rank % self.mcast, cta_layout)

    @cute.jit
    def _first_stage_across_pdl_wait(
        self, ab_pipeline, state, a_copies, b_copies, scheduler, unit, k_tiles
    ):
        """Decode: request the first stage's weights, wait for the grid that converts the
        tokens (the prologue, or with ``tokens_converted`` the quantizer's tokens grid;
        ``griddepcontrol.wait``), then request its tokens.  Returns the k-tiles issued (0 for
        a CTA without work or a first unit without k-tiles) and the advanced pipeline state.

        NOTE: PDL launch: the converted tokens are complete only after the wait; the weights
        and their scales do not depend on it, so their DRAM latency overlaps that grid."""
        row_tile, col_tile, batch, kt_begin, kt_end, sfa_rb = self._producer_unit(
            self._static_coords(scheduler, unit), k_tiles
        )
        issued = cutlass.min(Int32(1), kt_end - kt_begin)
        if not scheduler.is_valid(unit):
            issued = Int32(0)
        token_state = state.clone()
        for i in cutlass.range(issued, unroll=1):
            ab_pipeline.producer_acquire(state)
            bar = ab_pipeline.producer_get_barrier(state)
            self._copy_a(a_copies, kt_begin + i, state.index, bar, row_tile, sfa_rb, batch)
            state.advance()
        cute.arch.griddepcontrol_wait()
        for i in cutlass.range(issued, unroll=1):
            bar = ab_pipeline.producer_get_barrier(token_state)
            self._copy_b(b_copies, kt_begin + i, token_state.index, bar, col_tile, batch)
            ab_pipeline.producer_commit(token_state)
            token_state.advance()
        return issued, state

    @cute.jit
    def _producer_unit(self, coords, k_tiles):
        """A work unit's coordinates for the TMA copies: row tile, col tile, batch, its k-tiles
        [begin, end) and kernel A's scale row block."""
        row_tile, col_tile, lk = coords[:3]
        batch = lk // self.split_k
        kt_begin, kt_end = self._split_range(lk % self.split_k, k_tiles)
        # scale row block of this tile (tiles narrower than an atom share one)
        sfa_rb = row_tile * self.tile_rows // (SF_ATOM_ROWS * self.sfa_row_blocks)
        return row_tile, col_tile, batch, kt_begin, kt_end, sfa_rb

    @cute.jit
    def _copy_a(self, a_copies, kt, stage, bar, row_tile, sfa_rb, batch):
        """Kernel A (and, packed, its scales) of k-tile ``kt`` into ``stage``."""
        tma_atom_a, tAgA, tAsA, tma_atom_sfa, tAgSFA, tAsSFA = a_copies
        cute.copy(
            tma_atom_a, tAgA[(None, row_tile, kt, batch)], tAsA[(None, stage)], tma_bar_ptr=bar
        )
        if cutlass.const_expr(not self.a_converted):
            cute.copy(
                tma_atom_sfa,
                tAgSFA[(None, kt, sfa_rb, batch)],
                tAsSFA[(None, stage)],
                tma_bar_ptr=bar,
            )

    @cute.jit
    def _copy_b(self, b_copies, kt, stage, bar, col_tile, batch):
        """Converted kernel B of k-tile ``kt`` into ``stage``: ``_copy_b_tile``, or
        ``_copy_b_boxes`` where the token tile is ragged."""
        token_boxes = b_copies[4]
        if cutlass.const_expr(token_boxes is None):
            self._copy_b_tile(b_copies, kt, stage, bar, col_tile, batch)
        else:
            if self._ragged_token_tile(col_tile, token_boxes[3]):
                self._copy_b_boxes(token_boxes, kt, stage, bar, col_tile, batch)
            else:
                self._copy_b_tile(b_copies, kt, stage, bar, col_tile, batch)

    @cute.jit
    def _copy_b_tile(self, b_copies, kt, stage, bar, col_tile, batch):
        """One TMA copy of the whole token tile per k-block (multicast on a 2x1 cluster)."""
        tma_atom_b, tBgB, tBsB, b_mcast_mask, _ = b_copies
        kbs = self.kblocks_per_stage
        for j in cutlass.range_constexpr(kbs):
            cute.copy(
                tma_atom_b,
                tBgB[(None, col_tile, kbs * kt + j, batch)],
                tBsB[(None, kbs * stage + j)],
                tma_bar_ptr=bar,
                mcast_mask=b_mcast_mask,
            )

    @cute.jit
    def _copy_b_boxes(self, token_boxes, kt, stage, bar, col_tile, batch):
        """``_copy_b`` of a ragged token tile, one TMA copy per token box and k-block."""
        tma_atom_b_box, tBgB_box, tBsB_box, token_rows = token_boxes
        kbs = self.kblocks_per_stage
        for j in cutlass.range_constexpr(kbs):
            for i in cutlass.range_constexpr(self.tile_cols // self.token_box_rows):
                cute.copy(
                    tma_atom_b_box,
                    tBgB_box[(None, self._token_box(col_tile, i, token_rows), kbs * kt + j, batch)],
                    tBsB_box[(None, i, kbs * stage + j)],
                    tma_bar_ptr=bar,
                )

    @cute.jit
    def _ragged_token_tile(self, col_tile, token_rows):
        """Whether token tile ``col_tile`` holds a token box wholly past the last token row
        (a TMA box running that far past a tensor's end is slow): then it is read in boxes."""
        return (col_tile + 1) * self.tile_cols - self.token_box_rows >= token_rows

    @cute.jit
    def _token_box(self, col_tile, i, token_rows):
        """The token box that box ``i`` of token tile ``col_tile`` loads: its own, or the tile's
        first where its own lies wholly past the last token row (the same bytes for the stage
        barrier; those rows reach only D columns past M, which are not stored)."""
        first = col_tile * (self.tile_cols // self.token_box_rows)
        return first + i * Int32((first + i) * self.token_box_rows < token_rows)

    @cute.jit
    def _split_range(self, split, k_tiles):
        """``split_k_range``, or all k-tiles without split-K."""
        if cutlass.const_expr(self.split_k == 1):
            return Int32(0), k_tiles
        return split_k_range(split, k_tiles, self.split_k)

    # ======================================= consumers =========================================
    @cute.jit
    def _consumer(
        self, storage, ab_pipeline, k_tiles, layouts, epi_tensors, alphas, mmas, scheduler
    ):
        """Consumer warpgroups: per work unit, ``_mainloop_decode`` or ``_mainloop_prefill``, the
        K groups' sum, then (K group 0) ``_epilogue``."""
        mOffsets = epi_tensors[4]
        # (grouped: each unit reads its expert's alpha)
        alpha = None if cutlass.const_expr(self.grouped) else self._alpha(alphas, 0)
        a_smem_layout_staged, b_smem_layout_staged, _, d_smem_layout_staged = layouts
        tiled_mma, epi_mma = mmas
        tidx, _, _ = cute.arch.thread_idx()
        tidx = tidx - self.threads_per_wg
        # K group of this thread, then tidx = its index inside the group (0 .. group_threads - 1)
        kgroup = 0
        if cutlass.const_expr(self.k_groups > 1):
            kgroup = cute.arch.make_warp_uniform(tidx // self.group_threads)
            tidx = tidx % self.group_threads
        thr_mma = tiled_mma.get_slice(tidx)
        # (cols, 64, k-blocks x stage)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        # (MMA, MMA_N, MMA_K, k-blocks x stage): descriptors of the converted kernel B
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        if cutlass.const_expr(self.a_converted):
            # (rows, 64, k-blocks x stage)
            sA = storage.sA.get_tensor(
                a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner
            )
            # (MMA, MMA_M, MMA_K, k-blocks x stage): descriptors of the converted kernel A
            a_operands = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        else:
            a_operands = self._decode_a_operands(storage, tiled_mma, thr_mma, tidx)
        # (MMA, MMA_M, MMA_N)
        tCrAcc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_rows, self.tile_cols)), self.acc_dtype
        )
        d_pipeline, epi_smem = None, None
        if cutlass.const_expr(self.tma_store):
            # (rows, epi cols, epi stage)
            sD = storage.sD.get_tensor(
                d_smem_layout_staged.outer, swizzle=d_smem_layout_staged.inner
            )
            d_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=self.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.group_threads),
            )
            epi_smem = (sD, epi_mma, d_pipeline)
        # the split-K fix-up's SMEM: the last split's flag, or (split_cluster) the exchange
        # barriers and the kernel-B ring, where split 1's partial lands in split 0
        fixup_smem = storage.splitk_flag.data_ptr().toint()
        if cutlass.const_expr(self.split_cluster):
            fixup_smem = (storage.xchg_mbar.data_ptr(), storage.sB.data_ptr().toint())
        consumer = pipeline.PipelineUserType.Consumer
        # the stage of this thread's next k-tile, and (k_groups == 1) the next stage to free
        read_state = pipeline.make_pipeline_state(consumer, self.num_stages)
        free_state = pipeline.make_pipeline_state(consumer, self.num_stages)
        # k_groups > 1: the CTA's first k-tile of the current unit (every group's count)
        unit_state = None
        if cutlass.const_expr(self.k_groups > 1):
            unit_state = pipeline.make_pipeline_state(consumer, self.num_stages)
        unit = scheduler.first_unit()
        valid, found, cursor = self._unit(scheduler, unit, None, mOffsets)
        # units this CTA has finished (split_cluster: the exchange barriers' phase)
        units = Int32(0)
        while self._valid(scheduler, unit, valid):
            coords = self._coords(scheduler, unit, found)
            row_tile, col_tile, lk = coords[:3]
            kt_begin, kt_end = self._split_range(lk % self.split_k, k_tiles)
            # this thread's k-tiles: kt_first, kt_first + k_groups, ... < kt_end
            kt_first = kt_begin
            if cutlass.const_expr(self.k_groups > 1):
                # the unit's k-tiles whose stages this group owns (stage % k_groups == group)
                owned = unit_state.count % self.k_groups
                offset = (kgroup - owned + self.k_groups) % self.k_groups
                kt_first = kt_begin + offset
                read_state = unit_state.clone()
                read_state.advance(offset)
            tCrAcc.fill(0.0)
            # NOTE: wgmma's scale-d operand: without ACCUMULATE every k16 step overwrites D.
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            mainloop = (ab_pipeline, read_state, free_state, kt_first, kt_end, tiled_mma, tCrAcc)
            if cutlass.const_expr(self.a_converted):
                read_state, free_state = self._mainloop_prefill(*mainloop, a_operands, tCrB)
            else:
                read_state, free_state = self._mainloop_decode(
                    *mainloop, a_operands, tCrB, row_tile
                )
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.k_groups == 1):
                if kt_end > kt_first:
                    ab_pipeline.consumer_release(free_state)
                    free_state.advance()
            else:
                unit_state.advance(kt_end - kt_begin)
                self._reduce_k_groups(tCrAcc, kgroup, tidx, storage.sRed.data_ptr().toint())
            # (k_groups > 1: group 0 holds the sum)
            if kgroup == 0:
                unit_alpha, fixup = alpha, fixup_smem
                if cutlass.const_expr(self.grouped):
                    unit_alpha = self._alpha(alphas, lk // self.split_k)
                if cutlass.const_expr(self.split_cluster):
                    fixup = (*fixup_smem, units % 2)
                self._epilogue(
                    tCrAcc, epi_tensors, unit_alpha, coords, thr_mma, tidx, fixup, epi_smem
                )
            units += 1
            unit = scheduler.next_unit(unit)
            valid, found, cursor = self._unit(scheduler, unit, cursor, mOffsets)
        if cutlass.const_expr(self.tma_store):
            # warp 0 of group 0, which issued them (both terms >= 0; kgroup is 0 without groups)
            if tidx // 32 + kgroup == 0:
                # NOTE: the CTA must not exit before its TMA stores have read their SMEM.
                d_pipeline.producer_tail()

    def _decode_a_operands(self, storage, tiled_mma, thr_mma, tidx):
        """Decode: the two A register fragments (double-buffered across k-blocks), the SMEM
        bases of packed kernel A and its scales, this thread's first A row and 16-group."""
        # (MMA, MMA_M, MMA_K)
        a_frag_shape = thr_mma.partition_shape_A((self.tile_rows, K_BLOCK))
        tCrA0 = tiled_mma.make_fragment_A(a_frag_shape)
        tCrA1 = tiled_mma.make_fragment_A(a_frag_shape)
        wg = tidx // self.threads_per_wg
        warp_in_wg = (tidx // 32) % 4
        lane = tidx % 32
        # this thread's two kernel-A rows in the tile: wgmma A fragment rows g and g + 8
        a_row0 = wg * 64 + warp_in_wg * 16 + lane // 4
        # the 16-element group of each 64-wide k-block this thread dequantizes
        q = lane % 4
        base_a = storage.sA.data_ptr().toint()
        base_sfa = storage.sSFA.data_ptr().toint()
        return tCrA0, tCrA1, base_a, base_sfa, a_row0, q

    @cute.jit
    def _mainloop_decode(
        self,
        ab_pipeline,
        read_state,
        free_state,
        kt_first,
        kt_end,
        tiled_mma,
        tCrAcc,
        a_operands,
        tCrB,
        row_tile,
    ):
        """RS wgmma: per stage, this thread's packed weights and scales of both k-blocks from
        SMEM, dequantized into the A registers, then 4 wgmma per k-block against the converted
        tokens.  A stage is freed once its last wgmma has completed (k_groups == 1: one stage
        later; K groups: at once, so that a group holds one stage).  Returns the states."""
        tCrA0, tCrA1, base_a, base_sfa, a_row0, q = a_operands
        # row offset of this tile inside its 128-row scale atom
        sfa_row_off = row_tile * self.tile_rows % SF_ATOM_ROWS
        kbs = self.kblocks_per_stage
        for kt in cutlass.range(kt_first, kt_end, self.k_groups, unroll=1):
            ab_pipeline.consumer_wait(read_state)
            # both k-blocks' kernel-A bytes at once: one SMEM latency per stage
            a_bytes = [
                self._load_a(base_a, base_sfa, read_state.index, j, a_row0, sfa_row_off, q)
                for j in range(kbs)
            ]
            small = self._small_scales(a_bytes) if cutlass.const_expr(self.e8m0_fast) else None
            for j in cutlass.range_constexpr(kbs):
                tCrA = tCrA0 if j == 0 else tCrA1
                self._dequant_a(tCrA, a_bytes[j], j, q, small)
                self._wgmma_kblock(tiled_mma, tCrAcc, tCrA, tCrB, kbs * read_state.index + j)
                if cutlass.const_expr(self.k_groups > 1 and j == kbs - 1):
                    warpgroup.wait_group(0)
                    ab_pipeline.consumer_release(read_state)
                else:
                    # NOTE: k-block t - 1 done => its A registers are free again.
                    warpgroup.wait_group(1)
                if cutlass.const_expr(j == 0 and self.k_groups == 1):
                    # the last wgmma of the previous stage has completed: free that stage
                    if kt > kt_first:
                        ab_pipeline.consumer_release(free_state)
                        free_state.advance()
            read_state = self._next_owned_stage(read_state)
        return read_state, free_state

    @cute.jit
    def _next_owned_stage(self, state):
        """The state k_groups stages on (``advance(k_groups)``): the ring holds at least
        k_groups stages, so the step wraps at most once, a compare where ``advance`` divides."""
        if cutlass.const_expr(self.k_groups == 1):
            state.advance()
            return state
        index = state.index + self.k_groups
        wrapped = Int32(index >= state.stages)
        return pipeline.PipelineState(
            state.stages,
            state.count + self.k_groups,
            index - wrapped * state.stages,
            state.phase ^ wrapped,
        )

    @cute.jit
    def _mainloop_prefill(
        self, ab_pipeline, read_state, free_state, kt_first, kt_end, tiled_mma, tCrAcc, tCsA, tCrB
    ):
        """SS wgmma over the converted tiles: per stage one 64-wide k-block of kernel A and B;
        a stage is freed one stage later, once its wgmma has completed.  Returns the states."""
        for kt in cutlass.range(kt_first, kt_end, unroll=1):
            ab_pipeline.consumer_wait(read_state)
            stage = read_state.index
            self._wgmma_kblock(tiled_mma, tCrAcc, tCsA[(None, None, None, stage)], tCrB, stage)
            warpgroup.wait_group(1)
            if kt > kt_first:
                ab_pipeline.consumer_release(free_state)
                free_state.advance()
            read_state.advance()
        return read_state, free_state

    @cute.jit
    def _wgmma_kblock(self, tiled_mma, tCrAcc, tCrA, tCrB, b_block):
        """4 wgmma (k16 each) of one 64-wide k-block, committed as one group."""
        warpgroup.fence()
        for s in cutlass.range_constexpr(K_BLOCK // 16):
            cute.gemm(
                tiled_mma, tCrAcc, tCrA[(None, None, s)], tCrB[(None, None, s, b_block)], tCrAcc
            )
        warpgroup.commit_group()

    @cute.jit
    def _load_a(self, base_a, base_sfa, stage, j, a_row0, sfa_row_off, q):
        """Packed FP4 (8 bytes, SW64) and scales of rows a_row0 and a_row0 + 8, packed nibbles
        16q..16q+15 of k-block j: [(packed, scales)] x 2.  W4A4: the scale byte of the 16-group;
        W4A16: the aligned word of the row's scale columns that hold k-block j's."""
        out = []
        for r in cutlass.range_constexpr(2):
            row = a_row0 + 8 * r
            byte = row * (K_TILE // 2) + j * (K_BLOCK // 2) + q * 8
            packed = dq.ld_shared_b64(base_a + stage * self.a_stage_bytes + _swizzle64(byte))
            # (the scale's row counted from the first row of its 128x4 atom)
            base_sf = base_sfa + stage * self.sfa_stage_bytes
            if cutlass.const_expr(self.w4a16):
                col0 = j * K_BLOCK // self.sf_vec_size // SF_ATOM_COLS * SF_ATOM_COLS
                sf_at = blocked_sf_byte(row + sfa_row_off, col0, self.sf_atoms_k)
                out.append((packed, dq.ld_shared_u32(base_sf + sf_at)))
            else:
                col = scale_column(j, q, self.sf_vec_size)
                sf_at = blocked_sf_byte(row + sfa_row_off, col, self.sf_atoms_k)
                out.append((packed, dq.ld_shared_u8(base_sf + sf_at)))
        return out

    @cute.jit
    def _dequant_a(self, tCrA, a_bytes, j, q, small):
        """``_load_a``'s bytes -> the A fragment of k-block j (q: this thread's lane in its
        quad; small: MXFP4 on decode, every scale of the warp's stage <= 1)."""
        # Uint32 view of the F16 / BF16 fragment: word r + 2c + 4s = row r, K half c, k16 step s.
        rA = cute.recast_tensor(tCrA, Uint32)
        if cutlass.const_expr(self.e8m0_fast):
            if small:
                self._dequant_rows(rA, a_bytes, j, q, True)
            else:
                self._dequant_rows(rA, a_bytes, j, q, False)
        else:
            self._dequant_rows(rA, a_bytes, j, q, False)

    def _dequant_rows(self, rA, a_bytes, j, q, small: bool):
        """Both rows' (packed, scales) of k-block j -> their pairs in the A fragment ``rA``
        (Uint32 words); ``small``: the one-multiply MXFP4 factors."""
        for r in range(2):
            packed, sf = a_bytes[r]
            factors = self._kblock_factors(sf, j, q, small)
            convert = dq.prepacked_fp4x16_to_mma if self.w4a16 else dq.fp4x16_to_mma
            pairs = convert(packed, factors, self.f16, self.bf16_prescaled or small)
            for i in range(8):
                rA[k_order.a_fragment_word(r, i)] = pairs[i]

    def _small_scales(self, a_bytes):
        """MXFP4 on decode: whether every scale byte the warp's threads read for the stage is
        <= 127 (scale <= 1), warp-uniform so that ``_dequant_a``'s branch does not diverge."""
        bits = Uint32(0)
        for kblock in a_bytes:
            for _, sf in kblock:
                bits = bits | sf
        return cute.arch.vote_all_sync((bits & Uint32(0x80808080)) == Uint32(0))

    def _kblock_factors(self, sf, j, q, small: bool) -> list:
        """The multipliers of a row's pairs P_0..P_7 in k-block j, from its scale byte (W4A4) or
        its word of scales (W4A16); ``small``: MXFP4 scales <= 1, each carrying the 2^126 of the
        e2m1 bits (``dq.e8m0_prescaled_factor``), one multiply per pair instead of two."""
        if cutlass.const_expr(self.w4a16):
            return self._w4a16_factors(sf, j, q, small)
        if small:
            return [dq.e8m0_prescaled_factor(sf)] * 8
        return [dq.scale_factor(sf, self.f16)] * 8

    def _w4a16_factors(self, sf_word, j, q, small: bool) -> list:
        """W4A16: the multiplier of each pair P_0..P_7 of prepacked weights, from the row's word
        of scales: pair i's K values (``pair_k``) lie in scale column (64 j + pair_k) // V.
        NVFP4 k-blocks use all four scales of their word, which the four lanes of a quad (one
        row) share: lane q converts scale q, and each takes the others by shuffles; MXFP4
        k-blocks convert their two scale bytes (``small``: ``dq.e8m0_prescaled_factor``)."""
        by_byte = {}
        if self.f16 or self.bf16_prescaled:
            own = dq.e4m3_low_factor(sf_word >> (Uint32(8) * Uint32(q)), self.bf16_prescaled)
            for b in range(SF_ATOM_COLS):
                by_byte[b] = cute.arch.shuffle_sync(own, offset=b, mask_and_clamp=QUAD_SHUFFLE)
        factors = []
        for i in range(8):
            byte = (K_BLOCK * j + k_order.pair_k(i, 0)) // self.sf_vec_size % SF_ATOM_COLS
            if byte not in by_byte:
                sf_byte = (sf_word >> Uint32(8 * byte)) & Uint32(0xFF)
                if small:
                    by_byte[byte] = dq.e8m0_prescaled_factor(sf_byte)
                else:
                    by_byte[byte] = dq.scale_factor(sf_byte, self.f16)
            factors.append(by_byte[byte])
        return factors

    @cute.jit
    def _reduce_k_groups(self, tCrAcc, kgroup, tidx, base_red):
        """k_groups > 1: sum every K group's accumulators into group 0's, in group order.
        Groups 1 .. k_groups - 1 park theirs in SMEM, value-major (value i of thread t of group
        g at word ((g - 1) * values + i) * group_threads + t: a warp writes one 128-byte line),
        and group 0 adds them."""
        nacc = cute.size(tCrAcc)
        words = self.group_threads * 4
        if kgroup > 0:
            mine = base_red + ((kgroup - 1) * nacc * self.group_threads + tidx) * 4
            for i in cutlass.range_constexpr(nacc):
                dq.st_shared_f32(mine + i * words, tCrAcc[i])
        self._barrier(NamedBarrierId.K_GROUP_REDUCE, self.num_mma_threads)
        if kgroup == 0:
            for g in cutlass.range_constexpr(1, self.k_groups):
                theirs = base_red + ((g - 1) * nacc * self.group_threads + tidx) * 4
                for i in cutlass.range_constexpr(nacc):
                    tCrAcc[i] = tCrAcc[i] + dq.ld_shared_f32(theirs + i * words)
        # NOTE: group 0 has read every parked value before any group parks its next unit's.
        self._barrier(NamedBarrierId.K_GROUP_REDUCE, self.num_mma_threads)

    def _barrier(self, barrier_id: NamedBarrierId, threads: int):
        cute.arch.barrier(barrier_id=int(barrier_id), number_of_threads=threads)

    # ======================================= epilogue ==========================================
    @cute.jit
    def _epilogue(self, tCrAcc, epi_tensors, alpha, coords, thr_mma, tidx, fixup, epi_smem):
        """acc * alpha -> D: with split-K, after ``_splitk_fixup`` (``_cluster_fixup``) and by
        the last split (split 0) only; through SMEM and TMA stores (``_store_tile_tma``) or
        direct stores."""
        mD_mnl, tma_atom_d, mD_tma, mWork, mOffsets = epi_tensors
        row_tile, col_tile, lk = coords[:3]
        tile_coord = (row_tile, col_tile, lk // self.split_k)
        is_last = True
        if cutlass.const_expr(self.split_cluster):
            is_last = self._cluster_fixup(tCrAcc, tidx, *fixup)
        elif cutlass.const_expr(self.split_k > 1):
            tile_id, num_tiles = self._fixup_tile(mD_mnl, mOffsets, coords)
            split = lk % self.split_k
            is_last = self._splitk_fixup(tCrAcc, mWork, tile_id, num_tiles, split, tidx, fixup)
        if is_last:
            if cutlass.const_expr(self.tma_store):
                self._store_tile_tma(tCrAcc, alpha, mD_tma, tma_atom_d, epi_smem, tile_coord, tidx)
            elif cutlass.const_expr(self.grouped):
                mD_group = self._group_rows(mD_mnl, mOffsets, tile_coord[2])
                group_coord = (row_tile, col_tile, 0)
                self._store_tile_direct(tCrAcc, alpha, mD_group, thr_mma, group_coord)
            else:
                self._store_tile_direct(tCrAcc, alpha, mD_mnl, thr_mma, tile_coord)

    @cute.jit
    def _group_rows(self, mD_mnl, mOffsets, batch):
        """Grouped: D's rows of group ``batch`` in kernel coordinates (N, its rows, 1), so that
        the predicated stores end where the group does."""
        row0 = mOffsets[batch]
        rows = mOffsets[batch + 1] - row0
        pitch = mD_mnl.stride[1]
        layout = cute.make_layout((mD_mnl.shape[0], rows, 1), stride=(1, pitch, 0))
        return cute.make_tensor(mD_mnl.iterator + row0 * pitch, layout)

    @cute.jit
    def _fixup_tile(self, mD_mnl, mOffsets, coords):
        """(the unit's output tile among the split-K workspace's, its tiles): ``output_tile_id``
        of ``output_tiles``; grouped, (the unit's token tile among all groups') x row tiles +
        its row tile of row tiles x ``grouped_tiles`` (``launcher.workspace_elems``' count)."""
        row_tile, col_tile, lk = coords[:3]
        rows, cols = mD_mnl.shape[0], mD_mnl.shape[1]
        row_tiles, col_tiles, num_tiles = output_tiles(
            rows, cols, mD_mnl.shape[2], self.tile_rows, self.tile_cols, self.cluster_m
        )
        if cutlass.const_expr(self.grouped):
            groups = cute.size(mOffsets) - 1
            num_tiles = row_tiles * grouped_tiles(cols, groups, self.tile_cols)
            return coords[3] * row_tiles + row_tile, num_tiles
        tile_id = output_tile_id(row_tile, col_tile, lk // self.split_k, row_tiles, col_tiles)
        return tile_id, num_tiles

    @cute.jit
    def _splitk_fixup(self, tCrAcc, mWork, tile_id, num_tiles, split, tidx, flag_addr):
        """Split-K: park this split's fp32 fragment at output tile ``tile_id`` of the workspace's
        ``num_tiles``; the split that arrives last at the tile's counter sums all of them in
        split order (the result does not depend on the arrival order) into ``tCrAcc`` and
        resets the counter.  Returns whether this is it."""
        nacc = cute.size(tCrAcc)
        work = mWork.iterator.toint()
        frag_stride = Int64(self.group_threads * nacc * 4)
        # value-major partials (value i of thread t at 4 * (i * threads + t)): every warp access
        # is one contiguous 128-byte line
        value_stride = self.group_threads * 4
        my_frag = work + (Int64(tile_id * self.split_k + split) * frag_stride + Int64(tidx * 4))
        counter = work + Int64(num_tiles) * Int64(self.split_k) * frag_stride + Int64(tile_id * 4)
        self._park_partial(tCrAcc, my_frag, value_stride)
        self._barrier(NamedBarrierId.SPLITK_FIXUP, self.group_threads)
        if tidx == 0:
            # NOTE: after the barrier, this acq_rel atomic's cumulative gpu-scope release publishes
            # the group's partials; the last split's atomic acquires every earlier one.
            old = dq.atomic_add_global_u32(counter, Uint32(1))
            last = old == Uint32(self.split_k - 1)
            if last:
                dq.st_global_u32(counter, Uint32(0))
            dq.st_shared_b32(flag_addr, Uint32(last))
        self._barrier(NamedBarrierId.SPLITK_FIXUP, self.group_threads)
        is_last = dq.ld_shared_u32(flag_addr) != Uint32(0)
        if is_last:
            # every split's partial (this one's too: the same bits, read back) is loaded before
            # any is added: one memory round trip per chunk of values, not one per split
            tile_frags = work + (Int64(tile_id * self.split_k) * frag_stride + Int64(tidx * 4))
            # at most 128 loads at once, fewer where they and the accumulators (plus 24 registers
            # for the rest) would not fit the consumer's budget
            loads = min(128, self.mma_regs - nacc - 24)
            chunk = max(1, min(nacc, loads // self.split_k))
            for c0 in cutlass.range_constexpr(0, nacc, chunk):
                width = min(chunk, nacc - c0)
                self._sum_partials(tCrAcc, tile_frags, (frag_stride, value_stride), c0, width)
        return is_last

    @cute.jit
    def _cluster_fixup(self, tCrAcc, tidx, xchg, buf, phase):
        """Split-K on a 2x1 cluster: split 1 stores its fp32 fragment into split 0's ring through
        distributed SMEM (``st.async``, counted by split 0's FULL barrier) once split 0's last
        wgmma of the unit has completed (FREE); split 0 sums 0 + its own + split 1's, in
        ``_splitk_fixup``'s order, and frees the ring for its producer's next unit (DONE).
        ``phase``: the barriers' parity for this unit.  Returns whether this CTA stores D."""
        nacc = cute.size(tCrAcc)
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        # 16-byte chunks, chunk c of thread t at 16 * (c * threads + t): a warp writes 512 bytes
        chunk_stride = self.group_threads * 16
        mine = buf + tidx * 16
        full = xchg + ExchangeBarrier.FULL
        if rank == 0:
            # every wgmma of this warp has completed: its reads of the ring are done
            cute.arch.sync_warp()
            if tidx % 32 == 0:
                free = xchg + ExchangeBarrier.FREE
                dq.mbarrier_arrive_cluster(dq.mapa_shared(free.toint(), Int32(1)))
            if tidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(full, nacc * self.group_threads * 4)
            dq.mbarrier_wait_cluster(full.toint(), phase)
            self._add_peer_partial(tCrAcc, mine, chunk_stride)
            cute.arch.sync_warp()
            if tidx % 32 == 0:
                cute.arch.mbarrier_arrive(xchg + ExchangeBarrier.DONE)
        else:
            dq.mbarrier_wait_cluster((xchg + ExchangeBarrier.FREE).toint(), phase)
            remote_full = dq.mapa_shared(full.toint(), Int32(0))
            self._send_partial(tCrAcc, dq.mapa_shared(mine, Int32(0)), chunk_stride, remote_full)
        return rank == 0

    # NOTE: the four helpers below are plain Python, unrolled as the kernel is traced: their
    # loops index the accumulator fragment and Python lists with constants.
    def _send_partial(self, tCrAcc, remote, chunk_stride: int, remote_full):
        """This thread's fp32 partial, in 16-byte chunks, to the peer's SMEM at ``remote``."""
        for c in range(cute.size(tCrAcc) // 4):
            values = [tCrAcc[4 * c + j] for j in range(4)]
            dq.st_async_v4_f32(remote + c * chunk_stride, values, remote_full)

    def _add_peer_partial(self, tCrAcc, mine, chunk_stride: int):
        """tCrAcc = 0 + tCrAcc + the peer's partial at ``mine`` (``_send_partial``'s chunks)."""
        for c in range(cute.size(tCrAcc) // 4):
            for j in range(4):
                theirs = dq.ld_shared_f32(mine + c * chunk_stride + j * 4)
                i = 4 * c + j
                tCrAcc[i] = (cutlass.Float32(0.0) + tCrAcc[i]) + theirs

    def _park_partial(self, tCrAcc, my_frag, value_stride: int):
        """This thread's fp32 partial, value-major, at ``my_frag``."""
        for i in range(cute.size(tCrAcc)):
            dq.st_global_f32(my_frag + i * value_stride, tCrAcc[i])

    def _sum_partials(self, tCrAcc, tile_frags, strides, c0: int, width: int):
        """tCrAcc[c0 : c0 + width] = 0 + partial 0 + partial 1 + ... (split order), every
        load issued before any add."""
        frag_stride, value_stride = strides
        parts = [
            [
                dq.ld_global_cg_f32(tile_frags + sp * frag_stride + (c0 + v) * value_stride)
                for v in range(width)
            ]
            for sp in range(self.split_k)
        ]
        for v in range(width):
            total = cutlass.Float32(0.0)
            for sp in range(self.split_k):
                total = total + parts[sp][v]
            tCrAcc[c0 + v] = total

    @cute.jit
    def _store_tile_direct(self, tCrAcc, alpha, mD_mnl, thr_mma, tile_coord):
        """acc * alpha -> D with predicated stores from registers (ragged rows and cols)."""
        tile = (self.tile_rows, self.tile_cols)
        # (rows, cols)
        gD = cute.local_tile(mD_mnl, tile, tile_coord)
        cD = cute.local_tile(cute.make_identity_tensor(mD_mnl.shape), tile, tile_coord)
        # (MMA, MMA_M, MMA_N)
        tCgD = thr_mma.partition_C(gD)
        tCcD = thr_mma.partition_C(cD)
        tCrD = cute.make_rmem_tensor_like(tCrAcc, mD_mnl.element_type)
        tCrD.store((tCrAcc.load() * alpha).to(mD_mnl.element_type))
        self._store_inside(tCrD, tCgD, tCcD, mD_mnl.shape[0], mD_mnl.shape[1])

    def _store_inside(self, tCrD, tCgD, tCcD, rows, cols):
        """tCgD[i] = tCrD[i] where D holds coordinate tCcD[i] (plain Python: the loop unrolls
        as it is traced)."""
        for i in range(cute.size(tCrD)):
            self._store_if_inside(tCrD, tCgD, tCcD, i, rows, cols)

    @cute.jit
    def _store_if_inside(self, tCrD, tCgD, tCcD, i: cutlass.Constexpr, rows, cols):
        crd = tCcD[i]
        if crd[0] < rows and crd[1] < cols:
            tCgD[i] = tCrD[i]

    @cute.jit
    def _store_tile_tma(self, tCrAcc, alpha, mD_tma, tma_atom_d, epi_smem, tile_coord, tidx):
        """One subtile at a time: this thread's values * alpha -> SMEM buffer, then the first
        consumer warp issues its TMA store (which clips ragged rows and cols); the stores drain
        while the next unit's mainloop runs."""
        sD, epi_mma, d_pipeline = epi_smem
        # (rows, epi cols, 1, subtiles)
        gD_epi = cute.flat_divide(
            cute.local_tile(mD_tma, (self.tile_rows, self.tile_cols), tile_coord), self.epi_tile
        )
        # (TMA, epi stage) / (TMA, 1, subtiles)
        bSG_sD, bSG_gD = _tma_partition(tma_atom_d, sD, gD_epi, 2)
        # (MMA, MMA_M, MMA_N, epi stage): this thread's accumulator positions in a subtile
        tCsD = epi_mma.get_slice(tidx).partition_C(sD)
        # (MMA, MMA_M, MMA_N) of one subtile
        tRS_rAcc = cute.make_rmem_tensor(tCsD[(None, None, None, 0)].shape, self.acc_dtype)
        tRS_rD = cute.make_rmem_tensor(tRS_rAcc.shape, self.c_dtype)
        per_subtile = cute.size(tRS_rAcc)
        for sub in cutlass.range_constexpr(self.epi_subtiles):
            buf = sub % self.epi_stages
            for i in cutlass.range_constexpr(per_subtile):
                tRS_rAcc[i] = tCrAcc[sub * per_subtile + i]
            tRS_rD.store((tRS_rAcc.load() * alpha).to(self.c_dtype))
            cute.autovec_copy(tRS_rD, tCsD[(None, None, None, buf)])
            # NOTE: generic-proxy SMEM writes must be fenced before the async-proxy TMA store
            # reads them, and every consumer thread must have written its part.
            cute.arch.fence_proxy("async.shared", space="cta")
            self._barrier(NamedBarrierId.EPILOGUE, self.group_threads)
            if tidx // 32 == 0:
                cute.copy(tma_atom_d, bSG_sD[(None, buf)], bSG_gD[(None, 0, sub)])
                d_pipeline.producer_commit()
                # the store of the subtile that used the next buffer has read it
                d_pipeline.producer_acquire()
            self._barrier(NamedBarrierId.EPILOGUE, self.group_threads)

    # ======================================= prologue grid =====================================
    @cute.kernel
    def convert_operands(
        self, kernel_b: tuple, kernel_a: tuple, k: Int32, k_pad: Int32, divisors: tuple
    ):
        """Prologue grid: packed FP4 (rows, K/2, L) + blocked scales -> F16 / BF16 (rows, K_pad,
        L) in the mainloop's permuted K order (``token_chunk_layout``), for kernel B and (prefill)
        kernel A, each given as (packed, scales, copy); kernel B's CTAs come first.

        With ``prologue_pdl`` this grid may start before the GEMM ahead of it ends: nothing may
        read the operands or write the copies (which that GEMM may still read) before the wait,
        and the release stays after it, since the next GEMM requests its first weights and may
        store the epilogue of units without k-tiles before its own wait."""
        blocks_per_row, rows_div_b, rows_div_a = divisors
        mB, mA = kernel_b[0], kernel_a[0]
        cute.arch.griddepcontrol_wait()
        # the GEMM (launched with PDL) may start now; it waits for this grid before it loads a copy
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        per_cta = self.convert_threads * self.convert_unroll
        chunks_per_row = k_pad // K_BLOCK * CHUNKS_PER_KBLOCK
        chunks_b = cute.size(mB.shape[0]) * cute.size(mB.shape[2]) * chunks_per_row
        ctas_b = (chunks_b + per_cta - 1) // per_cta
        if bidx < ctas_b:
            first = bidx * per_cta + tidx
            # W4A16: prepacked weights, K_pad wide (no 32-wide tail)
            k_b = k_pad if cutlass.const_expr(self.w4a16) else k
            self._convert_chunks(kernel_b, first, chunks_b, k_b, k_pad, blocks_per_row, rows_div_b)
        elif cutlass.const_expr(self.convert_a):
            chunks_a = cute.size(mA.shape[0]) * cute.size(mA.shape[2]) * chunks_per_row
            first = (bidx - ctas_b) * per_cta + tidx
            self._convert_chunks(kernel_a, first, chunks_a, k, k_pad, blocks_per_row, rows_div_a)

    @cute.jit
    def _convert_chunks(self, operand, first, chunks, k, k_pad, blocks_per_row, rows_div):
        """16-byte output chunks first + j * convert_threads, j < convert_unroll, of one operand
        (packed, blocked scales, copy); chunks row-major over (L, rows, K_pad / 64, 8), chunk
        c is pair p = c % 4 of 32-bit word c % 8 // 4 of its block's four 16-groups."""
        mPacked, mSF, mConv = operand
        # NOTE: unsigned index arithmetic: % and // by powers of two are single AND / shift
        # instructions (signed ones need sign fix-ups), and every index here is >= 0.
        rows = Uint32(mPacked.shape[0])
        atoms_k = Uint32((k // self.sf_vec_size + SF_ATOM_COLS - 1) // SF_ATOM_COLS)
        row_blocks = (rows + SF_ATOM_ROWS - 1) // SF_ATOM_ROWS
        loaded = []
        for j in cutlass.range_constexpr(self.convert_unroll):
            # loads at a clamped (valid) chunk; only valid chunks are stored below
            c = Uint32(cutlass.min(first + j * self.convert_threads, chunks - 1))
            chunk = c % CHUNKS_PER_KBLOCK
            row_id, kb = divmod(Int32(c // CHUNKS_PER_KBLOCK), blocks_per_row)
            batch, row = divmod(row_id, rows_div)
            kb, batch, row = Uint32(kb), Uint32(batch), Uint32(row)
            row_id = Int64(row_id)
            # all ones for a full 64-block, zero for the 32-wide tail of K = 32 x odd
            keep = Uint32(0) - Uint32(kb * K_BLOCK + K_BLOCK <= Uint32(k))
            src = mPacked.iterator.toint() + row_id * Int64(k // 2) + Int64(kb * (K_BLOCK // 2))
            word_off, _, dst_off = dq.token_chunk_layout(chunk)
            src = src + Int64(word_off)
            # The block's scale columns lie in one atom's 4 bytes (NVFP4: columns 4kb .. 4kb+3,
            # MXFP4: 2kb, 2kb+1): one aligned 32-bit load.
            col0 = kb * (K_BLOCK // self.sf_vec_size)
            sf_word = blocked_sf_word(batch, row, col0, row_blocks, atoms_k)
            sf4 = dq.ld_global_nc_u32(mSF.iterator.toint() + Int64(sf_word))
            words = []
            for q in cutlass.range_constexpr(4):
                if cutlass.const_expr(q < 2):
                    words.append(dq.ld_global_nc_u32(src + Int64(8 * q)))
                else:
                    # the tail's missing groups 2, 3 re-read groups 0, 1; zeroed below
                    off = Int64(8 * (q - 2)) + Int64(16) * Int64(keep & Uint32(1))
                    words.append(dq.ld_global_nc_u32(src + off))
            if cutlass.const_expr(self.swap_ab):
                # decode: the tokens' copy has whole tiles of rows (mConv.shape[0] >= rows)
                row_id = Int64(batch) * Int64(mConv.shape[0]) + Int64(row)
            dst = mConv.iterator.toint() + (row_id * Int64(k_pad) + Int64(kb * K_BLOCK)) * 2
            loaded.append((words, sf4, keep, col0, chunk, dst + Int64(dst_off)))
        for j in cutlass.range_constexpr(self.convert_unroll):
            words, sf4, keep, col0, chunk, dst = loaded[j]
            _, shift, _ = dq.token_chunk_layout(chunk)
            # (W4A16: prepacked weights take the scale of each chunk's pair)
            pair = chunk if self.w4a16 else None
            out = dq.convert_chunk_words(
                words, sf4, keep, col0, shift, self.sf_vec_size, self.f16, pair
            )
            if first + j * self.convert_threads < chunks:
                dq.st_global_v4_b32(dst, out)

    # ======================================= helpers ===========================================
    @staticmethod
    def _k_major(ptr, rows, cols, l):  # noqa: E741
        """A (rows, cols, L) tensor, cols contiguous."""
        return cute.make_tensor(
            ptr, cute.make_layout((rows, cols, l), stride=(cols, 1, rows * cols))
        )

    @staticmethod
    def _blocked_sf_tensor(ptr, rows, sf_atoms_k, l):  # noqa: E741
        # NOTE: the 128x4 atoms are stored row-block-major, so the atoms of one row block are
        # contiguous along K; two 256-byte halves keep every TMA box extent <= 256.
        row_blocks = (rows + SF_ATOM_ROWS - 1) // SF_ATOM_ROWS
        atom_stride = cute.assume(SF_ATOM_BYTES * sf_atoms_k, SF_ATOM_BYTES)
        return cute.make_tensor(
            ptr,
            cute.make_layout(
                (256, 2 * sf_atoms_k, row_blocks, l),
                stride=(1, 256, atom_stride, atom_stride * row_blocks),
            ),
        )

    def converted_rows_b(self, rows_b):
        """Rows of the converted kernel-B copy (Python or DSL integers)."""
        return decode_token_rows(rows_b, self.tile_cols) if self.swap_ab else rows_b

    @staticmethod
    def can_implement(*config, **kw_config) -> tuple[bool, list[str]]:
        """(ok, reasons): ``check_fp4_gemm_config`` (same arguments) in the CUTLASS shape."""
        reasons = check_fp4_gemm_config(*config, **kw_config)
        return not reasons, reasons


# ---------------------------------------------------------------------------------------------
# Output tiles and compilation (the torch-facing launcher: fp4_ops.sm90.launcher)
# ---------------------------------------------------------------------------------------------
def output_tiles(rows, cols, l, tile_rows, tile_cols, cluster_m):  # noqa: E741
    """(row tiles, col tiles, tiles) of the kernel's output, on the host
    (``launcher.workspace_elems``) and in the kernel (the split-K fix-up's addresses): Python or
    DSL integers.  A 2x1 cluster runs an even number of row tiles."""
    row_tiles = (rows + tile_rows * cluster_m - 1) // (tile_rows * cluster_m) * cluster_m
    col_tiles = (cols + tile_cols - 1) // tile_cols
    return row_tiles, col_tiles, row_tiles * col_tiles * l


def grouped_tiles(rows, groups, tile_cols):
    """The most token tiles that ``rows`` token rows in ``groups`` groups can fill, each group
    in tiles of ``tile_cols``: ceil(rows / tile_cols) + min(groups, rows) - 1 (ceil(a) +
    ceil(b) <= ceil(a + b) + 1, over the at most min(groups, rows) groups holding rows), 0
    without rows; the grouped kernel's bound on units and split-K tiles, on the host and in the
    kernel: Python or DSL integers."""
    full = (rows + tile_cols - 1) // tile_cols
    return full + cutlass.max(cutlass.min(groups, rows) - 1, 0)


def output_tile_id(row_tile, col_tile, batch, row_tiles, col_tiles):
    """Index of an output tile among ``output_tiles``' (row-tile-major within a column, then
    columns, then batches): its split-K partials and counter in the workspace.  Python or DSL
    integers."""
    return (batch * col_tiles + col_tile) * row_tiles + row_tile


def tma_store_fits(n: int, c_dtype: str) -> bool:
    """Whether D (row pitch N elements) can leave through TMA stores: TMA strides are
    multiples of 16 bytes.  Otherwise the kernel variant with direct stores runs."""
    return n * C_DTYPES[c_dtype].width // 8 % 16 == 0


def compile_gemm(
    sf_vec_size: int,
    c_dtype: str,
    path: str,
    mma_tiler_mn: tuple[int, int],
    split_k: int = 1,
    num_sms: int = H200_SM_COUNT,
    options: str = "",
    cluster_shape_mn: tuple[int, int] | None = None,
    tma_store: bool = True,
    k_groups: int = 1,
    a_dtype: str = W4A4,
    grouped: bool = False,
    tokens_converted: bool = False,
):
    """Compile for any M, N, K, L (runtime values); returns (kernel object, executor).

    ``options="--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir=DIR"`` cross-compiles on a
    machine without a GPU; the executor's ``__ptx__`` / ``__cubin__`` then hold PTX and cubin.
    ``num_sms``: the GPU's SMs (the persistent grid holds occupancy x num_sms CTAs);
    ``cluster_shape_mn`` None takes ``default_cluster(path)``; ``tma_store`` False compiles the
    direct-store epilogue (``tma_store_fits``); ``grouped`` the grouped W4A16 kernel;
    ``tokens_converted`` the W4A4 decode kernel without its prologue grid."""
    cluster = default_cluster(path) if cluster_shape_mn is None else tuple(cluster_shape_mn)
    gemm = BlockwiseGemmFp4Sm90(
        sf_vec_size,
        path,
        mma_tiler_mn,
        cluster,
        split_k,
        tma_store,
        k_groups,
        a_dtype,
        grouped,
        tokens_converted,
    )
    return gemm, compile_kernel(gemm, c_dtype, num_sms, options)


def compile_kernel(gemm: BlockwiseGemmFp4Sm90, c_dtype: str, num_sms: int, options: str = ""):
    """``compile_gemm``'s executor of a kernel object, for any M, N, K, L."""
    import cuda.bindings.driver as cuda_driver

    args = compile_arguments(gemm, c_dtype)
    return cute.compile(gemm, *args, num_sms, cuda_driver.CUstream(0), options=options)


def compile_arguments(gemm: BlockwiseGemmFp4Sm90, c_dtype: str) -> tuple:
    """Placeholders of the launch's arguments but the SM count and the stream, for
    ``cute.compile``: the pointers (compilation only needs their element types and alignments)
    and (M, N, K, L)."""
    return (*gmem_pointers(gemm, c_dtype, [0] * 11), (Int32(1),) * 4)


def gmem_pointers(gemm: BlockwiseGemmFp4Sm90, c_dtype: str, addresses) -> list:
    """The kernel's pointers (A, B, SFA, SFB, D, workspace, converted B, converted A: 16-byte
    aligned; alpha: fp32; group offsets: int32; alpha's scale: fp32) at ``addresses``."""
    from cutlass.cute.runtime import make_ptr

    a_type = gemm.mma_dtype if gemm.w4a16 else cutlass.Uint8
    dtypes = [a_type] + [cutlass.Uint8] * 3 + [C_DTYPES[c_dtype], cutlass.Float32]
    dtypes += [gemm.mma_dtype] * 2 + [cutlass.Float32, cutlass.Int32, cutlass.Float32]
    aligns = [16] * 8 + [4, 4, 4]
    return [
        make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)
        for dtype, address, align in zip(dtypes, addresses, aligns, strict=True)
    ]


def torch_dtype(c_dtype: str):
    import torch

    return {"BFloat16": torch.bfloat16, "Float16": torch.float16, "Float32": torch.float32}[c_dtype]
