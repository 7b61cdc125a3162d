# SPDX-License-Identifier: BSD-3-Clause
"""Decode as a model runs it: one forward pass of a stack of distinct layers with SiLU between
them, in a CUDA graph, for our W4A16 and W4A4 layers, humming-kernels' W4A16 and cuBLAS BF16,
all on the same ModelOpt-convention NVFP4 weights.

    python -m benchmarks.stack                      # both stacks, M = 1, 16, 64, 128, 4096
    python -m benchmarks.stack --stack llama70b_mlp --m 1,16 --layers 8 --reps 10
    python -m benchmarks.stack --json results/h200_stack.json

Stacks (``STACKS``, (N, K) patterns cycled over ``--layers``): ``8192x8192``, 8 distinct
[8192, 8192] layers; ``llama70b_mlp``, Llama-70B's MLP shapes alternating, 28672 x 8192 then
8192 x 28672. Every layer's weights are its own and together they exceed the L2 many times, so
each layer reads its weights from HBM, and no GEMM directly follows another: a single GEMM's
back-to-back benchmark lets each call overlap the previous one (programmatic dependent launch),
which a model's layers do not.

Weights: randn(N, K) * GAIN / sqrt(K), quantized once by ``fp4_ops.quantize`` and kept as a
ModelOpt NVFP4 checkpoint holds them (``weight`` uint8 [N, K/2], ``weight_scale`` E4M3
[N, K/16], ``weight_scale_2`` the decoding global scale). Contestants made from those tensors:
    ours_w4a16     ``FP4Linear(FP4Tensor.from_modelopt(...), activations="bf16")``: BF16
                   activations, weights prepacked once for the Hopper kernel
    ours_w4a4      ``FP4Linear(..., activations="dynamic")``: each layer quantizes its
                   activations (dynamic global scale) before its GEMM, both timed
    ours_w4a4_static  ``activations="static"``: the same with a static global scale, as a
                   ModelOpt checkpoint's ``input_scale`` gives one: the layer's input amax over
                   a calibration batch through the float64 stack (CALIBRATION_TOKENS rows drawn
                   apart from the timed ones) / (448 x 6)
    humming_w4a16  humming-kernels' HummingLayer through its ModelOpt NVFP4 loader
                   (``benchmarks.sm90.humming_layer``); optional: absent, not measured
    cublas_bf16    ``F.linear`` on the weights dequantized to BF16 beforehand
Timing (``fp4_ops.devtools.time_graph_us``): FORWARDS_PER_GRAPH forward passes captured in one
CUDA graph (the first call, compiles included, runs before the capture), replayed ``--reps``
times; the mean per forward pass. The same stack with only its SiLUs (same shapes, no GEMM) is
timed the same way, and
    per-layer time = (stack time - SiLU-only stack time) / layers.
The same stack with a bare read in place of each GEMM (``bare_read_layers``: one kernel
reading as many bytes as the FP4 layer's weights, its own) is timed the same way, once per
stack (it reads no tokens: one row of SiLU inputs, and that SiLU-only stack subtracted): not a
GEMM and nothing to check, it shows what one kernel streaming a layer's bytes takes between
SiLUs, the reference point of the bandwidth targets.
The copy bandwidth is measured in the same run (a COPY_BYTES device-to-device copy, bytes read +
written / time, run eagerly: captured in a graph, a copy may run on a slower copy engine), and
    % of copy bandwidth = weight bytes per layer / per-layer time / copy bandwidth,
with weight bytes the FP4 data + E4M3 block scales (N K / 2 + N K / 16) for the FP4
contestants, 2 N K for cuBLAS BF16 (a layer's mean over the stack). Ratios: humming / ours
W4A16 and cuBLAS / ours W4A16 (speed-ups of ours), ours W4A4 (dynamic, static) / ours W4A16.

Correctness, once per contestant and M before any timing (``check_stack``): the stack runs
eagerly through the same code as the timed forward pass, keeping each layer's input and output.
Each layer's output is held against the float64 product of the same input (W4A4: the input
quantized by ``reference.quantize_nvfp4``, the oracle, with the layer's static scale if it has
one) and the exact dequantized weights (e2m1 x block scale, the global scales applied to the
sum). Tolerance, relative Frobenius norm:
one BF16 unit roundoff (2^-8) per rounding of the layer's result to BF16 (ROUNDINGS: ours
round their fp32 result once; humming sums partials in BF16, then rounds; cuBLAS holds BF16
weights, may reduce split-K partials in BF16 as torch allows by default, then rounds), plus
gamma_K (fp32) x ||sum of |products| ||. The stack's output is then held against the float64
stack on the same x (SiLU in float64): tolerance the layers' tolerances summed plus 2^-8 per
SiLU, as rounding errors that each layer passes on at most unamplified add up. W4A4's
stack output is not held to that (its activation quantization is a discontinuous function
of its input); its stack error is recorded. A contestant that fails gets no time: the table
says "check failed". (Elementwise bounds propagated through eight layers via |W| would be
vacuous; a normwise bound per layer on the stack's own activations is tight and exact.)

Output: a markdown table (per stack and M: us per layer, % of copy bandwidth, speed-ups) and,
with ``--json PATH``, every figure measured with the GPU, versions and date, rewritten after
each stack. Only measured figures are printed; what was not measured says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback
from importlib import metadata
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import fp4_ops
import reference
from benchmarks import args as cli
from benchmarks import linear as bench_linear
from benchmarks import sm90 as bench_sm90
from fp4_ops.devtools import time_eager_us, time_graph_us

#: (N, K) patterns, cycled over the layers
STACKS = {
    "8192x8192": [(8192, 8192)],
    "llama70b_mlp": [(28672, 8192), (8192, 28672)],
}
#: decode token counts and a 4096-token prefill
M_DEFAULT = (1, 16, 64, 128, 4096)
LAYERS_DEFAULT = 8
REPS_DEFAULT = 10
FORWARDS_PER_GRAPH = 5
COPY_BYTES = 1 << 30
#: weights: randn * GAIN / sqrt(K) keeps the activations' size about level through the SiLUs
GAIN = 1.7
CONTESTANTS = ("ours_w4a16", "ours_w4a4", "ours_w4a4_static", "humming_w4a16", "cublas_bf16")
#: the contestants that quantize their activations, and how (FP4Linear's ``activations``)
W4A4_MODES = {"ours_w4a4": "dynamic", "ours_w4a4_static": "static"}
#: roundings to BF16 of a layer's result (see the module docstring)
ROUNDINGS = {"ours_w4a16": 1, "humming_w4a16": 2, "cublas_bf16": 3} | dict.fromkeys(W4A4_MODES, 1)
#: the static input scales' calibration batch: rows, and the seed of their draw
CALIBRATION_TOKENS = 128
CALIBRATION_SEED = 7
BF16_U = 2.0**-8
FP32_U = 2.0**-24
NOT_MEASURED = "not measured"
HUMMING_ABSENT = "humming: not installed, not measured"


# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser("benchmarks.stack", __doc__)
    p.add_argument("--m", default=",".join(map(str, M_DEFAULT)), help="tokens, e.g. 1,16,64,128")
    p.add_argument("--stack", default=",".join(STACKS), help=f"of {', '.join(STACKS)}")
    p.add_argument("--layers", default=str(LAYERS_DEFAULT), help="distinct layers in the stack")
    p.add_argument("--reps", default=str(REPS_DEFAULT), help="CUDA-graph replays timed")
    p.add_argument(
        "--contestants", default=",".join(CONTESTANTS), help=f"of {', '.join(CONTESTANTS)}"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write every figure here")
    args = p.parse_args(argv)
    args.json = cli.output_path(p, "--json", args.json)
    args.m = cli.positive_ints(p, "--m", args.m, "1,16,64,128")
    args.stack = cli.names(p, "--stack", args.stack, list(STACKS), ordered=False)
    args.contestants = cli.names(p, "--contestants", args.contestants, CONTESTANTS, True)
    args.layers = cli.positive_int(p, "--layers", args.layers)
    args.reps = cli.positive_int(p, "--reps", args.reps)
    return args


def stack_shapes(name: str, layers: int) -> list[tuple[int, int]]:
    """(N, K) of each layer: the stack's pattern cycled; each layer's K is the N before it."""
    pattern = STACKS[name]
    return [pattern[i % len(pattern)] for i in range(layers)]


# ----------------------------------------------------------------------------- arithmetic


def per_layer_us(stack_us: float, silu_us: float, layers: int) -> float:
    """A layer's share of the stack's time without the SiLUs."""
    return (stack_us - silu_us) / layers


def weight_bytes(shapes, contestant: str) -> float:
    """Weight bytes a layer reads, the mean over the stack: FP4 data and E4M3 block scales, or
    BF16 for cuBLAS."""
    if contestant == "cublas_bf16":
        sizes = [2 * n * k for n, k in shapes]
    else:
        sizes = [n * k // 2 + n * k // 16 for n, k in shapes]
    return sum(sizes) / len(sizes)


def pct_of_copy_bandwidth(bytes_per_layer: float, layer_us: float, copy_bps: float) -> float:
    return 100.0 * bytes_per_layer / (layer_us * 1e-6) / copy_bps


#: ratios' keys and the peers they compare ours W4A16 with
PEERS = (("humming_vs_ours_w4a16", "humming_w4a16"), ("cublas_vs_ours_w4a16", "cublas_bf16"))


#: ratios' keys and the W4A4 contestants they hold against ours W4A16
W4A4_RATIOS = (("w4a4_over_w4a16", "ours_w4a4"), ("w4a4_static_over_w4a16", "ours_w4a4_static"))


def ratios(times: dict, peers=PEERS) -> dict:
    """Speed-ups of ours W4A16 (peer time / ours) and W4A4 / W4A16; None where not measured."""
    ours = times.get("ours_w4a16")
    out = {}
    for key, peer in peers:
        theirs = times.get(peer)
        out[key] = theirs / ours if ours and theirs else None
    for key, name in W4A4_RATIOS:
        w4a4 = times.get(name)
        out[key] = w4a4 / ours if ours and w4a4 else None
    return out


def copy_bandwidth(device, nbytes: int = COPY_BYTES) -> float:
    """Bytes read + written per second by a device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = time_eager_us(lambda: dst.copy_(src), 10)
    return 2 * nbytes / (us * 1e-6)


# ----------------------------------------------------------------------------- the stacks


def modelopt_weights(shapes, device, seed: int = 0) -> list[dict]:
    """Each layer's weights as a ModelOpt NVFP4 checkpoint holds them."""
    gen = torch.Generator(device=device).manual_seed(seed)
    layers = []
    for n, k in shapes:
        w = torch.randn(n, k, device=device, generator=gen) * (GAIN / math.sqrt(k))
        q = fp4_ops.quantize(w.to(torch.bfloat16), "nvfp4")
        layers.append(
            {
                "weight": q.data.view(torch.uint8),
                "weight_scale": q.plain_scales(),
                "weight_scale_2": q.global_scale,
            }
        )
        del w
    return layers


def fp4_weight(t: dict) -> fp4_ops.FP4Tensor:
    return fp4_ops.FP4Tensor.from_modelopt(t["weight"], t["weight_scale"], t["weight_scale_2"])


def build_layers(contestant: str, weights: list[dict], humming_cls=None, input_scales=None):
    """The stack's layers (callables, BF16 [M, K] -> [M, N]) of one contestant;
    ``input_scales``: ``calibrated_input_scales``' (ours_w4a4_static only)."""
    if contestant == "ours_w4a16":
        return [fp4_ops.FP4Linear(fp4_weight(t), None, "bf16") for t in weights]
    if contestant in W4A4_MODES:
        mode = W4A4_MODES[contestant]
        if mode == "static" and (input_scales is None or len(input_scales) != len(weights)):
            raise ValueError(f"{contestant} needs one calibrated input scale per layer")
        scales = input_scales if mode == "static" else [None] * len(weights)
        pairs = zip(weights, scales, strict=True)
        return [fp4_ops.FP4Linear(fp4_weight(t), None, mode, s) for t, s in pairs]
    if contestant == "humming_w4a16":
        return [bench_sm90.humming_layer(humming_cls, as_operands(t)) for t in weights]
    if contestant == "cublas_bf16":
        dense = [fp4_weight(t).dequantize(torch.bfloat16) for t in weights]
        return [lambda h, w=w: F.linear(h, w) for w in dense]
    raise ValueError(f"unknown contestant {contestant!r}")


def as_operands(t: dict) -> SimpleNamespace:
    """ModelOpt tensors in the form ``benchmarks.sm90.humming_layer`` takes (one batch)."""
    return SimpleNamespace(
        b=t["weight"].unsqueeze(0),
        sfb=t["weight_scale"].unsqueeze(0),
        sf_vec_size=16,
        global_scale_b=t["weight_scale_2"],
    )


def forward(layers, x, trace: list | None = None):
    """One forward pass: each layer, SiLU between layers; ``trace`` gets (input, output) of
    each layer (the check's eager run; the timed run passes None)."""
    h = x
    for i, layer in enumerate(layers):
        y = layer(h)
        if trace is not None:
            trace.append((h, y))
        h = F.silu(y) if i + 1 < len(layers) else y
    return h


def bare_read_layers(shapes, device) -> list:
    """Per layer, one kernel reading as many bytes as the FP4 layer's weights (data and block
    scales: N K / 2 + N K / 16) from a buffer of its own: a sum over each of N rows of them as
    BF16, [1, N] whatever its input."""
    layers = []
    for n, k in shapes:
        row_bytes = k // 2 + k // 16
        if row_bytes % 2:
            raise ValueError(f"K = {k}: a row's FP4 bytes ({row_bytes}) are not BF16 values")
        buf = torch.rand(n, row_bytes // 2, device=device).to(torch.bfloat16)
        layers.append(lambda h, buf=buf: buf.sum(dim=1).unsqueeze(0))
    return layers


def silu_inputs(m: int, shapes, device) -> list:
    """BF16 [M, N] of every layer but the last: what the stack's SiLUs see."""
    return [torch.randn(m, n, device=device).to(torch.bfloat16) for n, _ in shapes[:-1]]


def silu_only(buffers) -> None:
    """The stack's SiLUs alone, on tensors of the shapes they see in the stack."""
    for b in buffers:
        F.silu(b)


def activations(m: int, k: int, device) -> torch.Tensor:
    """BF16 x [M, K], standard normal, drawn on the CPU (the same on every device)."""
    gen = torch.Generator().manual_seed(1000 + m)
    return torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)


# ----------------------------------------------------------------------------- correctness


def exact_weight(t: dict) -> torch.Tensor:
    """e2m1 x block scale of a layer's weights, float64 [N, K] (exact; global scale apart)."""
    return reference.dequantize_fp4(t["weight"], t["weight_scale"], 16).double()


def layer_reference(a, t: dict, quantize_input: bool, input_scale=None):
    """(float64 output, float64 sum of |products|) of one layer on its input a, quantized
    first if ``quantize_input`` (with the static ``input_scale``, or a dynamic one)."""
    scale = float(t["weight_scale_2"])
    if quantize_input:
        data, scales, gs = reference.quantize_nvfp4(a, input_scale)
        a64 = reference.dequantize_fp4(data, scales, 16).double()
        scale *= float(gs)
    else:
        a64 = a.double()
    w64 = exact_weight(t)
    ref = (a64 @ w64.t()) * scale
    abs_sum = (a64.abs() @ w64.abs().t()) * scale
    return ref, abs_sum


def rel_err(y, ref) -> float:
    ref = ref.double()
    return float((y.double() - ref).norm() / ref.norm())


def layer_tolerance(contestant: str, k: int, ref, abs_sum) -> float:
    """ROUNDINGS BF16 unit roundoffs plus the fp32 sum's gamma_K, relative (Frobenius)."""
    gamma = k * FP32_U / (1 - k * FP32_U)
    return ROUNDINGS[contestant] * BF16_U + gamma * float(abs_sum.norm() / ref.norm())


def reference_stack(weights: list[dict], x, inputs: list | None = None) -> torch.Tensor:
    """The stack in float64 on the exact dequantized weights, x as given (BF16); ``inputs``
    gets each layer's input."""
    h = x.double()
    for i, t in enumerate(weights):
        if inputs is not None:
            inputs.append(h)
        h = (h @ exact_weight(t).t()) * float(t["weight_scale_2"])
        if i + 1 < len(weights):
            h = F.silu(h)
    return h


def calibrated_input_scales(weights: list[dict], device) -> list[torch.Tensor]:
    """Each layer's static input scale as a calibration gives one (ModelOpt's ``input_scale``):
    the amax of the layer's input over CALIBRATION_TOKENS rows of the float64 stack, / (448 x
    6); float32 0-d tensors on ``device``."""
    gen = torch.Generator().manual_seed(CALIBRATION_SEED)
    k = 2 * weights[0]["weight"].shape[1]
    x = torch.randn(CALIBRATION_TOKENS, k, generator=gen).to(torch.bfloat16).to(device)
    inputs: list = []
    reference_stack(weights, x, inputs)
    return [(h.abs().amax() / (448.0 * 6.0)).float() for h in inputs]


def check_stack(contestant: str, layers, weights: list[dict], x, stack_ref, input_scales=None):
    """Run the stack eagerly and hold each layer and the output to their tolerances
    (``input_scales``: ours_w4a4_static's)."""
    trace: list = []
    with torch.no_grad():
        out = forward(layers, x, trace)
    quantized = contestant in W4A4_MODES
    scales = input_scales if contestant == "ours_w4a4_static" else [None] * len(weights)
    errs, tols = [], []
    for (a, y), t, s in zip(trace, weights, scales, strict=True):
        ref, abs_sum = layer_reference(a, t, quantized, s)
        errs.append(rel_err(y, ref))
        tols.append(layer_tolerance(contestant, a.shape[-1], ref, abs_sum))
        del ref, abs_sum
    stack_err = rel_err(out, stack_ref)
    stack_tol = None if quantized else sum(tols) + (len(tols) - 1) * BF16_U
    ok = all(e <= t for e, t in zip(errs, tols, strict=True))
    ok = ok and (stack_tol is None or stack_err <= stack_tol)
    return {
        "ok": bool(ok),
        "layer_rel_err": errs,
        "layer_tol": tols,
        "stack_rel_err": stack_err,
        "stack_tol": stack_tol,
    }


# ----------------------------------------------------------------------------- measuring


def measure_stack(name, shapes, ms, device, run: SimpleNamespace, notes: list) -> list[dict]:
    """Rows (one per M) of one stack: every contestant checked, then timed. ``run``: reps,
    copy_bps, contestants, humming_cls (None: absent), timer(fn, forwards, reps) -> us per
    call, progress(text) (one line per step, so that a run cut short shows where)."""
    timer, reps, humming_cls = run.timer, run.reps, run.humming_cls
    weights = modelopt_weights(shapes, device)
    rows = {m: new_row(name, shapes, m) for m in ms}
    for m in ms:
        buffers = silu_inputs(m, shapes, device)
        rows[m]["silu_only_us"] = timer(lambda b=buffers: silu_only(b), FORWARDS_PER_GRAPH, reps)
    try:
        bare_read = time_bare_read(shapes, device, timer, reps)
    except Exception as err:  # (its capture or its buffers failed: reported, the GEMMs go on)
        note(notes, f"{name} bare read: not measured, it raised {describe(err)}")
        bare_read = None
    for m in ms:
        rows[m]["bare_read"] = None if bare_read is None else dict(bare_read)
    refs = {m: reference_stack(weights, activations(m, shapes[0][1], device)) for m in ms}
    static = "ours_w4a4_static" in run.contestants
    input_scales = calibrated_input_scales(weights, device) if static else None
    for contestant in run.contestants:
        if contestant == "humming_w4a16" and humming_cls is None:
            continue
        run.progress(f"{name} {contestant}: building the layers")
        try:
            layers = build_layers(contestant, weights, humming_cls, input_scales)
        except Exception as err:  # (a peer or a library that refuses these shapes)
            note(notes, f"{name} {contestant}: not measured, building it raised {describe(err)}")
            continue
        for m in ms:
            run.progress(f"{name} {contestant} M={m}: checking, then timing")
            result = measure_one(
                contestant, layers, weights, refs[m], shapes, reps, timer, m, input_scales
            )
            rows[m]["contestants"][contestant] = result
            why = failure(result)
            if why:
                note(notes, f"{name} M={m} {contestant}: {why}")
        del layers
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for row in rows.values():
        finish_row(row, run.copy_bps)
    return list(rows.values())


def time_bare_read(shapes, device, timer, reps) -> dict:
    """The bare-read stack's figures: ``new_result``'s, with its layers and the one-row
    SiLU-only time that its per-layer time subtracts."""
    buffers = silu_inputs(1, shapes, device)
    silu_us = timer(lambda: silu_only(buffers), FORWARDS_PER_GRAPH, reps)
    reads = bare_read_layers(shapes, device)
    x = activations(1, shapes[0][1], device)
    result = new_result(
        shapes, "ours_w4a16", timer(lambda: forward(reads, x), FORWARDS_PER_GRAPH, reps)
    )
    result.update(silu_only_us=silu_us, layers=len(shapes))
    return result


def measure_one(contestant, layers, weights, stack_ref, shapes, reps, timer, m, input_scales=None):
    """Check one contestant at one M, then time it (no time where the check fails)."""
    x = activations(m, shapes[0][1], stack_ref.device)
    result = new_result(shapes, contestant)
    if contestant == "ours_w4a4_static":
        result["input_scales"] = [float(s) for s in input_scales]
    try:
        result["check"] = check_stack(contestant, layers, weights, x, stack_ref, input_scales)
        if result["check"]["ok"]:
            result["stack_us"] = timer(lambda: forward(layers, x), FORWARDS_PER_GRAPH, reps)
    except Exception as err:  # (its first call or its capture raised: reported, not timed)
        result["error"] = describe(err)
    return result


def new_result(shapes, contestant: str, stack_us: float | None = None) -> dict:
    """A contestant's figures (those finish_row derives still None) for the stack's shapes."""
    result = {"stack_us": stack_us, "per_layer_us": None, "pct_copy_bandwidth": None}
    result["weight_bytes_per_layer"] = weight_bytes(shapes, contestant)
    return result


def failure(result: dict) -> str | None:
    """Why a contestant has no time (its worst layer or stack error), or None."""
    if "error" in result:
        return f"not measured, it raised {result['error']}"
    check = result.get("check")
    if check is None or check["ok"]:
        return None
    errs, tols = check["layer_rel_err"], check["layer_tol"]
    worst = max(range(len(tols)), key=lambda i: errs[i] / tols[i])
    err, tol = errs[worst], tols[worst]
    stack = f"stack output relative error {check['stack_rel_err']:.3g}"
    if err <= tol:  # (every layer passed: the stack output failed)
        return f"check failed, not timed: {stack} (tolerance {check['stack_tol']:.3g})"
    text = f"check failed, not timed: layer {worst} relative error {err:.3g} (tolerance {tol:.3g})"
    if check["stack_tol"] is not None:
        text += f", {stack} ({check['stack_tol']:.3g})"
    return text


def new_row(name, shapes, m) -> dict:
    shape_list = [list(s) for s in shapes]
    row = {"stack": name, "m": m, "layers": len(shapes), "shapes": shape_list}
    row.update(silu_only_us=None, bare_read=None, contestants={})
    return row


def finish_row(row: dict, copy_bps: float | None = None) -> None:
    """Per-layer times, % of copy bandwidth and ratios from the row's measured times."""
    times = {}
    for name, r in row["contestants"].items():
        finish_result(row, r, copy_bps)
        if r.get("per_layer_us") is not None:
            times[name] = r["per_layer_us"]
    if row.get("bare_read") is not None:
        finish_result(row["bare_read"], row["bare_read"], copy_bps)
    row["ratios"] = ratios(times)


def finish_result(base: dict, r: dict, copy_bps: float | None) -> None:
    """One result's per-layer time (less ``base``'s SiLU-only time) and % of copy bandwidth,
    where its stack was timed."""
    if r.get("stack_us") is None or base.get("silu_only_us") is None:
        r.setdefault("per_layer_us", None)
        return
    r["per_layer_us"] = per_layer_us(r["stack_us"], base["silu_only_us"], base["layers"])
    if copy_bps and r["per_layer_us"] > 0:
        r["pct_copy_bandwidth"] = pct_of_copy_bandwidth(
            r["weight_bytes_per_layer"], r["per_layer_us"], copy_bps
        )


def describe(err: Exception) -> str:
    """The error's type and first line, or (a bare assert) where it was raised and its source."""
    text = str(err).splitlines()[0][:160] if str(err) else ""
    if not text and err.__traceback__ is not None:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = "/".join(frame.filename.split(os.sep)[-2:])
        text = f"at {where}:{frame.lineno} ({(frame.line or '').strip()[:120]})"
    return f"{type(err).__name__}: {text}"


def note(notes: list, text: str) -> None:
    if text not in notes:
        notes.append(text)


# ----------------------------------------------------------------------------- output

STACK_LABELS = {
    "8192x8192": "8192 x 8192",
    "llama70b_mlp": "Llama-70B MLP (28672 x 8192, 8192 x 28672)",
}
HEAD = (
    "| stack | M | ours W4A16 (us / layer) | % of copy bandwidth | bare read of the same bytes "
    "(us / layer, % of copy bandwidth) | humming W4A16 (us / layer, "
    "ours' speed-up) | cuBLAS BF16 (us / layer, ours' speed-up) | ours W4A4 incl. activation "
    "quantization (us / layer) | W4A4 / W4A16 | ours W4A4, static input scale (us / layer) | "
    "W4A4 static / W4A16 |"
)


def cell(row: dict, contestant: str, ratio_key: str | None = None) -> str:
    """A contestant's per-layer time (and a speed-up), "check failed", or "not measured"."""
    r = row["contestants"].get(contestant)
    if r is None or "check" not in r:
        return NOT_MEASURED
    if not r["check"]["ok"]:
        return "check failed"
    if r["per_layer_us"] is None:
        return NOT_MEASURED
    text = f"{r['per_layer_us']:.1f}"
    ratio = row["ratios"].get(ratio_key) if ratio_key else None
    return text if ratio is None else f"{text} ({ratio:.2f}x)"


def bare_read_cell(r: dict | None) -> str:
    if r is None or r["per_layer_us"] is None:
        return NOT_MEASURED
    pct = r["pct_copy_bandwidth"]
    return f"{r['per_layer_us']:.1f}" + ("" if pct is None else f" ({pct:.0f}%)")


def format_row(row: dict) -> str:
    ours = row["contestants"].get("ours_w4a16") or {}
    pct = ours.get("pct_copy_bandwidth")
    w4a4, static = (row["ratios"].get(key) for key, _ in W4A4_RATIOS)
    cells = [
        STACK_LABELS.get(row["stack"], row["stack"]),
        str(row["m"]),
        cell(row, "ours_w4a16"),
        NOT_MEASURED if pct is None else f"{pct:.0f}%",
        bare_read_cell(row.get("bare_read")),
        cell(row, "humming_w4a16", "humming_vs_ours_w4a16"),
        cell(row, "cublas_bf16", "cublas_vs_ours_w4a16"),
        cell(row, "ours_w4a4"),
        NOT_MEASURED if w4a4 is None else f"{w4a4:.2f}",
        cell(row, "ours_w4a4_static"),
        NOT_MEASURED if static is None else f"{static:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def header_lines(env: dict, copy_bps: float | None, args) -> list[str]:
    bandwidth = NOT_MEASURED if copy_bps is None else f"{copy_bps / 1e12:.2f} TB/s"
    return [
        f"{env['gpu']}, {env['date']}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"nvidia-cutlass-dsl {env['nvidia-cutlass-dsl']}, humming-kernels "
        f"{env['humming-kernels'] or 'not installed'}",
        f"{args.layers} distinct layers, SiLU between them, one forward pass per call, "
        f"{FORWARDS_PER_GRAPH} per CUDA graph, {args.reps} replays; copy bandwidth {bandwidth}",
        "",
        HEAD,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]


def footer_lines(notes: list) -> list[str]:
    return [
        "",
        "per-layer time = (stack time - the same stack's SiLU-only time) / layers; % of copy "
        "bandwidth: FP4 data + block scales",
        "per layer / per-layer time / copy bandwidth; speed-up = peer time / ours W4A16; every "
        "GEMM's time follows a passed check; the bare read is one kernel reading as many bytes "
        "as the FP4 layer (a row sum), not a GEMM",
        *(f"note: {n}" for n in notes),
    ]


def environment(device) -> dict:
    """Date, GPU and versions, recorded with the results."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": None,
        "capability": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "nvidia-cutlass-dsl": dist_version("nvidia-cutlass-dsl"),
        "humming-kernels": dist_version("humming-kernels"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}")
        env["driver"] = bench_linear.driver_version()
    return env


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def write_json(path: str, env: dict, args, copy_bps, notes: list, rows: list) -> None:
    settings = {
        "stacks": {name: STACKS[name] for name in args.stack},
        "m": args.m,
        "layers": args.layers,
        "reps": args.reps,
        "forwards_per_graph": FORWARDS_PER_GRAPH,
        "copy_bytes": COPY_BYTES,
        "roundings": ROUNDINGS,
        "calibration": {"tokens": CALIBRATION_TOKENS, "seed": CALIBRATION_SEED},
    }
    data = {"environment": env, "settings": settings, "copy_bandwidth_Bps": copy_bps}
    data.update(notes=notes, rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.stack times CUDA graphs: it needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    env = environment(device)
    notes: list[str] = []
    humming_cls, why = bench_sm90.load_humming()
    if humming_cls is None:
        print(HUMMING_ABSENT, flush=True)
        notes.append(f"{HUMMING_ABSENT} ({why})")
    start = time.perf_counter()
    copy_bps = copy_bandwidth(device)
    run = SimpleNamespace(reps=args.reps, copy_bps=copy_bps, humming_cls=humming_cls)
    run.contestants, run.timer = args.contestants, time_graph_us
    run.progress = lambda text: print(
        f"[{time.perf_counter() - start:5.0f} s] {text}", file=sys.stderr, flush=True
    )
    print("\n".join(header_lines(env, copy_bps, args)), flush=True)
    rows: list[dict] = []
    for name in args.stack:
        shapes = stack_shapes(name, args.layers)
        stack_rows = measure_stack(name, shapes, args.m, device, run, notes)
        for row in stack_rows:
            print(format_row(row), flush=True)
        rows += stack_rows
        if args.json:  # (after each stack: a run cut short keeps what it measured)
            write_json(args.json, env, args, copy_bps, notes, rows)
    print("\n".join(footer_lines(notes)))
    print(f"run: {time.perf_counter() - start:.0f} s")
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
