# SPDX-License-Identifier: BSD-3-Clause
"""Which problems the kernels accept, and that a cache of checked problems never lets an
unchecked one through.

Acceptance: every (M, N, K, L) near the rules' boundaries, for the Blackwell template's
``check_fp4_gemm_config`` and the Hopper kernel's ``problem_reasons``, against the rules derived
here by hand: extents >= 1, and K a whole number of 16-byte TMA units of packed FP4 (32 values).
Caches: after a problem passed its checks once, a call that changes any one of M, N, K, L to
a problem the kernel cannot run still raises the first call's kind of refusal, in the Blackwell
``gemm``, the Hopper ``gemm`` and the Hopper ``gemm_for_ops`` launch cache.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import blockwise_gemm_fp4 as bw
from fp4_ops.layout import blocked_scale_numel
from fp4_ops.sm90 import gemm as k90
from fp4_ops.sm90 import launcher as r90

EXTENTS = (0, 1, 7, 128, 129)
KS = tuple(range(0, 289, 16))


def _hand_rule(m: int, n: int, k: int, l: int) -> bool:  # noqa: E741
    """Accepted: every extent >= 1, K a multiple of 32 (16 bytes of packed FP4 per TMA unit)."""
    return min(m, n, k, l) >= 1 and k % 32 == 0


@pytest.mark.parametrize("vec", [16, 32])
def test_blackwell_accepts_exactly_the_problems_of_the_hand_rule(vec):
    sf = bw.SF_FORMATS[vec][0]
    for m, n, k, l in itertools.product(EXTENTS, EXTENTS, KS, (0, 1, 3)):  # noqa: E741
        reasons = bw.check_fp4_gemm_config((m, n, k, l), vec, sf, "BFloat16", (128, 128))
        assert (not reasons) == _hand_rule(m, n, k, l), ((m, n, k, l), reasons)


@pytest.mark.parametrize("a_dtype", [k90.W4A4, "BFloat16"])
@pytest.mark.parametrize("path, tiler", [("prefill", (128, 256)), ("decode", (16, 128))])
def test_hopper_accepts_exactly_the_problems_of_the_hand_rule(path, tiler, a_dtype):
    for m, n, k, l in itertools.product(EXTENTS, EXTENTS, KS, (0, 1, 3)):  # noqa: E741
        reasons = k90.problem_reasons((m, n, k, l), 16, path, tiler, a_dtype)
        assert (not reasons) == _hand_rule(m, n, k, l), ((m, n, k, l), reasons)


# ------------------------------------------------------------------ caches of checked problems

GOOD = (256, 128, 256, 2)
# (one extent changed at a time: each makes a problem the kernels refuse)
BAD = {
    "M": (2**23, 128, 256, 2),
    "N": (256, 2**23, 256, 2),
    "K": (256, 128, 48, 2),
    "L": (256, 128, 256, 0),
}
# (the refusal each must get: the problem check of the configuration, not an operand check)
REFUSAL = {"M": r"M\*K = ", "N": r"N\*K = ", "K": "K=48 is not", "L": "L must be >= 1"}


def _bw_operands(m, n, k, l, vec=16):  # noqa: E741
    """The template gemm's operands as meta tensors (shapes only: extents past 2^31 elements)."""
    sf = bw.torch_scale_dtype(vec)
    with torch.device("meta"):
        return _bw_tensors(m, n, k, l, vec, sf)


def _bw_tensors(m, n, k, l, vec, sf):  # noqa: E741
    return dict(
        a=torch.zeros(l, m, k // 2, dtype=torch.uint8),
        b=torch.zeros(l, n, k // 2, dtype=torch.uint8),
        sfa_blocked=torch.zeros(l, blocked_scale_numel(m, k, vec) if m else 0, dtype=sf),
        sfb_blocked=torch.zeros(l, blocked_scale_numel(n, k, vec) if n else 0, dtype=sf),
    )


@pytest.mark.parametrize("changed", list(BAD))
def test_blackwell_gemm_checks_every_new_problem(monkeypatch, changed):
    """The template's ``gemm`` after one good call: a problem that differs in one extent is
    checked again, and refused, before anything is compiled or launched."""
    launched = []
    monkeypatch.setattr(bw, "_check_cuda_operands", lambda **_: None)
    monkeypatch.setattr(bw, "compile_gemm", lambda *a, **k: (None, lambda **kw: launched.append(1)))
    monkeypatch.setattr(bw, "_KERNELS", {})
    monkeypatch.setattr(bw, "_CHECKED", set())
    monkeypatch.setattr(
        bw.utils, "HardwareInfo", lambda *_: SimpleNamespace(get_max_active_clusters=lambda n: 1)
    )
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(bw, "kernel_args", lambda *a, **k: {})
    alpha = torch.ones(1, device="meta")
    m, n, k, l = GOOD  # noqa: E741
    ops = _bw_operands(m, n, k, l)
    bw.gemm(**ops, alpha=alpha, d=bw.empty_d(l, m, n, "BFloat16", "meta"))
    assert launched == [1]
    m, n, k, l = BAD[changed]  # noqa: E741
    ops = _bw_operands(m, n, k, l)
    with pytest.raises(ValueError, match=REFUSAL[changed]):
        bw.gemm(**ops, alpha=alpha, d=bw.empty_d(l, m, n, "BFloat16", "meta"))
    assert launched == [1]


# (the Hopper kernel's refusals of the same problems: its 32-bit offsets and K rule)
HOPPER_REFUSAL = {"M": r"M\*K/2\*L = ", "N": r"N\*K/2\*L = ", "K": "K=48 is not", "L": "L must be"}


def _h_operands(m, n, k, l, vec=16):  # noqa: E741
    """The Hopper gemm's W4A4 operands as meta tensors."""
    with torch.device("meta"):
        return dict(
            a=torch.empty(l, m, k // 2, dtype=torch.uint8),
            b=torch.empty(l, n, k // 2, dtype=torch.uint8),
            sfa=torch.empty(l, blocked_scale_numel(m, k, vec), dtype=torch.float8_e4m3fn),
            sfb=torch.empty(l, blocked_scale_numel(n, k, vec), dtype=torch.float8_e4m3fn),
            alpha=torch.empty(1),
            out=torch.empty(l, m, n, dtype=torch.bfloat16),
        )


@pytest.mark.parametrize("changed", list(BAD))
def test_hopper_gemm_checks_every_new_problem(monkeypatch, changed):
    """The Hopper ``gemm`` after one good call of a configuration: a problem that differs in one
    extent is checked again and refused before any launch (operand checks, which need CUDA
    tensors, left out)."""
    launched = []
    monkeypatch.setattr(r90, "operand_reasons", lambda *_: [])
    monkeypatch.setattr(r90, "_compiled", lambda *_: (None, lambda *a: launched.append(a)))
    monkeypatch.setattr(r90, "_workspace", lambda *_: (torch.empty(1),) * 3)
    monkeypatch.setattr(r90, "_CHECKED", set())
    stream = SimpleNamespace(cuda_stream=0, device=torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream)
    config = r90.GemmConfig(16, "BFloat16", path="prefill", mma_tiler_mn=(128, 256))
    monkeypatch.setattr(r90.Launch, "__call__", lambda self, *a, **k: launched.append(a))
    r90.gemm(**_h_operands(*GOOD), config=config)
    assert len(launched) == 1
    with pytest.raises(ValueError, match=HOPPER_REFUSAL[changed]):
        r90.gemm(**_h_operands(*BAD[changed]), config=config)
    assert len(launched) == 1


def test_hopper_workspaces_fit_every_problem_of_one_configuration(monkeypatch):
    """Two problems of one prefill configuration on one stream, the second larger: each call's
    converted copies hold its own (L, rows, K rounded up to 64) operands (a workspace cached
    by configuration alone would hand the second problem the first one's)."""
    calls = []

    def compile_kernel(kernel, c_dtype, sms, options):
        return SimpleNamespace(__tvm_ffi_object__=lambda: lambda *x: calls.append(x))

    monkeypatch.setattr(r90, "compile_kernel", compile_kernel)
    monkeypatch.setattr(r90, "operand_reasons", lambda *_: [])
    for cache in ("_KERNELS", "_WORKSPACES", "_CHECKED"):
        monkeypatch.setattr(r90, cache, {} if cache != "_CHECKED" else set())
    stream = SimpleNamespace(cuda_stream=5, device=torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    config = r90.GemmConfig(16, "BFloat16", path="prefill", mma_tiler_mn=(128, 256))
    for m, n, k, l in ((64, 256, 256, 1), (300, 512, 512, 2)):  # noqa: E741
        r90.gemm(**_h_operands(m, n, k, l), config=config)
        _, conv_b, conv_a = r90._workspace(config, (m, n, k, l), stream)
        k_pad = -(-k // 64) * 64
        assert conv_a.numel() >= l * m * k_pad and conv_b.numel() >= l * n * k_pad


def _cpu_workspaces(monkeypatch, stream_handle=5):
    """The launcher's workspaces made on the CPU (a stand-in stream), the kernel built, not
    compiled; returns the stand-in stream."""
    monkeypatch.setattr(r90, "_WORKSPACES", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def compiled(config, index):
        fields = (config.path, config.mma_tiler_mn, config.cluster_shape_mn, config.split_k)
        return k90.BlockwiseGemmFp4Sm90(16, *fields, config.tma_store, 1, config.a_dtype), None

    monkeypatch.setattr(r90, "_compiled", compiled)
    return SimpleNamespace(cuda_stream=stream_handle, device=torch.device("cpu"))


@pytest.mark.parametrize("a_dtype", ["Float4E2M1FN", "BFloat16"], ids=["w4a4", "w4a16"])
def test_hopper_prefill_problems_of_any_m_share_one_weights_copy(monkeypatch, a_dtype):
    """The prefill weights' converted copy depends on N, K, L, the configuration and the stream,
    not on M: problems that differ only in M share it (a copy per token count would grow with
    every prompt length); the M-sized parts (converted activations, split-K) stay per M."""
    stream = _cpu_workspaces(monkeypatch)
    config = r90.GemmConfig(16, "BFloat16", a_dtype, path="prefill", mma_tiler_mn=(128, 256))
    first = r90._workspace(config, (2100, 256, 512, 1), stream)
    second = r90._workspace(config, (3000, 256, 512, 1), stream)
    assert second[1] is first[1] and second[1].shape == (1, 256, 512)
    if a_dtype == "Float4E2M1FN":  # (W4A4 converts its activations too: one copy per M)
        assert first[2].shape == (1, 2100, 512) and second[2].shape == (1, 3000, 512)
    others = [
        r90._workspace(config, (2100, 512, 512, 1), stream),
        r90._workspace(config, (2100, 256, 1024, 1), stream),
        r90._workspace(config, (2100, 256, 512, 2), stream),
        r90._workspace(replace(config, c_dtype="Float16"), (2100, 256, 512, 1), stream),
        r90._workspace(config, (2100, 256, 512, 1), _other_stream(stream, 6)),
    ]
    assert all(o[1] is not first[1] for o in others)


def _other_stream(stream, handle):
    return SimpleNamespace(cuda_stream=handle, device=stream.device)


@pytest.mark.parametrize("paths", [("decode",), ("decode", "prefill")])
def test_hopper_workspaces_stay_bounded_over_many_token_counts(monkeypatch, paths):
    """Eager calls over ever new token counts (prompt lengths) keep at most _MAX_WORKSPACES
    entries (one more, the shared weights' copy, where prefill problems come in), and a
    problem asked for again after the cache started over gets a fresh zeroed workspace of its
    own shapes."""
    stream = _cpu_workspaces(monkeypatch)
    monkeypatch.setattr(r90, "_MAX_WORKSPACES", 8)
    configs = {
        "decode": r90.GemmConfig(16, "BFloat16", path="decode", mma_tiler_mn=(16, 128), split_k=2),
        "prefill": r90.GemmConfig(16, "BFloat16", path="prefill", mma_tiler_mn=(128, 256)),
    }
    sizes = []
    for m in range(1, 40):
        for path in paths:
            r90._workspace(configs[path], (m + 2048 * (path == "prefill"), 256, 512, 1), stream)
            sizes.append(len(r90._WORKSPACES))
    assert 8 <= max(sizes) <= 8 + (len(paths) - 1) and min(sizes[8:]) < max(sizes)
    again = r90._workspace(configs["decode"], (40, 256, 512, 1), stream)
    assert all(not t.any() for t in again) and again[1].shape[1] >= 48


@pytest.mark.parametrize("a_dtype", ["Float4E2M1FN", "BFloat16"], ids=["w4a4", "w4a16"])
def test_hopper_decode_workspaces_hold_each_token_count(monkeypatch, a_dtype):
    """Decode problems that differ in M share nothing: each has its own token copy (W4A4) of
    at least its token rows rounded up to whole tiles, and its own split-K workspace."""
    stream = _cpu_workspaces(monkeypatch)
    config = r90.GemmConfig(
        16, "BFloat16", a_dtype, path="decode", mma_tiler_mn=(16, 128), split_k=2
    )
    kernel = r90._compiled(config, None)[0]
    seen = []
    for m in (1, 40, 17, 2):
        splitk, copy_b, _ = r90._workspace(config, (m, 256, 512, 1), stream)
        if a_dtype == "Float4E2M1FN":
            assert copy_b.shape[1] >= kernel.converted_rows_b(m) >= m, m
        assert all(splitk is not s and (copy_b is not b or b.numel() <= 8) for s, b in seen)
        seen.append((splitk, copy_b))


def test_new_workspaces_are_marked_as_used_on_the_callers_stream(monkeypatch):
    """Every tensor the launcher's workspaces and ``memory.kept`` make on another stream is
    marked with ``record_stream`` as used on the caller's stream, so that dropping it (a
    cache starting over) never frees memory that kernels queued there still use."""
    from fp4_ops import memory

    marked = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: marked.append((t, s)))
    cuda_stream = SimpleNamespace(cuda_stream=9, device=torch.device("cuda", 0))
    parts = tuple(torch.zeros(n) for n in (3, 5, 7))
    assert r90._used_on(cuda_stream, *parts) == parts
    assert [(t, s) for t, s in marked] == [(t, cuda_stream) for t in parts]
    marked.clear()
    monkeypatch.setattr(memory, "persistent", lambda make, device: make())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: cuda_stream)
    made = memory.kept({}, "key", lambda: parts[:2], torch.device("cuda", 0))
    assert [(t, s) for t, s in marked] == [(t, cuda_stream) for t in made]


@pytest.mark.parametrize("cache_size", [1, 3])
def test_kept_caches_start_over_when_full(monkeypatch, cache_size):
    """``memory.kept`` makes each key's value once, and a cache of MAX_KEPT entries starts
    over rather than growing with every new key (shape)."""
    from fp4_ops import memory

    monkeypatch.setattr(memory, "MAX_KEPT", cache_size)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cache, made = {}, []

    def make(i):
        made.append(i)
        return torch.full((i + 1,), i)

    cpu = torch.device("cpu")
    first = memory.kept(cache, 0, lambda: make(0), cpu)
    assert memory.kept(cache, 0, lambda: make(0), cpu) is first and made == [0]
    for i in range(1, 10):
        assert torch.equal(memory.kept(cache, i, lambda i=i: make(i), cpu), torch.full((i + 1,), i))
        assert len(cache) <= cache_size
    assert made == list(range(10))


# (dtype, sf_vec_size, static global scale, rows of K = 64): 4 rows are within the one-grid
# dynamic quantizer's reach, 512 are not (an amax grid first)
QUANTIZER_CALLS = [
    (torch.bfloat16, 16, None, 4),
    (torch.bfloat16, 16, None, 512),
    (torch.bfloat16, 16, 0.5, 4),
    (torch.float16, 16, None, 4),
    (torch.bfloat16, 32, None, 4),
    (torch.float32, 16, 0.5, 512),
]


def test_quantizer_launch_cache_gives_each_call_its_own_kernel(monkeypatch):
    """``launch_quantize`` after calls of every other kind, in both orders: each launch runs the
    kernel compiled for its own input dtype, block size, dynamic / static global scale and,
    dynamic, for an x the one-grid quantizer takes (at most LOCAL_AMAX_BYTES) or not."""
    from fp4_ops import quantizer

    launched = []

    def compile_quantizer(
        in_dtype, vec, dynamic, options="", local_amax=False, tokens=False, exact_rows=False
    ):
        config = (in_dtype, vec, dynamic, local_amax)
        return SimpleNamespace(__tvm_ffi_object__=lambda: lambda *a: launched.append(config))

    monkeypatch.setattr(quantizer, "compile_quantizer", compile_quantizer)
    monkeypatch.setattr(quantizer, "_KERNELS", {})
    monkeypatch.setattr(quantizer, "_LAUNCHERS", {})
    monkeypatch.setattr(quantizer, "_PARTIALS", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    props = SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: props)
    names = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
    for first, second in itertools.permutations(QUANTIZER_CALLS, 2):
        for dtype, vec, gs, rows in (first, second):
            x = torch.zeros(rows, 64, dtype=dtype)
            quantizer.launch_quantize(x, vec, None if gs is None else torch.tensor(gs))
            dynamic = vec == 16 and gs is None
            local = dynamic and x.numel() * x.element_size() <= quantizer.LOCAL_AMAX_BYTES
            assert launched[-1] == (names[dtype], vec, dynamic, local)


@pytest.mark.parametrize("split", [2, 3])
def test_hopper_split_k_workspace_holds_partials_and_counters(monkeypatch, split):
    """A split-K decode problem's workspace: for each output tile (16 tokens x 128 weight rows,
    counted here by hand) ``split`` fp32 partial tiles, plus one counter per tile."""
    monkeypatch.setattr(r90, "_WORKSPACES", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    stream = SimpleNamespace(cuda_stream=5, device=torch.device("cpu"))
    config = r90.GemmConfig(16, "BFloat16", path="decode", mma_tiler_mn=(16, 128), split_k=split)
    fields = (config.path, config.mma_tiler_mn, config.cluster_shape_mn, split)
    kernel = k90.BlockwiseGemmFp4Sm90(16, *fields, config.tma_store, 1, config.a_dtype)
    monkeypatch.setattr(r90, "_compiled", lambda *_: (kernel, None))
    m, n, k, l = 20, 520, 1024, 2  # noqa: E741
    tiles = -(-m // 16) * -(-n // 128) * l
    work, _, _ = r90._workspace(config, (m, n, k, l), stream)
    assert work.dtype == torch.float32
    assert work.numel() >= tiles * split * 16 * 128 + tiles
