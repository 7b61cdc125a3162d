# SPDX-License-Identifier: BSD-3-Clause
"""Draw docs/sf_layout.png: where each FP4 scale factor lives in the 128x4 blocked layout.

The block-scaled tcgen05 MMA (and cuBLASLt, ``torch._scaled_mm``, torchao, FlashInfer) read
scale factors in 512-byte atoms: 128 rows x 4 scale columns.  Inside an atom, scale (r, c)
sits at byte ``(r % 32) * 16 + (r // 32) * 4 + c``; atoms are stored row-block-major (all atoms
of rows 0..127 left to right along K, then rows 128..255, ...), with rows padded to 128 and
scale columns padded to 4.

``tcgen05.cp.32x128b.warpx4`` then copies line i (16 bytes) of an atom to TMEM lane i of each of
the four 32-lane quadrants, 4 bytes per 32-bit column: lane L, column j holds the four scales of
row L % 32 + 32 j, so each lane finds its own row in column L // 32.

Every byte offset shown comes from ``sf_byte_offset`` and every TMEM position from
``tmem_positions``; tests/test_docs.py checks them against ``reference.to_blocked`` and the DSL's
``tile_atom_to_shape_SF`` and ``make_tmem_layout_sfa`` layouts.

Doc tool only, not a project dependency (it is not in requirements.txt).  To run it:

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


def tmem_positions(r: int, c: int) -> list[tuple[int, int, int]]:
    """(lane, column, byte) of every TMEM copy of scale (r, c) of an atom after tcgen05.cp.

    The copy moves 16-byte line r % 32 to lane r % 32 of each 32-lane quadrant (.warpx4), the
    line's bytes 4 j .. 4 j + 3 (row r % 32 + 32 j) to column j.  Columns relative to the atom's.
    """
    if not (0 <= r < ATOM_ROWS and 0 <= c < ATOM_COLS):
        raise ValueError(f"scale ({r}, {c}) is outside a 128 x 4 atom")
    byte = sf_byte_offset(r, c, ATOM_COLS)
    line, col_byte = divmod(byte, 16)
    return [(q * LANES + line, col_byte // 4, col_byte % 4) for q in range(ATOM_ROWS // LANES)]


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
    for lane in (1, 33, 65, 97):
        rows = ", ".join(str(cell[(lane, col)]) for col in range(ATOM_COLS))
        ax.annotate(
            f"lane {lane:3d}: rows {rows}",
            xy=(ATOM_COLS, lane + 0.5),
            xytext=(ATOM_COLS + 0.4, lane + 8),
            va="center",
            fontsize=8.5,
            family="monospace",
            arrowprops={"arrowstyle": "-", "lw": 0.7, "color": "0.25"},
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


def _draw_tiling(ax) -> None:
    """Panel 3: atoms tiling a ragged [200, 20] NVFP4 scale matrix (K = 320), with padding."""
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
        f"4. Atoms tile the [{rows} x {n_cols}] NVFP4 scale matrix row-block-major: "
        f"{row_blocks} x {col_blocks} atoms = {total} bytes\n"
        "(offset of (r, c) = atom * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4, "
        "atom = (r // 128) * col_blocks + c // 4)",
        fontsize=12,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def draw(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(20, 17), dpi=100)
    grid = fig.add_gridspec(
        2, 3, width_ratios=(1, 1.6, 1.2), height_ratios=(1.05, 1), hspace=0.3, wspace=0.32
    )
    _draw_logical_atom(fig.add_subplot(grid[0, 0]))
    _draw_atom_bytes(fig.add_subplot(grid[0, 1]))
    _draw_tmem(fig.add_subplot(grid[0, 2]))
    _draw_tiling(fig.add_subplot(grid[1, :]))
    fig.subplots_adjust(top=0.91)
    fig.suptitle(
        "FP4 scale factors (SFA / SFB) in the tcgen05 128x4 blocked layout "
        "(same bytes as torch._scaled_mm / cuBLASLt / reference.to_blocked)",
        fontsize=14,
        y=0.975,
    )
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sf_layout.png")
    print(f"wrote {draw(out)}")
