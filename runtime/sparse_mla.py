"""Host op of the sparse-MLA decode (DESIGN.md "sparse_mla_decode") on the AOT cluster kernel.

``sparse_mla_decode`` checks every argument, then launches the cached sm_90a kernel
(one cluster of ``width / 128`` CTAs a token) where ``supports_sparse_mla`` says it
takes the call, and otherwise computes the same result exactly with the torch
reference (CPU tensors, a GPU the cache has no kernel for). Batches above
``max_tokens(width)`` still run on the kernel: the clusters beyond one wave wait
for a free slot, which costs far less than the reference's gather in FP32.
"""

from __future__ import annotations

import math
import numbers

import torch

from .arguments import (
    OP_NAMESPACE,
    cuda_device_index,
    mark_written,
    require_dense,
    require_flag,
    traced,
    whole_number,
    write_result,
)
from .contract import sparse_mla_decode as contract
from .loader import held_kernel, launch_on, memo_kernel
from .overlap import check_in_storage, check_out_apart
from .reference import sparse_mla_decode_reference

FP8 = torch.float8_e4m3fn
HEADS = contract.HEADS
HEAD_DIM = contract.HEAD_DIM
WIDTHS = contract.WIDTHS
_POINTER_ALIGN = contract.POINTER_ALIGN  # a module global: one lookup fewer a tensor checked
_FLOAT32_MAX = 3.4028234663852886e38  # the kernel takes the scales as float32
# The kernel's base-2 scores, q.kv * bmm1_scale * log2(e) in float32, must stay finite and above its stand-in for
# -inf (contract.NEG_BIG, -3e38; a chunk's max is floored there so that an all-masked chunk gives 0, not NaN): past
# that a head whose scores all sit below it gets zeros, and one past FLT_MAX NaN, where the reference is finite.
# E4M3 inputs bound |q.kv| by 448^2 * 512 (1.03e8), so 1e30 keeps every score within +-1.5e38, half the stand-in:
# real scales are about 1 / sqrt(576).
_MAX_QK = torch.finfo(FP8).max ** 2 * HEAD_DIM
_BMM1_SCALE_MAX = 1e30
assert _MAX_QK * _BMM1_SCALE_MAX * math.log2(math.e) < 0.5 * -contract.NEG_BIG
# bmm2_scale multiplies the kernel's softmax weights before they are normalised: by 1 / (256 L) with L floored at
# 1e-30 (a token with no active column, whose O is 0: a factor past FLT_MAX makes 0 * inf = NaN where the reference
# writes zeros) and by a chunk's sum l_j <= 128 at width 640. 1e10 keeps both within float32 (3.9e37, 1.3e12);
# real scales are near 1.
_BMM2_SCALE_MAX = 1e10
assert _BMM2_SCALE_MAX / 256 / 1e-30 < _FLOAT32_MAX


def _copy_fix(name, fix):
    """``fix`` (a copy of ``name`` to pass), for the sinks with when to make it (the docstring's rule): with PDL the
    kernel reads them before it waits for the previous kernel, the one that writes a copy made each call."""
    if name != "sinks":
        return fix
    return (f"{fix}, made once where the weights are loaded (with pdl=True the kernel reads the sinks before it waits "
            f"for the kernel before it, which would write a copy made each call), or pass pdl=False")


# The refusals _check_tensor and _check_traced_args share, built only where they raise: the checks inline, since an
# eager call's checks are host time (a call each per tensor cost ~0.45 us a call of sparse_mla_decode).
def _not_a_tensor(name, t, dtype) -> TypeError:
    return TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; pass a {dtype} tensor")


def _wrong_ndim(name, shape, ndim) -> ValueError:
    return ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(shape)}")


def _check_traced_args(q, swa_kv, compressed_kv, indices, lens, sinks, out):
    """What a traced call checks of its tensors before its op, as _check_tensor does first: each is a tensor (a list
    failed inside the tracer), and q's dimensions where out is allocated from them (an IndexError while tracing).
    The rest the op's real call checks."""
    given = [("q", q, FP8), ("swa_kv", swa_kv, FP8), ("compressed_kv", compressed_kv, FP8),
             ("indices", indices, torch.int32), ("lens", lens, torch.int32)]
    given += [(name, t, dtype) for name, t, dtype in (("sinks", sinks, torch.float32), ("out", out, torch.bfloat16))
              if t is not None]  # optional
    for name, t, dtype in given:
        if not isinstance(t, torch.Tensor):
            raise _not_a_tensor(name, t, dtype)
    if out is None and q.dim() != 3:
        raise _wrong_ndim("q", q.shape, 3)


def _check_tensor(name, t, dtype, ndim, device=None):
    """``t``'s shape, where it is a dense contiguous ``dtype`` tensor of ``ndim`` dimensions inside its storage, on
    ``device`` (unless None: q, which sets it) and aligned as the kernel is compiled to assume (its contract's
    POINTER_ALIGN: 16 bytes for the vectors moved, 4 for indices, lens and sinks); else a TypeError/ValueError naming
    ``name``.
    Each property is read once: an eager call's checks are host time on every layer of a step."""
    if not isinstance(t, torch.Tensor):
        raise _not_a_tensor(name, t, dtype)
    require_dense(name, t, written=name == "out")
    if t.dtype != dtype:
        # out receives the result: a converted copy of it would not
        if name == "out":
            fix = f"allocate it with dtype={dtype} (or pass out=None)"
        elif dtype == FP8 and t.dtype in (torch.uint8, torch.int8):  # FP8 bytes kept as integers: .to() would
            fix = f"pass {name}.view({dtype}) where its bytes are E4M3 values"  # convert each byte's number
        else:
            fix = _copy_fix(name, f"pass {name}.to({dtype})")
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}; {fix}")
    shape = t.shape
    if len(shape) != ndim:
        raise _wrong_ndim(name, shape, ndim)
    if not t.is_contiguous():
        fix = "pass a contiguous out (or out=None)" if name == "out" else _copy_fix(name, f"pass {name}.contiguous()")
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}; {fix}")
    check_in_storage(name, t)
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}; pass every tensor on q's device")
    align = _POINTER_ALIGN[name]
    if t.data_ptr() % align and t.numel():
        # out receives the result: a copy of it would take the result instead
        fix = ("pass an out that torch allocated (or out=None)" if name == "out"
               else _copy_fix(name, f"pass a tensor that torch allocated, or {name}.clone()"))
        raise ValueError(f"{name} must start at a {align}-byte aligned address (its data_ptr is {t.data_ptr() % align} "
                         f"bytes past one); {fix}")
    return shape


def _check_scale(name, v, limit=_FLOAT32_MAX, why="finite as a float32"):
    if type(v) is not float:  # a float is a Real: the ABC test (~1 us) only for other types
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {type(v).__name__}; pass a Python float "
                            f"(float({name}) of a one-element CPU tensor)")
        try:
            v = float(v)
        except OverflowError:
            v = math.inf
    if not abs(v) <= limit:  # NaN and inf fail too
        raise ValueError(f"{name} must be {why} (|{name}| <= {limit:.4g}), got {v}")


def _check_scales(bmm1_scale, bmm2_scale):
    _check_scale("bmm1_scale", bmm1_scale, _BMM1_SCALE_MAX, "small enough that every score stays finite in the kernel")
    _check_scale("bmm2_scale", bmm2_scale, _BMM2_SCALE_MAX, "small enough that the kernel's weights stay finite; "
                 "scale the output instead for more")


def _check_args(q, swa_kv, compressed_kv, indices, lens, sinks, bmm1_scale, bmm2_scale, out):
    """Validate everything; return (T, width). Raises TypeError/ValueError naming the argument."""
    T, heads, dim = _check_tensor("q", q, FP8, 3)
    if heads != HEADS or dim != HEAD_DIM:
        raise ValueError(f"q must be [T, {HEADS}, {HEAD_DIM}], got {tuple(q.shape)}; pass {HEADS} heads of the "
                         f"{HEAD_DIM} latent dims (a query that carries the rope dims too is wider)")
    device = q.device
    for name, pool in (("swa_kv", swa_kv), ("compressed_kv", compressed_kv)):
        rows, cols = _check_tensor(name, pool, FP8, 2, device)
        if cols != HEAD_DIM:
            raise ValueError(f"{name} must be [rows, {HEAD_DIM}], got {tuple(pool.shape)}")
        if rows >= 2 ** 31:
            raise ValueError(f"{name} has {rows} rows; the kernel takes a pool's row count as int32 (at most 2^31 - 1, "
                             f"as many as int32 indices address); pass a view of the rows the indices can reach")
    tokens, width = _check_tensor("indices", indices, torch.int32, 2, device)
    if tokens != T:
        raise ValueError(f"indices must be [T = {T}, width] (T: q's tokens), got {tuple(indices.shape)}")
    if width not in WIDTHS:
        raise ValueError(f"indices width {width} is not supported; widths: {WIDTHS}")
    if _check_tensor("lens", lens, torch.int32, 1, device)[0] != T:
        raise ValueError(f"lens must be [T = {T}] (T: q's tokens), got {tuple(lens.shape)}")
    if sinks is not None and _check_tensor("sinks", sinks, torch.float32, 1, device)[0] != HEADS:
        raise ValueError(f"sinks must be [{HEADS}], got {tuple(sinks.shape)}")
    _check_scales(bmm1_scale, bmm2_scale)
    if out is not None:
        if _check_tensor("out", out, torch.bfloat16, 3, device) != (T, HEADS, HEAD_DIM):
            raise ValueError(f"out must be [{T}, {HEADS}, {HEAD_DIM}], got {tuple(out.shape)}")
        check_out_apart(out, (("q", q), ("swa_kv", swa_kv), ("compressed_kv", compressed_kv), ("indices", indices),
                              ("lens", lens), ("sinks", sinks)))
    return T, width


_kernels: dict = {}


def _kernel(width: int, has_sinks: bool, device):
    """The cached kernel for this call, or None where the cache cannot serve the device."""
    if device.type != "cuda":
        return None
    index = device.index  # a CUDA tensor's device always names its index (the callers pass q.device)
    key = (index, width, has_sinks)
    if key not in _kernels:
        return memo_kernel(_kernels, key, "sparse_mla_decode", index, contract.variant_name(width, has_sinks))
    return _kernels[key]


def supports_sparse_mla(q, swa_kv, compressed_kv, indices, lens, *, sinks=None, bmm1_scale=1.0,
                        bmm2_scale=1.0, out=None) -> bool:
    """Whether the cluster kernel takes this call (else ``sparse_mla_decode`` uses the reference).

    Invalid arguments raise as in ``sparse_mla_decode``. The kernel takes any valid call on a
    device the cache serves (sm_90a), any number of tokens (beyond ``max_tokens`` it runs in waves).
    """
    _, width = _check_args(q, swa_kv, compressed_kv, indices, lens, sinks, bmm1_scale, bmm2_scale, out)
    return _kernel(width, sinks is not None, q.device) is not None


def max_tokens(width: int, device=None) -> int:
    """Tokens that run in one wave on ``device``: resident clusters of ``width / 128`` CTAs.

    The kernel's occupancy (two CTAs an SM) is in ``cuOccupancyMaxActiveClusters``, which the
    loader measures per kernel. 0 where the cache has no kernel for the device, and without
    ``device`` on a machine where torch sees no CUDA device.
    """
    # An integer of any type; 128.0 == 128 would pass the membership test, name no variant, and leave a
    # refusal memoized under (device, 128) for every later call of that width.
    width = whole_number("width", width)
    if width not in WIDTHS:
        raise ValueError(f"width {width} is not supported; widths: {WIDTHS}")
    if device is None:
        if not torch.cuda.is_available():
            return 0
        device = torch.cuda.current_device()
    index = cuda_device_index("device", device)
    if index is None:
        return 0  # no kernel serves a device of another type
    # Either variant: sinks or not, they share the grid, the cluster and the occupancy, and a cache built with part
    # of the contract (build_kernels.py --only) may hold one of them. Asked of the cache, not through the ops' memo:
    # that would say a missing variant's fallback runs (no op call runs here) and keep the answer silently for the op.
    device = torch.device("cuda", index)
    k = _held_kernel(width, True, device)
    if k is None:
        k = _held_kernel(width, False, device)
    return 0 if k is None else int(k.max_active_clusters)


def _held_kernel(width: int, has_sinks: bool, device: torch.device):
    """The cache's kernel of this variant on ``device`` (a CUDA device with its index), or None, asked without the
    ops' memo and its missing-kernel warning."""
    return held_kernel("sparse_mla_decode", device.index, contract.variant_name(width, has_sinks))[1]


def sparse_mla_decode(q, swa_kv, compressed_kv, indices, lens, *, sinks=None, bmm1_scale, bmm2_scale,
                      out=None, pdl: bool = True):
    """BF16 ``[T, 16, 512]`` sparse-MLA decode output (DESIGN.md); writes ``out`` when given.

    q ``[T, 16, 512]`` FP8 E4M3; swa_kv / compressed_kv ``[rows, 512]`` FP8 E4M3; indices
    ``[T, width]`` int32 (width 128 or 640; the first 128 columns index swa_kv, the rest
    compressed_kv; -1, columns at or past ``lens[t]`` and indices at or past a pool's rows are
    masked); lens ``[T]`` int32; sinks ``[16]`` float32 or None (-inf: no sink; +inf or one past
    FLT_MAX / log2(e): the sink takes all the weight, zeros, as in the reference; a NaN sink leaves
    its head's output undefined: the kernel's max drops it and gives finite values up to ~1e31, and
    zeros on some tokens, on the H200; the reference NaN). Every tensor contiguous, on one device,
    16-byte aligned (indices, lens, sinks: 4). ``|bmm1_scale| <= 1e30`` (every score then stays
    finite in the kernel's base 2), ``|bmm2_scale| <= 1e10`` (the kernel scales its weights by it before they
    are normalised).

    ``pdl``: launch with programmatic dependent launch (the kernel reads the sinks and sets up its
    barriers while the previous kernel finishes; the next may be scheduled once the scores are
    issued). False launches in plain stream order, as decode_topk(pdl=False) does. With PDL the
    sinks are read before the kernel waits for the previous grid (they are weights): keep them in
    a buffer that no kernel of the step writes (filled at model load, not ``sinks=param.float()``
    each step), or pass ``pdl=False``.

    The first call on a device loads the AOT cache, which cannot happen inside CUDA graph stream capture:
    load it first (``runtime.load(device=i)`` at start-up, or one call before capturing); a first call
    during capture raises ``runtime.CacheLoadInterrupted``.

    Traced by torch.compile or make_fx, the call is one custom op (``sparse_decode_aot::sparse_mla_decode``,
    mutating ``out``, which is allocated first where None): the graph keeps it whole, and it runs this function on the
    real tensors.
    """
    if traced():
        # Traced by torch.compile (or make_fx, torch.export): the Python scalars checked here (the tracer specializes
        # on them), the tensors by the real call.
        _check_traced_args(q, swa_kv, compressed_kv, indices, lens, sinks, out)
        _check_scales(bmm1_scale, bmm2_scale)
        require_flag("pdl", pdl)
        if out is None:
            out = _new_out(q)
        _sparse_mla_decode_op(q, swa_kv, compressed_kv, indices, lens, sinks, float(bmm1_scale), float(bmm2_scale),
                              out, pdl)
        return out
    T, width = _check_args(q, swa_kv, compressed_kv, indices, lens, sinks, bmm1_scale, bmm2_scale, out)
    require_flag("pdl", pdl)  # "False" would launch with PDL, reading the sinks before the previous grid's writes
    if out is None:
        out = _new_out(q)
    if T == 0:
        return out
    kernel = _kernel(width, sinks is not None, q.device)
    if kernel is None:
        # No autograd, as on the kernel's path (which has no backward): a sinks or q that requires grad gave the
        # fallback's output a grad_fn, and an out that does refused the copy after the whole reference had run.
        with torch.no_grad():
            result = sparse_mla_decode_reference(q, swa_kv, compressed_kv, indices, lens, sinks=sinks,
                                                 bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale)
        write_result(out, result)
        return out
    if not pdl:
        kernel = kernel.in_stream_order()
    n = width // contract.CHUNK
    args = (out.data_ptr(), q.data_ptr(), swa_kv.data_ptr(), compressed_kv.data_ptr(), indices.data_ptr(),
            lens.data_ptr(), 0 if sinks is None else sinks.data_ptr(), swa_kv.shape[0], compressed_kv.shape[0],
            float(bmm1_scale), float(bmm2_scale))
    launch_on(q.device, kernel, T * n, *args)
    mark_written(out)
    return out


def _new_out(q):
    """The output a call allocates where ``out`` is None: BF16 ``[T, 16, 512]`` on q's device."""
    return torch.empty(q.shape[0], HEADS, HEAD_DIM, dtype=torch.bfloat16, device=q.device)


@torch.library.custom_op(f"{OP_NAMESPACE}::sparse_mla_decode", mutates_args=("out",))
def _sparse_mla_decode_op(q: torch.Tensor, swa_kv: torch.Tensor, compressed_kv: torch.Tensor, indices: torch.Tensor,
                          lens: torch.Tensor, sinks: torch.Tensor | None, bmm1_scale: float, bmm2_scale: float,
                          out: torch.Tensor, pdl: bool) -> None:
    """sparse_mla_decode as torch.compile sees it: an opaque op writing ``out``, so that the tracer neither follows
    the host checks and launches (pointer reads, driver calls) nor breaks the graph there."""
    sparse_mla_decode(q, swa_kv, compressed_kv, indices, lens, sinks=sinks, bmm1_scale=bmm1_scale,
                      bmm2_scale=bmm2_scale, out=out, pdl=pdl)


@_sparse_mla_decode_op.register_fake
def _sparse_mla_decode_fake(q, swa_kv, compressed_kv, indices, lens, sinks, bmm1_scale, bmm2_scale, out,
                            pdl) -> None:
    """Shapes only: the op writes ``out`` and returns nothing; the real call checks every argument."""
