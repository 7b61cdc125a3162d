# SPDX-License-Identifier: BSD-3-Clause
"""fp4_ops.quantizer: cross-compiled on the CPU for sm_90a and the sm_100 family (PTX checks); on a
GPU bit-exact against reference.py (codes, scale bytes, padding, global scale) on ragged shapes,
zeros, denormals, saturating values and ties, and the documented NaN / Inf behaviour."""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest
import torch
from conftest import exported_tvm_ffi_function

import reference
from fp4_ops import quantizer as quantize_fp4
from fp4_ops.layout import MXFP4_BF16_SHIFT

# (in_dtype, sf_vec_size, dynamic)
# (in_dtype, sf_vec_size, dynamic, local_amax)
CONFIGS = [
    ("BFloat16", 16, True, False),
    ("Float16", 16, False, False),
    ("Float32", 32, False, False),
    ("BFloat16", 16, True, True),
]
CONFIG_IDS = ["bf16-nvfp4-dynamic", "f16-nvfp4-static", "f32-mxfp4", "bf16-nvfp4-local"]


def _ptx(arch: str, config, tmp_path) -> str:
    in_dtype, vec, dynamic, local = config
    quantize_fp4.compile_quantizer(
        in_dtype,
        vec,
        dynamic,
        options=f"--gpu-arch {arch} --keep-ptx --dump-dir={tmp_path}",
        local_amax=local,
    )
    (path,) = glob.glob(os.path.join(tmp_path, "*.ptx"))
    with open(path) as f:
        return f.read()


@pytest.mark.parametrize(
    "arch, config",
    [("sm_90a", c) for c in CONFIGS]
    + [("sm_100a", c) for c in CONFIGS]
    + [("sm_100f", CONFIGS[0])],
    ids=[f"sm_90a-{i}" for i in CONFIG_IDS] + [f"sm_100a-{i}" for i in CONFIG_IDS] + ["sm_100f"],
)
def test_cross_compiles_to_portable_exact_code(arch, config, tmp_path):
    ptx = _ptx(arch, config, tmp_path)
    assert f".target {arch}" in ptx
    # 16-byte vector loads of x; no tensor-core or architecture-specific instructions
    assert "ld.global.v4" in ptx
    for absent in ("wgmma", "tcgen05", "cvt.rn.satfinite.e2m1x2"):
        assert absent not in ptx, absent
    # exact arithmetic: IEEE divisions, no flush-to-zero, no approximate division
    assert ".ftz" not in ptx and "div.approx" not in ptx and "div.full" not in ptx
    _, vec, dynamic, local = config
    if vec == 16:  # the block scale's divisions, Markstein's correction of |x| * rcp
        assert "div.rn.f32" in ptx and "rcp.rn.f32" in ptx and "fma.rn.f32" in ptx
    # dynamic: the quantize grid waits for the amax grid's maxima, no atomics, no memset;
    # local: one grid, which depends on no other
    grid = dynamic and not local
    assert ("griddepcontrol.wait" in ptx) == grid
    assert ("griddepcontrol.launch_dependents" in ptx) == grid
    assert "atom." not in ptx
    assert ptx.count(".entry") == (2 if grid else 1)


@pytest.mark.parametrize("in_dtype", sorted(quantize_fp4.IN_DTYPES))
@pytest.mark.parametrize(
    "vec, dynamic, local, tokens, exact",
    [(16, False, False, False, False), (16, True, False, False, False)]
    + [(16, True, True, False, False), (32, False, False, False, False)]
    + [(16, True, False, True, False), (16, False, False, True, False)]
    + [(32, False, False, True, False), (16, True, False, False, True)]
    + [(16, True, True, False, True), (32, False, False, False, True)],
)
def test_persistent_grid_is_resident(in_dtype, vec, dynamic, local, tokens, exact, tmp_path):
    """The quantize grid is sized to ``ctas_per_sm`` CTAs per SM and walks the work in as many
    rounds: a CTA that did not fit would leave its share to a second wave (the tokens and
    exact-rows modes too)."""
    import blockwise_gemm_fp4 as bw

    if bw.find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    options = f"--gpu-arch sm_90a --keep-cubin --dump-dir={tmp_path}"
    quantize_fp4.compile_quantizer(in_dtype, vec, dynamic, options, local, tokens, exact)
    (cubin,) = glob.glob(os.path.join(tmp_path, "*.cubin"))
    text = subprocess.run(
        [bw.find_cuobjdump(), "-res-usage", cubin], capture_output=True, text=True, check=True
    ).stdout
    # the quantize kernel's line (a dynamic cubin also holds the amax kernel)
    usage = re.search(
        r"Function kernel_cutlass_kernel_\S+\s+REG:(\d+) STACK:\d+ SHARED:\d+ LOCAL:(\d+)", text
    )
    assert usage is not None, text
    ctas = quantize_fp4.ctas_per_sm(vec, in_dtype, tokens or exact)
    assert usage[2] == "0"
    # NOTE: an SM has 64K registers, allocated per warp in units of 8 per thread
    regs = -(-int(usage[1]) // 8) * 8
    assert ctas * quantize_fp4.THREADS * regs <= 65536, usage[0]


@pytest.mark.parametrize(
    "args, why",
    [
        (["--shape", "4,48"], "K % 32 == 0"),
        (["--shape=-16,8192"], "extents must be >= 1, got (-16, 8192)"),
        (["--shape", "0,4,64"], "extents must be >= 1, got (0, 4, 64)"),
        (["--shape", "65536,32768"], "elements"),  # 2^31 elements
        (["--shape", "524272,1,1024"], "padded scale bytes"),  # 2^29 elements, rows padded 128x
        (["--global_scale", "0"], "finite value > 0"),
        (["--global_scale", "nan"], "finite value > 0"),
        (["--global_scale", "inf"], "finite value > 0"),
        (["--global_scale", "1e39"], "finite value > 0 in float32"),
        (["--global_scale", "1e-50"], "finite value > 0 in float32"),
        (["--format", "mxfp4", "--global_scale", "0.5"], "NVFP4 only"),
        (["--gpu_arch", "garbage"], "invalid choice: 'garbage'"),
        (["--gpu_arch", "sm_80"], "invalid choice: 'sm_80'"),
        (["--shape", "a,b"], "--shape a,b: integers, e.g. 16,8192"),
        (["--shape", "16.5,8192"], "--shape 16.5,8192: integers, e.g. 16,8192"),
        (["--benchmark"], "--benchmark runs the kernel: not with --compile_only"),
    ],
    ids=[
        "k-48",
        "rows-negative",
        "batch-zero",
        "elements",
        "padded-scales",
        "gs-0",
        "gs-nan",
        "gs-inf",
        "gs-f32-overflow",
        "gs-f32-zero",
        "mxfp4-gs",
        "arch",
        "sm80",
        "shape-not-integers",
        "shape-fraction",
        "benchmark-compile-only",
    ],
)
def test_cli_refuses_bad_input(args, why, capsys):
    """Exit 2 with the reason before anything compiles or runs (the 32-bit offset limits: also
    ``quantize_cuda``'s ValueError, through the same ``shape_reason``)."""
    try:
        code = quantize_fp4.main([*args, "--compile_only"])
    except SystemExit as exit_:  # (argparse's own refusals)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_cli_refuses_a_gpu_arch_without_compile_only(capsys):
    """``--gpu_arch`` names what ``--compile_only`` compiles for; a run compiles for the GPU it
    runs on, so the option alone would be ignored: exit 2 naming it."""
    assert quantize_fp4.main(["--gpu_arch", "sm_100a"]) == 2
    err = capsys.readouterr().err
    assert "--gpu_arch is --compile_only's target" in err and "Traceback" not in err


@pytest.mark.parametrize("arch", quantize_fp4.GPU_ARCHS)
def test_cli_compile_only_compiles_for_the_arch_it_names(arch, capsys, monkeypatch):
    """``--compile_only --gpu_arch A`` compiles for A (the options the compiler gets) and says
    so; nothing else claims an architecture."""
    options = []
    monkeypatch.setattr(quantize_fp4, "compile_quantizer", lambda *a: options.append(a[3]))
    code = quantize_fp4.main(["--shape", "16,256", "--compile_only", "--gpu_arch", arch])
    assert code == 0 and options == [f"--gpu-arch {arch}"]
    assert capsys.readouterr().out.endswith(f"compiled for {arch}\n")


def test_shape_reason_bounds_the_kernels_thread_space():
    """The quantize grid walks l x rows_pad x pairs of padded scale columns threads with 32-bit
    indices: just below each limit passes, at it fails."""
    assert quantize_fp4.shape_reason((2**31 // 1024 - 1, 1024), 16) == ""
    assert "elements" in quantize_fp4.shape_reason((2**31 // 1024, 1024), 16)
    # 2^31 padded scale bytes: each batch's 2 rows padded to 128, 64 NVFP4 scale columns each
    assert quantize_fp4.shape_reason((2**31 // (128 * 64) - 1, 2, 1024), 16) == ""
    assert "padded scale bytes" in quantize_fp4.shape_reason((2**31 // (128 * 64), 2, 1024), 16)


# ----------------------------------------------------------------------------- on the GPU

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90 or the sm_100 family)"
)
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def quantizer_inputs(kind: str, shape, dtype, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    k = shape[-1]
    if kind == "wide":  # one power of two per 16 elements, 2^-20 .. 2^20 (2^-8 .. 2^8 in F16)
        span = 8 if dtype == torch.float16 else 20
        exps = torch.randint(-span, span + 1, (*shape[:-1], k // 16, 1), generator=gen).float()
        x = (x.unflatten(-1, (-1, 16)) * torch.exp2(exps)).flatten(-2)
    elif kind == "zeros":  # whole zero blocks, zero rows, signed zeros
        x[..., ::3, :] = 0.0
        x[..., 1::3, :32] = -0.0
    elif kind == "denormal":  # subnormals of the input dtype, and fp32 subnormals
        tiny = torch.finfo(dtype).tiny
        x = x * tiny * 0.25
    elif kind == "ties":  # e2m1 midpoints (and grid points) times power-of-two scales
        grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 3.0, 4.0])
        idx = torch.randint(0, len(grid), shape, generator=gen)
        sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
        x = grid[idx] * sign * 2.0 ** torch.randint(-3, 4, (*shape[:-1], 1), generator=gen)
    return x.to(dtype)


def _check(x: torch.Tensor, vec: int, global_scale=None) -> None:
    gs_dev = None if global_scale is None else torch.tensor(global_scale, device="cuda")
    q, sf, gs = quantize_fp4.quantize_cuda(x.cuda(), vec, gs_dev)
    xc = x.cpu()
    if vec == 16:
        rq, rsf, rgs = reference.quantize_nvfp4(xc, global_scale)
    else:
        (rq, rsf), rgs = reference.quantize_mxfp4(xc), torch.tensor(1.0)
    blocked = reference.to_blocked(rsf).view(torch.uint8)
    got_sf = sf.cpu().view(torch.uint8)
    assert torch.equal(got_sf, blocked), f"{int((got_sf != blocked).sum())} scale bytes differ"
    got_q = q.cpu()
    assert torch.equal(got_q, rq), f"{int((got_q != rq).sum())} code bytes differ"
    assert gs.item() == float(rgs)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 32), (127, 96), (129, 160), (2, 200, 64), (300, 1056)])
@pytest.mark.parametrize("mode", ["nvfp4-dynamic", "nvfp4-static", "mxfp4"])
def test_bit_exact_on_ragged_shapes(dtype, shape, mode):
    x = quantizer_inputs("normal", shape, dtype)
    vec = 32 if mode == "mxfp4" else 16
    _check(x, vec, 0.0013 if mode == "nvfp4-static" else None)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["wide", "zeros", "denormal", "ties"])
@pytest.mark.parametrize("mode", ["nvfp4-dynamic", "nvfp4-static", "mxfp4"])
def test_bit_exact_on_special_values(dtype, kind, mode):
    x = quantizer_inputs(kind, (130, 256), dtype, seed=1)
    vec = 32 if mode == "mxfp4" else 16
    static = None
    if mode == "nvfp4-static":
        # a static scale that fits x, so that the E4M3 scales use their range
        amax = float(x.float().abs().amax())
        static = amax / 2688.0 if amax > 0 else 1.0
    _check(x, vec, static)


def exact_rows_reference(x: torch.Tensor, vec: int) -> tuple[torch.Tensor, float]:
    """(BF16 bits of reference.py's e2m1 x block scale (MXFP4 x MXFP4_BF16_SHIFT) for x [rows,
    K], computed in float64, and its global scale): what ``quantize_exact_rows`` writes."""
    if vec == 16:
        codes, sf, gs = reference.quantize_nvfp4(x.unsqueeze(0))
        shift = 1.0
    else:
        (codes, sf), gs = reference.quantize_mxfp4(x.unsqueeze(0)), torch.tensor(1.0)
        shift = MXFP4_BF16_SHIFT
    e2m1 = reference.e2m1_to_fp32(reference.unpack_fp4(codes[0])).double()
    values = e2m1 * sf[0].double().repeat_interleave(vec, dim=1) * shift
    return values.to(torch.bfloat16).view(torch.int16), float(gs)


# (rows, K, dtype): one token (the dynamic scale's one-grid kernel), a top-8 token's rows past
# LOCAL_AMAX_BYTES (the amax grid first), prefill-sized rows, a ragged MXFP4 block count
EXACT_SHAPES = [(1, 5120, torch.bfloat16), (8, 7168, torch.bfloat16)]
EXACT_SHAPES += [(3000, 2048, torch.float32), (37, 160, torch.float16)]


@needs_gpu
@pytest.mark.parametrize("kind", ["wide", "zeros", "denormal"])
@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
@pytest.mark.parametrize("shape", EXACT_SHAPES, ids=str)
def test_gpu_exact_rows_are_the_quantized_values(shape, vec, kind):
    """``quantize_exact_rows``: the exact BF16 values of reference.py's quantization, bit for
    bit, and the scalar that turns them into the quantized values (the global scale; MXFP4 1 /
    the shift)."""
    rows, k, dtype = shape
    x = quantizer_inputs(kind, (rows, k), dtype, seed=k)
    values, scale = quantize_fp4.quantize_exact_rows(x.cuda(), vec)
    want, want_gs = exact_rows_reference(x, vec)
    assert values.dtype == torch.bfloat16 and values.shape == (rows, k)
    got = values.cpu().view(torch.int16)
    assert torch.equal(got, want), f"{int((got != want).sum())} values differ"
    assert scale.item() == (want_gs if vec == 16 else 1 / MXFP4_BF16_SHIFT)


@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
@pytest.mark.parametrize("rows", [2, 72], ids=["one-grid", "amax-grid"])
def test_exact_rows_hand_the_kernel_its_buffers(vec, rows, monkeypatch):
    """The host side of ``quantize_exact_rows`` (CPU tensors, the kernel recorded): the
    exact-rows configuration (NVFP4: dynamic, one grid for x of LOCAL_AMAX_BYTES at most), a
    new BF16 [rows, K] for the values, a new scalar for the global scale that NVFP4 returns
    and MXFP4 does not (it returns 1 / the shift), the amax grid's partials past the limit."""
    launches, configs = [], []

    def kernel(in_dtype, vec_, dynamic, index, local=False, exact=False):
        configs.append((in_dtype, vec_, dynamic, local, exact))
        return (lambda *args: launches.append(args)), 132

    monkeypatch.setattr(quantize_fp4, "_kernel", kernel)
    monkeypatch.setattr(quantize_fp4, "stream_handle", lambda index: 7)
    partials = torch.zeros(quantize_fp4.MAX_PARTIALS, dtype=torch.int32)
    monkeypatch.setattr(quantize_fp4, "_partials", lambda device, stream: partials)
    x = torch.zeros(rows, 1024, dtype=torch.bfloat16)  # (2 KB a row: the limit is 16 rows)
    values, scale = quantize_fp4.quantize_exact_rows(x, vec)
    local = vec == 16 and x.numel() * 2 <= quantize_fp4.LOCAL_AMAX_BYTES
    assert configs == [(torch.bfloat16, vec, vec == 16, local, True)]
    (args,) = launches
    assert values.shape == x.shape and values.dtype == torch.bfloat16
    assert args[0] == x.data_ptr() and args[1] == args[2] == values.data_ptr()
    assert args[3] == args[4] and args[6:] == ((x.shape[0], 1024, 1), 132, 7)
    if vec == 16:
        assert args[3] == scale.data_ptr() and scale.shape == ()
        assert args[5] == (scale.data_ptr() if local else partials.data_ptr())
    else:
        assert float(scale) == 1 / MXFP4_BF16_SHIFT and args[3] != scale.data_ptr()


@pytest.mark.parametrize("exact", [False, True], ids=["codes", "exact-rows"])
def test_exact_rows_release_the_gemm_behind_and_wait_on_the_grid_ahead(exact, tmp_path):
    """The exact-rows grid lets the grouped GEMM behind it launch at once (PDL) and waits on
    the grid ahead, as the tokens mode does; a local-amax codes grid depends on no grid."""
    options = f"--gpu-arch sm_90a --keep-ptx --dump-dir={tmp_path}"
    quantize_fp4.compile_quantizer("BFloat16", 16, True, options, True, False, exact)
    (path,) = glob.glob(os.path.join(tmp_path, "*.ptx"))
    with open(path) as f:
        ptx = f.read()
    assert ("griddepcontrol.launch_dependents" in ptx) == exact
    assert ("griddepcontrol.wait" in ptx) == exact


def _every_scale_byte(vec: int) -> torch.Tensor:
    """float32 rows of K = 256 whose blocks' scales (reference.py's) take every value a
    dynamic quantization reaches: NVFP4 every positive E4M3 byte (block amax = its value x
    the largest amax / 448), MXFP4 every E8M0 byte from 2^-127 to 2^126 (amax 6 x 2^(b -
    127), the last below 2^128); the other elements random below the block's amax."""
    gen = torch.Generator().manual_seed(vec)
    if vec == 16:
        amax = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        amax = torch.cat([amax, torch.tensor([448.0])]) * 2.0**-4
    else:
        # (6 x 2^126 is past float32's range: byte 253 from an amax just below 2^128)
        amax = (6 * torch.exp2(torch.arange(0, 254, dtype=torch.float64) - 127)).clamp(
            max=1.7 * 2.0**127
        )
    blocks = amax.numel()
    x = torch.rand(blocks, vec, generator=gen, dtype=torch.float64) * amax[:, None]
    x[:, 0] = amax * torch.where(torch.arange(blocks) % 2 == 0, 1.0, -1.0)
    rows = -(-blocks * vec // 256)
    padded = torch.zeros(rows * 256 // vec, vec, dtype=torch.float64)
    padded[:blocks] = x
    return padded.reshape(rows, 256).float()


@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
def test_every_scale_byte_is_reached(vec):
    """The rows of ``_every_scale_byte`` do reach every scale byte they aim at (the exact-rows
    tests below rely on it)."""
    x = _every_scale_byte(vec)
    if vec == 16:
        _, sf, _ = reference.quantize_nvfp4(x)
        want = set(range(1, 127))
    else:
        _, sf = reference.quantize_mxfp4(x)
        want = set(range(0, 254))
    assert want <= set(sf.view(torch.uint8).flatten().tolist())


def _next_to_ties(global_scale, lo: int, hi: int, seed: int) -> torch.Tensor:
    """F32 [256, 256]: element 0 of each 16-block sets its amax (2^lo .. 2^(hi + 1)); the others
    lie 0..3 ulps either side of an E2M1 tie (or grid point) times the block's divisor, so that
    every quotient needs the correctly rounded division (blocks whose scale is 0 stay zero)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (256, 256 // 16, 16)
    amax = torch.exp2(torch.randint(lo, hi + 1, shape[:2], generator=gen).float())
    amax = amax * (1 + torch.rand(shape[:2], generator=gen))
    x = torch.zeros(shape)
    x[..., 0] = amax
    _, scales, gs = reference.quantize_nvfp4(x.flatten(-2), global_scale)
    divisor = scales.float() * gs
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.5, 3.0])
    t = ties[torch.randint(0, len(ties), (*shape[:2], 15), generator=gen)]
    near = (t * divisor.unsqueeze(-1)).view(torch.int32)
    near = near + torch.randint(-3, 4, near.shape, generator=gen, dtype=torch.int32)
    sign = torch.randint(0, 2, near.shape, generator=gen, dtype=torch.int32) << 31
    live = (divisor > 0).unsqueeze(-1)
    x[..., 1:] = torch.where(live, (near | sign).view(torch.float32), 0.0)
    return x.flatten(-2)


@needs_gpu
@pytest.mark.parametrize(
    "global_scale, lo, hi",
    [(None, -8, 9), (2.0**-7, -10, 10), (2.0**-112, -112, -100), (2.0**100, 95, 110)],
    ids=["dynamic", "static", "divisors-below-2^-100", "divisors-above-2^100"],
)
def test_bit_exact_next_to_ties(global_scale, lo, hi):
    # normal and subnormal E4M3 scales, clamped ones, and divisors outside Markstein's range
    _check(_next_to_ties(global_scale, lo, hi, seed=6), 16, global_scale)


@needs_gpu
def test_dynamic_global_scale_of_a_tiny_tensor():
    """F32 x whose amax / 2688 underflows to 0: the global scale is 1.0, as the reference (and
    an all-zero x) gives it, so scales and codes are zero, not NaN."""
    x = torch.full((2, 64), 2.0**-149)
    x[0, 3] = -(2.0**-140)
    _check(x, 16, None)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_exact_saturating(dtype):
    # a static global scale 1000x too small: block scales clamp at 448 and codes saturate at 6
    x = quantizer_inputs("normal", (64, 128), dtype, seed=2)
    _check(x, 16, float(x.float().abs().amax()) / 2688.0 / 1000.0)


@needs_gpu
@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_non_finite_blocks_get_nan_scales(vec, bad):
    x = quantizer_inputs("normal", (4, 128), torch.bfloat16, seed=3)
    x[1, 5] = bad  # block (1, 0)
    nan_byte = 0x7F if vec == 16 else 0xFF
    gs = torch.tensor(0.01, device="cuda") if vec == 16 else None
    q, sf, _ = quantize_fp4.quantize_cuda(x.cuda(), vec, gs)
    plain = reference.from_blocked(sf.cpu(), 4, 128 // vec).view(torch.uint8)
    others = torch.ones_like(plain, dtype=torch.bool)
    others[1, 0] = False
    assert plain[1, 0] == nan_byte and not bool((plain[others] == nan_byte).any())
    assert not bool(q.cpu()[1, : vec // 2].any())  # zero codes in that block
    # the other blocks as if the bad one were zero
    clean = x.clone()
    clean[1, :vec] = 0.0
    rq = (
        reference.quantize_nvfp4(clean, 0.01)[0]
        if vec == 16
        else reference.quantize_mxfp4(clean)[0]
    )
    assert torch.equal(q.cpu()[:, vec // 2 :], rq[:, vec // 2 :])
    if vec == 16:  # dynamic: a non-finite global scale, every scale byte NaN
        q, sf, gs = quantize_fp4.quantize_cuda(x.cuda(), 16, None)
        assert not torch.isfinite(gs).item()
        plain = reference.from_blocked(sf.cpu(), 4, 8).view(torch.uint8)
        assert bool((plain == 0x7F).all()) and not bool(q.any())


@needs_gpu
def test_fp4_ops_quantize_on_cuda_matches_cpu():
    import fp4_ops

    x = quantizer_inputs("wide", (3, 70, 192), torch.bfloat16, seed=4)
    for fmt, gs in (("nvfp4", None), ("nvfp4", 0.05), ("mxfp4", None)):
        gpu, cpu = fp4_ops.quantize(x.cuda(), fmt, gs), fp4_ops.quantize(x, fmt, gs)
        assert torch.equal(gpu.data.cpu(), cpu.data)
        assert torch.equal(gpu.scale.cpu().view(torch.uint8), cpu.scale.view(torch.uint8))
        assert gpu.global_scale.item() == cpu.global_scale.item()


@needs_gpu
@pytest.mark.parametrize("gs", [0.0, -0.5, float("inf"), float("nan")], ids=str)
def test_bad_static_global_scale_gives_nan_scales(gs):
    x = quantizer_inputs("normal", (4, 64), torch.bfloat16, seed=5)
    q, sf, _ = quantize_fp4.quantize_cuda(x.cuda(), 16, torch.tensor(gs, device="cuda"))
    plain = reference.from_blocked(sf.cpu(), 4, 4).view(torch.uint8)
    assert bool((plain == 0x7F).all()) and not bool(q.any())


@needs_gpu
@pytest.mark.parametrize(
    "vec, scale, why",
    [
        (32, lambda: torch.tensor(1.0, device="cuda"), "MXFP4 has none"),
        (16, lambda: torch.tensor(1.0, dtype=torch.float64, device="cuda"), "float32"),
        (16, lambda: torch.tensor(1.0, dtype=torch.bfloat16, device="cuda"), "float32"),
        (16, lambda: torch.tensor(1.0), "x's device"),
        (16, lambda: torch.ones(2, device="cuda"), "one-element"),
        (16, lambda: 1.0, "one-element"),
    ],
    ids=["mxfp4-scale", "float64", "bfloat16", "cpu-scale", "two-elements", "number"],
)
def test_quantize_cuda_refuses_a_global_scale_it_cannot_read(vec, scale, why):
    """The quantizer reads a static global scale as one float32 on x's device: anything else
    (or any scale for MXFP4) is refused by name before a launch."""
    x = quantizer_inputs("normal", (4, 64), torch.bfloat16, seed=6).cuda()
    with pytest.raises(ValueError, match=why):
        quantize_fp4.quantize_cuda(x, vec, scale())


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with a CUDA driver the exported kernel would launch"
)
@pytest.mark.parametrize("vec, static", [(16, False), (16, True), (32, False)])
def test_launch_matches_the_tvm_ffi_signature(monkeypatch, tmp_path, vec, static):
    """launch_quantize's call of the compiled TVM-FFI function (pointers as ints, the extents
    tuple, SM count, stream), checked against the signature the compile produced: on CPU tensors
    it gets as far as the CUDA runtime, so arity, tuple sizes and argument types all match."""
    from types import SimpleNamespace

    dynamic = vec == 16 and not static
    options = "--gpu-arch sm_90a --enable-tvm-ffi"
    kernel = exported_tvm_ffi_function(
        quantize_fp4.compile_quantizer("BFloat16", vec, dynamic, options), tmp_path
    )
    monkeypatch.setattr(quantize_fp4, "_kernel", lambda *_: (kernel, 132))
    monkeypatch.setattr(quantize_fp4, "_PARTIALS", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    gs = torch.tensor(0.5) if static else None
    with pytest.raises(RuntimeError, match="cudaErrorInsufficientDriver|CUDA driver"):
        quantize_fp4.launch_quantize(x, vec, gs)
