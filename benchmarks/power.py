# SPDX-License-Identifier: BSD-3-Clause
"""SM clock and power under sustained load: ``benchmarks.stack``'s forward passes, each replayed
from a CUDA graph for a few seconds, as a server's decode or prefill loop runs them, while
``nvidia-smi`` samples the SM clock, the power draw and the clock event reasons.

    python -m benchmarks.power                     # llama70b_mlp at M = 1, 16, 128, 4096
    python -m benchmarks.power --stack 8192x8192 --m 1,16 --seconds 3 --json power.json

Stacks, weights and contestants are ``benchmarks.stack``'s (``--contestants`` of ours_w4a16,
ours_w4a4, cublas_bf16, bare_read: its bare read of each layer's FP4 bytes); each contestant's
stack is checked against the float64 stack first, as there, and one that fails is not run.
Each (stack, M, contestant): FORWARDS_PER_GRAPH forward passes captured in one CUDA graph,
replayed back to back for ``--seconds``, the host synchronizing every REPLAYS_PER_SYNC replays.
From the samples taken inside that window, its first SETTLE_S dropped while the clock settles:
the SM clock's median and minimum, the power draw's median and maximum, and the share of
samples whose clock event reasons hold the software power cap (bit 0x4) or a thermal or
hardware slowdown (SLOWDOWN_BITS). Also the mean microseconds per forward pass over the
replays: time under sustained load, not ``benchmarks.stack``'s per-layer figure (no SiLU-only
stack is subtracted). A window without samples prints "not measured". The GPU's power limit,
read once, heads the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks import args as cli
from benchmarks import stack
from fp4_ops import devtools

STACK_DEFAULT = "llama70b_mlp"
M_DEFAULT = (1, 16, 128, 4096)
CONTESTANTS = ("ours_w4a16", "ours_w4a4", "cublas_bf16", "bare_read")
CONTESTANTS_DEFAULT = ("ours_w4a16", "cublas_bf16", "bare_read")
SECONDS_DEFAULT = 2
SAMPLE_MS = 20
SETTLE_S = 0.5
REPLAYS_PER_SYNC = 20
FORWARDS_PER_GRAPH = stack.FORWARDS_PER_GRAPH
# nvidia-smi clocks_event_reasons: software power cap; software thermal, hardware slowdown,
# hardware thermal and hardware power brake slowdowns
POWER_CAP_BIT = 0x4
SLOWDOWN_BITS = 0x20 | 0x8 | 0x40 | 0x80
QUERY = "timestamp,uuid,clocks.sm,power.draw,clocks_event_reasons.active"
LIMIT_QUERY = "uuid,power.limit"
NOT_MEASURED = "not measured"


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser("benchmarks.power", __doc__)
    p.add_argument("--stack", default=STACK_DEFAULT, help=f"of {', '.join(stack.STACKS)}")
    p.add_argument("--m", default=",".join(map(str, M_DEFAULT)), help="tokens, e.g. 1,16")
    p.add_argument("--layers", default=str(stack.LAYERS_DEFAULT), help="distinct layers")
    p.add_argument("--seconds", default=str(SECONDS_DEFAULT), help="replay time per row")
    p.add_argument(
        "--contestants", default=",".join(CONTESTANTS_DEFAULT), help=f"of {', '.join(CONTESTANTS)}"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write every figure here")
    args = p.parse_args(argv)
    args.json = cli.output_path(p, "--json", args.json)
    args.stack = cli.names(p, "--stack", args.stack, list(stack.STACKS), ordered=False)
    args.m = cli.positive_ints(p, "--m", args.m, "1,16")
    args.layers = cli.positive_int(p, "--layers", args.layers)
    args.seconds = cli.positive_int(p, "--seconds", args.seconds)
    args.contestants = cli.names(p, "--contestants", args.contestants, CONTESTANTS, True)
    return args


# ----------------------------------------------------------------------------- samples


def parse_sample(line: str) -> tuple[float, str, float, float, int] | None:
    """(epoch seconds, GPU UUID, SM MHz, W, event reasons) of one ``QUERY`` line (csv,
    noheader, nounits); None for a line with a field nvidia-smi could not read ("[N/A]")."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 5 or any(not f or f.startswith("[") for f in fields):
        return None
    stamp, uuid, clock, power, reasons = fields
    whole, _, frac = stamp.partition(".")
    # (nvidia-smi writes local time, as time.mktime reads it)
    seconds = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + float(f"0.{frac or 0}")
    return seconds, uuid, float(clock), float(power), int(reasons, 16)


def summarize(samples: list, start: float, end: float) -> dict | None:
    """The figures of ``samples`` (``parse_sample``'s) in [start + SETTLE_S, end]; None where
    there are none."""
    window = [s for s in samples if start + SETTLE_S <= s[0] <= end]
    if not window:
        return None
    clocks = [s[2] for s in window]
    powers = [s[3] for s in window]
    return {
        "samples": len(window),
        "sm_mhz_median": statistics.median(clocks),
        "sm_mhz_min": min(clocks),
        "power_w_median": statistics.median(powers),
        "power_w_max": max(powers),
        "power_capped": sum(1 for s in window if s[4] & POWER_CAP_BIT) / len(window),
        "slowed_down": sum(1 for s in window if s[4] & SLOWDOWN_BITS) / len(window),
    }


class Sampler:
    """``nvidia-smi`` sampling every GPU every SAMPLE_MS into a file, for the whole run; its
    lines are read once it has stopped, the GPU's own kept (``uuid``: CUDA's index may not be
    nvidia-smi's)."""

    def __init__(self, uuid: str):
        self.uuid = uuid.lower()
        fd, self.path = tempfile.mkstemp(prefix="power-", suffix=".csv")
        os.close(fd)
        command = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
        command += ["-lms", str(SAMPLE_MS), "-f", self.path]
        self.process = subprocess.Popen(command, stderr=subprocess.DEVNULL)

    def stop(self) -> list:
        """Stop sampling; the samples of this GPU."""
        self.process.terminate()
        self.process.wait()
        try:
            with open(self.path) as f:
                parsed = [s for s in map(parse_sample, f) if s is not None]
        finally:
            os.remove(self.path)
        return [s for s in parsed if s[1].lower().endswith(self.uuid)]


def power_limit(uuid: str) -> float | None:
    """This GPU's power limit in W as nvidia-smi reports it; None where it cannot be read."""
    command = ["nvidia-smi", f"--query-gpu={LIMIT_QUERY}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].lower().endswith(uuid.lower()):
            try:
                return float(fields[1])
            except ValueError:  # ("[N/A]")
                return None
    return None


# ----------------------------------------------------------------------------- measuring


def sustain(fn, seconds: int) -> tuple[float, float, float]:
    """(epoch start, epoch end, us per call) of ``fn`` captured FORWARDS_PER_GRAPH times in one
    CUDA graph and replayed back to back for ``seconds``."""
    graph = devtools.captured_graph(fn, FORWARDS_PER_GRAPH)
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replays, start = 0, time.time()
    first.record()
    while time.time() - start < seconds:
        for _ in range(REPLAYS_PER_SYNC):
            graph.replay()
        replays += REPLAYS_PER_SYNC
        torch.cuda.synchronize()
    last.record()
    torch.cuda.synchronize()
    return start, time.time(), first.elapsed_time(last) * 1e3 / (replays * FORWARDS_PER_GRAPH)


def contestant_layers(contestant: str, weights: list, shapes, device):
    """The stack's layers of one contestant (``benchmarks.stack``'s, or its bare read)."""
    if contestant == "bare_read":
        return stack.bare_read_layers(shapes, device)
    return stack.build_layers(contestant, weights)


def measure(name: str, args, device, progress) -> list[dict]:
    """Rows of one stack: per contestant and M, its check, then its sustained replay (its
    window, to be summarized once the sampler has stopped)."""
    shapes = stack.stack_shapes(name, args.layers)
    weights = stack.modelopt_weights(shapes, device)
    rows, refs = [], {}
    for contestant in args.contestants:
        layers = contestant_layers(contestant, weights, shapes, device)
        for m in args.m:
            progress(f"{name} {contestant} M={m}")
            row = {"stack": name, "m": m, "contestant": contestant, "us_per_forward": None}
            row.update(window=None, clocks=None)
            rows.append(row)
            x = stack.activations(m, shapes[0][1], device)  # (the bare read ignores it)
            if contestant != "bare_read":
                if m not in refs:  # (one float64 stack per M, for every contestant)
                    refs[m] = stack.reference_stack(weights, x)
                row["check"] = stack.check_stack(contestant, layers, weights, x, refs[m])
                if not row["check"]["ok"]:
                    continue
            start, end, us = sustain(lambda f=layers, x=x: stack.forward(f, x), args.seconds)
            row.update(window=(start, end), us_per_forward=us)
        del layers
        torch.cuda.empty_cache()
    return rows


def add_clocks(rows: list[dict], samples: list) -> None:
    """Each run row's figures from the samples of its window."""
    for row in rows:
        if row["window"] is not None:
            row["clocks"] = summarize(samples, *row["window"])


# ----------------------------------------------------------------------------- output


HEAD = (
    "| stack | M | contestant | us per forward pass, sustained | SM clock median (min), MHz "
    "| power median (max), W | samples power-capped | samples slowed down |",
    "|---|---:|---|---:|---:|---:|---:|---:|",
)


def header(env: dict) -> str:
    """The line naming the GPU, its power limit, the driver, the versions and the date."""
    limit = env["power_limit_w"]
    limit = NOT_MEASURED if limit is None else f"{limit:.0f} W"
    return (
        f"GPU: {env['gpu']}, power limit {limit}, driver {env['driver']}, torch {env['torch']}, "
        f"CUDA {env['cuda']}, nvidia-cutlass-dsl {env['nvidia-cutlass-dsl']}, {env['date']}"
    )


def format_row(row: dict) -> str:
    c = row["clocks"]
    if row["us_per_forward"] is None:
        figures = ["check failed: not run"] + [NOT_MEASURED] * 4
    elif c is None:
        figures = [f"{row['us_per_forward']:.1f}"] + [NOT_MEASURED] * 4
    else:
        figures = [
            f"{row['us_per_forward']:.1f}",
            f"{c['sm_mhz_median']:.0f} ({c['sm_mhz_min']:.0f})",
            f"{c['power_w_median']:.0f} ({c['power_w_max']:.0f})",
            f"{c['power_capped']:.0%} of {c['samples']}",
            f"{c['slowed_down']:.0%}",
        ]
    return "| " + " | ".join([row["stack"], str(row["m"]), row["contestant"], *figures]) + " |"


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.power replays CUDA graphs: it needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    try:
        sampler = Sampler(uuid)
    except OSError as err:
        print(f"error: benchmarks.power samples through nvidia-smi: {err}", file=sys.stderr)
        return 2
    env = stack.environment(device)
    env["power_limit_w"] = power_limit(uuid)
    start = time.perf_counter()

    def progress(text):
        print(f"[{time.perf_counter() - start:5.0f} s] {text}", file=sys.stderr, flush=True)

    rows: list[dict] = []
    try:
        for name in args.stack:
            rows += measure(name, args, device, progress)
    finally:
        samples = sampler.stop()
    add_clocks(rows, samples)
    if not samples:
        print("nvidia-smi gave no samples of this GPU: the clock columns are not measured")
    print(header(env))
    print("\n".join(HEAD))
    print("\n".join(map(format_row, rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "settings": vars(args), "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
