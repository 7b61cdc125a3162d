# SPDX-License-Identifier: BSD-3-Clause
"""Keep docs/fp8_to_fp4.md honest: every behaviour it quotes must still happen with the pinned DSL.

The findings come from docs/repro_fp8_to_fp4_errors.py (CPU only: host tracing and sm_100a
cross-compilation).  If one of these tests fails after a DSL upgrade, update the guide's section
named in the test together with the expectation here.  Further tests check that the figure
(docs/draw_sf_layout.py) draws what ``reference.to_blocked`` and the DSL's layouts say, that the
code the guide quotes is still the kernel's, and the guide's tables, links and length.
"""

from __future__ import annotations

import importlib.util
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

    pins = re.findall(r"nvidia-cutlass-dsl==([\w.]+)", (ROOT / "requirements.txt").read_text())
    assert pins == [PINNED_DSL], f"requirements.txt pins {pins}; the guide documents {PINNED_DSL}"
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
    f = repro.fp8_example_scale_checks(mma, granularity_n, granularity_k)
    assert f.message == message, f.details
    assert f.raised == ("ValueError" if message else None)


@pytest.mark.parametrize(
    "granularity,expected",
    [(128, None), (16, "(32, (16, 2))"), (8, "(32, (8, 4))"), (32, None), (64, None), (1, None)],
)
def test_fp8_example_scale_product_profile_error(repro, granularity, expected):
    """scale_a * scale_b fails exactly when 1 < granularity_n < 32 (the subtile's 32 columns)."""
    f = repro.fp8_example_scale_product(granularity)
    if expected is None:
        assert f.raised is None, f.message
        assert f.details["scale_a_shape"] == f.details["scale_b_shape"] == "((32, 1), 1, 1)"
    else:
        assert f.raised == "TypeError"
        assert f.message == f"profile of input tuples doesn't match: {expected}"
        assert f.details["scale_b_shape"] == f"(({expected[5:-1]}, 1), 1, 1)"


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


@pytest.mark.parametrize("sf_vec_size", [16, 32])
def test_figure_tmem_panel_equals_the_dsl_tmem_layout(repro, draw, sf_vec_size):
    """Panel 3: where tcgen05.cp puts each scale is where make_tmem_layout_sfa reads it."""
    dsl = repro.dsl_tmem_sf_positions(sf_vec_size)
    for (r, c), copies in dsl.items():
        assert copies == draw.tmem_positions(r, c), (r, c)


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
    """The first screen: where working FP4 kernels are, our status, then the index and checklist."""
    box = GUIDE[: GUIDE.index("## Error index")]
    assert box.count("> ") >= 10
    assert "has not run on a B200" in box
    assert "dense_blockscaled_gemm_persistent.py" in box and "nvfp4_gemm_0.py" in box
    assert GUIDE.index("## Checklist") < len(GUIDE) // 4


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


@pytest.mark.parametrize("name", list(_excerpts()))
def test_excerpt_is_verbatim_in_the_kernel(name):
    """The code the guide quotes is the kernel's, up to one uniform indentation."""
    code = _excerpts()[name]
    kernel = (ROOT / "blockwise_gemm_fp4.py").read_text()
    assert any(textwrap.indent(code, " " * n) in kernel for n in range(0, 33, 4)), (
        f"the guide's excerpt '{name}' is no longer verbatim in blockwise_gemm_fp4.py: "
        "copy the current code into docs/fp8_to_fp4.md"
    )


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
