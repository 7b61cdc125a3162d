# SPDX-License-Identifier: BSD-3-Clause
"""A CPU emulator of the PTX that the quantizer and MoE kernels compile to (tests only).

It runs a whole grid: every thread of every CTA, vectorized with numpy over all threads at once.
All threads share one instruction stream (SIMT): each step runs the instruction at the lowest
program counter among the live threads, for the threads that are at it. Forward branches thus
wait at their join and loop exits wait for the last iteration, so a warp's lanes reconverge at
the immediate post-dominator of structured code. ``shfl.sync`` and ``bar.sync`` check that every
lane (thread) they name is there, and raise otherwise: a schedule that diverges at a shuffle is
undefined behaviour on a GPU, never silently emulated.

Registers hold bits (uint16 / uint32 / uint64, bool predicates); ``.f32`` instructions view them
as IEEE float32 and round as PTX says: .rn (add, mul, fma, div, rcp; no .ftz, so subnormals are
kept), fma exact through float64 with round-to-odd, fma.rm stepped down from the nearest. NaN
results are the GPU's canonical 0x7FFFFFFF. Conversions (bf16, f16, E4M3 with .satfinite) are
exact. ``ex2.approx.ftz`` is a model: 2^x rounded once, subnormals flushed (the hardware's is
within 2 ulp). Shared-memory atomics apply thread by thread in thread order. The whole CTA runs
in lockstep, so a missing ``bar.sync`` cannot change a result here; instead each shared byte
remembers who stored it since the CTA's last ``bar.sync``, and a load or store by another thread
(atomics among atomics excepted) raises as a race. Each global byte remembers the thread that
stored it in the launch: a load or store by another thread raises unless that thread's CTA has
passed a ``bar.sync`` since (another CTA's store is never ordered: no global atomics or fences).

Memory: a global arena of the buffers the caller allocates, with guards between them; an access
out of a buffer, misaligned, or a load of shared memory never stored raises. The arena counts the
stores to each byte, so a test can require every output byte written exactly once.

Only the instructions of these kernels are implemented; any other raises ``PtxError``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
WIDTH = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16}
WIDTH.update({"b32": 32, "u32": 32, "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64})
CANONICAL_NAN = np.uint32(0x7FFFFFFF)
GLOBAL_BASE = 1 << 40
GUARD = 256  # unallocated bytes between global buffers
POISON = 0xA5  # the bytes of an uninitialized buffer (as uint32: above the Inf bits)


class PtxError(Exception):
    """The PTX does something the emulator does not model, or that is undefined on a GPU."""


# ------------------------------------------------------------------------------ float helpers


def f32_bits(values) -> np.ndarray:
    """float32 values -> uint32 bits, NaNs made canonical (as the GPU's arithmetic gives)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    return np.where(np.isnan(np.asarray(values, dtype=np.float32)), CANONICAL_NAN, bits)


def as_f32(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits, dtype=np.uint32).view(np.float32)


def _exact_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray):
    """(s, err): a * b + c = s + err exactly, s its float64 rounding (the product is exact in
    float64; TwoSum gives the sum's error)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    return s, (p - (s - bb)) + (c64 - bb)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fl32(a * b + c) rounded once, to nearest even: the exact error rounds the float64 sum to
    odd, then one rounding to float32 is correct (53 >= 24 + 2 bits)."""
    with np.errstate(all="ignore"):
        s, err = _exact_fma(a, b, c)
        inexact = np.isfinite(s) & (err != 0) & ((s.view(np.uint64) & np.uint64(1)) == 0)
        toward = np.where(err > 0, np.inf, -np.inf)
        s = np.where(inexact, np.nextafter(s, toward), s)
        return s.astype(np.float32)


def fma_f32_rm(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fl32(a * b + c) rounded once, toward minus infinity: the float32 nearest of the exact
    sum, stepped down where it lies above it."""
    with np.errstate(all="ignore"):
        s, err = _exact_fma(a, b, c)
        r = s.astype(np.float32)
        r64 = r.astype(np.float64)
        above = np.isfinite(s) & ((r64 > s) | ((r64 == s) & (err < 0)))
        return np.where(above, np.nextafter(r, np.float32(-np.inf)), r)


def bf16_bits_rn(v: np.ndarray) -> np.ndarray:
    """BF16 bits of float32 values, to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(v)
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def e4m3_from_f32(v: np.ndarray) -> np.ndarray:
    """E4M3 (fn: no Inf, NaN 0x7F) bytes of float32 values, to nearest even, saturating to
    +-448 (``cvt.rn.satfinite``); NaN gives 0x7F."""
    v = np.asarray(v, dtype=np.float32)
    sign = (v.view(np.uint32) >> 31).astype(np.uint8) << 7
    mag = np.abs(v.astype(np.float64))
    with np.errstate(all="ignore"):
        _, e = np.frexp(mag)  # mag = f 2^e, f in [0.5, 1)
        exp = np.maximum(e - 1, -6)  # unbiased exponent; subnormals share -6's step
        step = np.ldexp(1.0, exp - 3)
        q = np.rint(mag / step)  # exact scaling by a power of two; rint: ties to even
        value = q * step  # rounded magnitude (may carry into the next binade: still exact)
        _, e2 = np.frexp(value)
        exp2 = np.maximum(e2 - 1, -6)
        normal = value >= 2.0**-6
        mant = np.where(normal, value / np.ldexp(1.0, exp2) * 8 - 8, value / 2.0**-9)
        code = np.where(normal, (exp2 + 7) * 8, 0) + mant
        code = np.where(value > 448.0, 0x7E, code)  # satfinite (Inf too)
        code = np.where(value == 0, 0, code)
        code = np.where(np.isnan(mag), 0x7F, code)
    return (code.astype(np.int64).astype(np.uint8) & np.uint8(0x7F)) | np.where(
        np.isnan(mag), np.uint8(0), sign
    )


def f16_from_e4m3(byte: np.ndarray) -> np.ndarray:
    """f16 bits of E4M3 bytes (exact; NaN 0x7F / 0xFF gives the f16 NaN 0x7FFF)."""
    byte = np.asarray(byte, dtype=np.uint8)
    exp = (byte >> 3) & 0xF
    mant = (byte & 7).astype(np.float64)
    value = np.where(exp == 0, mant * 2.0**-9, (8 + mant) * np.ldexp(1.0, exp.astype(int) - 10))
    value = np.where(byte & 0x80, -value, value)
    bits = value.astype(np.float16).view(np.uint16)
    return np.where((byte & 0x7F) == 0x7F, np.uint16(0x7FFF), bits)


# ------------------------------------------------------------------------------ parsing

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\)\s*(.*?)\{(.*?)\n\}", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(\w+)(?:\[(\d+)\])?")
_REGDECL = re.compile(r"\.reg\s+\.(\w+)\s+([^;]+);")
_GUARD = re.compile(r"^@(!?)(%\w+)\s+(.*)$")


@dataclass
class Instr:
    op: str  # e.g. "add.s32"
    args: list  # operand strings; vectors as lists
    guard: str | None = None
    negate: bool = False
    text: str = ""


@dataclass
class Entry:
    name: str
    params: list  # (name, size in bytes)
    regs: dict  # register name -> dtype
    code: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)
    reqntid: int | None = None  # the threads per CTA that ``.reqntid`` requires, if it does


def _split_args(text: str) -> list:
    """Operands split at top-level commas; {a, b} becomes a list."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return [[x.strip() for x in a[1:-1].split(",")] if a.startswith("{") else a for a in out]


def _declare(regs: dict, kind: str, names: str) -> None:
    dtype = np.bool_ if kind == "pred" else UINT[WIDTH[kind]]
    for name in names.split(","):
        name = name.strip()
        m = re.fullmatch(r"(%?\w+)<(\d+)>", name)
        if m:
            regs[m.group(1)] = dtype  # a prefix: %r<144> declares %r0 .. %r143
        else:
            regs[name] = dtype


def _parse_statement(stmt: str, entry: Entry) -> None:
    stmt = stmt.strip()
    if not stmt:
        return
    if stmt.startswith(".reg"):
        m = _REGDECL.match(stmt + ";")
        _declare(entry.regs, m.group(1), m.group(2))
        return
    if stmt.startswith(".pragma"):  # (an optimization hint such as "nounroll": no semantics)
        return
    instr = Instr("", [], text=stmt)
    m = _GUARD.match(stmt)
    if m:
        instr.negate, instr.guard, stmt = m.group(1) == "!", m.group(2), m.group(3)
    op, _, rest = stmt.partition(" ")
    instr.op = op.strip()
    instr.args = _split_args(rest.strip())
    entry.code.append(instr)


def parse_ptx(ptx: str) -> dict:
    """{entry name: Entry} of a PTX module."""
    ptx = re.sub(r"//[^\n]*", "", ptx)
    entries = {}
    for m in _ENTRY.finditer(ptx):
        params = []
        for p in _PARAM.finditer(m.group(2)):
            size = int(p.group(4)) if p.group(4) else WIDTH[p.group(2)] // 8
            params.append((p.group(3), size))
        entry = Entry(m.group(1), params, {})
        ntid = re.search(r"\.reqntid\s+([\d,\s]+)", m.group(3))
        if ntid:
            entry.reqntid = math.prod(int(v) for v in ntid.group(1).split(","))
        for line in m.group(4).split("\n"):
            line = line.strip()
            if not line:
                continue
            if re.fullmatch(r"\$?\w+:", line):
                entry.labels[line[:-1]] = len(entry.code)
                continue
            if line.startswith("{") and line.endswith("}"):  # an inline asm scope
                line = line[1:-1]
            for stmt in line.split(";"):
                _parse_statement(stmt, entry)
        entries[entry.name] = entry
    return entries


# ------------------------------------------------------------------------------ memory


class GlobalMemory:
    """Buffers at distinct addresses with unallocated guards between them."""

    def __init__(self):
        self.mem = np.zeros(0, np.uint8)
        self.valid = np.zeros(0, bool)
        self.stores = np.zeros(0, np.int32)  # stores per byte

    def alloc(self, data) -> int:
        """A buffer holding ``data`` (bytes-like, or an int size: uninitialized bytes, which hold
        POISON as torch.empty's garbage would); its address."""
        if isinstance(data, int):
            raw = np.full(data, POISON, np.uint8)
        else:
            raw = np.frombuffer(data, np.uint8)
        start = self.mem.size + GUARD
        size = start + (raw.size + 15) // 16 * 16
        self.mem = np.concatenate([self.mem, np.zeros(size - self.mem.size, np.uint8)])
        self.mem[start : start + raw.size] = raw
        self.valid = np.concatenate([self.valid, np.zeros(size - self.valid.size, bool)])
        self.valid[start : start + raw.size] = True
        self.stores = np.concatenate([self.stores, np.zeros(size - self.stores.size, np.int32)])
        return GLOBAL_BASE + start

    def _index(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        off = addr.astype(np.int64) - GLOBAL_BASE
        if np.any(off % nbytes):
            raise PtxError(f"misaligned {nbytes}-byte global access")
        idx = off[:, None] + np.arange(nbytes)
        if np.any(idx < 0) or np.any(idx >= self.mem.size) or not self.valid[idx].all():
            raise PtxError(f"global access out of bounds at offsets {off[:4]}")
        return idx

    def indices(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        """The arena indices [threads, nbytes] of an access (checked)."""
        return self._index(addr, nbytes)

    def load(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        return self.mem[self._index(addr, nbytes)]

    def store(self, addr: np.ndarray, data: np.ndarray) -> None:
        idx = self._index(addr, data.shape[1])
        self.mem[idx] = data
        np.add.at(self.stores, idx.ravel(), 1)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.mem[addr - GLOBAL_BASE : addr - GLOBAL_BASE + nbytes].copy()

    def store_counts(self, addr: int, nbytes: int) -> np.ndarray:
        return self.stores[addr - GLOBAL_BASE : addr - GLOBAL_BASE + nbytes].copy()


class Params:
    """A kernel's parameter space: the bytes the launch sets; a load of others raises."""

    def __init__(self, entry: Entry):
        self.offsets, off = {}, 0
        for name, size in entry.params:
            off = (off + min(size, 8) - 1) // min(size, 8) * min(size, 8)
            self.offsets[name] = (off, size)
            off += size
        self.data = np.zeros(off, np.uint8)
        self.set = np.zeros(off, bool)
        self.names = [name for name, _ in entry.params]

    def put(self, index: int, value: int, nbytes: int, offset: int = 0) -> None:
        """Parameter ``index`` gets the little-endian ``value`` at byte ``offset``."""
        start, size = self.offsets[self.names[index]]
        assert offset + nbytes <= size, "past the parameter"
        raw = np.frombuffer(int(value % (1 << 8 * nbytes)).to_bytes(nbytes, "little"), np.uint8)
        self.data[start + offset : start + offset + nbytes] = raw
        self.set[start + offset : start + offset + nbytes] = True

    def load(self, ref: str, nbytes: int) -> int:
        name, _, plus = ref.partition("+")
        start = self.offsets[name][0] + int(plus or 0)
        if not self.set[start : start + nbytes].all():
            raise PtxError(f"ld.param of bytes the launch did not set: {ref}")
        return int.from_bytes(self.data[start : start + nbytes].tobytes(), "little")


# ------------------------------------------------------------------------------ execution

SHARED_BASE = 0  # the shared-window address of __dynamic_shmem__0
FREE, ATOMIC = -1, -2  # shared bytes not stored since the last bar.sync / stored by atomics
_SPECIAL = ("%tid.x", "%ntid.x", "%laneid", "%warpid")
_SPECIAL += tuple(f"%{r}.{a}" for r in ("ctaid", "nctaid") for a in "xyz")
_FLOAT_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal}
_FLOAT_CMP.update({"gt": np.greater, "ge": np.greater_equal})
_INT_CMP = dict(_FLOAT_CMP, lo=np.less, ls=np.less_equal, hi=np.greater, hs=np.greater_equal)


class Grid:
    """One launch of ``entry`` over ``ctas`` CTAs of ``threads`` threads, the CTAs along grid
    ``axis`` (the grid's other extents 1). ``global_races=False`` leaves global accesses
    unchecked for races: for inputs that break a kernel's contract, where only staying inside
    the buffers is promised."""

    def __init__(
        self,
        entry,
        ctas,
        threads,
        params,
        gmem,
        smem_bytes=0,
        max_steps=10**6,
        axis="x",
        global_races=True,
    ):
        if threads % 32:
            raise PtxError("CTAs of whole warps only")
        if entry.reqntid is not None and threads != entry.reqntid:
            raise PtxError(f"CTAs of {threads} threads: the entry requires {entry.reqntid}")
        self.axis = axis
        self.entry, self.params, self.gmem = entry, params, gmem
        self.ctas, self.threads, self.n = ctas, threads, ctas * threads
        self.tid = np.tile(np.arange(threads, dtype=np.uint32), ctas)
        self.cta = np.repeat(np.arange(ctas, dtype=np.int64), threads)
        self.regs = {}
        self.smem = np.zeros((ctas, smem_bytes), np.uint8)
        self.smem_set = np.zeros((ctas, smem_bytes), bool)
        # who stored each shared byte since the CTA's last bar.sync: FREE, ATOMIC or a thread
        self.smem_owner = np.full((ctas, smem_bytes), FREE, np.int64)
        # bar.syncs passed per CTA; each global byte's storing thread (grid-wide) and the count of
        # its CTA's bar.syncs at the store (made at run(): buffers may be allocated until then)
        self.bars = np.zeros(ctas, np.int64)
        self.gmem_owner = self.gmem_epoch = None
        self.global_races = global_races
        self.max_steps = max_steps

    # -------------------------------------------------------------------- operands

    def _dtype(self, name: str):
        regs = self.entry.regs
        dtype = regs.get(name, regs.get(name.rstrip("0123456789")))
        if dtype is None:
            raise PtxError(f"undeclared register {name}")
        return dtype

    def val(self, arg: str, width: int):
        """An operand's bits as uint<width> (an array over the threads, or a scalar)."""
        if arg in _SPECIAL:
            value = {
                "%tid.x": self.tid,
                "%ntid.x": np.uint32(self.threads),
                "%laneid": self.tid % 32,
                "%warpid": self.tid // 32,
            }.get(arg)
            if value is None:
                along = arg.endswith("." + self.axis)
                if arg.startswith("%ctaid"):
                    value = self.cta.astype(np.uint32) if along else np.uint32(0)
                else:
                    value = np.uint32(self.ctas if along else 1)
        elif arg.startswith("%") or re.fullmatch(r"[a-z]\w*", arg) and arg in self.entry.regs:
            if arg not in self.regs:
                raise PtxError(f"read of never-written register {arg}")
            value = self.regs[arg]
        elif re.fullmatch(r"0[fF][0-9A-Fa-f]{8}", arg):
            value = np.uint32(int(arg[2:], 16))
        elif re.fullmatch(r"-?(0[xX][0-9A-Fa-f]+|\d+)", arg):
            value = UINT[width](int(arg, 0) % (1 << width))
        elif arg == "__dynamic_shmem__0":
            value = np.uint32(SHARED_BASE)
        else:
            raise PtxError(f"unknown operand {arg}")
        if value.dtype == np.bool_:
            return value
        return value.astype(UINT[width]) if value.dtype != UINT[width] else value

    def set(self, name: str, value, mask: np.ndarray) -> None:
        dtype = self._dtype(name)
        if name not in self.regs:
            self.regs[name] = np.zeros(self.n, dtype)
        value = np.broadcast_to(np.asarray(value).astype(dtype), (self.n,))
        self.regs[name][mask] = value[mask]

    # -------------------------------------------------------------------- the schedule

    def run(self) -> None:
        code, labels = self.entry.code, self.entry.labels
        self.gmem_owner = np.full(self.gmem.mem.size, FREE, np.int64)
        self.gmem_epoch = np.zeros(self.gmem.mem.size, np.int64)
        pc = np.zeros(self.n, np.int64)
        exited = np.zeros(self.n, bool)
        steps = 0
        with np.errstate(all="ignore"):
            while not exited.all():
                steps += 1
                if steps > self.max_steps:
                    raise PtxError("step limit: a loop that does not end?")
                at = int(np.where(exited, len(code), pc).min())
                act = (pc == at) & ~exited
                if at >= len(code):
                    raise PtxError("ran past the end of the code")
                ins = code[at]
                mask = act
                if ins.guard is not None:
                    g = self.val(ins.guard, 1)
                    mask = act & (~g if ins.negate else g)
                head = ins.op.split(".")[0]
                if head == "bra":
                    if ins.op == "bra.uni" and ins.guard is not None:
                        raise PtxError("guarded bra.uni")
                    pc[mask] = labels[ins.args[0]]
                    pc[act & ~mask] = at + 1
                    continue
                pc[act] = at + 1
                if head in ("ret", "exit"):
                    exited |= mask
                    continue
                self.execute(ins, mask)

    # -------------------------------------------------------------------- instructions

    def execute(self, ins: Instr, m: np.ndarray) -> None:
        parts = ins.op.split(".")
        handler = getattr(self, "op_" + parts[0], None)
        if handler is None:
            raise PtxError(f"instruction not emulated: {ins.text}")
        handler(ins, parts, m)

    def _fvals(self, args) -> list:
        return [as_f32(self.val(a, 32)) for a in args]

    def _float_mods(self, ins: Instr, parts: list, need_rn: bool) -> None:
        mods = set(parts[1:-1])
        if parts[-1] != "f32" or not mods <= {"rn"} or (need_rn and "rn" not in mods):
            raise PtxError(f"float rounding/type not emulated: {ins.text}")

    def op_griddepcontrol(self, ins, parts, m):
        # (the driver runs the primary grid to completion before the dependent one)
        if parts[1] not in ("wait", "launch_dependents"):
            raise PtxError(ins.text)

    def op_mov(self, ins, parts, m):
        d, a = ins.args
        if parts[-1] == "pred":
            return self.set(d, self.val(a, 1), m)
        w = WIDTH[parts[-1]]
        if isinstance(d, list):  # unpack into halves, low first
            v = self.val(a, w).astype(np.uint64)
            k = w // len(d)
            for i, name in enumerate(d):
                if name != "_":  # (PTX's sink: that part is dropped)
                    self.set(name, (v >> np.uint64(k * i)) & np.uint64((1 << k) - 1), m)
        elif isinstance(a, list):
            k, v = w // len(a), np.uint64(0)
            for i, name in enumerate(a):
                v = v | (self.val(name, k).astype(np.uint64) << np.uint64(k * i))
            self.set(d, v, m)
        else:
            self.set(d, self.val(a, w), m)

    def _int_binary(self, ins, parts, m, fn):
        w = WIDTH[parts[-1]]
        d, a, b = ins.args
        self.set(d, fn(self.val(a, w), self.val(b, w)), m)

    def op_add(self, ins, parts, m):
        if parts[-1] == "f32":
            self._float_mods(ins, parts, False)
            a, b = self._fvals(ins.args[1:])
            return self.set(ins.args[0], f32_bits(a + b), m)
        if len(parts) != 2:
            raise PtxError(ins.text)
        self._int_binary(ins, parts, m, lambda a, b: a + b)

    def op_sub(self, ins, parts, m):
        if len(parts) != 2 or parts[-1] == "f32":
            raise PtxError(ins.text)
        self._int_binary(ins, parts, m, lambda a, b: a - b)

    def op_mul(self, ins, parts, m):
        t = parts[-1]
        if t in ("f16x2", "bf16x2"):
            return self._mul_x2(ins, parts, m)
        if t == "f32":
            self._float_mods(ins, parts, False)
            a, b = self._fvals(ins.args[1:])
            return self.set(ins.args[0], f32_bits(a * b), m)
        w, mode = WIDTH[t], parts[1]
        d, a, b = ins.args
        a, b = np.asarray(self.val(a, w)), np.asarray(self.val(b, w))
        if mode == "lo" and len(parts) == 3:
            return self.set(d, a * b, m)  # (the low half is the same for either sign)
        if mode == "wide" and w < 64:
            wide = SINT[2 * w] if t.startswith("s") else UINT[2 * w]
            if t.startswith("s"):
                a, b = a.view(SINT[w]), b.view(SINT[w])
            return self.set(d, (a.astype(wide) * b.astype(wide)).view(UINT[2 * w]), m)
        if mode == "hi" and w < 64:
            # (what a division by a constant becomes)
            if t.startswith("s"):
                p = a.view(SINT[w]).astype(np.int64) * b.view(SINT[w]).astype(np.int64)
                return self.set(d, (p >> np.int64(w)).view(np.uint64), m)
            p = a.astype(np.uint64) * b.astype(np.uint64)
            return self.set(d, p >> np.uint64(w), m)
        raise PtxError(ins.text)

    def _mul_x2(self, ins, parts, m):
        """mul.rn.f16x2 / mul.rn.bf16x2: each half's product is exact in float64 (at most 22
        significant bits), then rounded once to nearest even; NaN gives the canonical 0x7FFF."""
        t = parts[-1]
        if parts[1:] != ["rn", t]:
            raise PtxError(f"packed multiply not emulated: {ins.text}")
        d, a, b = ins.args
        a, b = np.asarray(self.val(a, 32)), np.asarray(self.val(b, 32))
        out = np.zeros(np.broadcast(a, b).shape, np.uint32)
        for shift in (0, 16):
            ha, hb = ((v >> np.uint32(shift)) & np.uint32(0xFFFF) for v in (a, b))
            if t == "f16x2":
                fa, fb = (h.astype(np.uint16).view(np.float16).astype(np.float64) for h in (ha, hb))
                # (numpy rounds float64 to float16 once, to nearest even, subnormals included)
                bits = (fa * fb).astype(np.float16).view(np.uint16).astype(np.uint32)
            else:
                fa, fb = (
                    (h << np.uint32(16)).view(np.float32).astype(np.float64) for h in (ha, hb)
                )
                prod = fa * fb
                f32 = prod.astype(np.float32)
                finite = np.isfinite(prod)
                if np.any(finite & (f32.astype(np.float64) != prod)):
                    raise PtxError(f"bf16x2 product not exact in float32: {ins.text}")
                wide = f32.view(np.uint32).astype(np.uint64)
                bits = ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(np.uint32)
                bits = np.where(np.isinf(f32), wide >> 16, bits).astype(np.uint32)
            nan = np.isnan(fa * fb)
            bits = np.where(nan, np.uint32(0x7FFF), bits).astype(np.uint32)
            out |= bits << np.uint32(shift)
        self.set(d, out, m)

    def op_not(self, ins, parts, m):
        if len(parts) != 2:
            raise PtxError(ins.text)
        d, a = ins.args
        if parts[1] == "pred":
            return self.set(d, ~np.asarray(self.val(a, 1), dtype=bool), m)
        self.set(d, ~np.asarray(self.val(a, WIDTH[parts[1]])), m)

    def op_mad(self, ins, parts, m):
        if parts[1] != "lo" or parts[-1] not in ("s32", "u32"):
            raise PtxError(ins.text)
        d, a, b, c = ins.args
        self.set(d, self.val(a, 32) * self.val(b, 32) + self.val(c, 32), m)

    def _minmax(self, ins, parts, m, is_max: bool):
        t = parts[-1]
        if t == "f32":
            if len(parts) != 2:
                raise PtxError(ins.text)
            a, b = self._fvals(ins.args[1:])
            r = np.fmax(a, b) if is_max else np.fmin(a, b)  # a NaN operand gives the other
            zeros = (a == 0) & (b == 0)  # -0 below +0
            sa, sb = np.signbit(a), np.signbit(b)
            zsign = (sa & sb) if is_max else (sa | sb)
            r = np.where(zeros, np.where(zsign, np.float32(-0.0), np.float32(0.0)), r)
            return self.set(ins.args[0], f32_bits(r), m)
        w = WIDTH[t]
        d, a, b = ins.args
        a, b = np.asarray(self.val(a, w)), np.asarray(self.val(b, w))
        if t.startswith("s"):
            a, b = a.view(SINT[w]), b.view(SINT[w])
        self.set(
            d,
            (np.maximum if is_max else np.minimum)(a, b).astype(SINT[w]).view(UINT[w])
            if t.startswith("s")
            else (np.maximum if is_max else np.minimum)(a, b),
            m,
        )

    def op_max(self, ins, parts, m):
        self._minmax(ins, parts, m, True)

    def op_min(self, ins, parts, m):
        self._minmax(ins, parts, m, False)

    def op_neg(self, ins, parts, m):
        if parts[1:] == ["s32"]:  # (two's complement: the negation mod 2^32)
            return self.set(ins.args[0], np.uint32(0) - np.asarray(self.val(ins.args[1], 32)), m)
        if parts[1:] != ["f32"]:
            raise PtxError(ins.text)
        (a,) = self._fvals(ins.args[1:])
        self.set(ins.args[0], f32_bits(-a), m)

    def op_abs(self, ins, parts, m):
        if parts[1:] != ["s32"]:
            raise PtxError(ins.text)
        a = np.asarray(self.val(ins.args[1], 32)).view(np.int32)
        self.set(ins.args[0], np.abs(a).view(np.uint32), m)

    def op_ex2(self, ins, parts, m):
        """ex2.approx.ftz.f32 modelled as 2^a rounded once (the hardware's is within 2 ulp):
        subnormal inputs and results flushed to zero."""
        if parts[1:] != ["approx", "ftz", "f32"]:
            raise PtxError(ins.text)
        (a,) = self._fvals(ins.args[1:])
        a = np.where(np.abs(a) < np.float32(2.0**-126), np.float32(0), a)
        r = np.exp2(a.astype(np.float64)).astype(np.float32)
        r = np.where(np.abs(r) < np.float32(2.0**-126), np.float32(0), r)
        self.set(ins.args[0], f32_bits(r), m)

    def op_fma(self, ins, parts, m):
        if parts[1:] == ["rm", "f32"]:
            a, b, c = self._fvals(ins.args[1:])
            return self.set(ins.args[0], f32_bits(fma_f32_rm(a, b, c)), m)
        self._float_mods(ins, parts, True)
        a, b, c = self._fvals(ins.args[1:])
        self.set(ins.args[0], f32_bits(fma_f32(a, b, c)), m)

    def op_div(self, ins, parts, m):
        if parts == ["div", "s32"]:  # (truncating toward zero, as C; a zero divisor raises)
            a, b = (np.asarray(self.val(v, 32)).view(np.int32) for v in ins.args[1:])
            if np.any(np.broadcast_to(b, (self.n,))[m] == 0):
                raise PtxError(f"division by zero: {ins.text}")
            quotient = np.trunc(a.astype(np.float64) / np.where(b == 0, 1, b))
            return self.set(ins.args[0], quotient.astype(np.int64).astype(np.uint32), m)
        self._float_mods(ins, parts, True)
        a, b = self._fvals(ins.args[1:])
        self.set(ins.args[0], f32_bits(a / b), m)  # numpy's float32 division: IEEE, to nearest

    def op_rcp(self, ins, parts, m):
        self._float_mods(ins, parts, True)
        (a,) = self._fvals(ins.args[1:])
        self.set(ins.args[0], f32_bits(np.float32(1.0) / a), m)

    def _logic(self, ins, parts, m, fn):
        if len(parts) != 2:
            raise PtxError(ins.text)
        d, a, b = ins.args
        w = 1 if parts[1] == "pred" else WIDTH[parts[1]]
        self.set(d, fn(self.val(a, w), self.val(b, w)), m)

    def op_and(self, ins, parts, m):
        self._logic(ins, parts, m, lambda a, b: a & b)

    def op_or(self, ins, parts, m):
        self._logic(ins, parts, m, lambda a, b: a | b)

    def op_xor(self, ins, parts, m):
        self._logic(ins, parts, m, lambda a, b: a ^ b)

    def _shift(self, ins, parts, m, left: bool):
        t = parts[-1]
        w = WIDTH[t]
        d, a, b = ins.args
        a = np.asarray(self.val(a, w))
        n = np.asarray(self.val(b, 32)).astype(np.int64)
        big = n >= w  # PTX clamps shift amounts at the width
        k = np.minimum(n, w - 1).astype(UINT[w])
        if left:
            r = np.where(big, UINT[w](0), a << k)
        elif t.startswith("s"):
            r = (a.view(SINT[w]) >> k.astype(SINT[w])).view(UINT[w])  # big: w - 1 is the fill
        else:
            r = np.where(big, UINT[w](0), a >> k)
        self.set(d, r, m)

    def op_shl(self, ins, parts, m):
        self._shift(ins, parts, m, True)

    def op_shr(self, ins, parts, m):
        self._shift(ins, parts, m, False)

    def op_shf(self, ins, parts, m):
        if parts[2:] != ["wrap", "b32"] and parts[2:] != ["clamp", "b32"]:
            raise PtxError(ins.text)
        d, a, b, c = ins.args
        lo = self.val(a, 32).astype(np.uint64)
        hi = self.val(b, 32).astype(np.uint64)
        n = self.val(c, 32).astype(np.uint64)
        n = n & np.uint64(31) if parts[2] == "wrap" else np.minimum(n, np.uint64(32))
        both = (hi << np.uint64(32)) | lo
        if parts[1] == "r":
            r = both >> n
        elif parts[1] == "l":
            r = (both << n) >> np.uint64(32)
        else:
            raise PtxError(ins.text)
        self.set(d, r & np.uint64(0xFFFFFFFF), m)

    def op_prmt(self, ins, parts, m):
        if parts[1:] != ["b32"]:
            raise PtxError(f"prmt mode not emulated: {ins.text}")
        d, a, b, c = ins.args
        both = (self.val(b, 32).astype(np.uint64) << np.uint64(32)) | self.val(a, 32)
        sel = np.asarray(self.val(c, 32)).astype(np.uint64)
        r = np.zeros(np.broadcast(both, sel).shape, np.uint64)
        for i in range(4):
            s = (sel >> np.uint64(4 * i)) & np.uint64(15)
            byte = (both >> ((s & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
            # selector bit 3: replicate the byte's sign bit
            byte = np.where(s & np.uint64(8), np.where(byte & np.uint64(0x80), 0xFF, 0), byte)
            r = r | (byte.astype(np.uint64) << np.uint64(8 * i))
        self.set(d, r, m)

    def op_setp(self, ins, parts, m):
        if len(parts) != 3 or len(ins.args) != 3 or "|" in ins.args[0]:
            raise PtxError(f"setp form not emulated: {ins.text}")
        cmp, t = parts[1], parts[2]
        d, a, b = ins.args
        if t == "f32":
            a, b = self._fvals([a, b])
            nan = np.isnan(a) | np.isnan(b)
            if cmp.endswith("u") and cmp[:-1] in _FLOAT_CMP:
                r = _FLOAT_CMP[cmp[:-1]](a, b) | nan
            elif cmp in _FLOAT_CMP:
                r = _FLOAT_CMP[cmp](a, b) & ~nan
            else:
                raise PtxError(ins.text)
        else:
            w = WIDTH[t]
            a, b = np.asarray(self.val(a, w)), np.asarray(self.val(b, w))
            if t.startswith("s"):
                a, b = a.view(SINT[w]), b.view(SINT[w])
            if cmp not in _INT_CMP or (t.startswith("b") and cmp not in ("eq", "ne")):
                raise PtxError(ins.text)
            r = _INT_CMP[cmp](a, b)
        self.set(d, r, m)

    def op_selp(self, ins, parts, m):
        d, a, b, c = ins.args
        w = WIDTH[parts[1]]
        self.set(d, np.where(self.val(c, 1), self.val(a, w), self.val(b, w)), m)

    def op_cvt(self, ins, parts, m):
        form = ".".join(parts[1:])
        args = ins.args
        if form == "f32.bf16":
            r = self.val(args[1], 16).astype(np.uint32) << np.uint32(16)
        elif form == "f32.f16":
            h = np.asarray(self.val(args[1], 16)).view(np.float16)
            r = f32_bits(h.astype(np.float32))
        elif form == "u32.u16":
            r = self.val(args[1], 16).astype(np.uint32)
        elif form == "u16.u32":
            r = self.val(args[1], 32).astype(np.uint16)
        elif form == "u64.u32":
            r = self.val(args[1], 32).astype(np.uint64)
        elif form == "sat.f32.f32":  # (clamped to [0, 1]; NaN to 0)
            (a,) = self._fvals(args[1:])
            r = f32_bits(np.where(np.isnan(a), np.float32(0), np.clip(a, 0, 1)))
        elif form == "rn.bf16.f32":
            (a,) = self._fvals(args[1:])
            r = bf16_bits_rn(np.broadcast_to(a, (self.n,)))
        elif form in ("rn.bf16x2.f32", "rn.f16x2.f32"):  # a into the high half, b the low
            hi, lo = (np.broadcast_to(f, (self.n,)) for f in self._fvals(args[1:]))
            if form == "rn.bf16x2.f32":
                hi, lo = bf16_bits_rn(hi), bf16_bits_rn(lo)
            else:
                hi, lo = (
                    hi.astype(np.float16).view(np.uint16),
                    lo.astype(np.float16).view(np.uint16),
                )
            r = (hi.astype(np.uint32) << np.uint32(16)) | lo.astype(np.uint32)
        elif form == "u32.u64":  # (the low word)
            r = self.val(args[1], 64).astype(np.uint32)
        elif form == "s64.s32":
            r = np.asarray(self.val(args[1], 32)).view(np.int32).astype(np.int64).view(np.uint64)
        elif form == "rn.satfinite.e4m3x2.f32":  # a in the high byte, b in the low one
            hi, lo = (e4m3_from_f32(np.broadcast_to(f, (self.n,))) for f in self._fvals(args[1:]))
            r = (hi.astype(np.uint16) << np.uint16(8)) | lo
        elif form == "rn.f16x2.e4m3x2":  # the low byte into the low half
            v = np.broadcast_to(self.val(args[1], 16), (self.n,))
            lo = f16_from_e4m3((v & 0xFF).astype(np.uint8)).astype(np.uint32)
            hi = f16_from_e4m3((v >> 8).astype(np.uint8)).astype(np.uint32)
            r = lo | (hi << np.uint32(16))
        else:
            raise PtxError(f"cvt form not emulated: {ins.text}")
        self.set(args[0], r, m)

    def _whole(self, m: np.ndarray, group: int, what: str) -> None:
        """Every thread of each group (warp, CTA) that has one at ``m`` is at it."""
        g = m.reshape(-1, group)
        if np.any(g.any(1) & ~g.all(1)):
            raise PtxError(f"{what} reached by part of a {group}-thread group only")

    def op_shfl(self, ins, parts, m):
        if parts[1] != "sync" or parts[-1] != "b32" or ins.guard is not None:
            raise PtxError(ins.text)
        d, a, b, c, mask = ins.args
        if int(mask, 0) % (1 << 32) != 0xFFFFFFFF or "|" in d:
            raise PtxError(f"shfl form not emulated: {ins.text}")
        self._whole(m, 32, "shfl.sync with a full member mask")
        lane = (self.tid % 32).astype(np.int64)
        bval = np.asarray(self.val(b, 32)).astype(np.int64) & 31
        cval = np.asarray(self.val(c, 32)).astype(np.int64)
        seg = (cval >> 8) & 31
        max_lane = (lane & seg) | (cval & 31 & ~seg)
        min_lane = lane & seg
        mode = parts[2]
        if mode == "bfly":
            j, ok = lane ^ bval, None
        elif mode == "down":
            j, ok = lane + bval, None
        elif mode == "up":
            j = lane - bval
            ok = j >= max_lane
        elif mode == "idx":
            j, ok = min_lane | (bval & ~seg), None
        else:
            raise PtxError(ins.text)
        ok = (j <= max_lane) if ok is None else ok
        j = np.where(ok, j, lane)
        src = np.arange(self.n) - lane + j
        self.set(d, np.broadcast_to(self.val(a, 32), (self.n,))[src], m)

    def op_vote(self, ins, parts, m):
        d, a, mask = ins.args
        if parts[1:] != ["sync", "ballot", "b32"] or int(mask, 0) % (1 << 32) != 0xFFFFFFFF:
            raise PtxError(f"vote form not emulated: {ins.text}")
        self._whole(m, 32, "vote.sync with a full member mask")
        bits = (np.broadcast_to(self.val(a, 1), (self.n,)) & m).reshape(-1, 32).astype(np.uint64)
        ballot = (bits << np.arange(32, dtype=np.uint64)).sum(1).astype(np.uint32)
        self.set(d, np.repeat(ballot, 32), m)

    def op_popc(self, ins, parts, m):
        if parts[1:] != ["b32"]:
            raise PtxError(ins.text)
        d, a = ins.args
        v = np.asarray(self.val(a, 32)).astype(np.uint32)
        count = np.unpackbits(v.reshape(-1, 1).view(np.uint8), axis=1).sum(1)
        self.set(d, count.reshape(v.shape).astype(np.uint32), m)

    def op_bar(self, ins, parts, m):
        if parts[1:] != ["sync"] or ins.args != ["0"] or ins.guard is not None:
            raise PtxError(ins.text)
        self._whole(m, self.threads, "bar.sync")
        self.smem_owner[np.unique(self.cta[m])] = FREE
        self.bars[np.unique(self.cta[m])] += 1

    def _race(self, ins, cta, off, m, atomic: bool, store: bool) -> None:
        """Raise on a shared access that no bar.sync orders after another thread's store since
        the last one (read or store after a store; atomics only after atomics); else record a
        store's owner."""
        me = np.broadcast_to(ATOMIC if atomic else self.tid[m].astype(np.int64)[:, None], off.shape)
        owner = self.smem_owner[cta, off]
        ok = (owner == FREE) | (owner == me) if not atomic else (owner == FREE) | (owner == ATOMIC)
        if store and not atomic:  # (two threads storing one byte in the same instruction)
            keys = (cta * self.smem.shape[1] + off).ravel()
            _, first = np.unique(keys, return_index=True)
            if first.size != keys.size:
                raise PtxError(f"shared race: threads store the same bytes at once: {ins.text}")
        if not ok.all():
            raise PtxError(f"shared race: no bar.sync since another thread stored: {ins.text}")
        if store:
            self.smem_owner[cta, off] = me

    def _global_race(self, ins, idx: np.ndarray, m: np.ndarray, store: bool) -> None:
        """Raise on a global access to bytes another thread stored in this launch, unless that
        thread is of this CTA and the CTA has passed a bar.sync since; else record a store."""
        if not self.global_races:
            return
        cta = self.cta[m][:, None]
        me = np.broadcast_to((self.cta[m] * self.threads + self.tid[m])[:, None], idx.shape)
        owner = self.gmem_owner[idx]
        ordered = (owner // self.threads == cta) & (self.gmem_epoch[idx] < self.bars[cta])
        if store and np.unique(idx).size != idx.size:
            raise PtxError(f"global race: threads store the same bytes at once: {ins.text}")
        if not ((owner == FREE) | (owner == me) | ordered).all():
            raise PtxError(f"global race: no bar.sync since another thread stored: {ins.text}")
        if store:
            self.gmem_owner[idx] = me
            self.gmem_epoch[idx] = np.broadcast_to(self.bars[cta], idx.shape)

    def _address(self, ref: str, m: np.ndarray, width: int):
        inner = ref[1:-1]
        base, _, off = inner.partition("+")
        return self.val(base, width)[m].astype(np.int64) + int(off or 0)

    def _vector(self, parts):
        vec = int(parts[2][1:]) if parts[2].startswith("v") else 1
        return vec, WIDTH[parts[-1]] // 8

    def op_ld(self, ins, parts, m):
        space = parts[1]
        dests, ref = ins.args
        dests = dests if isinstance(dests, list) else [dests]
        vec, size = self._vector(parts)
        if vec != len(dests):
            raise PtxError(ins.text)
        if space == "param":
            name, _, off = ref[1:-1].partition("+")
            for i, dst in enumerate(dests):
                at = f"{name}+{int(off or 0) + i * size}"
                self.set(dst, UINT[8 * size](self.params.load(at, size)), m)
            return
        if space == "global":
            addr = self._address(ref, m, 64)
            self._global_race(ins, self.gmem.indices(addr, vec * size), m, store=False)
            raw = self.gmem.load(addr, vec * size)
        elif space == "shared":
            cta, off = self._shared(ref, m, vec * size)
            if not self.smem_set[cta, off].all():
                raise PtxError(f"ld.shared of bytes never stored: {ins.text}")
            self._race(ins, cta, off, m, atomic=False, store=False)
            raw = self.smem[cta, off]
        else:
            raise PtxError(ins.text)
        words = np.ascontiguousarray(raw).view(UINT[8 * size])
        for i, dst in enumerate(dests):
            full = np.zeros(self.n, UINT[8 * size])
            full[m] = words[:, i]
            self.set(dst, full, m)

    def _shared(self, ref: str, m: np.ndarray, nbytes: int):
        off = self._address(ref, m, 32) - SHARED_BASE
        if np.any(off % nbytes) or np.any(off < 0) or np.any(off + nbytes > self.smem.shape[1]):
            raise PtxError(f"shared access misaligned or out of bounds at {off[:4]}")
        return self.cta[m][:, None], off[:, None] + np.arange(nbytes)

    def op_st(self, ins, parts, m):
        space = parts[1]
        ref, values = ins.args
        values = values if isinstance(values, list) else [values]
        vec, size = self._vector(parts)
        if vec != len(values):
            raise PtxError(ins.text)
        cols = [np.broadcast_to(self.val(v, 8 * size), (self.n,))[m] for v in values]
        data = np.ascontiguousarray(np.stack(cols, 1)).view(np.uint8)
        if space == "global":
            addr = self._address(ref, m, 64)
            self._global_race(ins, self.gmem.indices(addr, data.shape[1]), m, store=True)
            self.gmem.store(addr, data)
        elif space == "shared":
            cta, off = self._shared(ref, m, vec * size)
            self._race(ins, cta, off, m, atomic=False, store=True)
            self.smem[cta, off] = data
            self.smem_set[cta, off] = True
        else:
            raise PtxError(ins.text)

    def op_atom(self, ins, parts, m):
        """atom.shared[.cta].add.u32 / .s32: the active threads' adds applied one thread after
        another in thread order (one of the orders the hardware may take), each getting the
        value it found."""
        if parts[1] != "shared" or parts[-2] != "add" or parts[-1] not in ("u32", "s32"):
            raise PtxError(f"atomic not emulated: {ins.text}")
        dst, ref, value = ins.args
        cta, off = self._shared(ref, m, 4)
        self._race(ins, cta, off, m, atomic=True, store=True)
        adds = np.broadcast_to(self.val(value, 32), (self.n,))[m]
        old = np.zeros(self.n, np.uint32)
        found = old[m]
        for i, (c, o) in enumerate(zip(cta[:, 0], off, strict=True)):
            if not self.smem_set[c, o].all():
                raise PtxError(f"atom.shared on bytes never stored: {ins.text}")
            word = self.smem[c, o].view(np.uint32)
            found[i] = word[0]
            self.smem[c, o] = (word + adds[i]).view(np.uint8)
        old[m] = found
        self.set(dst, old, m)
