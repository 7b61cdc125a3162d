# SPDX-License-Identifier: BSD-3-Clause
"""Greedy generation from an FP4 checkpoint (folder or Hub repository), with decode tokens/s:

    python examples/generate.py --model DIR                      # the checkpoint's own mode
    python examples/generate.py --model nvidia/Llama-3.1-8B-Instruct-FP4   # a Hub repository
    python examples/generate.py --model DIR --activations bf16   # W4A16 (Hopper, CPU)
    python examples/generate.py --model DIR --chat --prompt "What is FP4?"  # an instruct model
    python examples/generate.py --model DIR --batch 16 --max_new_tokens 128 --baseline
    python examples/generate.py --model DIR --baseline --baseline_model BF16_DIR

The folder is a compressed-tensors or ModelOpt NVFP4 / MXFP4 checkpoint (``fp4_ops.load_quantized``
loads it; a Hub repository id, ``org/name``, is fetched first, ``fp4_ops.checkpoint_folder``);
its tokenizer files, or ``--tokenizer DIR``'s, encode the prompts. ``--activations``:
``fp4`` is W4A4 in every layer (the checkpoint's static input scales where it has them, per-call
scales where it is weight-only), ``bf16`` W4A16; left out, the checkpoint's own mode. The batch
holds the ``--prompt`` values, one row each or repeated to ``--batch`` rows (left-padded to one
length; fewer rows than prompts are refused); ``--chat`` puts each in the
tokenizer's chat template as a user message, ready for the assistant's reply (instruct models).

Timing: one untimed warm-up ``generate`` of the same shapes (kernel compilation, allocations),
then a timed one. A streamer notes the wall time at which ``generate`` hands it the prompt and
then each step's new tokens (it copies them to the host first, so that step has finished on
the device): prefill is the time from the prompt to the first new token, decode the time from
the first new token to the last, and decode tokens per second = batch x (steps - 1) / that
time. Steps that follow an end-of-sequence token in every row are not run (generate stops), and
the count says so. ``--compile`` (CUDA only) decodes with a static cache under
``torch.compile(mode="reduce-overhead")`` (CUDA graphs), as transformers' generate offers it;
otherwise a dynamic cache, eager.

``--baseline`` then runs the same prompts with a BF16 model: ``--baseline_model DIR``'s weights
(``from_pretrained``, e.g. the checkpoint's unquantized source; its config must be an
unquantized model's and describe the same architecture, checked before anything runs), or,
without it, the FP4 model dequantized and made BF16 throughout (the same numbers without FP4
arithmetic; the FP4 model is converted in place, so memory holds the BF16 model once).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
from torch import nn

import fp4_ops
from fp4_ops.checkpoint import REPO_ID
from fp4_ops.moe import apply_activation

ACTIVATIONS = {"fp4": "fp4", "bf16": "bf16"}
DEFAULT_PROMPT = "The quickest way to learn a new language is"
#: rows of text printed (all rows are timed)
SHOWN_ROWS = 4
# (a tokenizer's own files: from a config.json alone AutoTokenizer may build an empty one)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class StepClock:
    """A generate streamer that notes the wall time of each hand-over (prompt, then tokens)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Greedy generation from an FP4 checkpoint, with decode tokens per second."
    )
    p.add_argument("--model", required=True, help="FP4 checkpoint folder or Hub repository id")
    p.add_argument(
        "--activations",
        choices=sorted(ACTIVATIONS),
        help="fp4: W4A4, bf16: W4A16 (default: as stored)",
    )
    p.add_argument(
        "--batch", type=int, help="sequences generated together (default: one per --prompt)"
    )
    p.add_argument("--max_new_tokens", type=int, default=64, help="tokens to generate (>= 2)")
    p.add_argument("--prompt", action="append", help="a prompt (repeat the flag for several)")
    p.add_argument("--chat", action="store_true", help="prompts as user messages (chat template)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: --model)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--compile", action="store_true", help="static cache + CUDA graphs (CUDA)")
    p.add_argument("--baseline", action="store_true", help="also time a BF16 model")
    p.add_argument("--baseline_model", help="BF16 model folder for --baseline")
    args = p.parse_args(argv)
    args.prompt = args.prompt or [DEFAULT_PROMPT]
    args.batch = len(args.prompt) if args.batch is None else args.batch
    if args.batch < 1:
        p.error(f"--batch must be at least 1, got {args.batch}")
    if args.batch < len(args.prompt):
        p.error(f"--batch {args.batch} leaves out prompts: {len(args.prompt)} are given")
    if args.max_new_tokens < 2:
        p.error(
            f"--max_new_tokens must be at least 2 (decode is timed after the first token), "
            f"got {args.max_new_tokens}"
        )
    if args.baseline_model is not None and not args.baseline:
        p.error("--baseline_model is the model of --baseline: give --baseline too")
    for flag in ("model", "baseline_model"):
        folder = getattr(args, flag)
        if folder is None or not Path(folder).exists() and REPO_ID.fullmatch(folder):
            continue  # (a Hub repository: fetched, or refused, when the run starts)
        if not (Path(folder) / "config.json").is_file():
            p.error(f"--{flag} {folder}: not a model folder (no config.json) nor a Hub repository")
    if args.tokenizer is not None and not any(
        (Path(args.tokenizer) / name).is_file() for name in TOKENIZER_FILES
    ):
        p.error(f"--tokenizer {args.tokenizer}: no {' / '.join(TOKENIZER_FILES)}")
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r}: not a device (cuda, cuda:1, cpu)")
    if device.type not in ("cuda", "cpu"):
        p.error(f"--device {args.device!r}: cuda or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch sees no CUDA GPU")
    if device.type == "cpu" and device.index not in (None, 0):
        p.error(f"--device {args.device}: the CPU has no index but 0")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        p.error(f"--device {args.device}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    if args.compile and device.type != "cuda":
        p.error("--compile captures CUDA graphs: it needs --device cuda")
    return args


def load_tokenizer(folder: str):
    """The tokenizer of ``folder``, set up to left-pad a batch; ValueError when there is none."""
    import transformers

    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{folder}: no tokenizer that loads (no {' / '.join(TOKENIZER_FILES)}); pass "
            "--tokenizer DIR"
        )
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # (transformers 4.x fails a folder without tokenizer files oddly)
        raise ValueError(
            f"{folder}: no tokenizer that loads ({type(err).__name__}: {err}); pass --tokenizer DIR"
        ) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def encode(tokenizer, prompts: list[str], batch: int, device, chat: bool = False) -> dict:
    """The batch: ``prompts`` repeated to ``batch`` rows, left-padded; with ``chat``, each a
    user message in the tokenizer's chat template followed by the assistant's turn (the
    template holds the special tokens: none are added)."""
    rows = [prompts[i % len(prompts)] for i in range(batch)]
    special = {}
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat: the tokenizer has no chat template (leave out --chat)")
        rows = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": r}], tokenize=False, add_generation_prompt=True
            )
            for r in rows
        ]
        special["add_special_tokens"] = False
    lengths = {len(tokenizer(r, **special)["input_ids"]) for r in rows}
    if len(lengths) > 1 and tokenizer.pad_token is None:
        raise ValueError(
            "prompts of different lengths need padding: the tokenizer has no pad token"
        )
    if min(lengths) == 0:
        raise ValueError("a prompt encodes to no tokens")
    encoded = tokenizer(rows, return_tensors="pt", padding=len(lengths) > 1, **special)
    return {k: v.to(device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}


def generate_timed(model, inputs: dict, max_new_tokens: int, compile: bool) -> dict:
    """One warm-up and one timed greedy ``generate``: the tokens and the timings."""
    import transformers

    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if compile:
        kwargs["cache_implementation"] = "static"
        kwargs["compile_config"] = transformers.CompileConfig(
            fullgraph=True, mode="reduce-overhead"
        )
    else:
        kwargs["disable_compile"] = True
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:  # (else generate warns and takes the end-of-sequence token itself)
        kwargs["pad_token_id"] = model.generation_config.eos_token_id
    with torch.inference_mode():
        model.generate(**inputs, **kwargs)  # (warm-up)
        clock = StepClock()
        out = model.generate(**inputs, streamer=clock, **kwargs)
    steps = len(clock.times) - 1
    prompt = inputs["input_ids"].shape[1]
    decode_s = clock.times[-1] - clock.times[1] if steps > 1 else float("nan")
    batch = out.shape[0]
    return {
        "tokens": out[:, prompt:].cpu(),
        "steps": steps,
        "prefill_s": clock.times[1] - clock.times[0],
        "decode_s": decode_s,
        "decode_tok_s": batch * (steps - 1) / decode_s if steps > 1 else float("nan"),
    }


class DequantizedExperts(nn.Module):
    """An FP4Experts' experts dequantized to bfloat16, with transformers' experts forward
    (hidden_states, top_k_index, top_k_weights): a loop over the routed experts."""

    def __init__(self, experts: fp4_ops.FP4Experts):
        super().__init__()
        self.w13 = experts.expert_weights("w13").dequantize(torch.bfloat16)
        self.w2 = experts.expert_weights("w2").dequantize(torch.bfloat16)
        self.b13, self.b2, self.activation = experts.w13_bias, experts.w2_bias, experts.activation

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states, dtype=torch.float32)
        for e in top_k_index.unique().tolist():
            token, slot = torch.where(top_k_index == e)
            h = hidden_states[token].to(torch.bfloat16) @ self.w13[e].t()
            h = h if self.b13 is None else h + self.b13[e].to(h.dtype)
            a = apply_activation(h.float(), self.activation).to(torch.bfloat16)
            y = a @ self.w2[e].t()
            y = y if self.b2 is None else y + self.b2[e].to(y.dtype)
            out.index_add_(0, token, y.float() * top_k_weights[token, slot, None].float())
        return out.to(hidden_states.dtype)


def dequantize_in_place(model: nn.Module) -> int:
    """Every FP4Linear of ``model`` replaced by an nn.Linear of its dequantized weight (in the
    bias's dtype, else bfloat16), every FP4Experts by ``DequantizedExperts``; the number
    replaced."""
    experts = [(n, m) for n, m in model.named_modules() if isinstance(m, fp4_ops.FP4Experts)]
    for name, module in experts:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, DequantizedExperts(module))
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, fp4_ops.FP4Linear)]
    for name, layer in layers:
        dtype = layer.bias.dtype if layer.bias is not None else torch.bfloat16
        weight = layer.weight.dequantize(dtype)
        # (made on the meta device: its own initial weight would be thrown away)
        linear = nn.Linear(layer.in_features, layer.out_features, bias=False, device="meta")
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if layer.bias is not None:
            linear.bias = nn.Parameter(layer.bias.detach().to(dtype), requires_grad=False)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, linear)
    return len(experts) + len(layers)


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def report(label: str, tokenizer, result: dict, batch: int, max_new_tokens: int) -> None:
    print(f"--- {label}")
    for i, row in enumerate(result["tokens"][:SHOWN_ROWS]):
        print(f"[{i}] {tokenizer.decode(row, skip_special_tokens=True)!r}")
    if batch > SHOWN_ROWS:
        print(f"({batch - SHOWN_ROWS} more rows not shown)")
    steps = result["steps"]
    stopped = "" if steps == max_new_tokens else f"; every row ended after {counted(steps, 'step')}"
    print(f"prefill (prompt -> first token): {result['prefill_s'] * 1e3:.1f} ms{stopped}")
    if steps > 1:
        per_step = result["decode_s"] / (steps - 1) * 1e3
        print(
            f"decode: {counted(steps - 1, 'step')} x batch {batch} in {result['decode_s']:.3f} s = "
            f"{result['decode_tok_s']:.1f} tokens/s ({per_step:.2f} ms/step)"
        )
    else:
        print("decode: not measured (generation ended after the first token)")


#: text-config fields that two configs of one architecture may hold differently
NOT_ARCHITECTURE = frozenset(
    {"bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range"}
    | {"tie_word_embeddings", "quantization_config", "dtype", "torch_dtype"}
)


def check_baseline(path: str, config) -> None:
    """ValueError unless ``path`` holds an unquantized model whose config describes the FP4
    model's architecture: its model type and every field of its text config but
    ``PretrainedConfig``'s generic ones and ``NOT_ARCHITECTURE``."""
    import transformers

    base = transformers.AutoConfig.from_pretrained(path)
    if getattr(base, "quantization_config", None) or (Path(path) / "hf_quant_config.json").exists():
        raise ValueError(f"--baseline_model {path}: a quantized checkpoint, not a BF16 model")
    generic = set(transformers.PretrainedConfig().to_dict()) - {"model_type"}

    def fields(c) -> dict:
        items = c.get_text_config().to_dict().items()
        return {k: v for k, v in items if k not in generic and k not in NOT_ARCHITECTURE}

    theirs, ours = fields(base), fields(config)
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if differ:
        pairs = ((k, theirs.get(k), ours.get(k)) for k in differ)
        shown = "; ".join(f"{k} {a!r}, the checkpoint's {b!r}" for k, a, b in pairs)
        raise ValueError(f"--baseline_model {path}: another architecture ({shown})")


def _modes(model) -> str:
    fp4 = (fp4_ops.FP4Linear, fp4_ops.FP4MoE)
    found = sorted({m.activations for m in model.modules() if isinstance(m, fp4)})
    names = {"bf16": "W4A16", "static": "W4A4 static", "dynamic": "W4A4 dynamic"}
    return ", ".join(names[m] for m in found) or "no FP4 layer"


def _generate_or_none(model, inputs: dict, args) -> dict | None:
    """``generate_timed``, or None after an error line where the device runs out of memory."""
    try:
        return generate_timed(model, inputs, args.max_new_tokens, args.compile)
    except torch.OutOfMemoryError:
        print(
            f"error: out of {args.device} memory for --batch {args.batch} x --max_new_tokens "
            f"{args.max_new_tokens}: give fewer",
            file=sys.stderr,
        )
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    try:
        folder = fp4_ops.checkpoint_folder(args.model)
    except (ValueError, OSError, ImportError) as err:  # (OSError: the Hub's refusals too)
        print(f"error: --model: {err}", file=sys.stderr)
        return 2
    try:
        tokenizer = load_tokenizer(args.tokenizer or str(folder))
        inputs = encode(tokenizer, args.prompt, args.batch, device, args.chat)
        model = fp4_ops.load_quantized(folder, device, ACTIVATIONS.get(args.activations))
        if args.baseline_model is not None:
            check_baseline(args.baseline_model, model.config)
    except (ValueError, OSError, ImportError) as err:  # (OSError: unreadable files)
        print(f"error: {err}", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    how = "static cache, CUDA graphs" if args.compile else "dynamic cache, eager"
    print(f"{args.model} on {where}: {_modes(model)}; greedy, {how}")
    fp4 = _generate_or_none(model, inputs, args)
    if fp4 is None:
        return 2
    report(f"FP4 ({_modes(model)})", tokenizer, fp4, args.batch, args.max_new_tokens)
    if not args.baseline:
        return 0

    if args.baseline_model is not None:
        import transformers

        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            source = transformers.AutoModelForCausalLM.from_pretrained(
                args.baseline_model, dtype=torch.bfloat16
            )
        except (ValueError, OSError, RuntimeError) as err:  # (RuntimeError: sizes that differ)
            print(f"error: --baseline_model {args.baseline_model}: {err}", file=sys.stderr)
            return 2
        model, label = source.to(device).eval(), f"BF16 ({args.baseline_model})"
    else:
        count = dequantize_in_place(model)
        model.to(torch.bfloat16)  # (a checkpoint's float32 embeddings and norms too)
        label = f"BF16 (the FP4 model dequantized, {counted(count, 'layer')})"
    base = _generate_or_none(model, inputs, args)
    if base is None:
        return 2
    report(label, tokenizer, base, args.batch, args.max_new_tokens)
    print(f"FP4 / BF16 decode tokens per second: {fp4['decode_tok_s'] / base['decode_tok_s']:.2f}x")
    if fp4["tokens"].shape == base["tokens"].shape:
        same = (fp4["tokens"] == base["tokens"]).float().mean().item()
        print(f"greedy tokens equal to BF16's at {same:.1%} of positions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
