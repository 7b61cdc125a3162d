# SPDX-License-Identifier: BSD-3-Clause
"""The torch entry point of the Hopper FP4 GEMM (``fp4_ops.sm90.gemm``).

    from fp4_ops.sm90.launcher import GemmConfig, blocked_scales, gemm
    gemm(a, b, sfa, sfb, alpha, out)                    # D = alpha * A @ B^T into out
    gemm(x, prepack_weights(w), None, sfb, alpha, out)  # W4A16

``gemm(a, b, sfa, sfb, alpha, out, config=None, *, sf_vec_size=None, scale=None)``: one launch
on the current stream; M, N, K, L come from the tensors, all on the current device.  W4A4: a
[L, M, K/2] and b [L, N, K/2] packed FP4 (uint8 or float4_e2m1fn_x2), sfa / sfb [L, n] one-byte
scales in the 128x4 blocked layout (``blocked_scales``).  W4A16: a bfloat16 / float16 [L, M, K],
b from ``k_order.prepack_weights``, sfa None.  alpha (and ``scale``, None for 1): one-element
float32 tensors on a's device that the kernel reads when it runs and multiplies (one fp32
product: two global scales need no kernel that multiplies them first).  out: D [L, M, N],
contiguous bfloat16 / float16 / float32.
The format: float8_e4m3fn scales are NVFP4 (V 16), float8_e8m0fnu MXFP4 (V 32); uint8 scales
say nothing, so ``config.sf_vec_size`` or ``sf_vec_size`` names it (whatever names it must
agree).  Returns out.

``GemmConfig`` is what one compiled kernel is; with the device index, the key of the kernel
cache.  ``config`` None takes ``GemmConfig.for_problem`` (``default_config``'s rules) for the
formats of the tensors.  ``GemmConfig.reasons(mnkl)`` runs once per (configuration, problem
shape); the operands are checked at every call (``operand_reasons``), and a refusal is a
ValueError that lists every reason.

Workspaces and CUDA graphs: each (configuration, problem shape, device, stream) gets its own
workspace (split-K partials with self-resetting tile counters, the F16 / BF16 copies of the
operands) from torch's caching allocator, zeroed on that stream at the first call, kept for the
process's life (a captured graph holds its addresses).  So the first call of a shape on a
stream, which also compiles a new configuration, must come before a CUDA-graph capture on that
stream: under capture it raises RuntimeError.  A replayed graph reads alpha's value current
then; an alpha * ``acc_scale`` that overflows fp32 gives inf / NaN in D (``alpha_reason``).

Eager callers that hold some operands fixed (a layer's weights) take ``launch_for_ops``'
checked ``Launch`` and bind those operands once (``Launch.bind``): a ``BoundGemm`` call takes
only A's and D's addresses and the stream, with no checks.

PDL: the GEMM grid releases a PDL-launched successor once all its loads are issued
(``griddepcontrol.launch_dependents``): a kernel that follows it with programmatic dependent
launch must ``griddepcontrol.wait`` before it reads D or writes anything this GEMM reads (A, B,
scales, alpha, the workspace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from fp4_ops.layout import (
    DSL_DTYPE_NAMES,
    PACKED_DTYPES,
    SCALE_DTYPES,
    blocked_scale_numel,
    round_up,
    to_blocked,
)
from fp4_ops.memory import persistent, stream_handle, unit_scale
from fp4_ops.sm90.gemm import (
    C_DTYPES,
    H200_SM_COUNT,
    K_BLOCK,
    SF_FORMATS,
    W4A4,
    BlockwiseGemmFp4Sm90,
    compile_kernel,
    config_reasons,
    default_cluster,
    default_config,
    epilogue_staging_fits,
    grouped_reason,
    grouped_tiles,
    occupancy,
    output_tiles,
    problem_reasons,
    split_cluster_fits,
    tma_store_fits,
    tokens_converted_reason,
)
from fp4_ops.tensor import device_scalars

# scale dtype -> sf_vec_size, for the dtypes that name their format
_SCALE_VECS = {dtype: vec for vec, dtype in SCALE_DTYPES.items()}
# DSL type name -> torch dtype (D, and the W4A16 activations)
_TORCH_DTYPES = {name: dtype for dtype, name in DSL_DTYPE_NAMES.items()}


@dataclass(frozen=True)
class GemmConfig:
    """What one compiled kernel is: with the device index, the key of the kernel cache.

    ``cluster_shape_mn`` None is ``default_cluster(path)``.  ``tma_store`` False compiles the
    direct-store epilogue, which D needs unless its rows (N elements) are a multiple of 16 bytes
    (``tma_store_fits``); it reads False where the consumers cannot stage D
    (``epilogue_staging_fits``), as the kernel then compiles direct stores anyway.
    """

    sf_vec_size: int = 16
    c_dtype: str = "BFloat16"
    a_dtype: str = W4A4
    path: str = "prefill"
    mma_tiler_mn: tuple[int, int] = (128, 256)
    split_k: int = 1
    k_groups: int = 1
    cluster_shape_mn: tuple[int, int] | None = None
    tma_store: bool = True
    grouped: bool = False
    tokens_converted: bool = False

    def __post_init__(self):
        # (one spelling per kernel: two keys for one kernel would compile it twice)
        tiler = tuple(self.mma_tiler_mn)
        cluster = self.cluster_shape_mn
        cluster = default_cluster(self.path) if cluster is None else tuple(cluster)
        tma_store = bool(self.tma_store) and epilogue_staging_fits(self.path, tiler, self.split_k)
        tma_store = tma_store and not self.grouped
        object.__setattr__(self, "mma_tiler_mn", tiler)
        object.__setattr__(self, "cluster_shape_mn", cluster)
        object.__setattr__(self, "tma_store", tma_store)

    @classmethod
    def for_problem(
        cls,
        mnkl: tuple[int, int, int, int],
        sf_vec_size: int = 16,
        c_dtype: str = "BFloat16",
        a_dtype: str = W4A4,
        num_sms: int | None = None,
        *,
        path: str | None = None,
        mma_tiler_mn: tuple[int, int] | None = None,
        split_k: int | None = None,
        k_groups: int | None = None,
        cluster_shape_mn: tuple[int, int] | None = None,
    ) -> GemmConfig:
        """``default_config``'s path, tile, split and K groups for ``mnkl`` on ``num_sms`` SMs
        (None: the current GPU's), and its decode splits on 2x1 clusters where
        ``split_cluster_fits``; a keyword given replaces its pick, as the command line's
        options do (a tile or a split given: the pick without K groups, and without clusters
        on decode; a tile, a split or a cluster given: the pick without ``split_pairs``).  TMA
        stores where N allows them."""
        num_sms = gpu_sm_count() if num_sms is None else num_sms
        # (extents < 1 still get a configuration: reasons() then refuses the problem)
        m, n, k, l = (max(1, v) for v in mnkl)  # noqa: E741
        allow_k_groups = mma_tiler_mn is None and split_k is None
        pairs = allow_k_groups and cluster_shape_mn is None
        path, tiler, split, groups = default_config(
            m, n, k, l, num_sms, path, allow_k_groups, a_dtype, split_pairs=pairs
        )
        groups = groups if k_groups is None else k_groups
        if pairs and path == "decode":
            if split_cluster_fits((m, n, k, l), tiler, split, groups, num_sms):
                cluster_shape_mn = (2, 1)
        return cls(
            sf_vec_size,
            c_dtype,
            a_dtype,
            path,
            tiler if mma_tiler_mn is None else mma_tiler_mn,
            split if split_k is None else split_k,
            groups,
            cluster_shape_mn,
            c_dtype not in C_DTYPES or tma_store_fits(mnkl[1], c_dtype),
        )

    @classmethod
    def for_groups(
        cls,
        rows: int,
        n: int,
        k: int,
        experts: int,
        sf_vec_size: int = 16,
        c_dtype: str = "BFloat16",
        a_dtype: str = "BFloat16",
        num_sms: int | None = None,
    ) -> GemmConfig:
        """The grouped W4A16 kernel for ``rows`` token rows over ``experts`` groups: the decode
        path's token tile, K split and K groups that ``default_config`` picks for the experts
        those rows can touch (at most min(rows, experts) of them) holding twice their even
        share of the rows each (headroom for uneven routing; the kernel runs as many token tiles
        as a group needs).  The split only where every unit that any routing of the rows can
        make (``grouped_tiles``) fits one wave of CTAs: its partials' workspace holds them all,
        and a split deals more units than a wave where the routing is uneven."""
        num_sms = gpu_sm_count() if num_sms is None else num_sms
        rows, n, k = (max(1, v) for v in (rows, n, k))
        touched = max(1, min(rows, experts))
        per_group = min(rows, 2 * math.ceil(rows / touched))
        _, tiler, split, k_groups = default_config(
            per_group, n, k, touched, num_sms, "decode", True, a_dtype, grouped=True
        )
        units = grouped_tiles(rows, experts, tiler[0]) * math.ceil(n / tiler[1]) * split
        if units > num_sms * occupancy("decode", tiler, k_groups):
            split = 1
        return cls(sf_vec_size, c_dtype, a_dtype, "decode", tiler, split, k_groups, grouped=True)

    @property
    def sf_dtype(self) -> str:
        return SF_FORMATS.get(self.sf_vec_size, ("?",))[0]

    def kernel(self) -> BlockwiseGemmFp4Sm90:
        """A new kernel object of this configuration (what ``compile_kernel`` compiles)."""
        return BlockwiseGemmFp4Sm90(
            self.sf_vec_size,
            self.path,
            self.mma_tiler_mn,
            self.cluster_shape_mn,
            self.split_k,
            self.tma_store,
            self.k_groups,
            self.a_dtype,
            self.grouped,
            self.tokens_converted,
        )

    def reasons(self, mnkl: tuple[int, int, int, int]) -> list[str]:
        """Why this configuration cannot run the problem ``mnkl`` (empty when it can): the kernel
        file's ``config_reasons`` and ``problem_reasons``, and D's row pitch for TMA stores."""
        vec, tiler, a_dtype = self.sf_vec_size, self.mma_tiler_mn, self.a_dtype
        config = (self.path, tiler, self.cluster_shape_mn, self.split_k, self.k_groups)
        reasons = config_reasons(vec, self.sf_dtype, self.c_dtype, *config, a_dtype)
        reason = grouped_reason(self.grouped, self.path, self.cluster_shape_mn, a_dtype)
        reason = reason or tokens_converted_reason(self.tokens_converted, self.path, a_dtype)
        reasons += [reason] if reason else []
        reasons += problem_reasons(mnkl, vec, self.path, tiler, a_dtype, self.grouped)
        if not reasons and self.tma_store and not tma_store_fits(mnkl[1], self.c_dtype):
            reasons.append(
                f"tma_store: D rows of N={mnkl[1]} {self.c_dtype} values are not a multiple of "
                "16 bytes (TMA strides); use tma_store=False"
            )
        return reasons


# (GemmConfig, device index) -> (kernel object, compiled kernel)
_KERNELS: dict[tuple[GemmConfig, int], tuple] = {}
# (GemmConfig, (M, N, K, L)) whose reasons() came back empty
_CHECKED: set[tuple] = set()
# ((M, N, K, L), sf_vec_size, c_dtype, a_dtype, device) -> GemmConfig.for_problem's pick
_PICKED: dict[tuple, GemmConfig] = {}
# (GemmConfig, (M, N, K, L), device index, stream handle) -> (split-K workspace, converted B,
# converted A); ("weights", GemmConfig, (N, K, L), device index, stream handle) -> the prefill
# weights' copy that every M shares
_WORKSPACES: dict[tuple, tuple | torch.Tensor] = {}
# entries past which _WORKSPACES starts over (a shape of each token count would grow it forever)
_MAX_WORKSPACES = 64
# gemm_for_ops: the operands' shapes and dtypes, sf_vec_size, D's dtype, device index, stream
# handle -> the Launch that passed every check for them
_LAUNCHES: dict[tuple, Launch] = {}
# entries past which _LAUNCHES starts over (each holds its workspace)
_MAX_LAUNCHES = 256


def cache_size() -> int:
    """How many kernels this process has compiled for ``gemm``."""
    return len(_KERNELS)


def gemm(
    a, b, sfa, sfb, alpha, out, config: GemmConfig | None = None, *, sf_vec_size=None, scale=None
):
    """D = alpha * scale * (A x SFA)(B x SFB)^T into ``out`` on the current stream (the module
    docstring gives the operands and the CUDA-graph rule).  Returns ``out``."""
    launch = _prepare(a, b, sfa, sfb, alpha, out, config, sf_vec_size, scale=scale)
    launch(a, b, sfa, sfb, out, alpha, torch.cuda.current_stream().cuda_stream, scale=scale)
    return out


@dataclass(frozen=True)
class Launch:
    """One checked problem on one stream: the compiled kernel's TVM-FFI function, (M, N, K, L),
    the workspace, the device's 1.0 (alpha's scale when none is given) and the configuration,
    ready to take the operands' addresses."""

    fn: object
    mnkl: tuple[int, int, int, int]
    workspace: tuple[torch.Tensor, ...]
    device_index: int
    unit: torch.Tensor
    config: GemmConfig

    def __call__(
        self, a, b, sfa, sfb, out, alpha, stream_handle: int, offsets=None, scale=None
    ) -> None:
        # (W4A16 has no activation scales, a dense kernel no group offsets: stand-ins, never
        # read)
        sfa = sfb if sfa is None else sfa
        offsets = alpha if offsets is None else offsets
        scale = self.unit if scale is None else scale
        tensors = (a, b, sfa, sfb, out, *self.workspace, alpha, offsets, scale)
        self.fn(*[t.data_ptr() for t in tensors], self.mnkl, stream_handle)

    def bind(self, b, sfa, sfb, alpha, scale=None) -> BoundGemm:
        """This launch with B, the scales, alpha and its scale bound to their addresses (the
        tensors are held, so the addresses stay theirs): a call passes A's and D's. The caller
        has checked them (``fits``) and holds them fixed."""
        sfa = sfb if sfa is None else sfa
        scale = self.unit if scale is None else scale
        tensors = (b, sfa, sfb, *self.workspace, alpha, alpha, scale)
        ptrs = [t.data_ptr() for t in tensors]
        tail = (*ptrs[3:], self.mnkl)
        return BoundGemm(self.fn, tuple(ptrs[:3]), tail, tensors, self.config, self.device_index)

    def fits(self, a, b, sfa, sfb, alpha, out, scale=None) -> bool:
        """Whether operands of the shapes and dtypes it was checked for still pass what can
        change between calls: contiguity, 16-byte bases, the device (also the current one),
        alpha and its scale."""
        index = self.device_index
        for t in (a, b, sfa, sfb, out):
            if t is not None and (
                not t.is_contiguous() or t.data_ptr() % 16 or t.get_device() != index
            ):
                return False
        return (
            device_scalars(alpha, index, self.mnkl[3] if self.config.grouped else 1)
            and (scale is None or device_scalars(scale, index))
            and torch.cuda.current_device() == index
        )


@dataclass(frozen=True)
class BoundGemm:
    """A checked dense launch whose operands other than A and D stay put (a layer's weights,
    its activations' scratch): ``bound(a, out, stream)`` takes their addresses, no checks."""

    fn: object
    head: tuple[int, ...]  # B, SFA, SFB
    tail: tuple  # the workspace, alpha, group offsets (a stand-in), alpha's scale; (M, N, K, L)
    held: tuple[torch.Tensor, ...]
    config: GemmConfig
    device_index: int

    def __call__(self, a: int, out: int, stream_handle: int) -> None:
        self.fn(a, *self.head, out, *self.tail, stream_handle)


def _prepare(a, b, sfa, sfb, alpha, out, config, sf_vec_size, stream=None, scale=None) -> Launch:
    """Every check of ``gemm``'s arguments (configuration checks once per configuration and
    problem), the compiled kernel and the workspace: a ``Launch`` for them on ``stream``
    (None: the current one). ``config`` None takes ``_pick``'s for the operands."""
    if config is None:
        a_dtype = _a_dtype(a)
        vec = _sf_vec_size(sfa, sfb, sf_vec_size)
        c_dtype = DSL_DTYPE_NAMES.get(out.dtype)
        if c_dtype is None:
            raise ValueError(f"out must be bfloat16, float16 or float32, got {out.dtype}")
        config = _pick(_problem(a, b, a_dtype == W4A4), vec, c_dtype, a_dtype, a.device)
    elif sf_vec_size is not None and sf_vec_size != config.sf_vec_size:
        raise ValueError(
            f"sf_vec_size={sf_vec_size}, but config.sf_vec_size is {config.sf_vec_size}"
        )
    # (tokens_converted: a holds the activations themselves, not packed FP4)
    mnkl = _problem(a, b, config.a_dtype == W4A4 and not config.tokens_converted)
    reasons = operand_reasons(a, b, sfa, sfb, alpha, out, mnkl, config)
    if scale is not None and not device_scalars(scale, a.get_device()):
        reasons.append(f"scale must be None or a one-element float32 tensor on {a.device}")
    if (config, mnkl) not in _CHECKED:
        refused = config.reasons(mnkl)
        if not refused:
            _CHECKED.add((config, mnkl))
        reasons += refused
    if reasons:
        raise ValueError("; ".join(reasons))
    stream = torch.cuda.current_stream() if stream is None else stream
    workspace = _workspace(config, mnkl, stream)
    index = a.get_device()
    fn = _compiled(config, a.device.index)[1]
    return Launch(fn, mnkl, workspace, index, unit_scale(a.device), config)


def _pick(mnkl, vec: int, c_dtype: str, a_dtype: str, device) -> GemmConfig:
    """``GemmConfig.for_problem``'s pick, searched once per problem and device."""
    key = (mnkl, vec, c_dtype, a_dtype, device)
    if key not in _PICKED:
        num_sms = gpu_sm_count(device) if device.type == "cuda" else None
        _PICKED[key] = GemmConfig.for_problem(mnkl, vec, c_dtype, a_dtype, num_sms)
    return _PICKED[key]


def _a_dtype(a) -> str:
    """The kernel's ``a_dtype`` for activations ``a``: packed FP4 (W4A4) or 16-bit (W4A16)."""
    if a.dtype in PACKED_DTYPES:
        return W4A4
    if a.dtype in (torch.bfloat16, torch.float16):
        return DSL_DTYPE_NAMES[a.dtype]
    raise ValueError(
        "a must be packed FP4 (uint8 or float4_e2m1fn_x2: W4A4) or bfloat16 / float16 "
        f"activations (W4A16), got {a.dtype}"
    )


def _sf_vec_size(sfa, sfb, sf_vec_size) -> int:
    """The format that the scales' dtypes and ``sf_vec_size`` name together."""
    named = {_SCALE_VECS[t.dtype] for t in (sfa, sfb) if t is not None and t.dtype in _SCALE_VECS}
    if sf_vec_size is not None:
        named.add(sf_vec_size)
    if not named:
        raise ValueError(
            "uint8 scales do not say their format: pass sf_vec_size (16 NVFP4, 32 MXFP4), a "
            "config, or float8_e4m3fn / float8_e8m0fnu scales"
        )
    if len(named) > 1:
        raise ValueError(
            f"the scales' dtypes and sf_vec_size name different formats (V {sorted(named)})"
        )
    return named.pop()


def _problem(a, b, packed: bool) -> tuple[int, int, int, int]:
    """(M, N, K, L) from a [L, M, K/2 (``packed``) or K] and b [L, N, ...]."""
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [L, rows, K], got shape {tuple(t.shape)}")
    l, m, cols = a.shape  # noqa: E741
    return m, b.shape[1], 2 * cols if packed else cols, l


_TOKEN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def operand_reasons(a, b, sfa, sfb, alpha, out, mnkl, config: GemmConfig) -> list[str]:
    """Why these tensors cannot be ``gemm``'s operands for ``config`` and the problem ``mnkl``
    (empty when they can): shapes, one-byte packed FP4 and scales of the config's format, the
    dtypes of out and of W4A16 activations, alpha, 16-byte aligned bases (TMA), contiguity, one
    CUDA device, the current one."""
    m, n, k, l = mnkl  # noqa: E741
    vec, w4a16 = config.sf_vec_size, config.a_dtype != W4A4
    tensors = {"a": a, "b": b, "sfa": sfa, "sfb": sfb, "out": out}
    want = {"a": (l, m, k // 2), "b": (l, n, k // 2), "out": (l, m, n)}
    if config.tokens_converted:
        # (a: the activations that the grid ahead quantizes into the tokens' copy)
        want["a"] = (l, m, k)
        if a.dtype not in _TOKEN_DTYPES:
            return [f"a is {a.dtype}: the tokens' grid quantizes bfloat16, float16 or float32"]
    if vec in SF_FORMATS:
        want["sfa"] = (l, blocked_scale_numel(m, k, vec))
        want["sfb"] = (l, blocked_scale_numel(n, k, vec))
    # (tensors of a given dtype, and the configuration field that names it)
    typed = {"out": (config.c_dtype, "c_dtype")}
    reasons = []
    if w4a16:
        want["a"], want["b"] = (l, m, k), (l, n, round_up(k, K_BLOCK) // 2)
        if config.grouped:
            # (the token rows of all groups, and D, are one matrix each)
            want["a"], want["out"] = (m, k), (m, n)
        typed["a"] = (config.a_dtype, "a_dtype")
        if sfa is not None:
            reasons.append("sfa must be None: W4A16 activations have no scales")
    elif sfa is None and not config.tokens_converted:
        reasons.append("sfa is None: W4A4 needs the activations' scales")
    if sfa is None or w4a16:
        del tensors["sfa"]
    for name, t in tensors.items():
        if name == "a" and config.tokens_converted:
            pass  # (its dtype checked above)
        elif name in typed:
            dtype_name, field = typed[name]
            if t.dtype != _TORCH_DTYPES.get(dtype_name):
                reasons.append(f"{name} is {t.dtype}; config.{field} is {dtype_name}")
        elif name.startswith("sf"):
            if t.dtype != torch.uint8 and _SCALE_VECS.get(t.dtype) != vec:
                reasons.append(f"{name} is {t.dtype}: sf_vec_size {vec} takes uint8 or its dtype")
        elif t.dtype not in PACKED_DTYPES:
            reasons.append(f"{name} is {t.dtype}: packed FP4 is uint8 or float4_e2m1fn_x2")
        if name in want and tuple(t.shape) != want[name]:
            what = "prepack_weights' output for " if name == "b" and w4a16 else ""
            reasons.append(
                f"{name} has shape {tuple(t.shape)}; {what}(M, N, K, L) = {tuple(mnkl)} needs "
                f"{want[name]}"
            )
        # NOTE: TMA needs 16-byte aligned global base addresses.
        if t.data_ptr() % 16:
            reasons.append(f"{name} must start on a 16-byte boundary (TMA); copy it first")
        if not t.is_cuda or not t.is_contiguous():
            reasons.append(f"{name} must be a contiguous CUDA tensor")
        elif t.device != a.device:
            reasons.append(f"{name} is on {t.device}, a is on {a.device}")
    alphas = l if config.grouped else 1
    if (
        not isinstance(alpha, torch.Tensor)
        or alpha.dtype != torch.float32
        or alpha.numel() != alphas
        or not alpha.is_contiguous()
        or alpha.device != a.device
    ):
        what = f"a contiguous float32 tensor of {l} (one per group)" if alphas > 1 else None
        reasons.append(f"alpha must be {what or 'a one-element float32 tensor'} on {a.device}")
    if a.is_cuda and a.device.index != torch.cuda.current_device():
        # (the workspace, the stream and the launch belong to the current device)
        reasons.append(
            f"the operands are on {a.device}, the current device is cuda:"
            f"{torch.cuda.current_device()}: call under torch.cuda.device({a.device})"
        )
    return reasons


def _compiled(config: GemmConfig, device_index: int):
    """(kernel object, its TVM-FFI launch function) of ``config`` on a device, compiled once per
    process.  The launch takes the eleven tensors' addresses as ints (A, B, SFA, SFB, D, split-K
    workspace, converted B, converted A, alpha, group offsets, alpha's scale), (M, N, K, L) and
    the raw stream."""
    key = (config, device_index)
    if key not in _KERNELS:
        kernel = config.kernel()
        # (--enable-tvm-ffi changes the host entry only: the same cubin, no per-call marshalling)
        sms = gpu_sm_count(device_index)
        compiled = compile_kernel(kernel, config.c_dtype, sms, "--enable-tvm-ffi")
        _KERNELS[key] = (kernel, compiled.__tvm_ffi_object__(), compiled)
    return _KERNELS[key][:2]


def _workspace(config: GemmConfig, mnkl, stream):
    """(split-K workspace, converted kernel B, converted kernel A) of a problem on ``stream``
    (current), allocated and zeroed at its first use there, outside every graph pool. The
    prefill weights' copy does not depend on M: problems that differ in M share it."""
    key = (config, mnkl, stream.device.index, stream.cuda_stream)
    if key not in _WORKSPACES:
        if torch.cuda.is_current_stream_capturing():
            # NOTE: memory allocated during capture belongs to the graph's private pool.
            raise RuntimeError(
                "the first call of a shape on a stream compiles and allocates its workspace: "
                "make it before capturing a CUDA graph on that stream"
            )
        kernel = _compiled(config, stream.device.index)[0]
        m, n, k, l = mnkl  # noqa: E741
        # zeros once: the split-K counters reset themselves after every tile, and every
        # launch rewrites the converted copies (the decode tokens' padding rows stay zero)
        shape_a, shape_b = converted_shapes(kernel, m, n, k, l)
        weights = None
        if not kernel.swap_ab and kernel.convert_b:
            weights_key = ("weights", config, (n, k, l), *key[2:])
            weights = _WORKSPACES.get(weights_key)
        if len(_WORKSPACES) >= _MAX_WORKSPACES:
            # (what launches and plans still hold stays alive; the rest goes back to torch)
            _WORKSPACES.clear()
        device = stream.device
        parts = persistent(
            lambda: _used_on(
                stream,
                torch.zeros(workspace_elems(kernel, m, n, l), dtype=torch.float32, device=device),
                torch.zeros(shape_b, dtype=torch.float16, device=device)
                if weights is None
                else weights,
                torch.zeros(shape_a, dtype=torch.float16, device=device),
            ),
            device,
        )
        if not kernel.swap_ab and kernel.convert_b:
            _WORKSPACES[weights_key] = parts[1]
        _WORKSPACES[key] = parts
    return _WORKSPACES[key]


def _used_on(stream, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors``, marked as used on ``stream``: made on another stream, each is freed only
    once the kernels queued on ``stream`` by then have finished."""
    if stream.device.type == "cuda":
        for t in tensors:
            t.record_stream(stream)
    return tensors


def workspace_elems(gemm: BlockwiseGemmFp4Sm90, m, n, l):  # noqa: E741
    """fp32 elements of the split-K workspace (partials + one counter per output tile; grouped:
    per row tile and any routing's token tile, ``grouped_tiles``)."""
    rows, cols = (n, m) if gemm.swap_ab else (m, n)
    tr, tc = gemm.tile_rows, gemm.tile_cols
    if gemm.grouped:
        tiles = output_tiles(rows, 1, 1, tr, tc, 1)[0] * grouped_tiles(m, l, tc)
    else:
        tiles = output_tiles(rows, cols, l, tr, tc, gemm.cluster_m)[2]
    # (split pairs on clusters sum through DSMEM)
    global_fixup = gemm.split_k > 1 and not gemm.split_cluster
    return tiles * gemm.split_k * tr * tc + tiles if global_fixup else 1


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
    return to_blocked(scales).view(torch.uint8).contiguous()


def gpu_sm_count(device=None) -> int:
    """SMs of ``device`` (default: the current GPU; ``default_config``'s CTA slots), or an
    H200's without a GPU."""
    if not torch.cuda.is_available():
        return H200_SM_COUNT
    if device is None:
        device = torch.cuda.current_device()
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemm_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype, a_dtype=W4A4, scale=None):
    """``fp4_ops``' entry: ``gemm`` with ``default_config``'s configuration on a's device, into
    a new D in ``out_dtype``.  W4A4: packed a [L, M, K/2] and b [L, N, K/2] (or [M, K/2] and
    [N, K/2]: L = 1, D [M, N]), their blocked scales contiguous in any shape; W4A16: ``a`` the
    16-bit activations [L, M, K] (or [M, K]), ``b`` prepacked weights, ``sfa`` None.  ``alpha``
    and ``scale`` (None: 1): one-element float32 tensors on a's device, multiplied.

    The first call of a problem on a stream checks everything (``gemm``'s path) and keeps its
    ``Launch``; a later call with operands of the same shapes and dtypes launches it after
    the checks that can change between calls (``Launch.fits``)."""
    index = a.get_device()
    stream = stream_handle(index)
    sfa_key = None if sfa is None else (sfa.shape, sfa.dtype)
    key = (a.shape, a.dtype, b.shape, b.dtype, sfa_key, sfb.shape, sfb.dtype, sf_vec_size)
    key += (out_dtype, index, stream)
    out = torch.empty((*a.shape[:-1], b.shape[-2]), dtype=out_dtype, device=a.device)
    launch = _LAUNCHES.get(key)
    if launch is not None and launch.fits(a, b, sfa, sfb, alpha, out, scale):
        launch(a, b, sfa, sfb, out, alpha, stream, scale=scale)
        return out
    _keep_launch(key, _first_launch(a, b, sfa, sfb, sf_vec_size, alpha, out, a_dtype, scale))
    return out


def launch_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype, a_dtype=W4A4, scale=None):
    """``gemm_for_ops``' ``Launch`` for these operands and a D of ``out_dtype`` on the current
    stream, through every check, not launched: for a caller that keeps it and checks at each
    call what can change (``Launch.fits``), or binds the operands it holds fixed
    (``Launch.bind``)."""
    out = torch.empty((*a.shape[:-1], b.shape[-2]), dtype=out_dtype, device=a.device)
    return _checked(a, b, sfa, sfb, sf_vec_size, alpha, out, a_dtype, scale)[0]


def launch_for_tokens(x, b, sfb, sf_vec_size, alpha, out_dtype, scale=None):
    """W4A4 decode with the activations x [M, K] quantized by the grid ahead into this launch's
    converted copy (``fp4_ops.quantizer.bind_tokens``) rather than by a prologue grid:
    (the checked ``Launch``, ``tokens_converted``, against b [N, K/2] on the current stream;
    the copy it reads, [1, rows, K_pad]; a new D [M, N] in ``out_dtype``), or None off the
    decode path. The launch takes any A (the copy, say: not read) and SFA None. Whoever
    launches it launches the tokens grid right before it, on the same stream."""
    if b.dim() != 2 or x.dim() != 2:
        raise ValueError(f"x and b must be 2-D, got {tuple(x.shape)}, {tuple(b.shape)}")
    c_dtype = DSL_DTYPE_NAMES.get(out_dtype)
    if c_dtype is None:
        raise ValueError(f"out must be bfloat16, float16 or float32, got {out_dtype}")
    (m, k), n = x.shape, b.shape[0]
    config = _pick((m, n, k, 1), sf_vec_size, c_dtype, W4A4, x.device)
    if config.path != "decode":
        return None
    config = replace(config, tokens_converted=True)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    sfb = sfb.contiguous().view(torch.uint8).reshape(1, -1)
    x3, b3, out3 = x.unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0)
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream()
        launch = _prepare(x3, b3, None, sfb, alpha, out3, config, sf_vec_size, stream, scale)
    return launch, launch.workspace[1], out


def _first_launch(a, b, sfa, sfb, sf_vec_size, alpha, out, a_dtype, scale=None) -> Launch:
    """``gemm_for_ops``' operands through every check of ``gemm``, launched: their Launch."""
    checked = _checked(a, b, sfa, sfb, sf_vec_size, alpha, out, a_dtype, scale)
    launch, a3, b3, sfa, sfb, out3 = checked
    with torch.cuda.device(a.device):
        launch(a3, b3, sfa, sfb, out3, alpha, torch.cuda.current_stream().cuda_stream, scale=scale)
    return launch


def _checked(a, b, sfa, sfb, sf_vec_size, alpha, out, a_dtype, scale):
    """``gemm_for_ops``' operands through every check of ``gemm``: their Launch on the current
    stream, and the operands as the kernel takes them (3-D, the scales as bytes)."""
    if a.dim() not in (2, 3) or b.dim() != a.dim():
        raise ValueError(f"a and b must both be 2-D or 3-D, got {tuple(a.shape)}, {tuple(b.shape)}")
    if _a_dtype(a) != a_dtype:
        raise ValueError(f"a is {a.dtype}, a_dtype is {a_dtype}")
    l = a.shape[0] if a.dim() == 3 else 1  # noqa: E741
    a3, b3, out3 = a.view(l, *a.shape[-2:]), b.view(l, *b.shape[-2:]), out.view(l, *out.shape[-2:])
    sfa = None if sfa is None else sfa.contiguous().view(torch.uint8).reshape(l, -1)
    sfb = sfb.contiguous().view(torch.uint8).reshape(l, -1)
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream()
        launch = _prepare(a3, b3, sfa, sfb, alpha, out3, None, sf_vec_size, stream, scale)
    return launch, a3, b3, sfa, sfb, out3


def grouped_gemm_for_ops(a, b, sfb, sf_vec_size, alpha, offsets, out_dtype, scale=None):
    """The grouped W4A16 GEMM into a new D [rows, N] in ``out_dtype``: token rows
    offsets[e] .. offsets[e + 1] - 1 of ``a`` (bfloat16 / float16 [rows, K]) times expert e of
    ``b`` (prepacked weights [E, N, K_pad / 2]) with its blocked scales (``sfb`` [E, ...]) and
    alpha[e] (float32 [E]) times ``scale`` (a float32 scalar on a's device, None: 1.0, read by
    the kernel); ``offsets`` int32 [E + 1] on a's device, read by the kernel. Checked once per
    shape and stream as
    ``gemm_for_ops`` does; the offsets' values are the caller's to check
    (``fp4_ops.moe.check_group_offsets``)."""
    out = torch.empty((a.shape[0], b.shape[-2]), dtype=out_dtype, device=a.device)
    if b.dim() != 3 or a.dim() != 2:
        raise ValueError(
            f"grouped: a must be [rows, K] and b [E, N, K_pad / 2], got {tuple(a.shape)}, "
            f"{tuple(b.shape)}"
        )
    experts = b.shape[0]
    if not _offsets_fit(offsets, experts, a.get_device()):
        raise ValueError(
            f"offsets must be a contiguous int32 tensor [E + 1] = [{experts + 1}] on {a.device}"
        )
    if not isinstance(alpha, torch.Tensor) or alpha.numel() != experts:
        raise ValueError(f"alpha must be a float32 tensor of {experts} (one per group)")
    sfb = sfb.contiguous().view(torch.uint8).reshape(experts, -1)
    if scale is not None and not device_scalars(scale, a.get_device()):
        raise ValueError(f"scale must be a float32 scalar on {a.device}")
    _grouped_launch(a, b, sfb, sf_vec_size, alpha, offsets, out, scale)
    return out


def _grouped_launch(a, b, sfb, sf_vec_size, alpha, offsets, out, scale=None) -> None:
    """The grouped launch into ``out`` (experts b [E, N, K_pad / 2], offsets [E + 1]):
    checked at the first call of its shapes on a stream, then straight to the kernel."""
    index = a.get_device()
    stream = stream_handle(index)
    key = ("grouped", a.shape, a.dtype, b.shape, b.dtype, sfb.shape, sf_vec_size, out.dtype)
    key += (index, stream)
    launch = _LAUNCHES.get(key)
    if launch is not None and _offsets_fit(offsets, b.shape[0], index):
        if launch.fits(a, b, None, sfb, alpha, out):
            launch(a, b, None, sfb, out, alpha, stream, offsets, scale)
            return
    _keep_launch(key, _first_grouped_launch(a, b, sfb, sf_vec_size, alpha, offsets, out, scale))


def _keep_launch(key: tuple, launch: Launch) -> None:
    """``launch`` under ``key`` in ``_LAUNCHES``, which starts over when full."""
    if len(_LAUNCHES) >= _MAX_LAUNCHES:
        _LAUNCHES.clear()
    _LAUNCHES[key] = launch


def _offsets_fit(offsets, experts: int, index: int) -> bool:
    return (
        isinstance(offsets, torch.Tensor)
        and offsets.dtype == torch.int32
        and tuple(offsets.shape) == (experts + 1,)
        and offsets.is_contiguous()
        and offsets.get_device() == index
    )


def _first_grouped_launch(a, b, sfb, sf_vec_size, alpha, offsets, out, scale) -> Launch:
    """The grouped operands (the offsets and alpha checked by ``grouped_gemm_for_ops``)
    through every other check, launched: their Launch."""
    experts = b.shape[0]
    a_dtype = _a_dtype(a)
    if a_dtype == W4A4:
        raise ValueError("the grouped kernel takes bfloat16 / float16 activations (W4A16)")
    c_dtype = DSL_DTYPE_NAMES.get(out.dtype)
    rows, k = a.shape
    with torch.cuda.device(a.device):
        pick = (rows, b.shape[1], k, experts, sf_vec_size, c_dtype, a_dtype, a.device)
        if pick not in _PICKED:
            num_sms = gpu_sm_count(a.device)
            _PICKED[pick] = GemmConfig.for_groups(*pick[:-1], num_sms=num_sms)
        config = _PICKED[pick]
        mnkl = (rows, b.shape[1], k, experts)
        reasons = operand_reasons(a, b, None, sfb, alpha, out, mnkl, config)
        reasons += config.reasons(mnkl)
        if reasons:
            raise ValueError("; ".join(reasons))
        stream = torch.cuda.current_stream()
        workspace = _workspace(config, mnkl, stream)
        fn = _compiled(config, a.device.index)[1]
        launch = Launch(fn, mnkl, workspace, a.get_device(), unit_scale(a.device), config)
        launch(a, b, None, sfb, out, alpha, stream.cuda_stream, offsets, scale)
    return launch
