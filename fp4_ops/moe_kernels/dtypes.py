# SPDX-License-Identifier: BSD-3-Clause
"""The DSL float types the MoE kernels read and write, by the names that
``fp4_ops.layout.DSL_DTYPE_NAMES`` gives torch's (the launchers' configurations carry names)."""

from cutlass import BFloat16, Float16, Float32

DTYPES = {"BFloat16": BFloat16, "Float16": Float16, "Float32": Float32}
