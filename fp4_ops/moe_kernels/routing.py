# SPDX-License-Identifier: BSD-3-Clause
"""MoE routing in one CTA: topk_ids [T, k] -> the grouped GEMMs' row order.

For the P = T * k (token, slot) pairs, pair p = t * k + s with expert e = topk_ids[t, s]:

    offsets [E + 1] int32   rows of expert e: offsets[e] .. offsets[e + 1] - 1
    row_of  [P] int32       the row of pair p
    token_of [P] int32      the token whose x fills row r (x.index_select(0, token_of))
    expert_of [P] int32     the expert of row r (its biases' row)
    ok [1] int32            1 if every id lies in [0, E), else 0 (a device assert reads it)
    rows [P, H]             (``x_dtype`` given) x[token_of[r]] for each row r: the first GEMM's
                            operand, gathered here for decode-sized x instead of by a kernel

Three passes over the ids, with the counts in shared memory: count the pairs per expert
(shared atomics), scan the counts into offsets (warp 0), place each pair at its expert's next
free row (shared atomics again). Rows within an expert come in the order the atomics happen
to run; each row's result depends only on its token and expert, so every output of the MoE
layer is the same whatever that order. A pair with an id out of range gets a row past
offsets[E] (no GEMM computes it) and expert 0, so that nothing downstream reads out of bounds
before the assert on ``ok`` fires.

One CTA: decode routes tens to hundreds of pairs, and one CTA needs no grid-wide
synchronization between its passes. The gather, after a fourth barrier, moves 16-byte vectors,
each thread several at once; it is meant for decode's few tens of KB of rows (the host's
``GATHER_BYTES``): one CTA copying much more would outlast the grid-wide copy it replaces.
"""

from __future__ import annotations

from enum import IntEnum

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from fp4_ops.moe_kernels.dtypes import DTYPES

THREADS = 512
WARP = 32
LOG_WARP = 5
IDS_DTYPES = {"Int32": Int32, "Int64": Int64}
VEC_BYTES = 16
GATHER_UNROLL = 4


class Misc(IntEnum):
    """The routing kernel's shared counters beside the per-expert counts."""

    INVALID = 0  # pairs whose id lies out of range
    INVALID_PLACED = 1  # rows past offsets[E] handed to them so far
    VALID = 2  # pairs with an id in range: offsets[E]


class MoeRouting:
    """topk_ids -> (offsets, row_of, token_of, expert_of, ok); see the module docstring."""

    def __init__(self, ids_dtype: str, experts_cap: int, x_dtype: str | None = None):
        self.ids_dtype = IDS_DTYPES[ids_dtype]
        # (a power of two > E, at least a warp: the scan gives each lane cap / 32 counts)
        self.experts_cap = experts_cap
        self.x_dtype = None if x_dtype is None else DTYPES[x_dtype]
        self._setup_attributes()

    def _setup_attributes(self):
        self.counts_per_lane = self.experts_cap // WARP
        self.gather = self.x_dtype is not None
        self.vec = 0 if not self.gather else VEC_BYTES * 8 // self.x_dtype.width

    @cute.jit
    def __call__(
        self,
        ids_ptr: cute.Pointer,
        offsets_ptr: cute.Pointer,
        row_of_ptr: cute.Pointer,
        token_of_ptr: cute.Pointer,
        expert_of_ptr: cute.Pointer,
        ok_ptr: cute.Pointer,
        x_ptr: cute.Pointer,
        rows_ptr: cute.Pointer,
        problem: tuple[Int32, Int32, Int32, Int32],
        stream,
    ):
        pairs, top_k, experts, hidden = problem
        mIds = cute.make_tensor(ids_ptr, cute.make_layout(pairs))
        mOffsets = cute.make_tensor(offsets_ptr, cute.make_layout(experts + 1))
        mRowOf = cute.make_tensor(row_of_ptr, cute.make_layout(pairs))
        mTokenOf = cute.make_tensor(token_of_ptr, cute.make_layout(pairs))
        mExpertOf = cute.make_tensor(expert_of_ptr, cute.make_layout(pairs))
        mOk = cute.make_tensor(ok_ptr, cute.make_layout(1))
        gathered = ()
        if const_expr(self.gather):
            # (row, vector, element): x [T, H] and rows [P, H], H a multiple of the vector
            hidden = cute.assume(hidden, divby=self.vec)
            row_vectors = (hidden // self.vec, self.vec)
            vectors = cute.make_layout(row_vectors, stride=(self.vec, 1))
            tokens = pairs // top_k
            gathered = tuple(
                cute.make_tensor(
                    ptr, cute.make_layout((n, *row_vectors), stride=(hidden, *vectors.stride))
                )
                for ptr, n in ((x_ptr, tokens), (rows_ptr, pairs))
            )
        args = (mIds, mOffsets, mRowOf, mTokenOf, mExpertOf, mOk, top_k, experts, gathered)
        self.kernel(*args).launch(grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(
        self,
        mIds: cute.Tensor,
        mOffsets: cute.Tensor,
        mRowOf: cute.Tensor,
        mTokenOf: cute.Tensor,
        mExpertOf: cute.Tensor,
        mOk: cute.Tensor,
        top_k: Int32,
        experts: Int32,
        gathered: tuple,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        sCount = smem.allocate_tensor(Int32, cute.make_layout(self.experts_cap), byte_alignment=16)
        sMisc = smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16)
        for e in range(tidx, self.experts_cap, THREADS):
            sCount[e] = Int32(0)
        if tidx < 4:
            sMisc[tidx] = Int32(0)
        cute.arch.sync_threads()
        self._count(mIds, sCount, sMisc, experts)
        cute.arch.sync_threads()
        if tidx < WARP:
            self._scan(sCount, sMisc, mOffsets, mOk, experts)
        cute.arch.sync_threads()
        self._place(mIds, mRowOf, mTokenOf, mExpertOf, sCount, sMisc, top_k, experts)
        if const_expr(self.gather):
            # (every row's token is written)
            cute.arch.sync_threads()
            self._gather(*gathered, mTokenOf)

    @cute.jit
    def _expert(self, mIds: cute.Tensor, p: Int32, experts: Int32):
        """(pair p's expert as Int32, whether its id lies in [0, experts))."""
        raw = mIds[p]
        valid = (raw >= self.ids_dtype(0)) & (raw < self.ids_dtype(experts))
        return Int32(raw), valid

    @cute.jit
    def _count(self, mIds: cute.Tensor, sCount: cute.Tensor, sMisc: cute.Tensor, experts: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        for p in range(tidx, cute.size(mIds), THREADS):
            e, valid = self._expert(mIds, p, experts)
            if valid:
                cute.arch.atomic_add(sCount.iterator + e, Int32(1), scope="cta")
            else:
                cute.arch.atomic_add(sMisc.iterator + Misc.INVALID, Int32(1), scope="cta")

    @cute.jit
    def _scan(
        self,
        sCount: cute.Tensor,
        sMisc: cute.Tensor,
        mOffsets: cute.Tensor,
        mOk: cute.Tensor,
        experts: Int32,
    ):
        """Warp 0: counts -> exclusive prefix sums in sCount (each expert's next free row) and
        in mOffsets[0 .. E]; the valid pairs' count into sMisc; mOk."""
        lane = cute.arch.lane_idx()
        first = lane * self.counts_per_lane
        own = Int32(0)
        for j in cutlass.range(self.counts_per_lane, unroll=4):
            own += sCount[first + j]
        inclusive = own
        for step in cutlass.range_constexpr(LOG_WARP):
            below = cute.arch.shuffle_sync_up(inclusive, offset=1 << step)
            if lane >= (1 << step):
                inclusive += below
        start = inclusive - own
        for j in cutlass.range(self.counts_per_lane, unroll=4):
            e = first + j
            count = sCount[e]
            sCount[e] = start
            # (counts past E are zero: offsets[E] is the valid pairs' count)
            if e <= experts:
                mOffsets[e] = start
            start += count
        if lane == WARP - 1:
            sMisc[Misc.VALID] = inclusive
            mOk[0] = Int32(sMisc[Misc.INVALID] == 0)

    @cute.jit
    def _place(
        self,
        mIds: cute.Tensor,
        mRowOf: cute.Tensor,
        mTokenOf: cute.Tensor,
        mExpertOf: cute.Tensor,
        sCount: cute.Tensor,
        sMisc: cute.Tensor,
        top_k: Int32,
        experts: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        for p in range(tidx, cute.size(mIds), THREADS):
            e, valid = self._expert(mIds, p, experts)
            row = Int32(0)
            if valid:
                row = cute.arch.atomic_add(sCount.iterator + e, Int32(1), scope="cta")
            else:
                placed = sMisc.iterator + Misc.INVALID_PLACED
                row = sMisc[Misc.VALID] + cute.arch.atomic_add(placed, Int32(1), scope="cta")
                e = Int32(0)
            mRowOf[p] = row
            mTokenOf[row] = p // top_k
            mExpertOf[row] = e

    @cute.jit
    def _gather(self, mX: cute.Tensor, mRows: cute.Tensor, mTokenOf: cute.Tensor):
        """rows[r] = x[token_of[r]], 16-byte vectors over the whole CTA."""
        tidx, _, _ = cute.arch.thread_idx()
        per_row = cute.size(mRows.shape[1])
        rVec = cute.make_rmem_tensor(self.vec, self.x_dtype)
        for i in cutlass.range(tidx, cute.size(mTokenOf) * per_row, THREADS, unroll=GATHER_UNROLL):
            r = i // per_row
            c = i - r * per_row
            cute.autovec_copy(mX[mTokenOf[r], c, None], rVec)
            cute.autovec_copy(rVec, mRows[r, c, None])


def compile_routing(ids_dtype: str, cap: int, options: str = "", x_dtype: str | None = None):
    """Compile for any T, k, H and E < ``cap`` (runtime extents); ``x_dtype`` given: the
    variant that also gathers the rows. Returns the executor.
    ``options="--gpu-arch sm_90a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    op = MoeRouting(ids_dtype, cap, x_dtype)
    gmem = cute.AddressSpace.gmem
    ids_type = IDS_DTYPES[ids_dtype]
    x_type = DTYPES[x_dtype or "Float32"]
    ptrs = [make_ptr(ids_type, 0, gmem, assumed_align=ids_type.width // 8)]
    ptrs += [make_ptr(Int32, 0, gmem, assumed_align=4) for _ in range(5)]
    ptrs += [make_ptr(x_type, 0, gmem, assumed_align=VEC_BYTES) for _ in range(2)]
    problem = (Int32(1), Int32(1), Int32(1), Int32(64))
    return cute.compile(op, *ptrs, problem, cuda_driver.CUstream(0), options=options)
