# SPDX-License-Identifier: BSD-3-Clause
"""The Hopper (sm_90a) FP4 GEMM: W4A4 and W4A16 (``gemm``: the kernel; ``launcher``: the torch
entry point ``launcher.gemm``, its ``GemmConfig`` and caches; ``tokens_step``: W4A4 decode's
quantizer grid and GEMM from one host call; ``dequant``: the register conversions; ``k_order``:
the K orders and the W4A16 weight prepacking). Importing this package needs no CuTe DSL."""
