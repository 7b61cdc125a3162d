# SPDX-License-Identifier: BSD-3-Clause
"""Line references from docs/fp8_to_fp4.md into blockwise_gemm_fp4.py, kept true by a test.

The guide links kernel lines as
``[blockwise_gemm_fp4.py:123](../blockwise_gemm_fp4.py#L123 "KEY")``.  KEY names an entry of
``ANCHORS``: a piece of code that occurs exactly once in the kernel.  The line a reference must
point at is the line where its anchor starts.

    python docs/kernel_refs.py            # check: exit 1 and list the stale references
    python docs/kernel_refs.py --update   # rewrite the line numbers in the guide

``tests/test_docs.py`` runs the check, so editing the kernel without updating the guide fails CI.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "blockwise_gemm_fp4.py"
GUIDE = ROOT / "docs" / "fp8_to_fp4.md"

ANCHORS = {
    "check_config": "def check_fp4_gemm_config(",
    "guard": "def assert_block_scaled_fp4_mma(",
    "tile_budget": "def tile_budget(",
    "c_row_pitch": "def c_row_pitch(",
    "k_tile": "k_tile = mma_inst_k * MMA_INSTS_PER_K_TILE",
    "smem_ab": "self.a_smem_layout_staged = sm100_utils.make_smem_layout_a(",
    "smem_sf": "self.sfa_smem_layout_staged = blockscaled_utils.make_smem_layout_sfa(",
    "tmem_cols": "self.num_sfa_tmem_cols = ",
    "make_mma": "tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(",
    "mma_guard_call": "assert_block_scaled_fp4_mma(tiled_mma, self.sf_vec_size, self.sf_dtype)",
    "gmem_ab": "mA_mkl = cute.make_tensor(",
    "gmem_sf": "blockscaled_utils.tile_atom_to_shape_SF(mA_mkl.shape",
    "tma_ab": "tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(",
    "tma_sf": "tma_atom_sfa, tma_tensor_sfa = cute.nvgpu.make_tiled_tma_atom_A(",
    "tx_bytes": "self.num_tma_load_bytes = ",
    "tma_loop": "ab_pipeline.producer_acquire(ab_producer_state, empty_peek)",
    "tmem_sf_layout": "tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(",
    "s2t_partition": "def _s2t_copy_and_partition(",
    "s2t_copy": "cute.copy(copy_s2t_sfa,",
    "gemm_pairs": "[tCrA[k_coord], tCtSFA[sf_coord]]",
    "alpha": "(acc * alpha).to(self.c_dtype)",
    "compute_stages": "def _compute_stages(",
    "compile_only": "def run_compile_only(",
    "overlap": "self.overlapping_accum = self.num_acc_stage == 1",
}

LINK = re.compile(
    r"\[blockwise_gemm_fp4\.py:(?P<shown>\d+)\]"
    r"\(\.\./blockwise_gemm_fp4\.py#L(?P<target>\d+) \"(?P<key>[a-z0-9_]+)\"\)"
)


def anchor_lines(source: str) -> dict[str, int]:
    """1-based line of each anchor; ValueError if an anchor is missing or not unique."""
    lines = {}
    for key, anchor in ANCHORS.items():
        count = source.count(anchor)
        if count != 1:
            raise ValueError(f"anchor {key!r} ({anchor!r}) occurs {count} times in the kernel")
        lines[key] = source[: source.index(anchor)].count("\n") + 1
    return lines


def stale_references(guide: str, source: str) -> list[str]:
    """Every reference whose key is unknown or whose line numbers do not match its anchor."""
    lines = anchor_lines(source)
    problems = []
    if guide.count("blockwise_gemm_fp4.py#L") != len(LINK.findall(guide)):
        problems.append("a link to blockwise_gemm_fp4.py#L... is not in the checked form")
    for link in LINK.finditer(guide):
        key = link["key"]
        if key not in lines:
            problems.append(f"unknown key {key!r} in {link[0]}")
        elif not int(link["shown"]) == int(link["target"]) == lines[key]:
            problems.append(f"{link[0]} should point at line {lines[key]}")
    return problems


def updated(guide: str, source: str) -> str:
    lines = anchor_lines(source)

    def relink(link: re.Match) -> str:
        line = lines[link["key"]]
        return f'[blockwise_gemm_fp4.py:{line}](../blockwise_gemm_fp4.py#L{line} "{link["key"]}")'

    return LINK.sub(relink, guide)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the guide's line numbers")
    args = parser.parse_args()
    guide, source = GUIDE.read_text(), KERNEL.read_text()
    if args.update:
        GUIDE.write_text(updated(guide, source))
        return 0
    problems = stale_references(guide, source)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
