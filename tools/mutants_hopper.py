"""Single-line mutants of fp4_ops/sm90/gemm.py, launcher.py, dequant.py and
k_order.py: small, realistic bugs, each of which tests/test_hopper.py (the grouped kernel's:
tests/test_hopper_facts.py) must catch, on the CPU or
(``GPU`` in ``tests``: the ``-m gpu`` tests) on an H100 / H200 only. Keep every ``old`` text
current as the kernel changes (it must occur exactly once in its file)."""

FILE = "fp4_ops/sm90/gemm.py"
LAUNCHER = "fp4_ops/sm90/launcher.py"
DEQUANT = "fp4_ops/sm90/dequant.py"
K_ORDER = "fp4_ops/sm90/k_order.py"
TEST = "tests/test_hopper.py"
# the PTX facts and the grouped kernel's helpers run on integers
FACTS = "tests/test_hopper_facts.py"
# the CPU tests that run the kernel's conversion helpers and index math
CONVERSIONS = "permutation or conversion_helpers or blocked_scale"


def mutant(mutant_id: str, klass: str, old: str, new: str, select: str, file=FILE) -> dict:
    return {
        "id": mutant_id,
        "klass": klass,
        "file": file,
        "old": old,
        "new": new,
        "tests": [TEST, "-k", select],
    }


def gpu_mutant(mutant_id: str, klass: str, old: str, new: str, select: str) -> dict:
    """Caught only by a GPU test (skipped without an sm_90 GPU: run on an H100 / H200)."""
    return {
        **mutant(mutant_id, klass, old, new, select),
        "tests": [TEST, "-m", "gpu", "-k", select],
    }


DETERMINISM = "test_gpu_splitk_is_bitwise_deterministic and "
ORDER = "test_gpu_partials_are_summed_in_documented_order and "

MUTANTS = [
    # ------------------------------------------------------------------ conversion constants
    mutant(
        "h-e8m0-prescale-2pow127",
        "conversion constants",
        "sf_byte * Uint32(0x00800080) + Uint32(0x3F003F00)",
        "sf_byte * Uint32(0x00800080) + Uint32(0x3F803F80)",
        "small_e8m0",
        file=DEQUANT,
    ),
    mutant(
        "h-e8m0-small-first-byte",
        "conversion constants",
        "(bits & Uint32(0x80808080)) == Uint32(0)",
        "(bits & Uint32(0x80)) == Uint32(0)",
        "small_e8m0",
    ),
    mutant(
        "h-e8m0-small-two-multiplies",
        "conversion constants",
        "factors, self.f16, self.bf16_prescaled or small)",
        "factors, self.f16, self.bf16_prescaled)",
        "small_e8m0",
    ),
    mutant(
        "h-w4a16-quad-own-byte-0",
        "scale-factor offsets",
        "own = dq.e4m3_low_factor(sf_word >> (Uint32(8) * Uint32(q)), self.bf16_prescaled)",
        "own = dq.e4m3_low_factor(sf_word, self.bf16_prescaled)",
        "w4a16_prepacked",
    ),
    mutant(
        "h-dequant-row-0-twice",
        "scale-factor offsets",
        "packed, sf = a_bytes[r]\n            factors = self._kblock_factors",
        "packed, sf = a_bytes[0]\n            factors = self._kblock_factors",
        "small_e8m0_scales_convert or conversion_helpers_match",
    ),
    gpu_mutant(
        "h-e8m0-small-branch-inverted",
        "conversion constants",
        "if small:\n                self._dequant_rows(rA, a_bytes, j, q, True)",
        "if not small:\n                self._dequant_rows(rA, a_bytes, j, q, True)",
        "w4a16_matches_reference and (mixed or alternating)",
    ),
    mutant(
        "h-e4m3-factor-2pow6",
        "conversion constants",
        "F16X2_2POW7 = 0x58005800",
        "F16X2_2POW7 = 0x54005400",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-bf16-2pow127",
        "conversion constants",
        "BF16X2_2POW126 = 0x7E807E80",
        "BF16X2_2POW126 = 0x7F007F00",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-e4m3-bf16-2pow121",
        "conversion constants",
        "BF16X2_2POW120 = 0x7B807B80",
        "BF16X2_2POW120 = 0x7C007C00",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-acc-scale-2pow13",
        "conversion constants",
        "NVFP4_ACC_SCALE = 2.0**14",
        "NVFP4_ACC_SCALE = 2.0**13",
        CONVERSIONS,
    ),
    mutant(
        "h-f16-even-magnitude-shift",
        "conversion constants",
        "even = ((word << 4) & Uint32(0x80808080)) | ((word << 1) & Uint32(0x0E0E0E0E))",
        "even = ((word << 4) & Uint32(0x80808080)) | ((word << 2) & Uint32(0x0E0E0E0E))",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-f16-odd-magnitude-shift",
        "conversion constants",
        "odd = (word & Uint32(0x80808080)) | ((word >> 3) & Uint32(0x0E0E0E0E))",
        "odd = (word & Uint32(0x80808080)) | ((word >> 4) & Uint32(0x0E0E0E0E))",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-e4m3-cvt-one-half",
        "conversion constants",
        "return e4m3x2_to_f16x2(sf_byte * Uint32(0x0101), loc=loc, ip=ip)",
        "return e4m3x2_to_f16x2(sf_byte * Uint32(0x0100), loc=loc, ip=ip)",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-e8m0-no-subnormal",
        "conversion constants",
        "bits = (sf_byte << 7) | (((sf_byte - Uint32(1)) >> 31) << 6)",
        "bits = sf_byte << 7",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-e4m3-bf16-nan-lost",
        "conversion constants",
        "bits = bits | ((Uint32(0) - Uint32(is_nan)) & Uint32(0x7FC07FC0))",
        "bits = bits | ((Uint32(0) - Uint32(is_nan)) & Uint32(0x00000000))",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-mx-magnitude-bits",
        "conversion constants",
        "raw = ((word & Uint32(0x000F000F)) * Uint32(0x1040)) & Uint32(0x81C081C0)",
        "raw = ((word & Uint32(0x000F000F)) * Uint32(0x1020)) & Uint32(0x81C081C0)",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-token-f16-magnitude-shift",
        "conversion constants",
        "bits = ((x & Uint32(0x00080008)) << 12) | ((x & Uint32(0x00070007)) << 9)",
        "bits = ((x & Uint32(0x00080008)) << 12) | ((x & Uint32(0x00070007)) << 10)",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-alpha-scale-on-bf16-too",
        "alpha",
        'return NVFP4_ACC_SCALE if sf_vec_size == 16 and path == "decode" else 1.0',
        "return NVFP4_ACC_SCALE if sf_vec_size == 16 else 1.0",
        "cross_compile",
    ),
    # ------------------------------------------------------------------ permutations
    mutant(
        "h-token-kperm-word",
        "permutation",
        "return 4 * (chunk // 4), 4 * (chunk % 4), 16 * chunk",
        "return 4 * (chunk % 2), 4 * (chunk % 4), 16 * chunk",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-token-kperm-adjacent-pairs",
        "permutation",
        "return 4 * (chunk // 4), 4 * (chunk % 4), 16 * chunk",
        "return 4 * (chunk // 4), 8 * (chunk % 4), 16 * chunk",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-weight-fragment-word",
        "permutation",
        "return r + 2 * (i % 2) + 4 * (i // 2)",
        "return r + 4 * (i % 2) + 2 * (i // 2)",
        CONVERSIONS,
        file=K_ORDER,
    ),
    mutant(
        "h-prmt-selector-halves",
        "permutation",
        "prmt_zero(even, 0x3414),",
        "prmt_zero(even, 0x1434),",
        CONVERSIONS,
        file=DEQUANT,
    ),
    mutant(
        "h-mx-upper-pairs-shift",
        "permutation",
        "shifted = word >> 8",
        "shifted = word >> 16",
        CONVERSIONS,
        file=DEQUANT,
    ),
    # ------------------------------------------------------------------ scale-factor offsets
    mutant(
        "h-mx-scale-column",
        "scale-factor offsets",
        "return j * 2 + q // 2",
        "return j * 2 + q % 2",
        CONVERSIONS,
    ),
    mutant(
        "h-sf-atom-row-swap",
        "scale-factor offsets",
        "return atom * SF_ATOM_BYTES + (r % 32) * 16 + (r // 32) * 4 + col % SF_ATOM_COLS",
        "return atom * SF_ATOM_BYTES + (r // 32) * 16 + (r % 32) * 4 + col % SF_ATOM_COLS",
        CONVERSIONS,
    ),
    mutant(
        "h-sf-word-batch-stride",
        "scale-factor offsets",
        "((batch * row_blocks + row // SF_ATOM_ROWS) * atoms_k + col0 // SF_ATOM_COLS)",
        "((batch + row // SF_ATOM_ROWS) * atoms_k + col0 // SF_ATOM_COLS)",
        CONVERSIONS,
    ),
    mutant(
        "h-mx-token-scale-byte",
        "scale-factor offsets",
        "sf = (sf4 >> Uint32(8 * (col0 % 4 + q // 2))) & Uint32(0xFF)",
        "sf = (sf4 >> Uint32(8 * (q // 2))) & Uint32(0xFF)",
        CONVERSIONS,
        file=DEQUANT,
    ),
    gpu_mutant(
        "h-sfa-row-block",
        "scale-factor offsets",
        "sfa_rb = row_tile * self.tile_rows // (SF_ATOM_ROWS * self.sfa_row_blocks)",
        "sfa_rb = row_tile // self.sfa_row_blocks",
        DETERMINISM + "mxfp4",
    ),
    gpu_mutant(
        "h-sfa-row-offset",
        "scale-factor offsets",
        "sfa_row_off = row_tile * self.tile_rows % SF_ATOM_ROWS",
        "sfa_row_off = row_tile * self.tile_rows % (2 * SF_ATOM_ROWS)",
        DETERMINISM + "mxfp4",
    ),
    # ------------------------------------------------------------------ split-K
    gpu_mutant(
        "h-splitk-reverse-order",
        "split-K",
        "total = total + parts[sp][v]",
        "total = total + parts[self.split_k - 1 - sp][v]",
        ORDER + "nvfp4-split3",
    ),
    gpu_mutant(
        "h-splitk-own-partial-twice",
        "split-K",
        "total = cutlass.Float32(0.0)",
        "total = tCrAcc[c0 + v]",
        ORDER + "nvfp4-split3",
    ),
    gpu_mutant(
        "h-splitk-last-arrival",
        "split-K",
        "last = old == Uint32(self.split_k - 1)",
        "last = old == Uint32(self.split_k - 2)",
        DETERMINISM + "nvfp4-f16",
    ),
    gpu_mutant(
        "h-splitk-counter-not-reset",
        "split-K",
        "dq.st_global_u32(counter, Uint32(0))",
        "dq.st_global_u32(counter, Uint32(1))",
        DETERMINISM + "nvfp4-f16",
    ),
    mutant(
        "h-splitk-range-overlap",
        "split-K",
        "end = begin + base + (split < extra)",
        "end = begin + base + (split <= extra)",
        "split_k_ranges",
    ),
    mutant(
        "h-splitk-range-extra-last",
        "split-K",
        "begin = split * base + cutlass.min(split, extra)",
        "begin = split * base + cutlass.max(0, split - (split_k - extra))",
        "split_k_ranges",
    ),
    mutant(
        "h-splitk-tile-id",
        "split-K",
        "return (batch * col_tiles + col_tile) * row_tiles + row_tile",
        "return (batch * row_tiles + col_tile) * row_tiles + row_tile",
        "split_k_tile_ids",
    ),
    # ------------------------------------------------------------------ K-group reduction
    gpu_mutant(
        "h-kgroup-reverse-order",
        "K-group reduction",
        "for g in cutlass.range_constexpr(1, self.k_groups):",
        "for g in cutlass.range_constexpr(self.k_groups - 1, 0, -1):",
        ORDER + "kgroups4",
    ),
    gpu_mutant(
        "h-kgroup-last-group-dropped",
        "K-group reduction",
        "for g in cutlass.range_constexpr(1, self.k_groups):",
        "for g in cutlass.range_constexpr(1, self.k_groups - 1):",
        ORDER + "kgroups4",
    ),
    # ------------------------------------------------------------------ TMA coordinates
    gpu_mutant(
        "h-tma-b-kblock",
        "TMA coordinates",
        "tBgB[(None, col_tile, kbs * kt + j, batch)],",
        "tBgB[(None, col_tile, kt + j, batch)],",
        DETERMINISM + "nvfp4-f16",
    ),
    gpu_mutant(
        "h-tma-a-batch",
        "TMA coordinates",
        "tma_atom_a, tAgA[(None, row_tile, kt, batch)], tAsA[(None, stage)], tma_bar_ptr=bar",
        "tma_atom_a, tAgA[(None, row_tile, kt, 0)], tAsA[(None, stage)], tma_bar_ptr=bar",
        DETERMINISM + "nvfp4-f16",
    ),
    gpu_mutant(
        "h-tma-sfa-batch",
        "TMA coordinates",
        "tAgSFA[(None, kt, sfa_rb, batch)],",
        "tAgSFA[(None, kt, sfa_rb, 0)],",
        DETERMINISM + "nvfp4-f16",
    ),
    # ------------------------------------------------------------------ epilogue
    gpu_mutant(
        "h-epi-alpha-dropped",
        "alpha",
        "tRS_rD.store((tRS_rAcc.load() * alpha).to(self.c_dtype))",
        "tRS_rD.store(tRS_rAcc.load().to(self.c_dtype))",
        DETERMINISM + "nvfp4-f16",
    ),
    gpu_mutant(
        "h-epi-subtile-values",
        "epilogue",
        "tRS_rAcc[i] = tCrAcc[sub * per_subtile + i]",
        "tRS_rAcc[i] = tCrAcc[i]",
        DETERMINISM + "prefill",
    ),
    gpu_mutant(
        "h-epi-direct-col-bound",
        "epilogue",
        "if crd[0] < rows and crd[1] < cols:",
        "if crd[0] < rows:",
        "test_gpu_matches_reference and 100-300-800",
    ),
    # ------------------------------------------------------------------ W4A16
    mutant(
        "h-w4a16-pair-scale-column",
        "W4A16",
        "byte = (K_BLOCK * j + k_order.pair_k(i, 0)) // self.sf_vec_size % SF_ATOM_COLS",
        "byte = (K_BLOCK * j + k_order.pair_k(0, 0)) // self.sf_vec_size % SF_ATOM_COLS",
        "w4a16_prepacked",
    ),
    mutant(
        "h-w4a16-prepack-order-halves",
        "W4A16",
        "pair_k(4 * w + n % 4, q) + n // 4 for q",
        "pair_k(4 * w + n // 2, q) + n % 2 for q",
        "w4a16_prepacked or prepack_weights",
        file=K_ORDER,
    ),
    mutant(
        "h-w4a16-prefill-chunk-scale",
        "W4A16",
        "sf_col = pair_k(chunk, 0) // sf_vec_size",
        "sf_col = chunk // 4",
        "w4a16_prepacked",
        file=DEQUANT,
    ),
    mutant(
        "h-w4a16-bf16-acc-scale",
        "W4A16",
        "W4A16_BF16_ACC_SCALE = 2.0**8",
        "W4A16_BF16_ACC_SCALE = 2.0**7",
        "w4a16",
    ),
    mutant(
        "h-w4a16-prescale-factor",
        "W4A16",
        "E4M3_BF16_PRESCALE_BITS = 0x7A800000",
        "E4M3_BF16_PRESCALE_BITS = 0x7B000000",
        "w4a16_prepacked",
        file=DEQUANT,
    ),
    mutant(
        "h-consumers-skip-pdl-wait",
        "PDL",
        "            cute.arch.griddepcontrol_wait()\n            self._consumer(",
        "            self._consumer(",
        "cross_compile",
    ),
    mutant(
        "h-w4a16-weights-before-wait",
        "PDL",
        "if cutlass.const_expr(self.swap_ab and self.convert_b):",
        "if cutlass.const_expr(self.swap_ab):",
        "w4a16_cross_compile",
    ),
    gpu_mutant(
        "h-w4a16-sf-word-column",
        "W4A16",
        "col0 = j * K_BLOCK // self.sf_vec_size // SF_ATOM_COLS * SF_ATOM_COLS",
        "col0 = 0",
        "test_gpu_w4a16_matches_reference",
    ),
    gpu_mutant(
        "h-w4a16-weights-unpadded-pitch",
        "W4A16",
        "mW = self._k_major(b_ptr, n, k_pad // 2, l)",
        "mW = self._k_major(b_ptr, n, k // 2, l)",
        "test_gpu_w4a16_matches_reference",
    ),
    # ------------------------------------------------------------------ launcher (torch-facing)
    mutant(
        "h-launcher-alignment-8-bytes",
        "launcher checks",
        "if t.data_ptr() % 16:",
        "if t.data_ptr() % 8:",
        "names_each_operand_problem",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-w4a16-weights-unpadded",
        "launcher checks",
        "(l, n, round_up(k, K_BLOCK) // 2)",
        "(l, n, k // 2)",
        "w4a16_gemm_operand_checks",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-problem-unchecked",
        "launcher checks",
        "reasons += problem_reasons(mnkl, vec, self.path, tiler, a_dtype, self.grouped)",
        "reasons += []",
        "gemm_refuses",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-config-unchecked",
        "launcher checks",
        "reasons = config_reasons(vec, self.sf_dtype, self.c_dtype, *config, a_dtype)",
        "reasons = []",
        "gemm_refuses",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-refused-config-cached",
        "launcher checks",
        "if not refused:\n            _CHECKED.add((config, mnkl))",
        "if True:\n            _CHECKED.add((config, mnkl))",
        "once_per_problem",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-copy-k-unpadded",
        "launcher workspace",
        "k_pad = round_up(k, K_BLOCK)",
        "k_pad = k",
        "converted_shapes",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-token-copy-unpadded",
        "launcher workspace",
        "shape_b = (l, gemm.converted_rows_b(rows_b), k_pad)",
        "shape_b = (l, rows_b, k_pad)",
        "converted_shapes",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-workspace-shared-by-streams",
        "launcher workspace",
        "key = (config, mnkl, stream.device.index, stream.cuda_stream)",
        "key = (config, mnkl, stream.device.index)",
        "launch_arguments",
        file=LAUNCHER,
    ),
    mutant(
        "h-launcher-workspace-made-under-capture",
        "launcher workspace",
        "if torch.cuda.is_current_stream_capturing():",
        "if False:",
        "launch_arguments",
        file=LAUNCHER,
    ),
    # ------------------------------------------------------------------ the grouped kernel
    {
        **mutant(
            "h-grouped-skips-partial-tiles",
            "grouped schedule",
            "cutlass.max(Int32(0), (rows + tile_cols - 1) // tile_cols)",
            "cutlass.max(Int32(0), rows // tile_cols)",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-tile-given-to-the-group-before",
            "grouped schedule",
            "vote_ballot_sync(before + inclusive <= tile)",
            "vote_ballot_sync(before + inclusive < tile)",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-rows-without-pitch",
            "grouped epilogue",
            "cute.make_tensor(mD_mnl.iterator + row0 * pitch, layout)",
            "cute.make_tensor(mD_mnl.iterator + row0, layout)",
            "",
        ),
        "tests": [FACTS, "-k", "plain_integers"],
    },
    {
        **mutant(
            "h-grouped-alpha-of-expert-0",
            "grouped epilogue",
            "unit_alpha = self._alpha(alphas, lk // self.split_k)",
            "unit_alpha = self._alpha(alphas, lk % self.split_k)",
            "",
        ),
        "tests": [FACTS, "-k", "every_role_waits and grouped"],
    },
    mutant(
        "h-grouped-launch-offsets-alpha-swapped",
        "grouped launcher",
        "        tensors = (a, b, sfa, sfb, out, *self.workspace, alpha, offsets, scale)",
        "        tensors = (a, b, sfa, sfb, out, *self.workspace, offsets, alpha, scale)",
        "grouped_launches",
        file=LAUNCHER,
    ),
    mutant(
        "h-grouped-launch-key-without-out-dtype",
        "grouped launcher",
        'key = ("grouped", a.shape, a.dtype, b.shape, b.dtype, sfb.shape, sf_vec_size, out.dtype)',
        'key = ("grouped", a.shape, a.dtype, b.shape, b.dtype, sfb.shape, sf_vec_size)',
        "grouped_launches",
        file=LAUNCHER,
    ),
]
