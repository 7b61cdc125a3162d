# SPDX-License-Identifier: BSD-3-Clause
"""FP4 rows grouped by expert -> the Blackwell grouped kernel's tile-padded layout, one launch:

    offsets [G + 1] int32      group g's rows: offsets[g] .. offsets[g + 1] - 1
    codes [rows, K/2], scales  packed FP4 rows and their blocked scales (``fp4_ops.layout``)
 -> codes_out [tiles * TILE_M, K/2], scales_out (blocked over those rows)
    tile_group [tiles] int32   the group of each tile (the last group past num_m_tiles)
    num_m_tiles [1] int32      the tiles in use
    row_map [rows] int32       the padded row of each row: D's rows are gathered back through it

Group g takes ceil(count_g / TILE_M) tiles after those of groups 0 .. g - 1 and fills them with
its rows in order; the rest of its last tile is zero codes and zero scales, so every row the
grouped kernel reads is initialised and its padding rows of D are zero. ``tiles`` is the host's
bound for every routing of ``rows`` rows (ceil(rows / TILE_M) + min(G, rows) - 1), so the
buffers are sized without a host sync; tiles past num_m_tiles are not written (the grouped
kernel does not read them) but for tile_group.

Each CTA copies a few rows of one tile (``moe_kernels.pad_rows_per_cta``: as many as keep each
thread's codes within one unrolled batch of loads, so that a copy costs one round trip). It stages
the offsets in shared memory (one coalesced pass), then warp 0 finds the tile's group: each
lane sums the tiles of cap / 32 groups, a shuffle scan gives each lane its first tile, and the
lane whose range holds the tile walks its groups. Every CTA repeats that (G + 1 words from L2),
which is cheaper than a second launch or a grid-wide barrier. Offsets that break the op's
contract (its device asserts report them) cannot make the kernel write outside its buffers:
every store is bounded by the grid and by the source row's range.
"""

from __future__ import annotations

from enum import IntEnum

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from fp4_ops.sm90.gemm import SF_ATOM_COLS, SF_ATOM_ROWS, blocked_sf_word

THREADS = 128
WARP = 32
LOG_WARP = 5
WORDS = 4  # 32-bit words of a 16-byte vector (32 codes)
CODES_PER_VECTOR = 32
COPY_UNROLL = 8  # 16-byte vectors a thread loads before it stores them


class Slot(IntEnum):
    """What warp 0 leaves in shared memory for the CTA's tile."""

    FIRST = 0  # the source row of the tile's first row
    END = 1  # one past the group's last source row
    IN_USE = 2  # 1 if the tile is below num_m_tiles


class MoePaddedRows:
    """(offsets, codes, scales) -> the tile-padded layout; see the module docstring."""

    def __init__(self, tile_m: int, groups_cap: int, rows_per_cta: int):
        self.tile_m = tile_m
        # (a power of two > G, at least a warp: each lane sums cap / 32 groups)
        self.groups_cap = groups_cap
        # (a power of two <= 32: a CTA's rows share one lane group of a scale atom)
        self.rows_per_cta = rows_per_cta
        self._setup_attributes()

    def _setup_attributes(self):
        self.ctas_per_tile = self.tile_m // self.rows_per_cta
        self.groups_per_lane = self.groups_cap // WARP

    @cute.jit
    def __call__(
        self,
        offsets_ptr: cute.Pointer,
        codes_ptr: cute.Pointer,
        scale_ptr: cute.Pointer,
        codes_out_ptr: cute.Pointer,
        scale_out_ptr: cute.Pointer,
        tile_group_ptr: cute.Pointer,
        num_m_tiles_ptr: cute.Pointer,
        row_map_ptr: cute.Pointer,
        problem: tuple[Int32, Int32, Int32, Int32, Int32],
        stream,
    ):
        groups, rows, k, atoms_k, tiles = problem
        k = cute.assume(k, divby=CODES_PER_VECTOR)
        vectors = k // CODES_PER_VECTOR
        padded = tiles * self.tile_m

        def codes(ptr, n):  # (row, vector, word)
            layout = cute.make_layout((n, vectors, WORDS), stride=(vectors * WORDS, WORDS, 1))
            return cute.make_tensor(ptr, layout)

        def scale_words(ptr, n):  # every 32-bit word of n rows' blocked scales
            row_blocks = (n + SF_ATOM_ROWS - 1) // SF_ATOM_ROWS
            words = row_blocks * atoms_k * (SF_ATOM_ROWS * SF_ATOM_COLS // WORDS)
            return cute.make_tensor(ptr, cute.make_layout(words))

        tensors = (
            cute.make_tensor(offsets_ptr, cute.make_layout(groups + 1)),
            codes(codes_ptr, rows),
            scale_words(scale_ptr, rows),
            codes(codes_out_ptr, padded),
            scale_words(scale_out_ptr, padded),
            cute.make_tensor(tile_group_ptr, cute.make_layout(tiles)),
            cute.make_tensor(num_m_tiles_ptr, cute.make_layout(1)),
            cute.make_tensor(row_map_ptr, cute.make_layout(rows)),
        )
        self.kernel(*tensors, groups, atoms_k).launch(
            grid=(tiles * self.ctas_per_tile, 1, 1), block=(THREADS, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mOffsets: cute.Tensor,
        mCodes: cute.Tensor,
        mScale: cute.Tensor,
        mCodesOut: cute.Tensor,
        mScaleOut: cute.Tensor,
        mTileGroup: cute.Tensor,
        mNumMTiles: cute.Tensor,
        mRowMap: cute.Tensor,
        groups: Int32,
        atoms_k: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        tile = bidx // self.ctas_per_tile
        part = bidx - tile * self.ctas_per_tile
        smem = cutlass.memory.SmemAllocator()
        sTile = smem.allocate_tensor(Int32, cute.make_layout(len(Slot)), byte_alignment=16)
        # (the offsets once, coalesced: the scan and the walk then read shared memory)
        sOffsets = smem.allocate_tensor(Int32, cute.make_layout(self.groups_cap + 1))
        for g in cutlass.range(tidx, groups + 1, THREADS):
            sOffsets[g] = mOffsets[g]
        cute.arch.sync_threads()
        if tidx < WARP:
            self._find_group(sOffsets, sTile, mTileGroup, mNumMTiles, groups, tile, part)
        cute.arch.sync_threads()
        if sTile[Slot.IN_USE] != 0:
            # (source rows first .. first + rows_per_cta - 1 that lie below the group's end
            # and the row count are copied to padded rows out_row ..)
            first = sTile[Slot.FIRST] + part * self.rows_per_cta
            end = cutlass.min(sTile[Slot.END], cute.size(mCodes.shape[0]))
            span = (first, end, tile * self.tile_m + part * self.rows_per_cta)
            self._copy_codes(mCodes, mCodesOut, mRowMap, span)
            self._copy_scales(mScale, mScaleOut, atoms_k, span)

    @cute.jit
    def _tiles_of(self, sOffsets: cute.Tensor, g: Int32, groups: Int32) -> Int32:
        """Group g's tiles (0 for g >= G, and for offsets that fall)."""
        count = Int32(0)
        if g < groups:
            count = cutlass.max(sOffsets[g + 1] - sOffsets[g], Int32(0))
        return (count + (self.tile_m - 1)) // self.tile_m

    @cute.jit
    def _find_group(
        self,
        sOffsets: cute.Tensor,
        sTile: cute.Tensor,
        mTileGroup: cute.Tensor,
        mNumMTiles: cute.Tensor,
        groups: Int32,
        tile: Int32,
        part: Int32,
    ):
        """Warp 0: the tile's first source row, its group's end and whether it is in use into
        sTile; the first CTA of each tile writes tile_group, the grid's first num_m_tiles."""
        lane = cute.arch.lane_idx()
        first_group = lane * self.groups_per_lane
        own = Int32(0)
        for j in cutlass.range(self.groups_per_lane, unroll=4):
            own += self._tiles_of(sOffsets, first_group + j, groups)
        inclusive = own
        for step in cutlass.range_constexpr(LOG_WARP):
            below = cute.arch.shuffle_sync_up(inclusive, offset=1 << step)
            if lane >= (1 << step):
                inclusive += below
        total = cute.arch.shuffle_sync(inclusive, WARP - 1)
        start = inclusive - own
        if start <= tile and tile < inclusive:
            # (the one lane whose groups hold the tile)
            tile_start = start
            for j in cutlass.range(self.groups_per_lane, unroll=4):
                g = first_group + j
                n = self._tiles_of(sOffsets, g, groups)
                if tile_start <= tile and tile < tile_start + n:
                    sTile[Slot.FIRST] = sOffsets[g] + (tile - tile_start) * self.tile_m
                    sTile[Slot.END] = sOffsets[g + 1]
                    sTile[Slot.IN_USE] = Int32(1)
                    if part == 0:
                        mTileGroup[tile] = g
                tile_start += n
        if lane == 0:
            if tile >= total:
                # (past the tiles in use: not read by the grouped kernel, named the last group)
                sTile[Slot.IN_USE] = Int32(0)
                if part == 0:
                    mTileGroup[tile] = groups - 1
            if tile == 0 and part == 0:
                mNumMTiles[0] = total

    @cute.jit
    def _copy_codes(self, mCodes: cute.Tensor, mCodesOut: cute.Tensor, mRowMap, span: tuple):
        """The CTA's rows of codes in 16-byte vectors, zeros past the group's rows: each thread
        loads COPY_UNROLL vectors, then stores them (loads after a store could not be moved
        ahead of it: the buffers may alias, as far as the compiler knows). Each row's padded
        row into row_map."""
        tidx, _, _ = cute.arch.thread_idx()
        first, end, out_row = span
        vectors = cute.size(mCodes.shape[1])
        total = self.rows_per_cta * vectors
        rVecs = cute.make_rmem_tensor((WORDS, COPY_UNROLL), Uint32)
        for base in cutlass.range(tidx, total, THREADS * COPY_UNROLL):
            rVecs.fill(Uint32(0))
            for u in cutlass.range_constexpr(COPY_UNROLL):
                i = base + u * THREADS
                r = i // vectors
                s = first + r
                if (i < total) & (s >= 0) & (s < end):
                    cute.autovec_copy(mCodes[s, i - r * vectors, None], rVecs[None, u])
            for u in cutlass.range_constexpr(COPY_UNROLL):
                i = base + u * THREADS
                r = i // vectors
                if i < total:
                    cute.autovec_copy(rVecs[None, u], mCodesOut[out_row + r, i - r * vectors, None])
        if tidx < self.rows_per_cta:
            s = first + tidx
            if (s >= 0) & (s < end):
                mRowMap[s] = out_row + tidx

    @cute.jit
    def _copy_scales(self, mScale: cute.Tensor, mScaleOut: cute.Tensor, atoms_k, span: tuple):
        """The CTA's rows of scales: one 32-bit word (4 columns) per row and atom, rows fastest
        (consecutive threads write 16-byte steps of one atom), zeros past the group; loads in
        batches before their stores, as the codes'."""
        tidx, _, _ = cute.arch.thread_idx()
        first, end, out_row = span
        rows = self.rows_per_cta
        total = rows * atoms_k
        rWords = cute.make_rmem_tensor(COPY_UNROLL, Uint32)
        for base in cutlass.range(tidx, total, THREADS * COPY_UNROLL):
            rWords.fill(Uint32(0))
            for u in cutlass.range_constexpr(COPY_UNROLL):
                i = base + u * THREADS
                j = i // rows
                s = first + i - j * rows
                if (i < total) & (s >= 0) & (s < end):
                    rWords[u] = Uint32(mScale[self._word(s, j, atoms_k)])
            for u in cutlass.range_constexpr(COPY_UNROLL):
                i = base + u * THREADS
                j = i // rows
                if i < total:
                    mScaleOut[self._word(out_row + i - j * rows, j, atoms_k)] = rWords[u]

    @cute.jit
    def _word(self, row: Int32, atom_col: Int32, atoms_k: Int32) -> Uint32:
        """Index of the 32-bit word holding ``row``'s 4 scales of atom column ``atom_col``
        (unsigned: the atom's % and // by powers of two are single AND / shift)."""
        col0 = Uint32(atom_col * SF_ATOM_COLS)
        return blocked_sf_word(0, Uint32(row), col0, 0, Uint32(atoms_k)) // Uint32(WORDS)


def compile_padded_rows(tile_m: int, groups_cap: int, rows: int, options: str = ""):
    """Compile for any G < ``groups_cap``, rows and K (a multiple of 32), ``rows`` rows a CTA;
    returns the executor.
    ``options="--gpu-arch sm_100a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    if tile_m % SF_ATOM_ROWS:
        raise ValueError(f"tile_m must be a multiple of {SF_ATOM_ROWS}, got {tile_m}")
    op = MoePaddedRows(tile_m, groups_cap, rows)
    gmem = cute.AddressSpace.gmem
    ptrs = [make_ptr(Int32, 0, gmem, assumed_align=4)]
    ptrs += [
        make_ptr(Uint32, 0, gmem, assumed_align=16),
        make_ptr(Uint32, 0, gmem, assumed_align=4),
    ]
    ptrs += [
        make_ptr(Uint32, 0, gmem, assumed_align=16),
        make_ptr(Uint32, 0, gmem, assumed_align=4),
    ]
    ptrs += [make_ptr(Int32, 0, gmem, assumed_align=4) for _ in range(3)]
    problem = (Int32(1), Int32(1), Int32(32), Int32(1), Int32(1))
    return cute.compile(op, *ptrs, problem, cuda_driver.CUstream(0), options=options)
