# SPDX-License-Identifier: BSD-3-Clause
"""Tests of the Hopper (sm_90a) NVFP4 / MXFP4 GEMM, fp4_ops/sm90/gemm.py, its torch entry point
(``gemm``, ``GemmConfig``), fp4_ops/sm90/launcher.py, and its command line, fp4_ops/sm90/cli.py.

CPU (any machine, CI): cross-compile several configurations for sm_90a and check the PTX and
SASS (TMA loads, F16 / BF16 wgmma with FP32 accumulation, the conversion constants, no local
memory); the kernel's own conversion helpers and K-permutation and scale-offset index math, run
on the CPU with models of the PTX instructions they emit, against the reference's decode of
every code and scale; every can_implement refusal; ``gemm``'s operand and configuration checks;
the command line's error exits.
GPU (H100 / H200 only, skipped elsewhere): results against reference.check_gemm over ragged
shapes, both formats, every output dtype, alpha != 1, L > 1, decode (tiles of 8 to 128 tokens,
the tokens converted by the prologue grid) and prefill (2x1 cluster and 1x1) paths, split-K,
CTAs with several work units.
"""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import exported_tvm_ffi_function

from fp4_ops import devtools
from fp4_ops.memory import unit_scale
from fp4_ops.sm90 import cli, k_order
from fp4_ops.sm90 import dequant as dq
from fp4_ops.sm90 import gemm as k90
from fp4_ops.sm90 import launcher as r90

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ("-m", "fp4_ops.sm90")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_sm90() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# ------------------------------------------------------------------------------ CPU: compile
COMPILE_CONFIGS = [
    # (sf_vec_size, c_dtype, path, mma_tiler_mn, split_k[, tma_store])
    (16, "BFloat16", "prefill", (128, 256), 1),
    (32, "Float16", "prefill", (64, 128), 1),
    (16, "Float32", "decode", (16, 128), 2),
    (32, "BFloat16", "decode", (8, 64), 1),
    (16, "BFloat16", "decode", (8, 128), 4),
    (16, "Float32", "decode", (8, 128), 3, False),
    (16, "BFloat16", "decode", (32, 128), 4),
    # direct stores: requested (N * sizeof(D) not a multiple of 16 bytes), or where the
    # consumers' registers cannot hold the subtile staging (64 tokens x 128 rows, split-K)
    (16, "Float16", "decode", (16, 64), 3, False),
    (16, "BFloat16", "decode", (64, 128), 8),
    (32, "Float32", "prefill", (128, 128), 1, False),
    # the largest split: the fix-up's loads must still fit next to the accumulators
    (16, "BFloat16", "decode", (128, 128), 16),
    # K groups (7th field): 4 x 64 rows with split-K; 2 x 128 rows; 3 x 64 rows (no room for a
    # prologue CTA: no PDL chain); 2 x 64 rows at two CTAs per SM
    (16, "BFloat16", "decode", (8, 64), 1, True, 4),
    (32, "Float32", "decode", (32, 64), 2, True, 4),
    (16, "Float16", "decode", (16, 128), 1, False, 2),
    (16, "BFloat16", "decode", (16, 64), 1, True, 3),
    (32, "BFloat16", "decode", (32, 64), 2, True, 2),
]


def _half2(bits16: int) -> int:
    return bits16 << 16 | bits16


def _bf16_of(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0] >> 16


def _conversion_constants(vec: int, path: str) -> dict:
    """Constants the conversions must put in the PTX, by what they are."""
    f16 = vec == 16 and path == "decode"
    if f16:
        # the F16 bits of e2m1 * 2^-14: sign to bit 7, (exp, mant) to bits 1..3 of each byte
        return {
            _half2(_f16_bits(2.0**7)): "E4M3 scale * 2^7 (F16x2 2^7)",
            0x80808080: "e2m1 sign bits",
            0x0E0E0E0E: "e2m1 magnitude bits",
        }
    consts = {
        # e2m1 magnitude at BF16 bits 6..8 is 2^-126 times its value
        _half2(_bf16_of(2.0**126)): "BF16x2 2^126",
        0x81C081C0: "BF16 sign and magnitude bits",
        0x1040: "nibble to bits 6 and 12 (x << 6 | x << 12)",
    }
    if vec == 32 and path == "decode":
        # stages of E8M0 scales <= 1: BF16 scale * 2^126 = 2^(e - 1), exponent field e + 126
        consts[_half2(_bf16_of(2.0**-1))] = "BF16x2 2^(e - 1) at e = 0"
        consts[0x00800080] = "E8M0 byte to both BF16 exponent fields"
    if vec == 16:
        # E4M3 (magnitude << 4, sign << 8) is the BF16 value scale * 2^-120; NaN magnitude
        consts[_half2(_bf16_of(2.0**120))] = "BF16x2 2^120"
        consts[0x7FC07FC0] = "BF16x2 NaN of an E4M3 NaN scale"
    return consts


def _ptx_has_int(ptx: str, value: int) -> bool:
    """A 32-bit immediate, as PTX prints it (unsigned or signed decimal)."""
    signed = value - (1 << 32) if value >= 1 << 31 else value
    return re.search(rf"[\s,]({value}|{signed})[;,]", ptx) is not None


def _entry_ptx(ptx: str, name: str) -> str:
    """The PTX of one kernel: from its ``.entry`` line to the next kernel's (or the end)."""
    start = ptx.index(f".entry {name}")
    end = ptx.find(".entry", start + 1)
    return ptx[start:] if end < 0 else ptx[start:end]


def _cross_compile(dump: str, vec, c_dtype, path, tiler, split, tma_store, k_groups, a_dtype):
    """``compile_gemm`` for sm_90a into ``dump``: (kernel object, PTX text, cubin path)."""
    opts = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir={dump}"
    config = (vec, c_dtype, path, tiler, split, k90.H200_SM_COUNT, opts, None, tma_store)
    gemm, _ = k90.compile_gemm(*config, k_groups, a_dtype)
    ptx_files = [f for f in os.listdir(dump) if f.endswith(".ptx")]
    cubins = [f for f in os.listdir(dump) if f.endswith(".cubin")]
    assert ptx_files and cubins, os.listdir(dump)
    with open(os.path.join(dump, ptx_files[0])) as f:
        return gemm, f.read(), os.path.join(dump, cubins[0])


@pytest.mark.parametrize("vec", [16, 32])
def test_tokens_converted_kernel_has_no_prologue_grid(vec, tmp_path):
    """``tokens_converted``: the W4A4 decode GEMM alone (one kernel in the PTX, no
    ``convert_operands``), whose producer still requests its first weights before the PDL wait
    and loads the tokens' copy only after it."""
    opts = f"--gpu-arch sm_90a --keep-ptx --dump-dir={tmp_path}"
    config = (vec, "BFloat16", "decode", (16, 128), 4, k90.H200_SM_COUNT, opts, None, True, 1)
    gemm, compiled = k90.compile_gemm(*config, "Float4E2M1FN", tokens_converted=True)
    ptx = compiled.__ptx__
    assert not gemm.prologue and ptx.count(".entry") == 1 and "convert_operands" not in ptx
    early = ptx[: ptx.index("griddepcontrol.wait")]
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.\S*shared::\w+\.global", early)) == 2


@pytest.mark.parametrize("c_dtype", ["BFloat16", "Float16", "Float32"])
def test_compile_wrappers_hand_cute_compile_every_type(monkeypatch, c_dtype):
    """``compile_kernel`` and ``compile_tokens_step`` give ``cute.compile`` D in ``c_dtype``,
    the SM count and the options as asked (and the step the quantizer's x dtype): a wrapper
    that dropped one would compile another kernel than its cache key names."""
    from dataclasses import replace

    import cutlass

    from fp4_ops import quantizer
    from fp4_ops.sm90 import tokens_step

    seen = []
    monkeypatch.setattr(k90.cute, "compile", lambda *args, **kw: seen.append((args, kw)))
    config = r90.GemmConfig(16, c_dtype, path="decode", mma_tiler_mn=(8, 128))
    k90.compile_kernel(config.kernel(), c_dtype, 77, "--opt")
    tokens = replace(config, tokens_converted=True)
    q_config = quantizer.QuantizerConfig("Float16", 16, False, False, True)
    tokens_step.compile_tokens_step(q_config, tokens, 78, "--opt2")
    (args, kw), (step_args, step_kw) = seen
    assert args[5].dtype == k90.C_DTYPES[c_dtype] and args[13] == 77 and kw["options"] == "--opt"
    q_args, g_args, sms = step_args[1:4]
    assert q_args[0].dtype == cutlass.Float16 and g_args[4].dtype == k90.C_DTYPES[c_dtype]
    assert sms == 78 and step_kw["options"] == "--opt2"


def _kernel_bodies(dump) -> list[str]:
    """The PTX kernels in ``dump``, in order, each with its own name replaced by one word and
    its branch labels by the module's first kernel's."""
    [path] = [os.path.join(dump, f) for f in os.listdir(dump) if f.endswith(".ptx")]
    with open(path) as f:
        ptx = f.read()
    bodies = []
    for name in re.findall(r"\.entry (\w+)\(", ptx):
        body = _entry_ptx(ptx, name)
        # (up to its closing brace; branch labels carry the kernel's index in the module)
        body = body[: body.rindex("\n}\n") + 3].replace(name, "KERNEL")
        bodies.append(re.sub(r"\$L__BB\d+_", "$L__BB_", body))
    return bodies


@pytest.mark.parametrize(
    "in_dtype, vec, dynamic",
    [("BFloat16", 16, True), ("Float32", 16, False), ("Float16", 32, False)],
)
def test_tokens_step_holds_the_two_kernels_as_they_are(in_dtype, vec, dynamic, tmp_path):
    """``tokens_step``: one host function around the quantizer's tokens mode and the
    tokens_converted GEMM compiles the very kernels that the two compile alone (PTX equal up
    to their names: an amax grid, the tokens grid, the GEMM), in launch order."""
    from dataclasses import replace

    from fp4_ops import quantizer
    from fp4_ops.sm90 import tokens_step

    dirs = [tmp_path / d for d in ("step", "quantizer", "gemm")]
    for d in dirs:
        d.mkdir()
    opts = [f"--gpu-arch sm_90a --keep-ptx --dump-dir={d}" for d in dirs]
    q_config = quantizer.QuantizerConfig(in_dtype, vec, dynamic, False, True)
    problem = (16, 4096, 4096, 1)
    gemm_config = r90.GemmConfig.for_problem(problem, vec, "BFloat16", num_sms=k90.H200_SM_COUNT)
    gemm_config = replace(gemm_config, tokens_converted=True)
    tokens_step.compile_tokens_step(q_config, gemm_config, k90.H200_SM_COUNT, opts[0])
    quantizer.compile_quantizer(in_dtype, vec, dynamic, opts[1], False, True)
    k90.compile_kernel(gemm_config.kernel(), "BFloat16", k90.H200_SM_COUNT, opts[2])
    step, alone = _kernel_bodies(dirs[0]), _kernel_bodies(dirs[1]) + _kernel_bodies(dirs[2])
    assert len(step) == (3 if dynamic else 2) and step == alone
    with pytest.raises(ValueError, match="tokens_converted"):
        plain = replace(gemm_config, tokens_converted=False)
        tokens_step.compile_tokens_step(q_config, plain, k90.H200_SM_COUNT, opts[0])


@pytest.mark.parametrize(
    "path, a_dtype", [("prefill", "Float4E2M1FN"), ("decode", "BFloat16"), ("prefill", "BFloat16")]
)
def test_tokens_converted_only_on_the_w4a4_decode_path(path, a_dtype):
    """Only the W4A4 decode path reads a token copy that another grid can write: elsewhere
    ``tokens_converted`` is refused by the kernel and by the configuration's reasons."""
    tiler = (16, 128) if path == "decode" else (128, 256)
    with pytest.raises(ValueError, match="tokens_converted"):
        k90.BlockwiseGemmFp4Sm90(16, path, tiler, a_dtype=a_dtype, tokens_converted=True)
    config = r90.GemmConfig(16, "BFloat16", a_dtype, path, tiler, tokens_converted=True)
    assert any("tokens_converted" in r for r in config.reasons((16, 256, 256, 1)))


@pytest.mark.filterwarnings("error::DeprecationWarning")
@pytest.mark.parametrize("cfg", COMPILE_CONFIGS, ids=lambda c: "-".join(str(x) for x in c))
def test_cross_compile_sm90a(cfg, tmp_path):
    vec, c_dtype, path, tiler, split = cfg[:5]
    tma_store = cfg[5] if len(cfg) > 5 else True
    k_groups = cfg[6] if len(cfg) > 6 else 1
    config = (vec, c_dtype, path, tiler, split, tma_store, k_groups, "Float4E2M1FN")
    gemm, ptx, cubin = _cross_compile(str(tmp_path), *config)
    # TMA loads of the packed FP4 and the scales
    assert "cp.async.bulk.tensor" in ptx
    # the convert_operands grid first, then the GEMM, which waits for it (programmatic
    # dependent launch)
    assert "convert_operands" in ptx and "griddepcontrol.wait" in ptx
    # TMA loads before that wait: on decode the first stage's weights and scales (which the
    # prologue does not write), on prefill none
    gemm_ptx = _entry_ptx(ptx, "kernel_cutlass_kernel")
    early = gemm_ptx[: gemm_ptx.index("griddepcontrol.wait")]
    loads = re.findall(r"cp\.async\.bulk\.tensor\.\S*shared::\w+\.global", early)
    assert len(loads) == (2 if path == "decode" else 0), loads
    # (the producer's and the consumers', which read alpha from global memory after it)
    assert gemm_ptx.count("griddepcontrol.wait") == 2
    first_load = re.search(r"\bld\.global", gemm_ptx)
    assert first_load and first_load.start() > len(early)
    # the GEMM releases a PDL successor once, after its PDL wait (in PTX text order: a
    # guard against a release at entry, not a proof of the position after the loop)
    assert gemm_ptx.count("griddepcontrol.launch_dependents") == 1
    assert gemm_ptx.index("griddepcontrol.launch_dependents") > len(early)
    # the prologue waits for the kernel ahead before its first global memory access, and
    # releases its GEMM only after that wait
    prologue_ptx = _entry_ptx(ptx, "kernel_cutlass_convert_operands")
    first_access = re.search(r"\b(ld|st|atom|red)\.[\w:.]*global", prologue_ptx).start()
    wait = prologue_ptx.index("griddepcontrol.wait")
    assert wait < first_access
    release = prologue_ptx.index("griddepcontrol.launch_dependents")
    assert release > wait
    # wgmma (NVFP4: F16, MXFP4: BF16), A from registers, FP32 accumulation, N = the SMEM
    # operand's tile
    tile_cols = k90.kernel_tile(path, tiler)[1]
    ab = "f16" if vec == 16 and path != "prefill" else "bf16"
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_cols}k16\.f32\.{ab}\.{ab}", ptx)
    if ab == "f16":
        assert "mul.rn.f16x2" in ptx and "cvt.rn.f16x2.e4m3x2" in ptx and "prmt.b32" in ptx
    else:
        assert "mul.rn.bf16x2" in ptx
    # MXFP4 on decode: one warp vote per stage picks one multiply per pair or two
    assert gemm_ptx.count("vote.sync.all.pred") == (vec == 32 and path == "decode")
    # the conversion constants as the PTX carries them (values derived in the test)
    for value, what in _conversion_constants(vec, path).items():
        assert _ptx_has_int(ptx, value), f"{what} ({value:#x}) is not in the PTX"
    for selector in (0x2404, 0x3414) if ab == "f16" else ():
        assert re.search(rf"prmt\.b32\s+%r\d+, %r\d+, 0, {selector:#06x};", ptx), hex(selector)
    # F16 operands carry 2^-7 each: alpha * 2^14 (an fp32 immediate) on the F16 path only
    acc_scale = "0f" + struct.pack(">f", 2.0**14).hex().upper()
    assert re.search(rf"mul\.f32\s+%r\d+, %r\d+, {acc_scale};", gemm_ptx) or ab != "f16"
    assert (acc_scale in gemm_ptx) == (ab == "f16")
    tool = devtools.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    # per kernel of the module (the GEMM, and the prologue grid on decode and prefill):
    # (registers, stack bytes, local bytes)
    res = {
        name: tuple(int(x) for x in vals)
        for name, *vals in re.findall(
            r"Function (\w+):\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage
        )
    }
    assert len(res) == 2, usage
    assert all(stack == 0 and local == 0 for _, stack, local in res.values()), usage
    gemm_regs = next(r for name, (r, _, _) in res.items() if "convert_operands" not in name)
    # setmaxnreg.inc can only hand out what the CTA got at launch: more would hang the kernel.
    budget = gemm.threads_per_wg * gemm.producer_regs + gemm.num_mma_threads * gemm.mma_regs
    assert gemm_regs * gemm.threads_per_cta >= budget, (gemm_regs, budget)
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    # (SASS spells the F16 variant without a type suffix)
    hgmma = re.search(rf"HGMMA\.64x{tile_cols}x16\.F32(\.BF16)?\s", sass)
    assert hgmma and (hgmma.group(1) is None) == (ab == "f16"), hgmma
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert "UTMALDG" in sass
    # the epilogue: TMA stores of D subtiles, or direct stores
    spill_guard = tiler == (64, 128) and path == "decode" and split > 1
    assert gemm.tma_store == (tma_store and not spill_guard)
    assert ("UTMASTG" in sass) == gemm.tma_store
    assert ("cp.async.bulk.tensor.3d.global.shared::cta" in ptx) == gemm.tma_store
    # NOTE: each CTA also costs 1 KiB of SMEM reserved by the hardware.
    smem = gemm.shared_storage.size_in_bytes()
    assert smem <= k90.SM90_SMEM_CAPACITY
    assert gemm.occupancy * (smem + 1024) <= k90.SM90_SMEM_PER_SM
    prologue_regs = next((r for name, (r, _, _) in res.items() if "convert_operands" in name), 0)
    gemms_regs = gemm.occupancy * gemm.threads_per_cta * gemm_regs
    if k_groups > 1:
        # the PDL chain is on exactly where a prologue CTA fits beside the K groups' CTAs
        fits = gemms_regs + gemm.convert_threads * prologue_regs <= k90.SM90_REGS_PER_SM
        assert gemm.prologue_pdl == (gemm.tile_cols <= 32 and fits)
    if path == "decode" and (
        gemm.occupancy == 2 and gemm.tile_rows == 128 or k_groups > 1 and gemm.prologue_pdl
    ):
        # on the PDL chain the prologue's CTAs fit beside the GEMM's CTAs (registers, and the
        # SMEM of their reserved KiB), so they never hold back a GEMM CTA
        assert prologue_regs <= k90.DECODE_CONVERT_MAX_REGS, prologue_regs
        assert gemms_regs + gemm.convert_threads * prologue_regs <= k90.SM90_REGS_PER_SM
        assert gemm.occupancy * (smem + 1024) + 1024 <= k90.SM90_SMEM_PER_SM
    if k_groups > 1:
        # two stages or more per group, each stage owned by one group (phase parity waits)
        assert gemm.num_stages % k_groups == 0 and gemm.num_stages >= 2 * k_groups
        assert "ld.shared.f32" in ptx and "st.shared.f32" in ptx


def _cpu_operands(m, n, k, l, vec=16, sf_dtype="uint8", a_dtype=k90.W4A4, out="bfloat16"):  # noqa: E741
    """``gemm``'s operands for (M, N, K, L) as zeros on the CPU (only the device rule fails):
    packed FP4 or 16-bit activations, blocked scales of ``vec`` in ``sf_dtype``, alpha, out."""
    import torch

    sf = getattr(torch, sf_dtype)
    if a_dtype == k90.W4A4:
        a = torch.zeros(l, m, k // 2, dtype=torch.uint8)
        b = torch.zeros(l, n, k // 2, dtype=torch.uint8)
        sfa = torch.zeros(l, k90.blocked_sf_bytes(m, k, 1, vec), dtype=torch.uint8).view(sf)
    else:
        a = torch.zeros(l, m, k, dtype=k90.torch_dtype(a_dtype))
        b = torch.zeros(l, n, -(-k // 64) * 32, dtype=torch.uint8)
        sfa = None
    sfb = torch.zeros(l, k90.blocked_sf_bytes(n, k, 1, vec), dtype=torch.uint8).view(sf)
    d = torch.zeros(l, m, n, dtype=getattr(torch, out))
    return dict(a=a, b=b, sfa=sfa, sfb=sfb, alpha=torch.ones(1), out=d)


def _refusal(config=None, **operands) -> str:
    """The ValueError message of ``gemm`` on these operands (CPU tensors: never launched)."""
    with pytest.raises(ValueError) as err:
        r90.gemm(**operands, config=config)
    return str(err.value)


def _cuda_refusals(*names) -> str:
    return "; ".join(f"{name} must be a contiguous CUDA tensor" for name in names)


def test_gemm_names_each_operand_problem():
    import torch

    m, n, k, l = 16, 64, 256, 1  # noqa: E741
    config = r90.GemmConfig.for_problem((m, n, k, l), 16, "BFloat16", num_sms=132)
    good = _cpu_operands(m, n, k, l)
    # CPU tensors: only the device rule fails
    assert _refusal(config, **good) == _cuda_refusals("a", "b", "sfa", "sfb", "out")
    # 8 bytes past an aligned base: 8-byte aligned, not 16
    shifted = torch.zeros(l * m * k // 2 + 8, dtype=torch.uint8)[8:].view(l, m, k // 2)
    assert "a must start on a 16-byte boundary" in _refusal(config, **dict(good, a=shifted))
    sf = good["sfb"].shape[1]
    short = dict(good, sfb=torch.zeros(l, sf - 16, dtype=torch.uint8))
    want = f"sfb has shape (1, {sf - 16}); (M, N, K, L) = (16, 64, 256, 1) needs (1, {sf})"
    assert want in _refusal(config, **short)
    # (N comes from b, K from a: a b of another K)
    half = dict(good, b=good["b"][..., :64].contiguous())
    assert "b has shape (1, 64, 64); (M, N, K, L) = (16, 64, 256, 1)" in _refusal(config, **half)
    # packed FP4 and scales are one byte each
    wide = dict(good, a=torch.zeros(l, m, k // 2, dtype=torch.int16))
    assert "a is torch.int16: packed FP4 is uint8" in _refusal(config, **wide)
    mx_scales = dict(good, sfb=good["sfb"].view(torch.float8_e8m0fnu))
    assert "sfb is torch.float8_e8m0fnu: sf_vec_size 16" in _refusal(config, **mx_scales)
    assert "sfa is None: W4A4 needs" in _refusal(config, **dict(good, sfa=None))
    # D must have the dtype of the configuration's kernel: same size is not enough
    for c_dtype, other in (("BFloat16", torch.float16), ("Float32", torch.bfloat16)):
        wrong = dict(good, out=torch.zeros(l, m, n, dtype=other))
        refused = _refusal(r90.GemmConfig.for_problem((m, n, k, l), 16, c_dtype), **wrong)
        assert f"out is {other}; config.c_dtype is {c_dtype}" in refused
    assert "out has shape (1, 16, 32)" in _refusal(config, **dict(good, out=good["out"][..., :32]))
    for alpha in (1.0, torch.ones(1, dtype=torch.float64), torch.ones(2)):
        refused = _refusal(config, **dict(good, alpha=alpha))
        assert "alpha must be a one-element float32 tensor on cpu" in refused


def test_gemm_takes_the_formats_from_the_tensors():
    import torch

    m, n, k, l = 16, 64, 256, 2  # noqa: E741
    refused = _refusal(**_cpu_operands(m, n, k, l))
    assert "uint8 scales do not say their format: pass sf_vec_size" in refused
    cuda_only = _cuda_refusals("a", "b", "sfa", "sfb", "out")
    assert _refusal(**_cpu_operands(m, n, k, l), sf_vec_size=16) == cuda_only
    assert _refusal(**_cpu_operands(m, n, k, l, 16, "float8_e4m3fn")) == cuda_only
    mixed = dict(_cpu_operands(m, n, k, l, 16, "float8_e4m3fn"), sf_vec_size=32)
    assert "name different formats (V [16, 32])" in _refusal(**mixed)
    config = r90.GemmConfig.for_problem((m, n, k, l), 16)
    assert "sf_vec_size=32, but config.sf_vec_size is 16" in _refusal(config, **mixed)
    # W4A16 from a's dtype, MXFP4 from the scales': float16 activations cannot take E8M0
    w4a16 = _cpu_operands(m, n, k, l, 32, "float8_e8m0fnu", "Float16")
    assert "a_dtype=Float16 with MXFP4 weights" in _refusal(**w4a16)
    float64_out = _cpu_operands(m, n, k, l, 16, "float8_e4m3fn", out="float64")
    assert "out must be bfloat16, float16 or float32" in _refusal(**float64_out)
    flat = dict(_cpu_operands(m, n, k, l), a=torch.zeros(m * k // 2, dtype=torch.uint8))
    assert "a must be 3-D [L, rows, K]" in _refusal(**flat, sf_vec_size=16)
    ints = dict(_cpu_operands(m, n, k, l), a=torch.zeros(l, m, k // 2, dtype=torch.int16))
    assert "a must be packed FP4 (uint8 or float4_e2m1fn_x2: W4A4)" in _refusal(**ints)


def test_gemm_config_for_problem_and_its_key():
    mnkl = (1, 7168, 2048, 1)
    config = r90.GemmConfig.for_problem(mnkl, 32, "Float32", num_sms=132)
    picked = (config.path, config.mma_tiler_mn, config.split_k, config.k_groups)
    assert picked == k90.default_config(*mnkl, 132) == ("decode", (8, 64), 1, 4)
    assert (config.sf_vec_size, config.c_dtype, config.a_dtype) == (32, "Float32", k90.W4A4)
    assert config.cluster_shape_mn == (1, 1) and config.tma_store and config.reasons(mnkl) == []
    # a tile or a split given: the pick without K groups, as the command line makes it
    assert r90.GemmConfig.for_problem(mnkl, split_k=2, num_sms=132).k_groups == 1
    assert r90.GemmConfig.for_problem(mnkl, mma_tiler_mn=(8, 128), num_sms=132).k_groups == 1
    prefill = r90.GemmConfig.for_problem((4096, 8192, 8192, 1), num_sms=132)
    assert (prefill.path, prefill.mma_tiler_mn, prefill.cluster_shape_mn) == (
        "prefill",
        (128, 256),
        (2, 1),
    )
    # D rows of 1001 BF16 values are not 16-byte multiples: direct stores
    ragged = r90.GemmConfig.for_problem((8, 1001, 1024, 1), num_sms=132)
    assert not ragged.tma_store and ragged.reasons((8, 1001, 1024, 1)) == []
    tma = r90.GemmConfig(path="decode", mma_tiler_mn=(8, 128))
    assert "use tma_store=False" in tma.reasons((8, 1001, 1024, 1))[0]
    # one spelling per kernel: defaults filled in, lists made tuples, TMA stores off where the
    # kernel stages no D (64 tokens x 128 rows, split-K)
    same = r90.GemmConfig(path="decode", mma_tiler_mn=[8, 128], cluster_shape_mn=[1, 1])
    assert same == tma and hash(same) == hash(tma)
    assert not r90.GemmConfig(path="decode", mma_tiler_mn=(64, 128), split_k=2).tma_store


SPLIT_CLUSTER_PICKS = [
    # (M, N, K, L, a_dtype, SMs, tile / split / K groups given, cluster of the pick)
    # 128 x 128 tiles split 2, as many tiles as 2x1 clusters fit at once or fewer
    (128, 8192, 8192, 1, "BFloat16", 132, {}, (2, 1)),
    (65, 8448, 8192, 1, "BFloat16", 132, {}, (2, 1)),
    (128, 4096, 8192, 2, "BFloat16", 132, {}, (2, 1)),
    (128, 8192, 28672, 1, k90.W4A4, 132, {}, (2, 1)),
    (128, 8192, 8192, 1, k90.W4A4, 132, {}, (2, 1)),
    # one tile more than the clusters (67 > 66, also on an odd 133 SMs), or fewer SMs: no
    # second wave of clusters
    (128, 8576, 8192, 1, "BFloat16", 132, {}, (1, 1)),
    (128, 8192, 8192, 1, "BFloat16", 100, {}, (1, 1)),
    (128, 8576, 8192, 1, "BFloat16", 133, {}, (1, 1)),
    # other picks: W4A4's 128 x 64 tiles split 2, two token tiles, one token (K groups), 64
    # tokens
    (128, 4096, 14336, 1, k90.W4A4, 132, {}, (1, 1)),
    (256, 8192, 8192, 1, "BFloat16", 132, {}, (1, 1)),
    (1, 8192, 8192, 1, "BFloat16", 132, {}, (1, 1)),
    (64, 8192, 8192, 1, "BFloat16", 132, {}, (1, 1)),
    # a tile or a split given: the configuration as asked, without a cluster on decode
    (128, 8192, 8192, 1, "BFloat16", 132, {"split_k": 2}, (1, 1)),
    (128, 8192, 8192, 1, "BFloat16", 132, {"mma_tiler_mn": (128, 128)}, (1, 1)),
    # (K groups given as none: still the pick's tile and split)
    (128, 8192, 8192, 1, "BFloat16", 132, {"k_groups": 1}, (2, 1)),
]


@pytest.mark.parametrize("case", SPLIT_CLUSTER_PICKS, ids=lambda c: "-".join(map(str, c[:6])))
def test_for_problem_runs_a_wave_of_split_pairs_on_clusters(case):
    """``for_problem`` puts a pick's two K splits on 2x1 clusters where ``split_cluster_fits``:
    128-token x 128-row tiles split 2 without K groups, every tile's cluster in one wave."""
    *mnkl, a_dtype, sms, given, cluster = case
    config = r90.GemmConfig.for_problem(tuple(mnkl), 16, "BFloat16", a_dtype, sms, **given)
    assert config.cluster_shape_mn == cluster
    assert config.reasons(tuple(mnkl)) == []
    if cluster == (2, 1):
        assert (config.mma_tiler_mn, config.split_k, config.k_groups) == ((128, 128), 2, 1)
        assert config.kernel().split_cluster and config.kernel().mcast == 1


@pytest.mark.parametrize("given", [{"cluster_shape_mn": (1, 1)}, {"split_k": 2}, {"split_k": 1}])
def test_w4a4_takes_split_pairs_only_on_clusters(given):
    """W4A4's 128-row tiles split 2 on one short round pay only as 2x1 cluster pairs: with
    nothing given ``for_problem`` takes them on clusters; a cluster or a split given keeps the
    64-row tiles that the global fix-up needs there."""
    mnkl = (128, 8192, 8192, 1)
    pick = r90.GemmConfig.for_problem(mnkl, 16, "BFloat16", k90.W4A4, 132)
    assert (pick.mma_tiler_mn, pick.split_k, pick.cluster_shape_mn) == ((128, 128), 2, (2, 1))
    config = r90.GemmConfig.for_problem(mnkl, 16, "BFloat16", k90.W4A4, 132, **given)
    assert (config.mma_tiler_mn, config.cluster_shape_mn) == ((128, 64), (1, 1))


@pytest.mark.parametrize("operand", ["a", "b", "sfa", "sfb", "out"])
@pytest.mark.parametrize("defect", ["strided", "misaligned"])
def test_launch_fits_checks_every_operand(monkeypatch, operand, defect):
    """``Launch.fits``, which a caller keeping a Launch asks before each call: every tensor the
    kernel reads or writes through TMA, D included, must be contiguous with a 16-byte-aligned
    base; one that is not makes it False (the full path then checks and copies)."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: -1)
    launch = r90.Launch(
        lambda *args: None, (128, 128, 256, 1), (), -1, torch.ones(1), r90.GemmConfig()
    )
    shapes = dict(a=(1, 128, 128), b=(1, 128, 128), sfa=(1, 2048), sfb=(1, 2048))
    good = {name: torch.zeros(shape, dtype=torch.uint8) for name, shape in shapes.items()}
    good["out"] = torch.zeros(1, 128, 128, dtype=torch.bfloat16)
    alpha = torch.ones(1)
    assert launch.fits(**good, alpha=alpha)
    t = good[operand]
    if defect == "strided":
        bad = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2]
    else:
        bad = torch.zeros(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)
    assert launch.fits(**dict(good, **{operand: bad}), alpha=alpha) is False


def test_gemm_launch_arguments_workspaces_and_cache(monkeypatch):
    """``gemm``'s launch without a GPU (the device checks, the compile and the stream replaced):
    the kernel gets a, b, sfa, sfb, out, the stream's workspace, alpha and alpha's scale (the
    device's 1.0 when none is given) in place (W4A16: sfb for the unused sfa), (M, N, K, L) and
    the current stream; a configuration compiles once per
    device; each stream gets its own workspace, made outside CUDA-graph capture only."""
    import torch

    compiled, launches = [], []

    def compile_kernel(kernel, c_dtype, sms, options):
        fields = (kernel.sf_vec_size, c_dtype, kernel.path, kernel.mma_tiler_mn, kernel.split_k)
        fields += (sms, options, kernel.cluster_shape_mn, kernel.tma_store, kernel.k_groups)
        compiled.append((*fields, kernel.a_dtype))
        return SimpleNamespace(__tvm_ffi_object__=lambda: lambda *x: launches.append(x))

    streams = {h: SimpleNamespace(cuda_stream=h, device=torch.device("cpu")) for h in (5, 6, 7)}
    current, capturing = [streams[5]], [False]
    monkeypatch.setattr(r90, "compile_kernel", compile_kernel)
    monkeypatch.setattr(r90, "operand_reasons", lambda *_: [])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: current[0])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    def launch(stream, operands, config, scale=None):
        current[0] = streams[stream]
        assert r90.gemm(**operands, config=config, scale=scale) is operands["out"]
        addresses, problem, cu_stream = list(launches[-1][:11]), launches[-1][11], launches[-1][12]
        assert problem == (m, n, k, l) and cu_stream == stream
        sfa = operands["sfb"] if operands["sfa"] is None else operands["sfa"]
        named = (operands["a"], operands["b"], sfa, operands["sfb"], operands["out"])
        assert addresses[:5] == [t.data_ptr() for t in named]
        # (alpha, alpha again where a dense kernel takes no group offsets, alpha's scale)
        unit = unit_scale(torch.device("cpu"))
        assert float(unit) == 1.0
        alpha = operands["alpha"].data_ptr()
        assert addresses[8:] == [alpha, alpha, (unit if scale is None else scale).data_ptr()]
        return addresses[5:8]

    m, n, k, l = 20, 520, 1024, 2  # noqa: E741
    config = r90.GemmConfig.for_problem(
        (m, n, k, l), 32, "Float32", path="decode", mma_tiler_mn=(32, 128), split_k=3
    )
    ops = _cpu_operands(m, n, k, l, 32, out="float32")
    kernels = r90.cache_size()
    first = launch(5, ops, config)
    sms = r90.gpu_sm_count()
    options = "--enable-tvm-ffi"
    assert compiled == [
        (32, "Float32", "decode", (32, 128), 3, sms, options, (1, 1), True, 1, k90.W4A4)
    ]
    assert r90.cache_size() == kernels + 1
    again = launch(5, _cpu_operands(m, n, k, l, 32, out="float32"), config, torch.ones(1))
    other = launch(6, ops, config)
    assert again == first and len(set(other + first)) == 6 and len(compiled) == 1
    # under capture: the workspace of stream 5 is reused, stream 7 would need a new one
    capturing[0] = True
    assert launch(5, ops, config) == first
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph on that stream"):
        launch(7, ops, config)
    capturing[0] = False
    w4a16 = r90.GemmConfig.for_problem((m, n, k, l), 16, "BFloat16", "BFloat16", path="decode")
    launch(7, _cpu_operands(m, n, k, l, a_dtype="BFloat16"), w4a16)
    assert len(compiled) == 2 and compiled[1][-1] == "BFloat16"


@pytest.mark.skipif(_has_cuda(), reason="with a CUDA driver the exported kernel would launch")
@pytest.mark.parametrize("a_dtype", [k90.W4A4, "BFloat16"])
def test_launch_matches_the_tvm_ffi_signature(monkeypatch, tmp_path, a_dtype):
    """``gemm``'s call of the compiled TVM-FFI function (ten addresses as ints, (M, N, K, L),
    the raw stream), checked against the signature the compile produced: exported ahead of time
    and called through ``gemm`` on CPU tensors, it gets as far as the CUDA runtime, so arity,
    tuple sizes and argument types all match."""
    import torch

    m, n, k, l = 16, 256, 512, 1  # noqa: E741
    config = r90.GemmConfig.for_problem((m, n, k, l), 16, "BFloat16", a_dtype, path="decode")
    kernel, compiled = k90.compile_gemm(
        config.sf_vec_size,
        config.c_dtype,
        config.path,
        config.mma_tiler_mn,
        config.split_k,
        k90.H200_SM_COUNT,
        "--gpu-arch sm_90a --enable-tvm-ffi",
        config.cluster_shape_mn,
        config.tma_store,
        config.k_groups,
        config.a_dtype,
    )
    launch = exported_tvm_ffi_function(compiled, tmp_path)
    monkeypatch.setattr(r90, "_compiled", lambda *_: (kernel, launch))
    monkeypatch.setattr(r90, "operand_reasons", lambda *_: [])
    stream = SimpleNamespace(cuda_stream=0, device=torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    operands = _cpu_operands(m, n, k, l, a_dtype=a_dtype)
    with pytest.raises(RuntimeError, match="cudaErrorInsufficientDriver|CUDA driver"):
        r90.gemm(**operands, config=config)


def _grouped_cpu_operands(counts, n, k, vec=16):
    """The grouped entry's operands on the CPU: BF16 rows, prepacked-size weights and blocked
    scales per expert (zeros), alpha per expert, the offsets of ``counts``."""
    import torch

    e, rows = len(counts), sum(counts)
    a = torch.zeros(rows, k, dtype=torch.bfloat16)
    b = torch.zeros(e, n, -(-k // 64) * 32, dtype=torch.uint8)
    sfb = torch.zeros(e, k90.blocked_sf_bytes(n, k, 1, vec), dtype=torch.uint8)
    offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    return a, b, sfb, vec, torch.ones(e), offsets


@pytest.mark.skipif(_has_cuda(), reason="with a CUDA driver the exported kernel would launch")
def test_grouped_launch_matches_the_tvm_ffi_signature(monkeypatch, tmp_path):
    """The grouped entry's call of its compiled TVM-FFI function (ten addresses, the problem,
    the stream) against the signature the compile produced, as for the dense kernel."""
    import contextlib

    import torch

    counts, n, k = [1, 0, 3, 4], 256, 512
    config = r90.GemmConfig.for_groups(8, n, k, 4, num_sms=k90.H200_SM_COUNT)
    kernel, compiled = k90.compile_gemm(
        *(16, "BFloat16", "decode", config.mma_tiler_mn, 1, k90.H200_SM_COUNT),
        *("--gpu-arch sm_90a --enable-tvm-ffi", None, False, config.k_groups, "BFloat16"),
        grouped=True,
    )
    launch = exported_tvm_ffi_function(compiled, tmp_path)
    monkeypatch.setattr(r90, "_compiled", lambda *_: (kernel, launch))
    monkeypatch.setattr(r90, "operand_reasons", lambda *_: [])
    monkeypatch.setattr(r90, "stream_handle", lambda *_: 0)
    monkeypatch.setattr(r90, "_LAUNCHES", {})
    stream = SimpleNamespace(cuda_stream=0, device=torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    operands = _grouped_cpu_operands(counts, n, k)
    with pytest.raises(RuntimeError, match="cudaErrorInsufficientDriver|CUDA driver"):
        r90.grouped_gemm_for_ops(*operands, torch.bfloat16)


def test_grouped_offsets_limit_one_experts_weights_not_all():
    """The experts' weights and scales are read by TMA only: DeepSeek-V3's w13 (256 x 4096 x
    7168, 3.7 GB of FP4) runs as one problem at every token count (a batch of dense problems
    that size is refused), and only an expert whose own weights or scales pass 2^31 is refused,
    by name."""
    import dataclasses

    for rows in (8, 32768):
        mnkl = (rows, 4096, 7168, 256)
        config = r90.GemmConfig.for_groups(*mnkl, num_sms=k90.H200_SM_COUNT)
        assert config.reasons(mnkl) == [], rows
        dense = dataclasses.replace(config, grouped=False)
        assert any("N*K_pad/2*L" in r for r in dense.reasons(mnkl))
    n, k = 65536, 65536  # (one expert: 2^31 bytes of FP4)
    config = r90.GemmConfig.for_groups(8, n, k, 2, num_sms=k90.H200_SM_COUNT)
    reasons = config.reasons((8, n, k, 2))
    assert any("N*K_pad/2 (one expert) = 2147483648" in r for r in reasons), reasons
    # (one weight row: its scales, padded to a 128-row atom, outgrow its codes)
    config = r90.GemmConfig.for_groups(8, 1, 2**28, 2, num_sms=k90.H200_SM_COUNT)
    reasons = config.reasons((8, 1, 2**28, 2))
    assert any("SFB blocked bytes (one expert) = 2147483648" in r for r in reasons), reasons


def _stand_in_launcher(monkeypatch):
    """The launcher on the CPU: compiling records (c_dtype, grouped) and hands back a function
    that records its arguments; empty caches, a stand-in stream 5, an H200's SM count (also
    where a real GPU is present). Returns (compiled, launches)."""
    import contextlib

    compiled, launches = [], []

    def compile_kernel(kernel, c_dtype, sms, options):
        compiled.append((c_dtype, kernel.grouped))
        return SimpleNamespace(__tvm_ffi_object__=lambda: lambda *x: launches.append(x))

    stream = SimpleNamespace(cuda_stream=5, device=torch.device("cpu"))
    monkeypatch.setattr(r90, "compile_kernel", compile_kernel)
    monkeypatch.setattr(r90, "operand_reasons", lambda *_: [])
    monkeypatch.setattr(r90, "stream_handle", lambda *_: 5)
    monkeypatch.setattr(r90, "gpu_sm_count", lambda *_: k90.H200_SM_COUNT)
    for cache in ("_LAUNCHES", "_KERNELS", "_WORKSPACES", "_PICKED"):
        monkeypatch.setattr(r90, cache, {})
    monkeypatch.setattr(r90, "_CHECKED", set())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: -1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    return compiled, launches


def test_grouped_launches_pass_their_operands_and_cache_by_shape(monkeypatch):
    """The grouped entry's launch of its compiled function: the operands' addresses in the
    kernel's order (alpha, then the offsets), the problem with the activations' K (not the
    padded weights'), one check per shape and output dtype, a cache hit taking new operands."""
    counts, n, k = [1, 0, 3, 4], 256, 160  # (K % 64 == 32: the weights carry padding)
    compiled, launches = _stand_in_launcher(monkeypatch)
    for out_dtype, first in (
        (torch.bfloat16, True),
        (torch.bfloat16, False),
        (torch.float32, True),
    ):
        a, b, sfb, vec, alpha, offsets = _grouped_cpu_operands(counts, n, k)
        before = len(compiled)
        out = r90.grouped_gemm_for_ops(a, b, sfb, vec, alpha, offsets, out_dtype)
        assert (len(compiled) > before) == first and compiled[-1][1], out_dtype
        addresses, problem, handle = list(launches[-1][:11]), launches[-1][11], launches[-1][12]
        assert problem == (sum(counts), n, k, len(counts)) and handle == 5
        named = (a, b, sfb, sfb, out)  # (W4A16: the weights' scales stand in for SFA)
        assert addresses[:5] == [t.data_ptr() for t in named]
        unit = unit_scale(torch.device("cpu")).data_ptr()
        assert addresses[8:] == [alpha.data_ptr(), offsets.data_ptr(), unit]
        assert out.shape == (sum(counts), n) and out.dtype == out_dtype
    # a scale for every alpha (W4A4 MoE: the activations' global scale), new at each call
    for first in (True, False):
        before, scale = len(compiled), torch.full((), 3.0)
        r90.grouped_gemm_for_ops(a, b, sfb, vec, alpha, offsets, torch.float16, scale)
        assert (len(compiled) > before) == first
        assert launches[-1][10] == scale.data_ptr()
    for bad in (torch.full((), 3.0, dtype=torch.float64), torch.ones(2)):
        with pytest.raises(ValueError, match="scale must be a float32 scalar on cpu"):
            r90.grouped_gemm_for_ops(a, b, sfb, vec, alpha, offsets, torch.float16, bad)


def test_grouped_launches_stay_bounded_over_many_token_counts(monkeypatch):
    """The launch cache holds at most _MAX_LAUNCHES entries whatever the token counts a MoE
    layer sees (a launch per routing's row count would grow it forever), and a count seen
    before the cache started over launches again."""
    _, launches = _stand_in_launcher(monkeypatch)
    monkeypatch.setattr(r90, "_MAX_LAUNCHES", 3)
    for first in range(1, 9):
        a, b, sfb, vec, alpha, offsets = _grouped_cpu_operands([first, 2, 0, 1], 256, 128)
        r90.grouped_gemm_for_ops(a, b, sfb, vec, alpha, offsets, torch.bfloat16)
        assert len(r90._LAUNCHES) <= 3 and launches[-1][11][0] == first + 3
    assert len(launches) == 8


@pytest.mark.parametrize("capability", [(8, 0), (9, 0), (10, 0), (12, 0)])
def test_only_sm90_takes_the_hopper_only_paths(capability, monkeypatch):
    """W4A16 and the grouped GEMMs have kernels for sm_90 only: any other capability is
    refused by name (an H200 can never see this)."""
    from fp4_ops import ops

    monkeypatch.setattr(ops, "_capability", lambda t: capability)
    monkeypatch.setattr(ops.torch.cuda, "get_device_name", lambda *_: "some GPU")
    t = SimpleNamespace(device="cuda:0")
    for check in (lambda: ops.check_w4a16_gpu(t), lambda: ops.check_sm90(t, "the grouped GEMM")):
        if capability == (9, 0):
            check()
            continue
        with pytest.raises(ValueError, match=r"sm_90 \(H100 / H200\) only; some GPU is sm_"):
            check()


@pytest.mark.parametrize(
    "rows, experts, cols",
    # (rows = tokens x top-k: DeepSeek-V3 at 1 and 16 tokens, Qwen3-30B-A3B at 256 and 4096
    # tokens, fewer rows than experts, one expert)
    [
        *[(8, 256, 8), (128, 256, 8), (2048, 128, 32), (32768, 128, 128), (8, 4, 8)],
        *[(40, 1, 64), (37, 8, 16)],  # (a share of 4.6 rows: twice 5)
    ],
)
def test_grouped_token_tile_holds_twice_the_even_share(rows, experts, cols):
    """The grouped pick's token tile is the smallest that holds twice the rows of an even
    share, rounded up, over the experts the rows can touch (at most all rows, at most 128);
    experts beyond the rows' count, which no row can reach, change nothing in the pick."""
    config = r90.GemmConfig.for_groups(rows, 2048, 7168, experts, num_sms=k90.H200_SM_COUNT)
    assert config.mma_tiler_mn[0] == cols
    if experts >= rows:
        for n, k in ((2048, 7168), (4096, 7168), (768, 2048)):
            fewer = r90.GemmConfig.for_groups(rows, n, k, rows, num_sms=k90.H200_SM_COUNT)
            assert r90.GemmConfig.for_groups(rows, n, k, experts, num_sms=132) == fewer


@pytest.mark.parametrize(
    "rows, experts, n, k, want",
    [
        # Llama-4 at one token (top-1): w13 and w2 split where one expert's rows leave SMs idle
        (1, 16, 16384, 5120, ((8, 128), 2, 1)),
        (1, 128, 5120, 8192, ((8, 128), 6, 1)),
        # Qwen3-30B-A3B at one token (top-8): the even share's pick, 64 rows split 2, would
        # make 8 tiles x 24 x 2 = 384 units where each of 8 experts takes one row: unsplit
        (8, 128, 1536, 2048, ((8, 64), 1, 1)),
        # ... its w2: 6 k-tiles, too short to split
        (8, 128, 2048, 768, ((8, 128), 1, 1)),
        # DeepSeek-V3 at one token: 8 experts' tiles fill the SMs unsplit
        (8, 256, 4096, 7168, ((8, 128), 1, 1)),
        # the even share's pick splits (16 rows in 16 experts: 16 x 40 x 2 = 1280 units), but a
        # routing that gives 16 experts a row each makes more units than one wave: unsplit
        (16, 16, 5120, 8192, ((8, 128), 1, 1)),
    ],
)
def test_grouped_split_only_where_any_routing_fits_one_wave(rows, experts, n, k, want):
    """for_groups keeps default_config's K split of the even share only where every unit that
    any routing of the rows can make (grouped_tiles x row tiles x split) fits one wave of CTA
    slots: the split-K workspace holds all of them; else the same tile unsplit."""
    config = r90.GemmConfig.for_groups(rows, n, k, experts, num_sms=k90.H200_SM_COUNT)
    assert (config.mma_tiler_mn, config.split_k, config.k_groups) == want
    tile_cols, tile_rows = config.mma_tiler_mn
    bound = k90.grouped_tiles(rows, experts, tile_cols) * -(-n // tile_rows) * config.split_k
    slots = k90.H200_SM_COUNT * k90.occupancy("decode", config.mma_tiler_mn, config.k_groups)
    assert config.split_k == 1 or bound <= slots
    touched = min(rows, experts)
    share = min(rows, 2 * -(-rows // touched))
    picked = k90.default_config(
        share, n, k, touched, k90.H200_SM_COUNT, "decode", True, "BFloat16", grouped=True
    )
    assert picked[1] == config.mma_tiler_mn and config.split_k in (1, picked[2])


@pytest.mark.parametrize("rows, groups, tile", [(1, 16, 8), (8, 256, 8), (37, 8, 16), (0, 4, 8)])
def test_grouped_tiles_bounds_every_routing(rows, groups, tile):
    """grouped_tiles bounds the token tiles of every routing of ``rows`` rows over ``groups``
    groups (each group in whole tiles): against every routing of the rows over at most four
    groups, random routings over all of them, and the routing that reaches it (groups one row
    past a tile)."""
    import itertools

    bound = k90.grouped_tiles(rows, groups, tile)
    assert bound == (-(-rows // tile) + min(groups, rows) - 1 if rows else 0)
    for counts in itertools.product(range(rows + 1), repeat=min(groups, 4)):
        if sum(counts) == rows:
            assert sum(-(-c // tile) for c in counts) <= bound, counts
    gen = torch.Generator().manual_seed(rows)
    for _ in range(200):
        ids = torch.randint(0, groups, (rows,), generator=gen)
        counts = torch.bincount(ids, minlength=groups).tolist()
        assert sum(-(-c // tile) for c in counts) <= bound, counts
    # (n <= tile groups: n - 1 of tile + 1 rows and one of one row fill 2n - 1 tiles)
    n = min(groups, rows, tile)
    if n:
        assert k90.grouped_tiles((n - 1) * (tile + 1) + 1, n, tile) == 2 * n - 1


_GOOD_OFFSETS = torch.tensor([0, 2, 2, 5, 8], dtype=torch.int32)  # (E = 4 groups of 8 rows)


@pytest.mark.parametrize(
    "offsets",
    [
        _GOOD_OFFSETS.long(),
        _GOOD_OFFSETS.short(),
        _GOOD_OFFSETS.float(),
        _GOOD_OFFSETS[:4],
        torch.cat((_GOOD_OFFSETS, _GOOD_OFFSETS[-1:])),
        torch.stack((_GOOD_OFFSETS, _GOOD_OFFSETS), 1)[:, 0],
        _GOOD_OFFSETS.tolist(),
    ],
    ids=["int64", "int16", "float32", "E", "E+2", "strided", "list"],
)
def test_grouped_entry_refuses_offsets_the_kernel_cannot_read(offsets):
    """The grouped GEMM's kernel reads E + 1 contiguous int32 words at the offsets' address:
    any other dtype, length or layout is refused at the entry (it would read other numbers)."""
    a = torch.zeros(8, 64, dtype=torch.bfloat16)
    b, sfb = torch.zeros(4, 32, 32, dtype=torch.uint8), torch.zeros(4, 512, dtype=torch.uint8)
    alpha = torch.ones(4)
    want = r"offsets must be a contiguous int32 tensor \[E \+ 1\] = \[5\]"
    with pytest.raises(ValueError, match=want):
        r90.grouped_gemm_for_ops(a, b, sfb, 16, alpha, offsets, torch.bfloat16)
    with pytest.raises(Exception) as taken:  # (int32 ones pass it: then the CPU is refused)
        r90.grouped_gemm_for_ops(a, b, sfb, 16, alpha, _GOOD_OFFSETS, torch.bfloat16)
    assert "offsets" not in str(taken.value)


@pytest.mark.parametrize("rows, experts, tile, split", [(1, 16, (8, 128), 6), (37, 8, (16, 64), 2)])
def test_grouped_workspace_holds_every_routings_partials(rows, experts, tile, split):
    """The grouped split-K workspace: one fp32 partial per K split of every (token tile, row
    tile) that any routing of the rows can fill (grouped_tiles), then a counter per such tile,
    as the kernel's fix-up addresses them (tile among all groups' x row tiles + row tile)."""
    n = 200
    config = r90.GemmConfig(16, "BFloat16", "BFloat16", "decode", tile, split, grouped=True)
    gemm = config.kernel()
    cols, tile_rows = tile
    row_tiles = -(-n // tile_rows)
    tiles = k90.grouped_tiles(rows, experts, cols) * row_tiles
    assert r90.workspace_elems(gemm, rows, n, experts) == tiles * split * cols * tile_rows + tiles


def test_grouped_configuration_rules():
    """for_groups: the decode path without TMA stores; the grouped extents are M x N and M x K
    (not x L); W4A4, prefill and clusters are refused by name, in the launcher's reasons and by
    the kernel's constructor; alpha is one per group."""
    import dataclasses

    import torch

    config = r90.GemmConfig.for_groups(8, 384, 512, 32, num_sms=k90.H200_SM_COUNT)
    assert config.grouped and config.path == "decode" and config.split_k == 1
    assert not config.tma_store and config.reasons((8, 384, 512, 32)) == []
    big = (65536, 4096, 256, 256)  # (D: 2^28 elements; as a dense batch of 256: 2^36)
    assert config.reasons(big) == []
    assert any("M*N*L" in r for r in dataclasses.replace(config, grouped=False).reasons(big))
    for fields in (
        dict(a_dtype=k90.W4A4),
        dict(path="prefill", mma_tiler_mn=(128, 256)),
        dict(split_k=2, k_groups=1, cluster_shape_mn=(2, 1)),
    ):
        bad = dataclasses.replace(config, **fields)
        assert any("the grouped kernel runs W4A16" in r for r in bad.reasons((8, 384, 512, 32)))
        tiler, k_groups, cluster = bad.mma_tiler_mn, bad.k_groups, bad.cluster_shape_mn
        with pytest.raises(ValueError, match="the grouped kernel runs W4A16"):
            k90.BlockwiseGemmFp4Sm90(
                16, bad.path, tiler, cluster, bad.split_k, False, k_groups, bad.a_dtype, True
            )
    split = dataclasses.replace(config, split_k=3)
    assert split.reasons((8, 384, 512, 32)) == [] and split.kernel().split_k == 3
    a, b, sfb, _, alpha, _ = _grouped_cpu_operands([1, 0, 3, 4], 384, 512)
    out = torch.zeros(8, 384, dtype=torch.bfloat16)
    mnkl = (8, 384, 512, 4)
    shapes = r90.operand_reasons(a, b, None, sfb, alpha, out, mnkl, config)
    assert not [r for r in shapes if "shape" in r or "alpha" in r], shapes
    wrong = r90.operand_reasons(a, b, None, sfb, torch.ones(1), out, mnkl, config)
    assert any("float32 tensor of 4 (one per group)" in r for r in wrong), wrong


CONFIG_REFUSALS = [
    # (GemmConfig fields, a reason gemm must name): refused before anything is compiled
    (dict(path="decode", mma_tiler_mn=(24, 128), split_k=4), "MMA tile M (tokens)=24"),
    (dict(sf_vec_size=8), "sf_vec_size=8"),
    (dict(c_dtype="Float64"), "c_dtype=Float64"),
    (
        dict(path="decode", mma_tiler_mn=(16, 128), split_k=3, cluster_shape_mn=(2, 1)),
        "on decode with split_k=2",
    ),
    (dict(path="decode", mma_tiler_mn=(16, 128), split_k=0), "split_k=0"),
    (dict(path="sideways", mma_tiler_mn=(16, 128)), "path=sideways"),
]


@pytest.mark.parametrize("fields, needle", CONFIG_REFUSALS, ids=[r[1] for r in CONFIG_REFUSALS])
def test_gemm_refuses_bad_config(fields, needle):
    config = r90.GemmConfig(**fields)
    with pytest.raises(ValueError, match=re.escape(needle)):
        r90.gemm(**_cpu_operands(16, 64, 256, 1), config=config)


def test_gemm_refuses_bad_problem():
    """``gemm`` checks each problem (``problem_reasons``) with its operands."""
    config = r90.GemmConfig(16, "BFloat16", path="decode", mma_tiler_mn=(8, 64))
    with pytest.raises(ValueError, match="K=48 is not a multiple of 32"):
        r90.gemm(**_cpu_operands(1, 64, 48, 1), config=config)
    with pytest.raises(ValueError, match="M must be >= 1, got 0"):
        r90.gemm(**_cpu_operands(0, 64, 64, 1), config=config)


def test_gemm_checks_a_configuration_once_per_problem(monkeypatch):
    """``GemmConfig.reasons`` runs at the first call of a (configuration, problem) only; a
    configuration it refuses is checked again at every call."""
    checked = []
    reasons = r90.GemmConfig.reasons

    def counted(self, mnkl):
        checked.append((self.split_k, mnkl[0]))
        return reasons(self, mnkl)

    monkeypatch.setattr(r90.GemmConfig, "reasons", counted)
    config = r90.GemmConfig(32, "Float16", path="decode", mma_tiler_mn=(32, 64), split_k=3)
    bad = r90.GemmConfig(32, "Float16", path="decode", mma_tiler_mn=(32, 64), split_k=17)
    for m in (7, 7, 9, 7, 9):
        operands = _cpu_operands(m, 40, 96, 3, 32, out="float16")
        assert _refusal(config, **operands) == _cuda_refusals("a", "b", "sfa", "sfb", "out")
        assert "split_k=17" in _refusal(bad, **operands)
    assert checked == [(3, 7), (17, 7), (17, 7), (3, 9), (17, 9), (17, 7), (17, 9)]


@pytest.mark.parametrize(
    "n, c_dtype, fits",
    [
        (520, "BFloat16", True),
        (129, "Float16", False),
        (300, "Float32", True),
        (777, "Float32", False),
        (8, "BFloat16", True),
        (300, "Float16", False),
    ],
)
def test_tma_store_needs_16_byte_row_pitch(n, c_dtype, fits):
    assert k90.tma_store_fits(n, c_dtype) == fits


# ------------------------------------------------------------------------------ CPU: refusals
GOOD = dict(
    mnkl=(256, 512, 1024, 1),
    sf_vec_size=16,
    sf_dtype="Float8E4M3FN",
    c_dtype="BFloat16",
    path="prefill",
    mma_tiler_mn=(128, 256),
    cluster_shape_mn=(1, 1),
    split_k=1,
)
REFUSALS = [
    (dict(mnkl=(256, 512, 1000, 1)), "K=1000 is not a multiple of 32"),
    (dict(mnkl=(0, 512, 1024, 1)), "M must be >= 1, got 0"),
    (dict(mnkl=(256, 512, 1024, 0)), "L must be >= 1, got 0"),
    (dict(mnkl=(256, 512, 1024)), "mnkl must be four integers"),
    (dict(sf_vec_size=8), "sf_vec_size=8 is not supported"),
    (dict(sf_dtype="Float8E8M0FNU"), "does not pair with sf_vec_size=16"),
    (dict(sf_dtype="Float8E5M2"), "sf_dtype=Float8E5M2 is not a scale-factor type"),
    (dict(c_dtype="Float8E4M3FN"), "c_dtype=Float8E4M3FN is not supported"),
    (dict(path="sideways"), "path=sideways is not supported"),
    (dict(mma_tiler_mn=(256, 256)), "MMA tile M=256"),
    (dict(mma_tiler_mn=(128, 96)), "MMA tile N=96"),
    (dict(path="decode", mma_tiler_mn=(16, 256)), "MMA tile N (weight rows)=256"),
    (dict(path="decode", mma_tiler_mn=(24, 128)), "MMA tile M (tokens)=24"),
    (dict(cluster_shape_mn=(1, 2)), "takes (1, 1)"),
    (dict(path="decode", mma_tiler_mn=(16, 128), cluster_shape_mn=(2, 1)), "on the prefill path"),
    (
        dict(path="decode", mma_tiler_mn=(8, 64), cluster_shape_mn=(2, 1), split_k=2, k_groups=2),
        "with split_k=2 and no K groups",
    ),
    (dict(split_k=0), "split_k=0 is not supported"),
    (dict(split_k=3), "split-K needs tiles of at most 128 x 128"),
    (dict(k_groups=2), "K groups (2..4) run on the decode path"),
    (dict(path="decode", mma_tiler_mn=(64, 64), k_groups=4), "with tiles of at most 32 tokens"),
    (dict(path="decode", mma_tiler_mn=(8, 128), k_groups=3), "at most 4 consumer warpgroups"),
    (dict(path="decode", mma_tiler_mn=(8, 64), k_groups=5), "K groups (2..4)"),
    (dict(mnkl=(65536, 32768, 256, 1)), "M*N*L = 2147483648 elements does not fit"),
    (dict(mnkl=(65536, 512, 65536, 1)), "M*K/2*L = 2147483648 elements does not fit"),
    (dict(mnkl=(256, 32768, 65536, 2)), "N*K/2*L = 2147483648 elements does not fit"),
    (
        dict(mnkl=(32768, 8192, 65536, 1)),
        "M*K_pad*L (converted A) = 2147483648 elements does not fit",
    ),
    (
        dict(mnkl=(256, 65536, 32736, 1)),
        "N*K_pad*L (converted B) = 2147483648 elements does not fit",
    ),
    (dict(mnkl=(1, 64, 65536, 4096), path="decode", mma_tiler_mn=(8, 64)), "SFA blocked bytes"),
    # decode: the tokens' copy is padded to whole token tiles (100 x 2^20 x 16 alone would fit)
    (
        dict(mnkl=(100, 64, 2**20, 16), path="decode", mma_tiler_mn=(128, 128)),
        "M_pad*K_pad*L (converted A, M_pad = 128) = 2147483648 elements does not fit",
    ),
    # (padded to the 128-token tile, not to its 64 weight rows: 960 x 2^21 alone would fit)
    (
        dict(mnkl=(960, 64, 2**21, 1), path="decode", mma_tiler_mn=(128, 64)),
        "M_pad*K_pad*L (converted A, M_pad = 1024) = 2147483648 elements does not fit",
    ),
]


def test_kernel_refuses_bad_k_groups():
    # (compile_gemm builds the kernel object first: a clear error, not a failed compile or
    # launch)
    with pytest.raises(ValueError, match="at most 4 consumer warpgroups"):
        k90.BlockwiseGemmFp4Sm90(16, "decode", (8, 128), k_groups=4)
    with pytest.raises(ValueError, match="run on the decode path"):
        k90.BlockwiseGemmFp4Sm90(16, "prefill", (128, 256), k_groups=2)


@pytest.mark.parametrize(
    "split_k, k_groups, cluster",
    [(1, 1, (2, 1)), (3, 1, (2, 1)), (2, 2, (2, 1)), (2, 1, (1, 2)), (2, 1, (4, 1))],
)
def test_kernel_refuses_clusters_other_than_a_split_pair_on_decode(split_k, k_groups, cluster):
    """A decode 2x1 cluster is a tile's two K splits: any other split, K groups or cluster
    shape is refused by the kernel object itself (``compile_gemm`` builds it first), not only
    by ``config_reasons``."""
    tiler = (8, 64) if k_groups > 1 else (128, 128)
    with pytest.raises(ValueError, match=r"cluster shape \("):
        k90.BlockwiseGemmFp4Sm90(16, "decode", tiler, cluster, split_k, k_groups=k_groups)
    assert k90.BlockwiseGemmFp4Sm90(16, "decode", (128, 128), (2, 1), 2).split_cluster


def test_can_implement_accepts_good_config():
    ok, reasons = k90.BlockwiseGemmFp4Sm90.can_implement(**GOOD)
    assert ok and not reasons


@pytest.mark.parametrize("change,needle", REFUSALS, ids=[r[1] for r in REFUSALS])
def test_can_implement_refuses(change, needle):
    ok, reasons = k90.BlockwiseGemmFp4Sm90.can_implement(**{**GOOD, **change})
    assert not ok
    assert any(needle in r for r in reasons), reasons


def test_alpha_reason():
    assert k90.alpha_reason(0.5, 16) is None and k90.alpha_reason(-3e33, 16) is None
    # MXFP4, and NVFP4 on prefill (BF16 operands), do not rescale alpha
    assert k90.alpha_reason(1e38, 32) is None and k90.alpha_reason(1e38, 16, "prefill") is None
    assert "2^114" in k90.alpha_reason(-(2.0**114), 16)
    # 2^114 - 2^80 rounds to 2^114 in fp32, whose * 2^14 overflows
    assert "2^114" in k90.alpha_reason(2.0**114 - 2.0**80, 16, "decode")
    assert "finite fp32" in k90.alpha_reason(float("inf"), 32)
    assert "finite fp32" in k90.alpha_reason(1e39, 32)


# ------------------------------------------------------------------------------ CPU: conversions
# The kernel's own conversion helpers run on the CPU: DSL integers evaluate eagerly there, and
# the one inline-PTX entry point (``_ptx``) is replaced by models of the four instructions the
# helpers emit, written from the PTX ISA's definitions.  Every value is checked against
# ``reference.dequantize_fp4``.
def _f16_bits(value: float) -> int:
    import numpy as np

    return int(np.array([value], dtype=np.float16).view(np.uint16)[0])


def _f16_value(bits: int) -> float:
    import numpy as np

    return float(np.array([bits & 0xFFFF], dtype=np.uint16).view(np.float16)[0])


def _bf16_value(bits: int) -> float:
    import numpy as np

    return float(np.array([(bits & 0xFFFF) << 16], dtype=np.uint32).view(np.float32)[0])


def _bf16_bits(value: float) -> int:
    """Round to nearest even BF16 (a product of two BF16 values is exact in fp32 wherever
    the rounding to BF16 matters)."""
    import numpy as np

    if math.isnan(value):
        return 0x7FFF
    with np.errstate(over="ignore"):
        u = int(np.array([value], dtype=np.float32).view(np.uint32)[0])
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def _e4m3_value(byte: int) -> float:
    """E4M3 (OCP FP8): sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, mant = (byte >> 3) & 0xF, byte & 7
    if exp == 15 and mant == 7:
        return math.nan
    if exp == 0:
        return sign * mant * 2.0**-9
    return sign * (1 + mant / 8) * 2.0 ** (exp - 7)


def _prmt(a: int, b: int, selector: int) -> int:
    """``prmt.b32`` (default mode): selector nibble i picks byte (sel & 7) of {b, a} (a: bytes
    0-3) for result byte i; bit 3 of the nibble replicates that byte's sign bit instead."""
    pool = (b << 32) | a
    out = 0
    for i in range(4):
        nib = (selector >> (4 * i)) & 0xF
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lanes(a: int, b: int, to_value, to_bits) -> int:
    """A lane-wise ``.f16x2`` / ``.bf16x2`` multiply, rounded to nearest even."""
    lo = to_bits(to_value(a) * to_value(b))
    hi = to_bits(to_value(a >> 16) * to_value(b >> 16))
    return (hi << 16) | lo


def ptx_model(result, operands, asm, constraints, **_):
    """Stand-in for the kernel's ``_ptx``: evaluates the instruction on Python integers."""
    args = [int(dtype(v).value) & 0xFFFFFFFF for dtype, v in operands]
    if asm.startswith("prmt.b32 "):
        fields = [f.strip() for f in asm[len("prmt.b32 ") :].rstrip(";").split(",")]
        a, b, c = (args[int(f[1:]) - 1] if f.startswith("$") else int(f, 0) for f in fields[1:])
        return result(_prmt(a, b, c))
    if "cvt.rn.bf16x2.f32" in asm:
        # one F16 half of an F16x2 -> F32, times the fp32 immediate, -> BF16 in both halves
        half = re.search(r"cvt\.f32\.f16 f, (lo|hi);", asm).group(1)
        assert "mov.b32 {lo, hi}, $1" in asm, asm
        imm = struct.unpack(">f", bytes.fromhex(re.search(r"0f([0-9A-F]{8})", asm).group(1)))[0]
        h = args[0] >> 16 if half == "hi" else args[0] & 0xFFFF
        bits = _bf16_bits(_f16_value(h) * imm)
        return result((bits << 16) | bits)
    if "cvt.rn.f16x2.e4m3x2" in asm:
        assert "cvt.u16.u32 t, $1" in asm, asm
        t = args[0] & 0xFFFF  # cvt.u16.u32 keeps the low 16 bits
        hi, lo = (_f16_bits(_e4m3_value(x)) for x in (t >> 8, t & 0xFF))
        return result((hi << 16) | lo)
    if asm.startswith("mul.rn.f16x2 "):
        return result(_lanes(*args, _f16_value, _f16_bits))
    if asm.startswith("mul.rn.bf16x2 "):
        return result(_lanes(*args, _bf16_value, _bf16_bits))
    raise AssertionError(f"no CPU model of {asm!r}")


@pytest.fixture
def ptx_models(monkeypatch):
    import warnings

    monkeypatch.setattr(dq, "_ptx", ptx_model)
    with warnings.catch_warnings():
        # eager DSL integers warn when a shift drops high bits, as the 32-bit PTX ops do
        warnings.simplefilter("ignore")
        yield


# (sf_vec_size, F16 operands?, where): the three conversions of the kernel
CONVERSIONS = [(16, True, "decode"), (32, False, "decode"), (16, False, "prefill")]


def _accepted_scale_bytes(vec: int) -> list[int]:
    """The scale bytes reference.dequantize_fp4 decodes to finite values (unsigned E4M3; E8M0
    but the NaN byte 255); the NaN bytes have their own test."""
    return list(range(0x7F)) if vec == 16 else list(range(255))


def _unscale(f16: bool) -> float:
    """F16 operands carry 2^-7 each, undone by alpha * NVFP4_ACC_SCALE."""
    return math.sqrt(k90.NVFP4_ACC_SCALE) if f16 else 1.0


def _word(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], "little")


def _weights_kblock(packed_row: bytes, sf_stage: bytes, row: int, j: int, vec: int, small=False):
    """Decode path: the A operand of k-block j of one weight row as wgmma reads it, made by
    ``_load_a``'s addresses and ``_dequant_a``'s conversion (``_dequant_rows``; ``small``: the
    branch of MXFP4 stages whose scales are all <= 1): list of (K column of the k-block, half
    bits).  ``sf_stage`` holds the k-tile's scale atoms of the row's row block (the TMA box)."""
    from cutlass.cutlass_dsl import Uint32, Uint64

    gemm = k90.BlockwiseGemmFp4Sm90(vec, "decode", (16, 128))
    atoms_k = k90.K_TILE // vec // k90.SF_ATOM_COLS
    out = []
    for q in range(4):  # lane % 4: the thread's 16-group of the k-block
        byte = j * (k90.K_BLOCK // 2) + q * 8
        packed = int.from_bytes(packed_row[byte : byte + 8], "little")
        sf = sf_stage[k90.blocked_sf_byte(row, k90.scale_column(j, q, vec), atoms_k)]
        out += _fragment_halves(gemm, (Uint64(packed), Uint32(sf)), j, q, small)
    return out


def _fragment_halves(gemm, row_bytes: tuple, j: int, q: int, small: bool) -> list:
    """``_dequant_rows`` of one thread (lane q of its quad) whose rows hold ``row_bytes`` =
    (packed, scales) and all-zero codes under the same scales, then the other way round (each
    row must come from its own bytes): [(K column of k-block j, half bits)] of the first row."""
    from cutlass.cutlass_dsl import Uint64

    zeros = (Uint64(0), row_bytes[1])
    frags = []
    for rows in ([row_bytes, zeros], [zeros, row_bytes]):
        frag = [None] * 16
        gemm._dequant_rows(frag, rows, j, q, small)
        frags.append([int(word.value) for word in frag])
    assert frags[0][0::2] == frags[1][1::2] and frags[0][1::2] == frags[1][0::2], (
        "a row read the other's bytes"
    )
    halves = []
    for x in range(0, 16, 2):
        # PTX ISA, wgmma A fragment in registers: word x holds row lane / 4 + 8 (x % 2), K
        # columns 2 (lane % 4) + 8 (x / 2 % 2) + 16 (x / 4) and + 1 (the first row: x even)
        col = 16 * (x // 4) + 8 * (x // 2 % 2) + 2 * q
        halves += [(col, frags[0][x] & 0xFFFF), (col + 1, frags[0][x] >> 16)]
    return halves


def _tokens_kblock(
    packed_row: bytes, blocked: bytes, row: int, kb: int, vec, f16, keep=None, prepacked=False
):
    """``convert_operands``'s copy of k-block kb of one operand row, made by its helpers
    (``token_chunk_layout``, ``blocked_sf_word``, ``_convert_chunk_words``; ``prepacked``: W4A16
    weights, each chunk under its pair's scale): list of (K column of the k-block, half bits);
    the copy is K-major, so element e is wgmma K column e."""
    from cutlass.cutlass_dsl import Uint32

    atoms_k = (len(packed_row) * 2 // vec + 3) // 4
    row_blocks = len(blocked) // (atoms_k * k90.SF_ATOM_BYTES)
    col0 = kb * (k90.K_BLOCK // vec)
    sf4 = _word(blocked, k90.blocked_sf_word(0, row, col0, row_blocks, atoms_k))
    keep = 0xFFFFFFFF if keep is None else keep
    out = []
    for chunk in range(k90.CHUNKS_PER_KBLOCK):
        word_off, shift, dst_off = dq.token_chunk_layout(chunk)
        base = kb * (k90.K_BLOCK // 2) + word_off
        words = [Uint32(_word(packed_row, base + 8 * q)) for q in range(4)]
        pair = Uint32(chunk) if prepacked else None
        halves = dq.convert_chunk_words(
            words, Uint32(sf4), Uint32(keep), col0, Uint32(shift), vec, f16, pair
        )
        for q, pair in enumerate(halves):
            # st.global.v4.b32 at byte dst_off: word q = elements dst_off / 2 + 2q, + 1
            elem = dst_off // 2 + 2 * q
            bits = int(pair.value)
            out += [(elem, bits & 0xFFFF), (elem + 1, bits >> 16)]
    return out


def _operand(rows: int, vec: int, scale_bytes: list[int], seed: int):
    """Packed FP4 [rows, K_TILE / 2] (every code in every 16-group), scales [rows, K_TILE / vec]
    (row r's scale column c = scale_bytes[(r + 37 c) % len]) as bytes and as the format's scale
    dtype, their blocked form."""
    import torch

    import reference

    k = k90.K_TILE
    gen = torch.Generator().manual_seed(seed)
    codes = torch.stack([torch.randperm(16, generator=gen) for _ in range(rows * k // 16)])
    codes = codes.to(torch.uint8).reshape(rows, k)
    idx = (torch.arange(rows)[:, None] + 37 * torch.arange(k // vec)[None, :]) % len(scale_bytes)
    sf = torch.tensor(scale_bytes, dtype=torch.uint8)[idx]
    scales = sf.view(reference.SCALE_DTYPES[vec])
    packed = reference.pack_fp4(codes)
    return packed, scales, bytes(reference.to_blocked(sf).numpy().tobytes())


def _scale_stage(blocked: bytes, row: int, vec: int) -> bytes:
    """The TMA box of ``row``'s k-tile of scales: its row block's atoms (a one-k-tile operand:
    all of them)."""
    atom_block = k90.K_TILE // vec // k90.SF_ATOM_COLS * k90.SF_ATOM_BYTES
    rb = row // k90.SF_ATOM_ROWS
    return blocked[rb * atom_block : (rb + 1) * atom_block]


def _as_values(halves, f16: bool) -> dict:
    decode = _f16_value if f16 else _bf16_value
    return {col: decode(bits) * _unscale(f16) for col, bits in halves}


def _k_orders(vec: int, f16: bool, path: str) -> tuple[list, list]:
    """The wgmma K column of each K value of a k-block, for the weights (A registers, decode)
    and the converted copy: one-hot rows through the kernel's helpers (code 1.0, scale 1.0)."""
    import torch

    import reference

    one = 0x38 if vec == 16 else 0x7F  # 1.0 in E4M3 / E8M0
    k = k90.K_TILE
    weights, tokens = [], []
    for pos in range(k90.K_BLOCK):
        codes = [0] * k
        codes[pos] = 2  # e2m1 1.0
        packed = bytes(reference.pack_fp4(torch.tensor([codes], dtype=torch.uint8))[0].numpy())
        sf = torch.full((1, k // vec), one, dtype=torch.uint8)
        blocked = bytes(reference.to_blocked(sf).numpy().tobytes())
        for order, halves in (
            (weights, _weights_kblock(packed, blocked, 0, 0, vec) if path == "decode" else []),
            (tokens, _tokens_kblock(packed, blocked, 0, 0, vec, f16)),
        ):
            if not halves:
                continue
            values = _as_values(halves, f16)
            hot = [col for col, v in values.items() if v != 0]
            assert len(hot) == 1 and values[hot[0]] == 1.0, (pos, values)
            order.append(hot[0])
    return weights, tokens


@pytest.mark.parametrize(
    "vec, f16, path", CONVERSIONS, ids=["nvfp4-f16", "mxfp4-bf16", "nvfp4-bf16"]
)
def test_k_permutation_same_for_weights_and_tokens(vec, f16, path, ptx_models):
    """K value p of a k-block lands in the same wgmma K column in the weights' A registers
    (``_fp4x16_to_mma`` + ``a_fragment_word``, placed by the PTX ISA's fragment layout) and in
    the converted tokens (``token_chunk_layout`` + ``_convert_chunk_words``): the dot products
    are unchanged; each order is a permutation of the 64 columns."""
    weights, tokens = _k_orders(vec, f16, path)
    assert sorted(tokens) == list(range(k90.K_BLOCK)), tokens
    if path == "decode":
        assert weights == tokens


@pytest.mark.parametrize(
    "vec, f16, path", CONVERSIONS, ids=["nvfp4-f16", "mxfp4-bf16", "nvfp4-bf16"]
)
def test_conversion_helpers_match_reference(vec, f16, path, ptx_models):
    """Every e2m1 code times every scale byte the reference accepts, through the kernel's own
    helpers (``_scale_factor``, ``_fp4x16_to_mma``, ``_convert_chunk_words``, the E4M3 -> BF16
    scales of ``e4m3_byte_to_bf16x2``), equals ``reference.dequantize_fp4`` exactly (F16
    operands times 2^7 = sqrt(NVFP4_ACC_SCALE)), in the K order of
    ``test_k_permutation_same_for_weights_and_tokens``; both k-blocks of a k-tile, two row
    blocks of scales."""
    import reference

    accepted = _accepted_scale_bytes(vec)
    weights_order, tokens_order = _k_orders(vec, f16, path)
    packed, scales, blocked = _operand(len(accepted), vec, accepted, seed=vec)
    ref = reference.dequantize_fp4(packed, scales, vec)
    for row in range(len(accepted)):
        row_bytes = bytes(packed[row].numpy())
        stage = _scale_stage(blocked, row, vec)
        for kb in range(k90.K_TILE // k90.K_BLOCK):
            want = [float(x) for x in ref[row, kb * k90.K_BLOCK : (kb + 1) * k90.K_BLOCK]]
            got = _as_values(_tokens_kblock(row_bytes, blocked, row, kb, vec, f16), f16)
            assert [got[tokens_order[p]] for p in range(k90.K_BLOCK)] == want, (row, kb)
            if path == "decode":
                halves = _weights_kblock(row_bytes, stage, row % k90.SF_ATOM_ROWS, kb, vec)
                got = _as_values(halves, f16)
                assert [got[weights_order[p]] for p in range(k90.K_BLOCK)] == want, (row, kb)


@pytest.mark.parametrize(
    "vec, f16, path", CONVERSIONS, ids=["nvfp4-f16", "mxfp4-bf16", "nvfp4-bf16"]
)
def test_conversion_helpers_nan_scales_and_tail(vec, f16, path, ptx_models):
    """The NaN scale byte (E4M3 0x7f; E8M0 255, documented to read as +inf) gives no finite
    value (NVFP4: NaN only), through both conversions; ``keep`` = 0 (the tail of K = 32 x odd)
    zeroes groups 2, 3 of the copy whatever their bytes hold."""
    nan_byte = 0x7F if vec == 16 else 0xFF
    # (reference.dequantize_fp4 refuses NaN scales: the kernel's helpers are checked alone)
    packed, _, blocked = _operand(1, vec, [nan_byte], seed=1)
    row_bytes = bytes(packed[0].numpy())
    decode = _f16_value if f16 else _bf16_value
    halves = _tokens_kblock(row_bytes, blocked, 0, 0, vec, f16)
    if path == "decode":
        halves += _weights_kblock(row_bytes, blocked, 0, 0, vec)
    values = [decode(bits) for _, bits in halves]
    assert not any(math.isfinite(v) for v in values)
    if vec == 16:
        assert all(math.isnan(v) for v in values)
    tail = _tokens_kblock(row_bytes, blocked, 0, 0, vec, f16, keep=0)
    for elem, bits in tail:
        # chunk c's word q holds group q: groups 2, 3 (the missing K 32..63) must be +0
        if elem % 8 >= 4:
            assert bits == 0, (elem, hex(bits))


# (sf_vec_size, F16 activations?): the W4A16 weight conversions (MXFP4 needs BF16)
W4A16_CONVERSIONS = [(16, False), (16, True), (32, False)]
W4A16_IDS = ["nvfp4-bf16", "nvfp4-f16", "mxfp4-bf16"]


def _w4a16_decode_kblock(gemm, prepacked_row, sf_stage, row, j, monkeypatch, small=False) -> dict:
    """Decode W4A16: k-block j of one prepacked weight row as the wgmma A fragment holds it,
    made by ``_load_a``'s addresses and ``_dequant_a``'s conversion (``_dequant_rows``;
    ``small``: MXFP4 stages whose scales are all <= 1): {K column: value}, times the kernel's
    ``acc_scale`` (F16: 2^7, NVFP4 BF16: 2^8), as the epilogue applies it."""
    from cutlass.cutlass_dsl import Uint32, Uint64

    vec, f16 = gemm.sf_vec_size, gemm.f16
    atoms_k = k90.K_TILE // vec // k90.SF_ATOM_COLS
    col0 = j * k90.K_BLOCK // vec // k90.SF_ATOM_COLS * k90.SF_ATOM_COLS
    sf_word = Uint32(_word(sf_stage, k90.blocked_sf_byte(row, col0, atoms_k)))

    def fragment(q):
        byte = j * (k90.K_BLOCK // 2) + q * 8
        packed = Uint64(int.from_bytes(prepacked_row[byte : byte + 8], "little"))
        return _fragment_halves(gemm, (packed, sf_word), j, q, small)

    if vec == 16:
        # NVFP4: lane q of a quad converts scale q of the row's word and shfl.sync (segments of
        # 4 lanes, the kernel's QUAD_SHUFFLE) hands lane b's to every lane of the quad: a first
        # pass records each lane's own value, the second serves lane b's at offset b
        owns, recording = {}, [True]

        def quad_shuffle(value, offset, mask_and_clamp):
            assert mask_and_clamp == ((32 - 4) << 8) | 3
            if recording[0]:
                owns[lane] = int(value.value)
                return value
            return Uint32(owns[offset])

        monkeypatch.setattr(k90.cute.arch, "shuffle_sync", quad_shuffle)
        for lane in range(4):
            fragment(lane)
        recording[0] = False
    halves = [half for q in range(4) for half in fragment(q)]
    decode = _f16_value if f16 else _bf16_value
    return {col: decode(bits) * gemm.acc_scale for col, bits in halves}


@pytest.mark.parametrize("vec, f16", W4A16_CONVERSIONS, ids=W4A16_IDS)
def test_w4a16_prepacked_weights_dequantize_in_plain_k_order(vec, f16, ptx_models, monkeypatch):
    """W4A16: weights through ``prepack_weights`` and the kernel's own dequantization (decode:
    the A fragment; prefill: ``convert_operands``' copy) give, at wgmma K column c of each
    k-block, ``reference.dequantize_fp4`` of K value c: every code, every accepted scale byte,
    a different scale in every column, so a wrong scale column or K permutation shows."""
    import reference

    accepted = _accepted_scale_bytes(vec)
    packed, scales, blocked = _operand(len(accepted), vec, accepted, seed=vec + f16)
    ref = reference.dequantize_fp4(packed, scales, vec)
    prepacked = k_order.prepack_weights(packed)
    a_dtype = "Float16" if f16 else "BFloat16"
    gemm = k90.BlockwiseGemmFp4Sm90(vec, "decode", (16, 128), a_dtype=a_dtype)
    assert gemm.f16 == f16
    for row in range(len(accepted)):
        row_bytes = bytes(prepacked[row].numpy())
        stage = _scale_stage(blocked, row, vec)
        for kb in range(k90.K_TILE // k90.K_BLOCK):
            want = [float(x) for x in ref[row, kb * k90.K_BLOCK : (kb + 1) * k90.K_BLOCK]]
            got = _w4a16_decode_kblock(
                gemm, row_bytes, stage, row % k90.SF_ATOM_ROWS, kb, monkeypatch
            )
            assert [got[c] for c in range(k90.K_BLOCK)] == want, ("decode", row, kb)
            halves = _tokens_kblock(row_bytes, blocked, row, kb, vec, f16, prepacked=True)
            got = _as_values(halves, f16)  # (the prefill copy of F16 weights carries 2^-7)
            assert [got[c] for c in range(k90.K_BLOCK)] == want, ("prefill", row, kb)


@pytest.mark.parametrize("a_dtype", [k90.W4A4, "BFloat16"])
def test_small_e8m0_scales_convert_exactly(a_dtype, ptx_models, monkeypatch):
    """MXFP4 on decode, stages whose scales are all <= 1 (E8M0 bytes 0..127): one multiply by
    ``e8m0_prescaled_factor`` per pair gives ``reference.dequantize_fp4`` exactly, every code
    times every such byte (subnormal products included), W4A4 and W4A16 weights."""
    import reference

    small = list(range(128))
    packed, scales, blocked = _operand(len(small), 32, small, seed=5)
    ref = reference.dequantize_fp4(packed, scales, 32)
    weights = packed if a_dtype == k90.W4A4 else k_order.prepack_weights(packed)
    gemm = k90.BlockwiseGemmFp4Sm90(32, "decode", (16, 128), a_dtype=a_dtype)
    order = _k_orders(32, False, "decode")[0] if a_dtype == k90.W4A4 else list(range(64))
    for row in range(len(small)):
        row_bytes, stage = bytes(weights[row].numpy()), _scale_stage(blocked, row, 32)
        for kb in range(k90.K_TILE // k90.K_BLOCK):
            want = [float(x) for x in ref[row, kb * k90.K_BLOCK : (kb + 1) * k90.K_BLOCK]]
            at = (row_bytes, stage, row % k90.SF_ATOM_ROWS, kb)
            if a_dtype == k90.W4A4:
                got = _as_values(_weights_kblock(*at, 32, small=True), False)
            else:
                got = _w4a16_decode_kblock(gemm, *at, monkeypatch, small=True)
            assert [got[order[p]] for p in range(k90.K_BLOCK)] == want, (row, kb)


@pytest.mark.parametrize("a_dtype", [k90.W4A4, "BFloat16"])
def test_small_e8m0_scales_predicate(a_dtype, monkeypatch):
    """``_small_scales``: true only where every scale byte of the thread's stage (W4A4: one per
    row and k-block; W4A16: a word of four) is <= 127; the warp vote sees each thread's."""
    from cutlass.cutlass_dsl import Uint32, Uint64

    votes = []
    monkeypatch.setattr(k90.cute.arch, "vote_all_sync", lambda pred: votes.append(pred) or pred)
    gemm = k90.BlockwiseGemmFp4Sm90(32, "decode", (16, 128), a_dtype=a_dtype)
    width = 1 if a_dtype == k90.W4A4 else 4
    for value in (0, 127, 0x7F7F7F7F, 128, 255, 0x80 << 24, 0x00800000, 0x7F7F7FFF):
        value &= (1 << 8 * width) - 1
        for at in range(4):
            sfs = [Uint32(0x7F)] * 4
            sfs[at] = Uint32(value)
            stage = [
                [(Uint64(0), sfs[0]), (Uint64(0), sfs[1])],
                [(Uint64(0), sfs[2]), (Uint64(0), sfs[3])],
            ]
            want = all(b <= 127 for b in value.to_bytes(width, "little"))
            assert bool(gemm._small_scales(stage)) == want, (hex(value), at)
    assert len(votes) == 8 * 4


@pytest.mark.parametrize("k", [32, 64, 96, 160, 256])
def test_prepack_weights_keeps_each_k_blocks_bits(k):
    """``prepack_weights`` keeps every bit of a 64-wide k-block inside it (zeros pad K to
    64; ``PAIR_BITS`` places each of a word's 32 bits once), ``unprepack_weights`` restores
    the bytes, on [L, N, K/2] and [N, K/2] uint8 and
    float4_e2m1fn_x2 data."""
    import torch

    gen = torch.Generator().manual_seed(k)
    b = torch.randint(0, 256, (2, 5, k // 2), dtype=torch.uint8, generator=gen)
    prepacked = k_order.prepack_weights(b)
    k_pad = -(-k // 64) * 64
    assert prepacked.shape == (2, 5, k_pad // 2) and prepacked.dtype == torch.uint8
    assert torch.equal(k_order.unprepack_weights(prepacked, k), b)
    assert torch.equal(k_order.prepack_weights(b[0]), prepacked[0])
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert torch.equal(k_order.prepack_weights(b.view(torch.float4_e2m1fn_x2)), prepacked)
    bits = [torch.nn.functional.pad(b, (0, (k_pad - k) // 2)), prepacked]
    bits = [(x[..., None] >> torch.arange(8)) & 1 for x in bits]
    for kb in range(k_pad // 64):
        block = slice(32 * kb, 32 * kb + 32)
        ones = [x[..., block, :].sum((-2, -1)) for x in bits]
        assert torch.equal(ones[0], ones[1]), kb
    placed = [bit for pair in k_order.PAIR_BITS for lane in pair for bit in lane]
    assert sorted(placed) == list(range(32))
    assert sorted(k_order.prepacked_k_order()) == list(range(64))
    assert k_order.prepacked_k_order() != list(range(64))
    # (every K whose rows would be wider or narrower: none is cut or padded silently)
    for wrong in (k_pad - 64, k_pad + 32, k_pad + 64):
        if wrong > 0:
            with pytest.raises(ValueError, match="prepacked rows hold"):
                k_order.unprepack_weights(prepacked, wrong)
    with pytest.raises(ValueError, match="prepacked rows hold"):
        k_order.unprepack_weights(prepacked[..., :-2], k)
    # more rows than one pass takes, and none
    for extra in (1, 3):  # (one row past a pass, and more)
        tall = torch.randint(0, 256, (k_order.PREPACK_ROWS + extra, k // 2), dtype=torch.uint8)
        assert torch.equal(k_order.unprepack_weights(k_order.prepack_weights(tall), k), tall)
    empty = k_order.prepack_weights(tall[:0])
    assert empty.shape == (0, k_pad // 2)
    assert k_order.unprepack_weights(empty, k).shape == (0, k // 2)


class _StrictUint32(int):
    """A 32-bit unsigned integer whose shifts must stay below 32 (a PTX / LLVM shift by 32 or
    more is undefined, where Python's is not)."""

    def __new__(cls, value):
        return int.__new__(cls, int(value) & 0xFFFFFFFF)

    def _shift(self, amount, op):
        assert 0 <= int(amount) < 32, f"shift by {int(amount)}"
        return _StrictUint32(op(int(self), int(amount)))

    def __lshift__(self, amount):
        return self._shift(amount, int.__lshift__)

    def __rshift__(self, amount):
        return self._shift(amount, int.__rshift__)


def _wrapping(op: str):
    """int's ``op`` on two operands, the result wrapped to 32 bits."""
    return lambda a, b: _StrictUint32(getattr(int, op)(int(a), int(b)))


for _name in ("and", "or", "xor", "mul", "add", "sub", "mod"):
    setattr(_StrictUint32, f"__{_name}__", _wrapping(f"__{_name}__"))
    setattr(_StrictUint32, f"__r{_name}__", _wrapping(f"__r{_name}__"))


def test_prepacked_pair_pick_at_run_time_shifts_below_32(monkeypatch):
    """``prepacked_pair_bits_at`` (the prefill conversion's pair, known at run time) equals the
    compile-time ``prepacked_pair_bits`` for every pair, with no shift by 32 or more."""
    import random

    monkeypatch.setattr(dq, "Uint32", _StrictUint32)
    rng = random.Random(3)
    for word in [0, 0xFFFFFFFF, 0x80000001] + [rng.getrandbits(32) for _ in range(200)]:
        for p in range(4):
            word32 = _StrictUint32(word)
            want = dq.prepacked_pair_bits(word32, p)
            assert dq.prepacked_pair_bits_at(word32, _StrictUint32(p)) == want, (hex(word), p)


def test_blocked_scale_offsets_match_to_blocked():
    """``blocked_sf_byte`` (decode: a k-tile's atoms in SMEM) and ``blocked_sf_word``
    (``convert_operands``: batches, row blocks, the aligned word of 4 columns) against
    ``reference.to_blocked``, with ``scale_column``'s column of each (k-block, 16-group)."""
    import torch

    import reference

    gen = torch.Generator().manual_seed(5)
    l, rows, cols = 3, 300, 11  # noqa: E741
    sf = torch.randint(0, 256, (l, rows, cols), generator=gen, dtype=torch.uint8)
    blocked = reference.to_blocked(sf).reshape(-1)
    row_blocks, atoms_k = (rows + 127) // 128, (cols + 3) // 4
    for b in range(l):
        for r in range(rows):
            for c in range(cols):
                word = k90.blocked_sf_word(b, r, c, row_blocks, atoms_k)
                assert word % 4 == 0
                assert int(blocked[word + c % 4]) == int(sf[b, r, c]), (b, r, c)
                if b == 0:
                    assert int(blocked[k90.blocked_sf_byte(r, c, atoms_k)]) == int(sf[0, r, c])
    # the 16-groups of a k-tile's two k-blocks read their own scale column: NVFP4 one per
    # group, MXFP4 one per two groups
    for vec in (16, 32):
        cols = [k90.scale_column(j, q, vec) for j in range(2) for q in range(4)]
        assert cols == [(64 * j + 16 * q) // vec for j in range(2) for q in range(4)]


def test_split_k_ranges_partition_the_k_tiles():
    """``split_k_range`` (the producer's and the consumers' k-tiles of a split): the splits
    cover every k-tile once, in split order, at most one k-tile apart, longer ones first."""
    for split_k in range(1, 17):
        for k_tiles in range(0, 3 * split_k + 2):
            ranges = [k90.split_k_range(s, k_tiles, split_k) for s in range(split_k)]
            tiles = [t for begin, end in ranges for t in range(begin, end)]
            assert tiles == list(range(k_tiles)), (split_k, k_tiles, ranges)
            sizes = [end - begin for begin, end in ranges]
            assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1, sizes


def test_split_k_tile_ids_are_distinct():
    """``output_tile_id`` (the split-K fix-up's slot for a tile's partials and counter) numbers
    the tiles of ``output_tiles`` 0 .. tiles - 1, each once, for more row tiles than column
    tiles and the reverse, L > 1 and a 2x1 cluster (an odd count of row tiles rounded up to
    the cluster's, as its grid walks them)."""
    for rows, cols, l, tile_rows, tile_cols, cluster_m in (  # noqa: E741
        (1000, 20, 2, 64, 8, 1),
        (300, 100, 2, 128, 16, 1),
        (300, 520, 3, 128, 128, 2),
    ):
        row_tiles, col_tiles, tiles = k90.output_tiles(
            rows, cols, l, tile_rows, tile_cols, cluster_m
        )
        # (the cluster grid walks whole clusters: the row tiles cover the rows, a multiple of
        # the cluster's extent, less than one cluster more than needed)
        needed = math.ceil(rows / tile_rows)
        assert row_tiles % cluster_m == 0 and needed <= row_tiles < needed + cluster_m
        assert col_tiles == math.ceil(cols / tile_cols)
        ids = [
            k90.output_tile_id(r, c, b, row_tiles, col_tiles)
            for b in range(l)
            for c in range(col_tiles)
            for r in range(row_tiles)
        ]
        assert sorted(ids) == list(range(tiles)), (rows, cols, l)


@pytest.mark.parametrize("w4a16", [False, True], ids=["w4a4", "w4a16"])
@pytest.mark.parametrize("scale", [False, True], ids=["no-scale", "scale"])
def test_bound_launch_passes_the_checked_launchs_arguments(w4a16, scale):
    """A launch with B, the scales, alpha and its scale bound (a layer's plan) calls the kernel
    with the very arguments, in the same order, as the launch given every operand."""
    calls = []
    t = [torch.zeros(16 * (i + 1), dtype=torch.uint8) for i in range(9)]
    a, b, sfa, sfb, out, workspace, alpha, unit, s = t
    sfa = None if w4a16 else sfa
    s = s if scale else None
    launch = r90.Launch(lambda *args: calls.append(args), (3, 5, 7, 1), (workspace,), 0, unit, None)
    launch(a, b, sfa, sfb, out, alpha, 11, scale=s)
    launch.bind(b, sfa, sfb, alpha, s)(a.data_ptr(), out.data_ptr(), 11)
    assert len(calls) == 2 and calls[0] == calls[1]
    # (A, B, SFA, SFB, D, the workspace, alpha, the group offsets' stand-in, alpha's scale)
    want = (a, b, sfb if w4a16 else t[2], sfb, out, workspace, alpha, alpha, s if scale else unit)
    assert calls[0] == (*[x.data_ptr() for x in want], (3, 5, 7, 1), 11)


def test_converted_shapes_pad_decode_tokens_to_whole_tiles():
    # decode: the tokens' copy is padded to the token tile (TMA boxes stay inside it)
    decode = k90.BlockwiseGemmFp4Sm90(16, "decode", (128, 64), (1, 1), 1)
    assert r90.converted_shapes(decode, 72, 8192, 8000, 2) == ((8,), (2, 128, 8000))
    assert r90.converted_shapes(decode, 128, 8192, 8000, 1) == ((8,), (1, 128, 8000))
    wide = k90.BlockwiseGemmFp4Sm90(32, "decode", (32, 128), (1, 1), 2)
    assert r90.converted_shapes(wide, 30, 520, 1056, 2) == ((8,), (2, 32, 1088))
    narrow = k90.BlockwiseGemmFp4Sm90(16, "decode", (8, 128), (1, 1), 4)
    assert r90.converted_shapes(narrow, 3, 8192, 8192, 1) == ((8,), (1, 8, 8192))
    # prefill: both copies, rows as they are
    prefill = k90.BlockwiseGemmFp4Sm90(16, "prefill", (128, 256), (2, 1), 1)
    assert r90.converted_shapes(prefill, 1000, 8190, 8032, 2) == ((2, 1000, 8064), (2, 8190, 8064))


def test_default_config_paths():
    """The picks that docs/sm90_design.md measured, one rule of ``default_config`` at a time."""
    assert k90.default_config(1, 8192, 8192, 1)[0] == "decode"
    assert k90.default_config(1, 8192, 8192, 1, allow_k_groups=False)[1] == (8, 128)
    assert k90.default_config(64, 8192, 8192, 1)[1:] == ((64, 64), 2, 1)
    # tiles of > 32 tokens: on a tie, 64 weight rows unsplit rather than 128 rows split in two
    assert k90.default_config(128, 7168, 2048, 1)[1:] == ((128, 64), 1, 1)
    assert k90.default_config(128, 8192, 8192, 1)[1:] == ((128, 64), 1, 1)
    # UNIT_COST: 64 x 18432 x 7168 takes split 3, not split 4
    assert k90.default_config(64, 18432, 7168, 1)[1:] == ((64, 64), 3, 1)
    # the busiest CTA's work decides: 224 tiles of 128 rows fit the 264 CTA slots unsplit ...
    assert k90.default_config(1, 28672, 4096, 1)[1:] == ((8, 128), 1, 1)
    # ... while 144 tiles split 3 (432 units: at most two units of 19 k-tiles per CTA) beat
    # split 2 (288 units: 24 CTAs run two units of 28 k-tiles, the others one)
    assert k90.default_config(16, 18432, 7168, 1)[1:] == ((16, 128), 3, 1)
    assert k90.default_config(16, 4096, 7168, 1, allow_k_groups=False)[1:] == ((16, 64), 4, 1)
    # several token tiles (M > 128): 128 x 128 tiles, split only while tiles leave CTAs idle
    assert k90.default_config(192, 8192, 8192, 1) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(256, 4096, 7168, 1) == ("decode", (128, 128), 2, 1)
    assert k90.default_config(256, 18432, 7168, 1) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(2048, 8192, 8192, 1) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(2049, 8192, 8192, 1) == ("prefill", (128, 256), 1, 1)
    # ... unless the token copy, padded to 128-token tiles, would pass the 32-bit offsets
    # (410 tokens pad to 512: 512 x 1160000 x 4 >= 2^31; prefill's copy is 410 rows)
    assert k90.default_config(410, 1, 1160000, 4) == ("prefill", (128, 256), 1, 1)
    assert k90.default_config(4096, 8192, 8192, 1) == ("prefill", (128, 256), 1, 1)
    # a path asked for (the CLI's --path): that path's tile and split at any M
    assert k90.default_config(4096, 8192, 8192, 1, path="decode") == ("decode", (128, 128), 1, 1)
    assert k90.default_config(1024, 8192, 8192, 1, path="prefill") == ("prefill", (128, 256), 1, 1)
    # one wave of K groups where the split-K units would be short (<= 16 k-tiles) and one CTA
    # per 64 weight rows fills 3/4 of the SMs or more ...
    assert k90.default_config(1, 7168, 2048, 1) == ("decode", (8, 64), 1, 4)
    assert k90.default_config(16, 8192, 8192, 1) == ("decode", (16, 64), 1, 4)
    # (the bound's two sides: 7168 x 8192 splits 4 into units of 16 k-tiles, x 8576 of 17)
    assert k90.default_config(1, 7168, 8192, 1, allow_k_groups=False)[1:] == ((8, 128), 4, 1)
    assert k90.default_config(1, 7168, 8192, 1) == ("decode", (8, 64), 1, 4)
    assert k90.default_config(1, 7168, 8576, 1) == ("decode", (8, 128), 4, 1)
    assert k90.default_config(32, 7168, 2048, 1) == ("decode", (32, 64), 1, 4)
    # (the first split that fills 3/4 of the SMs: 1280 rows are 20 CTAs of 64, 120 at split 6)
    assert k90.default_config(1, 1280, 6144, 1) == ("decode", (8, 64), 6, 4)
    # (at exactly 3/4 of the 132 SMs: 6336 rows are 99 CTAs of 64)
    assert k90.default_config(1, 6336, 2048, 1) == ("decode", (8, 64), 1, 4)
    assert k90.default_config(1, 6336, 8192, 1, a_dtype="BFloat16") == ("decode", (8, 64), 1, 4)
    # ... not for longer units (K = 16384), fewer rows (1 x 1000 x 2080: 16 CTAs), more than
    # one wave (N = 18432) or more than one token tile
    assert k90.default_config(1, 7168, 16384, 1)[3] == 1
    assert k90.default_config(1, 1000, 2080, 1)[3] == 1
    assert k90.default_config(16, 18432, 2048, 1)[3] == 1
    assert k90.default_config(64, 7168, 2048, 1)[3] == 1
    # ... nor where units would have fewer than two k-tiles per group (K = 896: 7 k-tiles)
    assert k90.default_config(1, 7168, 896, 1)[3] == 1
    # the CLI: a tile or a split given completes the pick without K groups
    assert k90.default_config(1, 7168, 2048, 1, allow_k_groups=False) == ("decode", (8, 64), 2, 1)
    # W4A16: the busiest SM counts (its two CTAs share the issue slots): 144 tiles split 4 (576
    # units: at most 5 units of 14 k-tiles per SM) beat split 3 (432: 4 of 19 per SM) ...
    w4a16 = {"a_dtype": "BFloat16"}
    assert k90.default_config(16, 18432, 7168, 1, **w4a16) == ("decode", (16, 128), 4, 1)
    assert k90.default_config(64, 8192, 8192, 1, **w4a16) == ("decode", (64, 64), 2, 1)
    # ... and one wave of K groups whatever the units' length
    assert k90.default_config(1, 8192, 8192, 1, **w4a16) == ("decode", (8, 64), 1, 4)
    assert k90.default_config(16, 4096, 7168, 1, **w4a16) == ("decode", (16, 64), 2, 4)
    assert k90.default_config(16, 7168, 16384, 1, **w4a16) == ("decode", (16, 64), 1, 4)
    assert k90.default_config(16, 1000, 2080, 1, **w4a16) == ("decode", (16, 64), 2, 1)
    assert k90.default_config(1024, 8192, 8192, 1, **w4a16) == ("decode", (128, 128), 1, 1)
    # ... picks within W4A16_NEAR_TIE of the least tie, the fewest units wins: 28672 x 8192 unsplit
    # (1.5 x 8576 = 12864) over 896 units (5.25 x 2432); 18432 x 7168 keeps split 4 (3.5% apart)
    assert k90.default_config(1, 28672, 8192, 1, **w4a16) == ("decode", (8, 128), 1, 1)
    assert k90.default_config(64, 28672, 8192, 1, **w4a16) == ("decode", (64, 128), 1, 1)
    assert k90.default_config(16, 25600, 5120, 1, **w4a16) == ("decode", (16, 128), 1, 1)
    assert k90.default_config(64, 10240, 8192, 1, **w4a16) == ("decode", (64, 64), 3, 1)
    # (W4A4, which counts no SM share, and the grouped kernel keep the least: 7040 against 7168)
    assert k90.default_config(64, 18432, 8192, 1)[1:] == ((64, 64), 4, 1)
    assert k90.default_config(64, 28672, 8192, 1, grouped=True, **w4a16)[1:] == ((64, 64), 2, 1)
    # W4A16 on 64-token tiles: 64-row units of >= 32 k-tiles of 128 rows run as 128 rows split
    # twice as far (8192 x 28672: 2 -> 4, 56 k-tiles; 5120 x 25600: 3 -> 6, 34); 8192 x 8192's
    # units (16) stay, as do W4A4's and the grouped kernel's
    assert k90.default_config(64, 8192, 28672, 1, **w4a16) == ("decode", (64, 128), 4, 1)
    assert k90.default_config(40, 5120, 25600, 1, **w4a16) == ("decode", (64, 128), 6, 1)
    assert k90.default_config(33, 57344, 8192, 1, **w4a16) == ("decode", (64, 128), 2, 1)
    assert k90.default_config(64, 8192, 8192, 1, **w4a16) == ("decode", (64, 64), 2, 1)
    # (split 8 has no split twice as far: 64 x 1024 x 65536 keeps 64 rows)
    assert k90.default_config(64, 1024, 65536, 1, **w4a16) == ("decode", (64, 64), 8, 1)
    # (the threshold's two sides: 248 and 252 k-tiles split 4 -> 8, units of 31 and 32)
    assert k90.default_config(64, 3584, 31744, 1, **w4a16) == ("decode", (64, 64), 4, 1)
    assert k90.default_config(64, 3584, 32256, 1, **w4a16) == ("decode", (64, 128), 8, 1)
    # (64-token tiles only: one 128-token tile of long 64-row units keeps them)
    assert k90.default_config(128, 1536, 32768, 1, **w4a16) == ("decode", (128, 64), 4, 1)
    assert k90.default_config(64, 8192, 28672, 1) == ("decode", (64, 64), 2, 1)
    assert k90.default_config(64, 8192, 28672, 1, grouped=True, **w4a16)[1] == (64, 64)
    # W4A16, one tile of 65-128 tokens: 128 rows where units of >= 24 k-tiles fill 3/4 of the
    # SMs (224 tiles unsplit: 2 rounds, no fix-up; 64 tiles split 2: 128 units of 112 k-tiles)
    assert k90.default_config(128, 28672, 8192, 1, **w4a16) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(80, 8192, 28672, 1, **w4a16) == ("decode", (128, 128), 2, 1)
    # ... not where they would not (32 tiles x 56 k-tiles: <= 96 units, or units of < 24 k-tiles),
    # nor for the grouped kernel (for_groups bounds its splits by any routing's units)
    assert k90.default_config(128, 4096, 7168, 1, **w4a16) == ("decode", (128, 64), 2, 1)
    wide = k90.default_config(128, 28672, 8192, 1, grouped=True, **w4a16)
    assert wide == ("decode", (128, 64), 2, 1)
    # ... and for_groups asks for the grouped pick
    grouped = r90.GemmConfig.for_groups(128, 28672, 8192, 1, num_sms=k90.H200_SM_COUNT)
    assert (grouped.mma_tiler_mn, grouped.split_k) == ((128, 64), 1)
    # the busiest CTA's weight rows x k-tiles, plus 4 x 384 per unit end:
    # 144 tiles x 56 k-tiles: split 1 = 2 x (7168 + 1536), split 2 = 3 x (3584 + 1536)
    assert k90.default_config(128, 18432, 7168, 1, **w4a16) == ("decode", (128, 128), 2, 1)
    # L = 2: 128 unsplit tiles fill the SMs (9728 against split 2's 2 x 5632)
    assert k90.default_config(128, 8192, 8192, 2, **w4a16) == ("decode", (128, 128), 1, 1)
    # 416 tiles x 128 k-tiles: split 2 (7 x 9728) beats 1 (4 x 17920), 3 (10 x 7040), 4 (13 x 5632)
    assert k90.default_config(128, 53248, 16384, 1, **w4a16) == ("decode", (128, 128), 2, 1)
    # a tie (3 x 6144 = 4 x 4608) goes to fewer units
    assert k90.default_config(128, 18432, 9216, 1, **w4a16) == ("decode", (128, 128), 2, 1)
    # 114 SMs: 40 tiles x 8 = 320 units of 27 k-tiles (3 x 4992) beat split 4 (2 x 8448)
    assert k90.default_config(128, 5120, 27648, 1, 114, **w4a16) == ("decode", (128, 128), 8, 1)
    # every unit keeps >= 24 k-tiles: 72 k-tiles split 3 qualify, 70 do not (nor 96 units of 35)
    assert k90.default_config(128, 6144, 9216, 1, **w4a16) == ("decode", (128, 128), 3, 1)
    assert k90.default_config(128, 6144, 8960, 1, **w4a16) == ("decode", (128, 64), 4, 1)
    assert k90.default_config(128, 16384, 3072, 1, **w4a16) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(128, 7168, 4096, 1, **w4a16) == ("decode", (128, 64), 1, 1)
    # F16 activations too
    wide_f16 = k90.default_config(128, 28672, 8192, 1, a_dtype="Float16")
    assert wide_f16 == ("decode", (128, 128), 1, 1)
    # W4A4 takes the same pick where its busiest SM streams >= 48 k-tiles: 224 tiles x 64
    # unsplit (2 rounds: 128); 64 tiles x 224 split 2 (1 round of 112); 144 tiles x 56 split 2
    # (3 rounds of 28: 84) ...
    assert k90.default_config(128, 28672, 8192, 1) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(96, 8192, 28672, 1) == ("decode", (128, 128), 2, 1)
    assert k90.default_config(128, 18432, 7168, 1) == ("decode", (128, 128), 2, 1)
    # ... or where the caller runs its split on 2x1 clusters (split_pairs) and they fit (split
    # 2, <= 66 tiles: 8192 x 8192, one round of 32; 50 tiles x 94; 66 tiles x 64) ...
    pairs = dict(split_pairs=True)
    assert k90.default_config(128, 8192, 8192, 1, **pairs) == ("decode", (128, 128), 2, 1)
    assert k90.default_config(65, 6400, 12032, 1, **pairs) == ("decode", (128, 128), 2, 1)
    assert k90.default_config(128, 8448, 8192, 1, **pairs) == ("decode", (128, 128), 2, 1)
    assert k90.default_config(128, 6400, 12032, 1) == ("decode", (128, 64), 1, 1)
    assert k90.default_config(128, 8192, 8192, 1, **w4a16) == ("decode", (128, 128), 2, 1)
    # ... not on one short round of units that no cluster pairs: 32 tiles x 112 split 4 (28);
    # the bound's two sides, 32 tiles x 189 or 188 k-tiles split 4 (one round of 48 or 47)
    assert k90.default_config(128, 4096, 14336, 1) == ("decode", (128, 64), 2, 1)
    assert k90.default_config(128, 4096, 189 * 128, 1) == ("decode", (128, 128), 4, 1)
    assert k90.default_config(128, 4096, 188 * 128, 1) == ("decode", (128, 64), 2, 1)
    assert k90.default_config(128, 4096, 14336, 1, **w4a16) == ("decode", (128, 128), 4, 1)
    # 99 tiles fill exactly 3/4 of 132 SMs: unsplit (7680) beats split 2 (2 x 4608)
    assert k90.default_config(128, 12672, 6144, 1) == ("decode", (128, 128), 1, 1)
    assert k90.default_config(128, 12672, 6144, 1, **w4a16) == ("decode", (128, 128), 1, 1)
    # the grouped kernel keeps its pick (no wide rule)
    wide_grouped = k90.default_config(128, 28672, 8192, 1, grouped=True)
    assert wide_grouped == ("decode", (128, 64), 2, 1)
    for argv, want in (
        (["--split_k", "3"], ("decode", (8, 64), 3, 1)),
        (["--k_groups", "2"], ("decode", (8, 64), 1, 2)),
    ):
        args = cli._validated(cli.make_parser().parse_args(["--mnkl", "1,7168,2048,1", *argv]))
        assert (args.path, args.mma_tiler_mn, args.split_k, args.k_groups) == want
    for m in (1, 16, 32, 100, 128, 129, 2048, 4096):
        path, tiler, split, k_groups = k90.default_config(m, 7168, 2048, 1)
        reasons = k90.check_fp4_gemm_config(
            (m, 7168, 2048, 1), 16, "Float8E4M3FN", "BFloat16", path, tiler, (1, 1), split, k_groups
        )
        assert reasons == []


def test_default_config_picks_pass_the_checks():
    """Every pick of ``default_config`` over a sweep of shapes (ragged, L = 2, both formats, W4A4
    and W4A16) is a configuration that ``check_fp4_gemm_config`` accepts and the kernel object
    builds."""
    import itertools

    ms = (1, 5, 8, 9, 12, 16, 20, 24, 32, 33, 64, 128, 200, 2049)
    ns = (1, 520, 1000, 4096, 7168, 8192, 8448, 18432)
    ks = (32, 64, 96, 1024, 2080, 7168, 16384)
    shapes = itertools.product(ms, ns, ks, (1, 2), (16, 32), (k90.W4A4, "BFloat16"))
    for m, n, k, l, vec, a_dtype in shapes:  # noqa: E741
        path, tiler, split, k_groups = k90.default_config(m, n, k, l, a_dtype=a_dtype)
        sf_dtype = "Float8E4M3FN" if vec == 16 else "Float8E8M0FNU"
        cluster = k90.default_cluster(path)
        config = (path, tiler, cluster, split, k_groups, a_dtype)
        reasons = k90.check_fp4_gemm_config((m, n, k, l), vec, sf_dtype, "BFloat16", *config)
        assert reasons == [], (m, n, k, l, vec, config, reasons)
        k90.BlockwiseGemmFp4Sm90(
            vec, path, tiler, cluster, split, k_groups=k_groups, a_dtype=a_dtype
        )


def _cli(*args):
    return subprocess.run(
        [sys.executable, *SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mnkl", "128,128,100,1"], "K=100 is not a multiple of 32"),
        (["--mnkl", "1,2,3"], "--mnkl expects 4 integers"),
        (["--mnkl", "1,2,3,4,5"], "--mnkl expects 4 integers"),
        (["--mnkl", "1,x,3,4"], "--mnkl expects 4 comma-separated integers"),
        (["--mma_tiler_mn", "128,128,1"], "--mma_tiler_mn expects 2 integers"),
        (["--cluster_shape_mn", "1"], "--cluster_shape_mn expects 2 integers"),
        (["--sf_vec_size", "32", "--sf_dtype", "Float8E4M3FN"], "does not pair with"),
        (["--sf_vec_size", "8"], "invalid choice: 8"),
        (["--cluster_shape_mn", "1,2"], "takes (1, 1)"),
        (["--iterations", "0"], "--iterations must be >= 1"),
        (["--tolerance", "nan"], "--tolerance must be a finite number > 0"),
        (["--tolerance", "0"], "--tolerance must be a finite number > 0"),
        (["--seed", str(2**64)], "--seed must be in [0, 2^64)"),
        (["--seed", "-1"], "--seed must be in [0, 2^64)"),
        (["--alpha", "nan"], "--alpha: alpha must be a finite fp32 number"),
        (["--mnkl", "16,4096,4096,1", "--alpha", "1e38"], "NVFP4 here needs |alpha| < 2^114"),
        (["--mnkl", "1,64,256,1", "--k_groups", "4", "--mma_tiler_mn", "64,64"], "K groups"),
        (["--k_groups", "0"], "k_groups=0 is not supported: use 1 (no K groups) or 2..4"),
        (["--mnkl", "16,8192,0,1"], "K must be >= 1"),
        (["--mnkl", "16,8192,-32,1"], "K must be >= 1"),
        (["--mnkl", "0,8192,64,1"], "M must be >= 1"),
        (["--mnkl", "1,-64,64,1"], "N must be >= 1"),
        (["--mnkl", "1,64,64,0"], "L must be >= 1"),
    ],
)
def test_cli_bad_input_exits_2(args, message, tmp_path, capsys):
    """Bad input: exit 2 with a message naming what is wrong (argparse's own or ours)."""
    try:
        code = cli.main([*args, "--compile_only", "--dump_dir", str(tmp_path)])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("tolerance", ["2048", "4096"])
def test_cli_refuses_a_tolerance_past_the_bounds_reach(tolerance, capsys):
    """The bound's gamma_K needs K u < 1 (u = 2^-24 x tolerance): at K = 8192 a tolerance of
    2048 would divide by zero and a larger one make the bound negative (a false FAIL)."""
    assert cli.main(["--mnkl", "128,128,8192,1", "--tolerance", tolerance]) == 2
    assert "is too large for K = 8192" in capsys.readouterr().err


def test_cli_compile_only_keeps_each_configuration_apart(tmp_path, capsys):
    """Two configurations compiled into one --dump_dir keep their own PTX and cubin (the DSL
    names the files after the kernel only)."""
    cubins = []
    for split in ("1", "2"):
        args = ["--mnkl", "16,512,512,1", "--path", "decode", "--mma_tiler_mn", "16,64"]
        code = cli.main([*args, "--split_k", split, "--compile_only", "--dump_dir", str(tmp_path)])
        assert code == 0
        cubins.append(re.search(r"cubin: (\S+)", capsys.readouterr().out).group(1))
    folders = {os.path.dirname(c) for c in cubins}
    assert len(folders) == 2 and all(os.path.exists(c) for c in cubins)
    assert os.path.basename(os.path.dirname(cubins[0])).startswith("nvfp4_Float4E2M1FN_BFloat16")


@pytest.mark.parametrize("c_dtype", ["bfloat16", "float16", "float32"])
def test_cli_check_against_exact_product(c_dtype):
    """The CLI's check: D rounded from the exact product (any summation order's error is far
    below the bound) passes; one element off by more than the bound fails, and is counted."""
    import torch

    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2, 33, 256, generator=gen, dtype=torch.float64).float().double()
    b = torch.randn(2, 40, 256, generator=gen, dtype=torch.float64).float().double()
    alpha = 0.75
    exact = alpha * torch.matmul(a, b.transpose(-1, -2))
    d = exact.float().to(getattr(torch, c_dtype))
    assert cli.check_against_exact(d, a, b, alpha)[0]
    bad = d.clone()
    bad[1, 7, 9] += 0.05 * exact.abs().max().to(bad.dtype)
    passed, summary = cli.check_against_exact(bad, a, b, alpha)
    assert not passed and summary.startswith("1/2640 elements outside the bound")


def test_cli_unusable_dump_dir_exits_2(tmp_path, capsys):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    assert cli.main(["--mnkl", "16,4096,4096,1", "--compile_only", "--dump_dir", str(blocker)]) == 2
    assert "cannot create the folder" in capsys.readouterr().err
    locked = tmp_path / "read_only"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("this user can write into a read-only folder (root)")
    assert cli.main(["--mnkl", "16,4096,4096,1", "--compile_only", "--dump_dir", str(locked)]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_cli_compile_only_without_deprecation_warnings(tmp_path):
    """The script compiles on a machine without a GPU, prints the GEMM kernel's resources, and
    the DSL raises no DeprecationWarning on the way (an error here)."""
    r = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", *SCRIPT]
        + ["--mnkl", "16,8192,8192,1", "--compile_only", "--dump_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Warning" not in r.stderr, r.stderr
    assert "kernel: kernel_cutlass_kernel" in r.stdout, r.stdout
    for needle in ("registers per thread:", "local memory per thread: 0", "pipeline stages:"):
        assert needle in r.stdout, r.stdout


@pytest.mark.skipif(_has_sm90(), reason="this machine has an sm_90 GPU")
def test_cli_without_sm90_exits_2():
    r = _cli("--mnkl", "128,128,128,1")
    assert r.returncode == 2
    assert "--compile_only" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ GPU
def gpu(test):
    """An H100 / H200 test: marked ``gpu`` (select with ``-m gpu``; tests/conftest.py gives GPU
    tests a timeout), skipped on any other machine."""
    skip = pytest.mark.skipif(not _has_sm90(), reason="needs an sm_90 GPU (H100 / H200)")
    return pytest.mark.gpu(skip(test))


# bytes of NaN either side of D in the GPU tests' buffers (a multiple of 16: D stays aligned)
D_GUARD_BYTES = 1 << 16


def _nan_filled_d(shape, dtype, device="cuda"):
    """D full of NaN inside a buffer with D_GUARD_BYTES of NaN either side, so that a test sees
    a store outside D too.  Returns (d, buffer)."""
    import torch

    guard = D_GUARD_BYTES // torch.empty((), dtype=dtype).element_size()
    buf = torch.full((2 * guard + math.prod(shape),), float("nan"), dtype=dtype, device=device)
    return buf[guard : guard + math.prod(shape)].view(shape), buf


def _assert_guards_untouched(buf, d):
    import torch

    guard = (buf.numel() - d.numel()) // 2
    assert torch.isnan(buf[:guard]).all() and torch.isnan(buf[guard + d.numel() :]).all(), (
        "a store outside D"
    )


def _config(mnkl, vec, c_dtype, path, tiler, split, k_groups=1, a_dtype=k90.W4A4):
    """A GPU case's configuration, with TMA stores where N allows them (``for_problem``)."""
    picks = dict(path=path, mma_tiler_mn=tiler, split_k=split, k_groups=k_groups)
    return r90.GemmConfig.for_problem(mnkl, vec, c_dtype, a_dtype, **picks)


def _alpha(value: float):
    """alpha as ``gemm`` takes it: one fp32 value on the GPU, read when the kernel runs (made
    before a test queues its launches: a fill between two GEMMs would break their PDL chain)."""
    import torch

    return torch.full((1,), value, dtype=torch.float32, device="cuda")


def _kernel_of(config):
    """The kernel object (not compiled) of a configuration."""
    fields = (config.cluster_shape_mn, config.split_k, config.tma_store, config.k_groups)
    return k90.BlockwiseGemmFp4Sm90(
        config.sf_vec_size, config.path, config.mma_tiler_mn, *fields, config.a_dtype
    )


def _warm_up(config, a, b, sfa, sfb, d):
    """One call into a scratch D: compiles ``config`` and allocates the current stream's
    workspace for the shape, so that the launches after it are queued back to back."""
    import torch

    r90.gemm(a, b, sfa, sfb, _alpha(1.0), torch.empty_like(d), config)


GPU_CASES = [
    # (m, n, k, l, sf_vec_size, c_dtype, path, mma_tiler_mn, split_k, alpha, dist)
    (300, 520, 224, 2, 16, "BFloat16", "prefill", (128, 256), 1, 0.7, "wide"),
    (257, 129, 1056, 1, 32, "Float16", "prefill", (128, 256), 1, 1.0, "normal"),
    (200, 300, 544, 3, 16, "Float32", "prefill", (64, 128), 1, -1.5, "wide"),
    (1024, 1024, 2048, 1, 16, "BFloat16", "prefill", (128, 256), 1, 1.0, "normal"),
    (300, 520, 2080, 1, 16, "BFloat16", "prefill", (128, 128), 3, 1.0, "wide"),
    (1, 1000, 2080, 1, 16, "BFloat16", "decode", (8, 128), 1, 2.0, "wide"),
    (1, 1000, 2080, 1, 16, "BFloat16", "decode", (8, 128), 4, 2.0, "wide"),
    (16, 4096, 4096, 1, 32, "BFloat16", "decode", (16, 128), 2, 1.0, "wide"),
    (16, 777, 1056, 2, 16, "Float32", "decode", (16, 64), 3, 0.25, "normal"),
    (100, 300, 800, 1, 32, "Float16", "decode", (128, 128), 1, 1.0, "wide"),
    (16, 1024, 4096, 1, 16, "Float16", "decode", (16, 128), 8, 1.0, "normal"),
    (30, 520, 1056, 2, 32, "BFloat16", "decode", (32, 128), 2, 1.0, "wide"),
    (64, 520, 1056, 1, 16, "BFloat16", "decode", (64, 64), 2, 1.0, "wide"),
    # fewer tokens than the tile's 8, L > 1, K = 32 x odd, both formats
    (5, 1000, 4000, 2, 32, "Float32", "decode", (8, 64), 3, 1.0, "wide"),
    (3, 520, 1056, 2, 16, "Float16", "decode", (8, 128), 2, 0.5, "normal"),
    # 297 units on 264 CTA slots (CTAs with two units; the second starts mid-ring)
    (7, 4224, 1056, 9, 16, "BFloat16", "decode", (8, 128), 1, 1.0, "wide"),
    # M > 8 on 8-token tiles: col tiles 0..2, scale rows 0 / 8 / 16 of the atom; K = 64 mod 128
    (20, 520, 1088, 2, 32, "BFloat16", "decode", (8, 64), 2, 1.0, "normal"),
    # every token row real, direct stores (N x 2 bytes not a multiple of 16), K = 0 mod 128
    (8, 1001, 1024, 1, 16, "BFloat16", "decode", (8, 128), 1, 1.0, "wide"),
    # one k-tile, split 2: every second unit has no k-tiles (its first stage is never requested)
    (20, 520, 64, 1, 16, "BFloat16", "decode", (32, 64), 2, 1.0, "normal"),
    # several 128-token tiles (M > 128, default_config's decode range), the last one ragged
    (300, 520, 2080, 2, 16, "BFloat16", "decode", (128, 128), 1, 0.7, "wide"),
    (260, 1000, 4000, 1, 32, "Float32", "decode", (128, 128), 2, 1.0, "normal"),
    # one tile of 65-128 tokens on 128 rows split 2 (the configuration of default_config's
    # 128-row pick), L > 1
    (96, 520, 2080, 2, 16, "BFloat16", "decode", (128, 128), 2, 1.0, "wide"),
    # 864 split-K units on 264 CTA slots: CTAs run splits of several tiles in turn
    (16, 18432, 2048, 2, 16, "BFloat16", "decode", (16, 128), 3, 1.0, "wide"),
    # k_groups (12th field): 17 k-tiles over 4 groups; split-K, L > 1, K = 32 x odd; 3 groups;
    # one k-tile (groups without k-tiles); 297 units on 132 CTAs; a full-size shape
    (1, 1000, 2080, 1, 16, "BFloat16", "decode", (8, 64), 1, 2.0, "wide", 4),
    (5, 1000, 4000, 2, 32, "Float32", "decode", (8, 64), 3, 1.0, "wide", 4),
    (16, 777, 1056, 2, 16, "Float16", "decode", (16, 64), 1, 0.25, "normal", 3),
    (20, 520, 64, 1, 16, "BFloat16", "decode", (32, 64), 2, 1.0, "normal", 4),
    (7, 4224, 1056, 9, 16, "BFloat16", "decode", (8, 128), 1, 1.0, "wide", 2),
    (16, 8192, 8192, 1, 16, "BFloat16", "decode", (16, 64), 1, 1.0, "wide", 4),
]


@gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_gpu_matches_reference(case):
    import torch

    import reference

    m, n, k, l, vec, c_dtype, path, tiler, split, alpha_factor, dist = case[:11]  # noqa: E741
    k_groups = case[11] if len(case) > 11 else 1
    config = _config((m, n, k, l), vec, c_dtype, path, tiler, split, k_groups)
    # twice, back to back on different operands: the split-K counters reset themselves, and
    # the second prologue (PDL) must not overwrite tokens the first GEMM still reads
    runs = []
    for seed in (m + n + k, m + n + k + 1):
        ops = reference.make_fp4_operands(m, n, k, l, vec, "cuda", seed=seed, dist=dist)
        alpha = float(ops.alpha) * alpha_factor
        sfa, sfb = r90.blocked_scales(ops.sfa), r90.blocked_scales(ops.sfb)
        d, guarded = _nan_filled_d((l, m, n), k90.torch_dtype(c_dtype))
        runs.append((ops, alpha, sfa, sfb, d, guarded, _alpha(alpha)))
    _warm_up(config, runs[0][0].a, runs[0][0].b, *runs[0][2:5])
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000)  # about 1 ms on the GPU: both launches queue up behind it
    for ops, _, sfa, sfb, d, _, alpha in runs:
        r90.gemm(ops.a, ops.b, sfa, sfb, alpha, d, config)
    torch.cuda.synchronize()
    for ops, alpha, _, _, d, guarded, _ in runs:
        ok, info = reference.check_gemm(d, ops.a, ops.b, ops.sfa, ops.sfb, vec, alpha)
        assert ok, str(info)
        _assert_guards_untouched(guarded, d)


@gpu
@pytest.mark.parametrize("shared", ["tokens", "d"])
def test_gpu_after_an_early_releasing_kernel(shared):
    """Each launch follows a GEMM that releases its PDL dependents before it stores D, and that
    D is the launch's packed FP4 tokens (``tokens``: the prologue must wait for it) or the
    memory of the launch's own D (``d``: the launch must store after it, including the
    epilogues of its units and groups without k-tiles).  Five pairs queued back to back; each
    second GEMM checked against the reference."""
    import torch

    import reference

    if shared == "tokens":
        # writer: BF16 D of 8 KiB = the packed tokens of 8 x 7168 x 2048 (8-token tiles of 64
        # rows in 4 K groups, on the prologue's PDL chain)
        (m1, n1, k1), (m2, n2, k2) = (1, 4096, 2048), (8, 7168, 2048)
        reader = _config((m2, n2, k2, 1), 16, "BFloat16", "decode", (8, 64), 1, 4)
    else:
        # writer: BF16 D of 20800 bytes = the BF16 D of 20 x 520 x 64 (one k-tile, split 2 in
        # 4 K groups: units and groups without k-tiles)
        (m1, n1, k1), (m2, n2, k2) = (1, 10400, 2048), (20, 520, 64)
        reader = _config((m2, n2, k2, 1), 16, "BFloat16", "decode", (32, 64), 2, 4)
    assert _kernel_of(reader).prologue_pdl
    writer = _config((m1, n1, k1, 1), 16, "BFloat16", "decode", (8, 128), 4)
    ops1 = reference.make_fp4_operands(m1, n1, k1, 1, 16, "cuda", seed=3)
    ops2 = reference.make_fp4_operands(m2, n2, k2, 1, 16, "cuda", seed=4)
    sfa1, sfb1 = r90.blocked_scales(ops1.sfa), r90.blocked_scales(ops1.sfb)
    sfa2, sfb2 = r90.blocked_scales(ops2.sfa), r90.blocked_scales(ops2.sfb)
    pairs = []
    for i in range(5):
        d1 = torch.full((1, m1, n1), float("nan"), dtype=torch.bfloat16, device="cuda")
        if shared == "tokens":
            tokens = d1.view(torch.uint8).view(1, m2, k2 // 2)
            d2 = torch.full((1, m2, n2), float("nan"), dtype=torch.bfloat16, device="cuda")
        else:
            tokens = ops2.a
            d2 = d1.view(1, m2, n2)
        alpha1 = float(ops1.alpha) * (1 + i)
        pairs.append((alpha1, d1, tokens, d2, _alpha(alpha1)))
    _warm_up(writer, ops1.a, ops1.b, sfa1, sfb1, pairs[0][1])
    _warm_up(reader, ops2.a, ops2.b, sfa2, sfb2, pairs[0][3])
    alpha2 = _alpha(float(ops2.alpha))
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # tens of ms on the GPU: all ten launches queue up behind it
    for _, d1, tokens, d2, alpha1 in pairs:
        r90.gemm(ops1.a, ops1.b, sfa1, sfb1, alpha1, d1, writer)
        r90.gemm(tokens, ops2.b, sfa2, sfb2, alpha2, d2, reader)
    torch.cuda.synchronize()
    for alpha1, d1, tokens, d2, _ in pairs:
        if shared == "tokens":
            ok, info = reference.check_gemm(d1, ops1.a, ops1.b, ops1.sfa, ops1.sfb, 16, alpha1)
            assert ok, str(info)
        ok, info = reference.check_gemm(d2, tokens, ops2.b, ops2.sfa, ops2.sfb, 16, ops2.alpha)
        assert ok, str(info)


@gpu
@pytest.mark.parametrize(
    "vec, path, tiler, split",
    [
        (16, "decode", (8, 128), 2),  # F16 operands, E4M3 scales by cvt
        (32, "decode", (16, 64), 1),  # BF16 operands, E8M0 scales by bit arithmetic
        (16, "prefill", (128, 256), 1),  # the prologue's E4M3 -> BF16 scales
        (32, "prefill", (128, 256), 1),
    ],
)
def test_gpu_nan_scales_give_nan(vec, path, tiler, split):
    """A NaN scale makes its row of D NaN (token scale) or its column (weight scale) and changes
    no other value (reference.py refuses NaN scales, so the expectation is stated here).
    (MXFP4: the E8M0 NaN reads as +inf, so those values are inf or NaN.)"""
    import torch

    import reference

    m, n, k, l = 20, 300, 256, 1  # noqa: E741
    ops = reference.make_fp4_operands(m, n, k, l, vec, "cuda", seed=7, dist="wide")
    config = _config((m, n, k, l), vec, "BFloat16", path, tiler, split)
    nan_byte = 0x7F if vec == 16 else 0xFF  # E4M3 / E8M0 NaN
    sfa_nan, sfb_nan = ops.sfa.clone(), ops.sfb.clone()
    sfa_nan.view(torch.uint8)[0, 3, 1] = nan_byte
    sfb_nan.view(torch.uint8)[0, 7, k // vec - 1] = nan_byte
    poisoned = torch.zeros((l, m, n), dtype=torch.bool, device="cuda")
    poisoned[0, 3, :] = True  # every product of token row 3 with its NaN scale
    poisoned[0, :, 7] = True  # every product of weight row 7
    outs = []
    for sfa, sfb in ((ops.sfa, ops.sfb), (sfa_nan, sfb_nan)):
        d = torch.full((l, m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        blocked = (r90.blocked_scales(sfa), r90.blocked_scales(sfb))
        r90.gemm(ops.a, ops.b, *blocked, _alpha(1.0), d, config)
        outs.append(d)
    torch.cuda.synchronize()
    clean, with_nan = outs
    ok, info = reference.check_gemm(clean, ops.a, ops.b, ops.sfa, ops.sfb, vec, 1.0)
    assert ok, str(info)
    bad = with_nan.isnan() if vec == 16 else ~with_nan.isfinite()
    assert torch.equal(bad, poisoned)
    assert torch.equal(with_nan[~poisoned], clean[~poisoned])


SPLITK_CASES = [
    # (m, n, sf_vec_size, c_dtype, path, mma_tiler_mn, split_k, k_groups)
    # F16 operands; more token tiles than weight tiles (7 x 3, L = 2)
    (100, 300, 16, "Float32", "decode", (16, 128), 4, 1),
    (20, 1000, 32, "BFloat16", "decode", (8, 64), 3, 1),  # BF16 operands
    (20, 1000, 16, "BFloat16", "prefill", (128, 128), 3, 1),  # 4 D subtiles per tile
    (20, 1000, 16, "Float32", "decode", (32, 64), 2, 4),  # split-K of K groups
]


@gpu
@pytest.mark.parametrize("case", SPLITK_CASES, ids=["nvfp4-f16", "mxfp4", "prefill", "kgroups"])
def test_gpu_splitk_is_bitwise_deterministic(case):
    """Split-K (and K groups) on inputs X, then Y, then X again: both X results have the same
    bits, whichever split arrives last at the fix-up, and nothing of X leaks into Y (the
    counters and partials are reused); every result matches the reference and is stored inside
    D only."""
    import torch

    import reference

    m, n, vec, c_dtype, path, tiler, split, k_groups = case
    k, l = 4000, 2  # noqa: E741
    config = _config((m, n, k, l), vec, c_dtype, path, tiler, split, k_groups)
    x, y = (
        reference.make_fp4_operands(m, n, k, l, vec, "cuda", seed=seed, dist="wide")
        for seed in (11, 12)
    )
    outs = []
    for ops in (x, y, x):
        d, guarded = _nan_filled_d((l, m, n), k90.torch_dtype(c_dtype))
        sfa, sfb = r90.blocked_scales(ops.sfa), r90.blocked_scales(ops.sfb)
        r90.gemm(ops.a, ops.b, sfa, sfb, _alpha(float(ops.alpha)), d, config)
        outs.append((ops, d, guarded))
    torch.cuda.synchronize()
    for ops, d, guarded in outs:
        ok, info = reference.check_gemm(d, ops.a, ops.b, ops.sfa, ops.sfb, vec, float(ops.alpha))
        assert ok, str(info)
        _assert_guards_untouched(guarded, d)
    first, second = outs[0][1], outs[2][1]
    assert torch.equal(first.view(torch.uint8), second.view(torch.uint8))


SPLIT_CLUSTER_CASES = [
    # (m, n, k, l, sf_vec_size, a_dtype, c_dtype, mma_tiler_mn): split_k 2 on a 2x1 cluster
    # one wave of clusters, L > 1, K = 32 x odd; ragged tokens and rows, MXFP4, fp32 D
    (128, 1000, 4000, 2, 16, k90.W4A4, "BFloat16", (128, 128)),
    (100, 8000, 2080, 1, 32, k90.W4A4, "Float32", (128, 128)),
    # more tiles than clusters: a cluster runs several units, each reusing the ring
    (128, 16384, 1056, 1, 16, k90.W4A4, "BFloat16", (128, 128)),
    (260, 4096, 2080, 3, 16, k90.W4A4, "Float16", (128, 128)),
    # direct stores: N x 2 bytes not a multiple of 16; 64 x 128 tiles (no D staging)
    (8, 1001, 1024, 1, 16, k90.W4A4, "BFloat16", (8, 128)),
    (64, 520, 1056, 1, 16, k90.W4A4, "BFloat16", (64, 128)),
    # one k-tile: split 1 has none, and sends zeros
    (20, 520, 64, 1, 16, k90.W4A4, "BFloat16", (32, 128)),
    # W4A16 (the activations read by TMA as they are, ragged tiles in boxes)
    (96, 4096, 4096, 1, 16, "BFloat16", "BFloat16", (128, 128)),
    (128, 8192, 2048, 2, 32, "BFloat16", "BFloat16", (128, 128)),
]


@gpu
@pytest.mark.parametrize(
    "case", SPLIT_CLUSTER_CASES, ids=lambda c: "-".join(str(x) for x in c).replace(" ", "")
)
def test_gpu_split_cluster_is_the_global_fixup(case):
    """split_k 2 on a 2x1 decode cluster (split 1's partial through distributed SMEM) on X, then
    Y, then X, queued back to back: each D has the bits of the global fix-up's D on the same
    operands (the same order of the fp32 sums), matches the reference and is stored inside D
    only; X twice gives the same bits (nothing of a launch leaks into the next)."""
    import torch

    import reference

    m, n, k, l, vec, a_dtype, c_dtype, tiler = case  # noqa: E741
    w4a16 = a_dtype != k90.W4A4
    base = _config((m, n, k, l), vec, c_dtype, "decode", tiler, 2, 1, a_dtype)
    clustered = replace(base, cluster_shape_mn=(2, 1))
    assert clustered.reasons((m, n, k, l)) == []
    runs = []
    for seed in (3, 4):
        if w4a16:
            a, ops = _w4a16_operands(m, n, k, l, vec, a_dtype, seed)
            operands = (a, k_order.prepack_weights(ops.b), None, r90.blocked_scales(ops.sfb))
        else:
            ops = reference.make_fp4_operands(m, n, k, l, vec, "cuda", seed=seed, dist="wide")
            operands = (ops.a, ops.b, r90.blocked_scales(ops.sfa), r90.blocked_scales(ops.sfb))
        runs.append((ops, operands, _alpha(float(ops.alpha))))
    outs = {}
    for config in (base, clustered):
        scratch = torch.empty((l, m, n), dtype=k90.torch_dtype(c_dtype), device="cuda")
        _warm_up(config, *runs[0][1], scratch)
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)
        for ops, operands, alpha in (runs[0], runs[1], runs[0]):
            d, guarded = _nan_filled_d((l, m, n), k90.torch_dtype(c_dtype))
            r90.gemm(*operands, alpha, d, config)
            outs.setdefault(config, []).append((ops, operands, d, guarded))
        torch.cuda.synchronize()
    pairs = zip(outs[clustered], outs[base], strict=True)
    for (ops, operands, d, guarded), (_, _, want, _) in pairs:
        alpha = float(ops.alpha)
        if w4a16:
            ok, info = reference.check_gemm_w4a16(d, operands[0], ops.b, ops.sfb, vec, alpha)
        else:
            ok, info = reference.check_gemm(d, ops.a, ops.b, ops.sfa, ops.sfb, vec, alpha)
        assert ok, str(info)
        _assert_guards_untouched(guarded, d)
        assert torch.equal(d.view(torch.uint8), want.view(torch.uint8))
    first, again = outs[clustered][0][2], outs[clustered][2][2]
    assert torch.equal(first.view(torch.uint8), again.view(torch.uint8))


_B = 2.0**25
# Partials of one output per k-tile (1, +-2^25 or 0) and the fp32 sum in the documented order
# (docs/sm90_design.md, "Split-K and K groups"): the split-K fix-up adds the splits' partials in
# split order from 0 (0 + p0 + p1 + ...), group 0 adds the K groups' in group order. The exact
# sum is 1; 2^25 + 1 rounds to 2^25 and -2^25 + 1 to -2^25 (ties to even), so only that order
# gives these values.
CANCELLATION_SPLITS = [
    ((1, _B, -_B), 0.0),
    ((_B, -_B, 1), 1.0),
    ((_B, 1, -_B), 0.0),
    ((-_B, _B, 1), 1.0),
    ((1, -_B, _B), 0.0),
    ((-_B, 1, _B), 0.0),
]
CANCELLATION_K_GROUPS = [
    ((0, 1, _B, -_B), 0.0),
    ((0, _B, -_B, 1), 1.0),
    ((1, _B, -_B, 0), 0.0),
    ((0, -_B, 1, _B), 0.0),
    ((_B, 0, -_B, 1), 1.0),
]


def _cancellation_operands(vec: int, partials: list[tuple], device: str = "cuda"):
    """One token row and one weight row per partials tuple whose dot product's part in k-tile t
    is partials[t], exactly: 1 = 1 x 1 at the k-tile's first K, +-2^25 = 32 products
    (+-4 x 2^8) x (4 x 2^8) at its K 32..63 (scale blocks of 2^8).  Returns (a, b, sfa, sfb),
    unswizzled scales."""
    import torch

    import reference

    k_tiles = len(partials[0])
    k = k90.K_TILE * k_tiles
    one, big = (0x38, 0x78) if vec == 16 else (127, 135)  # 1.0 and 2^8 in E4M3 / E8M0
    a = torch.zeros((1, 1, k), dtype=torch.uint8)
    b = torch.zeros((1, len(partials), k), dtype=torch.uint8)
    sfa = torch.full((1, 1, k // vec), one, dtype=torch.uint8)
    sfb = torch.full((1, len(partials), k // vec), one, dtype=torch.uint8)
    for t in range(k_tiles):
        k0 = k90.K_TILE * t
        a[0, 0, k0] = 2  # e2m1 1.0
        a[0, 0, k0 + 32 : k0 + 64] = 6  # e2m1 4.0
        sfa[0, 0, (k0 + 32) // vec : (k0 + 64) // vec] = big
        sfb[0, :, (k0 + 32) // vec : (k0 + 64) // vec] = big
        for row, parts in enumerate(partials):
            sign = 8 if parts[t] < 0 else 0
            if abs(parts[t]) == 1:
                b[0, row, k0] = 2 | sign
            elif abs(parts[t]) == _B:
                b[0, row, k0 + 32 : k0 + 64] = 6 | sign
    dtype = reference.SCALE_DTYPES[vec]
    packed = (reference.pack_fp4(x).to(device) for x in (a, b))
    return (*packed, sfa.view(dtype).to(device), sfb.view(dtype).to(device))


@gpu
@pytest.mark.parametrize(
    "vec, path, tiler, split, k_groups",
    [
        (16, "decode", (8, 64), 3, 1),
        (32, "decode", (8, 64), 3, 1),
        (16, "prefill", (128, 128), 3, 1),
        (16, "decode", (8, 64), 1, 4),
    ],
    ids=["nvfp4-split3", "mxfp4-split3", "prefill-split3", "kgroups4"],
)
def test_gpu_partials_are_summed_in_documented_order(vec, path, tiler, split, k_groups):
    """Partials 1, +2^25, -2^25 in the k-tiles of one split (or K group) each: D is the fp32
    sum in split (group) order from 0, which is 0 where 1 comes before the cancelling pair; a
    fix-up summing in another order, or counting its own partial twice, gives other values."""
    import torch

    import reference

    table = CANCELLATION_K_GROUPS if k_groups > 1 else CANCELLATION_SPLITS
    partials = [p for p, _ in table]
    a, b, sfa, sfb = _cancellation_operands(vec, partials)
    m, n, k, l = 1, len(partials), k90.K_TILE * len(partials[0]), 1  # noqa: E741
    # the construction: the exact sums are 1
    ref = reference.reference_gemm(
        a, b, sfa, sfb, vec, 1.0, torch.float64, accum_dtype=torch.float64
    )
    assert ref.flatten().tolist() == [1.0] * n
    config = _config((m, n, k, l), vec, "Float32", path, tiler, split, k_groups)
    d = torch.full((l, m, n), float("nan"), dtype=torch.float32, device="cuda")
    blocked = (r90.blocked_scales(sfa), r90.blocked_scales(sfb))
    r90.gemm(a, b, *blocked, _alpha(1.0), d, config)
    torch.cuda.synchronize()
    assert d.flatten().tolist() == [want for _, want in table]


@gpu
@pytest.mark.parametrize(
    "config",
    [
        ("--path", "prefill", "--cluster_shape_mn", "2,1"),
        ("--path", "prefill", "--cluster_shape_mn", "1,1"),
        (),  # default_config: decode, two token tiles
    ],
    ids=["prefill-2x1", "prefill-1x1", "default"],
)
def test_gpu_cli_small(config):
    r = _cli(
        *("--mnkl", "200,384,1056,2", *config),
        *("--iterations", "2", "--warmup_iterations", "1"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Mean time:" in r.stdout and "TFLOP/s" in r.stdout and "PASS" in r.stdout


def test_bench_table_flags_a_failed_check():
    """``benchmarks.sm90`` prints every measured row, the speed-up over cuBLAS BF16, and marks a
    row whose result did not match the reference."""
    from benchmarks import sm90 as bench

    ours = dict(us=10.0, tflops=1.0, gbps=100.0, roof_pct=50.0, check=True)
    rows = [
        {"m": 1, "n": 64, "k": 64, "ours-nvfp4": ours, "cublas-bf16": dict(us=25.0)},
        {"m": 2, "n": 64, "k": 64, "ours-nvfp4": dict(ours, check=False)},
    ]
    lines = bench.format_table(rows, 4e12).splitlines()
    assert lines[0] == "copy bandwidth (roof): 4.00 TB/s"
    first, second = (line for line in lines if line.lstrip().startswith(("1 ", "2 ")))
    assert "2.50x" in first and "CHECK FAILED" not in first
    assert "CHECK FAILED" in second


# ------------------------------------------------------------------------------ W4A16
W4A16_COMPILE = [
    # (sf_vec_size, a_dtype, c_dtype, path, mma_tiler_mn, split_k, tma_store, k_groups)
    (16, "BFloat16", "BFloat16", "decode", (16, 128), 1, True, 1),
    (16, "Float16", "Float32", "decode", (64, 128), 4, True, 1),
    # (the W4A16 pick for long units on 64-token tiles: split-K 128 rows, no TMA-store staging)
    (16, "BFloat16", "BFloat16", "decode", (64, 128), 4, False, 1),
    (16, "BFloat16", "BFloat16", "decode", (128, 128), 2, True, 1),
    (32, "BFloat16", "Float16", "decode", (8, 64), 2, False, 4),
    (16, "BFloat16", "BFloat16", "prefill", (128, 256), 1, True, 1),
    (16, "Float16", "Float16", "prefill", (128, 256), 1, True, 1),
    (32, "BFloat16", "Float32", "prefill", (64, 128), 1, False, 1),
]


# (sf_vec_size, D, token tile x weight rows, K split, K groups): the grouped kernel's splits
GROUPED_SPLIT_COMPILE = [
    (16, "BFloat16", (8, 128), 6, 1),
    (16, "Float32", (8, 128), 2, 1),
    (16, "BFloat16", (8, 64), 2, 4),
    (32, "BFloat16", (16, 64), 4, 1),
    (16, "Float16", (64, 128), 2, 1),
]


@pytest.mark.parametrize("cfg", GROUPED_SPLIT_COMPILE, ids=lambda c: "-".join(map(str, c)))
def test_grouped_split_cross_compiles_without_local_memory(cfg, tmp_path):
    """The grouped kernel with K splits compiles for sm_90a to one kernel that keeps its
    split-K partials, fix-up and schedule in registers: no stack, no local memory."""
    vec, c_dtype, tiler, split, k_groups = cfg
    opts = f"--gpu-arch sm_90a --keep-cubin --dump-dir={tmp_path}"
    config = (vec, c_dtype, "decode", tiler, split, k90.H200_SM_COUNT, opts, None, False)
    k90.compile_gemm(*config, k_groups, "BFloat16", grouped=True)
    (cubin,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path) if f.endswith(".cubin")]
    tool = devtools.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    kernels = re.findall(r"Function (\w+):\s*REG:\d+ STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert len(kernels) == 1 and kernels[0][1:] == ("0", "0"), usage
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    assert not re.search(r"\b(LDL|STL)\b", sass) and "ATOMG" in sass


@pytest.mark.filterwarnings("error::DeprecationWarning")
@pytest.mark.parametrize("cfg", W4A16_COMPILE, ids=lambda c: "-".join(str(x) for x in c))
def test_w4a16_cross_compile_sm90a(cfg, tmp_path):
    """W4A16 compiles for sm_90a: the activations' type in wgmma with FP32 accumulation, TMA
    loads, no local memory; decode is the GEMM kernel alone (no convert_operands); producer and
    consumers wait for the grid ahead before any load or store (no prologue grid stands between:
    that grid may write the weights); prefill converts the weights only; alpha * 2^7 exactly
    where F16 weights carry 2^-7."""
    vec, a_dtype, c_dtype, path, tiler, split, tma_store, k_groups = cfg
    config = (vec, c_dtype, path, tiler, split, tma_store, k_groups, a_dtype)
    gemm, ptx, cubin = _cross_compile(str(tmp_path), *config)
    gemm_ptx = _entry_ptx(ptx, "kernel_cutlass_kernel")
    ab = "f16" if a_dtype == "Float16" else "bf16"
    tile_cols = k90.kernel_tile(path, tiler)[1]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_cols}k16\.f32\.{ab}\.{ab}", ptx)
    assert "cp.async.bulk.tensor" in gemm_ptx
    assert ("convert_operands" in ptx) == (path == "prefill")
    waits = gemm_ptx.count("griddepcontrol.wait")
    # producer and consumers wait for the grid ahead; alpha is read from memory after that
    assert waits == 2, waits
    early = gemm_ptx[: gemm_ptx.index("griddepcontrol.wait")]
    loads = re.findall(r"cp\.async\.bulk\.tensor\.\S*shared::\w+\.global", early)
    assert not loads, loads
    assert not re.search(r"\b(ld|st|atom|red)\.[\w:.]*global", early)
    assert re.search(r"\bld\.global\.(b32|f32)", gemm_ptx)
    prescaled = vec == 16 and a_dtype == "BFloat16" and path == "decode"
    if prescaled:
        # one packed multiply per pair (8 pairs x 2 rows x 2 k-blocks a stage); a lane converts
        # one scale per row and k-block and takes its quad's four by shuffles
        assert gemm_ptx.count("mul.rn.bf16x2") == 32
        assert gemm_ptx.count("cvt.rn.f16x2.e4m3x2") == gemm_ptx.count("cvt.rn.bf16x2.f32") == 4
        quad = [ln for ln in gemm_ptx.splitlines() if "shfl.sync.idx" in ln and "7171" in ln]
        assert len(quad) == 16, quad  # (7171: segments of 4 lanes, k90.QUAD_SHUFFLE)
    if vec == 32 and path == "decode":
        # MXFP4: two multiplies per pair, or one in stages whose scales are all <= 1, picked by
        # one warp vote per stage
        assert gemm_ptx.count("mul.rn.bf16x2") == 64 + 32
    assert gemm_ptx.count("vote.sync.all.pred") == (vec == 32 and path == "decode")
    scales = {2.0**7: a_dtype == "Float16", 2.0**8: prescaled, 2.0**14: False}
    for value, present in scales.items():
        assert (("0f" + struct.pack(">f", value).hex().upper()) in gemm_ptx) == present, value
    tool = devtools.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    kernels = re.findall(r"Function (\w+):\s*REG:\d+ STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert len(kernels) == (1 if path == "decode" else 2), usage
    assert all(stack == "0" and local == "0" for _, stack, local in kernels), usage
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    assert not re.search(r"\b(LDL|STL)\b", sass) and "UTMALDG" in sass
    assert ("UTMASTG" in sass) == gemm.tma_store


def test_w4a16_config_checks():
    """W4A16's own rules: the activation types, MXFP4 needs BF16 activations, the extents of
    activations and prepacked weights, alpha's bound with F16 weights (2^-7 each)."""
    check = k90.check_fp4_gemm_config
    base = dict(c_dtype="BFloat16", path="decode", mma_tiler_mn=(16, 128), cluster_shape_mn=(1, 1))
    assert check((16, 4096, 4096, 1), 16, "Float8E4M3FN", **base, a_dtype="BFloat16") == []
    assert check((16, 4096, 4096, 1), 16, "Float8E4M3FN", **base, a_dtype="Float16") == []
    reasons = check((16, 4096, 4096, 1), 32, "Float8E8M0FNU", **base, a_dtype="Float16")
    assert any("MXFP4" in r and "BFloat16 activations" in r for r in reasons), reasons
    prefill = base | dict(path="prefill", mma_tiler_mn=(128, 256), cluster_shape_mn=(2, 1))
    reasons = check((4096, 4096, 4096, 1), 32, "Float8E8M0FNU", **prefill, a_dtype="Float16")
    assert any("MXFP4" in r and "BFloat16 activations" in r for r in reasons), reasons
    reasons = check((16, 4096, 4096, 1), 16, "Float8E4M3FN", **base, a_dtype="Float32")
    assert any("a_dtype=Float32 is not supported" in r for r in reasons), reasons
    # activations are counted in elements: M*K*L >= 2^31 is refused for W4A16 only
    big = (2**16, 64, 2**15, 1)
    assert any("M*K*L" in r for r in check(big, 16, "Float8E4M3FN", **base, a_dtype="BFloat16"))
    assert not any("M*K" in r for r in check(big, 16, "Float8E4M3FN", **base))
    assert k90.alpha_reason(2.0**120, 16, "decode", "Float16") is None
    assert "2^121" in k90.alpha_reason(2.0**121, 16, "decode", "Float16")
    assert k90.acc_scale(16, "prefill", "Float16") == 2.0**7
    assert k90.acc_scale(16, "decode", "BFloat16") == 2.0**8
    assert k90.acc_scale(16, "prefill", "BFloat16") == k90.acc_scale(32, "decode", "BFloat16") == 1
    assert "2^120" in k90.alpha_reason(2.0**121, 16, "decode", "BFloat16")
    # the same path rule as W4A4; a W4A16 decode has no token copy to bound
    assert k90.default_config(16, 8192, 8192, 1, a_dtype="BFloat16")[0] == "decode"
    assert k90.default_config(4096, 8192, 8192, 1, a_dtype="BFloat16")[0] == "prefill"


def test_w4a16_gemm_operand_checks():
    import torch

    m, n, k, l = 16, 64, 96, 1  # noqa: E741
    config = r90.GemmConfig.for_problem((m, n, k, l), 16, "BFloat16", "BFloat16", num_sms=132)
    good = _cpu_operands(m, n, k, l, a_dtype="BFloat16")
    assert _refusal(config, **good) == _cuda_refusals("a", "b", "sfb", "out")
    # without a config: the activations' dtype says W4A16
    assert _refusal(**good, sf_vec_size=16) == _cuda_refusals("a", "b", "sfb", "out")
    unpacked = dict(good, b=torch.zeros(l, n, k // 2, dtype=torch.uint8))
    want = "b has shape (1, 64, 48); prepack_weights' output for (M, N, K, L) = (16, 64, 96, 1)"
    assert want in _refusal(config, **unpacked)
    f16 = dict(good, a=torch.zeros(l, m, k, dtype=torch.float16))
    assert "a is torch.float16; config.a_dtype is BFloat16" in _refusal(config, **f16)
    scaled = dict(good, sfa=torch.zeros(l, 128 * 8, dtype=torch.uint8))
    assert "sfa must be None: W4A16 activations have no scales" in _refusal(config, **scaled)


def test_w4a16_cli_compile_only_and_refusal(tmp_path):
    r = _cli(
        "--mnkl",
        "16,4096,4096,1",
        "--a_dtype",
        "BFloat16",
        "--compile_only",
        "--dump_dir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "A dtype: BFloat16, B dtype: Float4E2M1FN" in r.stdout
    assert "prologue (convert_operands): none" in r.stdout
    r = _cli("--a_dtype", "Float16", "--sf_vec_size", "32", "--compile_only")
    assert r.returncode == 2 and "BFloat16 activations" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


W4A16_GPU_CASES = [
    # (m, n, k, l, sf_vec_size, a_dtype, c_dtype, path, mma_tiler_mn, split_k, alpha, k_groups)
    (1, 1000, 2080, 1, 16, "BFloat16", "BFloat16", "decode", (8, 128), 1, 2.0, 1),
    (5, 1000, 4000, 2, 32, "BFloat16", "Float32", "decode", (8, 64), 3, 1.0, 1),
    (16, 777, 1056, 2, 16, "Float16", "Float32", "decode", (16, 64), 3, 0.25, 1),
    (30, 520, 1056, 2, 32, "BFloat16", "Float16", "decode", (32, 128), 2, -1.5, 1),
    (100, 300, 800, 1, 16, "Float16", "Float16", "decode", (128, 128), 1, 1.0, 1),
    # a ragged token tile read in 32-row boxes (box 3 wholly past M), both batches, split-K;
    # one read whole (its last box, rows 96-127, holds rows 96-112)
    (70, 520, 1056, 2, 16, "BFloat16", "BFloat16", "decode", (128, 128), 2, 1.0, 1),
    (113, 520, 1056, 2, 16, "BFloat16", "BFloat16", "decode", (128, 128), 2, 1.0, 1),
    # ragged token tiles of 64 tokens (16-row boxes) and 32 (read whole, K groups); M > K (the
    # boxes past M are M's, not K's)
    (40, 520, 1056, 1, 32, "BFloat16", "Float32", "decode", (64, 128), 1, 1.0, 1),
    # split-K 128-row tiles of 64 tokens (default_config's pick for long units): ragged and whole
    (40, 776, 4160, 2, 16, "BFloat16", "BFloat16", "decode", (64, 128), 4, 0.5, 1),
    (64, 520, 4096, 1, 32, "BFloat16", "Float16", "decode", (64, 128), 2, 1.0, 1),
    (64, 392, 4096, 1, 16, "Float16", "Float32", "decode", (64, 128), 8, 2.0, 1),
    (10, 520, 1056, 1, 16, "Float16", "BFloat16", "decode", (32, 64), 1, 1.0, 4),
    (200, 264, 64, 1, 16, "BFloat16", "BFloat16", "decode", (128, 128), 1, 1.0, 1),
    (8, 1001, 1024, 1, 16, "BFloat16", "BFloat16", "decode", (8, 128), 1, 1.0, 1),
    (20, 520, 64, 1, 16, "BFloat16", "BFloat16", "decode", (32, 64), 2, 1.0, 4),
    (1, 1000, 2080, 1, 16, "Float16", "BFloat16", "decode", (8, 64), 1, 2.0, 4),
    (300, 520, 2080, 2, 16, "BFloat16", "BFloat16", "decode", (128, 128), 1, 0.7, 1),
    (16, 4096, 4096, 1, 32, "BFloat16", "BFloat16", "decode", (16, 128), 2, 1.0, 1),
    (300, 520, 224, 2, 16, "BFloat16", "BFloat16", "prefill", (128, 256), 1, 0.7, 1),
    (257, 129, 1056, 1, 32, "BFloat16", "Float16", "prefill", (128, 256), 1, 1.0, 1),
    (200, 300, 544, 3, 16, "Float16", "Float32", "prefill", (64, 128), 1, -1.5, 1),
    (1024, 1024, 2048, 1, 16, "Float16", "BFloat16", "prefill", (128, 256), 1, 1.0, 1),
    # MXFP4 decode stages whose scales are all <= 1 (normal weights), and stages and warps of
    # both kinds in one GEMM (13th field: the weights' distribution; default "wide")
    (5, 1000, 4000, 2, 32, "BFloat16", "Float32", "decode", (8, 64), 3, 1.0, 1, "normal"),
    (16, 4096, 4096, 1, 32, "BFloat16", "BFloat16", "decode", (16, 64), 1, 1.0, 4, "mixed"),
    (130, 520, 1056, 1, 32, "BFloat16", "BFloat16", "decode", (128, 128), 1, 1.0, 1, "mixed"),
    (16, 4096, 4096, 1, 32, "BFloat16", "BFloat16", "decode", (16, 128), 2, 1.0, 1, "alternating"),
]


def _w4a16_operands(m, n, k, l, vec, a_dtype, seed, dist="wide"):  # noqa: E741
    """Random activations of ``a_dtype`` (normal, a wide exponent range), FP4 weights of
    ``reference.make_fp4_operands``' ``dist``, or normal weights whose E8M0 scales (all <= 1)
    are raised 2^4-fold in every third 16-row band (a warp's rows in the MXFP4 decode mainloop):
    "mixed" in every other scale column (those warps take the two-multiply branch in every
    stage, the others the one-multiply branch), "alternating" in every other k-tile (those
    warps switch branches from stage to stage)."""
    import torch

    import reference

    raised = dist in ("mixed", "alternating")
    ops = reference.make_fp4_operands(
        m, n, k, l, vec, "cuda", seed=seed, dist="normal" if raised else dist
    )
    if raised:
        sf = ops.sfb.view(torch.uint8)
        assert int(sf.max()) <= 127
        rows = torch.arange(n, device="cuda") // 16 % 3 == 0
        col = torch.arange(sf.shape[-1], device="cuda")
        cols = (col if dist == "mixed" else col // (k90.K_TILE // vec)) % 2 == 0
        sf += 4 * (rows[:, None] & cols[None, :]).to(torch.uint8)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    act = torch.randn((l, m, k), generator=gen, device="cuda")
    act = act * torch.exp2(torch.randint(-8, 8, (l, m, k), generator=gen, device="cuda"))
    return act.to(k90.torch_dtype(a_dtype)), ops


@gpu
@pytest.mark.parametrize("case", W4A16_GPU_CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_gpu_w4a16_matches_reference(case):
    """W4A16 against the product of the activations and the dequantized
    weights (``reference.check_gemm_w4a16``'s derived bound), twice back to back on different
    operands (PDL: the second GEMM must not read or write before the first is done)."""
    import torch

    import reference

    m, n, k, l, vec, a_dtype, c_dtype, path, tiler, split, alpha_factor, k_groups = case[:12]  # noqa: E741
    dist = case[12] if len(case) > 12 else "wide"
    config = _config((m, n, k, l), vec, c_dtype, path, tiler, split, k_groups, a_dtype)
    runs = []
    for seed in (m + n + k, m + n + k + 1):
        a, ops = _w4a16_operands(m, n, k, l, vec, a_dtype, seed, dist)
        alpha = float(ops.alpha) * alpha_factor
        d, guarded = _nan_filled_d((l, m, n), k90.torch_dtype(c_dtype))
        b, sfb = k_order.prepack_weights(ops.b), r90.blocked_scales(ops.sfb)
        runs.append((a, ops, b, sfb, alpha, d, guarded, _alpha(alpha)))
    _warm_up(config, runs[0][0], runs[0][2], None, runs[0][3], runs[0][5])
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000)
    for a, _, b, sfb, _, d, _, alpha in runs:
        r90.gemm(a, b, None, sfb, alpha, d, config)
    torch.cuda.synchronize()
    for a, ops, _, _, alpha, d, guarded, _ in runs:
        ok, info = reference.check_gemm_w4a16(d, a, ops.b, ops.sfb, vec, alpha)
        assert ok, str(info)
        _assert_guards_untouched(guarded, d)


@gpu
def test_gpu_w4a16_stores_after_the_grid_ahead():
    """A W4A16 decode launch with units without k-tiles (one k-tile, split 2) whose D is the
    memory of the D of the GEMM ahead of it, which releases its PDL dependents before it
    stores: the second launch's stores (zero-k-tile units included) must land after."""
    import torch

    import reference

    (m1, n1, k1), (m2, n2, k2) = (1, 10400, 2048), (20, 520, 64)
    writer = _config((m1, n1, k1, 1), 16, "BFloat16", "decode", (8, 128), 4, 1, "BFloat16")
    reader = _config((m2, n2, k2, 1), 16, "BFloat16", "decode", (32, 64), 2, 4, "BFloat16")
    a1, ops1 = _w4a16_operands(m1, n1, k1, 1, 16, "BFloat16", 3)
    a2, ops2 = _w4a16_operands(m2, n2, k2, 1, 16, "BFloat16", 4)
    b1, b2 = k_order.prepack_weights(ops1.b), k_order.prepack_weights(ops2.b)
    sfb1, sfb2 = r90.blocked_scales(ops1.sfb), r90.blocked_scales(ops2.sfb)
    outs = [torch.full((1, m1, n1), float("nan"), dtype=torch.bfloat16, device="cuda")]
    outs += [torch.full_like(outs[0], float("nan")) for _ in range(4)]
    _warm_up(writer, a1, b1, None, sfb1, outs[0])
    _warm_up(reader, a2, b2, None, sfb2, outs[0].view(1, m2, n2))
    alpha1, alpha2 = _alpha(1.0), _alpha(float(ops2.alpha))
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    for d1 in outs:
        r90.gemm(a1, b1, None, sfb1, alpha1, d1, writer)
        r90.gemm(a2, b2, None, sfb2, alpha2, d1.view(1, m2, n2), reader)
    torch.cuda.synchronize()
    for d1 in outs:
        ok, info = reference.check_gemm_w4a16(
            d1.view(1, m2, n2), a2, ops2.b, ops2.sfb, 16, ops2.alpha
        )
        assert ok, str(info)


@gpu
@pytest.mark.parametrize("a_dtype, vec", [("BFloat16", 32), ("Float16", 16)])
def test_gpu_w4a16_cli(a_dtype, vec):
    r = _cli(
        *("--mnkl", "200,384,1056,2", "--a_dtype", a_dtype, "--sf_vec_size", str(vec)),
        *("--iterations", "2", "--warmup_iterations", "1"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    check = "Reference check (float64 product of the dequantized operands): 0/"
    assert check in r.stdout and r.stdout.rstrip().endswith("PASS"), r.stdout


@gpu
def test_gpu_w4a16_reads_weights_after_the_grid_ahead():
    """W4A16 decode has no prologue grid: the GEMM ahead (which releases its PDL dependents
    before it stores D) writes this launch's prepacked weights, so the producer must wait for
    it before its first weight load.  Five pairs queued back to back."""
    import torch

    import reference

    (m1, n1, k1), (m2, n2, k2) = (13, 10240, 2048), (16, 520, 1024)
    writer = _config((m1, n1, k1, 1), 16, "BFloat16", "decode", (16, 128), 2, 1, "BFloat16")
    reader = _config((m2, n2, k2, 1), 16, "BFloat16", "decode", (16, 128), 1, 1, "BFloat16")
    a1, ops1 = _w4a16_operands(m1, n1, k1, 1, 16, "BFloat16", 5)
    a2, ops2 = _w4a16_operands(m2, n2, k2, 1, 16, "BFloat16", 6)
    b1, sfb1, sfb2 = k_order.prepack_weights(ops1.b), *map(r90.blocked_scales, (ops1.sfb, ops2.sfb))
    assert m1 * n1 * 2 == n2 * k2 // 2  # the writer's D is exactly the reader's weights
    outs = [torch.full((1, m1, n1), float("nan"), dtype=torch.bfloat16, device="cuda")]
    outs += [torch.full_like(outs[0], float("nan")) for _ in range(4)]
    d2s = [torch.empty(1, m2, n2, dtype=torch.bfloat16, device="cuda") for _ in outs]
    weights = [d1.view(torch.uint8).view(1, n2, k2 // 2) for d1 in outs]
    _warm_up(writer, a1, b1, None, sfb1, outs[0])
    _warm_up(reader, a2, weights[0], None, sfb2, d2s[0])
    alphas, one = [_alpha(float(1 + i)) for i in range(len(outs))], _alpha(1.0)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    for d1, d2, w, alpha in zip(outs, d2s, weights, alphas, strict=True):
        r90.gemm(a1, b1, None, sfb1, alpha, d1, writer)
        r90.gemm(a2, w, None, sfb2, one, d2, reader)
    torch.cuda.synchronize()
    for d1, d2 in zip(outs, d2s, strict=True):
        plain = k_order.unprepack_weights(d1.view(torch.uint8).view(1, n2, k2 // 2), k2)
        ok, info = reference.check_gemm_w4a16(d2, a2, plain, ops2.sfb, 16, 1.0)
        assert ok, str(info)


@gpu
def test_gpu_gemm_streams_graphs_and_alpha():
    """One split-K configuration on two streams at once (a workspace each: their tile counters
    must not mix), the second time through torch streams wrapping the same CUstreams (the same
    workspaces); a one-element device alpha changed between CUDA-graph replays; the first call
    of a shape under capture refused."""
    import torch

    import reference

    m, n, k = 16, 4096, 4096
    config = _config((m, n, k, 1), 16, "BFloat16", "decode", (16, 128), 4)
    runs = []
    for seed in range(4):
        ops = reference.make_fp4_operands(m, n, k, 1, 16, "cuda", seed=seed)
        sf = (r90.blocked_scales(ops.sfa), r90.blocked_scales(ops.sfb))
        d = torch.empty(1, m, n, dtype=torch.bfloat16, device="cuda")
        runs.append((ops, sf, d, _alpha(float(ops.alpha))))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            _warm_up(config, runs[0][0].a, runs[0][0].b, *runs[0][1], runs[0][2])
    torch.cuda.synchronize()
    for s in streams:
        with torch.cuda.stream(s):
            torch.cuda._sleep(20_000_000)
    kernels = r90.cache_size()
    for i, (ops, sf, d, alpha) in enumerate(runs):
        s = streams[i % 2]
        stream = s if i < 2 else torch.cuda.ExternalStream(s.cuda_stream)
        with torch.cuda.stream(stream):
            r90.gemm(ops.a, ops.b, *sf, alpha, d, config)
    torch.cuda.synchronize()
    assert r90.cache_size() == kernels
    for ops, _, d, _ in runs:
        ok, info = reference.check_gemm(d, ops.a, ops.b, ops.sfa, ops.sfb, 16, ops.alpha)
        assert ok, str(info)
    ops, sf, d, _ = runs[1]
    alpha, fixed = _alpha(0.5), _alpha(0.37)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=streams[0]):
        r90.gemm(ops.a, ops.b, *sf, fixed, runs[2][2], config)
        r90.gemm(ops.a, ops.b, *sf, alpha, d, config)
    for value in (0.5, -3.0):
        alpha.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        for out, want in ((runs[2][2], 0.37), (d, value)):
            ok, info = reference.check_gemm(out, ops.a, ops.b, ops.sfa, ops.sfb, 16, want)
            assert ok, str(info)
    # a shape new to the stream: its workspace cannot be allocated under capture
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph on that stream"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=streams[0]):
            r90.gemm(ops.a[:, :8], ops.b, *sf, alpha, d[:, :8], config)


def test_cli_refuses_a_dump_dir_without_compile_only(tmp_path):
    """``--dump_dir`` is where ``--compile_only`` writes; a run writes nothing there, so the
    option alone would be ignored: exit 2 naming it, before any GPU check."""
    proc = _cli("--mnkl", "128,128,128,1", "--dump_dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "--dump_dir is where --compile_only writes" in proc.stderr
    assert "Traceback" not in proc.stderr
