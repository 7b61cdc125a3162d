# SPDX-License-Identifier: BSD-3-Clause
"""Mutants of blockwise_gemm_fp4.py, of its grouped sibling and of fp4_ops/sm100.py (its
Blackwell adapter), for the mutation harness (tools/mutate.py).

Each mutant is a realistic bug, most of them one line: ``old`` (exact text, unique in
``file``) becomes ``new``; ``tests`` are the pytest arguments that must catch it on a machine
without a GPU.
Keep the list current as the kernel changes: a mutant whose ``old`` text is gone is an error.
"""

_T = "tests/test_blackwell.py"
_OPS = "tests/test_fp4_ops.py"
_G = "tests/test_blackwell_grouped.py"
_F = "tests/test_blackwell_facts.py"

# the MMA warp's k-step: a stage's scale copies and MMAs, then its release (two mutants move it)
_MMA_STEP = """                    stage = ab_consumer_state.index
                    # NOTE: tcgen05.cp and tcgen05.mma issued by the same thread execute in
                    # order, so the MMAs below see the scales copied here.
                    cute.copy(copy_s2t_sfa, tCsSFA_s2t[(None, None, None, None, stage)], tCtSFA_s2t)
                    cute.copy(copy_s2t_sfb, tCsSFB_s2t[(None, None, None, None, stage)], tCtSFB_s2t)
                    for k_block in cutlass.range(num_k_blocks, unroll_full=True):
                        k_coord = (None, None, k_block, stage)
                        sf_coord = (None, None, k_block)
                        cute.gemm(
                            tiled_mma,
                            tCtAcc,
                            [tCrA[k_coord], tCtSFA[sf_coord]],
                            [tCrB[k_coord], tCtSFB_mma[sf_coord]],
                            tCtAcc,
                        )
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                    # The stage is free once these MMAs complete (tcgen05.commit).
                    ab_pipeline.consumer_release(ab_consumer_state)
"""
_RELEASE = "                    ab_pipeline.consumer_release(ab_consumer_state)\n"
_LATE_RELEASE = (
    "                    # The stage is free once these MMAs complete (tcgen05.commit).\n"
    + _RELEASE
)

MUTANTS = [
    # --- where a tcgen05.commit sits relative to the work it releases ----------------------
    dict(
        id="stage-released-before-its-mmas",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old=_MMA_STEP,
        new=_MMA_STEP.replace(_LATE_RELEASE, "").replace(
            "tCtSFB_s2t)\n", "tCtSFB_s2t)\n" + _RELEASE
        ),
        tests=[_F, "-k", "commits_follow"],
    ),
    dict(
        id="stage-released-before-its-scale-copies",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old=_MMA_STEP,
        new=_MMA_STEP.replace(_LATE_RELEASE, "").replace(
            "stage = ab_consumer_state.index\n", "stage = ab_consumer_state.index\n" + _RELEASE
        ),
        tests=[_F, "-k", "commits_follow"],
    ),
    # --- from a blind review (planted without reading the tests) ---------------------------
    # (K alignment rule 16 instead of 32 (accepts K=16 mod 32))
    dict(
        id="host-k-multiple-of-16",
        klass="host config",
        file="blockwise_gemm_fp4.py",
        old="if k >= 1 and k % 32 != 0:",
        new="if k >= 1 and k % 16 != 0:",
        tests=["tests/test_problem_acceptance.py"],
    ),
    # (32-bit stride check counts packed bytes (M*K/2) not FP4 elements)
    dict(
        id="host-32bit-check-in-bytes",
        klass="host config",
        file="blockwise_gemm_fp4.py",
        old='("M*K", m * k),\n            ("N*K", n * k),',
        new='("M*K", m * k // 2),\n            ("N*K", n * k // 2),',
        tests=[_T, "-k", "can_implement"],
    ),
    # (SFB SMEM bytes from tile_n rows, not whole 128-row atoms: too many stages at N 64 / 192)
    dict(
        id="sfb-smem-rows-unrounded",
        klass="bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="sfb_rows = -(-tile_n // SF_ATOM_ROWS) * SF_ATOM_ROWS",
        new="sfb_rows = tile_n",
        tests=[_F, "-k", "sim_tma_loads"],
    ),
    # (N tile = cluster_n * cluster M extent (cm instead of cn))
    dict(
        id="n-tile-by-cluster-m",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="uniform(cluster_n * cn + bidy % cn),",
        new="uniform(cluster_n * cm + bidy % cn),",
        tests=[_F, "-k", "sim_tma_loads"],
    ),
    # (second divmod by clusters_m instead of clusters_n)
    dict(
        id="l-split-by-clusters-m",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="tile_l, cluster_n = divmod(rest, self.clusters_n)",
        new="tile_l, cluster_n = divmod(rest, self.clusters_m)",
        tests=[_F, "-k", "sim_tma_loads"],
    ),
    # (A multicast mask built along cluster mode 1 (M) instead of 2 (N))
    dict(
        id="a-multicast-along-m",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=2",
        new="cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=1",
        tests=[_F, "-k", "sim_tma_loads"],
    ),
    # (SFB tile coordinate uses N tile index directly (no 64-wide sharing / 192 re-index))
    dict(
        id="sfb-coordinate-unshared",
        klass="SF coordinates",
        file="blockwise_gemm_fp4.py",
        old="tile_n_sf, _ = self._sfb_coords(tile_n)",
        new="tile_n_sf = tile_n",
        tests=[_F, "-k", "sim_tma_loads"],
    ),
    # (expected tx bytes lack the CTA-pair factor)
    dict(
        id="tx-bytes-without-the-pair",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old="self.num_tma_load_bytes = cta_pair * (",
        new="self.num_tma_load_bytes = (",
        tests=[_F, "-k", "barrier_arrivals"],
    ),
    # (missing fence.proxy.async.shared before TMA store)
    dict(
        id="no-proxy-fence-before-the-store",
        klass="epilogue hand-off",
        file="blockwise_gemm_fp4.py",
        old='cute.arch.fence_proxy("async.shared", space="cta")',
        new="pass",
        tests=[_F, "-k", "epilogue_fences"],
    ),
    # (overlapping accumulator released one subtile too early)
    dict(
        id="acc-released-a-subtile-early",
        klass="epilogue hand-off",
        file="blockwise_gemm_fp4.py",
        old="self.acc_release_subtile = num_sf_tmem_cols // cute.size(self.epi_tile[1])",
        new="self.acc_release_subtile = num_sf_tmem_cols // cute.size(self.epi_tile[1]) - 1",
        tests=[_F, "-k", "epilogue_reads"],
    ),
    # (TMA store of subtile goes to gC[subtile] instead of gC[acc_subtile] (reversed read order))
    dict(
        id="store-in-read-order",
        klass="epilogue hand-off",
        file="blockwise_gemm_fp4.py",
        old="cute.copy(tma_atom_c, bSG_sC[(None, c_stage)], bSG_gC[(None, acc_subtile)])",
        new="cute.copy(tma_atom_c, bSG_sC[(None, c_stage)], bSG_gC[(None, subtile)])",
        tests=[_F, "-k", "epilogue_reads"],
    ),
    # (k-tile count K // 256 (floor), drops a partial last k-tile)
    dict(
        id="k-tiles-rounded-down",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="k_tile_cnt = cute.size(gA_mkl, mode=[3])",
        new="k_tile_cnt = cute.size(mA_mkl, mode=[1]) // self.mma_tiler[2]",
        tests=[_F, "-k", "sim_tma_loads"],
    ),
    # --- scale-factor layout and per-tile coordinates ------------------------------------
    dict(
        id="sfb-tile-index-n64",
        klass="SF coordinates",
        file="blockwise_gemm_fp4.py",
        old="return tile_n // 2 if cta_tile_n == 64 else tile_n",
        new="return tile_n if cta_tile_n == 64 else tile_n",
        tests=[_T, "-k", "sfb_tiles_the_kernel or sfb_tile_index"],
    ),
    dict(
        id="sfb-tile-index-call-site",
        klass="SF coordinates",
        file="blockwise_gemm_fp4.py",
        old="return sfb_tile_index(tile_n, tile_size_n), sfb_tmem_column_shift(",
        new="return sfb_tile_index(tile_n, 128), sfb_tmem_column_shift(",
        tests=[_T, "-k", "sfb_tiles_the_kernel or sfb_tile_index"],
    ),
    dict(
        id="sfb-tile-from-tile-m",
        klass="SF coordinates",
        file="blockwise_gemm_fp4.py",
        old="tile_n_sf, _ = self._sfb_coords(tile_n)",
        new="tile_n_sf, _ = self._sfb_coords(tile_m)",
        tests=[_T, "-k", "own_grid_axis"],
    ),
    dict(
        id="sfb-load-rows",
        klass="SF coordinates",
        file="blockwise_gemm_fp4.py",
        old="return -(-cta_tile_n // SF_ATOM_ROWS) * SF_ATOM_ROWS",
        new="return cta_tile_n",
        tests=[_T, "-k", "sfb_tiles_the_kernel or sfb_tile_index"],
    ),
    dict(
        id="sfa-layout-on-b-shape",
        klass="SF layout",
        file="blockwise_gemm_fp4.py",
        old="mSFA_mkl = cute.make_tensor(sfa_ptr, sf_layout(mA_mkl.shape, self.sf_vec_size))",
        new="mSFA_mkl = cute.make_tensor(sfa_ptr, sf_layout(mB_nkl.shape, self.sf_vec_size))",
        tests=[_T, "-k", "global_tensors"],
    ),
    dict(
        id="sf-layout-vec-size",
        klass="SF layout",
        file="blockwise_gemm_fp4.py",
        old="return blockscaled_utils.tile_atom_to_shape_SF(shape_rows_k_l, sf_vec_size)",
        new="return blockscaled_utils.tile_atom_to_shape_SF(shape_rows_k_l, 16)",
        tests=[_T, "-k", "tiles_the_kernel or sf_layout or global_tensors"],
    ),
    # --- the 192 re-index -----------------------------------------------------------------
    dict(
        id="reindex-192-never-applied",
        klass="192 re-index",
        file="blockwise_gemm_fp4.py",
        old="    if cta_tile_n == 192:\n",
        new="    if cta_tile_n == 256:\n",
        tests=[_T, "-k", "sfb_tiles_the_kernel"],
    ),
    dict(
        id="reindex-192-call-site",
        klass="192 re-index",
        file="blockwise_gemm_fp4.py",
        old="return sfb_tile_layout(sfb_layout, self.mma_tiler_mn[1])",
        new="return sfb_tile_layout(sfb_layout, sfb_load_rows(self.mma_tiler_mn[1]))",
        tests=[_T, "-k", "sfb_tiles_the_kernel"],
    ),
    dict(
        id="reindex-192-pair-stride",
        klass="192 re-index",
        file="blockwise_gemm_fp4.py",
        old="(sfb_layout.stride[0][0], ((atom_stride, atom_stride), 3 * atom_stride)),",
        new="(sfb_layout.stride[0][0], ((atom_stride, atom_stride), 2 * atom_stride)),",
        tests=[_T, "-k", "reindexing or sfb_tiles_the_kernel"],
    ),
    dict(
        id="reindex-192-odd-tile-stride",
        klass="192 re-index",
        file="blockwise_gemm_fp4.py",
        old="(sfb_layout.stride[0][0], ((atom_stride, atom_stride), 3 * atom_stride)),",
        new="(sfb_layout.stride[0][0], ((atom_stride, 2 * atom_stride), 3 * atom_stride)),",
        tests=[_T, "-k", "reindexing or sfb_tiles_the_kernel"],
    ),
    # --- TMEM offsets and the odd-tile shift -----------------------------------------------
    dict(
        id="sfb-tmem-col-is-sfa",
        klass="TMEM offsets",
        file="blockwise_gemm_fp4.py",
        old="sfb_tmem_col = self.num_acc_tmem_cols + self.num_sfa_tmem_cols",
        new="sfb_tmem_col = self.num_acc_tmem_cols",
        tests=[_T, "-k", "ptx_scale_factors"],
    ),
    dict(
        id="sfa-tmem-col-after-sfb",
        klass="TMEM offsets",
        file="blockwise_gemm_fp4.py",
        old="sfa_tmem_col = self.num_acc_tmem_cols\n",
        new="sfa_tmem_col = self.num_acc_tmem_cols + self.num_sfb_tmem_cols\n",
        tests=[_T, "-k", "ptx_scale_factors"],
    ),
    dict(
        id="sfa-tmem-columns-per-atom",
        klass="TMEM offsets",
        file="blockwise_gemm_fp4.py",
        old="sfa_columns = (cta_m // SF_ATOM_LANES) * MMA_INSTS_PER_K_TILE",
        new="sfa_columns = (cta_m // SF_ATOM_LANES) * 2",
        tests=[_T, "-k", "ptx_scale_factors or budget"],
    ),
    dict(
        id="odd-tile-shift-4",
        klass="tile shift",
        file="blockwise_gemm_fp4.py",
        old="return (tile_n % 2) * 2 if cta_tile_n in (64, 192) else 0",
        new="return (tile_n % 2) * 4 if cta_tile_n in (64, 192) else 0",
        tests=[_T, "-k", "ptx_scale_factors or sfb_tiles_the_kernel or tmem_shift"],
    ),
    dict(
        id="odd-tile-shift-not-192",
        klass="tile shift",
        file="blockwise_gemm_fp4.py",
        old="return (tile_n % 2) * 2 if cta_tile_n in (64, 192) else 0",
        new="return (tile_n % 2) * 2 if cta_tile_n == 64 else 0",
        tests=[_T, "-k", "ptx_scale_factors or sfb_tiles_the_kernel or tmem_shift"],
    ),
    dict(
        id="odd-tile-shift-skipped-in-mma",
        klass="tile shift",
        file="blockwise_gemm_fp4.py",
        old="if cutlass.const_expr(self.cta_tile_shape_mnk[1] in (64, 192)):",
        new="if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 64):",
        tests=[_T, "-k", "ptx_scale_factors"],
    ),
    dict(
        id="odd-tile-shift-on-tile-m",
        klass="tile shift",
        file="blockwise_gemm_fp4.py",
        old="_, tile_n, _ = tile_schedule.cta_tile(work, self.cluster_shape_mn)",
        new="tile_n, _, _ = tile_schedule.cta_tile(work, self.cluster_shape_mn)",
        tests=[_T, "-k", "ptx_scale_factors or own_grid_axis"],
    ),
    # --- multicast masks -----------------------------------------------------------------
    dict(
        id="a-copy-with-b-mask",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="mcast_mask=mcast_a,",
        new="mcast_mask=mcast_b,",
        tests=[_T, "-k", "multicast_mask"],
    ),
    dict(
        id="b-copy-with-a-mask",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="mcast_mask=mcast_b,",
        new="mcast_mask=mcast_a,",
        tests=[_T, "-k", "multicast_mask"],
    ),
    dict(
        id="sfa-copy-with-sfb-mask",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="mcast_mask=mcast_sfa,",
        new="mcast_mask=mcast_sfb,",
        tests=[_T, "-k", "multicast_mask"],
    ),
    dict(
        id="b-mask-along-n",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=1",
        new="cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=2",
        tests=[_T, "-k", "multicast_mask"],
    ),
    dict(
        id="sfb-mask-on-pair-layout",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="cluster_layout_sfb_vmnk, cta_coord_sfb_vmnk, mcast_mode=1",
        new="cluster_layout_vmnk, cta_coord_vmnk, mcast_mode=1",
        tests=[_T, "-k", "multicast_mask"],
    ),
    dict(
        id="sfa-mask-is-b-mask",
        klass="multicast masks",
        file="blockwise_gemm_fp4.py",
        old="mcast_sfa = mcast_a",
        new="mcast_sfa = mcast_b",
        tests=[_T, "-k", "multicast_mask"],
    ),
    # --- launch arguments ----------------------------------------------------------------
    dict(
        id="launch-alpha-pointer-on-a-copy",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="alpha_ptr=make_ptr(cutlass.Float32, alpha.data_ptr(), gmem, assumed_align=4),",
        new="alpha_ptr=make_ptr(cutlass.Float32, alpha.clone().data_ptr(), gmem, assumed_align=4),",
        tests=[_T, "-k", "launch_arguments or alpha_from_the_callers"],
    ),
    dict(
        id="launch-alpha-not-kept",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="        self.alpha = alpha\n",
        new="",
        tests=[_T, "-k", "holds_every_operand"],
    ),
    dict(
        id="launch-sfa-on-sfb-pointer",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="sfa_ptr=ptr(sf_dtype, sfa_blocked),",
        new="sfa_ptr=ptr(sf_dtype, sfb_blocked),",
        tests=[_T, "-k", "launch_arguments"],
    ),
    dict(
        id="launch-sfb-on-sfa-pointer",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="sfb_ptr=ptr(sf_dtype, sfb_blocked),",
        new="sfb_ptr=ptr(sf_dtype, sfa_blocked),",
        tests=[_T, "-k", "launch_arguments"],
    ),
    dict(
        id="launch-m-n-swapped",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="problem_mnkl=tuple(cutlass.Int32(v) for v in mnkl),",
        new="problem_mnkl=tuple(cutlass.Int32(v) for v in (mnkl[1], mnkl[0], *mnkl[2:])),",
        tests=[_T, "-k", "launch_arguments"],
    ),
    dict(
        id="launch-operands-not-kept",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="operands = (a, b, sfa_blocked, sfb_blocked)",
        new="operands = ()",
        tests=[_T, "-k", "holds_every_operand"],
    ),
    dict(
        id="host-sfa-tensor-on-sfb-pointer",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="mSFA_mkl = cute.make_tensor(sfa_ptr, sf_layout(mA_mkl.shape, self.sf_vec_size))",
        new="mSFA_mkl = cute.make_tensor(sfb_ptr, sf_layout(mA_mkl.shape, self.sf_vec_size))",
        tests=[_T, "-k", "global_tensors or host_builds"],
    ),
    dict(
        id="host-b-tensor-on-a-pointer",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="b_ptr, cute.make_ordered_layout((n, cute.assume(k, 32), l), order=(1, 0, 2))",
        new="a_ptr, cute.make_ordered_layout((n, cute.assume(k, 32), l), order=(1, 0, 2))",
        tests=[_T, "-k", "global_tensors or host_builds"],
    ),
    # --- alpha ---------------------------------------------------------------------------
    dict(
        id="epilogue-alpha-not-loaded",
        klass="alpha",
        file="blockwise_gemm_fp4.py",
        old="alpha = mAlpha[0]",
        new="alpha = cutlass.Float32(1.0)",
        tests=[_T, "-k", "by_alpha"],
    ),
    dict(
        id="alpha-tensor-copied",
        klass="alpha",
        file="blockwise_gemm_fp4.py",
        old="isinstance(alpha, torch.Tensor):\n        _check_alpha_tensor(alpha, a.device)\n",
        new="isinstance(alpha, torch.Tensor):\n        _check_alpha_tensor(alpha, a.device)\n"
        "        alpha = alpha.clone()\n",
        tests=[_T, "-k", "alpha_from_the_callers"],
    ),
    dict(
        id="alpha-tensor-dtype-unchecked",
        klass="alpha",
        file="blockwise_gemm_fp4.py",
        old="if alpha.dtype != torch.float32 or alpha.numel() != 1:",
        new="if alpha.numel() != 1:",
        tests=[_T, "-k", "bad_alpha_tensor"],
    ),
    dict(
        id="ops-blackwell-alpha-one",
        klass="alpha",
        file="fp4_ops/sm100.py",
        old="blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1), d)",
        new="blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1) * 0 + 1, d)",
        tests=[_OPS, "-k", "blackwell_adapter"],
    ),
    dict(
        id="ops-blackwell-fp32-d",
        klass="alpha",
        file="fp4_ops/sm100.py",
        old="d = blockwise_gemm_fp4.empty_d(l, m, n, DSL_DTYPE_NAMES[out_dtype], a.device)",
        new='d = blockwise_gemm_fp4.empty_d(l, m, n, "Float32", a.device)',
        tests=[_OPS, "-k", "blackwell_adapter"],
    ),
    dict(
        id="ops-blackwell-padded-d",
        klass="alpha",
        file="fp4_ops/sm100.py",
        old="d = d if d.is_contiguous() else d.contiguous()",
        new="d = d",
        tests=[_OPS, "-k", "blackwell_adapter"],
    ),
    dict(
        id="epilogue-ignores-alpha",
        klass="alpha",
        file="blockwise_gemm_fp4.py",
        old="tRS_rC.store((acc * tile_alpha).to(self.c_dtype))",
        new="tRS_rC.store(acc.to(self.c_dtype))",
        tests=[_T, "-k", "by_alpha"],
    ),
    dict(
        id="alpha-fp32-overflow-accepted",
        klass="alpha",
        file="blockwise_gemm_fp4.py",
        old="if not finite:",
        new="if math.isnan(value):",
        tests=[_T, "-k", "alpha"],
    ),
    dict(
        id="cli-alpha-unchecked",
        klass="alpha",
        file="blockwise_gemm_fp4.py",
        old="args.alpha = checked_alpha(args.alpha)",
        new="args.alpha = float(args.alpha)",
        tests=[_T, "-k", "bad_numbers"],
    ),
    # --- the static persistent tile schedule ----------------------------------------------
    dict(
        id="sched-next-work-by-one",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="return work + cute.arch.grid_dim()[2]",
        new="return work + 1",
        tests=[_T, "-k", "tile_schedule"],
    ),
    dict(
        id="sched-n-fastest",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="rest, cluster_m = divmod(work, self.clusters_m)",
        new="rest, cluster_m = divmod(work, self.clusters_n)",
        tests=[_T, "-k", "tile_schedule"],
    ),
    dict(
        id="sched-place-in-cluster-n",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="uniform(cluster_n * cn + bidy % cn),",
        new="uniform(cluster_n * cn + bidy % cm),",
        tests=[_T, "-k", "tile_schedule"],
    ),
    dict(
        id="sched-clusters-m-floor",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="clusters_m = cute.ceil_div(num_ctas_mnl[0], cluster_shape_mn[0])",
        new="clusters_m = num_ctas_mnl[0] // cluster_shape_mn[0]",
        tests=[_T, "-k", "tile_schedule"],
    ),
    dict(
        id="sched-first-work-block-x",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="return cutlass.Int32(cute.arch.block_idx()[2])",
        new="return cutlass.Int32(cute.arch.block_idx()[0])",
        tests=[_T, "-k", "tile_schedule"],
    ),
    # --- host configuration ----------------------------------------------------------------
    dict(
        id="pick-tile-ignores-cluster",
        klass="host config",
        file="blockwise_gemm_fp4.py",
        old="pair_fits = given_cluster is None or given_cluster[0] % 2 == 0",
        new="pair_fits = True",
        tests=[_T, "-k", "pick_tile"],
    ),
    dict(
        id="oracle-for-every-output-type",
        klass="host config",
        file="blockwise_gemm_fp4.py",
        old='if d_cublas is not None and c_dtype != "BFloat16":',
        new="if d_cublas is None:",
        tests=[_T, "-k", "second_oracle"],
    ),
    dict(
        id="sched-pair-not-shared",
        klass="tile schedule",
        file="blockwise_gemm_fp4.py",
        old="return tile_m // cta_pair, tile_n, tile_l",
        new="return tile_m, tile_n, tile_l",
        tests=[_T, "-k", "tile_schedule"],
    ),
    # --- barriers ------------------------------------------------------------------------
    dict(
        id="ab-empty-arrivals-one-too-many",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old="pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1",
        new="pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b",
        tests=[_T, "-k", "barrier_arrival"],
    ),
    dict(
        id="acc-empty-arrivals-one-cta",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old="THREADS_PER_WARP * NUM_EPILOGUE_WARPS * cute.size(tiled_mma.thr_id.shape)",
        new="THREADS_PER_WARP * NUM_EPILOGUE_WARPS",
        tests=[_T, "-k", "barrier_arrival"],
    ),
    dict(
        id="tmem-barrier-without-mma-warp",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old="num_threads=THREADS_PER_WARP * (NUM_EPILOGUE_WARPS + 1),",
        new="num_threads=THREADS_PER_WARP * NUM_EPILOGUE_WARPS,",
        tests=[_T, "-k", "barrier_arrival"],
    ),
    dict(
        id="tx-bytes-one-cta-of-pair",
        klass="barriers",
        file="blockwise_gemm_fp4.py",
        old="self.num_tma_load_bytes = cta_pair * (",
        new="self.num_tma_load_bytes = 1 * (",
        tests=[_T, "-k", "budget"],
    ),
    dict(
        id="mma-never-accumulates",
        klass="accumulate flag",
        file="blockwise_gemm_fp4.py",
        old="tiled_mma.set(tcgen05.Field.ACCUMULATE, True)",
        new="tiled_mma.set(tcgen05.Field.ACCUMULATE, False)",
        tests=[_T, "-k", "overwrites_then_accumulates"],
    ),
    dict(
        id="mma-accumulates-from-the-start",
        klass="accumulate flag",
        file="blockwise_gemm_fp4.py",
        old="tiled_mma.set(tcgen05.Field.ACCUMULATE, False)",
        new="tiled_mma.set(tcgen05.Field.ACCUMULATE, True)",
        tests=[_T, "-k", "overwrites_then_accumulates"],
    ),
    # --- targets -------------------------------------------------------------------------
    dict(
        id="gpu-check-ignores-target",
        klass="launch arguments",
        file="blockwise_gemm_fp4.py",
        old="runs = (major, minor) in GPU_ARCHS[gpu_arch]",
        new="runs = (major, minor) in BLACKWELL_CAPABILITIES",
        tests=[_T, "-k", "gpu_check_per_target"],
    ),
    # --- pipeline bookkeeping: orderings and races that only a B200 run shows --------------
    # The CPU suite does not catch these (the PTX stays well-formed, the host is unchanged); they
    # stay listed so that the harness counts them and a B200 test can be pointed at them.
    dict(
        id="tma-mma-tile-single-cta",
        klass="bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="tile_l = tile_schedule.mma_tile(work, self.cluster_shape_mn, cta_pair)",
        new="tile_l = tile_schedule.mma_tile(work, self.cluster_shape_mn, 1)",
        tests=[_T],
    ),
    dict(
        id="epi-acc-released-a-subtile-early",
        klass="bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="if subtile == self.acc_release_subtile:",
        new="if subtile == self.acc_release_subtile - 1:",
        tests=[_T],
    ),
    dict(
        id="epi-overlapping-buffers-swapped",
        klass="bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="if acc_buffer == 0:",
        new="if acc_buffer == 1:",
        tests=[_T],
    ),
    dict(
        id="mma-acc-buffer-from-phase",
        klass="bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="acc_buffer = acc_producer_state.phase ^ 1",
        new="acc_buffer = acc_producer_state.phase",
        tests=[_T],
    ),
    dict(
        id="epi-c-stage-restarts-each-tile",
        klass="bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="c_stage = (subtiles_before + subtile) % self.num_c_stage",
        new="c_stage = subtile % self.num_c_stage",
        tests=[_T],
    ),
    dict(
        id="grouped-tiles-m-fastest",
        klass="grouped schedule",
        file="blockwise_grouped_gemm_fp4.py",
        old="mma_tile_m, cluster_n = divmod(work, self.clusters_n)",
        new="cluster_n, mma_tile_m = divmod(work, self.clusters_m)",
        tests=[_G, "-k", "sim_"],
    ),
    dict(
        id="grouped-group-of-cta-tile",
        klass="grouped schedule",
        file="blockwise_grouped_gemm_fp4.py",
        old="uniform(self.mTileGroup[mma_tile_m]),",
        new="uniform(self.mTileGroup[mma_tile_m * cm + bidx % cm]),",
        tests=[_G, "-k", "sim_"],
    ),
    dict(
        id="grouped-count-inclusive",
        klass="grouped schedule",
        file="blockwise_grouped_gemm_fp4.py",
        old="& (mma_tile_m < self.mNumMTiles[0])",
        new="& (mma_tile_m <= self.mNumMTiles[0])",
        tests=[_G, "-k", "sim_"],
    ),
    dict(
        id="grouped-count-past-buffers",
        klass="grouped schedule",
        file="blockwise_grouped_gemm_fp4.py",
        old="return (work < self.num_cluster_tiles) & (mma_tile_m < self.mNumMTiles[0])",
        new="return mma_tile_m < self.mNumMTiles[0]",
        tests=[_G, "-k", "sim_"],
    ),
    dict(
        id="grouped-n-clusters-floor",
        klass="grouped schedule",
        file="blockwise_grouped_gemm_fp4.py",
        old="num_clusters_n = cute.ceil_div(num_ctas_n, cluster_n)",
        new="num_clusters_n = num_ctas_n // cluster_n",
        tests=[_G, "-k", "schedule_visits"],
    ),
    dict(
        id="grouped-alpha-of-m-tile",
        klass="grouped alpha",
        file="blockwise_grouped_gemm_fp4.py",
        old="return mAlpha[tile_mnl[2]]",
        new="return mAlpha[tile_mnl[0]]",
        tests=[_G, "-k", "sim_epilogue"],
    ),
    dict(
        id="grouped-alpha-loaded-once",
        klass="grouped alpha",
        file="blockwise_grouped_gemm_fp4.py",
        old="return mAlpha[tile_mnl[2]]",
        new="return alpha",
        tests=[_G, "-k", "sim_epilogue"],
    ),
    dict(
        id="grouped-layout-rounds-down",
        klass="grouped layout",
        file="blockwise_grouped_gemm_fp4.py",
        old="tiles = [-(-count // tile_m) for count in rows]",
        new="tiles = [count // tile_m for count in rows]",
        tests=[_G, "-k", "group_layout"],
    ),
    dict(
        id="grouped-cluster-m-below-pair",
        klass="grouped config",
        file="blockwise_grouped_gemm_fp4.py",
        old="if cluster_shape_mn[0] != pair:",
        new="if cluster_shape_mn[0] < pair:",
        tests=[_G, "-k", "refusals"],
    ),
    dict(
        id="grouped-m-multiple-of-128",
        klass="grouped config",
        file="blockwise_grouped_gemm_fp4.py",
        old="if mnkg[0] % tile_m:",
        new="if mnkg[0] % 128:",
        tests=[_G, "-k", "refusals"],
    ),
    dict(
        id="grouped-scale-columns-unpadded",
        klass="grouped operands",
        file="blockwise_grouped_gemm_fp4.py",
        old="k_cols = -(-(k // config.sf_vec_size) // 4) * 4",
        new="k_cols = k // config.sf_vec_size",
        tests=[_G, "-k", "accepts or refuses"],
    ),
    dict(
        id="grouped-count-is-groups",
        klass="grouped operands",
        file="blockwise_grouped_gemm_fp4.py",
        old="num_m_tiles=torch.tensor([layout.num_m_tiles], dtype=torch.int32, device=device),",
        new="num_m_tiles=torch.tensor([len(layout.group_rows)], dtype=torch.int32, device=device),",
        tests=[_G, "-k", "operands_give"],
    ),
    dict(
        id="grouped-scale-pointers-swapped",
        klass="grouped operands",
        file="blockwise_grouped_gemm_fp4.py",
        old="sfa_ptr=ptr(sf_dtype, sfa_blocked),",
        new="sfa_ptr=ptr(sf_dtype, sfb_blocked),",
        tests=[_G, "-k", "kernel_args"],
    ),
    dict(
        id="grouped-a-coordinates-not-shared",
        klass="grouped coordinates",
        file="blockwise_grouped_gemm_fp4.py",
        old="(a[0], shared_by_groups(a[1], self.num_groups)),",
        new="(a[0], a[1]),",
        tests=[_G, "-k", "sim_"],
        equivalent="A's batch mode is static 1 with stride 0 already: every group index gives "
        "batch 0's coordinates; shared_by_groups only makes the indices in range",
    ),
    dict(
        id="grouped-d-coordinates-not-shared",
        klass="grouped coordinates",
        file="blockwise_grouped_gemm_fp4.py",
        old="return atom, shared_by_groups(tensor, self.num_groups)",
        new="return atom, tensor",
        tests=[_G, "-k", "sim_epilogue"],
        equivalent="D's batch mode is static 1 with stride 0 already (its store is 2-D in both "
        "builds); shared_by_groups only makes the group indices in range",
    ),
    # --- a second blind review: the grouped kernel, and the dense kernel's code it runs -----
    # (buffers sized for 8 M tiles, num_m_tiles 6 (any count below the buffers): the tile at index
    # num_m_tiles is also processed - it reads tile_group[num_m_tiles] (a stale/garbage group,
    # possibly past B's groups) and overwrites D rows past the count that must stay untouched)
    dict(
        id="bg-valid-count-le",
        klass="tile-to-group bounds",
        file="blockwise_grouped_gemm_fp4.py",
        old="return (work < self.num_cluster_tiles) & (mma_tile_m < self.mNumMTiles[0])",
        new="return (work < self.num_cluster_tiles) & (mma_tile_m <= self.mNumMTiles[0])",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    # (tile M 256 on a CTA pair (cluster 2x1 or 2x2) with >= 2 groups, e.g. --group_rows
    # 200,0,37,512 --mma_tiler_mn 256,128 --cluster_shape_mn 2,1: MMA tile t reads tile_group[2t +
    # v] - the two CTAs of a pair disagree on the group, B/SFB/alpha of the wrong group, reads
    # past the table for the upper half of the tiles: wrong values)
    dict(
        id="bg-pair-group-index",
        klass="tile-to-group mapping (CTA pair)",
        file="blockwise_grouped_gemm_fp4.py",
        old="uniform(self.mTileGroup[mma_tile_m]),",
        new="uniform(self.mTileGroup[mma_tile_m * cm + bidx % cm]),",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    # (any routing whose M tile index differs from its group, e.g. --group_rows 200,0,37,512 at
    # tile 128 (tiles 0,1 are group 0, tile 2 group 2, tiles 3..6 group 3): tiles are scaled by
    # alpha[M tile] (another group's, or read past alpha's G entries) -> wrongly scaled D rows)
    dict(
        id="bg-alpha-m-tile",
        klass="epilogue alpha per group",
        file="blockwise_grouped_gemm_fp4.py",
        old="return mAlpha[tile_mnl[2]]",
        new="return mAlpha[tile_mnl[0]]",
        tests=[_G, "-k", "test_sim_epilogue_reads_each_tiles_alpha_and_stores_its_rows"],
    ),
    # (any routing with a non-empty group g >= 1: SFB's descriptor has one batch, so SFB loads at
    # group coordinate g are out of bounds and zero-filled -> those groups' D rows are 0 (or
    # garbage) on a B200)
    dict(
        id="bg-sfb-one-batch",
        klass="scale-factor indexing per group",
        file="blockwise_grouped_gemm_fp4.py",
        old=(
            "        mA_mkl, _, mSFA_mkl, _, mC_mnl = self.global_tensors(\n"
            "            a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, (m, n, k, 1)\n"
            "        )\n"
            "        _, mB_nkl, _, mSFB_nkl, _ = self.global_tensors("
        ),
        new=(
            "        mA_mkl, _, mSFA_mkl, mSFB_nkl, mC_mnl = self.global_tensors(\n"
            "            a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, (m, n, k, 1)\n"
            "        )\n"
            "        _, mB_nkl, _, _, _ = self.global_tensors("
        ),
        tests=[_G, "-k", "test_sim_tma_warp_loads_its_tiles_with_their_groups"],
    ),
    # (a group whose rows are not a multiple of tile M, e.g. group_rows (200, 0, 37, 512) at tile
    # 128: 200 rows get 1 tile and 37 rows none, offsets overlap the next group -> tail rows never
    # computed / overwritten (M tail of a group lost))
    dict(
        id="bg-group-layout-floor",
        klass="M tail of a group (padding)",
        file="blockwise_grouped_gemm_fp4.py",
        old="tiles = [-(-count // tile_m) for count in rows]",
        new="tiles = [count // tile_m for count in rows]",
        tests=[_G, "-k", "test_group_layout_pads_each_group_to_whole_tiles"],
    ),
    # (a routing with an empty group, e.g. (200, 0, 37, 512): the empty group gets a tile,
    # tile_group has more entries than M / TILE_M and every later tile is attributed to the wrong
    # group (and num_m_tiles exceeds the buffers))
    dict(
        id="bg-empty-group-tile",
        klass="empty groups",
        file="blockwise_grouped_gemm_fp4.py",
        old="tile_group += [group] * count",
        new="tile_group += [group] * max(count, 1)",
        tests=[_G, "-k", "test_group_layout_pads_each_group_to_whole_tiles"],
    ),
    # (any MXFP4 (sf_vec_size 32) grouped_gemm call: the expected scale sizes are those of V=16
    # (twice too many K columns), so correctly sized MXFP4 blocked scales are refused with
    # ValueError (a wrong refusal of valid input))
    dict(
        id="bg-operand-sf-vec16",
        klass="scale-factor size per format (host)",
        file="blockwise_grouped_gemm_fp4.py",
        old="k_cols = -(-(k // config.sf_vec_size) // 4) * 4",
        new="k_cols = -(-(k // 16) // 4) * 4",
        tests=[_G, "-k", "test_grouped_gemm_accepts_the_blocked_scales_of_every_shape"],
    ),
    # (any grouped_gemm launch: the kernel reads the tile count from tile_group[0] (a group id)
    # and the tile groups from the one-element count buffer (then past it) -> wrong/no tiles
    # computed, wrong groups, reads past num_m_tiles' buffer)
    dict(
        id="bg-kernel-args-swap",
        klass="host argument order",
        file="blockwise_grouped_gemm_fp4.py",
        old=(
            "tile_group_ptr=ptr(cutlass.Int32, tile_group, 4),\n"
            "        num_m_tiles_ptr=ptr(cutlass.Int32, num_m_tiles, 4),"
        ),
        new=(
            "tile_group_ptr=ptr(cutlass.Int32, num_m_tiles, 4),\n"
            "        num_m_tiles_ptr=ptr(cutlass.Int32, tile_group, 4),"
        ),
        tests=[_G, "-k", "test_kernel_args_name_each_operand_for_its_parameter"],
    ),
    # (any CTA that runs >= 2 tiles on one TMEM accumulator buffer (more tiles than ~148 clusters
    # x 2 buffers, e.g. --group_rows 200,0,37,512 --nk 4096,7168): the first MMA of a tile adds
    # onto the previous tile's accumulator -> wrong values)
    dict(
        id="bg-accumulate-carry",
        klass="accumulate flag",
        file="blockwise_gemm_fp4.py",
        old="            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)\n",
        new="            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)\n",
        tests=[_T, "-k", "test_ptx_mma_overwrites_then_accumulates"],
    ),
    # (any problem with more k-tiles than A/B stages (K > 5 x 256, e.g. K 7168): the empty
    # barriers expect one arrival more than the MMA warp's commit gives, so the TMA warp waits
    # forever when the ring wraps -> hang)
    dict(
        id="bg-ab-consumer-count",
        klass="barrier arrive count",
        file="blockwise_gemm_fp4.py",
        old="pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1",
        new="pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b",
        tests=[_F, "-k", "test_sim_barrier_arrivals_match_their_init_counts"],
    ),
    # (any input with non-trivial scales: SFB is copied into SFA's TMEM columns (same start
    # column), so the MMAs read SFB's scales for A (and stale columns for B) -> wrong values,
    # NVFP4 and MXFP4)
    dict(
        id="bg-sfb-tmem-col",
        klass="TMEM columns",
        file="blockwise_gemm_fp4.py",
        old="sfb_tmem_col = self.num_acc_tmem_cols + self.num_sfa_tmem_cols",
        new="sfb_tmem_col = self.num_acc_tmem_cols",
        tests=[_F, "-k", "test_sim_tmem_columns_of_accumulators_and_scales"],
    ),
    # (any CTA that runs >= 2 tiles (e.g. --group_rows 200,0,37,512 --nk 4096,7168): the MMA
    # warp's k-tile count keeps growing, so from the second tile on the try-wait peek is skipped,
    # full_peek stays True and consumer_wait never blocks -> MMAs read SMEM stages before TMA
    # filled them (race, wrong values))
    dict(
        id="bg-mma-no-reset-count",
        klass="pipeline stage/phase bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="            ab_consumer_state.reset_count()\n",
        new="",
        tests=[_F, "-k", "test_sim_pipeline_waits_start_in_each_roles_phase"],
    ),
    # (any run with more than one k-tile per CTA in total (K >= 512, or >= 2 tiles per CTA), NVFP4
    # or MXFP4, e.g. --group_rows 200,0,37,512 --nk 4096,7168: tcgen05.cp always copies SFA from
    # SMEM stage 0, so k-tile i is scaled with the SFA of whatever k-tile last landed in stage 0
    # (and races with its TMA) -> wrong values)
    dict(
        id="bg-s2t-sfa-stage0",
        klass="scale-factor SMEM->TMEM copy stage",
        file="blockwise_gemm_fp4.py",
        old="tCsSFA_s2t[(None, None, None, None, stage)]",
        new="tCsSFA_s2t[(None, None, None, None, 0)]",
        tests=[_F, "-k", "scale_copies_read"],
    ),
    # (fp4_gemm on a B200 (sm_100 branch of fp4_ops.ops.gemm_impl -> sm100.gemm_for_ops): sfa and
    # sfb are handed to blockwise_gemm_fp4.gemm swapped; with M and N padding to the same multiple
    # of 128 (e.g. M = N = 256, or M 100 / N 128) the shapes pass and D uses B's scales for A's
    # rows -> wrong values; otherwise a valid call is refused with ValueError)
    dict(
        id="bg-sm100-scales-swapped",
        klass="host argument order (sm100 path)",
        file="fp4_ops/sm100.py",
        old="blockwise_gemm_fp4.gemm(a, b, sfa, sfb, alpha.reshape(1), d)",
        new="blockwise_gemm_fp4.gemm(a, b, sfb, sfa, alpha.reshape(1), d)",
        tests=[_OPS, "-k", "adapter_hands"],
    ),
    # (tile M 256 on a CTA pair with >= 2 tiles per cluster: the accumulator's empty barrier
    # completes after 128 of the 256 epilogue arrivals (one CTA's), so the MMA warp overwrites an
    # accumulator the peer CTA's epilogue is still reading -> race, and the phases drift)
    dict(
        id="bg-acc-consumer-pair",
        klass="barrier arrive count (CTA pair)",
        file="blockwise_gemm_fp4.py",
        old=(
            "            THREADS_PER_WARP * NUM_EPILOGUE_WARPS * cute.size(tiled_mma.th"
            "r_id.shape)\n"
        ),
        new="            THREADS_PER_WARP * NUM_EPILOGUE_WARPS\n",
        tests=[_F, "-k", "test_sim_barrier_arrivals_match_their_init_counts"],
    ),
    # (tile N 256 (overlapping accumulator buffers), e.g. --mma_tiler_mn 256,256
    # --cluster_shape_mn 2,1: the epilogue reads the other buffer than the MMA wrote -> wrong
    # values)
    dict(
        id="bg-overlap-phase",
        klass="pipeline phase bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="                acc_buffer = acc_consumer_state.phase\n",
        new="                acc_buffer = acc_consumer_state.phase ^ 1\n",
        tests=[_F, "-k", "test_sim_epilogue_reads_the_buffer_the_mma_wrote"],
    ),
    # (any routing whose groups have different alphas (NVFP4 global scales): every tile is scaled
    # by alpha[0] (the dense kernel's preloaded value) instead of its group's)
    dict(
        id="bg-epilogue-alpha-bypass",
        klass="epilogue alpha per group",
        file="blockwise_gemm_fp4.py",
        old="tRS_rC.store((acc * tile_alpha).to(self.c_dtype))",
        new="tRS_rC.store((acc * alpha).to(self.c_dtype))",
        tests=[_G, "-k", "test_sim_epilogue_reads_each_tiles_alpha_and_stores_its_rows"],
    ),
    # (any CTA with >= 2 tiles where subtiles per tile is not a multiple of the epilogue stages
    # (128x128 BF16: 4 subtiles, 5 stages): a new tile restarts at stage 0 while a TMA store may
    # still read it -> race, corrupted D)
    dict(
        id="bg-c-stage-restart",
        klass="epilogue SMEM stage bookkeeping",
        file="blockwise_gemm_fp4.py",
        old="c_stage = (subtiles_before + subtile) % self.num_c_stage",
        new="c_stage = subtile % self.num_c_stage",
        tests=[_F, "-k", "test_sim_epilogue_fences_and_waits_around_every_tma_store"],
    ),
    # (tile N 64 or 192 with an odd N tile, e.g. N 384 at --mma_tiler_mn 128,192: odd tiles read
    # SFB from the start of the 128-row scale atom instead of half-way -> wrong values)
    dict(
        id="bg-sfb-shift-dropped",
        klass="scale-factor TMEM indexing (odd N tiles)",
        file="blockwise_gemm_fp4.py",
        old="[tCrB[k_coord], tCtSFB_mma[sf_coord]],",
        new="[tCrB[k_coord], tCtSFB[sf_coord]],",
        tests=[_F, "-k", "test_sim_tmem_columns_of_accumulators_and_scales"],
    ),
    # (tile N 256 (overlapping accumulators) with >= 2 tiles per CTA: the accumulator stage is
    # released before the tcgen05.ld of the shared columns complete -> the next tile's MMAs can
    # overwrite them (race))
    dict(
        id="bg-tmem-load-fence-dropped",
        klass="TMEM release ordering (overlapping accumulators)",
        file="blockwise_gemm_fp4.py",
        old="                        cute.arch.fence_view_async_tmem_load()\n",
        new="",
        tests=[_F, "-k", "test_sim_epilogue_reads_the_buffer_the_mma_wrote"],
    ),
    # a fifth blind review, of the grouped kernel's schedule, lookups, layout, checks and
    # launch (ids rz-); the dense template's launch below it
    dict(
        id="rz-valid-off-by-one",
        klass="schedule bound (num_m_tiles off by one)",
        file="blockwise_grouped_gemm_fp4.py",
        old="(mma_tile_m < self.mNumMTiles[0])",
        new="(mma_tile_m <= self.mNumMTiles[0])",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-valid-or",
        klass="schedule bound (count ignored)",
        file="blockwise_grouped_gemm_fp4.py",
        old=") & (mma_tile_m <",
        new=") | (mma_tile_m <",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-cta-divmod-swap",
        klass="per-group tile coordinates (quotient/remainder swapped)",
        file="blockwise_grouped_gemm_fp4.py",
        old="mma_tile_m, cluster_n = divmod(work, self.clusters_n)",
        new="cluster_n, mma_tile_m = divmod(work, self.clusters_n)",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-pair-unscaled",
        klass="CTA-pair M tile coordinate",
        file="blockwise_grouped_gemm_fp4.py",
        old="uniform(mma_tile_m * cm + bidx % cm)",
        new="uniform(mma_tile_m + bidx % cm)",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-n-rank-bidx",
        klass="cluster N rank (block x/y mix-up)",
        file="blockwise_grouped_gemm_fp4.py",
        old="cluster_n * cn + bidy % cn",
        new="cluster_n * cn + bidx % cn",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-group-by-work",
        klass="group lookup indexed by linear work id",
        file="blockwise_grouped_gemm_fp4.py",
        old="self.mTileGroup[mma_tile_m]",
        new="self.mTileGroup[work]",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-alpha-by-mtile",
        klass="alpha per group indexed by M tile",
        file="blockwise_grouped_gemm_fp4.py",
        old="mAlpha[tile_mnl[2]]",
        new="mAlpha[tile_mnl[0]]",
        tests=[_G, "-k", "test_sim_epilogue_reads_each_tiles_alpha_and_stores_its_rows"],
    ),
    dict(
        id="rz-cluster-tiles-no-n",
        klass="grid size / cluster tile count",
        file="blockwise_grouped_gemm_fp4.py",
        old="cutlass.Int32(num_tiles_m * num_clusters_n)",
        new="cutlass.Int32(num_tiles_m)",
        tests=[_G, "-k", "test_grouped_schedule_visits_every_tile_in_use_once"],
    ),
    dict(
        id="rz-layout-floor",
        klass="group offsets (tiles per group rounded down)",
        file="blockwise_grouped_gemm_fp4.py",
        old="tiles = [-(-count // tile_m) for count in rows]",
        new="tiles = [count // tile_m for count in rows]",
        tests=[_G, "-k", "test_group_layout_pads_each_group_to_whole_tiles"],
    ),
    dict(
        id="rz-cluster-m-check",
        klass="configuration check (cluster M larger than the CTA pair accepted)",
        file="blockwise_grouped_gemm_fp4.py",
        old="if cluster_shape_mn[0] != pair:",
        new="if cluster_shape_mn[0] < pair:",
        tests=[_G, "-k", "test_check_grouped_config_refusals"],
    ),
    dict(
        id="rz-routing-args-swap",
        klass="launch argument order (tile_group / num_m_tiles)",
        file="blockwise_grouped_gemm_fp4.py",
        old="d, tile_group, num_m_tiles, alpha)",
        new="d, num_m_tiles, tile_group, alpha)",
        tests=[_G, "-k", "test_grouped_gemm_launches_each_operand_under_its_parameter"],
    ),
    dict(
        id="rz-sfa-gets-sfb",
        klass="launch argument (SFA pointer from SFB)",
        file="blockwise_grouped_gemm_fp4.py",
        old="sfa_ptr=ptr(sf_dtype, sfa_blocked)",
        new="sfa_ptr=ptr(sf_dtype, sfb_blocked)",
        tests=[_G, "-k", "test_kernel_args_name_each_operand_for_its_parameter"],
    ),
    dict(
        id="rz-dense-gemm-launch-sf-swapped",
        klass="launch argument order (SFA / SFB)",
        file="blockwise_gemm_fp4.py",
        old="kernel_args(config, mnkl, a, b, sfa_blocked, sfb_blocked, d, alpha, stream))",
        new="kernel_args(config, mnkl, a, b, sfb_blocked, sfa_blocked, d, alpha, stream))",
        tests=[_T, "-k", "test_gemm_launch_arguments_reach_the_kernel_parameters"],
    ),
]
