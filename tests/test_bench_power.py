# SPDX-License-Identifier: BSD-3-Clause
"""benchmarks.power on the CPU: its arguments and refusals, nvidia-smi's lines as it reads them
(real lines of an H100 run), the window statistics against hand-computed figures, the sampler
through a fake nvidia-smi on PATH, and a faked run of small stacks: checked contestants replayed,
a failing one not run, each row's figures from its own window."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time

import pytest
import torch

from benchmarks import power
from benchmarks import stack as bench_stack
from fp4_ops import devtools

CPU = torch.device("cpu")
SMALL = [(128, 64), (64, 128), (128, 64)]
UUID = "GPU-5e2e6f7a-0c1d-4b2a-9f00-0123456789ab"


def stamp(epoch: float) -> str:
    """``epoch`` as nvidia-smi writes its timestamp (local time, milliseconds)."""
    whole = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(int(epoch)))
    return f"{whole}.{round((epoch % 1) * 1000):03d}"


# ----------------------------------------------------------------------------- arguments


def test_defaults():
    args = power.parse_args([])
    assert args.stack == ["llama70b_mlp"] and args.m == [1, 16, 128, 4096]
    assert args.layers == 8 and args.seconds == 2 and args.json is None
    assert args.contestants == ["ours_w4a16", "cublas_bf16", "bare_read"]
    args = power.parse_args(["--contestants", "bare_read,ours_w4a4", "--stack", "8192x8192"])
    assert args.contestants == ["ours_w4a4", "bare_read"] and args.stack == ["8192x8192"]


@pytest.mark.parametrize(
    "argv",
    [["--seconds", "0"], ["--seconds", "1.5"], ["--m", "0"], ["--stack", "llama"]]
    + [["--contestants", "humming_w4a16"], ["--layers", "-1"], ["--json", "/"]],
    ids=" ".join,
)
def test_bad_arguments_exit_2_with_a_reason(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        power.parse_args(argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_main_without_a_gpu_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(power.torch.cuda, "is_available", lambda: False)
    assert power.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_main_without_nvidia_smi_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(power.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(power.torch.cuda, "get_device_properties", lambda d: FakeProps())
    monkeypatch.setenv("PATH", str(tmp_path))
    assert power.main([]) == 2
    assert "nvidia-smi" in capsys.readouterr().err


# ----------------------------------------------------------------------------- samples


@pytest.mark.parametrize(
    ("line", "clock", "watts", "reasons"),
    [
        ("2026/12/07 22:03:38.019, GPU-ab, 1350, 690.99, 0x0000000000000004", 1350, 690.99, 4),
        ("2026/12/07 22:03:31.144, GPU-ab, 1980, 88.68, 0x0000000000000000", 1980, 88.68, 0),
        ("2026/12/07 22:03:18.888, GPU-ab, 810, 75.22, 0x0000000000000001", 810, 75.22, 1),
        ("2026/12/07 22:03:19.001, GPU-ab, 1755, 701.5, 0x0000000000000084", 1755, 701.5, 0x84),
        ("2026/12/07 22:03:19.021, GPU-ab, 1605, 650.0, 0x0000000000000020", 1605, 650.0, 0x20),
    ],
)
def test_a_line_reads_as_its_fields(line, clock, watts, reasons):
    seconds, uuid, got_clock, got_watts, got_reasons = power.parse_sample(line)
    local = time.mktime(time.strptime(line[:19], "%Y/%m/%d %H:%M:%S"))
    assert seconds == pytest.approx(local + int(line[20:23]) / 1000)
    assert (uuid, got_clock, got_watts, got_reasons) == ("GPU-ab", clock, watts, reasons)


@pytest.mark.parametrize(
    "line",
    [
        "2026/12/07 22:03:38.019, GPU-ab, [N/A], 690.99, 0x4",
        "2026/12/07 22:03:38.019, GPU-ab, 1350, [Unknown Error], 0x4",
        "2026/12/07 22:03:38.019, 1350, 690.99, 0x4",
        "",
    ],
)
def test_a_line_without_every_field_is_skipped(line):
    assert power.parse_sample(line) is None


@pytest.fixture
def zone(monkeypatch):
    """A time zone other than UTC for the test, the process's own restored after it."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset: POSIX only")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_timestamps_are_local_time_as_nvidia_smi_writes_them(zone):
    now = time.time()
    line = f"{stamp(now)}, G, 1500, 600, 0x0"
    assert time.timezone != 0
    assert power.parse_sample(line)[0] == pytest.approx(now, abs=1e-3)


def test_timestamps_keep_their_milliseconds():
    a = power.parse_sample("2026/12/07 23:59:59.980, G, 1, 1, 0x0")[0]
    b = power.parse_sample("2026/12/08 00:00:00.020, G, 1, 1, 0x0")[0]
    assert b - a == pytest.approx(0.04)


def sample(t, clock, watts, reasons):
    return (t, UUID, float(clock), float(watts), reasons)


def test_the_window_drops_its_settling_time_and_what_is_outside_it():
    s = power.SETTLE_S
    samples = [sample(99.0, 100, 999, 0x4), sample(100.0 + s / 2, 200, 888, 0x4)]
    samples += [sample(100.0 + s, 1400, 690, 0x4), sample(101.0, 1980, 650, 0x0)]
    samples += [sample(101.5, 1500, 700, 0x4 | 0x1), sample(102.0, 1600, 695, 0x8)]
    samples += [sample(102.5, 100, 999, 0x4)]
    got = power.summarize(samples, 100.0, 102.0)
    assert got == {
        "samples": 4,
        "sm_mhz_median": 1550.0,
        "sm_mhz_min": 1400.0,
        "power_w_median": 692.5,
        "power_w_max": 700.0,
        "power_capped": 0.5,
        "slowed_down": 0.25,
    }


@pytest.mark.parametrize(
    ("reasons", "capped", "slowed"),
    [(0x0, 0, 0), (0x1, 0, 0), (0x4, 1, 0), (0x20, 0, 1), (0x40, 0, 1), (0x80, 0, 1)]
    + [(0x8, 0, 1), (0x2, 0, 0), (0x100, 0, 0), (0x4 | 0x80, 1, 1)],
)
def test_each_event_reason_counts_where_it_belongs(reasons, capped, slowed):
    got = power.summarize([sample(10.0, 1500, 600, reasons)], 0.0, 20.0)
    assert (got["power_capped"], got["slowed_down"]) == (capped, slowed)


def test_an_empty_window_is_not_measured():
    assert power.summarize([sample(5.0, 1500, 600, 0)], 10.0, 20.0) is None
    assert power.summarize([], 0.0, 1e12) is None


FAKE_SMI = """#!{python}
import sys, time
path = sys.argv[sys.argv.index("-f") + 1]
query = [a for a in sys.argv if a.startswith("--query-gpu=")][0]
assert query == "--query-gpu={query}", query
with open(path, "w") as f:
    for line in {lines!r}:
        f.write(line + "\\n")
    f.flush()
    time.sleep(60)
"""


class FakeProps:
    uuid = UUID[4:]


def test_the_sampler_keeps_the_lines_of_its_own_device(tmp_path, monkeypatch):
    now = time.time()
    lines = [f"{stamp(now)}, {UUID}, 1410, 692.5, 0x0000000000000004"]
    lines += [f"{stamp(now)}, GPU-00000000-other, 1980, 100.0, 0x0000000000000000"]
    lines += [f"{stamp(now + 0.02)}, {UUID}, [N/A], 692.5, 0x0000000000000004"]
    lines += [f"{stamp(now + 0.04)}, {UUID.upper()}, 1395, 700.0, 0x0000000000000000"]
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, query=power.QUERY, lines=lines))
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = power.Sampler(FakeProps.uuid)
    path = sampler.path
    deadline = time.time() + 20
    while os.path.getsize(path) == 0 and time.time() < deadline:
        time.sleep(0.05)
    got = sampler.stop()
    assert not os.path.exists(path)
    assert [(s[2], s[3], s[4]) for s in got] == [(1410.0, 692.5, 4), (1395.0, 700.0, 0)]
    assert got[1][0] - got[0][0] == pytest.approx(0.04, abs=2e-3)


# nvidia-smi answering any --query-gpu from its GPUs' fields, as the real one does: a GPU capped
# with `nvidia-smi -pl` reports the cap in force as power.limit, its factory figure beside it
LIMIT_SMI = """#!{python}
import sys
fields = [a for a in sys.argv if a.startswith("--query-gpu=")][0].split("=", 1)[1].split(",")
for gpu in {gpus!r}:
    print(", ".join(gpu.get(f, "[N/A]") for f in fields))
sys.exit({code})
"""


def fake_limit_smi(tmp_path, monkeypatch, gpus: list, code: int = 0) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(LIMIT_SMI.format(python=sys.executable, gpus=gpus, code=code))
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def gpu(uuid: str, limit: str, default: str = "700.00") -> dict:
    return {"uuid": uuid, "power.limit": limit, "power.default_limit": default}


OTHER = gpu("GPU-00000000-other", "350.00", "350.00")


@pytest.mark.parametrize(
    ("gpus", "code", "limit"),
    [
        ([OTHER, gpu(UUID, "600.00")], 0, 600.0),
        ([gpu(UUID.upper(), "650.50"), OTHER], 0, 650.5),
        ([gpu(UUID, "[N/A]")], 0, None),
        ([OTHER], 0, None),
        ([gpu(UUID, "700.00")], 9, None),
    ],
    ids=["capped-second-line", "first-upper-case", "not-available", "other-gpu-only", "failed"],
)
def test_the_power_limit_is_this_gpu_s_in_force(tmp_path, monkeypatch, gpus, code, limit):
    fake_limit_smi(tmp_path, monkeypatch, gpus, code)
    assert power.power_limit(FakeProps.uuid) == limit


def test_no_nvidia_smi_leaves_the_power_limit_unread(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert power.power_limit(FakeProps.uuid) is None


class FakeCuda:
    """What ``sustain`` takes of torch.cuda: a graph whose replays are counted and events whose
    elapsed time is MS_PER_REPLAY per replay between their records."""

    MS_PER_REPLAY = 0.5

    def __init__(self):
        self.capturing, self.replays, self.captured = False, 0, 0

    def install(self, monkeypatch):
        fake = self
        cuda = power.torch.cuda

        class Stream:
            def wait_stream(self, other):
                pass

        class Graph:
            def replay(self):
                fake.replays += 1

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self):
                self.at = fake.replays

            def elapsed_time(self, other):
                return (other.at - self.at) * fake.MS_PER_REPLAY

        @contextlib.contextmanager
        def graph(g, stream):
            fake.capturing = True
            yield
            fake.capturing = False

        monkeypatch.setattr(cuda, "Stream", Stream)
        monkeypatch.setattr(cuda, "current_stream", lambda: Stream())
        monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "synchronize", lambda: None)
        monkeypatch.setattr(cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(cuda, "graph", graph)
        monkeypatch.setattr(cuda, "Event", Event)

    def fn(self):
        self.captured += self.capturing


def test_sustain_reports_time_per_forward_pass_over_its_window(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    before = time.time()
    start, end, us = power.sustain(fake.fn, 1)
    assert fake.captured == power.FORWARDS_PER_GRAPH  # one graph of the forward passes
    assert before <= start and end - start >= 1
    # every replay timed but the one before the first event
    assert us == pytest.approx(fake.MS_PER_REPLAY * 1e3 / power.FORWARDS_PER_GRAPH)
    assert (
        fake.replays > power.REPLAYS_PER_SYNC and (fake.replays - 1) % power.REPLAYS_PER_SYNC == 0
    )


def test_the_benchmarks_timer_shares_the_capture(monkeypatch):
    """devtools.time_graph_us, built on the same capture: calls captured, replays timed."""
    fake = FakeCuda()
    fake.install(monkeypatch)
    us = devtools.time_graph_us(fake.fn, iterations=20, repeats=5)
    assert fake.captured == 20 and fake.replays == 1 + 5
    assert us == pytest.approx(5 * fake.MS_PER_REPLAY * 1e3 / (20 * 5))


# ----------------------------------------------------------------------------- a faked run


@pytest.fixture
def small_stacks(monkeypatch):
    """Small shapes in place of the stacks', replays that call the forward pass once on the
    CPU and report a window each, a wall clock per window."""
    windows = iter(range(100, 10_000, 10))
    calls = []

    def sustain(fn, seconds):
        out = fn()
        calls.append(out)
        start = float(next(windows))
        return start, start + seconds, 7.0 + len(calls)

    monkeypatch.setattr(bench_stack, "stack_shapes", lambda name, layers: SMALL[:layers])
    monkeypatch.setattr(power, "sustain", sustain)
    return calls


def args_for(argv):
    return power.parse_args(["--layers", "3", "--seconds", "2", *argv])


def test_checked_contestants_are_replayed_with_their_own_windows(small_stacks):
    args = args_for(["--m", "1,4", "--contestants", "ours_w4a16,cublas_bf16,bare_read"])
    rows = power.measure("llama70b_mlp", args, CPU, lambda text: None)
    assert [(r["contestant"], r["m"]) for r in rows] == [
        (c, m) for c in ("ours_w4a16", "cublas_bf16", "bare_read") for m in (1, 4)
    ]
    assert [r["window"] for r in rows] == [(s, s + 2) for s in range(100, 160, 10)]
    assert [r["us_per_forward"] for r in rows] == [8.0 + i for i in range(6)]
    assert all(r["check"]["ok"] for r in rows if r["contestant"] != "bare_read")
    assert all("check" not in r for r in rows if r["contestant"] == "bare_read")
    # each replayed forward pass is the stack's own: M rows out; the bare read's, one
    assert [out.shape for out in small_stacks] == [(1, 128), (4, 128)] * 2 + [(1, 128)] * 2
    samples = [sample(100 + 10 * i + 1.0, 1500 + i, 600 + i, 0x4 * (i % 2)) for i in range(6)]
    power.add_clocks(rows, samples)
    for i, r in enumerate(rows):
        assert r["clocks"]["samples"] == 1 and r["clocks"]["sm_mhz_median"] == 1500 + i
        assert r["clocks"]["power_capped"] == i % 2


def test_one_reference_per_m_serves_every_contestant(small_stacks, monkeypatch):
    real, made = bench_stack.reference_stack, []

    def reference(weights, x, inputs=None):
        made.append(x.shape[0])
        return real(weights, x, inputs)

    monkeypatch.setattr(bench_stack, "reference_stack", reference)
    args = args_for(["--m", "1,4", "--contestants", "ours_w4a16,cublas_bf16,bare_read"])
    rows = power.measure("llama70b_mlp", args, CPU, lambda text: None)
    assert made == [1, 4] and all(r["window"] is not None for r in rows)


def test_a_contestant_off_its_reference_is_not_run(small_stacks, monkeypatch):
    real = bench_stack.check_stack

    def check(contestant, layers, weights, x, ref, input_scales=None):
        result = real(contestant, layers, weights, x, ref, input_scales)
        return result | {"ok": contestant != "cublas_bf16"}

    monkeypatch.setattr(bench_stack, "check_stack", check)
    args = args_for(["--m", "2", "--contestants", "ours_w4a4,cublas_bf16"])
    rows = power.measure("8192x8192", args, CPU, lambda text: None)
    assert [r["contestant"] for r in rows] == ["ours_w4a4", "cublas_bf16"]
    assert rows[0]["window"] is not None and rows[0]["check"]["ok"]
    assert rows[1]["window"] is None and rows[1]["us_per_forward"] is None
    assert len(small_stacks) == 1
    power.add_clocks(rows, [sample(rows[0]["window"][0] + 1, 1500, 600, 0)])
    assert rows[1]["clocks"] is None
    assert "check failed: not run" in power.format_row(rows[1])


def test_rows_print_under_their_headers():
    clocks = {"samples": 40, "sm_mhz_median": 1425.0, "sm_mhz_min": 1185.0}
    clocks |= {"power_w_median": 692.4, "power_w_max": 717.0, "power_capped": 1.0}
    clocks["slowed_down"] = 0.25
    row = {"stack": "llama70b_mlp", "m": 16, "contestant": "ours_w4a16", "us_per_forward": 51.25}
    line = power.format_row(row | {"clocks": clocks})
    assert (
        line
        == "| llama70b_mlp | 16 | ours_w4a16 | 51.2 | 1425 (1185) | 692 (717) | 100% of 40 | 25% |"
    )
    assert line.count("|") == power.HEAD[0].count("|") == power.HEAD[1].count("|")
    unsampled = power.format_row(row | {"clocks": None})
    assert (
        unsampled
        == "| llama70b_mlp | 16 | ours_w4a16 | 51.2 | "
        + " | ".join([power.NOT_MEASURED] * 4)
        + " |"
    )


ENV = {"gpu": "G", "driver": "D", "torch": "T", "cuda": "C", "nvidia-cutlass-dsl": "X"}
ENV["date"] = "2026-12-07 23:00 UTC"


def test_the_header_names_the_power_limit_or_says_it_was_not_read():
    line = "GPU: G, power limit {}, driver D, torch T, CUDA C, nvidia-cutlass-dsl X, " + ENV["date"]
    assert power.header(ENV | {"power_limit_w": 699.6}) == line.format("700 W")
    assert power.header(ENV | {"power_limit_w": None}) == line.format(power.NOT_MEASURED)


def test_main_prints_every_row_and_writes_json(small_stacks, monkeypatch, tmp_path, capsys):
    class Sampler:
        def __init__(self, uuid):
            assert uuid == FakeProps.uuid

        def stop(self):
            return [sample(101.0, 1500, 690, 0x4), sample(111.0, 1980, 500, 0x0)]

    monkeypatch.setattr(power.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(power.torch.cuda, "get_device_properties", lambda d: FakeProps())
    monkeypatch.setattr(power.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(power, "Sampler", Sampler)
    monkeypatch.setattr(bench_stack, "environment", lambda d: dict(ENV))
    monkeypatch.setattr(power, "power_limit", lambda uuid: 700.0 if uuid == FakeProps.uuid else 0)
    monkeypatch.setattr(power.torch, "device", lambda kind: CPU)
    out = tmp_path / "power.json"
    argv = ["--m", "1,2", "--contestants", "ours_w4a16", "--layers", "3", "--json", str(out)]
    assert power.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == power.header(ENV | {"power_limit_w": 700.0})
    assert printed[1:3] == list(power.HEAD)
    assert printed[3].startswith("| llama70b_mlp | 1 | ours_w4a16 | 8.0 | 1500 (1500) | 690 (690)")
    assert printed[4].startswith("| llama70b_mlp | 2 | ours_w4a16 | 9.0 | 1980 (1980) | 500 (500)")
    data = json.loads(out.read_text())
    assert [r["clocks"]["power_capped"] for r in data["rows"]] == [1.0, 0.0]
    assert data["settings"]["m"] == [1, 2] and data["environment"]["gpu"] == "G"
    assert data["environment"]["power_limit_w"] == 700.0
