# SPDX-License-Identifier: BSD-3-Clause
"""Persistent, warp-specialized NVFP4 / MXFP4 block-scaled GEMM with TMA for datacenter Blackwell.

What it computes
----------------
    D[m, n, l] = alpha * sum_k (A[m, k, l] * SFA[m, k // V, l]) * (B[n, k, l] * SFB[n, k // V, l])

* A [M, K, L] and B [N, K, L]: Float4E2M1FN, K-major, two values per byte (element 2i in the low
  nibble), exactly as ``torch.float4_e2m1fn_x2`` / cuBLASLt / ``reference.pack_fp4`` store them.
* SFA, SFB: one FP8 scale per V consecutive K elements, in the 128x4 blocked layout that
  tcgen05, cuBLASLt and ``torch._scaled_mm`` read (``reference.to_blocked``).
  NVFP4: Float8E4M3FN scales, V = 16.  MXFP4: Float8E8M0FNU scales, V = 32.
* alpha: fp32 scalar applied to the fp32 accumulator in the epilogue (for NVFP4 it is the
  product of the two per-tensor global scales).  The kernel reads it from global memory when it
  runs, so it can be computed on the device and changed between CUDA-graph replays.
* D [M, N, L]: BFloat16, Float16 or Float32, N-major, with a row pitch of ``c_row_pitch(N)``
  elements (N rounded up to 16 bytes, the TMA stride rule); columns past N are never written.

Warp roles (192 threads, one CTA per SM)
----------------------------------------
    =======  ==========  ========================================================================
    warp     role        work
    =======  ==========  ========================================================================
    0 - 3    epilogue    alpha GMEM -> registers once; per tile TMEM -> registers (tcgen05.ld),
                         * alpha, convert, -> SMEM, TMA store; warp 0 also allocates and
                         frees tensor memory
    4        MMA         SFA/SFB SMEM -> TMEM (tcgen05.cp), block-scaled tcgen05.mma into TMEM
    5        TMA         A, B, SFA, SFB GMEM -> SMEM ring (cp.async.bulk.tensor, multicast)
    =======  ==========  ========================================================================

Pipelines (producer -> consumer)
--------------------------------
    ab_pipeline   (PipelineTmaUmma,  ``num_ab_stage`` deep):   TMA warp -> MMA warp
    acc_pipeline  (PipelineUmmaAsync, ``num_acc_stage`` deep): MMA warp -> epilogue warps
                  (tile N 256: one stage over two TMEM buffers that overlap by the scale-factor
                  columns; the epilogue reads the shared columns first and releases early)
    c_pipeline    (PipelineTmaStore, ``num_c_stage`` deep):    epilogue warps -> TMA store unit
Every role walks the same static persistent tile schedule, so the three agree on the tile order
without talking to each other.

Budgets of the default configuration (NVFP4, 256x128 MMA tile on a 2x1 cluster, BFloat16 D)
------------------------------------------------------------------------------------------
    The 256x128 MMA runs on a CTA pair; each CTA holds 128 rows of A and 64 rows of B.
    SMEM per CTA and k-tile stage: A 16 KiB + B 8 KiB + SFA 2 KiB + SFB 2 KiB = 28 KiB; 7 stages
    fit into the 227 KiB of an sm_100 CTA beside 3 epilogue buffers of 128x32 outputs.  TMEM per
    CTA: 2 x 128 accumulator columns (double-buffered, so the epilogue of tile i overlaps the
    mainloop of tile i+1) + 16 SFA + 16 SFB columns of 512.  ``--compile_only`` prints these.

FP4-specific constraints (``check_fp4_gemm_config`` explains each refusal)
-------------------------------------------------------------------------
* One tcgen05.mma.kind::mxf4nvf4 consumes K = 64 (32 bytes of packed FP4 per row); a k-tile is
  4 MMAs = K 256 = one 128-byte swizzle row of packed FP4.
* K must be a multiple of 32: TMA needs 16-byte aligned rows, and 32 FP4 values are 16 bytes.
* Scale factors are read by the MMA from tensor memory, never from registers: there is no
  "apply the scale to the accumulator" step as in FP8 blockwise kernels.
* MMA tile M 128 (1 CTA) or 256 (2 CTAs, cluster M even); tile N 64, 128, 192 or 256;
  cluster M, N powers of two, at most 16 CTAs, each at most 4 (scale-factor multicast).

Targets: ``sm_100f`` (default) builds one cubin for B200/GB200 (sm_100) and B300/GB300
(sm_103); ``--gpu_arch sm_100a`` / ``sm_103a`` build for one of them.

Run
---
    python blockwise_gemm_fp4.py --mnkl 8192,8192,8192,1                 # Blackwell: check + time
    python blockwise_gemm_fp4.py --mnkl 8192,8192,8192,1 --compile_only  # any machine
    python blockwise_gemm_fp4.py --sf_vec_size 32 --sf_dtype Float8E8M0FNU \\
        --mma_tiler_mn 256,256 --cluster_shape_mn 2,1 --c_dtype Float32
"""

from __future__ import annotations

import argparse
import enum
import math
import operator
import os
import sys
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.tensor_utils import LayoutEnum

# NOTE: sm_100 limits.  232448 bytes of dynamic SMEM per CTA, 512 TMEM columns per SM.
SM100_SMEM_CAPACITY = 232448
SM100_TMEM_COLUMNS = 512
# Compile targets, and the GPUs (compute capabilities) each one runs on.  sm_100f is the family
# target: one cubin for B200/GB200 (sm_100) and B300/GB300 (sm_103).
GPU_ARCHS = {"sm_100f": ((10, 0), (10, 3)), "sm_100a": ((10, 0),), "sm_103a": ((10, 3),)}
DEFAULT_GPU_ARCH = "sm_100f"
BLACKWELL_CAPABILITIES = GPU_ARCHS[DEFAULT_GPU_ARCH]
# B200: 148 SMs; used only to size the persistent grid when cross-compiling without a GPU.
B200_SM_COUNT = 148
# Dense FP4 tensor-core peak of a B200, for the "% of peak" line.
B200_FP4_PEAK_TFLOPS = 9000.0

# tcgen05 block-scaled FP4 MMA: K per instruction, and instructions per k-tile.
MMA_INST_K = 64
MMA_INSTS_PER_K_TILE = 4
# Rows of one scale-factor atom (tcgen05.cp moves 4 x 32 lanes x 128 bits).
SF_ATOM_ROWS = 128
SF_ATOM_LANES = 32

SF_FORMATS = {
    # sf_vec_size: (scale dtype name, format name)
    16: ("Float8E4M3FN", "NVFP4"),
    32: ("Float8E8M0FNU", "MXFP4"),
}
C_DTYPES = {"BFloat16": cutlass.BFloat16, "Float16": cutlass.Float16, "Float32": cutlass.Float32}
SF_DTYPES = {"Float8E4M3FN": cutlass.Float8E4M3FN, "Float8E8M0FNU": cutlass.Float8E8M0FNU}


class NamedBarrierId(enum.IntEnum):
    """Hardware named-barrier ids (0 is reserved for __syncthreads)."""

    EPILOGUE = 1  # the four epilogue warps, around each SMEM -> TMA-store hand-off
    TMEM_ALLOC = 2  # epilogue warps + MMA warp: the TMEM base address is published


class WarpRole(enum.IntEnum):
    EPILOGUE_FIRST = 0  # warps 0..3
    MMA = 4
    TMA = 5


NUM_EPILOGUE_WARPS = 4
THREADS_PER_WARP = 32


def _ints(values, count: int) -> tuple[int, ...] | None:
    """``values`` as ``count`` Python ints, or None unless they are integers (numpy's too; not
    bool, float or str)."""
    try:
        if isinstance(values, str) or any(isinstance(v, bool) for v in values):
            return None
        ints = tuple(operator.index(v) for v in values)
    except TypeError:
        return None
    return ints if len(ints) == count else None


# ---------------------------------------------------------------------------------------------
# Configuration checks, usable from other kernels too
# ---------------------------------------------------------------------------------------------
def check_fp4_gemm_config(
    mnkl: tuple[int, int, int, int],
    sf_vec_size: int = 16,
    sf_dtype: str = "Float8E4M3FN",
    c_dtype: str = "BFloat16",
    mma_tiler_mn: tuple[int, int] = (128, 128),
    cluster_shape_mn: tuple[int, int] = (1, 1),
) -> list[str]:
    """Check an FP4 block-scaled GEMM configuration against the sm_100 rules.

    Returns a list of readable reasons why it cannot run; an empty list means it can.  Pure
    Python: it needs neither a GPU nor a compile, so other kernels can call it too.
    """
    # Integers of any type (numpy's too), but not bool and not float.
    given = {
        "mnkl": (mnkl, 4, "four integers M,N,K,L"),
        "mma_tiler_mn": (mma_tiler_mn, 2, "two integers M,N"),
        "cluster_shape_mn": (cluster_shape_mn, 2, "two integers M,N"),
        "sf_vec_size": ((sf_vec_size,), 1, "an integer"),
    }
    ints = {name: _ints(value, count) for name, (value, count, _) in given.items()}
    bad = [
        f"{name} must be {what}, got {value if count > 1 else value[0]!r}"
        for name, (value, count, what) in given.items()
        if ints[name] is None
    ]
    if bad:
        return bad
    reasons: list[str] = []
    m, n, k, l_ = ints["mnkl"]
    mma_tiler_mn, cluster_shape_mn = ints["mma_tiler_mn"], ints["cluster_shape_mn"]
    (sf_vec_size,) = ints["sf_vec_size"]
    for name, value in (("M", m), ("N", n), ("K", k), ("L", l_)):
        if value < 1:
            reasons.append(f"{name} must be >= 1, got {value}")
        elif value >= 2**31:
            reasons.append(f"{name}={value} does not fit the kernel's 32-bit extents (< 2^31)")
    if k >= 1 and k % 32 != 0:
        reasons.append(
            f"K={k} is not a multiple of 32: a packed FP4 row of A and B must be a whole number "
            "of 16-byte TMA units (32 FP4 values)"
        )
    if c_dtype in C_DTYPES and min(m, n, k) >= 1:
        # NOTE: the global layouts carry 32-bit strides; the batch strides M*K, N*K (FP4
        # elements) and M * row pitch of D (elements) must not wrap.
        for name, extent in (
            ("M*K", m * k),
            ("N*K", n * k),
            ("M * row pitch of D", m * c_row_pitch(n, c_dtype)),
        ):
            if extent >= 2**31:
                reasons.append(
                    f"{name} = {extent} elements does not fit the kernel's 32-bit strides "
                    "(< 2^31); split the problem along M or N"
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
    tile_m, tile_n = mma_tiler_mn
    if tile_m not in (128, 256):
        reasons.append(
            f"MMA tile M={tile_m} is not supported: 128 (one CTA) or 256 (a CTA pair, cta_group::2)"
        )
    if tile_n not in (64, 128, 192, 256):
        reasons.append(f"MMA tile N={tile_n} is not supported: use 64, 128, 192 or 256")
    cm, cn = cluster_shape_mn
    for name, value in (("M", cm), ("N", cn)):
        if value < 1 or value & (value - 1):
            reasons.append(f"cluster shape {name}={value} must be a power of two")
        elif value > 4:
            reasons.append(
                f"cluster shape {name}={value} exceeds 4: the scale-factor tiles cannot be "
                "multicast to more than 4 CTAs along one mode"
            )
    if cm >= 1 and cn >= 1 and cm * cn > 16:
        reasons.append(f"cluster {cm}x{cn} has {cm * cn} CTAs; at most 16 are supported")
    if tile_m == 256 and cm % 2 != 0:
        reasons.append(
            "MMA tile M=256 runs on a pair of CTAs (cta_group::2): cluster shape M must be even"
        )
    if not reasons:
        # The tile schedule numbers the tiles with 32-bit integers, and its last step goes one
        # grid (far fewer than 2^16 clusters) past the last tile: that must not wrap either.
        cta_m = tile_m // (2 if tile_m == 256 else 1)
        num_cta_tiles = -(-m // cta_m) * -(-n // tile_n) * l_
        if num_cta_tiles > 2**31 - 2**16:
            reasons.append(
                f"{num_cta_tiles} CTA tiles of {cta_m}x{tile_n} do not fit the tile schedule's "
                "32-bit tile numbers (<= 2^31 - 2^16); split the batch"
            )
    return reasons


def pick_tile_and_cluster(
    mnkl: tuple[int, int, int, int],
    mma_tiler_mn: tuple[int, int] | None = None,
    cluster_shape_mn: tuple[int, int] | None = None,
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The MMA tile and cluster for a problem: what the caller left as None is chosen here.

    Tile M: 256 on a CTA pair when M is larger than one 128-row CTA tile (the pair shares each
    B tile, halving B's SMEM and TMA traffic per CTA) and the cluster, if given, has room for
    the pair (even M); else 128 on one CTA (a 256-row tile would be at least half padding).
    Tile N: 64 when N fits into 64 columns, else 128.  Cluster: a CTA pair (2, 1) for tile M
    256, a single CTA otherwise.  The CLI and the Python API both use this rule.
    """
    m, n = mnkl[0], mnkl[1]
    if mma_tiler_mn is None:
        given_cluster = None if cluster_shape_mn is None else _ints(cluster_shape_mn, 2)
        pair_fits = given_cluster is None or given_cluster[0] % 2 == 0
        mma_tiler_mn = (256 if m > 128 and pair_fits else 128, 64 if n <= 64 else 128)
    if cluster_shape_mn is None:
        cluster_shape_mn = (2, 1) if mma_tiler_mn[0] == 256 else (1, 1)
    return tuple(mma_tiler_mn), tuple(cluster_shape_mn)


def assert_block_scaled_fp4_mma(tiled_mma: cute.TiledMma, sf_vec_size: int, sf_dtype) -> None:
    """Raise TypeError unless ``tiled_mma`` is the block-scaled FP4 tcgen05 MMA asked for.

    A plain MMA over FP4 data (what ``make_trivial_tiled_mma`` builds for Float4E2M1FN: kind
    f8f6f4, K 32) compiles and runs, and silently ignores every scale factor; so does a block-
    scaled MMA of another kind or scale type.  This turns those mistakes into errors at trace time.
    """
    op = tiled_mma.op
    want = tcgen05.MmaMXF4NVF4Op if sf_vec_size == 16 else tcgen05.MmaMXF4Op
    if (
        not isinstance(op, want)
        or op.sf_vec_size != sf_vec_size
        or op.sf_dtype is not sf_dtype
        or op.shape_mnk[2] != MMA_INST_K
    ):
        raise TypeError(
            f"expected a block-scaled FP4 MMA ({want.__name__}, sf_vec_size={sf_vec_size}, "
            f"sf_dtype={sf_dtype.__name__}, K={MMA_INST_K}), got {type(op).__name__}: {op}"
        )


def sfb_layout_for_tile_n_192(sfb_layout: cute.Layout) -> cute.Layout:
    """Re-index an SFB layout (((32, 4), atoms), K, L) for 192-wide N tiles loaded 256 rows at once.

    The N tiles of 192 rows start at rows 192 t, i.e. inside scale atom floor(1.5 t).  Splitting
    the atom index as ((a, b), c) with strides (x, x, 3x) (x: one atom) puts a inside the 256-row
    (two-atom) load and makes tile t = b + 2c start at atom b + 3c = floor(1.5 t); odd tiles then
    begin 64 rows into their first atom, which the MMA warp skips with a 2-column TMEM offset.
    Works on the TMA coordinate layout (ScaledBasis strides) and on plain integer layouts alike.
    """
    atom_stride = sfb_layout.stride[0][1]
    num_atom_pairs = cute.ceil_div(sfb_layout.shape[0][1], 4)
    shape = (
        (sfb_layout.shape[0][0], ((2, 2), num_atom_pairs)),
        sfb_layout.shape[1],
        sfb_layout.shape[2],
    )
    # NOTE: a ScaledBasis stride must be scaled as 3 * x, not x * 3.
    stride = (
        (sfb_layout.stride[0][0], ((atom_stride, atom_stride), 3 * atom_stride)),
        sfb_layout.stride[1],
        sfb_layout.stride[2],
    )
    return cute.make_layout(shape, stride=stride)


def sf_layout(shape_rows_k_l: tuple, sf_vec_size: int) -> cute.Layout:
    """The layout of one operand's scales over its (rows, K, L) coordinates: the 128x4 blocked
    layout ``reference.to_blocked`` writes, with a stride-0 mode over the V elements of a block.

    (((32, 4), RestRows), ((V, 4), RestK), L): row r sits in lane r % 32 of the 32-lane group
    r // 32 % 4 of atom r // 128.
    """
    return blockscaled_utils.tile_atom_to_shape_SF(shape_rows_k_l, sf_vec_size)


def sfb_load_rows(cta_tile_n: int) -> int:
    """Rows of SFB loaded (and copied to TMEM) per N tile: whole 128-row scale atoms."""
    return -(-cta_tile_n // SF_ATOM_ROWS) * SF_ATOM_ROWS


def sfb_tile_layout(sfb_layout: cute.Layout, cta_tile_n: int) -> cute.Layout:
    """The SFB layout the N tiles of ``cta_tile_n`` rows are cut from (``sfb_load_rows`` at a
    time): 192-wide tiles need the re-index of ``sfb_layout_for_tile_n_192``, others none."""
    if cta_tile_n == 192:
        return sfb_layout_for_tile_n_192(sfb_layout)
    return sfb_layout


def sfb_tile_index(tile_n, cta_tile_n: int):
    """Index of the SFB tile that holds N tile ``tile_n``'s scales: a 64-wide tile shares its
    128-row scale atom with its neighbour."""
    return tile_n // 2 if cta_tile_n == 64 else tile_n


def sfb_tmem_column_shift(tile_n, cta_tile_n: int):
    """TMEM columns between an SFB tile's first row and N tile ``tile_n``'s: tiles of N 64 and
    192 start half-way into a 128-row scale atom on odd tiles, and rows 64..127 of an atom sit
    two columns (of 32 lanes each) further on."""
    return (tile_n % 2) * 2 if cta_tile_n in (64, 192) else 0


@dataclass(frozen=True)
class TileBudget:
    """SMEM and TMEM use of one CTA, computed from the tile alone (see ``tile_budget``)."""

    ab_stage_bytes: int
    num_ab_stage: int
    num_acc_stage: int
    num_c_stage: int
    epi_bytes_per_stage: int
    acc_columns: int
    sfa_columns: int
    sfb_columns: int

    @property
    def overlapping_accum(self) -> bool:
        """Two accumulators that share their scale-factor-sized edge (see ``tile_budget``)."""
        return self.num_acc_stage == 1

    @property
    def acc_tmem_columns(self) -> int:
        if self.overlapping_accum:
            return 2 * self.acc_columns - self.sfa_columns - self.sfb_columns
        return self.acc_columns * self.num_acc_stage

    @property
    def tmem_columns(self) -> int:
        return self.acc_tmem_columns + self.sfa_columns + self.sfb_columns


def tile_budget(mma_tiler_mn: tuple[int, int], sf_vec_size: int, c_dtype: str) -> TileBudget:
    """SMEM stage counts and TMEM columns for a tile, from byte arithmetic alone.

    Per CTA and per k-tile (K 256): A is (tile_m / cta_pair) x 128 bytes, B (tile_n / cta_pair)
    x 128 bytes, and SFA / SFB one byte per row per ``256 / sf_vec_size`` scale columns, SFB
    rows rounded up to the 128-row scale atom.  The epilogue keeps ``num_c_stage`` subtiles of
    128 x 32 outputs: two while the mainloop stages are counted, then as many more as the SMEM
    left after those stages holds.  The kernel takes its stage counts and TMEM columns from
    here; every tile ``check_fp4_gemm_config`` accepts fits (two or more stages, <= 512 TMEM
    columns: a test sweeps them) and the kernel asserts that its real SMEM layouts fit.

    TMEM: two accumulators of tile N columns when they fit beside the scale factors; otherwise
    (tile N 256) one accumulator pipeline stage over two overlapping buffers, the second one
    starting ``sf columns`` before the end of the first (see ``BlockwiseGemmFp4Sm100``).
    """
    tile_m, tile_n = mma_tiler_mn
    cta_pair = 2 if tile_m == 256 else 1
    cta_m = tile_m // cta_pair
    k_tile = MMA_INST_K * MMA_INSTS_PER_K_TILE
    sf_per_row = k_tile // sf_vec_size
    sfb_rows = -(-tile_n // SF_ATOM_ROWS) * SF_ATOM_ROWS
    ab_stage_bytes = (
        cta_m * k_tile // 2 + (tile_n // cta_pair) * k_tile // 2 + cta_m * sf_per_row
    ) + sfb_rows * sf_per_row
    c_bytes = C_DTYPES[c_dtype].width // 8
    epi_bytes = cta_m * 32 * c_bytes
    num_c_stage = 2
    reserved = 1024  # mbarriers and the TMEM address slot
    num_ab_stage = (SM100_SMEM_CAPACITY - reserved - num_c_stage * epi_bytes) // ab_stage_bytes
    num_c_stage = (SM100_SMEM_CAPACITY - reserved - num_ab_stage * ab_stage_bytes) // epi_bytes
    # One TMEM column holds 4 scales for each of 32 lanes: a 128-row atom takes 4 columns. The
    # budget reserves NVFP4's 4 atoms per k-tile for MXFP4 too (it fills 2), as CUTLASS does.
    sfa_columns = (cta_m // SF_ATOM_LANES) * MMA_INSTS_PER_K_TILE
    sfb_columns = (sfb_rows // SF_ATOM_LANES) * MMA_INSTS_PER_K_TILE
    acc_columns = tile_n
    num_acc_stage = 2 if 2 * acc_columns + sfa_columns + sfb_columns <= SM100_TMEM_COLUMNS else 1
    return TileBudget(
        ab_stage_bytes=ab_stage_bytes,
        num_ab_stage=num_ab_stage,
        num_acc_stage=num_acc_stage,
        num_c_stage=num_c_stage,
        epi_bytes_per_stage=epi_bytes,
        acc_columns=acc_columns,
        sfa_columns=sfa_columns,
        sfb_columns=sfb_columns,
    )


def c_row_pitch(n: int, c_dtype: str) -> int:
    """Row pitch (elements) of D: N rounded up so that every row starts 16-byte aligned."""
    per_16b = 128 // C_DTYPES[c_dtype].width
    return -(-n // per_16b) * per_16b


@dataclass
class TileSchedule:
    """The static persistent tile schedule that every warp role walks.

    Cluster tiles (one cluster's worth of CTA tiles) are numbered M fastest, then N, then L.  The
    grid is ``(cluster M, cluster N, G)`` with G persistent clusters; cluster ``z`` of the grid
    works on cluster tiles z, z + G, z + 2G, ...  Built on the host and passed to the kernel; the
    divisions by the cluster counts use precomputed fast-divmod divisors.
    """

    num_cluster_tiles: cutlass.Int32
    clusters_m: cute.FastDivmodDivisorV2
    clusters_n: cute.FastDivmodDivisorV2

    @staticmethod
    def create(num_ctas_mnl: tuple, cluster_shape_mn: tuple[int, int]) -> TileSchedule:
        """Host side: the schedule of a (CTA tiles M, N, L) problem on clusters of this shape."""
        clusters_m = cute.ceil_div(num_ctas_mnl[0], cluster_shape_mn[0])
        clusters_n = cute.ceil_div(num_ctas_mnl[1], cluster_shape_mn[1])
        return TileSchedule(
            num_cluster_tiles=cutlass.Int32(clusters_m * clusters_n * num_ctas_mnl[2]),
            clusters_m=cute.fast_divmod_create_divisor_v2(clusters_m),
            clusters_n=cute.fast_divmod_create_divisor_v2(clusters_n),
        )

    def grid(self, cluster_shape_mn: tuple[int, int], max_active_clusters: int) -> tuple:
        """Host side: one persistent cluster per cluster tile, at most ``max_active_clusters``."""
        return (*cluster_shape_mn, cutlass.min(self.num_cluster_tiles, max_active_clusters))

    def first_work(self) -> cutlass.Int32:
        """Device side: this CTA's first cluster tile."""
        return cutlass.Int32(cute.arch.block_idx()[2])

    def next_work(self, work: cutlass.Int32) -> cutlass.Int32:
        """Device side: the cluster tile after ``work`` for this CTA."""
        return work + cute.arch.grid_dim()[2]

    def is_valid(self, work: cutlass.Int32) -> cutlass.Boolean:
        return work < self.num_cluster_tiles

    def cta_tile(self, work: cutlass.Int32, cluster_shape_mn: tuple[int, int]) -> tuple:
        """Device side: (M, N, L) CTA-tile coordinates of this CTA in cluster tile ``work``."""
        rest, cluster_m = divmod(work, self.clusters_m)
        tile_l, cluster_n = divmod(rest, self.clusters_n)
        # The grid's x and y extents are the cluster shape: block x, y is the place in the cluster.
        bidx, bidy, _ = cute.arch.block_idx()
        cm, cn = cluster_shape_mn
        uniform = cute.arch.make_warp_uniform
        return (
            uniform(cluster_m * cm + bidx % cm),
            uniform(cluster_n * cn + bidy % cn),
            uniform(tile_l),
        )

    def mma_tile(self, work: cutlass.Int32, cluster_shape_mn: tuple[int, int], cta_pair: int):
        """Device side: (M, N, L) MMA-tile coordinates of this CTA in cluster tile ``work``: the
        two CTAs of a pair (adjacent M CTA tiles) share one MMA tile of twice their rows."""
        tile_m, tile_n, tile_l = self.cta_tile(work, cluster_shape_mn)
        return tile_m // cta_pair, tile_n, tile_l


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
class BlockwiseGemmFp4Sm100:
    """NVFP4 / MXFP4 block-scaled GEMM, persistent and warp-specialized, for sm_100 / sm_103.

    :param sf_vec_size: 16 (NVFP4) or 32 (MXFP4).
    :param mma_tiler_mn: MMA tile (M, N); M 256 uses a CTA pair (cta_group::2).
    :param cluster_shape_mn: CTAs per cluster along M and N; A is multicast along N, B along M.
    """

    def __init__(
        self,
        sf_vec_size: int,
        mma_tiler_mn: tuple[int, int],
        cluster_shape_mn: tuple[int, int],
    ):
        self.sf_vec_size = sf_vec_size
        self.mma_tiler_mn = tuple(mma_tiler_mn)
        self.cluster_shape_mn = tuple(cluster_shape_mn)
        self.use_2cta_instrs = mma_tiler_mn[0] == 256
        self.cta_group = tcgen05.CtaGroup.TWO if self.use_2cta_instrs else tcgen05.CtaGroup.ONE
        self.acc_dtype = cutlass.Float32
        self.a_major = OperandMajorMode.K
        self.b_major = OperandMajorMode.K
        self.c_layout = LayoutEnum.ROW_MAJOR
        self.threads_per_cta = THREADS_PER_WARP * (NUM_EPILOGUE_WARPS + 2)
        self.smem_capacity = SM100_SMEM_CAPACITY
        self.num_tmem_alloc_cols = SM100_TMEM_COLUMNS

    def _setup_attributes(self):
        """Everything that depends on the operand types: MMA, tiles, stages, SMEM layouts."""
        self.tiled_mma = self._make_tiled_mma(self.mma_tiler_mn, self.cta_group)
        # The scale-factor atom covers 128 rows of N, so SFB is loaded (and copied to TMEM) in
        # tiles of N rounded up to 128 by a 1-CTA view of the same MMA.
        cta_pair = cute.size(self.tiled_mma.thr_id.shape)
        self.mma_tiler_mn_sfb = (
            self.mma_tiler_mn[0] // cta_pair,
            sfb_load_rows(self.mma_tiler_mn[1]),
        )
        self.tiled_mma_sfb = self._make_tiled_mma(self.mma_tiler_mn_sfb, tcgen05.CtaGroup.ONE)

        mma_inst_k = cute.size(self.tiled_mma.shape_mnk, mode=[2])
        # NOTE: the block-scaled FP4 MMA is K = 64 wide; a k-tile of 4 MMAs is K 256, i.e. 128
        # bytes of packed FP4 per row: exactly one 128-byte swizzle row.
        assert mma_inst_k == MMA_INST_K, f"unexpected FP4 MMA K {mma_inst_k}"
        k_tile = mma_inst_k * MMA_INSTS_PER_K_TILE
        self.mma_tiler = (*self.mma_tiler_mn, k_tile)
        self.mma_tiler_sfb = (*self.mma_tiler_mn_sfb, k_tile)
        self.cta_tile_shape_mnk = (self.mma_tiler[0] // cta_pair, self.mma_tiler[1], k_tile)

        # (V, M, N, K) cluster layouts: V is the CTA pair of a 2-CTA MMA.
        self.cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (self.tiled_mma.thr_id.shape,)
        )
        self.cluster_layout_sfb_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (self.tiled_mma_sfb.thr_id.shape,)
        )
        self.num_mcast_ctas_a = cute.size(self.cluster_layout_vmnk.shape[2])
        self.num_mcast_ctas_b = cute.size(self.cluster_layout_vmnk.shape[1])
        self.is_a_mcast = self.num_mcast_ctas_a > 1
        self.is_b_mcast = self.num_mcast_ctas_b > 1

        self.epi_tile = sm100_utils.compute_epilogue_tile_shape(
            self.cta_tile_shape_mnk, self.use_2cta_instrs, self.c_layout, self.c_dtype
        )

        # Stage counts and TMEM columns: tile_budget is their one source (byte arithmetic);
        # __call__ checks that the real SMEM layouts fit.
        c_dtype_name = next(name for name, t in C_DTYPES.items() if t is self.c_dtype)
        budget = tile_budget(self.mma_tiler_mn, self.sf_vec_size, c_dtype_name)
        self.num_acc_stage = budget.num_acc_stage
        self.num_ab_stage = budget.num_ab_stage
        self.num_c_stage = budget.num_c_stage
        self.num_sfa_tmem_cols = budget.sfa_columns
        self.num_sfb_tmem_cols = budget.sfb_columns
        num_sf_tmem_cols = self.num_sfa_tmem_cols + self.num_sfb_tmem_cols

        self.a_smem_layout_staged = sm100_utils.make_smem_layout_a(
            self.tiled_mma, self.mma_tiler, self.a_dtype, self.num_ab_stage
        )
        self.b_smem_layout_staged = sm100_utils.make_smem_layout_b(
            self.tiled_mma, self.mma_tiler, self.b_dtype, self.num_ab_stage
        )
        self.sfa_smem_layout_staged = blockscaled_utils.make_smem_layout_sfa(
            self.tiled_mma, self.mma_tiler, self.sf_vec_size, self.num_ab_stage
        )
        self.sfb_smem_layout_staged = blockscaled_utils.make_smem_layout_sfb(
            self.tiled_mma, self.mma_tiler, self.sf_vec_size, self.num_ab_stage
        )
        self.c_smem_layout_staged = sm100_utils.make_smem_layout_epi(
            self.c_dtype, self.c_layout, self.epi_tile, self.num_c_stage
        )

        # TMEM columns: [accumulators | SFA | SFB].  Two full accumulators when they fit beside
        # the scale factors.  Otherwise (tile N 256) the accumulator pipeline has one stage but
        # alternates between two buffers that overlap in ``num_sf_tmem_cols`` columns: buffer 1
        # starts that many columns before the end of buffer 0.  The epilogue reads the shared
        # columns first and then releases the stage, so the next tile's MMAs start while it
        # stores the rest of the tile.
        self.overlapping_accum = budget.overlapping_accum
        tile_n = self.cta_tile_shape_mnk[1]
        self.acc_buffer_stride_cols = (
            tile_n - num_sf_tmem_cols if self.overlapping_accum else tile_n
        )
        self.num_acc_tmem_cols = budget.acc_tmem_columns
        # The epilogue releases an overlapping buffer after reading subtiles 0..this one, which
        # cover more than the num_sf_tmem_cols shared columns.
        self.acc_release_subtile = num_sf_tmem_cols // cute.size(self.epi_tile[1])
        assert budget.tmem_columns <= self.num_tmem_alloc_cols, "TMEM overflow"

    def global_tensors(self, a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, problem_mnkl):
        """(mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl): the operands over their coordinates."""
        m, n, k, l = problem_mnkl  # noqa: E741 (CUTLASS names the batch extent l)
        # K-major packed FP4: (M, K, L) with K contiguous.  K % 32 == 0 keeps rows 16B-aligned.
        mA_mkl = cute.make_tensor(
            a_ptr, cute.make_ordered_layout((m, cute.assume(k, 32), l), order=(1, 0, 2))
        )
        mB_nkl = cute.make_tensor(
            b_ptr, cute.make_ordered_layout((n, cute.assume(k, 32), l), order=(1, 0, 2))
        )
        # D is N-major with a row pitch rounded up to 16 bytes (the TMA stride rule).
        c_align = 128 // self.c_dtype.width
        ldc = cute.assume((n + c_align - 1) // c_align * c_align, c_align)
        mC_mnl = cute.make_tensor(c_ptr, cute.make_layout((m, n, l), stride=(ldc, 1, m * ldc)))
        # Scale factors in the 128x4 blocked layout (sf_layout).
        mSFA_mkl = cute.make_tensor(sfa_ptr, sf_layout(mA_mkl.shape, self.sf_vec_size))
        mSFB_nkl = cute.make_tensor(sfb_ptr, sf_layout(mB_nkl.shape, self.sf_vec_size))
        return mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl

    def _sfb_tma_layout(self, sfb_layout: cute.Layout) -> cute.Layout:
        """The SFB layout this kernel's N tiles are loaded through (``sfb_tile_layout``)."""
        return sfb_tile_layout(sfb_layout, self.mma_tiler_mn[1])

    def _sfb_coords(self, tile_n):
        """(SFB tile index, SFB TMEM column shift) of N tile ``tile_n`` for this kernel's tile."""
        tile_size_n = self.mma_tiler_mn[1]
        return sfb_tile_index(tile_n, tile_size_n), sfb_tmem_column_shift(tile_n, tile_size_n)

    def _make_tiled_mma(self, mma_tiler_mn, cta_group) -> cute.TiledMma:
        """The block-scaled FP4 MMA, and a guard that it really is one.

        NOTE: ``make_trivial_tiled_mma`` must not be used for FP4: depending on the DSL release
        it either rejects Float4E2M1FN or builds a plain kind::f8f6f4 MMA that ignores the scale
        factors.  The block-scaled builder picks kind::mxf4nvf4, which reads SFA/SFB from TMEM.
        """
        tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            self.a_major,
            self.b_major,
            self.sf_dtype,
            self.sf_vec_size,
            cta_group,
            mma_tiler_mn,
        )
        assert_block_scaled_fp4_mma(tiled_mma, self.sf_vec_size, self.sf_dtype)
        return tiled_mma

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        problem_mnkl: tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32, cutlass.Int32],
        alpha_ptr: cute.Pointer,
        max_active_clusters: cutlass.Constexpr,
        stream,
    ):
        """Host side: global layouts, TMA descriptors, grid, shared storage, launch."""
        self.a_dtype = a_ptr.value_type
        self.b_dtype = b_ptr.value_type
        self.sf_dtype = sfa_ptr.value_type
        self.c_dtype = c_ptr.value_type
        self._setup_attributes()
        mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl = self.global_tensors(
            a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, problem_mnkl
        )
        # One fp32 value in global memory: the kernel reads alpha when it runs, not at launch.
        mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout(1))
        tile_schedule, grid = self._compute_grid(
            mC_mnl, self.cta_tile_shape_mnk, self.cluster_shape_mn, max_active_clusters
        )
        self.launch(mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl, mAlpha, tile_schedule, grid, stream)

    @cute.jit
    def launch(
        self, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl, mAlpha, tile_schedule, grid, stream
    ):
        """Host side: TMA descriptors, shared storage, launch of ``kernel`` on ``grid``."""
        (
            (tma_atom_a, tma_tensor_a),
            (tma_atom_b, tma_tensor_b),
            (tma_atom_sfa, tma_tensor_sfa),
            (tma_atom_sfb, tma_tensor_sfb),
        ) = self.make_tma_loads(mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl)
        tma_atom_c, tma_tensor_c = self.make_tma_store(mC_mnl)

        @cute.struct
        class SharedStorage:
            ab_full_mbar: cute.struct.MemRange[cutlass.Int64, self.num_ab_stage]
            ab_empty_mbar: cute.struct.MemRange[cutlass.Int64, self.num_ab_stage]
            acc_full_mbar: cute.struct.MemRange[cutlass.Int64, self.num_acc_stage]
            acc_empty_mbar: cute.struct.MemRange[cutlass.Int64, self.num_acc_stage]
            tmem_dealloc_mbar: cutlass.Int64
            tmem_base_addr: cutlass.Int32
            # (EPI_TILE_M, EPI_TILE_N, C_STAGE)
            sC: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, cute.cosize(self.c_smem_layout_staged.outer)],
                1024,
            ]
            # (MMA, MMA_M, MMA_K, AB_STAGE)
            sA: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(self.a_smem_layout_staged.outer)],
                1024,
            ]
            # (MMA, MMA_N, MMA_K, AB_STAGE)
            sB: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(self.b_smem_layout_staged.outer)],
                1024,
            ]
            # (MMA, MMA_M, MMA_K, AB_STAGE)
            sSFA: cute.struct.Align[
                cute.struct.MemRange[self.sf_dtype, cute.cosize(self.sfa_smem_layout_staged)],
                1024,
            ]
            # (MMA, MMA_N, MMA_K, AB_STAGE)
            sSFB: cute.struct.Align[
                cute.struct.MemRange[self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)],
                1024,
            ]

        self.shared_storage = SharedStorage
        # NOTE: tile_budget counted the stages from byte arithmetic; the real layouts must fit.
        assert SharedStorage.size_in_bytes() <= self.smem_capacity, "SMEM overflow"

        self.kernel(
            self.tiled_mma,
            self.tiled_mma_sfb,
            tma_atom_a,
            tma_tensor_a,
            tma_atom_b,
            tma_tensor_b,
            tma_atom_sfa,
            tma_tensor_sfa,
            tma_atom_sfb,
            tma_tensor_sfb,
            tma_atom_c,
            tma_tensor_c,
            mAlpha,
            self.cluster_layout_vmnk,
            self.cluster_layout_sfb_vmnk,
            self.a_smem_layout_staged,
            self.b_smem_layout_staged,
            self.sfa_smem_layout_staged,
            self.sfb_smem_layout_staged,
            self.c_smem_layout_staged,
            self.epi_tile,
            tile_schedule,
        ).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            stream=stream,
            min_blocks_per_mp=1,
        )

    def make_tma_store(self, mC_mnl):
        """(atom, coordinate tensor) of the TMA store of D, one epilogue subtile at a time."""
        epi_smem_layout = cute.slice_(self.c_smem_layout_staged, (None, None, 0))
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mC_mnl, epi_smem_layout, self.epi_tile
        )

    def make_tma_loads(self, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl):
        """TMA atoms and coordinate tensors of the four loads, ((atom, tensor) for A, B, SFA,
        SFB); sets ``num_tma_load_bytes``, the bytes one k-tile stage receives."""
        # TMA loads.  A and SFA are multicast along the cluster's N mode, B and SFB along M.
        a_smem_layout = cute.slice_(self.a_smem_layout_staged, (None, None, None, 0))
        tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, self.tiled_mma.thr_id),
            mA_mkl,
            a_smem_layout,
            self.mma_tiler,
            self.tiled_mma,
            self.cluster_layout_vmnk.shape,
        )
        b_smem_layout = cute.slice_(self.b_smem_layout_staged, (None, None, None, 0))
        tma_atom_b, tma_tensor_b = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_shape_mn, self.tiled_mma.thr_id),
            mB_nkl,
            b_smem_layout,
            self.mma_tiler,
            self.tiled_mma,
            self.cluster_layout_vmnk.shape,
        )
        # NOTE: scale factors travel as 16-bit TMA elements: a 1-byte element type would make
        # the box's inner extent too small for the 16-byte TMA minimum on narrow tiles.
        sfa_smem_layout = cute.slice_(self.sfa_smem_layout_staged, (None, None, None, 0))
        tma_atom_sfa, tma_tensor_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, self.tiled_mma.thr_id),
            mSFA_mkl,
            sfa_smem_layout,
            self.mma_tiler,
            self.tiled_mma,
            self.cluster_layout_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        sfb_smem_layout = cute.slice_(self.sfb_smem_layout_staged, (None, None, None, 0))
        tma_atom_sfb, tma_tensor_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_SFB(self.cluster_shape_mn, self.tiled_mma.thr_id),
            mSFB_nkl,
            sfb_smem_layout,
            self.mma_tiler_sfb,
            self.tiled_mma_sfb,
            self.cluster_layout_sfb_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        tma_tensor_sfb = cute.make_tensor(
            tma_tensor_sfb.iterator, self._sfb_tma_layout(tma_tensor_sfb.layout)
        )

        cta_pair = cute.size(self.tiled_mma.thr_id.shape)
        self.num_tma_load_bytes = cta_pair * (
            cute.size_in_bytes(self.a_dtype, a_smem_layout)
            + cute.size_in_bytes(self.b_dtype, b_smem_layout)
            + cute.size_in_bytes(self.sf_dtype, sfa_smem_layout)
            + cute.size_in_bytes(self.sf_dtype, sfb_smem_layout)
        )
        return (
            (tma_atom_a, tma_tensor_a),
            (tma_atom_b, tma_tensor_b),
            (tma_atom_sfa, tma_tensor_sfa),
            (tma_atom_sfb, tma_tensor_sfb),
        )

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        mC_mnl: cute.Tensor,
        mAlpha: cute.Tensor,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        c_smem_layout_staged: cute.ComposedLayout,
        epi_tile: cute.Tile,
        tile_schedule: TileSchedule,
    ):
        """Device side: shared set-up, then one branch per warp role."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()

        if warp_idx == WarpRole.TMA:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_sfa)
            cpasync.prefetch_descriptor(tma_atom_sfb)
            cpasync.prefetch_descriptor(tma_atom_c)

        # Where this CTA sits: its half of a CTA pair (V) and its (M, N) place in the cluster.
        bidx, _, _ = cute.arch.block_idx()
        mma_tile_coord_v = bidx % cute.size(tiled_mma.thr_id.shape)
        is_leader_cta = mma_tile_coord_v == 0
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_coord_vmnk = cluster_layout_vmnk.get_flat_coord(cta_rank_in_cluster)
        cta_coord_sfb_vmnk = cluster_layout_sfb_vmnk.get_flat_coord(cta_rank_in_cluster)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        ab_pipeline, acc_pipeline, tmem = self._make_pipelines(
            storage, tiled_mma, cluster_layout_vmnk
        )
        # Barrier inits must be visible cluster-wide before any peer signals them.
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        # (EPI_TILE_M, EPI_TILE_N, C_STAGE)
        sC = storage.sC.get_tensor(c_smem_layout_staged.outer, swizzle=c_smem_layout_staged.inner)
        # (MMA, MMA_M, MMA_K, AB_STAGE)
        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        # (MMA, MMA_N, MMA_K, AB_STAGE)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        # (MMA, MMA_M, MMA_K, AB_STAGE)
        sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
        # (MMA, MMA_N, MMA_K, AB_STAGE)
        sSFB = storage.sSFB.get_tensor(sfb_smem_layout_staged)

        tCgA, tCgB, tCgSFA, tCgSFB, tCgC, k_tile_cnt = self._partition_global_tiles(
            tiled_mma, tiled_mma_sfb, mma_tile_coord_v, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl
        )

        # (MMA, MMA_M, MMA_N, ACC_BUFFER)
        tCtAcc_fake = self._acc_tensor_layout(tiled_mma)

        # Peers have initialised their barriers: from here on they may be signalled.
        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        if warp_idx == WarpRole.TMA:
            self._tma_warp(
                ab_pipeline,
                tile_schedule,
                k_tile_cnt,
                cta_coord_vmnk,
                cta_coord_sfb_vmnk,
                cluster_layout_vmnk,
                cluster_layout_sfb_vmnk,
                tma_atom_a,
                tma_atom_b,
                tma_atom_sfa,
                tma_atom_sfb,
                tCgA,
                tCgB,
                tCgSFA,
                tCgSFB,
                sA,
                sB,
                sSFA,
                sSFB,
            )
        if warp_idx == WarpRole.MMA:
            self._mma_warp(
                tiled_mma,
                ab_pipeline,
                acc_pipeline,
                tmem,
                tile_schedule,
                k_tile_cnt,
                is_leader_cta,
                tCtAcc_fake,
                sA,
                sB,
                sSFA,
                sSFB,
                sfa_smem_layout_staged,
                sfb_smem_layout_staged,
            )
        if warp_idx < WarpRole.MMA:
            self._epilogue_warps(
                tidx,
                warp_idx,
                mAlpha,
                acc_pipeline,
                tmem,
                tile_schedule,
                tCtAcc_fake,
                tCgC,
                sC,
                tma_atom_c,
                epi_tile,
            )

    def _make_pipelines(self, storage, tiled_mma: cute.TiledMma, cluster_layout_vmnk):
        """(ab_pipeline, acc_pipeline, TMEM allocator) on this CTA's barriers in ``storage``."""
        # ab_pipeline: TMA warp -> MMA warp.  The MMA warp of the leader CTA releases a stage for
        # every CTA whose TMA wrote into it (the multicast peers along M and N).
        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_full_mbar.data_ptr(),
            num_stages=self.num_ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
            ),
            tx_count=self.num_tma_load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        # acc_pipeline: MMA warp -> epilogue warps (of both CTAs of a pair).
        num_acc_consumer_threads = (
            THREADS_PER_WARP * NUM_EPILOGUE_WARPS * cute.size(tiled_mma.thr_id.shape)
        )
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_full_mbar.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, num_acc_consumer_threads
            ),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = cutlass.memory.TmemAllocator(
            storage.tmem_base_addr.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=int(NamedBarrierId.TMEM_ALLOC),
                num_threads=THREADS_PER_WARP * (NUM_EPILOGUE_WARPS + 1),
            ),
            allocator_warp_id=int(WarpRole.EPILOGUE_FIRST),
            is_two_cta=cute.size(tiled_mma.thr_id.shape) == 2,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_mbar.ptr,
        )
        return ab_pipeline, acc_pipeline, tmem

    def _partition_global_tiles(
        self, tiled_mma, tiled_mma_sfb, mma_tile_coord_v, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl
    ):
        """The operands cut into MMA tiles, partitioned for this CTA's half (V) of the MMA:
        (tCgA, tCgB, tCgSFA, tCgSFB, tCgC, k-tile count)."""
        # (bM, bK, RestM, RestK, RestL)
        gA_mkl = cute.local_tile(
            mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None)
        )
        # (bN, bK, RestN, RestK, RestL)
        gB_nkl = cute.local_tile(
            mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None)
        )
        # (bM, bK, RestM, RestK, RestL)
        gSFA_mkl = cute.local_tile(
            mSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None)
        )
        # (bN_sf, bK, RestN_sf, RestK, RestL)
        gSFB_nkl = cute.local_tile(
            mSFB_nkl, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None)
        )
        # (bM, bN, RestM, RestN, RestL)
        gC_mnl = cute.local_tile(
            mC_mnl, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None)
        )
        k_tile_cnt = cute.size(gA_mkl, mode=[3])

        thr_mma = tiled_mma.get_slice(mma_tile_coord_v)
        thr_mma_sfb = tiled_mma_sfb.get_slice(mma_tile_coord_v)
        # (MMA, MMA_M, MMA_K, RestM, RestK, RestL)
        tCgA = thr_mma.partition_A(gA_mkl)
        # (MMA, MMA_N, MMA_K, RestN, RestK, RestL)
        tCgB = thr_mma.partition_B(gB_nkl)
        # (MMA, MMA_M, MMA_K, RestM, RestK, RestL)
        tCgSFA = thr_mma.partition_A(gSFA_mkl)
        # (MMA, MMA_N, MMA_K, RestN, RestK, RestL)
        tCgSFB = thr_mma_sfb.partition_B(gSFB_nkl)
        # (MMA, MMA_M, MMA_N, RestM, RestN, RestL)
        tCgC = thr_mma.partition_C(gC_mnl)
        return tCgA, tCgB, tCgSFA, tCgSFB, tCgC, k_tile_cnt

    def _acc_tensor_layout(self, tiled_mma: cute.TiledMma) -> cute.Tensor:
        """(MMA, MMA_M, MMA_N, ACC_BUFFER): the accumulators' TMEM layout (address comes later)."""
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        num_acc_buffers = 2 if self.overlapping_accum else self.num_acc_stage
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, num_acc_buffers))
        if cutlass.const_expr(self.overlapping_accum):
            # Buffer 1 starts acc_buffer_stride_cols columns after buffer 0 (they overlap).
            acc_stride = tCtAcc_fake.stride
            buffer_stride = self.acc_buffer_stride_cols * acc_stride[0][1]
            tCtAcc_fake = cute.make_tensor(
                tCtAcc_fake.iterator,
                cute.make_layout(
                    tCtAcc_fake.shape,
                    stride=(acc_stride[0], acc_stride[1], acc_stride[2], buffer_stride),
                ),
            )
        return tCtAcc_fake

    # =========================================================================================
    # TMA warp: A, B, SFA, SFB -> SMEM ring
    # =========================================================================================
    @cute.jit
    def _tma_warp(
        self,
        ab_pipeline: pipeline.PipelineTmaUmma,
        tile_schedule: TileSchedule,
        k_tile_cnt: cutlass.Int32,
        cta_coord_vmnk: tuple,
        cta_coord_sfb_vmnk: tuple,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        tma_atom_a: cute.CopyAtom,
        tma_atom_b: cute.CopyAtom,
        tma_atom_sfa: cute.CopyAtom,
        tma_atom_sfb: cute.CopyAtom,
        tCgA: cute.Tensor,
        tCgB: cute.Tensor,
        tCgSFA: cute.Tensor,
        tCgSFB: cute.Tensor,
        sA: cute.Tensor,
        sB: cute.Tensor,
        sSFA: cute.Tensor,
        sSFB: cute.Tensor,
    ):
        # CTAs sharing a load: A and SFA go to the CTAs of this cluster row (mode 2 = N),
        # B to the CTAs of this cluster column (mode 1 = M), SFB likewise on its 1-CTA view.
        a_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape)
        b_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape)
        sfb_cta_layout = cute.make_layout(
            cute.slice_(cluster_layout_sfb_vmnk, (0, None, 0, 0)).shape
        )
        # ((ATOM_V, REST_V), AB_STAGE), ((ATOM_V, REST_V), RestM, RestK, RestL)
        tAsA, tAgA = self._tma_partition(tma_atom_a, cta_coord_vmnk[2], a_cta_layout, sA, tCgA)
        # ((ATOM_V, REST_V), AB_STAGE), ((ATOM_V, REST_V), RestN, RestK, RestL)
        tBsB, tBgB = self._tma_partition(tma_atom_b, cta_coord_vmnk[1], b_cta_layout, sB, tCgB)
        # ((ATOM_V, REST_V), AB_STAGE), ((ATOM_V, REST_V), RestM, RestK, RestL)
        tAsSFA, tAgSFA = self._tma_partition(
            tma_atom_sfa, cta_coord_vmnk[2], a_cta_layout, sSFA, tCgSFA
        )
        # ((ATOM_V, REST_V), AB_STAGE), ((ATOM_V, REST_V), RestN_sf, RestK, RestL)
        tBsSFB, tBgSFB = self._tma_partition(
            tma_atom_sfb, cta_coord_sfb_vmnk[1], sfb_cta_layout, sSFB, tCgSFB
        )

        mcast_a = mcast_b = mcast_sfa = mcast_sfb = None
        if cutlass.const_expr(self.is_a_mcast or self.is_b_mcast or self.use_2cta_instrs):
            mcast_a = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=2
            )
            mcast_b = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=1
            )
            mcast_sfa = mcast_a
            mcast_sfb = cpasync.create_tma_multicast_mask(
                cluster_layout_sfb_vmnk, cta_coord_sfb_vmnk, mcast_mode=1
            )

        ab_producer_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.num_ab_stage
        )
        cta_pair = cute.size(self.tiled_mma.thr_id.shape)
        work = tile_schedule.first_work()
        while tile_schedule.is_valid(work):
            tile_m, tile_n, tile_l = tile_schedule.mma_tile(work, self.cluster_shape_mn, cta_pair)
            # ((ATOM_V, REST_V), RestK)
            tAgA_tile = tAgA[(None, tile_m, None, tile_l)]
            tBgB_tile = tBgB[(None, tile_n, None, tile_l)]
            tAgSFA_tile = tAgSFA[(None, tile_m, None, tile_l)]
            tile_n_sf, _ = self._sfb_coords(tile_n)
            tBgSFB_tile = tBgSFB[(None, tile_n_sf, None, tile_l)]

            ab_producer_state.reset_count()
            # Peek at the next stage's empty barrier one step ahead (try_wait does not block),
            # so the blocking wait below usually finds it already passed.
            empty_peek = cutlass.Boolean(True)
            if ab_producer_state.count < k_tile_cnt:
                empty_peek = ab_pipeline.producer_try_acquire(ab_producer_state)
            for _k_tile in cutlass.range(k_tile_cnt, unroll=1):
                ab_pipeline.producer_acquire(ab_producer_state, empty_peek)
                k_idx = ab_producer_state.count
                stage = ab_producer_state.index
                full_bar = ab_pipeline.producer_get_barrier(ab_producer_state)
                cute.copy(
                    tma_atom_a,
                    tAgA_tile[(None, k_idx)],
                    tAsA[(None, stage)],
                    tma_bar_ptr=full_bar,
                    mcast_mask=mcast_a,
                )
                cute.copy(
                    tma_atom_b,
                    tBgB_tile[(None, k_idx)],
                    tBsB[(None, stage)],
                    tma_bar_ptr=full_bar,
                    mcast_mask=mcast_b,
                )
                cute.copy(
                    tma_atom_sfa,
                    tAgSFA_tile[(None, k_idx)],
                    tAsSFA[(None, stage)],
                    tma_bar_ptr=full_bar,
                    mcast_mask=mcast_sfa,
                )
                cute.copy(
                    tma_atom_sfb,
                    tBgSFB_tile[(None, k_idx)],
                    tBsSFB[(None, stage)],
                    tma_bar_ptr=full_bar,
                    mcast_mask=mcast_sfb,
                )
                ab_producer_state.advance()
                empty_peek = cutlass.Boolean(True)
                if ab_producer_state.count < k_tile_cnt:
                    empty_peek = ab_pipeline.producer_try_acquire(ab_producer_state)
            work = tile_schedule.next_work(work)
        # Do not exit while peers may still signal this CTA's barriers.
        ab_pipeline.producer_tail(ab_producer_state)

    @staticmethod
    def _tma_partition(tma_atom, cta_coord, cta_layout, sX: cute.Tensor, tCgX: cute.Tensor):
        """(SMEM stages, GMEM tiles) of one TMA load for this CTA's share of a multicast.

        The K-broadcast (stride 0) modes of the scale tensors carry no data: they are dropped
        (A and B have none)."""
        sX_tma, gX_tma = cpasync.tma_partition(
            tma_atom,
            cta_coord,
            cta_layout,
            cute.group_modes(sX, 0, 3),
            cute.group_modes(tCgX, 0, 3),
        )
        return cute.filter_zeros(sX_tma), cute.filter_zeros(gX_tma)

    # =========================================================================================
    # MMA warp: scale factors SMEM -> TMEM, block-scaled MMAs into the TMEM accumulator
    # =========================================================================================
    @cute.jit
    def _mma_warp(
        self,
        tiled_mma: cute.TiledMma,
        ab_pipeline: pipeline.PipelineTmaUmma,
        acc_pipeline: pipeline.PipelineUmmaAsync,
        tmem: cutlass.memory.TmemAllocator,
        tile_schedule: TileSchedule,
        k_tile_cnt: cutlass.Int32,
        is_leader_cta: cutlass.Boolean,
        tCtAcc_fake: cute.Tensor,
        sA: cute.Tensor,
        sB: cute.Tensor,
        sSFA: cute.Tensor,
        sSFB: cute.Tensor,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
    ):
        tmem.wait_for_alloc()
        acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
        # (MMA, MMA_M, MMA_N, ACC_STAGE)
        tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

        # The scale factors live in TMEM right after the accumulators.
        sfa_tmem_col = self.num_acc_tmem_cols
        sfb_tmem_col = self.num_acc_tmem_cols + self.num_sfa_tmem_cols
        # (MMA, MMA_M, MMA_K)
        tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma,
            self.mma_tiler,
            self.sf_vec_size,
            cute.slice_(sfa_smem_layout_staged, (None, None, None, 0)),
        )
        tCtSFA = cute.make_tensor(
            cute.recast_ptr(acc_tmem_ptr + sfa_tmem_col, dtype=self.sf_dtype), tCtSFA_layout
        )
        # (MMA, MMA_N, MMA_K)
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma,
            self.mma_tiler,
            self.sf_vec_size,
            cute.slice_(sfb_smem_layout_staged, (None, None, None, 0)),
        )
        tCtSFB = cute.make_tensor(
            cute.recast_ptr(acc_tmem_ptr + sfb_tmem_col, dtype=self.sf_dtype), tCtSFB_layout
        )
        copy_s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_copy_and_partition(sSFA, tCtSFA)
        copy_s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_copy_and_partition(sSFB, tCtSFB)

        # (MMA, MMA_M, MMA_K, AB_STAGE)
        tCrA = tiled_mma.make_fragment_A(sA)
        # (MMA, MMA_N, MMA_K, AB_STAGE)
        tCrB = tiled_mma.make_fragment_B(sB)
        num_k_blocks = cute.size(tCrA, mode=[2])

        ab_consumer_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.num_ab_stage
        )
        acc_producer_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.num_acc_stage
        )
        work = tile_schedule.first_work()
        while tile_schedule.is_valid(work):
            _, tile_n, _ = tile_schedule.cta_tile(work, self.cluster_shape_mn)
            # With overlapping buffers the single pipeline stage's phase picks the buffer.
            acc_buffer = acc_producer_state.index
            if cutlass.const_expr(self.overlapping_accum):
                acc_buffer = acc_producer_state.phase ^ 1
            # (MMA, MMA_M, MMA_N)
            tCtAcc = tCtAcc_base[(None, None, None, acc_buffer)]
            # Odd N tiles of 64 and 192 rows start half-way into their first scale atom.
            tCtSFB_mma = tCtSFB
            if cutlass.const_expr(self.cta_tile_shape_mnk[1] in (64, 192)):
                _, shift = self._sfb_coords(tile_n)
                shifted = acc_tmem_ptr + sfb_tmem_col + shift
                tCtSFB_mma = cute.make_tensor(
                    cute.recast_ptr(shifted, dtype=self.sf_dtype), tCtSFB_layout
                )

            ab_consumer_state.reset_count()
            # Peek at the first stage before blocking on the accumulator buffer.
            full_peek = cutlass.Boolean(True)
            if ab_consumer_state.count < k_tile_cnt and is_leader_cta:
                full_peek = ab_pipeline.consumer_try_wait(ab_consumer_state)
            if is_leader_cta:
                acc_pipeline.producer_acquire(acc_producer_state)
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for _k_tile in cutlass.range(k_tile_cnt, unroll=1):
                if is_leader_cta:
                    ab_pipeline.consumer_wait(ab_consumer_state, full_peek)
                    stage = ab_consumer_state.index
                    # NOTE: tcgen05.cp and tcgen05.mma issued by the same thread execute in
                    # order, so the MMAs below see the scales copied here.
                    cute.copy(copy_s2t_sfa, tCsSFA_s2t[(None, None, None, None, stage)], tCtSFA_s2t)
                    cute.copy(copy_s2t_sfb, tCsSFB_s2t[(None, None, None, None, stage)], tCtSFB_s2t)
                    for k_block in cutlass.range(num_k_blocks, unroll_full=True):
                        k_coord = (None, None, k_block, stage)
                        sf_coord = (None, None, k_block)
                        cute.gemm(
                            tiled_mma,
                            tCtAcc,
                            [tCrA[k_coord], tCtSFA[sf_coord]],
                            [tCrB[k_coord], tCtSFB_mma[sf_coord]],
                            tCtAcc,
                        )
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                    # The stage is free once these MMAs complete (tcgen05.commit).
                    ab_pipeline.consumer_release(ab_consumer_state)
                ab_consumer_state.advance()
                full_peek = cutlass.Boolean(True)
                if ab_consumer_state.count < k_tile_cnt and is_leader_cta:
                    full_peek = ab_pipeline.consumer_try_wait(ab_consumer_state)
            if is_leader_cta:
                acc_pipeline.producer_commit(acc_producer_state)
            acc_producer_state.advance()
            work = tile_schedule.next_work(work)
        acc_pipeline.producer_tail(acc_producer_state)

    def _s2t_copy_and_partition(self, sSF: cute.Tensor, tSF: cute.Tensor):
        """tcgen05.cp (4 x 32 lanes x 128 bits) of one stage of scale factors into TMEM."""
        # (MMA, MMA_MN, MMA_K, AB_STAGE) without the K-broadcast modes
        sSF_compact = cute.filter_zeros(sSF)
        # (MMA, MMA_MN, MMA_K)
        tSF_compact = cute.filter_zeros(tSF)
        copy_atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.cta_group), self.sf_dtype)
        tiled_copy_s2t = tcgen05.make_s2t_copy(copy_atom, tSF_compact)
        thr_copy_s2t = tiled_copy_s2t.get_slice(0)
        # ((ATOM_V, REST_V), Rest_Tiler, MMA_MN, MMA_K, AB_STAGE), as SMEM descriptors
        # NOTE: the .warpx4 copy writes each SMEM core matrix to all four TMEM lane quadrants;
        # that broadcast mode exists only on the TMEM side, so it is made explicit on the SMEM
        # side before partitioning (the PTX is the same without it for these layouts).
        sSF_bcast = tcgen05.append_s2t_broadcast_mode(copy_atom.op, sSF_compact)
        tCsSF_s2t = tcgen05.get_s2t_smem_desc_tensor(
            tiled_copy_s2t, thr_copy_s2t.partition_S(sSF_bcast)
        )
        # ((ATOM_V, REST_V), Rest_Tiler, MMA_MN, MMA_K)
        tCtSF_s2t = thr_copy_s2t.partition_D(tSF_compact)
        return tiled_copy_s2t, tCsSF_s2t, tCtSF_s2t

    # =========================================================================================
    # Epilogue warps: TMEM -> registers -> * alpha -> SMEM -> TMA store
    # =========================================================================================
    @cute.jit
    def _epilogue_warps(
        self,
        tidx: cutlass.Int32,
        warp_idx: cutlass.Int32,
        mAlpha: cute.Tensor,
        acc_pipeline: pipeline.PipelineUmmaAsync,
        tmem: cutlass.memory.TmemAllocator,
        tile_schedule: TileSchedule,
        tCtAcc_fake: cute.Tensor,
        tCgC: cute.Tensor,
        sC: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        epi_tile: cute.Tile,
    ):
        # Loaded first: the TMEM allocation hides its latency.  NOTE: launched with PDL, this load
        # would have to follow griddepcontrol.wait, once the kernel that wrote alpha has finished.
        alpha = mAlpha[0]
        epilogue_barrier = pipeline.NamedBarrier(
            barrier_id=int(NamedBarrierId.EPILOGUE),
            num_threads=THREADS_PER_WARP * NUM_EPILOGUE_WARPS,
        )
        tmem.allocate(self.num_tmem_alloc_cols)
        tmem.wait_for_alloc()
        acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
        # (MMA, MMA_M, MMA_N, ACC_STAGE)
        tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

        (
            tiled_copy_t2r,
            tTR_tAcc_base,
            tTR_rAcc,
            tiled_copy_r2s,
            tRS_rC,
            tRS_sC,
            gC_epi,
        ) = self._epilogue_copies(tidx, tCtAcc_base, tCgC, sC, epi_tile)

        # SMEM -> GMEM (TMA store)
        # ((ATOM_V, REST_V), C_STAGE), ((ATOM_V, REST_V), EPI_M, EPI_N, RestM, RestN, RestL)
        bSG_sC, bSG_gC_all = cpasync.tma_partition(
            tma_atom_c,
            0,
            cute.make_layout(1),
            cute.group_modes(sC, 0, 2),
            cute.group_modes(gC_epi, 0, 2),
        )
        c_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=self.num_c_stage,
            producer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, THREADS_PER_WARP * NUM_EPILOGUE_WARPS
            ),
        )

        acc_consumer_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.num_acc_stage
        )
        cta_pair = cute.size(self.tiled_mma.thr_id.shape)
        work = tile_schedule.first_work()
        tiles_done = cutlass.Int32(0)
        while tile_schedule.is_valid(work):
            tile_mnl = tile_schedule.mma_tile(work, self.cluster_shape_mn, cta_pair)
            tile_alpha = self.tile_alpha(alpha, mAlpha, tile_mnl)
            # ((ATOM_V, REST_V), EPI_M * EPI_N)
            bSG_gC = cute.group_modes(bSG_gC_all[(None, None, None, *tile_mnl)], 1, 3)
            acc_buffer = acc_consumer_state.index
            if cutlass.const_expr(self.overlapping_accum):
                acc_buffer = acc_consumer_state.phase
            # (T2R, T2R_M, T2R_N, EPI_M * EPI_N)
            tTR_tAcc = tTR_tAcc_base[(None, None, None, None, None, acc_buffer)]
            tTR_tAcc = cute.group_modes(tTR_tAcc, 3, cute.rank(tTR_tAcc))

            acc_pipeline.consumer_wait(acc_consumer_state)
            num_subtiles = cute.size(tTR_tAcc.shape, mode=[3])
            subtiles_before = tiles_done * num_subtiles
            # NOTE: unrolled fully, ptxas keeps every subtile's TMEM load and TMA store in flight;
            # left rolled (the alpha multiplies tip its heuristic) it serializes them.
            for subtile in cutlass.range(num_subtiles, unroll_full=True):
                # Buffer 0 shares its last columns with buffer 1: it is read back to front.
                acc_subtile = subtile
                if cutlass.const_expr(self.overlapping_accum):
                    if acc_buffer == 0:
                        acc_subtile = num_subtiles - 1 - subtile
                cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, acc_subtile)], tTR_rAcc)
                if cutlass.const_expr(self.overlapping_accum):
                    if subtile == self.acc_release_subtile:
                        # NOTE: the shared columns are in registers once these tcgen05.ld
                        # complete; then the MMA warp may overwrite them.
                        cute.arch.fence_view_async_tmem_load()
                        acc_pipeline.consumer_release(acc_consumer_state)
                        acc_consumer_state.advance()
                acc = tiled_copy_r2s.retile(tTR_rAcc).load()
                tRS_rC.store((acc * tile_alpha).to(self.c_dtype))
                c_stage = (subtiles_before + subtile) % self.num_c_stage
                cute.copy(tiled_copy_r2s, tRS_rC, tRS_sC[(None, None, None, c_stage)])
                # NOTE: generic-proxy SMEM writes must be fenced before the async-proxy TMA
                # store reads them, and all four warps must have written their part.
                cute.arch.fence_proxy("async.shared", space="cta")
                epilogue_barrier.arrive_and_wait()
                if warp_idx == WarpRole.EPILOGUE_FIRST:
                    cute.copy(tma_atom_c, bSG_sC[(None, c_stage)], bSG_gC[(None, acc_subtile)])
                    c_pipeline.producer_commit()
                    c_pipeline.producer_acquire()
                epilogue_barrier.arrive_and_wait()
            if cutlass.const_expr(not self.overlapping_accum):
                # All TMEM reads of this accumulator are done: the MMA warp may reuse it.
                acc_pipeline.consumer_release(acc_consumer_state)
                acc_consumer_state.advance()
            tiles_done += 1
            work = tile_schedule.next_work(work)

        tmem.relinquish_alloc_permit()
        epilogue_barrier.arrive_and_wait()
        tmem.free(acc_tmem_ptr)
        c_pipeline.producer_tail()

    def tile_alpha(self, alpha, mAlpha: cute.Tensor, tile_mnl: tuple):
        """The alpha of the tile at ``tile_mnl``: the one loaded at the start (a grouped kernel
        overrides this to read its group's)."""
        return alpha

    def _epilogue_copies(self, tidx, tCtAcc_base, tCgC, sC, epi_tile):
        """The epilogue's TMEM -> register -> SMEM copies for thread ``tidx``, one subtile at a
        time: (tiled_copy_t2r, tTR_tAcc_base, tTR_rAcc, tiled_copy_r2s, tRS_rC, tRS_sC, gC_epi).
        """
        # TMEM -> registers, one epilogue subtile at a time.
        copy_atom_t2r = sm100_utils.get_tmem_load_op(
            self.cta_tile_shape_mnk,
            self.c_layout,
            self.c_dtype,
            self.acc_dtype,
            epi_tile,
            self.use_2cta_instrs,
        )
        # (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, ACC_STAGE)
        tAcc_epi = cute.flat_divide(tCtAcc_base[((None, None), 0, 0, None)], epi_tile)
        tiled_copy_t2r = tcgen05.make_tmem_copy(copy_atom_t2r, tAcc_epi[(None, None, 0, 0, 0)])
        thr_copy_t2r = tiled_copy_t2r.get_slice(tidx)
        # (T2R, T2R_M, T2R_N, EPI_M, EPI_N, ACC_STAGE)
        tTR_tAcc_base = thr_copy_t2r.partition_S(tAcc_epi)
        # (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, RestM, RestN, RestL)
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
        # (T2R, T2R_M, T2R_N)
        tTR_rAcc = cute.make_rmem_tensor(
            thr_copy_t2r.partition_D(gC_epi)[(None, None, None, 0, 0, 0, 0, 0)].shape,
            self.acc_dtype,
        )
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.c_dtype)

        # registers -> SMEM
        copy_atom_r2s = sm100_utils.get_smem_store_op(
            self.c_layout, self.c_dtype, self.acc_dtype, tiled_copy_t2r
        )
        tiled_copy_r2s = cute.make_tiled_copy_D(copy_atom_r2s, tiled_copy_t2r)
        thr_copy_r2s = tiled_copy_r2s.get_slice(tidx)
        # (R2S, R2S_M, R2S_N, C_STAGE)
        tRS_sC = thr_copy_r2s.partition_D(sC)
        # (R2S, R2S_M, R2S_N)
        tRS_rC = tiled_copy_r2s.retile(tTR_rC)
        return tiled_copy_t2r, tTR_tAcc_base, tTR_rAcc, tiled_copy_r2s, tRS_rC, tRS_sC, gC_epi

    # =========================================================================================
    # Static helpers
    # =========================================================================================
    @staticmethod
    def _compute_grid(mC_mnl, cta_tile_shape_mnk, cluster_shape_mn, max_active_clusters):
        """Persistent grid: at most ``max_active_clusters`` clusters, looping over the tiles."""
        c_tile = cute.slice_(cta_tile_shape_mnk, (None, None, 0))
        num_ctas_mnl = cute.zipped_divide(mC_mnl, tiler=c_tile)[(0, (None, None, None))].shape
        tile_schedule = TileSchedule.create(num_ctas_mnl, cluster_shape_mn)
        return tile_schedule, tile_schedule.grid(cluster_shape_mn, max_active_clusters)

    @staticmethod
    def can_implement(
        mnkl: tuple[int, int, int, int],
        sf_vec_size: int,
        sf_dtype: str,
        c_dtype: str,
        mma_tiler_mn: tuple[int, int],
        cluster_shape_mn: tuple[int, int],
    ) -> tuple[bool, list[str]]:
        """(ok, reasons): ``check_fp4_gemm_config`` in the CUTLASS-example shape."""
        reasons = check_fp4_gemm_config(
            mnkl, sf_vec_size, sf_dtype, c_dtype, mma_tiler_mn, cluster_shape_mn
        )
        return not reasons, reasons


# ---------------------------------------------------------------------------------------------
# Compilation, running, and the command line
# ---------------------------------------------------------------------------------------------
def compile_gemm(
    sf_vec_size: int,
    sf_dtype: str,
    c_dtype: str,
    mma_tiler_mn: tuple[int, int],
    cluster_shape_mn: tuple[int, int],
    max_active_clusters: int,
    gpu_arch: str = DEFAULT_GPU_ARCH,
    dump_dir: str | None = None,
):
    """Compile the kernel for any M, N, K, L (runtime values); returns (kernel object, executor).

    ``gpu_arch`` is a key of ``GPU_ARCHS``; no GPU is needed (cross-compilation).  With
    ``dump_dir`` (an existing folder) the PTX and the cubin are written there, and the
    executor's ``__ptx__`` holds the PTX.
    """
    if gpu_arch not in GPU_ARCHS:
        raise ValueError(f"gpu_arch={gpu_arch!r} is not one of {list(GPU_ARCHS)}")
    options = f"--gpu-arch {gpu_arch}"
    if dump_dir is not None:
        options += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    gemm = BlockwiseGemmFp4Sm100(sf_vec_size, mma_tiler_mn, cluster_shape_mn)
    gmem = cute.AddressSpace.gmem
    # Placeholder addresses: compilation only needs the element types and alignments.
    compiled = cute.compile(
        gemm,
        make_ptr(cutlass.Float4E2M1FN, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Float4E2M1FN, 0, gmem, assumed_align=16),
        make_ptr(SF_DTYPES[sf_dtype], 0, gmem, assumed_align=16),
        make_ptr(SF_DTYPES[sf_dtype], 0, gmem, assumed_align=16),
        make_ptr(C_DTYPES[c_dtype], 0, gmem, assumed_align=16),
        (cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1)),
        make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
        max_active_clusters,
        cuda_driver.CUstream(0),
        options=options,
    )
    return gemm, compiled


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, or from the ``nvidia-cuda-cuobjdump`` wheel."""
    import glob
    import shutil
    import sysconfig

    found = shutil.which("cuobjdump")
    if found:
        return found
    pattern = os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "bin", "cuobjdump")
    matches = sorted(glob.glob(pattern))
    return matches[0] if matches else None


def cubin_resource_usage(cubin_path: str) -> dict[str, int | str]:
    """Name, REG, STACK, SHARED, LOCAL of the kernel in a cubin (``cuobjdump -res-usage``)."""
    import re
    import subprocess

    tool = find_cuobjdump()
    if tool is None:
        raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    text = subprocess.run(
        [tool, "-res-usage", cubin_path], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump output:\n{text}")
    name, *counts = found.groups()
    usage: dict[str, int | str] = {"name": name}
    usage.update(zip(("REG", "STACK", "SHARED", "LOCAL"), map(int, counts), strict=True))
    return usage


def _parse_ints(text: str, count: int, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag} expects {count} comma-separated integers"
        ) from None
    if len(values) != count:
        raise argparse.ArgumentTypeError(f"{flag} expects {count} integers, got {text!r}")
    return values


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="NVFP4/MXFP4 block-scaled GEMM with TMA for datacenter Blackwell, CuTe DSL."
    )
    parser.add_argument(
        "--mnkl",
        type=lambda s: _parse_ints(s, 4, "--mnkl"),
        default=(8192, 8192, 8192, 1),
        help="M,N,K,L: D [M, N, L] = A [M, K, L] x B [N, K, L]^T (default 8192,8192,8192,1)",
    )
    parser.add_argument(
        "--mma_tiler_mn",
        type=lambda s: _parse_ints(s, 2, "--mma_tiler_mn"),
        default=None,
        help="MMA tile M,N; M 256 runs on a CTA pair (default: pick_tile_and_cluster's rule, "
        "256,128 for the default problem)",
    )
    parser.add_argument(
        "--cluster_shape_mn",
        type=lambda s: _parse_ints(s, 2, "--cluster_shape_mn"),
        default=None,
        help="CTAs per cluster along M,N (default: pick_tile_and_cluster's rule, 2,1 for tile "
        "M 256)",
    )
    parser.add_argument("--sf_vec_size", type=int, choices=(16, 32), default=16)
    parser.add_argument(
        "--sf_dtype",
        choices=tuple(SF_DTYPES),
        default=None,
        help="default: Float8E4M3FN for sf_vec_size 16, Float8E8M0FNU for 32",
    )
    parser.add_argument("--c_dtype", choices=tuple(C_DTYPES), default="BFloat16")
    parser.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="epilogue scale; default: the product of the NVFP4 global scales",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1.0,
        help="multiplier on the derived elementwise tolerance (reference.py)",
    )
    parser.add_argument("--warmup_iterations", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--skip_ref_check", action="store_true")
    parser.add_argument(
        "--use_cold_l2",
        action="store_true",
        help="time calls that rotate through copies of the operands (> 2x L2), read from DRAM",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile_only",
        action="store_true",
        help="cross-compile for --gpu_arch (no GPU needed) and print a summary",
    )
    parser.add_argument(
        "--gpu_arch",
        choices=tuple(GPU_ARCHS),
        default=DEFAULT_GPU_ARCH,
        help="compile target: sm_100f (default) runs on sm_100 and sm_103 GPUs (B200/GB200, "
        "B300/GB300); sm_100a only on sm_100, sm_103a only on sm_103",
    )
    parser.add_argument(
        "--dump_dir",
        default=None,
        help="--compile_only writes the PTX and cubin into a folder per configuration here "
        "(default ./dump)",
    )
    return parser


class UsageError(Exception):
    """A bad command line or an unsupported configuration: printed, exit code 2."""


def _validated(args: argparse.Namespace) -> argparse.Namespace:
    if args.dump_dir is not None and not args.compile_only:
        raise UsageError("--dump_dir is where --compile_only writes: give both or neither")
    args.dump_dir = args.dump_dir or "./dump"
    if args.sf_dtype is None:
        args.sf_dtype = SF_FORMATS[args.sf_vec_size][0]
    if args.iterations < 1 or args.warmup_iterations < 0:
        raise UsageError("--iterations must be >= 1 and --warmup_iterations >= 0")
    if not 0 <= args.seed < 2**64:
        raise UsageError(f"--seed must be in [0, 2^64), got {args.seed}")
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise UsageError(f"--tolerance must be a finite number > 0, got {args.tolerance}")
    if args.alpha is not None:
        try:
            args.alpha = checked_alpha(args.alpha)
        except ValueError as err:
            raise UsageError(f"--alpha: {err}") from None
    args.mma_tiler_mn, args.cluster_shape_mn = pick_tile_and_cluster(
        args.mnkl, args.mma_tiler_mn, args.cluster_shape_mn
    )
    reasons = check_fp4_gemm_config(
        args.mnkl,
        args.sf_vec_size,
        args.sf_dtype,
        args.c_dtype,
        args.mma_tiler_mn,
        args.cluster_shape_mn,
    )
    if reasons:
        raise UsageError("this configuration cannot run:\n  - " + "\n  - ".join(reasons))
    # NOTE: the derived bound needs K * unit roundoff < 1/2 (reference.gemm_tolerance).
    k_limit = 0.5 / (args.mnkl[2] * 2.0**-24)
    if not args.compile_only and args.tolerance >= k_limit:
        raise UsageError(
            f"--tolerance {args.tolerance:g} is too large for K={args.mnkl[2]}: the derived "
            f"bound needs --tolerance < {k_limit:g}"
        )
    return args


def _print_config(args: argparse.Namespace) -> None:
    fmt = SF_FORMATS[args.sf_vec_size][1]
    print(f"Running Blackwell {fmt} block-scaled GEMM (blockwise_gemm_fp4.py):")
    print(f"  mnkl: {args.mnkl}")
    print(f"  AB dtype: Float4E2M1FN, SF dtype: {args.sf_dtype}, SF vec size: {args.sf_vec_size}")
    print(f"  C dtype: {args.c_dtype}, acc dtype: Float32")
    print(f"  MMA tiler (M, N): {args.mma_tiler_mn}, cluster shape (M, N): {args.cluster_shape_mn}")


def _writable_folder(path: str) -> None:
    """Create ``path`` if needed; UsageError naming it unless a file can be written there."""
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--dump_dir {path}: cannot create the folder ({err})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise UsageError(f"--dump_dir {path}: cannot write into the folder ({err})") from None


def _files_written(folder: str, before: dict[str, int], suffix: str) -> list[str]:
    """Files ending in ``suffix`` that are new or changed since ``before`` (name -> mtime_ns)."""
    return sorted(
        os.path.join(folder, f)
        for f in os.listdir(folder)
        if f.endswith(suffix) and before.get(f) != os.stat(os.path.join(folder, f)).st_mtime_ns
    )


def dump_folder_name(args: argparse.Namespace) -> str:
    """The configuration's own folder under --dump_dir: the DSL names its files after the kernel
    only, so configurations sharing one folder would overwrite each other's PTX and cubin."""
    (tm, tn), (cm, cn) = args.mma_tiler_mn, args.cluster_shape_mn
    fmt = SF_FORMATS[args.sf_vec_size][1].lower()
    return f"{fmt}_{args.c_dtype}_tile{tm}x{tn}_cluster{cm}x{cn}_{args.gpu_arch}"


def run_compile_only(args: argparse.Namespace) -> int:
    _writable_folder(args.dump_dir)
    folder = os.path.join(args.dump_dir, dump_folder_name(args))
    _writable_folder(folder)
    # Only what this compile writes is reported: the folder may hold older cubins.
    before = {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in os.listdir(folder)}
    cluster_size = args.cluster_shape_mn[0] * args.cluster_shape_mn[1]
    gemm, compiled = compile_gemm(
        args.sf_vec_size,
        args.sf_dtype,
        args.c_dtype,
        args.mma_tiler_mn,
        args.cluster_shape_mn,
        B200_SM_COUNT // cluster_size,
        args.gpu_arch,
        folder,
    )
    cubins = _files_written(folder, before, f".{args.gpu_arch}.cubin")
    ptx_files = _files_written(folder, before, f".{args.gpu_arch}.ptx")
    print(f"Compile only: {args.gpu_arch}, no GPU used")
    if len(cubins) != 1 or len(ptx_files) != 1:
        print(
            f"error: the compile wrote {len(cubins)} cubin(s) and {len(ptx_files)} PTX file(s) "
            f"into {folder}, not one of each",
            file=sys.stderr,
        )
        return 1
    print(f"  PTX:   {ptx_files[0]}")
    print(f"  cubin: {cubins[0]}")
    if find_cuobjdump():
        usage = cubin_resource_usage(cubins[0])
        print(f"  kernel: {usage['name']}")
        print(f"  registers per thread: {usage['REG']}")
        print(f"  local memory per thread: {usage['LOCAL']} bytes (stack {usage['STACK']})")
    else:
        print("  registers / local memory: not read (cuobjdump not found)")
    smem = gemm.shared_storage.size_in_bytes()
    print(f"  shared memory per CTA: {smem} bytes of {SM100_SMEM_CAPACITY}")
    overlap = " (two overlapping buffers)" if gemm.overlapping_accum else ""
    print(
        f"  pipeline stages: A/B/SF {gemm.num_ab_stage}, accumulator {gemm.num_acc_stage}"
        f"{overlap}, epilogue {gemm.num_c_stage}"
    )
    print(
        f"  TMEM columns: accumulators {gemm.num_acc_tmem_cols} + SFA {gemm.num_sfa_tmem_cols} "
        f"+ SFB {gemm.num_sfb_tmem_cols} of {SM100_TMEM_COLUMNS}"
    )
    print(f"  threads per CTA: {gemm.threads_per_cta}, MMA tile {gemm.mma_tiler}")
    return 0


def blackwell_gpu(gpu_arch: str = DEFAULT_GPU_ARCH, device=None) -> tuple[bool, str]:
    """(can a ``gpu_arch`` cubin run on ``device`` (default: the current GPU), its description)."""
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    runs = (major, minor) in GPU_ARCHS[gpu_arch]
    return runs, f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"


# ---------------------------------------------------------------------------------------------
# The torch entry points: ``gemm`` (one launch per call) and ``prepare_gemm`` (a launch bound to
# its operands once, for timing and CUDA graphs), over one cache of compiled kernels
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmConfig:
    """What one compiled kernel is: with the device, the key of the kernel cache.

    ``for_problem`` fills in the tile and cluster by ``pick_tile_and_cluster``'s rule;
    ``reasons(mnkl)`` lists why it cannot run a problem (``check_fp4_gemm_config``).
    """

    sf_vec_size: int = 16
    c_dtype: str = "BFloat16"
    mma_tiler_mn: tuple[int, int] = (128, 128)
    cluster_shape_mn: tuple[int, int] = (1, 1)

    def __post_init__(self):
        # (tuples whatever the caller gave: the config is a dict key)
        object.__setattr__(self, "mma_tiler_mn", tuple(self.mma_tiler_mn))
        object.__setattr__(self, "cluster_shape_mn", tuple(self.cluster_shape_mn))

    @classmethod
    def for_problem(
        cls,
        mnkl: tuple[int, int, int, int],
        sf_vec_size: int = 16,
        c_dtype: str = "BFloat16",
        mma_tiler_mn: tuple[int, int] | None = None,
        cluster_shape_mn: tuple[int, int] | None = None,
    ) -> GemmConfig:
        tiler, cluster = pick_tile_and_cluster(mnkl, mma_tiler_mn, cluster_shape_mn)
        return cls(sf_vec_size, c_dtype, tiler, cluster)

    @property
    def sf_dtype(self) -> str:
        return SF_FORMATS[self.sf_vec_size][0]

    def reasons(self, mnkl: tuple[int, int, int, int]) -> list[str]:
        sf_dtype = SF_FORMATS[self.sf_vec_size][0] if self.sf_vec_size in SF_FORMATS else "?"
        return check_fp4_gemm_config(
            mnkl, self.sf_vec_size, sf_dtype, self.c_dtype, self.mma_tiler_mn, self.cluster_shape_mn
        )


# (GemmConfig, device index) -> compiled kernel; (GemmConfig, M, N, K, L) problems checked
_KERNELS: dict[tuple[GemmConfig, int], object] = {}
_CHECKED: set[tuple] = set()


def torch_scale_dtype(sf_vec_size: int):
    """The torch dtype of the scales: float8_e4m3fn for V 16 (NVFP4), float8_e8m0fnu for 32."""
    import torch

    return torch.float8_e4m3fn if sf_vec_size == 16 else torch.float8_e8m0fnu


def torch_c_dtypes() -> dict:
    """D's type names -> torch dtypes."""
    import torch

    return {"BFloat16": torch.bfloat16, "Float16": torch.float16, "Float32": torch.float32}


def reference_beside_this_file():
    """``reference.py``, which the GPU run uses to quantize its operands and check D: it sits
    beside this file in the repository (a copy of this file alone runs ``--compile_only``)."""
    try:
        import reference
    except ImportError:
        raise UsageError(
            "the GPU run quantizes its operands and checks D with reference.py, which is not "
            "importable here: put reference.py (from the repository) beside this file, or "
            "cross-compile with --compile_only"
        ) from None
    return reference


def checked_alpha(alpha) -> float:
    """``alpha`` as the float stored for the kernel; ValueError unless it is a real number whose
    fp32 rounding is finite (1e39 is a finite double but inf in fp32)."""
    import numbers
    import struct

    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"alpha must be a real number, got {alpha!r}")
    value = float(alpha)
    try:
        finite = math.isfinite(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:  # (rounds past the largest fp32)
        finite = False
    if not finite:
        raise ValueError(f"alpha={value!r} is not a finite fp32 number")
    return value


def _check_alpha_tensor(alpha, device) -> None:
    """ValueError unless ``alpha`` is one float32 value on ``device`` (the kernel reads it when it
    runs; its value is not read here, which would cost a synchronisation)."""
    import torch

    if not isinstance(alpha, torch.Tensor):
        raise ValueError(f"alpha must be a one-element float32 tensor, got {type(alpha).__name__}")
    if alpha.dtype != torch.float32 or alpha.numel() != 1:
        raise ValueError(
            f"an alpha tensor must hold one float32 value, got {alpha.dtype} {tuple(alpha.shape)}"
        )
    if alpha.device != device:
        raise ValueError(f"alpha is on {alpha.device}, a is on {device}")


def _problem(a, b, sfa_blocked, sfb_blocked, sf_vec_size: int) -> tuple[int, int, int, int]:
    """(M, N, K, L) of packed FP4 a [L, M, K/2], b [L, N, K/2] and their 128x4 blocked scales
    [L, n]; ValueError naming the first operand that does not fit."""
    import torch

    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(
            f"a and b must be [L, rows, K/2], got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    l, m, half_k = a.shape  # noqa: E741
    n, k = b.shape[1], 2 * half_k
    if b.shape[0] != l or b.shape[2] != half_k:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} disagree on L or K")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in (torch.uint8, torch.float4_e2m1fn_x2):
            raise ValueError(
                f"{name} must be packed FP4 (uint8 or float4_e2m1fn_x2), got {t.dtype}"
            )
    sf_torch = torch_scale_dtype(sf_vec_size)
    for name, sf, rows in (("sfa_blocked", sfa_blocked, m), ("sfb_blocked", sfb_blocked, n)):
        if sf.dtype != sf_torch:
            raise ValueError(
                f"{name} must be {sf_torch} for sf_vec_size {sf_vec_size}, got {sf.dtype}"
            )
        # (unswizzled [L, rows, K/V] scales of aligned shapes have the same number of bytes)
        want = (l, -(-rows // 128) * 128 * -(-(k // sf_vec_size) // 4) * 4)
        if tuple(sf.shape) != want:
            raise ValueError(
                f"{name} has shape {tuple(sf.shape)}; the 128x4 blocked layout of the "
                f"[L, {rows}, K/{sf_vec_size}] scales has shape {want}"
            )
    return m, n, k, l


def _check_cuda_operands(**tensors) -> None:
    """The placement rules of TMA and of this kernel: ValueError naming the first operand that
    breaks one (CUDA, contiguous rows, 16-byte aligned, one Blackwell GPU)."""
    device = next(iter(tensors.values())).device
    for name, t in tensors.items():
        # NOTE: TMA needs 16-byte aligned global base addresses.
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start on a 16-byte boundary (TMA); copy it first")
        # (D may be a view of rows padded to c_row_pitch(N): its own layout is checked by gemm)
        if not t.is_cuda or not (t.is_contiguous() or name == "d"):
            raise ValueError(f"{name} must be a contiguous CUDA tensor")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, a is on {device}")
    runs, gpu = blackwell_gpu(DEFAULT_GPU_ARCH, device)
    if not runs:
        raise ValueError(f"this kernel needs a datacenter Blackwell GPU (sm_100, sm_103); {gpu}")


def _compiled_kernel(config: GemmConfig, mnkl: tuple[int, int, int, int], device):
    """The kernel for ``config`` on ``device``, compiled once per process; ValueError (once per
    problem shape) when the configuration cannot run ``mnkl``."""
    import torch

    if (config, mnkl) not in _CHECKED:
        reasons = config.reasons(mnkl)
        if reasons:
            raise ValueError("; ".join(reasons))
        _CHECKED.add((config, mnkl))
    key = (config, device.index)
    if key not in _KERNELS:
        cluster_size = config.cluster_shape_mn[0] * config.cluster_shape_mn[1]
        with torch.cuda.device(device):
            hardware = utils.HardwareInfo(torch.cuda.current_device())
            _KERNELS[key] = compile_gemm(
                config.sf_vec_size,
                config.sf_dtype,
                config.c_dtype,
                config.mma_tiler_mn,
                config.cluster_shape_mn,
                hardware.get_max_active_clusters(cluster_size),
            )[1]
    return _KERNELS[key]


def kernel_args(config: GemmConfig, mnkl, a, b, sfa_blocked, sfb_blocked, d, alpha, stream):
    """The compiled kernel's keyword arguments (``BlockwiseGemmFp4Sm100.__call__``'s names)."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem

    def ptr(dtype, tensor):
        return make_ptr(dtype, tensor.data_ptr(), gmem, assumed_align=16)

    sf_dtype = SF_DTYPES[config.sf_dtype]
    return dict(
        a_ptr=ptr(cutlass.Float4E2M1FN, a),
        b_ptr=ptr(cutlass.Float4E2M1FN, b),
        sfa_ptr=ptr(sf_dtype, sfa_blocked),
        sfb_ptr=ptr(sf_dtype, sfb_blocked),
        c_ptr=ptr(C_DTYPES[config.c_dtype], d),
        problem_mnkl=tuple(cutlass.Int32(v) for v in mnkl),
        alpha_ptr=make_ptr(cutlass.Float32, alpha.data_ptr(), gmem, assumed_align=4),
        stream=cuda_driver.CUstream(stream.cuda_stream),
    )


def empty_d(l: int, m: int, n: int, c_dtype: str, device):  # noqa: E741
    """An uninitialised D [L, M, N] for ``gemm``: a view of rows ``c_row_pitch(N)`` long, so it
    is contiguous exactly when N elements make a multiple of 16 bytes."""
    if c_dtype not in C_DTYPES:
        raise ValueError(f"c_dtype={c_dtype!r} is not supported: use one of {list(C_DTYPES)}")
    return _empty_padded_d(l, m, n, c_dtype, device)[..., :n]


def _empty_padded_d(l: int, m: int, n: int, c_dtype: str, device):  # noqa: E741
    import torch

    pitch = c_row_pitch(n, c_dtype)
    return torch.empty(l, m, pitch, dtype=torch_c_dtypes()[c_dtype], device=device)


def gemm(a, b, sfa_blocked, sfb_blocked, alpha, d, config: GemmConfig | None = None):
    """D = alpha * (A x SFA)(B x SFB)^T into ``d``: one kernel launch on the current stream.

    a [L, M, K/2] and b [L, N, K/2]: packed FP4 (uint8 or torch.float4_e2m1fn_x2), K-major and
    contiguous; sfa_blocked / sfb_blocked [L, n]: the scales in the 128x4 blocked layout,
    float8_e4m3fn (NVFP4, V 16) or float8_e8m0fnu (MXFP4, V 32), which picks the format; alpha:
    a one-element float32 tensor on a's device that the kernel reads when it runs (a replayed
    CUDA graph uses the value current then); d [L, M, N] BFloat16 / Float16 / Float32 with rows
    ``c_row_pitch(N)`` apart (``empty_d``), which picks the output type.  ``config`` None takes
    ``pick_tile_and_cluster``'s rule.  The configuration is checked once per problem shape and
    compiled once; every call checks the operands it is given.  Returns ``d``.
    """
    import torch

    vec = {torch.float8_e4m3fn: 16, torch.float8_e8m0fnu: 32}.get(sfa_blocked.dtype)
    if vec is None:
        raise ValueError(
            f"sfa_blocked must be float8_e4m3fn (NVFP4) or float8_e8m0fnu (MXFP4), got "
            f"{sfa_blocked.dtype}"
        )
    mnkl = _problem(a, b, sfa_blocked, sfb_blocked, vec)
    c_dtype = {v: k for k, v in torch_c_dtypes().items()}.get(d.dtype)
    m, n, _, l = mnkl  # noqa: E741
    if c_dtype is None or tuple(d.shape) != (l, m, n):
        raise ValueError(f"d must be a bfloat16, float16 or float32 [{l}, {m}, {n}] tensor")
    pitch = c_row_pitch(n, c_dtype)
    if d.stride() != (m * pitch, pitch, 1):
        raise ValueError(f"d must have rows {pitch} elements apart (empty_d makes one)")
    _check_alpha_tensor(alpha, a.device)
    _check_cuda_operands(a=a, b=b, sfa_blocked=sfa_blocked, sfb_blocked=sfb_blocked, d=d)
    if config is None:
        config = GemmConfig.for_problem(mnkl, vec, c_dtype)
    elif (config.sf_vec_size, config.c_dtype) != (vec, c_dtype):
        raise ValueError(
            f"config is for sf_vec_size {config.sf_vec_size} and {config.c_dtype}; the operands "
            f"are sf_vec_size {vec} and {c_dtype}"
        )
    compiled = _compiled_kernel(config, mnkl, a.device)
    stream = torch.cuda.current_stream(a.device)
    with torch.cuda.device(a.device.index):
        compiled(**kernel_args(config, mnkl, a, b, sfa_blocked, sfb_blocked, d, alpha, stream))
    return d


class PreparedGemm:
    """One configured kernel call, from ``prepare_gemm``: calling it enqueues the kernel.

    It owns its operands, D and alpha (``operands``, ``d_padded``, ``alpha``, a one-element
    fp32 tensor): the kernel reads and writes raw addresses, so whatever the caller drops stays
    allocated for as long as this object lives. The kernel reads ``alpha`` when it runs, so a
    value written into it on the stream before a launch (or a graph replay) is the one used.
    """

    def __init__(self, compiled, kernel_args: dict, operands, d_padded, alpha, device):
        self.compiled = compiled
        self.kernel_args = kernel_args
        self.operands = operands
        self.d_padded = d_padded
        self.alpha = alpha
        self.device = device

    def __call__(self) -> None:
        import torch

        with torch.cuda.device(self.device.index):
            self.compiled(**self.kernel_args)


def prepare_gemm(
    a,
    b,
    sfa_blocked,
    sfb_blocked,
    sf_vec_size: int,
    alpha=1.0,
    c_dtype: str = "BFloat16",
    mma_tiler_mn: tuple[int, int] | None = None,
    cluster_shape_mn: tuple[int, int] | None = None,
):
    """``gemm`` bound to its operands once: returns ``(launch, d)``, where ``launch()`` (a
    ``PreparedGemm``) enqueues the kernel, and nothing else, on the stream that is current on
    ``a``'s device now and writes ``d`` [L, M, N] (``empty_d``).  Validation, compilation and
    pointer set-up happen here, once: the shape for timing loops and CUDA-graph capture.

    The operands are ``gemm``'s; ``sf_vec_size`` names the format; the tile and cluster default
    to ``pick_tile_and_cluster``'s choice for the shape.  ``alpha`` is a float
    (``checked_alpha``), stored here into a one-element fp32 tensor that ``launch`` owns, or a
    one-element float32 tensor on ``a``'s device, used in place (a value written into it on the
    stream before a launch or a graph replay is the one used; it must stay allocated for as long
    as the graph replays it).

    Scale bytes are not read on the host (that would cost a synchronisation per call).  The
    MMA's scale types are unsigned (ue4m3, ue8m0): an E4M3 scale with its sign bit set, or a
    NaN encoding (E4M3 0x7F, E8M0 0xFF), makes every output whose K blocks use it undefined;
    ``reference.py`` refuses such scales.
    """
    import torch

    if _ints((sf_vec_size,), 1) is None or sf_vec_size not in SF_FORMATS:
        raise ValueError(
            f"sf_vec_size={sf_vec_size!r} is not supported: use 16 (NVFP4, float8_e4m3fn scales) "
            "or 32 (MXFP4, float8_e8m0fnu scales)"
        )
    sf_vec_size = int(sf_vec_size)
    if isinstance(alpha, torch.Tensor):
        _check_alpha_tensor(alpha, a.device)
    else:
        alpha = checked_alpha(alpha)
    mnkl = _problem(a, b, sfa_blocked, sfb_blocked, sf_vec_size)
    config = GemmConfig.for_problem(mnkl, sf_vec_size, c_dtype, mma_tiler_mn, cluster_shape_mn)
    reasons = config.reasons(mnkl)
    if reasons:
        raise ValueError("; ".join(reasons))
    _check_cuda_operands(a=a, b=b, sfa_blocked=sfa_blocked, sfb_blocked=sfb_blocked)
    compiled = _compiled_kernel(config, mnkl, a.device)
    m, n, _, l = mnkl  # noqa: E741
    d_padded = _empty_padded_d(l, m, n, c_dtype, a.device)
    d = d_padded[..., :n]
    if not isinstance(alpha, torch.Tensor):
        # (a fill kernel on the current stream, not a host copy: allowed during graph capture)
        alpha = torch.full((1,), alpha, dtype=torch.float32, device=a.device)
    stream = torch.cuda.current_stream(a.device)
    args = kernel_args(config, mnkl, a, b, sfa_blocked, sfb_blocked, d, alpha, stream)
    operands = (a, b, sfa_blocked, sfb_blocked)
    launch = PreparedGemm(compiled, args, operands, d_padded, alpha, a.device)
    return launch, d


def blockwise_gemm_fp4(a, b, sfa_blocked, sfb_blocked, sf_vec_size: int, **config):
    """One call of the kernel: ``prepare_gemm``'s arguments, returns D [L, M, N]."""
    launch, d = prepare_gemm(a, b, sfa_blocked, sfb_blocked, sf_vec_size, **config)
    launch()
    return d


def time_us(calls, stream, warmup_iterations: int, iterations: int) -> float:
    """Mean time of one call in microseconds, from ``cutlass.testing.benchmark`` with CUDA
    graphs: warm-up and timed calls each captured into a graph on ``stream``, rotating through
    ``calls`` (one per operand set).

    NOTE: every call must enqueue its work on ``stream`` (``prepare_gemm`` binds the stream
    current when it is called; torch ops run on the current stream, so wrap them).
    """
    import cuda.bindings.driver as cuda_driver
    from cutlass.testing import JitArguments, benchmark

    workspaces = iter([JitArguments(call) for call in calls])
    return benchmark(
        _call,
        workspace_generator=lambda: next(workspaces),
        workspace_count=len(calls),
        warmup_iterations=warmup_iterations,
        iterations=iterations,
        stream=cuda_driver.CUstream(stream.cuda_stream),
        use_cuda_graphs=True,
    )


def _call(launch) -> None:
    launch()


def operand_sets(tensors, use_cold_l2: bool, warmup_iterations: int, iterations: int):
    """``[tensors]``, plus copies (``--use_cold_l2``) so that rotating through them reads the
    operands from DRAM: as many sets as ``cutlass.testing.get_workspace_count`` asks for."""
    from cutlass.testing import get_workspace_count

    sets = [tuple(tensors)]
    if use_cold_l2:
        one = sum(t.numel() * t.element_size() for t in tensors)
        count = get_workspace_count(one, warmup_iterations, iterations)
        sets += [tuple(t.clone() for t in tensors) for _ in range(count - 1)]
    return sets


def _cublaslt(a, b, sfa_blocked, sfb_blocked, out):
    """cuBLASLt's block-scaled FP4 GEMM (torch._scaled_mm) of batch 0, into ``out``."""
    import torch

    return torch._scaled_mm(
        a[0].view(torch.float4_e2m1fn_x2),
        b[0].view(torch.float4_e2m1fn_x2).t(),
        scale_a=sfa_blocked[0],
        scale_b=sfb_blocked[0],
        out_dtype=torch.bfloat16,
        out=out,
    )


def cublaslt_result(a, b, sfa_blocked, sfb_blocked, alpha: float):
    """(cuBLASLt's D * alpha in fp32, or None, and why not): the second oracle of the check.

    cuBLASLt takes no batch mode: only L = 1 is compared.
    """
    import torch

    if a.shape[0] != 1:
        return None, "it takes no batch mode; L > 1"
    out = torch.empty(a.shape[1], b.shape[1], dtype=torch.bfloat16, device=a.device)
    try:
        _cublaslt(a, b, sfa_blocked, sfb_blocked, out)
    except (RuntimeError, TypeError, ValueError) as err:
        return None, str(err).splitlines()[0]
    return (out.float() * alpha)[None], ""


def second_oracle(d_cublas, why_not: str, c_dtype: str):
    """(cuBLASLt's result as the check's second oracle, or None, and why not).

    cuBLASLt's error includes its own bf16 rounding, so it can vouch only for a BFloat16 D: for
    a Float16 or Float32 D, "within 2x cuBLASLt's error" would let through errors many times
    larger than that output type's rounding."""
    if d_cublas is not None and c_dtype != "BFloat16":
        return None, f"its output is bf16, D is {c_dtype}"
    return d_cublas, why_not


def run_on_gpu(args: argparse.Namespace) -> int:
    """Quantize random data, run the kernel, check it against reference.py (and cuBLASLt as a
    second oracle), time it and cuBLASLt."""
    is_blackwell, gpu = blackwell_gpu(args.gpu_arch)
    if not is_blackwell:
        targets = " or ".join(f"sm_{ma}{mi}" for ma, mi in GPU_ARCHS[args.gpu_arch])
        raise UsageError(
            f"a {args.gpu_arch} build of this kernel needs a datacenter Blackwell GPU "
            f"({targets}: B200/GB200 is sm_100, B300/GB300 sm_103); found {gpu}.\n"
            "  Cross-compile and inspect it on any machine with --compile_only.\n"
            "  On H100/H200 run the Hopper sibling: python -m fp4_ops.sm90"
        )
    import torch

    reference = reference_beside_this_file()
    m, n, k, l = args.mnkl  # noqa: E741
    ops = reference.make_fp4_operands(m, n, k, l, args.sf_vec_size, "cuda", seed=args.seed)
    alpha = float(ops.alpha) if args.alpha is None else args.alpha
    operands = (ops.a, ops.b, reference.to_blocked(ops.sfa), reference.to_blocked(ops.sfb))
    sets = operand_sets(operands, args.use_cold_l2, args.warmup_iterations, args.iterations)
    config = dict(
        sf_vec_size=args.sf_vec_size,
        alpha=alpha,
        c_dtype=args.c_dtype,
        mma_tiler_mn=args.mma_tiler_mn,
        cluster_shape_mn=args.cluster_shape_mn,
    )
    # The calls run on a side stream, which the timing graphs capture; prepare_gemm binds the
    # stream current when it is called.  (The operands were written on the current stream.)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launches = [prepare_gemm(*operand_set, **config) for operand_set in sets]
    launch, d = launches[0]
    launch()
    torch.cuda.synchronize()
    d_cublas, why_not = cublaslt_result(*operands, alpha)
    d_oracle, why_no_oracle = second_oracle(d_cublas, why_not, args.c_dtype)
    passed = None
    if args.skip_ref_check:
        print("Reference check: skipped (--skip_ref_check)")
    else:
        passed, info = reference.check_gemm_or_library(
            d,
            d_oracle,
            *ops.gemm_args[:5],
            alpha,
            unit_roundoff=reference.FP32_UNIT_ROUNDOFF * args.tolerance,
        )
        print("Reference check (reference.check_gemm_or_library):")
        print(f"  ours against reference_gemm: {info.ours}")
        if d_oracle is None:
            print(f"  cuBLASLt against reference_gemm: not used ({why_no_oracle})")
        else:
            print(f"  cuBLASLt against reference_gemm: max |err| {info.library_max_abs_err:.3e}")
        print(f"  rule that held: {info.rule if passed else 'none (FAIL)'}")

    mean_us = time_us([c for c, _ in launches], stream, args.warmup_iterations, args.iterations)
    tflops = 2.0 * m * n * k * l / (mean_us * 1e-6) / 1e12
    print(f"Mean time: {mean_us:.2f} us")
    # (the peak is a B200's: on other GPUs no percentage is printed)
    of_peak = ""
    if torch.cuda.get_device_capability() == (10, 0):
        percent = 100 * tflops / B200_FP4_PEAK_TFLOPS
        of_peak = f" ({percent:.1f}% of a B200's 9 PFLOP/s dense FP4 peak)"
    print(f"Throughput: {tflops:.1f} TFLOP/s{of_peak}")
    if d_cublas is None:
        print(f"cuBLASLt (torch._scaled_mm): not measured ({why_not})")
    else:
        us = _time_cublaslt(sets, stream, args)
        print(
            f"cuBLASLt (torch._scaled_mm, bf16 out, alpha not fused): {us:.2f} us; "
            f"ours / cuBLASLt time ratio: {mean_us / us:.3f}"
        )
    if passed is None:
        print("NOT CHECKED (--skip_ref_check)")
        return 0
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


def _time_cublaslt(sets, stream, args) -> float:
    """cuBLASLt timed as ours is: same operand sets, same stream, same benchmark."""
    import functools

    import torch

    calls = []
    for a, b, sfa_blocked, sfb_blocked in sets:
        # (outputs allocated up front: no allocation inside the captured graph)
        out = torch.empty(a.shape[1], b.shape[1], dtype=torch.bfloat16, device=a.device)
        calls.append(functools.partial(_cublaslt, a, b, sfa_blocked, sfb_blocked, out))

    def on_stream(call):
        def run():
            with torch.cuda.stream(stream):
                call()

        return run

    calls = [on_stream(c) for c in calls]
    # One eager call on the stream first: cuBLASLt's workspace for a stream is allocated on its
    # first call there, which must not happen inside a graph capture.
    stream.wait_stream(torch.cuda.current_stream())
    calls[0]()
    return time_us(calls, stream, args.warmup_iterations, args.iterations)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args = _validated(args)
        _print_config(args)
        if args.compile_only:
            return run_compile_only(args)
        return run_on_gpu(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
