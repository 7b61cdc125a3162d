# SPDX-License-Identifier: BSD-3-Clause
"""The MoE layer's gated activations, one definition for the torch steps (``fp4_ops.moe``) and
the kernel (``fp4_ops.moe_kernels.activation``)."""

#: name -> whether w13's gate and up rows are interleaved
ACTIVATIONS = {"silu": False, "swigluoai": True}
# gpt-oss's SwiGLU (transformers' GptOssExperts and vLLM's swigluoai_and_mul): gate = even rows,
# up = odd rows; gate clamped above, up on both sides; (up + 1) * gate * sigmoid(alpha * gate)
SWIGLUOAI_ALPHA = 1.702
SWIGLUOAI_LIMIT = 7.0
