# SPDX-License-Identifier: BSD-3-Clause
"""The GPU quantizer's PTX, run on the CPU (tests/ptx_emulator.py), bit for bit against
reference.py: codes, blocked scales with their zero padding, the global scale.

The kernels are cross-compiled for sm_90a (no GPU needed) and every CTA of a small grid runs:
the amax grid to completion, then the quantize grid. The launch parameters are built here from
the launch's contract (``QuantizeFp4.__call__``): extents, fast-divmod divisors, pointers; the
grids are chosen small (the kernels walk any grid size), so that each grid-stride loop turns.
Each output byte must be stored exactly once (no memset before the kernel). The emulator itself
is checked against torch's conversions and exact rationals.

Limits: this is the PTX, not the SASS that ptxas makes of it (a contraction of mul + add into an
fma there would go unseen); the host side's launch arithmetic is mirrored here, not run.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import ptx_options
from ptx_emulator import GlobalMemory, Grid, Params, PtxError, e4m3_from_f32, fma_f32, parse_ptx
from test_quantize_fp4 import _every_scale_byte, exact_rows_reference, quantizer_inputs
from test_quantize_midpoints import (
    dynamic_direction,
    dynamic_rounding,
    e2m1_element_ties,
    e4m3_scale_midpoints,
    e8m0_ties,
    quotient_cases,
)

import reference
from fp4_ops import quantizer

THREADS = 128
MAX_PARTIALS = 640  # the partials buffer the launch allocates (quantizer.MAX_PARTIALS)
AMAX_SMEM = 16  # the CTA max's 4 warp maxima
QUANT_SMEM = 16 + 2 * 128 * 4  # the CTA max's words, then (divisor, 1 / divisor) per scale byte
TORCH_IN = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}


@functools.cache
def _entries(
    in_dtype: str, vec: int, dynamic: bool, local: bool = False, tokens=False, exact_rows=False
) -> tuple:
    """(amax Entry or None, quantize Entry) of the config's PTX, compiled once per process."""
    options = ptx_options()
    ex = quantizer.compile_quantizer(in_dtype, vec, dynamic, options, local, tokens, exact_rows)
    entries = parse_ptx(ex.__ptx__)
    amax = [e for name, e in entries.items() if "amax_kernel" in name]
    quant = [e for name, e in entries.items() if "amax_kernel" not in name]
    assert len(quant) == 1 and len(amax) == (1 if dynamic and not local else 0)
    return (amax[0] if amax else None), quant[0]


def fast_divmod(d: int) -> tuple[int, int, int]:
    """(multiplier, shift1, shift2) with t // d = (hi + ((t - hi) >> s1)) >> s2, hi = the high
    word of t * multiplier, for 0 <= t < 2^31 (Granlund-Montgomery)."""
    ell = max(d - 1, 0).bit_length()  # ceil(log2 d)
    return (((1 << 32) * ((1 << ell) - d)) // d + 1) % (1 << 32), min(ell, 1), max(ell - 1, 0)


def _put_divmod(params: Params, index: int, d: int) -> None:
    mult, s1, s2 = fast_divmod(d)
    params.put(index, d, 4, 0)
    params.put(index, mult, 4, 4)
    params.put(index, s1, 1, 8)
    params.put(index, s2, 1, 9)
    params.put(index + 1, d, 4)


def _amax_grid(amax_entry, gmem: GlobalMemory, x_ptr: int, partials: int, steps: int, ctas: int):
    """The amax grid's run: the per-CTA maxima of |x| (``steps`` rows of 32) into partials."""
    p = Params(amax_entry)
    p.put(0, x_ptr, 8)
    p.put(1, partials, 8)
    p.put(2, steps, 4)
    Grid(amax_entry, ctas, THREADS, p, gmem, AMAX_SMEM).run()


def _partials(amax_entry, gmem: GlobalMemory, x_ptr: int, steps: int, ctas: int) -> int:
    """The partials buffer the launch allocates, filled by an amax grid of ``ctas`` CTAs where
    the configuration has one (``amax_entry`` not None)."""
    partials = gmem.alloc(4 * MAX_PARTIALS)
    if amax_entry is not None:
        _amax_grid(amax_entry, gmem, x_ptr, partials, steps, ctas)
    return partials


def _walk_params(p: Params, x_ptr: int, local_steps, amax_count, extents, pairs_pad, rows_pad):
    """The quantize grid's parameters past its pointers and output layouts: (``local_steps``
    given) x again as the rows of 32 elements each CTA reduces, the maxima's count, the walk's
    extents (rows, scale columns, threads), the fast divisors of its thread index."""
    if local_steps is not None:
        p.put(5, x_ptr, 8)
        p.put(5, local_steps, 4, 8)
    rows, sf_cols, total = extents
    for i, v in enumerate((amax_count, rows, sf_cols, total, -(-total // 32) * 32)):
        p.put(6 + i, v, 4)
    _put_divmod(p, 11, pairs_pad)
    _put_divmod(p, 13, rows_pad)


def emulate(x: torch.Tensor, vec: int, gs=None, ctas: int = 2, amax_ctas: int = 3, local=False):
    """(codes [L, R, K/2], blocked scale bytes [L, n], gs out, store counts) of the PTX's grids
    on x [L, R, K]; ``gs`` a static NVFP4 global scale or None (dynamic, or MXFP4); ``local``:
    the dynamic kernel whose CTAs each reduce x itself (no amax grid)."""
    dynamic = vec == 16 and gs is None
    local = local and dynamic
    amax_entry, entry = _entries(TORCH_IN[x.dtype], vec, dynamic, local)
    n_batch, rows, k = x.shape
    rows_pad, sf_cols = -(-rows // 128) * 128, k // vec
    sf_cols_pad = -(-sf_cols // 4) * 4
    # (the walk as the launch sizes it: its host arithmetic is under test too)
    pairs_pad, _, total = quantizer.walk_shape(rows, k, n_batch, vec, False, False)
    gmem = GlobalMemory()
    x_ptr = gmem.alloc(x.contiguous().view(torch.uint8).numpy().tobytes())
    q_ptr = gmem.alloc(x.numel() // 2)
    sf_ptr = gmem.alloc(n_batch * rows_pad * sf_cols_pad)
    gs_in = gmem.alloc(4) if gs is None else gmem.alloc(np.float32(gs).tobytes())
    gs_out = gmem.alloc(4)
    steps = x.numel() // 32
    partials = _partials(amax_entry, gmem, x_ptr, steps, amax_ctas)
    p = Params(entry)
    for i, ptr in enumerate((x_ptr, q_ptr, sf_ptr, gs_in, gs_out, partials)):
        p.put(i, ptr, 8)
    amax_count = steps if local else amax_ctas
    extents = (rows, sf_cols, total)
    _walk_params(p, x_ptr, steps if local else None, amax_count, extents, pairs_pad, rows_pad)
    Grid(entry, ctas, THREADS, p, gmem, QUANT_SMEM).run()
    codes = torch.from_numpy(gmem.read(q_ptr, x.numel() // 2)).view(n_batch, rows, k // 2)
    scales = torch.from_numpy(gmem.read(sf_ptr, n_batch * rows_pad * sf_cols_pad))
    counts = np.concatenate(
        [gmem.store_counts(q_ptr, x.numel() // 2), gmem.store_counts(sf_ptr, scales.numel())]
    )
    got_gs = float(gmem.read(gs_out, 4).view(np.float32)[0])
    return codes, scales.view(n_batch, -1), got_gs, counts, gmem.store_counts(gs_out, 4)


def check(x: torch.Tensor, vec: int, gs=None, **grid) -> None:
    """The emulated grids' outputs equal reference.py's, bit for bit, each byte stored once
    (``grid``: emulate's ctas, amax_ctas, local)."""
    codes, scales, got_gs, counts, gs_counts = emulate(x, vec, gs, **grid)
    if vec == 16:
        want_q, want_sf, want_gs = reference.quantize_nvfp4(x, gs)
    else:
        (want_q, want_sf), want_gs = reference.quantize_mxfp4(x), torch.tensor(1.0)
    blocked = reference.to_blocked(want_sf).view(torch.uint8)
    assert (counts == 1).all(), f"{int((counts != 1).sum())} output bytes not stored exactly once"
    assert (gs_counts == 1).all(), "the global scale is not stored exactly once"
    bad = (scales != blocked).nonzero()[:4].tolist()
    assert torch.equal(scales, blocked), f"scale bytes differ at {bad}"
    bad = (codes != want_q).nonzero()[:4].tolist()
    assert torch.equal(codes, want_q), f"code bytes differ at {bad}"
    assert np.float32(got_gs).tobytes() == np.float32(float(want_gs)).tobytes()


def emulate_tokens(x: torch.Tensor, vec: int, gs=None, local=True, pad_rows=3, ctas=2, amax_ctas=3):
    """(token copy as 16-bit words [rows + pad_rows, K_pad], its store counts, gs out) of the
    tokens kernel's grid on x [rows, K] (L = 1), in CTAs of the threads its entry requires;
    dynamic NVFP4 runs the local-amax kernel, or (not ``local``) the amax grid ahead of it."""
    dynamic = vec == 16 and gs is None
    local = local and dynamic
    amax_entry, entry = _entries(TORCH_IN[x.dtype], vec, dynamic, local, True)
    rows, k = x.shape
    k_pad, sf_cols = -(-k // 64) * 64, k // vec
    units_pad, _, total = quantizer.walk_shape(rows, k, 1, vec, True, vec == 16)
    gmem = GlobalMemory()
    x_ptr = gmem.alloc(x.contiguous().view(torch.uint8).numpy().tobytes())
    copy_bytes = (rows + pad_rows) * k_pad * 2
    copy = gmem.alloc(copy_bytes)
    gs_in = gmem.alloc(4) if gs is None else gmem.alloc(np.float32(gs).tobytes())
    gs_out = gmem.alloc(4)
    steps = x.numel() // 32
    partials = _partials(amax_entry, gmem, x_ptr, steps, amax_ctas)
    p = Params(entry)
    for i, ptr in enumerate((x_ptr, copy, copy, gs_in, gs_out, partials)):
        p.put(i, ptr, 8)
    # the copy as words [rows, K_pad / 2]: extents, then the row stride
    for off, v in ((8, rows), (12, k_pad // 2), (16, k_pad // 2)):
        p.put(1, v, 4, off)
    amax_count = steps if local else amax_ctas
    extents = (rows, sf_cols, total)
    _walk_params(p, x_ptr, steps if local else None, amax_count, extents, units_pad, rows)
    Grid(entry, ctas, entry.reqntid, p, gmem, QUANT_SMEM).run()
    words = torch.from_numpy(gmem.read(copy, copy_bytes).view(np.int16).copy())
    counts = gmem.store_counts(copy, copy_bytes).reshape(rows + pad_rows, 2 * k_pad)
    got_gs = float(gmem.read(gs_out, 4).view(np.float32)[0])
    return words.view(rows + pad_rows, k_pad), counts, got_gs


def token_copy_reference(x: torch.Tensor, vec: int, gs=None) -> torch.Tensor:
    """The Hopper decode GEMM's token copy of x [rows, K], from reference.py's codes and scales:
    e2m1 x block scale (no global scale), NVFP4 in F16 times 2^-7, MXFP4 in BF16, at position
    8c + 2q + h of each 64-wide k-block the element 16q + 8(c // 4) + c % 4 + 4h (chunk c, group
    q, half h: pair P_c of each 16-group); positions past K hold +0."""
    rows, k = x.shape
    if vec == 16:
        codes, sf, _ = reference.quantize_nvfp4(x.unsqueeze(0), gs)
        dtype, factor = torch.float16, 2.0**-7
    else:
        codes, sf = reference.quantize_mxfp4(x.unsqueeze(0))
        dtype, factor = torch.bfloat16, 1.0
    e2m1 = reference.e2m1_to_fp32(reference.unpack_fp4(codes[0]))
    values = e2m1 * sf[0].float().repeat_interleave(vec, dim=1) * factor
    return copy_order(values).to(dtype).view(torch.int16)


def copy_order(values: torch.Tensor) -> torch.Tensor:
    """values [rows, K] in the token copy's order [rows, K_pad] (K_pad = K rounded up to 64,
    zeros past K): at position 8c + 2q + h of each 64-wide k-block the element 16q + 8(c // 4) +
    c % 4 + 4h (chunk c, group q, half h: pair P_c of each 16-group)."""
    rows, k = values.shape
    k_pad = -(-k // 64) * 64
    padded = torch.zeros(rows, k_pad, dtype=values.dtype)
    padded[:, :k] = values
    c, q, h = torch.meshgrid(torch.arange(8), torch.arange(4), torch.arange(2), indexing="ij")
    source = (16 * q + 8 * (c // 4) + c % 4 + 4 * h).reshape(-1)
    return padded.view(rows, k_pad // 64, 64)[:, :, source].reshape(rows, k_pad)


TOKEN_MODES = {
    "nvfp4-local": (16, None, True),
    "nvfp4-amax-grid": (16, None, False),
    "nvfp4-static": (16, 0.0013, False),
    # (outside [2^-60, 2^60]: the walk with IEEE divisions for the block scales)
    "nvfp4-static-ieee": (16, 2.0**-62, False),
    "mxfp4": (32, None, False),
}


@pytest.mark.parametrize("dtype", list(TORCH_IN), ids=str)
@pytest.mark.parametrize("mode", list(TOKEN_MODES))
@pytest.mark.parametrize("kind", ["normal", "zeros", "wide", "denormal"])
@pytest.mark.parametrize("k", [32, 64, 96, 128, 192], ids=lambda k: f"K={k}")
def test_token_copy_matches_reference(k, kind, mode, dtype):
    """The tokens kernel writes the decode GEMM's token copy bit for bit as the reference's
    codes and scales give it (K = 32, 96: a half k-block at the end; 64, 128, 192: whole
    blocks, K / 32 of each residue mod 4, so that a lane pair's scale columns lie wholly past
    K at 64 and 192), every byte of the live rows once, the padding rows never; and the global
    scale."""
    vec, gs, local = TOKEN_MODES[mode]
    x = quantizer_inputs(kind, (1, 37, k), dtype, seed=11)[0]
    words, counts, got_gs = emulate_tokens(x, vec, gs, local, ctas=3)
    want = token_copy_reference(x, vec, gs)
    rows = x.shape[0]
    assert (counts[:rows] == 1).all(), f"{int((counts[:rows] != 1).sum())} bytes not stored once"
    assert (counts[rows:] == 0).all(), "a padding row was written"
    bad = (words[:rows] != want).nonzero()[:4].tolist()
    assert torch.equal(words[:rows], want), f"copy words differ at {bad}"
    if vec == 16:
        want_gs = reference.quantize_nvfp4(x.unsqueeze(0), gs)[2]
        assert np.float32(got_gs).tobytes() == np.float32(float(want_gs)).tobytes()


@pytest.mark.parametrize("dtype", list(TORCH_IN), ids=str)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
@pytest.mark.parametrize("mode", list(TOKEN_MODES))
def test_token_copy_of_non_finite_blocks(mode, bad, dtype):
    """Blocks holding NaN or Inf behind the tokens kernel (in either half of a 16-block, and the
    last element of a K = 32 x odd row): their values NaN in the copy (the NaN scale byte), the
    others as reference.py's with those blocks zeroed, +0 past K. A dynamic global scale turns
    non-finite: every value within K NaN."""
    vec, gs, local = TOKEN_MODES[mode]
    x = quantizer_inputs("normal", (1, 37, 96), dtype, seed=3)[0]
    spots = [(0, 5), (20, 40), (36, 95)]
    clean, bad_blocks = x.clone(), torch.zeros(x.shape)
    for r, c in spots:
        x[r, c] = bad
        clean[r, c // vec * vec : (c // vec + 1) * vec] = 0.0
        bad_blocks[r, c // vec * vec : (c // vec + 1) * vec] = 1.0
    words, _, got_gs = emulate_tokens(x, vec, gs, local, ctas=3)
    words = words[: x.shape[0]]
    values = words.view(torch.float16 if vec == 16 else torch.bfloat16).float()
    inside = copy_order(torch.ones(x.shape)) != 0
    if vec == 16 and gs is None:
        assert not math.isfinite(got_gs)
        nan_at = inside
    else:
        nan_at = copy_order(bad_blocks) != 0
    assert values[nan_at].isnan().all(), f"{int((~values[nan_at].isnan()).sum())} values not NaN"
    want = token_copy_reference(clean, vec, gs)
    assert torch.equal(words[~nan_at], want[~nan_at])
    assert not words[~inside].any(), "a value past K is not +0"


def emulate_exact_rows(x: torch.Tensor, vec: int, local: bool, ctas: int = 2, amax_ctas: int = 3):
    """(values as BF16 bits [rows, K], their store counts, gs out) of the exact-rows mode's grids
    on x [rows, K] (L = 1; NVFP4 dynamic, with the amax grid unless ``local``)."""
    dynamic = vec == 16
    local = local and dynamic
    amax_entry, entry = _entries(TORCH_IN[x.dtype], vec, dynamic, local, False, True)
    rows, k = x.shape
    sf_cols = k // vec
    pairs_pad, _, total = quantizer.walk_shape(rows, k, 1, vec, True, False)
    gmem = GlobalMemory()
    x_ptr = gmem.alloc(x.contiguous().view(torch.uint8).numpy().tobytes())
    out = gmem.alloc(rows * k * 2)
    gs_out = gmem.alloc(4)
    steps = x.numel() // 32
    partials = _partials(amax_entry, gmem, x_ptr, steps, amax_ctas)
    p = Params(entry)
    for i, ptr in enumerate((x_ptr, out, out, gs_out, gs_out, partials)):
        p.put(i, ptr, 8)
    # the values by (row, block, value): extents, then the row stride
    for off, v in ((8, rows), (12, sf_cols), (16, k)):
        p.put(1, v, 4, off)
    amax_count = steps if local else amax_ctas
    extents = (rows, sf_cols, total)
    _walk_params(p, x_ptr, steps if local else None, amax_count, extents, pairs_pad, rows)
    Grid(entry, ctas, THREADS, p, gmem, QUANT_SMEM).run()
    bits = torch.from_numpy(gmem.read(out, rows * k * 2).view(np.int16).copy()).view(rows, k)
    got_gs = float(gmem.read(gs_out, 4).view(np.float32)[0])
    return bits, gmem.store_counts(out, rows * k * 2), got_gs


EXACT_MODES = {"nvfp4-local": (16, True), "nvfp4-amax-grid": (16, False), "mxfp4": (32, False)}


@pytest.mark.parametrize("dtype", list(TORCH_IN), ids=str)
@pytest.mark.parametrize("mode", list(EXACT_MODES))
@pytest.mark.parametrize("kind", ["normal", "zeros", "wide", "denormal", "ties"])
@pytest.mark.parametrize("k", [32, 96, 160], ids=lambda k: f"K={k}")
def test_exact_rows_match_reference(k, kind, mode, dtype):
    """The exact-rows mode writes e2m1 x block scale of reference.py's codes and scales, bit
    for bit (signed zeros, BF16 subnormals of MXFP4's shifted scales, NVFP4's subnormal E4M3
    scales), each byte once, and the global scale (K = 32, 160: MXFP4 rows of an odd block
    count, whose second block lies past K)."""
    vec, local = EXACT_MODES[mode]
    x = quantizer_inputs(kind, (1, 37, k), dtype, seed=k)[0]
    bits, counts, got_gs = emulate_exact_rows(x, vec, local, ctas=3)
    want, want_gs = exact_rows_reference(x, vec)
    assert (counts == 1).all(), f"{int((counts != 1).sum())} bytes not stored exactly once"
    bad = (bits != want).nonzero()[:4].tolist()
    assert torch.equal(bits, want), f"values differ at {bad}"
    assert np.float32(got_gs).tobytes() == np.float32(want_gs).tobytes()


@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
def test_exact_rows_at_every_scale_byte(vec):
    """Every scale byte a quantization reaches (``_every_scale_byte``: NVFP4's E4M3 values
    down to the subnormal 2^-9, MXFP4's E8M0 from 2^-127, whose shifted values are BF16
    subnormals, to 2^126), each block's values bit for bit."""
    x = _every_scale_byte(vec)
    bits, counts, _ = emulate_exact_rows(x, vec, local=False, ctas=4)
    want, _ = exact_rows_reference(x, vec)
    assert (counts == 1).all()
    bad = (bits != want).nonzero()[:4].tolist()
    assert torch.equal(bits, want), f"values differ at {bad}"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=str)
@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
def test_exact_rows_of_non_finite_blocks_are_nan(vec, bad):
    """A block holding NaN or Inf has the NaN scale byte, so its values are NaN; NVFP4's
    dynamic global scale is then not finite, and every value is NaN; MXFP4's other blocks are
    those of x with that block zeroed (its blocks are independent)."""
    x = quantizer_inputs("normal", (1, 5, 64), torch.float32, seed=3)[0]
    x[2, 40] = bad
    bits, _, _ = emulate_exact_rows(x, vec, local=True)
    values = bits.view(torch.bfloat16).float()
    if vec == 16:
        assert bool(values.isnan().all())
        return
    block = torch.zeros_like(values, dtype=torch.bool)
    block[2, 32:64] = True
    assert torch.equal(values.isnan(), block)
    want = exact_rows_reference(x.masked_fill(block, 0.0), vec)[0]
    assert torch.equal(bits[~block], want[~block])


# ------------------------------------------------------------------------------ the grids

# (vec, static global scale, local amax)
MODES = {
    "nvfp4-dynamic": (16, None, False),
    "nvfp4-local": (16, None, True),
    "nvfp4-static": (16, 0.0013, False),
    "mxfp4": (32, None, False),
}
# [L, R, K]: two batches, rows past one 128-row atom, K / 16 = 6 (padded to 8 scale columns),
# K / 32 = 3 (an odd count: a dead second block per row)
SHAPE = (2, 130, 96)


@pytest.mark.parametrize("dtype", list(TORCH_IN), ids=str)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["normal", "zeros", "ties", "wide", "denormal"])
def test_grid_matches_reference(kind, mode, dtype):
    """Random, zero (blocks, rows, -0), E2M1-tie, wide-range and subnormal inputs."""
    vec, gs, local = MODES[mode]
    x = quantizer_inputs(kind, SHAPE, dtype, seed=3)
    check(x, vec, gs, local=local)


@pytest.mark.parametrize("ctas, amax_ctas", [(1, 1), (3, 2), (16, 8)])
@pytest.mark.parametrize("mode", list(MODES))
def test_any_grid_size(ctas, amax_ctas, mode):
    """The persistent grids walk any grid size: one CTA (many turns of the loops), a few, and
    more CTAs than the thread space needs (idle warps; the first step then reaches every batch
    and ragged row: two batches of 200 rows, padded to 256)."""
    vec, gs, local = MODES[mode]
    x = quantizer_inputs("normal", (2, 200, 64), torch.bfloat16, seed=4)
    check(x, vec, gs, ctas=ctas, amax_ctas=amax_ctas, local=local)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["+0", "-0"])
@pytest.mark.parametrize("mode", list(MODES))
def test_all_zero_tensor(mode, sign):
    """amax 0: the dynamic global scale is 1.0, every scale byte 0 (E8M0: 2^-127), codes keep
    the sign of zero."""
    vec, gs, local = MODES[mode]
    check(torch.zeros(SHAPE, dtype=torch.bfloat16) * sign, vec, gs, local=local)


# (non-powers of two: Markstein quotients by them are inexact where the fast walk is wrong)
@pytest.mark.parametrize(
    "gs",
    [0.7 * 2.0**-95, 1.3 * 2.0**-61, 1.3 * 2.0**61, 1.7 * 2.0**126],
    ids=["0.7*2^-95", "1.3*2^-61", "1.3*2^61", "1.7*2^126"],
)
def test_static_scale_outside_the_fast_range(gs):
    """Static global scales outside [2^-60, 2^60]: the walk with IEEE divisions for the block
    scales (at E4M3 midpoints), and for elements whose divisor lies outside [2^-100, 2^100]."""
    if gs < 2.0**100:
        check(quantizer_inputs("wide", (1, 130, 64), torch.float32, seed=6) * (gs * 2.0**4), 16, gs)
    mids = e4m3_scale_midpoints(gs)
    check(mids[torch.isfinite(mids).all(1)].unsqueeze(0), 16, gs, ctas=4)


def _edge_blocks(gs: float, dtype: torch.dtype) -> torch.Tensor:
    """Rows [1, rows, 32] of two blocks (the second the first negated) for a static global
    scale: for each of the nine smallest E4M3 scale bytes, amax 6 * byte's value * gs over
    zeros and small values (the smallest divisors), and, where x can hold it, amax
    2^128 * 6 * gs (amax / 6 / gs overflows fp32, past any clamp at 448)."""
    rows = []
    for byte in range(1, 10):
        scale = float(torch.tensor(byte, dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        amax = 6.0 * scale * gs
        rows.append([amax, 0.0, -0.0, amax / 3, -amax / 7, amax * 2.0**-20] + [0.0] * 10)
    huge = 2.0**128 * 6.0 * gs
    if huge < torch.finfo(dtype).max:
        rows.append([huge, 1.0, -1.0, 0.0] + [huge * 2.0**-30] * 12)
    blocks = torch.tensor(rows, dtype=torch.float32)
    return torch.cat([blocks, -blocks], dim=1).to(dtype).unsqueeze(0)


# (the fast walk's window [2^-60, 2^60] at both ends, and just below it)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "gs", [2.0**-60, 0.99 * 2.0**60, 1.3 * 2.0**-125], ids=["2^-60", "0.99*2^60", "1.3*2^-125"]
)
def test_static_scale_edges_of_the_fast_walk(gs, dtype):
    """Inside the window every step of the fast walk stays finite: the smallest scale bytes'
    divisors have finite reciprocals and an amax whose quotient overflows still saturates at
    448; just below it, where a divisor's reciprocal overflows, the IEEE walk gives the
    reference's bytes."""
    check(_edge_blocks(gs, dtype), 16, gs, ctas=2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
@pytest.mark.parametrize("mode", list(MODES))
def test_non_finite_blocks(mode, bad):
    """Blocks holding NaN or Inf (the module's contract; reference.py refuses them): NaN scale
    bytes and zero codes; the other blocks as reference.py's with those blocks zeroed. A dynamic
    global scale turns non-finite: every scale byte NaN, every code zero."""
    vec, gs, local = MODES[mode]
    x = quantizer_inputs("normal", SHAPE, torch.bfloat16, seed=7)
    spots = [(0, 0, 5), (0, 129, 95), (1, 64, 40)]
    clean = x.clone()
    for b, r, c in spots:
        x[b, r, c] = bad
        clean[b, r, c // vec * vec : (c // vec + 1) * vec] = 0.0
    codes, scales, got_gs, _, _ = emulate(x, vec, gs, local=local)
    nan_byte = 0x7F if vec == 16 else 0xFF
    if vec == 16:
        want_q, want_sf, _ = reference.quantize_nvfp4(clean, 1.0 if gs is None else gs)
    else:
        want_q, want_sf = reference.quantize_mxfp4(clean)
    want_sf = want_sf.view(torch.uint8).clone()
    for b, r, c in spots:
        want_sf[b, r, c // vec] = nan_byte
        want_q[b, r, c // vec * vec // 2 : (c // vec + 1) * vec // 2] = 0
    if gs is None and vec == 16:
        assert not math.isfinite(got_gs)
        want_sf[:], want_q[:] = nan_byte, 0
    assert torch.equal(scales, reference.to_blocked(want_sf))
    assert torch.equal(codes, want_q)


@pytest.mark.parametrize("gs", [0.0, -0.0, -0.5, float("inf"), float("nan")], ids=str)
def test_bad_static_global_scale_makes_every_scale_nan(gs):
    """A static NVFP4 global scale that is not finite and positive (+0 included), read as the
    kernel runs: every scale byte the NaN byte and every code zero, so every product that
    reads them is NaN (the module's contract; nothing can raise without a sync)."""
    x = quantizer_inputs("normal", (1, 130, 64), torch.bfloat16, seed=5)
    x[0, 7, :16] = 0.0  # an all-zero block too
    codes, scales, _, _, _ = emulate(x, 16, gs)
    plain = reference.from_blocked(scales, 130, 4)
    assert bool((plain == 0x7F).all()) and not bool(codes.any())


MIDPOINTS = [
    ("e4m3-mid-gs1", lambda: e4m3_scale_midpoints(1.0), 16, 1.0),
    ("e4m3-mid-gs0.3", lambda: e4m3_scale_midpoints(0.3), 16, 0.3),
    ("e2m1-ties-gs0.5", lambda: e2m1_element_ties(0.5, 16), 16, 0.5),
    ("e2m1-ties-dynamic", dynamic_direction, 16, None),
    ("dynamic-rounding", dynamic_rounding, 16, None),
    ("e2m1-ties-mxfp4", lambda: e2m1_element_ties(1.0, 32), 32, None),
    ("e8m0-ties", e8m0_ties, 32, None),
    ("quotient-gs0.3", lambda: quotient_cases(0.3), 16, 0.3),
    ("quotient-gs1/7", lambda: quotient_cases(1 / 7), 16, 1 / 7),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("make, vec, gs", [c[1:] for c in MIDPOINTS], ids=[c[0] for c in MIDPOINTS])
def test_grid_at_midpoints(make, vec, gs, dtype):
    """tests/test_quantize_midpoints.py's cases: E4M3 scale and E2M1 element ties, E8M0 ties
    (amax 6 * 2^e and 1 ulp above), quotients where x / d and x * fl(1 / d) differ."""
    x = make().to(dtype)
    check(x.unsqueeze(0), vec, gs, ctas=4)


@pytest.mark.parametrize("tokens", [False, True], ids=["codes", "tokens"])
@pytest.mark.parametrize("cta", [203, 550])
def test_dynamic_scale_from_many_partials(cta, tokens):
    """An amax grid of 600 CTAs, the maximum in CTA ``cta``'s partial (the second and the fifth
    partial of a quantize thread), behind the codes and the tokens kernels: the reduction of 5
    partials per thread reaches it."""
    x = quantizer_inputs(
        "normal", (1, 128, (cta + 1) * THREADS * 32 // 128), torch.bfloat16, seed=5
    )
    x.view(-1)[cta * THREADS * 32 + 77] = 1000.0
    if not tokens:
        check(x, 16, None, ctas=64, amax_ctas=600)
        return
    words, _, got_gs = emulate_tokens(x[0], 16, None, False, ctas=64, amax_ctas=600)
    want_gs = reference.quantize_nvfp4(x, None)[2]
    assert np.float32(got_gs).tobytes() == np.float32(float(want_gs)).tobytes()
    assert torch.equal(words[: x.shape[1]], token_copy_reference(x[0], 16))


# ------------------------------------------------------------------------------ the emulator


def _f32_of_fraction(v: Fraction) -> np.float32:
    """v rounded to float32, to nearest even, by exact rational arithmetic (normal range)."""
    if v == 0:
        return np.float32(0.0)
    e = max(math.floor(math.log2(abs(v))) - 23, -149)
    while abs(v) >= Fraction(2) ** (e + 24):  # (log2 of a rational can be off by one)
        e += 1
    while e > -149 and abs(v) < Fraction(2) ** (e + 23):
        e -= 1
    return np.float32(round(v / Fraction(2) ** e) * 2.0**e)


def test_fma_rounds_once():
    """fma_f32 against exact rationals: random operands, and the cases where rounding the
    float64 sum to float32 rounds twice (a * b + 1 = 1 + 2^-24 +- 2^-60)."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(2000).astype(np.float32) for _ in range(3))
    c = c * np.float32(2.0**-20)  # sums that cancel partly
    hard = [
        (4097 * 2.0**-12, 16773121 * 2.0**-48, 1.0),
        (262143 * 2.0**-18, 262145 * 2.0**-42, 1.0),
    ]
    hard += [(-x, y, -z) for x, y, z in hard]
    a, b, c = (
        np.concatenate([v, np.float32([h[i] for h in hard])]) for i, v in enumerate((a, b, c))
    )
    got = fma_f32(a, b, c)
    want = [
        _f32_of_fraction(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r)))
        for p, q, r in zip(a, b, c, strict=True)
    ]
    assert got.tobytes() == np.float32(want).tobytes()
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert naive[-4:].tobytes() != got[-4:].tobytes()  # (the hard cases are hard)


def test_e4m3_conversion_matches_torch():
    """cvt.rn.satfinite.e4m3x2.f32 (the emulator's) against torch's float8_e4m3fn: every E4M3
    value, the midpoints between them and 1 ulp beside, subnormals, random values; past 448
    it saturates, NaN gives 0x7F."""
    values = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (values[:-1] + values[1:]) / 2
    near = torch.cat([values, mids, mids.view(torch.int32).add(1).view(torch.float32)])
    near = torch.cat([near, mids.view(torch.int32).sub(1).view(torch.float32)])
    rand = torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 40
    x = torch.cat([near, -near, rand[rand.abs() < 448], torch.tensor([2.0**-12, -0.0])])
    want = x.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert (e4m3_from_f32(x.numpy()) == want).all()
    sat = np.float32([448.0, 463.99, 464.0, 1e30, np.inf, -500.0, -np.inf, np.nan])
    assert e4m3_from_f32(sat).tolist() == [0x7E] * 5 + [0xFE, 0xFE, 0x7F]


def test_fast_divmod_divides():
    """The launch's fast-divmod divisors give t // d over the kernels' index range."""
    t = np.concatenate([np.arange(5000), np.int64(2**31) - 1 - np.arange(100)]).astype(np.uint64)
    for d in [1, 2, 3, 4, 5, 7, 128, 256, 384, 1000, 2**20 + 1]:
        mult, s1, s2 = fast_divmod(d)
        hi = (t * np.uint64(mult)) >> np.uint64(32)
        q = (hi + ((t - hi) >> np.uint64(s1))) >> np.uint64(s2)
        assert (q == t // np.uint64(d)).all(), d


_TOY = """
.visible .entry toy(
    .param .u32 toy_param_0
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    mov.u32 %r1, %tid.x;
    setp.lt.u32 %p1, %r1, 16;
    @%p1 bra $L__done;
    OP
$L__done:
    ret;
}
"""


@pytest.mark.parametrize(
    "op, why",
    [
        ("shfl.sync.bfly.b32 %r2, %r1, 1, 31, -1;", "part of a 32-thread group"),
        ("bar.sync 0;", "part of a 128-thread group"),
        ("brev.b32 %r2, %r1;", "not emulated"),
        ("add.rz.f32 %r2, %r1, %r1;", "not emulated"),
        ("mov.b32 %r2, %r5;", "never-written"),
    ],
)
def test_emulator_refuses_what_it_does_not_model(op, why):
    """A shuffle or barrier that part of the warp (CTA) skips, an unknown instruction or
    rounding mode, a read of an unset register: PtxError, never a silent result."""
    entry = parse_ptx(_TOY.replace("OP", op))["toy"]
    with pytest.raises(PtxError, match=why):
        Grid(entry, 1, THREADS, Params(entry), GlobalMemory()).run()


def test_emulator_refuses_out_of_bounds_stores():
    """A store one word past its buffer raises (the guard between buffers)."""
    ptx = _TOY.replace("OP", "st.global.b32 [%rd1+4], %r1;").replace(
        ".u32 toy_param_0", ".u64 toy_param_0"
    )
    ptx = ptx.replace("mov.u32 %r1", "ld.param.b64 %rd1, [toy_param_0];\n    mov.u32 %r1")
    ptx = ptx.replace(".reg .b32 %r<8>;", ".reg .b32 %r<8>;\n    .reg .b64 %rd<2>;")
    entry = parse_ptx(ptx)["toy"]
    gmem = GlobalMemory()
    params = Params(entry)
    params.put(0, gmem.alloc(4), 8)
    with pytest.raises(PtxError, match="out of bounds"):
        Grid(entry, 1, THREADS, params, gmem).run()
