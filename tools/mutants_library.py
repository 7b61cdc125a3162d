"""Mutants of fp4_ops/checkpoint.py and fp4_ops/nn.py (checkpoint loading and saving, FP4Linear's
state dict, quantize_model, calibrate): small, realistic bugs that make a result silently wrong or
let bad input load, planted by a reviewer who had not read the tests. The CPU tests below must
catch each. Keep every ``old`` text current as the code changes (it must occur exactly once in
its file)."""

CHECKPOINT = "fp4_ops/checkpoint.py"
NN = "fp4_ops/nn.py"
TESTS = [
    "tests/test_checkpoint.py",
    "tests/test_moe_checkpoint.py",
    "tests/test_library.py",
    "tests/test_quantize_transformers.py",
]


def mutant(mutant_id: str, klass: str, file: str, old: str, new: str) -> dict:
    return {"id": mutant_id, "klass": klass, "file": file, "old": old, "new": new, "tests": TESTS}


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
]
