# SPDX-License-Identifier: BSD-3-Clause
"""FP4 (NVFP4 / MXFP4) for PyTorch: one quantized-operand type, a quantizer, one GEMM op, a Linear.

    import fp4_ops
    a = fp4_ops.quantize(x, "nvfp4")                 # FP4Tensor: codes, 128x4 scales, global scale
    y = fp4_ops.fp4_gemm(a, w, out_dtype=torch.bfloat16)     # y = dequant(a) @ dequant(w)^T
    report = fp4_ops.quantize_model(model)          # nn.Linear -> FP4Linear (W4A4), in place

``FP4Tensor``
    Packed E2M1 codes [rows, K/2] (or [L, rows, K/2]), the block scales in the 128x4 blocked layout
    (``fp4_ops.layout``), shaped [row blocks, column blocks, 512] (or [L, ...]) so that no plain
    scale matrix passes for them, and the fp32 per-tensor global scale as a 0-d tensor on the
    data's device, in the decoding convention ``x ~= e2m1 * scale * global_scale``
    (``amax / (448 * 6)``; 1.0 for MXFP4). Converters: torchao's ``NVFP4Tensor`` (both ways),
    ModelOpt NVFP4 checkpoint tensors and compressed-tensors' NVFP4 tensors (whose
    ``*_global_scale`` is the reciprocal, the encoding scale ``448 * 6 / amax``).
``quantize(x, format, global_scale=None)``
    ``torch.library`` op: CPU tensors through ``fp4_ops.cpu``, CUDA tensors through the CuTe DSL
    quantizer (``fp4_ops.quantizer``); both bit-exact with the formats' definition.
    ``global_scale`` None: dynamic (amax pass on the device).
``fp4_gemm(a, b, out_dtype, alpha=None)``
    ``torch.library`` op with a fake kernel (``torch.compile(fullgraph=True)``): CPU ->
    ``fp4_ops.cpu``, sm_90 -> the Hopper kernel (``fp4_ops.sm90``), sm_100 family -> the
    Blackwell kernel (``blockwise_gemm_fp4``). alpha = a.global_scale * b.global_scale (* alpha)
    is formed on the device, and the kernels read it there. ``a`` a bfloat16 / float16 tensor:
    W4A16 (weight-only FP4, Hopper).
``FP4Linear``, ``quantize_model``, ``calibrate``
    FP4 linear layers: weights quantized once, activations quantized per call (W4A4, dynamic or
    static global scale) or kept in 16 bits (``activations="bf16"``, W4A16), ``fp4_gemm``, bias.
    They keep their FP4 buffers through dtype casts, carry format and mode in their state dict,
    and are inference only (no backward). ``quantize_model`` returns a ``QuantizeReport``;
    ``calibrate`` gives dynamic NVFP4 layers static input scales from calibration data.
``fp4_grouped_gemm``, ``fp4_moe``, ``FP4MoE``, ``FP4Experts``, ``FP4Llama4Experts``,
``quantize_experts``
    Mixture-of-experts (``fp4_ops.moe``): experts [E, N, K] with a global scale each, routing
    on the device; ``quantize_model`` puts ``FP4Experts`` in place of transformers' experts
    (``FP4Llama4Experts`` in place of Llama-4's, which take tokens scaled per expert).

Importing this package needs no GPU and no CuTe DSL: the kernels are imported on first use.
"""

from fp4_ops.checkpoint import checkpoint_folder, load_quantized, save_quantized
from fp4_ops.layout import FORMATS, GLOBAL_SCALE_DIVISOR, blocked_scale_numel, blocked_scale_shape
from fp4_ops.moe import (
    FP4Experts,
    FP4Llama4Experts,
    FP4MoE,
    fp4_grouped_gemm,
    fp4_moe,
    quantize_experts,
)
from fp4_ops.nn import FP4Linear, QuantizeReport, calibrate, quantize_model
from fp4_ops.ops import fp4_gemm, quantize
from fp4_ops.tensor import FP4Tensor

__all__ = [
    "FORMATS",
    "GLOBAL_SCALE_DIVISOR",
    "FP4Linear",
    "FP4Experts",
    "FP4Llama4Experts",
    "FP4MoE",
    "FP4Tensor",
    "QuantizeReport",
    "blocked_scale_numel",
    "blocked_scale_shape",
    "calibrate",
    "checkpoint_folder",
    "fp4_gemm",
    "fp4_grouped_gemm",
    "fp4_moe",
    "load_quantized",
    "quantize",
    "quantize_experts",
    "quantize_model",
    "save_quantized",
]
