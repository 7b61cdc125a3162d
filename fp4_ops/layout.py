# SPDX-License-Identifier: BSD-3-Clause
"""Byte layouts of FP4 operands, shared by every part of the package (torch only, no CuTe DSL).

* Formats: NVFP4 (E4M3 scales per 16 values, an fp32 global scale) and MXFP4 (E8M0 per 32).
* Packing: E2M1 codes two per byte, element 2i in the low nibble.
* Scales: the 128x4 blocked layout that the tensor cores, cuBLASLt and both kernels read. A
  [rows, cols] scale matrix is cut into atoms of 128 rows x 4 columns (rows zero-padded to 128,
  columns to 4); atoms are stored row block by row block, and inside an atom the byte of
  (r, c) sits at 16 * (r % 32) + 4 * (r // 32) + c.

``reference.py`` at the repository root is the independent oracle these are tested against.
"""

from __future__ import annotations

import math

import torch

#: format name -> scale block size (sf_vec_size)
FORMATS = {"nvfp4": 16, "mxfp4": 32}
#: scale block size -> format name
FORMAT_OF_VEC = {vec: name for name, vec in FORMATS.items()}
#: scale block size -> the scales' torch dtype
SCALE_DTYPES = {16: torch.float8_e4m3fn, 32: torch.float8_e8m0fnu}
#: dtypes the GEMMs write
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: one-byte dtypes that hold packed E2M1 pairs
PACKED_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)
#: MXFP4 values made exact BF16 carry it (6 x 2^127 would overflow), the GEMM's alpha 1 / it
MXFP4_BF16_SHIFT = 0.25
#: the CuTe DSL's names of the float dtypes the kernels read and write
DSL_DTYPE_NAMES = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: NVFP4 global scale = amax / GLOBAL_SCALE_DIVISOR (decoding convention)
GLOBAL_SCALE_DIVISOR = E4M3_MAX * E2M1_MAX
ATOM_ROWS = 128
ATOM_COLS = 4
#: bytes of one 128x4 atom
ATOM_BYTES = ATOM_ROWS * ATOM_COLS


def format_vec(format: str) -> int:
    """The scale block size of a format name; ValueError for an unknown name."""
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    return FORMATS[format]


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def blocked_numel(rows: int, cols: int) -> int:
    """Bytes of [rows, cols] scales in the 128x4 layout, padding included."""
    return round_up(rows, ATOM_ROWS) * round_up(cols, ATOM_COLS)


def blocked_scale_numel(rows: int, k: int, sf_vec_size: int) -> int:
    """Scale bytes of one [rows, K] operand (one batch) in the 128x4 layout."""
    return blocked_numel(rows, k // sf_vec_size)


def blocked_scale_shape(rows: int, k: int, sf_vec_size: int) -> tuple[int, int, int]:
    """Shape of one [rows, K] operand's scales in the 128x4 layout, the shape ``FP4Tensor.scale``
    has (after the data's leading dims): (row blocks, column blocks, 512), one atom of 128 rows x
    4 columns per [i, j], the bytes of ``to_blocked`` in their order."""
    row_blocks = round_up(rows, ATOM_ROWS) // ATOM_ROWS
    return (row_blocks, round_up(k // sf_vec_size, ATOM_COLS) // ATOM_COLS, ATOM_BYTES)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] (or [L, rows, cols]) one-byte scales -> the 128x4 layout, 1-D (or [L, n]),
    zero padded, same dtype."""
    lead, (rows, cols) = scales.shape[:-2], scales.shape[-2:]
    # (the batch count given, not -1: it is ambiguous for empty scales)
    raw = scales.view(torch.uint8).reshape(math.prod(lead), rows, cols)
    rp, cp = round_up(rows, ATOM_ROWS), round_up(cols, ATOM_COLS)
    padded = torch.nn.functional.pad(raw, (0, cp - cols, 0, rp - rows))
    # (batch, row block, r // 32, r % 32, col block, c) -> (batch, row block, col block, r % 32,
    # r // 32, c)
    atoms = padded.unflatten(2, (cp // ATOM_COLS, ATOM_COLS)).unflatten(1, (rp // 128, 4, 32))
    out = atoms.permute(0, 1, 4, 3, 2, 5).reshape(*lead, rp * cp)
    return out.view(scales.dtype)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of ``to_blocked``: 1-D (or [L, n]) blocked scales -> [rows, cols] (or
    [L, rows, cols])."""
    rp, cp = round_up(rows, ATOM_ROWS), round_up(cols, ATOM_COLS)
    lead = blocked.shape[:-1]
    batch = math.prod(lead)
    atoms = blocked.view(torch.uint8).reshape(batch, rp // 128, cp // ATOM_COLS, 32, 4, ATOM_COLS)
    plain = atoms.permute(0, 1, 4, 3, 2, 5).reshape(batch, rp, cp)[:, :rows, :cols]
    return plain.reshape(*lead, rows, cols).contiguous().view(blocked.dtype)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [..., K] (uint8, 0..15) -> bytes [..., K/2], element 2i in the low nibble."""
    pairs = codes.unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., K/2] of any one-byte dtype -> E2M1 codes [..., K] (uint8)."""
    p = packed.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)
