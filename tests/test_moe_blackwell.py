# SPDX-License-Identifier: BSD-3-Clause
"""The MoE ops' Blackwell route (``fp4_ops.sm100.grouped_gemm_for_ops``) without a B200.

W4A4 grouped GEMMs on the sm_100 family copy their rows into the grouped template's tile-padded
layout (each group padded to whole MMA tiles) with one kernel (``moe_kernels.pad_rows``),
launch ``blockwise_grouped_gemm_fp4`` and gather D's rows back. The padding kernel's sm_100a
PTX runs on tests/ptx_emulator.py against the layout by a loop written here (every byte it
writes, and nothing outside its buffers whatever the offsets), and its sm_90a build on the
H200. The grouped kernel is checked by test_blackwell_grouped.py; here it is replaced by an
emulation of its contract, written from that module's docstring (tile t's rows of D = alpha[g]
x A's rows x B[g]^T with g = tile_group[t], tiles at or past num_m_tiles unwritten), so that
the op's rows are checked against reference.py per expert. On the GPU (H200) the same route
runs on CUDA tensors through the template's real launcher and checks, without a host sync, and
replays in a CUDA graph with new routings.
"""

import ctypes
import functools

import pytest
import torch
from conftest import ptx_options
from ptx_emulator import GlobalMemory, Grid, Params, parse_ptx
from test_moe import (
    COUNTS,
    FMTS,
    _assert_within,
    _check_groups,
    _cuda,
    _moe_case,
    _moe_reference,
    _offsets,
    _routing,
    needs_cuda,
)
from test_moe_kernels import _put, _tensor_param

import fp4_ops
import reference
from fp4_ops import moe, moe_kernels, ops
from fp4_ops.moe_kernels import padded_rows
from fp4_ops.sm90 import k_order


def _layout(counts, tile_m):
    """(padded row of every row, group of every tile in use): the contiguous layout by hand."""
    row_map, tile_group, start = [], [], 0
    for group, count in enumerate(counts):
        row_map += range(start, start + count)
        tiles = (count + tile_m - 1) // tile_m
        tile_group += [group] * tiles
        start += tiles * tile_m
    return row_map, tile_group


LAYOUTS = {
    **COUNTS,
    "every-group-one-row": [1] * 9,
    "one-past-a-tile": [129, 0, 1, 256, 127],
    "more-groups-than-rows": [0, 1, 0, 0, 1, 0, 0, 0],
    "last-group-only": [0, 0, 0, 300],
}


@functools.cache
def _pad_entry(tile_m: int, cap: int, rows_per_cta: int):
    """The padding kernel's sm_100a PTX (what a B200 runs), parsed for the emulator."""
    compiled = padded_rows.compile_padded_rows(tile_m, cap, rows_per_cta, ptx_options("sm_100a"))
    (entry,) = parse_ptx(compiled.__ptx__).values()
    return entry


def emulate_pad_rows(
    data, scale, offsets, tile_m, k_scales, stores=None, tiles=None, per_cta=None, races=True
):
    """The padding kernel's PTX run on tests/ptx_emulator.py over ``tiles`` tiles (default
    ``moe_kernels.padded_tiles``), ``per_cta`` rows a CTA (default the host's rule;
    uninitialised bytes poisoned, any access outside a buffer an error, and a race unless
    ``races`` is False): a PaddedRows of CPU tensors; ``stores`` (a dict) gets each output's
    per-byte store counts."""
    (rows, half), groups = data.shape, offsets.shape[0] - 1
    if tiles is None:
        tiles = moe_kernels.padded_tiles(rows, groups, tile_m)
    per_cta = per_cta or moe_kernels.pad_rows_per_cta(2 * half)
    atoms_k, vectors = -(-k_scales // 4), half // 16
    sizes = {
        "codes": tiles * tile_m * half,
        "scale": tiles * tile_m * atoms_k * 4,
        "tile_group": 4 * tiles,
        "num_m_tiles": 4,
        "row_map": 4 * rows,
    }
    gmem = GlobalMemory()
    out = {name: gmem.alloc(n) for name, n in sizes.items()}
    cap = moe_kernels.experts_cap(groups)
    entry = _pad_entry(tile_m, cap, per_cta)
    p = Params(entry)
    _tensor_param(p, 0, _put(gmem, offsets.int()), (groups + 1,))
    _tensor_param(p, 1, _put(gmem, data.view(torch.uint8)), (rows, vectors, 4 * vectors))
    _tensor_param(p, 2, _put(gmem, scale.view(torch.uint8)), (scale.numel() // 4,))
    _tensor_param(p, 3, out["codes"], (tiles * tile_m, vectors, 4 * vectors))
    _tensor_param(p, 4, out["scale"], (sizes["scale"] // 4,))
    _tensor_param(p, 5, out["tile_group"], (tiles,))
    p.put(6, out["num_m_tiles"], 8)
    _tensor_param(p, 7, out["row_map"], (rows,))
    p.put(8, groups, 4)
    p.put(9, atoms_k, 4)
    ctas = tiles * tile_m // per_cta
    smem = 16 + 4 * (cap + 1)
    Grid(entry, ctas, padded_rows.THREADS, p, gmem, smem, global_races=races).run()
    if stores is not None:
        stores.update({name: gmem.store_counts(out[name], n) for name, n in sizes.items()})

    def read(name, dtype):
        return torch.from_numpy(gmem.read(out[name], sizes[name]).copy()).view(dtype)

    codes = read("codes", torch.uint8).view(tiles * tile_m, half)
    tensors = (read("scale", torch.uint8), read("tile_group", torch.int32))
    tensors += (read("num_m_tiles", torch.int32), read("row_map", torch.int32))
    return moe_kernels.PaddedRows(codes, *tensors)


def emulated_function(config, device):
    """``moe_kernels._function``'s stand-in on CPU tensors for the padding kernel: what
    ``pad_rows`` hands the kernel (host pointers, the problem) read from host memory, the PTX
    emulated, the outputs written back to the pointers it was handed."""
    assert isinstance(config, moe_kernels.PaddedRowsConfig) and device.type == "cpu"

    def read(ptr, nbytes, dtype=torch.uint8):
        return torch.frombuffer(bytearray(ctypes.string_at(ptr, nbytes)), dtype=dtype)

    def fn(offsets, data, scale, *outputs_and_problem):
        *outputs, (groups, rows, k, atoms_k, tiles), _stream = outputs_and_problem
        assert config.groups_cap == moe_kernels.experts_cap(groups)
        blocks = -(-rows // 128)
        got = emulate_pad_rows(
            read(data, rows * k // 2).view(rows, k // 2),
            read(scale, blocks * 128 * atoms_k * 4),
            read(offsets, 4 * (groups + 1), torch.int32),
            config.tile_m,
            4 * atoms_k,
            tiles=tiles,
            per_cta=config.rows_per_cta,
        )
        for ptr, t in zip(
            outputs,
            (got.codes, got.scale, got.tile_group, got.num_m_tiles, got.row_map),
            strict=True,
        ):
            ctypes.memmove(ptr, t.contiguous().numpy().ctypes.data, t.numel() * t.element_size())

    return fn, 132


@pytest.fixture
def emulated_padding(monkeypatch):
    """pad_rows on CPU tensors, its kernel emulated (``emulated_function``)."""
    monkeypatch.setattr(moe_kernels, "_function", emulated_function)
    monkeypatch.setattr(moe_kernels, "stream_handle", lambda index: 0)


def _pad_case(counts, vec, k, seed):
    """Random code bytes and scale bytes for rows grouped by ``counts``: (codes, blocked
    scales (reference.to_blocked), the plain scales, offsets)."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(counts)
    data = torch.randint(0, 256, (rows, k // 2), generator=gen, dtype=torch.uint8)
    plain = torch.randint(1, 256, (rows, k // vec), generator=gen, dtype=torch.uint8)
    return data, reference.to_blocked(plain).reshape(-1), plain, _offsets(counts)


def check_padded_layout(got, data, plain, counts, tile_m, stores=None):
    """pad_rows' outputs against the layout by hand (``_layout``): the tiles in use hold each
    group's rows in order, then zero codes and scales (blocked by reference.to_blocked);
    tile_group names each tile's group (the last group past num_m_tiles); ``stores`` given:
    every byte of the tiles in use and of the indices written once, nothing past them."""
    want_rows, want_tiles = _layout(counts, tile_m)
    used = len(want_tiles) * tile_m
    assert got.row_map.tolist() == want_rows
    assert got.num_m_tiles.tolist() == [len(want_tiles)]
    tail = [len(counts) - 1] * (got.tile_group.numel() - len(want_tiles))
    assert got.tile_group.tolist() == want_tiles + tail
    codes = torch.zeros(used, data.shape[1], dtype=torch.uint8)
    scales = torch.zeros(used, plain.shape[1], dtype=torch.uint8)
    codes[want_rows], scales[want_rows] = data, plain
    assert torch.equal(got.codes[:used].cpu(), codes)
    blocked = reference.to_blocked(scales).reshape(-1)
    assert torch.equal(got.scale[: blocked.numel()].cpu(), blocked)
    if stores is not None:
        for name, written in (("codes", codes.numel()), ("scale", blocked.numel())):
            counts_of = stores[name]
            assert (counts_of[:written] == 1).all() and (counts_of[written:] == 0).all(), name
        for name in ("tile_group", "num_m_tiles", "row_map"):
            assert (stores[name] == 1).all(), name


# the layouts above, and groups past one warp's lanes: each lane then sums and walks several
# groups, rows in more than one of them
PAD_LAYOUTS = {
    **LAYOUTS,
    "two-groups-in-one-lane": [1, 1] + [0] * 62,
    "130-groups": [(3 * g) % 4 for g in range(130)],
}


@pytest.mark.parametrize("per_cta", [None, 1, 4], ids=["rule", "1-row", "4-rows"])
@pytest.mark.parametrize("tile_m", [128, 256])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("counts", list(PAD_LAYOUTS.values()), ids=list(PAD_LAYOUTS))
def test_pad_rows_ptx_is_the_padded_layout(counts, fmt, tile_m, per_cta):
    """The kernel's sm_100a PTX, emulated: every layout above at both tile heights, CTAs of
    the host's rule (32 / 16 rows here), 4 rows and 1; K whose scale columns leave the last
    atom part empty (NVFP4 38 of 40, MXFP4 39 of 40) and whose codes and scales take each
    thread more than one turn of its loops at the rule's rows."""
    vec = reference.NVFP4_BLOCK if fmt == "nvfp4" else reference.MXFP4_BLOCK
    k = 608 if vec == 16 else 1248
    data, blocked, plain, offsets = _pad_case(counts, vec, k, seed=len(counts))
    stores = {}
    got = emulate_pad_rows(data, blocked, offsets, tile_m, k // vec, stores, per_cta=per_cta)
    check_padded_layout(got, data, plain, counts, tile_m, stores)


# (offsets that break the op's contract, which its device asserts report: falling, past the
# rows, negative)
BAD_OFFSETS = [[0, 50, 10, 100], [0, 300, 300, 100], [0, -5, 40, 100], [7, 7, 100, 100]]


@pytest.mark.parametrize("offsets", BAD_OFFSETS, ids=str)
def test_pad_rows_ptx_stays_in_its_buffers_whatever_the_offsets(offsets):
    """Every load and store of the emulated kernel lies inside its buffers (the emulator raises
    otherwise), and num_m_tiles stays within the tiles the buffers hold. (Groups that overlap
    store rows twice: races are what such offsets promise, so they are not checked.)"""
    data, blocked, _, _ = _pad_case([100], 16, 64, seed=1)
    bad = torch.tensor(offsets, dtype=torch.int32)
    got = emulate_pad_rows(data, blocked, bad, 128, 4, races=False)
    assert got.tile_group.numel() == moe_kernels.padded_tiles(100, len(offsets) - 1, 128)


def test_pad_rows_hands_its_kernel_the_buffers_it_sizes(monkeypatch):
    """The host side: the buffers (tiles of the bound, int32 indices), the pointers and the
    problem in the kernel's order, and rows refused that the kernel cannot take."""
    launches = []
    monkeypatch.setattr(
        moe_kernels, "_function", lambda c, d: (lambda *a: launches.append((c, a)), 1)
    )
    monkeypatch.setattr(moe_kernels, "stream_handle", lambda index: 7)
    data, blocked, _, offsets = _pad_case([5, 0, 200, 3], 16, 96, seed=2)
    got = moe_kernels.pad_rows(data, blocked.view(torch.float8_e4m3fn), offsets, 128, 6)
    ((config, args),) = launches
    assert config == moe_kernels.PaddedRowsConfig(128, 32, 32)
    tiles = moe_kernels.padded_tiles(208, 4, 128)
    assert got.codes.shape == (tiles * 128, 48) and got.codes.dtype == torch.uint8
    assert got.scale.shape == (tiles * 128 * 8,) and got.scale.dtype == torch.uint8
    for t, n in ((got.tile_group, tiles), (got.num_m_tiles, 1), (got.row_map, 208)):
        assert t.shape == (n,) and t.dtype == torch.int32
    outputs = (got.codes, got.scale, got.tile_group, got.num_m_tiles, got.row_map)
    inputs = (offsets, data, blocked)
    assert args[:8] == tuple(t.data_ptr() for t in (*inputs, *outputs))
    assert args[8:] == ((4, 208, 96, 2, tiles), 7)
    with pytest.raises(ValueError, match="rows of a multiple of 32 codes, got \\(208, 40\\)"):
        moe_kernels.pad_rows(data[:, :40], blocked, offsets, 128, 5)
    with pytest.raises(ValueError, match="blocked scales of 208 rows x 6 columns"):
        moe_kernels.pad_rows(data, blocked[:512], offsets, 128, 6)


def test_pad_rows_runs_its_kernel_on_the_buffers_it_sizes(emulated_padding):
    """pad_rows' host side and its kernel's emulated PTX together give the padded layout."""
    counts = LAYOUTS["one-past-a-tile"]
    data, blocked, plain, offsets = _pad_case(counts, 32, 160, seed=3)
    got = moe_kernels.pad_rows(data, blocked, offsets, 128, 5)
    check_padded_layout(got, data, plain, counts, 128)


def test_pad_rows_per_cta_fills_one_batch_of_loads():
    """The host's rows per CTA: a power of two dividing 32 (a CTA's rows share one lane group
    of a scale atom), the most whose codes fit one unrolled batch of the kernel's threads."""
    batch = padded_rows.THREADS * padded_rows.COPY_UNROLL * 16
    assert moe_kernels.PAD_CTA_BYTES == batch
    for k in (32, 1024, 1056, 2048, 7168, 16384, 2**17):
        rows = moe_kernels.pad_rows_per_cta(k)
        assert 32 % rows == 0 and (rows * k // 2 <= batch or rows == 1), k
        assert rows == 32 or 2 * rows * k // 2 > batch, k


def test_padded_tiles_hold_every_routing():
    """The buffers' tiles, known on the host from the rows and groups alone, hold the tiles of
    any routing of those rows (random ones), and no more than the worst takes: every group
    with rows but one ending one row past a tile."""
    for tile_m in (128, 256):
        for counts in ([tile_m + 1] * 6 + [1], [1] * 40, [0, 1, 0], [tile_m] * 3):
            tiles = moe_kernels.padded_tiles(sum(counts), len(counts), tile_m)
            assert len(_layout(counts, tile_m)[1]) == tiles or counts == [tile_m] * 3, counts
    gen = torch.Generator().manual_seed(3)
    cases = [[129] * 7, [1] * 40, [257, 1, 0, 255]]
    for _ in range(300):
        groups = int(torch.randint(1, 40, (1,), generator=gen))
        cases.append(torch.randint(0, 300, (groups,), generator=gen).tolist())
    for counts in cases:
        for tile_m in (128, 256):
            tiles = moe_kernels.padded_tiles(sum(counts), len(counts), tile_m)
            assert len(_layout(counts, tile_m)[1]) <= tiles, counts


def _values(packed, scales, vec):
    """e2m1 x block scale in float32 (the emulation's own decoding, device-side only: no table
    to copy to the device, which a CUDA-graph capture would refuse)."""
    codes = torch.stack((packed & 15, packed >> 4), -1).flatten(-2)
    exponent, half = ((codes & 7) >> 1).float(), (codes & 1).float()
    # (E2M1: exponent field 0 is subnormal, 0 or 0.5; otherwise 2^(e - 1) x (1 + m / 2))
    magnitude = torch.where(exponent == 0, half * 0.5, torch.exp2(exponent - 1) * (1 + half / 2))
    values = torch.where(codes >= 8, -magnitude, magnitude)
    return (values.unflatten(-1, (-1, vec)) * scales.float()[..., None]).flatten(-2)


def emulated_grouped_kernel(a, b, sfa_blocked, sfb_blocked, alpha, tile_group, num_m_tiles, d, c):
    """The grouped template's contract, on any device without a host sync: its operand rules
    asserted, then D written tile by tile; tiles at or past num_m_tiles get NaN (the kernel
    leaves them as they were: uninitialised)."""
    import blockwise_gemm_fp4 as bw

    tile_m, vec = c.mma_tiler_mn[0], c.sf_vec_size
    (m, half), (groups, n, _) = a.shape, b.shape
    tiles, k_scales = m // tile_m, 2 * half // vec
    assert m % tile_m == 0 and a.dtype == b.dtype == torch.uint8
    assert tile_group.shape == (tiles,) and tile_group.dtype == torch.int32
    assert num_m_tiles.shape == (1,) and num_m_tiles.dtype == torch.int32
    assert alpha.shape == (groups,) and alpha.dtype == torch.float32
    assert d.shape == (m, n) and d.stride() == (bw.c_row_pitch(n, c.c_dtype), 1)
    assert sfa_blocked.dtype == sfb_blocked.dtype == reference.SCALE_DTYPES[vec]
    sfa = reference.from_blocked(sfa_blocked, m, k_scales).view(tiles, tile_m, k_scales)
    sfb = reference.from_blocked(sfb_blocked, n, k_scales)
    g = tile_group.long()
    va = _values(a.view(tiles, tile_m, half), sfa, vec)
    vb = _values(b, sfb, vec).index_select(0, g)
    acc = torch.matmul(va, vb.transpose(1, 2)) * alpha.index_select(0, g)[:, None, None]
    written = torch.arange(tiles, device=a.device)[:, None, None] < num_m_tiles.long()
    d.copy_(torch.where(written, acc, torch.nan).reshape(m, n))
    return d


@pytest.fixture
def blackwell(monkeypatch):
    """The MoE ops routed as on an sm_100 GPU: the Hopper check says no, and ``check_sm90``
    names a B200."""
    monkeypatch.setattr(moe, "runs_hopper_kernels", lambda _: False)
    monkeypatch.setattr(ops, "_capability", lambda _: (10, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA B200")


def _operands(fmt, counts, gen, n=256, k=192):
    b = fp4_ops.quantize_experts(torch.randn(len(counts), n, k, generator=gen), fmt)
    a = fp4_ops.quantize(torch.randn(sum(counts), k, generator=gen) * 3, fmt)
    return a, b


# (N 64 takes tile N 64, whose tiles differ from tile M 128 in both dimensions)
@pytest.mark.parametrize("n", [256, 64, 200])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("counts", list(LAYOUTS.values()), ids=list(LAYOUTS))
@pytest.mark.parametrize("fmt", FMTS)
def test_blackwell_route_gives_each_experts_gemm(
    fmt, counts, out_dtype, n, blackwell, emulated_padding, monkeypatch
):
    """The W4A4 op's CUDA side on CPU tensors, the kernel emulated: every group's rows
    against reference.check_gemm with its expert (derived bound)."""
    import blockwise_grouped_gemm_fp4 as grouped

    monkeypatch.setattr(grouped, "grouped_gemm", emulated_grouped_kernel)
    a, b = _operands(fmt, counts, torch.Generator().manual_seed(4), n=n)
    offsets = _offsets(counts)
    alpha = a.global_scale * b.global_scale
    args = (a.data, a.scale, b.data, b.scale, alpha, offsets, b.sf_vec_size, out_dtype)
    d = moe.gpu_grouped_w4a4(*args, False)
    assert d.shape == (sum(counts), n) and d.dtype == out_dtype and d.is_contiguous()
    _check_groups(d, None, b, offsets, w4a4_a=a)


def test_blackwell_moe_kernel_path_hands_the_grouped_op_fp4_rows(blackwell, monkeypatch):
    """fp4_moe's kernel path on the sm_100 family quantizes its rows and calls the W4A4
    grouped op (which goes to the Blackwell kernel), not Hopper's exact-BF16 route."""
    calls = []
    done = torch.zeros(5, 64)
    monkeypatch.setattr(moe, "grouped_w4a4_impl", lambda *args: calls.append(args) or done)
    gen = torch.Generator().manual_seed(8)
    w = fp4_ops.quantize_experts(torch.randn(3, 64, 96, generator=gen), "nvfp4")
    rows = torch.randn(5, 96, generator=gen).bfloat16()
    offsets, gs = _offsets([2, 0, 3]), w.global_scale.float()
    d = moe._expert_gemm(rows, w, gs, offsets, "dynamic", None, kernels=True)
    assert torch.equal(d, done)
    (args,) = calls
    q = fp4_ops.quantize(rows, "nvfp4")
    assert torch.equal(args[0], q.data) and torch.equal(args[1], q.scale)
    assert torch.equal(args[2], w.data) and torch.equal(args[4], q.global_scale * gs)
    assert torch.equal(args[5], offsets) and args[6:] == (16, torch.bfloat16, False)


def test_blackwell_refuses_what_it_has_no_kernel_for(blackwell):
    """W4A16 (no Blackwell kernel) and experts prepacked for Hopper are refused with what to do
    instead, by the grouped ops and by the MoE layer's kernel path."""
    a, b = _operands("nvfp4", [3, 2], torch.Generator().manual_seed(5))
    offsets, alpha = _offsets([3, 2]), b.global_scale.float()
    prepacked = k_order.prepack_weights(b.data)
    w4a16 = "W4A16 fp4_grouped_gemm.*B200 is sm_100: quantize the activations too"
    with pytest.raises(ValueError, match=w4a16):
        rows = torch.randn(5, 192).bfloat16()
        moe.gpu_grouped_w4a16(rows, b.data, b.scale, alpha, offsets, 16, torch.bfloat16, False)
    with pytest.raises(ValueError, match="experts prepacked for the Hopper kernel reached"):
        args = (a.data, a.scale, prepacked, b.scale, alpha, offsets, 16, torch.bfloat16)
        moe.gpu_grouped_w4a4(*args, True)
    x, w13, w2, _, _, gen = _moe_case("nvfp4", "silu", dtype=torch.bfloat16)
    ids, tw = _routing("random", x.shape[0], 2, 4, gen)
    gs13, gs2 = (w.global_scale.float().expand(4) for w in (w13, w2))
    weights = (w13, w2, gs13, gs2)
    with pytest.raises(ValueError, match="B200 is sm_100: quantize the activations too \\(act"):
        moe._moe_kernels(x, *weights, (None, None), tw, ids, "silu", "bf16", None, None)
    packed = (k_order.prepack_weights(w13.data), k_order.prepack_weights(w2.data))
    with pytest.raises(ValueError, match='layer.expert_weights\\("w13"\\)'):
        moe._moe_kernels(x, *weights, packed, tw, ids, "silu", "dynamic", None, None)


# ----------------------------------------------------------------------------- FP4MoE


def _layer_pair(activations="dynamic", seed=9):
    """(the layer's experts as FP4Tensors, an FP4MoE of them) on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    w13 = fp4_ops.quantize_experts(torch.randn(4, 64, 64, generator=gen), "nvfp4")
    w2 = fp4_ops.quantize_experts(torch.randn(4, 64, 32, generator=gen), "nvfp4")
    return (w13, w2), fp4_ops.FP4MoE(w13, w2, activations=activations)


def _same_codes(a, b) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_fp4moe_holds_plain_codes_where_the_blackwell_kernel_reads_them(monkeypatch):
    """A W4A4 FP4MoE where the sm_100 family's kernels run holds its codes in plain K order
    (what the Blackwell grouped kernel reads) and gives the Hopper-ordered layer's outputs and
    state dict; a move elsewhere prepacks them again, bit for bit. W4A16 layers keep the
    Hopper order (no Blackwell W4A16 kernel)."""
    (w13, w2), hopper = _layer_pair()
    monkeypatch.setattr(moe, "runs_blackwell_kernels", lambda _: True)
    _, blackwell = _layer_pair()
    assert blackwell.plain_k_order and not hopper.plain_k_order
    assert _same_codes(blackwell.w13_codes, w13.data) and _same_codes(blackwell.w2_codes, w2.data)
    x, gen = torch.randn(5, 64).bfloat16(), torch.Generator().manual_seed(1)
    ids, tw = _routing("random", 5, 2, 4, gen)
    assert torch.equal(blackwell(x, tw, ids), hopper(x, tw, ids))
    mine, theirs = blackwell.state_dict(), hopper.state_dict()
    assert mine.keys() == theirs.keys()
    assert mine.pop("_extra_state") == theirs.pop("_extra_state")
    assert all(_same_codes(mine[k], theirs[k]) for k in mine)
    for name in ("w13", "w2"):
        assert _same_codes(blackwell.expert_weights(name).data, hopper.expert_weights(name).data)
    monkeypatch.setattr(moe, "runs_blackwell_kernels", lambda _: False)
    blackwell.float()  # (every move and cast passes through _apply)
    assert not blackwell.plain_k_order
    assert _same_codes(blackwell.w13_codes, hopper.w13_codes)
    assert _same_codes(blackwell.w2_codes, hopper.w2_codes)
    monkeypatch.setattr(moe, "runs_blackwell_kernels", lambda _: True)
    assert not _layer_pair("bf16")[1].plain_k_order


def test_runs_blackwell_kernels_is_the_sm_100_family(monkeypatch):
    """sm_100 (B200 / GB200) and sm_103 (B300) take the Blackwell route; Hopper, consumer
    Blackwell (sm_120) and older GPUs do not, and a CPU tensor asks no GPU."""
    from types import SimpleNamespace

    cuda_tensor = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    for capability, want in (((10, 0), True), ((10, 3), True), ((9, 0), False), ((12, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _, c=capability: c)
        assert ops.runs_blackwell_kernels(cuda_tensor) is want, capability
    assert not ops.runs_blackwell_kernels(torch.zeros(1))


def test_fp4moe_settles_its_order_where_it_lands(monkeypatch):
    """The order follows where the codes are after a move, and after a load that assigns
    tensors from elsewhere: "meta" stands in for an sm_100 GPU."""
    monkeypatch.setattr(moe, "runs_blackwell_kernels", lambda t: t.is_meta)
    (w13, _), layer = _layer_pair()
    assert not layer.plain_k_order
    assert layer.to("meta").plain_k_order and layer.w13_codes.is_meta
    assert not layer.to_empty(device="cpu").plain_k_order
    _, fresh = _layer_pair(seed=12)
    state = fresh.state_dict()
    layer.load_state_dict(
        {k: v.to("meta") if torch.is_tensor(v) else v for k, v in state.items()}, assign=True
    )
    assert layer.plain_k_order and layer.w2_codes.is_meta


@pytest.mark.parametrize("assign", [False, True])
def test_fp4moe_state_dict_loads_in_the_layers_k_order(assign, monkeypatch):
    """A state dict (plain codes) loaded into a layer holding plain codes, and into one
    holding prepacked codes, gives each its own order: both then compute what the layer that
    saved it computes."""
    _, source = _layer_pair(seed=10)
    state = source.state_dict()
    x, gen = torch.randn(3, 64).bfloat16(), torch.Generator().manual_seed(2)
    ids, tw = _routing("random", 3, 2, 4, gen)
    want = source(x, tw, ids)
    for plain in (True, False):
        monkeypatch.setattr(moe, "runs_blackwell_kernels", lambda _, plain=plain: plain)
        _, layer = _layer_pair(seed=11)
        layer.load_state_dict(state, assign=assign)
        assert layer.plain_k_order == plain
        order = torch.Tensor.view if plain else (lambda t, _: k_order.prepack_weights(t))
        assert _same_codes(layer.w2_codes, order(state["w2_data"], torch.uint8))
        assert torch.equal(layer(x, tw, ids), want), plain


# ----------------------------------------------------------------------------- on a GPU


@pytest.fixture
def blackwell_launcher(blackwell, monkeypatch):
    """The template's real ``grouped_gemm`` (its operand checks and configuration rules), with
    the GPU check passed and the compiled kernel replaced by the emulation."""
    import blockwise_gemm_fp4 as bw
    import blockwise_grouped_gemm_fp4 as grouped

    launches = []

    def kernel(**operands):
        launches.append(operands["config"])
        emulated_grouped_kernel(*operands["tensors"], operands["config"])

    monkeypatch.setattr(bw, "blackwell_gpu", lambda *_: (True, "NVIDIA B200"))
    monkeypatch.setattr(grouped, "_compiled_kernel", lambda config, device: kernel)
    monkeypatch.setattr(
        grouped,
        "kernel_args",
        lambda config, mnkg, t, stream: dict(config=config, tensors=(*t[:4], t[7], *t[5:7], t[4])),
    )
    return launches


def _decode_counts(groups: int, rows: int, seed: int) -> list[int]:
    """``rows`` rows in distinct random groups of ``groups`` (one token's top-k)."""
    gen = torch.Generator().manual_seed(seed)
    counts = [0] * groups
    for g in torch.randperm(groups, generator=gen)[:rows].tolist():
        counts[g] = 1
    return counts


def _prefill_counts(groups: int, rows: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.bincount(
        torch.randint(0, groups, (rows,), generator=gen), minlength=groups
    ).tolist()


# (counts, tile_m, format, K): one token's top-8 of 128 experts; prefill-sized routings over 64
# and 257 groups (past the 256 count slots of a warp's lanes); one group only
GPU_PADDINGS = {
    "decode-top8-of-128": (_decode_counts(128, 8, 1), 128, "nvfp4", 7168),
    "prefill-64": (_prefill_counts(64, 3000, 2), 128, "mxfp4", 2048),
    "prefill-257-tile256": (_prefill_counts(257, 2000, 3), 256, "nvfp4", 1024),
    "one-group": ([0, 700, 0], 128, "mxfp4", 96),
}


@needs_cuda
@pytest.mark.parametrize("case", list(GPU_PADDINGS))
def test_gpu_pad_rows_is_the_padded_layout(case):
    """The padding kernel compiled for this GPU, on real sizes, against the layout by hand."""
    counts, tile_m, fmt, k = GPU_PADDINGS[case]
    vec = reference.NVFP4_BLOCK if fmt == "nvfp4" else reference.MXFP4_BLOCK
    data, blocked, plain, offsets = _pad_case(counts, vec, k, seed=k)
    got = moe_kernels.pad_rows(data.cuda(), blocked.cuda(), offsets.cuda(), tile_m, k // vec)
    check_padded_layout(got, data, plain, counts, tile_m)


@needs_cuda
@pytest.mark.parametrize("fmt", FMTS)
def test_blackwell_route_gpu_runs_without_host_sync(fmt, blackwell_launcher):
    """fp4_grouped_gemm on CUDA tensors down the Blackwell route: the layout, the copies and the
    gather run on the device (the sync debug mode turns a host sync into an error), and every
    group matches its expert's reference GEMM."""
    counts = LAYOUTS["one-past-a-tile"]
    a, b = _operands(fmt, counts, torch.Generator().manual_seed(6))
    offsets = _offsets(counts)
    ac, bc, oc = _cuda(a), _cuda(b), offsets.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        d = fp4_ops.fp4_grouped_gemm(ac, bc, oc, out_dtype=torch.float32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [c.mma_tiler_mn[0] for c in blackwell_launcher] == [128]
    _check_groups(d.cpu(), None, b, offsets, w4a4_a=a)


@needs_cuda
def test_blackwell_route_gpu_cuda_graph_replays_new_routing(blackwell_launcher):
    a, b = _operands("nvfp4", [4, 0, 3, 5], torch.Generator().manual_seed(7))
    ac, bc, offsets = _cuda(a), _cuda(b), _offsets([4, 0, 3, 5]).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp4_ops.fp4_grouped_gemm(ac, bc, offsets)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        d = fp4_ops.fp4_grouped_gemm(ac, bc, offsets)
    for counts in ([12, 0, 0, 0], [0, 0, 0, 12], [1, 2, 9, 0]):
        offsets.copy_(_offsets(counts))
        graph.replay()
        torch.cuda.synchronize()
        _check_groups(d.cpu(), None, b, _offsets(counts), w4a4_a=a)


@needs_cuda
@pytest.mark.parametrize("fmt", FMTS)
def test_fp4_moe_w4a4_gpu_blackwell_route_is_the_per_expert_loop(fmt, blackwell_launcher):
    """fp4_moe's kernel path (routing, activation and combine kernels, the quantizer) with its
    grouped GEMMs down the Blackwell route, against the per-expert oracle."""
    x, w13, w2, b13, b2, gen = _moe_case(fmt, "silu", dtype=torch.float32, bias=True)
    ids, tw = _routing("random", x.shape[0], 3, 4, gen)
    args = (_cuda(w13), _cuda(w2), tw.cuda(), ids.cuda())
    biases = dict(w13_bias=b13.cuda(), w2_bias=b2.cuda())
    out = fp4_ops.fp4_moe(x.cuda(), *args, **biases, activations="dynamic")
    assert len(blackwell_launcher) == 2
    ref, bound = _moe_reference(x, w13, w2, tw, ids, "silu", b13, b2, w4a4=True)
    _assert_within(out.cpu(), ref, bound, f"GPU W4A4 {fmt}, Blackwell route")


@needs_cuda
def test_fp4moe_w4a4_gpu_blackwell_route_is_the_per_expert_loop(blackwell_launcher, monkeypatch):
    """An FP4MoE moved to the GPU reorders its codes for the Blackwell route there, and its
    forward (the kernel path, grouped GEMMs emulated) is the per-expert oracle."""
    monkeypatch.setattr(moe, "runs_blackwell_kernels", lambda t: t.is_cuda)
    x, w13, w2, b13, b2, gen = _moe_case("nvfp4", "silu", dtype=torch.float32, bias=True)
    ids, tw = _routing("random", x.shape[0], 3, 4, gen)
    layer = fp4_ops.FP4MoE(w13, w2, "silu", "dynamic", b13, b2)
    assert not layer.plain_k_order
    layer = layer.cuda()
    assert layer.plain_k_order and _same_codes(layer.w13_codes.cpu(), w13.data)
    out = layer(x.cuda(), tw.cuda(), ids.cuda())
    assert len(blackwell_launcher) == 2
    ref, bound = _moe_reference(x, w13, w2, tw, ids, "silu", b13, b2, w4a4=True)
    _assert_within(out.cpu(), ref, bound, "FP4MoE W4A4, Blackwell route")
