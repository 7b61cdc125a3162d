# SPDX-License-Identifier: BSD-3-Clause
"""Contiguous grouped NVFP4 / MXFP4 GEMM for datacenter Blackwell: the experts of a MoE layer.

What it computes
----------------
    D[m, n] = alpha[g] * sum_k (A[m, k] * SFA[m, k // V]) * (B[n, k, g] * SFB[n, k // V, g]),
    g = tile_group[m // TILE_M]

* A [M, K]: the rows of every group (expert) stacked, each group padded to whole MMA tiles of
  TILE_M rows (128, or 256 on a CTA pair): the contiguous grouped layout of CUTLASS's contiguous
  grouped GEMM and DeepGEMM's m-grouped GEMM.  ``group_layout`` computes it from the row counts.
* B [N, K, G]: one weight matrix per group.  Packing, scale layouts, formats and D's row pitch
  are the dense kernel's (``blockwise_gemm_fp4.py``): SFA is the blocked layout of A's M rows,
  SFB one blocked layout per group.  Groups start on tile boundaries, so on 128-row scale atoms.
* tile_group [M / TILE_M] int32: the group of each M tile.  num_m_tiles [1] int32: how many M
  tiles hold rows; the kernel stops there, so buffers sized for the most rows serve every
  routing.  alpha [G] fp32: one per group (NVFP4: the product of the global scales).  All three
  are read on the device when the kernel runs: a routing kernel may write them, and a CUDA
  graph replays with new ones.
* D [M, N]: rows of padding hold the products of A's padding rows; rows of tiles past
  num_m_tiles are not written.

What it changes in the dense kernel (whose warp roles, pipelines and budgets it runs unchanged)
-----------------------------------------------------------------------------------------------
* The tile schedule (``GroupedTileSchedule``): cluster tile w is M tile w // clusters_n and N
  cluster w % clusters_n, valid while its M tile is below num_m_tiles; its group comes from
  tile_group.  The roles index every operand with (M tile, N tile, group).
* A, SFA and D have no group mode: their TMA coordinate tensors get one of stride 0
  (``shared_by_groups``), so the roles' group index lands on their only batch.  B and SFB are
  indexed by group.
* The epilogue multiplies each tile by its group's alpha.
* Clusters: M is the CTA pair (1, or 2 for tile M 256), since M tiles of one cluster could
  belong to different groups, and B is multicast along M; N up to 4 (A is multicast along N:
  the CTAs of a cluster row work on one M tile, so on one group).

Run
---
    python blockwise_grouped_gemm_fp4.py --group_rows 200,0,37,512 --nk 4096,7168
    python blockwise_grouped_gemm_fp4.py --group_rows 8,8,8,8 --nk 4096,7168 --compile_only
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

import blockwise_gemm_fp4 as bw


@dataclass
class GroupedTileSchedule(bw.TileSchedule):
    """The dense kernel's persistent schedule over the M tiles that hold rows, read on device.

    Cluster tiles are numbered N fastest, then M: cluster tile w is M tile w // clusters_n (a
    cluster's M extent is one MMA tile) and N cluster w % clusters_n.  The grid covers every M
    tile of the buffers (``num_cluster_tiles``, of ``clusters_m`` M tiles); persistent cluster
    ``z`` of a grid of P works on cluster tiles z, z + P, ... below num_m_tiles x clusters_n.
    """

    mTileGroup: cute.Tensor  # (M tiles,) int32: the group of each M tile
    mNumMTiles: cute.Tensor  # (1,) int32: the M tiles in use

    @staticmethod
    def create_grouped(
        num_tiles_m, num_ctas_n, cluster_n: int, mTileGroup, mNumMTiles
    ) -> GroupedTileSchedule:
        """Host side: the schedule of ``num_tiles_m`` M tiles by ``num_ctas_n`` N tiles."""
        num_clusters_n = cute.ceil_div(num_ctas_n, cluster_n)
        return GroupedTileSchedule(
            num_cluster_tiles=cutlass.Int32(num_tiles_m * num_clusters_n),
            clusters_m=cute.fast_divmod_create_divisor_v2(num_tiles_m),
            clusters_n=cute.fast_divmod_create_divisor_v2(num_clusters_n),
            mTileGroup=mTileGroup,
            mNumMTiles=mNumMTiles,
        )

    def is_valid(self, work: cutlass.Int32) -> cutlass.Boolean:
        # (both bounds: a count past the buffers must not send TMA past them)
        mma_tile_m, _ = divmod(work, self.clusters_n)
        return (work < self.num_cluster_tiles) & (mma_tile_m < self.mNumMTiles[0])

    def cta_tile(self, work: cutlass.Int32, cluster_shape_mn: tuple[int, int]) -> tuple:
        """Device side: (M tile, N tile, group) of this CTA in cluster tile ``work``."""
        mma_tile_m, cluster_n = divmod(work, self.clusters_n)
        bidx, bidy, _ = cute.arch.block_idx()
        cm, cn = cluster_shape_mn
        uniform = cute.arch.make_warp_uniform
        return (
            uniform(mma_tile_m * cm + bidx % cm),
            uniform(cluster_n * cn + bidy % cn),
            uniform(self.mTileGroup[mma_tile_m]),
        )

    def mma_tile(self, work: cutlass.Int32, cluster_shape_mn: tuple[int, int], cta_pair: int):
        """Device side: (MMA tile M, N tile, group) of this CTA in cluster tile ``work``."""
        tile_m, tile_n, group = self.cta_tile(work, cluster_shape_mn)
        return tile_m // cta_pair, tile_n, group


def shared_by_groups(tensor: cute.Tensor, num_groups) -> cute.Tensor:
    """``tensor`` (a TMA coordinate tensor whose last mode is a batch of one) with a last mode
    of ``num_groups`` and stride 0: every group index gives the coordinates of batch 0."""
    layout = tensor.layout
    return cute.make_tensor(
        tensor.iterator,
        cute.make_layout((*layout.shape[:-1], num_groups), stride=(*layout.stride[:-1], 0)),
    )


class BlockwiseGroupedGemmFp4Sm100(bw.BlockwiseGemmFp4Sm100):
    """The dense kernel over the contiguous grouped layout (module docstring).

    :param sf_vec_size: 16 (NVFP4) or 32 (MXFP4).
    :param mma_tiler_mn: MMA tile (M, N); M 256 uses a CTA pair, and groups are padded to it.
    :param cluster_shape_mn: (CTA pair, N); A is multicast along N.
    """

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        problem_mnkg: tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32, cutlass.Int32],
        tile_group_ptr: cute.Pointer,
        num_m_tiles_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        max_active_clusters: cutlass.Constexpr,
        stream,
    ):
        """Host side: the operands over their coordinates, the schedule, the dense launch."""
        self.a_dtype = a_ptr.value_type
        self.b_dtype = b_ptr.value_type
        self.sf_dtype = sfa_ptr.value_type
        self.c_dtype = c_ptr.value_type
        self._setup_attributes()
        m, n, k, num_groups = problem_mnkg
        # A, SFA and D: one batch; B and SFB: one per group.
        mA_mkl, _, mSFA_mkl, _, mC_mnl = self.global_tensors(
            a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, (m, n, k, 1)
        )
        _, mB_nkl, _, mSFB_nkl, _ = self.global_tensors(
            a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, (m, n, k, num_groups)
        )
        self.num_groups = num_groups
        # Read when the kernel runs: the group of each M tile, the M tiles in use, alpha.
        num_tiles_m = cute.ceil_div(m, self.mma_tiler[0])
        mTileGroup = cute.make_tensor(tile_group_ptr, cute.make_layout(num_tiles_m))
        mNumMTiles = cute.make_tensor(num_m_tiles_ptr, cute.make_layout(1))
        mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout(num_groups))
        tile_schedule = GroupedTileSchedule.create_grouped(
            num_tiles_m,
            cute.ceil_div(n, self.cta_tile_shape_mnk[1]),
            self.cluster_shape_mn[1],
            mTileGroup,
            mNumMTiles,
        )
        grid = tile_schedule.grid(self.cluster_shape_mn, max_active_clusters)
        self.launch(mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mC_mnl, mAlpha, tile_schedule, grid, stream)

    def make_tma_loads(self, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl):
        """The dense loads, with A's and SFA's coordinates shared by every group."""
        a, b, sfa, sfb = bw.BlockwiseGemmFp4Sm100.make_tma_loads(
            self, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl
        )
        return (
            (a[0], shared_by_groups(a[1], self.num_groups)),
            b,
            (sfa[0], shared_by_groups(sfa[1], self.num_groups)),
            sfb,
        )

    def make_tma_store(self, mC_mnl):
        """The dense store of D, its coordinates shared by every group."""
        atom, tensor = bw.BlockwiseGemmFp4Sm100.make_tma_store(self, mC_mnl)
        return atom, shared_by_groups(tensor, self.num_groups)

    def tile_alpha(self, alpha, mAlpha: cute.Tensor, tile_mnl: tuple):
        """The alpha of the tile's group."""
        return mAlpha[tile_mnl[2]]

    @staticmethod
    def can_implement(
        mnkg: tuple[int, int, int, int],
        sf_vec_size: int,
        sf_dtype: str,
        c_dtype: str,
        mma_tiler_mn: tuple[int, int],
        cluster_shape_mn: tuple[int, int],
    ) -> tuple[bool, list[str]]:
        """(ok, reasons): ``check_grouped_config`` in the CUTLASS-example shape."""
        reasons = check_grouped_config(
            mnkg, sf_vec_size, sf_dtype, c_dtype, mma_tiler_mn, cluster_shape_mn
        )
        return not reasons, reasons


def compile_grouped_gemm(
    sf_vec_size: int,
    sf_dtype: str,
    c_dtype: str,
    mma_tiler_mn: tuple[int, int],
    cluster_shape_mn: tuple[int, int],
    max_active_clusters: int,
    gpu_arch: str = bw.DEFAULT_GPU_ARCH,
    dump_dir: str | None = None,
):
    """Compile the kernel for any M, N, K and group count (runtime values); returns (kernel
    object, executor).  As ``blockwise_gemm_fp4.compile_gemm``: no GPU is needed."""
    if gpu_arch not in bw.GPU_ARCHS:
        raise ValueError(f"gpu_arch={gpu_arch!r} is not one of {list(bw.GPU_ARCHS)}")
    options = f"--gpu-arch {gpu_arch}"
    if dump_dir is not None:
        options += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    gemm = BlockwiseGroupedGemmFp4Sm100(sf_vec_size, mma_tiler_mn, cluster_shape_mn)
    gmem = cute.AddressSpace.gmem
    ones = tuple(cutlass.Int32(1) for _ in range(4))
    compiled = cute.compile(
        gemm,
        make_ptr(cutlass.Float4E2M1FN, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Float4E2M1FN, 0, gmem, assumed_align=16),
        make_ptr(bw.SF_DTYPES[sf_dtype], 0, gmem, assumed_align=16),
        make_ptr(bw.SF_DTYPES[sf_dtype], 0, gmem, assumed_align=16),
        make_ptr(bw.C_DTYPES[c_dtype], 0, gmem, assumed_align=16),
        ones,
        make_ptr(cutlass.Int32, 0, gmem, assumed_align=4),
        make_ptr(cutlass.Int32, 0, gmem, assumed_align=4),
        make_ptr(cutlass.Float32, 0, gmem, assumed_align=4),
        max_active_clusters,
        cuda_driver.CUstream(0),
        options=options,
    )
    return gemm, compiled


# ---------------------------------------------------------------------------------------------
# The contiguous grouped layout, the configuration check, and the torch entry point
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupLayout:
    """Where each group's rows sit in the contiguous grouped layout (``group_layout``)."""

    tile_m: int
    group_rows: tuple[int, ...]
    row_offsets: tuple[int, ...]  # G + 1: group g's rows start at row_offsets[g]
    tile_group: tuple[int, ...]  # the group of each M tile in use

    @property
    def num_m_tiles(self) -> int:
        return len(self.tile_group)

    @property
    def rows(self) -> int:
        """M: the rows of A and D, padding included."""
        return self.row_offsets[-1]


def group_layout(group_rows, tile_m: int) -> GroupLayout:
    """The layout of groups of ``group_rows`` rows (empty groups allowed), each padded to whole
    tiles of ``tile_m`` rows (the MMA tile M); ValueError on anything else."""
    rows = _ints(group_rows)
    if not rows or min(rows) < 0:
        raise ValueError(f"group_rows must be one or more integers >= 0, got {group_rows!r}")
    if _ints((tile_m,)) not in ((128,), (256,)):
        raise ValueError(f"tile_m must be the MMA tile M, the integer 128 or 256, got {tile_m!r}")
    tiles = [-(-count // tile_m) for count in rows]
    if sum(tiles) * tile_m >= 2**31:  # (checked before the per-tile table is built)
        raise ValueError(
            f"the groups pad to {sum(tiles) * tile_m} rows, beyond the kernel's 32-bit extents "
            "(< 2^31)"
        )
    offsets, tile_group = [0], []
    for group, count in enumerate(tiles):
        tile_group += [group] * count
        offsets.append(offsets[-1] + count * tile_m)
    return GroupLayout(tile_m, rows, tuple(offsets), tuple(tile_group))


def check_grouped_config(
    mnkg: tuple[int, int, int, int],
    sf_vec_size: int = 16,
    sf_dtype: str = "Float8E4M3FN",
    c_dtype: str = "BFloat16",
    mma_tiler_mn: tuple[int, int] = (128, 128),
    cluster_shape_mn: tuple[int, int] = (1, 1),
) -> list[str]:
    """Reasons why the grouped kernel cannot run M padded rows x N x K x G groups (empty: it
    can): the dense kernel's rules with G as the batch, and the grouped layout's own."""
    reasons = bw.check_fp4_gemm_config(
        mnkg, sf_vec_size, sf_dtype, c_dtype, mma_tiler_mn, cluster_shape_mn
    )
    if reasons:
        # (the dense check names the batch L: here it is the group count G)
        return [r.replace("L must be", "G (groups) must be") for r in reasons]
    tile_m, pair = mma_tiler_mn[0], 2 if mma_tiler_mn[0] == 256 else 1
    if cluster_shape_mn[0] != pair:
        reasons.append(
            f"cluster shape M={cluster_shape_mn[0]}: the grouped kernel's clusters span one MMA "
            f"tile along M (M tiles may belong to different groups), so it must be {pair} for "
            f"MMA tile M {tile_m}"
        )
    if mnkg[0] % tile_m:
        reasons.append(
            f"M={mnkg[0]} is not a multiple of the MMA tile M {tile_m}: every group is padded "
            "to whole tiles (group_layout)"
        )
    return reasons


def grouped_config(
    n: int,
    sf_vec_size: int = 16,
    c_dtype: str = "BFloat16",
    mma_tiler_mn: tuple[int, int] | None = None,
    cluster_shape_mn: tuple[int, int] | None = None,
) -> bw.GemmConfig:
    """The configuration, with what is None chosen: tile M 128 (groups of a MoE layer are short,
    and padding costs a tile's rows per group) unless the cluster is a CTA pair, tile N as the
    dense rule, the CTA pair of the tile M."""
    if mma_tiler_mn is None:
        pair = cluster_shape_mn is not None and cluster_shape_mn[0] == 2
        mma_tiler_mn = (256 if pair else 128, 64 if n <= 64 else 128)
    if cluster_shape_mn is None:
        cluster_shape_mn = (2 if mma_tiler_mn[0] == 256 else 1, 1)
    return bw.GemmConfig(sf_vec_size, c_dtype, mma_tiler_mn, cluster_shape_mn)


# Operands read by TMA (16-byte aligned); the others are read by plain loads (4 bytes).
TMA_OPERANDS = ("a", "b", "sfa_blocked", "sfb_blocked", "d")
# (GemmConfig, device index) -> compiled kernel
_KERNELS: dict[tuple[bw.GemmConfig, int], object] = {}


def _compiled_kernel(config: bw.GemmConfig, device):
    import torch

    key = (config, device.index)
    if key not in _KERNELS:
        cluster_size = config.cluster_shape_mn[0] * config.cluster_shape_mn[1]
        with torch.cuda.device(device):
            hardware = cutlass.utils.HardwareInfo(torch.cuda.current_device())
            _KERNELS[key] = compile_grouped_gemm(
                config.sf_vec_size,
                config.sf_dtype,
                config.c_dtype,
                config.mma_tiler_mn,
                config.cluster_shape_mn,
                hardware.get_max_active_clusters(cluster_size),
            )[1]
    return _KERNELS[key]


def _operand_problem(a, b, sfa_blocked, sfb_blocked, alpha, tile_group, num_m_tiles, d, config):
    """(M, N, K, G) of the operands; ValueError naming the first one that does not fit."""
    import torch

    if a.dim() != 2 or b.dim() != 3 or b.shape[2] != a.shape[1]:
        raise ValueError(
            f"a must be [M, K/2] and b [G, N, K/2], got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    m, k, (num_groups, n, _) = a.shape[0], 2 * a.shape[1], b.shape
    sf_torch = bw.torch_scale_dtype(config.sf_vec_size)
    k_cols = -(-(k // config.sf_vec_size) // 4) * 4
    want = {
        "a": ((m, k // 2), (torch.uint8, torch.float4_e2m1fn_x2)),
        "b": ((num_groups, n, k // 2), (torch.uint8, torch.float4_e2m1fn_x2)),
        "sfa_blocked": ((-(-m // 128) * 128 * k_cols,), (sf_torch,)),
        "sfb_blocked": ((num_groups, -(-n // 128) * 128 * k_cols), (sf_torch,)),
        "alpha": ((num_groups,), (torch.float32,)),
        "tile_group": ((m // config.mma_tiler_mn[0],), (torch.int32,)),
        "num_m_tiles": ((1,), (torch.int32,)),
        "d": ((m, n), (bw.torch_c_dtypes()[config.c_dtype],)),
    }
    given = dict(
        a=a,
        b=b,
        sfa_blocked=sfa_blocked,
        sfb_blocked=sfb_blocked,
        alpha=alpha,
        tile_group=tile_group,
        num_m_tiles=num_m_tiles,
        d=d,
    )
    for name, (shape, dtypes) in want.items():
        t = given[name]
        if tuple(t.shape) != shape or t.dtype not in dtypes:
            raise ValueError(
                f"{name} must be {' or '.join(map(str, dtypes))} of shape {shape}, got "
                f"{t.dtype} of shape {tuple(t.shape)}"
            )
    # (the layout first, the placement after, as blockwise_gemm_fp4.gemm checks them)
    for name, t in given.items():
        align = 16 if name in TMA_OPERANDS else 4
        if t.data_ptr() % align:
            raise ValueError(f"{name} must start on a {align}-byte boundary")
        if not (t.is_contiguous() or name == "d"):
            raise ValueError(f"{name} must be contiguous")
    pitch = bw.c_row_pitch(n, config.c_dtype)
    if d.stride() != (pitch, 1):
        raise ValueError(f"d must have rows {pitch} elements apart (blockwise_gemm_fp4.empty_d)")
    for name, t in given.items():
        if not t.is_cuda or t.device != a.device:
            raise ValueError(f"{name} must be on a's CUDA device")
    runs, gpu = bw.blackwell_gpu(bw.DEFAULT_GPU_ARCH, a.device)
    if not runs:
        raise ValueError(f"this kernel needs a datacenter Blackwell GPU (sm_100, sm_103); {gpu}")
    return m, n, k, num_groups


def grouped_gemm(a, b, sfa_blocked, sfb_blocked, alpha, tile_group, num_m_tiles, d, config=None):
    """D = alpha[g] * (A x SFA)(B[g] x SFB[g])^T per M tile of group g: one launch on the
    current stream.  Operands as the module docstring says: a [M, K/2] and b [G, N, K/2] packed
    FP4, sfa_blocked [bytes] and sfb_blocked [G, bytes] in the 128x4 blocked layout
    (float8_e4m3fn for NVFP4, float8_e8m0fnu for MXFP4), alpha [G] float32, tile_group
    [M / TILE_M] and num_m_tiles [1] int32, d [M, N] with rows ``c_row_pitch(N)`` apart.
    ``config`` None takes ``grouped_config``'s choice.  Returns ``d``.

    The routing is read on the device, not here (that would cost a synchronisation): the
    caller keeps num_m_tiles <= M / TILE_M (the kernel stops at the buffers' end regardless)
    and the first num_m_tiles entries of tile_group in [0, G), and must not write them, alpha
    or the operands while the kernel runs."""
    import torch

    vec = {torch.float8_e4m3fn: 16, torch.float8_e8m0fnu: 32}.get(sfa_blocked.dtype)
    if vec is None:
        raise ValueError(
            f"sfa_blocked must be float8_e4m3fn or float8_e8m0fnu, got {sfa_blocked.dtype}"
        )
    c_dtype = {v: k for k, v in bw.torch_c_dtypes().items()}.get(d.dtype)
    if c_dtype is None:
        raise ValueError(
            f"d must be {' or '.join(map(str, bw.torch_c_dtypes().values()))}, got {d.dtype}"
        )
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(
            f"a must be [M, K/2] and b [G, N, K/2], got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if config is None:
        config = grouped_config(b.shape[-2], vec, c_dtype)
    if (config.sf_vec_size, config.c_dtype) != (vec, c_dtype):
        raise ValueError(
            f"config is for sf_vec_size {config.sf_vec_size} and {config.c_dtype}; the operands "
            f"are sf_vec_size {vec} and {c_dtype}"
        )
    mnkg = _operand_problem(
        a, b, sfa_blocked, sfb_blocked, alpha, tile_group, num_m_tiles, d, config
    )
    reasons = check_grouped_config(
        mnkg, vec, config.sf_dtype, c_dtype, config.mma_tiler_mn, config.cluster_shape_mn
    )
    if reasons:
        raise ValueError("; ".join(reasons))
    compiled = _compiled_kernel(config, a.device)
    operands = (a, b, sfa_blocked, sfb_blocked, d, tile_group, num_m_tiles, alpha)
    stream = torch.cuda.current_stream(a.device)
    with torch.cuda.device(a.device.index):
        compiled(**kernel_args(config, mnkg, operands, stream))
    return d


def kernel_args(config: bw.GemmConfig, mnkg, operands, stream) -> dict:
    """The compiled kernel's keyword arguments (``BlockwiseGroupedGemmFp4Sm100.__call__``'s)."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    a, b, sfa_blocked, sfb_blocked, d, tile_group, num_m_tiles, alpha = operands
    gmem = cute.AddressSpace.gmem

    def ptr(dtype, tensor, align=16):
        return make_ptr(dtype, tensor.data_ptr(), gmem, assumed_align=align)

    sf_dtype = bw.SF_DTYPES[config.sf_dtype]
    return dict(
        a_ptr=ptr(cutlass.Float4E2M1FN, a),
        b_ptr=ptr(cutlass.Float4E2M1FN, b),
        sfa_ptr=ptr(sf_dtype, sfa_blocked),
        sfb_ptr=ptr(sf_dtype, sfb_blocked),
        c_ptr=ptr(bw.C_DTYPES[config.c_dtype], d),
        problem_mnkg=tuple(cutlass.Int32(v) for v in mnkg),
        tile_group_ptr=ptr(cutlass.Int32, tile_group, 4),
        num_m_tiles_ptr=ptr(cutlass.Int32, num_m_tiles, 4),
        alpha_ptr=ptr(cutlass.Float32, alpha, 4),
        stream=cuda_driver.CUstream(stream.cuda_stream),
    )


def _ints(values) -> tuple[int, ...] | None:
    """``values`` as Python ints, or None unless they all are integers (not bool, float, str)."""
    import operator

    try:
        if isinstance(values, str) or any(isinstance(v, bool) for v in values):
            return None
        return tuple(operator.index(v) for v in values)
    except TypeError:
        return None


# ---------------------------------------------------------------------------------------------
# Operands for a run, and the command line
# ---------------------------------------------------------------------------------------------
@dataclass
class GroupedOperands:
    """The kernel's operands for a ``GroupLayout``, and each group's own (unswizzled scales,
    rows without padding) for ``reference.check_gemm``: ``groups[g] = (a, b, sfa, sfb, alpha)``."""

    a: object
    b: object
    sfa_blocked: object
    sfb_blocked: object
    alpha: object
    tile_group: object
    num_m_tiles: object
    groups: list


def make_grouped_operands(layout: GroupLayout, n: int, k: int, sf_vec_size: int, device, seed=0):
    """Random groups quantized by ``reference.make_fp4_operands`` (group g from seed + g), put
    into the contiguous grouped layout; padding rows are zero codes with zero-byte scales."""
    import torch

    reference = bw.reference_beside_this_file()
    groups = []
    for g, rows in enumerate(layout.group_rows):
        ops = reference.make_fp4_operands(max(rows, 1), n, k, 1, sf_vec_size, device, seed + g)
        groups.append((ops.a[0, :rows], ops.b[0], ops.sfa[0, :rows], ops.sfb[0], ops.alpha))
    m = layout.rows
    a = torch.zeros(m, k // 2, dtype=torch.uint8, device=device)
    sfa = torch.zeros(m, k // sf_vec_size, dtype=torch.uint8, device=device)
    sfa = sfa.view(bw.torch_scale_dtype(sf_vec_size))
    for start, (a_g, _, sfa_g, _, _) in zip(layout.row_offsets[:-1], groups, strict=True):
        a[start : start + a_g.shape[0]] = a_g.view(torch.uint8)
        sfa[start : start + sfa_g.shape[0]] = sfa_g
    return GroupedOperands(
        a=a,
        b=torch.stack([g[1] for g in groups]),
        sfa_blocked=reference.to_blocked(sfa),
        sfb_blocked=reference.to_blocked(torch.stack([g[3] for g in groups])),
        alpha=torch.stack([g[4].float().reshape(()) for g in groups]),
        tile_group=torch.tensor(layout.tile_group, dtype=torch.int32, device=device),
        num_m_tiles=torch.tensor([layout.num_m_tiles], dtype=torch.int32, device=device),
        groups=groups,
    )


def _parse_ints(text: str, flag: str, count: int | None = None) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} expects comma-separated integers") from None
    if count is not None and len(values) != count:
        raise argparse.ArgumentTypeError(f"{flag} expects {count} integers, got {text!r}")
    return values


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Contiguous grouped NVFP4/MXFP4 GEMM (MoE experts) for datacenter Blackwell."
    )
    parser.add_argument(
        "--group_rows",
        type=lambda s: _parse_ints(s, "--group_rows"),
        default=(200, 0, 37, 512),
        help="rows of each group (0: an empty group)",
    )
    parser.add_argument(
        "--nk", type=lambda s: _parse_ints(s, "--nk", 2), default=(4096, 7168), help="N,K"
    )
    parser.add_argument("--sf_vec_size", type=int, choices=(16, 32), default=16)
    parser.add_argument("--c_dtype", choices=tuple(bw.C_DTYPES), default="BFloat16")
    parser.add_argument(
        "--mma_tiler_mn", type=lambda s: _parse_ints(s, "--mma_tiler_mn", 2), default=None
    )
    parser.add_argument(
        "--cluster_shape_mn", type=lambda s: _parse_ints(s, "--cluster_shape_mn", 2), default=None
    )
    parser.add_argument("--gpu_arch", choices=tuple(bw.GPU_ARCHS), default=bw.DEFAULT_GPU_ARCH)
    parser.add_argument(
        "--compile_only", action="store_true", help="cross-compile for --gpu_arch (no GPU)"
    )
    parser.add_argument("--dump_dir", default=None, help="write the PTX and cubin here")
    parser.add_argument("--warmup_iterations", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _validated(args: argparse.Namespace) -> argparse.Namespace:
    n, k = args.nk
    if args.dump_dir is not None and not args.compile_only:
        raise bw.UsageError("--dump_dir is where --compile_only writes: give both or neither")
    if args.iterations < 1 or args.warmup_iterations < 0:
        raise bw.UsageError("--iterations must be >= 1 and --warmup_iterations >= 0")
    if not 0 <= args.seed < 2**63 - 2**16:
        raise bw.UsageError(f"--seed must be in [0, 2^63 - 2^16), got {args.seed}")
    args.config = grouped_config(
        n, args.sf_vec_size, args.c_dtype, args.mma_tiler_mn, args.cluster_shape_mn
    )
    tile_m = args.config.mma_tiler_mn[0]
    if tile_m not in (128, 256):
        raise bw.UsageError(f"--mma_tiler_mn: tile M must be 128 or 256, got {tile_m}")
    try:
        args.layout = group_layout(args.group_rows, tile_m)
    except ValueError as err:
        raise bw.UsageError(f"--group_rows: {err}") from None
    if args.layout.rows == 0:
        raise bw.UsageError("--group_rows: every group is empty; give at least one row")
    mnkg = (args.layout.rows, n, k, len(args.group_rows))
    c = args.config
    reasons = check_grouped_config(
        mnkg, c.sf_vec_size, c.sf_dtype, c.c_dtype, c.mma_tiler_mn, c.cluster_shape_mn
    )
    if reasons:
        raise bw.UsageError("this configuration cannot run:\n  - " + "\n  - ".join(reasons))
    return args


def run_compile_only(args: argparse.Namespace) -> int:
    c = args.config
    if args.dump_dir is not None and not os.path.isdir(args.dump_dir):
        raise bw.UsageError(f"--dump_dir {args.dump_dir} is not an existing folder")
    gemm, _ = compile_grouped_gemm(
        c.sf_vec_size,
        c.sf_dtype,
        c.c_dtype,
        c.mma_tiler_mn,
        c.cluster_shape_mn,
        bw.B200_SM_COUNT // (c.cluster_shape_mn[0] * c.cluster_shape_mn[1]),
        args.gpu_arch,
        args.dump_dir,
    )
    print(
        f"Compiled for {args.gpu_arch}: {gemm.num_ab_stage} k-tile stages, "
        f"{gemm.num_acc_stage} accumulator stages, {gemm.num_c_stage} epilogue buffers"
    )
    return 0


def run_on_gpu(args: argparse.Namespace) -> int:
    """Quantize random groups, run the kernel, check every group against reference.py, time."""
    runs, gpu = bw.blackwell_gpu(args.gpu_arch)
    if not runs:
        raise bw.UsageError(
            f"a {args.gpu_arch} build of this kernel needs a datacenter Blackwell GPU; found "
            f"{gpu}.  Cross-compile it on any machine with --compile_only."
        )
    import torch

    reference = bw.reference_beside_this_file()
    c, layout = args.config, args.layout
    n, k = args.nk
    ops = make_grouped_operands(layout, n, k, c.sf_vec_size, "cuda", args.seed)
    d = bw.empty_d(1, layout.rows, n, c.c_dtype, "cuda")[0]
    operands = (ops.a, ops.b, ops.sfa_blocked, ops.sfb_blocked, ops.alpha)
    grouped_gemm(*operands, ops.tile_group, ops.num_m_tiles, d, c)
    torch.cuda.synchronize()
    passed = True
    for g, (start, group) in enumerate(zip(layout.row_offsets[:-1], ops.groups, strict=True)):
        rows = layout.group_rows[g]
        if rows:
            ok, info = reference.check_gemm(
                d[start : start + rows], *group[:4], c.sf_vec_size, group[4]
            )
            print(f"  group {g} ({rows} rows) against reference_gemm: {info.ours}")
            passed &= ok

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def launch():
        with torch.cuda.stream(stream):
            grouped_gemm(*operands, ops.tile_group, ops.num_m_tiles, d, c)

    mean_us = bw.time_us([launch], stream, args.warmup_iterations, args.iterations)
    useful = 2.0 * sum(layout.group_rows) * n * k
    print(f"Mean time: {mean_us:.2f} us")
    print(f"Throughput: {useful / (mean_us * 1e-6) / 1e12:.1f} TFLOP/s (rows without padding)")
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args = _validated(args)
        c, layout = args.config, args.layout
        print("Running Blackwell grouped FP4 GEMM (blockwise_grouped_gemm_fp4.py):")
        print(
            f"  groups: {len(layout.group_rows)}, rows {layout.group_rows}, padded M {layout.rows}"
        )
        print(f"  N, K: {tuple(args.nk)}, {bw.SF_FORMATS[c.sf_vec_size][1]}, C dtype {c.c_dtype}")
        print(f"  MMA tiler (M, N): {c.mma_tiler_mn}, cluster shape (M, N): {c.cluster_shape_mn}")
        if args.compile_only:
            return run_compile_only(args)
        return run_on_gpu(args)
    except bw.UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
