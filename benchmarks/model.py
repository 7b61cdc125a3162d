# SPDX-License-Identifier: BSD-3-Clause
"""Whole-model decode speed: BF16 against FP4 W4A16 and W4A4 (``fp4_ops.quantize_model``), same
process, same random weights, on transformers models built from real configurations.

    python -m benchmarks.model                                # both configs, batches 1, 16, 64
    python -m benchmarks.model --config llama-3.1-8b --layers 4 --batch 1,16
    python -m benchmarks.model --eager --profile              # + eager decode, + a breakdown
    python -m benchmarks.model --config tiny --device cpu     # CI smoke test (eager, CPU)

Models: the config.json numbers of Llama-3.1-8B and Qwen3-32B (``CONFIGS``, with their
sources), ``--layers N`` keeping the first N decoder layers; random weights (transformers'
initialisation, BF16), nothing downloaded. The three variants hold one model: its Linear
modules, except ``lm_head`` (kept in BF16 as FP4 checkpoints keep it, unless ``--lm_head fp4``),
are swapped between the BF16 ones and two sets of FP4Linear quantized from them, so memory
holds the BF16 model and two FP4 copies of its linear layers (Qwen3-32B: about 100 GB); a run
that would not fit the device's memory is refused before it starts, naming the ``--layers``
that would.

A decode step: one new token per row at position ``--context`` of a static KV cache
(transformers' ``StaticCache``, ``--context`` + ``CACHE_MARGIN`` positions, allocated at the
first step of a batch size and shared by the variants), through the model's forward with
``position_ids`` and a 4-D boolean attention mask made from one device-side position counter,
so nothing in a step reads a value back to the host. The counter and the cache's write
positions advance by one each step and are set back to ``--context`` before each
measurement. Attention is transformers' SDPA path, which with a mask repeats K / V for every
query head: its cost is the same in all three variants.

Timing: CUDA graphs by ``fp4_ops.devtools.time_graph_us``: a warm-up step (first calls compile
and allocate), then ``GRAPH_STEPS`` steps captured in one graph, replayed ``GRAPH_REPLAYS``
times; the mean step time. ``--eager``: also ``devtools.time_eager_us`` over ``EAGER_STEPS``
steps, nothing captured, the variants in turn over ``EAGER_ROUNDS`` rounds (a slow phase of
the host falls on all of them alike), the median of each. On ``--device cpu``: eager steps
timed with ``time.perf_counter`` (no graphs; for smoke tests). Tokens per second = batch /
step time.

``--profile``: one eager step of each variant and batch under ``torch.profiler``; the time of
its kernels (CPU: of its operators) split into GEMMs, attention (everything launched inside an
attention module that is not a GEMM: rotary, cache update, K / V repeat, SDPA), activation
quantization and other, with, on the GPU, the step's span from first kernel start to last
kernel end and the idle time inside it (launch gaps).

Output: a table (step time in ms and tokens per second per variant; ``x bf16``: tokens per
second over BF16's) and JSON (``--out``; default ``results/<gpu>_model.json`` on a GPU, none
on the CPU) with the GPU, torch / transformers / CUDA versions, the date and every number.
Only measured numbers are printed.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gc
import inspect
import json
import os
import re
import statistics
import sys
import time

import torch
from torch import nn

import fp4_ops
from benchmarks import args as cli
from fp4_ops import devtools, layout

# From the models' config.json on the Hugging Face Hub.
CONFIGS = {
    "llama-3.1-8b": {
        "source": "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "source": "https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json",
        "model_type": "qwen3",
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "tiny": {
        "source": "a small Llama for smoke tests (not a real model)",
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
    },
}
DEFAULT_CONFIGS = ("llama-3.1-8b", "qwen3-32b")
VARIANTS = ("bf16", "w4a16", "w4a4")
#: quantize_model's activations of each FP4 variant
FP4_ACTIVATIONS = {"w4a16": "bf16", "w4a4": "dynamic"}
GRAPH_STEPS, GRAPH_REPLAYS, EAGER_STEPS, EAGER_ROUNDS, CPU_STEPS = 16, 4, 16, 5, 3
#: cache positions past --context: more than any one measurement's steps
CACHE_MARGIN = 128
#: memory a run holds beyond its weights and KV cache: activations, the CUDA context, the
#: allocator's rounding (the peaks that results/*_model.json record stay within it)
MEMORY_HEADROOM = 2 << 30
_GEMM = re.compile(r"gemm|gemv|nvjet|xmma|cublas|cutlass|matmul|aten::(mm|addmm|bmm)$", re.I)
_QUANTIZE = re.compile(r"quantiz|amax", re.I)
_ATTENTION = re.compile(r"fmha|flash|attention|softmax", re.I)
_ATTENTION_LABEL = "fp4_bench::attention"


# ----------------------------------------------------------------------------- arguments


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"unknown config {', '.join(bad) or repr(text)}: choose from {', '.join(CONFIGS)}"
        )
    return list(dict.fromkeys(names))


def _batches(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expects comma-separated integers, got {text!r}"
        ) from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be at least 1, got {text!r}")
    return list(dict.fromkeys(values))


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser("benchmarks.model", __doc__)
    p.add_argument("--config", type=_names, default=list(DEFAULT_CONFIGS), help="comma-separated")
    p.add_argument("--batch", type=_batches, default=[1, 16, 64], help="batch sizes (1,16,64)")
    p.add_argument("--layers", type=int, help="keep the first N decoder layers (default: all)")
    p.add_argument("--context", type=int, default=512, help="KV positions before the step")
    p.add_argument("--format", choices=("nvfp4", "mxfp4"), default="nvfp4")
    p.add_argument("--lm_head", choices=("bf16", "fp4"), default="bf16", help="lm_head's variant")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--eager", action="store_true", help="also time eager decode steps")
    p.add_argument("--profile", action="store_true", help="torch.profiler breakdown of a step")
    p.add_argument("--out", help="JSON path (default results/<gpu>_model.json on a GPU)")
    args = p.parse_args(argv)
    args.out = cli.output_path(p, "--out", args.out)
    if args.layers is not None and args.layers < 1:
        p.error(f"--layers must be at least 1, got {args.layers}")
    if args.context < 1:
        p.error(f"--context must be at least 1, got {args.context}")
    for name in args.config:
        total = CONFIGS[name]["num_hidden_layers"]
        if args.layers is not None and args.layers > total:
            p.error(f"--layers {args.layers}: {name} has {total} decoder layers")
    if args.device not in ("cuda", "cpu"):
        p.error(f"--device must be cuda or cpu, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(
            "--device cuda: torch sees no CUDA GPU (--config tiny --device cpu runs on the CPU)"
        )
    if args.device == "cpu" and args.eager:
        p.error(
            "--eager adds eager timing to the CUDA-graph timing; on the CPU every step is eager"
        )
    for name in args.config:
        if reason := size_reason(name, args):
            p.error(reason)
    return args


def cache_length(context: int) -> int:
    """The static cache's positions: ``context`` + CACHE_MARGIN, rounded up to a multiple of 64
    (the SDPA kernels' alignment for the mask's last dimension)."""
    return -(-(context + CACHE_MARGIN) // 64) * 64


def kv_cache_bytes(name: str, batch: int, context: int, layers: int | None) -> int:
    """BF16 keys and values of the static cache of ``CONFIGS[name]`` (first ``layers`` layers)."""
    c = CONFIGS[name]
    head_dim = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    per_position = 2 * c["num_key_value_heads"] * head_dim * 2
    return (layers or c["num_hidden_layers"]) * batch * cache_length(context) * per_position


def memory_bytes(device: str) -> int:
    """The memory of the device the run would use: the current GPU's, or the host's."""
    if device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def linear_shapes(name: str, layers: int | None) -> list[tuple[int, int]]:
    """(N, K) of every Linear weight of ``CONFIGS[name]`` (first ``layers`` decoder layers):
    per layer q, k, v, o, gate, up, down; ``lm_head`` last."""
    c = CONFIGS[name]
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    head_dim = c.get("head_dim", hidden // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    layer = [(q, hidden), (kv, hidden), (kv, hidden), (hidden, q)]
    layer += [(inter, hidden), (inter, hidden), (hidden, inter)]
    return layer * (layers or c["num_hidden_layers"]) + [(c["vocab_size"], hidden)]


def weight_bytes(name: str, layers: int | None, fmt: str, lm_head: str) -> tuple[int, int]:
    """(the BF16 model's parameter bytes, one FP4 copy of the Linear layers that the variants
    quantize): what ``run_config`` holds besides the KV cache and the activations."""
    c = CONFIGS[name]
    hidden, count = c["hidden_size"], layers or c["num_hidden_layers"]
    shapes = linear_shapes(name, layers)
    norms = 2 * hidden + (2 * c.get("head_dim", 0) if c["model_type"] == "qwen3" else 0)
    embedding = c["vocab_size"] * hidden
    bf16 = 2 * (sum(n * k for n, k in shapes) + embedding + count * norms + hidden)
    vec = layout.format_vec(fmt)
    quantized = shapes if lm_head == "fp4" else shapes[:-1]
    fp4 = sum(n * k // 2 + layout.blocked_scale_numel(n, k, vec) + 4 for n, k in quantized)
    return bf16, fp4


def memory_need(name: str, args) -> tuple[int, str]:
    """Bytes a run of ``CONFIGS[name]`` holds at its largest batch, and what they are: the BF16
    model, two FP4 copies of its Linear layers, the KV cache and ``MEMORY_HEADROOM``."""
    bf16, fp4 = weight_bytes(name, args.layers, args.format, args.lm_head)
    kv = kv_cache_bytes(name, max(args.batch), args.context, args.layers)
    parts = [(bf16, "BF16 weights"), (2 * fp4, "two FP4 copies of its Linear layers")]
    parts += [(kv, "KV cache"), (MEMORY_HEADROOM, "headroom")]
    return sum(b for b, _ in parts), ", ".join(f"{what} {b / 2**30:.1f}" for b, what in parts)


def size_reason(name: str, args) -> str:
    """Why ``CONFIGS[name]`` cannot run these sizes ("" if it can): a cache longer than the
    model's positions, or a run larger than the device's memory (then how many decoder layers
    would fit, if any)."""
    positions = CONFIGS[name]["max_position_embeddings"]
    if cache_length(args.context) > positions:
        return (
            f"--context {args.context}: {name} takes at most {positions} positions and the "
            f"cache holds {cache_length(args.context)} ({CACHE_MARGIN} more, rounded up to 64)"
        )
    have = memory_bytes(args.device)
    need, parts = memory_need(name, args)
    if need <= have:
        return ""
    what = f"--batch {max(args.batch)} --context {args.context}: {name}"
    if args.layers is not None:
        what += f" with --layers {args.layers}"
    reason = (
        f"{what} needs about {need / 2**30:.1f} GiB ({parts}), the {args.device} device has "
        f"{have / 2**30:.1f} GiB"
    )
    fits = [
        n
        for n in range(1, (args.layers or CONFIGS[name]["num_hidden_layers"]))
        if memory_need(name, argparse.Namespace(**{**vars(args), "layers": n}))[0] <= have
    ]
    return reason + (f"; --layers {fits[-1]} fits" if fits else "")


# ----------------------------------------------------------------------------- the model


def build_model(name: str, layers: int | None, device: str) -> nn.Module:
    """A random-weight BF16 causal LM of ``CONFIGS[name]`` (first ``layers`` decoder layers)."""
    import transformers

    fields = {k: v for k, v in CONFIGS[name].items() if k != "source"}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    config = transformers.AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    return model.eval().requires_grad_(False)


def swap_modules(model: nn.Module, modules: dict[str, nn.Module]) -> None:
    """Install ``modules`` (module name -> module) in ``model``."""
    for name, module in modules.items():
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, module)


def make_variants(model: nn.Module, fmt: str, lm_head: str) -> dict[str, dict[str, nn.Module]]:
    """variant -> {module name: module} to install with ``swap_modules``: the BF16 Linear
    modules and two FP4Linear sets quantized from them; the model is left BF16."""

    def chosen(name: str, _linear) -> bool:
        return name != "lm_head" or lm_head == "fp4"

    bf16 = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and chosen(n, m)}
    variants = {"bf16": bf16}
    for variant, activations in FP4_ACTIVATIONS.items():
        report = fp4_ops.quantize_model(model, chosen, fmt, activations)
        if report.skipped:
            raise ValueError(f"quantize_model skipped layers: {report.skipped}")
        variants[variant] = {n: model.get_submodule(n) for n in report.replaced}
        swap_modules(model, bf16)
    return variants


def tensor_bytes(modules) -> int:
    seen, total = set(), 0
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


class DecodeStep:
    """One decode step of ``model`` for ``batch`` rows at a device-side position, with static
    inputs (token ids, the position counter, the cache) so that a CUDA graph can replay it."""

    def __init__(self, model: nn.Module, batch: int, context: int, device: str):
        import transformers

        self.model, self.batch, self.context = model, batch, context
        length = cache_length(context)
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=length)
        for layer in self.cache.layers:
            if not isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                raise RuntimeError(
                    f"transformers {transformers.__version__}: its StaticCache layers keep no "
                    "cumulative_length tensor, the write position this benchmark sets back"
                )
        gen = torch.Generator().manual_seed(batch)
        vocab = model.config.vocab_size
        self.ids = torch.randint(0, vocab, (batch, 1), generator=gen).to(device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(length, device=device)
        # (transformers renamed the forward's past_key_values to cache after 5.17)
        forward = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in forward else "past_key_values"
        self.steps_left = 0
        self.reset()

    def reset(self, steps: int = CACHE_MARGIN) -> None:
        """Back to position ``context`` (the counter and every layer's write position), for at
        most ``steps`` steps."""
        if steps > CACHE_MARGIN:
            raise ValueError(f"{steps} steps pass the cache's {CACHE_MARGIN} spare positions")
        self.position.fill_(self.context)
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.context)
        self.steps_left = steps

    def __call__(self) -> torch.Tensor:
        mask = (self.slots <= self.position).expand(self.batch, 1, 1, -1)
        position_ids = self.position.expand(self.batch, 1)
        out = self.model(
            input_ids=self.ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_kwarg: self.cache},
        )
        self.position.add_(1)
        return out.logits


# ----------------------------------------------------------------------------- timing


def time_step_us(step: DecodeStep, mode: str) -> float:
    """Microseconds per decode step: "graph", "eager" (CUDA) or "cpu"."""
    if mode == "graph":
        step.reset(1 + GRAPH_STEPS * (GRAPH_REPLAYS + 1))
        return devtools.time_graph_us(step, GRAPH_STEPS, GRAPH_REPLAYS)
    if mode == "eager":
        step.reset(1 + EAGER_STEPS)
        return devtools.time_eager_us(step, EAGER_STEPS)
    step.reset(1 + CPU_STEPS)
    step()
    start = time.perf_counter()
    for _ in range(CPU_STEPS):
        step()
    return (time.perf_counter() - start) * 1e6 / CPU_STEPS


class _AttentionLabels:
    """record_function ranges around every attention module's forward (for the profile)."""

    def __init__(self, model: nn.Module):
        self.handles, self.open = [], []
        for module in model.modules():
            if type(module).__name__.endswith("Attention"):
                self.handles.append(module.register_forward_pre_hook(self._enter))
                self.handles.append(module.register_forward_hook(self._exit))

    def _enter(self, *_):
        label = torch.profiler.record_function(_ATTENTION_LABEL)
        label.__enter__()
        self.open.append(label)

    def _exit(self, *_):
        self.open.pop().__exit__(None, None, None)

    def remove(self):
        for handle in self.handles:
            handle.remove()


def category(name: str, in_attention: bool) -> str:
    """gemm, quantize, attention or other, for a kernel (or CPU operator) ``name``."""
    if _QUANTIZE.search(name):
        return "quantize"
    if _ATTENTION.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "attention" if in_attention else "other"


def _inside_attention(event) -> bool:
    while event is not None:
        if event.name == _ATTENTION_LABEL:
            return True
        event = event.cpu_parent
    return False


def split_times(events, device_events=None) -> dict:
    """Microseconds per category: each CPU operator's kernels (CPU run: its own time), then, on
    the GPU, every kernel no operator launched (ours go through TVM-FFI, outside the
    dispatcher) by its name alone."""
    from torch.autograd import DeviceType

    out = dict.fromkeys(("gemm", "attention", "quantize", "other"), 0.0)
    attached: collections.Counter = collections.Counter()
    for event in events:
        if event.device_type != DeviceType.CPU or event.name == _ATTENTION_LABEL:
            continue
        inside = _inside_attention(event)
        if device_events is None:  # (CPU: each operator's own time, its children's excluded)
            out[category(event.name, inside)] += event.self_cpu_time_total
            continue
        for kernel in event.kernels:
            out[category(kernel.name, inside)] += kernel.duration
            attached[kernel.name, kernel.duration] += 1
    for e in device_events or ():
        if e.is_user_annotation:  # (a record_function range drawn on the GPU timeline)
            continue
        duration = e.time_range.elapsed_us()
        if attached[e.name, duration] > 0:
            attached[e.name, duration] -= 1
        else:
            out[category(e.name, False)] += duration
    return out


def profile_step(step: DecodeStep, device: str) -> dict:
    """One eager step under torch.profiler: microseconds per category, and on the GPU the
    span from the first kernel's start to the last one's end and the idle time within."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step.reset(2)
    step()  # (warm)
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    labels = _AttentionLabels(step.model)
    try:
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
    finally:
        labels.remove()
    events = prof.events()
    device_events = [e for e in events if e.device_type == DeviceType.CUDA]
    out = split_times(events, device_events if cuda else None)
    result = {k: round(v, 1) for k, v in out.items()}
    if cuda:
        spans = sorted((e.time_range.start, e.time_range.end) for e in device_events)
        busy, reach = 0.0, None
        for start, end in spans:
            if reach is None or start >= reach:
                busy, reach = busy + end - start, end
            elif end > reach:
                busy, reach = busy + end - reach, end
        span = spans[-1][1] - spans[0][0] if spans else 0.0
        result.update(span=round(span, 1), idle=round(span - busy, 1))
    return result


def time_variants(model: nn.Module, variants: dict, step: DecodeStep, mode: str) -> dict:
    """Microseconds per step of each variant swapped into ``model``: eager, ``EAGER_ROUNDS``
    rounds over the variants in turn (a slow phase of the host falls on all of them alike) and
    the median of each; otherwise one round."""
    times = {variant: [] for variant in VARIANTS}
    for _ in range(EAGER_ROUNDS if mode == "eager" else 1):
        for variant in VARIANTS:
            swap_modules(model, variants[variant])
            times[variant].append(time_step_us(step, mode))
    return {variant: statistics.median(found) for variant, found in times.items()}


# ----------------------------------------------------------------------------- a run


def run_config(name: str, args, emit) -> dict:
    """Every batch size and variant of one configuration: its rows (``emit`` prints each as it
    is measured), profiles and sizes."""
    gc.collect()  # (the previous configuration's model)
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    model = build_model(name, args.layers, args.device)
    built = time.perf_counter()
    variants = make_variants(model, args.format, args.lm_head)
    quantized = time.perf_counter()
    rest = [m for n, m in model.named_modules() if n not in variants["bf16"]]
    rest_bytes = tensor_bytes(m for m in rest if not list(m.children()))
    sizes = {v: rest_bytes + tensor_bytes(mods.values()) for v, mods in variants.items()}
    layers = model.config.num_hidden_layers
    result = {"config": name, "layers": layers, "bytes": sizes, "rows": [], "profiles": []}
    result["setup_s"] = {"build": built - started, "quantize": quantized - built}
    modes = ["cpu"] if args.device == "cpu" else ["graph"] + (["eager"] if args.eager else [])
    with torch.inference_mode():
        for batch in args.batch:
            step = DecodeStep(model, batch, args.context, args.device)
            for mode in modes:
                row = {"config": name, "layers": layers, "batch": batch, "mode": mode}
                for variant, us in time_variants(model, variants, step, mode).items():
                    row[f"{variant}_us"] = us
                result["rows"].append(row)
                emit(row)
            if args.profile:
                for variant in VARIANTS:
                    swap_modules(model, variants[variant])
                    found = profile_step(step, args.device)
                    found.update(config=name, batch=batch, variant=variant)
                    result["profiles"].append(found)
            del step
            if args.device == "cuda":
                torch.cuda.empty_cache()
    swap_modules(model, variants["bf16"])
    if args.device == "cuda":
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return result


def header_lines(env: dict, args) -> list[str]:
    where = env["gpu"] if args.device == "cuda" else "CPU"
    return [
        f"decode step, {where}, {env['date']}; torch {env['torch']}, transformers "
        f"{env['transformers']}, CUDA {env['cuda']}",
        f"{args.format} FP4Linear via quantize_model (lm_head {args.lm_head}); static KV cache, "
        f"position {args.context}; random weights",
        f"{'config':<14} {'layers':>6} {'batch':>5} {'timing':<6} | {'bf16 ms':>8} {'tok/s':>9} | "
        f"{'w4a16 ms':>8} {'tok/s':>9} {'x bf16':>6} | {'w4a4 ms':>8} {'tok/s':>9} {'x bf16':>6}",
    ]


def format_row(row: dict) -> str:
    cells = []
    for variant in VARIANTS:
        us = row[f"{variant}_us"]
        cell = f"{us / 1e3:8.3f} {row['batch'] / us * 1e6:9.1f}"
        if variant != "bf16":
            cell += f" {row['bf16_us'] / us:5.2f}x"
        cells.append(cell)
    timing = {"graph": "graph", "eager": "eager", "cpu": "cpu"}[row["mode"]]
    lead = f"{row['config']:<14} {row['layers']:>6} {row['batch']:>5} {timing:<6}"
    return " | ".join([lead, *cells])


def profile_lines(profiles: list[dict]) -> list[str]:
    if not profiles:
        return []
    gpu = "span" in profiles[0]
    what = "its kernels' times" if gpu else "its operators' own CPU times"
    head = f"{'config':<14} {'batch':>5} {'variant':<7} | {'gemm':>8} {'attention':>9} "
    head += f"{'quantize':>8} {'other':>8} {'total':>8}" + (
        f" | {'span':>8} {'idle':>8}" if gpu else ""
    )
    lines = [f"profile of one eager decode step, us ({what}):", head]
    for p in profiles:
        total = p["gemm"] + p["attention"] + p["quantize"] + p["other"]
        line = f"{p['config']:<14} {p['batch']:>5} {p['variant']:<7} | {p['gemm']:8.1f} "
        line += f"{p['attention']:9.1f} {p['quantize']:8.1f} {p['other']:8.1f} {total:8.1f}"
        if gpu:
            line += f" | {p['span']:8.1f} {p['idle']:8.1f}"
        lines.append(line)
    if gpu:
        lines.append("span: first kernel start to last kernel end; idle: no kernel running in it")
    return lines


def environment(device: str) -> dict:
    import transformers

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        env.update(gpu=torch.cuda.get_device_name(), capability=f"sm_{major}{minor}")
    return env


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        env = environment(args.device)
    except ImportError:
        print("error: benchmarks.model needs transformers (pip install -e .[hf])", file=sys.stderr)
        return 2
    for line in header_lines(env, args):
        print(line, flush=True)
    results = []
    out = args.out
    if out is None and args.device == "cuda":
        label = cli.gpu_label(env["gpu"])
        out = os.path.join(
            os.path.dirname(os.path.dirname(__file__)), "results", f"{label}_model.json"
        )
    for name in args.config:
        result = run_config(name, args, lambda row: print(format_row(row), flush=True))
        results.append(result)
        sizes = ", ".join(f"{v} {b / 1e6:.1f} MB" for v, b in result["bytes"].items())
        setup = result["setup_s"]
        line = f"  {name}: weights {sizes}; built in {setup['build']:.1f} s, quantized in "
        line += f"{setup['quantize']:.1f} s"
        if "max_memory_allocated" in result:
            line += f"; peak GPU memory {result['max_memory_allocated'] / 1e9:.1f} GB"
        print(line, flush=True)
        if out is not None:  # (after each configuration: a run cut short keeps what it measured)
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            record = {"environment": env, "arguments": vars(args), "results": results}
            record["configs"] = {n: CONFIGS[n] for n in args.config}
            with open(out, "w") as f:
                json.dump(record, f, indent=1)
    for line in profile_lines([p for r in results for p in r["profiles"]]):
        print(line)
    steps = (
        "cpu: eager steps, time.perf_counter"
        if args.device == "cpu"
        else (
            f"graph: {GRAPH_STEPS} steps per CUDA graph, {GRAPH_REPLAYS} replays (mean); eager: "
            f"{EAGER_STEPS} steps, median of {EAGER_ROUNDS} rounds over the variants in turn"
        )
    )
    print(f"ms: per decode step ({steps}); tok/s: batch / step time")
    print("attention: transformers' SDPA with a mask, which repeats K / V for every query head")
    if out is not None:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
