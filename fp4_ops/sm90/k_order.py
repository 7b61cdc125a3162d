# SPDX-License-Identifier: BSD-3-Clause
"""The K orders of the Hopper kernel, and the W4A16 weight prepacking: plain Python and torch,
no CuTe DSL (the library's CPU path imports this module alone).

The register dequantizer (``dequant.fp4x16_to_mma``) turns the 16 packed FP4 values of a
thread's 16-group q of a 64-wide k-block into pairs P_0..P_7 (P_i = nibbles (i % 4, i % 4 + 4)
of 32-bit word i // 4), and the wgmma A fragment places P_i at K = ``pair_k(i, q)`` (+1), not
in memory order.  W4A4 permutes the other operand to match; W4A16 permutes the weights once
(``prepack_weights``) so that 16-bit activations go to the tensor cores as they are, and
spreads each 32-bit word's bits (``PAIR_BITS``) so that the W4A16 dequantizer extracts a pair's
BF16 bits with one to three instructions (``dequant.prepacked_pair_bits``).
"""

from __future__ import annotations

import math
import sys

from fp4_ops.memory import persistent

# K values per wgmma k-block (four k16 steps): the unit of every permutation here
K_BLOCK = 64
# rows prepack_weights permutes at a time
PREPACK_ROWS = 256
# Bit of a prepacked 32-bit word that holds bit b (mantissa, exponent 0, 1, sign) of pair p's
# low (lane 0) and high (lane 1) e2m1 value: PAIR_BITS[p][lane][b].  Pair 0 sits where BF16
# wants it (magnitude at 6..8, sign at 15, +16 for the high half); pairs 1 and 2 sit there after
# a rotation right by 3 and 6 bits; pair 3 fills the rest, placed by one multiply.
PAIR_BITS = (
    ((6, 7, 8, 15), (22, 23, 24, 31)),
    ((9, 10, 11, 18), (25, 26, 27, 2)),
    ((12, 13, 14, 21), (28, 29, 30, 5)),
    ((3, 4, 0, 1), (19, 20, 16, 17)),
)
# (kind, device, inverse) -> the byte order or the half-word tables of the prepacking there
_TABLES: dict = {}


def a_fragment_word(r: int, i: int) -> int:
    """Word of a k-block's wgmma A fragment (Uint32 view: row r, K half c, k16 step s at word
    r + 2c + 4s) that takes pair P_i of ``fp4x16_to_mma``: for the thread's 16-group q, K
    values 16 (i // 2) + 8 (i % 2) + 2q, +1 of the k-block (the weights' K permutation)."""
    return r + 2 * (i % 2) + 4 * (i // 2)


def pair_k(i, q):
    """K (within a 64-wide k-block) that the wgmma A fragment gives the low value of pair P_i of
    16-group q (the high value is K + 1).  Python or DSL integers."""
    word = a_fragment_word(0, i)
    return 16 * (word // 4) + 8 * (word // 2 % 2) + 2 * q


def prepacked_k_order() -> list[int]:
    """W4A16: the K (0..63) whose weight ``prepack_weights`` stores at packed nibble position
    16q + 8w + n of a 64-wide k-block, so that the dequantized fragment is in plain K order:
    pair P_(4w + n % 4) of group q, its low (n < 4) or high value."""
    return [pair_k(4 * w + n % 4, q) + n // 4 for q in range(4) for w in range(2) for n in range(8)]


def prepack_weights(b):
    """W4A16: packed FP4 weights [..., N, K/2] (uint8 or a one-byte type) -> uint8
    [..., N, K_pad/2], K_pad = K rounded up to 64: each 64-wide k-block permuted
    (``prepacked_k_order``) so that the kernel dequantizes it into the wgmma A fragment in plain
    K order, and the activations need no permutation; then the bits of every 32-bit word placed
    by ``PAIR_BITS`` (nibble n of the permuted word is pair n % 4, lane n // 4).  Meant for
    load time; CPU or GPU (the first call on a GPU must come before any CUDA-graph capture).
    ``unprepack_weights`` inverts it."""
    import torch

    _check_packed(b)
    k = 2 * b.shape[-1]
    k_pad = -(-k // K_BLOCK) * K_BLOCK
    rows = b.view(torch.uint8).reshape(math.prod(b.shape[:-1]), b.shape[-1])
    out = torch.empty((rows.shape[0], k_pad // 2), dtype=torch.uint8, device=b.device)
    order, tables = _byte_order(b.device, inverse=False), _word_tables(b.device, inverse=False)
    # (a few rows at a time: the 32-bit half-words stay a small multiple of one chunk, not of b)
    for start in range(0, rows.shape[0], PREPACK_ROWS):
        chunk = torch.nn.functional.pad(rows[start : start + PREPACK_ROWS], (0, (k_pad - k) // 2))
        blocks = chunk.reshape(chunk.shape[0], k_pad // K_BLOCK, K_BLOCK // 2)[..., order]
        out[start : start + PREPACK_ROWS] = _move_bits(blocks, tables).reshape(chunk.shape)
    return out.reshape(*b.shape[:-1], k_pad // 2)


def unprepack_weights(prepacked, k: int):
    """The inverse of ``prepack_weights`` for K = ``k``: [..., N, K/2] uint8 in plain order."""
    import torch

    _check_packed(prepacked)
    k_pad = 2 * prepacked.shape[-1]
    if k_pad != -(-k // K_BLOCK) * K_BLOCK:
        raise ValueError(
            f"prepacked rows hold {k_pad} values; K = {k} needs {-(-k // K_BLOCK) * K_BLOCK}"
        )
    rows = prepacked.view(torch.uint8).reshape(math.prod(prepacked.shape[:-1]), k_pad // 2)
    out = torch.empty((rows.shape[0], k // 2), dtype=torch.uint8, device=prepacked.device)
    device = prepacked.device
    order, tables = _byte_order(device, inverse=True), _word_tables(device, inverse=True)
    for start in range(0, rows.shape[0], PREPACK_ROWS):
        chunk = rows[start : start + PREPACK_ROWS]
        words = _move_bits(chunk.reshape(chunk.shape[0], k_pad // K_BLOCK, K_BLOCK // 2), tables)
        out[start : start + PREPACK_ROWS] = words[..., order].reshape(chunk.shape)[:, : k // 2]
    return out.reshape(*prepacked.shape[:-1], k // 2)


def _byte_order(device, inverse: bool):
    """The bytes of a prepacked 64-wide k-block before its bits are placed: byte p of word
    2q + w holds pair P_(4w + p) of 16-group q (low value in the low nibble), i.e. the plain
    byte of K = ``pair_k(4w + p, q)``: that byte's index for each position (``inverse``: each
    plain byte's position), an index tensor on ``device``, made once."""
    import torch

    key = ("bytes", device, inverse)
    if key not in _TABLES:
        order = [pair_k(4 * w + p, q) // 2 for q in range(4) for w in range(2) for p in range(4)]
        index = torch.tensor(order)
        _TABLES[key] = _kept(torch.argsort(index) if inverse else index, device)
    return _TABLES[key]


def _word_tables(device, inverse: bool):
    """The bit placement of ``PAIR_BITS`` on 32-bit words whose byte p holds pair p (lane l in
    nibble l): two tables of the 65536 low and high half-words' placed bits, as int32 (bit 31
    the sign) (``inverse``: from placed words back), on ``device``, made once."""
    import torch

    key = ("words", device, inverse)
    if key not in _TABLES:
        if sys.byteorder != "little":  # (_move_bits reads bytes as little-endian half-words)
            raise RuntimeError("prepack_weights needs a little-endian host")
        placed = {
            8 * p + 4 * lane + b: PAIR_BITS[p][lane][b]
            for p in range(4)
            for lane in range(2)
            for b in range(4)
        }
        if inverse:
            placed = {dst: src for src, dst in placed.items()}
        half = torch.arange(1 << 16, dtype=torch.int64)
        tables = torch.zeros((2, 1 << 16), dtype=torch.int64)
        for src, dst in placed.items():
            tables[src // 16] |= (half >> (src % 16) & 1) << dst
        tables = torch.where(tables >= 1 << 31, tables - (1 << 32), tables).to(torch.int32)
        _TABLES[key] = _kept(tables, device)
    return _TABLES[key]


def _kept(t, device):
    """``t`` copied to ``device`` for keeping (refused under CUDA-graph capture, which would
    keep it in a graph's pool)."""
    import torch

    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "prepack_weights: the first call on a GPU copies its tables to the device; make it "
            "before capturing a CUDA graph"
        )
    return persistent(lambda: t.to(device), device)


def _move_bits(blocks, tables):
    """uint8 [..., 4w] -> the same shape with each little-endian 32-bit word's bits moved by
    ``_word_tables``: one lookup per half-word, the two results ORed (a little-endian int32's
    bytes are the word's)."""
    import torch

    halves = blocks.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    low, high = halves[..., 0::2].flatten(), halves[..., 1::2].flatten()
    moved = tables[0].index_select(0, low) | tables[1].index_select(0, high)
    return moved.view(torch.uint8).reshape(blocks.shape)


def _check_packed(packed) -> None:
    if packed.element_size() != 1 or packed.dim() < 2:
        raise ValueError(f"packed FP4 must be [..., rows, K/2] bytes, got {packed.dtype}")
