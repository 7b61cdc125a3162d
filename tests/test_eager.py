# SPDX-License-Identifier: BSD-3-Clause
"""The eager fast path: what an eager call may skip, and what it must still check.

CPU: the Hopper launcher's per-problem ``Launch`` cache (``gemm_for_ops``) driven with a
recording kernel: a hit takes the new operands' addresses, and every fact that can change
between calls of one shape (alignment, contiguity, alpha, the stream) sends the call back
through the full checks, which refuse it as on a first call; ``ops.eager``'s choice of path.
GPU (sm_90): the direct path gives the bits of the registered ops, skips the dispatcher, shares
its activation scratch safely between layers and graphs, and a static layer's alpha follows its
scales when they change.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch

import fp4_ops
import reference
from fp4_ops import nn as fpnn
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
    compiled = []

    def compile_kernel(kernel, c_dtype, sms, options):
        compiled.append(c_dtype)
        return SimpleNamespace(__tvm_ffi_object__=lambda: lambda *x: launches.append(x))

    real_reasons, real_prepare = r90.operand_reasons, r90._prepare

    def reasons(*args):
        return [r for r in real_reasons(*args) if "CUDA" not in r and "current device" not in r]

    def prepare(*args, **kwargs):
        prepared.append(args)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(r90, "compile_kernel", compile_kernel)
    monkeypatch.setattr(r90, "operand_reasons", reasons)
    monkeypatch.setattr(r90, "_prepare", prepare)
    for cache in ("_LAUNCHES", "_KERNELS", "_WORKSPACES"):
        monkeypatch.setattr(r90, cache, {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream[0])
    # (a CUDA build of torch has a raw stream getter, which the launcher prefers)
    monkeypatch.setattr(r90, "stream_handle", lambda *_: stream[0].cuda_stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: -1)
    # (the configuration rule's SM count: an H200's, also where a real GPU is present)
    monkeypatch.setattr(r90, "gpu_sm_count", lambda *_: k90.H200_SM_COUNT)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    return SimpleNamespace(launches=launches, prepared=prepared, stream=stream, compiled=compiled)


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


def test_launch_cache_is_per_output_dtype(recorder):
    """A kernel writes D in the type it was compiled for: each new D dtype is checked and
    compiled anew, and a dtype seen before takes its own launch again."""
    for dtype in (torch.bfloat16, torch.float32, torch.float16, torch.bfloat16, torch.float32):
        ops = _operands()
        ops[6] = dtype
        assert r90.gemm_for_ops(*ops).dtype == dtype
    assert recorder.compiled == ["BFloat16", "Float32", "Float16"]
    assert len(recorder.prepared) == 3 and len(recorder.launches) == 5


def test_launch_cache_is_per_stream(recorder):
    r90.gemm_for_ops(*_operands())
    recorder.stream[0] = SimpleNamespace(cuda_stream=6, device=torch.device("cpu"))
    r90.gemm_for_ops(*_operands())
    assert len(recorder.prepared) == 2
    first, other = recorder.launches
    assert other[-1] == 6 and set(first[5:8]).isdisjoint(other[5:8])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [16, 4096], ids=["decode", "prefill"])
def test_tokens_launch_is_the_decode_kernel_without_its_prologue(recorder, m, dtype):
    """launch_for_tokens: on the decode path the picked W4A4 configuration with
    tokens_converted, whose kernel launches no prologue grid, and the token copy of its
    workspace, for every activation dtype the quantizer takes; None on the prefill path;
    activations the tokens' grid cannot quantize are refused by name."""
    k, n = 256, 64
    x = torch.zeros(m, k, dtype=dtype)
    b = torch.zeros(n, k // 2, dtype=torch.uint8)
    sfb = torch.zeros(blocked_scale_numel(n, k, 16), dtype=torch.uint8)
    args = (b, sfb, 16, torch.ones((), dtype=torch.float32), torch.float16)
    found = r90.launch_for_tokens(x, *args)
    if m > 2048:
        assert found is None and not r90._KERNELS
        return
    launch, copy, out = found
    assert out.shape == (m, n) and out.dtype == torch.float16
    [((config, _), (kernel, _))] = [(key, value[:2]) for key, value in r90._KERNELS.items()]
    assert config.tokens_converted and config.path == "decode" and not kernel.prologue
    rows = -(-m // kernel.tile_cols) * kernel.tile_cols
    assert copy is launch.workspace[1] and copy.shape == (1, rows, k)
    with pytest.raises(ValueError, match="tokens' grid quantizes"):
        r90.launch_for_tokens(x.to(torch.int32), *args)


@pytest.fixture
def token_route(recorder, monkeypatch):
    """FP4Linear's token route on the CPU: the Hopper GEMM's ``recorder`` and a step function
    that records the (quantizer config, GEMM config) pairs it is asked for and each call's
    arguments; nothing compiles a standalone quantizer (the step compiles its own)."""
    from fp4_ops import quantizer
    from fp4_ops.sm90 import tokens_step

    state = SimpleNamespace(calls=[], pairs=[], gemm_launches=recorder.launches)

    def function(q_config, gemm_config, index):
        state.pairs.append((q_config, gemm_config))
        return lambda *x: state.calls.append(x)

    monkeypatch.setattr(tokens_step, "_function", function)
    monkeypatch.setattr(quantizer, "_kernel", _no_standalone_quantizer)
    monkeypatch.setattr(quantizer, "stream_handle", lambda _: 5)
    monkeypatch.setattr(quantizer, "_TOKEN_SCALES", {})
    monkeypatch.setattr(quantizer, "_PARTIALS", {})
    monkeypatch.setattr(fpnn, "stream_handle", lambda _: 5)
    monkeypatch.setattr(fpnn, "current_device", lambda: -1)
    monkeypatch.setattr(fpnn, "runs_hopper_kernels", lambda _: True)
    return state


@pytest.mark.parametrize(
    "format, activations", [("nvfp4", "dynamic"), ("nvfp4", "static")] + [("mxfp4", "dynamic")]
)
@pytest.mark.parametrize("m", [4, 40], ids=["local-amax", "amax-grid"])
def test_token_route_binds_and_orders_its_two_grids(token_route, format, activations, m):
    """FP4Linear's token route on the CPU with a recording step: one host call whose arguments
    are the tokens grid's, taking x and writing the GEMM's copy and a global scale of its own
    (never the layer's static scale), then the prologue-free GEMM's, reading that copy, alpha
    (the static scale, or the one the quantizer wrote) and the weight's global scale; the
    pair of kernels it compiles is the tokens mode and the tokens_converted GEMM."""
    from fp4_ops import quantizer

    k, n = 512, 64
    linear = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    gs = 0.25 if activations == "static" else None
    layer = fp4_ops.FP4Linear.from_linear(linear, format, activations, gs)
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    vec = 16 if format == "nvfp4" else 32
    y = layer._forward_tokens(x, vec)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    calls = token_route.calls
    assert len(calls) == 1 and not token_route.gemm_launches
    [(q_config, gemm_config)] = token_route.pairs
    dynamic = format == "nvfp4" and layer.input_global_scale is None
    amax_grid = dynamic and m * k * 2 > quantizer.LOCAL_AMAX_BYTES
    local = dynamic and not amax_grid
    assert q_config == quantizer.QuantizerConfig("BFloat16", vec, dynamic, local, True)
    assert gemm_config.tokens_converted and gemm_config.path == "decode"
    q_args, g_args, stream = calls[0]
    assert stream == 5 and len(q_args) == 8 and len(g_args) == 12  # (addresses, then extents)
    copy = g_args[6]  # (the workspace's converted kernel B)
    assert q_args[0] == x.data_ptr() and q_args[1] == copy == g_args[0]
    gs_in, gs_out = q_args[3], q_args[4]
    static = layer.input_global_scale
    assert gs_out != (static.data_ptr() if static is not None else None)
    assert gs_in == (static.data_ptr() if static is not None else gs_out)
    assert (q_args[5] != gs_out) == amax_grid  # (the amax partials, or a stand-in)
    assert q_args[-2:] == ((m, k, 1), k90.H200_SM_COUNT)  # (the recorder's GPU: an H200)
    # GEMM: A (the copy), B, SFA stand-in, SFB, D, workspace x 3, alpha, offsets, scale
    assert g_args[1] == layer.weight_data.data_ptr() and g_args[3] == layer.weight_scale.data_ptr()
    assert g_args[4] == y.data_ptr() and g_args[8] == gs_in
    assert g_args[10] == layer.weight_global_scale.data_ptr()
    assert g_args[11] == (m, n, k, 1)


@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_token_route_plan_binds_scratch_and_every_buffer(token_route, monkeypatch, activations):
    """A token-route plan (``_Plan.make``) launches the bound step, never under CUDA-graph
    capture (it binds this stream's token copy and scale), and goes stale when the layer holds
    another tensor for any buffer the step reads, the static input scale included."""
    monkeypatch.setattr(ops, "current_device", lambda: -1)
    capture = [False]
    monkeypatch.setattr(fpnn, "capturing", lambda: capture[0])
    gs = 0.25 if activations == "static" else None
    linear = torch.nn.Linear(256, 64, bias=False, dtype=torch.bfloat16)
    layer = fp4_ops.FP4Linear.from_linear(linear, "nvfp4", activations, gs)
    x = aligned_buffer(4 * 256, dtype=torch.bfloat16).view(4, 256)
    plan = fpnn._Plan.make(layer, x)
    assert plan.scratch and plan.quantize is None and plan.takes(x, -1)
    y = plan(x, 5)
    [(q_args, g_args, stream)] = token_route.calls
    assert (q_args[0], g_args[4], stream) == (x.data_ptr(), y.data_ptr(), 5)
    capture[0] = True
    assert not plan.takes(x, -1)
    read = ["weight_data", "weight_scale", "weight_global_scale"]
    read += ["input_global_scale"] if activations == "static" else []
    for name in read:
        held = layer._buffers[name]
        assert plan.current(layer)
        layer._buffers[name] = held.clone()
        assert not plan.current(layer), name
        layer._buffers[name] = held


def _no_standalone_quantizer(*_, **__):
    raise AssertionError("the token route compiled a quantizer of its own")


def _bound_pair(seen: list, gemm_config):
    """A TokensQuantize, a BoundGemm whose kernel records its arguments, and the token copy
    they share."""
    from fp4_ops import quantizer

    t = [torch.zeros(16, dtype=torch.float32) for _ in range(10)]
    copy, gs_in, gs_out, partials = t[:4]
    q_config = quantizer.QuantizerConfig("BFloat16", 16, True, False, True)
    held = (copy, copy, gs_in, gs_out, partials)
    tail = (*(h.data_ptr() for h in held), (4, 256, 1), 132)
    quantize = quantizer.TokensQuantize(tail, held, q_config)
    workspace, unit = tuple(t[4:7]), t[7]
    launch = r90.Launch(
        lambda *a: seen.append(a), (4, 64, 256, 1), workspace, -1, unit, gemm_config
    )
    gemm = launch.bind(t[8], t[9], t[9], gs_out, t[8])
    return quantize, gemm, copy


def test_fused_step_hands_each_kernel_what_its_own_call_would(monkeypatch):
    """``tokens_step.fuse``: one call of the step, whose host function (run here with
    recording kernels) calls the quantizer with x and its bound tail, then the GEMM with the
    arguments of its bound call, the SM count and the same stream; a copy the quantizer is not
    bound to write is refused."""
    from fp4_ops.sm90 import tokens_step

    seen, compiled = [], []
    gemm_config = r90.GemmConfig(16, "BFloat16", path="decode", mma_tiler_mn=(8, 128))
    quantize, gemm, copy = _bound_pair(seen, gemm_config)
    x, out, stream = 1001, 1002, 7
    q_call = (x, *quantize.tail, stream)
    gemm(copy.data_ptr(), out, stream)
    [g_call] = seen

    def function(*key):
        compiled.append(key)
        return lambda *a: seen.append(a)

    monkeypatch.setattr(tokens_step, "_function", function)
    step = tokens_step.fuse(quantize, gemm, copy)
    assert compiled == [(quantize.config, gemm_config, -1)]
    step(x, out, stream)
    q_args, g_args, step_stream = seen[1]
    run = []
    host = tokens_step.TokensStep(lambda *a: run.append(a), lambda *a: run.append(a))
    tokens_step.TokensStep.__call__.__wrapped__(host, q_args, g_args, 132, step_stream)
    assert run == [q_call, (*g_call[:-1], 132, stream)]
    with pytest.raises(ValueError, match="token copy"):
        tokens_step.fuse(quantize, gemm, torch.zeros(16))


@pytest.mark.parametrize("k", [96, 128], ids=["k-padded", "k-whole"])
def test_bind_tokens_refuses_a_copy_short_of_k_rounded_up_to_64(k):
    """The token copy holds rows x K rounded up to 64 (the GEMM's k-blocks), 16-bit, contiguous
    and 16-byte aligned (the kernel's stores): one value short, 32-bit values, a strided or
    misaligned view are refused before anything is bound; the copy and the static global
    scale are what the bound call holds."""
    from fp4_ops import quantizer

    x = torch.zeros(3, k, dtype=torch.bfloat16)
    gs, gs_out = torch.full((), 0.5), torch.zeros(())
    need = 3 * 128
    for bad in (torch.zeros(need - 1, dtype=torch.bfloat16), torch.zeros(need)):
        with pytest.raises(ValueError, match="copy must hold 16-bit values for 3 x"):
            quantizer.bind_tokens(x, 16, bad, gs, gs_out, 132)
    wide = torch.zeros(2 * need + 8, dtype=torch.bfloat16)
    for bad in (wide[: 2 * need : 2], wide[1 : need + 1], wide[4 : need + 4]):
        with pytest.raises(ValueError, match="copy must be contiguous and 16-byte aligned"):
            quantizer.bind_tokens(x, 16, bad, gs, gs_out, 132)
    copy = torch.zeros(need, dtype=torch.bfloat16)
    bound = quantizer.bind_tokens(x, 16, copy, gs, gs_out, 132)
    assert bound.held[0] is copy and bound.held[2] is gs and bound.tail[-2:] == ((3, k, 1), 132)
    assert bound.config == quantizer.QuantizerConfig("BFloat16", 16, False, False, True)


@pytest.mark.parametrize("tokens, converted", [(True, False), (False, True), (False, False)])
def test_tokens_step_pairs_only_the_tokens_quantizer_with_a_tokens_gemm(tokens, converted):
    """A step whose quantizer does not write the token copy, or whose GEMM does not read it,
    is refused before anything compiles."""
    from fp4_ops import quantizer
    from fp4_ops.sm90 import tokens_step

    q = quantizer.QuantizerConfig("BFloat16", 16, True, True, tokens)
    g = r90.GemmConfig(
        16, "BFloat16", path="decode", mma_tiler_mn=(8, 128), tokens_converted=converted
    )
    with pytest.raises(ValueError, match=f"tokens={tokens}, tokens_converted={converted}"):
        tokens_step.compile_tokens_step(q, g, 132)


@pytest.mark.parametrize("local, tokens", [(True, False), (False, True), (True, True)])
def test_quantizer_config_makes_the_kernel_it_names(local, tokens):
    """Each field of a QuantizerConfig reaches the kernel object it compiles (the cache key
    and the kernel must agree)."""
    from fp4_ops import quantizer

    config = quantizer.QuantizerConfig("Float16", 16, True, local, tokens)
    kernel = config.kernel()
    assert (kernel.in_dtype_name, kernel.sf_vec_size, kernel.dynamic) == ("Float16", 16, True)
    assert (kernel.local_amax, kernel.tokens) == (local, tokens)


def test_step_functions_are_compiled_once_per_pair_and_device(monkeypatch):
    """A step is compiled once per (quantizer config, GEMM config, device): another GEMM
    configuration, quantizer configuration or device compiles its own."""
    from dataclasses import replace

    from fp4_ops import quantizer
    from fp4_ops.sm90 import tokens_step

    compiled = []

    def compile_step(q_config, gemm_config, sms, options):
        compiled.append((q_config, gemm_config))
        fn = object()
        return SimpleNamespace(__tvm_ffi_object__=lambda: fn)

    monkeypatch.setattr(tokens_step, "compile_tokens_step", compile_step)
    monkeypatch.setattr(tokens_step, "gpu_sm_count", lambda *_: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(tokens_step, "_STEPS", {})
    q = quantizer.QuantizerConfig("BFloat16", 16, True, True, True)
    g = r90.GemmConfig(16, "BFloat16", path="decode", mma_tiler_mn=(8, 128), tokens_converted=True)
    keys = [(q, g, 0), (q, replace(g, split_k=2), 0), (replace(q, dynamic=False), g, 0), (q, g, 1)]
    fns = [tokens_step._function(*key) for key in keys]
    assert len(compiled) == 4 and len({id(f) for f in fns}) == 4
    assert [tokens_step._function(*key) for key in keys] == fns and len(compiled) == 4


def test_eager_goes_direct_only_for_plain_untracked_cuda_tensors():
    cpu = torch.zeros(2)
    assert not ops.eager(cpu)
    assert not ops.eager(torch.zeros(2, device="meta"))
    with torch.device("meta"):
        assert not ops.eager(torch.zeros(2), None)


def _cpu_layer(activations="dynamic", seed=0):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(64, 32, bias=True, dtype=torch.bfloat16)
    gs = 0.5 if activations == "static" else None
    return fp4_ops.FP4Linear.from_linear(linear, activations=activations, input_global_scale=gs)


def _plan_of(layer):
    """A plan as ``_Plan.make`` binds a layer's tensors (no kernels: the bookkeeping only)."""
    names = [n for n, t in layer._buffers.items() if t is not None]
    parts = tuple((n, layer._buffers[n], fpnn._address(layer._buffers[n])) for n in names)
    return fpnn._Plan(parts, layer._parameters.get("bias"), (1, 32), None, None, None, False)


@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
def test_plan_is_stale_once_the_layer_holds_other_tensors(activations):
    """A plan stays current through in-place loads and goes stale once any tensor it bound is
    replaced (a load with assign=True, an assigned buffer, a new bias) or a buffer's storage
    is (``.data =``: the same object at another address, which the plan's launch would read)."""
    layer, other = _cpu_layer(activations), _cpu_layer(activations, seed=1)
    plan = _plan_of(layer)
    layer.load_state_dict(other.state_dict())
    assert plan.current(layer)
    layer.load_state_dict(other.state_dict(), assign=True)
    assert not plan.current(layer)
    plan = _plan_of(layer)
    layer.weight_scale = layer.weight_scale.clone()
    assert not plan.current(layer)
    plan = _plan_of(layer)
    layer.bias = torch.nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
    assert not plan.current(layer)
    for name in [n for n, t in layer._buffers.items() if t is not None]:
        plan = _plan_of(layer)
        layer._buffers[name].data = layer._buffers[name].clone()
        assert not plan.current(layer), name


def test_plans_are_dropped_by_moves_casts_and_pickles():
    """A layer's plans hold its tensors and compiled launches: a move or cast (which replaces
    the tensors), a pickle and a deepcopy leave none behind."""
    import copy
    import pickle

    for change in (
        lambda m: m.to(torch.float16),
        lambda m: m.cpu(),
        lambda m: pickle.loads(pickle.dumps(m)),
        copy.deepcopy,
    ):
        layer = _cpu_layer()
        layer._plans = {"key": _plan_of(layer)}
        assert change(layer)._plans is None


def aligned_buffer(n: int, offset: int = 0, dtype=torch.uint8) -> torch.Tensor:
    """n elements of a CPU buffer, ``offset`` bytes past a 16-byte boundary."""
    size = torch.tensor([], dtype=dtype).element_size()
    buf = torch.zeros(n * size + 64, dtype=torch.uint8)
    base = (-buf.data_ptr()) % 16 + offset
    return buf[base : base + n * size].view(dtype)


@pytest.fixture
def device_index(monkeypatch):
    """The plan checks' view of the current device (-1: CPU tensors' get_device()) and of
    CUDA-graph capture (off), both settable."""
    state = SimpleNamespace(device=-1, capturing=False)
    monkeypatch.setattr(ops, "current_device", lambda: state.device)
    monkeypatch.setattr(ops, "capturing", lambda: state.capturing)
    return state


def test_launchable_refuses_what_a_plan_cannot_launch(device_index):
    """A plan takes x contiguous, 16-byte aligned, on the current device, asking no gradient."""
    x = aligned_buffer(64, dtype=torch.float32).view(4, 16)
    assert ops.launchable(x, -1)
    assert not ops.launchable(x.t(), -1)
    assert not ops.launchable(aligned_buffer(64, 4, torch.float32).view(4, 16), -1)
    assert not ops.launchable(x.clone().requires_grad_(), -1)
    with torch.no_grad():
        assert ops.launchable(x.clone().requires_grad_(), -1)
    device_index.device = 0
    assert not ops.launchable(x, -1)


def test_quantize_plan_takes_only_its_kind_of_scale(device_index):
    """A planned quantize takes a dynamic scale outside capture, and a static one only as a
    float32 one-element tensor on x's device that asks no gradient."""
    x = aligned_buffer(64, dtype=torch.float32).view(2, 32)
    assert ops._quantize_takes(x, None, -1)
    device_index.capturing = True
    assert not ops._quantize_takes(x, None, -1)
    gs = torch.full((), 0.5)
    assert ops._quantize_takes(x, gs, -1)
    for bad in (gs.double(), torch.full((2,), 0.5), 0.5, gs.clone().requires_grad_()):
        assert not ops._quantize_takes(x, bad, -1), bad
    device_index.device = 0
    assert not ops._quantize_takes(x, gs, -1)


def test_gemm_plan_takes_aligned_parts_and_one_global_scale_each(device_index):
    """A planned fp4_gemm needs every data and scale part 16-byte aligned, 0-d global scales,
    b on a's device, which is the current one."""
    a = fp4_ops.quantize(torch.randn(4, 64))
    b = fp4_ops.quantize(torch.randn(8, 64))
    assert ops._gemm_takes(a, b, -1)
    shifted = aligned_buffer(a.scale.numel(), 8).view(a.scale.shape).view(a.scale.dtype)
    odd = fp4_ops.FP4Tensor(a.data, shifted.copy_(a.scale), a.global_scale, "nvfp4")
    assert not ops._gemm_takes(odd, b, -1) and not ops._gemm_takes(a, odd, -1)
    batched = fp4_ops.quantize(torch.randn(2, 8, 64))
    per_batch = fp4_ops.FP4Tensor(batched.data, batched.scale, torch.ones(2), "nvfp4")
    assert not ops._gemm_takes(per_batch, per_batch, -1)
    device_index.device = 0
    assert not ops._gemm_takes(a, b, -1)


@pytest.mark.parametrize("w4a16", [True, False], ids=["w4a16", "w4a4"])
@pytest.mark.parametrize("scale", [True, False], ids=["scale", "unit"])
def test_bound_gemm_passes_what_the_full_launch_passes(w4a16, scale):
    """A BoundGemm's call hands the kernel the same addresses, in the same order, as the
    Launch it came from given the same operands."""
    seen = []
    t = [torch.zeros(16, dtype=torch.float32) for _ in range(10)]
    config = r90.GemmConfig()
    launch = r90.Launch(lambda *a: seen.append(a), (1, 2, 3, 1), tuple(t[:3]), -1, t[3], config)
    a, b, sfa, sfb, out, alpha = t[4], t[5], None if w4a16 else t[6], t[7], t[8], t[9]
    gs = t[0] if scale else None
    launch(a, b, sfa, sfb, out, alpha, 7, scale=gs)
    launch.bind(b, sfa, sfb, alpha, gs)(a.data_ptr(), out.data_ptr(), 7)
    assert seen[0] == seen[1]


def test_unchecked_holds_the_parts_it_is_given():
    data, scale = torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(1, 1, 512, dtype=torch.uint8)
    gs = torch.ones(())
    t = fp4_ops.FP4Tensor.unchecked(data, scale, gs, "mxfp4")
    assert t.data is data and t.scale is scale and t.global_scale is gs and t.format == "mxfp4"


def test_a_quantize_plan_makes_outputs_of_its_shapes():
    """Outputs of the plan's shapes (batched too), dtypes and device, new at every call."""
    from fp4_ops import quantizer

    templates = quantizer.output_templates(
        (3, 2, 32), (3, 1, 1, 512), torch.float8_e4m3fn, torch.device("cpu")
    )
    config = quantizer.QuantizerConfig("Float32", 16, True)
    plan = quantizer.QuantizePlan(lambda *a: None, templates, ((2, 64, 3), 132), None, config)
    q, sf, g = plan(torch.zeros(3, 2, 64), None, 0)
    assert (q.shape, q.dtype) == ((3, 2, 32), torch.uint8)
    assert (sf.shape, sf.dtype) == ((3, 1, 1, 512), torch.float8_e4m3fn)
    assert (g.shape, g.dtype) == ((), torch.float32)
    # (each its own dense storage, as the kernel writes them whole)
    for t in (q, sf, g):
        assert t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    again = plan(torch.zeros(3, 2, 64), None, 0)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(again, (q, sf, g), strict=True))


def test_scratch_buffers_are_kept_per_shape_format_and_stream(monkeypatch):
    """A layer's activation scratch holds its own format's blocked scales (128-row atoms, 4
    scale columns each): kept per x shape, format and stream, so that layers of one shape in
    two formats, or on two streams, never write each other's."""
    from fp4_ops import quantizer

    stream = [5]
    monkeypatch.setattr(quantizer, "stream_handle", lambda *_: stream[0])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(quantizer, "_SCRATCH", {})
    x = torch.zeros(200, 320, dtype=torch.bfloat16)
    seen = {}
    for vec, handle in ((32, 5), (16, 5), (32, 5), (16, 6), (16, 5)):
        stream[0] = handle
        q, sf, gs = quantizer.scratch_buffers(x, vec)
        assert (q.shape, q.dtype, gs.shape) == ((200, 160), torch.uint8, ())
        assert sf.numel() == 256 * -(-(320 // vec) // 4) * 4, vec
        # (the first call of a format and stream makes its buffers, later ones find them)
        assert seen.setdefault((vec, handle), sf.data_ptr()) == sf.data_ptr(), (vec, handle)
    assert len(set(seen.values())) == 3


@pytest.mark.parametrize(
    "vec, static, local",
    [(16, False, False), (16, False, True), (16, True, False), (32, False, False)],
)
def test_bound_quantize_passes_what_a_planned_call_passes(vec, static, local):
    """A QuantizePlan bound to fixed outputs hands the kernel the addresses a call with new
    outputs would, in the same order: x, codes, scales, the input global scale, the output
    one, the amax partials (dynamic with an amax grid) or a stand-in."""
    from fp4_ops import quantizer

    seen = []
    partials = None if static or local or vec == 32 else torch.zeros(640, dtype=torch.int32)
    templates = quantizer.output_templates((2, 32), (1, 1, 512), torch.uint8, torch.device("cpu"))
    config = quantizer.QuantizerConfig("Float32", vec, vec == 16 and not static, local)
    plan = quantizer.QuantizePlan(
        lambda *args: seen.append(args), templates, ((2, 64, 1), 132), partials, config
    )
    x = torch.zeros(2, 64)
    gs = torch.full((), 0.5) if static else None
    q, sf, g = plan(x, gs, 9)
    plan.bind((q, sf, g), gs)(x.data_ptr(), 9)
    assert seen[0] == seen[1]
    want_in = gs if static else g
    want_partials = g if partials is None else partials
    assert seen[1][3:6] == (want_in.data_ptr(), g.data_ptr(), want_partials.data_ptr())


@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
@pytest.mark.parametrize("rows", [4, 300], ids=["local-amax", "amax-grid"])
def test_quantize_into_scratch_passes_what_new_outputs_would(monkeypatch, static, rows):
    """``launch_quantize`` into a layer's scratch hands the kernel what a call with new outputs
    does: x, then (the scratch's) codes, scales and global scale, the input scale a static
    layer gives (a dynamic one: the output scale), and the same amax partials."""
    from fp4_ops import quantizer

    seen = []
    monkeypatch.setattr(quantizer, "_kernel", lambda *_: (lambda *a: seen.append(a), 132))
    monkeypatch.setattr(quantizer, "stream_handle", lambda *_: 9)
    monkeypatch.setattr(quantizer, "_PARTIALS", {})
    monkeypatch.setattr(quantizer, "_SCRATCH", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: -1)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    x = torch.zeros(rows, 256, dtype=torch.bfloat16)
    gs = torch.full((), 0.25) if static else None
    q, sf, g = quantizer.launch_quantize(x, 16, gs)
    scratch = quantizer.scratch_buffers(x, 16)
    assert quantizer.launch_quantize(x, 16, gs, scratch) is scratch
    new, into = seen
    grid = not static and rows == 300  # (an amax grid: its partials, the stream's buffer)
    for args, (codes, scales, out) in ((new, (q, sf, g)), (into, scratch)):
        assert args[:3] == (x.data_ptr(), codes.data_ptr(), scales.data_ptr())
        assert args[3:5] == ((gs if static else out).data_ptr(), out.data_ptr())
        assert args[5] == (new[5] if grid else out.data_ptr())
    assert into[6:] == new[6:]


@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_scratch_route_plan_binds_the_full_path_s_scales(monkeypatch, activations):
    """A W4A4 plan off the token route (``_Plan.make``) binds what the full path passes: the
    quantizer writes the layer's scratch with the layer's input scale (static) or none, and the
    GEMM reads the scratch's codes, scales and global scale as alpha, times the weights' global
    scale."""
    from fp4_ops import quantizer
    from fp4_ops.sm90 import launcher

    calls = {}

    def launch_for_ops(*args, **kwargs):
        calls["launch"] = (args, kwargs)
        return SimpleNamespace(bind=lambda *b: calls.setdefault("gemm", b))

    def plan_quantize(*args):
        calls["plan"] = args
        return SimpleNamespace(bind=lambda *b: calls.setdefault("quantize", b))

    scratch = (torch.zeros(4, 128, dtype=torch.uint8), torch.zeros(512), torch.zeros(()))
    monkeypatch.setattr(launcher, "launch_for_ops", launch_for_ops)
    monkeypatch.setattr(quantizer, "plan_quantize", plan_quantize)
    monkeypatch.setattr(quantizer, "scratch_buffers", lambda *_: scratch)
    gs_in = 0.5 if activations == "static" else None
    linear = torch.nn.Linear(256, 64, bias=False, dtype=torch.bfloat16)
    layer = fp4_ops.FP4Linear.from_linear(linear, "nvfp4", activations, gs_in)
    monkeypatch.setattr(layer, "_tokens_route", lambda *_: None)
    x = aligned_buffer(4 * 256, dtype=torch.bfloat16).view(4, 256)
    plan = fpnn._Plan.make(layer, x)
    q, sq, gs = scratch
    w, sw, gw = layer.weight_data, layer.weight_scale, layer.weight_global_scale
    assert calls["quantize"] == (scratch, layer.input_global_scale)
    assert calls["launch"] == ((q, w, sq, sw, 16, gs, torch.bfloat16), {"scale": gw})
    assert calls["gemm"] == (w, sq, sw, gs, gw)
    assert plan.a == q.data_ptr() and plan.scratch


# ----------------------------------------------------------------------------- GPU (sm_90)

needs_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="the direct path runs the Hopper kernels: needs an sm_90 GPU",
)


# (past the Hopper GEMM's decode path, where a W4A4 layer's plan quantizes, then multiplies)
PREFILL_ROWS = 2100


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
@pytest.mark.parametrize(
    "rows, offset", [(5, 0), (5, 1), (PREFILL_ROWS, 0)], ids=["tokens", "misaligned", "prefill"]
)
def test_gpu_direct_path_matches_the_registered_ops(activations, rows, offset):
    """Eager FP4Linear (direct) against the same layer with the dispatcher's path forced (x
    requiring a gradient): bit-identical, and the direct call never reaches the op. W4A4 takes
    the tokens step on aligned decode rows and quantizes into its scratch on the others."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 384, bias=True, device="cuda", dtype=torch.bfloat16)
    gs = 0.25 if activations == "static" else None
    layer = fp4_ops.FP4Linear.from_linear(linear, activations=activations, input_global_scale=gs)
    x = torch.randn(rows * 512 + offset, device="cuda", dtype=torch.bfloat16)[offset:]
    x = x.view(rows, 512)
    seen = []
    with torch.no_grad(), _OpRecorder(seen):
        direct = layer(x)
    assert not [op for op in seen if op.startswith("fp4_ops::")]
    dispatched = layer(x.clone().requires_grad_())
    assert torch.equal(direct, dispatched.detach())
    if activations != "bf16":
        assert (layer._tokens_route(x, 16) is None) == (rows != 5 or offset != 0)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_gpu_new_token_counts_keep_the_memory_bounded(activations, monkeypatch):
    """Eager prefill calls at ever new token counts (prompt lengths) stop adding memory that
    stays once the library's caches (small caps here) and the layer's plans are full, and every
    checked call matches the layer's CPU path: the caches start over while plans still hold
    older workspaces, and the prefill weights' copy is shared across token counts."""
    from fp4_ops import memory

    monkeypatch.setattr(r90, "_MAX_WORKSPACES", 6)
    monkeypatch.setattr(r90, "_MAX_LAUNCHES", 6)
    monkeypatch.setattr(memory, "MAX_KEPT", 6)
    torch.manual_seed(3)
    linear = torch.nn.Linear(1024, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = fp4_ops.FP4Linear.from_linear(linear, activations=activations)
    on_cpu = copy.deepcopy(layer).cpu()
    calls, allocated = 60, []
    with torch.no_grad():
        for i in range(calls):
            x = torch.randn(2049 + i, 1024, device="cuda", dtype=torch.bfloat16)
            y = layer(x)
            if i % 7 == 0:
                want, got = on_cpu(x.cpu()).double(), y.cpu().double()
                # (D is bfloat16; the two paths sum in other orders)
                assert (got - want).abs().max() <= want.abs().max() * 2.0**-7, i
            allocated.append(torch.cuda.memory_allocated())
    # (the held workspaces grow by a few KB a call as the token counts do; a workspace kept
    # for every token count adds >= 2 MB a call: the weights' copy, or W4A4's activations)
    half = calls // 2
    assert max(allocated[half:]) - allocated[half] <= 16 * 2**20, [a >> 20 for a in allocated]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
def test_gpu_planned_layer_reads_storage_swapped_under_it(activations):
    """A planned layer whose buffers and bias get new storage through ``.data =`` (the same
    objects at other addresses) computes with the new values at its next call, bit for bit as
    a layer built from them, though the old storage is freed and reused in between."""
    torch.manual_seed(4)
    gs = 0.25 if activations == "static" else None

    def make():
        linear = torch.nn.Linear(256, 128, device="cuda", dtype=torch.bfloat16)
        return fp4_ops.FP4Linear.from_linear(linear, activations=activations, input_global_scale=gs)

    layer, other = make(), make()
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x), layer(x)  # (the first call leaves a plan, the second launches it)
        for name, t in layer._buffers.items():
            if t is not None:
                t.data = other._buffers[name].clone()
        layer.bias.data = other.bias.detach().clone()
        junk = [torch.full((1 << 20,), -7.0, device="cuda") for _ in range(8)]  # (reuse)
        assert torch.equal(layer(x), other(x))
        del junk


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


def _square_layers(activations: str, k: int, count: int, static_scale: float) -> list:
    """``count`` W4A4 layers [k, k] without bias on the GPU, at ``static_scale`` if static."""
    gs = static_scale if activations == "static" else None
    return [
        fp4_ops.FP4Linear.from_linear(
            torch.nn.Linear(k, k, bias=False, device="cuda", dtype=torch.bfloat16),
            activations=activations,
            input_global_scale=gs,
        )
        for _ in range(count)
    ]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_gpu_layers_of_one_shape_share_scratch_safely(activations):
    """W4A4 layers of one shape quantize their activations into one scratch per stream: a chain
    of three such layers (each reading what the one before wrote) gives the bits of the
    dispatcher's path, eagerly, on a second stream, and replayed from a CUDA graph with new
    inputs while eager calls run between replays."""
    torch.manual_seed(2)
    layers = _square_layers(activations, 256, 3, 0.125)

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


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_gpu_back_to_back_layers_read_what_the_one_ahead_wrote(activations):
    """W4A4 layers of one square shape called back to back, each on the output of the one
    ahead with no other kernel between (x of 32 KB: one quantizer grid, also when dynamic):
    each quantizer must wait for the GEMM ahead (which releases dependent grids early) before
    it reads x or rewrites the token copy, for the dispatcher's bits at every call."""
    torch.manual_seed(3)
    layers = _square_layers(activations, 2048, 4, 0.05)

    def chain(x):
        for layer in layers:
            x = layer(x)
        return x

    with torch.no_grad():
        for seed in range(6):
            x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16) * (seed + 1)
            got = chain(x)
            assert torch.equal(got, chain(x.clone().requires_grad_()).detach()), seed


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


# ----------------------------------------------------------------------------- plans (GPU)


def _layer(activations, bias=True, n=384, k=512, seed=0):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    gs = 0.25 * (seed + 1) if activations == "static" else None  # (layers of other seeds differ)
    return fp4_ops.FP4Linear.from_linear(linear, activations=activations, input_global_scale=gs)


def _full_path(layer, x):
    """The layer's output through the registered ops (x requiring a gradient): no plan."""
    with torch.enable_grad():
        return layer(x.clone().requires_grad_()).detach()


def _no_full_path(*_):
    raise AssertionError("a planned call went through the full path")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
@pytest.mark.parametrize(
    "shape", [(5, 512), (2, 3, 512), (PREFILL_ROWS, 512)], ids=["2d", "3d", "prefill"]
)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_gpu_planned_forward_gives_the_full_paths_bits(activations, shape, bias):
    """The second eager call of a shape launches the layer's plan (the full path is not
    reached) and gives the dispatcher's bits, for new inputs of that shape at every call; a
    prefill shape plans W4A4 as quantize-then-GEMM, not the decode tokens step."""
    layer = _layer(activations, bias)
    with torch.no_grad():
        layer(torch.randn(shape, device="cuda", dtype=torch.bfloat16))
        layer._forward = _no_full_path
        for _ in range(2):
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            y = layer(x)
            del layer._forward
            assert y.shape == (*shape[:-1], 384)
            assert torch.equal(y, _full_path(layer, x))
            layer._forward = _no_full_path


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "format, activations",
    [("nvfp4", "dynamic"), ("nvfp4", "static"), ("mxfp4", "dynamic")],
    ids=["nvfp4-dynamic", "nvfp4-static", "mxfp4"],
)
@pytest.mark.parametrize(
    "m, k, dtype",
    [(1, 96, torch.bfloat16), (37, 160, torch.float16), (3, 256, torch.float32)]
    + [(64, 1024, torch.bfloat16)],
    ids=["1x96-bf16", "37x160-f16", "3x256-f32", "64x1024-bf16"],
)
def test_gpu_quantizer_token_copy_gives_the_prologue_bits(format, activations, m, k, dtype):
    """W4A4 on the Hopper decode path, eagerly: the quantizer writes the GEMM's token copy and
    no prologue grid runs. The first (direct) call and the planned ones give the dispatcher's
    bits (the quantize op, then the GEMM whose prologue grid converts its codes): K of one and
    a half k-blocks, F16 and F32 activations, and a dynamic x past the one-launch size (its
    amax grid first)."""
    torch.manual_seed(5)
    linear = torch.nn.Linear(k, 200, device="cuda", dtype=dtype)
    gs = 0.03 if activations == "static" else None
    layer = fp4_ops.FP4Linear.from_linear(linear, format, activations, gs)
    with torch.no_grad():
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        assert layer._tokens_route(x, 16 if format == "nvfp4" else 32) is not None
        for scale in (1.0, 3.0, 0.5):
            x = torch.randn(m, k, device="cuda", dtype=dtype) * scale
            y = layer(x)
            assert y.dtype == dtype and torch.equal(y, _full_path(layer, x))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("shape", [(128, 12288, 8192), (96, 8192, 8192)])
@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
def test_gpu_split_cluster_pick_gives_the_global_fixups_bits(activations, shape, monkeypatch):
    """M tokens through a K -> N layer (``shape``), where ``default_config``'s pick (128 x 128
    tiles split 2, one wave; W4A4 at K = 8192 only because the split runs on clusters) runs
    each tile's two K splits as a 2x1 cluster: the eager call (W4A4: the quantizer's token
    copy, no prologue grid) and the registered ops give the bits of the same layer on the
    global split-K fix-up (the cluster rule patched off)."""
    layer = _layer(activations, n=shape[2], k=shape[1])
    x = torch.randn(shape[:2], device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        clustered = [layer(x) for _ in range(2)]
    picks = list(r90._PICKED.values())
    assert any(c.cluster_shape_mn == (2, 1) and c.path == "decode" for c in picks), picks
    full = _full_path(layer, x)
    # the same layer with the rule off, and no pick, launch or plan kept from above
    monkeypatch.setattr(r90, "split_cluster_fits", lambda *_: False)
    monkeypatch.setattr(r90, "_PICKED", {})
    monkeypatch.setattr(r90, "_LAUNCHES", {})
    monkeypatch.setattr(ops, "_GEMM_PLANS", {})
    plain = _layer(activations, n=shape[2], k=shape[1])
    with torch.no_grad():
        want = plain(x)
    assert all(c.cluster_shape_mn == (1, 1) for c in r90._PICKED.values())
    for y in (*clustered, full):
        assert torch.equal(y, want)


def _replace_weights(layer, other):
    layer.load_state_dict(other.state_dict(), assign=True)


def _copy_weights(layer, other):
    layer.load_state_dict(other.state_dict())


def _move(layer, other):
    layer.cpu()
    _copy_weights(layer, other)
    layer.cuda()


def _new_bias(layer, other):
    layer.bias = torch.nn.Parameter(other.bias.detach().clone(), requires_grad=False)
    _copy_weights(layer, other)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic", "static"])
@pytest.mark.parametrize(
    "change", [_replace_weights, _copy_weights, _move, _new_bias], ids=lambda f: f.__name__[1:]
)
@pytest.mark.parametrize("rows", [4, PREFILL_ROWS], ids=["decode", "prefill"])
def test_gpu_plan_follows_the_layers_tensors(activations, change, rows):
    """Weights, scales or bias replaced, copied in place, or the layer moved off the GPU and
    back: the next call computes with the new tensors (the bits of a layer made from them),
    on both of a W4A4 layer's plan routes."""
    layer, other = _layer(activations, seed=0), _layer(activations, seed=1)
    x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):  # (the second call is planned)
            before = layer(x)
        change(layer, other)
        after = layer(x)
        assert torch.equal(after, other(x)) and not torch.equal(after, before)
        assert torch.equal(layer(x), after)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
@pytest.mark.parametrize("how", ["transposed", "misaligned", "grad"])
def test_gpu_calls_a_plan_cannot_take_use_the_full_path(activations, how):
    """After a plan exists for the shape: a non-contiguous x, an x 2 bytes off a 16-byte
    boundary, and an x that asks for a gradient take the full path, with its result (and its
    refusal of a backward)."""
    layer = _layer(activations)
    x = torch.randn(6, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x)
        layer(x)
    want = _full_path(layer, x)
    if how == "transposed":
        odd = x.t().contiguous().t()
    elif how == "misaligned":
        odd = torch.empty(x.numel() + 8, device="cuda", dtype=torch.bfloat16)[1:][: x.numel()]
        odd = odd.view(6, 512).copy_(x)
    else:
        odd = x.clone().requires_grad_()
    y = layer(odd)
    assert torch.equal(y.detach(), want)
    if how == "grad":
        with pytest.raises(RuntimeError, match="inference only"):
            y.sum().backward()


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize(
    "how", ["transposed", "misaligned", "grad", "scale-float64", "scale-number"]
)
def test_gpu_quantize_calls_its_plan_cannot_take_use_the_full_path(static, how):
    """After quantize has a plan for the shape: a non-contiguous x, an x 4 bytes off a 16-byte
    boundary, an x that asks for a gradient and (static) a float64 or Python-number scale take
    the full path, with the CPU quantizer's bytes."""
    if how.startswith("scale") and not static:
        pytest.skip("a dynamic scale has no scale argument")
    torch.manual_seed(7)
    x = torch.randn(12, 192, device="cuda")  # (a shape of its own)
    gs = torch.full((), 0.02, device="cuda") if static else None
    for _ in range(2):
        fp4_ops.quantize(x, "nvfp4", gs)
    odd, scale = x, gs
    if how == "transposed":
        odd = x.t().contiguous().t()
    elif how == "misaligned":
        odd = torch.empty(x.numel() + 4, device="cuda")[1:][: x.numel()].view(12, 192).copy_(x)
    elif how == "grad":
        odd = x.clone().requires_grad_()
    elif how == "scale-float64":
        scale = gs.double()
    else:
        scale = 0.02
    got = fp4_ops.quantize(odd, "nvfp4", scale)
    _assert_same_fp4(got, ops._quantize(x.cpu(), "nvfp4", None if gs is None else gs.cpu()), how)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("format", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_gpu_plain_and_token_quantizers_of_one_kind_stay_apart(format, activations):
    """quantize's kernel and a W4A4 decode layer's token-copy quantizer for the same x dtype,
    format and kind of scale are different kernels: with the plain one compiled and cached
    first, the layer's planned calls still give its full path's bits, and quantize after them
    the CPU quantizer's bytes."""
    if activations == "static" and format == "mxfp4":
        pytest.skip("mxfp4 has no global scale")
    torch.manual_seed(11)
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    gs = torch.full((), 0.25, device="cuda") if activations == "static" else None
    want = ops._quantize(x.cpu(), format, None if gs is None else gs.cpu())
    _assert_same_fp4(fp4_ops.quantize(x, format, gs), want, "plain first")
    linear = torch.nn.Linear(512, 384, device="cuda", dtype=torch.bfloat16)
    layer = fp4_ops.FP4Linear.from_linear(
        linear, format, activations=activations, input_global_scale=None if gs is None else 0.25
    )
    with torch.no_grad():
        for _ in range(3):  # (the second and third calls are planned)
            assert torch.equal(layer(x), _full_path(layer, x))
    _assert_same_fp4(fp4_ops.quantize(x, format, gs), want, "plain after")


def _assert_same_fp4(got, want, what) -> None:
    """got holds want's codes, scale bytes and global scale bit for bit (either on any device)."""
    for part in ("data", "scale", "global_scale"):
        g, w = getattr(got, part).cpu().reshape(-1), getattr(want, part).cpu().reshape(-1)
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), (what, part)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("format", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_gpu_planned_quantize_matches_the_cpu_quantizer(format, static):
    """quantize's plan (second and later calls of a shape) gives the CPU quantizer's bytes for
    new inputs, a static scale read at each call (changed in place between calls); each call's
    FP4Tensor is its own (checked after every later call has run)."""
    if static and format == "mxfp4":
        pytest.skip("mxfp4 has no global scale")
    torch.manual_seed(3)
    gs = torch.full((), 0.01, device="cuda") if static else None
    fp4_ops.quantize(torch.randn(40, 256, device="cuda"), format, gs)
    real = ops._quantize
    ops._quantize = _no_full_path
    try:
        results = []
        for step in range(3):
            x = torch.randn(40, 256, device="cuda") * (step + 1)
            if static:
                gs.mul_(2.0)
            want = real(x.cpu(), format, None if gs is None else gs.cpu())
            results.append((fp4_ops.quantize(x, format, gs), want))
    finally:
        ops._quantize = real
    for step, (got, want) in enumerate(results):
        _assert_same_fp4(got, want, step)


@pytest.mark.gpu
@needs_hopper
def test_gpu_quantize_plans_of_one_shape_keep_their_kind_of_scale():
    """One x shape quantized with a dynamic scale, then a static one, in turn: each call gives
    the CPU quantizer's bytes for its own kind of scale (a plan of one kind never serves the
    other)."""
    torch.manual_seed(5)
    x = torch.randn(8, 160, device="cuda")  # (a shape of its own: its first call is full)
    gs = torch.full((), 0.004, device="cuda")
    for static in (False, True, False, True, False):
        scale = gs if static else None
        got = fp4_ops.quantize(x, "nvfp4", scale)
        want = ops._quantize(x.cpu(), "nvfp4", None if scale is None else scale.cpu())
        _assert_same_fp4(got, want, static)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")], ids=str)
def test_gpu_bad_static_scale_on_the_device_poisons_every_scale(bad):
    """A float32 CUDA global scale is read by the quantizer as it runs: one that is not finite
    and positive gives the NaN scale byte in every block (first and planned calls), so every
    product that reads it is NaN."""
    x = torch.randn(24, 96, device="cuda")  # (a shape of its own: the first call is full)
    gs = torch.full((), bad, device="cuda")
    for _ in range(2):
        q = fp4_ops.quantize(x, global_scale=gs)
        plain = q.plain_scales().view(torch.uint8)
        assert bool((plain == 0x7F).all())
        assert bool(fp4_ops.fp4_gemm(q, fp4_ops.quantize(x)).isnan().all())


@pytest.mark.gpu
@needs_hopper
def test_gpu_planned_fp4_gemm_gives_the_full_paths_bits():
    """fp4_gemm's plan gives the full path's bits for new operands of the planned shapes and
    reads the global scales at each call; operands it cannot take (data 8 bytes into a
    buffer) go to the full path, which refuses them as on a first call."""
    torch.manual_seed(4)
    w = fp4_ops.quantize(torch.randn(256, 512, device="cuda"))
    fp4_ops.fp4_gemm(fp4_ops.quantize(torch.randn(9, 512, device="cuda")), w)
    real = ops._fp4_gemm
    for _ in range(3):
        a = fp4_ops.quantize(torch.randn(9, 512, device="cuda"))
        w.global_scale.mul_(1.5)
        want = real(a, w, torch.bfloat16, None)
        ops._fp4_gemm = _no_full_path
        try:
            got = fp4_ops.fp4_gemm(a, w)
        finally:
            ops._fp4_gemm = real
        assert torch.equal(got, want)
        buffer = torch.zeros(a.data.numel() + 16, dtype=torch.uint8, device="cuda")
        shifted = buffer[8 : 8 + a.data.numel()].view(a.data.shape).copy_(a.data)
        odd = fp4_ops.FP4Tensor(shifted, a.scale, a.global_scale, "nvfp4")
        with pytest.raises(ValueError, match="a must start on a 16-byte boundary"):
            fp4_ops.fp4_gemm(odd, w)


_REFUSALS = {
    "layer-K": (lambda layer, x, w, a: layer(torch.randn(3, 256, device="cuda")), "in_features"),
    "layer-cpu": (lambda layer, x, w, a: layer(x.cpu()), "is on cpu"),
    "layer-int": (lambda layer, x, w, a: layer(x.to(torch.int32)), "float32, bfloat16 or"),
    "quantize-K": (lambda layer, x, w, a: fp4_ops.quantize(x[:, :500]), "not a multiple of"),
    "quantize-mx-gs": (lambda layer, x, w, a: fp4_ops.quantize(x, "mxfp4", 0.5), "no global"),
    "quantize-format": (lambda layer, x, w, a: fp4_ops.quantize(x, "nvfp8"), "format"),
    "gemm-format": (
        lambda layer, x, w, a: fp4_ops.fp4_gemm(fp4_ops.quantize(x, "mxfp4"), w),
        "a is mxfp4 but b is nvfp4",
    ),
    "gemm-dtype": (lambda layer, x, w, a: fp4_ops.fp4_gemm(a, w, torch.int8), "out_dtype"),
    "gemm-K": (
        lambda layer, x, w, a: fp4_ops.fp4_gemm(fp4_ops.quantize(x[:, :256]), w),
        "K mismatch",
    ),
}


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", list(_REFUSALS))
def test_gpu_refusals_stand_after_plans_exist(name):
    """Once the layer, quantize and fp4_gemm have plans for x's shape, a bad input near it
    raises the first call's ValueError, and the plans still serve good calls."""
    layer = _layer("dynamic")
    x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    w = fp4_ops.quantize(torch.randn(256, 512, device="cuda"))
    a = fp4_ops.quantize(x)
    call, needle = _REFUSALS[name]
    with torch.no_grad():
        for _ in range(2):
            want = (layer(x), fp4_ops.quantize(x), fp4_ops.fp4_gemm(a, w))
        with pytest.raises(ValueError, match=needle):
            call(layer, x, w, a)
        got = (layer(x), fp4_ops.quantize(x), fp4_ops.fp4_gemm(a, w))
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert torch.equal(got[1].data, want[1].data)


@pytest.mark.gpu
@needs_hopper
def test_gpu_plans_are_per_dtype_and_per_stream():
    """quantize plans one shape per input dtype (bfloat16 then float16: each its own bits); a
    W4A4 layer plans per stream, each stream's plan with its own scratch."""
    torch.manual_seed(5)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16, torch.float16):
        x = torch.randn(24, 128, device="cuda").to(dtype)
        got, want = fp4_ops.quantize(x), fp4_ops.quantize(x.cpu())
        _assert_same_fp4(got, want, dtype)
    layer = _layer("dynamic")
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    want = _full_path(layer, x)
    side = torch.cuda.Stream()
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(layer(x), want)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = layer(x)
            torch.cuda.current_stream().wait_stream(side)
            assert torch.equal(y, want)
    assert len(layer._plans) == 2
    # (the token route's scratch is the GEMM's token copy, which its bound step writes)
    copies = {plan.gemm.gemm_head[0] for plan in layer._plans.values()}
    assert all(plan.a is None for plan in layer._plans.values()) and len(copies) == 2


@pytest.mark.gpu
@needs_hopper
def test_gpu_capture_never_launches_a_w4a4_plan(monkeypatch):
    """Under CUDA-graph capture a W4A4 layer takes the full path (the graph quantizes into
    its own tensors), though the capture stream has a plan from the eager warm-up."""
    layer = _layer("dynamic")
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        layer(x)
        layer(x)
    torch.cuda.current_stream().wait_stream(side)
    (plan,) = layer._plans.values()

    def refuse(*_):
        raise AssertionError("a W4A4 plan launched under capture")

    monkeypatch.setattr(fpnn._Plan, "__call__", refuse)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, stream=side):
        y = layer(x)
    graph.replay()
    assert torch.equal(y, _full_path(layer, x))


@pytest.mark.gpu
@needs_hopper
def test_gpu_planned_batched_fp4_gemm():
    """fp4_gemm of batched operands ([L, M, K] against [L, N, K]): the planned call gives the
    full path's shape and bits."""
    torch.manual_seed(6)
    w = fp4_ops.quantize(torch.randn(2, 256, 512, device="cuda"))
    for _ in range(3):
        a = fp4_ops.quantize(torch.randn(2, 5, 512, device="cuda"))
        got = fp4_ops.fp4_gemm(a, w)
        want = ops._fp4_gemm(a, w, torch.bfloat16, None)
        assert got.shape == (2, 5, 256) and torch.equal(got, want)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_gpu_layer_with_a_non_contiguous_scale_is_not_planned(activations):
    """A weight scale loaded as a non-contiguous tensor (assign=True): the full path copies it
    at every call; no plan binds its address."""
    layer = _layer(activations)
    state = layer.state_dict()
    scale = state["weight_scale"]
    state["weight_scale"] = scale.transpose(0, 1).contiguous().transpose(0, 1)
    assert not state["weight_scale"].is_contiguous()
    layer.load_state_dict(state, assign=True)
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    want = _full_path(_layer(activations), x)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(layer(x), want)
    assert not layer._plans
