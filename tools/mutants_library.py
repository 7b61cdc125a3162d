"""Mutants of the library: fp4_ops/checkpoint.py and fp4_ops/nn.py (checkpoint loading and saving,
FP4Linear's state dict, quantize_model, calibrate), the CPU quantizer and GEMM, the scale layout,
FP4Tensor, the ops' checks, the memory rules, the FP4 buffers' casts, the MoE host code, the Hopper
launcher's picks and checks, the tokens step, the GPU quantizer, the benchmarks' figures and
checks (benchmarks.power's too), the Hopper CLI, k_order, the CLIs' argument checks, reference.py
and examples/generate.py: small, realistic bugs that make a result silently wrong or let bad input
through, planted by reviewers who had not read the tests. The tests named must catch each
(``-m gpu``: on an H100 / H200). Keep every ``old`` text current as the code changes (it must
occur exactly once in its file)."""

CHECKPOINT = "fp4_ops/checkpoint.py"
NN = "fp4_ops/nn.py"
CPU = "fp4_ops/cpu.py"
LAYOUT = "fp4_ops/layout.py"
TENSOR = "fp4_ops/tensor.py"
OPS = "fp4_ops/ops.py"
MOE = "fp4_ops/moe.py"
QUANTIZER = "fp4_ops/quantizer.py"
MEMORY = "fp4_ops/memory.py"
BUFFERS = "fp4_ops/buffers.py"
SM100 = "fp4_ops/sm100.py"
PADDED_ROWS = "fp4_ops/moe_kernels/padded_rows.py"
TOKENS_STEP = "fp4_ops/sm90/tokens_step.py"
LAUNCHER = "fp4_ops/sm90/launcher.py"
MODEL_BENCH = "benchmarks/model.py"
POWER = "benchmarks/power.py"
GENERATE = "examples/generate.py"
TESTS = [
    "tests/test_checkpoint.py",
    "tests/test_moe_checkpoint.py",
    "tests/test_library.py",
    "tests/test_quantize_transformers.py",
]

OPS_TESTS = [
    "tests/test_cpu.py",
    "tests/test_fp4_ops.py",
    "tests/test_semantics.py",
    "tests/test_library.py",
    "tests/test_moe.py",
]

# every reader and writer of checkpoints: compressed-tensors, ModelOpt, gpt-oss, Llama 4, MoE
CHECKPOINT_TESTS = [
    *TESTS,
    "tests/test_gpt_oss_checkpoint.py",
    "tests/test_llama4.py",
    "-m",
    "not gpu",
]

# the quantizer kernels' PTX in the emulator, bit for bit against reference.py
QUANTIZER_TESTS = ["tests/test_quantizer_ptx.py", "tests/test_quantize_midpoints.py"]

# quantize_cuda (the quantizer CLI's entry): its refusals and the ragged shapes, on a GPU only
QUANTIZE_CUDA_GPU = ["tests/test_quantize_fp4.py", "-m", "gpu", "-k", "refuses_a_global or ragged"]

# transformers' save_pretrained / resize_token_embeddings refused on FP4 models
REFUSAL_TESTS = ["tests/test_quantize_transformers.py", "tests/test_checkpoint.py"]

# the MoE ops' Blackwell route: its host code with the kernel emulated, on the CPU
BLACKWELL_MOE_TESTS = ["tests/test_moe_blackwell.py", "tests/test_moe.py"]

# the eager plan caches run on a GPU only
EAGER_TESTS = ["tests/test_eager.py", "tests/test_fp4_ops.py", "-m", "gpu"]

# the MoE layer's routing, activation and combine kernels, and the quantizer's exact rows: their
# PTX on the CPU emulator catches most of these; strided routing weights (computed by the host
# side that the emulator's harness stands in for) need the GPU tests
ROUTING = "fp4_ops/moe_kernels/routing.py"
ACTIVATION = "fp4_ops/moe_kernels/activation.py"
COMBINE = "fp4_ops/moe_kernels/combine.py"
EXACT_ROWS_TESTS = [
    "tests/test_quantizer_ptx.py",
    "tests/test_quantize_fp4.py",
    "tests/test_moe.py",
]
MOE_KERNELS = "fp4_ops/moe_kernels/__init__.py"
MOE_KERNEL_TESTS = ["tests/test_moe_kernels.py", "tests/test_moe.py"]


# the library's CPU suite over the small host modules (scale layout, CPU path, FP4Tensor, buffers,
# memory rules, k_order, devtools, tokens step): what a blind review's mutants there run against
HOST_TESTS = [
    "tests/test_cpu.py",
    "tests/test_reference.py",
    "tests/test_fp4_ops.py",
    "tests/test_semantics.py",
    "tests/test_library.py",
    "tests/test_hopper.py",
    "tests/test_eager.py",
    "tests/test_moe_kernels.py",
    "tests/test_device_keys.py",
    "-m",
    "not gpu",
]


# the MoE helper kernels (routing, activation, combine, padded rows) and the layers over them, on
# the CPU (their PTX in the emulator): what a blind review's mutants there run against
MOE_REVIEW_TESTS = [
    "tests/test_moe_kernels.py",
    "tests/test_moe.py",
    "tests/test_moe_blackwell.py",
    "tests/test_gpt_oss_checkpoint.py",
    "-m",
    "not gpu",
]


# the op entry points and their CPU path (checks, fake kernels, grouped GEMMs, the MoE torch path):
# what a blind review's mutants there run against
OPS_REVIEW_TESTS = [
    *OPS_TESTS,
    "tests/test_moe_checkpoint.py",
    "tests/test_moe_kernels.py",
    "tests/test_fake_kernels.py",
    "-m",
    "not gpu",
]


# FP4Linear as a module (state dict, casts, pickling, repr), quantize_model and calibrate, on
# the CPU: what a blind review's mutants there run against
NN_REVIEW_TESTS = [
    "tests/test_library.py",
    "tests/test_fp4_ops.py",
    "tests/test_semantics.py",
    "tests/test_quantize_transformers.py",
    "tests/test_checkpoint.py",
    "tests/test_moe.py",
    "-m",
    "not gpu",
]


# the Blackwell path's host side (the sm_100 dispatch, the kernels' torch wrappers and layouts,
# the padded rows), on the CPU: what a blind review's mutants there run against
BW_REVIEW_TESTS = [
    "tests/test_blackwell.py",
    "tests/test_blackwell_grouped.py",
    "tests/test_moe_blackwell.py",
    "tests/test_fp4_ops.py",
    "tests/test_moe.py",
    "-m",
    "not gpu",
]


# the benchmarks' argument checks, on the CPU
BENCH_CLI_TESTS = [
    "tests/test_bench.py",
    "tests/test_bench_stack.py",
    "tests/test_bench_linear.py",
    "tests/test_model_bench.py",
    "-m",
    "not gpu",
]


# every benchmark's tests (the figures, checks, arguments and JSON of each module)
BENCH_REVIEW_TESTS = [
    *BENCH_CLI_TESTS[:-2],
    "tests/test_bench_moe.py",
    "tests/test_timers.py",
    "-m",
    "not gpu",
]


# the public API on CPU tensors (FP4Tensor, quantize, fp4_gemm, FP4Linear, quantize_model)
API_REVIEW_TESTS = [
    "tests/test_fp4_ops.py",
    "tests/test_library.py",
    "tests/test_semantics.py",
    "tests/test_cpu.py",
    "tests/test_fake_kernels.py",
    "tests/test_quantize_transformers.py",
    "tests/test_reference.py",
    "-m",
    "not gpu",
]


# the MoE module layer (FP4MoE, FP4Experts, Llama-4's, the transformers adapters) and its
# checkpoints, on the CPU: what a blind review's mutants there run against
MOE_MODULE_REVIEW_TESTS = [
    "tests/test_moe.py",
    "tests/test_moe_checkpoint.py",
    "tests/test_moe_transformers.py",
    "tests/test_gpt_oss_checkpoint.py",
    "tests/test_llama4.py",
    "tests/test_checkpoint.py",
    "-m",
    "not gpu",
]


# FP4Tensor, the scale layout, the FP4 buffers and the memory rules, on the CPU: what a blind
# review's mutants there run against
TENSOR_REVIEW_TESTS = [
    "tests/test_cpu.py",
    "tests/test_fp4_ops.py",
    "tests/test_semantics.py",
    "tests/test_library.py",
    "tests/test_checkpoint.py",
    "tests/test_device_keys.py",
    "tests/test_moe.py",
    "-m",
    "not gpu",
]


# the Hopper launcher's host side, k_order and the tokens step, on the CPU: what a blind
# review's mutants there run against
# checkpoint loading and saving and the example that generates from one
CHECKPOINT_REVIEW_TESTS = [
    "tests/test_checkpoint.py",
    "tests/test_moe_checkpoint.py",
    "tests/test_gpt_oss_checkpoint.py",
    "tests/test_transformers4.py",
    "tests/test_examples.py",
    "tests/test_quantize_transformers.py",
    "tests/test_library.py",
    "-m",
    "not gpu",
]


LAUNCHER_REVIEW_TESTS = [
    "tests/test_hopper.py",
    "tests/test_hopper_facts.py",
    "tests/test_eager.py",
    "tests/test_fp4_ops.py",
    "tests/test_device_keys.py",
    "tests/test_moe.py",
    "tests/test_library.py",
    "-m",
    "not gpu",
]
POWER_REVIEW_TESTS = ["tests/test_bench_power.py"]


# the lines between to_blocked's permute and from_blocked's reshape, which
# rv17-layout-atom-row-major-both keeps as they are
BLOCKED_SEAM = (
    "    return out.view(scales.dtype)\n"
    "\n"
    "\n"
    "def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:\n"
    '    """Inverse of ``to_blocked``: 1-D (or [L, n]) blocked scales -> [rows, cols] (or\n'
    '    [L, rows, cols])."""\n'
    "    rp, cp = round_up(rows, ATOM_ROWS), round_up(cols, ATOM_COLS)\n"
    "    lead = blocked.shape[:-1]\n"
    "    batch = math.prod(lead)\n"
    "    atoms = blocked.view(torch.uint8).reshape("
)


def mutant(mutant_id: str, klass: str, file: str, old: str, new: str, tests=TESTS) -> dict:
    return {"id": mutant_id, "klass": klass, "file": file, "old": old, "new": new, "tests": tests}


MUTANTS = [
    # -------------------------------------------------------------- reading a checkpoint's config
    # (a target in several config groups takes the first group's scheme, not the last's)
    mutant(
        "lib-ct-target-first-group",
        "checkpoint config",
        CHECKPOINT,
        "by_target = {t: scheme for _, targets, scheme in self.groups for t in targets}",
        "by_target = {}\n"
        "        for _, targets, scheme in self.groups:\n"
        "            for t in targets:\n"
        "                by_target.setdefault(t, scheme)",
    ),
    mutant(
        "lib-ct-regex-search",
        "name matching",
        CHECKPOINT,
        "return re.match(target[3:], name) is not None",
        "return re.search(target[3:], name) is not None",
    ),
    # (NVFP4 inputs with static group scales, which no layer here serves, pass as static)
    mutant(
        "lib-ct-static-group-inputs",
        "refusal weakened",
        CHECKPOINT,
        'if dynamic == "local":',
        'if dynamic in ("local", False):',
    ),
    # ------------------------------------------------------------------------ loading tensors
    mutant(
        "lib-ct-input-scale-not-inverted",
        "scale convention",
        CHECKPOINT,
        "None else _read_scalar(t[key].cpu(), key, layer.scheme.reciprocal)",
        "None else _read_scalar(t[key].cpu(), key, False)",
    ),
    mutant(
        "lib-experts-gate-up-scales-close",
        "refusal weakened",
        CHECKPOINT,
        "if not torch.equal(ggs, ugs):",
        "if not torch.allclose(ggs, ugs, rtol=10.0):",
    ),
    mutant(
        "lib-experts-w13-up-first",
        "expert layout",
        CHECKPOINT,
        "w13.append((torch.cat((gd, ud)), torch.cat((gsc, usc))))",
        "w13.append((torch.cat((ud, gd)), torch.cat((usc, gsc))))",
    ),
    mutant(
        "lib-tied-copies-by-shape",
        "refusal weakened",
        CHECKPOINT,
        "if not torch.equal(read(other), value):",
        "if read(other).shape != value.shape:",
    ),
    # (two spellings of one tensor in a checkpoint: the first silently wins)
    mutant(
        "lib-two-spellings-first-wins",
        "name matching",
        CHECKPOINT,
        "            if len(keys) > 1:",
        "            if len(keys) > 2:",
    ),
    mutant(
        "lib-float-not-cast",
        "dtype",
        CHECKPOINT,
        "value = value.to(t.dtype) if t.is_floating_point() else value",
        "value = value if t.is_floating_point() else value.to(t.dtype)",
    ),
    # ----------------------------------------------------------------------- saving a checkpoint
    mutant(
        "lib-save-expert0-scale",
        "scale convention",
        CHECKPOINT,
        "w13.global_scale.expand(experts.num_experts)[e],",
        "w13.global_scale.expand(experts.num_experts)[0],",
    ),
    mutant(
        "lib-save-silu-bias-dropped",
        "refusal weakened",
        CHECKPOINT,
        "if experts.w13_bias is not None or experts.w2_bias is not None:",
        "if experts.w13_bias is not None and experts.w2_bias is not None:",
    ),
    # ------------------------------------------------------------------- FP4Linear and its state
    mutant(
        "lib-weight-amax-no-abs",
        "scale convention",
        NN,
        "own = w.abs().amax().float()",
        "own = w.amax().float()",
    ),
    mutant(
        "lib-state-skips-weight-scale",
        "state dict checks",
        NN,
        "for name in parts[2:]:",
        "for name in parts[3:]:",
    ),
    mutant(
        "lib-state-bias-not-unexpected",
        "state dict checks",
        NN,
        'if "bias" in found and self.bias is None:\n'
        '            unexpected_keys.append(prefix + "bias")\n'
        '        elif "bias" not in found',
        'if "bias" not in found',
    ),
    mutant(
        "lib-state-bias-shape",
        "state dict checks",
        NN,
        "if tuple(bias.shape) != (self.out_features,) or not bias.is_floating_point():",
        "if not bias.is_floating_point():",
    ),
    # ------------------------------------------------------------- quantize_model and calibrate
    # (a one-output gate, Qwen2-MoE's shared_expert_gate, is no longer kept as a router)
    mutant(
        "lib-router-one-output",
        "module selection",
        NN,
        "out_features not in counts | {1}:",
        "out_features not in counts:",
    ),
    mutant(
        "lib-fused-w1-w2",
        "shared scale",
        NN,
        '("w1", "w3"),',
        '("w1", "w2"),',
    ),
    mutant(
        "lib-calibrate-last-call",
        "calibration",
        NN,
        "amax[key] = seen if key not in amax else torch.maximum(amax[key], seen)",
        "amax[key] = seen",
    ),
    # --------------------------------------- the CPU quantizer and GEMM, layouts, the ops' checks
    mutant(
        "lib-e2m1-ties-up",
        "rounding",
        CPU,
        "code = torch.where(tie & (below % 2 == 1), below + 1, below)",
        "code = torch.where(tie, below + 1, below)",
        OPS_TESTS,
    ),
    mutant(
        "lib-e8m0-rounded-down",
        "rounding",
        CPU,
        "exponent = exponent - (mantissa == 0.5).int()",
        "exponent = exponent - 1",
        OPS_TESTS,
    ),
    mutant(
        "lib-e8m0-power-of-two-up",
        "rounding",
        CPU,
        "exponent = exponent - (mantissa == 0.5).int()",
        "exponent = exponent",
        OPS_TESTS,
    ),
    mutant(
        "lib-blocked-padding-ones",
        "layout",
        LAYOUT,
        "padded = torch.nn.functional.pad(raw, (0, cp - cols, 0, rp - rows))",
        "padded = torch.nn.functional.pad(raw, (0, cp - cols, 0, rp - rows), value=1)",
        OPS_TESTS,
    ),
    mutant(
        "lib-dynamic-scale-over-448",
        "scale convention",
        CPU,
        "gs = amax / torch.tensor(GLOBAL_SCALE_DIVISOR, dtype=torch.float32)",
        "gs = amax / torch.tensor(448.0, dtype=torch.float32)",
        OPS_TESTS,
    ),
    mutant(
        "lib-ct-weight-scale-not-inverted",
        "scale convention",
        TENSOR,
        'return _from_plain(weight_packed, weight_scale, 1.0 / inv, "nvfp4", names)',
        'return _from_plain(weight_packed, weight_scale, inv, "nvfp4", names)',
        OPS_TESTS,
    ),
    mutant(
        "lib-quantize-k-multiple-of-16",
        "refusal weakened",
        OPS,
        "if x.shape[-1] == 0 or x.shape[-1] % 32:",
        "if x.shape[-1] == 0 or x.shape[-1] % 16:",
        OPS_TESTS,
    ),
    mutant(
        "lib-gemm-weight-scale-twice",
        "alpha",
        OPS,
        "alpha, alpha_scale = device_alpha(a.global_scale * b.global_scale, alpha), None",
        "alpha, alpha_scale = device_alpha(a.global_scale * b.global_scale, alpha), b.global_scale",
        OPS_TESTS,
    ),
    mutant(
        "lib-w4a16-alpha-dropped",
        "alpha",
        OPS,
        "alpha = device_alpha(b.global_scale, alpha)",
        "alpha = device_alpha(b.global_scale, None)",
        OPS_TESTS,
    ),
    mutant(
        "lib-batched-scales-as-view",
        "layout",
        OPS,
        "if m % 128 == 0:",
        "if True:",
        OPS_TESTS,
    ),
    mutant(
        "lib-batch-mismatch-accepted",
        "refusal weakened",
        OPS,
        "if a_shape[0] != b.data.shape[0]:",
        "if False:",
        OPS_TESTS,
    ),
    mutant(
        "lib-inf-accepted",
        "refusal weakened",
        CPU,
        "if not bool(torch.isfinite(xf).all()):",
        "if bool(torch.isnan(xf).any()):",
        OPS_TESTS,
    ),
    mutant(
        "lib-tensor-scale-unchecked",
        "refusal weakened",
        TENSOR,
        "check_global_scale_value(t, name)\n        return t.to(like.device).clone()",
        "return t.to(like.device).clone()",
        OPS_TESTS,
    ),
    mutant(
        "lib-scale-contiguity-unchecked",
        "refusal weakened",
        TENSOR,
        "if not (d.is_contiguous() and s.is_contiguous()):",
        "if not d.is_contiguous():",
        OPS_TESTS,
    ),
    mutant(
        "lib-routing-id-e-accepted",
        "refusal weakened",
        MOE,
        "return (topk_ids >= 0) & (topk_ids < num_experts)",
        "return (topk_ids >= 0) & (topk_ids <= num_experts)",
        OPS_TESTS,
    ),
    mutant(
        "lib-swigluoai-interleave-swapped",
        "activation",
        MOE,
        "gate, up = h[:, 0::2], h[:, 1::2]",
        "gate, up = h[:, 1::2], h[:, 0::2]",
        OPS_TESTS,
    ),
    mutant(
        "lib-negative-e4m3-scale-accepted",
        "refusal weakened",
        CPU,
        "if bool((bits & 0x80).any()):",
        "if False:",
        OPS_TESTS,
    ),
    # ------------------------------------------------- the GPU quantizer's PTX, run on the CPU
    mutant(
        "q-element-quotient-no-markstein",
        "division",
        QUANTIZER,
        "q = self._markstein(ax, divisor, rcp)",
        "q = ax * rcp",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-block-scale-divisions-reordered",
        "division",
        QUANTIZER,
        "self._markstein(amax, Float32(E2M1_MAX), RCP_E2M1_MAX), gs, rcp_gs",
        "self._markstein(amax, gs, rcp_gs), Float32(E2M1_MAX), RCP_E2M1_MAX",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-no-clamp-before-e4m3",
        "saturation",
        QUANTIZER,
        "sf_byte = _e4m3_bits(cute.arch.fmin(s, Float32(E4M3_MAX)))",
        "sf_byte = _e4m3_bits(s)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-fast-window-to-2^-126",
        "division",
        QUANTIZER,
        "SCALE_FAST_MIN = 2.0**-60",
        "SCALE_FAST_MIN = 2.0**-126",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-e8m0-tie-rounds-up",
        "rounding",
        QUANTIZER,
        "up = Int32((amax_bits & Uint32(0x7FFFFF)) > Uint32(0x400000))",
        "up = Int32((amax_bits & Uint32(0x7FFFFF)) >= Uint32(0x400000))",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-scale-atom-batch-stride",
        "layout",
        QUANTIZER,
        "atom = (batch * (rows_pad >> 7) + (r >> 7)) * (pairs_pad >> 1) + (col >> 2)",
        "atom = (batch + (r >> 7)) * (pairs_pad >> 1) + (col >> 2)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-padding-scale-words-unwritten",
        "layout",
        QUANTIZER,
        "if live & (pair % 2 == 0):",
        "if live & (pair % 2 == 0) & (r < rows):",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-partials-read-one-past",
        "amax",
        QUANTIZER,
        "if tidx + j * THREADS < amax_count:",
        "if tidx + j * THREADS <= amax_count:",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-partials-one-fewer-per-thread",
        "amax",
        QUANTIZER,
        "for j in cutlass.range_constexpr(PARTIALS_PER_THREAD):",
        "for j in cutlass.range_constexpr(PARTIALS_PER_THREAD - 1):",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-amax-loop-bound-short",
        "amax",
        QUANTIZER,
        "amax = self._thread_amax(mXa, bidx * THREADS + tidx, gdim * THREADS, steps)",
        "amax = self._thread_amax(mXa, bidx * THREADS + tidx, gdim * THREADS, steps - 1)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-cta-max-drops-last-warp",
        "amax",
        QUANTIZER,
        "for w in cutlass.range_constexpr(THREADS // WARP):",
        "for w in cutlass.range_constexpr(THREADS // WARP - 1):",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-local-amax-cta-offset",
        "amax",
        QUANTIZER,
        "self._thread_amax(mAmax, tidx, THREADS, amax_count)",
        "self._thread_amax(mAmax, cute.arch.block_idx()[0] * THREADS + tidx, THREADS, amax_count)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-divisor-table-no-sync",
        "synchronization",
        QUANTIZER,
        "cute.arch.sync_threads()\n        return gs, Float32(1.0) / gs, valid, sDiv",
        "return gs, Float32(1.0) / gs, valid, sDiv",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-negative-zero-sign-dropped",
        "rounding",
        QUANTIZER,
        "word = word | (sign_bit(w * 8 + e) & Uint32(SIGN_BIT))",
        "word = word | (sign_bit(w * 8 + e) & Uint32(SIGN_BIT) & -Uint32(ax > Float32(0.0)))",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-dynamic-scale-by-reciprocal",
        "division",
        QUANTIZER,
        "gs_dynamic = amax / Float32(GLOBAL_DIVISOR)",
        "gs_dynamic = amax * Float32(1.0 / GLOBAL_DIVISOR)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-token-pair-past-k-live",
        "layout",
        QUANTIZER,
        "live = live & (kb * Uint32(2) < Uint32(sf_cols))",
        "live = live & (kb * Uint32(2) <= Uint32(sf_cols))",
        QUANTIZER_TESTS,
    ),
    # (the NVFP4 tokens walk, one thread per half block: planted by a reviewer who had not read
    # the tests; the walk's size is the launch's host arithmetic, which the emulator tests use)
    mutant(
        "q-half-pair-amax-wrong-lane",
        "lane exchange",
        QUANTIZER,
        "shuffle_sync_bfly(amax_bits, offset=1))",
        "shuffle_sync_bfly(amax_bits, offset=2))",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-gather-other-half",
        "lane exchange",
        QUANTIZER,
        "offset=first + 2 * g + Int32(h))",
        "offset=first + 2 * g + Int32(h ^ Uint32(1)))",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-scale-bytes-wrong-lanes",
        "lane exchange",
        QUANTIZER,
        "sf4 = sf4 | cute.arch.shuffle_sync_bfly(sf4, offset=2)",
        "sf4 = sf4 | cute.arch.shuffle_sync_bfly(sf4, offset=1)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-chunk-h-q-swapped",
        "layout",
        QUANTIZER,
        "(h * Uint32(4) + q) * 4)",
        "(q * Uint32(2) + h) * 4)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-k-block-of-4-units",
        "layout",
        QUANTIZER,
        "kb = Uint32(unit) >> 3",
        "kb = Uint32(unit) >> 2",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-copy-rows-unpadded",
        "layout",
        QUANTIZER,
        "row_words = Int64(cute.size(mC.shape[1]))\n        word_index",
        "row_words = Int64(sf_cols * 8)\n        word_index",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-tail-mask-drops-last-block",
        "tail",
        QUANTIZER,
        "K_BLOCK <= Uint32(sf_cols * self.sf_vec_size))",
        "K_BLOCK < Uint32(sf_cols * self.sf_vec_size))",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-active-counts-blocks",
        "tail",
        QUANTIZER,
        "active = live & (unit < sf_cols * 2)",
        "active = live & (unit < sf_cols)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-tail-chunks-not-stored",
        "tail",
        QUANTIZER,
        "self._store_chunk(mQ, codes[0], sf_byte, r, unit, sf_cols, live)",
        "self._store_chunk(mQ, codes[0], sf_byte, r, unit, sf_cols, active)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-half-walk-units-unpadded",
        "grid walk",
        QUANTIZER,
        "units = (k + K_BLOCK - 1) // K_BLOCK * (K_BLOCK // HALF_BLOCK)",
        "units = k // HALF_BLOCK",
        QUANTIZER_TESTS,
    ),
    mutant(
        "q-grid-stride-doubled",
        "grid walk",
        QUANTIZER,
        "stride = gdim * THREADS",
        "stride = gdim * THREADS * BLOCKS_PER_THREAD",
        QUANTIZER_TESTS,
    ),
    # ------------------------------------------- eager plans (GPU tests: on an H100 / H200 only)
    mutant(
        "eager-quantize-key-static",
        "plan key",
        OPS,
        "key = (x.shape, x.dtype, format, global_scale is None, index, stream_handle(index))",
        "key = (x.shape, x.dtype, format, index, stream_handle(index))",
        EAGER_TESTS,
    ),
    mutant(
        "eager-quantize-checks-skipped-on-a-hit",
        "plan checks",
        OPS,
        "if plan is not None and _quantize_takes(x, global_scale, index):",
        "if plan is not None:",
        EAGER_TESTS,
    ),
    mutant(
        "eager-gemm-key-out-dtype",
        "plan key",
        OPS,
        "key = (ad.shape, ad.dtype, bd.shape, bd.dtype, a.format, b.format, out_dtype, index)",
        "key = (ad.shape, ad.dtype, bd.shape, bd.dtype, a.format, b.format, index)",
        EAGER_TESTS,
    ),
    mutant(
        "eager-linear-key-dtype",
        "plan key",
        NN,
        "key = (x.shape, x.dtype, index, stream_handle(index))",
        "key = (x.shape, x.device.type, index, stream_handle(index))",
        EAGER_TESTS,
    ),
    mutant(
        "eager-linear-stale-bias",
        "plan staleness",
        NN,
        'return layer._parameters.get("bias") is self.bias',
        'return (layer._parameters.get("bias") is None) == (self.bias is None)',
        EAGER_TESTS,
    ),
    mutant(
        "eager-linear-plan-scale-bound",
        "plan binding",
        NN,
        "quantize = quantizer.plan_quantize(rows, vec, gs_in).bind(scratch, gs_in)",
        "quantize = quantizer.plan_quantize(rows, vec, gs_in).bind(scratch)",
        EAGER_TESTS,
    ),
    mutant(
        "eager-quantize-plan-shared-gs",
        "plan outputs",
        QUANTIZER,
        "gs = torch.empty_like(gs_like)",
        "gs = gs_like",
        EAGER_TESTS,
    ),
    # E >= 16 with tokens on an expert below e - 15 for some used expert e >= 16 (cap 32: lane =
    # expert; lanes 16..31 miss the sums of lanes 0..lane-16): offsets of experts >= 16 (and
    # offsets[16] for E = 16) too small, rows overlap; with E <= 15 only the invalid pairs' base
    # (sMisc VALID) is wrong, i.e. needs out-of-range ids
    mutant(
        "mk-route-scan-16-lanes",
        "prefix sum",
        ROUTING,
        "for step in cutlass.range_constexpr(LOG_WARP):",
        "for step in cutlass.range_constexpr(LOG_WARP - 1):",
        MOE_KERNEL_TESTS,
    ),
    # P = T*k > 32 pairs (threads outside warp 0 take rows with atomics on the raw counts while
    # warp 0 is still turning them into prefix sums): duplicate / out-of-range rows, wrong row_of
    # / token_of; P <= 32 is all in warp 0 and stays correct
    mutant(
        "mk-route-no-barrier-scan-place",
        "synchronization",
        ROUTING,
        "        cute.arch.sync_threads()\n        self._place(",
        "        self._place(",
        MOE_KERNEL_TESTS,
    ),
    # int64 topk_ids with an out-of-range id whose low 32 bits lie in [0, E), e.g. 2**32 + 1: ok
    # stays 1 and the pair is routed to expert 1 instead of being flagged (int32 ids unaffected)
    mutant(
        "mk-route-int64-ids-truncated-check",
        "int32 vs int64 ids",
        ROUTING,
        "valid = (raw >= self.ids_dtype(0)) & (raw < self.ids_dtype(experts))",
        "valid = (Int32(raw) >= Int32(0)) & (Int32(raw) < experts)",
        MOE_KERNEL_TESTS,
    ),
    # any out-of-range id (e.g. -1 or E) among valid ones: the invalid pair gets row 0, 1, ..
    # which belong to valid pairs, overwriting their token_of / expert_of and row_of < offsets[E]
    # (ok is still 0)
    mutant(
        "mk-route-invalid-rows-from-zero",
        "index/offset",
        ROUTING,
        "row = sMisc[Misc.VALID] + cute.arch.atomic_add(placed",
        "row = cute.arch.atomic_add(placed",
        MOE_KERNEL_TESTS,
    ),
    # E a power of two >= 32 (32, 64, 128, ..): cap == E so no lane holds slot E and offsets[E] is
    # never written (left as torch.empty garbage); E = 8, 60, 33 are unaffected
    mutant(
        "mk-host-experts-cap-not-greater",
        "counts at edges",
        MOE_KERNELS,
        "return max(32, 1 << num_experts.bit_length())",
        "return max(32, 1 << (num_experts - 1).bit_length())",
        MOE_KERNEL_TESTS,
    ),
    # non-contiguous topk_weights [T, k] (a column slice of a wider tensor, or a transposed view)
    # with T > 1 or k > 1: the kernel reads them as dense t*k+s and weighs tokens with other
    # tokens' weights
    mutant(
        "mk-host-combine-weights-strided",
        "host",
        MOE_KERNELS,
        "weights = topk_weights.contiguous()",
        "weights = topk_weights",
        MOE_KERNEL_TESTS,
    ),
    # swigluoai with some up value (odd column of h, + bias) below -7 and a gate not ~0: (u + 1)
    # uses u instead of -7; silu and small-magnitude inputs are unaffected
    mutant(
        "mk-act-swiglu-up-clamp-one-sided",
        "activation math",
        ACTIVATION,
        "u = max(min(u, Float32(SWIGLUOAI_LIMIT)), Float32(-SWIGLUOAI_LIMIT))",
        "u = min(u, Float32(SWIGLUOAI_LIMIT))",
        MOE_KERNEL_TESTS,
    ),
    # silu with gate half != up half (any random h): silu(up) * gate instead of silu(gate) * up;
    # swigluoai unaffected
    mutant(
        "mk-act-silu-gate-up-swapped",
        "gating order",
        ACTIVATION,
        "return g / (Float32(1.0) + cute.math.exp(-g)) * u",
        "return u / (Float32(1.0) + cute.math.exp(-u)) * g",
        MOE_KERNEL_TESTS,
    ),
    # bf16 / fp16 h with a w13 bias (whose sum with h is not representable in 16 bits): outputs
    # off by ~1 ulp on some elements vs the float32 h + bias reference; float32 h and bias-free
    # calls are unaffected, so only a bit-exact / ulp-tight check catches it
    mutant(
        "mk-act-bias-sum-rounded",
        "dtype/rounding",
        ACTIVATION,
        "gu = gu + rBias.load().to(Float32)",
        "gu = (gu + rBias.load().to(Float32)).to(self.dtype).to(Float32)",
        MOE_KERNEL_TESTS,
    ),
    # w2 bias given and some topk weight != 1 (e.g. k = 2 with softmax weights): out gets sum_s
    # bias[e_s] instead of sum_s w_s * bias[e_s]; k = 1 with weight 1 or no bias is unaffected
    mutant(
        "mk-comb-bias-unweighted",
        "bias application",
        COMBINE,
        "y = y + rBias.load().to(Float32)",
        "acc = acc + rBias.load().to(Float32)",
        MOE_KERNEL_TESTS,
    ),
    # w2 bias with differing rows per expert, E > 1, and a routing whose row order differs from
    # pair order (e.g. ids [[1],[0]]): a token gets the bias of the expert of row p; identity
    # routings (ids sorted by pair) are unaffected
    mutant(
        "mk-comb-bias-expert-by-pair",
        "index",
        COMBINE,
        "mBias[mExpertOf[r], c, None]",
        "mBias[mExpertOf[p], c, None]",
        MOE_KERNEL_TESTS,
    ),
    # NVFP4 rows with a nonzero subnormal E4M3 block scale (byte 0x01..0x07, a block whose amax is
    # < ~2^-6/448 of the tensor amax): value m*2^-10 - 2^-7 instead of m*2^-9; zero blocks give
    # (MXFP4's shifted E8M0 scales below 2^-126 (f32 subnormals) off by a factor of 4)
    mutant(
        "mk-exact-e8m0-subnormal",
        "MXFP4 vs NVFP4",
        QUANTIZER,
        "cutlass.min(byte, Uint32(-SHIFT_EXP)) + Uint32(22 + SHIFT_EXP)",
        "cutlass.min(byte, Uint32(-SHIFT_EXP)) + Uint32(22)",
        EXACT_ROWS_TESTS,
    ),
    # (a thread's second block takes the first block's scale byte and the first the second's)
    mutant(
        "mk-exact-scale-byte",
        "MXFP4 vs NVFP4",
        QUANTIZER,
        "block_scale_f32((sf_bytes >> Uint32(8 * b)) & Uint32(0xFF), self.nvfp4)",
        "block_scale_f32((sf_bytes >> Uint32(8 * (1 - b))) & Uint32(0xFF), self.nvfp4)",
        EXACT_ROWS_TESTS,
    ),
    # (MXFP4 rows of an odd block count: the second block past K written over the next row)
    mutant(
        "mk-exact-block-past-k",
        "counts at edges",
        QUANTIZER,
        "if (b == 0) | (col + b < sf_cols):",
        "if (b == 0) | (col + b <= sf_cols):",
        EXACT_ROWS_TESTS,
    ),
    # (a blind review's survivors: E8M0 byte 3 decoded as a subnormal, 2^-127 for 2^-126;
    # the launch cache keyed without the exact-rows mode, which hands one mode the other's
    # kernel; the values' row stride padded to whole scale atoms, which the emulator's harness
    # cannot see (it sets the layout itself): a GPU test's)
    mutant(
        "mk-exact-e8m0-boundary",
        "MXFP4 vs NVFP4",
        QUANTIZER,
        "    if byte >= Uint32(1 - SHIFT_EXP):",
        "    if byte > Uint32(1 - SHIFT_EXP):",
        EXACT_ROWS_TESTS,
    ),
    mutant(
        "mk-exact-cache-key",
        "plan staleness",
        QUANTIZER,
        "        _LAUNCHERS[in_dtype, sf_vec_size, dynamic, local_amax, exact, index] = found",
        "        _LAUNCHERS[in_dtype, sf_vec_size, dynamic, local_amax, False, index] = found",
        ["tests/test_quantize_midpoints.py"],
    ),
    mutant(
        "mk-exact-row-stride",
        "counts at edges",
        QUANTIZER,
        "cute.make_layout((rows, k // vec, vec), stride=(k, vec, 1)),",
        "cute.make_layout((rows, k // vec, vec), stride=(sf_cols_pad * vec, vec, 1)),",
        ["tests/test_quantize_fp4.py", "-m", "gpu"],
    ),
    # (nibbles 4..7 of each code word read as 0..3 again)
    mutant(
        "mk-exact-nibble",
        "packing",
        QUANTIZER,
        "(words[first + j // 8] >> Uint32(4 * (j % 8)))",
        "(words[first + j // 8] >> Uint32(4 * (j % 4)))",
        EXACT_ROWS_TESTS,
    ),
    # --- a blind review of the MoE host code, FP4Tensor and the scale layout ---------------
    # (swigluoai with an up value below -7 (gpt-oss probe tokens at PROBE_REACH 32): (up + 1) is
    # no longer floored at -6)
    mutant(
        "mh-swiglu-up-clamp-upper-only",
        "activation-clamp",
        MOE,
        "up = up.clamp(min=-SWIGLUOAI_LIMIT, max=SWIGLUOAI_LIMIT)",
        "up = up.clamp(max=SWIGLUOAI_LIMIT)",
        ["tests/test_moe.py"],
    ),
    # (swigluoai with a gate value below -7: gate*sigmoid(1.702 gate) becomes -7*sigmoid(-11.9) ~
    # -4.6e-5 instead of ~0 (tiny absolute change, times (up + 1)))
    mutant(
        "mh-swiglu-gate-clamp-both-sides",
        "activation-clamp",
        MOE,
        "gate = gate.clamp(max=SWIGLUOAI_LIMIT)",
        "gate = gate.clamp(min=-SWIGLUOAI_LIMIT, max=SWIGLUOAI_LIMIT)",
        ["tests/test_moe.py"],
    ),
    # (any bf16/fp16 fp4_moe on CPU: the activation stays float32 into the w2 GEMM (W4A16 skips
    # one rounding; W4A4 quantizes unrounded values, codes flip) - differs from the documented
    # 'then rounded to x's dtype')
    mutant(
        "mh-act-not-rounded-to-x-dtype",
        "rounding",
        MOE,
        "act = apply_activation(hf, activation).to(x.dtype)",
        "act = apply_activation(hf, activation)",
        ["tests/test_moe.py"],
    ),
    # (float32 w13_bias with bf16/fp16 x: bias rounded to x's dtype before the float32 add (doc:
    # bias added in float32))
    mutant(
        "mh-w13-bias-rounded-to-x-dtype",
        "rounding",
        MOE,
        "hf = hf + w13_bias.float().index_select(0, sorted_ids)",
        "hf = hf + w13_bias.to(x.dtype).float().index_select(0, sorted_ids)",
        ["tests/test_moe.py"],
    ),
    # (FP4MoE with float32 biases, then .to(torch.bfloat16) / .half(): biases keep float32
    # (nn.Module would cast them), state_dict bias dtype differs)
    mutant(
        "mh-kept-buffers-include-bias",
        "dtype-cast",
        MOE,
        'if t is not None and "bias" not in n}',
        "if t is not None}",
        ["tests/test_library.py"],
    ),
    # (topk_ids containing E on CPU: accepted; the pair lands past offsets[E], its row is never
    # computed (silent zero / garbage contribution))
    mutant(
        "mh-topk-ids-upper-inclusive",
        "range-check",
        MOE,
        "(topk_ids < num_experts)",
        "(topk_ids <= num_experts)",
        ["tests/test_moe.py"],
    ),
    # (top-k > 1 with T > 1: pair p = t*k + s is read as token p % T (slot-major confusion); exact
    # for k == 1)
    mutant(
        "mh-rows-slot-major",
        "indexing",
        MOE,
        "rows = x.index_select(0, order // k)",
        "rows = x.index_select(0, order % tokens)",
        ["tests/test_moe.py"],
    ),
    # (load a swigluoai FP4MoE's state dict into a silu FP4MoE of the same shapes: accepted
    # silently, the layer then computes silu on interleaved gate/up rows)
    mutant(
        "mh-extra-state-checks-format-only",
        "state-dict",
        MOE,
        'for key in ("format", "activation"):',
        'for key in ("format",):',
        ["tests/test_moe.py"],
    ),
    # (FP4MoE.load_state_dict with w13_data / w2_data of the right shape but int8, float8 or
    # float16 dtype: loaded silently (bytes reinterpreted; float16 is viewed as twice the bytes
    # and still loads) instead of the ValueError 'w2_data differs')
    mutant(
        "mh-load-data-any-dtype",
        "state-dict",
        MOE,
        'plain = name.endswith("_data") and t.dtype in PACKED_DTYPES',
        'plain = name.endswith("_data")',
        ["tests/test_moe.py"],
    ),
    # (FP4MoE(w13, w2) then load_state_dict(other layer's state): the caller's w13.scale /
    # w2.scale are overwritten in place)
    mutant(
        "mh-fp4moe-scale-not-copied",
        "aliasing",
        MOE,
        'self.register_buffer(f"{name}_scale", w.scale.clone())',
        'self.register_buffer(f"{name}_scale", w.scale)',
        ["tests/test_library.py"],
    ),
    # (activations='dynamic' NVFP4 with H = 48 or I = 16/48: accepted on the host (the kernels
    # assume 32-aligned rows))
    mutant(
        "mh-dynamic-alignment-16",
        "shape-check",
        MOE,
        "elif h % 32 or i % 32:",
        "elif h % 16 or i % 16:",
        ["tests/test_moe.py"],
    ),
    # (FP4Llama4Experts forward with T != E (e.g. E = 4, T = 3, top_k = 2): rows gathered /
    # scattered at e*E + t instead of e*T + t, output sum 46.93 -> 43.72; exact when T == E)
    mutant(
        "mh-llama4-rows-stride-e",
        "indexing",
        MOE,
        "at = chosen.view(-1) * t + tokens",
        "at = chosen.view(-1) * e + tokens",
        ["tests/test_llama4.py"],
    ),
    # (pickle.loads(pickle.dumps(mxfp4_tensor)) (or an MXFP4 FP4MoE / FP4Linear): E8M0 scales
    # pickled as float8 cannot be read back (AttributeError))
    mutant(
        "mh-pickle-e4m3-only",
        "pickling",
        TENSOR,
        ("if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() == 1:"),
        "if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn:",
        ["tests/test_library.py"],
    ),
    # (from_plain(data, scales, gs) with gs a float32 CPU tensor, then gs.mul_(2) (or zero_()):
    # the FP4Tensor's global scale changes (bypassing its positivity check))
    mutant(
        "mh-global-scale-aliases-input",
        "aliasing",
        TENSOR,
        "return t.to(like.device).clone()",
        "return t.to(like.device)",
        ["tests/test_moe_checkpoint.py"],
    ),
    # (FP4Tensor with data [2, rows, K/2] and global_scale of shape [3] (or [1]) accepted; fails
    # later in dequantize / check_experts (or [1] silently shared))
    mutant(
        "mh-per-batch-gs-any-length",
        "shape-check",
        TENSOR,
        "per_batch = d.ndim == 3 and tuple(g.shape) == d.shape[:1]",
        "per_batch = d.ndim == 3 and g.ndim == 1",
        ["tests/test_moe.py"],
    ),
    # (to_compressed_tensors(): weight_global_scale is 0-d instead of compressed-tensors' [1]; the
    # values still round-trip)
    mutant(
        "mh-compressed-gs-0d",
        "format-convention",
        TENSOR,
        '"weight_global_scale": (1.0 / self.global_scale).reshape(1),',
        '"weight_global_scale": 1.0 / self.global_scale,',
        ["tests/test_fp4_ops.py"],
    ),
    # (FP4Tensor with a non-contiguous scale of the right blocked shape (e.g. a strided slice):
    # accepted; kernels read its storage linearly)
    mutant(
        "mh-post-init-scale-contiguity",
        "input-check",
        TENSOR,
        "if not (d.is_contiguous() and s.is_contiguous()):",
        "if not d.is_contiguous():",
        ["tests/test_fp4_ops.py"],
    ),
    # (rows % 128 != 0 or cols % 4 != 0: from_blocked / plain_scales / to_compressed_tensors
    # return a non-contiguous view (safetensors save fails); values unchanged)
    mutant(
        "mh-from-blocked-noncontig",
        "layout",
        LAYOUT,
        "return plain.reshape(*lead, rows, cols).contiguous().view(blocked.dtype)",
        "return plain.reshape(*lead, rows, cols).view(blocked.dtype)",
        ["tests/test_fp4_ops.py"],
    ),
    # --- a blind review of the command lines (argument checks, exit codes, printed figures) --
    # (python examples/generate.py --model DIR --max_new_tokens 8: decode tokens/s counts the
    # first (prefill) token, printed rate x steps/(steps-1) too high and inconsistent with the
    # printed 'N-1 steps x batch B in T s')
    mutant(
        "cli-gen-decode-tok-s-uses-steps",
        "unit/count error in printed rate",
        "examples/generate.py",
        '"decode_tok_s": batch * (steps - 1) / decode_s',
        '"decode_tok_s": batch * steps / decode_s',
        ["tests/test_examples.py", "-k", "clock_saw"],
    ),
    # (python examples/generate.py --model DIR: decode time measured from the prompt hand-over
    # (includes prefill), so decode s too large, tokens/s and ms/step too low)
    mutant(
        "cli-gen-decode-time-includes-prefill",
        "wrong interval in printed rate",
        "examples/generate.py",
        "decode_s = clock.times[-1] - clock.times[1] if steps > 1",
        "decode_s = clock.times[-1] - clock.times[0] if steps > 1",
        ["tests/test_examples.py", "-k", "clock_saw"],
    ),
    # (python examples/generate.py --model DIR --max_new_tokens 1: accepted (exit 0, 'decode: not
    # measured') instead of exit 2 with '--max_new_tokens must be at least 2')
    mutant(
        "cli-gen-max-new-tokens-off-by-one",
        "off-by-one validation bound (lets bad input through)",
        "examples/generate.py",
        "if args.max_new_tokens < 2:",
        "if args.max_new_tokens < 1:",
        ["tests/test_examples.py", "-k", "test_bad_arguments_exit_2"],
    ),
    # (python examples/generate.py --model DIR_WITHOUT_TOKENIZER --tokenizer TOKDIR: --tokenizer
    # ignored, 'error: DIR: no tokenizer that loads' exit 2 (or, where the model folder has one,
    # silently the wrong tokenizer))
    mutant(
        "cli-gen-tokenizer-option-ignored",
        "option ignored",
        "examples/generate.py",
        "tokenizer = load_tokenizer(args.tokenizer or str(folder))",
        "tokenizer = load_tokenizer(str(folder))",
        ["tests/test_examples.py", "-k", "test_unusable_folders_exit_2"],
    ),
    # (python examples/generate.py --model DIR --baseline: the line 'FP4 / BF16 decode tokens per
    # second: R x' prints BF16/FP4 (the reciprocal))
    mutant(
        "cli-gen-baseline-ratio-inverted",
        "wrong printed figure",
        "examples/generate.py",
        "{fp4['decode_tok_s'] / base['decode_tok_s']:.2f}x",
        "{base['decode_tok_s'] / fp4['decode_tok_s']:.2f}x",
        ["tests/test_examples.py", "-k", "clock_saw"],
    ),
    # (python examples/generate.py --model org/missing-repo (or an unreadable folder): an OSError
    # from checkpoint_folder / load_quantized escapes as a traceback, exit 1)
    mutant(
        "cli-gen-hub-oserror-traceback",
        "bad input gives traceback, not exit 2",
        "examples/generate.py",
        "except (ValueError, OSError, ImportError) as err:  # (OSError: the Hub's refusals too)",
        "except (ValueError, ImportError) as err:  # (OSError: the Hub's refusals too)",
        [
            "tests/test_examples.py",
            "-k",
            "test_a_hub_repository_generates_and_a_missing_one_exits_2",
        ],
    ),
    # (python -m fp4_ops.sm90 --iterations 0 (or any refused configuration): exit status 1 (the
    # FAIL code) instead of 2)
    mutant(
        "cli-sm90-usage-exit-code-1",
        "wrong exit code",
        "fp4_ops/sm90/cli.py",
        'print(f"error: {err}", file=sys.stderr)\n        return 2',
        'print(f"error: {err}", file=sys.stderr)\n        return 1',
        ["tests/test_hopper.py", "-k", "test_cli_bad_input_exits_2"],
    ),
    # (a Qwen3.5-MoE vision-language checkpoint: 'model.layers.0...: missing from the
    # checkpoint', its names left as stored)
    mutant(
        "lib-qwen3-5-moe-spelling-dropped",
        "checkpoint names",
        CHECKPOINT,
        '    "qwen3_5_moe": ((None, "model.language_model", "model"),),\n',
        "",
        ["tests/test_moe_checkpoint.py", "-k", "qwen3_5_moe"],
    ),
    # (Qwen3.5's vision-language model, saved: model.language_model.language_model.* keys, a
    # checkpoint that does not load)
    mutant(
        "lib-save-respells-a-model-named-as-stored",
        "checkpoint names",
        CHECKPOINT,
        "    kind = None if _spelled_as_stored(kind, model) else kind\n",
        "",
        ["tests/test_checkpoint.py", "-k", "named_as_its_checkpoints"],
    ),
    # (the PDL-launched tokens grid releases the GEMM behind it before its own wait: the GEMM's
    # weight requests before its wait overlap the kernel ahead of the grid)
    mutant(
        "q-tokens-release-before-wait",
        "PDL order",
        QUANTIZER,
        "cute.arch.griddepcontrol_wait()\n        rRaw = None",
        "cute.arch.griddepcontrol_launch_dependents()\n        rRaw = None",
        ["tests/test_hopper_facts.py", "-k", "quantizer_grids"],
    ),
    # (the PDL-launched amax grid reads x before its wait: the kernel ahead may still write it)
    mutant(
        "q-amax-reads-before-wait",
        "PDL order",
        QUANTIZER,
        "before this wait\n        cute.arch.griddepcontrol_wait()\n",
        "before this wait\n",
        ["tests/test_hopper_facts.py", "-k", "quantizer_grids"],
    ),
    # (the plain dynamic quantization loads its first blocks before its wait: the amax grid
    # ahead released it before that grid's own wait, so x may not be final yet)
    mutant(
        "q-preload-before-the-amax-wait",
        "PDL order",
        QUANTIZER,
        "self.preload = self.nvfp4 and (self.values_out or not self.amax_grid)",
        "self.preload = self.nvfp4",
        ["tests/test_hopper_facts.py", "-k", "quantizer_grids"],
    ),
    # (python -m fp4_ops.quantizer --compile_only --gpu_arch sm_100a: compiles for sm_90a yet
    # prints 'compiled for sm_100a')
    mutant(
        "cli-quantizer-gpu-arch-ignored",
        "option ignored",
        "fp4_ops/quantizer.py",
        'compile_quantizer(args.in_dtype, vec, dynamic, f"--gpu-arch {args.gpu_arch}")',
        'compile_quantizer(args.in_dtype, vec, dynamic, "--gpu-arch sm_90a")',
        ["tests/test_quantize_fp4.py", "-k", "arch_it_names"],
    ),
    # (python -m fp4_ops.quantizer --compile_only --global_scale 0: accepted (exit 0) instead of
    # 'error: --global_scale 0.0: a finite value > 0' exit 2; on a GPU, a zero scale quantizes
    # everything by 1/0)
    mutant(
        "cli-quantizer-global-scale-zero-accepted",
        "check lets bad input through",
        "fp4_ops/quantizer.py",
        "not 0 < as_f32 < math.inf",
        "not 0 <= as_f32 < math.inf",
        ["tests/test_quantize_fp4.py", "-k", "test_cli_refuses_bad_input"],
    ),
    # (python blockwise_gemm_fp4.py --compile_only --gpu_arch sm_100a, then the same with
    # --gpu_arch sm_103a: both write ./dump/<same folder>, the second overwrites the first's PTX
    # and cubin; the folder no longer names the target)
    mutant(
        "cli-bw-dump-folder-drops-gpu-arch",
        "option ignored (output folder collides)",
        "blockwise_gemm_fp4.py",
        'return f"{fmt}_{args.c_dtype}_tile{tm}x{tn}_cluster{cm}x{cn}_{args.gpu_arch}"',
        'return f"{fmt}_{args.c_dtype}_tile{tm}x{tn}_cluster{cm}x{cn}"',
        ["tests/test_blackwell.py", "-k", "test_cli_compile_only_summary"],
    ),
    # (python blockwise_gemm_fp4.py --mnkl 128,128,8192,1 --tolerance 1500: accepted (limit 2048
    # instead of 1024) although the derived bound needs K u tol < 1/2; without a GPU it then fails
    # with the no-GPU message instead of naming --tolerance)
    mutant(
        "cli-bw-tolerance-limit-doubled",
        "off-by-factor validation bound",
        "blockwise_gemm_fp4.py",
        "k_limit = 0.5 / (args.mnkl[2] * 2.0**-24)",
        "k_limit = 1.0 / (args.mnkl[2] * 2.0**-24)",
        ["tests/test_blackwell.py", "-k", "tolerance_limit"],
    ),
    # (python blockwise_grouped_gemm_fp4.py --compile_only --iterations 0: accepted (exit 0)
    # instead of exit 2 '--iterations must be >= 1'; on a GPU, time_us over zero iterations)
    mutant(
        "cli-grouped-iterations-zero-accepted",
        "off-by-one validation bound",
        "blockwise_grouped_gemm_fp4.py",
        "if args.iterations < 1 or args.warmup_iterations < 0:\n        raise bw.UsageError",
        "if args.iterations < 0 or args.warmup_iterations < 0:\n        raise bw.UsageError",
        ["tests/test_blackwell_grouped.py", "-k", "test_cli_bad_input_exits_2_without_traceback"],
    ),
    # --- a second blind review of checkpoint loading (config checks, scales, KV cache) ------
    # (compressed-tensors NVFP4 W4A4 (input_global_scale stored as 448*6/amax): static input scale
    # taken un-inverted, activations quantized with a scale off by amax^2/2688^2)
    mutant(
        "ck-ct-input-scale-no-reciprocal",
        "missed-reciprocal",
        CHECKPOINT,
        (
            "return None if key is None else _read_scalar(t[key].cpu(), key, layer.sche"
            "me.reciprocal)"
        ),
        "return None if key is None else _read_scalar(t[key].cpu(), key, False)",
        ["tests/test_checkpoint.py", "-k", "test_round_trip"],
    ),
    # (ModelOpt NVFP4 with kv_cache_quant_algo FP8 whose k_proj.k_scale is NaN / negative / 0:
    # loads with no ValueError)
    mutant(
        "ck-kv-scales-never-checked",
        "missing-value-check",
        CHECKPOINT,
        "    if not keys:\n        return\n    with ck.reader",
        "    if keys:\n        return\n    with ck.reader",
        ["tests/test_checkpoint.py", "-k", "test_fp8_kv_cache_scales_are_checked"],
    ),
    # (checkpoint with k_proj.k_scale / v_proj.v_scale tensors but no KV-cache quantization
    # declared in its config: tensors silently swallowed (no refusal, no warning) instead of
    # 'unexpected tensors')
    mutant(
        "ck-kv-scales-undeclared-taken",
        "leftover-refusal",
        CHECKPOINT,
        "kv_scales = _plan_kv_scales(ck, model) if qconfig.kv_cache else []",
        "kv_scales = _plan_kv_scales(ck, model)",
        ["tests/test_checkpoint.py", "-k", "test_fp8_kv_cache_scales_are_checked"],
    ),
    # (MoE NVFP4 W4A4 checkpoint (Mixtral / Qwen3-MoE, ModelOpt or compressed-tensors) with a NaN
    # / zero / negative expert input_scale: loads silently instead of ValueError)
    mutant(
        "ck-experts-input-scales-unchecked",
        "missing-value-check",
        CHECKPOINT,
        ('for layer in (layer for row in plan.layers for layer in row if "input" in layer.keys):'),
        ('for layer in (layer for row in plan.layers for layer in row if "inputs" in layer.keys):'),
        ["tests/test_moe_checkpoint.py", "-k", "test_a_bad_input_scale_of_an_expert_is_refused"],
    ),
    # (compressed-tensors MXFP4 W4A16 checkpoint with config dtype float16: model kept in float16
    # (no bfloat16 switch, no warning); E8M0 scales overflow float16 in W4A16 matmuls)
    mutant(
        "ck-mxfp4-fp16-w4a16-kept",
        "dtype-choice",
        CHECKPOINT,
        'dtype == torch.float16 and formats == {"nvfp4"}',
        "dtype == torch.float16",
        ["tests/test_checkpoint.py", "-k", "test_dtype"],
    ),
    # (Mixtral checkpoint holding both experts.0.w1.* and experts.0.gate_proj.* (same model name):
    # one silently used, the other silently ignored (neither consumed nor left over))
    mutant(
        "ck-duplicate-spellings-allowed",
        "key-lookup",
        CHECKPOINT,
        "            if len(keys) > 1:\n",
        "            if len(keys) > 2:\n",
        [
            "tests/test_moe_checkpoint.py",
            "-k",
            "test_mixtral_checkpoint_naming_one_tensor_twice_is_refused",
        ],
    ),
    # (compressed-tensors config listing the same target in two config_groups (e.g. group_0 nvfp4
    # Linear, group_1 mxfp4 Linear): first group's scheme used instead of the last; wrong format
    # planned, checkpoint refused or mis-read)
    mutant(
        "ck-ct-groups-first-wins",
        "precedence",
        CHECKPOINT,
        "by_target = {t: scheme for _, targets, scheme in self.groups for t in targets}",
        (
            "by_target = {t: scheme for _, targets, scheme in reversed(self.groups) for"
            " t in targets}"
        ),
        ["tests/test_checkpoint.py", "-k", "test_compressed_tensors_matching"],
    ),
    # (ModelOpt hf_quant_config with exclude_modules glob patterns ('*lm_head*',
    # 'model.layers.*.mlp.gate'): excluded BF16 layers planned as NVFP4, checkpoint refused)
    mutant(
        "ck-modelopt-glob-exclude-lost",
        "pattern-match",
        CHECKPOINT,
        "if any(n == p or fnmatch.fnmatchcase(n, p) for n in names for p in self.ignore):",
        "if any(n == p for n in names for p in self.ignore):",
        ["tests/test_checkpoint.py", "-k", "test_modelopt_exclude_globs"],
    ),
    # (load_quantized(path, device=True/False): taken as cuda:1 / cuda:0 (ValueError on CPU-only,
    # silently a GPU elsewhere) instead of TypeError)
    mutant(
        "ck-parse-device-bool-accepted",
        "arg-check",
        CHECKPOINT,
        "if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):",
        "if not isinstance(device, (str, torch.device, int)):",
        ["tests/test_checkpoint.py", "-k", "load_arguments"],
    ),
    # (compressed-tensors config group with no group_size (a per-channel / tensor layout writer):
    # accepted as 16 / 32-blocked instead of ValueError)
    mutant(
        "ck-ct-group-size-absent-ok",
        "config-check",
        CHECKPOINT,
        'if args.get("group_size") != vec:',
        'if args.get("group_size") not in (vec, None):',
        ["tests/test_checkpoint.py", "-k", "refusals"],
    ),
    # (NVFP4 MoE checkpoint whose gate_proj / up_proj global scales differ by < 1e-5 relative (not
    # re-fused): up weight silently rescaled by gate's global scale)
    mutant(
        "ck-experts-gate-up-gs-allclose",
        "value-check",
        CHECKPOINT,
        "if not torch.equal(ggs, ugs):",
        "if not torch.allclose(ggs, ugs):",
        ["tests/test_moe_checkpoint.py", "-k", "per_expert_checkpoint_refusals"],
    ),
    # (compressed-tensors mxfp4-pack-quantized with input_activations dynamic: false (static group
    # scales): accepted and run with per-call scales instead of ValueError)
    mutant(
        "ck-mxfp4-static-acts-as-dynamic",
        "config-check",
        CHECKPOINT,
        '    if dynamic in (True, "local"):\n        return "dynamic"',
        '    if dynamic is not None:\n        return "dynamic"',
        ["tests/test_checkpoint.py", "-k", "test_refusals"],
    ),
    # (compressed-tensors checkpoint with kv_cache_scheme FP8 storing self_attn.k_scale / v_scale:
    # scales not recognized, refused as left-over tensors (a loadable checkpoint refused))
    mutant(
        "ck-kv-scale-on-attention-missed",
        "key-lookup",
        CHECKPOINT,
        'if owner.rpartition(".")[2] != proj and f"{owner}.{proj}" not in modules:',
        'if owner.rpartition(".")[2] != proj:',
        [
            "tests/test_checkpoint.py",
            "-k",
            "test_an_fp8_kv_cache_checkpoint_loads_with_its_scales_checked_and_unused",
        ],
    ),
    # (ModelOpt config.json-embedded quantization_config spelling its exclusions 'ignore' (lm_head
    # etc.): exclusions lost, the BF16 lm_head is planned as NVFP4 and the checkpoint refused)
    mutant(
        "ck-modelopt-ignore-fallback-lost",
        "config-parse",
        CHECKPOINT,
        'exclude = q["exclude_modules"] if "exclude_modules" in q else q.get("ignore")',
        'exclude = q.get("exclude_modules")',
        [
            "tests/test_checkpoint.py",
            "-k",
            "test_an_fp8_kv_cache_checkpoint_loads_with_its_scales_checked_and_unused",
        ],
    ),
    # (compressed-tensors config whose ignore / targets regex is unanchored-at-start (e.g.
    # 're:mlp.gate$' or 're:.*' variants): matches mid-name where compressed-tensors' re.match
    # does not, quantized layers treated as ignored (refused / wrong scheme))
    mutant(
        "ck-ct-regex-search",
        "pattern-match",
        CHECKPOINT,
        "return re.match(target[3:], name) is not None",
        "return re.search(target[3:], name) is not None",
        ["tests/test_checkpoint.py", "-k", "test_compressed_tensors_matching"],
    ),
    # (compressed-tensors kv_cache_scheme FP8 with dynamic: true (per-call KV scales): accepted
    # instead of ValueError)
    mutant(
        "ck-kv-dynamic-accepted",
        "config-check",
        CHECKPOINT,
        '        and not kv.get("dynamic")\n',
        "\n",
        [
            "tests/test_checkpoint.py",
            "-k",
            "test_kv_cache_schemes_other_than_static_per_tensor_fp8_are_refused",
        ],
    ),
    # (compressed-tensors kv_cache_scheme FP8 strategy 'head' / 'channel': accepted instead of
    # ValueError)
    mutant(
        "ck-kv-strategy-any",
        "config-check",
        CHECKPOINT,
        'and kv.get("strategy", "tensor") == "tensor"',
        'and kv.get("strategy", "tensor") in ("tensor", "channel", "head")',
        [
            "tests/test_checkpoint.py",
            "-k",
            "test_kv_cache_schemes_other_than_static_per_tensor_fp8_are_refused",
        ],
    ),
    # (ModelOpt checkpoint whose config.json says FP8 KV cache and hf_quant_config.json none (or
    # vice versa): disagreement not refused)
    mutant(
        "ck-modelopt-agree-format-only",
        "config-check",
        CHECKPOINT,
        (
            '    mode = "W4A16" if config.scheme.inputs == "none" else "W4A4"\n'
            "    return f\"{config.scheme.format} {mode}, KV cache {config.kv_cache or '"
            "16-bit'}\""
        ),
        (
            '    mode = "W4A16" if config.scheme.inputs == "none" else "W4A4"\n'
            '    return f"{config.scheme.format} {mode}"'
        ),
        ["tests/test_checkpoint.py", "-k", "test_refusals"],
    ),
    # (FP8 KV-cache checkpoint with per-head k_scale [H]: accepted (one positive entry suffices?)
    # instead of refused as non-per-tensor)
    mutant(
        "ck-kv-scale-shape-any",
        "shape-check",
        CHECKPOINT,
        '_expect(ck, key, (), ((), (1,)), "an FP8 KV-cache scale")',
        '_expect(ck, key, (), ((), (1,), ck.header[key][1]), "an FP8 KV-cache scale")',
        ["tests/test_checkpoint.py", "-k", "test_fp8_kv_cache_scales_are_checked"],
    ),
    # (sharded checkpoint whose shards hold tensors the index does not list: loaded instead of
    # refused)
    mutant(
        "ck-index-unlisted-ok",
        "leftover-refusal",
        CHECKPOINT,
        "            unlisted = set(self.file_of) - set(weight_map)\n",
        "            unlisted = set()\n",
        ["tests/test_checkpoint.py", "-k", "test_refusals"],
    ),
    # (compressed-tensors config with quantization_status '' / null: accepted as compressed)
    mutant(
        "ck-status-default-frozen",
        "config-check",
        CHECKPOINT,
        'status = qc.get("quantization_status", "compressed")',
        'status = qc.get("quantization_status") or "compressed"',
        ["tests/test_checkpoint.py", "-k", "refusals"],
    ),
    # (gpt-oss MXFP4 with modules_to_not_convert naming a parent (model.layers.0 /
    # model.layers.0.mlp): its BF16 experts planned as MXFP4 and the checkpoint refused)
    mutant(
        "ck-gptoss-ignore-prefix-lost",
        "pattern-match",
        CHECKPOINT,
        'fnmatch.fnmatchcase(name, p) or name.startswith(p + ".") for p in self.ignore',
        "fnmatch.fnmatchcase(name, p) for p in self.ignore",
        ["tests/test_gpt_oss_checkpoint.py", "-k", "modules_not_converted"],
    ),
    # ------------------------------------------------ FP4Tensor, ops, layout, memory, CPU path
    # (check_global_scale_value accepts a zero global-scale tensor (> weakened to >=))
    mutant(
        "co-tensor-01",
        "core review",
        TENSOR,
        "ok = torch.isfinite(t) & (t > 0)",
        "ok = torch.isfinite(t) & (t >= 0)",
        ["tests/test_library.py"],
    ),
    # (global_scale_tensor aliases the caller's float32 tensor instead of copying it)
    mutant(
        "co-tensor-02",
        "core review",
        TENSOR,
        "        return t.to(like.device).clone()",
        "        return t.to(like.device)",
        ["tests/test_checkpoint.py"],
    ),
    # (check_packed_data accepts K = 0 packed data)
    mutant(
        "co-tensor-03",
        "core review",
        TENSOR,
        "    if k == 0 or k % vec:",
        "    if k % vec:",
        ["tests/test_fp4_ops.py"],
    ),
    # (FP4Tensor no longer checks that scale is contiguous)
    mutant(
        "co-tensor-04",
        "core review",
        TENSOR,
        "if not (d.is_contiguous() and s.is_contiguous()):",
        "if not d.is_contiguous():",
        ["tests/test_fp4_ops.py"],
    ),
    # (picklable only converts E4M3 tensors, forgetting E8M0 (MXFP4) scales)
    mutant(
        "co-tensor-05",
        "core review",
        TENSOR,
        "t.is_floating_point() and t.element_size() == 1:",
        "t.is_floating_point() and t.dtype == torch.float8_e4m3fn:",
        ["tests/test_fp4_ops.py"],
    ),
    # (from_plain/from_modelopt silently default an NVFP4 global_scale of None to 1.0 instead of
    # raising)
    mutant(
        "co-tensor-06",
        "core review",
        TENSOR,
        '    elif vec == FORMATS["mxfp4"]:\n        gs = torch.ones(',
        "    elif vec in FORMATS.values():\n        gs = torch.ones(",
        ["tests/test_library.py"],
    ),
    # (plain-scale shape error names the data argument instead of the scales argument)
    mutant(
        "co-tensor-07",
        "core review",
        TENSOR,
        'f"{scales_name} has shape {tuple(scales.shape)}; plain scales of',
        'f"{data_name} has shape {tuple(scales.shape)}; plain scales of',
        ["tests/test_library.py"],
    ),
    # (unpickling / torch.load of an FP4Tensor skips the constructor's validation)
    mutant(
        "co-tensor-08",
        "core review",
        TENSOR,
        (
            "            object.__setattr__(self, name, unpickled(value))\n"
            "        self.__post_init__()"
        ),
        "            object.__setattr__(self, name, unpickled(value))",
        ["tests/test_fp4_ops.py"],
    ),
    # (FP4Tensor.dequantize defaults to bfloat16 instead of float32)
    mutant(
        "co-tensor-09",
        "core review",
        TENSOR,
        "def dequantize(self, dtype: torch.dtype = torch.float32)",
        "def dequantize(self, dtype: torch.dtype = torch.bfloat16)",
        ["tests/test_fp4_ops.py"],
    ),
    # (quantize accepts K a multiple of 16 (not 32))
    mutant(
        "co-ops-10",
        "core review",
        OPS,
        "if x.shape[-1] == 0 or x.shape[-1] % 32:",
        "if x.shape[-1] == 0 or x.shape[-1] % 16:",
        ["tests/test_fp4_ops.py"],
    ),
    # (quantize silently ignores a global_scale given with format='mxfp4')
    mutant(
        "co-ops-11",
        "core review",
        OPS,
        (
            '    if global_scale is not None and vec != FORMATS["nvfp4"]:\n'
            '        raise ValueError("global_scale: mxfp4 has no global scale (E8M0 sc'
            'ales span the range)")\n'
        ),
        "",
        ["tests/test_fp4_ops.py"],
    ),
    # (fp4_gemm's default out_dtype is float16 instead of bfloat16)
    mutant(
        "co-ops-13",
        "core review",
        OPS,
        (
            "    out_dtype: torch.dtype = torch.bfloat16,\n"
            "    alpha: torch.Tensor | float | None = None,\n"
            ") -> torch.Tensor:\n"
            '    """D = alpha'
        ),
        (
            "    out_dtype: torch.dtype = torch.float16,\n"
            "    alpha: torch.Tensor | float | None = None,\n"
            ") -> torch.Tensor:\n"
            '    """D = alpha'
        ),
        ["tests/test_fp4_ops.py"],
    ),
    # (_as_rows reuses the blocked scales as a view for M % 32 == 0 (padding rows between batches
    # misread))
    mutant(
        "co-ops-14",
        "core review",
        OPS,
        "    if m % 128 == 0:\n        return data, a.scale.reshape(",
        "    if m % 32 == 0:\n        return data, a.scale.reshape(",
        ["tests/test_semantics.py"],
    ),
    # (W4A4 fp4_gemm with an empty result returns a uint8 tensor (out_dtype dropped))
    mutant(
        "co-ops-15",
        "core review",
        OPS,
        "        return a.data.new_empty(out_shape, dtype=out_dtype)",
        "        return a.data.new_empty(out_shape)",
        ["tests/test_library.py"],
    ),
    # (fp4_gemm checks only b for a per-batch global scale, not a)
    mutant(
        "co-ops-16",
        "core review",
        OPS,
        (
            '    for name, t in (("a", a), ("b", b)):\n'
            "        if isinstance(t, FP4Tensor) and t.global_scale.numel() != 1:"
        ),
        (
            '    for name, t in (("b", b),):\n'
            "        if isinstance(t, FP4Tensor) and t.global_scale.numel() != 1:"
        ),
        ["tests/test_fp4_ops.py"],
    ),
    # (from_blocked returns a non-contiguous view (plain_scales / to_compressed_tensors not
    # contiguous))
    mutant(
        "co-layout-17",
        "core review",
        LAYOUT,
        "    return plain.reshape(*lead, rows, cols).contiguous().view(blocked.dtype)",
        "    return plain.reshape(*lead, rows, cols).view(blocked.dtype)",
        ["tests/test_fp4_ops.py"],
    ),
    # (CPU quantize rejects NaN but accepts +-Inf input)
    mutant(
        "co-cpu-18",
        "core review",
        CPU,
        "    if not bool(torch.isfinite(xf).all()):",
        "    if bool(torch.isnan(xf).any()):",
        ["tests/test_cpu.py"],
    ),
    # (CPU _encode gives zero-scale blocks +0 codes, dropping each element's sign (negative values
    # encode 0x0, not 0x8))
    mutant(
        "co-cpu-19",
        "core review",
        CPU,
        "y = torch.where(live.unsqueeze(-1), blocks / d, blocks * 0.0)",
        "y = torch.where(live.unsqueeze(-1), blocks / d, torch.zeros_like(blocks))",
        ["tests/test_cpu.py"],
    ),
    # (check_scales no longer refuses the E4M3 NaN byte 0x7F)
    mutant(
        "co-cpu-20",
        "core review",
        CPU,
        "        nan = 0x7F",
        "        nan = 0xFF",
        ["tests/test_fp4_ops.py"],
    ),
    # (CPU MXFP4 quantize drops the lower exponent clamp (tiny blocks wrap the E8M0 byte))
    mutant(
        "co-cpu-21",
        "core review",
        CPU,
        ".clamp(-_E8M0_BIAS, _E8M0_BIAS)",
        ".clamp(max=_E8M0_BIAS)",
        ["tests/test_cpu.py"],
    ),
    # (FP4Buffers._apply restores kept dtypes by casting the cast buffer back (half() rounds global
    # scales))
    mutant(
        "co-buffers-22",
        "core review",
        BUFFERS,
        "self._buffers[name] = old.to(new.device)",
        "self._buffers[name] = new.to(old.dtype)",
        ["tests/test_library.py"],
    ),
    # (aligned_rows returns a non-contiguous aligned tensor uncopied)
    mutant(
        "co-memory-23",
        "core review",
        MEMORY,
        "if t.is_contiguous() and t.data_ptr() % 16 == 0:",
        "if t.is_contiguous() or t.data_ptr() % 16 == 0:",
        ["tests/test_moe_kernels.py"],
    ),
    # ------------------------------------------------------------ FP4Linear, quantize_model, calibr
    # (FP4Linear.__init__ accepts in_features that is only a multiple of 16 (should be 32))
    mutant(
        "nn-01",
        "nn review",
        NN,
        (
            "        if in_features % 32:\n"
            '            raise ValueError(f"in_features = {in_features}'
        ),
        (
            "        if in_features % 16:\n"
            '            raise ValueError(f"in_features = {in_features}'
        ),
        ["tests/test_fp4_ops.py"],
    ),
    # (bias Parameter aliases the caller's tensor (no clone): load_state_dict writes into it)
    mutant(
        "nn-02",
        "nn review",
        NN,
        "bias = nn.Parameter(bias.detach().clone(), requires_grad=False)",
        "bias = nn.Parameter(bias.detach(), requires_grad=False)",
        ["tests/test_library.py"],
    ),
    # (static activations no longer refused for mxfp4 weights)
    mutant(
        "nn-03",
        "nn review",
        NN,
        (
            '        if static and weight.format != "nvfp4":\n'
            '            raise ValueError("static activation scales exist for nvfp4 onl'
            'y (mxfp4 has none)")\n'
        ),
        "",
        ["tests/test_fp4_ops.py"],
    ),
    # (from_linear checks only for NaN, an Inf weight slips through)
    mutant(
        "nn-04",
        "nn review",
        NN,
        (
            "if not bool(torch.isfinite(w).all()):\n"
            '            raise ValueError("weight contains NaN or Inf, which FP4 cannot'
            ' encode")\n'
            "        if weight_global_scale"
        ),
        (
            "if bool(torch.isnan(w).any()):\n"
            '            raise ValueError("weight contains NaN or Inf, which FP4 cannot'
            ' encode")\n'
            "        if weight_global_scale"
        ),
        ["tests/test_library.py"],
    ),
    # (_check_weight_global_scale forgets abs(): a too-small scale passes for weights whose amax is
    # negative)
    mutant(
        "nn-05",
        "nn review",
        NN,
        "own = w.abs().amax().float() / torch.tensor(",
        "own = w.amax().float() / torch.tensor(",
        ["tests/test_library.py"],
    ),
    # (extra-state check compares activations exactly: a dynamic checkpoint no longer loads into a
    # bf16 layer)
    mutant(
        "nn-06",
        "nn review",
        NN,
        'if (state["activations"] == "static") != (self.activations == "static"):',
        'if state["activations"] != self.activations:',
        ["tests/test_library.py"],
    ),
    # (load with a bias-less checkpoint into a layer with bias does not report the missing bias)
    mutant(
        "nn-07",
        "nn review",
        NN,
        (
            '        elif "bias" not in found and self.bias is not None:\n'
            '            missing_keys.append(prefix + "bias")'
        ),
        (
            '        elif "bias" not in found and self.bias is None:\n'
            '            missing_keys.append(prefix + "bias")'
        ),
        ["tests/test_library.py"],
    ),
    # (static layer loads a checkpoint lacking input_global_scale silently (keeps its old scale))
    mutant(
        "nn-08",
        "nn review",
        NN,
        '        if static:\n            parts.append("input_global_scale")',
        (
            '        if static and "input_global_scale" in found:\n'
            '            parts.append("input_global_scale")'
        ),
        ["tests/test_library.py"],
    ),
    # (off-by-one: weight_global_scale of a checkpoint is not checked (0-d float32, finite,
    # positive))
    mutant(
        "nn-09",
        "nn review",
        NN,
        "        for name in parts[2:]:",
        "        for name in parts[3:]:",
        ["tests/test_library.py"],
    ),
    # (forward: a 0-d x raises IndexError instead of the ValueError)
    mutant(
        "nn-10",
        "nn review",
        NN,
        "if x.ndim == 0 or x.shape[-1] != self.in_features:",
        "if x.shape[-1] != self.in_features:",
        ["tests/test_library.py"],
    ),
    # (forward: bias added without cast, output dtype promoted to the bias's)
    mutant(
        "nn-11",
        "nn review",
        NN,
        "y = y + self.bias.to(y.dtype)",
        "y = y + self.bias",
        ["tests/test_library.py"],
    ),
    # (input_global_scale dropped from the kept FP4 buffers: .half()/.bfloat16() casts it)
    mutant(
        "nn-12",
        "nn review",
        NN,
        '    "weight_global_scale",\n    "input_global_scale",\n)',
        '    "weight_global_scale",\n)',
        ["tests/test_library.py"],
    ),
    # (include patterns also match every module under a matching name (glob matches too much))
    mutant(
        "nn-13",
        "nn review",
        NN,
        "return any(fnmatch.fnmatchcase(name, p) for p in patterns)",
        (
            'return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + "'
            '.*") for p in patterns)'
        ),
        ["tests/test_library.py"],
    ),
    # (a Conv1D chosen by include patterns is skipped silently instead of raising)
    mutant(
        "nn-14",
        "nn review",
        NN,
        (
            "            elif _chosen(name, module, patterns, None):\n"
            '                raise ValueError(f"{name}: {CONV1D_REASON}")'
        ),
        (
            "            elif _chosen(name, module, patterns, None):\n"
            "                report.skipped[name] = CONV1D_REASON"
        ),
        ["tests/test_quantize_transformers.py"],
    ),
    # (router detection: a one-output gate (shared_expert_gate) is no longer a router)
    mutant(
        "nn-15",
        "nn review",
        NN,
        "not in counts | {1}:",
        "not in counts:",
        ["tests/test_library.py"],
    ),
    # (a Linear also reachable under a router/weight-reader name is quantized anyway (kept filter
    # dropped))
    mutant(
        "nn-16",
        "nn review",
        NN,
        "linears = {key: found for key, found in linears.items() if key not in kept}",
        "linears = {key: found for key, found in linears.items()}",
        ["tests/test_library.py"],
    ),
    # (fused q/k/v, gate/up groups keyed without the parent: all layers' siblings share one global
    # scale)
    mutant(
        "nn-17",
        "nn review",
        NN,
        "groups.setdefault((parent, i), []).append(name)",
        'groups.setdefault(("", i), []).append(name)',
        ["tests/test_checkpoint.py"],
    ),
    # (untie warning not emitted)
    mutant(
        "nn-18",
        "nn review",
        NN,
        '        warnings.warn(\n            f"quantize_model: untied {pairs}',
        '        print(\n            f"quantize_model: untied {pairs}',
        ["tests/test_quantize_transformers.py"],
    ),
    # (untying only fixes the top model's config, not a submodel's text config)
    mutant(
        "nn-19",
        "nn review",
        NN,
        ('    for module in model.modules():\n        config = getattr(module, "config", None)'),
        '    for module in [model]:\n        config = getattr(module, "config", None)',
        ["tests/test_quantize_transformers.py"],
    ),
    # (weight-reader walk drops if-bodies whose condition is unknown (a reader inside a runtime
    # branch is missed))
    mutant(
        "nn-20",
        "nn review",
        NN,
        "*(body if taken is not False else ())",
        "*(body if taken else ())",
        ["tests/test_quantize_transformers.py"],
    ),
    # (calibrate keeps the last call's amax instead of the running max)
    mutant(
        "nn-21",
        "nn review",
        NN,
        "amax[key] = seen if key not in amax else torch.maximum(amax[key], seen)",
        "amax[key] = seen",
        ["tests/test_checkpoint.py"],
    ),
    # (calibrate also converts bf16 (W4A16) layers to static)
    mutant(
        "nn-22",
        "nn review",
        NN,
        '            if module.activations == "dynamic":',
        '            if module.activations != "static":',
        ["tests/test_library.py"],
    ),
    # ------------------------------------------------------- the benchmarks' figures and checks
    # (per-layer time subtracts the whole SiLU-only stack time from each layer's share)
    mutant(
        "bn-stack-01",
        "benchmark review",
        "benchmarks/stack.py",
        "    return (stack_us - silu_us) / layers\n",
        "    return stack_us / layers - silu_us\n",
        ["tests/test_bench_stack.py"],
    ),
    # (FP4 weight bytes count one scale byte per 32 elements (MXFP4) instead of 16 (NVFP4))
    mutant(
        "bn-stack-02",
        "benchmark review",
        "benchmarks/stack.py",
        "sizes = [n * k // 2 + n * k // 16 for n, k in shapes]",
        "sizes = [n * k // 2 + n * k // 32 for n, k in shapes]",
        ["tests/test_bench_stack.py"],
    ),
    # (speed-up of ours over peers inverted (ours / peer instead of peer / ours))
    mutant(
        "bn-stack-03",
        "benchmark review",
        "benchmarks/stack.py",
        "        out[key] = theirs / ours if ours and theirs else None",
        "        out[key] = ours / theirs if ours and theirs else None",
        ["tests/test_bench_moe.py"],
    ),
    # (an unmeasured peer yields a 0.00x speed-up instead of None / not measured)
    mutant(
        "bn-stack-04",
        "benchmark review",
        "benchmarks/stack.py",
        "        out[key] = theirs / ours if ours and theirs else None",
        "        out[key] = (theirs or 0.0) / ours if ours else None",
        ["tests/test_bench_moe.py"],
    ),
    # (layer tolerance's gamma_K uses the BF16 unit roundoff instead of fp32 (tolerance far too
    # loose))
    mutant(
        "bn-stack-05",
        "benchmark review",
        "benchmarks/stack.py",
        "    gamma = k * FP32_U / (1 - k * FP32_U)",
        "    gamma = k * BF16_U / (1 - k * BF16_U)",
        ["tests/test_bench_stack.py"],
    ),
    # (static-scale W4A4 checked against a reference quantized with a dynamic scale)
    mutant(
        "bn-stack-06",
        "benchmark review",
        "benchmarks/stack.py",
        (
            '    scales = input_scales if contestant == "ours_w4a4_static" else [None] '
            "* len(weights)\n"
            "    errs, tols"
        ),
        "    scales = [None] * len(weights)\n    errs, tols",
        ["tests/test_bench_stack.py"],
    ),
    # (static scales calibrated on the very rows timed/checked at M=128 (not drawn apart))
    mutant(
        "bn-stack-07",
        "benchmark review",
        "benchmarks/stack.py",
        "    gen = torch.Generator().manual_seed(CALIBRATION_SEED)",
        "    gen = torch.Generator().manual_seed(1000 + CALIBRATION_TOKENS)",
        ["tests/test_bench_stack.py"],
    ),
    # (contestant timed before (and regardless of) its correctness check)
    mutant(
        "bn-stack-08",
        "benchmark review",
        "benchmarks/stack.py",
        (
            '        result["check"] = check_stack(contestant, layers, weights, x, stac'
            "k_ref, input_scales)\n"
            '        if result["check"]["ok"]:\n'
            '            result["stack_us"] = timer(lambda: forward(layers, x), FORWARD'
            "S_PER_GRAPH, reps)"
        ),
        (
            '        result["stack_us"] = timer(lambda: forward(layers, x), FORWARDS_PE'
            "R_GRAPH, reps)\n"
            '        result["check"] = check_stack(contestant, layers, weights, x, stac'
            "k_ref, input_scales)"
        ),
        ["tests/test_bench_stack.py"],
    ),
    # (bare read subtracts the row's M-token SiLU-only time instead of its own one-row SiLU time)
    mutant(
        "bn-stack-09",
        "benchmark review",
        "benchmarks/stack.py",
        '        finish_result(row["bare_read"], row["bare_read"], copy_bps)',
        '        finish_result(row, row["bare_read"], copy_bps)',
        ["tests/test_bench_stack.py"],
    ),
    # (table's W4A4/W4A16 and W4A4-static/W4A16 ratio columns swapped)
    mutant(
        "bn-stack-10",
        "benchmark review",
        "benchmarks/stack.py",
        '    w4a4, static = (row["ratios"].get(key) for key, _ in W4A4_RATIOS)',
        '    static, w4a4 = (row["ratios"].get(key) for key, _ in W4A4_RATIOS)',
        ["tests/test_bench_stack.py"],
    ),
    # (comma lists accept 0 (M=0 / T=0) as a positive integer)
    mutant(
        "bn-args-11",
        "benchmark review",
        "benchmarks/args.py",
        '    if min(values) < 1:\n        p.error(f"{flag} takes positive integers',
        '    if min(values) < 0:\n        p.error(f"{flag} takes positive integers',
        ["tests/test_bench_moe.py"],
    ),
    # (repeated names (--stack/--config) kept: measured and reported twice)
    mutant(
        "bn-args-12",
        "benchmark review",
        "benchmarks/args.py",
        (
            "    return [n for n in allowed if n in given] if ordered else list(dict.fr"
            "omkeys(given))"
        ),
        "    return [n for n in allowed if n in given] if ordered else given",
        ["tests/test_tools.py"],
    ),
    # (cold-L2 copies only exceed the L2 once, not twice as documented)
    mutant(
        "bn-linear-13",
        "benchmark review",
        "benchmarks/linear.py",
        "    return 2 * l2_bytes // one_copy_bytes + 1",
        "    return l2_bytes // one_copy_bytes + 1",
        ["tests/test_bench_linear.py"],
    ),
    # (ratio reported as F.linear / ours instead of ours / F.linear (below 1 now means slower))
    mutant(
        "bn-linear-14",
        "benchmark review",
        "benchmarks/linear.py",
        ('        row[f"ratio_{name}"] = None if ours is None or bf16 is None else ours / bf16'),
        ('        row[f"ratio_{name}"] = None if ours is None or bf16 is None else bf16 / ours'),
        ["tests/test_bench_linear.py"],
    ),
    # (static activation scale calibrated on the timed/measured x, not a separate batch)
    mutant(
        "bn-linear-15",
        "benchmark review",
        "benchmarks/linear.py",
        "        scale = calib.abs().amax().float() / fp4_ops.GLOBAL_SCALE_DIVISOR",
        "        scale = x.abs().amax().float() / fp4_ops.GLOBAL_SCALE_DIVISOR",
        ["tests/test_bench_linear.py"],
    ),
    # (--calls accepts up to 1500: the launch queue fills behind the sleep, host time silently
    # includes GPU waits)
    mutant(
        "bn-eager-16",
        "benchmark review",
        "benchmarks/eager.py",
        "    if not 1 <= args.calls <= 150:",
        "    if not 1 <= args.calls <= 1500:",
        ["tests/test_bench.py"],
    ),
    # ('x bf16' printed as time ratio (FP4/BF16) rather than tokens/s ratio (BF16 time / FP4 time))
    mutant(
        "bn-model-17",
        "benchmark review",
        "benchmarks/model.py",
        "            cell += f\" {row['bf16_us'] / us:5.2f}x\"",
        "            cell += f\" {us / row['bf16_us']:5.2f}x\"",
        ["tests/test_model_bench.py"],
    ),
    # (KV cache size counts keys only (half the bytes): oversize runs not refused)
    mutant(
        "bn-model-18",
        "benchmark review",
        "benchmarks/model.py",
        '    per_position = 2 * c["num_key_value_heads"] * head_dim * 2',
        '    per_position = c["num_key_value_heads"] * head_dim * 2',
        ["tests/test_model_bench.py"],
    ),
    # (--lm_head fp4 ignored: lm_head stays BF16 while the header says fp4)
    mutant(
        "bn-model-19",
        "benchmark review",
        "benchmarks/model.py",
        '        return name != "lm_head" or lm_head == "fp4"',
        '        return name != "lm_head"',
        ["tests/test_model_bench.py"],
    ),
    # (touched bytes count every expert, not only those the routing touches (inflates % of
    # bandwidth))
    mutant(
        "bn-moe-20",
        "benchmark review",
        "benchmarks/moe.py",
        "    return len(touched_experts(topk_ids)) * expert_bytes(cfg, contestant)",
        "    return cfg.experts * expert_bytes(cfg, contestant)",
        ["tests/test_bench_moe.py"],
    ),
    # (BF16 grouped's % of copy bandwidth computed from FP4 bytes)
    mutant(
        "bn-moe-21",
        "benchmark review",
        "benchmarks/moe.py",
        '        kind = "bf16" if name == "bf16_grouped" else "fp4"',
        '        kind = "fp4"',
        ["tests/test_bench_moe.py"],
    ),
    # (MoE tolerance drops the combine condition number kappa_comb)
    mutant(
        "bn-moe-22",
        "benchmark review",
        "benchmarks/moe.py",
        '    return parts["kappa_comb"] * (e_y + gamma(cfg.top_k)) + BF16_U',
        "    return e_y + gamma(cfg.top_k) + BF16_U",
        ["tests/test_bench_moe.py"],
    ),
    # (the eager benchmark's static quantize row set against F.linear, not the empty_like + op
    # pair; the main loop runs after the CUDA check: the test fakes the GPU)
    mutant(
        "bn-eager-static-quantize-base",
        "benchmark review",
        "benchmarks/eager.py",
        'quantizing = name.startswith("quantize") or name == "empty_like + mul"',
        'quantizing = name == "quantize" or name == "empty_like + mul"',
        ["tests/test_bench.py", "-k", "own_base"],
    ),
    # (the model benchmark's eager figure the least of its rounds, not their median)
    mutant(
        "bn-model-eager-least-round",
        "benchmark review",
        "benchmarks/model.py",
        "return {variant: statistics.median(found) for variant, found in times.items()}",
        "return {variant: min(found) for variant, found in times.items()}",
        ["tests/test_model_bench.py", "-k", "eager_rounds"],
    ),
    # ------------------------------------------- quantizer and MoE host code (blind review)
    # (shape_reason accepts K a multiple of 16 only (MXFP4 needs 32))
    mutant(
        "qm-quantizer-01",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "if len(shape) not in (2, 3) or shape[-1] % 32:",
        "if len(shape) not in (2, 3) or shape[-1] % 16:",
        ["tests/test_quantize_fp4.py"],
    ),
    # (shape_reason accepts zero extents)
    mutant(
        "qm-quantizer-02",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "    if min(shape) < 1:\n",
        "    if min(shape) < 0:\n",
        ["tests/test_quantize_fp4.py"],
    ),
    # (32-bit element limit off by one (2^31 elements accepted))
    mutant(
        "qm-quantizer-03",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "    if l * rows * k >= 2**31:",
        "    if l * rows * k > 2**31:",
        ["tests/test_quantize_fp4.py"],
    ),
    # (QuantizerConfig.kernel swaps local_amax and tokens)
    mutant(
        "qm-quantizer-04",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "            self.local_amax,\n            self.tokens,\n",
        "            self.tokens,\n            self.local_amax,\n",
        ["tests/test_eager.py"],
    ),
    # (plan_quantize one-grid threshold counts elements, not bytes)
    mutant(
        "qm-quantizer-05",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        (
            "    local = dynamic and x.numel() * x.element_size() <= LOCAL_AMAX_BYTES\n"
            "    kernel, sm_count"
        ),
        "    local = dynamic and x.numel() <= LOCAL_AMAX_BYTES\n    kernel, sm_count",
        ["tests/test_quantize_midpoints.py"],
    ),
    # (launcher cache stores under a key without local_amax)
    mutant(
        "qm-quantizer-08",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "        _LAUNCHERS[in_dtype, sf_vec_size, dynamic, local_amax, exact, index] = found",
        "        _LAUNCHERS[in_dtype, sf_vec_size, dynamic, False, exact, index] = found",
        ["tests/test_quantize_midpoints.py"],
    ),
    # (scratch scale buffer size with swapped blocked_numel args)
    mutant(
        "qm-quantizer-09",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        (
            "    sf = torch.empty(blocked_numel(rows, k // sf_vec_size), dtype=torch.ui"
            "nt8, device=device)"
        ),
        (
            "    sf = torch.empty(blocked_numel(k // sf_vec_size, rows), dtype=torch.ui"
            "nt8, device=device)"
        ),
        ["tests/test_quantize_midpoints.py"],
    ),
    # (bind_tokens copy-size check ignores K rounding to 64)
    mutant(
        "qm-quantizer-10",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "    need = rows * -(-k // K_BLOCK) * K_BLOCK",
        "    need = rows * k",
        ["tests/test_eager.py"],
    ),
    # (scratch cache key misses sf_vec_size)
    mutant(
        "qm-quantizer-11",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "    key = (x.shape, sf_vec_size, index, stream_handle(index))",
        "    key = (x.shape, index, stream_handle(index))",
        ["tests/test_quantize_midpoints.py"],
    ),
    # (tokens-step pairing check weakened and->or)
    mutant(
        "qm-tokens_step-13",
        "quantizer / MoE host review",
        "fp4_ops/sm90/tokens_step.py",
        "    if not (quantizer.tokens and gemm.tokens_converted):",
        "    if not (quantizer.tokens or gemm.tokens_converted):",
        ["tests/test_eager.py"],
    ),
    # (tokens-step cache key misses the GEMM config)
    mutant(
        "qm-tokens_step-14",
        "quantizer / MoE host review",
        "fp4_ops/sm90/tokens_step.py",
        "    key = (quantizer, gemm, device_index)",
        "    key = (quantizer, device_index)",
        ["tests/test_eager.py"],
    ),
    # (quantize_experts accepts E = 0)
    mutant(
        "qm-moe-15",
        "quantizer / MoE host review",
        "fp4_ops/moe.py",
        "    if w.ndim != 3 or w.shape[0] == 0:",
        "    if w.ndim != 3:",
        ["tests/test_moe.py"],
    ),
    # (check_moe drops the 2I == 2*I pairing check)
    mutant(
        "qm-moe-16",
        "quantizer / MoE host review",
        "fp4_ops/moe.py",
        (
            "    if e2 != e or h2 != h or two_i != 2 * i:\n"
            "        raise ValueError(\n"
            '            f"w13 {w13.shape}'
        ),
        ('    if e2 != e or h2 != h:\n        raise ValueError(\n            f"w13 {w13.shape}'),
        ["tests/test_moe.py"],
    ),
    # (W4A4 check drops I % 32)
    mutant(
        "qm-moe-17",
        "quantizer / MoE host review",
        "fp4_ops/moe.py",
        "    elif h % 32 or i % 32:",
        "    elif h % 32:",
        ["tests/test_moe.py"],
    ),
    # (topk_ids range check off by one)
    mutant(
        "qm-moe-18",
        "quantizer / MoE host review",
        "fp4_ops/moe.py",
        "    return (topk_ids >= 0) & (topk_ids < num_experts)",
        "    return (topk_ids >= 0) & (topk_ids <= num_experts)",
        ["tests/test_moe.py"],
    ),
    # (set_extra_state ignores an activation mismatch)
    mutant(
        "qm-moe-19",
        "quantizer / MoE host review",
        "fp4_ops/moe.py",
        '        for key in ("format", "activation"):',
        '        for key in ("format",):',
        ["tests/test_moe.py"],
    ),
    # (Llama4 top_k == E rejected (off by one))
    mutant(
        "qm-moe-20",
        "quantizer / MoE host review",
        "fp4_ops/moe.py",
        "        if not 1 <= top_k <= self.num_experts:",
        "        if not 1 <= top_k < self.num_experts:",
        ["tests/test_llama4.py"],
    ),
    # (quantize_cuda, the quantizer CLI's entry: GPU-only, run on an H100 / H200)
    # (a static global scale of any dtype is read as float32)
    mutant(
        "qm-quantizer-06",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "        if global_scale.dtype != torch.float32 or global_scale.device != x.device:",
        "        if global_scale.device != x.device:",
        QUANTIZE_CUDA_GPU,
    ),
    # (the MXFP4 refusal of a global scale inverted: NVFP4's refused, MXFP4's taken)
    mutant(
        "qm-quantizer-07",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "        if sf_vec_size != 16:\n            raise ValueError(\"global_scale is NVFP4's",
        "        if sf_vec_size == 16:\n            raise ValueError(\"global_scale is NVFP4's",
        QUANTIZE_CUDA_GPU,
    ),
    # (the launch's extents (rows, K) passed as (K, rows))
    mutant(
        "qm-quantizer-12",
        "quantizer / MoE host review",
        "fp4_ops/quantizer.py",
        "    return QuantizePlan(kernel, templates, ((rows, k, l), sm_count), partials, config)",
        "    return QuantizePlan(kernel, templates, ((k, rows, l), sm_count), partials, config)",
        QUANTIZE_CUDA_GPU,
    ),
    # ----------------------------- transformers methods refused on FP4 models (blind review)
    # (the refusal's message prefix changed)
    mutant(
        "rf-01",
        "transformers method refusals",
        NN,
        'raise ValueError(f"{self.method}: {self.reason}")',
        'raise ValueError(f"{self.method}(): {self.reason}")',
        REFUSAL_TESTS,
    ),
    # (load_quantized sets no refusals)
    mutant(
        "rf-03",
        "transformers method refusals",
        CHECKPOINT,
        "    refuse_transformers_methods(model)\n    return model.to(device).eval()",
        "    return model.to(device).eval()",
        REFUSAL_TESTS,
    ),
    # (resize refused whatever the output embedding is)
    mutant(
        "rf-04",
        "transformers method refusals",
        NN,
        "if callable(resize) and isinstance(output_embedding(module), FP4Linear):",
        "if callable(resize):",
        REFUSAL_TESTS,
    ),
    # (the input embedding checked instead of the output one)
    mutant(
        "rf-05",
        "transformers method refusals",
        NN,
        "if callable(resize) and isinstance(output_embedding(module), FP4Linear):",
        "if callable(resize) and isinstance(module.get_input_embeddings(), FP4Linear):",
        REFUSAL_TESTS,
    ),
    # (save_pretrained refused on the class (every model))
    mutant(
        "rf-06",
        "transformers method refusals",
        NN,
        'module.save_pretrained = Refused("save_pretrained", SAVE_PRETRAINED_REASON)',
        'type(module).save_pretrained = Refused("save_pretrained", SAVE_PRETRAINED_REASON)',
        REFUSAL_TESTS,
    ),
    # (the refusal holds the model (a reference cycle))
    mutant(
        "rf-07",
        "transformers method refusals",
        NN,
        'module.save_pretrained = Refused("save_pretrained", SAVE_PRETRAINED_REASON)',
        (
            "module.save_pretrained = functools.partial(\n"
            '            Refused("save_pretrained", SAVE_PRETRAINED_REASON), model\n'
            "        )"
        ),
        REFUSAL_TESTS,
    ),
    # (the save refusal does not name fp4_ops.save_quantized)
    mutant(
        "rf-09",
        "transformers method refusals",
        NN,
        ('"after writing config.json); write the checkpoint with fp4_ops.save_quantized(model, "'),
        '"after writing config.json); write the checkpoint with save_quantized(model, "',
        REFUSAL_TESTS,
    ),
    # (resize refused with the save_pretrained reason)
    mutant(
        "rf-10",
        "transformers method refusals",
        NN,
        'Refused("resize_token_embeddings", RESIZE_REASON)',
        'Refused("resize_token_embeddings", SAVE_PRETRAINED_REASON)',
        REFUSAL_TESTS,
    ),
    # (refusals set on the outer model only, not on inner models holding FP4 layers)
    mutant(
        "rf-11",
        "transformers method refusals",
        NN,
        "    for module in model.modules():\n        if not callable",
        "    for module in [model]:\n        if not callable",
        REFUSAL_TESTS,
    ),
    # (refusals set on every inner transformers model, FP4 layers or not)
    mutant(
        "rf-12",
        "transformers method refusals",
        NN,
        "        if not any(isinstance(m, FP4Buffers) for m in module.modules()):\n",
        "        if not any(isinstance(m, FP4Buffers) for m in model.modules()):\n",
        REFUSAL_TESTS,
    ),
    # (a group's tiles rounded up once too often)
    mutant(
        "bm-01",
        "MoE on Blackwell",
        PADDED_ROWS,
        "return (count + (self.tile_m - 1)) // self.tile_m",
        "return (count + self.tile_m) // self.tile_m",
        BLACKWELL_MOE_TESTS,
    ),
    # (each tile given to the group before its own)
    mutant(
        "bm-02",
        "MoE on Blackwell",
        PADDED_ROWS,
        "if tile_start <= tile and tile < tile_start + n:",
        "if tile_start < tile and tile <= tile_start + n:",
        BLACKWELL_MOE_TESTS,
    ),
    # (num_m_tiles in int64, which the kernel reads as int32)
    mutant(
        "bm-03",
        "MoE on Blackwell",
        MOE_KERNELS,
        "num_m_tiles = torch.empty(1, dtype=torch.int32, device=device)",
        "num_m_tiles = torch.empty(1, dtype=torch.int64, device=device)",
        BLACKWELL_MOE_TESTS,
    ),
    # (a group's last row left out of its tile)
    mutant(
        "bm-04",
        "MoE on Blackwell",
        PADDED_ROWS,
        "sTile[Slot.END] = sOffsets[g + 1]",
        "sTile[Slot.END] = sOffsets[g + 1] - 1",
        BLACKWELL_MOE_TESTS,
    ),
    # (half of A's scale columns)
    mutant(
        "bm-05",
        "MoE on Blackwell",
        SM100,
        "a, a_scale, offsets, config.mma_tiler_mn[0], 2 * half // sf_vec_size",
        "a, a_scale, offsets, config.mma_tiler_mn[0], half // sf_vec_size",
        BLACKWELL_MOE_TESTS,
    ),
    # (A's scales not moved with their rows)
    mutant(
        "bm-06",
        "MoE on Blackwell",
        PADDED_ROWS,
        "rWords[u] = Uint32(mScale[self._word(s, j, atoms_k)])",
        "rWords[u] = Uint32(mScale[self._word(i // rows, j, atoms_k)])",
        BLACKWELL_MOE_TESTS,
    ),
    # (the first group's alpha for every group)
    mutant(
        "bm-07",
        "MoE on Blackwell",
        SM100,
        "alpha = alpha.float().reshape(num_groups).contiguous()",
        "alpha = alpha.float().reshape(-1)[:1].expand(num_groups).contiguous()",
        BLACKWELL_MOE_TESTS,
    ),
    # (rows padded to tile N, not tile M)
    mutant(
        "bm-08",
        "MoE on Blackwell",
        SM100,
        "a, a_scale, offsets, config.mma_tiler_mn[0], 2 * half // sf_vec_size",
        "a, a_scale, offsets, config.mma_tiler_mn[1], 2 * half // sf_vec_size",
        BLACKWELL_MOE_TESTS,
    ),
    # (Hopper-prepacked experts handed to the Blackwell kernel)
    mutant(
        "bm-09",
        "MoE on Blackwell",
        MOE,
        "        if prepacked:\n            raise ValueError(PREPACKED_ON_BLACKWELL)\n",
        "",
        BLACKWELL_MOE_TESTS,
    ),
    # (the prepacked refusal on the wrong GPU)
    mutant(
        "bm-10",
        "MoE on Blackwell",
        MOE,
        "elif any(p is not None for p in prepacked) and not runs_hopper_kernels(x):",
        "elif any(p is not None for p in prepacked) and runs_hopper_kernels(x):",
        BLACKWELL_MOE_TESTS,
    ),
    # (the MoE kernel path takes Hopper's exact-BF16 route on Blackwell)
    mutant(
        "bm-11",
        "MoE on Blackwell",
        MOE,
        "    if kernels and runs_hopper_kernels(rows):",
        "    if kernels:",
        BLACKWELL_MOE_TESTS,
    ),
    # (W4A16 grouped on Blackwell not refused)
    mutant(
        "bm-12",
        "MoE on Blackwell",
        MOE,
        '    check_sm90(a, W4A16_GROUPED, "quantize the activations too (W4A4)")',
        "    runs_hopper_kernels(a)",
        BLACKWELL_MOE_TESTS,
    ),
    # (D's padded rows returned in place of the gather)
    mutant(
        "bm-13",
        "MoE on Blackwell",
        SM100,
        "    return d.index_select(0, padded.row_map)",
        "    return d[:rows]",
        BLACKWELL_MOE_TESTS,
    ),
    # (each row's padded row not recorded: D's rows gathered from the wrong places)
    mutant(
        "bm-14",
        "MoE on Blackwell",
        PADDED_ROWS,
        "mRowMap[s] = out_row + tidx",
        "mRowMap[s] = s",
        BLACKWELL_MOE_TESTS,
    ),
    # (W4A16 layers reordered for a kernel they cannot use)
    mutant(
        "bm-15",
        "MoE on Blackwell",
        MOE,
        '        plain = self.activations == "dynamic" and runs_blackwell_kernels(self.w13_scale)',
        "        plain = runs_blackwell_kernels(self.w13_scale)",
        BLACKWELL_MOE_TESTS,
    ),
    # (plain codes passed on as prepacked)
    mutant(
        "bm-16",
        "MoE on Blackwell",
        MOE,
        "prepacked = (None, None) if self.plain_k_order else (self.w13_codes, self.w2_codes)",
        "        prepacked = (self.w13_codes, self.w2_codes)",
        BLACKWELL_MOE_TESTS,
    ),
    # (a loaded state dict prepacked into a plain layer)
    mutant(
        "bm-17",
        "MoE on Blackwell",
        MOE,
        "                    t = t if self.plain_k_order else k_order.prepack_weights(t)",
        "                    t = k_order.prepack_weights(t)",
        BLACKWELL_MOE_TESTS,
    ),
    # (moves keep the K order of where the layer was)
    mutant(
        "bm-18",
        "MoE on Blackwell",
        MOE,
        "        super()._apply(fn, recurse)\n        self._settle_k_order()\n",
        "        super()._apply(fn, recurse)\n",
        BLACKWELL_MOE_TESTS,
    ),
    # (the order flag not kept with the codes)
    mutant(
        "bm-19",
        "MoE on Blackwell",
        MOE,
        "        self._buffers.update(codes)\n        self.plain_k_order = plain\n",
        "        self._buffers.update(codes)\n",
        BLACKWELL_MOE_TESTS,
    ),
    # (the order settled for where the layer was before a move)
    mutant(
        "bm-20",
        "MoE on Blackwell",
        MOE,
        "        super()._apply(fn, recurse)\n        self._settle_k_order()\n        return self",
        "        self._settle_k_order()\n        super()._apply(fn, recurse)\n        return self",
        BLACKWELL_MOE_TESTS,
    ),
    # (a load that assigns tensors from elsewhere keeps the old order)
    mutant(
        "bm-21",
        "MoE on Blackwell",
        MOE,
        "        self._settle_k_order()  # (assigned tensors",
        "        pass  # (assigned tensors",
        BLACKWELL_MOE_TESTS,
    ),
    # (sm_103 (B300) not in the sm_100 family)
    mutant(
        "bm-22",
        "MoE on Blackwell",
        OPS,
        "torch.cuda.get_device_capability(t.device) in BLACKWELL_CAPABILITIES",
        "torch.cuda.get_device_capability(t.device) == (10, 0)",
        BLACKWELL_MOE_TESTS,
    ),
    # (a tile more than any routing takes)
    mutant(
        "bm-23",
        "MoE on Blackwell",
        MOE_KERNELS,
        "max(min(groups, rows) - 1, 0)",
        "min(groups, rows)",
        BLACKWELL_MOE_TESTS,
    ),
    # (a tile less than the worst routing takes)
    mutant(
        "bm-24",
        "MoE on Blackwell",
        MOE_KERNELS,
        "max(min(groups, rows) - 1, 0)",
        "max(min(groups, rows) - 2, 0)",
        BLACKWELL_MOE_TESTS,
    ),
    # (a blind review's survivor: the walk takes the lane's first tile for every group it
    # walks, so a lane's second group with rows starts at the wrong source row)
    mutant(
        "bm-25",
        "MoE on Blackwell",
        PADDED_ROWS,
        "sOffsets[g] + (tile - tile_start) * self.tile_m",
        "sOffsets[g] + (tile - start) * self.tile_m",
        BLACKWELL_MOE_TESTS,
    ),
    # a blind review of the host code: layout, FP4Tensor, the ops' entries, FP4Linear, the
    # Hopper launcher's picks and checks, the tokens step and the MoE host code (ids rv-)
    mutant(
        "rv-layout-colblocks-floor",
        "off by one padding",
        LAYOUT,
        "return (row_blocks, round_up(k // sf_vec_size, ATOM_COLS) // ATOM_COLS, ATOM_BYTES)",
        "return (row_blocks, k // sf_vec_size // ATOM_COLS, ATOM_BYTES)",
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rv-layout-pad-swapped",
        "swapped argument",
        LAYOUT,
        "padded = torch.nn.functional.pad(raw, (0, cp - cols, 0, rp - rows))",
        "padded = torch.nn.functional.pad(raw, (0, rp - rows, 0, cp - cols))",
        ["tests/test_fp4_ops.py"],
    ),
    mutant(
        "rv-tensor-gs-zero-ok",
        "wrong bound",
        TENSOR,
        "ok = torch.isfinite(t) & (t > 0)",
        "ok = torch.isfinite(t) & (t >= 0)",
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rv-tensor-ct-not-inverted",
        "scale convention",
        TENSOR,
        'return _from_plain(weight_packed, weight_scale, 1.0 / inv, "nvfp4", names)',
        'return _from_plain(weight_packed, weight_scale, inv, "nvfp4", names)',
        ["tests/test_fp4_ops.py"],
    ),
    mutant(
        "rv-tensor-nvfp4-none-gs",
        "missing error",
        TENSOR,
        '    elif vec == FORMATS["mxfp4"]:\n        gs = torch.ones(',
        '    elif vec <= FORMATS["mxfp4"]:\n        gs = torch.ones(',
        ["tests/test_library.py"],
    ),
    mutant(
        "rv-ops-k-mult-16",
        "wrong bound",
        OPS,
        "if x.shape[-1] == 0 or x.shape[-1] % 32:",
        "if x.shape[-1] == 0 or x.shape[-1] % 16:",
        ["tests/test_fp4_ops.py"],
    ),
    mutant(
        "rv-ops-asrows-m32",
        "wrong layout condition",
        OPS,
        "    if m % 128 == 0:\n        return data, a.scale.reshape(",
        "    if m % 32 == 0:\n        return data, a.scale.reshape(",
        ["tests/test_semantics.py"],
    ),
    mutant(
        "rv-ops-alpha-drops-b-gs",
        "scale not applied",
        OPS,
        "alpha, alpha_scale = device_alpha(a.global_scale * b.global_scale, alpha), None",
        "alpha, alpha_scale = device_alpha(a.global_scale, alpha), None",
        ["tests/test_fp4_ops.py"],
    ),
    mutant(
        "rv-nn-fused-pairs",
        "off by one",
        NN,
        "return [group for group in groups.values() if len(group) > 1]",
        "return [group for group in groups.values() if len(group) > 2]",
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rv-nn-gs-not-kept",
        "dtype not preserved",
        NN,
        '    "weight_scale",\n    "weight_global_scale",\n    "input_global_scale",\n)',
        '    "weight_scale",\n    "input_global_scale",\n)',
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rv-nn-cpu-alpha-no-act-gs",
        "scale not applied",
        NN,
        "alpha = gs * self.weight_global_scale",
        "alpha = self.weight_global_scale",
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rv-nn-load-no-prepack",
        "missing transform",
        NN,
        'name, value = "weight_prepacked", k_order.prepack_weights(value)',
        'name, value = "weight_prepacked", value',
        ["tests/test_cpu.py"],
    ),
    mutant(
        "rv-nn-calibrate-last-amax",
        "wrong reduction",
        NN,
        "amax[key] = seen if key not in amax else torch.maximum(amax[key], seen)",
        "amax[key] = seen",
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rv-launcher-tma-uses-m",
        "wrong dimension",
        LAUNCHER,
        "c_dtype not in C_DTYPES or tma_store_fits(mnkl[1], c_dtype),",
        "c_dtype not in C_DTYPES or tma_store_fits(mnkl[0], c_dtype),",
        ["tests/test_hopper.py"],
    ),
    mutant(
        "rv-launcher-sfb-uses-m",
        "check wrong tensor",
        LAUNCHER,
        'want["sfb"] = (l, blocked_scale_numel(n, k, vec))',
        'want["sfb"] = (l, blocked_scale_numel(m, k, vec))',
        ["tests/test_eager.py"],
    ),
    mutant(
        "rv-launcher-pick-key-no-cdtype",
        "cache key missing field",
        LAUNCHER,
        "key = (mnkl, vec, c_dtype, a_dtype, device)",
        "key = (mnkl, vec, a_dtype, device)",
        ["tests/test_eager.py"],
    ),
    mutant(
        "rv-tokens-step-and-or",
        "wrong boolean operator",
        TOKENS_STEP,
        "if not (quantizer.tokens and gemm.tokens_converted):",
        "if not (quantizer.tokens or gemm.tokens_converted):",
        ["tests/test_eager.py"],
    ),
    mutant(
        "rv-moe-ids-le-e",
        "off by one bound",
        MOE,
        "return (topk_ids >= 0) & (topk_ids < num_experts)",
        "return (topk_ids >= 0) & (topk_ids <= num_experts)",
        ["tests/test_moe.py"],
    ),
    mutant(
        "rv-moe-gather-by-tokens",
        "swapped argument",
        MOE,
        "rows = x.index_select(0, order // k)",
        "rows = x.index_select(0, order // tokens)",
        ["tests/test_moe.py"],
    ),
    mutant(
        "rv-moe-extra-state-activation",
        "missing check",
        MOE,
        'for key in ("format", "activation"):',
        'for key in ("format",):',
        ["tests/test_moe.py"],
    ),
    # a second blind review: the CPU quantizer, the GPU quantizer's host functions, the
    # memory and buffer rules, the CLI integer lists, the stack benchmark's figures and
    # arguments, checkpoint loading and saving (ids rw-)
    mutant(
        "rw-cpu-nvfp4-scale-times-gs",
        "scale inverted",
        CPU,
        "scales = (amax / six / gs)",
        "scales = (amax / six * gs)",
        ["tests/test_cpu.py"],
    ),
    mutant(
        "rw-cpu-e2m1-tie-to-odd",
        "wrong rounding",
        CPU,
        "tie & (below % 2 == 1)",
        "tie & (below % 2 == 0)",
        ["tests/test_cpu.py"],
    ),
    mutant(
        "rw-cpu-e4m3-nan-not-refused",
        "refusal dropped",
        CPU,
        "        nan = 0x7F\n",
        "        nan = 0xFF\n",
        ["tests/test_cpu.py"],
    ),
    mutant(
        "rw-cpu-mxfp4-pow2-exponent",
        "off by one exponent",
        CPU,
        "exponent = exponent - (mantissa == 0.5).int()",
        "exponent = exponent - (mantissa > 0.5).int()",
        ["tests/test_cpu.py"],
    ),
    mutant(
        "rw-q-sf-cols-pad-off-by-one",
        "off by one padding",
        QUANTIZER,
        "return (sf_cols + SF_PER_WORD - 1)",
        "return (sf_cols + SF_PER_WORD)",
        QUANTIZER_TESTS,
    ),
    mutant(
        "rw-q-walk-tokens-no-roundup",
        "off by one rounding",
        QUANTIZER,
        "units = (k + K_BLOCK - 1) // K_BLOCK",
        "units = k // K_BLOCK",
        QUANTIZER_TESTS,
    ),
    mutant(
        "rw-q-scale-bytes-one-batch",
        "check wrong bound",
        QUANTIZER,
        "scale_bytes = l * blocked_numel",
        "scale_bytes = blocked_numel",
        ["tests/test_quantize_fp4.py"],
    ),
    mutant(
        "rw-q-ctas-values-swapped",
        "inverted condition",
        QUANTIZER,
        "if values_out else per_sm",
        "if not values_out else per_sm",
        ["tests/test_quantize_fp4.py"],
    ),
    mutant(
        "rw-mem-scalar-key-no-value",
        "cache key missing field",
        MEMORY,
        "key = (value, device.type, device.index)",
        "key = (device.type, device.index)",
        ["tests/test_library.py", "-k", "device_scalar"],
    ),
    mutant(
        "rw-buf-meta-copy-no-warning",
        "warning dropped",
        BUFFERS,
        "if target.is_meta and not value.is_meta:",
        "if target.is_meta and value.is_meta:",
        ["tests/test_library.py"],
    ),
    mutant(
        "rw-dev-parse-ints-extra-accepted",
        "check wrong bound",
        "fp4_ops/devtools.py",
        "if len(values) != count:",
        "if len(values) < count:",
        ["tests/test_hopper.py", "-k", "cli"],
    ),
    mutant(
        "rw-args-zero-accepted",
        "off by one check",
        "benchmarks/args.py",
        "if min(values) < 1:",
        "if min(values) < 0:",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rw-stack-per-layer-precedence",
        "operator precedence",
        "benchmarks/stack.py",
        "return (stack_us - silu_us) / layers",
        "return stack_us - silu_us / layers",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rw-stack-pct-us-as-ms",
        "unit error",
        "benchmarks/stack.py",
        "(layer_us * 1e-6)",
        "(layer_us * 1e-3)",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rw-stack-ratio-inverted",
        "swapped operands",
        "benchmarks/stack.py",
        "out[key] = theirs / ours",
        "out[key] = ours / theirs",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rw-ck-ct-weight-gs-not-inverted",
        "scale not inverted",
        CHECKPOINT,
        'gs = _read_scalar(t[keys["global"]].cpu(), keys["global"], scheme.reciprocal)',
        'gs = _read_scalar(t[keys["global"]].cpu(), keys["global"], False)',
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rw-ck-ct-input-scale-saved-decoding",
        "scale not inverted",
        CHECKPOINT,
        "(1.0 / layer.input_global_scale).reshape(1)",
        "layer.input_global_scale.reshape(1)",
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rw-ck-fp4-weight-only-stays-w4a16",
        "wrong mode mapping",
        CHECKPOINT,
        'return "dynamic" if inputs == "none" else inputs',
        'return "bf16" if inputs == "none" else inputs',
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rw-ck-save-gate-up-swapped",
        "swapped slices",
        CHECKPOINT,
        '("gate_proj", slice(0, i)), ("up_proj", slice(i, 2 * i))',
        '("gate_proj", slice(i, 2 * i)), ("up_proj", slice(0, i))',
        ["tests/test_checkpoint.py"],
    ),
    mutant(
        "rw-ck-ct-input-dynamic-swapped",
        "wrong config mapping",
        CHECKPOINT,
        '"dynamic": "local" if inputs == "static" else True',
        '"dynamic": True if inputs == "static" else "local"',
        ["tests/test_checkpoint.py"],
    ),
    # a third blind review: the benchmarks' host code (model, MoE, eager, linear, sm90, the
    # MoE profile), examples/generate.py, the Hopper CLI, k_order, reference.py and the MoE
    # kernels' host helpers (ids rx-)
    mutant(
        "rx-model-kv-missing-k-or-v",
        "wrong factor (size computation)",
        MODEL_BENCH,
        'per_position = 2 * c["num_key_value_heads"] * head_dim * 2',
        'per_position = c["num_key_value_heads"] * head_dim * 2',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rx-model-oproj-k-hidden",
        "wrong shape (N, K)",
        MODEL_BENCH,
        "(kv, hidden), (kv, hidden), (hidden, q)]",
        "(kv, hidden), (kv, hidden), (hidden, hidden)]",
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rx-model-fits-first-not-last",
        "index error (refusal message)",
        MODEL_BENCH,
        'f"; --layers {fits[-1]} fits"',
        'f"; --layers {fits[0]} fits"',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rx-model-lm-head-inverted",
        "inverted condition",
        MODEL_BENCH,
        'quantized = shapes if lm_head == "fp4" else shapes[:-1]',
        'quantized = shapes if lm_head == "bf16" else shapes[:-1]',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rx-model-kv-smallest-batch",
        "wrong operand (max vs min)",
        MODEL_BENCH,
        "kv_cache_bytes(name, max(args.batch)",
        "kv_cache_bytes(name, min(args.batch)",
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rx-moe-graph-calls-floor",
        "rounding direction",
        "benchmarks/moe.py",
        "return copies * math.ceil(CALLS_PER_GRAPH / copies)",
        "return copies * (CALLS_PER_GRAPH // copies)",
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rx-moe-humming-interval-bounds",
        "off-by-one bound",
        "benchmarks/moe.py",
        "if lo < routed <= hi:",
        "if lo <= routed < hi:",
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rx-moe-softmax-over-tokens",
        "wrong axis",
        "benchmarks/moe.py",
        "topk_weights=torch.softmax(top, dim=1)",
        "topk_weights=torch.softmax(top, dim=0)",
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rx-eager-calls-zero-accepted",
        "off-by-one bound (refusal)",
        "benchmarks/eager.py",
        "if not 1 <= args.calls <= 150:",
        "if not 0 <= args.calls <= 150:",
        ["tests/test_bench.py"],
    ),
    mutant(
        "rx-linear-k-multiple-dropped",
        "dropped check",
        "benchmarks/linear.py",
        "if n < 1 or k < 32 or k % 32:",
        "if n < 1 or k < 32:",
        ["tests/test_bench_linear.py"],
    ),
    mutant(
        "rx-linear-ratio-inverted",
        "ratio inverted",
        "benchmarks/linear.py",
        "else ours / bf16",
        "else bf16 / ours",
        ["tests/test_bench_linear.py"],
    ),
    mutant(
        "rx-sm90-shard-index-n",
        "off-by-one bound (refusal)",
        "benchmarks/sm90.py",
        "if not 0 <= i < n:",
        "if not 0 <= i <= n:",
        ["tests/test_bench.py"],
    ),
    mutant(
        "rx-sm90-torch-dequant-nibbles",
        "permutation error",
        "benchmarks/sm90.py",
        "codes = torch.stack((packed & 0xF, packed >> 4), dim=-1)",
        "codes = torch.stack((packed >> 4, packed & 0xF), dim=-1)",
        ["tests/test_bench.py"],
    ),
    mutant(
        "rx-prof-mean-divisor",
        "wrong divisor",
        "benchmarks/moe_profile.py",
        "(name, total / count)",
        "(name, total / per_call)",
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rx-gen-decode-counts-first-step",
        "off-by-one (reported figure)",
        "examples/generate.py",
        '"decode_tok_s": batch * (steps - 1) / decode_s',
        '"decode_tok_s": batch * steps / decode_s',
        ["tests/test_examples.py"],
    ),
    mutant(
        "rx-cli-tolerance-check-inverted",
        "inverted condition (refusal)",
        "fp4_ops/sm90/cli.py",
        "if not args.compile_only and args.tolerance >= k_limit:",
        "if args.compile_only and args.tolerance >= k_limit:",
        ["tests/test_hopper.py", "-k", "tolerance"],
    ),
    mutant(
        "rx-korder-byte-order-key",
        "cache key missing a field",
        "fp4_ops/sm90/k_order.py",
        'key = ("bytes", device, inverse)',
        'key = ("bytes", device)',
        ["tests/test_hopper.py", "-k", "prepack"],
    ),
    mutant(
        "rx-ref-mxfp4-pow2-mantissa",
        "wrong constant (rounding of the scale exponent)",
        "reference.py",
        "exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)",
        "exponent = torch.where(mantissa == 1.0, exponent - 1, exponent)",
        ["tests/test_reference.py"],
    ),
    mutant(
        "rx-mk-experts-cap-not-above-e",
        "off-by-one (size computation)",
        MOE_KERNELS,
        "return max(32, 1 << num_experts.bit_length())",
        "return max(32, 1 << (num_experts - 1).bit_length())",
        ["tests/test_moe_kernels.py"],
    ),
    mutant(
        "rx-mk-pad-rows-bytes-vs-codes",
        "wrong units (codes vs bytes)",
        MOE_KERNELS,
        "fit = max(PAD_CTA_BYTES * 2 // max(k, 1), 1)",
        "fit = max(PAD_CTA_BYTES // max(k, 1), 1)",
        ["tests/test_moe_kernels.py"],
    ),
    # a fourth blind review: the host code of the CUDA path (the eager plans, their keys and
    # bindings, scratch, workspaces, the tokens step, the MoE kernels route; ids ry-); two
    # are caught by the GPU tests only (-m gpu)
    mutant(
        "ry-launchable-no-contig",
        "check lets a non-contiguous tensor into a plan",
        OPS,
        "        x.is_contiguous()\n        and not x.data_ptr() % 16\n",
        "        not x.data_ptr() % 16\n",
        ["tests/test_eager.py", "-k", "launchable_refuses"],
    ),
    mutant(
        "ry-gemm-plan-scale-wrong-operand",
        "alpha scale pointer to the wrong tensor",
        OPS,
        "launch(ad, bd, a.scale, b.scale, out, a.global_scale, key[-1], scale=b.global_scale)",
        "launch(ad, bd, a.scale, b.scale, out, a.global_scale, key[-1], scale=a.global_scale)",
        ["tests/test_eager.py", "-m", "gpu", "-k", "planned_fp4_gemm"],
    ),
    mutant(
        "ry-quantize-takes-any-scale",
        "check lets a non-float32 / off-device static scale into a plan",
        OPS,
        "        and device_scalars(global_scale, index)\n",
        "",
        ["tests/test_eager.py", "-k", "quantize_plan_takes"],
    ),
    mutant(
        "ry-launch-key-no-out-dtype",
        "cache key missing dtype",
        LAUNCHER,
        "    key += (out_dtype, index, stream)\n",
        "    key += (index, stream)\n",
        ["tests/test_eager.py", "-k", "per_output_dtype"],
    ),
    mutant(
        "ry-workspace-key-no-stream",
        "buffer shared across streams (cache key missing stream)",
        LAUNCHER,
        "key = (config, mnkl, stream.device.index, stream.cuda_stream)",
        "key = (config, mnkl, stream.device.index)",
        ["tests/test_hopper.py", "-k", "launch_arguments_workspaces"],
    ),
    mutant(
        "ry-scratch-key-no-stream",
        "buffer shared across streams (cache key missing stream)",
        QUANTIZER,
        "key = (x.shape, sf_vec_size, index, stream_handle(index))",
        "key = (x.shape, sf_vec_size, index)",
        ["tests/test_eager.py", "-k", "scratch_buffers_are_kept"],
    ),
    mutant(
        "ry-scratch-run-drops-static-scale",
        "global-scale pointer to the wrong tensor",
        QUANTIZER,
        "plan.bind(scratch, global_scale)(x.data_ptr(), stream)",
        "plan.bind(scratch)(x.data_ptr(), stream)",
        ["tests/test_eager.py", "-k", "into_scratch"],
    ),
    mutant(
        "ry-linear-plan-key-no-dtype",
        "plan reused after a dtype change (cache key missing dtype)",
        NN,
        "key = (x.shape, x.dtype, index, stream_handle(index))",
        "key = (x.shape, None, index, stream_handle(index))",
        ["tests/test_eager.py", "-m", "gpu", "-k", "refusals_stand_after"],
    ),
    mutant(
        "ry-linear-plan-alpha-weight-scale",
        "alpha pointer to the wrong tensor",
        NN,
        "gemm, a = launch.bind(w, sq, sw, gs, gw), q.data_ptr()",
        "gemm, a = launch.bind(w, sq, sw, gw, gw), q.data_ptr()",
        ["tests/test_eager.py", "-k", "scratch_route"],
    ),
    mutant(
        "ry-linear-plan-ignores-bias-swap",
        "stale plan after bias replaced",
        NN,
        '        return layer._parameters.get("bias") is self.bias\n',
        "        return True\n",
        ["tests/test_eager.py", "-k", "plan_is_stale"],
    ),
    mutant(
        "ry-moe-exact-rows-drops-scale",
        "global scale dropped",
        MOE,
        "return gpu_grouped_w4a16(*args, prepacked_data is not None, scale)",
        "return gpu_grouped_w4a16(*args, prepacked_data is not None)",
        ["tests/test_moe.py", "-k", "undoes_its_exact_rows"],
    ),
    mutant(
        "ry-tokens-step-key-no-quantizer",
        "compiled-step cache key missing the quantizer config (dtype / static vs dynamic)",
        TOKENS_STEP,
        "key = (quantizer, gemm, device_index)",
        "key = (gemm, device_index)",
        ["tests/test_eager.py", "-k", "compiled_once_per_pair"],
    ),
    # the benchmarks' timers and copy bandwidths, against spins timed alone (ids tm-); the
    # GPU tests catch them (any CUDA GPU)
    mutant(
        "tm-graph-divides-by-graph-calls",
        "timer divides by the wrong count",
        "fp4_ops/devtools.py",
        "return start.elapsed_time(end) * 1000.0 / (iterations * repeats)",
        "return start.elapsed_time(end) * 1000.0 / iterations",
        ["tests/test_timers.py", "-m", "gpu"],
    ),
    mutant(
        "tm-eager-times-its-warmup",
        "warm-up call timed",
        "fp4_ops/devtools.py",
        "    import torch\n\n    fn()\n    torch.cuda.synchronize()\n",
        "    import torch\n\n    torch.cuda.synchronize()\n",
        ["tests/test_timers.py", "-m", "gpu"],
    ),
    mutant(
        "tm-linear-times-first-call-only",
        "timer skips calls it was given",
        "benchmarks/linear.py",
        "                calls[i % len(calls)]()\n",
        "                calls[0]()\n",
        ["tests/test_timers.py", "-m", "gpu"],
    ),
    mutant(
        "tm-linear-captures-the-warmup",
        "warm-up call timed",
        "benchmarks/linear.py",
        "        for call in calls:  # warm-up, on the capturing stream\n            call()\n",
        "",
        ["tests/test_timers.py", "-m", "gpu"],
    ),
    mutant(
        "tm-sm90-graph-per-replay",
        "timer divides by the wrong count",
        "benchmarks/sm90.py",
        "times.append(s.elapsed_time(e) * 1e-3 / reps)",
        "times.append(s.elapsed_time(e) * 1e-3)",
        ["tests/test_timers.py", "-m", "gpu"],
    ),
    mutant(
        "tm-sm90-copy-counts-one-way",
        "copy bandwidth counts the bytes once",
        "benchmarks/sm90.py",
        "return 2 * (2 << 30) / sorted(times[2:])[len(times[2:]) // 2]",
        "return (2 << 30) / sorted(times[2:])[len(times[2:]) // 2]",
        ["tests/test_timers.py", "-m", "gpu"],
    ),
    # a seventh blind review: the benchmarks' reporting and arithmetic on the CPU (per-layer
    # times, bytes, ratios, memory estimates, the profile table, refusals; ids rb-)
    mutant(
        "rb-stack-perlayer-precedence",
        "operator precedence / dropped parentheses",
        "benchmarks/stack.py",
        "    return (stack_us - silu_us) / layers\n",
        "    return stack_us - silu_us / layers\n",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rb-stack-bare-read-silu-base",
        "wrong base record (wrong SiLU-only time subtracted)",
        "benchmarks/stack.py",
        '        finish_result(row["bare_read"], row["bare_read"], copy_bps)\n',
        '        finish_result(row, row["bare_read"], copy_bps)\n',
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rb-stack-scale-bytes-block32",
        "wrong divisor (block size) in byte count",
        "benchmarks/stack.py",
        "        sizes = [n * k // 2 + n * k // 16 for n, k in shapes]\n",
        "        sizes = [n * k // 2 + n * k // 32 for n, k in shapes]\n",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rb-stack-speedup-inverted",
        "swapped numerator / denominator",
        "benchmarks/stack.py",
        "        out[key] = theirs / ours if ours and theirs else None\n",
        "        out[key] = ours / theirs if ours and theirs else None\n",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rb-model-kv-missing-k-or-v",
        "dropped factor (keys and values) in memory estimate",
        "benchmarks/model.py",
        '    per_position = 2 * c["num_key_value_heads"] * head_dim * 2\n',
        '    per_position = c["num_key_value_heads"] * head_dim * 2\n',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rb-model-lm-head-inverted",
        "inverted condition",
        "benchmarks/model.py",
        '    quantized = shapes if lm_head == "fp4" else shapes[:-1]\n',
        '    quantized = shapes if lm_head != "fp4" else shapes[:-1]\n',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rb-model-fits-smallest-layers",
        "wrong element picked (first instead of last)",
        "benchmarks/model.py",
        '    return reason + (f"; --layers {fits[-1]} fits" if fits else "")\n',
        '    return reason + (f"; --layers {fits[0]} fits" if fits else "")\n',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rb-model-profile-total-no-quantize",
        "missed element in a sum",
        "benchmarks/model.py",
        '        total = p["gemm"] + p["attention"] + p["quantize"] + p["other"]\n',
        '        total = p["gemm"] + p["attention"] + p["other"]\n',
        ["tests/test_model_bench.py"],
    ),
    mutant(
        "rb-moe-expert-bytes-w13-one-i",
        "wrong constant in byte count (w13 counted as I x H)",
        "benchmarks/moe.py",
        "    weights = 3 * cfg.hidden * cfg.intermediate\n",
        "    weights = 2 * cfg.hidden * cfg.intermediate\n",
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rb-moe-touched-not-deduplicated",
        "missing deduplication (pairs counted, not experts)",
        "benchmarks/moe.py",
        "    return sorted(set(topk_ids.reshape(-1).tolist()))\n",
        "    return sorted(topk_ids.reshape(-1).tolist())\n",
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rb-moe-targets-range-exclusive",
        "off-by-one range bound",
        "benchmarks/moe.py",
        '            if not first <= row["tokens"] <= last:\n',
        '            if not first <= row["tokens"] < last:\n',
        ["tests/test_bench_moe.py"],
    ),
    mutant(
        "rb-args-positive-ints-zero",
        "off-by-one refusal bound",
        "benchmarks/args.py",
        "    if min(values) < 1:\n",
        "    if min(values) < 0:\n",
        ["tests/test_bench_stack.py"],
    ),
    mutant(
        "rb-eager-static-quantize-base",
        "wrong reference row for a ratio",
        "benchmarks/eager.py",
        '            quantizing = name.startswith("quantize") or name == "empty_like + mul"\n',
        '            quantizing = name == "quantize" or name == "empty_like + mul"\n',
        ["tests/test_bench.py"],
    ),
    mutant(
        "rb-linear-l2-copies-off-by-one",
        "off-by-one (dropped + 1)",
        "benchmarks/linear.py",
        "    return 2 * l2_bytes // one_copy_bytes + 1\n",
        "    return 2 * l2_bytes // one_copy_bytes\n",
        ["tests/test_bench_linear.py"],
    ),
    mutant(
        "rb-model-profile-columns-swapped",
        "table columns swapped",
        MODEL_BENCH,
        "line += f\"{p['attention']:9.1f} {p['quantize']:8.1f} {p['other']:8.1f} {total:8.1f}\"",
        "line += f\"{p['quantize']:9.1f} {p['attention']:8.1f} {p['other']:8.1f} {total:8.1f}\"",
        ["tests/test_model_bench.py"],
    ),
    # an eighth blind review: loading and saving checkpoints (names, global-scale conventions,
    # expert stacking, header and config checks, the save path; ids rc-); all caught
    mutant(
        "rc-ct-input-gs-not-inverted",
        "reciprocal dropped (input scale)",
        CHECKPOINT,
        (
            "    return None if key is None else _read_scalar(t[key].cpu(), key, la"
            "yer.scheme.reciprocal)"
        ),
        ("    return None if key is None else _read_scalar(t[key].cpu(), key, False)"),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-ct-global-input-swapped",
        "tensor names swapped",
        CHECKPOINT,
        (
            '            names["global"] = "weight_global_scale"\n'
            '        if self.inputs == "static":\n'
            '            names["input"] = "input_global_scale"'
        ),
        (
            '            names["global"] = "input_global_scale"\n'
            '        if self.inputs == "static":\n'
            '            names["input"] = "weight_global_scale"'
        ),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-save-modelopt-gs-inverted",
        "reciprocal added on save",
        CHECKPOINT,
        '        out[prefix + "weight_scale_2"] = w.global_scale.reshape(())',
        ('        out[prefix + "weight_scale_2"] = (1.0 / w.global_scale).reshape(())'),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-moe-gate-up-swapped",
        "gate/up order swapped in cat",
        CHECKPOINT,
        "        w13.append((torch.cat((gd, ud)), torch.cat((gsc, usc))))",
        "        w13.append((torch.cat((ud, gd)), torch.cat((usc, gsc))))",
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-moe-down-gs-from-gate",
        "wrong variable (global scale)",
        CHECKPOINT,
        "        gs2.append(dgs)",
        "        gs2.append(ggs)",
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-mixtral-w1-w3-swapped",
        "name mapping swapped",
        CHECKPOINT,
        (
            '    (r"\\.experts\\.\\d+", "w1", "gate_proj"),\n'
            '    (r"\\.experts\\.\\d+", "w3", "up_proj"),'
        ),
        (
            '    (r"\\.experts\\.\\d+", "w1", "up_proj"),\n'
            '    (r"\\.experts\\.\\d+", "w3", "gate_proj"),'
        ),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-save-expert-gs-first",
        "wrong index (per-expert stacking)",
        CHECKPOINT,
        "            w13.global_scale.expand(experts.num_experts)[e],",
        "            w13.global_scale.expand(experts.num_experts)[0],",
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-save-modelopt-blocked-scales",
        "blocked scales written as plain",
        CHECKPOINT,
        (
            '        out[prefix + "weight"] = w.data.view(torch.uint8)\n'
            '        out[prefix + "weight_scale"] = w.plain_scales()'
        ),
        (
            '        out[prefix + "weight"] = w.data.view(torch.uint8)\n'
            '        out[prefix + "weight_scale"] = w.scale.reshape(w.shape[-2], -1'
            ")"
        ),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-mxfp4-scale-dtype-any",
        "dtype check too loose (E4M3 as E8M0)",
        CHECKPOINT,
        (
            '    scale_dtypes = (SCALE_DTYPES[vec],) if fmt == "nvfp4" else (torch.'
            "uint8, SCALE_DTYPES[vec])"
        ),
        (
            '    scale_dtypes = (SCALE_DTYPES[vec],) if fmt == "nvfp4" else (torch.'
            "uint8, *SCALE_DTYPES.values())"
        ),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-ct-nvfp4-static-groups-accepted",
        "config check too loose",
        CHECKPOINT,
        '        if dynamic == "local":',
        '        if dynamic in ("local", False):',
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-modelopt-disagree-accepted",
        "consistency check weakened",
        CHECKPOINT,
        ("    return f\"{config.scheme.format} {mode}, KV cache {config.kv_cache or '16-bit'}\""),
        ("    return f\"{config.scheme.format}, KV cache {config.kv_cache or '16-bit'}\""),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-expect-and-not-or",
        "or -> and in header check",
        CHECKPOINT,
        "    if not ok_dtype or shape not in shapes:",
        "    if not ok_dtype and shape not in shapes:",
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-kv-scales-unchecked",
        "inverted early return (missed check)",
        CHECKPOINT,
        ('    if not keys:\n        return\n    with ck.reader(torch.device("cpu")) as read:'),
        ('    if keys:\n        return\n    with ck.reader(torch.device("cpu")) as read:'),
        CHECKPOINT_TESTS,
    ),
    mutant(
        "rc-gptoss-wrong-ignore-key",
        "wrong config key",
        CHECKPOINT,
        (
            '            ignore = _str_list(qc.get("modules_to_not_convert") or [],'
            ' "modules_to_not_convert")'
        ),
        ('            ignore = _str_list(qc.get("ignore") or [], "modules_to_not_convert")'),
        CHECKPOINT_TESTS,
    ),
    # a ninth blind review: the Hopper CLI's checks and exit statuses, benchmarks.sm90's shards,
    # rates, ratios, cold-L2 copies and combine (ids rk-)
    mutant(
        "rk-cli-dumpdir-inverted",
        "inverted condition",
        "fp4_ops/sm90/cli.py",
        "    if args.dump_dir is not None and not args.compile_only:\n",
        "    if args.dump_dir is not None and args.compile_only:\n",
        ["tests/test_hopper.py", "-m", "not gpu", "-k", "cli"],
    ),
    mutant(
        "rk-cli-tolerance-zero",
        "loosened bound check",
        "fp4_ops/sm90/cli.py",
        "    if not math.isfinite(args.tolerance) or args.tolerance <= 0:\n",
        "    if not math.isfinite(args.tolerance) or args.tolerance < 0:\n",
        ["tests/test_hopper.py", "-m", "not gpu", "-k", "cli"],
    ),
    mutant(
        "rk-cli-klimit-uses-n",
        "wrong list element",
        "fp4_ops/sm90/cli.py",
        "    k_limit = 1.0 / (max(args.mnkl[2], 1) * 2.0**-24)\n",
        "    k_limit = 1.0 / (max(args.mnkl[1], 1) * 2.0**-24)\n",
        ["tests/test_hopper.py", "-m", "not gpu", "-k", "cli"],
    ),
    mutant(
        "rk-cli-usage-exit-1",
        "wrong exit status",
        "fp4_ops/sm90/cli.py",
        ('        print(f"error: {err}", file=sys.stderr)\n        return 2\n'),
        ('        print(f"error: {err}", file=sys.stderr)\n        return 1\n'),
        ["tests/test_hopper.py", "-m", "not gpu", "-k", "cli"],
    ),
    mutant(
        "rk-cli-ulp-bits-swapped",
        "swapped constants",
        "fp4_ops/sm90/cli.py",
        "    bits = {torch.bfloat16: 8, torch.float16: 11}.get(d.dtype)\n",
        "    bits = {torch.bfloat16: 11, torch.float16: 8}.get(d.dtype)\n",
        ["tests/test_hopper.py", "-m", "not gpu", "-k", "cli"],
    ),
    mutant(
        "rk-bench-shard-index-n",
        "off-by-one range check",
        "benchmarks/sm90.py",
        "        if not 0 <= i < n:\n",
        "        if not 0 <= i <= n:\n",
        ["tests/test_bench.py"],
    ),
    mutant(
        "rk-bench-tflops-no-2",
        "wrong unit factor",
        "benchmarks/sm90.py",
        ("    return dict(us=sec * 1e6, tflops=2 * m * n * k / sec / 1e12, **extra)\n"),
        "    return dict(us=sec * 1e6, tflops=m * n * k / sec / 1e12, **extra)\n",
        ["tests/test_bench.py"],
    ),
    mutant(
        "rk-bench-l2-copies-no-plus1",
        "off-by-one count",
        "benchmarks/sm90.py",
        "    return 1 if warm else L2_MULTIPLE * l2_bytes // one_set_bytes + 1\n",
        "    return 1 if warm else L2_MULTIPLE * l2_bytes // one_set_bytes\n",
        ["tests/test_bench.py"],
    ),
    mutant(
        "rk-bench-ratio-inverted",
        "swapped operands",
        "benchmarks/sm90.py",
        ('            out[f"{fmt}/{key}"] = theirs / ours if ours and theirs else None\n'),
        ('            out[f"{fmt}/{key}"] = ours / theirs if ours and theirs else None\n'),
        ["tests/test_bench.py"],
    ),
    mutant(
        "rk-bench-combine-bw-max",
        "wrong reduction (min/max)",
        "benchmarks/sm90.py",
        ('    meta["copy_bandwidth_Bps"] = min(s["meta"]["copy_bandwidth_Bps"] for s in shards)\n'),
        ('    meta["copy_bandwidth_Bps"] = max(s["meta"]["copy_bandwidth_Bps"] for s in shards)\n'),
        ["tests/test_bench.py"],
    ),
    mutant(
        "rk-bench-nibble-order",
        "swapped operands",
        "benchmarks/sm90.py",
        ("    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)\n"),
        ("    codes = torch.stack((packed >> 4, packed & 0xF), dim=-1).flatten(-2)\n"),
        ["tests/test_bench.py"],
    ),
    mutant(
        "rk-bench-combine-no-runs",
        "loosened check",
        "benchmarks/sm90.py",
        "        if len(runs) != 1:\n",
        "        if len(runs) > 1:\n",
        ["tests/test_bench.py"],
    ),
    # a tenth blind review (the host modules): 17 caught at first; test_device_keys and the
    # scales-copied test since; rj-time-graph-per-replay needs a GPU (test_timers)
    mutant(
        "rj-blocked-atom-order",
        "wrong blocked scale layout index",
        LAYOUT,
        "out = atoms.permute(0, 1, 4, 3, 2, 5).reshape(*lead, rp * cp)",
        "out = atoms.permute(0, 4, 1, 3, 2, 5).reshape(*lead, rp * cp)",
        HOST_TESTS,
    ),
    mutant(
        "rj-round-up-exact",
        "off-by-one in padding",
        LAYOUT,
        "    return -(-n // multiple) * multiple",
        "    return (n // multiple + 1) * multiple",
        HOST_TESTS,
    ),
    mutant(
        "rj-pack-nibble-order",
        "wrong nibble order in FP4 packing",
        LAYOUT,
        "    return pairs[..., 0] | (pairs[..., 1] << 4)",
        "    return (pairs[..., 0] << 4) | pairs[..., 1]",
        HOST_TESTS,
    ),
    mutant(
        "rj-e2m1-ties-odd",
        "rounding ties to the wrong code",
        CPU,
        "    code = torch.where(tie & (below % 2 == 1), below + 1, below)",
        "    code = torch.where(tie & (below % 2 == 0), below + 1, below)",
        HOST_TESTS,
    ),
    mutant(
        "rj-mxfp4-pow2-exponent",
        "off-by-one exponent at a power of two",
        CPU,
        "    exponent = exponent - (mantissa == 0.5).int()\n",
        "",
        HOST_TESTS,
    ),
    mutant(
        "rj-check-scales-e4m3-nan",
        "weakened refusal of bad input",
        CPU,
        ("        nan = 0x7F\n    else:"),
        ("        nan = 0xFF\n    else:"),
        HOST_TESTS,
    ),
    mutant(
        "rj-gemm-alpha-after-cast",
        "scaling after the output cast (double rounding)",
        CPU,
        "    return (torch.matmul(da, db.transpose(-1, -2)) * alpha).to(out_dtype)",
        "    return torch.matmul(da, db.transpose(-1, -2)).to(out_dtype) * alpha",
        HOST_TESTS,
    ),
    mutant(
        "rj-packed-k-zero",
        "dropped refusal of empty input",
        TENSOR,
        "    if k == 0 or k % vec:",
        "    if k % vec:",
        HOST_TESTS,
    ),
    mutant(
        "rj-global-scale-alias",
        "missing copy (aliasing the caller's tensor)",
        TENSOR,
        "        return t.to(like.device).clone()",
        "        return t.to(like.device)",
        HOST_TESTS,
    ),
    mutant(
        "rj-per-batch-gs-length",
        "weakened shape check for 3-D batched input",
        TENSOR,
        "        per_batch = d.ndim == 3 and tuple(g.shape) == d.shape[:1]",
        "        per_batch = d.ndim == 3 and g.ndim == 1",
        ["tests/test_moe.py", "-m", "not gpu"],
    ),
    mutant(
        "rj-picklable-e8m0",
        "serialization misses a dtype",
        TENSOR,
        ("    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() == 1:"),
        "    if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn:",
        HOST_TESTS,
    ),
    mutant(
        "rj-buffers-cast-roundtrip",
        "kept buffer restored through the cast dtype",
        BUFFERS,
        "                self._buffers[name] = old.to(new.device)",
        "                self._buffers[name] = new.to(old.dtype)",
        HOST_TESTS,
    ),
    mutant(
        "rj-aligned-rows-contiguous",
        "wrong alignment handling",
        MEMORY,
        "    return t.clone(memory_format=torch.contiguous_format)",
        "    return t.contiguous()",
        HOST_TESTS,
    ),
    mutant(
        "rj-device-scalar-key",
        "cache keyed without the device index",
        MEMORY,
        "    key = (value, device.type, device.index)",
        "    key = (value, device.type)",
        HOST_TESTS,
    ),
    mutant(
        "rj-byte-order-cache-inverse",
        "cache keyed on too little",
        "fp4_ops/sm90/k_order.py",
        '    key = ("bytes", device, inverse)',
        '    key = ("bytes", device)',
        HOST_TESTS,
    ),
    mutant(
        "rj-byte-order-loop-swap",
        "wrong K permutation",
        "fp4_ops/sm90/k_order.py",
        "for q in range(4) for w in range(2) for p in range(4)]",
        "for w in range(2) for q in range(4) for p in range(4)]",
        HOST_TESTS,
    ),
    mutant(
        "rj-parse-ints-extra",
        "weakened refusal of bad input",
        "fp4_ops/devtools.py",
        "    if len(values) != count:",
        "    if len(values) < count:",
        HOST_TESTS,
    ),
    mutant(
        "rj-time-graph-per-replay",
        "timer reports the wrong statistic",
        "fp4_ops/devtools.py",
        "    return start.elapsed_time(end) * 1000.0 / (iterations * repeats)",
        "    return start.elapsed_time(end) * 1000.0 / repeats",
        ["tests/test_timers.py"],
    ),
    mutant(
        "rj-tokens-step-refusal",
        "weakened refusal of bad configuration",
        TOKENS_STEP,
        "    if not (quantizer.tokens and gemm.tokens_converted):",
        "    if not (quantizer.tokens or gemm.tokens_converted):",
        HOST_TESTS,
    ),
    mutant(
        "rj-tokens-step-cache-device",
        "cache keyed without the device",
        TOKENS_STEP,
        "    key = (quantizer, gemm, device_index)",
        "    key = (quantizer, gemm)",
        HOST_TESTS,
    ),
    # an eleventh blind review (the MoE kernels): 15 caught at first, 19 of 20 on the CPU since
    # (docs/moe_design.md section 4); the combine's host loop bound needs the GPU test
    mutant(
        "rm-route-gather-bound",
        "wrong loop bound (tokens instead of rows)",
        ROUTING,
        (
            "for i in cutlass.range(tidx, cute.size(mTokenOf) * per_row, THREADS,"
            " unroll=GATHER_UNROLL):"
        ),
        (
            "for i in cutlass.range(tidx, cute.size(mX.shape[0]) * per_row, THREADS,"
            " unroll=GATHER_UNROLL):"
        ),
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-route-gather-barrier",
        "missing barrier (global-memory RAW race)",
        ROUTING,
        (
            "        if const_expr(self.gather):\n"
            "            # (every row's token is written)\n"
            "            cute.arch.sync_threads()\n"
            "            self._gather(*gathered, mTokenOf)\n"
        ),
        ("        if const_expr(self.gather):\n            self._gather(*gathered, mTokenOf)\n"),
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-route-ok-slot",
        "wrong shared counter read (enum slot)",
        ROUTING,
        "mOk[0] = Int32(sMisc[Misc.INVALID] == 0)",
        "mOk[0] = Int32(sMisc[Misc.INVALID_PLACED] == 0)",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-route-valid-lane",
        "wrong lane publishes the scan total",
        ROUTING,
        ("        if lane == WARP - 1:\n            sMisc[Misc.VALID] = inclusive"),
        ("        if lane == 0:\n            sMisc[Misc.VALID] = inclusive"),
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-host-gather-align",
        "alignment copy weakened to contiguity",
        MOE_KERNELS,
        "    x = aligned_rows(x) if gather else x\n",
        "    x = x.contiguous() if gather else x\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-host-max-experts-boundary",
        "off-by-one in refusal bound",
        MOE_KERNELS,
        "    if num_experts > MAX_EXPERTS:\n",
        "    if num_experts >= MAX_EXPERTS:\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-host-pad-tiles-bound",
        "wrong capacity bound (under-allocation)",
        MOE_KERNELS,
        "    return -(-rows // tile_m) + max(min(groups, rows) - 1, 0)\n",
        "    return -(-rows // tile_m) + max(min(groups, -(-rows // tile_m)) - 1, 0)\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-host-pad-k-check",
        "weakened input refusal",
        MOE_KERNELS,
        "    if rows == 0 or half % 16:\n",
        "    if rows == 0 or half % 8:\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-host-act-bias-align",
        "missing alignment/contiguity copy of an operand",
        MOE_KERNELS,
        ("    h = aligned_rows(h)\n    bias = None if bias is None else aligned_rows(bias)\n"),
        "    h = aligned_rows(h)\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-act-swiglu-sig-unclamped",
        "clamp applied after it is used",
        ACTIVATION,
        (
            "            g = min(g, Float32(SWIGLUOAI_LIMIT))\n"
            "            u = max(min(u, Float32(SWIGLUOAI_LIMIT)), Float32(-SWIGLUOAI_LIMIT))\n"
            "            sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-g *"
            " Float32(SWIGLUOAI_ALPHA)))\n"
        ),
        (
            "            sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-g *"
            " Float32(SWIGLUOAI_ALPHA)))\n"
            "            g = min(g, Float32(SWIGLUOAI_LIMIT))\n"
            "            u = max(min(u, Float32(SWIGLUOAI_LIMIT)), Float32(-SWIGLUOAI_LIMIT))\n"
        ),
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-act-swiglu-gate-both",
        "clamp on the wrong side(s)",
        ACTIVATION,
        "            g = min(g, Float32(SWIGLUOAI_LIMIT))\n",
        "            g = max(min(g, Float32(SWIGLUOAI_LIMIT)), Float32(-SWIGLUOAI_LIMIT))\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-act-silu-fastmath",
        "approximate math instead of accurate exp",
        ACTIVATION,
        "        return g / (Float32(1.0) + cute.math.exp(-g)) * u\n",
        "        return g / (Float32(1.0) + cute.math.exp(-g, fastmath=True)) * u\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-comb-total-pairs",
        "wrong grid-stride bound (pairs for tokens)",
        COMBINE,
        "        total = tokens * cols\n",
        "        total = pairs * cols\n",
        ["tests/test_moe_kernels.py", "-m", "gpu", "-k", "combine"],
    ),
    mutant(
        "rm-comb-acc-rounding",
        "dropped float32 accumulation (per-step rounding)",
        COMBINE,
        "                acc = acc + Float32(mWeights[p]) * y\n",
        ("                acc = (acc + Float32(mWeights[p]) * y).to(self.dtype).to(Float32)\n"),
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-pad-first-stride",
        "wrong stride in tile-to-row index",
        PADDED_ROWS,
        "sTile[Slot.FIRST] = sOffsets[g] + (tile - tile_start) * self.tile_m",
        "sTile[Slot.FIRST] = sOffsets[g] + (tile - tile_start) * self.rows_per_cta",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-pad-rowmap-end",
        "off-by-one predicate (<= end)",
        PADDED_ROWS,
        ("            if (s >= 0) & (s < end):\n                mRowMap[s] = out_row + tidx"),
        ("            if (s >= 0) & (s <= end):\n                mRowMap[s] = out_row + tidx"),
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-pad-unused-tile",
        "off-by-one in unused-tile test",
        PADDED_ROWS,
        "            if tile >= total:\n",
        "            if tile > total:\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-gating-alpha",
        "wrong constant (rounded)",
        "fp4_ops/moe_kernels/gating.py",
        "SWIGLUOAI_ALPHA = 1.702\n",
        "SWIGLUOAI_ALPHA = 1.7\n",
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-dtypes-f16",
        "wrong dtype mapping",
        "fp4_ops/moe_kernels/dtypes.py",
        '"Float16": Float16',
        '"Float16": BFloat16',
        MOE_REVIEW_TESTS,
    ),
    mutant(
        "rm-moe-weights-xdtype",
        "dropped precision in dtype conversion",
        MOE,
        (
            "        weights = topk_weights if topk_weights.dtype in IN_DTYPES else"
            " topk_weights.float()\n"
        ),
        "        weights = topk_weights.to(x.dtype)\n",
        ["tests/test_moe.py", "-m", "not gpu"],
    ),
    # a twelfth blind review (the ops' entry points and CPU path): 18 caught at first; the
    # two fake-kernel ones since by test_fake_kernels
    mutant(
        "rn-fake-quant-mx-scale-dtype",
        "fake kernel wrong dtype",
        OPS,
        (
            "    scale = x.new_empty(blocked_shape_of(data, sf_vec_size),"
            " dtype=SCALE_DTYPES[sf_vec_size])\n"
        ),
        (
            "    scale = x.new_empty(blocked_shape_of(data, sf_vec_size),"
            " dtype=torch.float8_e4m3fn)\n"
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-fake-gemm-batched-shape",
        "fake kernel wrong shape (batched)",
        OPS,
        "    shape = (*a_data.shape[:-1], b_data.shape[-2])\n",
        "    shape = (a_data.shape[0], b_data.shape[-2])\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-fake-w4a16-out-dtype",
        "fake kernel wrong dtype",
        OPS,
        "    return a.new_empty((*a.shape[:-1], b_data.shape[-2]), dtype=out_dtype)\n",
        "    return a.new_empty((*a.shape[:-1], b_data.shape[-2]), dtype=a.dtype)\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-cpu-gemm-alpha-scale-skipped",
        "alpha product skipped on CPU path",
        OPS,
        (
            "    alpha = alpha if alpha_scale is None else alpha * alpha_scale\n"
            '    if where == "cpu":\n'
            "        a_scale, b_scale = _flat(a_scale, a_data), _flat(b_scale, b_data)\n"
            "        return cpu.gemm(a_data, a_scale, b_data, b_scale, alpha,"
            " sf_vec_size, out_dtype)\n"
        ),
        (
            '    if where == "cpu":\n'
            "        a_scale, b_scale = _flat(a_scale, a_data), _flat(b_scale, b_data)\n"
            "        return cpu.gemm(a_data, a_scale, b_data, b_scale, alpha,"
            " sf_vec_size, out_dtype)\n"
            "    alpha = alpha if alpha_scale is None else alpha * alpha_scale\n"
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-alpha-path-drops-a-gs",
        "global scale dropped when alpha given",
        OPS,
        (
            "        alpha, alpha_scale = device_alpha(a.global_scale *"
            " b.global_scale, alpha), None\n"
        ),
        "        alpha, alpha_scale = device_alpha(b.global_scale, alpha), None\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-quant-accepts-float64",
        "dtype refusal weakened",
        OPS,
        (
            "    if x.dtype not in IN_DTYPES:\n"
            '        raise ValueError(f"{name} must be float32, bfloat16 or float16,'
            ' got {x.dtype}")\n'
        ),
        (
            "    if not x.is_floating_point():\n"
            '        raise ValueError(f"{name} must be float32, bfloat16 or float16,'
            ' got {x.dtype}")\n'
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-quant-empty-static-gs-lost",
        "static global scale ignored on empty input",
        OPS,
        (
            "        gs = torch.ones((), dtype=torch.float32, device=x.device) if gs"
            " is None else gs.clone()\n"
        ),
        "        gs = torch.ones((), dtype=torch.float32, device=x.device)\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-batch-b1-broadcast",
        "broadcast accepts mismatched batch",
        OPS,
        "    if a_shape[0] != b.data.shape[0]:\n",
        "    if a_shape[0] != b.data.shape[0] and b.data.shape[0] != 1:\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-w4a16-fp16-mxfp4-cpu",
        "refusal applied only on CUDA",
        OPS,
        '    if a.dtype == torch.float16 and format == "mxfp4":\n',
        '    if a.dtype == torch.float16 and format == "mxfp4" and a.is_cuda:\n',
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-w4a16-autograd-unregistered",
        "autograd refusal dropped for one op",
        OPS,
        "for _op in (quantize_op, gemm_op, gemm_w4a16_op):\n",
        "for _op in (quantize_op, gemm_op):\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-cpu-groups-enumerate",
        "wrong expert index after skipping empty groups",
        MOE,
        (
            "    return [\n"
            "        (e, bounds[e], bounds[e + 1]) for e in range(len(bounds) - 1)"
            " if bounds[e + 1] > bounds[e]\n"
            "    ]\n"
        ),
        (
            "    live = [(bounds[e], bounds[e + 1]) for e in range(len(bounds) - 1)"
            " if bounds[e + 1] > bounds[e]]\n"
            "    return [(e, r0, r1) for e, (r0, r1) in enumerate(live)]\n"
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-w4a16-grouped-gs-expert0",
        "per-expert global scale indexed by wrong expert",
        MOE,
        (
            "        out[r0:r1] = cpu.gemm_w4a16(a[r0:r1], data, scale, alpha[e],"
            " sf_vec_size, out_dtype)\n"
        ),
        (
            "        out[r0:r1] = cpu.gemm_w4a16(a[r0:r1], data, scale, alpha[0],"
            " sf_vec_size, out_dtype)\n"
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-grouped-w4a4-fake-bf16",
        "fake kernel wrong dtype",
        MOE,
        "    return a_data.new_empty((a_data.shape[0], b_data.shape[1]), dtype=out_dtype)\n",
        ("    return a_data.new_empty((a_data.shape[0], b_data.shape[1]), dtype=torch.bfloat16)\n"),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-moe-unsort-index-select",
        "inverse permutation applied wrongly",
        MOE,
        "    pairs = y.new_empty(y.shape).index_copy_(0, order, y)\n",
        "    pairs = y.index_select(0, order)\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-moe-token-mod",
        "pair-to-token index for slot-major layout",
        MOE,
        "    rows = x.index_select(0, order // k)\n",
        "    rows = x.index_select(0, order % tokens)\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-moe-topk-weights-broadcast",
        "shape check weakened (silent broadcast)",
        MOE,
        "    if topk_weights.shape != topk_ids.shape:\n",
        "    if topk_weights.shape[0] != topk_ids.shape[0]:\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-moe-negative-ids",
        "range check drops lower bound",
        MOE,
        "    return (topk_ids >= 0) & (topk_ids < num_experts)\n",
        "    return topk_ids < num_experts\n",
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-quantize-experts-shared-gs",
        "per-expert global scale replaced by a shared one",
        MOE,
        (
            "    parts = [quantize(w[e], format) for e in range(w.shape[0])]\n"
            "    data = torch.stack([p.data for p in parts])\n"
            "    scale = torch.stack([p.scale for p in parts])\n"
            "    gs = torch.stack([p.global_scale for p in parts])\n"
            "    return FP4Tensor(data, scale, gs, format)\n"
        ),
        (
            "    q = quantize(w, format)  # (batched [E, N, K]: one pass over all experts)\n"
            "    gs = q.global_scale.expand(w.shape[0]).contiguous()\n"
            "    return FP4Tensor(q.data, q.scale, gs, format)\n"
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-moe-w13-bias-before-cast",
        "bias added before the float32 cast",
        MOE,
        (
            "    hf = h.float()\n"
            "    if w13_bias is not None:\n"
            "        hf = hf + w13_bias.float().index_select(0, sorted_ids)\n"
        ),
        (
            "    if w13_bias is not None:\n"
            "        h = h + w13_bias.to(h.dtype).index_select(0, sorted_ids)\n"
            "    hf = h.float()\n"
        ),
        OPS_REVIEW_TESTS,
    ),
    mutant(
        "rn-fp4moe-extra-state-activation",
        "state-dict check dropped for one key",
        MOE,
        '        for key in ("format", "activation"):\n',
        '        for key in ("format",):\n',
        OPS_REVIEW_TESTS,
    ),
    # a thirteenth blind review (FP4Linear as a module, quantize_model, calibrate): 18 caught
    # at first; the repr and requires-grad tests in test_library since
    mutant(
        "rq-load-w4a16-no-prepack",
        "derived buffer not refreshed on load",
        NN,
        ('                    name, value = "weight_prepacked", k_order.prepack_weights(value)\n'),
        '                    name = "weight_prepacked"\n',
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-save-prepacked-bytes",
        "state dict saves internal layout",
        NN,
        (
            '        return {"weight_data": self._plain_weight_data(), **{n:'
            " getattr(self, n) for n in names}}\n"
        ),
        (
            '        data = self._buffers.get("weight_data",'
            ' self._buffers.get("weight_prepacked"))\n'
            '        return {"weight_data": data, **{n: getattr(self, n) for n in names}}\n'
        ),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-cast-input-scale",
        "dtype cast converts an FP4 buffer",
        NN,
        ('    "weight_global_scale",\n    "input_global_scale",\n)\n'),
        ('    "weight_global_scale",\n)\n'),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-apply-restore-old-device",
        "restored buffer left on old device",
        BUFFERS,
        "                self._buffers[name] = old.to(new.device)\n",
        "                self._buffers[name] = old\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-bias-dropped-w4a16",
        "bias skipped on one path (indentation)",
        NN,
        (
            "            y = self._forward_w4a4(rows.contiguous(), vec, direct, on_cpu)\n"
            "        if self.bias is not None:\n"
            "            y = y + self.bias.to(y.dtype)\n"
        ),
        (
            "            y = self._forward_w4a4(rows.contiguous(), vec, direct, on_cpu)\n"
            "            if self.bias is not None:\n"
            "                y = y + self.bias.to(y.dtype)\n"
        ),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-bias-no-dtype-cast",
        "missing cast, dtype promotion",
        NN,
        "            y = y + self.bias.to(y.dtype)\n",
        "            y = y + self.bias\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-batched-output-2d",
        "leading dims not restored",
        NN,
        "        return y.reshape(*x.shape[:-1], self.out_features)\n",
        "        return y.reshape(-1, self.out_features)\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-calibrate-last-batch",
        "running max replaced by last value",
        NN,
        "        amax[key] = seen if key not in amax else torch.maximum(amax[key], seen)\n",
        "        amax[key] = seen\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-calibrate-divisor-448",
        "wrong scale constant",
        NN,
        "    gs = cpu.global_scales_of_amax(seen).tolist()\n",
        "    gs = torch.where(seen > 0, seen / 448.0, torch.ones_like(seen)).tolist()\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-calibrate-mode-lost",
        "train/eval mode not carried over",
        NN,
        ('        key: FP4Linear(layer.weight, layer.bias, "static", s).train(layer.training)\n'),
        '        key: FP4Linear(layer.weight, layer.bias, "static", s)\n',
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-fused-groups-across-layers",
        "grouping key missing the parent",
        NN,
        (
            '        parent, _, attr = name.rpartition(".")\n'
            "        for i, siblings in enumerate(FUSED_SIBLINGS):\n"
            "            if attr in siblings:\n"
            "                groups.setdefault((parent, i), []).append(name)\n"
        ),
        (
            '        attr = name.rpartition(".")[2]\n'
            "        for i, siblings in enumerate(FUSED_SIBLINGS):\n"
            "            if attr in siblings:\n"
            "                groups.setdefault(i, []).append(name)\n"
        ),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-include-unanchored",
        "glob matched as suffix, not fullmatch",
        NN,
        "        return any(fnmatch.fnmatchcase(name, p) for p in patterns)\n",
        '        return any(fnmatch.fnmatchcase(name, "*" + p) for p in patterns)\n',
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-router-single-gate",
        "router detection misses a case",
        NN,
        (
            "    if None not in counts and model.get_submodule(name).out_features"
            " not in counts | {1}:\n"
        ),
        ("    if None not in counts and model.get_submodule(name).out_features not in counts:\n"),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-report-unfit-silent",
        "report omits skipped modules",
        NN,
        (
            "        if why is not None and include is not None:\n"
            '            raise ValueError(f"{name}: {why}")\n'
            "    if why is not None:\n"
        ),
        (
            "        if why is not None and include is not None:\n"
            '            raise ValueError(f"{name}: {why}")\n'
            "        elif why is not None:\n"
            "            return False\n"
            "    if why is not None:\n"
        ),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-load-missing-bias-silent",
        "missing key not reported",
        NN,
        (
            '        elif "bias" not in found and self.bias is not None:\n'
            '            missing_keys.append(prefix + "bias")\n'
        ),
        "",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-assign-bias-requires-grad",
        "requires_grad flag lost on one path",
        NN,
        "                    self.bias = nn.Parameter(value, requires_grad=False)\n",
        "                    self.bias = nn.Parameter(value)\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-extra-state-mode-strict",
        "check too strict (compares full mode)",
        NN,
        '        if (state["activations"] == "static") != (self.activations == "static"):\n',
        '        if state["activations"] != self.activations:\n',
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-load-global-scale-unchecked",
        "refusal weakened (off-by-one slice)",
        NN,
        "        for name in parts[2:]:\n",
        "        for name in parts[3:]:\n",
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-repr-features-swapped",
        "repr fields swapped",
        NN,
        ('            f"in_features={self.in_features}, out_features={self.out_features}, "\n'),
        ('            f"in_features={self.out_features}, out_features={self.in_features}, "\n'),
        NN_REVIEW_TESTS,
    ),
    mutant(
        "rq-getstate-inplace",
        "shared dict mutated while pickling",
        BUFFERS,
        ('        state["_buffers"] = {n: picklable(t) for n, t in state["_buffers"].items()}\n'),
        (
            '        state["_buffers"].update({n: picklable(t) for n, t in'
            ' state["_buffers"].items()})\n'
        ),
        NN_REVIEW_TESTS,
    ),
    # a fourteenth blind review (the CLIs' argument checks): 18 of 19 caught at first (a 20th
    # was rj-parse-ints-extra again); K = 48 refused since (a multiple of 16, not of 32)
    mutant(
        "rs-bw-iterations-zero",
        "bound check off by one",
        "blockwise_gemm_fp4.py",
        "    if args.iterations < 1 or args.warmup_iterations < 0:\n",
        "    if args.iterations < 0 or args.warmup_iterations < 0:\n",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-bw-k-multiple-16",
        "refusal weakened",
        "blockwise_gemm_fp4.py",
        "    if k >= 1 and k % 32 != 0:\n",
        "    if k >= 1 and k % 16 != 0:\n",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-bw-cluster-not-pow2",
        "refusal weakened",
        "blockwise_gemm_fp4.py",
        "        if value < 1 or value & (value - 1):\n",
        "        if value < 1:\n",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-bw-alpha-traceback",
        "exception escapes as traceback",
        "blockwise_gemm_fp4.py",
        ("            args.alpha = checked_alpha(args.alpha)\n        except ValueError as err:\n"),
        ("            args.alpha = checked_alpha(args.alpha)\n        except TypeError as err:\n"),
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-bw-compile-only-needs-gpu",
        "--compile_only still requires a GPU",
        "blockwise_gemm_fp4.py",
        (
            "        if args.compile_only:\n"
            "            return run_compile_only(args)\n"
            "        return run_on_gpu(args)\n"
        ),
        (
            "        if args.compile_only and blackwell_gpu(args.gpu_arch)[0]:\n"
            "            return run_compile_only(args)\n"
            "        return run_on_gpu(args)\n"
        ),
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-gg-negative-rows",
        "refusal weakened",
        "blockwise_grouped_gemm_fp4.py",
        "    if not rows or min(rows) < 0:\n",
        "    if not rows:\n",
        ["tests/test_blackwell_grouped.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-gg-nk-swapped",
        "parsed values swapped",
        "blockwise_grouped_gemm_fp4.py",
        ("    n, k = args.nk\n    if args.dump_dir is not None and not args.compile_only:\n"),
        ("    k, n = args.nk\n    if args.dump_dir is not None and not args.compile_only:\n"),
        ["tests/test_blackwell_grouped.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-gg-exit-1",
        "exit status 1 instead of 2",
        "blockwise_grouped_gemm_fp4.py",
        ('        print(f"error: {err}", file=sys.stderr)\n        return 2\n'),
        ('        print(f"error: {err}", file=sys.stderr)\n        return 1\n'),
        ["tests/test_blackwell_grouped.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-sm90-tolerance-nan",
        "refusal weakened",
        "fp4_ops/sm90/cli.py",
        "    if not math.isfinite(args.tolerance) or args.tolerance <= 0:\n",
        "    if args.tolerance <= 0:\n",
        ["tests/test_hopper.py", "tests/test_bench.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-sm90-k0-traceback",
        "exception escapes as traceback",
        "fp4_ops/sm90/cli.py",
        "    k_limit = 1.0 / (max(args.mnkl[2], 1) * 2.0**-24)\n",
        "    k_limit = 1.0 / (args.mnkl[2] * 2.0**-24)\n",
        ["tests/test_hopper.py", "tests/test_bench.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-sm90-default-mxfp4",
        "default changed",
        "fp4_ops/sm90/cli.py",
        (
            '    parser.add_argument("--sf_vec_size", type=int,'
            " choices=tuple(SF_FORMATS), default=16)\n"
        ),
        (
            '    parser.add_argument("--sf_vec_size", type=int,'
            " choices=tuple(SF_FORMATS), default=32)\n"
        ),
        ["tests/test_hopper.py", "tests/test_bench.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-q-mxfp4-global-scale-ignored",
        "flag silently ignored",
        "fp4_ops/quantizer.py",
        "    if as_f32 is not None and (vec != 16 or not 0 < as_f32 < math.inf):\n",
        "    if as_f32 is not None and not 0 < as_f32 < math.inf:\n",
        ["tests/test_quantize_fp4.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-q-shape-traceback",
        "exception escapes as traceback",
        "fp4_ops/quantizer.py",
        ('    except ValueError:\n        print(f"error: --shape'),
        ('    except TypeError:\n        print(f"error: --shape'),
        ["tests/test_quantize_fp4.py", "-m", "not gpu"],
    ),
    mutant(
        "rs-args-positive-ints-zero",
        "bound check off by one",
        "benchmarks/args.py",
        "    if min(values) < 1:\n",
        "    if min(values) < 0:\n",
        BENCH_CLI_TESTS,
    ),
    mutant(
        "rs-args-positive-int-traceback",
        "exception escapes as traceback",
        "benchmarks/args.py",
        "    if not (text.isascii() and text.isdigit()) or int(text) < 1:\n",
        "    if int(text) < 1:\n",
        BENCH_CLI_TESTS,
    ),
    mutant(
        "rs-eager-calls-zero",
        "bound check off by one",
        "benchmarks/eager.py",
        "    if not 1 <= args.calls <= 150:\n",
        "    if not 0 <= args.calls <= 150:\n",
        BENCH_CLI_TESTS,
    ),
    mutant(
        "rs-stack-m-unvalidated",
        "validation bypassed",
        "benchmarks/stack.py",
        '    args.m = cli.positive_ints(p, "--m", args.m, "1,16,64,128")\n',
        '    args.m = [int(v) for v in args.m.split(",")]\n',
        BENCH_CLI_TESTS,
    ),
    mutant(
        "rs-model-layers-zero-truthy",
        "truthiness bug in bound check",
        "benchmarks/model.py",
        "    if args.layers is not None and args.layers < 1:\n",
        "    if args.layers and args.layers < 1:\n",
        BENCH_CLI_TESTS,
    ),
    mutant(
        "rs-gen-max-new-tokens-1",
        "bound check off by one",
        "examples/generate.py",
        "    if args.max_new_tokens < 2:\n",
        "    if args.max_new_tokens < 1:\n",
        ["tests/test_examples.py", "-m", "not gpu"],
    ),
    # a fifteenth blind review (the Blackwell path's host side): of the first 10, 6 caught at
    # first; since, two by the routing test, one by the kernel-route test, one by D's offsets;
    # the last five caught when first run: 15 of 15
    mutant(
        "rt-cap-sm103-rejected",
        "capability list too narrow",
        OPS,
        "        if (major, minor) != (9, 0) and (major, minor) not in BLACKWELL_CAPABILITIES:\n",
        "        if (major, minor) not in ((9, 0), (10, 0)):\n",
        ["tests/test_blackwell.py", "tests/test_fp4_ops.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-arch-family-drops-sm103",
        "compile-target capability table wrong",
        "blockwise_gemm_fp4.py",
        (
            'GPU_ARCHS = {"sm_100f": ((10, 0), (10, 3)), "sm_100a": ((10, 0),),'
            ' "sm_103a": ((10, 3),)}'
        ),
        'GPU_ARCHS = {"sm_100f": ((10, 0),), "sm_100a": ((10, 0),), "sm_103a": ((10, 3),)}',
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-sm90-is-blackwell",
        "capability check routes sm_90 to Blackwell",
        OPS,
        (
            "    return t.is_cuda and torch.cuda.get_device_capability(t.device) in "
            "BLACKWELL_CAPABILITIES\n"
        ),
        "    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9\n",
        ["tests/test_blackwell.py", "tests/test_fp4_ops.py", "-m", "not gpu"],
    ),
    # (the library's list of Blackwell GPUs drifts from the kernel's: sm_101 routed to a
    # kernel whose family build does not run there)
    mutant(
        "rt-library-blackwell-list-wider",
        "capability list too wide",
        OPS,
        "BLACKWELL_CAPABILITIES = ((10, 0), (10, 3))\n",
        "BLACKWELL_CAPABILITIES = ((10, 0), (10, 1), (10, 3))\n",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-alpha-a-scale-only",
        "alpha uses only a's global scale",
        OPS,
        (
            "    alpha = alpha if alpha_scale is None else alpha * alpha_scale\n"
            '    if where == "cpu":\n'
        ),
        (
            '    if where == "cpu":\n'
            "        alpha = alpha if alpha_scale is None else alpha * alpha_scale\n"
        ),
        ["tests/test_blackwell.py", "tests/test_fp4_ops.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-swap-sfa-sfb",
        "scale tensors of A and B swapped",
        "fp4_ops/sm100.py",
        "    blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1), d)\n",
        "    blockwise_gemm_fp4.gemm(a, b, sfb, sfa, alpha.reshape(1), d)\n",
        BW_REVIEW_TESTS,
    ),
    mutant(
        "rt-c-batch-stride-n",
        "batch stride from the wrong dim",
        "blockwise_gemm_fp4.py",
        "stride=(ldc, 1, m * ldc)",
        "stride=(ldc, 1, n * ldc)",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-tile-n-64-strict",
        "wrong default tile pick at boundary",
        "blockwise_gemm_fp4.py",
        (
            "        mma_tiler_mn = (256 if m > 128 and pair_fits else 128, 64 if n"
            " <= 64 else 128)\n"
        ),
        ("        mma_tiler_mn = (256 if m > 128 and pair_fits else 128, 64 if n < 64 else 128)\n"),
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-cluster-not-doubled",
        "cluster M not doubled for 2-CTA tile",
        "blockwise_gemm_fp4.py",
        "        cluster_shape_mn = (2, 1) if mma_tiler_mn[0] == 256 else (1, 1)\n",
        "        cluster_shape_mn = (1, 1)\n",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-group-layout-extra-tile",
        "grouped padding off by one tile",
        "blockwise_grouped_gemm_fp4.py",
        "    tiles = [-(-count // tile_m) for count in rows]\n",
        "    tiles = [count // tile_m + 1 for count in rows]\n",
        ["tests/test_blackwell_grouped.py", "-m", "not gpu"],
    ),
    mutant(
        "rt-padded-tiles-under",
        "padded buffer bound off by one",
        MOE_KERNELS,
        "    return -(-rows // tile_m) + max(min(groups, rows) - 1, 0)\n",
        "    return -(-rows // tile_m) + max(min(groups, rows) - 2, 0)\n",
        BW_REVIEW_TESTS,
    ),
    mutant(
        "rt-offsets-int64",
        "group offsets passed with wrong dtype",
        "fp4_ops/sm100.py",
        "        a, a_scale, offsets, config.mma_tiler_mn[0], 2 * half // sf_vec_size\n",
        ("        a, a_scale, offsets.long(), config.mma_tiler_mn[0], 2 * half // sf_vec_size\n"),
        BW_REVIEW_TESTS,
    ),
    mutant(
        "rt-grouped-out-dtype-default",
        "output dtype default instead of requested",
        "fp4_ops/sm100.py",
        "    config = grouped.grouped_config(n, sf_vec_size, DSL_DTYPE_NAMES[out_dtype])\n",
        "    config = grouped.grouped_config(n, sf_vec_size)\n",
        BW_REVIEW_TESTS,
    ),
    mutant(
        "rt-prepacked-accepted-blackwell",
        "prepacked weights accepted on Blackwell",
        MOE,
        (
            "        if prepacked:\n"
            "            raise ValueError(PREPACKED_ON_BLACKWELL)\n"
            "        from fp4_ops import sm100\n"
        ),
        "        from fp4_ops import sm100\n",
        BW_REVIEW_TESTS,
    ),
    mutant(
        "rt-grouped-alpha-group0",
        "per-group alpha collapsed to one value",
        "fp4_ops/sm100.py",
        "    alpha = alpha.float().reshape(num_groups).contiguous()\n",
        "    alpha = alpha.float().reshape(-1)[:1].expand(num_groups).contiguous()\n",
        BW_REVIEW_TESTS,
    ),
    mutant(
        "rt-row-pitch-8-bytes",
        "output row pitch alignment wrong",
        "blockwise_gemm_fp4.py",
        "    per_16b = 128 // C_DTYPES[c_dtype].width\n",
        "    per_16b = 64 // C_DTYPES[c_dtype].width\n",
        ["tests/test_blackwell.py", "-m", "not gpu"],
    ),
    # a sixteenth blind review (the MoE module and its checkpoints): 17 caught at first, 20 since
    # (top_k either side of its range; every buffer through the state dict; casts of the biases)
    # (every expert's global scale taken from expert 0's)
    mutant(
        "ru-moe-gs-expert0",
        "global scale per expert from expert 0",
        MOE,
        "            gs = w.global_scale.float().expand(self.num_experts).clone()\n",
        "            gs = w.global_scale.float().flatten()[0].expand(self.num_experts).clone()\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (FP4MoE.forward drops w2's bias)
    mutant(
        "ru-moe-forward-w2-bias-dropped",
        "bias dropped",
        MOE,
        "            self.activations,\n            self.w13_bias,\n            self.w2_bias,\n",
        "            self.activations,\n            self.w13_bias,\n            None,\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (Llama-4: the chosen experts [k, T] read slot-major, paired with token-major tokens)
    mutant(
        "ru-moe-llama4-chosen-not-transposed",
        "wrong axis order (missing transpose)",
        MOE,
        "chosen = size.topk(k, dim=0).indices.t().reshape(t * k, 1)",
        "chosen = size.topk(k, dim=0).indices.reshape(t * k, 1)",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (Llama-4: the row of expert e and token t taken as e * E + t, not e * T + t)
    mutant(
        "ru-moe-llama4-row-stride",
        "wrong stride in a flat index",
        MOE,
        "        at = chosen.view(-1) * t + tokens  # (their rows)\n",
        "        at = chosen.view(-1) * e + tokens  # (their rows)\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (Llama-4: top_k = 0 accepted)
    mutant(
        "ru-moe-llama4-top-k-zero",
        "off-by-one range check",
        MOE,
        "        if not 1 <= top_k <= self.num_experts:\n",
        "        if not 0 <= top_k <= self.num_experts:\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (FP4Experts.from_transformers defaults to W4A4)
    mutant(
        "ru-moe-from-transformers-default-dynamic",
        "wrong default",
        MOE,
        'format: str = "nvfp4", activations: str = "bf16"\n    ) -> FP4Experts:',
        'format: str = "nvfp4", activations: str = "dynamic"\n    ) -> FP4Experts:',
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (an experts module with parameters beyond the experts' is accepted)
    mutant(
        "ru-moe-experts-params-extra",
        "weaker check (subset for equality)",
        MOE,
        "    if set(params) != known or list(module.children()) not in ([], [act]):\n",
        "    if not known <= set(params) or list(module.children()) not in ([], [act]):\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (_check_forward refuses only when every probe token differs: a clamp passes)
    mutant(
        "ru-moe-check-forward-all",
        "any for all",
        MOE,
        "bool(((got - want).norm(dim=1) > tol).any()):\n",
        "bool(((got - want).norm(dim=1) > tol).all()):\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (a state-dict tensor of another shape but the right dtype loads, broadcast)
    mutant(
        "ru-moe-load-shape-and",
        "and for or",
        MOE,
        "if tuple(t.shape) != tuple(mine.shape) or not (plain or cast",
        "if tuple(t.shape) != tuple(mine.shape) and not (plain or cast",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (only w13's global scales are value-checked on load)
    mutant(
        "ru-moe-load-w2-gs-unchecked",
        "check on one weight only",
        MOE,
        '            if name.endswith("global_scale"):\n',
        '            if name == "w13_global_scale":\n',
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (the loaded plain-order data is not prepacked into the layer's K order)
    mutant(
        "ru-moe-load-not-prepacked",
        "layout conversion missing",
        MOE,
        "                    t = t if self.plain_k_order else k_order.prepack_weights(t)\n",
        "",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (a checkpoint of another activation loads)
    mutant(
        "ru-moe-extra-state-activation-unchecked",
        "check skipped",
        MOE,
        '        for key in ("format", "activation"):\n',
        '        for key in ("format",):\n',
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (w2's bias left out of the state dict: neither saved nor loaded)
    mutant(
        "ru-moe-state-w2-bias-omitted",
        "state-dict key missing",
        MOE,
        '        for name in ("w13_bias", "w2_bias"):\n            if getattr(self, name) is not',
        '        for name in ("w13_bias",):\n            if getattr(self, name) is not',
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (the biases kept in their dtype through .to(dtype) / .half())
    mutant(
        "ru-moe-kept-buffers-bias",
        "wrong dtype kept",
        MOE,
        'self._buffers.items() if t is not None and "bias" not in n}\n',
        "self._buffers.items() if t is not None}\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # ------------------------------------------------------------------ checkpoint.py's experts
    # (gpt-oss experts always load W4A16, whatever activations asks)
    mutant(
        "ru-ck-gptoss-activations-ignored",
        "argument ignored",
        CHECKPOINT,
        '    return FP4Experts(w13, w2, "swigluoai", activations, b13, b2)\n',
        '    return FP4Experts(w13, w2, "swigluoai", "bf16", b13, b2)\n',
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (per-expert Linears: up's rows stacked before gate's)
    mutant(
        "ru-ck-linear-experts-up-gate-order",
        "swapped gate / up halves",
        CHECKPOINT,
        "        w13.append((torch.cat((gd, ud)), torch.cat((gsc, usc))))\n",
        "        w13.append((torch.cat((ud, gd)), torch.cat((usc, gsc))))\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (per-expert Linears: w2's global scale taken from gate_proj's)
    mutant(
        "ru-ck-linear-experts-down-gs-from-gate",
        "scale of the wrong weight",
        CHECKPOINT,
        "        gs2.append(dgs)\n",
        "        gs2.append(ggs)\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (experts with static input scales load as W4A4 with per-call scales)
    mutant(
        "ru-ck-experts-mode-static-dynamic",
        "weaker condition",
        CHECKPOINT,
        'plan.layers[0][0].scheme.inputs == "dynamic"\n',
        'plan.layers[0][0].scheme.inputs != "none"\n',
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (SiLU experts with only one of the two biases saved, their bias dropped)
    mutant(
        "ru-ck-silu-experts-bias-and",
        "and for or",
        CHECKPOINT,
        "    if experts.w13_bias is not None or experts.w2_bias is not None:\n",
        "    if experts.w13_bias is not None and experts.w2_bias is not None:\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # (saved per-expert gate / up Linears all take expert 0's global scale)
    mutant(
        "ru-ck-expert-linears-gs-expert0",
        "global scale per expert from expert 0",
        CHECKPOINT,
        "            w13.global_scale.expand(experts.num_experts)[e],\n",
        "            w13.global_scale.expand(experts.num_experts)[0],\n",
        MOE_MODULE_REVIEW_TESTS,
    ),
    # a seventeenth blind review (FP4Tensor, the scale layout, the FP4 buffers, memory): 20 of 20
    # caught, two by the files named on their entries (outside the reviewer's list)
    # (packed data with K = 0, [rows, 0] bytes, pass as an FP4Tensor / from_plain operand)
    mutant(
        "rv17-tensor-packed-k-zero-accepted",
        "weaker shape check",
        TENSOR,
        "    if k == 0 or k % vec:\n",
        "    if k % vec:\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (a 0-d CPU global scale tensor of 0.0 passes the constructor's and from_plain's check)
    mutant(
        "rv17-tensor-global-scale-zero-ok",
        "weaker value check",
        TENSOR,
        "    ok = torch.isfinite(t) & (t > 0)\n",
        "    ok = torch.isfinite(t) & (t >= 0)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (a number global scale is checked as the float64 given, not the float32 it becomes: 1e-50
    # passes and becomes a global scale of 0.0)
    mutant(
        "rv17-tensor-gs-number-checked-as-given",
        "check on the wrong value",
        TENSOR,
        "    if not (math.isfinite(float(scale)) and float(scale) > 0):\n",
        "    if not (math.isfinite(float(scale)) and float(value) > 0):\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (a 0-d float32 global scale tensor is kept, not copied: the FP4Tensor aliases the caller's)
    mutant(
        "rv17-tensor-gs-tensor-aliased",
        "copy became an alias",
        TENSOR,
        "        return t.to(like.device).clone()\n",
        "        return t.to(like.device)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (an NVFP4 FP4Tensor takes E8M0 block scales, and an MXFP4 one E4M3 scales)
    mutant(
        "rv17-tensor-scale-dtype-either-format",
        "wrong dtype accepted",
        TENSOR,
        "        if s.dtype != want:\n",
        "        if s.dtype not in SCALE_DTYPES.values():\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (2-D data [rows, K/2] take a per-row global scale [rows]: dequantize broadcasts it to
    # [rows, rows, K])
    mutant(
        "rv17-tensor-per-batch-gs-on-2d",
        "missing rank condition",
        TENSOR,
        "        per_batch = d.ndim == 3 and tuple(g.shape) == d.shape[:1]\n",
        "        per_batch = tuple(g.shape) == d.shape[:1]\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (a float64 / bfloat16 0-d global scale, or a [n] float32 one on 2-D data, passes)
    mutant(
        "rv17-tensor-gs-dtype-and",
        "and for or",
        TENSOR,
        "        if not (g.ndim == 0 or per_batch) or g.dtype != torch.float32:\n",
        "        if not (g.ndim == 0 or per_batch) and g.dtype != torch.float32:\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (an unpickled / torch.load-ed FP4Tensor is no longer checked: any state passes)
    mutant(
        "rv17-tensor-setstate-unchecked",
        "validation dropped",
        TENSOR,
        "            object.__setattr__(self, name, unpickled(value))\n"
        "        self.__post_init__()\n",
        "            object.__setattr__(self, name, unpickled(value))\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (dequantize multiplies in the target dtype: the global scale is rounded to bf16 / fp16
    # first, and the product rounded again)
    mutant(
        "rv17-tensor-dequantize-in-target-dtype",
        "precision of an intermediate",
        TENSOR,
        "        return (values * gs.reshape(*gs.shape, 1, 1)).to(dtype)\n",
        "        return values.to(dtype) * gs.to(dtype).reshape(*gs.shape, 1, 1)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (compressed-tensors' encoding global scale is taken as ours, not inverted)
    mutant(
        "rv17-tensor-ct-global-not-inverted",
        "missing reciprocal",
        TENSOR,
        'return _from_plain(weight_packed, weight_scale, 1.0 / inv, "nvfp4", names)',
        'return _from_plain(weight_packed, weight_scale, inv, "nvfp4", names)',
        TENSOR_REVIEW_TESTS,
    ),
    # (from_plain / from_modelopt with no global scale default NVFP4 data to 1.0 silently)
    mutant(
        "rv17-tensor-from-plain-nvfp4-default",
        "wrong default",
        TENSOR,
        '    elif vec == FORMATS["mxfp4"]:\n',
        "    elif vec in FORMATS.values():\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (blocked_numel / blocked_scale_numel leave the scale columns unpadded: K / vec not a
    # multiple of 4 gives too few bytes)
    mutant(
        "rv17-layout-numel-cols-unpadded",
        "missing round-up",
        LAYOUT,
        "    return round_up(rows, ATOM_ROWS) * round_up(cols, ATOM_COLS)\n",
        "    return round_up(rows, ATOM_ROWS) * cols\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (pack_fp4 and unpack_fp4 both put element 2i in the high nibble: consistent, but not the
    # format's order that the kernels, the CPU table and checkpoints use)
    mutant(
        "rv17-layout-nibbles-swapped-both",
        "swapped nibble order",
        LAYOUT,
        "    return pairs[..., 0] | (pairs[..., 1] << 4)\n"
        "\n"
        "\n"
        "def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:\n"
        '    """Bytes [..., K/2] of any one-byte dtype -> E2M1 codes [..., K] (uint8)."""\n'
        "    p = packed.view(torch.uint8)\n"
        "    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)\n",
        "    return (pairs[..., 0] << 4) | pairs[..., 1]\n"
        "\n"
        "\n"
        "def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:\n"
        '    """Bytes [..., K/2] of any one-byte dtype -> E2M1 codes [..., K] (uint8)."""\n'
        "    p = packed.view(torch.uint8)\n"
        "    return torch.stack((p >> 4, p & 0xF), dim=-1).flatten(-2)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (to_blocked and from_blocked both store an atom row-major, byte (r, c) at 4 * r + c, not
    # 16 * (r % 32) + 4 * (r // 32) + c: they still invert each other)
    mutant(
        "rv17-layout-atom-row-major-both",
        "wrong axis order",
        LAYOUT,
        "    out = atoms.permute(0, 1, 4, 3, 2, 5).reshape(*lead, rp * cp)\n"
        + BLOCKED_SEAM
        + "batch, rp // 128, cp // ATOM_COLS, 32, 4, ATOM_COLS)\n"
        "    plain = atoms.permute(0, 1, 4, 3, 2, 5).reshape(batch, rp, cp)[:, :rows, :cols]\n",
        "    out = atoms.permute(0, 1, 4, 2, 3, 5).reshape(*lead, rp * cp)\n"
        + BLOCKED_SEAM
        + "batch, rp // 128, cp // ATOM_COLS, 4, 32, ATOM_COLS)\n"
        "    plain = atoms.permute(0, 1, 3, 4, 2, 5).reshape(batch, rp, cp)[:, :rows, :cols]\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (int8 packed data pass as FP4 codes wherever PACKED_DTYPES is the check)
    mutant(
        "rv17-layout-int8-packed",
        "wrong dtype accepted",
        LAYOUT,
        "PACKED_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)\n",
        "PACKED_DTYPES = (torch.uint8, torch.int8, torch.float4_e2m1fn_x2)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (a cast restores a kept buffer by casting the cast one back: .half() rounds the float32
    # global scales to fp16, E8M0 scales over fp16's range become inf / 0)
    mutant(
        "rv17-buffers-cast-back",
        "lossy round trip instead of the original",
        BUFFERS,
        "                self._buffers[name] = old.to(new.device)\n",
        "                self._buffers[name] = new.to(old.dtype)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (casts and moves keep the caches derived from the buffers, e.g. FP4Linear._plans)
    mutant(
        "rv17-buffers-caches-survive-apply",
        "stale cache",
        BUFFERS,
        "        for name in self.CACHES:\n"
        "            setattr(self, name, None)\n"
        "        super()._apply",
        "        super()._apply",
        ["tests/test_eager.py", "-m", "not gpu"],
    ),
    # (load_state_dict into a meta module copies silently, with no warning; a meta checkpoint
    # tensor warns instead)
    mutant(
        "rv17-buffers-meta-load-no-warning",
        "negation dropped",
        BUFFERS,
        "        if target.is_meta and not value.is_meta:\n",
        "        if target.is_meta and value.is_meta:\n",
        TENSOR_REVIEW_TESTS,
    ),
    # (aligned_rows returns a non-contiguous 16-byte aligned tensor, or an unaligned contiguous
    # one, uncopied)
    mutant(
        "rv17-memory-aligned-rows-or",
        "or for and",
        MEMORY,
        "    if t.is_contiguous() and t.data_ptr() % 16 == 0:\n",
        "    if t.is_contiguous() or t.data_ptr() % 16 == 0:\n",
        ["tests/test_moe_kernels.py", "-m", "not gpu", "-k", "aligned_rows"],
    ),
    # (device_scalar's cache is keyed without the value: the first value asked for a device is
    # returned for every later one)
    mutant(
        "rv17-memory-scalar-key-without-value",
        "cache key missing an input",
        MEMORY,
        "    key = (value, device.type, device.index)\n",
        "    key = (device.type, device.index)\n",
        TENSOR_REVIEW_TESTS,
    ),
    # an eighteenth blind review (the Hopper launcher, k_order, the tokens step): 19 of 20 caught
    # at first; rv18-offsets-any-dtype since by the grouped entry's offsets refusals
    # (_pick's cache forgets the format: an NVFP4 pick is reused for MXFP4 of the same shape)
    mutant(
        "rv18-pick-key-no-vec",
        "cache key",
        LAUNCHER,
        "    key = (mnkl, vec, c_dtype, a_dtype, device)\n",
        "    key = (mnkl, c_dtype, a_dtype, device)\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (the split-K workspace loses its tile counters: the fix-up's flags land past its end)
    mutant(
        "rv18-workspace-no-counters",
        "workspace size",
        LAUNCHER,
        "    return tiles * gemm.split_k * tr * tc + tiles if global_fixup else 1\n",
        "    return tiles * gemm.split_k * tr * tc if global_fixup else 1\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (converted copies sized with M and N swapped: prefill with M != N overflows one of them)
    mutant(
        "rv18-converted-rows-swapped",
        "swapped pair",
        LAUNCHER,
        "    rows_a, rows_b = (n, m) if gemm.swap_ab else (m, n)\n",
        "    rows_a, rows_b = (m, n) if gemm.swap_ab else (n, m)\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (a refused (configuration, problem) is cached as checked: the second call goes through)
    mutant(
        "rv18-checked-caches-refusal",
        "check cache",
        LAUNCHER,
        "        if not refused:\n            _CHECKED.add((config, mnkl))\n",
        "        _CHECKED.add((config, mnkl))\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (a reused Launch takes operands that are not 16-byte aligned: TMA on a bad base)
    mutant(
        "rv18-fits-no-alignment",
        "reused launch check",
        LAUNCHER,
        "not t.is_contiguous() or t.data_ptr() % 16 or t.get_device() != index",
        "not t.is_contiguous() or t.get_device() != index",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (gemm_for_ops' launch key forgets D's dtype: a float32 D gets a bfloat16 kernel's stores)
    mutant(
        "rv18-ops-key-no-out-dtype",
        "cache key",
        LAUNCHER,
        "    key += (out_dtype, index, stream)\n",
        "    key += (index, stream)\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (int64 group offsets pass: the kernel reads them as int32)
    mutant(
        "rv18-offsets-any-dtype",
        "weak check",
        LAUNCHER,
        "        and offsets.dtype == torch.int32\n",
        "",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (an explicit sf_vec_size that contradicts the scales' dtype is ignored, not refused)
    mutant(
        "rv18-sf-vec-explicit-ignored",
        "weak check",
        LAUNCHER,
        "    if sf_vec_size is not None:\n        named.add(sf_vec_size)\n",
        "    if sf_vec_size is not None and not named:\n        named.add(sf_vec_size)\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (for_problem picks TMA stores from M's row pitch, not N's: valid problems refused)
    mutant(
        "rv18-tma-store-m-axis",
        "wrong axis",
        LAUNCHER,
        "c_dtype not in C_DTYPES or tma_store_fits(mnkl[1], c_dtype),",
        "c_dtype not in C_DTYPES or tma_store_fits(mnkl[0], c_dtype),",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (a given cluster or tile no longer turns off split pairs: the caller's cluster is replaced)
    mutant(
        "rv18-for-problem-pairs-or",
        "and for or",
        LAUNCHER,
        "    pairs = allow_k_groups and cluster_shape_mn is None\n",
        "    pairs = allow_k_groups or cluster_shape_mn is None\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (launch_for_tokens hands out converted A (8 elements on decode) as the token copy)
    mutant(
        "rv18-tokens-copy-wrong-part",
        "wrong operand",
        LAUNCHER,
        "    return launch, launch.workspace[1], out\n",
        "    return launch, launch.workspace[2], out\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (Launch.bind passes SFB as SFA and SFA as SFB: a bound W4A4 layer's scales swapped)
    mutant(
        "rv18-bind-scales-swapped",
        "swapped pair",
        LAUNCHER,
        "tensors = (b, sfa, sfb, *self.workspace, alpha, alpha, scale)",
        "tensors = (b, sfb, sfa, *self.workspace, alpha, alpha, scale)",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (for_groups counts units with the tile's axes swapped: K splits past one wave)
    mutant(
        "rv18-for-groups-tile-axes",
        "wrong axis",
        LAUNCHER,
        "grouped_tiles(rows, experts, tiler[0]) * math.ceil(n / tiler[1]) * split",
        "grouped_tiles(rows, experts, tiler[1]) * math.ceil(n / tiler[0]) * split",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (prepacked bytes in (w, q) order rather than (q, w): consistent with the inverse only)
    mutant(
        "rv18-korder-byte-loops",
        "k permutation",
        "fp4_ops/sm90/k_order.py",
        "for q in range(4) for w in range(2) for p in range(4)]",
        "for w in range(2) for q in range(4) for p in range(4)]",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (PAIR_BITS read from lane-major nibbles: a bijection, so unprepack still inverts it)
    mutant(
        "rv18-korder-bit-source",
        "k permutation",
        "fp4_ops/sm90/k_order.py",
        "            8 * p + 4 * lane + b: PAIR_BITS[p][lane][b]\n",
        "            16 * lane + 4 * p + b: PAIR_BITS[p][lane][b]\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (K padded at the front of a row: K % 64 = 32 weights shift by 32 values)
    mutant(
        "rv18-korder-pad-front",
        "padding",
        "fp4_ops/sm90/k_order.py",
        "(rows[start : start + PREPACK_ROWS], (0, (k_pad - k) // 2))",
        "(rows[start : start + PREPACK_ROWS], ((k_pad - k) // 2, 0))",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (the byte-order table's key forgets inverse: whichever direction comes first serves both)
    mutant(
        "rv18-korder-key-no-inverse",
        "cache key",
        "fp4_ops/sm90/k_order.py",
        '    key = ("bytes", device, inverse)\n',
        '    key = ("bytes", device)\n',
        LAUNCHER_REVIEW_TESTS,
    ),
    # (the step launches the GEMM before the tokens grid: D from the previous call's tokens)
    mutant(
        "rv18-step-gemm-first",
        "launch order",
        TOKENS_STEP,
        "        self.quantizer(*quantizer_args, stream)\n"
        "        self.gemm(*gemm_args, num_sms, stream)\n",
        "        self.gemm(*gemm_args, num_sms, stream)\n"
        "        self.quantizer(*quantizer_args, stream)\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (a step compiles with a GEMM that is not tokens_converted, or a quantizer not in tokens mode)
    mutant(
        "rv18-step-pair-check-or",
        "and for or",
        TOKENS_STEP,
        "    if not (quantizer.tokens and gemm.tokens_converted):\n",
        "    if not (quantizer.tokens or gemm.tokens_converted):\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # (the steps' cache forgets the quantizer's configuration: one layer's step serves another)
    mutant(
        "rv18-step-key-no-quantizer",
        "cache key",
        TOKENS_STEP,
        "    key = (quantizer, gemm, device_index)\n",
        "    key = (gemm, device_index)\n",
        LAUNCHER_REVIEW_TESTS,
    ),
    # a nineteenth blind review (checkpoint loading and saving, examples/generate.py): 16 of 17
    # caught at first (three more duplicated earlier mutants); r19-gen-right-padding since by
    # the example's batch-against-alone rows
    # (a target in several config groups takes the first group's scheme (scheme_for))
    mutant(
        "r19-ct-first-group-wins",
        "wrong precedence",
        CHECKPOINT,
        "        by_target = {t: scheme for _, targets, scheme in self.groups for t in targets}\n",
        "        by_target = {t: scheme for _, targets, scheme in reversed(self.groups)"
        " for t in targets}\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (the top-level format wins over a group's own format)
    mutant(
        "r19-ct-top-format-overrides-group",
        "wrong config field",
        CHECKPOINT,
        '        fmt = group.get("format") or top\n',
        '        fmt = top or group.get("format")\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (ModelOpt exclude_modules patterns match exact names only)
    mutant(
        "r19-modelopt-exclude-glob-ignored",
        "pattern matching lost",
        CHECKPOINT,
        "            if any(n == p or fnmatch.fnmatchcase(n, p) for n in names for p in"
        " self.ignore):\n",
        "            if any(n == p for n in names for p in self.ignore):\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (a compressed-tensors input_global_scale is not inverted)
    mutant(
        "r19-ct-input-scale-not-inverted",
        "scale convention flipped",
        CHECKPOINT,
        "    return None if key is None else _read_scalar(t[key].cpu(), key,"
        " layer.scheme.reciprocal)\n",
        "    return None if key is None else _read_scalar(t[key].cpu(), key, False)\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (an index naming the wrong shard for a key is accepted)
    mutant(
        "r19-index-wrong-shard-accepted",
        "refusal lost",
        CHECKPOINT,
        "                if self.file_of.get(key) != name:\n",
        "                if key not in self.file_of:\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (save_quantized numbers its shards from 0)
    mutant(
        "r19-shard-names-from-zero",
        "off by one",
        CHECKPOINT,
        "    for i, shard in enumerate(shards, 1):\n",
        "    for i, shard in enumerate(shards):\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (tied keys of equal shape and different values are not refused)
    mutant(
        "r19-tied-values-not-compared",
        "refusal lost",
        CHECKPOINT,
        "                if not torch.equal(read(other), value):\n",
        "                if read(other).shape != value.shape:\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (a quantized output embedding loads although tied)
    mutant(
        "r19-tied-quantized-lm-head-accepted",
        "refusal lost",
        CHECKPOINT,
        "    return model, *_plan_quantized(ck, qconfig, model, output if ties else None)\n",
        "    return model, *_plan_quantized(ck, qconfig, model, None)\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (plain tensors keep the checkpoint's dtype, not the model's)
    mutant(
        "r19-plain-tensors-not-cast",
        "wrong dtype",
        CHECKPOINT,
        "            value = value.to(t.dtype) if t.is_floating_point() else value\n"
        "            if isinstance(t, nn.Parameter):\n",
        "            if isinstance(t, nn.Parameter):\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (activations="dynamic" still hands the stored input scale over)
    mutant(
        "r19-dynamic-keeps-input-scale",
        "wrong mode",
        CHECKPOINT,
        '    if activations != "static":\n        input_gs = None\n',
        '    if activations == "bf16":\n        input_gs = None\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (a weight-only checkpoint loads as W4A4 by default)
    mutant(
        "r19-weight-only-defaults-to-dynamic",
        "wrong default mode",
        CHECKPOINT,
        '    return activations or {"none": "bf16"}.get(inputs, inputs)\n',
        '    return activations or {"none": "dynamic"}.get(inputs, inputs)\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (the float16 W4A16 fallback picks the wrong format)
    mutant(
        "r19-fp16-w4a16-format-swapped",
        "wrong dtype",
        CHECKPOINT,
        "    if not formats or dtype == torch.bfloat16 or dtype == torch.float16 and"
        ' formats == {"nvfp4"}:\n',
        "    if not formats or dtype == torch.bfloat16 or dtype == torch.float16 and"
        ' formats == {"mxfp4"}:\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (every stacked expert takes expert 0's global scale)
    mutant(
        "r19-moe-global-scale-expert0",
        "wrong values",
        CHECKPOINT,
        "        return FP4Tensor(data, blocked.scale, torch.stack(scales).to(data.device), fmt)\n",
        "        return FP4Tensor(data, blocked.scale, scales[0].to(data.device), fmt)\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (gpt-oss E8M0 scales skip check_scales (NaN bytes load))
    mutant(
        "r19-gpt-oss-scales-unchecked",
        "validation lost",
        CHECKPOINT,
        "        scales = t[key].view(torch.float8_e8m0fnu)\n"
        "        try:\n"
        "            check_scales(scales)\n",
        "        scales = t[key].view(torch.float8_e8m0fnu)\n        try:\n            pass\n",
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (KV-cache scales on the attention module are refused)
    mutant(
        "r19-ct-kv-scales-on-attention-refused",
        "wrong condition",
        CHECKPOINT,
        '        if owner.rpartition(".")[2] != proj and f"{owner}.{proj}" not in modules:\n',
        '        if owner.rpartition(".")[2] != proj and f"{owner}.{proj}" in modules:\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (generate.py's --activations fp4 drops static input scales)
    mutant(
        "r19-gen-fp4-maps-to-dynamic",
        "wrong mode",
        GENERATE,
        'ACTIVATIONS = {"fp4": "fp4", "bf16": "bf16"}\n',
        'ACTIVATIONS = {"fp4": "dynamic", "bf16": "bf16"}\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # (generate.py pads a batch on the right)
    mutant(
        "r19-gen-right-padding",
        "wrong padding",
        GENERATE,
        '    tokenizer.padding_side = "left"\n',
        '    tokenizer.padding_side = "right"\n',
        CHECKPOINT_REVIEW_TESTS,
    ),
    # a twentieth blind review (the benchmarks: figures, checks, arguments, JSON): 19 of 20
    # caught at first, 8 of them repeating earlier mutants text for text (left out);
    # r20-linear-nk-k-multiple-16 since by --nk's K check held to the library's
    # (per-layer time divided by layers - 1)
    mutant(
        "r20-stack-per-layer-off-by-one",
        "off-by-one layer count",
        "benchmarks/stack.py",
        "    return (stack_us - silu_us) / layers\n",
        "    return (stack_us - silu_us) / (layers - 1)\n",
        BENCH_REVIEW_TESTS,
    ),
    # (a contestant that failed its check still gets a time (the check dict, not its ok))
    mutant(
        "r20-stack-timed-despite-failed-check",
        "check skipped",
        "benchmarks/stack.py",
        '        if result["check"]["ok"]:\n            result["stack_us"] = timer(',
        '        if result["check"]:\n            result["stack_us"] = timer(',
        BENCH_REVIEW_TESTS,
    ),
    # (every FP4 layer's error taken from W4A4's output)
    mutant(
        "r20-linear-err-wrong-output",
        "check on the wrong tensor",
        "benchmarks/linear.py",
        '            row[f"rel_err_{name}"] = rel_err(outputs[name], y_bf16)\n',
        '            row[f"rel_err_{name}"] = rel_err(outputs["w4a4"], y_bf16)\n',
        BENCH_REVIEW_TESTS,
    ),
    # (--nk takes a K that is a multiple of 16, not of 32)
    mutant(
        "r20-linear-nk-k-multiple-16",
        "argument check lost",
        "benchmarks/linear.py",
        "        if n < 1 or k < 32 or k % 32:\n",
        "        if n < 1 or k < 32 or k % 16:\n",
        BENCH_REVIEW_TESTS,
    ),
    # (the JSON's cold_l2 the opposite of the run's mode)
    mutant(
        "r20-linear-json-cold-l2-inverted",
        "JSON disagrees with the table",
        "benchmarks/linear.py",
        '        "cold_l2": not args.warm_l2,\n',
        '        "cold_l2": args.warm_l2,\n',
        BENCH_REVIEW_TESTS,
    ),
    # (tokens per second without the batch)
    mutant(
        "r20-model-tok-s-ignores-batch",
        "wrong figure (tokens per second)",
        "benchmarks/model.py",
        "        cell = f\"{us / 1e3:8.3f} {row['batch'] / us * 1e6:9.1f}\"\n",
        '        cell = f"{us / 1e3:8.3f} {1e6 / us:9.1f}"\n',
        BENCH_REVIEW_TESTS,
    ),
    # (the KV cache sized by query heads, not KV heads)
    mutant(
        "r20-model-kv-cache-query-heads",
        "wrong byte count",
        "benchmarks/model.py",
        '    per_position = 2 * c["num_key_value_heads"] * head_dim * 2\n',
        '    per_position = 2 * c["num_attention_heads"] * head_dim * 2\n',
        BENCH_REVIEW_TESTS,
    ),
    # (eager step times the mean of the rounds, not the median)
    mutant(
        "r20-model-eager-mean-not-median",
        "median vs mean",
        "benchmarks/model.py",
        "    return {variant: statistics.median(found) for variant, found in times.items()}\n",
        "    return {variant: statistics.mean(found) for variant, found in times.items()}\n",
        BENCH_REVIEW_TESTS,
    ),
    # (W4A16 checked against the W4A4 reference)
    mutant(
        "r20-moe-w4a16-checked-against-w4a4-reference",
        "check against the wrong reference",
        "benchmarks/moe.py",
        '        ref = reference_for(problem.x.shape[0], contestant == "ours_w4a4")\n',
        '        ref = reference_for(problem.x.shape[0], contestant.startswith("ours"))\n',
        BENCH_REVIEW_TESTS,
    ),
    # (the timer given the first copy of the weights only (warm in L2))
    mutant(
        "r20-moe-timed-first-copy-only",
        "contestant timed on different data",
        "benchmarks/moe.py",
        '        result["us"] = run.timer(cycling(calls), graph_calls(len(calls)), run.reps)\n',
        '        result["us"] = run.timer(calls[0], graph_calls(len(calls)), run.reps)\n',
        BENCH_REVIEW_TESTS,
    ),
    # (an out-of-range --calls exits 1, not 2)
    mutant(
        "r20-eager-bad-calls-exit-1",
        "wrong exit status",
        "benchmarks/eager.py",
        '        print("error: --calls must be 1 .. 150", file=sys.stderr)\n        return 2\n',
        '        print("error: --calls must be 1 .. 150", file=sys.stderr)\n        return 1\n',
        BENCH_REVIEW_TESTS,
    ),
    # (a kernel's mean time divided by kernels per call, not calls)
    mutant(
        "r20-moe-profile-mean-per-call-divisor",
        "wrong divisor",
        "benchmarks/moe_profile.py",
        "    return [(name, total / count) for name, total in zip(names, sums, strict=True)]\n",
        "    return [(name, total / per_call) for name, total in zip(names, sums, strict=True)]\n",
        BENCH_REVIEW_TESTS,
    ),
    # a twenty-first blind review (the public API on CPU tensors: FP4Tensor, quantize,
    # fp4_gemm, FP4Linear, quantize_model, calibrate, the layout): 18 of 20 caught at first,
    # 8 of them repeating earlier mutants text for text (left out; the uncaught
    # calibrate one is rq-calibrate-last-batch, caught by a file outside this list);
    # r21-to-blocked-empty-rows since by from_plain of empty parts
    # (dequantize casts before the global scale multiplies)
    mutant(
        "r21-dequantize-cast-before-global-scale",
        "wrong dtype / rounding order",
        TENSOR,
        "        return (values * gs.reshape(*gs.shape, 1, 1)).to(dtype)\n",
        "        return values.to(dtype) * gs.reshape(*gs.shape, 1, 1)\n",
        API_REVIEW_TESTS,
    ),
    # (to_compressed_tensors writes the decoding scale, not its reciprocal)
    mutant(
        "r21-to-compressed-tensors-scale-not-inverted",
        "reciprocal scale convention",
        TENSOR,
        '            "weight_global_scale": (1.0 / self.global_scale).reshape(1),\n',
        '            "weight_global_scale": self.global_scale.reshape(1),\n',
        API_REVIEW_TESTS,
    ),
    # (a numeric global scale of 0 accepted)
    mutant(
        "r21-number-global-scale-accepts-zero",
        "boundary condition (refusal lost)",
        TENSOR,
        "    if not (math.isfinite(float(scale)) and float(scale) > 0):\n",
        "    if not (math.isfinite(float(scale)) and float(scale) >= 0):\n",
        API_REVIEW_TESTS,
    ),
    # (batched activations skip re-blocking their scales at M % 32 == 0)
    mutant(
        "r21-as-rows-view-threshold-32",
        "batched [L, M, K] scale layout",
        OPS,
        "    if m % 128 == 0:\n        return data, a.scale.reshape(-1, *a.scale.shape[-2:])\n",
        "    if m % 32 == 0:\n        return data, a.scale.reshape(-1, *a.scale.shape[-2:])\n",
        API_REVIEW_TESTS,
    ),
    # (the W4A16 fp4_gemm drops alpha)
    mutant(
        "r21-w4a16-ignores-alpha",
        "argument dropped (wrong values)",
        OPS,
        "    alpha = device_alpha(b.global_scale, alpha)\n",
        "    alpha = device_alpha(b.global_scale, None)\n",
        API_REVIEW_TESTS,
    ),
    # (the quantize fake kernel's global scale in x's dtype)
    mutant(
        "r21-fake-quantize-global-scale-dtype",
        "fake kernel dtype",
        OPS,
        "    return data, scale, x.new_empty((), dtype=torch.float32)\n",
        "    return data, scale, x.new_empty(())\n",
        API_REVIEW_TESTS,
    ),
    # (quantize takes a K that is a multiple of 16, not of 32)
    mutant(
        "r21-quantize-k-multiple-of-16",
        "refusal lost (block size confusion)",
        OPS,
        "    if x.shape[-1] == 0 or x.shape[-1] % 32:\n",
        "    if x.shape[-1] == 0 or x.shape[-1] % 16:\n",
        API_REVIEW_TESTS,
    ),
    # (E2M1 ties round to the odd code)
    mutant(
        "r21-e2m1-ties-to-odd",
        "rounding direction",
        CPU,
        "    code = torch.where(tie & (below % 2 == 1), below + 1, below)\n",
        "    code = torch.where(tie & (below % 2 == 0), below + 1, below)\n",
        API_REVIEW_TESTS,
    ),
    # (to_blocked reshapes with -1, ambiguous for empty scales)
    mutant(
        "r21-to-blocked-empty-rows",
        "empty input (ambiguous reshape)",
        LAYOUT,
        "    raw = scales.view(torch.uint8).reshape(math.prod(lead), rows, cols)\n",
        "    raw = scales.view(torch.uint8).reshape(-1, rows, cols)\n",
        API_REVIEW_TESTS,
    ),
    # (the blocked shape's column blocks rounded down)
    mutant(
        "r21-blocked-shape-floor-column-blocks",
        "rounding (floor instead of ceil)",
        LAYOUT,
        "    return (row_blocks, round_up(k // sf_vec_size, ATOM_COLS) // ATOM_COLS, ATOM_BYTES)\n",
        "    return (row_blocks, k // sf_vec_size // ATOM_COLS, ATOM_BYTES)\n",
        API_REVIEW_TESTS,
    ),
    # (a W4A16 layer's load_state_dict stores plain-order bytes as prepacked)
    mutant(
        "r21-bf16-load-not-prepacked",
        "state does not survive save/load",
        NN,
        '                    name, value = "weight_prepacked", k_order.prepack_weights(value)\n',
        '                    name, value = "weight_prepacked", value\n',
        API_REVIEW_TESTS,
    ),
    # (a single-string include split into one-character patterns)
    mutant(
        "r21-include-str-split-into-chars",
        "pattern match too wide",
        NN,
        "    if isinstance(include, str):\n        return [include], None\n",
        "    if isinstance(include, str):\n        return list(include), None\n",
        API_REVIEW_TESTS,
    ),
    # ------------------------------------------- review 22: benchmarks.power (clock and power)
    # the window keeps the settling samples: SETTLE_S is never dropped from its start
    mutant(
        "r22-settle-not-dropped",
        "off-by-settle sample window",
        POWER,
        "    window = [s for s in samples if start + SETTLE_S <= s[0] <= end]\n",
        "    window = [s for s in samples if start <= s[0] <= end]\n",
        POWER_REVIEW_TESTS,
    ),
    # the SM clock's "median" is the mean: one deep dip drags the printed median down
    mutant(
        "r22-clock-mean-not-median",
        "mean instead of median",
        POWER,
        '        "sm_mhz_median": statistics.median(clocks),\n',
        '        "sm_mhz_median": statistics.mean(clocks),\n',
        POWER_REVIEW_TESTS,
    ),
    # the shares are over every sample of the run, not over the row's window
    mutant(
        "r22-share-over-all-samples",
        "wrong denominator of a share",
        POWER,
        '        "power_capped": sum(1 for s in window if s[4] & POWER_CAP_BIT) / len(window),\n',
        '        "power_capped": sum(1 for s in window if s[4] & POWER_CAP_BIT) / len(samples),\n',
        POWER_REVIEW_TESTS,
    ),
    # the power-cap bit is 0x2 (applications clocks setting), not 0x4 (software power cap)
    mutant(
        "r22-power-cap-bit-0x2",
        "wrong bit mask",
        POWER,
        "POWER_CAP_BIT = 0x4\n",
        "POWER_CAP_BIT = 0x2\n",
        POWER_REVIEW_TESTS,
    ),
    # the event reasons are read from their last hex digit only: 0x20, 0x40, 0x80 are lost
    mutant(
        "r22-reasons-low-digit-only",
        "mis-read bit field",
        POWER,
        "float(power), int(reasons, 16)\n",
        "float(power), int(reasons[-1], 16)\n",
        POWER_REVIEW_TESTS,
    ),
    # the timestamp's milliseconds are dropped: samples shift up to a second earlier
    mutant(
        "r22-timestamp-drops-ms",
        "dropped fractional seconds",
        POWER,
        '    seconds = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S"))'
        ' + float(f"0.{frac or 0}")\n',
        '    seconds = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S"))\n',
        POWER_REVIEW_TESTS,
    ),
    # the timestamp is read as UTC, though nvidia-smi writes local time
    mutant(
        "r22-timestamp-as-utc",
        "local vs UTC time",
        POWER,
        '    seconds = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S"))'
        ' + float(f"0.{frac or 0}")\n',
        '    seconds = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) - time.timezone'
        ' + float(f"0.{frac or 0}")\n',
        POWER_REVIEW_TESTS,
    ),
    # the clock and power fields are unpacked in the wrong order
    mutant(
        "r22-clock-power-swapped",
        "wrong field order",
        POWER,
        "    stamp, uuid, clock, power, reasons = fields\n",
        "    stamp, uuid, power, clock, reasons = fields\n",
        POWER_REVIEW_TESTS,
    ),
    # this GPU's samples are matched on the UUID's start: nvidia-smi's "GPU-" prefix loses all
    mutant(
        "r22-uuid-startswith",
        "wrong-GPU filter",
        POWER,
        "        return [s for s in parsed if s[1].lower().endswith(self.uuid)]\n",
        "        return [s for s in parsed if s[1].lower().startswith(self.uuid)]\n",
        POWER_REVIEW_TESTS,
    ),
    # the check's dict (always truthy) is tested, not its "ok": a failed contestant still runs
    mutant(
        "r22-failed-check-runs",
        "failed correctness check ignored",
        POWER,
        '                if not row["check"]["ok"]:\n',
        '                if not row["check"]:\n',
        POWER_REVIEW_TESTS,
    ),
    # microseconds per graph replay, not per forward pass (FORWARDS_PER_GRAPH forgotten)
    mutant(
        "r22-us-per-replay",
        "wrong per-call divisor",
        POWER,
        "first.elapsed_time(last) * 1e3 / (replays * FORWARDS_PER_GRAPH)\n",
        "first.elapsed_time(last) * 1e3 / replays\n",
        POWER_REVIEW_TESTS,
    ),
    # the SM clock cell prints the minimum first and the median in parentheses
    mutant(
        "r22-clock-cell-swapped",
        "swapped figures in a cell",
        POWER,
        "f\"{c['sm_mhz_median']:.0f} ({c['sm_mhz_min']:.0f})\"",
        "f\"{c['sm_mhz_min']:.0f} ({c['sm_mhz_median']:.0f})\"",
        POWER_REVIEW_TESTS,
    ),
    # a run row without samples gets one "not measured" cell too few: the columns misalign
    mutant(
        "r22-not-measured-cells-short",
        "misaligned table columns",
        POWER,
        "        figures = [f\"{row['us_per_forward']:.1f}\"] + [NOT_MEASURED] * 4\n",
        "        figures = [f\"{row['us_per_forward']:.1f}\"] + [NOT_MEASURED] * 3\n",
        POWER_REVIEW_TESTS,
    ),
    # --seconds is not checked: 0 or -1 runs (no replays, a division by zero), "x" crashes
    mutant(
        "r22-seconds-unchecked",
        "bad command-line input let through",
        POWER,
        '    args.seconds = cli.positive_int(p, "--seconds", args.seconds)\n',
        "    args.seconds = int(args.seconds)\n",
        POWER_REVIEW_TESTS,
    ),
    # a missing nvidia-smi raises FileNotFoundError, not SubprocessError: a traceback, not exit 2
    mutant(
        "r22-missing-nvidia-smi-traceback",
        "broken exit-2 refusal",
        POWER,
        "    except OSError as err:\n",
        "    except subprocess.SubprocessError as err:\n",
        POWER_REVIEW_TESTS,
    ),
    # ---------------------------------- review 23: benchmarks.power's power limit and header
    # the UUID filter is dropped: on a multi-GPU host the first GPU's limit heads the table
    mutant(
        "r23-limit-any-gpu",
        "wrong-GPU filter",
        POWER,
        "        if len(fields) == 2 and fields[0].lower().endswith(uuid.lower()):\n",
        "        if len(fields) == 2:\n",
        POWER_REVIEW_TESTS,
    ),
    # the UUID must equal nvidia-smi's exactly: its "GPU-" prefix means it never does (always None)
    mutant(
        "r23-limit-uuid-equals",
        "wrong-GPU filter",
        POWER,
        "        if len(fields) == 2 and fields[0].lower().endswith(uuid.lower()):\n",
        "        if len(fields) == 2 and fields[0].lower() == uuid.lower():\n",
        POWER_REVIEW_TESTS,
    ),
    # the default power limit is queried, not the one in force: a capped GPU reports its default
    mutant(
        "r23-limit-default-query",
        "wrong nvidia-smi field",
        POWER,
        'LIMIT_QUERY = "uuid,power.limit"\n',
        'LIMIT_QUERY = "uuid,power.default_limit"\n',
        POWER_REVIEW_TESTS,
    ),
    # only a failing exit status is caught: a missing nvidia-smi or a timeout is a traceback
    mutant(
        "r23-limit-timeout-uncaught",
        "exception not caught",
        POWER,
        "    except (OSError, subprocess.SubprocessError):\n        return None\n    for line",
        "    except subprocess.CalledProcessError:\n        return None\n    for line",
        POWER_REVIEW_TESTS,
    ),
    # an unreadable limit ("[N/A]") is swallowed as 0 W: the header prints "power limit 0 W"
    mutant(
        "r23-limit-na-zero",
        "failure swallowed as a number",
        POWER,
        '            except ValueError:  # ("[N/A]")\n                return None\n',
        '            except ValueError:  # ("[N/A]")\n                return 0.0\n',
        POWER_REVIEW_TESTS,
    ),
    # the header truncates the limit (699.9 W prints as 699 W), not rounds it
    mutant(
        "r23-header-truncates",
        "wrong rounding",
        POWER,
        '    limit = NOT_MEASURED if limit is None else f"{limit:.0f} W"\n',
        '    limit = NOT_MEASURED if limit is None else f"{int(limit)} W"\n',
        POWER_REVIEW_TESTS,
    ),
    # the header prints the raw figure: "power limit 700.0" without its unit, "None" when unread
    mutant(
        "r23-header-raw-limit",
        "header field misformatted",
        POWER,
        "power limit {limit}, driver",
        "power limit {env['power_limit_w']}, driver",
        POWER_REVIEW_TESTS,
    ),
    # the limit is read for "cuda", not this GPU's UUID: never matched, always "not measured"
    mutant(
        "r23-main-limit-wrong-device",
        "limit read for the wrong device",
        POWER,
        '    env["power_limit_w"] = power_limit(uuid)\n',
        '    env["power_limit_w"] = power_limit(str(device))\n',
        POWER_REVIEW_TESTS,
    ),
]
