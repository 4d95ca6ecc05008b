"""Host op of decode_topk (DESIGN.md "decode_topk"): exact top-k of indexer logits rows.

``decode_topk(logits, row_ends, out, *, block_mode=False)`` writes, for each row
``r``, the ``k = out.shape[1]`` best candidates of row ``r``:

- token mode: column indices ``< row_end`` with the largest logits;
- block mode: indices ``b`` of blocks ``[8b, 8b + 8)`` clipped to the row end, each
  scored by its largest logit.

Exact: ties at the threshold go to the lower index, NaN counts as -inf, a row with
fewer than ``k`` candidates gets all of them then -1. ``row_ends`` are clipped to
``[0, logits.shape[1]]`` on the device (no host sync, no read past the width).
**Order within a row is unspecified**: the kernel's output is not sorted (the torch
fallback's is best first); compare rows as sets.

The cached kernel takes the call where ``supports_decode_topk`` says so (one wave
on this device, aligned FP32/BF16 logits): the short-row kernel (one CTA a row) on
short rows (``_Plan.choose``), else a cluster kernel. More rows than one wave of any
cached kernel holds go as several launches of even size, each one wave (``decode_topk``);
otherwise the exact torch reference computes the same set.
"""

from __future__ import annotations

import torch

from .arguments import (
    OP_NAMESPACE,
    cuda_device_index,
    mark_written,
    require_dense,
    require_element_aligned,
    require_flag,
    traced,
    whole_count,
    whole_number,
    write_result,
)
from .contract import decode_topk as contract
from .errors import warn_at_caller
from .loader import cache_or_fallback, launch_on, warn_missing_kernels
from .overlap import check_in_storage, check_out_apart
from .reference import decode_topk_reference

SUPPORTED_K = contract.SUPPORTED_K
MAX_WIDTH = (1 << 21) - 1  # the kernels break exact ties over 21 index bits (kernels/decode_topk: gather_rounds)
_ALIGN = contract.POINTER_ALIGN["logits"]  # bytes: the kernel reads 16-byte vectors of a row
INT32_MAX = (1 << 31) - 1  # the kernel takes the row strides as int32 and offsets out by row * out_stride in int32
_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
# Columns a CTA should own at least, by cluster size, before a row is split further:
# below this the cluster's barriers cost more than the extra CTAs save. Measured on the
# H200 (gpu/jobs/topk_roots.py, TOPK_ROOTS_CASES=small; decode_topk_ab_h200.json:
# routing_ab): 4 CTAs of 2K columns beat 2 of 4K (8K columns, 1 and 8 rows: 0.5 us),
# while 2 CTAs of 2K lose to one of 4K (1.2 us) and 8 of 2K to 4 of 4K (0.7 us). Re-checked after
# short slices stopped keeping a list (decode_topk_ab_h200.json: listless_ab call5_small, short_floors_ab):
# the same choices win.
MIN_COLUMNS_PER_CTA = {1: 0, 2: 4096, 4: 2048, 8: 4096, 16: 4096}
# The short-row kernel (one CTA a row, the row in registers) takes rows of up to this many allocated
# columns, by mode, where one wave of it holds them; wider rows up to contract.ROW_MAX_WIDTH too unless
# the cluster choice splits them over 4 CTAs or more. Measured on the H200 (gpu/jobs/topk_roots.py,
# TOPK_ROOTS_CASES=row; decode_topk_ab_h200.json: row_kernel_ab, final) against the best of 1, 2 and 4
# CTAs a row: token mode at 2K to 8K columns 0.13-1.8 us faster (1 x 8K k512 5.34 against 6.24 us), at
# 16K columns 1.7-3.3 us faster on 64 and 132 rows but 0.26-0.35 us slower than 4 CTAs on 1 and 8 rows
# (32 items a thread: issue-bound); block mode 0.66-2.4 us faster at 8K and 16K columns on 1 and 64 rows.
ROW_ALWAYS_MAX_WIDTH = {False: 8192, True: contract.ROW_MAX_WIDTH}  # by block_mode
# A cluster size's one-CTA-an-SM twin (contract.FULL_SM_TWIN_CLUSTERS) takes rows of at least this many columns
# a CTA where one wave of it holds them. Measured on the H200 (decode_topk_ab_h200.json: full_sm_twin_ab): the
# twins win from 8K columns a CTA on (64 x 16K and 64 x 32K on 2 CTAs 0.4-0.7 us, 8 and 24 x 32K on 4 CTAs
# 0.25-0.5 us, 64 x 64K 3.6-6.6 us, 16 x 256K on 4 CTAs 6.6 us) and lose 0.1-0.2 us at 4K (4 CTAs a row, 1 and
# 8 x 16K).
FULL_SM_TWIN_MIN_COLUMNS = 8192


# The refusals _check_args and _require_tensors share, built only where they raise: the checks inline, since an
# eager call's checks are host time on every layer of a step.
def _logits_not_a_tensor(logits) -> TypeError:
    return TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}; pass the scores as a 2-D float32 "
                     f"or bfloat16 tensor")


def _not_an_int32_tensor(name: str, t) -> TypeError:
    return TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; pass an int32 tensor")


def _require_tensors(logits, row_ends, out) -> None:
    """What a traced call checks before its op, as _check_args does first: a TypeError naming the first argument
    that is no tensor (a traced call with out=None wrote nothing and raised nothing; logits as a list failed inside
    the tracer)."""
    if not isinstance(logits, torch.Tensor):
        raise _logits_not_a_tensor(logits)
    for name, t in (("row_ends", row_ends), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise _not_an_int32_tensor(name, t)


def _require_int32_tensor(name: str, t) -> torch.Size:
    """``t``'s shape where it is a dense int32 tensor, else a TypeError naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise _not_an_int32_tensor(name, t)
    require_dense(name, t, written=name == "out")
    if t.dtype != torch.int32:
        fix = "allocate it with dtype=torch.int32" if name == "out" else f"pass {name}.int()"
        raise TypeError(f"{name} must be int32, got {t.dtype}; {fix}")
    return t.shape


def _check_out_strides(out, rows: int, k: int) -> None:
    """A ValueError unless ``out`` ([rows, k]) holds each row in k adjacent slots of its own (_check_args tests the
    same inline and calls this only to raise)."""
    row_stride, column_stride = out.stride()
    if column_stride != 1:
        raise ValueError(f"out must have unit column stride, got strides {out.stride()}; pass rows of k adjacent "
                         f"int32 slots (a contiguous out, or a slice of its rows)")
    if rows > 1 and row_stride < k:
        raise ValueError(f"out's rows overlap (row stride {row_stride} < k = {k}): give each row k slots of its own")


def _check_args(logits, row_ends, out, block_mode):
    """Every argument checked before anything is launched; returns (rows, width, k). Each property is read once:
    an eager call's checks are host time on every layer of a step."""
    if not isinstance(logits, torch.Tensor):
        raise _logits_not_a_tensor(logits)
    require_dense("logits", logits)
    if logits.dtype not in _DTYPES:
        raise TypeError(f"logits must be float32 or bfloat16, got {logits.dtype}; pass logits.float()")
    shape = logits.shape
    if len(shape) != 2:
        raise ValueError(f"logits must be 2-D [rows, width], got shape {tuple(shape)}; pass one row of scores a "
                         f"decode token (logits.view(-1, width))")
    rows, width = shape
    if width > MAX_WIDTH:
        raise ValueError(f"logits: width {width} exceeds {MAX_WIDTH} columns; select from longer rows with "
                         f"runtime.reference.decode_topk_reference (exact, torch; it takes int32 widths)")
    if width > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits must have unit column stride, got strides {logits.stride()}; pass "
                         f"logits.contiguous()")
    ends_shape = _require_int32_tensor("row_ends", row_ends)
    if len(ends_shape) != 1 or ends_shape[0] != rows:
        raise ValueError(f"row_ends must have shape [{rows}], got {tuple(ends_shape)}; pass one end a row of logits")
    if rows > 1 and row_ends.stride(0) != 1:
        raise ValueError(f"row_ends must be contiguous, got stride {row_ends.stride(0)}; pass row_ends.contiguous()")
    out_shape = _require_int32_tensor("out", out)
    if len(out_shape) != 2 or out_shape[0] != rows:
        raise ValueError(f"out must have shape [{rows}, k], got {tuple(out_shape)}; allocate one row of k slots a "
                         f"row of logits")
    k = out_shape[1]
    if k not in SUPPORTED_K:
        raise ValueError(f"out: k = out.shape[1] = {k} is not supported; expected one of {SUPPORTED_K}")
    row_stride, column_stride = out.stride()
    if column_stride != 1 or (rows > 1 and row_stride < k):  # the test inline: no call on every eager step
        _check_out_strides(out, rows, k)
    require_flag("block_mode", block_mode)
    device = logits.device
    if row_ends.device != device or out.device != device:
        raise ValueError(f"logits, row_ends and out must be on one device, got {logits.device}, "
                         f"{row_ends.device} and {out.device}; pass row_ends on the logits' device and an out "
                         f"allocated there (the op writes out in place: a moved copy would take the result)")
    for name, t in (("logits", logits), ("row_ends", row_ends), ("out", out)):
        check_in_storage(name, t)
    # The kernels read row_ends and write out by 4-byte accesses, and every reader of the logits (the kernels, the
    # exact fallback's torch ops) by their elements: a start off the element size, as over a storage sliced at a byte
    # offset, would fault on the device. Logits off 16 bytes but on their element size take the exact fallback
    # (_layout_refusal).
    require_element_aligned("logits", logits)
    require_element_aligned("row_ends", row_ends)
    require_element_aligned("out", out)
    check_out_apart(out, (("logits", logits), ("row_ends", row_ends)))
    return rows, width, k


class _Plan:
    """The cached kernels of one (device, dtype, mode): cluster sizes and their one-wave row limits,
    and the short-row kernel (one CTA a row) with its own."""

    def __init__(self, cache, dtype: str, block_mode: bool):
        def cached(name):
            """(kernel, most rows in one wave), or None where the cache lacks it."""
            if name not in cache:
                return None
            kernel = cache.kernel(name)
            return kernel, kernel.max_active_clusters

        self.block_mode = block_mode
        # cluster size -> (kernel, most rows in one wave); twins: the one-CTA-an-SM ones (FULL_SM_TWIN_CLUSTERS)
        self.kernels = {c: k for c in contract.CLUSTERS if (k := cached(contract.name_for(dtype, block_mode, c)))}
        self.twins = {c: k for c in contract.CLUSTERS if contract.has_full_sm_twin(block_mode, c)
                      and (k := cached(contract.name_for(dtype, block_mode, c, full_sm=True)))}
        self.row = cached(contract.row_name_for(dtype, block_mode))

    def choose(self, rows: int, width: int):
        """(kernel, CTAs a row) for rows of this width, or None: the short-row kernel where one wave of
        it holds the rows and it wins (ROW_ALWAYS_MAX_WIDTH, then the cluster choice), else cluster_for's."""
        row_fits = self.row is not None and 0 < rows <= self.row[1] and width <= contract.ROW_MAX_WIDTH
        if row_fits and width <= ROW_ALWAYS_MAX_WIDTH[self.block_mode]:
            return self.row[0], 1  # the common short row: no cluster choice computed
        c = self.cluster_for(rows, width)
        if row_fits and (c is None or c < 4):
            return self.row[0], 1
        if c is None:
            return None
        twin = self.twins.get(c)
        if twin is not None and rows <= twin[1] and width >= c * FULL_SM_TWIN_MIN_COLUMNS:
            return twin[0], c  # long slices: one CTA an SM where a wave of it holds the rows
        return self.kernels[c][0], c

    def most_rows(self, width: int) -> int:
        """The most rows of this width that ``choose`` takes in one wave (the short-row kernel only up to its
        width limit, as in ``choose``)."""
        most = [m for _, m in self.kernels.values()]
        if self.row is not None and width <= contract.ROW_MAX_WIDTH:
            most.append(self.row[1])
        return max(most, default=0)

    def cluster_for(self, rows: int, width: int):
        """The largest cluster that fits one wave and leaves each CTA enough columns.

        Measured on the H200 with 8 and 16 CTAs at one CTA an SM (gpu/jobs/topk_roots.py,
        TOPK_ROOTS_CASES=wide; decode_topk_ab_h200.json: wide_routing): from 64K columns, 16
        CTAs a row beat 8 for every row count that one wave of 16 holds (3 to 6 rows: 64K
        2.1 us, 256K 0.8-1.6 us, 1M 7.3-9.4 us faster), and two waves of 16 lose to one
        of 8 (8 rows: 5.7-20 us slower); the wave limit is the device's, read at load.
        """
        fits = [c for c, (_, most) in self.kernels.items() if 0 < rows <= most]
        if not fits:
            return None
        good = [c for c in fits if width >= c * MIN_COLUMNS_PER_CTA[c]]
        return max(good) if good else min(fits)


_plans: dict = {}


def _plan_for(device: torch.device, dtype: str, block_mode: bool):
    key = (device.index, dtype, block_mode)
    if key not in _plans:  # (concurrent first calls may both fill it, with equal plans)
        cache = cache_or_fallback("decode_topk", device.index)
        plan = _Plan(cache, dtype, block_mode) if cache is not None else None
        _plans[key] = plan if plan is not None and plan.kernels else None
        if plan is not None and not plan.kernels:  # said once: memoized first (where warnings are errors too)
            warn_missing_kernels("decode_topk", f"cuda:{device.index}",
                                 [contract.name_for(dtype, block_mode, c) for c in contract.CLUSTERS], arch=cache.arch)
    return _plans[key]


def load_kernels(device: torch.device, dtype: torch.dtype, block_mode: bool) -> None:
    """Load the cache's kernels that select ``dtype`` logits in this mode on ``device`` (CUDA), as the first call
    would: a refused or partial cache is said now (once, a RuntimeWarning), and a load during CUDA-graph capture
    raises ``runtime.CacheLoadInterrupted``. For a caller whose later calls happen on some ranks only (the indexer's
    selection, on ranks with rows): every rank loads, and warns, alike. ``device`` may be an index or its string."""
    index = cuda_device_index("device", device)
    if index is None:
        raise ValueError(f"device: {device} is not a CUDA device; pass the device the calls will run on")
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: the kernels select {' or '.join(map(str, _DTYPES))} logits, got {dtype!r}; pass the "
                        f"logits' dtype")
    require_flag("block_mode", block_mode)  # "False" would load the block-mode kernels, leaving token mode to a call
    _plan_for(torch.device("cuda", index), _DTYPES[dtype], block_mode)


def _shape_supported(logits, k: int) -> bool:
    """What ``_check_args`` requires of the logits and k, as a yes/no (for the queries, which take any call)."""
    if not isinstance(logits, torch.Tensor):
        return False
    try:  # a tensor without memory to read (a FakeTensor, one whose data pointer torch refuses) is no kernel's
        require_dense("logits", logits)
    except TypeError:
        return False
    if logits.dim() != 2 or logits.dtype not in _DTYPES:
        return False
    width = logits.shape[1]
    return k in SUPPORTED_K and width <= MAX_WIDTH and (width <= 1 or logits.stride(1) == 1)


def _layout_refusal(logits: torch.Tensor, rows: int) -> str | None:
    """Why the kernel cannot read ``rows`` rows of these logits (words for the slow-path warning), or None."""
    es = logits.element_size()
    # One row is read from its start alone (row 0's offset is 0 whatever the stride): its stride is neither checked
    # nor passed (_row_strides).
    if logits.data_ptr() % _ALIGN or (rows > 1 and (logits.stride(0) * es) % _ALIGN):
        return f"the logits' start or row stride is not a multiple of {_ALIGN} bytes"
    if rows > 1 and logits.stride(0) > INT32_MAX:
        return "the logits' row stride is past int32"
    width = logits.shape[1]
    if (width * es) % _ALIGN:
        # The kernel's bulk reads of a row round its end up to 16 bytes (within the row's stride): the last
        # row's padding must be allocated too.
        last_end = (logits.storage_offset() + (rows - 1) * logits.stride(0)) * es + -(-width * es // _ALIGN) * _ALIGN
        if last_end > logits.untyped_storage().nbytes():
            return f"the logits' last row, rounded up to {_ALIGN} bytes, ends past their storage"
    return None


def _warn_slow_path(reason: str) -> None:
    """Say that a call the cache's kernels could serve runs the exact torch reference because of its layout: Python's
    default filter shows it once per reason and calling line, so a step that hits it every time says so once."""
    warn_at_caller(f"decode_topk: {reason}, so the exact torch reference runs instead of the cached kernel "
                   f"(milliseconds, not microseconds); pass tensors the kernel can read")


def _kernel_for(logits: torch.Tensor, rows: int, k: int, block_mode: bool):
    """(kernel, cluster) that takes this call, or None; for arguments ``_check_args`` accepts
    (or ``_shape_supported`` says it would): the dtype, k, width limit and column stride are not re-checked."""
    width = logits.shape[1]
    if not logits.is_cuda or rows < 1 or width < 1 or _layout_refusal(logits, rows) is not None:
        return None
    plan = _plan_for(logits.device, _DTYPES[logits.dtype], block_mode)
    if plan is None:
        return None
    return plan.choose(rows, width)


def _one_wave_rows(logits: torch.Tensor, block_mode: bool) -> int:
    """The most rows of these logits' width that one wave of a cached kernel of their (device, dtype, mode)
    takes; 0 where the cache has none."""
    plan = _plan_for(logits.device, _DTYPES[logits.dtype], block_mode)
    return 0 if plan is None else plan.most_rows(logits.shape[1])


def _query_args(rows, k, block_mode) -> tuple[int, int]:
    """The queries' (rows, k), checked as decode_topk checks its arguments: int() took 3.7 as 3 rows and True as
    k = 1, bool() the string "False" as block mode, so the answer was for another call than the one to be made."""
    require_flag("block_mode", block_mode)
    return whole_count("rows", rows, 0), whole_number("k", k)


def supports_decode_topk(logits: torch.Tensor, rows: int, k: int, block_mode: bool) -> bool:
    """Whether the cluster kernel takes ``rows`` rows of ``logits`` with this ``k`` in one wave on this device.

    False for CPU tensors, unaligned logits (16-byte start and row stride), a ``k``
    outside ``SUPPORTED_K`` or a GPU without a cache, where ``decode_topk`` uses the exact
    torch fallback; and for more rows than one wave of any cached kernel holds, which
    ``decode_topk`` launches a wave at a time. ``rows`` and ``k`` must be integers (any integer
    type, not a bool, nor a tensor off the CPU) and ``block_mode`` a bool, else a TypeError naming it;
    ``rows`` < 0 is a ValueError.
    """
    rows, k = _query_args(rows, k, block_mode)
    if not _shape_supported(logits, k):
        return False
    return _kernel_for(logits, rows, k, block_mode) is not None


def decode_topk(logits: torch.Tensor, row_ends: torch.Tensor, out: torch.Tensor, *, block_mode: bool = False,
                pdl: bool = True) -> None:
    """Write each row's exact top-k candidate indices into ``out`` ([rows, k] int32; see the module doc).

    ``pdl``: launch the kernel with programmatic dependent launch (its setup overlaps the previous
    kernel, the next may be scheduled once it has read its slice). Right behind a kernel that does
    not trigger its dependents early, such as DeepGEMM's scoring, pass False: measured on the H200
    (decode_topk_ab_h200.json: pdl_ab) scoring + selection was 0.1-0.4 us slower with PDL there,
    while a chain of selections was 3-7 % faster.

    More rows than one wave of any cached kernel holds (264 on the H200) run as the fewest launches of
    even size that each fit one wave, rather than through the torch reference (milliseconds, and int64
    temporaries of several times the logits' size).

    The first call on a device loads the AOT cache, which cannot happen inside CUDA graph stream capture:
    load it first (``runtime.load(device=i)`` at start-up, or one call before capturing); a first call
    during capture raises ``runtime.CacheLoadInterrupted``.

    Inside a function torch.compile or make_fx traces, the call is one custom op (``sparse_decode_aot::decode_topk``,
    mutating ``out``): the graph keeps it whole, and it runs this function on the real tensors.
    """
    if traced():
        # Traced by torch.compile (or make_fx, torch.export): one opaque node (_decode_topk_op), which runs this
        # function on real tensors.
        _require_tensors(logits, row_ends, out)
        require_flag("block_mode", block_mode)
        require_flag("pdl", pdl)
        if out._base is not None:
            # out a view (a slice of a wider buffer): this torch's inductor, with dynamic shapes, hands the op a view
            # of the base at storage offset 0 where the slice's offset is symbolic (out = buf[1:-1, 3:515] wrote
            # buf's first rows: pytorch/pytorch#198068, aten.sym_storage_offset lowered to 0). The op writes a fresh
            # tensor and a plain copy_, which the compilers place right, fills the view (rows * k words more).
            # The op checks that tensor in out's place: out's own strides are checked here, as eagerly (a view of
            # overlapping rows took one copy_, later rows over earlier ones' slots, and gave a wrong top-k).
            if out.dim() == 2:  # another shape the op refuses, on the fresh tensor of that shape
                _check_out_strides(out, out.shape[0], out.shape[1])
            written = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            _decode_topk_op(logits, row_ends, written, block_mode, pdl)
            out.copy_(written)
            return
        _decode_topk_op(logits, row_ends, out, block_mode, pdl)
        return
    rows, width, k = _check_args(logits, row_ends, out, block_mode)
    require_flag("pdl", pdl)  # "False" would launch with PDL
    if rows == 0:
        return
    chosen = _kernel_for(logits, rows, k, block_mode)
    # Split only where the kernel can read every row (the layout of all rows, not the first one's): a last row whose
    # 16-byte-rounded read leaves the storage would send the last slice to the reference, warning after the first
    # slices were launched (an exception there where warnings are errors, out left half written).
    if (chosen is None and rows > 1 and _layout_refusal(logits, rows) is None
            and _kernel_for(logits, 1, k, block_mode) is not None):
        wave = _one_wave_rows(logits, block_mode)
        if 0 < wave < rows:
            launches = -(-rows // wave)
            step = -(-rows // launches)
            for r0 in range(0, rows, step):  # slices of checked arguments: not checked again
                part = logits[r0:r0 + step]
                _select(part, row_ends[r0:r0 + step], out[r0:r0 + step], k, block_mode, pdl,
                        _kernel_for(part, part.shape[0], k, block_mode))
            return
    _select(logits, row_ends, out, k, block_mode, pdl, chosen)


def _select(logits, row_ends, out, k: int, block_mode: bool, pdl: bool, chosen) -> None:
    """decode_topk of checked arguments: one launch of ``chosen`` (kernel, cluster), or the exact reference where
    it is None or out's row offsets pass int32."""
    rows, width = logits.shape
    logits_stride, out_stride = _row_strides(logits, out)
    if chosen is None or (rows - 1) * out_stride + k > INT32_MAX:
        if logits.is_cuda and width > 0 and _plan_for(logits.device, _DTYPES[logits.dtype], block_mode) is not None:
            # The cache serves this device (a refusal was said by cache_or_fallback): the layout sent the call here.
            _warn_slow_path(_layout_refusal(logits, rows) or "out's row offsets are past int32")
        write_result(out, decode_topk_reference(logits, row_ends, k, block_mode=block_mode))
        return
    kernel, cluster = chosen
    if not pdl:
        kernel = kernel.in_stream_order()
    launch_on(logits.device, kernel, rows * cluster, logits.data_ptr(), row_ends.data_ptr(), out.data_ptr(), width,
              logits_stride, out_stride, k)
    mark_written(out)


def _row_strides(logits: torch.Tensor, out: torch.Tensor) -> tuple[int, int]:
    """The row strides the kernel takes (int32 parameters that only offset rows past the first): a single row's
    are never used, so they go as 0 and a row sliced from a tensor whose stride passes int32 still runs."""
    if logits.shape[0] == 1:
        return 0, 0
    return logits.stride(0), out.stride(0)


def decode_topk_plan(logits: torch.Tensor, rows: int, k: int, block_mode: bool):
    """(kernel name, cluster size, grid CTAs) the op would launch, or None (benchmarks, tests)."""
    rows, k = _query_args(rows, k, block_mode)
    if not _shape_supported(logits, k):
        return None
    chosen = _kernel_for(logits, rows, k, block_mode)
    if chosen is None:
        return None
    kernel, cluster = chosen
    return kernel.name, cluster, rows * cluster


@torch.library.custom_op(f"{OP_NAMESPACE}::decode_topk", mutates_args=("out",))
def _decode_topk_op(logits: torch.Tensor, row_ends: torch.Tensor, out: torch.Tensor, block_mode: bool,
                    pdl: bool) -> None:
    """decode_topk as torch.compile sees it: an opaque op, so that the tracer neither follows the host checks and
    launches (pointer reads, driver calls, which a traced tensor cannot take) nor breaks the graph there."""
    decode_topk(logits, row_ends, out, block_mode=block_mode, pdl=pdl)


@_decode_topk_op.register_fake
def _decode_topk_fake(logits, row_ends, out, block_mode, pdl) -> None:
    """Shapes only: the op writes ``out`` and returns nothing; the real call checks every argument."""
