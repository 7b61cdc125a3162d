"""Single-line mutants of fp4_ops/sm90/gemm.py, launcher.py, dequant.py and k_order.py (and
fp4_ops/sm100.py's adapter): small, realistic bugs, each of which the tests named must catch
(tests/test_hopper.py; the grouped kernel's: tests/test_hopper_facts.py), on the CPU or (``GPU``
in ``tests``: the ``-m gpu`` tests) on an H100 / H200 only. Keep every ``old`` text current as
the kernel changes (it must occur exactly once in its file)."""

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
# the blind review's device-code mutants: every GPU test of the kernel (the grouped kernel's
# are the MoE layer's; the tokens grid's, the eager W4A4 layer's)
HOPPER_GPU = [TEST, "-m", "gpu"]
GROUPED_GPU = ["tests/test_moe.py", "-m", "gpu"]
TOKENS_GPU = [TEST, "tests/test_eager.py", "-m", "gpu"]

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
        "raw = ((word & Uint32(0x000F000F)) * Uint32(0x1040)) & Uint32(BF16_PAIR_BITS)",
        "raw = ((word & Uint32(0x000F000F)) * Uint32(0x1020)) & Uint32(BF16_PAIR_BITS)",
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
        "h-w4a16-prepacked-rotation",
        "W4A16",
        "return _rotate_right(word, Uint32(3 * p)) & Uint32(BF16_PAIR_BITS)",
        "return _rotate_right(word, Uint32(3 * p + 1)) & Uint32(BF16_PAIR_BITS)",
        "w4a16_prepacked",
        file=DEQUANT,
    ),
    mutant(
        "h-w4a16-prepacked-pair3-spread",
        "W4A16",
        "PAIR3_SPREAD = 0x4108",
        "PAIR3_SPREAD = 0x4104",
        "w4a16_prepacked",
        file=DEQUANT,
    ),
    mutant(
        "h-w4a16-prepacked-lanes",
        "W4A16",
        "((12, 13, 14, 21), (28, 29, 30, 5)),",
        "((28, 29, 30, 5), (12, 13, 14, 21)),",
        "w4a16_prepacked",
        file=K_ORDER,
    ),
    mutant(
        "h-w4a16-prefill-runtime-pair",
        "W4A16",
        "is_3 = Uint32(0) - Uint32(p == Uint32(3))",
        "is_3 = Uint32(0) - Uint32(p >= Uint32(2))",
        "w4a16_prepacked",
        file=DEQUANT,
    ),
    mutant(
        "h-w4a16-prefill-rotation-by-32",
        "W4A16",
        "return (word >> shift) | (word << ((Uint32(32) - shift) & Uint32(31)))",
        "return (word >> shift) | (word << (Uint32(32) - shift))",
        "w4a16_prepacked or run_time_shifts",
        file=DEQUANT,
    ),
    mutant(
        "h-w4a16-f16-pair-spread",
        "W4A16",
        "return mul_f16x2((bits * Uint32(9)) & Uint32(F16_PAIR_BITS), factor)",
        "return mul_f16x2((bits * Uint32(8)) & Uint32(F16_PAIR_BITS), factor)",
        "w4a16_prepacked",
        file=DEQUANT,
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
    # (split-K in the grouped kernel: the units' order, the partials' place, the bound)
    {
        **mutant(
            "h-grouped-split-fastest",
            "grouped split-K",
            "tile, split = tile // self.split_k, tile % self.split_k",
            "tile, split = tile % self.split_k, tile // self.split_k",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-split-without-group-stride",
            "grouped split-K",
            "uniform(group * self.split_k + split),",
            "uniform(group + split),",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-walks-past-the-bound",
            "grouped split-K",
            "valid = valid & scheduler.is_valid(unit)",
            "valid = valid | (unit < 0)",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    mutant(
        "h-grouped-tiles-one-short",
        "grouped split-K",
        "return full + cutlass.max(cutlass.min(groups, rows) - 1, 0)",
        "return full + cutlass.max(cutlass.min(groups, rows) - 2, 0)",
        "grouped",
    ),
    mutant(
        "h-grouped-split-kept-past-a-wave",
        "grouped split-K",
        'if units > num_sms * occupancy("decode", tiler, k_groups):',
        'if units > 2 * num_sms * occupancy("decode", tiler, k_groups):',
        "grouped",
        file=LAUNCHER,
    ),
    mutant(
        "h-grouped-workspace-dense-bound",
        "grouped split-K",
        "tiles = output_tiles(rows, 1, 1, tr, tc, 1)[0] * grouped_tiles(m, l, tc)",
        "tiles = output_tiles(rows, 1, 1, tr, tc, 1)[0] * -(-m // tc)",
        "grouped",
        file=LAUNCHER,
    ),
    {
        **mutant(
            "h-grouped-fixup-tile-of-its-group",
            "grouped split-K",
            "uniform(tile),",
            "uniform(col_tile),",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-scheduler-without-splits",
            "grouped split-K",
            "tiles = (row_tiles, grouped_tiles(m, l, self.tile_cols), self.split_k)",
            "tiles = (row_tiles, grouped_tiles(m, l, self.tile_cols), 1)",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-counters-over-the-partials",
            "grouped split-K",
            "num_tiles = row_tiles * grouped_tiles(cols, groups, self.tile_cols)",
            "num_tiles = row_tiles",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    # (a blind review's survivors, before the walk reached the schedule and the fix-up's place)
    {
        **mutant(
            "h-grouped-bound-in-weight-row-tiles",
            "grouped split-K",
            "tiles = (row_tiles, grouped_tiles(m, l, self.tile_cols), self.split_k)",
            "tiles = (row_tiles, grouped_tiles(m, l, self.tile_rows), self.split_k)",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-fixup-place-terms-swapped",
            "grouped split-K",
            "return coords[3] * row_tiles + row_tile, num_tiles",
            "return coords[3] + row_tiles * row_tile, num_tiles",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
    },
    {
        **mutant(
            "h-grouped-counters-after-weight-rows",
            "grouped split-K",
            "num_tiles = row_tiles * grouped_tiles(cols, groups, self.tile_cols)",
            "num_tiles = row_tiles * grouped_tiles(rows, groups, self.tile_cols)",
            "",
        ),
        "tests": [FACTS, "-k", "grouped_schedule"],
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
    # ------------------------------------------------------------------ default_config
    mutant(
        "h-config-no-near-tie",
        "configuration rule",
        "W4A16_NEAR_TIE = 0.02",
        "W4A16_NEAR_TIE = 0.0",
        "default_config_paths",
    ),
    mutant(
        "h-config-w4a4-k-group-bound-high",
        "configuration rule",
        "W4A4_K_GROUP_MAX_UNIT_K_TILES = 16",
        "W4A4_K_GROUP_MAX_UNIT_K_TILES = 17",
        "default_config_paths",
    ),
    mutant(
        "h-config-w4a4-k-group-bound-low",
        "configuration rule",
        "W4A4_K_GROUP_MAX_UNIT_K_TILES = 16",
        "W4A4_K_GROUP_MAX_UNIT_K_TILES = 8",
        "default_config_paths",
    ),
    mutant(
        "h-config-near-tie-too-wide",
        "configuration rule",
        "W4A16_NEAR_TIE = 0.02",
        "W4A16_NEAR_TIE = 0.04",
        "default_config_paths",
    ),
    mutant(
        "h-config-near-tie-for-w4a4",
        "configuration rule",
        "    if w4a16_dense:",
        "    if not grouped:",
        "default_config_paths",
    ),
    mutant(
        "h-config-tall-for-w4a4",
        "configuration rule",
        "    if w4a16_dense and cols == 64 and rows == 64:",
        "    if not grouped and cols == 64 and rows == 64:",
        "default_config_paths",
    ),
    mutant(
        "h-config-tall-threshold-low",
        "configuration rule",
        "W4A16_TALL_MIN_K_TILES = 32",
        "W4A16_TALL_MIN_K_TILES = 31",
        "default_config_paths",
    ),
    mutant(
        "h-config-near-tie-most-units",
        "configuration rule",
        "picks = [(units, busiest, *rest) for busiest, units, *rest in near]",
        "picks = [(-units, busiest, *rest) for busiest, units, *rest in near]",
        "default_config_paths",
    ),
    mutant(
        "h-config-no-sm-share",
        "configuration rule",
        "                rounds = max(rounds, W4A16_SM_SHARE * math.ceil(units / num_sms))",
        "                rounds = max(rounds, W4A16_SM_SHARE * math.ceil(units / slots))",
        "default_config_paths",
    ),
    # ------------------------------------------------- host code (from a blind review)
    mutant(
        "h-token-copy-padded-to-rows",
        "host checks",
        "m_pad = decode_token_rows(m, max(8, kernel_tile(path, mma_tiler_mn)[1]))",
        "m_pad = decode_token_rows(m, max(8, kernel_tile(path, mma_tiler_mn)[0]))",
        "can_implement_refuses",
    ),
    mutant(
        "h-cluster-row-tiles-not-rounded",
        "host checks",
        "row_tiles = (rows + tile_rows * cluster_m - 1) // (tile_rows * cluster_m) * cluster_m",
        "row_tiles = (rows + tile_rows - 1) // tile_rows",
        "tile_ids_are_distinct",
    ),
    mutant(
        "h-bound-scales-swapped",
        "launch arguments",
        "tensors = (b, sfa, sfb, *self.workspace, alpha, alpha, scale)",
        "tensors = (b, sfb, sfa, *self.workspace, alpha, alpha, scale)",
        "bound_launch",
        file=LAUNCHER,
    ),
    # global split-K fix-up (split_k > 1, no 2x1 cluster), a SECOND launch of the same shape on
    # the same stream (the workspace and its counters are cached) with new inputs or a fresh out:
    # the counter keeps counting past split_k - 1, no split is ever last, D is never written
    # (stale / uninitialised out), e.g. 16x8192x8192 W4A4 default (split 4) called twice with
    # different tokens; the first call is correct
    {
        "id": "gr-splitk-counter-no-reset",
        "klass": "split-K fix-up",
        "file": FILE,
        "old": "            if last:\n                dq.st_global_u32(counter, Uint32(0))\n",
        "new": "",
        "tests": HOPPER_GPU,
    },
    # split_k >= 3 global fix-up (e.g. 1x8192x8192 W4A4 default, split 4; 16x18432x7168 split 3):
    # partials summed last-to-first round differently from 0 + p0 + p1 + ...; only a bitwise
    # comparison with the split-order sum catches it (split 2 is equivalent: a + b is commutative)
    {
        "id": "gr-splitk-sum-reversed",
        "klass": "split-K fix-up order (determinism / bit pattern)",
        "file": FILE,
        "old": (
            "            for sp in range(self.split_k):\n"
            "                total = total + parts[sp][v]"
        ),
        "new": (
            "            for sp in reversed(range(self.split_k)):\n"
            "                total = total + parts[sp][v]"
        ),
        "tests": HOPPER_GPU,
    },
    # k_groups >= 3 (default k_groups 4, e.g. 1x8192x8192 W4A16 or --mma_tiler_mn 16,64 --k_groups
    # 4): groups 2 and 3 park their accumulators on top of group 1's, group 0 reads unwritten
    # slots -> wrong D; k_groups = 2 is unaffected
    {
        "id": "gr-kgroup-park-overlap",
        "klass": "K-group SMEM reduction offset",
        "file": FILE,
        "old": "mine = base_red + ((kgroup - 1) * nacc * self.group_threads + tidx) * 4",
        "new": "mine = base_red + ((kgroup - 1) * nacc + tidx) * 4",
        "tests": HOPPER_GPU,
    },
    # K groups whose unit wraps the ring (more k-tiles per unit than ring stages, e.g. 1x8192x8192
    # W4A16 K groups: 64 k-tiles on 16 stages): after the wrap a group waits on the wrong parity
    # on odd ring passes: it reads a stage before its refill (wrong D) or, if the refill already
    # landed, blocks on the next phase and the launch HANGS (timing-dependent); units of <=
    # num_stages k-tiles are unaffected
    {
        "id": "gr-kgroup-phase-no-flip",
        "klass": "pipeline phase bookkeeping (K groups stage step)",
        "file": FILE,
        "old": "            state.phase ^ wrapped,",
        "new": "            state.phase,",
        "tests": HOPPER_GPU,
    },
    # decode split_k 2 on a 2x1 cluster with two or more units per cluster (e.g. 96x16384x1056
    # W4A16 --mma_tiler_mn 128,128 --split_k 2 --cluster_shape_mn 2,1, or 128x32768x2048): from
    # the second unit on, split 0's FULL wait and split 1's FREE wait pass on the old phase ->
    # split 1 overwrites split 0's live ring and split 0 adds a partial that has not landed: wrong
    # D, or (timing-dependent) split 1 blocks on a FREE phase that never completes and the launch
    # HANGS; one unit per cluster is unaffected
    {
        "id": "gr-cluster-phase-const",
        "klass": "barrier wait phase (split-K on 2x1 clusters)",
        "file": FILE,
        "old": "fixup = (*fixup_smem, units % 2)",
        "new": "fixup = (*fixup_smem, 0)",
        "tests": [TEST, "-m", "gpu", "-k", "split_cluster"],
    },
    # W4A16 decode with a ragged last token tile that is not tile 0, i.e. M > 128 with a wholly
    # empty last quarter (e.g. M = 200 or 130, x 4096 x 4096, BFloat16 activations): the boxes of
    # tile 1 load tile 0's tokens -> D rows 128..M-1 wrong; M <= 128 is unaffected
    {
        "id": "gr-token-box-from-tile0",
        "klass": "index math (W4A16 ragged token boxes)",
        "file": FILE,
        "old": "        return first + i * Int32((first + i) * self.token_box_rows < token_rows)",
        "new": "        return i * Int32((first + i) * self.token_box_rows < token_rows)",
        "tests": HOPPER_GPU,
    },
    # direct stores (N * sizeof(D) not a multiple of 16 bytes, e.g. N = 1004 BF16 or N = 1001
    # Float32; 128x64 split tiles; the grouped kernel) with M not a multiple of the token tile:
    # one extra D row (token M) is written: with L > 1 it overwrites row 0 of the next batch
    # (race), in the grouped kernel the first row of the next group, with L = 1 one row past D's
    # end
    {
        "id": "gr-direct-store-col-offbyone",
        "klass": "edge predication (direct-store epilogue)",
        "file": FILE,
        "old": "        if crd[0] < rows and crd[1] < cols:",
        "new": "        if crd[0] < rows and crd[1] <= cols:",
        "tests": HOPPER_GPU,
    },
    # W4A4 decode with the prologue grid, L >= 2 and M not a multiple of the token tile (e.g.
    # 5x4096x4096x2 or 20x2048x1024x3): batch l's converted tokens are written at row l*M instead
    # of l*M_pad, so batches >= 1 read shifted tokens -> wrong D; L = 1 or M a multiple of the
    # tile is unaffected
    {
        "id": "gr-convert-batch-rows-unpadded",
        "klass": "index math (prologue token copy, L > 1)",
        "file": FILE,
        "old": "                row_id = Int64(batch) * Int64(mConv.shape[0]) + Int64(row)",
        "new": "                row_id = Int64(batch) * Int64(rows) + Int64(row)",
        "tests": HOPPER_GPU,
    },
    # W4A4 decode (prologue grid or tokens_converted quantizer grid): the first stage's tokens are
    # requested before griddepcontrol.wait, racing the grid that writes the token copy; the first
    # k-tile of each CTA's first unit reads the previous call's (or the zeroed) copy -> wrong D on
    # a first call or when tokens change between calls of one shape
    {
        "id": "gr-pdl-tokens-before-wait",
        "klass": "PDL wait placement",
        "file": FILE,
        "old": (
            "        cute.arch.griddepcontrol_wait()\n"
            "        for i in cutlass.range(issued, unroll=1):\n"
            "            bar = ab_pipeline.producer_get_barrier(token_state)\n"
            "            self._copy_b(b_copies, kt_begin + i, token_state.index, bar, c"
            "ol_tile, batch)\n"
            "            ab_pipeline.producer_commit(token_state)\n"
            "            token_state.advance()\n"
        ),
        "new": (
            "        for i in cutlass.range(issued, unroll=1):\n"
            "            bar = ab_pipeline.producer_get_barrier(token_state)\n"
            "            self._copy_b(b_copies, kt_begin + i, token_state.index, bar, c"
            "ol_tile, batch)\n"
            "            ab_pipeline.producer_commit(token_state)\n"
            "            token_state.advance()\n"
            "        cute.arch.griddepcontrol_wait()\n"
        ),
        "tests": TOKENS_GPU,
    },
    # K not a multiple of the stage K: decode K % 128 != 0 (e.g. K = 2080, 1056, 96, 32), prefill
    # K % 64 != 0 (e.g. 4096x1024x1056): the last partial k-tile is dropped -> D misses those K
    # terms (K < stage K gives D = 0)
    {
        "id": "gr-k-tiles-floor",
        "klass": "K edge predication (k-tile count)",
        "file": FILE,
        "old": "        k_tiles = (k + self.stage_k - 1) // self.stage_k",
        "new": "        k_tiles = k // self.stage_k",
        "tests": HOPPER_GPU,
    },
    # decode 64-row tiles (K groups, or --mma_tiler_mn T,64) with N > 64: row tile t takes the
    # scales of atom row block t instead of t // 2 -> wrong weight scales (past the end: TMA zero
    # fill) for every tile but the first; 128-row tiles are unaffected
    {
        "id": "gr-sfa-rowblock-64",
        "klass": "scale index (weight scale row block of 64-row tiles)",
        "file": FILE,
        "old": "        sfa_rb = row_tile * self.tile_rows // (SF_ATOM_ROWS * self.sfa_row_blocks)",
        "new": "        sfa_rb = row_tile // self.sfa_row_blocks",
        "tests": HOPPER_GPU,
    },
    # W4A16 MXFP4 decode (BFloat16 activations, sf_vec_size 32): the second 64-wide k-block of
    # every stage takes scale columns 0, 1 instead of 2, 3 -> wrong D whenever those E8M0 scales
    # differ; NVFP4 (four columns per k-block) is equivalent
    {
        "id": "gr-w4a16-mxfp4-scale-byte",
        "klass": "scale handling (MXFP4 column per k-block, W4A16)",
        "file": FILE,
        "old": (
            "            byte = (K_BLOCK * j + k_order.pair_k(i, 0)) // self.sf_vec_siz"
            "e % SF_ATOM_COLS"
        ),
        "new": "            byte = k_order.pair_k(i, 0) // self.sf_vec_size % SF_ATOM_COLS",
        "tests": HOPPER_GPU,
    },
    # grouped (MoE) W4A16 with more than 32 experts where the first token tile of chunk 2 (group
    # >= 32) follows a non-empty group 31 (e.g. 64 or 70 experts with every group non-empty): that
    # unit gets token tile tiles(31) of its group instead of 0 -> that expert's first token tile
    # is never computed (its D rows unwritten) and the unit recomputes another tile of it or one
    # past its rows; also, whatever E, a CTA whose walk ends exactly at tile == total tiles runs a
    # bogus unit for the group after the last 32-group chunk (offsets and alpha read past the last
    # expert), harmless only if the words past the offsets give rows <= 0
    {
        "id": "gr-grouped-chunk-boundary",
        "klass": "grouped tile search (off-by-one at 32-group chunks)",
        "file": FILE,
        "old": "    while (base < groups) & (before + total <= tile):",
        "new": "    while (base < groups) & (before + total < tile):",
        "tests": GROUPED_GPU,
    },
    # MXFP4 on decode (W4A4 or W4A16 BFloat16) where every E8M0 scale a warp reads in a stage is
    # <= 1 (scale byte <= 127, common for quantized activations/weights of magnitude < 6): the
    # prescaled factor is multiplied by 2^126 again -> inf / huge D; stages with any scale > 1
    # take the two-multiply path and are unaffected
    {
        "id": "gr-mxfp4-small-not-prescaled",
        "klass": "FP4 -> BF16 conversion (MXFP4 one-multiply path)",
        "file": FILE,
        "old": (
            "            pairs = convert(packed, factors, self.f16, self.bf16_prescaled or small)"
        ),
        "new": "            pairs = convert(packed, factors, self.f16, self.bf16_prescaled)",
        "tests": HOPPER_GPU,
    },
    # grouped (MoE) kernel with distinct per-expert alphas: every expert's D is scaled by expert
    # 0's alpha -> wrong D for experts >= 1; uniform alphas and dense kernels are unaffected
    {
        "id": "gr-grouped-alpha-expert0",
        "klass": "alpha / global scale product (per-expert alpha)",
        "file": FILE,
        "old": (
            "        alpha = mAlpha[batch if cutlass.const_expr(self.grouped) else 0] * mScale[0]"
        ),
        "new": "        alpha = mAlpha[0] * mScale[0]",
        "tests": GROUPED_GPU,
    },
    # TMA-store epilogue whose D type differs from the MMA type: Float32 D anywhere (rounded to
    # BF16/F16 first), Float16 D on BF16-MMA configs (MXFP4, prefill, W4A16 BF16: only 8
    # significant bits), BF16 D on W4A4 NVFP4 decode (F16 MMA: |D| > 65504 becomes inf, tiny
    # values flush, rare double rounding); direct stores unaffected
    {
        "id": "gr-epilogue-round-through-mma-dtype",
        "klass": "epilogue output dtype (double rounding)",
        "file": FILE,
        "old": "            tRS_rD.store((tRS_rAcc.load() * alpha).to(self.c_dtype))",
        "new": (
            "            tRS_rD.store((tRS_rAcc.load() * alpha).to(self.mma_dtype).to(s"
            "elf.c_dtype))"
        ),
        "tests": HOPPER_GPU,
    },
    # ------------------------------------------- host side: configuration, checks, launches
    # (split_k_range: off-by-one, splits up to and including index `extra` get the extra k-tile
    # (overlapping ranges))
    {
        "id": "ln-gemm-01",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": "    end = begin + base + (split < extra)\n",
        "new": "    end = begin + base + (split <= extra)\n",
        "tests": ["tests/test_hopper.py", "-k", "test_split_k_ranges_partition_the_k_tiles"],
    },
    # (default_config: M == 2048 goes to prefill instead of decode (threshold off by one))
    {
        "id": "ln-gemm-02",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": 'path = "decode" if m <= DECODE_MAX_M and fits else "prefill"',
        "new": 'path = "decode" if m < DECODE_MAX_M and fits else "prefill"',
        "tests": ["tests/test_hopper.py", "-k", "test_default_config_paths"],
    },
    # (occupancy: 64-token decode tiles get 1 CTA/SM instead of 2)
    {
        "id": "ln-gemm-03",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": 'return 2 if path == "decode" and cols <= 64 and rows // 64 * k_groups <= 2 else 1',
        "new": 'return 2 if path == "decode" and cols < 64 and rows // 64 * k_groups <= 2 else 1',
        "tests": ["tests/test_hopper.py", "-k", "test_default_config_paths"],
    },
    # (cluster_reason: decode 2x1 cluster accepted together with K groups)
    {
        "id": "ln-gemm-04",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": (
            'pair_ok = path == "prefill" or (path == "decode" and split_k == 2 and k_groups == 1)'
        ),
        "new": 'pair_ok = path == "prefill" or (path == "decode" and split_k == 2)',
        "tests": [
            "tests/test_hopper.py",
            "-k",
            "test_kernel_refuses_clusters_other_than_a_split_pair_on_decode",
        ],
    },
    # (k_groups_reason: K groups accepted on 64-token decode tiles)
    {
        "id": "ln-gemm-05",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": "rows // 64 * k_groups > 4 or cols > 32:",
        "new": "rows // 64 * k_groups > 4 or cols > 64:",
        "tests": ["tests/test_hopper.py", "-k", "test_can_implement_refuses"],
    },
    # (problem_reasons: an extent of exactly 2^31 elements accepted (32-bit offsets overflow))
    {
        "id": "ln-gemm-06",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": "        if extent >= OFFSET_LIMIT:",
        "new": "        if extent > OFFSET_LIMIT:",
        "tests": [
            "tests/test_hopper.py",
            "-k",
            "test_grouped_offsets_limit_one_experts_weights_not_all",
        ],
    },
    # (tma_store_fits: 8-byte row pitch considered TMA-storable)
    {
        "id": "ln-gemm-07",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": "    return n * C_DTYPES[c_dtype].width // 8 % 16 == 0",
        "new": "    return n * C_DTYPES[c_dtype].width // 8 % 8 == 0",
        "tests": ["tests/test_hopper.py", "-k", "test_tma_store_needs_16_byte_row_pitch"],
    },
    # (split_cluster_fits: counts tiles against all SMs, not clusters (num_sms // 2): 2 waves of
    # clusters)
    {
        "id": "ln-gemm-08",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": "    return output_tiles(n, m, l, *tile, 1)[2] <= num_sms // 2",
        "new": "    return output_tiles(n, m, l, *tile, 1)[2] <= num_sms",
        "tests": [
            "tests/test_hopper.py",
            "-k",
            "test_for_problem_runs_a_wave_of_split_pairs_on_clusters",
        ],
    },
    # (GemmConfig.__post_init__: grouped configs keep tma_store True (grouped kernel needs direct
    # stores; two keys))
    {
        "id": "ln-launcher-09",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "        tma_store = tma_store and not self.grouped\n",
        "new": "",
        "tests": ["tests/test_hopper.py", "-k", "test_grouped_configuration_rules"],
    },
    # (for_problem: tma_store decided from M instead of N)
    {
        "id": "ln-launcher-10",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "c_dtype not in C_DTYPES or tma_store_fits(mnkl[1], c_dtype),",
        "new": "c_dtype not in C_DTYPES or tma_store_fits(mnkl[0], c_dtype),",
        "tests": ["tests/test_hopper.py", "-k", "test_gemm_config_for_problem_and_its_key"],
    },
    # (for_problem: a user split_k still lets default_config add K groups)
    {
        "id": "ln-launcher-11",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "        allow_k_groups = mma_tiler_mn is None and split_k is None\n",
        "new": "        allow_k_groups = mma_tiler_mn is None\n",
        "tests": ["tests/test_hopper.py", "-k", "test_gemm_config_for_problem_and_its_key"],
    },
    # (for_groups: no 2x headroom for uneven routing (smaller token tile picked))
    {
        "id": "ln-launcher-12",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "        per_group = min(rows, 2 * math.ceil(rows / touched))",
        "new": "        per_group = min(rows, math.ceil(rows / touched))",
        "tests": [
            "tests/test_hopper.py",
            "-k",
            "test_grouped_token_tile_holds_twice_the_even_share",
        ],
    },
    # (operand_reasons: expected sfb size computed from M instead of N)
    {
        "id": "ln-launcher-13",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": '        want["sfb"] = (l, blocked_scale_numel(n, k, vec))',
        "new": '        want["sfb"] = (l, blocked_scale_numel(m, k, vec))',
        "tests": ["tests/test_hopper.py", "-k", "test_grouped_configuration_rules"],
    },
    # (operand_reasons: W4A16 b expected unpadded K/2 instead of prepacked K_pad/2)
    {
        "id": "ln-launcher-14",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": '        want["a"], want["b"] = (l, m, k), (l, n, round_up(k, K_BLOCK) // 2)',
        "new": '        want["a"], want["b"] = (l, m, k), (l, n, k // 2)',
        "tests": ["tests/test_hopper.py", "-k", "test_w4a16_gemm_operand_checks"],
    },
    # (operand_reasons: grouped alpha only needs one element (kernel reads E))
    {
        "id": "ln-launcher-15",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "    alphas = l if config.grouped else 1\n",
        "new": "    alphas = 1\n",
        "tests": ["tests/test_hopper.py", "-k", "test_grouped_configuration_rules"],
    },
    # (_pick: cache key misses c_dtype (a float32-out pick reused for bf16 etc.))
    {
        "id": "ln-launcher-16",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "    key = (mnkl, vec, c_dtype, a_dtype, device)\n",
        "new": "    key = (mnkl, vec, a_dtype, device)\n",
        "tests": ["tests/test_eager.py", "-k", "test_launch_cache_is_per_output_dtype"],
    },
    # (_sf_vec_size: conflicting scale dtype / sf_vec_size no longer refused)
    {
        "id": "ln-launcher-17",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "    if len(named) > 1:\n",
        "new": "    if len(named) > 2:\n",
        "tests": ["tests/test_hopper.py", "-k", "test_gemm_takes_the_formats_from_the_tensors"],
    },
    # (Launch.__call__: SFA and SFB addresses swapped)
    {
        "id": "ln-launcher-18",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "        tensors = (a, b, sfa, sfb, out, *self.workspace, alpha, offsets, scale)",
        "new": "        tensors = (a, b, sfb, sfa, out, *self.workspace, alpha, offsets, scale)",
        "tests": ["tests/test_hopper.py", "-k", "test_gemm_launch_arguments_workspaces_and_cache"],
    },
    # (workspace_elems: partials sized for one split, not split_k)
    {
        "id": "ln-launcher-19",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/launcher.py",
        "old": "    return tiles * gemm.split_k * tr * tc + tiles if global_fixup else 1",
        "new": "    return tiles * tr * tc + tiles if global_fixup else 1",
        "tests": [
            "tests/test_problem_acceptance.py",
            "-k",
            "test_hopper_split_k_workspace_holds_partials_and_counters",
        ],
    },
    # (prepack_weights: K_pad always adds a block (K multiple of 64 gets an extra 64))
    {
        "id": "ln-k_order-20",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/k_order.py",
        "old": "    k_pad = -(-k // K_BLOCK) * K_BLOCK\n    rows = b.view",
        "new": "    k_pad = (k // K_BLOCK + 1) * K_BLOCK\n    rows = b.view",
        "tests": [
            "tests/test_hopper.py",
            "-k",
            "test_w4a16_prepacked_weights_dequantize_in_plain_k_order",
        ],
    },
    # (sm100.gemm_for_ops: sfa and sfb swapped)
    {
        "id": "ln-sm100-21",
        "klass": "launcher review",
        "file": "fp4_ops/sm100.py",
        "old": "    blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1), d)",
        "new": "    blockwise_gemm_fp4.gemm(a, b, sfb, sfa, alpha.reshape(1), d)",
        "tests": [
            "tests/test_fp4_ops.py",
            "-k",
            "test_blackwell_adapter_hands_the_kernel_alpha_and_out_dtype",
        ],
    },
    # (config_reasons: tile-rows refusal names M on decode / N on prefill (wrong dimension))
    {
        "id": "ln-gemm-22",
        "klass": "launcher review",
        "file": "fp4_ops/sm90/gemm.py",
        "old": 'what = "N (weight rows)" if path == "decode" else "M"\n',
        "new": 'what = "M" if path == "decode" else "N (weight rows)"\n',
        "tests": ["tests/test_hopper.py", "-k", "test_can_implement_refuses"],
    },
    # a sixth blind review, of the host-side configuration rules and refusals (ids rh-)
    {
        "id": "rh-token-tile-pow2-off-by-one",
        "klass": "off-by-one",
        "file": FILE,
        "old": "max(8, 1 << (m - 1).bit_length())",
        "new": "max(8, 1 << m.bit_length())",
        "tests": [TEST, "-k", "test_for_problem_runs_a_wave_of_split_pairs_on_clusters"],
    },
    {
        "id": "rh-wide-split-min-k-ceil",
        "klass": "integer division rounding the wrong way",
        "file": FILE,
        "old": "k_tiles // split < WIDE_MIN_K_TILES",
        "new": "math.ceil(k_tiles / split) < WIDE_MIN_K_TILES",
        "tests": [TEST, "-k", "test_default_config_paths"],
    },
    {
        "id": "rh-row-tie-break-reversed",
        "klass": "tie-break reversed",
        "file": FILE,
        "old": "rows != (64 if cols >= 64 else 128)",
        "new": "rows == (64 if cols >= 64 else 128)",
        "tests": [TEST, "-k", "test_w4a4_takes_split_pairs_only_on_clusters"],
    },
    {
        "id": "rh-kg-wave-tiles-128",
        "klass": "wrong constant",
        "file": FILE,
        "old": "tiles = math.ceil(n / 64) * l",
        "new": "tiles = math.ceil(n / 128) * l",
        "tests": [TEST, "-k", "test_gemm_config_for_problem_and_its_key"],
    },
    {
        "id": "rh-split-cluster-wave-ctas",
        "klass": "wrong bound (CTAs vs clusters)",
        "file": FILE,
        "old": "<= num_sms // 2",
        "new": "<= num_sms",
        "tests": [TEST, "-k", "test_for_problem_runs_a_wave_of_split_pairs_on_clusters"],
    },
    {
        "id": "rh-staging-rows-cols-swapped",
        "klass": "check on the wrong dimension",
        "file": FILE,
        "old": "== (128, 64) and split_k > 1",
        "new": "== (64, 128) and split_k > 1",
        "tests": [TEST, "-k", "test_cross_compile_sm90a"],
    },
    {
        "id": "rh-kgroups-64-token-tiles",
        "klass": "relaxed refusal bound",
        "file": FILE,
        "old": "or cols > 32:",
        "new": "or cols > 64:",
        "tests": [TEST, "-k", "test_can_implement_refuses"],
    },
    {
        "id": "rh-cluster-pair-kgroups-dropped",
        "klass": "dropped refusal",
        "file": FILE,
        "old": "split_k == 2 and k_groups == 1)",
        "new": "split_k == 2)",
        "tests": [TEST, "-k", "test_kernel_refuses_clusters_other_than_a_split_pair_on_decode"],
    },
    {
        "id": "rh-k-multiple-of-16",
        "klass": "wrong constant (weakened refusal)",
        "file": FILE,
        "old": "k >= 1 and k % 32 != 0",
        "new": "k >= 1 and k % 16 != 0",
        "tests": [TEST, "-k", "test_gemm_refuses_bad_problem"],
    },
    {
        "id": "rh-stages-reduce-bytes-uncounted",
        "klass": "budget counts one buffer too few",
        "file": FILE,
        "old": "- self.reduce_bytes - reserved",
        "new": "- reserved",
        "tests": [TEST, "-k", "test_cross_compile_sm90a"],
    },
    {
        "id": "rh-grouped-tiles-floor",
        "klass": "integer division rounding the wrong way",
        "file": FILE,
        "old": "full = (rows + tile_cols - 1) // tile_cols",
        "new": "full = rows // tile_cols",
        "tests": [TEST, "-k", "test_grouped_tiles_bounds_every_routing"],
    },
    {
        "id": "rh-split-k-wide-tile-rows",
        "klass": "check on the wrong dimension",
        "file": FILE,
        "old": "split_k > 1 and cols > 128",
        "new": "split_k > 1 and rows > 128",
        "tests": [TEST, "-k", "test_can_implement_refuses"],
    },
]
