# SPDX-License-Identifier: BSD-3-Clause
"""Tests of blockwise_gemm_fp4.py (the Blackwell kernel).

CPU (every machine, CI included): cross-compilation (sm_100f, sm_100a, sm_103a) of a matrix of
configurations with checks on the PTX (per operand: scale-factor TMEM columns, multicast masks,
tile coordinates, alpha from global memory), the SASS, the resource usage and the host
function; the scale-factor layouts and tile coordinates the kernel uses against
reference.to_blocked; what prepare_gemm hands the kernel; every refusal of bad input; the CLI's
exits.
GPU (datacenter Blackwell: sm_100 or sm_103, bw.BLACKWELL_CAPABILITIES, as run_tests.sh says):
the kernel's output against reference.reference_gemm; a new alpha written into device memory
changes D at the next launch and graph replay.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import math
import os
import re
import subprocess
import sys
import warnings
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
import numpy as np
import pytest
import torch
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05
from cutlass.cute.runtime import make_ptr

import blockwise_gemm_fp4 as bw
import reference

ROOT = Path(__file__).resolve().parent.parent

NVFP4 = (16, "Float8E4M3FN")
MXFP4 = (32, "Float8E8M0FNU")

# (format, c_dtype, mma_tiler_mn, cluster_shape_mn): 1-CTA and 2-CTA, N tiles 64..256, clusters
# 1x1 .. 4x4, both formats and all three output types.
COMPILE_MATRIX = [
    (NVFP4, "BFloat16", (128, 128), (1, 1)),
    (NVFP4, "BFloat16", (256, 128), (2, 1)),
    (MXFP4, "Float16", (128, 64), (1, 2)),
    (NVFP4, "Float32", (128, 192), (1, 1)),
    (NVFP4, "BFloat16", (256, 256), (2, 2)),
    (MXFP4, "Float32", (128, 256), (4, 1)),
    (NVFP4, "Float16", (256, 192), (2, 1)),
    (MXFP4, "BFloat16", (256, 64), (4, 1)),
    (NVFP4, "BFloat16", (128, 128), (4, 4)),
    (MXFP4, "BFloat16", (256, 128), (2, 2)),
]


def _config_id(cfg) -> str:
    (vec, _), c_dtype, tile, cluster = cfg
    fmt = "nvfp4" if vec == 16 else "mxfp4"
    return f"{fmt}-{c_dtype}-{tile[0]}x{tile[1]}-cl{cluster[0]}x{cluster[1]}"


def _tool(name: str) -> str | None:
    found = bw.find_cuobjdump()
    if found is None:
        return None
    path = Path(found).with_name(name)
    return str(path) if path.exists() else None


# Every configuration for the default family target; for sm_100a the default one, N 64, 192
# and 256 and the 4x4 cluster; two for sm_103a.
ARCH_MATRIX = [
    *((bw.DEFAULT_GPU_ARCH, cfg) for cfg in COMPILE_MATRIX),
    *(("sm_100a", COMPILE_MATRIX[i]) for i in (1, 2, 4, 6, 8)),
    *(("sm_103a", cfg) for cfg in COMPILE_MATRIX[:2]),
]


def arch_config_id(arch_cfg) -> str:
    arch, cfg = arch_cfg
    return f"{arch}-{_config_id(cfg)}"


class Compiled(NamedTuple):
    gemm: bw.BlockwiseGemmFp4Sm100
    ptx: str
    cubin: Path
    deprecations: list  # the DeprecationWarnings raised while compiling
    host_ir: str  # the LLVM-dialect host function that builds the descriptors and launches


def _compile(arch, cfg, dump) -> Compiled:
    (vec, sf_dtype), c_dtype, tile, cluster = cfg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gemm, compiled = bw.compile_gemm(
            vec,
            sf_dtype,
            c_dtype,
            tile,
            cluster,
            bw.B200_SM_COUNT // (cluster[0] * cluster[1]),
            arch,
            str(dump),
        )
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    cubins = list(dump.glob("*.cubin"))
    assert len(cubins) == 1, f"expected one cubin in {dump}, found {cubins}"
    assert cubins[0].name.endswith(f".{arch}.cubin"), cubins[0].name
    host = re.search(r"llvm\.func @cutlass___call__\w*\(.*?\n  \}\n", str(compiled.ir_module), re.S)
    assert host, "no host function in the compiled module"
    return Compiled(gemm, compiled.__ptx__, cubins[0], deprecations, host.group(0))


@functools.cache
def _sass(cubin: Path) -> str:
    if bw.find_cuobjdump() is None or _tool("nvdisasm") is None:
        pytest.skip("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump/-nvdisasm)")
    env = dict(os.environ, PATH=f"{Path(_tool('nvdisasm')).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        [bw.find_cuobjdump(), "-sass", str(cubin)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout


class _CompiledMatrix(dict):
    """(arch, configuration) id -> Compiled, each compiled on first use (so that a -k selection
    compiles only what it needs)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self._tmp = tmp_path_factory
        self._by_id = {arch_config_id(ac): ac for ac in ARCH_MATRIX}

    def __missing__(self, key: str) -> Compiled:
        self[key] = _compile(*self._by_id[key], self._tmp.mktemp(key))
        return self[key]


# One matrix per process: test_blackwell_facts.py runs the same compiles' PTX.
_MATRIX: list[_CompiledMatrix] = []


@pytest.fixture(scope="module")
def compiled_matrix(tmp_path_factory):
    if not _MATRIX:
        _MATRIX.append(_CompiledMatrix(tmp_path_factory))
    return _MATRIX[0]


@pytest.mark.parametrize("arch_cfg", ARCH_MATRIX, ids=arch_config_id)
def test_compile_uses_no_deprecated_dsl_api(arch_cfg, compiled_matrix):
    """No DeprecationWarning while tracing and compiling, wherever the DSL attributes it (the
    DSL's own modules too: pytest.ini's filter sees only warnings attributed to our files)."""
    deprecations = compiled_matrix[arch_config_id(arch_cfg)].deprecations
    assert [f"{w.filename}:{w.lineno}: {w.message}" for w in deprecations] == []


@pytest.mark.parametrize("arch_cfg", ARCH_MATRIX, ids=arch_config_id)
def test_ptx_block_scaled_fp4_mma(arch_cfg, compiled_matrix):
    arch, ((vec, _), _, tile, _) = arch_cfg
    ptx = compiled_matrix[arch_config_id(arch_cfg)].ptx
    assert re.search(rf"^\.target {arch}$", ptx, re.M), "PTX for another target"
    cta_group = 2 if tile[0] == 256 else 1
    mmas = set(re.findall(r"tcgen05\.mma\.[a-z0-9_.:]+", ptx))
    want = f"tcgen05.mma.cta_group::{cta_group}.kind::mxf4nvf4.block_scale.block{vec}"
    assert mmas, "no tcgen05.mma in the PTX"
    assert all(mma.startswith(want) for mma in mmas), mmas
    # Four K=64 MMAs per 256-wide k-tile, unrolled.
    assert len(re.findall(r"tcgen05\.mma\.", ptx)) == bw.MMA_INSTS_PER_K_TILE
    # Scale factors reach TMEM through tcgen05.cp of the same CTA group.
    assert re.search(rf"tcgen05\.cp\.cta_group::{cta_group}\.32x128b\.warpx4", ptx)
    assert f"tcgen05.alloc.cta_group::{cta_group}" in ptx


@pytest.mark.parametrize("arch_cfg", ARCH_MATRIX, ids=arch_config_id)
def test_ptx_tma_loads_multicast_and_store(arch_cfg, compiled_matrix):
    _, (_, _, _, cluster) = arch_cfg
    ptx = compiled_matrix[arch_config_id(arch_cfg)].ptx
    loads = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.shared::[a-z]+\.global[a-z0-9_.:]*", ptx)
    # A and B are 3-D (rows, K, L) boxes, SFA and SFB 4-D: one TMA load instruction each.
    assert sorted(loads) == ["3", "3", "4", "4"], loads
    multicast = "multicast::cluster" in ptx
    needs_multicast = cluster != (1, 1)
    assert multicast == needs_multicast, f"multicast in PTX: {multicast}, cluster {cluster}"
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.global\.shared::cta", ptx), "no TMA store"


@pytest.mark.parametrize("arch_cfg", ARCH_MATRIX, ids=arch_config_id)
def test_no_local_memory_and_sass(arch_cfg, compiled_matrix):
    _, (_, _, tile, _) = arch_cfg
    cubin = compiled_matrix[arch_config_id(arch_cfg)].cubin
    if bw.find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    usage = bw.cubin_resource_usage(str(cubin))
    assert usage["LOCAL"] == 0 and usage["STACK"] == 0, usage
    sass = _sass(cubin)
    assert "UTCOMMA" in sass or "UTCQMMA" in sass, "no block-scaled UTC*MMA in SASS"
    assert "UTCCP" in sass and "UTMALDG" in sass and "UTMASTG" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory loads/stores in SASS"
    # The epilogue's subtile loop is unrolled: one TMEM load (LDTM) and one TMA store (UTMASTG)
    # per 32-column subtile of the CTA tile, all in the SASS.
    subtiles = tile[1] // 32
    assert len(re.findall(r"\bLDTM\b", sass)) == subtiles
    assert len(re.findall(r"\bUTMASTG\b", sass)) == subtiles


@pytest.mark.parametrize(
    "arch_cfg",
    [a for a in ARCH_MATRIX if a[1][2:] in (((256, 128), (2, 1)), ((128, 128), (4, 4)))],
    ids=arch_config_id,
)
def test_sass_epilogue_four_tmem_loads_and_tma_stores(arch_cfg, compiled_matrix):
    """The default configuration and 128x128 on 4x4: 4 TMEM loads + 4 TMA stores per tile."""
    cubin = compiled_matrix[arch_config_id(arch_cfg)].cubin
    sass = _sass(cubin)
    assert len(re.findall(r"\bLDTM\b", sass)) == 4
    assert len(re.findall(r"\bUTMASTG\b", sass)) == 4


@pytest.mark.parametrize("arch_cfg", ARCH_MATRIX, ids=arch_config_id)
def test_budget_matches_compiled_kernel(arch_cfg, compiled_matrix):
    """tile_budget's byte arithmetic is what the kernel runs with, and it agrees with the
    kernel's real SMEM layouts (the TMA transaction bytes per stage are counted from them)."""
    _, ((vec, _), c_dtype, tile, _) = arch_cfg
    gemm = compiled_matrix[arch_config_id(arch_cfg)].gemm
    budget = bw.tile_budget(tile, vec, c_dtype)
    cta_pair = 2 if tile[0] == 256 else 1
    assert gemm.num_tma_load_bytes == cta_pair * budget.ab_stage_bytes
    assert (gemm.num_ab_stage, gemm.num_acc_stage, gemm.num_c_stage) == (
        budget.num_ab_stage,
        budget.num_acc_stage,
        budget.num_c_stage,
    )
    assert budget.overlapping_accum == gemm.overlapping_accum == (tile[1] == 256)
    assert budget.tmem_columns == (
        gemm.num_acc_tmem_cols + gemm.num_sfa_tmem_cols + gemm.num_sfb_tmem_cols
    )
    epi_bytes = gemm.shared_storage.size_in_bytes() - budget.num_ab_stage * budget.ab_stage_bytes
    assert epi_bytes >= budget.num_c_stage * budget.epi_bytes_per_stage
    assert gemm.shared_storage.size_in_bytes() <= bw.SM100_SMEM_CAPACITY


@pytest.mark.parametrize("vec", [16, 32])
@pytest.mark.parametrize("c_dtype", list(bw.C_DTYPES))
def test_every_accepted_tile_fits(vec, c_dtype):
    """Every tile check_fp4_gemm_config accepts has two or more mainloop stages and fits into
    the TMEM (why check_fp4_gemm_config has no stage or TMEM refusal)."""
    for tile in [(m, n) for m in (128, 256) for n in (64, 128, 192, 256)]:
        budget = bw.tile_budget(tile, vec, c_dtype)
        assert budget.num_ab_stage >= 2 and budget.num_c_stage >= 2, (tile, budget)
        assert budget.tmem_columns <= bw.SM100_TMEM_COLUMNS, (tile, budget)
        smem = (
            budget.num_ab_stage * budget.ab_stage_bytes
            + budget.num_c_stage * budget.epi_bytes_per_stage
        )
        assert smem <= bw.SM100_SMEM_CAPACITY - 1024, (tile, budget)


# ------------------------------------------------------------------------------------------
# Per-operand facts in the PTX: TMEM columns of the scales, multicast masks, alpha, and the
# host function's descriptors
# ------------------------------------------------------------------------------------------
_PTX_INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s+(.*?);\s*$")


class _Ptx:
    """The instructions of a kernel's PTX, and the value of a 32-bit register as
    (symbolic part, constant part), followed through adds, xors and shifts."""

    def __init__(self, ptx: str):
        self.instructions = []
        self.defs: dict[str, list] = {}
        for line in ptx.splitlines():
            found = _PTX_INSTRUCTION.match(line)
            if not found:
                continue
            op, rest = found.groups()
            operands = [o.strip() for o in re.split(r",(?![^\[]*\])(?![^{]*\})", rest)]
            self.instructions.append((op, operands))
            if re.fullmatch(r"%\w+", operands[0]) and not op.startswith(
                ("st.", "tcgen05", "cp.", "mbarrier", "prefetch", "bar", "fence")
            ):
                self.defs.setdefault(operands[0], []).append((op, operands[1:]))

    def definition(self, reg: str) -> tuple[str, list]:
        (single,) = self.defs[reg]
        return single

    def value(self, x: str) -> tuple[str | None, int]:
        x = x.strip("[]")
        if re.fullmatch(r"-?\d+", x):
            return None, int(x) & 0xFFFFFFFF
        if len(self.defs.get(x, ())) != 1:
            return f"?{x}", 0
        op, args = self.definition(x)
        if op in ("mov.b32", "mov.u32", "mov.b16", "cvt.u16.u32") and len(args) == 1:
            return self.value(args[0])
        if op in ("add.s32", "xor.b32", "shl.b32"):
            (sa, ca), (sb, cb) = self.value(args[0]), self.value(args[1])
            if op == "add.s32":
                return "+".join(sorted(s for s in (sa, sb) if s)) or None, (ca + cb) & 0xFFFFFFFF
            if op == "xor.b32" and sb is None and cb == 0x80000000:
                return sa, ca ^ cb
            if op == "shl.b32" and sb is None and sa is None:
                return None, (ca << cb) & 0xFFFFFFFF
            if op == "shl.b32":
                return f"shl({sa if sa else ca},{sb if sb else cb})", 0
        if op.startswith("ld.shared"):
            return f"ld{args[0]}", 0
        return f"{op.split('.')[0]}:{x}", 0

    def grid_sources(self, reg: str) -> set[str]:
        """The grid and cluster coordinates (%ctaid.x, %cluster_ctarank, ...) ``reg`` is
        computed from, through every definition of every register on the way."""
        found, seen, stack = set(), set(), [reg]
        while stack:
            r = stack.pop()
            if r in seen:
                continue
            seen.add(r)
            for _, args in self.defs.get(r, ()):
                for arg in args:
                    found.update(re.findall(r"%n?ctaid\.[xyz]|%cluster_\w+", arg))
                    stack.extend(re.findall(r"%(?:r|rd|rs)\d+", arg))
        return found

    def tma_loads(self) -> dict[int, tuple[str, list[str], str | None]]:
        """Descriptor parameter -> (instruction, coordinate registers, mask register) of each
        TMA load (global -> shared)."""
        loads = {}
        for op, ops in self.instructions:
            if op.startswith("cp.async.bulk.tensor") and ".global" in op.split("shared")[-1]:
                descriptor = re.match(r"\[(%rd\d+),", ops[1]).group(1)
                coords = re.search(r"\{(.*?)\}", ops[1]).group(1).split(", ")
                mask = ops[3] if "multicast::cluster" in op else None
                loads[self.param_of(descriptor)] = (op, coords, mask)
        return loads

    def param_of(self, reg: str) -> int:
        """The kernel parameter a cvta.param'd descriptor address comes from."""
        op, args = self.definition(reg)
        assert op == "cvta.param.u64", (reg, op)
        op, args = self.definition(args[0])
        return int(re.search(r"_param_(\d+)$", args[0]).group(1))


def kernel_param(name: str) -> int:
    """PTX parameter index of a kernel argument (the PTX numbers them in order, self excluded)."""
    params = list(inspect.signature(bw.BlockwiseGemmFp4Sm100.kernel).parameters)
    return params.index(name) - 1


FAMILY_MATRIX = [(bw.DEFAULT_GPU_ARCH, cfg) for cfg in COMPILE_MATRIX]


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_scale_factors_tmem_columns(arch_cfg, compiled_matrix):
    """tcgen05.cp writes SFA at the columns right after the accumulators and SFB right after
    SFA; each MMA reads the scale columns of its K block, and on N tiles of 64 and 192 the SFB
    columns move by (tile % 2) * 2."""
    _, ((vec, _), _, tile, _) = arch_cfg
    ptx = _Ptx(compiled_matrix[arch_config_id(arch_cfg)].ptx)
    tile_n = tile[1]
    # Accumulators: two of tile N columns; for N 256 two that share the 16 + 32 scale columns.
    sfa_col = 2 * tile_n if tile_n < 256 else 2 * tile_n - 16 - 32
    sfb_col = sfa_col + 16  # SFA: 128 rows of a CTA = 4 x 32 lanes, 4 columns per MMA
    sfb_atoms = 1 if tile_n <= 128 else 2
    cps_per_atom = 256 // vec // 4  # scale groups of 4 per 128-row atom and k-tile
    k_blocks_per_group = 4 // cps_per_atom  # MMAs (K 64) per group of 4 scales

    copies = [ptx.value(ops[0]) for op, ops in ptx.instructions if op.startswith("tcgen05.cp")]
    (base,) = {symbol for symbol, _ in copies}
    assert base.startswith("ld[")  # the TMEM address the allocator published, nothing added
    want = [sfa_col + 4 * i for i in range(cps_per_atom)]
    want += [sfb_col + 4 * i for i in range(cps_per_atom * sfb_atoms)]
    assert [column for _, column in copies] == want

    mmas = [ops for op, ops in ptx.instructions if op.startswith("tcgen05.mma")]
    assert len(mmas) == 4
    for j, ops in enumerate(mmas):
        (sym_a, sfa), (sym_b, sfb) = ptx.value(ops[4]), ptx.value(ops[5])
        group, scale_id = divmod(j, k_blocks_per_group)
        hi = scale_id << 31  # (MXFP4: the second K 64 block of a group reads scales 2, 3)
        assert (sym_a, sfa) == (base, sfa_col + 4 * group + hi), j
        assert sfb == sfb_col + 4 * sfb_atoms * group + hi, j
        if tile_n in (64, 192):
            shift = re.fullmatch(re.escape(base) + r"\+shl\(sub:(%r\d+),1\)", sym_b or "")
            assert shift, sym_b
            # the shift is 2 * (tile % 2): t - (t & ~1), shifted left by one
            op, (_, masked) = ptx.definition(shift.group(1))
            assert op == "sub.s32" and ptx.definition(masked)[0] == "and.b32"
            assert ptx.definition(masked)[1][1] == str(0x7FFFFFFE)
        else:
            assert sym_b == base, sym_b


def _expected_masks(tile_m: int, cluster: tuple[int, int]) -> dict[str, int | None]:
    """Multicast bit pattern (before the shift to this CTA's place) of each TMA load; None for
    a load without multicast. CTA rank = v + pair * m + cluster_m * n (V: half of a CTA pair)."""
    cm, cn = cluster
    pair = 2 if tile_m == 256 else 1

    def pattern(ranks):
        ranks = list(ranks)
        return sum(1 << r for r in ranks) if len(ranks) > 1 else None

    along_n = pattern(cm * n for n in range(cn))  # same (v, m), every n
    return {
        "tma_atom_a": along_n,
        "tma_atom_sfa": along_n,
        "tma_atom_b": pattern(pair * m for m in range(cm // pair)),  # same (v, n)
        "tma_atom_sfb": pattern(range(cm)),  # SFB's 1-CTA view: every CTA of the column
    }


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_tma_multicast_mask_of_each_load(arch_cfg, compiled_matrix):
    """Which of the four TMA loads multicast, with which mask: A and SFA to the CTAs of their
    cluster row, B to the CTAs of its column (pairs of CTAs for tile M 256), SFB to every CTA of
    its column."""
    _, (_, _, tile, cluster) = arch_cfg
    ptx = _Ptx(compiled_matrix[arch_config_id(arch_cfg)].ptx)
    loads = {
        param: None if mask is None else ptx.value(mask)
        for param, (_, _, mask) in ptx.tma_loads().items()
    }
    expected = _expected_masks(tile[0], cluster)
    assert sorted(loads) == sorted(kernel_param(name) for name in expected)
    for name, pattern in expected.items():
        mask = loads[kernel_param(name)]
        if pattern is None:
            assert mask is None, (name, mask)
            continue
        assert mask is not None, name
        symbol, constant = mask
        # a constant (this CTA's shift folded to 0) or the pattern shifted by a coordinate
        assert (symbol is None and constant == pattern) or (
            symbol is not None and symbol.startswith(f"shl({pattern},")
        ), (name, mask, pattern)
    a, sfa = loads[kernel_param("tma_atom_a")], loads[kernel_param("tma_atom_sfa")]
    assert a == sfa  # the same mask, shifted by the same coordinate


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_barrier_arrival_counts(arch_cfg, compiled_matrix):
    """Arrivals each mbarrier waits for, in allocation order, from the roles' sizes: a stage
    fills with one TMA transaction arrival and is freed by one MMA-warp arrival from every CTA
    that multicast into it (its cluster row, plus its column counted in CTA pairs, itself
    once); an accumulator fills with one MMA commit and is freed by the 128 epilogue threads of
    each CTA of the pair. Named barriers: the 128 epilogue threads (id 1), and those with the
    MMA warp's 32 waiting for the TMEM address (id 2)."""
    (vec, _), c_dtype, tile, cluster = arch_cfg[1]
    pair = 2 if tile[0] == 256 else 1
    budget = bw.tile_budget(tile, vec, c_dtype)
    ptx = _Ptx(compiled_matrix[arch_config_id(arch_cfg)].ptx)
    counts = [ptx.value(ops[1]) for op, ops in ptx.instructions if op.startswith("mbarrier.init")]
    ab, acc = budget.num_ab_stage, budget.num_acc_stage
    expected = (
        [1] * ab + [cluster[1] + cluster[0] // pair - 1] * ab + [1] * acc + [128 * pair] * acc
    )
    assert counts[: len(expected)] == [(None, c) for c in expected], counts
    named = {tuple(ops) for op, ops in ptx.instructions if op == "bar.sync"}
    assert named - {("0",)} == {("1", "128"), ("2", "160")}, named  # (0: the whole CTA)


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_mma_overwrites_then_accumulates(arch_cfg, compiled_matrix):
    """The enable-input-d operand of each tcgen05.mma: the k-tile's first MMA takes a flag that
    is false at a tile's start and true once MMAs have run; its other MMAs always accumulate."""
    ptx = _Ptx(compiled_matrix[arch_config_id(arch_cfg)].ptx)
    flags = [ops[-1] for op, ops in ptx.instructions if op.startswith("tcgen05.mma")]
    values = [{args[0] for op, args in ptx.defs.get(f, ()) if op == "mov.pred"} for f in flags]
    assert len(flags) % bw.MMA_INSTS_PER_K_TILE == 0 and flags, flags
    for i, flag_values in enumerate(values):
        first_of_k_tile = i % bw.MMA_INSTS_PER_K_TILE == 0
        assert flag_values == ({"0", "-1"} if first_of_k_tile else {"-1"}), (i, flags, values)


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_tile_coordinates_come_from_their_own_grid_axis(arch_cfg, compiled_matrix):
    """The grid's x extent is the cluster's M, y its N: A and SFA tiles are picked without
    %ctaid.y, SFB tiles and the MMA's SFB column shift without %ctaid.x (B too, unless a CTA
    pair splits it along x)."""
    _, (_, _, tile, cluster) = arch_cfg
    ptx = _Ptx(compiled_matrix[arch_config_id(arch_cfg)].ptx)
    loads = ptx.tma_loads()

    def sources(name):
        return set().union(*(ptx.grid_sources(c) for c in loads[kernel_param(name)][1]))

    assert "%ctaid.y" not in sources("tma_atom_a") | sources("tma_atom_sfa")
    assert "%ctaid.x" not in sources("tma_atom_sfb")
    if tile[0] == 128:
        assert "%ctaid.x" not in sources("tma_atom_b")
    if cluster[0] > 1:
        assert "%ctaid.x" in sources("tma_atom_a")
    if cluster[1] > 1:
        assert "%ctaid.y" in sources("tma_atom_b") and "%ctaid.y" in sources("tma_atom_sfb")
    (first_mma,) = [ops for op, ops in ptx.instructions if op.startswith("tcgen05.mma")][:1]
    shift_sources = ptx.grid_sources(first_mma[5].strip("[]"))
    assert "%ctaid.x" not in shift_sources
    if tile[1] in (64, 192) and cluster[1] > 1:
        assert "%ctaid.y" in shift_sources


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_epilogue_scales_every_value_by_alpha(arch_cfg, compiled_matrix):
    """alpha comes from global memory: the kernel's alpha parameter holds an address and nothing
    else, the kernel's only global load reads alpha there (once, before any TMEM load), and the
    value loaded multiplies every accumulator value the epilogue stores: 32 values per thread
    and 32-column subtile, two per mul.f32x2."""
    _, (_, _, tile, _) = arch_cfg
    ptx = compiled_matrix[arch_config_id(arch_cfg)].ptx
    param = kernel_param("mAlpha")
    reads = re.findall(rf"ld\.param\.(\w+)\s+(%\w+), \[\w+_param_{param}(?:\+\d+)?\];", ptx)
    assert [kind for kind, _ in reads] == ["b64"], f"alpha's parameter is not one address: {reads}"
    loads = re.findall(r"ld\.global(?:\.\w+)*\s+(%r\d+), \[(%rd\d+)\];", ptx)
    assert [address for _, address in loads] == [reads[0][1]], "alpha not read at its address"
    loaded = loads[0][0]
    assert re.search(r"ld\.global", ptx).start() < ptx.index("tcgen05.ld."), "alpha loaded late"
    pairs = re.findall(rf"mov\.b64\s+(%rd\d+), \{{{loaded}, {loaded}\}};", ptx)
    assert len(pairs) == 1, "alpha is not paired for mul.f32x2"
    pair = pairs[0]
    muls = re.findall(rf"mul\.f32x2\s+%rd\d+, (?:%rd\d+, {pair}|{pair}, %rd\d+);", ptx)
    assert len(muls) == tile[1] // 32 * 16


def _stored_values(ptx: _Ptx) -> tuple[list, set]:
    """Every 32-bit value the kernel stores to shared memory that depends on the accumulator,
    as an expression over the values it loaded: ("tmem", load, column) for a tcgen05.ld result,
    ("alpha",) for its one global load, (op, *operands) for anything computed, followed through
    64-bit packing; and the (load, column) of every tcgen05.ld result."""
    val: dict[str, object] = {}
    pair: dict[str, tuple] = {}  # 64-bit register -> its two 32-bit lanes
    stored, loaded, loads = [], set(), 0
    for op, ops in ptx.instructions:
        regs = re.findall(r"%\w+|_", ops[0]) if ops else []
        if op.startswith("tcgen05.ld"):
            val.update({r: ("tmem", loads, i) for i, r in enumerate(regs)})
            loaded |= {(loads, i) for i in range(len(regs))}
            loads += 1
        elif op.startswith("st.shared"):
            for r in re.findall(r"%\w+", ops[1]):
                stored += pair[r] if r in pair else [val.get(r, r)]
        elif op == "mov.b64" and ops[1].startswith("{"):
            pair[ops[0]] = tuple(val.get(r, r) for r in re.findall(r"%\w+", ops[1]))
        elif op == "mov.b64" and ops[0].startswith("{"):
            lanes = pair.get(ops[1], (("?", ops[1]),) * 2)
            val.update({r: lane for r, lane in zip(regs, lanes, strict=True) if r != "_"})
        elif op == "mul.f32x2":
            a, b = (pair.get(o, (("?", o),) * 2) for o in ops[1:])
            pair[ops[0]] = tuple(("mul", x, y) for x, y in zip(a, b, strict=True))
        elif op.startswith("ld.global"):
            val[ops[0]] = ("alpha",)
        elif len(regs) == 1 and regs[0] != "_":
            val[regs[0]] = (op, *(val.get(o, o) for o in ops[1:]))
    return [v for v in stored if _reads_tmem(v)], loaded


def _reads_tmem(expr) -> bool:
    """Whether a ``_stored_values`` expression depends on a tcgen05.ld result."""
    if not isinstance(expr, tuple):
        return False
    return expr[0] == "tmem" or any(_reads_tmem(e) for e in expr[1:])


def _scaled_column(expr) -> tuple[int, int] | None:
    """(load, column) of alpha x one accumulator value, multiplied in fp32; else None."""
    if not (isinstance(expr, tuple) and expr[0] == "mul" and ("alpha",) in expr[1:]):
        return None
    a, b = expr[1:]
    other = b if a == ("alpha",) else a
    return other[1:] if isinstance(other, tuple) and other[0] == "tmem" else None


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX, ids=arch_config_id)
def test_ptx_epilogue_rounds_each_product_once(arch_cfg, compiled_matrix):
    """What the epilogue stores for D is each accumulator value times alpha in fp32, rounded
    once to the output type by round-to-nearest (a 16-bit pair packs columns 2c and 2c + 1,
    the lower in the low half; Float32 stores the products themselves), and every column of
    every TMEM load is stored exactly once: no second rounding, no alpha after the rounding."""
    _, (_, c_dtype, _, _) = arch_cfg
    ptx = _Ptx(compiled_matrix[arch_config_id(arch_cfg)].ptx)
    stored, loaded = _stored_values(ptx)
    if c_dtype == "Float32":
        columns = [_scaled_column(v) for v in stored]
    else:
        cvt = {"BFloat16": "cvt.rn.bf16x2.f32", "Float16": "cvt.rn.f16x2.f32"}[c_dtype]
        assert all(isinstance(v, tuple) and v[0] == cvt and len(v) == 3 for v in stored), {
            v[0] if isinstance(v, tuple) else v for v in stored
        }
        columns = [_scaled_column(part) for v in stored for part in (v[2], v[1])]
    assert None not in columns, "a stored value is not alpha x one accumulator value"
    assert all(
        lo[0] == hi[0] and lo[1] % 2 == 0 and hi[1] == lo[1] + 1
        for lo, hi in zip(columns[::2], columns[1::2], strict=True)
    ), "columns paired out of order"
    assert sorted(columns) == sorted(loaded), "a TMEM column stored twice or not at all"


@pytest.mark.parametrize("arch_cfg", FAMILY_MATRIX[:4], ids=arch_config_id)
def test_host_builds_each_descriptor_from_its_own_pointer(arch_cfg, compiled_matrix):
    """The host function turns its pointer arguments (A, B, SFA, SFB, D) into TMA descriptors
    in that order, each once, and passes alpha's pointer on to the kernel launch."""
    host = compiled_matrix[arch_config_id(arch_cfg)].host_ir
    signature = host[: host.index(") -> ")]
    args = re.findall(r"(%arg\d+): ", signature)
    params = list(inspect.signature(bw.BlockwiseGemmFp4Sm100.__call__).parameters)[1:]
    # pointers, M, N, K, L, alpha's pointer, stream (max_active_clusters is a compile-time one)
    assert len(args) == 5 + 4 + 1 + 1 and params[:5] == [
        "a_ptr",
        "b_ptr",
        "sfa_ptr",
        "sfb_ptr",
        "c_ptr",
    ]
    body = host[host.index(") -> ") :]
    assert re.findall(r"llvm\.ptrtoint (%arg\d+) ", body) == args[:5]
    alpha = args[9]
    assert params[6] == "alpha_ptr" and re.search(rf"{alpha}: !llvm\.ptr<1>", signature)
    assert re.search(rf"llvm\.insertvalue {alpha}, ", body)


# ------------------------------------------------------------------------------------------
# The scale-factor layout handed to TMA, against reference.to_blocked (host-side, no GPU)
# ------------------------------------------------------------------------------------------
def _kernel_sf_offsets(rows: int, k: int, batches: int, vec: int) -> list[int]:
    result: dict[str, list[int]] = {}

    @cute.jit
    def probe(
        rows: cutlass.Constexpr,
        k: cutlass.Constexpr,
        batches: cutlass.Constexpr,
        vec: cutlass.Constexpr,
    ):
        # The layout the kernel builds mSFA_mkl / mSFB_nkl with.
        layout = bw.sf_layout((rows, k, batches), vec)
        offsets = []
        for b in cutlass.range_constexpr(batches):
            for r in cutlass.range_constexpr(rows):
                for c in cutlass.range_constexpr(k // vec):
                    # Every element of a scale block maps to the same scale.
                    first = cute.crd2idx((r, c * vec, b), layout)
                    last = cute.crd2idx((r, c * vec + vec - 1, b), layout)
                    assert first == last
                    offsets.append(first)
        result["offsets"] = offsets

    probe(rows, k, batches, vec)
    return result["offsets"]


@pytest.mark.parametrize(
    "rows,k,batches,vec",
    [(128, 256, 1, 16), (200, 320, 2, 16), (1, 32, 1, 32), (129, 96, 3, 32), (300, 160, 1, 16)],
)
def test_sf_layout_matches_to_blocked(rows, k, batches, vec):
    cols = k // vec
    # Distinct value for every scale: its position in the unswizzled [L, rows, cols] tensor.
    values = torch.arange(1, batches * rows * cols + 1, dtype=torch.int32).reshape(
        batches, rows, cols
    )
    blocked = reference.to_blocked(values.to(torch.float32)).flatten()
    kernel_view = blocked[torch.tensor(_kernel_sf_offsets(rows, k, batches, vec))]
    assert torch.equal(kernel_view.to(torch.int32), values.flatten())
    # The padded size the kernel addresses equals what to_blocked allocates.
    assert blocked.numel() == batches * (-(-rows // 128) * 128) * (-(-cols // 4) * 4)


def _scale_values(rows: int, cols: int, batches: int) -> torch.Tensor:
    """A distinct value for every scale: its position in the unswizzled [L, rows, cols] tensor."""
    return torch.arange(1, batches * rows * cols + 1, dtype=torch.int32).reshape(
        batches, rows, cols
    )


SFB_TILE_CASES = [
    # (N, K, L, sf_vec_size, CTA tile N)
    (1000, 512, 2, 16, 64),
    (1000, 512, 1, 32, 192),
    (700, 768, 1, 16, 192),
    (520, 256, 1, 16, 128),
    (600, 256, 1, 32, 256),
]


@pytest.mark.parametrize("n,k,batches,vec,tile_n", SFB_TILE_CASES)
def test_sfb_tiles_the_kernel_loads_match_to_blocked(n, k, batches, vec, tile_n):
    """SFB as the kernel addresses it, per N tile and k-tile: the kernel's layout (sf_layout,
    then _sfb_tma_layout: the 192 re-index), cut into sfb_load_rows-row tiles; N tile t reads
    SFB tile _sfb_coords(t)[0] from _sfb_coords(t)[1] TMEM columns (32 rows each) on.
    Row r of N tile t must be the scale to_blocked stores for row t * tile_n + r."""
    found: dict[str, list] = {}
    gemm = bw.BlockwiseGemmFp4Sm100(vec, (128, tile_n), (1, 1))

    @cute.jit
    def probe(
        n: cutlass.Constexpr,
        k: cutlass.Constexpr,
        batches: cutlass.Constexpr,
        vec: cutlass.Constexpr,
        tile_n: cutlass.Constexpr,
    ):
        layout = gemm._sfb_tma_layout(bw.sf_layout((n, k, batches), vec))
        load_rows = bw.sfb_load_rows(tile_n)
        triples = []
        for b in cutlass.range_constexpr(batches):
            for t in cutlass.range_constexpr(-(-n // tile_n)):
                tile_index, shift = gemm._sfb_coords(t)
                first = tile_index * load_rows + shift * bw.SF_ATOM_LANES
                for kk in cutlass.range_constexpr(k // 256 if k >= 256 else 1):
                    for r in cutlass.range_constexpr(0, min(tile_n, n - t * tile_n), 5):
                        for c in (0, min(256, k) // vec - 1):
                            crd = (first + r, kk * 256 + c * vec, b)
                            want = (b, t * tile_n + r, kk * 256 // vec + c)
                            triples.append((want, cute.crd2idx(crd, layout)))
        found["triples"] = triples

    probe(n, k, batches, vec, tile_n)
    values = _scale_values(n, k // vec, batches)
    blocked = reference.to_blocked(values.to(torch.float32)).flatten().to(torch.int32)
    wrong = [(w, int(blocked[off])) for w, off in found["triples"] if blocked[off] != values[w]]
    assert found["triples"] and wrong == []


@pytest.mark.parametrize(
    "m,k,batches,vec,tile_m",
    [(300, 512, 2, 16, 128), (600, 256, 1, 32, 256), (129, 768, 1, 16, 256)],
)
def test_sfa_tiles_the_kernel_loads_match_to_blocked(m, k, batches, vec, tile_m):
    """SFA as the kernel addresses it: sf_layout over A's rows, cut into MMA tiles of tile_m
    rows; row r of M tile t must be the scale to_blocked stores for row t * tile_m + r."""
    found: dict[str, list] = {}

    @cute.jit
    def probe(
        m: cutlass.Constexpr,
        k: cutlass.Constexpr,
        batches: cutlass.Constexpr,
        vec: cutlass.Constexpr,
        tile_m: cutlass.Constexpr,
    ):
        layout = bw.sf_layout((m, k, batches), vec)
        triples = []
        for b in cutlass.range_constexpr(batches):
            for t in cutlass.range_constexpr(-(-m // tile_m)):
                for kk in cutlass.range_constexpr(k // 256):
                    for r in cutlass.range_constexpr(0, min(tile_m, m - t * tile_m), 7):
                        for c in (0, 256 // vec - 1):
                            crd = (t * tile_m + r, kk * 256 + c * vec, b)
                            triples.append(
                                (
                                    (b, t * tile_m + r, kk * 256 // vec + c),
                                    cute.crd2idx(crd, layout),
                                )
                            )
        found["triples"] = triples

    probe(m, k, batches, vec, tile_m)
    values = _scale_values(m, k // vec, batches)
    blocked = reference.to_blocked(values.to(torch.float32)).flatten().to(torch.int32)
    wrong = [(w, int(blocked[off])) for w, off in found["triples"] if blocked[off] != values[w]]
    assert found["triples"] and wrong == []


@pytest.mark.parametrize("vec", [16, 32])
def test_global_tensors_each_on_its_own_pointer_and_shape(vec):
    """The kernel's global tensors: each built on its own pointer (told apart by alignment),
    A and SFA over M rows, B and SFB over N rows, SF layouts as sf_layout gives them, A, B and
    D over the torch tensors' strides (D's rows padded, its batches M rows apart)."""
    found: dict[str, object] = {}
    m, n, k, batches = 300, 196, 512, 2  # (196 BF16: rows padded to 200)

    @cute.jit
    def probe(
        a: cute.Pointer, b: cute.Pointer, sfa: cute.Pointer, sfb: cute.Pointer, c: cute.Pointer
    ):
        gemm = bw.BlockwiseGemmFp4Sm100(vec, (128, 128), (1, 1))
        gemm.c_dtype = c.value_type
        tensors = gemm.global_tensors(a, b, sfa, sfb, c, (m, n, k, batches))
        found["align"] = [t.iterator.alignment for t in tensors]
        found["shapes"] = [tuple(cute.size(t, mode=[i]) for i in range(3)) for t in tensors]
        checks = []
        for tensor, rows in ((tensors[2], m), (tensors[3], n)):
            plain = bw.sf_layout((rows, k, batches), vec)
            for crd in ((0, 0, 0), (rows - 1, k - 1, batches - 1), (rows // 2, k // 3, 1)):
                checks.append(cute.crd2idx(crd, tensor.layout) == cute.crd2idx(crd, plain))
        found["sf_layouts"] = checks
        # (A, B and D element offsets as the torch tensors gemm is handed lay them out)
        offsets = []
        for tensor, strides in zip(
            (tensors[0], tensors[1], tensors[4]), torch_strides, strict=True
        ):
            for crd in ((1, 3, 1), (m // 2 - 1, 7, batches - 1), (2, 1, 0)):
                want = crd[2] * strides[0] + crd[0] * strides[1] + crd[1] * strides[2]
                offsets.append(cute.crd2idx(crd, tensor.layout) == want)
        found["offsets"] = offsets

    d = bw.empty_d(batches, m, n, "BFloat16", "cpu")
    # (packed FP4 [L, rows, K/2] in elements: two per byte)
    torch_strides = [(m * k, k, 1), (n * k, k, 1), d.stride()]
    gmem = cute.AddressSpace.gmem
    sf = bw.SF_DTYPES[bw.SF_FORMATS[vec][0]]
    pointers = [
        make_ptr(dtype, 1 << 20, gmem, assumed_align=align)
        for dtype, align in (
            (cutlass.Float4E2M1FN, 16),
            (cutlass.Float4E2M1FN, 32),
            (sf, 64),
            (sf, 128),
            (cutlass.BFloat16, 256),
        )
    ]
    probe(*pointers)
    assert found["align"] == [16, 32, 64, 128, 256]
    # (the scale tensors cover whole 128-row atoms)
    assert found["shapes"] == [
        (m, k, batches),
        (n, k, batches),
        (384, k, batches),
        (256, k, batches),
        (m, n, batches),
    ]
    assert found["sf_layouts"] == [True] * 6
    assert found["offsets"] == [True] * 9


@pytest.mark.parametrize(
    "tile_n,index,shift",
    [
        (64, [0, 0, 1, 1, 2], [0, 2, 0, 2, 0]),
        (128, [0, 1, 2, 3, 4], [0] * 5),
        (192, [0, 1, 2, 3, 4], [0, 2, 0, 2, 0]),
        (256, [0, 1, 2, 3, 4], [0] * 5),
    ],
)
def test_sfb_tile_index_and_tmem_shift(tile_n, index, shift):
    assert [bw.sfb_tile_index(t, tile_n) for t in range(5)] == index
    assert [bw.sfb_tmem_column_shift(t, tile_n) for t in range(5)] == shift
    for tile_m in (128, 256):
        gemm = bw.BlockwiseGemmFp4Sm100(16, (tile_m, tile_n), (2, 1))
        assert [gemm._sfb_coords(t) for t in range(5)] == list(zip(index, shift, strict=True))
    assert bw.sfb_load_rows(tile_n) == (128 if tile_n <= 128 else 256)


@pytest.mark.parametrize(
    "n,c_dtype,pitch",
    [(1, "BFloat16", 8), (8, "Float16", 8), (13, "Float32", 16), (4096, "BFloat16", 4096)],
)
def test_c_row_pitch(n, c_dtype, pitch):
    assert bw.c_row_pitch(n, c_dtype) == pitch


# ------------------------------------------------------------------------------------------
# The MMA guard and can_implement
# ------------------------------------------------------------------------------------------
def test_mma_guard_accepts_block_scaled_and_rejects_dense():
    outcome = {}

    @cute.jit
    def probe():
        k_major = OperandMajorMode.K
        scaled = sm100_utils.make_blockscaled_trivial_tiled_mma(
            cutlass.Float4E2M1FN,
            cutlass.Float4E2M1FN,
            k_major,
            k_major,
            cutlass.Float8E4M3FN,
            16,
            tcgen05.CtaGroup.ONE,
            (128, 128),
        )
        bw.assert_block_scaled_fp4_mma(scaled, 16, cutlass.Float8E4M3FN)
        outcome["scaled"] = "accepted"
        try:
            bw.assert_block_scaled_fp4_mma(scaled, 32, cutlass.Float8E8M0FNU)
        except TypeError as err:
            outcome["wrong_vec"] = str(err)
        # The FP8 habit: on FP4 data this builds a plain kind::f8f6f4 MMA (K 32, no scales).
        dense = sm100_utils.make_trivial_tiled_mma(
            cutlass.Float4E2M1FN,
            cutlass.Float4E2M1FN,
            k_major,
            k_major,
            cutlass.Float32,
            tcgen05.CtaGroup.ONE,
            (128, 128),
        )
        try:
            bw.assert_block_scaled_fp4_mma(dense, 16, cutlass.Float8E4M3FN)
        except TypeError as err:
            outcome["dense"] = str(err)
        try:
            bw.assert_block_scaled_fp4_mma(scaled, 16, cutlass.Float8E8M0FNU)
        except TypeError as err:
            outcome["wrong_sf_dtype"] = str(err)

    # (compiled for Blackwell, not run: on a GPU machine a jit call targets that GPU's arch)
    cute.compile(probe, options=f"--gpu-arch {bw.DEFAULT_GPU_ARCH}")
    assert outcome["scaled"] == "accepted"
    assert "sf_vec_size=32" in outcome["wrong_vec"]
    assert "got MmaF8F6F4Op" in outcome["dense"]
    assert "sf_dtype=Float8E8M0FNU" in outcome["wrong_sf_dtype"]


GOOD = dict(
    mnkl=(8192, 8192, 8192, 1),
    sf_vec_size=16,
    sf_dtype="Float8E4M3FN",
    c_dtype="BFloat16",
    mma_tiler_mn=(128, 128),
    cluster_shape_mn=(1, 1),
)


@pytest.mark.parametrize(
    "change,reason",
    [
        (dict(mnkl=(128, 128, 100, 1)), "K=100 is not a multiple of 32"),
        # (16 packed bytes hold 32 FP4 values: K = 48 is 24 bytes, not a whole TMA unit)
        (dict(mnkl=(128, 128, 48, 1)), "K=48 is not a multiple of 32"),
        (dict(mnkl=(0, 128, 256, 1)), "M must be >= 1"),
        (dict(mnkl=(128, 128, 256, 0)), "L must be >= 1"),
        (dict(mnkl=(128, 128)), "mnkl must be four integers"),
        (dict(sf_vec_size=8), "sf_vec_size=8 is not supported"),
        (dict(sf_dtype="Float8E8M0FNU"), "does not pair with sf_vec_size=16"),
        (dict(sf_vec_size=32), "does not pair with sf_vec_size=32"),
        (dict(sf_dtype="Float16"), "is not a scale-factor type"),
        (dict(c_dtype="Float8E4M3FN"), "c_dtype=Float8E4M3FN is not supported"),
        (dict(mma_tiler_mn=(64, 128)), "MMA tile M=64 is not supported"),
        (dict(mma_tiler_mn=(128, 96)), "MMA tile N=96 is not supported"),
        (dict(cluster_shape_mn=(3, 1)), "cluster shape M=3 must be a power of two"),
        (dict(cluster_shape_mn=(1, 8)), "cluster shape N=8 exceeds 4"),
        (dict(mma_tiler_mn=(256, 128)), "M must be even"),
        (dict(mnkl=(32768, 1024, 65536, 1)), "M*K = 2147483648 elements does not fit"),
        (dict(mnkl=(64, 65536, 32768, 1)), "N*K = 2147483648 elements does not fit"),
        (dict(mnkl=(32768, 131072, 256, 1)), "M * row pitch of D = 4294967296 elements"),
    ],
)
def test_can_implement_refusals(change, reason):
    config = {**GOOD, **change}
    ok, reasons = bw.BlockwiseGemmFp4Sm100.can_implement(**config)
    assert not ok
    assert any(reason in r for r in reasons), reasons


def test_can_implement_accepts_the_matrix():
    for (vec, sf_dtype), c_dtype, tile, cluster in COMPILE_MATRIX:
        for mnkl in [(8192, 8192, 8192, 1), (1, 1, 32, 1), (333, 77, 32 * 7, 3)]:
            assert bw.check_fp4_gemm_config(mnkl, vec, sf_dtype, c_dtype, tile, cluster) == []


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------
def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "blockwise_gemm_fp4.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mnkl", "1,2,3"], "--mnkl expects 4 integers"),
        (["--mnkl", "1,2,3,4,5"], "--mnkl expects 4 integers"),
        (["--mma_tiler_mn", "128,128,1"], "--mma_tiler_mn expects 2 integers"),
        (["--mnkl", "128,128,100,1"], "K=100 is not a multiple of 32"),
        (["--sf_vec_size", "32", "--sf_dtype", "Float8E4M3FN"], "does not pair"),
        (["--mma_tiler_mn", "256,128", "--cluster_shape_mn", "1,1"], "M must be even"),
        (["--iterations", "0"], "--iterations must be >= 1"),
        (["--tolerance", "nan"], "--tolerance must be a finite number > 0, got nan"),
        (["--alpha", "1e39"], "--alpha: alpha=1e+39 is not a finite fp32 number"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(args, message):
    proc = _cli(*args, "--compile_only")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_dump_dir_that_is_a_file_exits_2(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    proc = _cli("--compile_only", "--dump_dir", str(blocker))
    assert proc.returncode == 2
    assert "--dump_dir" in proc.stderr and "cannot create the folder" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_compile_only_summary(tmp_path):
    proc = _cli("--compile_only", "--dump_dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Compile only: sm_100f, no GPU used" in out
    assert re.search(r"cubin: .*\.sm_100f\.cubin", out)
    assert "mnkl: (8192, 8192, 8192, 1)" in out
    assert re.search(r"pipeline stages: A/B/SF \d+, accumulator 2, epilogue \d+", out)
    assert re.search(r"TMEM columns: accumulators 256 \+ SFA 16 \+ SFB 16 of 512", out)
    if bw.find_cuobjdump():
        assert "local memory per thread: 0 bytes" in out
    folder = tmp_path / "nvfp4_BFloat16_tile256x128_cluster2x1_sm_100f"
    assert list(folder.glob("*.ptx")) and list(folder.glob("*.cubin"))


def test_cli_compile_only_keeps_each_configuration_apart(tmp_path):
    """Two configurations compiled into one --dump_dir keep their own PTX and cubin (the DSL
    names the files after the kernel only)."""
    cubins = []
    for tile in ("128,64", "128,128"):
        args = ("--mnkl", "256,256,256,1", "--mma_tiler_mn", tile, "--cluster_shape_mn", "1,1")
        proc = _cli(*args, "--compile_only", "--dump_dir", str(tmp_path), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        cubins.append(Path(re.search(r"cubin: (\S+)", proc.stdout).group(1)))
    assert cubins[0].parent != cubins[1].parent and all(c.exists() for c in cubins)
    assert cubins[0].parent.name == "nvfp4_BFloat16_tile128x64_cluster1x1_sm_100f"


@pytest.mark.parametrize(
    "arch,capability,runs",
    [
        ("sm_100f", (10, 0), True),
        ("sm_100f", (10, 3), True),
        ("sm_100a", (10, 0), True),
        ("sm_100a", (10, 3), False),
        ("sm_103a", (10, 3), True),
        ("sm_103a", (10, 0), False),
        ("sm_100f", (9, 0), False),
        ("sm_100f", (12, 0), False),
        ("sm_100f", (11, 0), False),
    ],
)
def test_cli_gpu_check_per_target(monkeypatch, arch, capability, runs):
    """The CLI runs a build only on the GPUs its target covers (the family target: both)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a stand-in GPU")
    ok, description = bw.blackwell_gpu(arch)
    assert ok == runs
    assert description == f"a stand-in GPU (sm_{capability[0]}{capability[1]})"


def test_default_target_is_the_family_target():
    assert bw.DEFAULT_GPU_ARCH == "sm_100f"
    assert set(bw.BLACKWELL_CAPABILITIES) == {(10, 0), (10, 3)}
    assert bw.make_parser().parse_args([]).gpu_arch == "sm_100f"


@pytest.mark.parametrize(
    "capability", [(8, 0), (8, 9), (9, 0), (10, 0), (10, 1), (10, 2), (10, 3), (11, 0), (12, 0)]
)
def test_library_routes_each_capability_to_its_kernel(monkeypatch, capability):
    """fp4_ops sends a GPU's GEMMs to the Hopper kernel on sm_90, to this kernel on the GPUs its
    default (family) build runs on, and refuses every other GPU, sm_10x ones outside the family
    included: the library's list of those GPUs is the kernel's."""
    from fp4_ops import ops

    assert ops.BLACKWELL_CAPABILITIES == bw.BLACKWELL_CAPABILITIES
    monkeypatch.setattr(ops, "_CAPABILITIES", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a stand-in GPU")
    t = SimpleNamespace(get_device=lambda: 0, is_cuda=True, device=torch.device("cuda", 0))
    blackwell = capability in bw.BLACKWELL_CAPABILITIES
    assert ops.runs_blackwell_kernels(t) == blackwell
    if capability == (9, 0) or blackwell:
        assert ops.runs_hopper_kernels(t) == (capability == (9, 0))
    else:
        with pytest.raises(ValueError, match=f"is sm_{capability[0]}{capability[1]}"):
            ops.runs_hopper_kernels(t)


@pytest.mark.parametrize("c_dtype", ["Int8", "bfloat16", "Float8E4M3FN", None])
def test_empty_d_refuses_a_type_d_cannot_have(c_dtype):
    """empty_d takes gemm's D types only: anything else is a ValueError naming them."""
    with pytest.raises(ValueError, match="BFloat16"):
        bw.empty_d(1, 16, 64, c_dtype, "cpu")


class _Dressed:
    """A CPU tensor dressed as one on cuda:0: what ``gemm_impl`` looks at to pick a route."""

    def __init__(self, t: torch.Tensor):
        self.t, self.device = t, torch.device("cuda", 0)


def _bind_into(handed: list, signature: inspect.Signature, *args, **kwargs) -> None:
    handed.append(signature.bind(*args, **kwargs))


@pytest.mark.parametrize("batch", [(), (2,)], ids=["2d", "batched"])
@pytest.mark.parametrize("alphas", ["global scales", "one alpha"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (10, 3)])
def test_each_kernel_route_is_handed_the_product_the_cpu_forms(
    monkeypatch, capability, fmt, alphas, batch
):
    """The GEMM op's GPU routes (the Hopper kernel's and this kernel's), given dressed CPU
    operands: what each kernel entry is handed, multiplied out by the CPU's math, is the CPU
    route's product, bit for bit (operands, scales, alpha and its second factor, dtype)."""
    import fp4_ops
    from fp4_ops import cpu, ops, sm100
    from fp4_ops.sm90 import launcher

    gen = torch.Generator().manual_seed(11)
    a = fp4_ops.quantize(torch.randn(*batch, 5, 128, generator=gen), fmt)
    b = fp4_ops.quantize(torch.randn(*batch, 24, 128, generator=gen) * 3, fmt)
    if fmt == "nvfp4":
        assert a.global_scale.item() != b.global_scale.item()  # (swapping them must show)
    gs = a.global_scale * b.global_scale * 0.37
    alpha, alpha_scale = (
        (a.global_scale, b.global_scale) if alphas == "global scales" else (gs, None)
    )
    out_dtype = torch.bfloat16 if batch else torch.float32
    args = (a.data, a.scale, b.data, b.scale, alpha, alpha_scale, a.sf_vec_size, out_dtype)
    want = ops.gemm_impl(*args)

    handed = []
    for module in (sm100, launcher):
        signature = inspect.signature(module.gemm_for_ops)
        record = functools.partial(_bind_into, handed, signature)
        monkeypatch.setattr(module, "gemm_for_ops", record)
    monkeypatch.setattr(ops, "_capability", lambda t: capability)
    dressed = (_Dressed(a.data), *args[1:2], _Dressed(b.data), *args[3:])
    ops.gemm_impl(*dressed)

    (bound,) = handed
    bound.apply_defaults()
    got = bound.arguments
    assert got.get("a_dtype", launcher.W4A4) == launcher.W4A4
    assert (capability == (9, 0)) == ("scale" in got)
    total = got["alpha"] if got.get("scale") is None else got["alpha"] * got["scale"]
    assert total.dtype == torch.float32 and total.numel() == 1
    product = cpu.gemm(
        got["a"].t, got["sfa"], got["b"].t, got["sfb"], total, got["sf_vec_size"], got["out_dtype"]
    )
    assert product.dtype == want.dtype and torch.equal(product, want)


ON_BLACKWELL = (
    torch.cuda.is_available() and torch.cuda.get_device_capability() in bw.BLACKWELL_CAPABILITIES
)


@pytest.mark.skipif(
    ON_BLACKWELL, reason="a Blackwell GPU is present: the CLI runs the kernel instead of refusing"
)
def test_cli_without_blackwell_refuses_clearly():
    proc = _cli("--mnkl", "256,256,256,1")
    assert proc.returncode == 2
    want = "a sm_100f build of this kernel needs a datacenter Blackwell GPU (sm_100 or sm_103"
    assert want in proc.stderr and "found" in proc.stderr
    assert "--compile_only" in proc.stderr and "python -m fp4_ops.sm90" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------
# On a datacenter Blackwell GPU: values against reference.reference_gemm (and cuBLASLt)
# ------------------------------------------------------------------------------------------
needs_blackwell = pytest.mark.skipif(
    not ON_BLACKWELL,
    reason="needs a datacenter Blackwell GPU (sm_100 or sm_103); "
    + (
        f"found {torch.cuda.get_device_name()}"
        if torch.cuda.is_available()
        else "no CUDA device here"
    ),
)
# A multicast or pipeline bug hangs a GPU test: the timeout fails it instead (the thread method
# ends a hang inside a CUDA call; tests/conftest.py registers the marks).
gpu_timeout = pytest.mark.timeout(600, method="thread")


GPU_CASES = [
    # (mnkl, format, c_dtype, tile, cluster, alpha)
    ((256, 256, 512, 1), NVFP4, "BFloat16", (128, 128), (1, 1), None),
    ((300, 200, 32 * 9, 2), NVFP4, "Float32", (128, 128), (1, 1), 0.37),
    ((1000, 1030, 32 * 33, 1), MXFP4, "Float16", (128, 64), (1, 2), None),
    ((513, 700, 2048, 3), NVFP4, "BFloat16", (256, 192), (2, 1), -2.5),
    ((777, 333, 32 * 15, 1), MXFP4, "Float32", (256, 256), (2, 2), 1.0),
    ((1, 4096, 7168, 1), NVFP4, "BFloat16", (128, 256), (1, 1), None),
    ((4096, 7168, 2048, 1), NVFP4, "BFloat16", (256, 128), (4, 4), None),
    ((640, 384, 1024, 2), MXFP4, "BFloat16", (128, 192), (1, 1), 3.0),
    ((700, 900, 1024, 1), NVFP4, "BFloat16", None, None, None),  # pick_tile_and_cluster
]


def _check_on_gpu(d, ops, operands, alpha):
    """reference.check_gemm_or_library, cuBLASLt as the second oracle where it runs."""
    d_cublas, _ = bw.cublaslt_result(*operands, alpha)
    return reference.check_gemm_or_library(d, d_cublas, *ops.gemm_args[:5], alpha)


@needs_blackwell
@gpu_timeout
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}-{c[4]}")
def test_gpu_matches_reference(case):
    mnkl, (vec, _), c_dtype, tile, cluster, alpha = case
    ops = reference.make_fp4_operands(*mnkl, vec, device="cuda", seed=7, dist="wide")
    alpha = float(ops.alpha) if alpha is None else alpha
    operands = (ops.a, ops.b, reference.to_blocked(ops.sfa), reference.to_blocked(ops.sfb))
    launch, d = bw.prepare_gemm(
        *operands, vec, alpha=alpha, c_dtype=c_dtype, mma_tiler_mn=tile, cluster_shape_mn=cluster
    )
    # D starts as NaN: every element must be written, the row padding never.
    launch.d_padded.fill_(math.nan)
    launch()
    torch.cuda.synchronize()
    ok, info = _check_on_gpu(d, ops, operands, alpha)
    assert ok, str(info)
    assert bool(launch.d_padded[..., mnkl[1] :].isnan().all())


@needs_blackwell
@gpu_timeout
def test_gpu_launch_keeps_operands_alive():
    """Every caller reference dropped, memory allocated over what was freed: launch() still
    reads its own operands and writes its own D."""
    ops = reference.make_fp4_operands(512, 384, 1024, 1, 16, device="cuda", seed=11)
    alpha = float(ops.alpha)
    operands = (ops.a, ops.b, reference.to_blocked(ops.sfa), reference.to_blocked(ops.sfb))
    launch, d = bw.prepare_gemm(*[t.clone() for t in operands], 16, alpha=alpha)
    del d
    gc.collect()
    torch.cuda.synchronize()
    # Whatever the caching allocator hands out now would reuse freed operands' memory.
    junk = [torch.full((1 << 20,), 0x77, dtype=torch.uint8, device="cuda") for _ in range(64)]
    launch()
    torch.cuda.synchronize()
    ok, info = _check_on_gpu(launch.d_padded[..., :384], ops, operands, alpha)
    assert ok, str(info)
    del junk


@needs_blackwell
@gpu_timeout
def test_gpu_alpha_is_read_from_device_memory_at_every_launch():
    """The kernel reads alpha from the caller's tensor when it runs: a value written into the
    tensor on the stream, with no new prepare_gemm, changes D, in an eager launch and in a
    replayed CUDA graph."""
    ops = reference.make_fp4_operands(300, 256, 512, 1, 16, device="cuda", seed=13)
    operands = (ops.a, ops.b, reference.to_blocked(ops.sfa), reference.to_blocked(ops.sfb))
    alpha = torch.full((), float(ops.alpha), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch, d = bw.prepare_gemm(*operands, 16, alpha=alpha)
        launch()
        stream.synchronize()
        ok, info = _check_on_gpu(d, ops, operands, float(ops.alpha))
        assert ok, str(info)
        alpha.fill_(-3.0 * float(ops.alpha))
        launch()
        stream.synchronize()
        ok, info = _check_on_gpu(d, ops, operands, -3.0 * float(ops.alpha))
        assert ok, f"eager launch after a new alpha: {info}"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            launch()
        alpha.fill_(0.5 * float(ops.alpha))
        graph.replay()
        stream.synchronize()
    ok, info = _check_on_gpu(d, ops, operands, 0.5 * float(ops.alpha))
    assert ok, f"graph replay after a new alpha: {info}"


@needs_blackwell
@gpu_timeout
def test_gpu_cli_defaults():
    proc = _cli("--iterations", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Mean time:" in proc.stdout and "Throughput:" in proc.stdout
    assert "ours against reference_gemm:" in proc.stdout
    assert "cuBLASLt against reference_gemm:" in proc.stdout
    assert "rule that held: " in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "PASS"


# ------------------------------------------------------------------------------------------
# The CLI's timing helpers (any CUDA GPU: they time torch work here, the kernel on Blackwell)
# ------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (any)")
def test_time_us_runs_every_call_on_the_stream():
    stream = torch.cuda.Stream()
    counters = [torch.zeros(1, device="cuda") for _ in range(3)]

    def adder(c):
        def call():
            with torch.cuda.stream(stream):
                c.add_(1.0)

        return call

    us = bw.time_us([adder(c) for c in counters], stream, warmup_iterations=2, iterations=7)
    torch.cuda.synchronize()
    assert 0.0 < us < 1e6
    # 2 warm-up + 7 timed calls, rotating through the three calls: three each
    assert [int(c.item()) for c in counters] == [3, 3, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (any)")
def test_time_us_times_one_call():
    """A call that spins the GPU for a fixed number of cycles: the mean equals one call's time
    measured alone."""
    stream = torch.cuda.Stream()
    cycles = 2_000_000  # about 1 ms at the H200's / B200's clocks

    def spin():
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)

    spin()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
    torch.cuda.synchronize()
    alone_us = 1e3 * start.elapsed_time(end)
    us = bw.time_us([spin], stream, warmup_iterations=1, iterations=4)
    assert 0.8 * alone_us < us < 1.25 * alone_us, (us, alone_us)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (any)")
def test_operand_sets_cold_l2_copies():
    from cutlass.testing import get_workspace_count

    a = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
    assert len(bw.operand_sets((a,), False, 3, 20)) == 1
    sets = bw.operand_sets((a,), True, 3, 20)
    assert len(sets) == get_workspace_count(a.numel() * a.element_size(), 3, 20) > 1
    assert all(torch.equal(s[0], a) and s[0].data_ptr() != a.data_ptr() for s in sets[1:])


def _stand_in_kernels(monkeypatch, launches: list, prepared: list) -> list:
    """Blackwell stand-ins for the CLI on any CUDA GPU: prepare_gemm by one that records its
    A operand and configuration in ``prepared`` and returns a launch writing the reference
    result from the stream current at preparation (recorded in ``launches`` with whether it
    is being captured), torch._scaled_mm by one that zeroes its output; returns the streams
    _scaled_mm was called on."""

    def stand_in(a, b, sfa_blocked, sfb_blocked, sf_vec_size, alpha=1.0, **config):
        prepared.append((a, dict(config, sf_vec_size=sf_vec_size, alpha=alpha)))
        l, m, half_k = a.shape  # noqa: E741
        n, cols = b.shape[1], 2 * half_k // sf_vec_size
        sfa = reference.from_blocked(sfa_blocked, m, cols)
        sfb = reference.from_blocked(sfb_blocked, n, cols)
        d = reference.reference_gemm(a, b, sfa, sfb, sf_vec_size, alpha, torch.bfloat16)
        bound = torch.cuda.current_stream()
        out = torch.empty_like(d)

        def launch():
            with torch.cuda.stream(bound):
                launches.append((bound, torch.cuda.is_current_stream_capturing()))
                out.copy_(d)

        return launch, out

    scaled_mm_calls = []

    def stand_in_scaled_mm(a, b, scale_a, scale_b, out_dtype, out):
        scaled_mm_calls.append(torch.cuda.current_stream())
        return out.zero_()

    monkeypatch.setattr(bw, "blackwell_gpu", lambda *_: (True, "a stand-in"))
    monkeypatch.setattr(bw, "prepare_gemm", stand_in)
    monkeypatch.setattr(torch, "_scaled_mm", stand_in_scaled_mm)
    return scaled_mm_calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (any)")
@pytest.mark.parametrize(
    "flags,want",
    [
        (["--alpha", "0"], {"alpha": 0.0}),
        (["--alpha", "-0.0"], {"alpha": -0.0}),
        (["--alpha", "0.37"], {"alpha": 0.37}),
        ([], {}),
        (["--sf_vec_size", "32"], {"sf_vec_size": 32}),
        (["--c_dtype", "Float16"], {"c_dtype": "Float16"}),
        (
            ["--mma_tiler_mn", "256,64", "--cluster_shape_mn", "2,1"],
            {"mma_tiler_mn": (256, 64), "cluster_shape_mn": (2, 1)},
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_cli_passes_each_option_to_the_kernel_as_given(monkeypatch, capsys, flags, want):
    """Every configuration the CLI prepares carries the options as given (an alpha of 0 or
    -0 too), and otherwise the defaults: the product of the operands' global scales for
    alpha, NVFP4, BFloat16 output, the default tile and cluster."""
    launches, prepared = [], []
    _stand_in_kernels(monkeypatch, launches, prepared)
    argv = ["--mnkl", "256,128,512,1", "--iterations", "2", "--skip_ref_check", *flags]
    assert bw.main(argv) == 0, capsys.readouterr().out
    vec = want.get("sf_vec_size", 16)
    seed = bw.make_parser().parse_args(argv).seed
    ops = reference.make_fp4_operands(256, 128, 512, 1, vec, "cuda", seed=seed)
    tile, cluster = bw.pick_tile_and_cluster((256, 128, 512, 1), None, None)
    expected = {
        "sf_vec_size": vec,
        "alpha": float(ops.alpha),
        "c_dtype": "BFloat16",
        "mma_tiler_mn": tuple(tile),
        "cluster_shape_mn": tuple(cluster),
    } | want
    configs = [
        dict(
            c, mma_tiler_mn=tuple(c["mma_tiler_mn"]), cluster_shape_mn=tuple(c["cluster_shape_mn"])
        )
        for _, c in prepared
    ]
    assert configs and all(c == expected for c in configs), (configs, expected)
    assert all(
        math.copysign(1.0, c["alpha"]) == math.copysign(1.0, expected["alpha"]) for c in configs
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (any)")
@pytest.mark.parametrize(
    "extra,check_line,last_line",
    [
        ([], "rule that held: derived bound", "PASS"),
        (["--skip_ref_check"], "Reference check: skipped", "NOT CHECKED (--skip_ref_check)"),
    ],
)
def test_cli_flow_with_a_stand_in_kernel(monkeypatch, capsys, extra, check_line, last_line):
    """The CLI's host flow on a GPU (operand copies, the stream prepare_gemm binds, graph timing,
    the checks, the output lines) with prepare_gemm replaced by a stand-in that writes the
    reference result from the stream current at preparation, as the real launch does, and
    torch._scaled_mm by one that returns the reference result too.  The kernel and cuBLASLt's
    FP4 GEMM need a Blackwell GPU."""
    launches, prepared = [], []
    scaled_mm_calls = _stand_in_kernels(monkeypatch, launches, prepared)
    rc = bw.main(["--mnkl", "200,136,512,1", "--iterations", "4", "--use_cold_l2", *extra])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Mean time:" in out and "Throughput:" in out and "ours / cuBLASLt time ratio" in out
    assert check_line in out
    assert out.strip().splitlines()[-1] == last_line
    # every launch ran on one side stream, and the timing graphs captured it there, once per
    # operand copy at least
    streams = {s for s, _ in launches}
    assert len(streams) == 1 and torch.cuda.default_stream() not in streams
    assert len(prepared) > 1  # (--use_cold_l2: operand copies)
    assert sum(capturing for _, capturing in launches) >= len(prepared)
    assert streams <= set(scaled_mm_calls[1:])


# ------------------------------------------------------------------------------------------
# prepare_gemm's input validation (runs before anything touches a GPU)
# ------------------------------------------------------------------------------------------
def _operands(m=256, n=128, k=512, l=1, vec=16):  # noqa: E741
    ops = reference.make_fp4_operands(m, n, k, l, vec, seed=3)
    return ops.a, ops.b, reference.to_blocked(ops.sfa), reference.to_blocked(ops.sfb)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda a, b, sa, sb: (a[0], b, sa, sb, 16), "must be \\[L, rows, K/2\\]"),
        (lambda a, b, sa, sb: (a, b[:, :, :128], sa, sb, 16), "disagree on L or K"),
        (lambda a, b, sa, sb: (a, b, sa.view(torch.uint8), sb, 16), "sfa_blocked must be"),
        (
            lambda a, b, sa, sb: (a, b, sa, sb.view(torch.float8_e8m0fnu), 16),
            "sfb_blocked must be torch.float8_e4m3fn",
        ),
        (lambda a, b, sa, sb: (a, b, sa, sb, 16), "must be a contiguous CUDA tensor"),
        (
            lambda a, b, sa, sb: (a, b, sa.view(1, 256, 32), sb, 16),
            r"sfa_blocked has shape \(1, 256, 32\); the 128x4 blocked layout of the \[L, 256,",
        ),
        (lambda a, b, sa, sb: (a, b, sa, sb[:, :-4], 16), r"sfb_blocked has shape \(1, 4092\)"),
        (lambda a, b, sa, sb: (a, b, sa, sb, 16.0), "sf_vec_size=16.0 is not supported"),
    ],
)
def test_prepare_gemm_rejects_bad_input(mutate, message):
    args = mutate(*_operands())
    with pytest.raises(ValueError, match=message):
        bw.prepare_gemm(*args)


def test_prepare_gemm_rejects_misaligned_operands():
    a, b, sa, sb = _operands()
    # A contiguous view 8 bytes into the buffer: not 16-byte aligned.
    a_flat = torch.empty(a.numel() + 8, dtype=torch.uint8)
    a_off = a_flat[8:].view(a.shape)
    with pytest.raises(ValueError, match="a must start on a 16-byte boundary"):
        bw.prepare_gemm(a_off, b, sa, sb, 16)


def test_prepare_gemm_rejects_unsupported_config():
    a, b, sa, sb = _operands()
    with pytest.raises(ValueError, match="MMA tile N=96 is not supported"):
        bw.prepare_gemm(a, b, sa, sb, 16, mma_tiler_mn=(128, 96))


@pytest.mark.parametrize("n", [192, 384, 1000, 1344, 1536, 2000])
def test_sfb_reindexing_for_192_wide_tiles(n):
    """Tile t of a 192-wide N tiling must load the 256 scale rows from atom floor(1.5 t) on."""
    checked = {}

    @cute.jit
    def probe(n: cutlass.Constexpr):
        plain = bw.sf_layout((n, 256, 1), 16)
        tiled = bw.sfb_layout_for_tile_n_192(plain)
        num_tiles = -(-n // 192)
        pairs = []
        for t in cutlass.range_constexpr(num_tiles):
            first_atom = (3 * t) // 2
            for r in cutlass.range_constexpr(0, 256, 7):
                # Row r of tile t's 256-row load: ((r % 32, r // 32 % 4), ((r // 128, b), c)).
                crd = (((r % 32, (r // 32) % 4), ((r // 128, t % 2), t // 2)), 0, 0)
                want = cute.crd2idx((first_atom * 128 + r, 0, 0), plain)
                pairs.append((t, r, cute.crd2idx(crd, tiled), want))
        checked["tiles"] = num_tiles
        checked["pairs"] = pairs

    probe(n)
    assert checked["tiles"] == -(-n // 192)
    assert len(checked["pairs"]) == checked["tiles"] * len(range(0, 256, 7))
    mismatches = [p for p in checked["pairs"] if p[2] != p[3]]
    assert mismatches == []


@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf, 1e39, -3.5e38, "2", True, None])
def test_prepare_gemm_rejects_alpha_that_is_not_a_finite_fp32(alpha):
    with pytest.raises(ValueError, match="alpha"):
        bw.prepare_gemm(*_operands(), 16, alpha=alpha)


@pytest.mark.parametrize("alpha", [3.4028234663852886e38, -1e-45, 0.0, 7, np.float32(0.5)])
def test_checked_alpha_accepts_finite_fp32(alpha):
    assert bw.checked_alpha(alpha) == float(alpha)


@pytest.mark.parametrize("vec", [8, 0, 64, None])
def test_prepare_gemm_names_an_unsupported_sf_vec_size(vec):
    with pytest.raises(ValueError, match=f"sf_vec_size={vec!r} is not supported: use 16"):
        bw.prepare_gemm(*_operands(), vec)


class _RecordingExecutor:
    """Stands in for the compiled kernel: records the keyword arguments of every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)


def _launch_on_cpu(monkeypatch, executor) -> None:
    """The CUDA-only checks, the compile and the stream replaced (``executor`` stands in for
    the kernel, stream 77): everything else on the way to a launch is the real code path."""
    monkeypatch.setattr(bw, "_check_cuda_operands", lambda **_: None)
    monkeypatch.setattr(bw, "_compiled_kernel", lambda *_: executor)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=77))
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())


def _prepare_on_cpu(monkeypatch, executor, *args, **config):
    """prepare_gemm on CPU tensors (``_launch_on_cpu``): validation, the tile pick, D and the
    launch object are the real code path."""
    _launch_on_cpu(monkeypatch, executor)
    return bw.prepare_gemm(*args, **config)


def _address(ptr) -> int:
    return int(ptr.__tvm_ffi_opaque_ptr__())


@pytest.mark.parametrize("vec,c_dtype", [(16, "BFloat16"), (32, "Float32")])
def test_prepare_gemm_launch_arguments_reach_the_kernel_parameters(monkeypatch, vec, c_dtype):
    """What prepare_gemm binds reaches the kernel's parameters by name: each pointer on its own
    operand, the problem shape, alpha's pointer on the fp32 alpha launch holds, the stream;
    nothing else."""
    executor = _RecordingExecutor()
    a, b, sa, sb = _operands(m=200, n=136, k=512, l=2, vec=vec)
    launch, d = _prepare_on_cpu(
        monkeypatch, executor, a, b, sa, sb, vec, alpha=-0.375, c_dtype=c_dtype
    )
    launch()
    launch()
    assert len(executor.calls) == 2
    args = executor.calls[0]
    # The names are the parameters of the kernel's __call__, minus the compile-time one.
    params = list(inspect.signature(bw.BlockwiseGemmFp4Sm100.__call__).parameters)
    assert list(args) == [p for p in params if p not in ("self", "max_active_clusters")]
    for name, tensor in (
        ("a_ptr", a),
        ("b_ptr", b),
        ("sfa_ptr", sa),
        ("sfb_ptr", sb),
        ("c_ptr", launch.d_padded),
        ("alpha_ptr", launch.alpha),
    ):
        assert _address(args[name]) == tensor.data_ptr(), name
    sf_dtype = bw.SF_DTYPES[bw.SF_FORMATS[vec][0]]
    assert args["sfa_ptr"].dtype is sf_dtype and args["sfb_ptr"].dtype is sf_dtype
    assert args["c_ptr"].dtype is bw.C_DTYPES[c_dtype]
    assert args["a_ptr"].dtype is cutlass.Float4E2M1FN is args["b_ptr"].dtype
    assert [v.value for v in args["problem_mnkl"]] == [200, 136, 512, 2]
    assert args["alpha_ptr"].dtype is cutlass.Float32
    assert launch.alpha.dtype == torch.float32 and launch.alpha.tolist() == [-0.375]
    assert int(args["stream"]) == 77
    # D is a view of the padded buffer the kernel writes
    assert d.data_ptr() == launch.d_padded.data_ptr() and tuple(d.shape) == (2, 200, 136)
    assert launch.d_padded.shape[-1] == bw.c_row_pitch(136, c_dtype)


@pytest.mark.parametrize("vec,c_dtype", [(16, "BFloat16"), (32, "Float32")])
def test_gemm_launch_arguments_reach_the_kernel_parameters(monkeypatch, vec, c_dtype):
    """``gemm``'s one launch (``_launch_on_cpu``): each pointer on its own operand, D and the
    caller's alpha tensor, the problem shape, the current stream."""
    executor = _RecordingExecutor()
    a, b, sa, sb = _operands(m=200, n=136, k=512, l=2, vec=vec)
    _launch_on_cpu(monkeypatch, executor)
    alpha = torch.tensor([-0.375])
    d = bw.empty_d(2, 200, 136, c_dtype, "cpu")
    assert bw.gemm(a, b, sa, sb, alpha, d) is d
    [args] = executor.calls
    for name, tensor in (
        ("a_ptr", a),
        ("b_ptr", b),
        ("sfa_ptr", sa),
        ("sfb_ptr", sb),
        ("c_ptr", d),
        ("alpha_ptr", alpha),
    ):
        assert _address(args[name]) == tensor.data_ptr(), name
    assert args["c_ptr"].dtype is bw.C_DTYPES[c_dtype]
    assert [v.value for v in args["problem_mnkl"]] == [200, 136, 512, 2]
    assert int(args["stream"]) == 77


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0-d", "1-d"])
def test_prepare_gemm_reads_alpha_from_the_callers_tensor(monkeypatch, shape):
    """A one-element fp32 tensor is used in place: its own address reaches the kernel's alpha
    pointer, so a value written into it later is what later launches read."""
    executor = _RecordingExecutor()
    alpha = torch.full(shape, 0.25)
    launch, _ = _prepare_on_cpu(monkeypatch, executor, *_operands(), 16, alpha=alpha)
    launch()
    assert launch.alpha is alpha
    assert _address(executor.calls[0]["alpha_ptr"]) == alpha.data_ptr()


@pytest.mark.parametrize(
    "alpha,message",
    [
        (torch.ones((), dtype=torch.float64), "an alpha tensor must hold one float32 value"),
        (torch.ones(2), r"an alpha tensor must hold one float32 value, got torch.float32 \(2,\)"),
        (torch.ones((), device="meta"), "alpha is on meta, a is on cpu"),
    ],
    ids=["float64", "two-values", "other-device"],
)
def test_prepare_gemm_rejects_a_bad_alpha_tensor(alpha, message):
    with pytest.raises(ValueError, match=message):
        bw.prepare_gemm(*_operands(), 16, alpha=alpha)


def test_prepare_gemm_launch_holds_every_operand_and_d(monkeypatch):
    """The launch object keeps the operands, D and alpha alive after the caller drops them (the
    kernel only has their addresses), and releases them with itself."""
    tensors = [*_operands(), torch.full((), 2.0)]
    refs = [weakref.ref(t) for t in tensors]
    launch, d = _prepare_on_cpu(
        monkeypatch, _RecordingExecutor(), *tensors[:4], 16, alpha=tensors[4]
    )
    refs.append(weakref.ref(launch.d_padded))
    del tensors, d
    gc.collect()
    assert all(r() is not None for r in refs)
    del launch
    gc.collect()
    assert all(r() is None for r in refs)


@pytest.mark.parametrize(
    "mnkl,tile,cluster",
    [
        ((8192, 8192, 8192, 1), (256, 128), (2, 1)),
        ((129, 65, 256, 1), (256, 128), (2, 1)),
        ((128, 4096, 7168, 1), (128, 128), (1, 1)),
        ((1, 64, 256, 4), (128, 64), (1, 1)),
        ((4096, 1, 256, 1), (256, 64), (2, 1)),
    ],
)
def test_pick_tile_and_cluster_rule(mnkl, tile, cluster):
    assert bw.pick_tile_and_cluster(mnkl) == (tile, cluster)
    assert bw.check_fp4_gemm_config(mnkl, 16, "Float8E4M3FN", "BFloat16", tile, cluster) == []


def test_pick_tile_and_cluster_fills_in_what_is_missing():
    assert bw.pick_tile_and_cluster((64, 64, 64, 1), (256, 192)) == ((256, 192), (2, 1))
    assert bw.pick_tile_and_cluster((8192, 8192, 64, 1), None, (4, 1)) == ((256, 128), (4, 1))
    assert bw.pick_tile_and_cluster((1, 1, 32, 1), (128, 256), (1, 4)) == ((128, 256), (1, 4))


@pytest.mark.parametrize("cluster", [(1, 1), (1, 2), (1, 4)])
def test_pick_tile_fits_a_given_cluster_with_odd_m(cluster):
    """A cluster with no room for a CTA pair gets a one-CTA tile: a user who asks only for the
    cluster gets a configuration that runs."""
    mnkl = (8192, 8192, 8192, 1)
    tile, picked = bw.pick_tile_and_cluster(mnkl, None, cluster)
    assert (tile, picked) == ((128, 128), cluster)
    assert bw.check_fp4_gemm_config(mnkl, 16, "Float8E4M3FN", "BFloat16", tile, picked) == []


def test_cli_and_python_api_use_the_same_pick(monkeypatch):
    """No tile or cluster given: the CLI's configuration and prepare_gemm's are the rule's."""
    for mnkl in [(8192, 8192, 8192, 1), (100, 40, 64, 1)]:
        args = bw._validated(bw.make_parser().parse_args(["--mnkl", ",".join(map(str, mnkl))]))
        assert (args.mma_tiler_mn, args.cluster_shape_mn) == bw.pick_tile_and_cluster(mnkl)
    picked = []
    monkeypatch.setattr(
        bw,
        "_compiled_kernel",
        lambda config, *_: picked.append((config.mma_tiler_mn, config.cluster_shape_mn)),
    )
    monkeypatch.setattr(bw, "_check_cuda_operands", lambda **_: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(bw, "PreparedGemm", lambda *_, **__: None)
    bw.prepare_gemm(*_operands(m=100, n=40, k=64), 16)
    assert picked == [bw.pick_tile_and_cluster((100, 40, 64, 1))]


@pytest.mark.parametrize(
    "mnkl,message",
    [
        ((np.int64(256), np.int32(128), np.int64(512), np.int16(1)), None),
        ((256.0, 128, 512, 1), "mnkl must be four integers"),
        ((256, True, 512, 1), "mnkl must be four integers"),
        ("1234", "mnkl must be four integers"),
        ((128, 128, 256, 2**31), "L=2147483648 does not fit the kernel's 32-bit extents"),
        ((2**31, 1, 32, 1), "M=2147483648 does not fit"),
        ((256, 64, 32, 2**31 - 1), "CTA tiles of 128x128 do not fit"),
        # The persistent loop's last step (tile + grid size) must not wrap past 2^31 either.
        ((1, 1, 32, 2**31 - 1), "2147483647 CTA tiles of 128x128 do not fit"),
        ((1, 1, 32, 2**31 - 2**16 + 1), "CTA tiles of 128x128 do not fit"),
        ((1, 1, 32, 2**31 - 2**16), None),
    ],
)
def test_check_config_integer_types_and_32_bit_limits(mnkl, message):
    reasons = bw.check_fp4_gemm_config(mnkl)
    if message is None:
        assert reasons == []
    else:
        assert any(message in r for r in reasons), reasons


@pytest.mark.parametrize(
    "config,message",
    [
        (dict(mma_tiler_mn=(np.int64(256), 128), cluster_shape_mn=(np.int32(2), 1)), None),
        (dict(mma_tiler_mn=(128.0, 128)), "mma_tiler_mn must be two integers M,N, got (128.0,"),
        (dict(mma_tiler_mn=(128,)), "mma_tiler_mn must be two integers M,N, got (128,)"),
        (dict(cluster_shape_mn=(1.0, 1)), "cluster_shape_mn must be two integers M,N"),
        (dict(cluster_shape_mn=(2, 1, 1)), "cluster_shape_mn must be two integers M,N"),
        (dict(cluster_shape_mn="21"), "cluster_shape_mn must be two integers M,N"),
        (dict(sf_vec_size=16.0), "sf_vec_size must be an integer, got 16.0"),
        (dict(sf_vec_size=True), "sf_vec_size must be an integer, got True"),
    ],
)
def test_check_config_tile_cluster_and_vec_types(config, message):
    """A float, short or long tile / cluster, or a non-integer sf_vec_size, is named (a float
    128.0 would otherwise pass ``in (128, 256)`` and reach the compiler)."""
    reasons = bw.check_fp4_gemm_config((256, 256, 256, 1), **config)
    if message is None:
        assert reasons == []
    else:
        assert any(message in r for r in reasons), reasons


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tolerance", "nan"], "--tolerance must be a finite number > 0, got nan"),
        (["--tolerance", "inf"], "--tolerance must be a finite number > 0, got inf"),
        (["--tolerance", "0"], "--tolerance must be a finite number > 0"),
        (["--tolerance", "1e6", "--mnkl", "256,256,8192,1"], "--tolerance 1e+06 is too large"),
        (["--alpha", "1e39"], "--alpha: alpha=1e+39 is not a finite fp32 number"),
        (["--alpha", "nan"], "--alpha: alpha=nan is not a finite fp32 number"),
        (["--seed", "-1"], "--seed must be in [0, 2^64), got -1"),
        (["--seed", str(2**64)], "--seed must be in [0, 2^64)"),
    ],
)
def test_cli_rejects_bad_numbers_before_running(args, message):
    """Refused before anything runs: exit 2, the reason, no traceback (no GPU needed)."""
    parsed = bw.make_parser().parse_args(args)
    with pytest.raises(bw.UsageError, match=re.escape(message)):
        bw._validated(parsed)


def test_cli_tolerance_limit_is_the_bound_s_limit():
    """An accepted --tolerance is one reference.gemm_tolerance accepts, and the bound's own
    limit (K * u * tolerance = 1/2) is refused by the command line, before any GPU work."""
    k = 8192
    parsed = bw.make_parser().parse_args(["--mnkl", f"256,256,{k},1", "--tolerance", "1000"])
    tol = bw._validated(parsed).tolerance
    ref = torch.zeros(1)
    reference.gemm_tolerance(
        k, torch.float32, ref, ref, unit_roundoff=reference.FP32_UNIT_ROUNDOFF * tol
    )
    too_big = 0.5 / (k * reference.FP32_UNIT_ROUNDOFF)
    with pytest.raises(ValueError):
        reference.gemm_tolerance(
            k, torch.float32, ref, ref, unit_roundoff=reference.FP32_UNIT_ROUNDOFF * too_big
        )
    parsed = bw.make_parser().parse_args(["--mnkl", f"256,256,{k},1", "--tolerance", f"{too_big}"])
    with pytest.raises(bw.UsageError, match=f"too large for K={k}"):
        bw._validated(parsed)


def _unwritable_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        # (root ignores permissions: a folder of a virtual file system no one can write into)
        return Path("/proc")
    return folder


def test_cli_dump_dir_not_writable_exits_2_naming_it(tmp_path):
    folder = _unwritable_folder(tmp_path)
    proc = _cli("--compile_only", "--dump_dir", str(folder), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--dump_dir {folder}: cannot write into the folder" in proc.stderr
    assert "Traceback" not in proc.stderr and "cubin:" not in proc.stdout


def test_cli_never_reports_a_stale_cubin(tmp_path):
    """An older, newer-dated cubin in the configuration's folder is not reported."""
    folder = tmp_path / "nvfp4_BFloat16_tile128x64_cluster1x1_sm_100f"
    folder.mkdir()
    stale = folder / "stale_kernel.sm_100f.cubin"
    stale.write_bytes(b"not a cubin")
    os.utime(stale, (2**32, 2**32))
    (folder / "stale_kernel.sm_100f.ptx").write_text("stale")
    proc = _cli(
        "--compile_only",
        "--dump_dir",
        str(tmp_path),
        "--mma_tiler_mn",
        "128,64",
        "--cluster_shape_mn",
        "1,1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    cubin = re.search(r"cubin: (\S+)", proc.stdout).group(1)
    assert Path(cubin).exists() and Path(cubin) != stale and "stale_kernel" not in proc.stdout


@pytest.mark.parametrize(
    "dtype,byte,message",
    [
        (torch.float8_e4m3fn, 0x7F, "NaN scale"),
        (torch.float8_e4m3fn, 0xFF, "sign bit set"),
        (torch.float8_e4m3fn, 0x81, "sign bit set"),
        (torch.float8_e8m0fnu, 0xFF, "NaN scale"),
    ],
)
def test_reference_refuses_nan_and_sign_bit_scales_alike(dtype, byte, message):
    vec = 16 if dtype == torch.float8_e4m3fn else 32
    ops = reference.make_fp4_operands(4, 4, 64, 1, vec, seed=1)
    for which in ("sfa", "sfb"):
        sf = {"sfa": ops.sfa.clone(), "sfb": ops.sfb.clone()}
        sf[which].view(torch.uint8)[0, 1, 0] = byte
        with pytest.raises(ValueError, match=f"{which} has 1 .*{message}"):
            reference.reference_gemm(ops.a, ops.b, sf["sfa"], sf["sfb"], vec)


def _library_case(perturb_ours: float, perturb_library: float | None):
    ops = reference.make_fp4_operands(64, 48, 512, 1, 16, seed=5)
    ref = reference.reference_gemm(*ops.gemm_args, out_dtype=torch.float32)
    tol = reference.gemm_tolerance(
        512,
        torch.float32,
        ref,
        reference.abs_product_sum(*ops.gemm_args[:5]),
        ops.alpha,
    )
    d = (ref.double() + perturb_ours * tol).float()
    lib = None if perturb_library is None else (ref.double() + perturb_library * tol).float()
    return reference.check_gemm_or_library(d, lib, *ops.gemm_args)


@pytest.mark.parametrize(
    "ours,library,passed,rule",
    [
        (0.5, None, True, "derived bound"),
        (0.5, 100.0, True, "derived bound"),
        (3.0, None, False, "neither rule held"),
        (3.0, 2.0, True, "within 2x the library's error"),
        (3.0, 1.0, False, "neither rule held"),
        (3.0, math.nan, False, "neither rule held"),
        (math.nan, 5.0, False, "neither rule held"),
    ],
)
def test_second_oracle_rule(ours, library, passed, rule):
    ok, info = _library_case(ours, library)
    assert ok == passed == info.passed and info.rule == rule, str(info)
    if library is not None and math.isfinite(library):
        assert info.library_max_abs_err > 0


class FakeGrid:
    """Stands in for the device's block and grid indices, so that ``TileSchedule``'s own code
    runs on the CPU with Python integers (plain ints as the fast-divmod divisors)."""

    def __init__(self, monkeypatch):
        self.block = (0, 0, 0)
        self.grid = (1, 1, 1)
        monkeypatch.setattr(bw.cute.arch, "block_idx", lambda: self.block)
        monkeypatch.setattr(bw.cute.arch, "grid_dim", lambda: self.grid)
        monkeypatch.setattr(bw.cute.arch, "make_warp_uniform", lambda v: v)
        monkeypatch.setattr(bw.cute, "fast_divmod_create_divisor_v2", lambda v: v)
        monkeypatch.setattr(bw.cutlass, "Int32", int)
        monkeypatch.setattr(bw.cutlass, "min", min)


@pytest.mark.parametrize(
    "num_ctas_mnl,cluster,max_active_clusters",
    [
        ((1, 1, 1), (1, 1), 148),
        ((7, 5, 3), (1, 1), 4),
        ((7, 5, 3), (2, 1), 5),
        ((8, 8, 1), (4, 4), 9),
        ((3, 10, 2), (1, 4), 37),
        ((5, 3, 2), (4, 2), 18),
        ((64, 64, 1), (2, 1), 74),
        ((2, 2, 4), (2, 2), 1000),
    ],
)
def test_tile_schedule_visits_every_cta_tile_once(
    monkeypatch, num_ctas_mnl, cluster, max_active_clusters
):
    """Every (M, N, L) CTA tile of the cluster-rounded problem is worked on by exactly one CTA,
    which sits at that tile's place in its cluster; the clusters take the cluster tiles M
    fastest, then N, then L (CUTLASS's order); the CTAs of a cluster walk the same cluster
    tiles (their multicast loads and barriers must pair up)."""
    fake = FakeGrid(monkeypatch)
    cm, cn = cluster
    schedule = bw.TileSchedule.create(num_ctas_mnl, cluster)
    clusters_m, clusters_n = -(-num_ctas_mnl[0] // cm), -(-num_ctas_mnl[1] // cn)
    num_cluster_tiles = clusters_m * clusters_n * num_ctas_mnl[2]
    fake.grid = schedule.grid(cluster, max_active_clusters)
    assert fake.grid == (cm, cn, min(num_cluster_tiles, max_active_clusters))

    visits = {}
    for z in range(fake.grid[2]):
        walks = set()
        for x in range(cm):
            for y in range(cn):
                fake.block = (x, y, z)
                walk = []
                work = schedule.first_work()
                while schedule.is_valid(work):
                    tile = schedule.cta_tile(work, cluster)
                    assert (tile[0] % cm, tile[1] % cn) == (x, y)
                    visits[tile] = visits.get(tile, 0) + 1
                    walk.append((tile[0] // cm, tile[1] // cn, tile[2]))
                    work = schedule.next_work(work)
                walks.add(tuple(walk))
        assert len(walks) == 1, f"the CTAs of cluster {z} walk different tiles"
        (walk,) = walks
        # Cluster z takes cluster tiles z, z + G, ... numbered M fastest, then N, then L.
        expected = [
            (t % clusters_m, t // clusters_m % clusters_n, t // (clusters_m * clusters_n))
            for t in range(z, num_cluster_tiles, fake.grid[2])
        ]
        assert list(walk) == expected
    every_tile = {
        (m, n, l)  # noqa: E741
        for m in range(clusters_m * cm)
        for n in range(clusters_n * cn)
        for l in range(num_ctas_mnl[2])  # noqa: E741
    }
    assert set(visits) == every_tile
    assert set(visits.values()) == {1}


@pytest.mark.parametrize(
    "c_dtype,used", [("BFloat16", True), ("Float16", False), ("Float32", False)]
)
def test_cublaslt_is_a_second_oracle_only_for_bfloat16_d(c_dtype, used):
    """cuBLASLt's D is bf16: its error cannot vouch for a Float16 or Float32 D."""
    d_cublas = torch.zeros(1, 2, 2)
    d, why = bw.second_oracle(d_cublas, "", c_dtype)
    assert (d is d_cublas) == used
    assert why == ("" if used else f"its output is bf16, D is {c_dtype}")
    assert bw.second_oracle(None, "it takes no batch mode; L > 1", c_dtype) == (
        None,
        "it takes no batch mode; L > 1",
    )


@pytest.mark.parametrize(
    "num_ctas_mnl,cluster", [((7, 5, 3), (2, 1)), ((8, 8, 1), (4, 4)), ((5, 3, 2), (4, 2))]
)
def test_tile_schedule_cta_pairs_share_their_mma_tile(monkeypatch, num_ctas_mnl, cluster):
    """MMA tile M 256 on CTA pairs: the two CTAs of a pair (cluster places 2i, 2i + 1 along M)
    work on the same MMA tile at every step, and the pairs cover every MMA tile exactly once.
    With one CTA per MMA tile, the MMA tile is the CTA tile."""
    fake = FakeGrid(monkeypatch)
    cm, cn = cluster
    schedule = bw.TileSchedule.create(num_ctas_mnl, cluster)
    fake.grid = schedule.grid(cluster, 3)
    pair_tiles = {}
    for z in range(fake.grid[2]):
        for x in range(cm):
            for y in range(cn):
                fake.block = (x, y, z)
                work, step = schedule.first_work(), 0
                while schedule.is_valid(work):
                    mma = schedule.mma_tile(work, cluster, 2)
                    assert schedule.mma_tile(work, cluster, 1) == schedule.cta_tile(work, cluster)
                    pair_tiles.setdefault((z, x // 2, y, step), set()).add(mma)
                    work, step = schedule.next_work(work), step + 1
    assert all(len(tiles) == 1 for tiles in pair_tiles.values())
    visited = [tile for tiles in pair_tiles.values() for tile in tiles]
    clusters_m, clusters_n = -(-num_ctas_mnl[0] // cm), -(-num_ctas_mnl[1] // cn)
    every_mma_tile = {
        (m, n, l)  # noqa: E741
        for m in range(clusters_m * cm // 2)
        for n in range(clusters_n * cn)
        for l in range(num_ctas_mnl[2])  # noqa: E741
    }
    assert sorted(visited) == sorted(every_mma_tile)


def test_cli_refuses_a_dump_dir_without_compile_only(tmp_path):
    """``--dump_dir`` is where ``--compile_only`` writes; a run writes nothing there, so the
    option alone would be ignored: exit 2 naming it, before any GPU check."""
    proc = _cli("--mnkl", "128,128,128,1", "--dump_dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "--dump_dir is where --compile_only writes" in proc.stderr
    assert "Traceback" not in proc.stderr
