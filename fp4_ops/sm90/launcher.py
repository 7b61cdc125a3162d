# SPDX-License-Identifier: BSD-3-Clause
"""The torch-facing runner of the Hopper FP4 GEMM (``fp4_ops.sm90.gemm``).

``Fp4GemmSm90Runner`` holds the compiled kernels of one configuration (the TMA-store variant,
and the direct-store one once an N needs it) and a workspace per problem shape and stream
(split-K partials, converted operands) from torch's caching allocator.  Each call checks its
operands (``operand_reasons``), problem and alpha (the kernel file's ``problem_reasons`` and
``alpha_reason``) before it launches; the class docstring gives the CUDA-graph rules.
``blocked_scales`` puts scales into the kernel's 128x4 blocked layout.

    from fp4_ops.sm90.gemm import default_config
    from fp4_ops.sm90.launcher import Fp4GemmSm90Runner, blocked_scales
"""

from __future__ import annotations

import struct

from cutlass.cutlass_dsl import Int32

from fp4_ops.layout import round_up, to_blocked
from fp4_ops.sm90.gemm import (
    H200_SM_COUNT,
    K_BLOCK,
    SF_FORMATS,
    W4A4,
    BlockwiseGemmFp4Sm90,
    alpha_reason,
    blocked_sf_bytes,
    compile_gemm,
    config_reasons,
    default_cluster,
    default_config,
    gmem_pointers,
    output_tiles,
    problem_reasons,
    tma_store_fits,
    torch_dtype,
)


class Fp4GemmSm90Runner:
    """Compiled kernel + workspaces for one configuration; ``__call__`` launches on torch data.
    A configuration ``check_fp4_gemm_config`` refuses raises ValueError at construction, and a
    problem or operands it refuses (``operand_reasons``, ``alpha_reason``) at the call.

    W4A4: ``runner(a, b, sfa_blocked, sfb_blocked, d, m, n, k, l, alpha)`` on packed FP4 A and B.
    W4A16 (``a_dtype`` BFloat16 / Float16): ``runner(a, b, None, sfb_blocked, ...)``, ``a`` the
    activations [L, M, K], ``b`` the weights after ``k_order.prepack_weights``.  ``alpha``: a float
    (checked by ``alpha_reason``; kept on the device per value and stream), or a one-element
    fp32 CUDA tensor that the kernel reads when it runs (a replayed CUDA graph reads the value
    current then; an alpha * ``acc_scale`` that overflows gives inf / NaN in D).

    Every stream gets its own workspace per shape (split-K partials with self-resetting tile
    counters, the converted operands), from torch's caching allocator, zeroed once on that
    stream; a CUDA graph captured on a stream keeps that stream's.  A launch that aborts part
    way leaves counters behind: make a new runner after a CUDA error.  The GEMM grid releases a
    PDL-launched successor once all its loads are issued (``griddepcontrol.launch_dependents``):
    a kernel that follows it with programmatic dependent launch must ``griddepcontrol.wait``
    before it reads D or writes anything this GEMM reads (A, B, scales, alpha, the workspace).
    """

    def __init__(
        self,
        sf_vec_size,
        c_dtype,
        path,
        mma_tiler_mn,
        split_k=1,
        options="",
        cluster_shape_mn=None,
        k_groups=1,
        a_dtype=W4A4,
    ):
        cluster = default_cluster(path) if cluster_shape_mn is None else tuple(cluster_shape_mn)
        sf_dtype = SF_FORMATS.get(sf_vec_size, ("?",))[0]
        config = (path, mma_tiler_mn, cluster, split_k, k_groups, a_dtype)
        reasons = config_reasons(sf_vec_size, sf_dtype, c_dtype, *config)
        if reasons:
            raise ValueError("; ".join(reasons))
        self.c_dtype = c_dtype
        num_sms = gpu_sm_count()
        self._args = (sf_vec_size, c_dtype, path, mma_tiler_mn, split_k, num_sms, options, cluster)
        # compiled here: the TMA-store variant; the direct-store one when an N first needs it
        self.gemm, compiled = compile_gemm(*self._args, True, k_groups, a_dtype)
        self._compiled = {True: compiled}
        self._workspace = {}
        self._alphas = {}

    def executor(self, n: int):
        """The compiled kernel for output width N (see ``tma_store_fits``)."""
        tma_store = tma_store_fits(n, self.c_dtype) and self.gemm.tma_store
        if tma_store not in self._compiled:
            gemm = self.gemm
            self._compiled[tma_store] = compile_gemm(
                *self._args, tma_store, gemm.k_groups, gemm.a_dtype
            )[1]
        return self._compiled[tma_store]

    def workspace(self, m, n, k, l, stream=None):  # noqa: E741
        """(split-K workspace, converted kernel B, converted kernel A) of a problem shape on a
        stream (``__call__``'s), allocated and zeroed on it at its first use (F16 / BF16
        ``converted_shapes``; 8 elements when unused)."""
        import torch

        stream = _torch_stream(stream)
        key = (m, n, k, l, stream.cuda_stream)
        if key not in self._workspace:
            if _capturing(stream):
                # NOTE: memory allocated during capture belongs to the graph's private pool.
                raise RuntimeError(
                    "the first call of a shape on a stream allocates its workspace: make it "
                    "before capturing a CUDA graph"
                )
            # zeros once: the split-K counters reset themselves after every tile, and every
            # launch rewrites the converted copies (the decode tokens' padding rows stay zero)
            elems = workspace_elems(self.gemm, m, n, l)
            shape_a, shape_b = converted_shapes(self.gemm, m, n, k, l)
            with torch.cuda.stream(stream):
                self._workspace[key] = (
                    torch.zeros(elems, dtype=torch.float32, device="cuda"),
                    torch.zeros(shape_b, dtype=torch.float16, device="cuda"),
                    torch.zeros(shape_a, dtype=torch.float16, device="cuda"),
                )
        return self._workspace[key]

    def __call__(self, a, b, sfa_blocked, sfb_blocked, d, m, n, k, l, alpha, stream=None):  # noqa: E741
        """Launch on ``stream`` (a torch stream or a CUstream; default: the current stream)."""
        import cuda.bindings.driver as cuda_driver
        import torch

        gemm, mnkl = self.gemm, (m, n, k, l)
        vec, path, a_dtype = gemm.sf_vec_size, gemm.path, gemm.a_dtype
        operands = (a, b, sfa_blocked, sfb_blocked, d)
        reasons = operand_reasons(*operands, mnkl, vec, self.c_dtype, a_dtype)
        reasons += problem_reasons(mnkl, vec, path, gemm.mma_tiler_mn, a_dtype)
        if a.is_cuda and a.device.index != torch.cuda.current_device():
            # (the workspace, the stream and the launch belong to the current device)
            reasons.append(
                f"the operands are on {a.device}, the current device is cuda:"
                f"{torch.cuda.current_device()}: call under torch.cuda.device({a.device})"
            )
        if isinstance(alpha, torch.Tensor):
            if alpha.dtype != torch.float32 or alpha.numel() != 1 or alpha.device != a.device:
                reasons.append(f"alpha must be one float32 value on {a.device} (or a float)")
        else:
            reason = alpha_reason(float(alpha), vec, path, a_dtype)
            if reason:
                reasons.append(reason)
        if reasons:
            raise ValueError("; ".join(reasons))
        stream = _torch_stream(stream)
        if not isinstance(alpha, torch.Tensor):
            alpha = self._alpha_tensor(float(alpha), stream)
        if sfa_blocked is None:
            # W4A16: no activation scales; the kernel never reads this pointer
            sfa_blocked = sfb_blocked
        tensors = (a, b, sfa_blocked, sfb_blocked, d, *self.workspace(m, n, k, l, stream), alpha)
        ptrs = gmem_pointers(gemm, self.c_dtype, [t.data_ptr() for t in tensors])
        problem = tuple(Int32(v) for v in mnkl)
        cu_stream = cuda_driver.CUstream(stream.cuda_stream)
        self.executor(n)(*ptrs, problem, cu_stream)

    def _alpha_tensor(self, alpha: float, stream):
        """A device copy of a host alpha, written on ``stream`` once per fp32 value (under
        CUDA-graph capture: per call, a fill in the graph).  Kept for the runner's life: a
        captured graph may hold its address."""
        import torch

        key = (struct.pack("<f", alpha), stream.cuda_stream)
        if key in self._alphas:
            return self._alphas[key]
        with torch.cuda.stream(stream):
            value = torch.full((1,), alpha, dtype=torch.float32, device=stream.device)
        if not _capturing(stream):
            self._alphas[key] = value
        return value


def _capturing(stream) -> bool:
    """Whether the torch stream ``stream`` is capturing a CUDA graph."""
    import torch

    with torch.cuda.stream(stream):
        return torch.cuda.is_current_stream_capturing()


def _torch_stream(stream):
    """A torch stream for None (the current stream), a torch stream or a CUstream."""
    import torch

    if stream is None:
        return torch.cuda.current_stream()
    if isinstance(stream, torch.cuda.Stream):
        return stream
    return torch.cuda.ExternalStream(int(stream))


def operand_reasons(
    a, b, sfa_blocked, sfb_blocked, d, mnkl, sf_vec_size, c_dtype, a_dtype=W4A4
) -> list[str]:
    """Why these torch tensors cannot be the kernel's operands (empty when they can): sizes
    (packed FP4 and scales in bytes, whatever their dtype), the dtypes of D and of W4A16
    activations, 16-byte aligned bases (TMA loads and stores), contiguity, one CUDA device."""
    m, n, k, l = mnkl  # noqa: E741
    tensors = {"a": a, "b": b, "sfa_blocked": sfa_blocked, "sfb_blocked": sfb_blocked, "d": d}
    want = {
        "a": l * m * (k // 2),
        "b": l * n * (k // 2),
        "sfa_blocked": blocked_sf_bytes(m, k, l, sf_vec_size),
        "sfb_blocked": blocked_sf_bytes(n, k, l, sf_vec_size),
        "d": l * m * n,
    }
    # (tensors counted in elements of a given dtype, and the argument that names it)
    typed = {"d": (c_dtype, "this kernel writes", "c_dtype")}
    reasons = []
    if a_dtype != W4A4:
        want["a"], want["b"] = l * m * k, l * n * round_up(k, K_BLOCK) // 2
        typed["a"] = (a_dtype, "W4A16 here takes", "a_dtype")
        if sfa_blocked is not None:
            reasons.append("sfa_blocked must be None: W4A16 activations have no scales")
        del tensors["sfa_blocked"]
    for name, t in tensors.items():
        if name in typed:
            dtype_name, verb, arg = typed[name]
            if t.dtype != torch_dtype(dtype_name):
                reasons.append(f"{name} is {t.dtype}; {verb} {dtype_name} ({arg})")
            unit, have = "elements", t.numel()
        else:
            unit, have = "bytes", t.numel() * t.element_size()
        if have != want[name]:
            what = "prepack_weights' output for " if name == "b" and a_dtype != W4A4 else ""
            reasons.append(f"{name} has {have} {unit}; {what}(M, N, K, L) needs {want[name]}")
        # NOTE: TMA needs 16-byte aligned global base addresses.
        if t.data_ptr() % 16:
            reasons.append(f"{name} must start on a 16-byte boundary (TMA); copy it first")
        if not t.is_cuda or not t.is_contiguous():
            reasons.append(f"{name} must be a contiguous CUDA tensor")
        elif t.device != a.device:
            reasons.append(f"{name} is on {t.device}, a is on {a.device}")
    return reasons


def workspace_elems(gemm: BlockwiseGemmFp4Sm90, m, n, l):  # noqa: E741
    """fp32 elements of the split-K workspace (partials + one counter per output tile)."""
    rows, cols = (n, m) if gemm.swap_ab else (m, n)
    tr, tc = gemm.tile_rows, gemm.tile_cols
    tiles = output_tiles(rows, cols, l, tr, tc, gemm.cluster_m)[2]
    return tiles * gemm.split_k * tr * tc + tiles if gemm.split_k > 1 else 1


def converted_shapes(gemm: BlockwiseGemmFp4Sm90, m, n, k, l):  # noqa: E741
    """Shapes of the F16 / BF16 copies of kernel A and kernel B that ``convert_operands`` writes
    for a problem: (L, rows, K rounded up to 64), rows rounded up to whole tiles for the tokens
    of the decode path; (8,) for kernel A on decode, which is not converted."""
    rows_a, rows_b = (n, m) if gemm.swap_ab else (m, n)
    k_pad = round_up(k, K_BLOCK)
    shape_a = (l, rows_a, k_pad) if gemm.convert_a else (8,)
    shape_b = (l, gemm.converted_rows_b(rows_b), k_pad) if gemm.convert_b else (8,)
    return shape_a, shape_b


def blocked_scales(scales):
    """[R, K/V] or [L, R, K/V] unswizzled scales -> contiguous uint8 [bytes] or [L, bytes] in
    the 128x4 layout."""
    import torch

    return to_blocked(scales).view(torch.uint8).contiguous()


def gpu_sm_count() -> int:
    """SMs of the current GPU (``default_config``'s CTA slots), or an H200's without one."""
    try:
        import torch
    except ImportError:
        return H200_SM_COUNT
    if not torch.cuda.is_available():
        return H200_SM_COUNT
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


_RUNNERS: dict = {}
_C_DTYPE_NAMES = {"bfloat16": "BFloat16", "float16": "Float16", "float32": "Float32"}


def gemm_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype, a_dtype=W4A4):
    """``fp4_ops``' entry: ``default_config``'s path, tile, split and K groups for the shape;
    one runner per configuration and device.  W4A4: packed uint8 a [L, M, K/2] and b
    [L, N, K/2], blocked scales [L, n]; W4A16: ``a`` the 16-bit activations [L, M, K], ``b``
    prepacked weights, ``sfa`` None.  Returns D [L, M, N] in ``out_dtype``."""
    import torch

    l, m = a.shape[0], a.shape[1]  # noqa: E741
    k = 2 * a.shape[2] if a_dtype == W4A4 else a.shape[2]
    n, device = b.shape[1], a.device
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    path, tiler, split, k_groups = default_config(m, n, k, l, num_sms, a_dtype=a_dtype)
    c_dtype = _C_DTYPE_NAMES[str(out_dtype).removeprefix("torch.")]
    key = (sf_vec_size, c_dtype, a_dtype, path, tuple(tiler), split, k_groups, device.index)
    if key not in _RUNNERS:
        with torch.cuda.device(device):
            _RUNNERS[key] = Fp4GemmSm90Runner(
                sf_vec_size, c_dtype, path, tiler, split, k_groups=k_groups, a_dtype=a_dtype
            )
    d = torch.empty((l, m, n), dtype=out_dtype, device=device)
    sfa = None if sfa is None else sfa.contiguous()
    with torch.cuda.device(device):
        _RUNNERS[key](a, b, sfa, sfb.contiguous(), d, m, n, k, l, alpha.reshape(1))
    return d
