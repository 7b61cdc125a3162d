# SPDX-License-Identifier: BSD-3-Clause
"""Keep docs/fp8_to_fp4.md honest: every behaviour it quotes must still happen with the pinned DSL.

The findings come from docs/repro_fp8_to_fp4_errors.py (CPU only: host tracing and sm_100a
cross-compilation).  If one of these tests fails after a DSL upgrade, update the guide's section
named in the test together with the expectation here.  Further tests check that the figure
(docs/draw_sf_layout.py) draws what ``reference.to_blocked``, the DSL's layouts and the kernel's
SFB shift say and that its callouts point where their labels say, that the code the guide quotes
is still the kernel's (in the method its label names), that its examples run, its version table
(against the facts read from CUTLASS's sources and the installed DSL), links and length.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PINNED_DSL = "4.8.1"
GUIDE = (DOCS / "fp8_to_fp4.md").read_text()


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def _restore_dsl_arch_env():
    """The repro script sets CUTE_DSL_ARCH=sm_100a if unset; do not leak it to other test files."""
    saved = os.environ.get("CUTE_DSL_ARCH")
    yield
    if saved is None:
        os.environ.pop("CUTE_DSL_ARCH", None)
    else:
        os.environ["CUTE_DSL_ARCH"] = saved


@pytest.fixture(scope="module")
def repro():
    return _load("repro_fp8_to_fp4_errors")


@pytest.fixture(scope="module")
def draw():
    return _load("draw_sf_layout")


def test_guide_is_about_the_installed_and_pinned_dsl(repro):
    """Header of the guide: all findings are for nvidia-cutlass-dsl 4.8.1."""
    import cutlass

    pins = re.findall(r"nvidia-cutlass-dsl==([\w.]+)", (ROOT / "pyproject.toml").read_text())
    assert pins == [PINNED_DSL], f"pyproject.toml pins {pins}; the guide documents {PINNED_DSL}"
    assert cutlass.__version__ == PINNED_DSL


# --- "unsupported ab_dtype, or no error at all": the plain builder and FP4 ----------------------
def test_plain_builder_silently_builds_an_unscaled_fp4_mma(repro):
    f = repro.plain_builder_with_fp4()
    assert f.raised is None, f"make_trivial_tiled_mma now raises: {f.message}"
    for api in ("new_api", "legacy_api"):
        info = f.details[api]
        assert info["op"] == "MmaF8F6F4Op"
        assert info["shape_mnk"][2] == 32
        assert info["block_scaled"] is False
    assert any("deprecated" in w for w in f.details["legacy_warnings"])


def test_the_deprecation_warning_is_hidden_by_default(repro):
    """The guide: the single-dtype call's only sign is a DeprecationWarning Python hides.

    Python's default filters show a DeprecationWarning only when it is attributed to __main__;
    this one is attributed to a file inside the DSL, whoever calls the builder.
    """
    import cutlass

    f = repro.plain_builder_with_fp4()
    assert f.details["legacy_warning_categories"] == ["DeprecationWarning"]
    dsl_dir = str(Path(cutlass.__file__).resolve().parent)
    for filename in f.details["legacy_warning_files"]:
        assert str(Path(filename).resolve()).startswith(dsl_dir), filename
    assert "is a `DeprecationWarning` that Python hides" in GUIDE


def test_blockscaled_builder_picks_the_fp4_ops(repro):
    d = repro.blockscaled_builder_ops().details
    nv, mx = d["nvfp4 (F4 x F4, E4M3, 16)"], d["mxfp4 (F4 x F4, E8M0, 32)"]
    assert (nv["op"], nv["shape_mnk"][2], nv["sf_vec_size"], nv["sf_dtype"]) == (
        "MmaMXF4NVF4Op",
        64,
        16,
        "Float8E4M3FN",
    )
    assert (mx["op"], mx["shape_mnk"][2], mx["sf_vec_size"], mx["sf_dtype"]) == (
        "MmaMXF4Op",
        64,
        32,
        "Float8E8M0FNU",
    )
    assert nv["module"] == "cutlass.cute.nvgpu.tcgen05.mma"
    # E4M3 scales with sf_vec_size 32 are silently replaced by E8M0 (kind::mxf4).
    assert d["F4 x F4, E4M3, 32 (E4M3 dropped)"]["sf_dtype"] == "Float8E8M0FNU"
    # A mixed FP8 x FP4 pair silently becomes kind::mxf8f6f4: K 32, 32-element E8M0 scales.
    mixed = d["E4M3 x F4, E4M3, 16 (mixed)"]
    assert (mixed["op"], mixed["shape_mnk"][2], mixed["sf_vec_size"], mixed["sf_dtype"]) == (
        "MmaMXF8F6F4Op",
        32,
        32,
        "Float8E8M0FNU",
    )
    # The requested MN-major mode is ignored: the FP4 ops are K-major only.
    assert d["F4 x F4 requested MN-major"]["a_major"].endswith(".K")
    # "the one-dtype block-scaled form still works on 4.8.1"
    assert d["nvfp4, one-dtype (DSL <= 4.4) signature"] == nv


# --- What the PTX says -------------------------------------------------------------------------
def test_ptx_of_the_plain_builder_is_kind_f8f6f4(repro):
    f = repro.mma_ptx("plain_builder")
    assert f.raised is None, f.message
    assert len(f.details["mma_lines"]) == 1
    line = f.details["mma_lines"][0]
    assert ".kind::f8f6f4" in line and "block_scale" not in line


@pytest.mark.parametrize("sf_vec_size", [16, 32])
def test_ptx_of_the_blockscaled_mma_reads_scales_from_tmem(repro, sf_vec_size):
    f = repro.mma_ptx("blockscaled_with_scales", sf_vec_size=sf_vec_size)
    assert f.raised is None, f.message
    line = f.details["mma_lines"][0]
    # MXFP4 (MmaMXF4Op) is emitted as kind::mxf4nvf4 with 32-element blocks, too.
    assert f".kind::mxf4nvf4.block_scale.block{sf_vec_size}" in line
    # The repro puts the accumulator at TMEM 256, SFA at 128 and SFB at 144.
    assert f.details["tmem_addresses"] == [{"d": 256, "sfa": 128, "sfb": 144}]


def test_scales_set_as_mma_fields_give_the_same_instruction(repro):
    """ "DSL 4.3 (4.8.1 still accepts it)": tiled_mma.set(Field.SFA / SFB) before cute.gemm."""
    by_list = repro.mma_ptx("blockscaled_with_scales")
    by_field = repro.mma_ptx("blockscaled_with_set_fields")
    assert by_field.raised is None, by_field.message
    assert by_field.details["tmem_addresses"] == by_list.details["tmem_addresses"]
    kinds = [re.match(r"\S+", f.details["mma_lines"][0]).group(0) for f in (by_list, by_field)]
    assert kinds[0] == kinds[1] and "block_scale.block16" in kinds[0]
    assert "tiled_mma.set(tcgen05.Field.SFA, tCtSFA[sf].iterator)" in GUIDE


def test_s2t_copy_without_the_broadcast_helper_emits_the_same_ptx(repro):
    """ "Older DSLs: partition sSF_compact directly (same PTX, s2t_copy_ptx)"."""
    f = repro.s2t_copy_ptx()
    assert f.raised is None, f.message
    assert set(f.details) == set(repro.S2T_CASES)
    for name, result in f.details.items():
        assert result["same_ptx"], name
        assert result["tcgen05_cp"] >= 4, name
    assert "same PTX, `s2t_copy_ptx`" in GUIDE


def test_blockscaled_mma_without_scales_reads_the_accumulator_as_scales(repro):
    """ "No error: the block-scaled MMA called without its scales": compiles, reads TMEM 0."""
    f = repro.mma_ptx("blockscaled_without_scales")
    assert f.raised is None, f"now rejected: {f.message}"
    line = f.details["mma_lines"][0]
    assert ".kind::mxf4nvf4.block_scale" in line
    # Both scale operands fall back to TMEM address 0, the atom's default scale pointers.
    assert f.details["tmem_addresses"] == [{"d": 256, "sfa": 0, "sfb": 0}]


def test_scales_passed_to_the_plain_mma_fail_verification(repro):
    f = repro.gemm_with_scales_on_plain_mma()
    assert f.raised == "DSLOperationBuildError"
    assert "'cute.gemm' op expects 1 operands for A and 1 operands for B, but got 2 and 2" in (
        f.message
    )


def test_scale_field_on_the_plain_mma(repro):
    f = repro.set_scale_field_on_plain_mma()
    assert f.raised == "ValueError"
    assert f.message == (
        "invalid field, must be one of ['accum_c', 'neg_a', 'neg_b', 'disable_output_lane'] "
        "or their enum counterparts, but got Field.SFA"
    )


# --- "scale_k_per_tile must be 1", "profile of input tuples": the FP8 example's own path --------
@pytest.mark.parametrize(
    "mma,granularity_n,granularity_k,message",
    [
        ("fp8", 128, 128, ""),
        # The example's single-dtype call builds the unscaled K 32 MMA for FP4: no error.
        ("fp4 plain (the example's call)", 128, 128, ""),
        # The block-scaled MMA is K 64, so the K tile becomes 256: two 128-wide K blocks per tile.
        ("fp4 block-scaled", 128, 128, "scale_k_per_tile must be 1"),
        ("fp8", 128, 16, "scale_k_per_tile must be 1"),
        ("fp8", 16, 128, "scale_n_per_tile must be 1"),
    ],
)
def test_fp8_example_scale_checks(repro, mma, granularity_n, granularity_k, message):
    """Computed as the example computes them: nothing is raised, the message is what it would."""
    f = repro.fp8_example_scale_checks(mma, granularity_n, granularity_k)
    assert f.message == message, f.details
    assert f.raised is None
    assert f.would_raise == ("ValueError" if message else None)


@pytest.mark.parametrize(
    "granularity,expected",
    [
        (1, None),
        (2, "(32, (2, 16))"),
        (4, "(32, (4, 8))"),
        (8, "(32, (8, 4))"),
        (16, "(32, (16, 2))"),
        (32, None),
        (64, None),
        (128, None),
    ],
)
def test_fp8_example_scale_product_profile_error(repro, granularity, expected):
    """scale_a * scale_b fails exactly when 1 < granularity_n < 32 (the subtile's 32 columns)."""
    assert "strictly between 1 and 32" in GUIDE
    f = repro.fp8_example_scale_product(granularity)
    if expected is None:
        assert f.raised is None, f.message
        assert f.details["scale_a_shape"] == f.details["scale_b_shape"] == "((32, 1), 1, 1)"
    else:
        assert f.raised == "TypeError"
        assert f.message == f"profile of input tuples doesn't match: {expected}"
        assert f.details["scale_b_shape"] == f"(({expected[5:-1]}, 1), 1, 1)"


def test_repro_labels_computed_and_quoted_messages(repro, capsys):
    """The script never says "raises" for a message it computed or quoted."""
    repro.main()
    out = capsys.readouterr().out
    assert "the FP8 example would raise ValueError: scale_k_per_tile must be 1" in out
    assert "the FP8 example would raise ValueError: scale_n_per_tile must be 1" in out
    assert "raises ValueError: scale_" not in out
    for f in repro.quoted_messages():
        assert f.raised is None and f.quoted_from
        line = f"quoted, not raised here, from {f.quoted_from}: {f.would_raise}: {f.message}"
        assert line in out
    # The DSL <= 4.4 message, which 4.8.1 cannot raise, is among the quotes.
    assert f"from {repro.DSL_44_SOURCE}: {repro.DSL_44_PLAIN_BUILDER_ERROR}" in out


def test_fp8_example_scale_product_fails_the_same_with_fp4_data(repro):
    f8 = repro.fp8_example_scale_product(16)
    f4 = repro.fp8_example_scale_product(16, repro.F4)
    assert (f4.raised, f4.message) == (f8.raised, f8.message)


# --- The builder's shape errors and other things an FP8 port meets ------------------------------
def test_fp8_k_tiles_on_the_fp4_mma(repro):
    f = repro.fp8_k_tile_on_fp4_mma()
    assert f.raised == "ValueError"
    assert f.message == "Expected size in shape to be strictly positive, but got 0"
    assert f.details["swizzle_k128"] == "S<2,4,3>"
    assert f.details["swizzle_k256"] == "S<3,4,3>"


def test_blockscaled_mma_shape_and_scale_errors(repro):
    d = repro.blockscaled_mma_errors().details
    assert d["tile M 64 on one CTA (allowed for FP8)"] == (
        "DSLUserCodeError",
        "expects the M-mode to be 128, but got 64",
    )
    assert d["tile N 8 on a CTA pair"] == (
        "DSLUserCodeError",
        "expects the N-mode to satisfy 16 <= N <= 256 and N % 16 == 0, but got 8",
    )
    assert d["sf_vec_size 64"] == ("ValueError", "unsupported sf_vec_size, got 64")
    assert d["scale dtype Float8E5M2"] == (
        "DSLUserCodeError",
        "expects the 'sf_dtype' Op parameter to be one of Float8E8M0FNU",
    )


def test_two_cta_tile_needs_an_even_cluster(repro):
    f = repro.two_cta_cluster_error()
    assert f.raised == "ValueError"
    assert f.message == "Cluster shape not divisible by MMA size: (1, 1, 1) and 2:1"


def test_tma_k_rule_is_not_checked_at_compile_time(repro):
    f = repro.tma_with_k_not_multiple_of_32(48)
    assert f.raised is None, f"the DSL now checks it at compile time: {f.message}"


@pytest.mark.parametrize("where", ["repro", "kernel"])
def test_recommended_guard(repro, where):
    """The guide's guard (the kernel's assert_block_scaled_fp4_mma) accepts exactly the FP4 ops."""
    import blockwise_gemm_fp4 as bw

    guard = (
        bw.assert_block_scaled_fp4_mma if where == "kernel" else repro.assert_block_scaled_fp4_mma
    )
    f = repro.guard_verdicts(guard)
    assert f.raised is None, f.message
    assert f.details == {
        "nvfp4 op": True,
        "mxfp4 op": True,
        "plain F8F6F4 op": False,
        "E8M0 x 16 asked as NVFP4": False,
        "E4M3 x 32 (became E8M0)": False,
        "mixed FP8 x FP4 (MXF8F6F4)": False,
    }
    assert "`assert_block_scaled_fp4_mma`" in GUIDE


def test_hardware_budgets(repro):
    d = repro.hardware_budgets().details
    assert d == {"smem_bytes": 232448, "tmem_columns": 512}


# --- "The 128x4 scale layout, in memory and in TMEM" and the figure -----------------------------
@pytest.mark.parametrize("rows,n_cols", [(200, 20), (128, 4), (1, 1), (300, 22), (129, 7)])
def test_figure_offsets_equal_reference_to_blocked(draw, rows, n_cols):
    import torch

    import reference

    ids = torch.arange(1, rows * n_cols + 1, dtype=torch.int64).reshape(rows, n_cols)
    blocked = reference.to_blocked(ids)
    assert blocked.ndim == 1 and blocked.numel() == draw.blocked_size(rows, n_cols)
    table = draw.offset_table(rows, n_cols)
    seen = set()
    for r, row in enumerate(table):
        for c, off in enumerate(row):
            expected = int(ids[r, c]) if r < rows and c < n_cols else 0  # padding is zero
            assert int(blocked[off]) == expected, (r, c, off)
            seen.add(off)
    assert seen == set(range(blocked.numel())), "offsets must cover the blocked tensor once"


@pytest.mark.parametrize("sf_vec_size", [16, 32])
def test_figure_offsets_equal_the_dsl_sf_layout(repro, draw, sf_vec_size):
    rows, n_cols = 200, 20
    dsl = repro.dsl_sf_offsets(rows, n_cols * sf_vec_size, sf_vec_size)
    assert dsl == draw.offset_table(rows, n_cols)


@pytest.mark.parametrize(
    "sf_vec_size,operand,tile_n",
    [(16, "sfa", 128), (32, "sfa", 128), (16, "sfb", 64), (16, "sfb", 256), (32, "sfb", 192)],
)
def test_figure_tmem_panels_equal_the_dsl_tmem_layout(repro, draw, sf_vec_size, operand, tile_n):
    """Panels 3 and 4: where tcgen05.cp puts each scale of a K tile is where the DSL's
    make_tmem_layout_sfa / _sfb reads it (SFB rows rounded up to 128)."""
    dsl = repro.dsl_tmem_sf_positions(sf_vec_size, operand, tile_n)
    rows = -(-tile_n // 128) * 128 if operand == "sfb" else 128
    assert len(dsl) == rows * 256 // sf_vec_size
    for (r, c), copies in dsl.items():
        assert copies == draw.tmem_positions(r, c, rows), (r, c)
    # "atom a lands in TMEM columns 4a to 4a + 3" (128 rows): 16 columns NVFP4, 8 MXFP4.
    if rows == 128:
        columns = {col for copies in dsl.values() for _, col, _ in copies}
        assert columns == set(range(4 * 64 // sf_vec_size))


@pytest.mark.parametrize("tile_n", [64, 192])
def test_odd_n_tiles_read_two_columns_further(repro, draw, tile_n):
    """Panel 5 and "Tile N 64 and 192": an odd tile's rows are the load's rows 64 on, which the
    DSL layout puts sfb_tmem_column_shift (2) columns after the even tile's."""
    import blockwise_gemm_fp4 as bw

    dsl = repro.dsl_tmem_sf_positions(16, "sfb", tile_n)
    shift = bw.sfb_tmem_column_shift(1, tile_n)
    assert shift == draw.N64_ODD_TILE_SHIFT == 2 and bw.sfb_tmem_column_shift(0, tile_n) == 0
    for n in range(tile_n):
        for c in range(16):
            moved = [(lane, col + shift, b) for lane, col, b in dsl[(n, c)]]
            assert moved == dsl[(64 + n, c)], (n, c)
    if tile_n == 64:
        for k_block in range(4):
            for tile in (0, 1):
                read = sorted(
                    {
                        col + bw.sfb_tmem_column_shift(tile, 64)
                        for n in range(64)
                        for c in range(4 * k_block, 4 * k_block + 4)
                        for _, col, _ in dsl[(n, c)]
                    }
                )
                assert read == draw.n64_tile_columns(tile, k_block), (tile, k_block)


@pytest.fixture(scope="module")
def figure(draw):
    import matplotlib.pyplot as plt

    fig = draw.make_figure()
    yield {ax.get_title().split(".")[0]: ax for ax in fig.axes}
    plt.close(fig)


def _callouts(ax) -> list:
    from matplotlib.text import Annotation

    return [t for t in ax.texts if isinstance(t, Annotation) and t.get_text()]


def test_figure_has_the_k_tile_and_n64_panels(figure):
    assert sorted(figure) == ["1", "2", "3", "4", "5", "6"]
    assert "K tile" in figure["4"].get_title() and "N 64" in figure["5"].get_title()


def test_tmem_panel_callouts_point_at_the_lanes_they_name(draw, figure):
    """Panel 3: each "lane L: rows ..." arrow ends on lane L, and lane L holds those rows."""
    found = []
    for ann in _callouts(figure["3"]):
        m = re.fullmatch(r"lane\s+(\d+): rows ([\d, ]+)", ann.get_text())
        assert m, ann.get_text()
        lane = int(m.group(1))
        x, y = ann.xy
        assert int(y) == lane and ann.xyann[1] == y, (lane, ann.xy, ann.xyann)
        assert x == draw.ATOM_COLS
        held = {
            col: r for r in range(128) for ln, col, _ in draw.tmem_positions(r, 0) if ln == lane
        }
        assert [int(v) for v in m.group(2).split(", ")] == [held[col] for col in range(4)]
        assert lane % 32 not in (0, 31), "a callout at a quadrant edge is ambiguous"
        found.append(lane)
    assert found == list(draw.TMEM_CALLOUT_LANES)


@pytest.mark.parametrize("panel", ["4", "5"])
def test_k_tile_and_n64_callouts_point_at_the_cells_they_name(draw, figure, panel):
    """Panels 4, 5: "lane L, column C: row R, scales S0-S1" ends in cell (C, L), holding them."""
    callouts = [a for a in _callouts(figure[panel]) if a.get_text().startswith("lane")]
    assert len(callouts) == 2
    for ann in callouts:
        m = re.match(r"lane (\d+), column (\d+): row (\d+), scales (\d+)-(\d+)", ann.get_text())
        lane, column, row, s0, s1 = map(int, m.groups())
        assert (int(ann.xy[0]), int(ann.xy[1])) == (column, lane), ann.get_text()
        for c in range(s0, s1 + 1):
            assert (lane, column, c % 4) in draw.tmem_positions(row, c), (row, c)


def test_figure_script_draws(draw, tmp_path):
    out = draw.draw(tmp_path / "sf_layout.png")
    assert out.stat().st_size > 10_000


# ------------------------------------------------------------------------------------------
# The guide itself: its quotes, excerpts, tables, links and length
# ------------------------------------------------------------------------------------------
def _headings() -> list[str]:
    return [line for line in GUIDE.splitlines() if line.startswith("#")]


def test_every_reproduced_message_is_quoted_in_the_guide(repro):
    """Each message the repro observes with the pinned DSL appears verbatim in the guide."""
    quoted = [
        repro.plain_builder_with_fp4().details["legacy_warnings"][0],
        repro.set_scale_field_on_plain_mma().message,
        repro.gemm_with_scales_on_plain_mma().message.removeprefix("unknown: "),
        repro.fp8_example_scale_checks("fp4 block-scaled").message,
        repro.fp8_example_scale_checks("fp8", scale_granularity_n=16).message,
        repro.fp8_example_scale_product(16).message,
        repro.fp8_example_scale_product(8).message.split(": ", 1)[1],
        repro.fp8_k_tile_on_fp4_mma().message,
        repro.two_cta_cluster_error().message,
        *[message for _, message in repro.blockscaled_mma_errors().details.values()],
    ]
    flat = " ".join(GUIDE.split())
    for message in quoted:
        assert message and " ".join(message.split()) in flat, f"not quoted in the guide: {message}"


def test_every_reproduced_value_is_quoted_in_the_guide(repro):
    """Op names, PTX kinds and swizzles the guide quotes are the ones the pinned DSL produces."""
    builder = repro.blockscaled_builder_ops().details
    k_tiles = repro.fp8_k_tile_on_fp4_mma().details
    plain_ptx = repro.mma_ptx("plain_builder").details["mma_lines"][0]
    nvfp4_ptx = repro.mma_ptx("blockscaled_with_scales").details["mma_lines"][0]
    values = [
        repro.plain_builder_with_fp4().details["new_api"]["op"],
        re.match(r"tcgen05\.mma\.cta_group::1\.kind::\w+", plain_ptx).group(0),
        builder["nvfp4 (F4 x F4, E4M3, 16)"]["op"],
        builder["mxfp4 (F4 x F4, E8M0, 32)"]["op"],
        builder["E4M3 x F4, E4M3, 16 (mixed)"]["op"],
        re.search(r"kind::mxf4nvf4\.block_scale\.block16", nvfp4_ptx).group(0),
        k_tiles["swizzle_k128"],
        k_tiles["swizzle_k256"],
    ]
    for value in values:
        assert f"`{value}`" in GUIDE, f"not quoted in the guide: {value}"
    # ... and the guide quotes no other op or swizzle.
    for pattern in (r"`(Mma\w+Op)`", r"`(S<\d,\d,\d>)`"):
        for quoted in re.findall(pattern, GUIDE):
            assert quoted in values, f"the guide quotes {quoted}, which the repro never saw"


def _known_messages(repro) -> list[str]:
    """Every message the guide may quote, with its exception class where one is raised."""
    known = [
        repro.DSL_44_PLAIN_BUILDER_ERROR,
        repro.FP8_EXAMPLE_UNSUPPORTED.format(ab_dtype="Float4E2M1FN"),
        *[f"ValueError: {message}" for _, message in repro.FP8_EXAMPLE_CHECKS],
    ]
    for f in (
        repro.set_scale_field_on_plain_mma(),
        repro.gemm_with_scales_on_plain_mma(),
        repro.fp8_example_scale_product(16),
        repro.fp8_k_tile_on_fp4_mma(),
        repro.two_cta_cluster_error(),
    ):
        known.append(f"{f.raised}: {f.message.removeprefix('unknown: ')}")
    known += [f"{cls}: {msg}" for cls, msg in repro.blockscaled_mma_errors().details.values()]
    return known


def test_error_index_quotes_only_real_messages(repro):
    """Each quoted message in the error index is (up to "...") one the DSL or example raises."""
    known = _known_messages(repro)
    index = GUIDE[GUIDE.index("## Error index") : GUIDE.index("## Checklist")]
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10
    for row in rows:
        quote = re.match(r"\| `([^`]+)`", row).group(1)
        fragments = [part.strip(" ,") for part in quote.split("...")]
        assert any(fragments), row
        for fragment in filter(None, fragments):
            assert any(fragment in message for message in known), row


def test_shape_error_table_matches_the_dsl(repro):
    """The "builder's shape errors" table: exception class and message of each row."""
    known = _known_messages(repro)
    rows = re.findall(r"^\| [^|]+ \| `(\w+)`: `([^`]+)` \|$", GUIDE, re.M)
    assert len(rows) == 5
    for cls, message in rows:
        assert f"{cls}: {message}" in known, (cls, message)


def test_messages_quoted_from_other_sources(repro):
    """Messages the pinned DSL cannot raise: DSL <= 4.4's builder, the FP8 example's own checks."""
    assert repro.DSL_44_PLAIN_BUILDER_ERROR in GUIDE
    assert repro.FP8_EXAMPLE_UNSUPPORTED.format(ab_dtype="Float4E2M1FN") in GUIDE
    for _, message in repro.FP8_EXAMPLE_CHECKS[::2]:
        assert f"ValueError: {message}" in GUIDE


@pytest.mark.parametrize(
    "message",
    [
        "TypeError: unsupported ab_dtype, got Float4E2M1FN",
        "ValueError: scale_k_per_tile must be 1",
        "ValueError: scale_n_per_tile must be 1",
        "TypeError: profile of input tuples doesn't match: (32, (16, 2))",
        "ValueError: Expected size in shape to be strictly positive, but got 0",
        "ValueError: Cluster shape not divisible by MMA size: (1, 1, 1) and 2:1",
        "No error: the block-scaled MMA called without its scales",
    ],
)
def test_error_messages_are_headings(message):
    assert any(message in heading for heading in _headings()), message


def test_error_index_links_resolve():
    index = GUIDE[GUIDE.index("## Error index") : GUIDE.index("## Checklist")]
    targets = set(re.findall(r"\]\(#([\w-]+)\)", index))
    assert len(targets) >= 6
    for target in targets:
        assert f'<a id="{target}"></a>' in GUIDE, target


def test_start_here_box_and_checklist_come_first():
    """The first screen: where working FP4 kernels are, versions, our status, then the index
    (the reader's two messages first), what to change for them, and the checklist."""
    box = GUIDE[: GUIDE.index("## Error index")]
    assert box.count("> ") >= 10
    assert "has not run on a B200" in box
    assert "dense_blockscaled_gemm_persistent.py" in box and "nvfp4_gemm_0.py" in box
    assert "**Minimum version**" in box and "needs exactly" in box and "4.8.1" in box
    order = ["## Error index", '<a id="what-to-change">', "## Checklist", "## DSL versions"]
    assert [GUIDE.index(h) for h in order] == sorted(GUIDE.index(h) for h in order)
    assert GUIDE.index("## Checklist") < len(GUIDE) // 3
    index = GUIDE[GUIDE.index("## Error index") : GUIDE.index('<a id="what-to-change">')]
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `TypeError: unsupported ab_dtype, got Float4E2M1FN`")
    assert rows[1].startswith("| `TypeError: profile of input tuples doesn't match: (32, (16, 2))`")
    assert all("(#what-to-change)" in row for row in rows[:2])


def test_upstream_links_are_pinned_to_a_release_tag():
    links = re.findall(r"https://github\.com/NVIDIA/cutlass/blob/([^/]+)/", GUIDE)
    assert len(links) >= 4
    assert set(links) == {"v4.7.0"}


def test_kernel_is_named_by_symbols_not_line_numbers():
    """No line links into the kernel; every symbol the migration table names exists."""
    import blockwise_gemm_fp4 as bw

    assert "blockwise_gemm_fp4.py#L" not in GUIDE
    table = GUIDE[GUIDE.index("## From the FP8 example to FP4") : GUIDE.index("The new code")]
    names = set()
    for row in [line for line in table.splitlines() if line.startswith("|")][2:]:
        names.update(re.findall(r"`(\w+)`", row.split("|")[3]))
    assert len(names) >= 8
    for name in names:
        assert hasattr(bw.BlockwiseGemmFp4Sm100, name) or hasattr(bw, name), name


def _excerpts() -> dict[str, str]:
    # fmt: off keeps ruff format (which formats Markdown code blocks) from re-wrapping the quote.
    found = re.findall(
        r"<!-- excerpt: (.+?) -->\n<!-- fmt: off -->\n```python\n(.*?)```\n<!-- fmt: on -->",
        GUIDE,
        re.S,
    )
    return dict(found)


def test_guide_quotes_three_kernel_excerpts():
    names = list(_excerpts())
    assert len(names) == 3, names
    assert sum(len(code.splitlines()) for code in _excerpts().values()) >= 35


def _method_source(class_name: str, method: str) -> str:
    """The source of ``class_name.method`` in the kernel file (from its AST: no import)."""
    text = (ROOT / "blockwise_gemm_fp4.py").read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return ast.get_source_segment(text, item, padded=True) + "\n"
    raise AssertionError(f"{class_name}.{method} is not in blockwise_gemm_fp4.py")


@pytest.mark.parametrize("name", list(_excerpts()))
def test_excerpt_label_names_the_method_that_holds_it(name):
    """ "(Class.method)" in an excerpt's label is where the code lives, not a caller of it."""
    class_name, method = re.search(r"\((\w+)\.(\w+)\)$", name).groups()
    source = textwrap.dedent(_method_source(class_name, method))
    code = _excerpts()[name]
    assert any(textwrap.indent(code, " " * n) in source for n in range(0, 33, 4)), name


def test_sfb_tma_excerpt_shows_every_difference_from_sfa():
    """The SFB atom differs from SFA's in its MMA view, cluster layout and the N 192 re-index."""
    code = next(c for n, c in _excerpts().items() if "TMA" in n)
    for name in (
        "make_tiled_tma_atom_B",
        "cluster_shape_to_tma_atom_SFB",
        "self.mma_tiler_sfb",
        "self.tiled_mma_sfb",
        "self.cluster_layout_sfb_vmnk",
        "self._sfb_tma_layout",
    ):
        assert name in code, name


@pytest.mark.parametrize("name", list(_excerpts()))
def test_excerpt_is_verbatim_in_the_kernel(name):
    """The code the guide quotes is the kernel's, up to one uniform indentation."""
    code = _excerpts()[name]
    kernel = (ROOT / "blockwise_gemm_fp4.py").read_text()
    assert any(textwrap.indent(code, " " * n) in kernel for n in range(0, 33, 4)), (
        f"the guide's excerpt '{name}' is no longer verbatim in blockwise_gemm_fp4.py: "
        "copy the current code into docs/fp8_to_fp4.md"
    )


def _code_after(anchor: str) -> str:
    """The first ```python block after ``anchor`` in the guide."""
    rest = GUIDE[GUIDE.index(anchor) :]
    return re.search(r"```python\n(.*?)```", rest, re.S).group(1)


def test_what_to_change_block_traces_on_the_pinned_dsl(repro):
    """The block under "What to change" runs as written (imports, MMA, K tile, SMEM layouts)."""
    code = _code_after('<a id="what-to-change">')
    ns: dict = {}
    seen: dict = {}

    def body():
        exec(code, ns)  # noqa: S102 - the guide's own example is the thing under test
        # (layouts can be read only while the DSL traces)
        seen["op"] = type(ns["tiled_mma"].op).__name__
        seen["swizzles"] = {str(ns[name].inner) for name in ("a_layout", "b_layout")}
        seen["sf_layouts"] = [str(ns[name]) for name in ("sfa_layout", "sfb_layout")]

    exc = repro._run_jit(body)
    assert exc is None, repro.error_line(exc)
    assert seen["op"] == "MmaMXF4NVF4Op"
    assert ns["mma_tiler"][2] == 256
    # "make_smem_layout_a/_b already handle FP4": the 128-byte swizzle of a K 256 tile.
    assert seen["swizzles"] == {"S<3,4,3>"}
    assert all(seen["sf_layouts"])
    # The import path of the other scale-factor helpers.
    assert "import cutlass.utils.blockscaled_layout as blockscaled_utils" in code
    assert (
        "`cutlass.utils.blockscaled_layout` also has `make_tmem_layout_sfa/_sfb` and "
        "`tile_atom_to_shape_SF`"
    ) in " ".join(GUIDE.split())


def test_host_call_example_passes_every_check_but_the_gpu():
    """The torch call example, on CPU tensors, gets as far as the kernel's CUDA-tensor check."""
    code = _code_after('<a id="call">')
    assert code.count('device="cuda"') == 2
    with pytest.raises(ValueError, match="must be a contiguous CUDA tensor"):
        exec(code.replace('device="cuda"', 'device="cpu"'), {})  # noqa: S102


def _versions_table() -> dict[str, list[str]]:
    section = GUIDE[GUIDE.index("## DSL versions") : GUIDE.index("## From the FP8 example")]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == "| API the recipe uses | 4.3 | 4.4 | 4.5 to 4.8.1 |", rows[0]
    return {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in r.strip("|").split("|")] for r in rows[1:])
    }


def test_version_table_rows(repro):
    """Each row of "DSL versions" against the facts read from CUTLASS's sources (repro's
    VERSION_FACTS) and, for 4.5 to 4.8.1, the installed DSL."""
    table = _versions_table()
    facts = repro.VERSION_FACTS
    assert len(table) >= 7

    v43, v44, v45 = table["plain builder"]
    assert repro.DSL_44_PLAIN_BUILDER_ERROR in v43 and v44 == "same"
    assert "a_dtype, b_dtype" in v45 and "`MmaF8F6F4Op`" in v45
    assert facts["a_dtype, b_dtype builders"][0] == "4.5"

    v43, v44, v45 = table["block-scaled builder"]
    assert "(ab_dtype, a_major, b_major, sf_dtype, sf_vec_size, cta_group, tile_mn)" in v43
    assert v44 == "same" and "a_dtype, b_dtype" in v45

    v43, v44, v45 = table["passing scales"]
    assert facts["tcgen05.Field.SFA / SFB"][0] == "4.3" and "Field.SFA" in v43 and "only" in v43
    assert facts["cute.gemm([a, sfa], [b, sfb])"][0] == "4.4"
    assert "[a, sfa]" not in v43 and "[a, sfa]" in v44 and "lists" in v45
    import cutlass.cute as cute

    assert "List" in str(inspect.signature(cute.gemm).parameters["a"].annotation)

    apis = next(k for k in table if k.startswith("`make_smem_layout_a/_b`"))
    assert table[apis] == ["yes", "yes", "yes"]
    import cutlass.utils.blackwell_helpers as sm100_utils
    import cutlass.utils.blockscaled_layout as blockscaled_utils
    from cutlass.cute.nvgpu import tcgen05

    for module, name in (
        (sm100_utils, "make_smem_layout_a"),
        (sm100_utils, "make_smem_layout_b"),
        (sm100_utils, "cluster_shape_to_tma_atom_SFB"),
        (blockscaled_utils, "make_smem_layout_sfa"),
        (blockscaled_utils, "make_smem_layout_sfb"),
        (blockscaled_utils, "make_tmem_layout_sfa"),
        (blockscaled_utils, "make_tmem_layout_sfb"),
        (blockscaled_utils, "tile_atom_to_shape_SF"),
        (tcgen05, "Cp4x32x128bOp"),
        (tcgen05, "make_s2t_copy"),
        (tcgen05, "get_s2t_smem_desc_tensor"),
    ):
        assert hasattr(module, name), name
    assert "internal_type" in inspect.signature(cute.nvgpu.make_tiled_tma_atom_A).parameters

    v43, v44, v45 = table["`tcgen05.append_s2t_broadcast_mode`, `cutlass.memory`"]
    assert (v43, v44, v45) == ("no", "no", "4.8.0 and 4.8.1 only")
    assert facts["tcgen05.append_s2t_broadcast_mode"][0] == facts["cutlass.memory"][0] == "4.8"

    v43, v44, v45 = table["version, CUDA 13"]
    assert facts["cutlass.__version__"][0] == facts["nvidia-cutlass-dsl[cu13]"][0] == "4.4"
    assert "`cutlass.__version__`" not in v43 and "[cu13]" in v44 and "`cutlass.__version__`" in v44
    import cutlass

    assert cutlass.__version__ == PINNED_DSL
    extras = importlib.metadata.requires("nvidia-cutlass-dsl")
    assert any('extra == "cu13"' in r for r in extras), extras

    assert table["our kernel"] == ["no", "no", f"exactly {PINNED_DSL}"]
    # "Sources: CUTLASS's python/CuTeDSL at v4.3.5, v4.4.2, v4.5.0"
    assert ", ".join(repro.OLDER_DSL_TAGS.values()) in GUIDE


def test_the_kernel_needs_the_pinned_dsl():
    """Why 4.8.1 exactly: the kernel calls APIs that the installed DSL has and the guide names."""
    import cutlass.memory
    from cutlass.cute.nvgpu import tcgen05

    kernel = (ROOT / "blockwise_gemm_fp4.py").read_text()
    assert "tcgen05.append_s2t_broadcast_mode(" in kernel and "cutlass.memory." in kernel
    assert hasattr(tcgen05, "append_s2t_broadcast_mode")
    assert hasattr(cutlass.memory, "TmemAllocator") and hasattr(cutlass.memory, "SmemAllocator")
    pin = GUIDE[GUIDE.index("**Our kernel needs exactly nvidia-cutlass-dsl 4.8.1**") :]
    pin = " ".join(pin[: pin.index("\n\n")].split())
    for claim in (
        "`tcgen05.append_s2t_broadcast_mode` and `cutlass.memory`",
        "only in the 4.8.0 and 4.8.1 wheels",
        "in no CUTLASS source, tag or HEAD",
    ):
        assert claim in pin, claim


@pytest.mark.parametrize(
    "overstatement",
    [
        "Always pass",  # tiled_mma.set is the other way, the only one on DSL 4.3
        "none: accumulator read as scales",
        "has no hardware path",  # kind::f8f6f4 takes unscaled e2m1; no FP4-speed path
        "any between 1 and 32",  # strictly between: 1 and 32 pass
        "on the FP8 example's own path",  # a faithful copy, not the example run as is
        "four substitutions",  # SFB differs in more: see the SFB excerpt
        "BlockwiseGemmFp4Sm100.__call__)",  # the TMA atoms live in make_tma_loads
    ],
)
def test_reviewed_overstatements_stay_out(overstatement):
    assert overstatement not in " ".join(GUIDE.split())


def test_guide_length():
    """At most 2,500 words of prose; the quoted kernel code is on top of that."""
    prose = re.sub(r"```.*?```", "", GUIDE, flags=re.S)
    assert len(prose.split()) <= 2500, len(prose.split())


def test_guide_stage_table_matches_the_kernel_budget():
    """Each row equals tile_budget, which test_blackwell checks on compiled kernels."""
    import blockwise_gemm_fp4 as bw

    row = re.compile(
        r"^\| (NVFP4|MXFP4) (\d+) x (\d+), (\w+) \| (\d+) \| (\d+), (\d+) \| "
        r"(\d+) \+ (\d+) \+ (\d+) = (\d+) \|$",
        re.M,
    )
    rows = row.findall(GUIDE)
    assert len(rows) >= 4
    assert {int(r[2]) for r in rows} >= {64, 128, 192, 256}
    for fmt, tm, tn, c_dtype, stage_bytes, ab, acc, acc_cols, sfa, sfb, total in rows:
        budget = bw.tile_budget((int(tm), int(tn)), 16 if fmt == "NVFP4" else 32, c_dtype)
        assert (budget.ab_stage_bytes, budget.num_ab_stage, budget.num_acc_stage) == (
            int(stage_bytes),
            int(ab),
            int(acc),
        )
        assert budget.acc_tmem_columns == int(acc_cols)
        assert (budget.sfa_columns, budget.sfb_columns, budget.tmem_columns) == (
            int(sfa),
            int(sfb),
            int(total),
        )
