# SPDX-License-Identifier: BSD-3-Clause
"""Hopper W4A4 decode in one host call: the quantizer's tokens grid, then the GEMM that reads
the token copy it wrote.

An eager W4A4 layer on the decode path runs two grids: ``fp4_ops.quantizer``'s tokens mode
(activations -> the GEMM's F16 / BF16 token copy) and ``fp4_ops.sm90.gemm`` with
``tokens_converted`` (no prologue grid). Launched one after the other from Python, each pays a
host call of its own. ``TokensStep`` is a host function around the two kernels' own host sides,
compiled once per pair of configurations: one TVM-FFI call enqueues both grids, the same kernels
with the same arguments in the same order on one stream (the GEMM with programmatic dependent
launch, as it always is), so the results are those of the two calls, bit for bit.

    step = fuse(quantize, gemm, copy)   # a TokensQuantize and a BoundGemm of one layer's call
    step(x.data_ptr(), y.data_ptr(), stream_handle)

CUDA graphs capture the step as they capture the two calls: two kernel nodes (three for a
dynamic x over 32 KB, whose amax grid comes first).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch

from fp4_ops.quantizer import QuantizeFp4, QuantizerConfig, TokensQuantize
from fp4_ops.quantizer import compile_arguments as quantizer_arguments
from fp4_ops.sm90.gemm import BlockwiseGemmFp4Sm90
from fp4_ops.sm90.gemm import compile_arguments as gemm_arguments
from fp4_ops.sm90.launcher import BoundGemm, GemmConfig, gpu_sm_count


class TokensStep:
    """The quantizer's host side, then the GEMM's, with no kernel of its own."""

    def __init__(self, quantizer: QuantizeFp4, gemm: BlockwiseGemmFp4Sm90):
        self.quantizer = quantizer
        self.gemm = gemm

    @cute.jit
    def __call__(self, quantizer_args: tuple, gemm_args: tuple, num_sms: cutlass.Constexpr, stream):
        """``QuantizeFp4.__call__``'s arguments but the stream (pointers, (rows, K, L), SM
        count), then ``BlockwiseGemmFp4Sm90.__call__``'s but the SM count and the stream
        (eleven pointers, (M, N, K, L)): both grids on ``stream``, the quantizer's first."""
        self.quantizer(*quantizer_args, stream)
        self.gemm(*gemm_args, num_sms, stream)


def compile_tokens_step(
    quantizer: QuantizerConfig, gemm: GemmConfig, num_sms: int, options: str = ""
):
    """Compile the step of two configurations for any shape; returns the executor.

    ``options="--gpu-arch sm_90a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver

    if not (quantizer.tokens and gemm.tokens_converted):
        raise ValueError(
            "a tokens step pairs the quantizer's tokens mode with a tokens_converted GEMM, got "
            f"tokens={quantizer.tokens}, tokens_converted={gemm.tokens_converted}"
        )
    gemm_kernel = gemm.kernel()
    step = TokensStep(quantizer.kernel(), gemm_kernel)
    q_args = quantizer_arguments(step.quantizer)
    gemm_args = gemm_arguments(gemm_kernel, gemm.c_dtype)
    stream = cuda_driver.CUstream(0)
    return cute.compile(step, q_args, gemm_args, num_sms, stream, options=options)


def _function(quantizer: QuantizerConfig, gemm: GemmConfig, device_index: int):
    """The TVM-FFI function of a pair's step on a device, compiled once per process."""
    key = (quantizer, gemm, device_index)
    if key not in _STEPS:
        with torch.cuda.device(device_index):
            sms = gpu_sm_count(device_index)
            compiled = compile_tokens_step(quantizer, gemm, sms, "--enable-tvm-ffi")
        _STEPS[key] = (compiled, compiled.__tvm_ffi_object__())
    return _STEPS[key][1]


# (QuantizerConfig, GemmConfig, device index) -> (compiled step, its TVM-FFI function)
_STEPS: dict[tuple, tuple] = {}


@dataclass(frozen=True)
class BoundStep:
    """A ``TokensQuantize`` and a ``BoundGemm`` of one call launched by one host call:
    ``step(x, out, stream)`` takes x's and D's addresses, no checks."""

    fn: object
    quantize_tail: tuple  # TokensQuantize.tail: its outputs' addresses, (rows, K, 1), SMs
    gemm_head: tuple[int, ...]  # A (the token copy, not read), B, SFA, SFB
    gemm_tail: tuple  # BoundGemm.tail: the workspace, alpha, offsets, alpha's scale; (M, N, K, L)
    held: tuple

    def __call__(self, x: int, out: int, stream_handle: int) -> None:
        gemm_args = (*self.gemm_head, out, *self.gemm_tail)
        self.fn((x, *self.quantize_tail), gemm_args, stream_handle)


def fuse(quantize: TokensQuantize, gemm: BoundGemm, copy: torch.Tensor) -> BoundStep:
    """One host call for ``quantize`` (the tokens mode, into ``copy``) and then ``gemm`` (its
    ``tokens_converted`` launch reading ``copy``), both bound for one layer and shape."""
    if copy.data_ptr() != quantize.tail[0]:
        raise ValueError("copy must be the token copy that the quantizer is bound to write")
    fn = _function(quantize.config, gemm.config, gemm.device_index)
    head = (copy.data_ptr(), *gemm.head)
    return BoundStep(fn, quantize.tail, head, gemm.tail, (quantize.held, gemm.held, copy))
