# SPDX-License-Identifier: BSD-3-Clause
"""The eager fast path: what an eager call may skip, and what it must still check.

CPU: the Hopper launcher's per-problem ``_Launch`` cache (``gemm_for_ops``) driven with a
recording kernel: a hit takes the new operands' addresses, and every fact that can change
between calls of one shape (alignment, contiguity, alpha, the stream) sends the call back
through the full checks, which refuse it as on a first call; ``ops.eager``'s choice of path.
GPU (sm_90): the direct path gives the bits of the registered ops, skips the dispatcher, shares
its activation scratch safely between layers and graphs, and a static layer's alpha follows its
scales when they change.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

import fp4_ops
import reference
from fp4_ops import ops
from fp4_ops.layout import blocked_scale_numel
from fp4_ops.sm90 import gemm as k90
from fp4_ops.sm90 import launcher as r90

M, N, K, L = 16, 256, 512, 1


def _operands(vec=16, offset=0):
    """gemm_for_ops' W4A4 operands as CPU zeros; ``offset`` bytes shift a's base address."""
    storage = torch.zeros(L * M * K // 2 + 64, dtype=torch.uint8)
    base = (-storage.data_ptr()) % 16 + offset
    a = storage[base : base + L * M * K // 2].view(L, M, K // 2)
    b = torch.zeros(L, N, K // 2, dtype=torch.uint8)
    sfa = torch.zeros(L, blocked_scale_numel(M, K, vec), dtype=torch.uint8)
    sfb = torch.zeros(L, blocked_scale_numel(N, K, vec), dtype=torch.uint8)
    return [a, b, sfa, sfb, vec, torch.ones((), dtype=torch.float32), torch.bfloat16]


@pytest.fixture
def recorder(monkeypatch):
    """gemm_for_ops on the CPU: a kernel that records its launches, a settable stream, and the
    real operand checks less the CUDA-only ones (no GPU here)."""
    cpu = torch.device("cpu")
    launches, prepared, stream = [], [], [SimpleNamespace(cuda_stream=5, device=cpu)]

    def compile_gemm(
        vec, c_dtype, path, tiler, split, sms, options, cluster, tma, groups, a, grouped=False
    ):
        kernel = k90.BlockwiseGemmFp4Sm90(vec, path, tiler, cluster, split, tma, groups, a, grouped)
        return kernel, SimpleNamespace(__tvm_ffi_object__=lambda: lambda *x: launches.append(x))

    real_reasons, real_prepare = r90.operand_reasons, r90._prepare

    def reasons(*args):
        return [r for r in real_reasons(*args) if "CUDA" not in r and "current device" not in r]

    def prepare(*args, **kwargs):
        prepared.append(args)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(r90, "compile_gemm", compile_gemm)
    monkeypatch.setattr(r90, "operand_reasons", reasons)
    monkeypatch.setattr(r90, "_prepare", prepare)
    for cache in ("_LAUNCHES", "_KERNELS", "_WORKSPACES"):
        monkeypatch.setattr(r90, cache, {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream[0])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: -1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    return SimpleNamespace(launches=launches, prepared=prepared, stream=stream)


def _addresses(launch) -> list[int]:
    return list(launch[:5]) + [launch[8]]


def test_launch_cache_hit_takes_the_new_operands(recorder):
    first = _operands()
    out = r90.gemm_for_ops(*first)
    assert len(recorder.prepared) == 1 and out.shape == (L, M, N)
    second = _operands()
    out2 = r90.gemm_for_ops(*second)
    assert len(recorder.prepared) == 1, "a second call of one shape must not check it again"
    a, b, sfa, sfb, _, alpha, _ = second
    want = [t.data_ptr() for t in (a, b, sfa, sfb, out2, alpha)]
    assert _addresses(recorder.launches[-1]) == want
    assert recorder.launches[-1][5:8] == recorder.launches[0][5:8]  # (the same workspace)
    assert recorder.launches[-1][-2:] == ((M, N, K, L), 5)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda ops: ops.__setitem__(0, _operands(offset=8)[0]), "a must start on a 16-byte"),
        (lambda ops: ops.__setitem__(5, torch.ones(1, dtype=torch.float64)), "alpha must be"),
        (lambda ops: ops.__setitem__(5, torch.ones(2)), "alpha must be"),
        (lambda ops: ops.__setitem__(3, ops[3][:, :-16]), "sfb has shape"),
        (lambda ops: ops.__setitem__(4, 32), "sfa has shape"),
    ],
    ids=["misaligned-a", "alpha-float64", "alpha-two-elements", "sfb-short", "other-format"],
)
def test_launch_cache_hit_rechecks_what_can_change(recorder, change, needle):
    """A refusal on a later call of a cached shape is the first call's refusal, and the cached
    launch still serves good operands afterwards."""
    r90.gemm_for_ops(*_operands())
    bad = _operands()
    change(bad)
    with pytest.raises(ValueError, match=needle):
        r90.gemm_for_ops(*bad)
    launched = len(recorder.launches)
    r90.gemm_for_ops(*_operands())
    assert len(recorder.launches) == launched + 1


def test_launch_cache_is_per_stream(recorder):
    r90.gemm_for_ops(*_operands())
    recorder.stream[0] = SimpleNamespace(cuda_stream=6, device=torch.device("cpu"))
    r90.gemm_for_ops(*_operands())
    assert len(recorder.prepared) == 2
    first, other = recorder.launches
    assert other[-1] == 6 and set(first[5:8]).isdisjoint(other[5:8])


def test_eager_goes_direct_only_for_plain_untracked_cuda_tensors():
    cpu = torch.zeros(2)
    assert not ops.eager(cpu)
    assert not ops.eager(torch.zeros(2, device="meta"))
    with torch.device("meta"):
        assert not ops.eager(torch.zeros(2), None)


# ----------------------------------------------------------------------------- GPU (sm_90)

needs_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="the direct path runs the Hopper kernels: needs an sm_90 GPU",
)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
def test_gpu_direct_path_matches_the_registered_ops(activations):
    """Eager FP4Linear (direct) against the same layer with the dispatcher's path forced (x
    requiring a gradient): bit-identical, and the direct call never reaches the op."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 384, bias=True, device="cuda", dtype=torch.bfloat16)
    gs = 0.25 if activations == "static" else None
    layer = fp4_ops.FP4Linear.from_linear(linear, activations=activations, input_global_scale=gs)
    x = torch.randn(5, 512, device="cuda", dtype=torch.bfloat16)
    seen = []
    with torch.no_grad(), _OpRecorder(seen):
        direct = layer(x)
    assert not [op for op in seen if op.startswith("fp4_ops::")]
    dispatched = layer(x.clone().requires_grad_())
    assert torch.equal(direct, dispatched.detach())


@pytest.mark.gpu
@needs_hopper
def test_gpu_static_alpha_follows_its_scales():
    """A static layer's input and weight global scales, which the kernel reads and multiplies
    at every call: changed in place or replaced, the next call uses the new value (held against
    a float64 reference of the layer)."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(256, 128, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = fp4_ops.FP4Linear.from_linear(linear, activations="static", input_global_scale=0.5)
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for change in (None, lambda: layer.input_global_scale.mul_(4.0), lambda: _replace(layer)):
            if change is not None:
                change()
            want = _reference_static(layer, x)
            got = layer(x).double()
            # (D is bfloat16: half an ulp of the largest output)
            assert (got - want).abs().max() <= want.abs().max() * 2.0**-8


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_gpu_layers_of_one_shape_share_scratch_safely(activations):
    """W4A4 layers of one shape quantize their activations into one scratch per stream: a chain
    of three such layers (each reading what the one before wrote) gives the bits of the
    dispatcher's path, eagerly, on a second stream, and replayed from a CUDA graph with new
    inputs while eager calls run between replays."""
    torch.manual_seed(2)
    gs = 0.125 if activations == "static" else None
    layers = [
        fp4_ops.FP4Linear.from_linear(
            torch.nn.Linear(256, 256, bias=False, device="cuda", dtype=torch.bfloat16),
            activations=activations,
            input_global_scale=gs,
        )
        for _ in range(3)
    ]

    def chain(x):
        for layer in layers:
            x = torch.nn.functional.silu(layer(x))
        return x

    def dispatched(x):
        return chain(x.clone().requires_grad_()).detach()

    x = torch.randn(7, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(chain(x), dispatched(x))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = chain(x)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, dispatched(x))
        static_x = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):  # (side ran this shape first)
            static_y = chain(static_x)
        for seed in range(3):
            new = torch.randn(7, 256, device="cuda", dtype=torch.bfloat16)
            static_x.copy_(new * (seed + 1))
            graph.replay()
            eager = chain(new)  # (between replays: the eager scratch is not the graph's)
            assert torch.equal(static_y, dispatched(static_x))
            assert torch.equal(eager, dispatched(new))


def _replace(layer):
    layer.input_global_scale = torch.full((), 0.125, device="cuda")


def _reference_static(layer, x):
    """float64 truth of a static W4A4 layer: reference.py's quantizer at the layer's input
    scale, against the layer's weight."""
    gs = layer.input_global_scale.cpu()
    a, sfa, _ = reference.quantize_nvfp4(x.float().cpu(), global_scale=gs)
    w = layer.weight
    alpha = float(gs) * float(w.global_scale)
    b, sfb = w.data.view(torch.uint8).cpu(), w.plain_scales().cpu()
    f64 = torch.float64
    return reference.reference_gemm(a, b, sfa, sfb, 16, alpha, f64, accum_dtype=f64).cuda()


class _OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Names every op that reaches the dispatcher under it."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func._schema.name))
        return func(*args, **(kwargs or {}))
