# SPDX-License-Identifier: BSD-3-Clause
"""Tests of blockwise_grouped_gemm_fp4.py (the Blackwell contiguous grouped kernel).

CPU: the contiguous grouped layout against hand-derived offsets; the operands a run builds
against an independent emulation of the kernel's arithmetic and each group's own reference GEMM;
every refusal of bad input; cross-compilation with the PTX of the warp roles executed by the
PTX interpreter of test_blackwell_facts.py for a routing held in (simulated) global memory: the
M tiles each CTA walks, the group each B / SFB load and each alpha read names, that A, SFA and
D are addressed without a group, and that no tile past num_m_tiles is touched.  The mainloop
instructions are the dense kernel's (same configuration), compared class by class.
GPU: each group against its reference on a datacenter Blackwell GPU (skipped elsewhere: no test
machine has one); the refusal of other GPUs.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_blackwell import FakeGrid, kernel_param
from test_blackwell_facts import PtxThread, fast_divisor
from test_eager import aligned_buffer

import blockwise_gemm_fp4 as bw
import blockwise_grouped_gemm_fp4 as grouped
import reference

NVFP4, MXFP4 = (16, "Float8E4M3FN"), (32, "Float8E8M0FNU")
# (format, c_dtype, mma_tiler_mn, cluster_shape_mn): 1-CTA, CTA pair, N multicast, N 64
CONFIGS = [
    (NVFP4, "BFloat16", (128, 128), (1, 1)),
    (MXFP4, "Float16", (256, 128), (2, 1)),
    (NVFP4, "Float32", (128, 64), (1, 2)),
    (NVFP4, "BFloat16", (256, 256), (2, 2)),
]


def _config_id(cfg) -> str:
    (vec, _), c_dtype, tile, cluster = cfg
    return f"v{vec}-{c_dtype}-{tile[0]}x{tile[1]}-cl{cluster[0]}x{cluster[1]}"


# ------------------------------------------------------------------------------------------
# The contiguous grouped layout (pure Python)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rows, tile_m, offsets, tile_group",
    [
        ((200, 0, 37, 512), 128, (0, 256, 256, 384, 896), (0, 0, 2, 3, 3, 3, 3)),
        ((200, 0, 37, 512), 256, (0, 256, 256, 512, 1024), (0, 2, 3, 3)),
        ((1, 1, 1), 128, (0, 128, 256, 384), (0, 1, 2)),
        ((128, 129), 128, (0, 128, 384), (0, 1, 1)),
        ((0, 0), 128, (0, 0, 0), ()),
    ],
)
def test_group_layout_pads_each_group_to_whole_tiles(rows, tile_m, offsets, tile_group):
    layout = grouped.group_layout(rows, tile_m)
    assert layout.row_offsets == offsets
    assert layout.tile_group == tile_group
    assert layout.num_m_tiles == len(tile_group) and layout.rows == offsets[-1]


@pytest.mark.parametrize(
    "rows, tile_m, message",
    [
        ((), 128, "one or more integers"),
        ((3, -1), 128, "integers >= 0"),
        ((3, 2.0), 128, "integers >= 0"),
        ((True, 2), 128, "integers >= 0"),
        ("12", 128, "integers >= 0"),
        ((3,), 64, "128 or 256"),
        ((3,), 128.0, "the integer 128 or 256"),
        ((2**31 - 128, 1), 128, r"pad to 2147483648 rows, beyond the kernel's 32-bit extents"),
    ],
)
def test_group_layout_refuses_bad_input(rows, tile_m, message):
    with pytest.raises(ValueError, match=message):
        grouped.group_layout(rows, tile_m)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(cluster_shape_mn=(2, 1)), "cluster shape M=2.*must be 1 for MMA tile M 128"),
        (dict(mma_tiler_mn=(256, 128)), "cluster shape M must be even"),
        (
            dict(mma_tiler_mn=(256, 128), cluster_shape_mn=(4, 1)),
            "cluster shape M=4.*must be 2 for MMA tile M 256",
        ),
        (dict(mnkg=(200, 4096, 7168, 4)), "M=200 is not a multiple of the MMA tile M 128"),
        (
            dict(mnkg=(384, 4096, 7168, 4), mma_tiler_mn=(256, 128), cluster_shape_mn=(2, 1)),
            "M=384 is not a multiple of the MMA tile M 256",
        ),
        (dict(mnkg=(256, 4096, 7000, 4)), "K=7000 is not a multiple of 32"),
        (dict(mnkg=(256, 4096, 4080, 4)), "K=4080 is not a multiple of 32"),  # (of 16, not 32)
        (dict(mnkg=(256, 4096, 7168, 0)), "G \\(groups\\) must be >= 1, got 0"),
        (dict(cluster_shape_mn=(1, 8)), "exceeds 4"),
    ],
)
def test_check_grouped_config_refusals(change, message):
    args = dict(
        mnkg=(256, 4096, 7168, 4),
        sf_vec_size=16,
        sf_dtype="Float8E4M3FN",
        c_dtype="BFloat16",
        mma_tiler_mn=(128, 128),
        cluster_shape_mn=(1, 1),
    )
    assert grouped.check_grouped_config(**args) == []
    args.update(change)
    reasons = grouped.check_grouped_config(**args)
    assert any(re.search(message, r) for r in reasons), reasons
    # (the kernel class answers the same, in the CUTLASS examples' shape)
    ok, why = grouped.BlockwiseGroupedGemmFp4Sm100.can_implement(*args.values())
    assert (ok, why) == (False, reasons)


@pytest.mark.parametrize(
    "n, given, tile, cluster",
    [
        (4096, {}, (128, 128), (1, 1)),
        (64, {}, (128, 64), (1, 1)),
        (4096, dict(mma_tiler_mn=(256, 256)), (256, 256), (2, 1)),
        (4096, dict(cluster_shape_mn=(1, 4)), (128, 128), (1, 4)),
        (4096, dict(cluster_shape_mn=(2, 1)), (256, 128), (2, 1)),
    ],
)
def test_grouped_config_fills_in_what_is_missing(n, given, tile, cluster):
    config = grouped.grouped_config(n, **given)
    assert (config.mma_tiler_mn, config.cluster_shape_mn) == (tile, cluster)


@pytest.mark.parametrize(
    "num_tiles_m, num_ctas_n, cluster, count, max_active_clusters",
    [
        (8, 5, (1, 1), 6, 148),
        (8, 3, (1, 2), 8, 4),  # N tiles not a whole number of clusters
        (4, 7, (2, 4), 3, 5),
        (6, 1, (1, 4), 9, 3),  # a count past the buffers; one N tile in a cluster of 4
        (5, 4, (1, 2), 0, 7),  # no tile in use
    ],
)
def test_grouped_schedule_visits_every_tile_in_use_once(
    monkeypatch, num_tiles_m, num_ctas_n, cluster, count, max_active_clusters
):
    """The host-built schedule run on the CPU (plain ints for the device's indices): every CTA
    tile of the first min(count, buffers) M tiles, across the cluster-rounded N tiles, is worked
    on once, with its M tile's group, by the CTA at its place in the cluster; nothing else is."""
    fake = FakeGrid(monkeypatch)
    cm, cn = cluster
    tile_group = [(7 * t + 3) % 5 for t in range(num_tiles_m)]
    schedule = grouped.GroupedTileSchedule.create_grouped(
        num_tiles_m, num_ctas_n, cn, tile_group, [count]
    )
    clusters_n = -(-num_ctas_n // cn)
    fake.grid = schedule.grid(cluster, max_active_clusters)
    assert fake.grid == (cm, cn, min(num_tiles_m * clusters_n, max_active_clusters))
    visits = collections.Counter()
    for z in range(fake.grid[2]):
        for x in range(cm):
            for y in range(cn):
                fake.block = (x, y, z)
                work = schedule.first_work()
                while schedule.is_valid(work):
                    tile = schedule.cta_tile(work, cluster)
                    assert (tile[0] % cm, tile[1] % cn) == (x, y)
                    visits[tile] += 1
                    work = schedule.next_work(work)
    in_use = min(count, num_tiles_m)
    assert visits == {
        (mt * cm + x, n, tile_group[mt]): 1
        for mt in range(in_use)
        for x in range(cm)
        for n in range(clusters_n * cn)
    }


# ------------------------------------------------------------------------------------------
# The operands of a run, against an emulation of the kernel and each group's own GEMM
# ------------------------------------------------------------------------------------------
def _emulated_kernel(ops, layout, n: int, k: int, vec: int) -> torch.Tensor:
    """D as the module docstring defines it, read from the kernel's operands only: M tile t of
    tile_group[t] < num_m_tiles, A's rows and SFA's blocked scales, the group's B, SFB, alpha."""
    m = ops.a.shape[0]
    sfa = reference.from_blocked(ops.sfa_blocked, m, k // vec)
    d = torch.full((m, n), float("nan"))
    for t in range(int(ops.num_m_tiles[0])):
        g = int(ops.tile_group[t])
        rows = slice(t * layout.tile_m, (t + 1) * layout.tile_m)
        sfb = reference.from_blocked(ops.sfb_blocked[g], n, k // vec)
        d[rows] = reference.reference_gemm(
            ops.a[rows], ops.b[g], sfa[rows], sfb, vec, ops.alpha[g], out_dtype=torch.float32
        )
    return d


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="the CUDA run of the host code needs a GPU"
        ),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vec", [16, 32])
@pytest.mark.parametrize("rows, tile_m", [((200, 0, 37, 129), 128), ((5, 300, 0, 1), 256)])
def test_grouped_operands_give_each_group_its_own_gemm(vec, rows, tile_m, device):
    """The operands a GPU run builds (on the CPU, and on a GPU as a B200 run builds them)."""
    n, k = 72, 256
    layout = grouped.group_layout(rows, tile_m)
    ops = grouped.make_grouped_operands(layout, n, k, vec, device, seed=3)
    assert ops.a.device.type == device
    ops = grouped.GroupedOperands(
        *(getattr(ops, f).cpu() for f in ("a", "b", "sfa_blocked", "sfb_blocked", "alpha")),
        ops.tile_group.cpu(),
        ops.num_m_tiles.cpu(),
        [tuple(t.cpu() for t in group) for group in ops.groups],
    )
    assert ops.tile_group.dtype == ops.num_m_tiles.dtype == torch.int32
    assert ops.tile_group.tolist() == list(layout.tile_group)
    d = _emulated_kernel(ops, layout, n, k, vec)
    for g, start in enumerate(layout.row_offsets[:-1]):
        a_g, b_g, sfa_g, sfb_g, alpha_g = ops.groups[g]
        assert a_g.shape[0] == rows[g]
        if rows[g]:
            ok, info = reference.check_gemm(
                d[start : start + rows[g]].float(), a_g, b_g, sfa_g, sfb_g, vec, alpha_g
            )
            assert ok, (g, info)
        # padding rows: zero codes, so zero products
        pad_end = layout.row_offsets[g + 1]
        assert torch.all(d[start + rows[g] : pad_end] == 0)
    # the groups differ (a swapped group shows)
    assert len({float(a) for a in ops.alpha}) == len(rows) or vec == 32


# ------------------------------------------------------------------------------------------
# The torch entry point's refusals (checked before anything touches a GPU)
# ------------------------------------------------------------------------------------------
def _cpu_operands(m=256, n=128, k=256, groups=3, vec=16):
    sf = bw.torch_scale_dtype(vec)
    k_cols = -(-(k // vec) // 4) * 4
    return dict(
        a=torch.zeros(m, k // 2, dtype=torch.uint8),
        b=torch.zeros(groups, n, k // 2, dtype=torch.uint8),
        sfa_blocked=torch.zeros(-(-m // 128) * 128 * k_cols, dtype=torch.uint8).view(sf),
        sfb_blocked=torch.zeros(groups, -(-n // 128) * 128 * k_cols, dtype=torch.uint8).view(sf),
        alpha=torch.ones(groups),
        tile_group=torch.zeros(m // 128, dtype=torch.int32),
        num_m_tiles=torch.ones(1, dtype=torch.int32),
        d=torch.empty(m, n, dtype=torch.bfloat16),
    )


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("a", torch.zeros(256, 128, dtype=torch.int8), "a must be torch.uint8"),
        ("a", torch.zeros(256, 64, dtype=torch.uint8), r"a must be \[M, K/2\] and b"),
        ("b", torch.zeros(3, 128, 128, dtype=torch.float16), "b must be torch.uint8"),
        ("sfa_blocked", torch.zeros(100, dtype=torch.uint8).view(torch.float8_e4m3fn), "sfa"),
        ("sfb_blocked", torch.zeros(2, 2048, dtype=torch.uint8).view(torch.float8_e4m3fn), "sfb"),
        ("alpha", torch.ones(3, dtype=torch.float64), "alpha must be torch.float32"),
        ("alpha", torch.ones(2), r"alpha must be .* shape \(3,\)"),
        ("tile_group", torch.zeros(2, dtype=torch.int64), "tile_group must be torch.int32"),
        ("num_m_tiles", torch.ones(2, dtype=torch.int32), r"num_m_tiles must be .* \(1,\)"),
        ("d", torch.empty(256, 128, dtype=torch.float16), "config is for"),
        ("d", torch.empty(255, 128, dtype=torch.bfloat16), r"d must be .* \(256, 128\)"),
        (
            "d",
            torch.empty(256, 128, dtype=torch.int8),
            "d must be torch.bfloat16 or .* got torch.int8",
        ),
        ("b", torch.zeros(128, 128, dtype=torch.uint8), r"a must be \[M, K/2\] and b \[G, N"),
        # the layout, refused on any device
        (
            "a",
            aligned_buffer(256 * 128, 8, torch.uint8).view(256, 128),
            "a must start on a 16-byte",
        ),
        (
            "d",
            aligned_buffer(256 * 128, 8, torch.bfloat16).view(256, 128),
            "d must start on a 16-byte",
        ),
        ("b", torch.zeros(3, 128, 256, dtype=torch.uint8)[..., ::2], "b must be contiguous"),
        ("tile_group", torch.zeros(4, dtype=torch.int32)[::2], "tile_group must be contiguous"),
        ("d", torch.empty(256, 136, dtype=torch.bfloat16)[:, :128], "d must have rows 128 elem"),
    ],
)
def test_grouped_gemm_refuses_bad_operands(name, bad, message):
    operands = _cpu_operands()
    operands[name] = bad
    with pytest.raises(ValueError, match=message):
        grouped.grouped_gemm(**operands, config=grouped.grouped_config(128))


@pytest.mark.parametrize("vec", [16, 32])
@pytest.mark.parametrize("m, n, k", [(128, 64, 96), (256, 200, 160), (384, 128, 7168)])
def test_grouped_gemm_accepts_the_blocked_scales_of_every_shape(vec, m, n, k):
    """Operands of the exact sizes reference.to_blocked writes (K / V not a multiple of 4, N
    not of 128 included) pass every shape check: the refusal is the CPU placement."""
    groups = 2
    sf = bw.torch_scale_dtype(vec)
    operands = _cpu_operands(m, n, k, groups, vec)
    operands["sfa_blocked"] = reference.to_blocked(torch.zeros(m, k // vec, dtype=sf))
    operands["sfb_blocked"] = reference.to_blocked(torch.zeros(groups, n, k // vec, dtype=sf))
    config = grouped.grouped_config(n, vec)
    with pytest.raises(ValueError, match="a must be on a's CUDA device"):
        grouped.grouped_gemm(**operands, config=config)


def _check_kernel_args(args: dict, operands: dict) -> None:
    """Each pointer holds its own operand's address and element type (NVFP4, BF16 D), under the
    name of the kernel's parameter for it."""
    import cutlass

    sf = cutlass.Float8E4M3FN
    want = {
        "a_ptr": ("a", cutlass.Float4E2M1FN),
        "b_ptr": ("b", cutlass.Float4E2M1FN),
        "sfa_ptr": ("sfa_blocked", sf),
        "sfb_ptr": ("sfb_blocked", sf),
        "c_ptr": ("d", cutlass.BFloat16),
        "tile_group_ptr": ("tile_group", cutlass.Int32),
        "num_m_tiles_ptr": ("num_m_tiles", cutlass.Int32),
        "alpha_ptr": ("alpha", cutlass.Float32),
    }
    call = inspect.signature(grouped.BlockwiseGroupedGemmFp4Sm100.__call__).parameters
    assert set(args) == set(call) - {"self", "max_active_clusters"}
    for param, (name, dtype) in want.items():
        assert int(args[param].__tvm_ffi_opaque_ptr__()) == operands[name].data_ptr(), param
        assert args[param].dtype is dtype, param


def test_kernel_args_name_each_operand_for_its_parameter():
    """``kernel_args`` of operands in its order; the problem is (M, N, K, G)."""
    operands = _cpu_operands(m=256, n=128, k=256, groups=3)
    config = grouped.grouped_config(128)
    order = ("a", "b", "sfa_blocked", "sfb_blocked", "d", "tile_group", "num_m_tiles", "alpha")
    args = grouped.kernel_args(
        config,
        (256, 128, 256, 3),
        tuple(operands[name] for name in order),
        SimpleNamespace(cuda_stream=0),
    )
    _check_kernel_args(args, operands)
    assert [int(v) for v in args["problem_mnkg"]] == [256, 128, 256, 3]


def test_grouped_gemm_launches_each_operand_under_its_parameter(monkeypatch):
    """``grouped_gemm``'s one launch (its operand checks, which need CUDA tensors, stood in
    for): every operand reaches the kernel under its own parameter, on the current stream."""
    operands = _cpu_operands(m=256, n=128, k=256, groups=3)
    launched = []
    monkeypatch.setattr(grouped, "_operand_problem", lambda *_: (256, 128, 256, 3))
    monkeypatch.setattr(grouped, "_compiled_kernel", lambda *_: lambda **kw: launched.append(kw))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=7))
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    assert grouped.grouped_gemm(**operands) is operands["d"]
    [args] = launched
    _check_kernel_args(args, operands)
    assert int(args["stream"]) == 7


def test_grouped_gemm_refuses_host_tensors_and_bad_configs():
    with pytest.raises(ValueError, match="a must be on a's CUDA device"):
        grouped.grouped_gemm(**_cpu_operands())
    operands = _cpu_operands(m=384)
    config = grouped.grouped_config(128, mma_tiler_mn=(256, 128))
    with pytest.raises(ValueError, match="tile_group must be"):  # (M / 256 tiles: 1, not 3)
        grouped.grouped_gemm(**operands, config=config)


@pytest.mark.skipif(
    not torch.cuda.is_available() or bw.blackwell_gpu()[0],
    reason="the refusal of a GPU that is not a datacenter Blackwell needs such a GPU",
)
def test_gpu_grouped_gemm_refuses_a_gpu_that_is_not_blackwell():
    operands = {name: t.cuda() for name, t in _cpu_operands().items()}
    operands["d"] = bw.empty_d(1, 256, 128, "BFloat16", "cuda")[0]
    with pytest.raises(ValueError, match="needs a datacenter Blackwell GPU"):
        grouped.grouped_gemm(**operands)


@pytest.mark.skipif(
    not torch.cuda.is_available() or not bw.blackwell_gpu()[0],
    reason="the kernel runs on a datacenter Blackwell GPU (sm_100 / sm_103) only",
)
@pytest.mark.parametrize("vec", [16, 32])
@pytest.mark.parametrize("tile_m", [128, 256])
def test_gpu_grouped_gemm_matches_each_groups_reference(vec, tile_m):
    """Ragged and empty groups, and a count below the buffers: each group's rows equal its own
    reference GEMM, padding rows are zero, rows of tiles past num_m_tiles keep their sentinel."""
    n, k, sentinel = 320, 512, -3.0
    layout = grouped.group_layout((200, 0, 37, 129, 0, 300), tile_m)
    ops = grouped.make_grouped_operands(layout, n, k, vec, "cuda", seed=11)
    used = layout.row_offsets[5] // tile_m  # the last group lies past the count
    ops.num_m_tiles.fill_(used)
    config = grouped.grouped_config(n, vec, mma_tiler_mn=(tile_m, 128))
    d = bw.empty_d(1, layout.rows, n, "BFloat16", "cuda")[0].fill_(sentinel)
    operands = (ops.a, ops.b, ops.sfa_blocked, ops.sfb_blocked, ops.alpha)
    grouped.grouped_gemm(*operands, ops.tile_group, ops.num_m_tiles, d, config)
    torch.cuda.synchronize()
    for g, start in enumerate(layout.row_offsets[:5]):
        rows = layout.group_rows[g]
        if rows:
            ok, info = reference.check_gemm(
                d[start : start + rows], *ops.groups[g][:4], vec, ops.groups[g][4]
            )
            assert ok, (g, info)
        assert torch.all(d[start + rows : layout.row_offsets[g + 1]] == 0), g
    assert torch.all(d[used * tile_m :] == sentinel)


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    script = Path(grouped.__file__)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        cwd=script.parent,
        timeout=600,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--group_rows", "3,-1"], "--group_rows: group_rows must be one or more integers >= 0"),
        (["--group_rows", "3,x"], "--group_rows expects comma-separated integers"),
        (["--nk", "4096,7168,1"], "--nk expects 2 integers"),
        (["--nk", "4096"], "--nk expects 2 integers"),
        (["--group_rows", "0,0"], "--group_rows: every group is empty"),
        (["--group_rows", "99999999999999"], "beyond the kernel's 32-bit extents"),
        (["--mma_tiler_mn", "64,128"], "--mma_tiler_mn: tile M must be 128 or 256, got 64"),
        (["--nk", "4096,7000"], "K=7000 is not a multiple of 32"),
        (["--mma_tiler_mn", "256,128", "--cluster_shape_mn", "1,1"], "M must be even"),
        (["--cluster_shape_mn", "4,1"], "cluster shape M=4"),
        (["--iterations", "0"], "--iterations must be >= 1"),
        (["--dump_dir", "no/such/folder"], "--dump_dir no/such/folder is not an existing folder"),
        (["--sf_vec_size", "24"], "invalid choice"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(args, message):
    proc = _cli(*args, "--compile_only")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(bw.blackwell_gpu()[0], reason="this machine has the GPU the run needs")
def test_cli_run_without_a_blackwell_gpu_exits_2_pointing_to_compile_only():
    proc = _cli("--group_rows", "8,8")
    assert proc.returncode == 2, proc.stderr
    assert "needs a datacenter Blackwell GPU" in proc.stderr and "--compile_only" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_compile_only_picks_the_cta_pair_tile_for_a_pair_cluster(tmp_path):
    proc = _cli("--cluster_shape_mn", "2,1", "--compile_only", "--dump_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "MMA tiler (M, N): (256, 128), cluster shape (M, N): (2, 1)" in proc.stdout
    assert f"Compiled for {bw.DEFAULT_GPU_ARCH}:" in proc.stdout
    assert list(tmp_path.glob("*.ptx")) and list(tmp_path.glob("*.cubin"))


# ------------------------------------------------------------------------------------------
# Cross-compilation, and the warp roles' PTX run for a routing in global memory
# ------------------------------------------------------------------------------------------
@functools.cache
def _compiled(cfg, arch: str = bw.DEFAULT_GPU_ARCH):
    (vec, sf_dtype), c_dtype, tile, cluster = cfg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gemm, compiled = grouped.compile_grouped_gemm(
            vec,
            sf_dtype,
            c_dtype,
            tile,
            cluster,
            148 // (cluster[0] * cluster[1]),
            arch,
            tempfile.mkdtemp(),
        )
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    return gemm, compiled.__ptx__, deprecations


@functools.cache
def _dense_ptx(cfg) -> str:
    (vec, sf_dtype), c_dtype, tile, cluster = cfg
    _, compiled = bw.compile_gemm(
        vec,
        sf_dtype,
        c_dtype,
        tile,
        cluster,
        148 // (cluster[0] * cluster[1]),
        dump_dir=tempfile.mkdtemp(),
    )
    return compiled.__ptx__


def _opcodes(ptx: str) -> collections.Counter:
    """PTX instruction names of the kernel (host functions excluded)."""
    body = ptx[ptx.index(".entry") :]
    names = re.findall(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s", body, re.M)
    return collections.Counter(names)


MAINLOOP = ("tcgen05.mma", "tcgen05.cp", "cp.async.bulk.tensor", "tcgen05.ld", "mbarrier")


@pytest.mark.parametrize("cfg", CONFIGS, ids=_config_id)
def test_compiles_without_deprecated_api_and_keeps_the_dense_instructions(cfg):
    """The grouped kernel is the dense one with another schedule: the same MMA, scale copies,
    TMA loads and stores, TMEM loads and barriers, instruction for instruction (the counts of
    loop bodies); no local memory."""
    _, ptx, deprecations = _compiled(cfg)
    assert deprecations == [], [str(w.message) for w in deprecations]
    ours, dense = _opcodes(ptx), _opcodes(_dense_ptx(cfg))
    for prefix in MAINLOOP:

        def picked(counts, prefix=prefix):
            # (A, SFA and D lose their batch mode: one dimension fewer in those descriptors)
            names = (re.sub(r"\.\dd\.", ".", op) for op in counts.elements())
            return collections.Counter(op for op in names if op.startswith(prefix))

        assert picked(ours) == picked(dense), prefix
    assert ".local" not in ptx


# A routing: 8 M tiles in the buffers, groups out of order and one tile of group 4; the count of
# M tiles in use is none, some, or past the buffers (the kernel stops at their end).
TILE_GROUP = (3, 3, 0, 4, 1, 1, 2, 2)
COUNTS = (0, 6, 10)
GROUPS, K_TILES, N_CLUSTERS, GRID = 5, 3, 3, 4
TABLE, COUNT, ALPHA = 0x10000, 0x20000, 0x30000


class _Routed(PtxThread):
    """The interpreter with global loads from a memory of the routing and alpha (recorded)."""

    def __init__(self, ptx: str, memory: dict):
        super().__init__(ptx)
        self.memory = memory

    def _step(self, op: str, ops: list):
        if op.startswith("ld.global"):
            address = self.addr(ops[1])
            self.set(ops[0], self.memory.get(address))
            return ("ld.global", address)
        return super()._step(op, ops)


def _run(cfg, count: int, warp: int, rank: int, z: int) -> list[tuple]:
    _, ptx, _ = _compiled(cfg)
    _, _, (tile_m, _), (cm, _) = cfg
    m, k = len(TILE_GROUP) * tile_m, K_TILES * 256 - 32
    memory = {TABLE + 4 * t: g for t, g in enumerate(TILE_GROUP)}
    memory[COUNT] = count
    params = {(i, b): 0 for i in (0, 1) for b in range(12)}
    # (the schedule's fields follow alpha: the layouts between them are static)
    schedule = kernel_param("mAlpha") + 1
    params.update({(kernel_param("mA_mkl"), 0): m, (kernel_param("mA_mkl"), 4): k})
    params[(kernel_param("mAlpha"), 0)] = ALPHA
    params[(schedule, 0)] = len(TILE_GROUP) * N_CLUSTERS
    # (fields in order: tile count, the M and N divisors (two parameters each), the tables)
    for index, count in ((schedule + 1, len(TILE_GROUP)), (schedule + 3, N_CLUSTERS)):
        for offset, value in zip((0, 4, 8, 9), fast_divisor(count), strict=True):
            params[(index, offset)] = value
    params[(schedule + 5, 0)] = TABLE
    params[(schedule + 6, 0)] = COUNT
    special = {
        "%tid.x": 32 * warp,
        "%ctaid.x": rank % cm,
        "%ctaid.y": rank // cm,
        "%ctaid.z": z,
        "%nctaid.z": GRID,
        "%cluster_ctarank": rank,
    }
    return _Routed(ptx, memory).run(special, params)


def _expected_tiles(cfg, count: int, rank: int, z: int) -> list[tuple[int, int, int]]:
    """(CTA tile M, CTA tile N, group) of CTA ``rank`` in cluster ``z``, derived by hand: cluster
    tiles z, z + GRID, ... numbered N fastest, below ``count`` M tiles and the buffers' end."""
    _, _, _, (cm, cn) = cfg
    x, y = rank % cm, rank // cm
    m_tiles = min(count, len(TILE_GROUP))
    return [
        (w // N_CLUSTERS * cm + x, w % N_CLUSTERS * cn + y, TILE_GROUP[w // N_CLUSTERS])
        for w in range(z, m_tiles * N_CLUSTERS, GRID)
    ]


SIM_CONFIGS = [CONFIGS[0], CONFIGS[3]]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", SIM_CONFIGS, ids=_config_id)
def test_sim_tma_warp_loads_its_tiles_with_their_groups(cfg, count):
    """Every k-tile step of every tile a CTA walks: A's and SFA's coordinates carry no group,
    A's rows are the tile's; B's and SFB's last coordinate is the tile's group; B's rows are the
    N tile's; no tile at or past num_m_tiles is loaded."""
    _, _, (tile_m, tile_n), (cm, cn) = cfg
    pair = 2 if tile_m == 256 else 1
    atoms = ("tma_atom_a", "tma_atom_b", "tma_atom_sfa", "tma_atom_sfb")
    names = {kernel_param(name): name for name in atoms}
    for z in range(GRID):
        for rank in range(cm * cn):
            tiles = _expected_tiles(cfg, count, rank, z)
            loads = [e for e in _run(cfg, count, 5, rank, z) if e[0] == "load"]
            assert len(loads) == 4 * K_TILES * len(tiles), (rank, z, len(loads))
            for i in range(0, len(loads), 4):
                (m_cta, n_cta, group), kt = tiles[i // (4 * K_TILES)], i // 4 % K_TILES
                step = {names[e[1]]: e[2] for e in loads[i : i + 4]}
                a, b, sfa, sfb = (step[name] for name in atoms)
                where = (rank, z, m_cta, n_cta, kt)
                cta_m = tile_m // pair
                assert len(a) == 2 and a[0] == kt * 256, (where, a)
                assert m_cta * cta_m <= a[1] < (m_cta + 1) * cta_m, (where, a)
                assert len(b) == 3 and b[0] == kt * 256 and b[2] == group, (where, b)
                assert n_cta * tile_n <= b[1] < (n_cta + 1) * tile_n, (where, b)
                assert len(sfa) == 3 and sfa[2] == m_cta, (where, sfa)
                assert len(sfb) == 4 and sfb[3] == group, (where, sfb)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", SIM_CONFIGS, ids=_config_id)
def test_sim_epilogue_reads_each_tiles_alpha_and_stores_its_rows(cfg, count):
    """The epilogue's first warp: per tile, alpha of the tile's group (4 bytes apart), and TMA
    stores of D without a group coordinate: one per epilogue subtile of the tile (the CTA's rows
    by the subtile's columns, tile_budget's rule), each once, tile after tile; nothing for a
    CTA without tiles."""
    (vec, _), c_dtype, (tile_m, tile_n), (cm, cn) = cfg
    cta_m = tile_m // (2 if tile_m == 256 else 1)
    budget = bw.tile_budget((tile_m, tile_n), vec, c_dtype)
    epi_n = budget.epi_bytes_per_stage // (cta_m * bw.C_DTYPES[c_dtype].width // 8)
    for z in range(GRID):
        for rank in range(cm * cn):
            tiles = _expected_tiles(cfg, count, rank, z)
            events = _run(cfg, count, 0, rank, z)
            alphas = [e[1] for e in events if e[0] == "ld.global" and e[1] >= ALPHA]
            assert alphas == [ALPHA + 4 * g for _, _, g in tiles], (rank, z, alphas)
            stores = [tuple(e[2]) for e in events if e[0] == "store"]
            subtiles = tile_n // epi_n
            assert len(stores) == subtiles * len(tiles), (rank, z, len(stores))
            for t, (m_cta, n_cta, _) in enumerate(tiles):
                # (a tile's subtiles in the order its accumulator frees them)
                mine = sorted(stores[t * subtiles : (t + 1) * subtiles])
                want = [(n_cta * tile_n + col, m_cta * cta_m) for col in range(0, tile_n, epi_n)]
                assert mine == want, (rank, z, t, mine)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", SIM_CONFIGS, ids=_config_id)
def test_sim_no_role_reads_the_routing_past_its_table(cfg, count):
    """Every routing read is the count or an entry of the first num_m_tiles tiles that the
    buffers hold."""
    _, _, _, (cm, cn) = cfg
    in_use = {TABLE + 4 * t for t in range(min(count, len(TILE_GROUP)))}
    for warp in (0, 4, 5):
        for rank in range(cm * cn):
            reads = {e[1] for e in _run(cfg, count, warp, rank, 0) if e[0] == "ld.global"}
            table = {a for a in reads if TABLE <= a < COUNT}
            assert COUNT in reads, warp
            assert table <= in_use, (warp, table)


def test_cli_refuses_a_dump_dir_without_compile_only(tmp_path):
    """``--dump_dir`` is where ``--compile_only`` writes; a run writes nothing there, so the
    option alone would be ignored: exit 2 naming it, before any GPU check."""
    proc = _cli("--group_rows", "3", "--dump_dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "--dump_dir is where --compile_only writes" in proc.stderr
    assert "Traceback" not in proc.stderr
