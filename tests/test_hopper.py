# SPDX-License-Identifier: BSD-3-Clause
"""Tests of the Hopper (sm_90a) NVFP4 / MXFP4 GEMM, hopper/blockwise_gemm_fp4_sm90.py.

CPU (any machine, CI): cross-compile several configurations for sm_90a and check the PTX and
SASS (TMA loads, F16 / BF16 wgmma with FP32 accumulation, no local memory); the exactness of
the NVFP4 F16 conversion; every can_implement refusal; the command line's error exits.
GPU (H100 / H200 only, skipped elsewhere): results against reference.check_gemm over ragged
shapes, both formats, every output dtype, alpha != 1, L > 1, decode (tiles of 8 to 128 tokens,
the tokens converted by the prologue grid) and prefill (2x1 cluster and 1x1) paths, split-K,
CTAs with several work units.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import subprocess
import sys

import pytest

import blockwise_gemm_fp4 as k100
from hopper import blockwise_gemm_fp4_sm90 as k90

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "hopper", "blockwise_gemm_fp4_sm90.py")


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


def _entry_ptx(ptx: str, name: str) -> str:
    """The PTX of one kernel: from its ``.entry`` line to the next kernel's (or the end)."""
    start = ptx.index(f".entry {name}")
    end = ptx.find(".entry", start + 1)
    return ptx[start:] if end < 0 else ptx[start:end]


@pytest.mark.filterwarnings("error::DeprecationWarning")
@pytest.mark.parametrize("cfg", COMPILE_CONFIGS, ids=lambda c: "-".join(str(x) for x in c))
def test_cross_compile_sm90a(cfg, tmp_path):
    vec, c_dtype, path, tiler, split = cfg[:5]
    tma_store = cfg[5] if len(cfg) > 5 else True
    k_groups = cfg[6] if len(cfg) > 6 else 1
    dump = str(tmp_path)
    opts = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir={dump}"
    gemm, _ = k90.compile_gemm(
        vec,
        c_dtype,
        path,
        tiler,
        split,
        k90.H200_SM_COUNT,
        opts,
        tma_store=tma_store,
        k_groups=k_groups,
    )
    ptx_files = [f for f in os.listdir(dump) if f.endswith(".ptx")]
    cubins = [f for f in os.listdir(dump) if f.endswith(".cubin")]
    assert ptx_files and cubins, os.listdir(dump)
    ptx = open(os.path.join(dump, ptx_files[0])).read()
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
    assert gemm_ptx.count("griddepcontrol.wait") == 1
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
    tool = k90.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    cubin = os.path.join(dump, cubins[0])
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
    assert k90.smem_bytes(gemm) <= k90.SM90_SMEM_CAPACITY
    assert gemm.occupancy * (k90.smem_bytes(gemm) + 1024) <= k90.SM90_SMEM_PER_SM
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
        smem = gemm.occupancy * (k90.smem_bytes(gemm) + 1024) + 1024
        assert smem <= k90.SM90_SMEM_PER_SM
    if k_groups > 1:
        # two stages or more per group, each stage owned by one group (phase parity waits)
        assert gemm.num_stages % k_groups == 0 and gemm.num_stages >= 2 * k_groups
        assert "ld.shared.f32" in ptx and "st.shared.f32" in ptx


def test_operand_reasons_name_each_problem():
    import torch

    m, n, k, l = 16, 64, 256, 1  # noqa: E741
    sf = l * 128 * (k // 16 // 4 * 4)
    good = dict(
        a=torch.zeros(m * k // 2, dtype=torch.uint8),
        b=torch.zeros(n * k // 2, dtype=torch.uint8),
        sfa_blocked=torch.zeros(sf, dtype=torch.uint8),
        sfb_blocked=torch.zeros(sf, dtype=torch.uint8),
        d=torch.zeros(m * n, dtype=torch.bfloat16),
    )
    reasons = k90.operand_reasons(**good, mnkl=(m, n, k, l), sf_vec_size=16, c_dtype="BFloat16")
    # CPU tensors: only the device rule fails
    assert reasons and all("contiguous CUDA tensor" in r for r in reasons), reasons
    shifted = dict(good, a=torch.zeros(m * k // 2 + 1, dtype=torch.uint8)[1:])
    reasons = k90.operand_reasons(**shifted, mnkl=(m, n, k, l), sf_vec_size=16, c_dtype="BFloat16")
    assert any("a must start on a 16-byte boundary" in r for r in reasons), reasons
    short = dict(good, sfb_blocked=torch.zeros(sf - 16, dtype=torch.uint8))
    reasons = k90.operand_reasons(**short, mnkl=(m, n, k, l), sf_vec_size=16, c_dtype="BFloat16")
    assert any(f"sfb_blocked has {sf - 16} bytes" in r for r in reasons), reasons
    # packed operands are counted in bytes whatever their dtype
    wide = dict(good, a=torch.zeros(m * k // 4 + 1, dtype=torch.int16))
    reasons = k90.operand_reasons(**wide, mnkl=(m, n, k, l), sf_vec_size=16, c_dtype="BFloat16")
    assert any(f"a has {2 * (m * k // 4 + 1)} bytes" in r for r in reasons), reasons
    # D must have the dtype the kernel writes: same size in elements is not enough
    for c_dtype, other in (("BFloat16", torch.float32), ("Float32", torch.bfloat16)):
        wrong = dict(good, d=torch.zeros(m * n, dtype=other))
        reasons = k90.operand_reasons(**wrong, mnkl=(m, n, k, l), sf_vec_size=16, c_dtype=c_dtype)
        assert any(f"d is {other}; this kernel writes {c_dtype}" in r for r in reasons), reasons
    reasons = k90.operand_reasons(**good, mnkl=(m, n, k, l), sf_vec_size=16, c_dtype="BFloat16")
    assert not any(r.startswith("d is") for r in reasons), reasons


RUNNER_REFUSALS = [
    # (runner arguments, a reason it must name): refused before anything is compiled
    ((16, "BFloat16", "decode", (24, 128), 4), "MMA tile M (tokens)=24"),
    ((8, "BFloat16", "prefill", (128, 256)), "sf_vec_size=8"),
    ((16, "Float64", "prefill", (128, 256)), "c_dtype=Float64"),
    ((16, "BFloat16", "decode", (16, 128), 2, "", (2, 1)), "on the prefill path"),
    ((16, "BFloat16", "decode", (16, 128), 0), "split_k=0"),
    ((16, "BFloat16", "sideways", (16, 128)), "path=sideways"),
]


@pytest.mark.parametrize("args, needle", RUNNER_REFUSALS, ids=[r[1] for r in RUNNER_REFUSALS])
def test_runner_refuses_bad_config(args, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        k90.Fp4GemmSm90Runner(*args)


def test_runner_refuses_bad_problem(tmp_path):
    """A built runner checks each call's problem (``problem_reasons``) with its operands."""
    import torch

    runner = k90.Fp4GemmSm90Runner(
        16, "BFloat16", "decode", (8, 64), 1, options=f"--gpu-arch sm_90a --dump-dir={tmp_path}"
    )
    m, n, k, l = 1, 64, 48, 1  # noqa: E741
    sf = k90.blocked_sf_bytes(m, k, l, 16)
    ops = [torch.zeros(x, dtype=torch.uint8) for x in (m * k // 2, n * k // 2, sf, sf)]
    d = torch.zeros(m * n, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K=48 is not a multiple of 32"):
        runner(*ops, d, m, n, k, l, 1.0)
    with pytest.raises(ValueError, match="M must be >= 1, got 0"):
        runner(*ops, d, 0, n, k, l, 1.0)


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
]


def test_kernel_refuses_bad_k_groups():
    # (the runner and compile_gemm build the kernel object first: a clear error, not a failed
    # compile or launch)
    with pytest.raises(ValueError, match="at most 4 consumer warpgroups"):
        k90.BlockwiseGemmFp4Sm90(16, "decode", (8, 128), k_groups=4)
    with pytest.raises(ValueError, match="run on the decode path"):
        k90.BlockwiseGemmFp4Sm90(16, "prefill", (128, 256), k_groups=2)


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


def _e2m1(nibble: int) -> float:
    return (-1.0 if nibble & 8 else 1.0) * (0, 0.5, 1, 1.5, 2, 3, 4, 6)[nibble & 7]


def _prmt_zero(word, selector):
    """Model of ``prmt.b32 d, word, 0, selector``: digit i < 4 picks byte i, 4 a zero byte."""
    out = 0
    for i in range(4):
        digit = (selector >> (4 * i)) & 0xF
        out |= ((word >> (8 * digit)) & 0xFF if digit < 4 else 0) << (8 * i)
    return out


def test_nvfp4_f16_conversion_is_exact():
    """The arithmetic of ``_fp4x8_to_f16x2``, ``_fp4_pair_lo_to_mma`` and ``_scale_factor``
    (modelled here with numpy on every nibble and every finite E4M3 scale): the F16 byte
    pattern is e2m1 * 2^-14, the F16 scale factor is scale * 2^7, and their F16 product is
    exactly e2m1 * scale * 2^-7."""
    import numpy as np

    prmt_zero = _prmt_zero
    words = [0x76543210, 0xFEDCBA98, 0x08F1E92A, 0x3C5A7B9D]
    for w in words:
        even = ((w << 4) & 0x80808080) | ((w << 1) & 0x0E0E0E0E)
        odd = (w & 0x80808080) | ((w >> 3) & 0x0E0E0E0E)
        for p, (src, sel) in enumerate(
            [(even, 0x2404), (odd, 0x2404), (even, 0x3414), (odd, 0x3414)]
        ):
            halves = np.array([prmt_zero(src, sel)], dtype=np.uint32).view(np.float16)
            want = [_e2m1((w >> (4 * q)) & 0xF) for q in (p, p + 4)]
            assert [float(h) * 2.0**14 for h in halves] == want, (hex(w), p)
            # _fp4_pair_lo_to_mma (convert_operands, pair chosen at run time): same bits
            x = w >> (4 * p)
            lo = ((x & 0x00080008) << 12) | ((x & 0x00070007) << 9)
            assert lo & 0xFFFFFFFF == prmt_zero(src, sel), (hex(w), p)
    codes = np.arange(16)
    e2m1_f16 = np.array([_e2m1(int(c)) * 2.0**-14 for c in codes], dtype=np.float16)
    import torch

    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    for s in scales[np.isfinite(scales)]:
        factor = np.float16(s) * np.float16(2.0**7)
        assert float(factor) == s * 2.0**7
        got = (e2m1_f16 * factor).astype(np.float64)
        want = np.array([_e2m1(int(c)) for c in codes]) * float(s) * 2.0**-7
        assert np.array_equal(got, want), s


def _bf16(bits: int) -> float:
    import torch

    return float(torch.tensor([bits], dtype=torch.int32).to(torch.uint16).view(torch.bfloat16))


def test_e4m3_scale_bytes_to_bf16_bits():
    """``_e4m3_byte_to_bf16x2`` (the prologue's NVFP4 -> BF16 scales, modelled here): byte q of
    four packed E4M3 scales becomes ``(magnitude << 4) | (sign << 8)`` in both halves, the BF16
    value scale * 2^-120 (subnormal scales included), for every byte in every position; the
    two NaN bytes become a BF16 NaN, as the reference reads them."""
    import torch

    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for b in range(256):
        for q in range(4):
            sf4 = (0x5A3C91E7 & ~(0xFF << (8 * q))) | (b << (8 * q))
            mags, signs = sf4 & 0x7F7F7F7F, sf4 & 0x80808080
            bits = _prmt_zero(mags, 0x4040 | q << 8 | q) * 16 + _prmt_zero(
                signs, 0x0404 | q << 12 | q << 4
            )
            half = ((b & 0x7F) << 4) | ((b & 0x80) << 8)
            assert bits == half | half << 16, (b, q)
            if (mags >> (8 * q)) & 0xFF == 0x7F:
                bits |= 0x7FC07FC0
            for h in (bits & 0xFFFF, bits >> 16):
                if torch.isfinite(values[b]):
                    assert _bf16(h) * 2.0**120 == float(values[b]), b
                else:
                    assert math.isnan(_bf16(h) * 2.0**120), b


def test_e8m0_scale_bytes_to_bf16_bits():
    """``_scale_factor`` for MXFP4 (modelled here): every finite E8M0 byte becomes its BF16
    value, 2^-127 as a BF16 subnormal; the NaN byte 255 becomes +inf (documented)."""
    import torch

    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu).float()
    for b in range(256):
        bits = (b << 7) | ((((b - 1) & 0xFFFFFFFF) >> 31) << 6)
        if b == 255:
            assert _bf16(bits) == math.inf and math.isnan(float(values[b]))
        else:
            assert _bf16(bits) == float(values[b]), b


def test_converted_shapes_pad_decode_tokens_to_whole_tiles():
    # decode: the tokens' copy is padded to the token tile (TMA boxes stay inside it)
    decode = k90.BlockwiseGemmFp4Sm90(16, "decode", (128, 64), (1, 1), 1)
    assert k90.converted_shapes(decode, 72, 8192, 8000, 2) == ((8,), (2, 128, 8000))
    assert k90.converted_shapes(decode, 128, 8192, 8000, 1) == ((8,), (1, 128, 8000))
    wide = k90.BlockwiseGemmFp4Sm90(32, "decode", (32, 128), (1, 1), 2)
    assert k90.converted_shapes(wide, 30, 520, 1056, 2) == ((8,), (2, 32, 1088))
    narrow = k90.BlockwiseGemmFp4Sm90(16, "decode", (8, 128), (1, 1), 4)
    assert k90.converted_shapes(narrow, 3, 8192, 8192, 1) == ((8,), (1, 8, 8192))
    # prefill: both copies, rows as they are
    prefill = k90.BlockwiseGemmFp4Sm90(16, "prefill", (128, 256), (2, 1), 1)
    assert k90.converted_shapes(prefill, 1000, 8190, 8032, 2) == ((2, 1000, 8064), (2, 8190, 8064))


def test_default_config_paths():
    """The picks that hopper/DESIGN.md measured, one rule of ``default_config`` at a time."""
    assert k90.default_config(1, 8192, 8192, 1)[0] == "decode"
    assert k90.default_config(1, 8192, 8192, 1)[1] == (8, 128)
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
    assert k90.default_config(16, 4096, 7168, 1)[1:] == ((16, 64), 4, 1)
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
    # one wave of K groups where the split-K units would be short (<= 8 k-tiles) and one CTA
    # per 64 weight rows fills 3/4 of the SMs or more ...
    assert k90.default_config(1, 7168, 2048, 1) == ("decode", (8, 64), 1, 4)
    assert k90.default_config(32, 7168, 2048, 1) == ("decode", (32, 64), 1, 4)
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
    for argv, want in (
        (["--split_k", "3"], ("decode", (8, 64), 3, 1)),
        (["--k_groups", "2"], ("decode", (8, 64), 1, 2)),
    ):
        args = k90._validated(k90.make_parser().parse_args(["--mnkl", "1,7168,2048,1", *argv]))
        assert (args.path, args.mma_tiler_mn, args.split_k, args.k_groups) == want
    for m in (1, 16, 32, 100, 128, 129, 2048, 4096):
        path, tiler, split, k_groups = k90.default_config(m, 7168, 2048, 1)
        reasons = k90.check_fp4_gemm_config(
            (m, 7168, 2048, 1), 16, "Float8E4M3FN", "BFloat16", path, tiler, (1, 1), split, k_groups
        )
        assert reasons == []


def test_default_config_picks_pass_the_checks():
    """Every pick of ``default_config`` over a sweep of shapes (ragged, L = 2, both formats)
    is a configuration that ``check_fp4_gemm_config`` accepts and the kernel object builds."""
    import itertools

    ms = (1, 5, 8, 9, 12, 16, 20, 24, 32, 33, 64, 128, 200, 2049)
    ns = (1, 520, 1000, 4096, 7168, 8192, 8448, 18432)
    ks = (32, 64, 96, 1024, 2080, 7168, 16384)
    for m, n, k, l, vec in itertools.product(ms, ns, ks, (1, 2), (16, 32)):  # noqa: E741
        path, tiler, split, k_groups = k90.default_config(m, n, k, l)
        sf_dtype = "Float8E4M3FN" if vec == 16 else "Float8E8M0FNU"
        cluster = k90.default_cluster(path)
        reasons = k90.check_fp4_gemm_config(
            (m, n, k, l), vec, sf_dtype, "BFloat16", path, tiler, cluster, split, k_groups
        )
        assert reasons == [], (m, n, k, l, vec, path, tiler, split, k_groups, reasons)
        k90.BlockwiseGemmFp4Sm90(vec, path, tiler, cluster, split, k_groups=k_groups)


def _cli(*args):
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mnkl", "128,128,100,1"], "K=100 is not a multiple of 32"),
        (["--mnkl", "1,2,3"], "--mnkl expects 4 integers"),
        (["--mnkl", "1,x,3,4"], "--mnkl expects 4 comma-separated integers"),
        (["--sf_vec_size", "32", "--sf_dtype", "Float8E4M3FN"], "does not pair with"),
        (["--sf_vec_size", "8"], "invalid choice: 8"),
        (["--cluster_shape_mn", "1,2"], "takes (1, 1)"),
        (["--iterations", "0"], "--iterations must be >= 1"),
        (["--tolerance", "nan"], "--tolerance must be a finite number > 0"),
        (["--alpha", "nan"], "--alpha: alpha must be a finite fp32 number"),
        (["--mnkl", "16,4096,4096,1", "--alpha", "1e38"], "NVFP4 here needs |alpha| < 2^114"),
        (["--mnkl", "1,64,256,1", "--k_groups", "4", "--mma_tiler_mn", "64,64"], "K groups"),
    ],
)
def test_cli_bad_input_exits_2(args, message, tmp_path, capsys):
    """Bad input: exit 2 with a message naming what is wrong (argparse's own or ours)."""
    try:
        code = k90.main([*args, "--compile_only", "--dump_dir", str(tmp_path)])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_unusable_dump_dir_exits_2(tmp_path, capsys):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    assert k90.main(["--mnkl", "16,4096,4096,1", "--compile_only", "--dump_dir", str(blocker)]) == 2
    assert "cannot create the folder" in capsys.readouterr().err
    locked = tmp_path / "read_only"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("this user can write into a read-only folder (root)")
    assert k90.main(["--mnkl", "16,4096,4096,1", "--compile_only", "--dump_dir", str(locked)]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_cli_compile_only_without_deprecation_warnings(tmp_path):
    """The script compiles on a machine without a GPU, prints the GEMM kernel's resources, and
    the DSL raises no DeprecationWarning on the way (an error here)."""
    r = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", SCRIPT]
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


def test_module_imports_without_path_edits():
    """``from hopper import ...`` works from the repository root and changes no sys.path."""
    code = (
        "import sys; before = list(sys.path); "
        "from hopper.blockwise_gemm_fp4_sm90 import BlockwiseGemmFp4Sm90; "
        "import hopper.bench; assert sys.path == before, sys.path"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_helpers_shared_with_the_blackwell_file_are_identical():
    """The helpers both kernel files carry (CLI integer parsing, cuobjdump and the cubin's
    resources, timing, cold-L2 copies, the torch dtype map, the GPU check) are the same code."""
    for name in (
        "find_cuobjdump",
        "cubin_resource_usage",
        "_parse_ints",
        "UsageError",
        "time_us",
        "_call",
        "operand_sets",
    ):
        assert inspect.getsource(getattr(k90, name)) == inspect.getsource(getattr(k100, name))
    # The GPU check differs in its name only; each file's GPU_ARCHS says what its cubin runs on.
    blackwell_gpu = inspect.getsource(k100._blackwell_gpu).replace("_blackwell_gpu", "_hopper_gpu")
    assert inspect.getsource(k90._hopper_gpu) == blackwell_gpu
    assert k90.GPU_ARCHS == {k90.DEFAULT_GPU_ARCH: ((9, 0),)}
    dtype_map = '{"BFloat16": torch.bfloat16, "Float16": torch.float16, "Float32": torch.float32}'
    assert dtype_map in inspect.getsource(k100.prepare_gemm)
    assert dtype_map in inspect.getsource(k90._torch_dtype)


@pytest.mark.skipif(_has_sm90(), reason="this machine has an sm_90 GPU")
def test_cli_without_sm90_exits_2():
    r = _cli("--mnkl", "128,128,128,1")
    assert r.returncode == 2
    assert "--compile_only" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ GPU
gpu = pytest.mark.skipif(not _has_sm90(), reason="needs an sm_90 GPU (H100 / H200)")

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
    runner = k90.Fp4GemmSm90Runner(vec, c_dtype, path, tiler, split, k_groups=k_groups)
    # twice, back to back on different operands: the split-K counters reset themselves, and
    # the second prologue (PDL) must not overwrite tokens the first GEMM still reads
    runs = []
    for seed in (m + n + k, m + n + k + 1):
        ops = reference.make_fp4_operands(m, n, k, l, vec, "cuda", seed=seed, dist=dist)
        alpha = float(ops.alpha) * alpha_factor
        sfa, sfb = k90.blocked_scales(ops.sfa), k90.blocked_scales(ops.sfb)
        d = torch.full((l, m, n), float("nan"), dtype=k90._torch_dtype(c_dtype), device="cuda")
        runs.append((ops, alpha, sfa, sfb, d))
    # compile the kernel variant for this N and allocate the workspace first, so that the two
    # launches below are queued back to back
    runner.executor(n)
    runner.workspace(m, n, k, l)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000)  # about 1 ms on the GPU: both launches queue up behind it
    for ops, alpha, sfa, sfb, d in runs:
        runner(ops.a, ops.b, sfa, sfb, d, m, n, k, l, alpha)
    torch.cuda.synchronize()
    for ops, alpha, _, _, d in runs:
        ok, info = reference.check_gemm(d, ops.a, ops.b, ops.sfa, ops.sfb, vec, alpha)
        assert ok, str(info)


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
        reader = k90.Fp4GemmSm90Runner(16, "BFloat16", "decode", (8, 64), 1, k_groups=4)
    else:
        # writer: BF16 D of 20800 bytes = the BF16 D of 20 x 520 x 64 (one k-tile, split 2 in
        # 4 K groups: units and groups without k-tiles)
        (m1, n1, k1), (m2, n2, k2) = (1, 10400, 2048), (20, 520, 64)
        reader = k90.Fp4GemmSm90Runner(16, "BFloat16", "decode", (32, 64), 2, k_groups=4)
    assert reader.gemm.prologue_pdl
    writer = k90.Fp4GemmSm90Runner(16, "BFloat16", "decode", (8, 128), 4)
    ops1 = reference.make_fp4_operands(m1, n1, k1, 1, 16, "cuda", seed=3)
    ops2 = reference.make_fp4_operands(m2, n2, k2, 1, 16, "cuda", seed=4)
    sfa1, sfb1 = k90.blocked_scales(ops1.sfa), k90.blocked_scales(ops1.sfb)
    sfa2, sfb2 = k90.blocked_scales(ops2.sfa), k90.blocked_scales(ops2.sfb)
    pairs = []
    for i in range(5):
        d1 = torch.full((1, m1, n1), float("nan"), dtype=torch.bfloat16, device="cuda")
        if shared == "tokens":
            tokens = d1.view(torch.uint8).view(1, m2, k2 // 2)
            d2 = torch.full((1, m2, n2), float("nan"), dtype=torch.bfloat16, device="cuda")
        else:
            tokens = ops2.a
            d2 = d1.view(1, m2, n2)
        pairs.append((float(ops1.alpha) * (1 + i), d1, tokens, d2))
    for runner, m, n, k in ((writer, m1, n1, k1), (reader, m2, n2, k2)):
        runner.executor(n)
        runner.workspace(m, n, k, 1)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # tens of ms on the GPU: all ten launches queue up behind it
    for alpha1, d1, tokens, d2 in pairs:
        writer(ops1.a, ops1.b, sfa1, sfb1, d1, m1, n1, k1, 1, alpha1)
        reader(tokens, ops2.b, sfa2, sfb2, d2, m2, n2, k2, 1, float(ops2.alpha))
    torch.cuda.synchronize()
    for alpha1, d1, tokens, d2 in pairs:
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
    """A NaN scale makes its row of D NaN (token scale) or its column (weight scale), as in the
    reference, and changes no other value.  (MXFP4: the E8M0 NaN reads as +inf, so those
    values are inf or NaN.)"""
    import torch

    import reference

    m, n, k, l = 20, 300, 256, 1  # noqa: E741
    ops = reference.make_fp4_operands(m, n, k, l, vec, "cuda", seed=7, dist="wide")
    runner = k90.Fp4GemmSm90Runner(vec, "BFloat16", path, tiler, split)
    nan_byte = 0x7F if vec == 16 else 0xFF  # E4M3 / E8M0 NaN
    sfa_nan, sfb_nan = ops.sfa.clone(), ops.sfb.clone()
    sfa_nan.view(torch.uint8)[0, 3, 1] = nan_byte
    sfb_nan.view(torch.uint8)[0, 7, k // vec - 1] = nan_byte
    ref = reference.reference_gemm(ops.a, ops.b, sfa_nan, sfb_nan, vec, 1.0)
    assert ref[0, 3].isnan().all() and ref[0, :, 7].isnan().all()
    outs = []
    for sfa, sfb in ((ops.sfa, ops.sfb), (sfa_nan, sfb_nan)):
        d = torch.zeros((l, m, n), dtype=torch.bfloat16, device="cuda")
        runner(ops.a, ops.b, k90.blocked_scales(sfa), k90.blocked_scales(sfb), d, m, n, k, l, 1.0)
        outs.append(d)
    torch.cuda.synchronize()
    clean, with_nan = outs
    ok, info = reference.check_gemm(clean, ops.a, ops.b, ops.sfa, ops.sfb, vec, 1.0)
    assert ok, str(info)
    bad = with_nan.isnan() if vec == 16 else ~with_nan.isfinite()
    assert torch.equal(bad, ref.isnan())
    keep = ~ref.isnan()
    assert torch.equal(with_nan[keep], clean[keep])


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
    """``hopper.bench`` prints every measured row, the speed-up over cuBLAS BF16, and marks a
    row whose result did not match the reference."""
    from hopper import bench

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
