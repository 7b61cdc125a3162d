# SPDX-License-Identifier: BSD-3-Clause
"""Facts of the Hopper kernel (fp4_ops/sm90) that hold for whole classes of bugs, on the CPU.

* PTX, per warp role, through the control-flow graph of each kernel (not text order): every
  global read or write of a role comes after that role's own ``griddepcontrol.wait`` on every
  path; the release of a PDL successor comes after every TMA load; each stage's empty barrier
  waits for one arrival per consumer warp of every CTA that multicasts into it, and the
  consumers do arrive once per warp at each of those CTAs; the multicast mask of each TMA load
  and its per-CTA coordinates, evaluated for every cluster rank; D's staging is fenced before
  its TMA store.
* The 64-byte swizzle and the prologue grid's K-tail predicate at their boundaries: the prologue's
  own chunk code (``_convert_chunks``) runs on the CPU over a whole operand, with models of the
  PTX it emits, against ``reference.dequantize_fp4``.
* The host's global tensors (strides, batch strides, K padding) for a problem whose M, N, K and
  L (and their tile counts) all differ.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
import torch
from conftest import ptx_options
from cutlass.cutlass_dsl import Int32
from ptx_emulator import GlobalMemory, Grid, Params, parse_ptx
from test_hopper import ptx_model

import reference
from fp4_ops import quantizer
from fp4_ops.sm90 import dequant as dq
from fp4_ops.sm90 import gemm as k90
from fp4_ops.sm90 import launcher as r90

W4A4 = k90.W4A4

# ------------------------------------------------------------------------------ PTX: compiles
# (name: compile_gemm's arguments, the cluster, consumer warps of one K group, the TMA loads
# that may precede the PDL wait)
PTX_CONFIGS = {
    "prefill-nvfp4-2x1": ((16, "BFloat16", "prefill", (128, 256), 1, True, 1, W4A4), (2, 1), 8),
    "prefill-w4a16-1x1": (
        (32, "Float32", "prefill", (128, 128), 1, False, 1, "BFloat16"),
        (1, 1),
        8,
    ),
    "decode-nvfp4-split": ((16, "BFloat16", "decode", (16, 128), 2, True, 1, W4A4), (1, 1), 8),
    "decode-w4a16-kgroups": (
        (16, "BFloat16", "decode", (8, 64), 1, True, 4, "BFloat16"),
        (1, 1),
        4,
    ),
    # token tiles that end past M read in 16-row boxes, through their own TMA atom
    "decode-w4a16-boxes": (
        (16, "BFloat16", "decode", (128, 128), 2, True, 1, "BFloat16"),
        (1, 1),
        8,
    ),
    # a tile's two K splits on a 2x1 cluster, summed through DSMEM
    "decode-w4a16-split-cluster": (
        (16, "BFloat16", "decode", (128, 128), 2, True, 1, "BFloat16"),
        (2, 1),
        8,
    ),
    # (a ninth field: the grouped kernel)
    "decode-w4a16-grouped": (
        (16, "BFloat16", "decode", (16, 128), 1, False, 1, "BFloat16", True),
        (1, 1),
        8,
    ),
    # its K splits summed through global memory, and K groups beside them
    "decode-w4a16-grouped-split": (
        (16, "BFloat16", "decode", (8, 128), 3, False, 1, "BFloat16", True),
        (1, 1),
        8,
    ),
    "decode-w4a16-grouped-kgroups-split": (
        (32, "BFloat16", "decode", (8, 64), 2, False, 4, "BFloat16", True),
        (1, 1),
        4,
    ),
}
# The GEMM kernel's PTX parameters: kernel(tma_ab = (atom A, A, atom B, B, atom SFA, SFA,
# atom of B's token boxes, B), epi_tensors = (D, atom D, D's TMA tensor, workspace, group
# offsets), alphas = (alpha, its scale), ...), flattened in order.
PARAM_A, PARAM_B, PARAM_SFA, PARAM_B_BOX, PARAM_D = 0, 2, 4, 6, 9
PARAM_OFFSETS, PARAM_ALPHA, PARAM_SCALE = 12, 13, 14


class _Compiled(dict):
    """Configuration name -> (kernel object, PTX), compiled once per module on first use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self._tmp = tmp_path_factory

    def __missing__(self, name):
        (vec, c_dtype, path, tiler, split, tma, groups, a_dtype, *grouped), cluster, _ = (
            PTX_CONFIGS[name]
        )
        dump = self._tmp.mktemp(name)
        opts = f"--gpu-arch sm_90a --keep-ptx --dump-dir={dump}"
        gemm, compiled = k90.compile_gemm(
            *(vec, c_dtype, path, tiler, split, k90.H200_SM_COUNT, opts, cluster, tma, groups),
            a_dtype,
            grouped=bool(grouped),
        )
        self[name] = (gemm, compiled.__ptx__)
        return self[name]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _Compiled(tmp_path_factory)


_INSTRUCTION = re.compile(r"^(?:@(!?)(%p\d+)\s+)?([a-z][\w.:]*)\s*(.*?);$")
_LABEL = re.compile(r"^(\$L\w+):$")


class _Kernel:
    """One ``.entry`` of a PTX module as instructions with a control-flow graph. Inline asm
    blocks (nested braces) count as straight-line code: their local loops are spins."""

    def __init__(self, ptx: str, name: str):
        start = ptx.index(f".entry {name}")
        end = ptx.find(".entry", start + 1)
        text = ptx[start:] if end < 0 else ptx[start:end]
        self.params = re.search(r"\.entry (\w+)\(", text).group(1) + "_param_"
        self.ins: list[tuple[str, list[str], tuple | None]] = []
        labels: dict[str, int] = {}
        depth = 0
        for raw in text.splitlines():
            line = raw.split("//")[0].strip()
            if line == "{":
                depth += 1
            elif line == "}":
                depth -= 1
            elif depth == 1 and _LABEL.match(line):
                labels[_LABEL.match(line).group(1)] = len(self.ins)
            elif depth >= 1 and not line.startswith(".") and (m := _INSTRUCTION.match(line)):
                neg, pred, op, rest = m.groups()
                if depth > 1 and op.startswith("bra"):
                    continue
                ops = [o.strip() for o in re.split(r",(?![^\[]*\])(?![^{]*\})", rest) if o.strip()]
                self.ins.append((op, ops, (pred, neg == "!") if pred else None))
        self.labels = labels
        self.defs: dict[str, list[int]] = {}
        for i, (op, ops, _) in enumerate(self.ins):
            if (
                ops
                and re.fullmatch(r"%\w+", ops[0].split("|")[0])
                and not op.startswith(
                    ("st.", "mbarrier", "cp.", "prefetch", "bar", "fence", "wgmma", "bra")
                )
            ):
                for reg in ops[0].split("|"):
                    self.defs.setdefault(reg, []).append(i)

    def successors(self, i: int) -> list[int]:
        op, ops, pred = self.ins[i]
        if op.startswith("bra"):
            target = self.labels[ops[0]]
            return [target, i + 1] if pred else [target]
        if op in ("ret", "exit", "trap"):
            return []
        return [i + 1] if i + 1 < len(self.ins) else []

    def reach(self, starts, stop) -> set[int]:
        """Instructions reachable from ``starts`` along paths that do not go through an
        instruction for which ``stop(op)`` holds (those are reached but not passed)."""
        seen, todo = set(), list(starts)
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            if i not in starts and stop(self.ins[i][0]):
                continue
            todo.extend(self.successors(i))
        return seen

    def where(self, pattern: str) -> list[int]:
        return [i for i, (op, _, _) in enumerate(self.ins) if re.fullmatch(pattern, op)]

    # -- values of registers, for given special registers (a tiny PTX interpreter)
    def value(self, x: str, env: dict, depth: int = 0) -> int:
        x = x.strip().strip("[]")
        if re.fullmatch(r"-?\d+", x):
            return int(x) & 0xFFFFFFFF
        if re.fullmatch(r"0x[0-9a-fA-F]+", x):
            return int(x, 16)
        if x in env:
            return env[x]
        defs = self.defs.get(x, [])
        if len(defs) != 1 or depth > 200:
            # (a loop-carried or loaded value: fixed, the same for every env)
            return (hash(x) * 2654435761) & 0xFFFF
        op, ops, _ = self.ins[defs[0]]
        v = [lambda j: self.value(ops[j], env, depth + 1)][0]
        kind = op.split(".")[0]
        signed = ".s" in op
        if kind in ("mov", "cvt", "cvta", "shfl") or op.startswith("ld.param"):
            if op.startswith("ld.param") or kind == "cvta":
                return (hash(x) * 40503) & 0xFFFF
            return v(1)
        a = v(1)
        b = v(2) if len(ops) > 2 else 0
        if signed:
            a = a - (1 << 32) if a >> 31 else a
            b = b - (1 << 32) if b >> 31 else b
        result = {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: (a * b) >> 32 if ".hi" in op else a * b,
            "shl": lambda: a << b,
            "shr": lambda: a >> b,
            "and": lambda: a & b,
            "or": lambda: a | b,
            "xor": lambda: a ^ b,
            "not": lambda: ~a,
            "neg": lambda: -a,
            "min": lambda: min(a, b),
            "max": lambda: max(a, b),
            "selp": lambda: a if v(3) else b,
            "setp": lambda: int(self._compare(op, a, b)),
        }.get(kind)
        if result is None:
            return (hash(x) * 2246822519) & 0xFFFF
        return result() & 0xFFFFFFFF

    @staticmethod
    def _compare(op: str, a: int, b: int) -> bool:
        cmp = op.split(".")[1]
        return {
            "eq": a == b,
            "ne": a != b,
            "lt": a < b,
            "le": a <= b,
            "gt": a > b,
            "ge": a >= b,
        }[cmp]

    def taken(self, i: int, env: dict) -> bool:
        """Whether the predicated branch ``i`` is taken under ``env``."""
        _, _, (pred, negated) = self.ins[i]
        return bool(self.value(pred, env)) != negated

    def guard(self, i: int) -> int:
        """The predicated branch just before instruction ``i`` that skips it."""
        for j in range(i - 1, -1, -1):
            op, ops, pred = self.ins[j]
            if op.startswith("bra"):
                assert pred and self.labels[ops[0]] > i, (i, j, self.ins[j])
                return j
        raise AssertionError(f"no guard before {self.ins[i]}")

    def descriptor_param(self, reg: str) -> int:
        """The kernel parameter a ``cvta.param``'d TMA descriptor address comes from."""
        (i,) = self.defs[reg]
        op, ops, _ = self.ins[i]
        assert op == "cvta.param.u64", (reg, op)
        (j,) = self.defs[ops[1]]
        return int(re.search(r"_param_(\d+)$", self.ins[j][1][1]).group(1))

    def tma_loads(self) -> dict[int, list[tuple]]:
        """Descriptor parameter -> [(index, coordinate registers, mask operand or None)] of the
        TMA loads (global -> shared)."""
        loads: dict[int, list[tuple]] = {}
        for i, (op, ops, _) in enumerate(self.ins):
            if op.startswith("cp.async.bulk.tensor") and op.split(".")[5].startswith("shared"):
                descriptor = re.match(r"\[(%rd\d+),", ops[1]).group(1)
                coords = re.search(r"\{(.*?)\}", ops[1]).group(1).split(", ")
                mask = ops[3] if "multicast::cluster" in op else None
                loads.setdefault(self.descriptor_param(descriptor), []).append((i, coords, mask))
        return loads

    def param_address(self, param: int) -> set[str]:
        """Registers that hold the 64-bit value of parameter ``param``."""
        name = f"[{self.params}{param}]"
        return {ops[0] for op, ops, _ in self.ins if op == "ld.param.b64" and ops[1] == name}

    def global_loads_from(self, param: int) -> list[int]:
        """Global loads whose address is parameter ``param``'s value plus any offsets (the
        closure of its registers under add / mad)."""
        regs, grown = self.param_address(param), True
        while grown:
            grown = False
            for op, ops, _ in self.ins:
                derives = op.split(".")[0] in ("add", "mad") and ops[0] not in regs
                if derives and any(o in regs for o in ops[1:]):
                    regs.add(ops[0])
                    grown = True
        loads = self.where(r"ld\.global.*")
        return [i for i in loads if self.ins[i][1][1].strip("[]").split("+")[0] in regs]


def _gemm(compiled, name) -> tuple:
    gemm, ptx = compiled[name]
    return gemm, _Kernel(ptx, "kernel_cutlass_kernel")


_GLOBAL_ACCESS = re.compile(r"(ld|st|atom|red)\.[\w:.]*global|cp\.async\.bulk\.tensor.*global")


@pytest.mark.parametrize("name", list(PTX_CONFIGS))
def test_ptx_every_role_waits_before_its_global_accesses(name, compiled):
    """PDL, on the control-flow graph of the GEMM: no path from the entry reaches a global
    load or store (the consumers' alpha included: each role has its own wait) or the release
    of a successor without a ``griddepcontrol.wait`` on the way; the only TMA loads such a path
    reaches are W4A4 decode's first weights and their scales; no TMA load follows the release.
    The prologue grid: the same for all its global accesses and its release."""
    gemm, kern = _gemm(compiled, name)
    early = kern.reach({0}, lambda op: op == "griddepcontrol.wait")
    loads = kern.tma_loads()
    assert set(loads) >= {PARAM_A, PARAM_B} and all(loads.values()), loads
    before = {p for p, found in loads.items() for i, _, _ in found if i in early}
    w4a4_decode = gemm.path == "decode" and gemm.a_dtype == W4A4
    assert before == ({PARAM_A, PARAM_SFA} if w4a4_decode else set()), before
    others = [kern.ins[i][0] for i in early if _GLOBAL_ACCESS.match(kern.ins[i][0])]
    assert all(op.startswith("cp.async.bulk.tensor") for op in others), others
    # alpha: read once, at its parameter's address (grouped: per unit, at its expert's), only
    # after a wait, as is its scale; the group offsets: read only by the grouped kernel, only
    # after a wait
    alpha, scale = kern.param_address(PARAM_ALPHA), kern.param_address(PARAM_SCALE)
    plain = kern.where(r"ld\.global.*")
    reads = [i for i in plain if kern.ins[i][1][1].strip("[]") in alpha]
    scale_reads = [i for i in plain if kern.ins[i][1][1].strip("[]") in scale]
    assert scale_reads and not set(scale_reads) & early, scale_reads
    if gemm.grouped:
        # (per unit, at its expert's element: never the bare address, which is expert 0's)
        assert not reads, reads
        reads = kern.global_loads_from(PARAM_ALPHA)
        assert reads and not set(reads) & early, reads
    else:
        assert len(reads) == 1 and reads[0] not in early, reads
        assert len(scale_reads) == 1, scale_reads
    offsets = kern.global_loads_from(PARAM_OFFSETS)
    assert bool(offsets) == gemm.grouped and not set(offsets) & early, offsets
    (release,) = kern.where(r"griddepcontrol\.launch_dependents")
    assert release not in early
    after = kern.reach({release}, lambda op: False)
    assert not [i for found in loads.values() for i, _, _ in found if i in after]
    ptx = compiled[name][1]
    # (W4A16 decode converts nothing: no prologue grid)
    assert (".entry kernel_cutlass_convert_operands" in ptx) == gemm.convert_b
    if not gemm.convert_b:
        return
    prologue = _Kernel(ptx, "kernel_cutlass_convert_operands")
    early = prologue.reach({0}, lambda op: op == "griddepcontrol.wait")
    accesses = [i for i, (op, _, _) in enumerate(prologue.ins) if _GLOBAL_ACCESS.match(op)]
    assert accesses and not set(accesses) & early
    assert not set(prologue.where(r"griddepcontrol\.launch_dependents")) & early


@pytest.mark.parametrize(
    "dynamic, local, mode",
    [
        (False, False, "tokens"),
        (True, True, "tokens"),
        (True, False, "tokens"),
        (True, True, "exact_rows"),
        (True, False, "codes"),
    ],
    ids=["tokens-static", "tokens-local-amax", "tokens-amax-grid", "exact-rows", "amax-grid"],
)
def test_ptx_quantizer_grids_ahead_of_a_gemm_wait_before_memory_and_release(
    dynamic, local, mode, tmp_path
):
    """The quantizer grids that feed a Hopper GEMM (the tokens mode, PDL-launched behind the
    kernel ahead of it; the exact-rows mode) touch no global memory, and release the GEMM
    behind them, only after their ``griddepcontrol.wait``: the kernel ahead may still read the
    copy they write, and the GEMM's weight requests before its own wait must not overlap it.
    The amax grid ahead of them (a dynamic x over LOCAL_AMAX_BYTES), PDL-launched too, reads x
    and writes its maxima only after its own wait (it may release them at once: they wait), as
    it does ahead of the plain quantization (codes and scales), whose grid waits for it before
    it touches memory: it may start before the kernel ahead of the amax grid has ended."""
    import glob

    options = f"--gpu-arch sm_90a --keep-ptx --dump-dir={tmp_path}"
    values = {m: m == mode for m in ("tokens", "exact_rows")}
    quantizer.compile_quantizer("BFloat16", 16, dynamic, options, local, **values)
    (path,) = glob.glob(os.path.join(tmp_path, "*.ptx"))
    with open(path) as f:
        ptx = f.read()
    names = re.findall(r"\.entry (kernel_cutlass_(amax_)?kernel_\w+)\(", ptx)
    assert [amax for _, amax in names] == ["amax_"] * (dynamic and not local) + [""], names
    for name, amax in names:
        kern = _Kernel(ptx, name)
        early = kern.reach({0}, lambda op: op == "griddepcontrol.wait")
        accesses = [i for i, (op, _, _) in enumerate(kern.ins) if _GLOBAL_ACCESS.match(op)]
        assert accesses and not set(accesses) & early, name
        release = kern.where(r"griddepcontrol\.launch_dependents")
        # (the plain quantization releases nothing: what follows it is launched plainly)
        assert bool(release) == bool(amax or mode != "codes"), name
        assert amax or not set(release) & early, name


@pytest.mark.parametrize("name", list(PTX_CONFIGS))
def test_ptx_stage_barriers_count_every_consumer_warp_of_the_cluster(name, compiled):
    """``mbarrier.init``: the full barriers wait for one arrival (the producer's, with the
    transaction bytes), the empty barriers for one per consumer warp of the K group in every
    CTA of the cluster (2x1 prefill: both CTAs' 8 warps, as each multicasts into the other).
    Each release of a stage (arrive on an empty barrier) is made by exactly one lane of a warp
    per CTA of the cluster, evaluated lane by lane."""
    gemm, kern = _gemm(compiled, name)
    _, cluster, warps = PTX_CONFIGS[name]
    counts = [kern.value(ops[1], {}) for op, ops, _ in kern.ins if op.startswith("mbarrier.init")]
    # (split_cluster: first its exchange barriers, FULL, FREE and DONE)
    exchange = [1, warps, warps] if gemm.split_cluster else []
    assert counts[: len(exchange)] == exchange
    counts = counts[len(exchange) :]
    stages = len(counts) // 2
    assert stages == gemm.num_stages and counts == [1] * stages + [warps * gemm.mcast] * stages
    arrives = kern.where(r"mbarrier\.arrive\.shared(::cluster|::cta)?\.b64")
    arrives = [i for i in arrives if "expect_tx" not in kern.ins[i][0]]
    assert arrives
    warp = range(128, 160)  # the first consumer warp (warpgroup 0 is the producer's)
    for i in arrives:
        guard = kern.guard(i)
        lanes = [t for t in warp if not kern.taken(guard, {"%tid.x": t})]
        op, ops, _ = kern.ins[i]
        if gemm.mcast == 1:
            assert ".shared::cluster" not in op and len(lanes) == 1, (op, lanes)
            continue
        # the peer's barrier through mapa: one lane per cluster rank
        address = ops[1].strip("[]").split("+")[0]
        (j,) = kern.defs[address]
        assert kern.ins[j][0].startswith("mapa"), kern.ins[j]
        ranks = Counter(kern.value(kern.ins[j][1][2], {"%tid.x": t}) for t in lanes)
        assert ranks == Counter(range(cluster[0])), ranks


@pytest.mark.parametrize("name", list(PTX_CONFIGS))
def test_ptx_multicast_masks_and_coordinates_per_cluster_rank(name, compiled):
    """Each TMA load evaluated for every CTA rank of the cluster (%cluster_ctarank and %ctaid.x
    together): on a 2x1 prefill cluster the B tile is multicast to both CTAs (mask 0b11 at
    either rank), each CTA loading its half (rows + 128 at rank 1), while A is loaded by each
    CTA alone, its own M tile (rows + 128 at rank 1); without a cluster nothing multicasts and
    no coordinate depends on the rank. K and batch coordinates never depend on it. A decode
    2x1 cluster (a tile's two K splits) multicasts nothing and loads the same rows and batch at
    either rank."""
    gemm, kern = _gemm(compiled, name)
    _, cluster, _ = PTX_CONFIGS[name]
    # tile rows for A; B is split over the cluster's CTAs
    step = {PARAM_A: gemm.tile_rows, PARAM_B: gemm.tile_cols // cluster[0], PARAM_SFA: 0}
    if gemm.split_cluster:
        step = dict.fromkeys(step, 0)
    for param, found in kern.tma_loads().items():
        for _, coords, mask in found:
            at = []
            for rank in range(2):
                env = {"%cluster_ctarank": rank, "%ctaid.x": 6 + rank}
                at.append([kern.value(c, env) for c in coords])
                if param == PARAM_B and gemm.mcast == 2:
                    assert mask is not None and kern.value(mask, env) == 0b11, (rank, mask)
                else:
                    assert mask is None, (param, mask)
            delta = [(b - a) & 0xFFFFFFFF for a, b in zip(*at, strict=True)]
            if cluster[0] == 1:
                assert delta == [0] * len(coords), (param, delta)
            elif param in (PARAM_A, PARAM_B):
                # coordinates innermost first: (K, rows, batch)
                assert delta == [0, step[param], 0], (param, delta)


@pytest.mark.parametrize("name", list(PTX_CONFIGS))
def test_ptx_token_boxes_tile_the_token_tile(name, compiled):
    """W4A16 decode (not grouped) on token tiles of TOKEN_BOX_MIN_COLS or more has a second way
    to load a stage's tokens, through its own descriptor: for each k-block load of the whole
    tile, TOKEN_BOXES loads, box i at i box sizes past the tile's SMEM address, at the tile's K
    and batch coordinates and at its own rows or the tile's first box's. Every other kernel
    loads B through B's descriptor alone."""
    gemm, kern = _gemm(compiled, name)
    loads = kern.tma_loads()
    w4a16_decode = gemm.path == "decode" and gemm.a_dtype != W4A4 and not gemm.grouped
    boxed = w4a16_decode and gemm.tile_cols >= k90.TOKEN_BOX_MIN_COLS
    boxes = k90.TOKEN_BOXES if boxed else 0
    tiles, box_loads = loads[PARAM_B], loads.get(PARAM_B_BOX, [])
    assert len(box_loads) == boxes * len(tiles), sorted(loads)
    if not boxed:
        return
    box_rows = gemm.tile_cols // boxes

    def address(i):
        base, _, offset = kern.ins[i][1][0].strip("[]").partition("+")
        return kern.value(base, {}) + int(offset or 0)

    box_bytes = box_rows * k90.K_BLOCK * 2
    for t, (i, coords, _) in enumerate(tiles):
        k, row, batch = (kern.value(c, {}) for c in coords)
        for b, (j, box_coords, _) in enumerate(box_loads[t * boxes : (t + 1) * boxes]):
            assert address(j) - address(i) == b * box_bytes, (t, b)
            box_k, box_row, box_batch = (kern.value(c, {}) for c in box_coords)
            assert (box_k, box_batch) == (k, batch), (t, b)
            assert (box_row - row) & 0xFFFFFFFF in (0, b * box_rows), (t, b)


@pytest.mark.parametrize("name", [n for n in PTX_CONFIGS if PTX_CONFIGS[n][0][5]])
def test_ptx_d_staging_is_fenced_before_each_tma_store(name, compiled):
    """Every path into a TMA store of D from a shared-memory store (the staged subtile) passes
    a ``fence.proxy.async`` (generic-proxy writes, async-proxy read) and the named barrier."""
    _, kern = _gemm(compiled, name)
    stores = [i for i, (op, _, _) in enumerate(kern.ins) if op.startswith("cp.async.bulk.tensor")]
    stores = [i for i in stores if ".global.shared" in kern.ins[i][0]]
    assert stores
    preds: dict[int, list[int]] = {}
    for i in range(len(kern.ins)):
        for s in kern.successors(i):
            preds.setdefault(s, []).append(i)
    for store in stores:
        for fence in ("fence.proxy.async", "bar.sync"):
            seen, todo = set(), list(preds.get(store, []))
            while todo:
                i = todo.pop()
                if i in seen or kern.ins[i][0].startswith(fence):
                    continue
                seen.add(i)
                todo.extend(preds.get(i, []))
            staged = [i for i in seen if kern.ins[i][0].startswith("st.shared")]
            assert not staged, (fence, store, staged[:3])


# ------------------------------------------------------------------------------ helpers
def _swizzle64_by_definition(offset: int) -> int:
    """TMA / wgmma 64-byte swizzle (CU_TENSOR_MAP_SWIZZLE_64B): in each 512-byte span of 8 rows
    of 64 bytes, the 16-byte chunk index of a row is XORed with (row / 2) % 4."""
    row, chunk, byte = offset // 64, offset // 16 % 4, offset % 16
    return row * 64 + (chunk ^ (row // 2 % 4)) * 16 + byte


@pytest.mark.parametrize(
    "offset, swizzled",
    [
        (0, 0),
        (15, 15),
        (16, 16),
        (64, 64),
        (127, 127),
        (128, 144),
        (136, 152),
        (144, 128),
        (256, 288),
        (384, 432),
        (432, 384),
        (511, 463),
        (512, 512),
        (640, 656),
    ],
)
def test_swizzle64_at_its_boundaries(offset, swizzled):
    """``_swizzle64`` on hand-derived offsets: rows 0, 1 unchanged, row 2 (byte 128) moves by
    one 16-byte chunk, row 4 by two, row 6 by three, and the pattern repeats every 512 bytes."""
    assert k90._swizzle64(offset) == swizzled == _swizzle64_by_definition(offset)


def test_swizzle64_is_the_smem_layouts_swizzle():
    """``_load_a`` reads packed A at ``_swizzle64`` of the byte offsets that the DSL's K_SW64
    layout atom for bytes (TMA writes it) maps them to: the same bijection over 2 KiB."""
    assert sorted(k90._swizzle64(o) for o in range(2048)) == list(range(2048))
    assert all(k90._swizzle64(o) == _swizzle64_by_definition(o) for o in range(2048))


class _Divisor:
    """A stand-in for the kernel's runtime divisors: ``divmod(x, d)`` on DSL integers."""

    def __init__(self, n: int):
        self.n = n

    def __rdivmod__(self, other):
        from cutlass.cutlass_dsl import Int32

        v = int(other.value) if hasattr(other, "value") else int(other)
        return Int32(v // self.n), Int32(v % self.n)


def _plain_method(name: str):
    """A kernel method as plain Python, its source run without the DSL's decorator (which,
    once the class has compiled, hands out the rewritten function)."""
    source = textwrap.dedent(inspect.getsource(getattr(k90.BlockwiseGemmFp4Sm90, name)))
    scope = dict(vars(k90))
    exec(re.sub(r"^@.*\n", "", source, flags=re.M), scope)
    return scope[name]


def _address(value) -> int:
    return int(value.value) if hasattr(value, "value") else int(value)


def _run_prologue(monkeypatch, gemm, packed, sf_blocked, rows_conv, k):
    """``convert_operands``' chunk code over one whole operand (packed [L, rows, K/2], its
    blocked scales) on the CPU: every thread of the grid, global memory as a byte dict, the
    PTX of the conversions by ``test_hopper``'s models. Returns the copy [L, rows_conv, K_pad]
    as stored halves (-1 where nothing was stored)."""
    import cutlass
    from cutlass.cutlass_dsl import Int32, Int64, Uint32

    l, rows, half = packed.shape  # noqa: E741
    k_pad = -(-k // 64) * 64
    mem: dict[int, int] = {}
    bases = {"packed": 1 << 24, "sf": 2 << 24, "conv": 3 << 24}
    for i, b in enumerate(packed.numpy().tobytes()):
        mem[bases["packed"] + i] = b
    for i, b in enumerate(sf_blocked.numpy().tobytes()):
        mem[bases["sf"] + i] = b
    stored: dict[int, int] = {}

    def load(addr):
        a = _address(addr)
        # (unwritten memory reads as a pattern that no valid operand byte makes zero)
        return Uint32(int.from_bytes(bytes(mem.get(a + i, 0x77) for i in range(4)), "little"))

    def store(addr, values):
        for i, v in enumerate(values):
            stored[_address(addr) + 4 * i] = _address(v) & 0xFFFFFFFF

    monkeypatch.setattr(dq, "_ptx", ptx_model)
    monkeypatch.setattr(dq, "ld_global_nc_u32", load)
    monkeypatch.setattr(dq, "st_global_v4_b32", store)
    monkeypatch.setattr(cutlass, "range_constexpr", range)

    def tensor(base, shape):
        return SimpleNamespace(shape=shape, iterator=SimpleNamespace(toint=lambda: Int64(base)))

    operand = (
        tensor(bases["packed"], (rows, half, l)),
        tensor(bases["sf"], None),
        tensor(bases["conv"], (rows_conv, k_pad, l)),
    )
    chunks = l * rows * k_pad // 64 * k90.CHUNKS_PER_KBLOCK
    per_cta = gemm.convert_threads * gemm.convert_unroll
    convert = _plain_method("_convert_chunks")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cta in range(-(-chunks // per_cta)):
            for t in range(gemm.convert_threads):
                first = Int32(cta * per_cta + t)
                args = (Int32(chunks), Int32(k), Int32(k_pad))
                convert(gemm, operand, first, *args, _Divisor(k_pad // 64), _Divisor(rows))
    out = torch.full((l * rows_conv * k_pad,), -1, dtype=torch.int32)
    for addr, word in stored.items():
        e = (addr - bases["conv"]) // 2
        out[e], out[e + 1] = word & 0xFFFF, word >> 16
    return out.reshape(l, rows_conv, k_pad)


def _copy_k(e: int) -> int:
    """K (within a 64-wide k-block) of element e of the converted copy: 16-byte chunk c = e // 8
    holds pair P_c (nibbles c % 4 and c % 4 + 4 of word c // 4) of each 16-group q."""
    c, q, high = e // 8, e % 8 // 2, e % 2
    return 16 * q + 8 * (c // 4) + c % 4 + 4 * high


@pytest.mark.parametrize(
    "k, l, path",
    [(96, 2, "prefill"), (64, 1, "prefill"), (128, 1, "prefill"), (160, 2, "decode")],
    ids=["tail-32", "one-block", "two-blocks", "decode-tail-after-two"],
)
def test_prologue_keeps_whole_k_blocks_and_zeroes_the_tail(k, l, path, monkeypatch):  # noqa: E741
    """The prologue's K-tail predicate at its boundary (``kb * 64 + 64 <= K``: a k-block ending
    exactly at K is whole, one ending 32 past K keeps only groups 0, 1), its batch / row / k-block
    walk and scale words, over a whole operand (prefill: NVFP4 in BF16; decode: the tokens in
    F16 times 2^-7, their copy padded to whole 16-token tiles), every stored value against
    ``reference.dequantize_fp4``; the tail's groups 2, 3 store +0."""
    gemm = k90.BlockwiseGemmFp4Sm90(16, path, (128, 256) if path == "prefill" else (16, 128))
    rows = 3
    rows_conv = rows if path == "prefill" else 16
    gen = torch.Generator().manual_seed(k + l)
    # (codes 1..7: every value nonzero, so a dropped or zeroed one shows)
    codes = torch.randint(1, 8, (l, rows, k), generator=gen, dtype=torch.uint8)
    codes |= torch.randint(0, 2, codes.shape, generator=gen, dtype=torch.uint8) << 3
    packed = reference.pack_fp4(codes)
    sf = torch.randint(0x30, 0x48, (l, rows, k // 16), generator=gen, dtype=torch.uint8)
    scales = sf.view(torch.float8_e4m3fn)
    want = reference.dequantize_fp4(packed, scales, 16)
    copy = _run_prologue(monkeypatch, gemm, packed, reference.to_blocked(sf), rows_conv, k)
    # (decode: the padding rows of each batch's token tile are never written)
    copy = copy[:, :rows]
    k_pad = -(-k // 64) * 64
    assert int((copy < 0).sum()) == 0, "a chunk of the copy was never stored"
    if gemm.f16:
        got = copy.to(torch.int16).view(torch.float16).float() * 2.0**7
    else:
        got = (copy << 16).view(torch.float32)  # (BF16 bits: the same value in fp32)
    for e in range(k_pad):
        kk = e // 64 * 64 + _copy_k(e % 64)
        if kk < k:
            assert torch.equal(got[..., e], want[..., kk]), (e, kk)
        else:
            assert bool((copy[..., e] == 0).all()), (e, kk, copy[..., e])


# ------------------------------------------------------------------------------ host tensors
@pytest.mark.parametrize(
    "path, a_dtype",
    [("prefill", W4A4), ("decode", W4A4), ("prefill", "BFloat16"), ("decode", "BFloat16")],
)
def test_global_tensors_strides_and_batches(path, a_dtype):
    """``_global_tensors``' layouts for M, N, K, L that all differ (and so do their tile
    counts): each tensor's offset of its last element and of (row 1, col 1, batch 1) against
    the row-major [L, rows, cols] offsets of its operand, decode's D^T included; K padded to 64
    for the converted copies and W4A16's prepacked weights."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    m, n, k, l = 72, 520, 160, 3  # noqa: E741
    k_pad = 192
    tiler = (128, 256) if path == "prefill" else (16, 128)
    gemm = k90.BlockwiseGemmFp4Sm90(16, path, tiler, (1, 1), 1, True, 1, a_dtype)
    names = ("KAp", "KBp", "KA", "KB", "SFKA", "SFKB", "D")
    found = {}

    @cute.jit
    def probe(a, b, sfa, sfb, c, work, conv_b, conv_a):
        gemm.c_dtype = c.value_type
        gemm._setup_attributes()
        ptrs = (a, b, sfa, sfb, c, work, conv_b, conv_a)
        for name, t in zip(names, gemm._global_tensors(ptrs, m, n, k, k_pad, l), strict=False):
            shape = [cute.size(t, mode=[i]) for i in range(len(t.shape))]
            last = cute.crd2idx(tuple(s - 1 for s in shape), t.layout)
            at = cute.crd2idx((2, 1, 1), t.layout) if len(shape) == 3 else None
            found[name] = (shape, last, at, t.iterator.alignment)

    mma = gemm.mma_dtype
    dtypes = [mma if gemm.w4a16 else cutlass.Uint8, cutlass.Uint8, cutlass.Uint8, cutlass.Uint8]
    dtypes += [cutlass.BFloat16, cutlass.Float32, mma, mma]
    # (told apart by alignment: each tensor must sit on its own pointer)
    a, b, sfa, sfb, d, _, conv_b, conv_a = aligns = [16, 32, 64, 128, 256, 512, 1024, 2048]
    gmem = cute.AddressSpace.gmem
    # (tracing fills ``found``; Hopper's MMA atoms trace for sm_90a only, whatever ran before)
    ptrs = [
        make_ptr(t, 1 << 24, gmem, assumed_align=al) for t, al in zip(dtypes, aligns, strict=True)
    ]
    cute.compile(probe, *ptrs, options="--gpu-arch sm_90a")

    def row_major(rows, cols, align):
        """(shape, offset of the last element, offset of (2, 1, 1), pointer) of [L, rows, cols]."""
        return [rows, cols, l], rows * cols * l - 1, rows * cols + 2 * cols + 1, align

    decode = path == "decode"
    if a_dtype != W4A4:
        act, wts = row_major(m, k, a), row_major(n, k_pad // 2, b)
        want = (
            {"KAp": wts, "KBp": wts, "KA": wts, "KB": act}
            if decode
            else {"KAp": act, "KBp": wts, "KA": act, "KB": row_major(n, k_pad, conv_b)}
        )
    elif decode:
        # the weights are kernel A; the tokens' copy has whole 16-token tiles of rows
        want = {"KAp": row_major(n, k // 2, b), "KBp": row_major(m, k // 2, a)}
        want |= {"KA": want["KAp"], "KB": row_major(-(-m // 16) * 16, k_pad, conv_b)}
    else:
        want = {"KAp": row_major(m, k // 2, a), "KBp": row_major(n, k // 2, b)}
        want |= {"KA": row_major(m, k_pad, conv_a), "KB": row_major(n, k_pad, conv_b)}
    for name, expect in want.items():
        assert found[name] == (*expect[:3], expect[3]), (name, found[name], expect)
    # D [L, M, N] row-major, in kernel coordinates (N, M, L) on decode (D^T)
    shape, last, at, ptr = found["D"]
    assert (last, ptr) == (l * m * n - 1, d)
    assert (shape, at) == (([n, m, l], m * n + n + 2) if decode else ([m, n, l], m * n + 2 * n + 1))
    # the blocked scales: whole 512-byte atoms (4 scale columns x 128 rows) per batch
    atoms_k = -(-(k // 16) // 4)
    for name, rows, ptr in (
        (("SFKA", n, sfb), ("SFKB", m, sfa))
        if decode
        else (
            ("SFKA", m, sfa),
            ("SFKB", n, sfb),
        )
    ):
        assert found[name][1] == l * -(-rows // 128) * atoms_k * 512 - 1, name
        assert found[name][3] == ptr, name


WARPGROUP = 128


def _shared_address(kern, operand: str, env: dict) -> int:
    """The value of a ``[reg]`` or ``[reg+imm]`` address operand."""
    reg, _, imm = operand.partition("+")
    return kern.value(reg, env) + int(imm or 0)


def _mapa_source_address(kern, reg: str, env: dict) -> int:
    """The local SMEM address that ``mapa`` mapped to the peer, plus the constants added to the
    mapped address on the way to ``reg``."""
    offset = 0
    while True:
        (d,) = kern.defs[reg]
        op, ops, _ = kern.ins[d]
        if op.startswith("mapa"):
            return kern.value(ops[1], env) + offset
        assert op == "add.s32" and re.fullmatch(r"-?\d+", ops[2]), (op, ops)
        reg, offset = ops[1], offset + int(ops[2])


@pytest.mark.parametrize("name", list(PTX_CONFIGS))
def test_ptx_split_pair_hands_its_whole_partial_to_split_0(name, compiled):
    """A decode 2x1 cluster's exchange: split 1's ``st.async`` stores cover its whole fp32
    fragment (one 16-byte store per four accumulators, every consumer thread) and all complete
    the one barrier, the peer's FULL (``mapa`` to rank 0); split 0 expects exactly those bytes on
    its FULL barrier and waits there with a cluster-scope acquire, as split 1 does on FREE; the
    producer fences the async proxy before TMA reuses the ring. Nothing of it elsewhere."""
    gemm, kern = _gemm(compiled, name)
    stores = kern.where(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.v4\.f32")
    waits = kern.where(r"mbarrier\.try_wait\.parity\.acquire\.cluster\.shared::cta\.b64")
    if not gemm.split_cluster:
        assert stores == [] and waits == []
        return
    rows, cols = gemm.tile_rows, gemm.tile_cols
    fragment = rows * cols // gemm.group_threads
    assert len(stores) == fragment // 4
    (mbar,) = {kern.ins[i][1][-1].strip("[]") for i in stores}
    (j,) = kern.defs[mbar]
    assert kern.ins[j][0].startswith("mapa") and kern.value(kern.ins[j][1][2], {}) == 0
    full = kern.ins[j][1][1]
    expects = [i for i in kern.where(r"mbarrier\.arrive\.expect_tx.*") if full in kern.ins[i][1][1]]
    assert [kern.value(kern.ins[i][1][2], {}) for i in expects] == [rows * cols * 4]
    assert len(waits) == 2 and full in {kern.ins[i][1][1].strip("[]") for i in waits}
    # DONE is two barriers (16 bytes) past FULL: the producer's wait on it, then the fence
    (d,) = kern.defs[full]
    _, (_, base, offset), _ = kern.ins[d]
    done = ("add.s32", base, str(int(offset) + 16))
    at_done = [
        i
        for i in kern.where(r"mbarrier\.try_wait\.parity\.shared\.b64")
        if any(
            kern.ins[e][0] == done[0] and kern.ins[e][1][1:] == list(done[1:])
            for e in kern.defs.get(kern.ins[i][1][1].strip("[]"), ())
        )
    ]
    assert len(at_done) == 1
    assert kern.ins[at_done[0] + 1][0] == "fence.proxy.async.shared::cta"
    # where each consumer thread's chunks land in split 0's SMEM (the address mapa maps), and
    # where split 0's same thread reads them back: the chunks tile one fragment-sized buffer,
    # and read j of a thread is word j % 4 of its chunk j // 4
    loads = kern.where(r"ld\.shared\.f32")
    assert len(loads) == fragment
    chunks = set()
    for t in range(WARPGROUP, WARPGROUP + gemm.group_threads):
        env = {"%tid.x": t}
        sent = [_mapa_source_address(kern, kern.ins[i][1][0].strip("[]"), env) for i in stores]
        read = [_shared_address(kern, kern.ins[i][1][1].strip("[]"), env) for i in loads]
        assert read == [sent[j // 4] + 4 * (j % 4) for j in range(fragment)], t
        chunks.update(sent)
    first = min(chunks)
    assert sorted(chunks) == list(range(first, first + rows * cols * 4, 16))


@pytest.mark.parametrize("name", list(PTX_CONFIGS))
def test_ptx_split_k_counters_are_left_zero_for_the_next_launch(name, compiled):
    """The split-K workspace is zeroed once, when it is made, so every launch must leave it so:
    each tile counter the splits count up on (one atomic add of 1) is stored back to 0 after
    that add, at the same address; without split-K there is no counter."""
    (_, _, _, _, split, *_), _, _ = PTX_CONFIGS[name]
    ptx = compiled[name][1]
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+), (-?\d+);", ptx))
    lines = [line.strip() for line in ptx.splitlines()]
    adds = [
        (i, m.group(1), m.group(2))
        for i, line in enumerate(lines)
        if (m := re.match(r"atom\.global\.[\w.]*add\.u32 %r\d+, \[(%rd\d+)\], (%r\d+);", line))
    ]
    stores = [
        (i, m.group(1), m.group(2))
        for i, line in enumerate(lines)
        if (m := re.match(r"st\.[\w.]*global\.u32 \[(%rd\d+)\], (%r\d+);", line))
    ]
    if split == 1 or compiled[name][0].split_cluster:
        assert adds == [], "a counter without split-K through global memory"
        return
    assert adds, "split-K without a tile counter"
    for at, addr, one in adds:
        assert consts.get(one) == "1", (addr, one)
        resets = [reg for i, a, reg in stores if a == addr and i > at]
        assert [consts.get(reg) for reg in resets] == ["0"], (addr, resets)


@pytest.mark.parametrize(
    "helpers",
    ["grouped_helpers_on_integers", "token_boxes_on_integers", "k_group_steps_on_integers"],
)
def test_kernel_helpers_run_on_plain_integers(helpers):
    """The kernel's own helpers, run eagerly on integers (``helpers``' checks). (In a fresh
    process: once a kernel has been compiled in one, the DSL's integers build IR instead of
    computing.)"""
    code = f"import test_hopper_facts as t; t.{helpers}()"
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((here, os.path.dirname(here))))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=os.path.dirname(__file__),
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def k_group_steps_on_integers() -> None:
    """A K group's step to its next stage is ``PipelineState.advance(k_groups)``: k_groups on,
    modulo the ring, the phase flipped per wrap, the count k_groups more; for every ring the
    kernel can hold (a multiple of k_groups, at least two per group) and every state in it."""
    import cutlass.pipeline as pipeline
    from cutlass.cutlass_dsl import Int32

    step = k90.BlockwiseGemmFp4Sm90._next_owned_stage.__wrapped__
    for k_groups in (2, 3, 4):
        gemm = k90.BlockwiseGemmFp4Sm90(16, "decode", (8, 64), (1, 1), 1, True, k_groups)
        for stages in range(2 * k_groups, 4 * k90.DECODE_K_GROUP_MAX_STAGES + 1, k_groups):
            for index in range(stages):
                for phase, count in ((0, index), (1, index + 3 * stages)):
                    state = pipeline.PipelineState(stages, Int32(count), Int32(index), Int32(phase))
                    got = step(gemm, state)
                    want_index = (index + k_groups) % stages
                    want_phase = phase ^ ((index + k_groups) // stages) % 2
                    assert got.stages == stages, (k_groups, stages)
                    assert (int(got.index), int(got.phase), int(got.count)) == (
                        want_index,
                        want_phase,
                        count + k_groups,
                    ), (k_groups, stages, index, phase)


def token_boxes_on_integers() -> None:
    """A token tile is read in boxes exactly where one of its boxes holds no token row; then
    each box loads itself where it holds one, else the tile's first box (which always does)."""
    from cutlass.cutlass_dsl import Int32

    kernel_cls = k90.BlockwiseGemmFp4Sm90
    for cols in (64, 128):
        gemm = kernel_cls(16, "decode", (cols, 128), (1, 1), 1, True, 1, "BFloat16")
        rows = gemm.token_box_rows
        assert rows * k90.TOKEN_BOXES == cols >= k90.TOKEN_BOX_MIN_COLS, (cols, rows)
        # (narrower tiles, other paths and kernels read whole tiles)
        for kw in ({"tiler": (32, 64)}, {"a_dtype": W4A4}, {"grouped": True}):
            args = {"tiler": (cols, 128), "a_dtype": "BFloat16", "grouped": False} | kw
            other = kernel_cls(
                16, "decode", args["tiler"], (1, 1), 1, False, 1, args["a_dtype"], args["grouped"]
            )
            assert other.token_box_rows == other.tile_cols, kw
        for m in range(1, 3 * cols + 1):
            for tile in range(-(-m // cols)):
                starts = range(tile * cols, (tile + 1) * cols, rows)
                empty = [start >= m for start in starts]
                ragged = kernel_cls._ragged_token_tile.__wrapped__(gemm, Int32(tile), Int32(m))
                assert bool(ragged) == any(empty), (cols, m, tile)
                for i, start in enumerate(starts):
                    want = tile * cols // rows if empty[i] else start // rows
                    box = kernel_cls._token_box.__wrapped__(gemm, Int32(tile), i, Int32(m))
                    assert int(box) == want, (cols, m, tile, i)


def grouped_helpers_on_integers() -> None:
    """The grouped kernel's alpha is its expert's times the scale and acc_scale; D's view of
    an expert starts at its first row and ends with its rows."""
    from unittest import mock

    from cutlass.cutlass_dsl import Float32, Int32

    kernel_cls = k90.BlockwiseGemmFp4Sm90
    gemm = kernel_cls(16, "decode", (16, 128), (1, 1), 1, False, 1, "BFloat16", True)
    counts = [3, 0, 20, 0, 40, 0]
    bounds = [0, *itertools.accumulate(counts)]
    offsets = [Int32(v) for v in bounds]
    alphas = [Float32(2.0**-e) for e in range(len(counts))]
    scale = [Float32(3.0)]
    for e in range(len(counts)):
        alpha = kernel_cls._alpha.__wrapped__(gemm, (alphas, scale), Int32(e))
        assert alpha.value == 2.0**-e * 3.0 * gemm.acc_scale, e

    pitch = 48  # (D^T in kernel coordinates: (N, M, 1), row pitch N)
    mD = SimpleNamespace(shape=(pitch, bounds[-1], 1), stride=(1, pitch, 0), iterator=1000)
    with (
        mock.patch.object(k90.cute, "make_layout", lambda shape, stride: (shape, stride)),
        mock.patch.object(k90.cute, "make_tensor", lambda base, layout: (base, layout)),
    ):
        for e, rows in enumerate(counts):
            view = kernel_cls._group_rows.__wrapped__(gemm, mD, offsets, Int32(e))
            base, (shape, stride) = view
            assert int(base) == 1000 + bounds[e] * pitch and int(shape[1]) == rows, e
            assert int(shape[0]) == pitch and int(stride[1]) == pitch, e


# -------------------------------------------------------------- grouped schedule (emulated PTX)
class _WalkUnits:
    """A kernel whose CTAs of WALK_WARPS warps walk the grouped GEMM's units as its roles do,
    each warp on its own, on the kernel's own schedule for M = ``m`` rows of N = ``n`` weight
    rows (``_schedule``, ``first_unit``, ``_unit``, ``_valid``, ``_coords``, ``next_unit``),
    and write each unit's (row tile, token tile, group x split + K split) and its split-K
    partials' place (``_fixup_tile``: tile, tiles) at the unit's index, one slot per warp."""

    def __init__(self, gemm, m, n, ctas):
        self.gemm, self.m, self.n, self.ctas = gemm, m, n, ctas

    @cute.jit
    def __call__(self, offsets: cute.Pointer, groups: Int32, out: cute.Pointer, units: Int32):
        mOffsets = cute.make_tensor(offsets, cute.make_layout(groups + 1))
        mOut = cute.make_tensor(
            out,
            cute.make_layout(
                (units, WALK_WARPS, WALK_FIELDS), stride=(WALK_FIELDS * WALK_WARPS, WALK_FIELDS, 1)
            ),
        )
        self.kernel(mOffsets, mOut).launch(grid=(1, 1, self.ctas), block=(32 * WALK_WARPS, 1, 1))

    @cute.kernel
    def kernel(self, mOffsets: cute.Tensor, mOut: cute.Tensor):
        scheduler, _ = self.gemm._schedule(self.m, self.n, cute.size(mOffsets) - 1, self.ctas)
        # D in kernel coordinates (N, M, 1): the fix-up reads its shape only
        mD = cute.make_tensor(mOut.iterator, cute.make_layout((self.n, self.m, 1)))
        # (outside the one-lane store below: warp_idx() is a warp-wide shuffle)
        warp = cute.arch.warp_idx()
        unit = scheduler.first_unit()
        valid, found, cursor = self.gemm._unit(scheduler, unit, None, mOffsets)
        while self.gemm._valid(scheduler, unit, valid):
            coords = self.gemm._coords(scheduler, unit, found)
            place = self.gemm._fixup_tile(mD, mOffsets, coords)
            if cute.arch.lane_idx() == 0:
                for i in cutlass.range_constexpr(3):
                    mOut[unit, warp, i] = coords[i]
                for i in cutlass.range_constexpr(2):
                    mOut[unit, warp, 3 + i] = place[i]
            unit = scheduler.next_unit(unit)
            valid, found, cursor = self.gemm._unit(scheduler, unit, cursor, mOffsets)


WALK_WARPS = 2  # (a producer warp and consumer warps walk the same units apart)
WALK_FIELDS = 5


def _walk_units(counts, tile_cols, row_tiles, ctas, split=1, m=None):
    """The units every CTA of the grouped schedule reaches for groups of ``counts`` rows (M =
    ``m``, by default the positive counts' sum) and 128-row tiles of N = 128 x ``row_tiles``:
    the emulated walk's (row tile, token tile, group x split + K split, partials' tile, tiles)
    per unit, how often each was written, and the kernel object."""
    groups = len(counts)
    tiler = (tile_cols, 128)
    gemm = k90.BlockwiseGemmFp4Sm90(16, "decode", tiler, (1, 1), split, False, 1, "BFloat16", True)
    # (an M of at least the largest row count keeps every tile of the falling-offset cases)
    m = max(sum(max(0, c) for c in counts), 1) if m is None else m
    # the out buffer: the most units any routing makes
    units = row_tiles * k90.grouped_tiles(m, groups, tile_cols) * split
    null = cute.runtime.make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
    compiled = cute.compile(
        _WalkUnits(gemm, m, 128 * row_tiles, ctas),
        null,
        Int32(groups),
        null,
        Int32(units),
        options=ptx_options(),
    )
    (entry,) = parse_ptx(compiled.__ptx__).values()
    gmem = GlobalMemory()
    offsets = np.cumsum([0, *counts]).astype(np.int32)
    out_bytes = 4 * WALK_FIELDS * WALK_WARPS * units
    offsets_ptr, out_ptr = gmem.alloc(offsets.tobytes()), gmem.alloc(out_bytes)
    params = Params(entry)
    params.put(0, offsets_ptr, 8)
    params.put(0, groups + 1, 4, 8)
    params.put(1, out_ptr, 8)
    params.put(1, units, 4, 8)
    Grid(entry, ctas, 32 * WALK_WARPS, params, gmem, axis="z").run()
    shape = (units, WALK_WARPS, WALK_FIELDS)
    written = gmem.store_counts(out_ptr, out_bytes).reshape(*shape, 4)
    got = gmem.read(out_ptr, out_bytes).view(np.int32).reshape(shape)
    return got, written, gemm, m


# (rows per group, token tile, weight row tiles, CTAs): empty groups first, last and between;
# one group with every row; chunks of 32 groups crossed with and without tiles in them; more
# CTAs than units; groups of several token tiles; ragged last tiles; whole chunks of groups;
# offsets that fall (invalid, refused by a device assert ahead: such a group holds no tile)
GROUPED_WALKS = [
    ([40, -30, 20, 3], 16, 2, 5),
    ([0] * 31 + [3], 8, 2, 3),
    ([2] * 64, 16, 1, 9),
    ([3, 0, 20, 0, 40, 0], 16, 2, 3),
    ([0, 0, 9], 8, 3, 5),
    ([0] * 40 + [5] + [0] * 30 + [17, 1], 8, 1, 7),
    ([1] * 70, 8, 2, 132),
    ([7, 0, 64, 33] * 9, 32, 4, 11),
    ([0] * 5, 16, 2, 4),
]


@pytest.mark.parametrize("split", [1, 2])
def test_grouped_schedule_stops_at_the_bound(split):
    """Offsets that fall and rise again (refused by a device assert ahead) can hold more token
    tiles than grouped_tiles allows for M rows: the walk stops at the bound, so no unit's
    split-K partials land past the workspace: M = 60 in tiles of 16, 3 groups: 6 tiles, of the
    8 that counts 60, -60, 60 name."""
    counts, tile_cols, row_tiles, ctas, m = [60, -60, 60], 16, 2, 5, 60
    bound = k90.grouped_tiles(m, len(counts), tile_cols)
    got, written, *_ = _walk_units(counts, tile_cols, row_tiles, ctas, split, m)
    units = bound * split * row_tiles
    assert written.shape[0] == units and (written == 1).all()
    firsts = [(t, 0) for t in range(4)] + [(t, 2) for t in range(2)]
    expected = [
        (row, tile, group * split + s)
        for tile, group in firsts
        for s in range(split)
        for row in range(row_tiles)
    ]
    assert got[:, 0, :3].tolist() == [list(e) for e in expected]
    assert got[:, 0, 3].max() < got[0, 0, 4] == bound * row_tiles


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("walk", GROUPED_WALKS, ids=range(len(GROUPED_WALKS)))
def test_grouped_schedule_visits_every_token_tile_once(walk, split):
    """Every unit of the dense grouped schedule runs once, on the CTA the static deal gives it,
    and units are the groups' token tiles in group order, then K splits, row tiles fastest:
    unit u is (u mod row tiles, the tile's place in its group, its group x split + its K
    split)."""
    counts, tile_cols, row_tiles, ctas = walk
    got, written, gemm, m = _walk_units(counts, tile_cols, row_tiles, ctas, split)
    expected = [
        (row, tile, group * split + s)
        for group, rows in enumerate(counts)
        for tile in range(max(0, -(-rows // tile_cols)))
        for s in range(split)
        for row in range(row_tiles)
    ]
    live = len(expected)
    assert (written[:live] == 1).all(), "a unit run twice or not at all, by some warp"
    assert (written[live:] == 0).all(), "a unit past the groups' tiles ran"
    for warp in range(WALK_WARPS):
        assert got[:live, warp, :3].tolist() == [list(e) for e in expected], warp
    # the split-K partials' place: unit u's token tile among all groups' (u // (row tiles x
    # split)) x row tiles + its row tile, so a tile's splits share one and no other tile does,
    # among the workspace's tiles (what launcher.workspace_elems holds)
    tiles = k90.grouped_tiles(m, len(counts), tile_cols) * row_tiles
    for u in range(live):
        assert got[u, 0, 3] == u // (row_tiles * split) * row_tiles + u % row_tiles, u
    assert (got[:live, :, 3] < tiles).all() and (got[:live, :, 4] == tiles).all()
    elems = r90.workspace_elems(gemm, m, 128 * row_tiles, len(counts))
    if split > 1:
        assert elems == tiles * split * tile_cols * 128 + tiles
