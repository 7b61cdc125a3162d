# SPDX-License-Identifier: BSD-3-Clause
"""Draw docs/sf_layout.png: where each FP4 scale factor lives in the 128x4 blocked layout.

The block-scaled tcgen05 MMA (and cuBLASLt, ``torch._scaled_mm``, torchao, FlashInfer) read
scale factors in 512-byte atoms: 128 rows x 4 scale columns.  Inside an atom, scale (r, c)
sits at byte ``(r % 32) * 16 + (r // 32) * 4 + c``; atoms are stored row-block-major (all atoms
of rows 0..127 left to right along K, then rows 128..255, ...), with rows padded to 128 and
scale columns padded to 4.

``tcgen05.cp.32x128b.warpx4`` then copies line i (16 bytes) of an atom to TMEM lane i of each of
the four 32-lane quadrants, 4 bytes per 32-bit column: lane L, column j holds the four scales of
row L % 32 + 32 j, so each lane finds its own row in column L // 32.  A K tile (K 256) holds
256 / V scale columns, i.e. 4 (NVFP4) or 2 (MXFP4) atoms per 128 rows; atom a of a 128-row tile
lands in TMEM columns 4a .. 4a + 3.  An N tile of 64 reads half an atom: the odd one of a pair
reads rows 64-127, two columns further on.

Every byte offset shown comes from ``sf_byte_offset`` and every TMEM position from
``tmem_positions``; tests/test_docs.py checks them against ``reference.to_blocked``, the DSL's
``tile_atom_to_shape_SF``, ``make_tmem_layout_sfa`` and ``make_tmem_layout_sfb`` layouts, and
the kernel's SFB column shift, and checks that each callout points at what its label says.

Doc tool only, not a project dependency (it is not in pyproject.toml).  To run it:

    pip install matplotlib
    python docs/draw_sf_layout.py            # writes docs/sf_layout.png
    python docs/draw_sf_layout.py out.png    # or anywhere else
"""

from __future__ import annotations

import sys
from pathlib import Path

ATOM_ROWS = 128  # rows of one atom (M of A, or N of B)
ATOM_COLS = 4  # scale columns of one atom (4 x sf_vec_size K elements)
ATOM_BYTES = ATOM_ROWS * ATOM_COLS  # 512
LANES = 32  # rows r and r + 32k share one 16-byte line

# The ragged example of the figure: 200 rows, K = 320 NVFP4 elements -> 20 scale columns.
EXAMPLE_ROWS = 200
EXAMPLE_K = 320
EXAMPLE_SF_VEC_SIZE = 16


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sf_byte_offset(r: int, c: int, n_cols: int) -> int:
    """Byte offset of scale factor (r, c) in the blocked layout of a [rows, n_cols] scale matrix.

    ``n_cols`` is the unpadded number of scale columns (K / sf_vec_size); the row count does not
    matter because atoms are row-block-major.
    """
    if r < 0 or c < 0 or c >= _ceil_div(n_cols, ATOM_COLS) * ATOM_COLS:
        raise ValueError(f"scale ({r}, {c}) is outside a matrix with {n_cols} scale columns")
    col_blocks = _ceil_div(n_cols, ATOM_COLS)
    atom = (r // ATOM_ROWS) * col_blocks + c // ATOM_COLS
    rr, cc = r % ATOM_ROWS, c % ATOM_COLS
    return atom * ATOM_BYTES + (rr % LANES) * 16 + (rr // LANES) * 4 + cc


def blocked_size(rows: int, n_cols: int) -> int:
    """Bytes of the padded blocked tensor (what ``to_blocked`` returns, in elements)."""
    return _ceil_div(rows, ATOM_ROWS) * _ceil_div(n_cols, ATOM_COLS) * ATOM_BYTES


def offset_table(rows: int, n_cols: int) -> list[list[int]]:
    """``sf_byte_offset`` for every (r, c) of the padded [rows, n_cols] scale matrix."""
    rp = _ceil_div(rows, ATOM_ROWS) * ATOM_ROWS
    cp = _ceil_div(n_cols, ATOM_COLS) * ATOM_COLS
    return [[sf_byte_offset(r, c, n_cols) for c in range(cp)] for r in range(rp)]


def tmem_positions(r: int, c: int, rows: int = ATOM_ROWS) -> list[tuple[int, int, int]]:
    """(lane, column, byte) of every TMEM copy of scale (r, c) of a tile's scales after tcgen05.cp.

    ``rows``: the tile's rows (a multiple of 128); c: any scale column of the K tile.  The copy
    moves 16-byte line r % 32 of an atom to lane r % 32 of each 32-lane quadrant (.warpx4), the
    line's bytes 4 j .. 4 j + 3 (row r % 32 + 32 j) to column j.  The atoms of scale columns
    4a .. 4a + 3 take columns a * rows / 32 onwards.  Columns relative to the tile's first.
    """
    if rows % ATOM_ROWS or not (0 <= r < rows and c >= 0):
        raise ValueError(f"scale ({r}, {c}) is outside a tile of {rows} rows")
    byte = sf_byte_offset(r % ATOM_ROWS, c % ATOM_COLS, ATOM_COLS)
    line, col_byte = divmod(byte, 16)
    column = (c // ATOM_COLS) * (rows // LANES) + (r // ATOM_ROWS) * ATOM_COLS + col_byte // 4
    return [(q * LANES + line, column, col_byte % 4) for q in range(ATOM_ROWS // LANES)]


# NOTE: an N tile of 64 reads 64 rows of a 128-row SFB atom; the odd tile of a pair starts at
# row 64, which tmem_positions puts two columns after row 0 (the kernel's SFB column shift).
N64_ODD_TILE_SHIFT = 2


def n64_tile_columns(tile: int, k_block: int) -> list[int]:
    """TMEM columns (of the shared 128-row SFB load) that N tile ``tile`` of 64 reads in k_block
    ``k_block`` (NVFP4: scale columns 4 k_block .. 4 k_block + 3)."""
    first_row = (tile % 2) * 64
    return sorted(
        {
            col
            for n in range(64)
            for c in range(4 * k_block, 4 * k_block + 4)
            for _, col, _ in tmem_positions(first_row + n, c)
        }
    )


# ------------------------------------------------------------------------------------------
# Drawing
# ------------------------------------------------------------------------------------------
GROUP_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759")  # r // 32 = 0, 1, 2, 3
LIGHT_COLORS = ("#c6d4e6", "#f9d8b8", "#cde4c8", "#f5c4c5")  # the same groups, pale
PAD_COLOR = "#d9d9d9"


def _draw_logical_atom(ax) -> None:
    """Panel 1: the 128 x 4 logical atom, coloured by row group, with sample offsets."""
    from matplotlib.patches import Rectangle

    for r in range(ATOM_ROWS):
        for c in range(ATOM_COLS):
            ax.add_patch(
                Rectangle(
                    (c, r), 1, 1, facecolor=GROUP_COLORS[r // LANES], edgecolor="white", lw=0.3
                )
            )
    for g in range(4):
        ax.text(
            2.0,
            g * LANES + LANES / 2,
            f"rows {g * LANES}-{g * LANES + LANES - 1}\nr // 32 = {g}",
            ha="center",
            va="center",
            color="white",
            fontsize=10,
            fontweight="bold",
        )
    # (row, y of its label): labels spread out so that neighbouring rows stay readable.
    samples = (
        (0, 1),
        (1, 8),
        (31, 25),
        (32, 37),
        (63, 56),
        (64, 69),
        (95, 89),
        (96, 102),
        (127, 125),
    )
    for r, y_text in samples:
        offs = [sf_byte_offset(r, c, ATOM_COLS) for c in range(ATOM_COLS)]
        ax.annotate(
            f"row {r:3d}: bytes {offs[0]}-{offs[-1]}",
            xy=(ATOM_COLS, r + 0.5),
            xytext=(ATOM_COLS + 0.7, y_text),
            va="center",
            fontsize=9,
            family="monospace",
            arrowprops={"arrowstyle": "-", "lw": 0.7, "color": "0.25"},
        )
    ax.set_xlim(0, ATOM_COLS + 5.2)
    ax.set_ylim(ATOM_ROWS, 0)
    ax.set_xticks([c + 0.5 for c in range(ATOM_COLS)], [f"c={c}" for c in range(ATOM_COLS)])
    ax.set_yticks([0, 32, 64, 96, 127])
    ax.set_ylabel("row r inside the atom (M of A / N of B)")
    ax.set_title("1. One atom, logical view:\n128 rows x 4 scale columns", fontsize=12)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_atom_bytes(ax) -> None:
    """Panel 2: the 512 bytes of one atom as 32 lines of 16 bytes; each 4-byte group is one row."""
    from matplotlib.patches import Rectangle

    owner: dict[int, tuple[int, int]] = {}
    for r in range(ATOM_ROWS):
        for c in range(ATOM_COLS):
            owner[sf_byte_offset(r, c, ATOM_COLS)] = (r, c)
    assert sorted(owner) == list(range(ATOM_BYTES)), "offsets must cover one atom exactly once"
    for byte, (r, c) in owner.items():
        line, col = divmod(byte, 16)
        ax.add_patch(
            Rectangle(
                (col, line), 1, 1, facecolor=LIGHT_COLORS[r // LANES], edgecolor="white", lw=0.8
            )
        )
        if c == 0:
            ax.text(col + 2, line + 0.5, f"row {r}", ha="center", va="center", fontsize=7.5)
    ax.set_xlim(0, 16)
    ax.set_ylim(LANES, 0)
    ax.set_xticks([i + 0.5 for i in range(16)], [f"c{i % 4}" for i in range(16)], fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(0, LANES, 4)], [str(i * 16) for i in range(0, LANES, 4)])
    ax.set_xlabel("byte in the 16-byte line = (r // 32) * 4 + c")
    ax.set_ylabel("line i starts at byte 16 i  (i = r % 32)")
    ax.set_title(
        "2. The atom in memory: 512 bytes\noffset(r, c) = (r % 32) * 16 + (r // 32) * 4 + c",
        fontsize=12,
        pad=20,
    )
    for g in range(4):
        ax.text(g * 4 + 2, -0.5, f"r // 32 = {g}", ha="center", va="bottom", fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


# Mid-quadrant lanes, away from the quadrant edges where a callout would be ambiguous.
TMEM_CALLOUT_LANES = (8, 40, 72, 104)


def _draw_tmem(ax) -> None:
    """Panel 3: the atom in TMEM after tcgen05.cp.32x128b.warpx4: 128 lanes x 4 columns."""
    from matplotlib.patches import Rectangle

    cell: dict[tuple[int, int], int] = {}
    for r in range(ATOM_ROWS):
        for lane, col, byte in tmem_positions(r, 0):
            assert byte == 0
            cell[(lane, col)] = r
    assert len(cell) == ATOM_ROWS * ATOM_COLS, "every lane and column holds one row's scales"
    for (lane, col), r in cell.items():
        own = lane == r
        face = GROUP_COLORS[r // LANES] if own else LIGHT_COLORS[r // LANES]
        ax.add_patch(Rectangle((col, lane), 1, 1, facecolor=face, edgecolor="white", lw=0.3))
    for q in range(4):
        ax.add_patch(Rectangle((q, q * LANES), 1, LANES, fill=False, edgecolor="black", lw=1.6))
        ax.text(
            q + 0.5,
            q * LANES + LANES / 2,
            f"rows\n{q * LANES}-{q * LANES + LANES - 1}",
            ha="center",
            va="center",
            color="white",
            fontsize=8.5,
            fontweight="bold",
        )
    for lane in TMEM_CALLOUT_LANES:
        # The lane is outlined so that the callout's target is visible at this scale.
        ax.add_patch(
            Rectangle((0, lane), ATOM_COLS, 1, fill=False, edgecolor="black", lw=1.2, zorder=3)
        )
        rows = ", ".join(str(cell[(lane, col)]) for col in range(ATOM_COLS))
        ax.annotate(
            f"lane {lane:3d}: rows {rows}",
            xy=(ATOM_COLS, lane + 0.5),
            xytext=(ATOM_COLS + 0.4, lane + 0.5),
            va="center",
            fontsize=8.5,
            family="monospace",
            arrowprops={"arrowstyle": "->", "lw": 0.8, "color": "0.1"},
        )
    ax.set_xlim(0, ATOM_COLS + 4.6)
    ax.set_ylim(ATOM_ROWS, 0)
    ax.set_xticks([c + 0.5 for c in range(ATOM_COLS)], [f"col {c}" for c in range(ATOM_COLS)])
    ax.set_yticks([0, 32, 64, 96, 127])
    ax.set_ylabel("TMEM lane (4 quadrants of 32)")
    ax.set_xlabel("32-bit column = 4 scales (c = 0..3)")
    ax.set_title(
        "3. In TMEM after tcgen05.cp.32x128b.warpx4:\n"
        "line i -> lane i of every quadrant (dark: lane = row)",
        fontsize=12,
        pad=14,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _tmem_image(cells: dict[tuple[int, int], int]):
    """RGB image of TMEM cells (lane, column) -> row held: dark where the lane is the row's own."""
    from matplotlib.colors import to_rgb

    n_cols = 1 + max(col for _, col in cells)
    image = [[(1.0, 1.0, 1.0)] * n_cols for _ in range(ATOM_ROWS)]
    for (lane, col), r in cells.items():
        colors = GROUP_COLORS if lane == r else LIGHT_COLORS
        image[lane][col] = to_rgb(colors[r // LANES])
    return image


def _tile_cells(n_scale_cols: int) -> dict[tuple[int, int], int]:
    """(lane, column) -> row, for every TMEM cell a 128-row tile's scales occupy."""
    cells = {}
    for r in range(ATOM_ROWS):
        for c in range(n_scale_cols):
            for lane, col, _ in tmem_positions(r, c):
                cells[(lane, col)] = r
    return cells


def cell_contents(lane: int, column: int, n_scale_cols: int) -> tuple[int, list[int]]:
    """(row, scale columns) that TMEM cell (lane, column) of a 128-row tile holds."""
    held = [
        (r, c)
        for r in range(ATOM_ROWS)
        for c in range(n_scale_cols)
        if any((ln, col) == (lane, column) for ln, col, _ in tmem_positions(r, c))
    ]
    return held[0][0], sorted(c for _, c in held)


def _tmem_callout(ax, lane: int, column: int, xytext, note: str = "") -> None:
    """A callout at TMEM cell (lane, column) of a 128-row tile's grid, naming what it holds."""
    from matplotlib.patches import Rectangle

    row, scales = cell_contents(lane, column, 256 // EXAMPLE_SF_VEC_SIZE)
    ax.add_patch(Rectangle((column, lane), 1, 1, fill=False, edgecolor="k", lw=1.5, zorder=4))
    ax.annotate(
        f"lane {lane}, column {column}: row {row}, scales {scales[0]}-{scales[-1]}{note}",
        xy=(column + 0.5, lane + 0.5),
        xytext=xytext,
        va="center",
        fontsize=9,
        family="monospace",
        bbox={"facecolor": "white", "edgecolor": "0.3", "pad": 2},
        arrowprops={"arrowstyle": "->", "lw": 1.0, "color": "black"},
        zorder=5,
    )


def _tmem_tile_axes(ax, title: str) -> int:
    """Draw a 128-row NVFP4 tile's 16 TMEM scale columns at x = 0 .. 16; return the count."""
    n_scale_cols = 256 // EXAMPLE_SF_VEC_SIZE
    image = _tmem_image(_tile_cells(n_scale_cols))
    n_cols = len(image[0])
    ax.imshow(image, extent=(0, n_cols, ATOM_ROWS, 0), aspect="auto", interpolation="none")
    ax.vlines(range(0, n_cols + 1, ATOM_COLS), 0, ATOM_ROWS, color="k", lw=2.0)
    ax.set_xlim(0, 36)
    ax.set_ylim(ATOM_ROWS, -24)
    ax.set_xticks([c + 0.5 for c in range(n_cols)], [str(c) for c in range(n_cols)], fontsize=8)
    ax.set_yticks([0, 32, 64, 96, 127])
    ax.set_xlabel("TMEM column (relative to the region's base)")
    ax.set_ylabel("TMEM lane")
    ax.set_title(title, fontsize=12)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    return n_cols


def _draw_k_tile(ax) -> None:
    """Panel 4: one K tile of NVFP4 SFA (128 rows x 16 scale columns = 4 atoms) in TMEM."""
    n_cols = _tmem_tile_axes(
        ax,
        "4. One K tile (K 256) of NVFP4 SFA, 128 rows:\n"
        "16 scale columns = 4 atoms -> 16 TMEM columns (dark: lane = row)",
    )
    for a in range(n_cols // ATOM_COLS):
        ax.text(
            4 * a + 2,
            -1,
            f"atom {a}\nscales {4 * a}-{4 * a + 3}\nk_block {a}",
            ha="center",
            va="bottom",
            fontsize=8.5,
        )
    _tmem_callout(ax, 70, 6, (18, 62))
    _tmem_callout(ax, 45, 13, (18, 40))
    ax.text(
        18,
        100,
        "tcgen05.cp copies each atom as in panel 3:\n"
        "atom a -> columns 4a .. 4a+3.\n"
        "cute.gemm of k_block b reads tCtSFA[(None, None, b)]:\n"
        "columns 4b .. 4b+3.\n"
        "MXFP4 (V 32): 8 scale columns = 2 atoms -> 8 columns;\n"
        "atom a serves k_blocks 2a and 2a+1.",
        fontsize=9.5,
        va="center",
    )


def _draw_n64(ax) -> None:
    """Panel 5: N tiles of 64 share one 128-row SFB load; the odd tile reads 2 columns further."""
    n_cols = _tmem_tile_axes(
        ax,
        "5. Tile N 64: one 128-row SFB load serves N tiles 2i and 2i+1;\n"
        f"the odd tile's base is {N64_ODD_TILE_SHIFT} columns further on",
    )
    colors = {0: "#1f3b73", 1: "#8c1c13"}
    for k_block in range(n_cols // ATOM_COLS):
        ax.text(4 * k_block + 2, -12, f"k_block {k_block}", ha="center", va="bottom", fontsize=9)
        for tile in (0, 1):
            cols = n64_tile_columns(tile, k_block)
            ax.plot([cols[0] + 0.1, cols[-1] + 0.9], [-2, -2], color=colors[tile], lw=3)
            ax.text(
                (cols[0] + cols[-1] + 1) / 2,
                -3,
                ("even", "odd")[tile],
                ha="center",
                va="bottom",
                fontsize=8.5,
                color=colors[tile],
            )
    _tmem_callout(ax, 16, 0, (18, 6), "\n  = even tile's row 16")
    _tmem_callout(ax, 16, 2, (18, 34), "\n  = odd tile's row 16")
    ax.text(
        18,
        92,
        "Tile 2i (rows 0-63 of the load) reads columns\n"
        "4b, 4b+1 of k_block b; tile 2i+1 (rows 64-127)\n"
        f"reads the same layout from base + {N64_ODD_TILE_SHIFT}:\n"
        "columns 4b+2, 4b+3 (sfb_tmem_column_shift).\n"
        "N 192: odd tiles also start 64 rows into an atom.",
        fontsize=9.5,
        va="center",
    )


def _draw_tiling(ax) -> None:
    """Panel 6: atoms tiling a ragged [200, 20] NVFP4 scale matrix (K = 320), with padding."""
    from matplotlib.patches import Rectangle

    rows, n_cols = EXAMPLE_ROWS, EXAMPLE_K // EXAMPLE_SF_VEC_SIZE
    row_blocks = _ceil_div(rows, ATOM_ROWS)
    col_blocks = _ceil_div(n_cols, ATOM_COLS)
    rp, cp = row_blocks * ATOM_ROWS, col_blocks * ATOM_COLS
    # Scale columns drawn 8 units wide so the atom labels fit; rows 1 unit high.
    cw = 8
    for r0 in range(0, rp, 8):
        for c in range(cp):
            padded = r0 >= rows or c >= n_cols
            face = PAD_COLOR if padded else GROUP_COLORS[(r0 % ATOM_ROWS) // LANES]
            ax.add_patch(
                Rectangle(
                    (c * cw, r0),
                    cw,
                    8,
                    facecolor=face,
                    edgecolor="white",
                    lw=0.3,
                    hatch="//" if padded else None,
                    alpha=0.55 if not padded else 1.0,
                )
            )
    for rb in range(row_blocks):
        for cb in range(col_blocks):
            base = sf_byte_offset(rb * ATOM_ROWS, cb * ATOM_COLS, n_cols)
            ax.add_patch(
                Rectangle(
                    (cb * ATOM_COLS * cw, rb * ATOM_ROWS),
                    ATOM_COLS * cw,
                    ATOM_ROWS,
                    fill=False,
                    edgecolor="black",
                    lw=2.0,
                )
            )
            ax.text(
                (cb * ATOM_COLS + 2) * cw,
                rb * ATOM_ROWS + 40,
                f"atom {base // ATOM_BYTES}\nbytes {base}-{base + ATOM_BYTES - 1}",
                ha="center",
                va="center",
                fontsize=10,
                fontweight="bold",
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 2},
            )
    ax.axhline(rows, color="black", lw=1.2, ls="--")
    ax.text(
        cp * cw + 1,
        rows,
        f" row {rows}: rows {rows}-{rp - 1}\n are zero padding",
        va="center",
        fontsize=9,
    )
    ax.set_xlim(0, cp * cw + 30)
    ax.set_ylim(rp, 0)
    ax.set_xticks(
        [(c + 0.5) * cw for c in range(cp)],
        [f"{c}\nk{c * EXAMPLE_SF_VEC_SIZE}" for c in range(cp)],
        fontsize=7,
    )
    ax.set_yticks([0, 32, 64, 96, 128, 160, 192, 200, 224, 255])
    ax.set_xlabel(
        f"scale column c (k = first of its {EXAMPLE_SF_VEC_SIZE} K elements);  "
        f"K = {EXAMPLE_K} -> {n_cols} scale columns"
    )
    ax.set_ylabel("row (M of A / N of B)")
    total = blocked_size(rows, n_cols)
    ax.set_title(
        f"6. Atoms tile the [{rows} x {n_cols}] NVFP4 scale matrix row-block-major: "
        f"{row_blocks} x {col_blocks} atoms = {total} bytes\n"
        "(offset of (r, c) = atom * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4, "
        "atom = (r // 128) * col_blocks + c // 4)",
        fontsize=12,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def make_figure():
    """The figure (tests/test_docs.py reads its callouts back); ``draw`` saves it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(20, 26), dpi=100)
    grid = fig.add_gridspec(3, 6, height_ratios=(1.05, 1, 1), hspace=0.34, wspace=0.5)
    _draw_logical_atom(fig.add_subplot(grid[0, 0:2]))
    _draw_atom_bytes(fig.add_subplot(grid[0, 2:4]))
    _draw_tmem(fig.add_subplot(grid[0, 4:6]))
    _draw_k_tile(fig.add_subplot(grid[1, 0:3]))
    _draw_n64(fig.add_subplot(grid[1, 3:6]))
    _draw_tiling(fig.add_subplot(grid[2, :]))
    fig.subplots_adjust(top=0.94)
    fig.suptitle(
        "FP4 scale factors (SFA / SFB) in the tcgen05 128x4 blocked layout "
        "(same bytes as torch._scaled_mm / cuBLASLt / reference.to_blocked)",
        fontsize=14,
        y=0.975,
    )
    return fig


def draw(path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = make_figure()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sf_layout.png")
    print(f"wrote {draw(out)}")
