# SPDX-License-Identifier: BSD-3-Clause
"""The MoE layer's routing, activation and combine kernels (fp4_ops/moe_kernels).

GPU: each kernel against an independent statement of what it computes: the routing's offsets
against a count of the ids on the host and its rows as a permutation that puts every pair in
its expert's range (at the count slots' power-of-two boundaries, more pairs than threads, ids
out of range); the activation and the combine against float64 formulas with bounds derived
from float32 arithmetic and one rounding to the output dtype. The layer built on them is
tested against the per-expert loop in test_moe.py.
CPU: each kernel's PTX runs on tests/ptx_emulator.py against the same oracles (small grids,
so that the grid-stride loops turn; shared atomics in thread order; ex2.approx modelled as
2^x rounded once); every configuration cross-compiles for sm_90a and sm_100a, and the PTX
moves 16-byte vectors, keeps nothing in local memory and uses shared-memory atomics only for
the counts.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import ptx_options
from ptx_emulator import GlobalMemory, Grid, Params, PtxError, parse_ptx

from fp4_ops import memory, moe_kernels
from fp4_ops.moe_kernels import activation, combine, gating, padded_rows, routing

U32 = 2.0**-24
ACT_REL = 2.0**-19  # float32 activation (accurate exp, a division, three products): << 2^-19
# the emulator's ex2.approx is 2^x rounded once, so there the exp (argument reduction and ex2),
# 1 + e, the division and the three products are each within a float32 rounding: < 8 U32
EMU_ACT_REL = 8 * U32
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NAMES = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
NAMES_IDS = {torch.int32: "Int32", torch.int64: "Int64"}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H200)")


def _half_ulp(mag: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half an ulp of ``dtype`` at float64 magnitudes ``mag`` (the error of one rounding), at
    least half the subnormal spacing (float16's subnormals start at 2^-14)."""
    _, e = torch.frexp(mag)
    info = torch.finfo(dtype)
    relative = torch.ldexp(torch.full_like(mag, info.eps / 2), e - 1)
    return relative.clamp(min=info.eps * info.tiny / 2)


def _assert_within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str):
    err = (got.double().cpu() - want).abs()
    bad = err > bound
    worst = int((err - bound).argmax())
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())} of {err.numel()} outside the bound; worst at {worst}: "
        f"{got.flatten()[worst].item()} vs {want.flatten()[worst].item()}"
    )


# ----------------------------------------------------------------------------- routing (GPU)

# (T, k, E): E at the count slots' boundaries (32 = one warp of slots, 33 needs 64), pairs
# past one pass of the CTA's threads, one expert
ROUTING_SHAPES = [(1, 8, 128), (3, 2, 1), (16, 4, 31), (16, 4, 32), (9, 5, 33), (300, 8, 256)]


def _check_routing(ids: torch.Tensor, num_experts: int, got: moe_kernels.Routing, x=None):
    """Offsets = the prefix sums of the per-expert counts; row_of a permutation that puts
    every valid pair in its expert's rows and every invalid one past offsets[E]; token_of and
    expert_of read back through it; (x given) each row x's row of its token, bit for bit."""
    if x is not None:
        want = x.cpu()[got.token_of.cpu().long()]
        assert torch.equal(got.rows.cpu().view(torch.uint8), want.view(torch.uint8))
    flat = ids.reshape(-1).long()
    k = ids.shape[1]
    valid = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[valid], minlength=num_experts)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    assert got.offsets.cpu().tolist() == offsets.tolist()
    row_of = got.row_of.cpu().long()
    assert sorted(row_of.tolist()) == list(range(flat.numel()))
    lo = torch.where(valid, offsets[flat.clamp(0, num_experts - 1)], offsets[-1])
    hi = torch.where(valid, offsets[flat.clamp(0, num_experts - 1) + 1], flat.numel())
    assert bool(((row_of >= lo) & (row_of < hi)).all())
    pairs = torch.arange(flat.numel())
    assert torch.equal(got.token_of.cpu().long()[row_of], pairs // k)
    assert torch.equal(got.expert_of.cpu().long()[row_of], torch.where(valid, flat, 0))
    assert got.ok.cpu().tolist() == [int(bool(valid.all()))]


@needs_cuda
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", ROUTING_SHAPES, ids=[str(s) for s in ROUTING_SHAPES])
def test_gpu_routing_places_every_pair_in_its_experts_rows(shape, ids_dtype):
    t, k, e = shape
    gen = torch.Generator().manual_seed(t * 1000 + e)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=ids_dtype)
    x = torch.randn(t, 64, generator=gen).bfloat16().cuda()
    _check_routing(ids, e, moe_kernels.route(ids.cuda(), e, x), x)
    skewed = torch.where(torch.rand(t, k, generator=gen) < 0.8, e - 1, ids)  # one busy expert
    _check_routing(skewed, e, moe_kernels.route(skewed.cuda(), e, x), x)


@needs_cuda
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_gpu_routing_flags_ids_out_of_range_and_keeps_rows_in_bounds(ids_dtype):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 6, (40, 3), generator=gen, dtype=ids_dtype)
    ids[5, 1], ids[17, 0], ids[39, 2] = 6, -1, 2**31 - 1 if ids_dtype == torch.int32 else 2**40
    x = torch.randn(40, 32, generator=gen).cuda()
    got = moe_kernels.route(ids.cuda(), 6, x)
    _check_routing(ids, 6, got, x)
    assert got.ok.item() == 0


@needs_cuda
def test_gpu_layer_with_an_id_out_of_range_raises_the_routing_message():
    """A device assert ends the process's CUDA context, so the layer runs in a child."""
    script = textwrap.dedent(
        """
        import torch, fp4_ops
        w13 = fp4_ops.quantize_experts(torch.randn(4, 64, 64, device="cuda"))
        w2 = fp4_ops.quantize_experts(torch.randn(4, 64, 32, device="cuda"))
        x = torch.randn(3, 64, device="cuda", dtype=torch.bfloat16)
        ids = torch.tensor([[0, 1], [2, 4], [3, 0]], device="cuda", dtype=torch.int32)
        fp4_ops.fp4_moe(x, w13, w2, torch.rand(3, 2, device="cuda"), ids)
        torch.cuda.synchronize()
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode != 0
    assert "topk_ids must lie in [0, 4)" in run.stderr, run.stderr[-2000:]


# ----------------------------------------------------------------------------- routing (CPU)


@functools.cache
def _routing_entry(ids_dtype: str, cap: int, x_dtype: str | None = None):
    options = ptx_options()
    ptx = routing.compile_routing(ids_dtype, cap, options, x_dtype).__ptx__
    (entry,) = parse_ptx(ptx).values()
    return entry


def emulate_routing(ids: torch.Tensor, num_experts: int, entry=None, x=None):
    """The routing kernel's PTX (or ``entry``'s) run on the CPU (tests/ptx_emulator.py; shared
    atomics in thread order) over ids [T, k] (and x [T, H]: the gathering variant): its
    outputs as a Routing of CPU tensors."""
    cap = moe_kernels.experts_cap(num_experts)
    x_dtype = None if x is None else NAMES[x.dtype]
    entry = entry or _routing_entry(NAMES_IDS[ids.dtype], cap, x_dtype)
    pairs = ids.numel()
    gmem = GlobalMemory()
    ids_ptr = gmem.alloc(ids.contiguous().numpy().tobytes())
    sizes = (num_experts + 1, pairs, pairs, pairs, 1)
    ptrs = [gmem.alloc(4 * n) for n in sizes]
    params = Params(entry)
    params.put(0, ids_ptr, 8)
    params.put(0, pairs, 4, 8)
    for i, (ptr, n) in enumerate(zip(ptrs[:4], sizes[:4], strict=True)):
        params.put(1 + i, ptr, 8)
        params.put(1 + i, n, 4, 8)  # (each tensor's dynamic extent follows its pointer)
    params.put(5, ptrs[4], 8)
    params.put(6, ids.shape[1], 4)
    params.put(7, num_experts, 4)
    if x is not None:
        hidden, vec = x.shape[1], 16 // x.element_size()
        rows_bytes = pairs * hidden * x.element_size()
        rows_ptr = gmem.alloc(rows_bytes)
        _tensor_param(params, 8, _put(gmem, x), (x.shape[0], hidden // vec, hidden))
        _tensor_param(params, 9, rows_ptr, (pairs, hidden // vec, hidden))
    Grid(entry, 1, routing.THREADS, params, gmem, 4 * cap + 16).run()
    out = [
        torch.from_numpy(gmem.read(p, 4 * n).view(np.int32).copy())
        for p, n in zip(ptrs, sizes, strict=True)
    ]
    for p, n in zip(ptrs, sizes, strict=True):
        assert (gmem.store_counts(p, 4 * n) == 1).all()
    rows = None
    if x is not None:
        assert (gmem.store_counts(rows_ptr, rows_bytes) == 1).all()
        raw = torch.from_numpy(gmem.read(rows_ptr, rows_bytes).copy())
        rows = raw.view(x.dtype).view(pairs, x.shape[1])
    return moe_kernels.Routing(*out, rows)


@pytest.mark.parametrize("k", [32, 64, 1000 * 32, 1024, 2048, 2880, 7168, 32768, 65536, 2**20])
def test_pad_rows_per_cta_is_the_most_rows_whose_codes_fit(k):
    """A power of two in 1 .. 32: its rows' packed codes (K / 2 bytes a row) fit PAD_CTA_BYTES,
    and twice as many rows would not fit, unless it is 32 or 1."""
    rows = moe_kernels.pad_rows_per_cta(k)
    assert 1 <= rows <= 32 and rows & (rows - 1) == 0
    fits = rows * k // 2 <= moe_kernels.PAD_CTA_BYTES
    assert fits or rows == 1
    assert rows == 32 or 2 * rows * k // 2 > moe_kernels.PAD_CTA_BYTES


# (T, k, E): E = 1, at the 32-slot boundary, past it, the most the slots hold; pairs past one
# pass of 512 threads; one slot per token
EMULATED_ROUTING = [(3, 2, 1), (7, 3, 31), (7, 3, 32), (5, 4, 33), (130, 4, 8), (9, 1, 8191)]


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", EMULATED_ROUTING, ids=[str(s) for s in EMULATED_ROUTING])
def test_routing_ptx_places_every_pair_in_its_experts_rows(shape, ids_dtype):
    t, k, e = shape
    gen = torch.Generator().manual_seed(t + e)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=ids_dtype)
    _check_routing(ids, e, emulate_routing(ids, e))
    if t * k > 20:  # ids out of range (both signs, and past 32 bits for int64) flagged
        bad = [e, -1, 2**40 if ids_dtype == torch.int64 else -5]
        ids.view(-1)[[3, 11, 19]] = torch.tensor(bad, dtype=ids_dtype)
        got = emulate_routing(ids, e)
        _check_routing(ids, e, got)
        assert got.ok.tolist() == [0]


# (T, k, E, H, x dtype): more rows than threads, float32 rows, the most experts
GATHERS = [(3, 2, 5, 64, torch.bfloat16), (130, 4, 8, 32, torch.float32)]
GATHERS += [(9, 1, 8191, 64, torch.float16)]


@pytest.mark.parametrize("case", GATHERS, ids=[str(c[:4]) for c in GATHERS])
def test_routing_ptx_gathers_each_rows_token(case):
    """The gathering variant: the same routing, and row r holds x[token_of[r]] bit for bit,
    each written once (ids out of range too: their rows hold their tokens)."""
    t, k, e, hidden, dtype = case
    gen = torch.Generator().manual_seed(t * k)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
    ids.view(-1)[1] = e  # (out of range)
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    got = emulate_routing(ids, e, x=x)
    _check_routing(ids, e, got)
    assert torch.equal(got.rows.view(torch.uint8), x[got.token_of.long()].view(torch.uint8))


def test_emulator_sees_a_routing_kernel_without_its_barriers(monkeypatch):
    """The emulator runs a CTA in lockstep, where a missing barrier changes nothing; its
    shared-memory race check must refuse the kernel built without them."""
    import cutlass.cute as cute

    monkeypatch.setattr(cute.arch, "sync_threads", lambda *args, **kwargs: None)
    ptx = routing.compile_routing("Int32", 128, ptx_options()).__ptx__
    assert "bar.sync" not in ptx
    (entry,) = parse_ptx(ptx).values()
    ids = torch.randint(0, 100, (6, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(PtxError, match="shared race"):
        emulate_routing(ids.int(), 100, entry)


# ----------------------------------------------------------------------------- activation (GPU)


def _ref_activation(h: torch.Tensor, name: str) -> torch.Tensor:
    """float64 activation of float64 h [..., 2I] (gate half first, or interleaved for gpt-oss)."""
    if name == "silu":
        gate, up = h.chunk(2, dim=-1)
        return gate * torch.sigmoid(gate) * up
    gate, up = h[..., 0::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
    # (gpt-oss's slope 1.702 as float32 arithmetic holds it: at a gate of -40 the float64 value
    # would move sigmoid by 40 x 2.2e-8, 15 U32)
    alpha = float(torch.tensor(1.702, dtype=torch.float32))
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


# (rows, I): one vector, a partial CTA, more vectors than the grid's threads (grid-stride)
ACT_SHAPES = [(1, 32), (7, 96), (300, 4096)]
ACT_EXPERTS = 5


def _activation_case(shape, dtype, bias_dtype):
    """(h [rows, 2I], bias [E, 2I] or None, expert_of [rows]) on the CPU."""
    rows, inter = shape
    gen = torch.Generator().manual_seed(rows + inter)
    h = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype)
    expert_of = torch.randint(0, ACT_EXPERTS, (rows,), generator=gen, dtype=torch.int32)
    bias = None
    if bias_dtype is not None:
        bias = torch.randn(ACT_EXPERTS, 2 * inter, generator=gen).to(bias_dtype)
    return h, bias, expert_of


def _check_activation(got, h, bias, expert_of, name, rel=ACT_REL):
    assert got.dtype == h.dtype and got.shape == (h.shape[0], h.shape[1] // 2)
    h64 = h.double() + (0 if bias is None else bias.double()[expert_of.long()])
    want = _ref_activation(h64, name)
    # h + bias rounds once in float32 (bias only); the activation's slopes on these inputs
    # are at most 1.1 (|up| + 1) in the gate (d/dz z sigmoid(c z) <= 1.1) and |gate| in up
    if name == "silu":
        gate, up = h64.abs().chunk(2, dim=-1)
    else:
        gate, up = h64.abs()[:, 0::2], h64.abs()[:, 1::2]
    rounding = 0 if bias is None else U32
    d = rel * want.abs() + rounding * (1.1 * (up + 1) * gate + gate * up)
    if name == "swigluoai":  # (x = alpha g' rounds once: sigmoid(x) moves by |x| (1 - s) U32)
        x = 1.702 * h64[:, 0::2].clamp(max=7.0)
        d = d + U32 * x.abs() * (1 - torch.sigmoid(x)) * want.abs()
    _assert_within(got, want, d + _half_ulp(want.abs() + d, h.dtype), f"{name} {h.dtype}")


@needs_cuda
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["silu", "swigluoai"])
@pytest.mark.parametrize("shape", ACT_SHAPES, ids=[str(s) for s in ACT_SHAPES])
def test_gpu_activation_is_the_float64_formula(shape, name, dtype, bias_dtype):
    h, bias, expert_of = _activation_case(shape, dtype, bias_dtype)
    bias_cuda = None if bias is None else bias.cuda()
    got = moe_kernels.activate(h.cuda(), name, bias_cuda, expert_of.cuda())
    _check_activation(got.cpu(), h, bias, expert_of, name)


# ----------------------------------------------------------------------------- combine (GPU)

COMBINE_SHAPES = [(1, 8, 64), (5, 3, 96), (300, 4, 4096)]  # (T, k, H)
COMBINE_EXPERTS = 6


def _combine_case(shape, dtype, weights_dtype, bias_dtype):
    """(ids [T, k], y [T k, H], topk_weights [T, k], bias [E, H] or None) on the CPU."""
    t, k, hidden = shape
    gen = torch.Generator().manual_seed(t * k)
    ids = torch.randint(0, COMBINE_EXPERTS, (t, k), generator=gen, dtype=torch.int32)
    y = torch.randn(t * k, hidden, generator=gen).to(dtype)
    weights = torch.rand(t, k, generator=gen).to(weights_dtype)
    bias = None
    if bias_dtype is not None:
        bias = torch.randn(COMBINE_EXPERTS, hidden, generator=gen).to(bias_dtype)
    return ids, y, weights, bias


def _check_combine(got, ids, y, weights, bias, row_of):
    """out[t] = sum_s w[t, s] (y[row_of[t k + s]] + bias[ids[t, s]]) within float32's error."""
    (t, k), dtype = ids.shape, y.dtype
    assert got.dtype == dtype and got.shape == (t, y.shape[1])
    terms = y.double()[row_of.long()]
    terms = terms + (0 if bias is None else bias.double()[ids.reshape(-1).long()])
    w = weights.double().reshape(-1, 1)
    want = (w * terms).view(t, k, -1).sum(1)
    d = ((k + 2) * U32 * (w.abs() * terms.abs())).view(t, k, -1).sum(1)
    _assert_within(got, want, d + _half_ulp(want.abs() + d, dtype), f"combine {dtype}")


@needs_cuda
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", COMBINE_SHAPES, ids=[str(s) for s in COMBINE_SHAPES])
def test_gpu_combine_is_the_weighted_sum_of_each_tokens_rows(
    shape, dtype, weights_dtype, bias_dtype
):
    ids, y, weights, bias = _combine_case(shape, dtype, weights_dtype, bias_dtype)
    routes = moe_kernels.route(ids.cuda(), COMBINE_EXPERTS, y.new_zeros(ids.shape[0], 32).cuda())
    bias_cuda = None if bias is None else bias.cuda()
    got = moe_kernels.combine_tokens(y.cuda(), weights.cuda(), routes, bias_cuda)
    _check_combine(got.cpu(), ids, y, weights, bias, routes.row_of.cpu())


# ----------------------------------------------------------------------------- activation and
# combine PTX on the CPU (the emulator's ex2.approx is 2^x rounded once: a model)

CTAS = 2  # a small grid: the grid-stride loops turn


def _tensor_param(params, index, ptr, dynamic):
    """A tensor argument: its pointer, then the layout's dynamic extents and strides."""
    params.put(index, ptr, 8)
    for i, value in enumerate(dynamic):
        params.put(index, value, 4, 8 + 4 * i)


def _put(gmem, t):
    return gmem.alloc(t.contiguous().view(torch.uint8).numpy().tobytes())


@functools.cache
def _entry(make, *args):
    (entry,) = parse_ptx(make(*args, ptx_options()).__ptx__).values()
    return entry


def emulate_activation(h, name, bias, expert_of):
    rows, inter = h.shape[0], h.shape[1] // 2
    bias_name = None if bias is None else NAMES[bias.dtype]
    entry = _entry(activation.compile_activation, NAMES[h.dtype], name, bias_name)
    gmem = GlobalMemory()
    out = gmem.alloc(rows * inter * h.element_size())
    experts = ACT_EXPERTS if bias is not None else 1
    gated = (2 * inter,) if gating.ACTIVATIONS[name] else (2 * inter, inter)
    p = Params(entry)
    cols = inter // activation.VEC
    _tensor_param(p, 0, _put(gmem, h), (rows, cols, *gated))
    _tensor_param(p, 1, _put(gmem, h if bias is None else bias), (experts, cols, *gated))
    _tensor_param(p, 2, out, (rows, cols, inter))
    _tensor_param(p, 3, _put(gmem, expert_of), (rows,))
    p.put(4, cols, 4)
    p.put(5, rows * cols, 4)
    Grid(entry, CTAS, activation.THREADS, p, gmem).run()
    assert (gmem.store_counts(out, rows * inter * h.element_size()) == 1).all()
    raw = torch.from_numpy(gmem.read(out, rows * inter * h.element_size()).copy())
    return raw.view(h.dtype).view(rows, inter)


@pytest.mark.parametrize(
    "name, dtype, bias_dtype",
    [
        ("silu", torch.bfloat16, None),
        ("silu", torch.float32, torch.bfloat16),
        ("silu", torch.float32, None),
        ("swigluoai", torch.float16, torch.float32),
        ("swigluoai", torch.bfloat16, torch.bfloat16),
        ("swigluoai", torch.float32, None),
    ],
)
@pytest.mark.parametrize("shape", [(70, 64), (3, 32)], ids=["grid-stride", "one-vector-rows"])
def test_activation_ptx_is_the_float64_formula(shape, name, dtype, bias_dtype):
    h, bias, expert_of = _activation_case(shape, dtype, bias_dtype)  # (560 vectors > 2 x 256)
    # every fifth value spread over [-40, 40]: gates where an exp without argument reduction,
    # 2^(x log2 e) with the product rounded, is |x| U32 off (e^68 stays finite in float32)
    wide = h.view(-1)[::5]
    wide.copy_(torch.linspace(-40, 40, wide.numel()))
    got = emulate_activation(h, name, bias, expert_of)
    _check_activation(got, h, bias, expert_of, name, EMU_ACT_REL)


def emulate_combine(y, weights, row_of, bias, expert_of, top_k):
    pairs, hidden = y.shape
    tokens = pairs // top_k
    bias_name = None if bias is None else NAMES[bias.dtype]
    entry = _entry(combine.compile_combine, NAMES[y.dtype], NAMES[weights.dtype], bias_name)
    gmem = GlobalMemory()
    nbytes = tokens * hidden * y.element_size()
    out = gmem.alloc(nbytes)
    cols = hidden // combine.VEC
    experts = COMBINE_EXPERTS if bias is not None else 1
    p = Params(entry)
    _tensor_param(p, 0, _put(gmem, y), (pairs, cols, hidden))
    _tensor_param(p, 1, _put(gmem, weights), (pairs,))
    _tensor_param(p, 2, _put(gmem, row_of), (pairs,))
    _tensor_param(p, 3, _put(gmem, y if bias is None else bias), (experts, cols, hidden))
    _tensor_param(p, 4, _put(gmem, expert_of), (pairs,))
    _tensor_param(p, 5, out, (tokens, cols, hidden))
    for i, v in enumerate((top_k, cols, tokens * cols)):
        p.put(6 + i, v, 4)
    Grid(entry, CTAS, combine.THREADS, p, gmem).run()
    assert (gmem.store_counts(out, nbytes) == 1).all()
    raw = torch.from_numpy(gmem.read(out, nbytes).copy())
    return raw.view(y.dtype).view(tokens, hidden)


@pytest.mark.parametrize(
    "dtype, weights_dtype, bias_dtype",
    [
        (torch.bfloat16, torch.float32, None),
        (torch.float16, torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("shape", [(40, 3, 128), (5, 1, 32)], ids=["grid-stride", "k1-h32"])
def test_combine_ptx_is_the_weighted_sum_of_each_tokens_rows(
    shape, dtype, weights_dtype, bias_dtype
):
    ids, y, weights, bias = _combine_case(shape, dtype, weights_dtype, bias_dtype)
    # rows grouped by expert as the routing places them: a stable sort's inverse
    order = torch.argsort(ids.reshape(-1), stable=True)
    row_of = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel()))
    expert_of = ids.reshape(-1)[order].int()
    got = emulate_combine(y, weights, row_of.int(), bias, expert_of, shape[1])
    _check_combine(got, ids, y, weights, bias, row_of)


# ----------------------------------------------------------------------------- PTX (CPU)

CONFIGS = {
    "routing-int32-32": (routing.compile_routing, ("Int32", 32)),
    "routing-int64-256": (routing.compile_routing, ("Int64", 256)),
    "silu-bf16": (activation.compile_activation, ("BFloat16", "silu", None)),
    "silu-f32-bias-bf16": (activation.compile_activation, ("Float32", "silu", "BFloat16")),
    "swigluoai-f16-bias-f32": (activation.compile_activation, ("Float16", "swigluoai", "Float32")),
    "combine-bf16": (combine.compile_combine, ("BFloat16", "Float32", None)),
    "combine-f32-bias-bf16": (combine.compile_combine, ("Float32", "BFloat16", "BFloat16")),
    "padded-rows-128": (padded_rows.compile_padded_rows, (128, 256, 4)),
    "padded-rows-256": (padded_rows.compile_padded_rows, (256, 32, 32)),
}


def _vector_bytes(op: str) -> int:
    """Bytes one PTX global load / store moves: ld.global.v4.b32 -> 16, st.global.b16 -> 2."""
    found = re.fullmatch(r"(?:ld|st)\.global(?:\.v(\d))?\.[bfsu](\d+)", op)
    assert found, op
    return int(found.group(1) or 1) * int(found.group(2)) // 8


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_kernels_cross_compile_with_vector_moves_and_no_local_memory(name, arch):
    make, args = CONFIGS[name]
    ptx = make(*args, ptx_options(arch)).__ptx__
    assert ".local" not in ptx and "ld.local" not in ptx and "st.local" not in ptx
    if name.startswith("routing"):
        atomics = [line for line in ptx.splitlines() if "atom." in line]
        assert atomics and all("atom.shared" in line for line in atomics)
        assert "shfl.sync.up" in ptx
        # a barrier between the passes (zero, count, scan, place): the emulator runs a CTA in
        # lockstep and cannot see one missing
        assert ptx.count("bar.sync") == 3
        return
    ops = [line.split()[0] for line in ptx.splitlines() if ".global" in line]
    if name.startswith("padded"):
        # codes move in 16-byte vectors, a batch of loads before their stores; scales (one
        # atom row's 4 columns) and indices in 32-bit words; no atomics; a barrier after the
        # offsets are staged and one after the tile's group is found
        assert {_vector_bytes(op) for op in ops} == {4, 16}
        vectors = [op for op in ops if op.endswith("v4.b32")]
        batch = ["ld.global.v4.b32"] * padded_rows.COPY_UNROLL
        assert vectors[: 2 * len(batch)] == batch + ["st.global.v4.b32"] * len(batch)
        assert "atom." not in ptx and ptx.count("bar.sync") == 2
        return
    # every store of a row is a vector of 16 bytes or more (sm_100 has 32-byte ones), and so
    # are the loads of h / y / bias rows; scalar loads are the index and weight tables only
    stores = [op for op in ops if op.startswith("st.")]
    assert stores and all(_vector_bytes(op) >= 16 for op in stores)
    assert sum(_vector_bytes(op) >= 16 for op in ops if op.startswith("ld.")) >= 2
    if not name.startswith("combine"):
        # the IEEE division or reciprocal of sigmoid / silu, no fast-math approximation
        assert "div.rn.f32" in ptx or "rcp.rn.f32" in ptx
        assert "div.approx" not in ptx and "div.full" not in ptx and "rcp.approx" not in ptx


# ----------------------------------------------------------------------------- the layer (GPU)


LAYER_CASES = {  # (format, activation, ids dtype, weights / bias dtype, activations)
    "nvfp4-silu": ("nvfp4", "silu", torch.int64, torch.float32, "bf16"),
    "mxfp4-swigluoai-biases": ("mxfp4", "swigluoai", torch.int32, torch.float64, "bf16"),
    "nvfp4-silu-w4a4": ("nvfp4", "silu", torch.int32, torch.float32, "dynamic"),
    "mxfp4-swigluoai-w4a4": ("mxfp4", "swigluoai", torch.int64, torch.bfloat16, "dynamic"),
}


@needs_cuda
@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_gpu_layer_runs_the_kernels_eagerly_and_the_torch_steps_when_tracked(monkeypatch, case):
    """Plain CUDA calls take the kernels (W4A4: ``quantize_exact_rows`` for each GEMM's rows), with
    no host sync; a gradient-tracking call takes the torch steps (the registered ops); both
    agree up to their float32 roundings (exp, sum order), far below what a wrong routing,
    activation or exact row would change."""
    import fp4_ops
    from fp4_ops import quantizer

    fmt, name, ids_dtype, float_dtype, activations = LAYER_CASES[case]
    calls = []
    for module, fn in (
        (moe_kernels, "route"),
        (moe_kernels, "activate"),
        (moe_kernels, "combine_tokens"),
        (quantizer, "quantize_exact_rows"),
    ):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, _f=real, _n=fn: calls.append(_n) or _f(*a))
    gen = torch.Generator().manual_seed(4)
    w13 = fp4_ops.quantize_experts(torch.randn(6, 128, 64, generator=gen).cuda(), fmt)
    w2 = fp4_ops.quantize_experts(torch.randn(6, 64, 64, generator=gen).cuda(), fmt)
    x = torch.randn(5, 64, generator=gen).bfloat16().cuda()
    ids = torch.randint(0, 6, (5, 2), generator=gen, dtype=ids_dtype).cuda()
    tw = torch.rand(5, 2, generator=gen, dtype=float_dtype).cuda()
    biases = {}
    if name == "swigluoai":
        biases = dict(
            w13_bias=torch.randn(6, 128, generator=gen, dtype=float_dtype).cuda(),
            w2_bias=torch.randn(6, 64, generator=gen, dtype=float_dtype).cuda(),
        )
    biases["activations"] = activations
    fp4_ops.fp4_moe(x, w13, w2, tw, ids, name, **biases)  # (compiles first)
    calls.clear()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            fused = fp4_ops.fp4_moe(x, w13, w2, tw, ids, name, **biases)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = ["route", "activate", "combine_tokens"]
    if activations == "dynamic":
        want = ["route", "quantize_exact_rows", "activate", "quantize_exact_rows"]
        want.append("combine_tokens")
    assert calls == want
    tracked = fp4_ops.fp4_moe(x.clone().requires_grad_(True), w13, w2, tw, ids, name, **biases)
    assert calls == want and tracked.requires_grad
    scale = tracked.detach().float().abs().amax()
    torch.testing.assert_close(fused.float(), tracked.detach().float(), atol=scale * 2**-5, rtol=0)


# ----------------------------------------------------------------------------- launches (CPU)


def _recorded_launches(monkeypatch):
    """moe_kernels' launches as (config, arguments), with no kernel compiled or run."""
    launches = []

    def function(config, device):
        return (lambda *args: launches.append((config, args))), 132

    monkeypatch.setattr(moe_kernels, "_function", function)
    monkeypatch.setattr(moe_kernels, "stream_handle", lambda index: 7)
    return launches


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_route_hands_the_kernel_its_ids_and_outputs_in_order(monkeypatch, ids_dtype):
    """Decode-sized x goes to the gathering variant with a new [P, H] for the rows; x past
    GATHER_BYTES (or rows not whole 16-byte vectors) to the plain one, its rows gathered by
    index_select in token_of's order."""
    launches = _recorded_launches(monkeypatch)
    ids = torch.zeros(3, 4, dtype=ids_dtype)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    got = moe_kernels.route(ids, 33, x)
    ((config, args),) = launches
    assert config == moe_kernels.RoutingConfig(NAMES_IDS[ids_dtype], 64, "BFloat16")
    outputs = (got.offsets, got.row_of, got.token_of, got.expert_of, got.ok)
    assert args[:6] == (ids.data_ptr(), *(t.data_ptr() for t in outputs))
    assert args[6:8] == (x.data_ptr(), got.rows.data_ptr())
    assert args[8:] == ((12, 4, 33, 64), 7)
    assert [tuple(t.shape) for t in outputs] == [(34,), (12,), (12,), (12,), (1,)]
    assert all(t.dtype == torch.int32 for t in outputs)
    assert got.rows.shape == (12, 64) and got.rows.dtype == torch.bfloat16
    big = moe_kernels.GATHER_BYTES // (12 * 4) + 8  # (float32 columns just past the limit)
    monkeypatch.setattr(torch, "empty", torch.zeros)  # (no kernel runs: token_of stays 0)
    for x in (torch.randn(3, big), torch.randn(3, 6, dtype=torch.bfloat16)):
        launches.clear()
        got = moe_kernels.route(ids, 33, x)
        ((config, args),) = launches
        assert config == moe_kernels.RoutingConfig(NAMES_IDS[ids_dtype], 64)
        assert torch.equal(got.rows, x[got.token_of.long()])


_BASE = torch.arange(64 * 64 + 4, dtype=torch.float32)


@pytest.mark.parametrize(
    "view, copied",
    [
        (_BASE[: 64 * 64].view(64, 64), False),
        (_BASE[: 64 * 64].view(64, 64).t(), True),  # aligned base, not row-major
        (_BASE[: 64 * 64].view(64, 64)[:, ::2], True),  # aligned base, strided rows
        (_BASE[1 : 64 * 64 + 1].view(64, 64), True),  # row-major, 4 bytes off the boundary
    ],
    ids=["aligned", "transposed", "strided", "misaligned"],
)
def test_aligned_rows_copies_exactly_what_the_kernels_cannot_read(view, copied):
    """A row-major tensor from a 16-byte aligned base goes as it is; any other comes back as
    a row-major copy of the same values from an aligned base."""
    out = memory.aligned_rows(view)
    assert (out.data_ptr() != view.data_ptr()) == copied
    assert out.is_contiguous() and out.data_ptr() % 16 == 0
    assert out.shape == view.shape and torch.equal(out, view)


def test_route_activation_and_combine_hand_their_kernels_16_byte_aligned_rows(monkeypatch):
    """A bias (or a decode x to gather) that starts off a 16-byte boundary reaches the kernel
    as an aligned copy of the same values; every other operand goes as it is, in the kernel's
    order."""
    launches = _recorded_launches(monkeypatch)
    h = torch.randn(4, 64, dtype=torch.bfloat16)
    expert_of = torch.zeros(4, dtype=torch.int32)
    storage = torch.randn(3 * 64 + 1)
    bias = storage[1:].view(3, 64)  # (4 bytes past an aligned base)
    assert bias.data_ptr() % 16
    out = moe_kernels.activate(h, "swigluoai", bias, expert_of)
    ((config, args),) = launches
    assert config == moe_kernels.ActivationConfig("BFloat16", "swigluoai", "Float32")
    assert args[0] == h.data_ptr() and args[1] == out.data_ptr() and args[3] == expert_of.data_ptr()
    assert args[2] % 16 == 0 and args[2] != bias.data_ptr()
    assert args[4:] == ((4, 32, 3), 132, 7)
    launches.clear()
    routes = moe_kernels.Routing(*(torch.zeros(n, dtype=torch.int32) for n in (4, 6, 6, 6, 1)))
    y, weights = torch.randn(6, 64), torch.rand(3, 2, dtype=torch.bfloat16)
    out = moe_kernels.combine_tokens(y, weights, routes, bias)
    ((config, args),) = launches
    assert config == moe_kernels.CombineConfig("Float32", "BFloat16", "Float32")
    want = (y.data_ptr(), weights.data_ptr(), routes.row_of.data_ptr())
    assert args[:3] == want and args[3] % 16 == 0 and args[3] != bias.data_ptr()
    assert args[4:6] == (routes.expert_of.data_ptr(), out.data_ptr())
    assert args[6:] == ((3, 2, 64, 3), 132, 7)
    launches.clear()
    x = torch.randn(3 * 64 + 1, dtype=torch.bfloat16)[1:].view(3, 64)  # (2 bytes off)
    assert x.data_ptr() % 16
    moe_kernels.route(torch.zeros(3, 2, dtype=torch.int32), 4, x)
    ((config, args),) = launches
    assert config == moe_kernels.RoutingConfig("Int32", 32, "BFloat16")  # (the gathering one)
    assert args[6] % 16 == 0 and args[6] != x.data_ptr()


def test_route_refuses_more_experts_than_its_count_slots_hold(monkeypatch):
    _recorded_launches(monkeypatch)
    ids = torch.zeros(2, 2, dtype=torch.int32)
    x = torch.zeros(2, 32)
    moe_kernels.route(ids, moe_kernels.MAX_EXPERTS, x)
    with pytest.raises(ValueError, match="at most 8191 experts, got 8192"):
        moe_kernels.route(ids, moe_kernels.MAX_EXPERTS + 1, x)
    # (the largest cap's counts and the four words beside them fit 48 KB of static SMEM)
    assert 4 * moe_kernels.experts_cap(moe_kernels.MAX_EXPERTS) + 16 <= 48 * 1024
