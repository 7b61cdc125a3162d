# SPDX-License-Identifier: BSD-3-Clause
"""Behavioural facts of blockwise_gemm_fp4.py, found by running what it generates (no GPU).

The kernel's PTX (the compiles test_blackwell.py makes) is executed one thread at a time by a
small integer interpreter, ``PtxThread``: a warp role's address, coordinate, barrier and control
arithmetic runs for a given cluster rank, persistent-grid place and problem, every barrier wait
passing, and the instructions that touch memory, barriers or the tensor core are recorded with
their operands evaluated.  The records are checked against values derived by hand from the
problem, the tile and the cluster (the schedule, the TMA boxes each rank loads, the multicast
masks, the barrier phases, the TMEM columns), never against the kernel's own helpers.
Also here: the host-side layouts of the operands, the acceptance set of the configuration check,
and the compile cache's key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import pytest
import torch
from test_blackwell import (  # noqa: F401  (compiled_matrix: the same compiles, once a process)
    FAMILY_MATRIX,
    arch_config_id,
    compiled_matrix,
    kernel_param,
)

import blockwise_gemm_fp4 as bw

# ------------------------------------------------------------------------------------------
# A PTX interpreter for one thread
# ------------------------------------------------------------------------------------------
_INSTRUCTION = re.compile(r"^(?:@(!?)(%p\d+)\s+)?([a-z][\w.:]*)\s*(.*?);$")
_SPLIT = re.compile(r",(?![^\[]*\])(?![^{]*\})")
_WAIT_ASM = re.compile(r"mbarrier\.try_wait\.parity\.shared\.b64 P1, \[(.*?)\], (\S+),")


def _bits(op: str) -> int:
    for part in reversed(op.split(".")):
        found = re.fullmatch(r"[bsu](8|16|32|64)", part)
        if found:
            return int(found.group(1))
    return 32


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


_ALU = {
    "add": lambda a: a[0] + a[1],
    "sub": lambda a: a[0] - a[1],
    "neg": lambda a: -a[0],
    "mad": lambda a: a[0] * a[1] + a[2],
    "and": lambda a: a[0] & a[1],
    "or": lambda a: a[0] | a[1],
    "xor": lambda a: a[0] ^ a[1],
    "min": min,
    "max": max,
}
_CMP = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


class PtxThread:
    """Runs one thread of a kernel's PTX on integers (None: a value it does not model, such as
    floating point).  Shared memory and TMEM start at address 0; every mbarrier wait passes
    (``try_wait`` answers ``peek``); ``elect.sync`` elects this thread.  ``run`` returns the
    recorded events as tuples (kind, operands...)."""

    def __init__(self, ptx: str):
        self.code: list[tuple] = []
        self.labels: dict[str, int] = {}
        in_asm = False
        for raw in ptx.splitlines():
            line = raw.strip()
            if line in ("// begin inline asm", "// end inline asm"):
                in_asm = line.endswith("begin inline asm")
            elif in_asm:
                # (the kernel's only inline assembly: a blocking mbarrier wait loop)
                found = _WAIT_ASM.match(line)
                if found:
                    self.code.append((None, "asm.wait", list(found.groups())))
            elif re.fullmatch(r"\$L__\w+:", line):
                self.labels[line[:-1]] = len(self.code)
            elif line and not line.startswith(("//", ".")):
                found = _INSTRUCTION.match(line)
                if found:
                    neg, pred, op, rest = found.groups()
                    ops = [o.strip() for o in _SPLIT.split(rest)] if rest else []
                    self.code.append(((pred, neg == "!") if pred else None, op, ops))

    def run(self, special: dict, params: dict, peek: bool = False) -> list[tuple]:
        self.special, self.params, self.regs, self.peek = special, params, {}, peek
        self.low_words: dict[str, int | None] = {}
        events, pc = [], 0
        for _ in range(3_000_000):
            if pc >= len(self.code):
                return events
            guard, op, ops = self.code[pc]
            pc += 1
            if guard is not None:
                taken = self.regs.get(guard[0])
                assert taken is not None, f"branch on an unknown value: {self.code[pc - 1]}"
                if bool(taken) == guard[1]:
                    continue
            if op in ("bra", "bra.uni"):
                pc = self.labels[ops[0]]
            elif op == "ret":
                return events
            else:
                event = self._step(op, ops)
                if event is not None:
                    events.append(event)
        raise AssertionError("the simulated thread does not finish")

    def val(self, x: str):
        if re.fullmatch(r"-?\d+|0[xX][0-9a-fA-F]+", x):
            return int(x, 0)
        if x.startswith("["):
            return self.addr(x)
        if re.fullmatch(r"%(r|rd|rs|p)\d+", x):
            return self.regs.get(x)
        if x.startswith("%"):
            return self.special[x]
        param = re.search(r"_param_(\d+)$", x)
        if param:
            return ("param", int(param.group(1)))
        assert x == "__dynamic_shmem__0", x
        return 0

    def addr(self, x: str):
        base, _, offset = x.strip("[]").partition("+")
        value = self.val(base)
        if isinstance(value, tuple):
            return (*value, int(offset or 0))
        return None if value is None else value + int(offset or 0)

    def set(self, reg: str, value, bits: int = 32):
        if isinstance(value, int) and not isinstance(value, bool):
            value &= (1 << bits) - 1
        self.regs[reg] = value

    def _step(self, op: str, ops: list):  # noqa: C901 (one branch per PTX opcode)
        head, bits = op.split(".")[0], _bits(op)
        if head in (
            "tcgen05",
            "cp",
            "mbarrier",
            "fence",
            "bar",
            "barrier",
            "st",
            "asm",
            "prefetch",
        ):
            return self._effect(op, ops)
        if op.startswith("ld.param"):
            _, index, offset = self.addr(ops[1])
            regs = re.findall(r"%\w+", ops[0])
            for i, reg in enumerate(regs):
                self.set(reg, self.params.get((index, offset + i * bits // 8)), bits)
        elif op.startswith("ld.shared"):
            self.set(ops[0], 0)  # the TMEM address the allocator published: column 0
        elif head == "elect":
            reg, pred = ops[0].split("|")
            self.set(reg, 0)
            self.regs[pred] = True
        elif head == "mov" and "{" in ops[0]:  # (a 64-bit value split into its two words)
            value = self.val(ops[1])
            for i, reg in enumerate(w.strip() for w in ops[0].strip("{}").split(",")):
                if reg != "_":
                    known = isinstance(value, int)
                    self.regs[reg] = value >> 32 * i & 0xFFFFFFFF if known else None
        elif head == "mov" and "{" in ops[1]:  # (two words packed: only the low one is kept)
            self.regs[ops[0]] = None
            self.low_words[ops[0]] = self.val(re.findall(r"%\w+", ops[1])[0])
        elif op == "mov.pred":
            self.regs[ops[0]] = int(ops[1]) != 0
        elif head in ("mov", "shfl", "cvta"):  # (shfl.idx 0: lane 0's value, warp-uniform)
            self.set(ops[0], self.val(ops[1]), 64 if head == "cvta" else bits)
        elif head == "mapa":
            self.regs[ops[0]] = ("mapa", self.val(ops[1]), self.val(ops[2]))
        elif op.endswith(".pred"):
            args = [self.val(o) for o in ops[1:]]
            if None in args:
                self.regs[ops[0]] = None
            else:
                self.regs[ops[0]] = {"not": lambda a: not a[0], "and": all, "or": any}[head](args)
        elif head == "setp":
            a, b = self.val(ops[1]), self.val(ops[2])
            if isinstance(a, int) and isinstance(b, int):
                if ".s" in op:
                    a, b = _signed(a, bits), _signed(b, bits)
                else:
                    a, b = a % (1 << bits), b % (1 << bits)
                self.regs[ops[0]] = _CMP[op.split(".")[1]](a, b)
            else:
                self.regs[ops[0]] = None
        elif head == "selp":
            pred = self.val(ops[3])
            self.set(ops[0], None if pred is None else self.val(ops[1] if pred else ops[2]), bits)
        elif head == "cvt":
            dst, src = op.split(".")[-2:]
            value = self.val(ops[1])
            if not isinstance(value, int) or "f" in dst + src:
                self.regs[ops[0]] = None
            else:
                width = int(src[1:])
                value = _signed(value, width) if src[0] == "s" else value % (1 << width)
                self.set(ops[0], value, int(dst[1:]))
        else:
            self._alu(op, head, bits, ops)
        return None

    def _alu(self, op: str, head: str, bits: int, ops: list):
        args = [self.val(o) for o in ops[1:]]
        if head in ("mul", "and") and 0 in args:
            self.set(ops[0], 0)
            return
        if ".f" in op or not all(isinstance(a, int) for a in args):
            self.regs[ops[0]] = None
            return
        signed = ".s" in op
        a = [_signed(v, bits) if signed else v % (1 << bits) for v in args]
        if head == "mul":
            r = a[0] * a[1] >> (bits if ".hi" in op else 0)
        elif head == "shl":
            r = a[0] << a[1] if a[1] < bits else 0
        elif head == "shr":
            r = a[0] >> min(a[1], bits)
        else:
            r = _ALU[head](a)
        self.set(ops[0], r, bits)

    def _effect(self, op: str, ops: list):
        if op.startswith("mbarrier.try_wait"):
            self.regs[ops[0]] = self.peek
            return ("wait", self.addr(ops[1]), self.val(ops[2]))
        if op == "asm.wait":
            return ("wait", self.addr(f"[{ops[0]}]"), self.val(ops[1]))
        if op.startswith("mbarrier.init"):
            return ("init", self.addr(ops[0]), self.val(ops[1]))
        if op.startswith("mbarrier.arrive.expect_tx"):
            return ("expect_tx", self.addr(ops[1]), self.val(ops[2]))
        if op.startswith("mbarrier.arrive"):
            target = self.val(ops[1].strip("[]")) if "shared::cluster" in op else None
            if isinstance(target, tuple) and target[0] == "mapa":
                return ("arrive", target[1], target[2])
            return ("arrive", self.addr(ops[1]), None)
        if op.startswith("cp.async.bulk.tensor"):
            store = ".global.shared" in op
            tensor = ops[0] if store else ops[1]
            desc, coords = re.match(r"\[(%rd\d+), \{(.*?)\}\]", tensor).groups()
            coords = [self.val(c) for c in coords.split(", ")]
            if store:
                return ("store", self.val(desc)[1], coords, self.addr(ops[1]))
            mask = self.val(ops[3]) if "multicast::cluster" in op else None
            return ("load", self.val(desc)[1], coords, self.addr(ops[0]), self.addr(ops[2]), mask)
        if op.startswith("cp.async.bulk.wait_group"):
            return ("wait_group", int(ops[0]))
        if op.startswith("cp.async.bulk.commit_group"):
            return ("commit_group",)
        if op.startswith("tcgen05.mma"):
            return ("mma", *(self.val(o) for o in ops))
        if op.startswith("tcgen05.cp"):
            return ("cp", self.addr(ops[0]), self.low_words.get(ops[1]))
        if op.startswith("tcgen05.ld"):
            return ("tmem_ld", self.addr(ops[-1]))
        if op.startswith("tcgen05.commit"):
            return ("commit", self.addr(ops[0]), self.val(ops[1]) if len(ops) > 1 else None)
        if op.startswith("tcgen05.alloc"):
            return ("alloc", self.val(ops[1]))
        if op.startswith("tcgen05.wait::ld"):
            return ("wait_ld",)
        if op.startswith("st.shared"):
            return ("st.shared", self.addr(ops[0]))
        if op.startswith("fence.proxy.async"):
            return ("fence_proxy_async", op)
        if op.startswith("bar.sync"):
            return ("bar", int(ops[0]), int(ops[1]) if len(ops) > 1 else None)
        if op.startswith(("barrier.cluster.arrive", "barrier.cluster.wait")):
            return ("cluster_" + op.split(".")[2],)
        return None


# ------------------------------------------------------------------------------------------
# The problem every simulation runs, and what the kernel must do with it (derived by hand)
# ------------------------------------------------------------------------------------------
# Cluster tiles M 3, N 2, k-tiles 5, batches 4 (all different, so a swap of two modes shows),
# each extent one partial tile short; a persistent grid of G clusters, so every CTA walks 4 or 5.
TILES_M, TILES_N, K_TILES, BATCHES, G = 3, 2, 5, 4, 5
K_TILE = 256  # K per k-tile: four K 64 MMAs


class Setup(SimpleNamespace):
    """A configuration's hand-derived geometry."""


def _setup(arch_cfg, compiled) -> Setup:
    (vec, _), c_dtype, (tile_m, tile_n), (cm, cn) = arch_cfg[1]
    pair = 2 if tile_m == 256 else 1
    cta_m = tile_m // pair
    mnkl = (
        TILES_M * cm * cta_m - 5,
        TILES_N * cn * tile_n - 8,
        K_TILES * K_TILE - 32,
        BATCHES,
    )
    return Setup(
        id=arch_config_id(arch_cfg),
        ptx=compiled.ptx,
        vec=vec,
        c_bytes=bw.C_DTYPES[c_dtype].width // 8,
        tile_n=tile_n,
        cm=cm,
        cn=cn,
        pair=pair,
        cta_m=cta_m,
        mnkl=mnkl,
        # stage counts: the kernel's own (tested against byte arithmetic in test_blackwell.py)
        stages=compiled.gemm.num_ab_stage,
        acc_stages=compiled.gemm.num_acc_stage,
        # SF columns per k-tile and 128-row atom: 4 MMAs x V-blocks of K 64, 4 scales a column
        sf_units=K_TILE // vec // 4,
    )


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def fast_divisor(d: int) -> tuple[int, int, int, int]:
    """(divisor, multiplier, shift 1, shift 2) of unsigned 32-bit division by d as
    q = (((x - mulhi(x, m)) >> s1) + mulhi(x, m)) >> s2 (Granlund-Montgomery, round-up)."""
    ell = (d - 1).bit_length()
    multiplier = ((1 << 32) * ((1 << ell) - d)) // d + 1
    s1, s2 = min(ell, 1), max(ell - 1, 0)
    for x in (0, 1, d - 1, d, 7 * d + 3, 2**31 - 1):
        hi = x * (multiplier % 2**32) >> 32
        assert (((x - hi) >> s1) + hi) >> s2 == x // d
    return d, multiplier % 2**32, s1, s2


def _params(s: Setup) -> dict:
    """Kernel parameters as (index, byte offset) -> value: the DSL passes A's coordinate tensor
    as its (M, K, L) extents, and the tile schedule as the tile count and two divisors."""
    m, n, k, batches = s.mnkl
    clusters_m = _ceil(_ceil(m, s.cta_m), s.cm)
    clusters_n = _ceil(_ceil(n, s.tile_n), s.cn)
    params = {(i, b): 0 for i in (0, 1) for b in range(12)}  # the MMAs' runtime fields
    a = kernel_param("mA_mkl")
    params.update({(a, 0): m, (a, 4): k, (a, 8): batches})
    schedule = kernel_param("mAlpha") + 1
    params[(schedule, 0)] = clusters_m * clusters_n * batches
    for index, count in ((schedule + 1, clusters_m), (schedule + 3, clusters_n)):
        for offset, value in zip((0, 4, 8, 9), fast_divisor(count), strict=True):
            params[(index, offset)] = value
    return params


def _tiles(s: Setup, rank: int, z: int) -> list[tuple[int, int, int]]:
    """(M, N, L) CTA tiles of CTA ``rank`` of cluster ``z``: cluster tiles z, z + G, ...,
    numbered M fastest, then N, then L; the CTA's place in its cluster added."""
    x, y = rank % s.cm, rank // s.cm
    total = TILES_M * TILES_N * BATCHES
    return [
        (t % TILES_M * s.cm + x, t // TILES_M % TILES_N * s.cn + y, t // (TILES_M * TILES_N))
        for t in range(z, total, G)
    ]


_MACHINES: dict[str, PtxThread] = {}


@functools.cache
def _run_cached(setup_id: str, warp: int, rank: int, z: int, peek: bool) -> tuple:
    s = _SETUPS[setup_id]
    machine = _MACHINES.setdefault(setup_id, PtxThread(s.ptx))
    special = {
        "%tid.x": 32 * warp,
        "%ctaid.x": rank % s.cm,
        "%ctaid.y": rank // s.cm,
        "%ctaid.z": z,
        "%nctaid.z": G,
        "%cluster_ctarank": rank,  # (x fastest: the cluster is (cluster M, cluster N, 1))
    }
    return tuple(machine.run(special, _params(s), peek))


_SETUPS: dict[str, Setup] = {}


def _sim(s: Setup, warp: int, rank: int = 0, z: int = 0, peek: bool = False) -> list[tuple]:
    _SETUPS[s.id] = s
    return list(_run_cached(s.id, warp, rank, z, peek))


@pytest.fixture
def setup(request) -> Setup:
    matrix = request.getfixturevalue("compiled_matrix")
    return _setup(request.param, matrix[arch_config_id(request.param)])


def _mask(ranks) -> int:
    return sum(1 << r for r in set(ranks))


def _barriers(s: Setup) -> dict[str, int]:
    """First barrier of each array, in the order SharedStorage declares them (8 bytes each)."""
    ab, acc = s.stages, s.acc_stages
    return {
        "ab_full": 0,
        "ab_empty": 8 * ab,
        "acc_full": 16 * ab,
        "acc_empty": 16 * ab + 8 * acc,
        "tmem_dealloc": 16 * ab + 16 * acc,
    }


EPILOGUE, MMA, TMA = 0, 4, 5
OPERANDS = ("tma_atom_a", "tma_atom_b", "tma_atom_sfa", "tma_atom_sfb")
family = pytest.mark.parametrize("setup", FAMILY_MATRIX, ids=arch_config_id, indirect=True)


# ------------------------------------------------------------------------------------------
# 2. TMA loads: coordinates and multicast masks of every cluster rank (4: modes and batches)
# ------------------------------------------------------------------------------------------
def _expected_loads(s: Setup, rank: int, tile, k: int) -> dict[str, tuple]:
    """(coordinates, multicast mask or None) of each load CTA ``rank`` issues for k-tile ``k``
    of CTA tile ``tile``; a None coordinate is a slice index the test checks separately."""
    m_cta, n_cta, batch = tile
    x, y = rank % s.cm, rank // s.cm
    v, pm = x % s.pair, x // s.pair  # half of the CTA pair, pair index along M
    row_a = m_cta * s.cta_m + y * (s.cta_m // s.cn)  # A: one slice per CTA of the cluster row
    b_rows = s.tile_n // s.pair  # B rows per CTA of a pair, sliced over the pairs of the column
    row_b = n_cta * s.tile_n + v * b_rows + pm * (b_rows // (s.cm // s.pair))
    along_n = [x + s.cm * j for j in range(s.cn)]
    along_m_pairs = [v + s.pair * j + s.cm * y for j in range(s.cm // s.pair)]
    along_m = [j + s.cm * y for j in range(s.cm)]

    def mask(ranks):
        return _mask(ranks) if len(ranks) > 1 else None

    return {
        "tma_atom_a": ([k * K_TILE, row_a, batch], mask(along_n)),
        "tma_atom_b": ([k * K_TILE, row_b, batch], mask(along_m_pairs)),
        "tma_atom_sfa": ([None, None, m_cta, batch], mask(along_n)),
        "tma_atom_sfb": ([None, None, None, batch], mask(along_m)),
    }


def _sfb_atoms(s: Setup, n_cta: int) -> set[int]:
    """The 128-row scale atoms an N tile's SFB load covers: from the atom holding its first row,
    as many as hold tile N rows (a 64-row tile shares its atom, a 192-row one starts mid-atom)."""
    first = n_cta * s.tile_n // bw.SF_ATOM_ROWS
    return set(range(first, first + _ceil(s.tile_n, bw.SF_ATOM_ROWS)))


def _tma_loads(s: Setup, rank: int, z: int) -> list[dict[str, tuple]]:
    """The loads of CTA ``rank`` in cluster ``z``, grouped per k-tile: operand -> record."""
    loads = [e for e in _sim(s, TMA, rank, z) if e[0] == "load"]
    params = {kernel_param(name): name for name in OPERANDS}
    assert len(loads) % 4 == 0, loads
    steps = []
    for i in range(0, len(loads), 4):
        step = {params[e[1]]: e for e in loads[i : i + 4]}
        assert sorted(step) == sorted(OPERANDS), loads[i : i + 4]
        steps.append(step)
    return steps


@family
def test_sim_tma_loads_of_every_rank_and_tile(setup):
    """Each CTA of the cluster, in each persistent cluster: one k-tile step per k-tile of each
    of its tiles (5 per tile: the K mode), A and B rows, batch and K coordinates of its own tile
    and slice, SF tiles of its tile's atoms, the exact multicast mask of each load (A and SFA to
    the cluster row, B to the pairs' halves of the column, SFB to the whole column), each stage's
    full barrier, and one SMEM place per stage."""
    s = setup
    for z in range(G):
        for rank in range(s.cm * s.cn):
            tiles = _tiles(s, rank, z)
            steps = _tma_loads(s, rank, z)
            assert len(steps) == len(tiles) * K_TILES, (rank, z, len(steps))
            places: dict[tuple, set] = {}
            for i, step in enumerate(steps):
                tile, k = tiles[i // K_TILES], i % K_TILES
                stage = i % s.stages
                for name, (coords, mask) in _expected_loads(s, rank, tile, k).items():
                    _, _, got, smem, bar, got_mask = step[name]
                    where = (name, rank, z, tile, k)
                    assert [
                        g if c is not None else None for g, c in zip(got, coords, strict=True)
                    ] == [c for c in coords], (where, got)
                    assert got_mask == mask, (where, got_mask, mask)
                    # (the barrier address: this CTA's, or with the pair bit cleared, the leader's)
                    assert bar == _barriers(s)["ab_full"] + 8 * stage, (where, bar)
                    if name in ("tma_atom_sfa", "tma_atom_sfb"):
                        assert k * s.sf_units <= got[1] < (k + 1) * s.sf_units, (where, got)
                    if name == "tma_atom_sfb":
                        assert got[2] in _sfb_atoms(s, tile[1]), (where, got)
                    places.setdefault((name, stage), set()).add(smem)
            assert all(len(p) == 1 for p in places.values()), places
            for name in OPERANDS:
                per_stage = [places[(name, st)].pop() for st in range(min(s.stages, len(steps)))]
                assert len(set(per_stage)) == len(per_stage), (name, per_stage)


@family
def test_sim_every_cta_receives_each_slice_of_its_tiles_once(setup):
    """What lands in each CTA at each k-tile step: every multicast slice of its A, B, SFA and
    SFB tiles exactly once (the issuers' masks name it; a load without a mask stays home), all
    for the same tile and k-tile, as many slices as CTAs share the load."""
    s = setup
    group = {
        "tma_atom_a": s.cn,
        "tma_atom_sfa": s.cn,
        "tma_atom_b": s.cm // s.pair,
        "tma_atom_sfb": s.cm,
    }
    for z in range(G):
        received: dict[tuple, list] = {}
        for rank in range(s.cm * s.cn):
            for i, step in enumerate(_tma_loads(s, rank, z)):
                for name, (_, _, coords, smem, _, mask) in step.items():
                    targets = [rank] if mask is None else [r for r in range(32) if mask >> r & 1]
                    for target in targets:
                        received.setdefault((target, i, name), []).append((tuple(coords), smem))
        for rank in range(s.cm * s.cn):
            tiles = _tiles(s, rank, z)
            for i in range(len(tiles) * K_TILES):
                for name in OPERANDS:
                    got = received.get((rank, i, name), [])
                    assert len(got) == group[name], (rank, z, i, name, got)
                    assert len({c for c, _ in got}) == len(got), (rank, z, i, name, got)
                    assert len({smem for _, smem in got}) == len(got), (rank, z, i, name, got)
                    mine = _expected_loads(s, rank, tiles[i // K_TILES], i % K_TILES)[name][0]
                    # every slice is of this CTA's tile (its atom / row block and batch)
                    assert all(c[-1] == mine[-1] for c, _ in got), (rank, i, name, got)
                    if name == "tma_atom_sfa":
                        assert all(c[2] == mine[2] for c, _ in got), (rank, i, name, got)
                    if name == "tma_atom_sfb":
                        atoms = _sfb_atoms(s, tiles[i // K_TILES][1])
                        assert {c[2] for c, _ in got} <= atoms, (rank, i, name, got)


# ------------------------------------------------------------------------------------------
# 1. Synchronisation: barrier phases per role, arrivals against init counts
# ------------------------------------------------------------------------------------------
def _waits(events, first: int, count: int) -> list[tuple[int, int]]:
    """(stage, parity) of every wait on the barrier array [first, first + 8 * count)."""
    return [
        ((e[1] - first) // 8, e[2])
        for e in events
        if e[0] == "wait" and isinstance(e[1], int) and first <= e[1] < first + 8 * count
    ]


def _ring(count: int, stages: int, start_phase: int, repeat: int = 1) -> list[tuple[int, int]]:
    """(stage, parity) of ``count`` pipeline steps from stage 0 at ``start_phase``, each step
    waited ``repeat`` times (a try_wait peek, then the blocking wait)."""
    return [
        (i % stages, start_phase ^ (i // stages) & 1) for i in range(count) for _ in range(repeat)
    ]


@family
def test_sim_pipeline_waits_start_in_each_roles_phase(setup):
    """The phase each role waits for on each barrier, step after step: producers (TMA warp on a
    stage's empty barrier, MMA warp on an accumulator's empty barrier) start at parity 1 (a
    fresh barrier counts as just-completed phase 1), consumers (MMA warp on a full stage,
    epilogue on a full accumulator) at parity 0; each ring's parity flips once per lap; at the
    end the TMA warp waits once more on every stage, the MMA warp on its last accumulator (their
    tails)."""
    s = setup
    bars = _barriers(s)
    ab, acc = s.stages, s.acc_stages
    for rank in range(s.pair):
        tiles = _tiles(s, rank, 0)
        steps = len(tiles) * K_TILES
        tma = _sim(s, TMA, rank, peek=False)
        # (peek False: the try_wait misses and the blocking wait follows, same parity)
        want = _ring(steps, ab, 1, repeat=2) + _ring(steps + ab, ab, 1)[steps:]
        assert _waits(tma, bars["ab_empty"], ab) == want, s.id
        mma = _sim(s, MMA, rank, peek=False)
        if rank == 0:  # the MMA warp of a pair's leader issues; its peer's waits on nothing
            assert _waits(mma, bars["ab_full"], ab) == _ring(steps, ab, 0, repeat=2)
            # (its tail: one wait for the release of the last accumulator it filled)
            acc_waits = _ring(len(tiles), acc, 1) + _ring(len(tiles) + acc, acc, 1)[-1:]
            assert _waits(mma, bars["acc_empty"], acc) == acc_waits
        else:
            assert _waits(mma, bars["ab_full"], ab) == []
        epilogue = _sim(s, EPILOGUE, rank)
        assert _waits(epilogue, bars["acc_full"], acc) == _ring(len(tiles), acc, 0)


@family
def test_sim_barrier_arrivals_match_their_init_counts(setup):
    """Every barrier is initialised with the number of arrivals its phase gets, counted from
    what the roles really do: a full stage one expect_tx arrival of the whole stage's bytes
    (the pair's leader, for both CTAs); an empty stage one tcgen05.commit from the MMA warp of
    each CTA pair whose commit mask names this CTA (derived: every CTA that multicast into it);
    a full accumulator one commit to both CTAs of the pair; an empty accumulator an arrival from
    each epilogue thread of the pair on the leader's barrier."""
    s = setup
    bars = _barriers(s)
    ab, acc = s.stages, s.acc_stages
    ranks = range(s.cm * s.cn)
    inits = [e for e in _sim(s, EPILOGUE) if e[0] == "init"]
    counts = {addr: count for _, addr, count in inits}
    # whole stage: pair x (A + B + SFA + SFB rows per CTA x bytes per row and k-tile)
    sfb_rows = -(-s.tile_n // bw.SF_ATOM_ROWS) * bw.SF_ATOM_ROWS
    sf_bytes = K_TILE // s.vec
    stage_bytes = s.pair * (
        (s.cta_m + s.tile_n // s.pair) * K_TILE // 2 + (s.cta_m + sfb_rows) * sf_bytes
    )
    ab_empty_arrivals = {r: 0 for r in ranks}
    for rank in ranks:
        x, y = rank % s.cm, rank // s.cm
        tma = _sim(s, TMA, rank)
        expect_tx = [e for e in tma if e[0] == "expect_tx"]
        mma = _sim(s, MMA, rank)
        commits = [e for e in mma if e[0] == "commit"]
        if x % s.pair:
            assert expect_tx == [] and commits == [], (rank, expect_tx, commits)
            continue
        steps = len(_tiles(s, rank, 0)) * K_TILES
        assert expect_tx == [
            ("expect_tx", bars["ab_full"] + 8 * (i % ab), stage_bytes) for i in range(steps)
        ]
        stage_commits = [c for c in commits if c[1] < bars["acc_full"]]
        assert [c[1] for c in stage_commits] == [
            bars["ab_empty"] + 8 * (i % ab) for i in range(steps)
        ]
        # the CTAs whose loads land in this pair: its rows (A, SFA) and its column (B, SFB)
        pair_ranks = [x + v + s.cm * y for v in range(s.pair)]
        producers = {p % s.cm + s.cm * j for p in pair_ranks for j in range(s.cn)}
        producers |= {i + s.cm * y for i in range(s.cm)}
        for _, _, mask in stage_commits:
            got = {rank} if mask is None else {r for r in ranks if mask >> r & 1}
            assert got == producers and (mask or 0) >> len(ranks) == 0, (rank, mask, producers)
        for r in producers:
            ab_empty_arrivals[r] += 1
        tiles = len(_tiles(s, rank, 0))
        acc_commits = [c for c in commits if c[1] >= bars["acc_full"]]
        assert [c[1] for c in acc_commits] == [
            bars["acc_full"] + 8 * (t % acc) for t in range(tiles)
        ]
        for _, _, mask in acc_commits:
            got = {rank} if mask is None else {r for r in ranks if mask >> r & 1}
            assert got == set(pair_ranks), (rank, mask)
    for rank in ranks:
        # each epilogue thread arrives once per tile, on the pair leader's barrier
        arrivals = [
            e[1:]
            for e in _sim(s, EPILOGUE, rank)
            if e[0] == "arrive" and e[1] != bars["tmem_dealloc"]
        ]
        leader = rank - rank % s.cm % s.pair if s.pair == 2 else None
        tiles = len(_tiles(s, rank, 0))
        assert arrivals == [(bars["acc_empty"] + 8 * (t % acc), leader) for t in range(tiles)]
    for r in ranks:
        assert counts[bars["ab_full"]] == 1
        assert counts[bars["ab_empty"]] == ab_empty_arrivals[r], (r, counts, ab_empty_arrivals)
    assert [counts[bars["acc_full"] + 8 * t] for t in range(acc)] == [1] * acc
    assert [counts[bars["acc_empty"] + 8 * t] for t in range(acc)] == [128 * s.pair] * acc
    assert sorted(counts) == sorted(
        [8 * i for i in range(2 * ab + 2 * acc)] + ([bars["tmem_dealloc"]] if s.pair == 2 else [])
    )


@family
def test_sim_commits_follow_the_tensor_core_work_they_release(setup):
    """A tcgen05.commit arrives once the tcgen05 work issued before it completes, so it may only
    follow the work that reads what it releases: in each MMA-issuing CTA, the commit that frees
    the k-th stage comes right after that k-step's scale copies and four MMAs (its SMEM is read
    until then; later would stall the ring), and the commit that fills the t-th accumulator
    right after the tile's last MMA."""
    s = setup
    bars = _barriers(s)
    # per k-step: SFA's and SFB's copies (a column of 4 per MMA block group and 128-row atom)
    copies_per_step = s.sf_units * (1 + _ceil(s.tile_n, bw.SF_ATOM_ROWS))
    for rank in range(0, s.cm * s.cn, s.pair):
        mmas = copies = 0
        stage_commits, acc_commits = [], []
        for e in _sim(s, MMA, rank):
            if e[0] == "mma":
                mmas += 1
            elif e[0] == "cp":
                copies += 1
            elif e[0] == "commit" and e[1] < bars["acc_full"]:
                stage_commits.append((mmas, copies))
            elif e[0] == "commit":
                acc_commits.append(mmas)
        tiles = len(_tiles(s, rank, 0))
        steps = tiles * K_TILES
        assert stage_commits == [(4 * (i + 1), copies_per_step * (i + 1)) for i in range(steps)]
        assert acc_commits == [4 * K_TILES * (t + 1) for t in range(tiles)]


# (a shared-memory matrix descriptor's bits 0-13: the start address in 16-byte units)
DESC_ADDRESS_BITS, DESC_ADDRESS_UNIT = 0x3FFF, 16


@family
def test_sim_scale_copies_read_the_stage_their_k_step_loaded(setup):
    """Each k-step's tcgen05.cp copies read SFA and SFB from the SMEM stage that the TMA warp's
    loads of the same k-step wrote (the source descriptor's address): SFA's copies (one per
    four-scale column) in SFA's stage, SFB's (one per column and 128-row atom) in SFB's. A copy
    from another stage scales these MMAs with another k-tile's scales, racing its load."""
    s = setup
    assert s.stages >= 2
    bars = _barriers(s)
    sfb_copies = s.sf_units * _ceil(s.tile_n, bw.SF_ATOM_ROWS)
    # (a cluster's CTAs each load a slice of a stage and multicast it: its start, the lowest)
    per_rank = [_tma_loads(s, rank, 0) for rank in range(s.cm * s.cn)]
    starts = {
        name: [min(step[name][3] for step in steps) for steps in zip(*per_rank, strict=True)]
        for name in ("tma_atom_sfa", "tma_atom_sfb")
    }
    for rank in range(0, s.cm * s.cn, s.pair):
        steps, current = [], []
        for e in _sim(s, MMA, rank):
            if e[0] == "cp":
                assert e[2] is not None, "a scale copy whose source the simulation lost"
                current.append((e[2] & DESC_ADDRESS_BITS) * DESC_ADDRESS_UNIT)
            elif e[0] == "commit" and e[1] < bars["acc_full"]:
                steps.append(current)
                current = []
        assert len(steps) == len(per_rank[rank]) == len(_tiles(s, rank, 0)) * K_TILES
        for name, count in (("tma_atom_sfa", s.sf_units), ("tma_atom_sfb", sfb_copies)):
            stride = starts[name][1] - starts[name][0]  # (one stage's bytes)
            for i, (sources, first) in enumerate(zip(steps, starts[name], strict=True)):
                inside = [a for a in sources if first <= a < first + stride]
                assert len(inside) == count, (name, i, sources, first, stride)


# ------------------------------------------------------------------------------------------
# 1. The epilogue's SMEM -> TMA-store hand-off
# ------------------------------------------------------------------------------------------
def _smem_c_buffers(s: Setup) -> tuple[int, int, int]:
    """(first address, bytes, count) of the epilogue's SMEM buffers, from the SMEM layout the
    PTX uses: D's buffers start where the stores read the lowest address and end where A's
    stages begin (SharedStorage: sC, then sA); one buffer is 128 rows x 32 columns of D."""
    first = min(e[3] for e in _sim(s, EPILOGUE) if e[0] == "store")
    a_param = kernel_param("tma_atom_a")
    a_start = min(e[3] for e in _sim(s, TMA) if e[0] == "load" and e[1] == a_param)
    size = s.cta_m * 32 * s.c_bytes
    assert (a_start - first) % size == 0, (first, a_start, size)
    return first, size, (a_start - first) // size


def _tokens(events, depth: int) -> str:
    """The epilogue's hand-off as letters: S an SMEM write, F the generic-to-async proxy fence,
    B the epilogue warps' named barrier, X a TMA store, C its commit, W a wait for all but
    ``depth`` stores' reads, Z a wait for all of them, ? a wait for any other count."""
    letters = []
    for e in events:
        if e[0] == "st.shared":
            letters.append("S")
        elif e[0] == "fence_proxy_async":
            letters.append("F" if e[1] == "fence.proxy.async.shared::cta" else "f")
        elif e[0] == "bar" and e[1] == bw.NamedBarrierId.EPILOGUE:
            letters.append("B" if e[2] == 32 * bw.NUM_EPILOGUE_WARPS else "b")
        elif e[0] == "store":
            letters.append("X")
        elif e[0] == "commit_group":
            letters.append("C")
        elif e[0] == "wait_group":
            letters.append({depth: "W", 0: "Z"}.get(e[1], "?"))
    return "".join(letters)


@family
def test_sim_epilogue_fences_and_waits_around_every_tma_store(setup):
    """Every 32-column subtile of every tile, in each epilogue warp: the warp's SMEM writes, then
    fence.proxy.async (its generic writes visible to the TMA unit), then the four warps' barrier;
    warp 0 alone then stores, commits, and waits until at most (SMEM buffers - 1) stores still
    read SMEM before the barrier that lets the warps write again; the last wait (before exit)
    is for every store (a no-op in warps with none).  Stores rotate through the SMEM buffers in
    order, each store reading the buffer its warps just wrote."""
    s = setup
    first, size, buffers = _smem_c_buffers(s)
    assert buffers >= 2, buffers
    subtiles = len(_tiles(s, 0, 0)) * (s.tile_n // 32)
    for warp in (0, 2):
        events = _sim(s, warp)
        tokens = _tokens(events, buffers - 1)
        store = "XCW" if warp == 0 else ""
        pattern = f"(?:S+FB{store}B){{{subtiles}}}BZ"
        assert re.fullmatch(pattern, tokens), (warp, buffers, tokens)
        # which buffer each subtile's writes and store use: i-th subtile, buffer i % count
        written, group = [], set()
        for e in events:
            if e[0] == "st.shared" and e[1] >= first:
                group.add((e[1] - first) // size)
            elif e[0] == "fence_proxy_async" and group:
                written.append(group)
                group = set()
        assert written == [{i % buffers} for i in range(subtiles)], (warp, written)
        if warp == 0:
            stored = [e[3] for e in events if e[0] == "store"]
            assert stored == [first + size * (i % buffers) for i in range(subtiles)]


# ------------------------------------------------------------------------------------------
# 3. The TMEM address map: accumulators, scale factors, what the epilogue reads
# ------------------------------------------------------------------------------------------
def _tmem_map(s: Setup) -> tuple[list[int], int, int, int]:
    """(first column of each accumulator buffer, SFA's first column, SFB's, SFB's columns), by
    hand: two tile-N buffers, then SFA (128 rows: 4 groups of 32 lanes x 4 columns), then SFB
    (16 columns per 128-row atom); at tile N 256 the second buffer starts the 48 scale columns
    before the end of the first, so that 512 columns hold it all."""
    sfa_cols, sfb_cols = 16, 16 * _ceil(s.tile_n, bw.SF_ATOM_ROWS)
    second = s.tile_n if 2 * s.tile_n + sfa_cols + sfb_cols <= 512 else s.tile_n - 48
    sfa = second + s.tile_n
    return [0, second], sfa, sfa + sfa_cols, sfb_cols


def _column(taddr: int) -> int:
    return taddr & 0xFFFF  # (bits 16 up: the lane; bit 31 of a scale address: its scale id)


@family
def test_sim_tmem_columns_of_accumulators_and_scales(setup):
    """The MMA warp's TMEM, in every MMA-issuing CTA of the cluster: the accumulator of its t-th
    tile in buffer t % 2 (exact first column), SFA and SFB copies and MMA reads in their own
    columns (SFB from the tile's row offset in its 128-row atom on: (n * tile N) % 128 / 32
    columns), nothing overlapping but the two buffers' 48 shared columns at tile N 256, all
    inside the 512 allocated."""
    s = setup
    buffers, sfa, sfb, sfb_cols = _tmem_map(s)
    sf = set(range(sfa, sfa + 16)) | set(range(sfb, sfb + sfb_cols))
    acc = [set(range(b, b + s.tile_n)) for b in buffers]
    assert not sf & (acc[0] | acc[1]) and max(sf) < 512
    assert len(acc[0] & acc[1]) == (48 if s.tile_n == 256 else 0)
    assert [e[1] for e in _sim(s, EPILOGUE) if e[0] == "alloc"] == [512]
    per_tile = 4 * K_TILES
    for rank in range(0, s.cm * s.cn, s.pair):  # (the MMA warps of single CTAs and pair leaders)
        events = _sim(s, MMA, rank)
        assert [e[1] for e in events if e[0] == "alloc"] == []  # (epilogue warp 0 allocates)
        tiles = _tiles(s, rank, 0)
        mmas = [e for e in events if e[0] == "mma"]
        assert len(mmas) == len(tiles) * per_tile
        for t, (_, n_cta, _) in enumerate(tiles):
            shift = n_cta * s.tile_n % bw.SF_ATOM_ROWS // 32
            for j, mma in enumerate(mmas[t * per_tile : (t + 1) * per_tile]):
                where = (rank, t, n_cta, j, mma)
                assert mma[1] == buffers[t % 2], where
                assert sfa <= _column(mma[5]) < sfa + 16, where
                assert sfb + shift <= _column(mma[6]) < sfb + sfb_cols, where
                if j % 4 == 0:
                    assert _column(mma[6]) - sfb - shift == _column(mma[5]) - sfa, where
        copies = {_column(e[1]) for e in events if e[0] == "cp"}
        # (a k-tile's scales of a 128-row atom: sf_units columns of 4; MXFP4 fills half of 16)
        atoms = _ceil(s.tile_n, bw.SF_ATOM_ROWS)
        used = set(range(sfa, sfa + 4 * s.sf_units, 4))
        assert copies == used | set(range(sfb, sfb + 4 * s.sf_units * atoms, 4))


@family
def test_sim_epilogue_reads_the_buffer_the_mma_wrote(setup):
    """The epilogue of the t-th tile reads every 32-column subtile of buffer t % 2 once and
    stores each to the D columns of that subtile (tile N offset + its column in the buffer),
    rows and batch of its CTA tile; it releases the accumulator (arrival on its empty barrier)
    only after the TMEM loads of every column the next tile's MMAs write, with a tcgen05.wait
    between those loads and an early release."""
    s = setup
    buffers, _, _, _ = _tmem_map(s)
    for rank in range(s.pair):
        tiles = _tiles(s, rank, 0)
        events = _sim(s, EPILOGUE, rank)
        acc_full, acc_empty = _barriers(s)["acc_full"], _barriers(s)["acc_empty"]
        starts = [
            i
            for i, e in enumerate(events)
            if e[0] == "wait" and acc_full <= e[1] < acc_full + 8 * s.acc_stages
        ]
        assert len(starts) == len(tiles)
        for t, (m_cta, n_cta, batch) in enumerate(tiles):
            end = starts[t + 1] if t + 1 < len(tiles) else len(events)
            tile_events = events[starts[t] : end]
            reads = [(i, _column(e[1])) for i, e in enumerate(tile_events) if e[0] == "tmem_ld"]
            stores = [e[2] for e in tile_events if e[0] == "store"]
            base, other = buffers[t % 2], buffers[(t + 1) % 2]
            assert sorted(c for _, c in reads) == list(range(base, base + s.tile_n, 32)), t
            if rank == 0 or stores:
                assert stores == [
                    [n_cta * s.tile_n + c - base, m_cta * s.cta_m, batch] for _, c in reads
                ], (t, reads, stores)
            (release,) = [
                i
                for i, e in enumerate(tile_events)
                if e[0] == "arrive" and e[1] == acc_empty + 8 * (t % s.acc_stages)
            ]
            next_columns = set(range(other, other + s.tile_n))
            late = [c for i, c in reads if i > release]
            assert not set().union(*(range(c, c + 32) for c in late)) & next_columns, (t, late)
            if late:
                last_early = max(i for i, _ in reads if i < release)
                between = [e[0] for e in tile_events[last_early:release]]
                assert "wait_ld" in between, (t, between)


# ------------------------------------------------------------------------------------------
# 4. Host side: the operands' layouts, the k-tile count, the grid
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "c_dtype,n,pitch",
    [("BFloat16", 250, 256), ("Float16", 9, 16), ("Float32", 250, 252), ("Float32", 4, 4)],
)
def test_host_layouts_modes_pitch_and_tile_counts(c_dtype, n, pitch):
    """The layouts the host builds, on a problem whose M, N, K and L tile counts all differ (3,
    2, 5, 4): A [M, K, L] and B [N, K, L] K-major with batch strides M*K and N*K, D [M, N, L]
    with rows ``pitch`` apart (N rounded up to 16 bytes) and batch stride M * pitch; the MMA
    tiles of A, B, D per mode, and the k-tile count, 5; the grid: the cluster, then one cluster
    per cluster tile."""
    from cutlass.cute.runtime import make_ptr

    tile, cluster = (128, 128), (1, 2)
    m, k, batches = 3 * 128 - 7, 5 * 256 - 32, 4
    n_tiles = -(-n // 128)
    found = {}

    @cute.jit
    def probe(a: cute.Pointer, b: cute.Pointer, sfa: cute.Pointer, sfb: cute.Pointer, c):
        gemm = bw.BlockwiseGemmFp4Sm100(16, tile, cluster)
        gemm.a_dtype, gemm.b_dtype, gemm.sf_dtype = a.value_type, b.value_type, sfa.value_type
        gemm.c_dtype = c.value_type
        gemm._setup_attributes()
        tensors = gemm.global_tensors(a, b, sfa, sfb, c, (m, n, k, batches))
        found["layouts"] = [(t.shape, t.stride) for t in (tensors[0], tensors[1], tensors[4])]
        parts = gemm._partition_global_tiles(gemm.tiled_mma, gemm.tiled_mma_sfb, 0, *tensors)
        found["rest"] = [p.shape[3:] for p in (parts[0], parts[1], parts[4])]
        found["k_tiles"] = parts[5]
        schedule, grid = gemm._compute_grid(tensors[4], gemm.cta_tile_shape_mnk, cluster, 100)
        found["grid"] = grid

    gmem = cute.AddressSpace.gmem
    pointers = [
        make_ptr(dtype, 1 << 20, gmem, assumed_align=16)
        for dtype in (
            cutlass.Float4E2M1FN,
            cutlass.Float4E2M1FN,
            cutlass.Float8E4M3FN,
            cutlass.Float8E4M3FN,
            bw.C_DTYPES[c_dtype],
        )
    ]
    probe(*pointers)
    a, b, d = found["layouts"]
    assert (a[0], a[1]) == ((m, k, batches), (k, 1, m * k))
    assert (b[0], b[1]) == ((n, k, batches), (k, 1, n * k))
    assert (d[0], d[1]) == ((m, n, batches), (pitch, 1, m * pitch))
    assert found["rest"] == [(3, 5, batches), (n_tiles, 5, batches), (3, n_tiles, batches)]
    assert found["k_tiles"] == 5
    clusters_n = -(-n_tiles // cluster[1])
    assert tuple(found["grid"]) == (*cluster, 3 * clusters_n * batches)


# ------------------------------------------------------------------------------------------
# 5. Acceptance and the compile cache
# ------------------------------------------------------------------------------------------
def _accepted_by_hand(tile, cluster) -> bool:
    """The kernel's configurations: tile M 128 (one CTA) or 256 (a CTA pair: even cluster M),
    tile N a whole number of 64-row halves of a scale atom, at most two atoms (64..256), cluster
    extents powers of two up to 4 (scale-factor multicast)."""
    (tm, tn), (cm, cn) = tile, cluster
    return (
        tm in (128, 256)
        and tn in (64, 128, 192, 256)
        and cm in (1, 2, 4)
        and cn in (1, 2, 4)
        and (tm == 128 or cm % 2 == 0)
    )


@pytest.mark.parametrize("vec", [16, 32])
def test_acceptance_set_is_exactly_the_kernels(vec):
    """Over a sweep of tile M, tile N and cluster shapes the configuration check accepts exactly
    the hand-derived set, and names the tile or cluster extent it refuses."""
    sf_dtype = bw.SF_FORMATS[vec][0]
    mnkl = (1000, 1000, 1024, 2)
    for tm in (64, 128, 192, 256, 512):
        for tn in (16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 512):
            for cm in (1, 2, 3, 4, 8):
                for cn in (1, 2, 4, 8):
                    tile, cluster = (tm, tn), (cm, cn)
                    reasons = bw.check_fp4_gemm_config(
                        mnkl, vec, sf_dtype, "BFloat16", tile, cluster
                    )
                    assert (reasons == []) == _accepted_by_hand(tile, cluster), (tile, cluster)
                    ok, why = bw.BlockwiseGemmFp4Sm100.can_implement(
                        mnkl, vec, sf_dtype, "BFloat16", tile, cluster
                    )
                    assert ok == (reasons == []) and why == reasons
                    if tn not in (64, 128, 192, 256):
                        assert any(f"MMA tile N={tn} is not supported" in r for r in reasons)
                    if tm not in (128, 256):
                        assert any(f"MMA tile M={tm} is not supported" in r for r in reasons)


def test_tile_n_32_is_refused_everywhere():
    """Tile N 32 (a valid tcgen05 N, but not a shape the SFB handling serves) is refused by the
    check, by GemmConfig, and by the CLI, with the reason."""
    reason = "MMA tile N=32 is not supported: use 64, 128, 192 or 256"
    config = bw.GemmConfig(16, "BFloat16", (128, 32), (1, 1))
    assert reason in config.reasons((256, 256, 256, 1))
    parsed = bw.make_parser().parse_args(["--mma_tiler_mn", "128,32", "--compile_only"])
    with pytest.raises(bw.UsageError, match=re.escape(reason)):
        bw._validated(parsed)


KERNEL_ARGUMENTS = [
    ("sf_vec_size", 32),
    ("c_dtype", "Float32"),
    ("c_dtype", "Float16"),
    ("mma_tiler_mn", (256, 128)),
    ("mma_tiler_mn", (128, 64)),
    ("cluster_shape_mn", (4, 2)),
    ("cluster_shape_mn", (2, 1)),
]


@pytest.mark.parametrize("field,value", KERNEL_ARGUMENTS)
def test_compile_cache_key_changes_with_every_kernel_argument(monkeypatch, field, value):
    """Two configurations that differ in one argument that changes the kernel are two cache
    entries and two compiles, each compiled with its own arguments; the same configuration
    (however its tuples are spelled) and another problem shape reuse the entry; another device
    is another entry."""
    compiles = []

    def compile_gemm(*args, **kwargs):
        compiles.append(args)
        return None, object()

    monkeypatch.setattr(bw, "compile_gemm", compile_gemm)
    monkeypatch.setattr(bw, "_KERNELS", {})
    monkeypatch.setattr(bw, "_CHECKED", set())
    monkeypatch.setattr(
        bw.utils,
        "HardwareInfo",
        lambda *_: SimpleNamespace(get_max_active_clusters=lambda size: 148 // size),
    )
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    base = bw.GemmConfig(16, "BFloat16", (256, 256), (2, 2))
    changed = dataclasses.replace(base, **{field: value})
    assert changed != base and hash(changed) != hash(base)
    device = SimpleNamespace(index=0)
    mnkl = (1024, 1024, 1024, 1)
    first = bw._compiled_kernel(base, mnkl, device)
    second = bw._compiled_kernel(changed, mnkl, device)
    assert first is not second and len(compiles) == 2
    for config, args in zip((base, changed), compiles, strict=True):
        cluster = config.cluster_shape_mn
        assert args == (
            config.sf_vec_size,
            bw.SF_FORMATS[config.sf_vec_size][0],
            config.c_dtype,
            config.mma_tiler_mn,
            cluster,
            148 // (cluster[0] * cluster[1]),
        )
    same = bw.GemmConfig(16, "BFloat16", [256, 256], [2, 2])
    assert bw._compiled_kernel(same, (512, 256, 2048, 3), device) is first
    assert len(compiles) == 2
    bw._compiled_kernel(base, mnkl, SimpleNamespace(index=1))
    assert len(compiles) == 3


@family
def test_sim_no_peer_is_signalled_before_the_cluster_initialised_its_barriers(setup):
    """Start-up: a CTA of a cluster may signal a peer's barriers (a multicast TMA load, a
    tcgen05.commit to other CTAs, a remote arrive) only after a cluster-wide wait that follows
    every CTA's mbarrier.init; before it, a peer's barrier may not be initialised yet."""
    s = setup
    if s.cm * s.cn == 1:
        pytest.skip("one CTA: no peer to signal")
    for rank in range(s.cm * s.cn):
        for warp in (EPILOGUE, MMA, TMA):
            events = _sim(s, warp, rank)
            kinds = [e[0] for e in events]
            assert "cluster_wait" in kinds, (rank, warp)
            start = kinds.index("cluster_wait")
            arrived = [i for i, k in enumerate(kinds) if k == "cluster_arrive"]
            inits = [i for i, k in enumerate(kinds) if k == "init"]
            assert arrived and arrived[0] < start and all(i < arrived[0] for i in inits)
            remote = [
                i
                for i, e in enumerate(events)
                if (e[0] == "load" and e[5] is not None)
                or (e[0] == "commit" and e[2] is not None and e[2] != 1 << rank)
                or (e[0] == "arrive" and e[2] is not None)
            ]
            assert all(i > start for i in remote), (rank, warp, [events[i] for i in remote])
