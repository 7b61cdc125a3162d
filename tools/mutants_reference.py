"""Single-line mutants of reference.py for tools/mutate.py: small, realistic bugs, each of which
tests/test_reference.py must catch. Keep every ``old`` text current as reference.py changes
(``python tools/mutate.py --list`` flags stale ones)."""

TESTS = ["tests/test_reference.py"]


def mutant(mutant_id: str, klass: str, old: str, new: str, equivalent: str = "") -> dict:
    m = {
        "id": mutant_id,
        "klass": klass,
        "file": "reference.py",
        "old": old,
        "new": new,
        "tests": TESTS,
    }
    if equivalent:
        m["equivalent"] = equivalent
    return m


MUTANTS = [
    # ------------------------------------------------------------------ E2M1 rounding
    mutant(
        "ref-round-compares-in-fp32",
        "rounding",
        "mag = t.abs()",
        "mag = t.abs().float()",
    ),
    mutant(
        "ref-round-ties-away",
        "rounding",
        "passed = mag >= mid if i % 2 else mag > mid",
        "passed = mag >= mid",
    ),
    mutant(
        "ref-round-ties-odd",
        "rounding",
        "passed = mag >= mid if i % 2 else mag > mid",
        "passed = mag > mid if i % 2 else mag >= mid",
    ),
    mutant(
        "ref-round-midpoint-4.5",
        "rounding",
        "_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)",
        "_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 4.5)",
    ),
    mutant(
        "ref-round-negative-zero-unsigned",
        "rounding",
        "return index | (torch.signbit(t).to(torch.uint8) << 3)",
        "return index | ((t < 0).to(torch.uint8) << 3)",
    ),
    mutant(
        "ref-decode-magnitude-5",
        "rounding",
        "_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)",
        "_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0)",
    ),
    # ------------------------------------------------------------------ packing
    mutant(
        "ref-pack-high-nibble-first",
        "packing",
        "return c[..., 0::2] | (c[..., 1::2] << 4)",
        "return c[..., 1::2] | (c[..., 0::2] << 4)",
    ),
    mutant(
        "ref-unpack-high-nibble-first",
        "packing",
        "torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)",
        "torch.stack((p >> 4, p & 0xF), dim=-1).flatten(-2)",
    ),
    mutant(
        "ref-unpack-halves-not-interleaved",
        "packing",
        "torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)",
        "torch.cat((p & 0xF, p >> 4), dim=-1)",
    ),
    # ------------------------------------------------------------------ scale decode / encode
    mutant(
        "ref-scale-raw-bits",
        "scale decode",
        "per_block = scales.float().to(dtype).unsqueeze(-1)",
        "per_block = scales.view(torch.uint8).float().to(dtype).unsqueeze(-1)",
    ),
    mutant("ref-e8m0-bias-128", "scale decode", "E8M0_BIAS = 127", "E8M0_BIAS = 128"),
    mutant(
        "ref-mxfp4-power-of-two-rounds-up",
        "scale choice",
        "exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)",
        "exponent = torch.where(mantissa == 0.5, exponent, exponent)",
    ),
    mutant(
        "ref-mxfp4-scale-amax-over-4",
        "scale choice",
        "target = _divide(blocks.abs().amax(dim=-1).double(), E2M1_MAX)",
        "target = _divide(blocks.abs().amax(dim=-1).double(), 4.0)",
    ),
    mutant(
        "ref-nvfp4-scale-no-clamp",
        "scale choice",
        "scales = (_divide(amax, E2M1_MAX) / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)",
        "scales = (_divide(amax, E2M1_MAX) / gs).to(torch.float8_e4m3fn)",
        equivalent="where torch's float8_e4m3fn cast saturates (torch/headeronly/util/"
        "Float8_e4m3fn.h: finite overflow and inf give 0x7E = 448), as torch 2.13 does: the "
        "clamp changes only values > 448 (never NaN: amax is finite, gs > 0), which both "
        "versions then encode as 448. Torch versions whose cast gives NaN for v >= 464 "
        "make test_nvfp4_scale_clamps_to_448_and_saturates fail.",
    ),
    mutant(
        "ref-nvfp4-scale-amax-over-4",
        "scale choice",
        "scales = (_divide(amax, E2M1_MAX) / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)",
        "scales = (_divide(amax, 4.0) / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)",
    ),
    mutant(
        "ref-zero-block-divides-by-zero",
        "scale choice",
        "live = (divisor > 0).unsqueeze(-1)",
        "live = (divisor >= 0).unsqueeze(-1)",
    ),
    mutant(
        "ref-nvfp4-amax-signed",
        "scale choice",
        "amax = blocks.abs().amax(dim=-1)",
        "amax = blocks.amax(dim=-1)",
    ),
    mutant(
        "ref-zero-block-loses-sign",
        "scale choice",
        "y = torch.where(live, blocks / safe, blocks * 0.0)",
        "y = torch.where(live, blocks / safe, torch.zeros_like(blocks))",
    ),
    mutant(
        "ref-mxfp4-no-upper-clamp",
        "scale choice",
        ".clamp(-E8M0_BIAS, E8M0_BIAS)",
        ".clamp(min=-E8M0_BIAS)",
        equivalent="the upper clamp never binds: amax is a finite float32 (validated), below "
        "2^128, so target = amax / 6 < 2^125.5 and ceil(log2(target)) <= 126 < 127.",
    ),
    mutant(
        "ref-mxfp4-zero-block-scale-one",
        "scale choice",
        "exponent = torch.where(target > 0, exponent, -E8M0_BIAS)",
        "exponent = torch.where(target >= 0, exponent, -E8M0_BIAS)",
    ),
    mutant(
        "ref-nvfp4-blocks-strided",
        "scale choice",
        "blocks = xf.unflatten(-1, (-1, NVFP4_BLOCK))",
        "blocks = xf.unflatten(-1, (NVFP4_BLOCK, -1)).transpose(-1, -2)",
    ),
    # ------------------------------------------------------------------ global scale
    mutant(
        "ref-gs-amax-over-448",
        "global scale",
        "gs = _divide(xf.abs().amax(), E4M3_MAX * E2M1_MAX)",
        "gs = _divide(xf.abs().amax(), E4M3_MAX)",
    ),
    mutant(
        "ref-gs-zero-for-zero-tensor",
        "global scale",
        "gs = torch.where(gs > 0, gs, torch.ones_like(gs))",
        "gs = torch.where(gs > 0, gs, torch.zeros_like(gs))",
    ),
    mutant(
        "ref-gs-encode-without-gs",
        "global scale",
        "packed = _encode_blocks(blocks, scales.float() * gs)",
        "packed = _encode_blocks(blocks, scales.float())",
    ),
    mutant(
        "ref-gs-dequant-divides",
        "global scale",
        "return _dequantize(data, sc, vec, torch.float32) * gs",
        "return _dequantize(data, sc, vec, torch.float32) / gs",
    ),
    mutant(
        "ref-alpha-gsa-squared",
        "global scale",
        "return FP4Operands(a, b, sfa, sfb, vec, gsa, gsb, gsa * gsb)",
        "return FP4Operands(a, b, sfa, sfb, vec, gsa, gsb, gsa * gsa)",
    ),
    mutant(
        "ref-alpha-not-rounded-to-fp32",
        "global scale",
        "t = torch.tensor(float(value), dtype=torch.float32, device=device)",
        "t = torch.tensor(float(value), dtype=torch.float64, device=device)",
    ),
    # ------------------------------------------------------------------ 128x4 layout, padding
    mutant(
        "ref-blocked-r32-major",
        "to_blocked layout",
        "atoms = padded.view(n_batch, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)",
        "atoms = padded.view(n_batch, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 2, 3, 5)",
    ),
    mutant(
        "ref-blocked-column-block-major",
        "to_blocked layout",
        "atoms = padded.view(n_batch, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)",
        "atoms = padded.view(n_batch, rp // 128, 4, 32, cp // 4, 4).permute(0, 4, 1, 3, 2, 5)",
    ),
    mutant(
        "ref-unblocked-r32-major",
        "to_blocked layout",
        "atoms = raw.reshape(n_batch, rp // 128, cp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)",
        "atoms = raw.reshape(n_batch, rp // 128, cp // 4, 4, 32, 4).permute(0, 1, 3, 4, 2, 5)",
    ),
    mutant(
        "ref-pad-columns-missing",
        "padding",
        "n_batch, rows, cols = raw.shape\n    rp, cp = _round_up(rows, 128), _round_up(cols, 4)",
        "n_batch, rows, cols = raw.shape\n    rp, cp = _round_up(rows, 128), cols",
    ),
    mutant(
        "ref-pad-with-ones",
        "padding",
        "padded = raw.new_zeros((n_batch, rp, cp))",
        "padded = raw.new_ones((n_batch, rp, cp))",
    ),
    mutant(
        "ref-round-up-overpads",
        "padding",
        "return (n + m - 1) // m * m",
        "return (n + m) // m * m",
    ),
    # ------------------------------------------------------------------ GEMM, abs_product_sum
    mutant(
        "ref-gemm-alpha-after-cast",
        "gemm",
        "return (torch.matmul(da, db.transpose(-1, -2)) * scale).to(out_dtype)",
        "return torch.matmul(da, db.transpose(-1, -2)).to(out_dtype) * scale.to(out_dtype)",
    ),
    mutant(
        "ref-gemm-accumulates-in-fp32",
        "gemm",
        "da = _dequantize(a8, sa, vec, accum_dtype)",
        "da = _dequantize(a8, sa, vec, torch.float32).to(accum_dtype)",
    ),
    mutant(
        "ref-abs-sum-factored",
        "abs_product_sum",
        "return torch.matmul(da, db.transpose(-1, -2))\n",
        "return da.sum(-1, keepdim=True) * db.sum(-1).unsqueeze(-2)\n",
    ),
    mutant(
        "ref-abs-sum-signed-a",
        "abs_product_sum",
        "da = _dequantize(a8, sa, vec, torch.float32).abs()",
        "da = _dequantize(a8, sa, vec, torch.float32)",
    ),
    mutant(
        "ref-abs-sum-b-with-a-scales",
        "abs_product_sum",
        "db = _dequantize(b8, sb, vec, torch.float32).abs()",
        "db = _dequantize(b8, sa, vec, torch.float32).abs()",
    ),
    # ------------------------------------------------------------------ tolerance, check_gemm
    mutant(
        "ref-tol-kernel-term-only",
        "tolerance",
        "delta = (gamma(k, unit_roundoff) + gamma(k, FP32_UNIT_ROUNDOFF)) * a * s_bound",
        "delta = gamma(k, unit_roundoff) * a * s_bound",
    ),
    mutant(
        "ref-tol-sqrt-k",
        "tolerance",
        "delta = (gamma(k, unit_roundoff) + gamma(k, FP32_UNIT_ROUNDOFF)) * a * s_bound",
        "delta = (gamma(math.isqrt(k), unit_roundoff) + gamma(math.isqrt(k), FP32_UNIT_ROUNDOFF)) "
        "* a * s_bound",
    ),
    mutant(
        "ref-tol-alpha-ignored",
        "tolerance",
        'a = abs(float(_scalar(alpha, "alpha", ref.device, positive=False)))',
        'a = abs(float(_scalar(1.0, "alpha", ref.device, positive=False)))',
    ),
    mutant(
        "ref-tol-ulp-at-ref",
        "tolerance",
        "return delta + _ulp(ref.double().abs() + delta, out_dtype) / 2",
        "return delta + _ulp(ref.double().abs(), out_dtype) / 2",
    ),
    mutant(
        "ref-tol-ulp-no-subnormals",
        "tolerance",
        "exp = torch.where(mag > 0, e - 1, min_exp).clamp(min=min_exp)",
        "exp = torch.where(mag > 0, e - 1, min_exp)",
    ),
    mutant(
        "ref-check-k-counts-bytes",
        "check_gemm",
        'k = 2 * _packed_as_uint8(a, "a").shape[-1]',
        'k = _packed_as_uint8(a, "a").shape[-1]',
    ),
    mutant(
        "ref-check-nan-passes",
        "check_gemm",
        "err = torch.where(torch.isinf(d) & exact, 0.0, err).nan_to_num(nan=math.inf)",
        "err = torch.where(torch.isinf(d) & exact, 0.0, err).nan_to_num(nan=0.0)",
    ),
    mutant(
        "ref-check-any-inf-passes",
        "check_gemm",
        "err = torch.where(torch.isinf(d) & exact, 0.0, err).nan_to_num(nan=math.inf)",
        "err = torch.where(torch.isinf(d), 0.0, err).nan_to_num(nan=math.inf)",
    ),
    mutant(
        "ref-check-worst-by-abs-error",
        "check_gemm",
        "flat = int(ratio.flatten().argmax())",
        "flat = int(err.flatten().argmax())",
    ),
    mutant(
        "ref-check-inf-compared-in-fp32",
        "check_gemm",
        "exact = d == ref.to(d.dtype)",
        "exact = d == ref",
    ),
    mutant(
        "ref-tol-fp32-output-gets-an-ulp",
        "tolerance",
        "    if out_dtype == torch.float32:\n        return delta\n",
        "",
    ),
    mutant(
        "ref-check-reports-reference-as-kernel",
        "check_gemm",
        "kernel_value=float(d[index]),",
        "kernel_value=float(ref[index]),",
    ),
    mutant(
        "ref-check-unbounded-rejects-reference",
        "check_gemm",
        "unbounded_miss = ~torch.isfinite(tol) & ~exact",
        "unbounded_miss = ~torch.isfinite(tol)",
    ),
    mutant(
        "ref-unblocked-keeps-column-padding",
        "padding",
        "out = atoms.reshape(n_batch, rp, cp)[:, :rows, :cols]",
        "out = atoms.reshape(n_batch, rp, cp)[:, :rows, :]",
    ),
    # ------------------------------------------------------------------ operands, validation
    mutant(
        "ref-wide-dist-not-wide",
        "operands",
        "exps = torch.randint(-8, 9, (*shape[:-1], shape[-1] // vec, 1), generator=gen)",
        "exps = torch.randint(0, 1, (*shape[:-1], shape[-1] // vec, 1), generator=gen)",
    ),
    mutant(
        "ref-code-range-check-off-by-one",
        "validation",
        "if t.numel() and int(t.max()) > 15:",
        "if t.numel() and int(t.max()) > 16:",
    ),
    mutant(
        "ref-uniform-not-centred",
        "operands",
        "return torch.rand(shape, generator=gen) * 2 - 1",
        "return torch.rand(shape, generator=gen) * 2",
    ),
    mutant(
        "ref-seed-ignored",
        "operands",
        "gen = torch.Generator().manual_seed(seed)",
        "gen = torch.Generator().manual_seed(0)",
    ),
    mutant(
        "ref-gemm-args-scales-swapped",
        "operands",
        "return self.a, self.b, self.sfa, self.sfb, self.sf_vec_size, self.alpha",
        "return self.a, self.b, self.sfb, self.sfa, self.sf_vec_size, self.alpha",
    ),
    mutant(
        "ref-divide-by-reciprocal",
        "global scale",
        "return t / torch.full((), value, dtype=t.dtype, device=t.device)",
        "return t * (1.0 / value)",
    ),
    mutant(
        "ref-check-drops-unit-roundoff",
        "check_gemm",
        "tol = gemm_tolerance(k, d.dtype, ref, abs_sum, alpha, unit_roundoff=unit_roundoff)",
        "tol = gemm_tolerance(k, d.dtype, ref, abs_sum, alpha)",
    ),
    mutant(
        "ref-dequant-accepts-negative-gs",
        "validation",
        'gs = _scalar(global_scale, "global_scale", data.device, positive=True)',
        'gs = _scalar(global_scale, "global_scale", data.device, positive=False)',
    ),
    # ------------------------------------------------------------------ scale bytes
    mutant(
        "ref-scale-e4m3-nan-is-0xff",
        "scale bytes",
        "nans = int(bits.eq(0x7F if want == torch.float8_e4m3fn else 0xFF).sum())",
        "nans = int(bits.eq(0xFF if want == torch.float8_e4m3fn else 0xFF).sum())",
    ),
    mutant(
        "ref-scale-e8m0-nan-off-by-one",
        "scale bytes",
        "nans = int(bits.eq(0x7F if want == torch.float8_e4m3fn else 0xFF).sum())",
        "nans = int(bits.eq(0x7F if want == torch.float8_e4m3fn else 0xFE).sum())",
    ),
    mutant(
        "ref-scale-negative-zero-accepted",
        "scale bytes",
        "signed = int((bits & 0x80).ne(0).sum())",
        "signed = int((bits > 0x80).sum())",
    ),
    mutant(
        "ref-scale-sign-check-on-e8m0",
        "scale bytes",
        "    if want == torch.float8_e4m3fn:\n        signed",
        "    if True:\n        signed",
    ),
    # ------------------------------------------------------------------ second oracle
    mutant(
        "ref-lib-four-times",
        "second oracle",
        "if ours.max_abs_err <= 2 * library_err:",
        "if ours.max_abs_err <= 4 * library_err:",
    ),
    mutant(
        "ref-lib-strictly-below-twice",
        "second oracle",
        "if ours.max_abs_err <= 2 * library_err:",
        "if ours.max_abs_err < 2 * library_err:",
    ),
    mutant(
        "ref-lib-error-against-ours",
        "second oracle",
        "library_err = float((d_library.double() - ref.double()).abs().max())",
        "library_err = float((d_library.double() - d_kernel.double()).abs().max())",
    ),
    mutant(
        "ref-lib-mean-error",
        "second oracle",
        "library_err = float((d_library.double() - ref.double()).abs().max())",
        "library_err = float((d_library.double() - ref.double()).abs().mean())",
    ),
    mutant(
        "ref-lib-nan-library-accepted",
        "second oracle",
        "if library_err is not None and math.isfinite(library_err) and math.isfinite(",
        "if library_err is not None and math.isfinite(",
    ),
    mutant(
        "ref-lib-shape-unchecked",
        "second oracle",
        "if d_library.shape != ref.shape:",
        "if d_library.dim() != ref.dim():",
    ),
]
