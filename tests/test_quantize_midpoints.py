# SPDX-License-Identifier: BSD-3-Clause
"""The quantizers at their rounding midpoints, bit for bit against ``reference.py``: the CPU
path (``fp4_ops.cpu``, here) and the GPU quantizer (``fp4_ops.quantizer``, on a GPU).

Each case builds blocks whose rounding is decided at a midpoint: the block scale
amax / 6 / global_scale at, just above and just below an E4M3 midpoint; elements exactly on
(and one ulp beside) an E2M1 tie after scaling; MXFP4 amax at 6 * 2^e (an E8M0 tie) and one ulp
above; elements whose correctly rounded quotient x / divisor and x * fl(1 / divisor) give
different E2M1 codes; a dynamic global scale of amax / (448 * 6) (its direction). Also the
GPU quantizer's host side: the kernel-cache key of each call.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import reference
from fp4_ops import cpu
from fp4_ops import quantizer as q90

E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _f32(values) -> torch.Tensor:
    return torch.tensor(np.asarray(values, dtype=np.float32))


def _ulps(x: torch.Tensor, n: int) -> torch.Tensor:
    """x moved n ulps away from zero (negative n: towards it), in float32 bits."""
    return (x.view(torch.int32) + n).view(torch.float32)


def _e4m3_values() -> torch.Tensor:
    """Every finite non-negative E4M3 value, ascending (bytes 0 .. 0x7E)."""
    return torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def _blocks_with_amax(amax: torch.Tensor, block: int, fill: torch.Tensor | None = None):
    """[n, 2 * block] float32: two blocks per row, each led by its amax; the other elements
    are ``fill`` (default: fixed fractions of the amax, rounded to float32)."""
    n = amax.numel()
    if fill is None:
        fractions = _f32(np.linspace(-0.97, 0.97, block - 1))
        fill = amax.reshape(n, 1) * fractions
    x = torch.cat([amax.reshape(n, 1), fill.reshape(n, block - 1)], 1)
    return torch.cat([x, -x.flip(1)], 1)


def e4m3_scale_midpoints(global_scale: float) -> torch.Tensor:
    """Blocks whose amax / 6 / gs is an E4M3 midpoint (a tie: to even), and 1 ulp either
    side of the amax (exactly at the midpoint for a power-of-two gs, within an ulp else)."""
    v = _e4m3_values()
    mids = (v[:-1] + v[1:]) / 2
    amax = (mids * 6.0 * global_scale).float()
    amax = torch.cat([amax, _ulps(amax, 1), _ulps(amax, -1)])
    return _blocks_with_amax(amax[amax > 0], 16)


def e2m1_element_ties(global_scale: float, vec: int) -> torch.Tensor:
    """Blocks of amax 6 * s * gs (scale s exact: powers of two and 1.5) whose other elements
    are E2M1 ties (and 1 ulp beside) times the divisor s * gs, both signs."""
    rows = []
    for s in (2.0**-6, 0.25, 1.0, 1.5, 16.0, 256.0):
        divisor = s * global_scale
        ties = _f32([t * divisor for t in E2M1_TIES])
        values = torch.cat([ties, _ulps(ties, 1), _ulps(ties, -1)])
        values = torch.cat([values, -values])[: vec - 1]
        fill = torch.cat([values, values[: vec - 1 - values.numel()]])
        rows.append(_blocks_with_amax(_f32([6.0 * divisor]), vec, fill))
    return torch.cat(rows)


def e8m0_ties() -> torch.Tensor:
    """MXFP4 blocks of amax 6 * 2^e (scale 2^e exactly: ceil(log2(1)) = 0), 1 ulp above (2^(e+1))
    and below, e from -20 to 20; the other elements E2M1 ties times 2^e."""
    amax = torch.exp2(torch.arange(-20, 21, dtype=torch.float32)) * 6.0
    amax = torch.cat([amax, _ulps(amax, 1), _ulps(amax, -1)])
    scale = torch.exp2(torch.ceil(torch.log2(amax.double() / 6))).float()
    ties = _f32(E2M1_TIES * 4 + (6.0, 0.5, 1.0))[:31]
    return _blocks_with_amax(amax, 32, scale.reshape(-1, 1) * ties)


def quotient_cases(global_scale: float, want: int = 48) -> torch.Tensor:
    """NVFP4 blocks with elements x (both signs) near a tie times the block's divisor d, where
    the E2M1 code of fl(x / d) differs from that of fl(x * fl(1 / d)); the divisor is the
    reference's own for the block."""
    found = []
    v = _e4m3_values()[8:0x7E]
    amax = (v * 6.0 * global_scale).float()
    _, scales, gs = reference.quantize_nvfp4(_blocks_with_amax(amax, 16), global_scale)
    divisor = scales[:, 0].float() * gs
    for i, d in enumerate(divisor.tolist()):
        d32 = np.float32(d)
        for t in E2M1_TIES:
            for n in range(-4, 5):
                x = (np.array([t * d32], dtype=np.float32).view(np.int32) + n).view(np.float32)
                exact, by_rcp = x / d32, x * (np.float32(1) / d32)
                codes = reference.fp32_to_e2m1(_f32([exact[0], by_rcp[0]]))
                if codes[0] != codes[1]:
                    found.append((i, float(x[0])))
    assert len(found) >= want, f"only {len(found)} quotient cases for gs {global_scale}"
    rows = []
    for i, x in found[:want]:
        fill = _f32([x, -x] * 7 + [x])
        rows.append(_blocks_with_amax(amax[i : i + 1], 16, fill))
    return torch.cat(rows)


def dynamic_direction() -> torch.Tensor:
    """amax 2688 * 4 = 10752 over the tensor: the dynamic global scale is 4 (not 1 / 4)."""
    x = e2m1_element_ties(4.0, 16)
    return x * (10752.0 / float(x.abs().amax()))


def dynamic_rounding() -> torch.Tensor:
    """A tensor whose amax a gives fl(a / 2688) != fl(a * fl(1 / 2688)): the dynamic global
    scale is a correctly rounded division."""
    rcp = np.float32(1) / np.float32(2688)
    a = np.float32(10000)
    while np.float32(a / np.float32(2688)) == np.float32(a * rcp):
        a = np.nextafter(a, np.float32(np.inf))
    x = e2m1_element_ties(1.0, 16)
    return x * (float(a) / float(x.abs().amax()))


# (name, input, format, static global scale or None for the dynamic one)
CASES = [
    ("e4m3-mid-gs1", lambda: e4m3_scale_midpoints(1.0), 16, 1.0),
    ("e4m3-mid-gs2^-5", lambda: e4m3_scale_midpoints(2.0**-5), 16, 2.0**-5),
    ("e4m3-mid-gs0.3", lambda: e4m3_scale_midpoints(0.3), 16, 0.3),
    ("e2m1-ties-gs1", lambda: e2m1_element_ties(1.0, 16), 16, 1.0),
    ("e2m1-ties-gs0.5", lambda: e2m1_element_ties(0.5, 16), 16, 0.5),
    ("e2m1-ties-dynamic", lambda: dynamic_direction(), 16, None),
    ("dynamic-rounding", dynamic_rounding, 16, None),
    ("e2m1-ties-mxfp4", lambda: e2m1_element_ties(1.0, 32), 32, None),
    ("e8m0-ties", e8m0_ties, 32, None),
    ("quotient-gs0.3", lambda: quotient_cases(0.3), 16, 0.3),
    ("quotient-gs1/7", lambda: quotient_cases(1 / 7), 16, 1 / 7),
]
IDS = [c[0] for c in CASES]


def _reference(x: torch.Tensor, vec: int, global_scale):
    """(codes, plain scale bytes, global scale) of reference.py."""
    if vec == 16:
        codes, scales, gs = reference.quantize_nvfp4(x, global_scale)
    else:
        (codes, scales), gs = reference.quantize_mxfp4(x), torch.tensor(1.0)
    return codes, scales.view(torch.uint8), gs


def _assert_same(codes, blocked_scales, gs, x, vec, global_scale):
    want_codes, want_scales, want_gs = _reference(x, vec, global_scale)
    got_scales = reference.from_blocked(
        blocked_scales.reshape(-1).view(torch.uint8), x.shape[0], x.shape[1] // vec
    )
    bad = (got_scales != want_scales).nonzero()[:4].tolist()
    assert torch.equal(got_scales, want_scales), f"scale bytes differ at {bad}"
    bad = (codes != want_codes).nonzero()[:4].tolist()
    assert torch.equal(codes, want_codes), f"codes differ at {bad}"
    assert float(gs) == float(want_gs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, make, vec, global_scale", CASES, ids=IDS)
def test_cpu_quantizer_at_midpoints(name, make, vec, global_scale, dtype):
    """``fp4_ops.cpu`` equals reference.py bit for bit at every midpoint case (bfloat16: the
    cases rounded to bfloat16 first, still next to their midpoints)."""
    x = make().to(dtype)
    if vec == 16:
        gs = None if global_scale is None else torch.tensor(global_scale)
        codes, scales, out_gs = cpu.quantize_nvfp4(x, gs)
    else:
        codes, scales, out_gs = cpu.quantize_mxfp4(x)
    _assert_same(codes, scales, out_gs, x, vec, global_scale)


def test_midpoint_cases_hit_their_midpoints():
    """The cases are what they claim, by hand: block scales on an E4M3 tie round to the even
    byte; 6 * 2^e gives E8M0 2^e and one ulp more 2^(e + 1); the dynamic scale is 4.0."""
    x = e4m3_scale_midpoints(1.0)
    n = x.shape[0] // 3
    _, scales, _ = reference.quantize_nvfp4(x[:n], 1.0)
    assert bool((scales.view(torch.uint8)[:, 0] % 2 == 0).all())  # ties to the even byte
    _, e8m0 = reference.quantize_mxfp4(e8m0_ties())
    exps = e8m0.view(torch.uint8)[:, 0].long() - 127
    assert exps.tolist() == list(range(-20, 21)) + list(range(-19, 22)) + list(range(-20, 21))
    assert float(reference.quantize_nvfp4(dynamic_direction())[2]) == 4.0


# ------------------------------------------------------------------------------ GPU
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with E4M3 conversions (sm_89+; H200 for the owner's run)",
)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name, make, vec, global_scale", CASES, ids=IDS)
def test_gpu_quantizer_at_midpoints(name, make, vec, global_scale, dtype):
    """``fp4_ops.quantizer`` equals reference.py bit for bit at every midpoint case."""
    x = make()
    if dtype == torch.float16 and float(x.abs().amax()) > 60000:
        pytest.skip("the case's values exceed float16's range")
    x = x.to(dtype)
    gs = None if global_scale is None else torch.tensor(global_scale, device="cuda")
    codes, scales, out_gs = q90.quantize_cuda(x.cuda(), vec, gs)
    _assert_same(codes.cpu(), scales.cpu(), out_gs.cpu(), x, vec, global_scale)


# ------------------------------------------------------------------------------ host side
@pytest.mark.parametrize(
    "dtype, vec, static, rows, want",
    [
        (torch.bfloat16, 16, False, 4, ("BFloat16", 16, True, True)),
        (torch.bfloat16, 16, False, 256, ("BFloat16", 16, True, True)),
        (torch.bfloat16, 16, False, 257, ("BFloat16", 16, True, False)),
        (torch.float16, 16, True, 4, ("Float16", 16, False, False)),
        (torch.float32, 32, False, 4, ("Float32", 32, False, False)),
        (torch.bfloat16, 32, False, 4, ("BFloat16", 32, False, False)),
        (torch.float32, 16, False, 4, ("Float32", 16, True, True)),
        (torch.float32, 16, False, 128, ("Float32", 16, True, True)),
        (torch.float32, 16, False, 129, ("Float32", 16, True, False)),
    ],
)
def test_quantizer_cache_key_names_every_kernel_choice(monkeypatch, dtype, vec, static, rows, want):
    """What ``launch_quantize`` compiles (through its kernel cache) for each call: the input
    dtype, the block size, whether the global scale is dynamic (NVFP4 without a given one),
    and for a dynamic one whether x fits LOCAL_AMAX_BYTES (x [rows, 64]: 32 KB is 128 float32
    or 256 bfloat16 rows), as the call asks; ``QuantizerConfig`` keys of different kernels
    differ."""
    compiled = []

    def compile_quantizer(
        in_dtype, sf_vec_size, dynamic, options="", local_amax=False, tokens=False, exact_rows=0
    ):
        compiled.append((in_dtype, sf_vec_size, dynamic, local_amax))
        raise LookupError("stop before any CUDA call")

    monkeypatch.setattr(q90, "compile_quantizer", compile_quantizer)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    for cache in ("_KERNELS", "_LAUNCHERS"):
        if hasattr(q90, cache):
            monkeypatch.setattr(q90, cache, {})
    x = torch.zeros(rows, 64, dtype=dtype)
    with pytest.raises(LookupError):
        q90.launch_quantize(x, vec, torch.ones(()) if static else None)
    assert compiled == [want]
    configs = {
        q90.QuantizerConfig(d, v, s, local, tokens, exact)
        for d in q90.IN_DTYPES
        for v in (16, 32)
        for s in (0, 1)
        for local in (0, 1)
        for tokens in (0, 1)
        for exact in (0, 1)
    }
    assert len(configs) == 96


def test_each_kernel_choice_gets_its_own_kernel_in_any_order(monkeypatch):
    """``_kernel``'s caches (compiled kernels, launch functions) hand every choice of input
    dtype, block size, dynamic scale, local amax and exact rows its own kernel, whether it is
    asked for before or after the others, and compile each once (the tokens mode is compiled
    only inside ``fp4_ops.sm90.tokens_step``)."""
    import itertools
    import types

    compiled = []

    def compile_quantizer(
        in_dtype, sf_vec_size, dynamic, options="", local_amax=False, exact_rows=False
    ):
        choice = (in_dtype, sf_vec_size, dynamic, local_amax, exact_rows)
        compiled.append(choice)
        return types.SimpleNamespace(__tvm_ffi_object__=lambda: choice)

    def properties(index):
        return types.SimpleNamespace(multi_processor_count=132)

    monkeypatch.setattr(q90, "compile_quantizer", compile_quantizer)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(q90, "_KERNELS", {})
    monkeypatch.setattr(q90, "_LAUNCHERS", {})
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    bits = (False, True)
    choices = list(itertools.product(dtypes, (16, 32), bits, bits, bits))
    for order in (choices, choices[::-1], choices):
        for dtype, vec, dynamic, local, exact in order:
            fn, sm_count = q90._kernel(dtype, vec, dynamic, 0, local, exact)
            assert fn == (q90.DSL_DTYPE_NAMES[dtype], vec, dynamic, local, exact)
            assert sm_count == 132
    assert len(compiled) == len(set(compiled)) == len(choices)


@pytest.mark.parametrize("k", [64, 256, 4096])
def test_scratch_buffers_fit_their_format_and_shape(monkeypatch, k):
    """The eager W4A4 layer's scratch (codes, scales, global scale) per shape, format and
    stream: NVFP4 and MXFP4 of one shape, or two shapes, never share buffers, and each holds
    what its quantization writes (K / 2 code bytes a row, the blocked scales of K / 16 or
    K / 32 a row)."""
    from fp4_ops.layout import blocked_numel

    def kept(cache, key, make, device):
        return cache.setdefault(key, make())

    monkeypatch.setattr(q90, "_SCRATCH", {})
    monkeypatch.setattr(q90, "stream_handle", lambda index: 7)
    monkeypatch.setattr(q90, "kept", kept)
    xs = [torch.zeros(8, k), torch.zeros(24, k)]
    asks = [(x, vec) for x in xs for vec in (32, 16)]
    seen = {}
    for x, vec in asks + asks[::-1]:
        codes, scales, gs = q90.scratch_buffers(x, vec)
        assert codes.shape == (x.shape[0], k // 2) and codes.dtype == torch.uint8
        assert scales.numel() == blocked_numel(x.shape[0], k // vec) and gs.numel() == 1
        # (the same buffers at the next call of a shape and format)
        assert seen.setdefault((x.shape, vec), scales.data_ptr()) == scales.data_ptr()
    assert len(set(seen.values())) == len(asks)


@pytest.mark.parametrize("vec", [16, 32])
def test_output_templates_give_the_formats_outputs(vec):
    """What a quantize plan makes its outputs from: empty_like of the templates gives
    contiguous codes (uint8), blocked scales of the format's scale dtype (E4M3 / E8M0) and a
    float32 global scale, of the shapes asked for."""
    from fp4_ops.layout import SCALE_DTYPES

    q_shape, sf_shape = (2, 130, 32), (2, 2, 512)
    templates = q90.output_templates(q_shape, sf_shape, SCALE_DTYPES[vec], "cpu")
    made = [torch.empty_like(t, memory_format=q90.DENSE) for t in templates]
    assert [t.dtype for t in made] == [torch.uint8, SCALE_DTYPES[vec], torch.float32]
    assert [tuple(t.shape) for t in made] == [q_shape, sf_shape, ()]
    assert all(t.is_contiguous() for t in made)
