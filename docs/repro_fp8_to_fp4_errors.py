# SPDX-License-Identifier: BSD-3-Clause
"""Reproduce, on a CPU-only machine, what an FP8 -> FP4 port of a Blackwell CuTe DSL GEMM meets.

Every finding quoted in docs/fp8_to_fp4.md comes from a function here, and tests/test_docs.py
asserts that each one still behaves as documented with the pinned DSL (nvidia-cutlass-dsl 4.8.1),
so the guide fails loudly instead of rotting when the DSL changes.

Three kinds of finding, printed differently: what the DSL raised or emitted here; what the FP8
example would raise, computed as a faithful copy of its code (the example itself is not run);
and messages quoted from sources this DSL cannot reproduce (older DSLs, the example's driver).

    python docs/repro_fp8_to_fp4_errors.py          # prints every finding (seconds, no GPU)

Nothing here needs a GPU: host-side ``@cute.jit`` code is traced (and run) on the CPU, and the
kernels are only cross-compiled for sm_100a (``CUTE_DSL_ARCH``, set below unless already set).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")

import re  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.utils.blackwell_helpers as sm100_utils  # noqa: E402
import cutlass.utils.blockscaled_layout as blockscaled_utils  # noqa: E402
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402

F4 = cutlass.Float4E2M1FN
E4M3 = cutlass.Float8E4M3FN
E8M0 = cutlass.Float8E8M0FNU
KMAJ = OperandMajorMode.K
MNMAJ = OperandMajorMode.MN
ONE = tcgen05.CtaGroup.ONE
TWO = tcgen05.CtaGroup.TWO
TILE_MN = (128, 128)


@dataclass
class Finding:
    """One behaviour: an exception raised here (``raised`` names its class), one the FP8 example
    would raise (``would_raise``, computed as it computes it), a message quoted from a source
    (``quoted_from``), or a silent result (none of the three)."""

    key: str
    summary: str
    raised: str | None = None
    message: str = ""
    details: dict = field(default_factory=dict)
    would_raise: str | None = None
    quoted_from: str = ""


def _outcome(exc: BaseException | None) -> dict:
    """``raised`` and ``message`` of a Finding for what a probe raised (None: nothing)."""
    if exc is None:
        return {"raised": None, "message": ""}
    return {"raised": type(exc).__name__, "message": error_line(exc)}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_line(exc: BaseException) -> str:
    """The readable core of a DSL exception: the ``error: ...`` line, without colours."""
    text = _ANSI.sub("", str(exc))
    for line in text.splitlines():
        m = re.search(r"\berror(?:\[[A-Z_]+\])?:\s*(.+)", line)
        if m:
            return m.group(1).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _run_jit(body) -> BaseException | None:
    """Trace and run ``body`` inside a host ``@cute.jit`` function; return what it raised."""

    @cute.jit
    def host():
        body()

    try:
        host()
    except Exception as exc:  # noqa: BLE001 - the exception is the finding
        return exc
    return None


def _compile_kernel(body, keep_ptx: bool = False) -> tuple[BaseException | None, str]:
    """Cross-compile a one-CTA kernel whose body is ``body``; return (exception, PTX)."""

    @cute.kernel
    def kernel():
        body()

    @cute.jit
    def host():
        kernel().launch(grid=(1, 1, 1), block=(128, 1, 1))

    with tempfile.TemporaryDirectory() as dump_dir:
        options = f"--keep-ptx --dump-dir={dump_dir}" if keep_ptx else ""
        try:
            compiled = cute.compile(host, options=options)
        except Exception as exc:  # noqa: BLE001 - the exception is the finding
            return exc, ""
    return None, (compiled.__ptx__ or "") if keep_ptx else ""


def _blockscaled_mma(sf_dtype=E4M3, sf_vec_size=16, cta_group=ONE, tile_mn=TILE_MN, a=F4, b=F4):
    return sm100_utils.make_blockscaled_trivial_tiled_mma(
        a, b, KMAJ, KMAJ, sf_dtype, sf_vec_size, cta_group, tile_mn
    )


def _plain_mma(cta_group=ONE, tile_mn=TILE_MN):
    return sm100_utils.make_trivial_tiled_mma(
        F4, F4, KMAJ, KMAJ, cutlass.Float32, cta_group, tile_mn
    )


def _op_info(tiled_mma) -> dict:
    op = tiled_mma.op
    return {
        "op": type(op).__name__,
        "module": type(op).__module__,
        "shape_mnk": tuple(op.shape_mnk),
        "block_scaled": isinstance(op, tcgen05.mma.BlockScaledMmaOp),
        "sf_dtype": getattr(getattr(op, "sf_dtype", None), "__name__", None),
        "sf_vec_size": getattr(op, "sf_vec_size", None),
        "a_major": str(op.a_major_mode),
    }


# ------------------------------------------------------------------------------------------
# 1a. Which MMA do the two builders return for FP4?
# ------------------------------------------------------------------------------------------
def plain_builder_with_fp4() -> Finding:
    """``make_trivial_tiled_mma`` with Float4E2M1FN: raises, or silently builds a plain MMA?"""
    out: dict = {}

    def body():
        out["new_api"] = _op_info(_plain_mma())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            legacy = sm100_utils.make_trivial_tiled_mma(
                F4, KMAJ, KMAJ, cutlass.Float32, ONE, TILE_MN
            )
        out["legacy_api"] = _op_info(legacy)
        out["legacy_warnings"] = [str(w.message) for w in caught]
        # Python shows a DeprecationWarning by default only when it is attributed to __main__;
        # these are attributed to a file inside the DSL, so a plain run prints nothing.
        out["legacy_warning_categories"] = [w.category.__name__ for w in caught]
        out["legacy_warning_files"] = [w.filename for w in caught]

    exc = _run_jit(body)
    info = out.get("new_api", {})
    return Finding(
        key="plain_builder_with_fp4",
        summary=(
            "make_trivial_tiled_mma(Float4E2M1FN, ...) does not raise: it silently returns "
            f"{info.get('op')} (kind::f8f6f4, K={info.get('shape_mnk', (0, 0, 0))[2]}), a "
            "non-scaled MMA with no scale-factor operands"
        ),
        **_outcome(exc),
        details=out,
    )


def blockscaled_builder_ops() -> Finding:
    """What ``make_blockscaled_trivial_tiled_mma`` returns for the FP4 (and one mixed) cases."""
    cases = {
        "nvfp4 (F4 x F4, E4M3, 16)": dict(sf_dtype=E4M3, sf_vec_size=16),
        "mxfp4 (F4 x F4, E8M0, 32)": dict(sf_dtype=E8M0, sf_vec_size=32),
        "F4 x F4, E8M0, 16": dict(sf_dtype=E8M0, sf_vec_size=16),
        "F4 x F4, E4M3, 32 (E4M3 dropped)": dict(sf_dtype=E4M3, sf_vec_size=32),
        "E4M3 x F4, E4M3, 16 (mixed)": dict(sf_dtype=E4M3, sf_vec_size=16, a=E4M3),
    }
    out: dict = {}

    def body():
        for name, kw in cases.items():
            out[name] = _op_info(_blockscaled_mma(**kw))
        mn = sm100_utils.make_blockscaled_trivial_tiled_mma(
            F4, F4, MNMAJ, MNMAJ, E4M3, 16, ONE, TILE_MN
        )
        out["F4 x F4 requested MN-major"] = _op_info(mn)
        # The DSL <= 4.4 signature (one ab_dtype) still builds on 4.8.1, with a deprecation.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            legacy = sm100_utils.make_blockscaled_trivial_tiled_mma(
                F4, KMAJ, KMAJ, E4M3, 16, ONE, TILE_MN
            )
        out["nvfp4, one-dtype (DSL <= 4.4) signature"] = _op_info(legacy)

    exc = _run_jit(body)
    return Finding(
        key="blockscaled_builder_ops",
        summary=(
            "make_blockscaled_trivial_tiled_mma: FP4 x FP4 gives MmaMXF4NVF4Op (sf_vec_size 16) "
            "or MmaMXF4Op (sf_vec_size 32), K = 64, always K-major; a mixed FP8 x FP4 pair "
            "gives MmaMXF8F6F4Op with K = 32, sf_vec_size 32 and E8M0 whatever was asked"
        ),
        **_outcome(exc),
        details=out,
    )


# ------------------------------------------------------------------------------------------
# 1a (PTX). What instruction does each choice become?
# ------------------------------------------------------------------------------------------
MMA_VARIANTS = (
    "plain_builder",
    "blockscaled_with_scales",
    "blockscaled_with_set_fields",
    "blockscaled_without_scales",
)


def _mma_kernel_body(variant: str, want_scales_on_plain: bool = False, sf_vec_size: int = 16):
    tiler = (*TILE_MN, 256)
    sf_dtype = E4M3 if sf_vec_size == 16 else E8M0
    vec = sf_vec_size

    def body():
        if cutlass.const_expr(variant == "plain_builder"):
            tiled_mma = _plain_mma()
        else:
            tiled_mma = _blockscaled_mma(sf_dtype=sf_dtype, sf_vec_size=vec)
        layout_a = sm100_utils.make_smem_layout_a(tiled_mma, tiler, F4, 1)
        layout_b = sm100_utils.make_smem_layout_b(tiled_mma, tiler, F4, 1)
        ptr_a = cute.make_ptr(F4, 0, cute.AddressSpace.smem, assumed_align=1024)
        ptr_b = cute.make_ptr(F4, 65536, cute.AddressSpace.smem, assumed_align=1024)
        s_a = cute.make_tensor(cute.recast_ptr(ptr_a, layout_a.inner, dtype=F4), layout_a.outer)
        s_b = cute.make_tensor(cute.recast_ptr(ptr_b, layout_b.inner, dtype=F4), layout_b.outer)
        frag_a = tiled_mma.make_fragment_A(s_a)
        frag_b = tiled_mma.make_fragment_B(s_b)
        acc = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C(TILE_MN))
        tmem_acc = cute.make_ptr(cutlass.Float32, 256, cute.AddressSpace.tmem, assumed_align=16)
        t_acc = cute.make_tensor(tmem_acc, acc.layout)
        # TMEM: the accumulator at 256, SFA at 128 and SFB at 144, so that the addresses in the
        # PTX tell the operands apart.
        s_sfa = blockscaled_utils.make_smem_layout_sfa(tiled_mma, tiler, vec, 1)
        s_sfb = blockscaled_utils.make_smem_layout_sfb(tiled_mma, tiler, vec, 1)
        t_sfa_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma, tiler, vec, cute.slice_(s_sfa, (None, None, None, 0))
        )
        t_sfb_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, tiler, vec, cute.slice_(s_sfb, (None, None, None, 0))
        )
        t_sfa = cute.make_tensor(
            cute.make_ptr(sf_dtype, 128, cute.AddressSpace.tmem, assumed_align=16), t_sfa_layout
        )
        t_sfb = cute.make_tensor(
            cute.make_ptr(sf_dtype, 144, cute.AddressSpace.tmem, assumed_align=16), t_sfb_layout
        )
        a0 = frag_a[(None, None, 0, 0)]
        b0 = frag_b[(None, None, 0, 0)]
        if cutlass.const_expr(variant == "blockscaled_with_scales" or want_scales_on_plain):
            sfa0 = t_sfa[(None, None, 0)]
            sfb0 = t_sfb[(None, None, 0)]
            cute.gemm(tiled_mma, t_acc, [a0, sfa0], [b0, sfb0], t_acc)
        elif cutlass.const_expr(variant == "blockscaled_with_set_fields"):
            # DSL <= 4.3 has no list form: the scale addresses are fields of the MMA atom.
            tiled_mma.set(tcgen05.Field.SFA, t_sfa[(None, None, 0)].iterator)
            tiled_mma.set(tcgen05.Field.SFB, t_sfb[(None, None, 0)].iterator)
            cute.gemm(tiled_mma, t_acc, a0, b0, t_acc)
        else:
            cute.gemm(tiled_mma, t_acc, a0, b0, t_acc)

    return body


def mma_ptx(variant: str, sf_vec_size: int = 16) -> Finding:
    """Cross-compile one MMA of ``variant`` and return its ``tcgen05.mma`` PTX lines.

    ``sf_vec_size`` 16 is NVFP4 (E4M3 scales), 32 is MXFP4 (E8M0 scales).
    """
    if variant not in MMA_VARIANTS:
        raise ValueError(f"variant must be one of {MMA_VARIANTS}")
    body = _mma_kernel_body(variant, sf_vec_size=sf_vec_size)
    exc, ptx = _compile_kernel(body, keep_ptx=True)
    lines = [ln.strip() for ln in ptx.splitlines() if "tcgen05.mma" in ln]
    operands = [mma_operands(ln) for ln in lines]
    # Constant registers (mov.b32 %rN, value;) so that TMEM addresses can be read off the PTX.
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+),\s*(-?\d+);", ptx))
    tmem_addresses = [
        {
            name: int(consts.get(operand.strip("[]"), -1))
            for name, operand in zip(("d", "sfa", "sfb"), (ops[0], ops[4], ops[5]), strict=True)
        }
        for ops in operands
        if len(ops) >= 7
    ]
    summaries = {
        "plain_builder": "plain builder: the PTX is a non-scaled tcgen05.mma ... kind::f8f6f4",
        "blockscaled_with_scales": (
            "block-scaled MMA with [a, sfa], [b, sfb]: kind::mxf4nvf4.block_scale.block16 "
            "(NVFP4) or .block32 (MXFP4), scale-factor TMEM addresses distinct from the "
            "accumulator"
        ),
        "blockscaled_with_set_fields": (
            "block-scaled MMA with tiled_mma.set(Field.SFA / Field.SFB, ptr) and cute.gemm(mma, "
            "d, a, b, c) (the DSL <= 4.3 way): the same instruction, reading the set addresses"
        ),
        "blockscaled_without_scales": (
            "block-scaled MMA called as cute.gemm(mma, d, a, b, c): compiles without a "
            "word, and both scale-factor operands are TMEM address 0 (the atom's default)"
        ),
    }
    return Finding(
        key=f"mma_ptx[{variant}, sf_vec_size={sf_vec_size}]",
        summary=summaries[variant],
        **_outcome(exc),
        details={"mma_lines": lines, "operands": operands, "tmem_addresses": tmem_addresses},
    )


def mma_operands(line: str) -> list[str]:
    """Operands of one ``tcgen05.mma`` PTX line: [d_tmem, a_desc, b_desc, idesc, ...]."""
    body = line.split(None, 1)[1].rstrip(";").strip()
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def gemm_with_scales_on_plain_mma() -> Finding:
    """Passing ``[a, sfa]`` to the plain (non-scaled) MMA that the plain builder returned."""
    exc, _ = _compile_kernel(_mma_kernel_body("plain_builder", want_scales_on_plain=True))
    return Finding(
        key="gemm_with_scales_on_plain_mma",
        summary="cute.gemm(plain_mma, d, [a, sfa], [b, sfb], c) fails MLIR verification",
        **_outcome(exc),
    )


def set_scale_field_on_plain_mma() -> Finding:
    """``tiled_mma.set(tcgen05.Field.SFA, ptr)`` on the plain MMA (the FP8 atom has no SF)."""

    def body():
        tmem = cute.make_ptr(E4M3, 0, cute.AddressSpace.tmem, assumed_align=16)
        _plain_mma().set(tcgen05.Field.SFA, tmem)

    exc = _run_jit(body)
    return Finding(
        key="set_scale_field_on_plain_mma",
        summary="Field.SFA / Field.SFB do not exist on a non-scaled tcgen05 MMA",
        **_outcome(exc),
    )


# ------------------------------------------------------------------------------------------
# The trace-time guard the guide recommends (blockwise_gemm_fp4.assert_block_scaled_fp4_mma
# does the same); guard_verdicts runs either over the same cases
# ------------------------------------------------------------------------------------------
def assert_block_scaled_fp4_mma(tiled_mma, sf_vec_size, sf_dtype):
    op = tiled_mma.op
    want = tcgen05.MmaMXF4NVF4Op if sf_vec_size == 16 else tcgen05.MmaMXF4Op
    if not (
        isinstance(op, want)
        and op.sf_vec_size == sf_vec_size
        and op.sf_dtype is sf_dtype
        and op.shape_mnk[2] == 64
    ):
        raise TypeError(
            f"expected a block-scaled FP4 MMA ({want.__name__}, sf_vec_size={sf_vec_size}, "
            f"{sf_dtype.__name__}), got {type(op).__name__}: {op}"
        )


GUARD_CASES = {
    # name: (builder, requested sf_vec_size, requested sf_dtype)
    "nvfp4 op": (lambda: _blockscaled_mma(sf_dtype=E4M3, sf_vec_size=16), 16, E4M3),
    "mxfp4 op": (lambda: _blockscaled_mma(sf_dtype=E8M0, sf_vec_size=32), 32, E8M0),
    "plain F8F6F4 op": (lambda: _plain_mma(), 16, E4M3),
    "E8M0 x 16 asked as NVFP4": (lambda: _blockscaled_mma(sf_dtype=E8M0, sf_vec_size=16), 16, E4M3),
    "E4M3 x 32 (became E8M0)": (lambda: _blockscaled_mma(sf_dtype=E4M3, sf_vec_size=32), 32, E4M3),
    "mixed FP8 x FP4 (MXF8F6F4)": (
        lambda: _blockscaled_mma(sf_dtype=E8M0, sf_vec_size=32, a=E4M3),
        32,
        E8M0,
    ),
}


def guard_verdicts(guard=assert_block_scaled_fp4_mma) -> Finding:
    """Which tiled MMAs ``guard`` accepts (True) or rejects (False)."""
    out: dict = {}

    def body():
        for name, (build, vec, sf_dtype) in GUARD_CASES.items():
            try:
                guard(build(), vec, sf_dtype)
                out[name] = True
            except TypeError:
                out[name] = False

    exc = _run_jit(body)
    return Finding(
        key="guard_verdicts",
        summary="the recommended guard accepts exactly the NVFP4 and MXFP4 ops",
        **_outcome(exc),
        details=out,
    )


# ------------------------------------------------------------------------------------------
# 1b. The FP8 blockwise example's own code path: its scale checks and its accumulator update
# ------------------------------------------------------------------------------------------
# CUTLASS v4.7.0, examples/python/CuTeDSL/cute/blackwell/kernel/blockwise_gemm/blockwise_gemm.py
# (``BlockwiseGemmKernel``).  Its ``_setup_attributes`` derives the K tile from the MMA (4
# instructions) and checks, in this order, these three ratios of the CTA tile to the scale
# granularity; the messages below are the ones it raises.
FP8_EXAMPLE_URL = (
    "https://github.com/NVIDIA/cutlass/blob/v4.7.0/examples/python/CuTeDSL/cute/blackwell/"
    "kernel/blockwise_gemm/blockwise_gemm.py"
)
FP8_EXAMPLE_CHECKS = (
    ("scale_k_per_tile", "scale_k_per_tile must be 1"),
    ("scale_m_per_tile", "scale_m_per_tile must be cta_tile_m"),
    ("scale_n_per_tile", "scale_n_per_tile must be 1"),
)
# Its ``run`` raises this (format) when ``can_implement`` refuses the dtypes (FP8 only).
FP8_EXAMPLE_UNSUPPORTED = "TypeError: Unsupported testcase {ab_dtype}, ..."
# DSL <= 4.4, ``make_trivial_tiled_mma`` for any dtype it did not know (FP4 included), as in
# python/CuTeDSL/cutlass/utils/blackwell_helpers.py at CUTLASS v4.3.5 and v4.4.2; 4.5.0 dropped it.
DSL_44_PLAIN_BUILDER_ERROR = "TypeError: unsupported ab_dtype, got Float4E2M1FN"
DSL_44_SOURCE = "python/CuTeDSL/cutlass/utils/blackwell_helpers.py at CUTLASS v4.3.5 and v4.4.2"
FP8_EXAMPLE_MMAS = ("fp8", "fp4 plain (the example's call)", "fp4 block-scaled")


def _fp8_example_mma(mma: str):
    if mma == "fp8":
        return sm100_utils.make_trivial_tiled_mma(
            E4M3, E4M3, KMAJ, KMAJ, cutlass.Float32, ONE, TILE_MN
        )
    if mma == "fp4 plain (the example's call)":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return sm100_utils.make_trivial_tiled_mma(F4, KMAJ, KMAJ, cutlass.Float32, ONE, TILE_MN)
    return _blockscaled_mma()


def fp8_example_scale_checks(
    mma: str, scale_granularity_n: int = 128, scale_granularity_k: int = 128
) -> Finding:
    """The FP8 example's tile and scale-granularity checks, computed as it computes them.

    ``mma`` picks the tiled MMA its ``_setup_attributes`` builds: its own FP8 one, what its
    single-dtype ``make_trivial_tiled_mma(a_dtype, ...)`` call builds for Float4E2M1FN, or the
    block-scaled FP4 MMA a port swaps in.  ``message`` is the first check that fails.
    """
    if mma not in FP8_EXAMPLE_MMAS:
        raise ValueError(f"mma must be one of {FP8_EXAMPLE_MMAS}")
    out: dict = {}

    def body():
        tiled_mma = _fp8_example_mma(mma)
        k_tile = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4
        cta_tile = (TILE_MN[0], TILE_MN[1], k_tile)
        out["op"] = type(tiled_mma.op).__name__
        out["k_tile"] = k_tile
        out["scale_m_per_tile"] = cta_tile[0] // 1
        out["scale_n_per_tile"] = cta_tile[1] // scale_granularity_n
        out["scale_k_per_tile"] = cta_tile[2] // scale_granularity_k

    exc = _run_jit(body)
    if exc is not None:
        return Finding(key="fp8_example_scale_checks", summary="", **_outcome(exc))
    want = {"scale_k_per_tile": 1, "scale_m_per_tile": TILE_MN[0], "scale_n_per_tile": 1}
    failed = [msg for name, msg in FP8_EXAMPLE_CHECKS if out[name] != want[name]]
    # Nothing is raised here: the message is the one the example's check would raise.
    return Finding(
        key=f"fp8_example_scale_checks[{mma}, n={scale_granularity_n}, k={scale_granularity_k}]",
        summary="BlockwiseGemmKernel._setup_attributes: K tile and scale-per-tile checks",
        would_raise="ValueError" if failed else None,
        message=failed[0] if failed else "",
        details=out,
    )


def quoted_messages() -> list[Finding]:
    """Messages the guide quotes that no code here can raise with DSL 4.8.1."""
    ab_dtype_cls, ab_dtype_msg = DSL_44_PLAIN_BUILDER_ERROR.split(": ", 1)
    example_cls, example_msg = FP8_EXAMPLE_UNSUPPORTED.format(ab_dtype="Float4E2M1FN").split(
        ": ", 1
    )
    return [
        Finding(
            key="dsl_44_plain_builder_error",
            summary="make_trivial_tiled_mma(Float4E2M1FN, ...) on DSL <= 4.4",
            would_raise=ab_dtype_cls,
            message=ab_dtype_msg,
            quoted_from=DSL_44_SOURCE,
        ),
        Finding(
            key="fp8_example_unsupported",
            summary="the FP8 example's run() when its is_valid_dtypes refuses FP4",
            would_raise=example_cls,
            message=example_msg,
            quoted_from=FP8_EXAMPLE_URL,
        ),
    ]


def fp8_example_scale_product(scale_granularity_n: int, ab_dtype=E4M3) -> Finding:
    """The FP8 example's accumulator update, ``scale = scale_a * scale_b``, for one subtile.

    As its ``acc_update_tmem_copy_and_partition`` and accumulator-update warps do: SFA and SFB
    viewed "as C" ((1, M) x N and M x (granularity_n, N / granularity_n), zero strides over the
    broadcast modes, a stage mode), divided into epilogue subtiles, partitioned by the
    tcgen05.ld 32x32b.x32 copy of the accumulator, then one stage's registers, one subtile each,
    multiplied as TensorSSA values.  FP8 data throughout: the N granularity alone decides.
    """
    out: dict = {}

    def body():
        if cutlass.const_expr(ab_dtype is F4):
            tiled_mma = _blockscaled_mma()
        else:
            tiled_mma = sm100_utils.make_trivial_tiled_mma(
                ab_dtype, ab_dtype, KMAJ, KMAJ, cutlass.Float32, ONE, TILE_MN
            )
        cta_tile = (*TILE_MN, cute.size(tiled_mma.shape_mnk, mode=[2]) * 4)
        n_per_tile = cta_tile[1] // scale_granularity_n
        num_scale_stage = 2
        epi_tile = sm100_utils.compute_epilogue_tile_shape(
            cta_tile, False, LayoutEnum.ROW_MAJOR, cutlass.BFloat16
        )
        smem = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.smem, assumed_align=16)
        sSFA_view_as_C = cute.make_tensor(
            smem,
            cute.make_layout(
                ((1, cta_tile[0]), cta_tile[1], num_scale_stage), stride=((0, 1), 0, cta_tile[0])
            ),
        )
        sSFB_view_as_C = cute.make_tensor(
            smem,
            cute.make_layout(
                (cta_tile[0], (scale_granularity_n, n_per_tile), num_scale_stage),
                stride=(0, (0, 1), n_per_tile),
            ),
        )
        acc_shape = tiled_mma.partition_shape_C(TILE_MN)
        tmem = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem, assumed_align=16)
        tAcc = cute.make_tensor(tmem, tiled_mma.make_fragment_C(cute.append(acc_shape, 1)).layout)
        tAcc_epi = cute.flat_divide(tAcc[((None, None), 0, 0, None)], epi_tile)
        load_atom = cute.make_copy_atom(
            tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), cutlass.Float32
        )
        thr_t2r = tcgen05.make_tmem_copy(load_atom, tAcc_epi[(None, None, 0, 0, 0)]).get_slice(0)
        tTR_sSFA = thr_t2r.partition_D(cute.flat_divide(sSFA_view_as_C, epi_tile))
        tTR_sSFB = thr_t2r.partition_D(cute.flat_divide(sSFB_view_as_C, epi_tile))
        tTR_rSFA = cute.make_rmem_tensor(
            cute.slice_(tTR_sSFA, (None, None, None, 0, None, 0)).shape, cutlass.Float32
        )
        tTR_rSFB = cute.make_rmem_tensor(
            cute.slice_(tTR_sSFB, (None, None, None, 0, None, 0)).shape, cutlass.Float32
        )
        scale_a = tTR_rSFA[(None, None, None, 0)].load()
        scale_b = tTR_rSFB[(None, None, None, 0)].load()
        out["scale_a_shape"] = str(scale_a.shape)
        out["scale_b_shape"] = str(scale_b.shape)
        scale_a * scale_b  # noqa: B018 - the product is the probe

    exc = _run_jit(body)
    return Finding(
        key=f"fp8_example_scale_product[{scale_granularity_n}, {ab_dtype.__name__}]",
        summary=(
            "the FP8 example's scale = scale_a * scale_b with scale_granularity_n="
            f"{scale_granularity_n} ({ab_dtype.__name__} data)"
        ),
        **_outcome(exc),
        details=out,
    )


# ------------------------------------------------------------------------------------------
# 1c. Other things an FP8 -> FP4 port meets
# ------------------------------------------------------------------------------------------
def fp8_k_tile_on_fp4_mma() -> Finding:
    """Keeping FP8's K tiles (32 = one FP8 MMA, 128 = four) with the K=64 FP4 MMA."""
    out: dict = {}

    def body():
        tiled_mma = _blockscaled_mma()
        for k_tile in (128, 256):
            layout_a = sm100_utils.make_smem_layout_a(tiled_mma, (*TILE_MN, k_tile), F4, 1)
            out[f"smem_a_k{k_tile}"] = str(layout_a)
            out[f"swizzle_k{k_tile}"] = str(layout_a.inner)
        try:
            blockscaled_utils.make_smem_layout_sfa(tiled_mma, (*TILE_MN, 32), 16, 1)
            out["sfa_k32"] = "no error"
        except Exception as exc:  # noqa: BLE001 - the exception is the finding
            out["sfa_k32_raised"] = type(exc).__name__
            out["sfa_k32"] = error_line(exc)

    exc = _run_jit(body)
    return Finding(
        key="fp8_k_tile_on_fp4_mma",
        summary=(
            "K tile 32 (one FP8 MMA) breaks the SFA layout; K tile 128 silently gets a 64-byte "
            "swizzle (S<2,4,3>), K tile 256 the 128-byte one (S<3,4,3>)"
        ),
        raised=out.get("sfa_k32_raised") or (type(exc).__name__ if exc else None),
        message=out.get("sfa_k32", error_line(exc) if exc else ""),
        details=out,
    )


MMA_SHAPE_CASES = {
    "tile M 64 on one CTA (allowed for FP8)": dict(tile_mn=(64, 128)),
    "tile N 8 on a CTA pair": dict(cta_group=TWO, tile_mn=(256, 8)),
    "sf_vec_size 64": dict(sf_vec_size=64),
    "scale dtype Float8E5M2": dict(sf_dtype=cutlass.Float8E5M2),
}


def blockscaled_mma_errors() -> Finding:
    """Messages of the block-scaled FP4 MMA for shapes / scale settings it does not support."""
    out: dict = {}
    for name, kw in MMA_SHAPE_CASES.items():

        def body(kw=kw):
            _blockscaled_mma(**kw)

        exc = _run_jit(body)
        out[name] = (type(exc).__name__, error_line(exc)) if exc else (None, "no error")
    return Finding(
        key="blockscaled_mma_errors",
        summary="shape / scale-factor errors of make_blockscaled_trivial_tiled_mma",
        details=out,
    )


def two_cta_cluster_error() -> Finding:
    """Tile M 256 (a CTA pair) with a cluster of M = 1."""

    def body():
        tiled_mma = _blockscaled_mma(cta_group=TWO, tile_mn=(256, 128))
        sm100_utils.cluster_shape_to_tma_atom_A((1, 1, 1), tiled_mma.thr_id)

    exc = _run_jit(body)
    return Finding(
        key="two_cta_cluster_error",
        summary="a 256-row MMA tile runs on 2 CTAs: the cluster's M must be even",
        **_outcome(exc),
    )


def tma_with_k_not_multiple_of_32(k: int = 48) -> Finding:
    """TMA for a K-major FP4 A with K = 48 (24-byte rows): does the compiler object?"""
    from cutlass.cute.runtime import make_fake_compact_tensor

    @cute.jit
    def host(a: cute.Tensor):
        tiled_mma = _blockscaled_mma()
        tiler = (*TILE_MN, 256)
        layout_a = sm100_utils.make_smem_layout_a(tiled_mma, tiler, F4, 2)
        cute.nvgpu.make_tiled_tma_atom_A(
            cpasync.CopyBulkTensorTileG2SOp(ONE),
            a,
            cute.slice_(layout_a, (None, None, None, 0)),
            tiler,
            tiled_mma,
            (1, 1, 1, 1),
        )

    a = make_fake_compact_tensor(F4, (256, k, 1), stride_order=(1, 0, 2), assumed_align=16)
    with tempfile.TemporaryDirectory() as dump_dir:
        try:
            cute.compile(host, a, options=f"--dump-dir={dump_dir}")
            exc = None
        except Exception as e:  # noqa: BLE001 - the exception is the finding
            exc = e
    return Finding(
        key="tma_with_k_not_multiple_of_32",
        summary=(
            f"K={k} FP4 ({k // 2}-byte rows) compiles: the 16-byte TMA row rule is only "
            "enforced when the driver encodes the tensor map at launch"
        ),
        **_outcome(exc),
        details={"k": k, "row_bytes": k // 2},
    )


S2T_CASES = {
    # name: (operand, MMA tile (M, N), CTA group)
    "SFA, 128 x 128": ("sfa", (128, 128), ONE),
    "SFB, 128 x 64": ("sfb", (128, 64), ONE),
    "SFB, 128 x 256": ("sfb", (128, 256), ONE),
    "SFA, 256 x 128, CTA pair": ("sfa", (256, 128), TWO),
}


def _s2t_copy_body(operand: str, tile_mn, cta_group, broadcast: bool):
    tiler = (*tile_mn, 256)

    def body():
        tiled_mma = _blockscaled_mma(cta_group=cta_group, tile_mn=tile_mn)
        make_smem, make_tmem = (
            (blockscaled_utils.make_smem_layout_sfa, blockscaled_utils.make_tmem_layout_sfa)
            if operand == "sfa"
            else (blockscaled_utils.make_smem_layout_sfb, blockscaled_utils.make_tmem_layout_sfb)
        )
        smem_layout = make_smem(tiled_mma, tiler, 16, 2)
        tmem_layout = make_tmem(
            tiled_mma, tiler, 16, cute.slice_(smem_layout, (None, None, None, 0))
        )
        ptr = cute.make_ptr(E4M3, 0, cute.AddressSpace.smem, assumed_align=1024)
        sSF = cute.make_tensor(ptr, smem_layout)
        tSF = cute.make_tensor(
            cute.make_ptr(E4M3, 128, cute.AddressSpace.tmem, assumed_align=16), tmem_layout
        )
        # As the kernel's _s2t_copy_and_partition, with or without the explicit broadcast mode.
        sSF_compact = cute.filter_zeros(sSF)
        tSF_compact = cute.filter_zeros(tSF)
        copy_atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(cta_group), E4M3)
        tiled_copy = tcgen05.make_s2t_copy(copy_atom, tSF_compact)
        thr_copy = tiled_copy.get_slice(0)
        src = sSF_compact
        if cutlass.const_expr(broadcast):
            src = tcgen05.append_s2t_broadcast_mode(copy_atom.op, sSF_compact)
        tCsSF = tcgen05.get_s2t_smem_desc_tensor(tiled_copy, thr_copy.partition_S(src))
        tCtSF = thr_copy.partition_D(tSF_compact)
        cute.copy(tiled_copy, tCsSF[(None, None, None, None, 1)], tCtSF)

    return body


def s2t_copy_ptx() -> Finding:
    """The kernel's SMEM -> TMEM scale copy with and without ``append_s2t_broadcast_mode``.

    That helper is only in the 4.8 wheels; CUTLASS's examples partition ``sSF_compact``
    directly.  Per case: whether the two kernels' PTX bodies are equal, and the copy count.
    """
    out: dict = {}
    for name, (operand, tile_mn, cta_group) in S2T_CASES.items():
        bodies = []
        for broadcast in (False, True):
            exc, ptx = _compile_kernel(
                _s2t_copy_body(operand, tile_mn, cta_group, broadcast), keep_ptx=True
            )
            if exc is not None:
                return Finding(key="s2t_copy_ptx", summary=name, **_outcome(exc))
            # From the kernel's entry on: the header names the module, which differs.
            bodies.append(ptx[ptx.index(".entry") :])
        out[name] = {
            "same_ptx": bodies[0] == bodies[1],
            "tcgen05_cp": sum("tcgen05.cp" in ln for ln in bodies[1].splitlines()),
        }
    return Finding(
        key="s2t_copy_ptx",
        summary=(
            "tcgen05.cp of one stage of scales: the PTX with append_s2t_broadcast_mode equals "
            "the PTX without it"
        ),
        details=out,
    )


def hardware_budgets() -> Finding:
    """The DSL's own numbers for SMEM per CTA and TMEM columns on sm_100."""
    import cutlass.memory

    return Finding(
        key="hardware_budgets",
        summary="sm_100: dynamic SMEM per CTA and TMEM columns per SM, as the DSL reports them",
        details={
            "smem_bytes": cutlass.memory.get_smem_capacity_in_bytes("sm_100"),
            "tmem_columns": cute.arch.get_max_tmem_alloc_cols("sm_100"),
        },
    )


def _flatten(t) -> list[int]:
    return [x for s in t for x in _flatten(s)] if isinstance(t, tuple) else [t]


def _crd2idx(i: int, shape, stride) -> int:
    """Offset of the 1-D (colexicographic) coordinate ``i`` in a static (shape, stride) mode."""
    idx = 0
    for s, d in zip(_flatten(shape), _flatten(stride), strict=True):
        idx += (i % s) * d
        i //= s
    return idx


def dsl_sf_offsets(rows: int, k: int, sf_vec_size: int) -> list[list[int]]:
    """Offsets of scale (r, c) in the DSL's own global SF layout (``tile_atom_to_shape_SF``).

    Row r, scale column c (the c-th group of ``sf_vec_size`` K elements); rows and columns are
    padded to the 128 x 4 atom.  Computed from the layout's static shape and stride.
    """
    out: dict = {}

    def body():
        layout = blockscaled_utils.tile_atom_to_shape_SF((rows, k, 1), sf_vec_size)
        out["shape"] = layout.shape
        out["stride"] = layout.stride

    exc = _run_jit(body)
    if exc:
        raise exc
    shape, stride = out["shape"], out["stride"]
    n_rows = 1
    for s in _flatten(shape[0]):
        n_rows *= s
    n_k = 1
    for s in _flatten(shape[1]):
        n_k *= s
    return [
        [
            _crd2idx(r, shape[0], stride[0]) + _crd2idx(c * sf_vec_size, shape[1], stride[1])
            for c in range(n_k // sf_vec_size)
        ]
        for r in range(n_rows)
    ]


TMEM_LANE_STRIDE = 65536 * 4  # one TMEM lane, in 8-bit elements (65536 columns of 4 bytes)


def dsl_tmem_sf_positions(
    sf_vec_size: int, operand: str = "sfa", tile_n: int = 128
) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    """Where ``make_tmem_layout_sfa`` (or ``_sfb``) puts each scale of one K tile (K 256) in TMEM.

    For each row r of the layout (128 for SFA; SFB's tile_n rounded up to 128) and scale column
    c < 256 / sf_vec_size: the sorted (lane, column, byte) of every copy, relative to the base
    address, from the layout's static shape and stride (an MMA tile of 128 x tile_n).
    """
    out: dict = {}
    tile_mn = (TILE_MN[0], tile_n)
    tiler = (*tile_mn, 256)
    make_smem, make_tmem = {
        "sfa": (blockscaled_utils.make_smem_layout_sfa, blockscaled_utils.make_tmem_layout_sfa),
        "sfb": (blockscaled_utils.make_smem_layout_sfb, blockscaled_utils.make_tmem_layout_sfb),
    }[operand]

    def body():
        tiled_mma = _blockscaled_mma(
            sf_dtype=E4M3 if sf_vec_size == 16 else E8M0, sf_vec_size=sf_vec_size, tile_mn=tile_mn
        )
        smem = make_smem(tiled_mma, tiler, sf_vec_size, 1)
        layout = make_tmem(tiled_mma, tiler, sf_vec_size, cute.slice_(smem, (None, None, None, 0)))
        out["shape"], out["stride"] = layout.shape, layout.stride

    exc = _run_jit(body)
    if exc:
        raise exc
    shape, stride = out["shape"], out["stride"]
    (rows_shape, k_shape), (rows_stride, k_stride) = shape[0], stride[0]
    # ((rows, replicas), K): the replica mode is tcgen05.cp's copy to all four lane quadrants.
    n_rows = 1
    for s in _flatten(rows_shape[0]):
        n_rows *= s
    replicas = 1
    for s in _flatten(rows_shape[1]):
        replicas *= s
    mma_k = 64
    positions = {}
    for r in range(n_rows):
        for c in range(256 // sf_vec_size):
            k = c * sf_vec_size
            copies = []
            for q in range(replicas):
                off = (
                    _crd2idx(r + n_rows * q, rows_shape, rows_stride)
                    + _crd2idx(k % mma_k, k_shape, k_stride)
                    + _crd2idx(k // mma_k, shape[2], stride[2])
                )
                lane, rest = divmod(off, TMEM_LANE_STRIDE)
                copies.append((lane, rest // 4, rest % 4))
            positions[(r, c)] = sorted(copies)
    return positions


# ------------------------------------------------------------------------------------------
# 2. DSL versions.  Facts about releases other than the pinned one cannot be reproduced here:
# each was read from CUTLASS's python/CuTeDSL (the DSL's Python layer) at the tags named, or
# from the wheels named; tests/test_docs.py checks the guide's table against these and the
# pinned column against the installed DSL.
# ------------------------------------------------------------------------------------------
OLDER_DSL_TAGS = {"4.3": "v4.3.5", "4.4": "v4.4.2", "4.5": "v4.5.0"}
# name: (first release that has it, where that was read)
VERSION_FACTS = {
    "cute.gemm([a, sfa], [b, sfb])": ("4.4", "cutlass/cute/algorithm.py at v4.3.5 and v4.4.0"),
    "tcgen05.Field.SFA / SFB": ("4.3", "cutlass/cute/nvgpu/tcgen05/mma.py at v4.3.0"),
    "a_dtype, b_dtype builders": ("4.5", "cutlass/utils/blackwell_helpers.py at v4.4.2, v4.5.0"),
    "cutlass.__version__": ("4.4", "cutlass/__init__.py at v4.3.5 and v4.4.0"),
    "nvidia-cutlass-dsl[cu13]": ("4.4", "python/CuTeDSL/requirements-cu13.txt at v4.4.0"),
    # Absent from python/CuTeDSL at every tag up to v4.7.0 and at main (7107b0553, 2026-08-20),
    # and from the nvidia-cutlass-dsl-libs-core 4.6.3, 4.7.0 and 4.7.1 wheels.
    "tcgen05.append_s2t_broadcast_mode": ("4.8", "nvidia-cutlass-dsl-libs-core 4.8.0 wheel"),
    "cutlass.memory": ("4.8", "nvidia-cutlass-dsl-libs-core 4.8.0 wheel"),
}


def all_findings() -> list[Finding]:
    findings = [plain_builder_with_fp4(), blockscaled_builder_ops()]
    findings += [mma_ptx(v) for v in MMA_VARIANTS]
    findings.append(mma_ptx("blockscaled_with_scales", sf_vec_size=32))
    findings += [
        gemm_with_scales_on_plain_mma(),
        set_scale_field_on_plain_mma(),
        s2t_copy_ptx(),
        fp8_example_scale_checks("fp8"),
        fp8_example_scale_checks("fp4 plain (the example's call)"),
        fp8_example_scale_checks("fp4 block-scaled"),
        fp8_example_scale_checks("fp8", scale_granularity_n=16),
        *[fp8_example_scale_product(g) for g in (1, 2, 4, 8, 16, 32, 64, 128)],
        fp8_example_scale_product(16, F4),
        fp8_k_tile_on_fp4_mma(),
        blockscaled_mma_errors(),
        two_cta_cluster_error(),
        tma_with_k_not_multiple_of_32(),
        hardware_budgets(),
        guard_verdicts(),
        *quoted_messages(),
    ]
    return findings


def outcome_line(f: Finding) -> str:
    """How ``main`` reports a finding's message: raised here, computed, quoted, or plain."""
    if f.raised:
        return f"raises {f.raised}: {f.message}"
    if f.quoted_from:
        return f"quoted, not raised here, from {f.quoted_from}: {f.would_raise}: {f.message}"
    if f.would_raise:
        return f"nothing raised; the FP8 example would raise {f.would_raise}: {f.message}"
    return f.message


def main() -> None:
    print(f"nvidia-cutlass-dsl {cutlass.__version__}, CUTE_DSL_ARCH={os.environ['CUTE_DSL_ARCH']}")
    for f in all_findings():
        print(f"\n== {f.key}\n   {f.summary}")
        line = outcome_line(f)
        if line:
            print(f"   {line}")
        for name, value in f.details.items():
            print(f"   {name}: {value}")


if __name__ == "__main__":
    main()
