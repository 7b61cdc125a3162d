# SPDX-License-Identifier: BSD-3-Clause
"""Draw docs/sf_layout.png: where each FP4 scale factor lives in the 128x4 blocked layout.

The block-scaled tcgen05 MMA (and cuBLASLt, ``torch._scaled_mm``, torchao, FlashInfer) read
scale factors in 512-byte atoms: 128 rows x 4 scale columns.  Inside an atom, scale (r, c)
sits at byte ``(r % 32) * 16 + (r // 32) * 4 + c``; atoms are stored row-block-major (all atoms
of rows 0..127 left to right along K, then rows 128..255, ...), with rows padded to 128 and
scale columns padded to 4.

Every byte offset shown in the figure comes from ``sf_byte_offset`` below; tests/test_docs.py
checks that function against ``reference.to_blocked``.

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


# ------------------------------------------------------------------------------------------
# Drawing
# ------------------------------------------------------------------------------------------
GROUP_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759")  # r // 32 = 0, 1, 2, 3
PAD_COLOR = "#d9d9d9"


def _text_color(face: str) -> str:
    return "white" if face != PAD_COLOR else "black"


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
    """Panel 2: the 512 bytes of one atom as 32 lines of 16 bytes, each byte labelled r,c."""
    from matplotlib.patches import Rectangle

    owner: dict[int, tuple[int, int]] = {}
    for r in range(ATOM_ROWS):
        for c in range(ATOM_COLS):
            owner[sf_byte_offset(r, c, ATOM_COLS)] = (r, c)
    assert sorted(owner) == list(range(ATOM_BYTES)), "offsets must cover one atom exactly once"
    for byte, (r, c) in owner.items():
        line, col = divmod(byte, 16)
        face = GROUP_COLORS[r // LANES]
        ax.add_patch(Rectangle((col, line), 1, 1, facecolor=face, edgecolor="white", lw=0.6))
        ax.text(
            col + 0.5,
            line + 0.5,
            f"{r},{c}",
            ha="center",
            va="center",
            fontsize=6.5,
            color=_text_color(face),
        )
    ax.set_xlim(0, 16)
    ax.set_ylim(LANES, 0)
    ax.set_xticks([i + 0.5 for i in range(16)], [str(i) for i in range(16)], fontsize=8)
    ax.set_yticks(
        [i + 0.5 for i in range(LANES)], [f"{i * 16:3d}" for i in range(LANES)], fontsize=7
    )
    ax.set_xlabel("byte within the 16-byte line  =  (r // 32) * 4 + c")
    ax.set_ylabel("line start byte  =  (r % 32) * 16")
    ax.set_title(
        "2. The same atom in memory: 512 bytes, cell = 'r,c'\n"
        "offset(r, c) = (r % 32) * 16 + (r // 32) * 4 + c",
        fontsize=12,
        pad=24,
    )
    for g in range(4):
        ax.text(g * 4 + 2, -0.6, f"r // 32 = {g}", ha="center", va="bottom", fontsize=9)


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
        f"3. Atoms tile the [{rows} x {n_cols}] NVFP4 scale matrix row-block-major: "
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

    fig = plt.figure(figsize=(17, 17), dpi=100)
    grid = fig.add_gridspec(2, 2, width_ratios=(1, 2.1), height_ratios=(1.05, 1), hspace=0.28)
    _draw_logical_atom(fig.add_subplot(grid[0, 0]))
    _draw_atom_bytes(fig.add_subplot(grid[0, 1]))
    _draw_tiling(fig.add_subplot(grid[1, :]))
    fig.subplots_adjust(top=0.92)
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
