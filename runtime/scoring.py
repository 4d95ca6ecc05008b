"""Indexer scoring: paged MQA logits of each decode row over the FP8 index-key cache.

Two scorers share one interface (``Scorer``):

- ``DeepGemmScorer``: DeepGEMM's ``fp8_paged_mqa_logits`` and its schedule
  ``get_paged_mqa_logits_metadata``, where DeepGEMM imports and a Hopper or
  Blackwell GPU is present. On sm_90 DeepGEMM takes 2-D context lengths
  ``[batch, next_n]`` and no ``indices`` (its varlen mode is sm_100 only), so each
  decode row is scored as its own request with ``next_n = 1``: rows stay
  independent and a row slice may split a request.
- ``TorchScorer``: the same logits from ``runtime.reference`` (CPU, CI, peer).

DeepGEMM compiles its kernels at first use. ``warm_deepgemm`` runs the serving
shapes once so that its JIT cache directory holds every kernel a decode step
needs; ``jit_cache_snapshot`` lets a caller prove a step compiled nothing.

Installing DeepGEMM where a GPU is: its host extension inlines ``at::Tensor``
accessors, so the wheel must be built against the serving torch's ABI. For torch
2.11 (+cu130): ``pip install tokenspeed-deepgemm==2.5.0.post20260629`` (cp312; needs
``nvcc`` under ``CUDA_HOME`` for its JIT). The ``sgl-deep-gemm`` 0.1.x/0.2.x wheels
are compiled against a newer torch whose ``c10::TensorImpl`` is 8 bytes shorter
before its sizes (``PyObjectSlot`` lost its interpreter pointer): under torch 2.11
their inline ``dim()`` reads the wrong field, which is the bogus
``context_lens.dim() == 2`` assertion on a 2-D tensor (seen in their code: ``dim()``
read at offset 0x38, torch 2.11's headers give 0x40).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from . import reference
from .arguments import require_dense, require_element_aligned, whole_count
from .overlap import check_in_storage

BLOCK_KV = reference.INDEX_BLOCK_KV
HOPPER_HEADS = (32, 64)  # DeepGEMM's sm_90 paged MQA logits
# Its sm_100 ones: a head a TMEM column, loaded 8, 16, 32 or 64 at a time (other counts fail its host assert, or
# its JIT compile at the first step).
BLACKWELL_HEADS = (8, 16, 32, 64)
DEEPGEMM_HEADS = {9: HOPPER_HEADS, 10: BLACKWELL_HEADS}
MAX_HEAD_DIM = 128
METADATA_BATCH_ALIGN = 32  # DeepGEMM specializes its schedule kernel per 32 rows
# The most rows one DeepGEMM schedule takes: its schedule kernel keeps a 4-byte word a row, the rows rounded up to 32,
# in shared memory, and its host code asserts that within the arch's 232,448 bytes (sm_90 and sm_100; DeepGEMM 2.5's
# `smem_size <= meta_smem_cap`), which raises a RuntimeError naming no argument. Run on the H200
# (benchmarks/results/schedule_rows_s54.json, gpu/jobs/schedule_rows_probe.py): 58,112 rows build a schedule, 58,113
# and 58,144 hit that assert.
MAX_SCHEDULE_ROWS = 232448 // 4 // METADATA_BATCH_ALIGN * METADATA_BATCH_ALIGN
# DeepGEMM reads a schedule in 8-byte pairs (a uint2 a SM): off an 8-byte boundary that load faults on the device.
SCHEDULE_ALIGN = 8


class Scorer(Protocol):
    """What the indexer flow needs from a scorer."""

    name: str
    # Optional (read with a default of torch.float32): the dtype ``logits`` returns, float32 or bfloat16. A state
    # loads that dtype's AOT top-k kernels when it is built, on every rank; logits of another dtype are refused.
    logits_dtype: torch.dtype

    def schedule(self, seq_lens: torch.Tensor) -> torch.Tensor | None:
        """The work schedule of these rows (None where the scorer needs none).
        Reads only ``seq_lens``: no query, no key."""

    def check_inputs(self, q, weights, cache, seq_lens, block_table, max_model_len: int, *,
                     layout_checked: bool = False) -> None:
        """Raise TypeError/ValueError naming the argument where ``logits`` could not
        take these inputs (the tensors of ``check_scoring_inputs``); launches nothing.
        Inputs that pass may be sliced by rows and still pass. ``layout_checked=True`` (optional
        for a scorer; the indexer passes it where the method takes it): the caller has checked
        what ``check_scoring_inputs`` checks but q's contiguity, weights' unit column stride and the
        cache, so only those and the scorer's own limits are checked (host time on every step of
        every layer)."""

    def logits(self, q, weights, cache, seq_lens, block_table, schedule: torch.Tensor | None,
               max_model_len: int, *, checked: bool = False) -> torch.Tensor:
        """``[rows, max_model_len]`` logits of ``logits_dtype`` (FP32 unless the scorer declares BF16; row stride
        may be padded; the AOT top-k reads CUDA logits whose start and row stride are multiples of 16 bytes and
        whose last row, rounded up to 16 bytes, lies within their storage, as DeepGEMM's and the torch scorer's do;
        other layouts are selected by the exact reference, with a warning); columns at or past ``seq_lens[r]`` hold
        anything. ``checked=True``: the caller already ran ``check_inputs`` on these rows or on rows they were sliced
        from, and built ``schedule`` with this scorer's ``schedule`` or ran its ``check_schedule`` on it, so neither
        is run again (the indexer checks the whole step once, ~3.4 µs of host time, and its plan the schedule)."""


def check_index_k_cache(cache, name: str = "cache", head_dim: int | None = None) -> None:
    """Raise TypeError/ValueError naming ``name`` unless ``cache`` is the fused paged index-key cache: contiguous
    uint8 ``[pages, 64, 1, head_dim + 4]`` (``reference.pack_index_k_cache``; any head_dim where it is None)."""
    row = "head_dim + 4" if head_dim is None else head_dim + reference.INDEX_SCALE_BYTES
    if isinstance(cache, torch.Tensor):
        # First: a nested tensor's shape, read for the message below, raised torch's RuntimeError, naming nothing.
        require_dense(name, cache)
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8:
        got = f"{cache.dtype} {tuple(cache.shape)}" if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise TypeError(f"{name}: expected uint8 [blocks, {BLOCK_KV}, 1, {row}], got {got}")
    if cache.dim() != 4:  # a shape, not a type: ValueError, as every other shape refusal of the flow
        raise ValueError(f"{name}: expected uint8 [blocks, {BLOCK_KV}, 1, {row}], got {cache.dim()} dims "
                         f"{tuple(cache.shape)}; pass the paged cache, not a view of its rows")
    width_ok = cache.shape[3] > reference.INDEX_SCALE_BYTES if head_dim is None else cache.shape[3] == row
    if cache.shape[1] != BLOCK_KV or cache.shape[2] != 1 or not width_ok:
        raise ValueError(f"{name}: expected [blocks, {BLOCK_KV}, 1, {row}], got {tuple(cache.shape)}")
    if cache.shape[0] == 0:
        # Nothing to score from, and neither scorer takes it: DeepGEMM's key descriptor would span no page, the torch
        # scorer's gather raises an IndexError naming nothing (after the plan's reset).
        raise ValueError(f"{name}: has no page; give the key cache at least one page of {BLOCK_KV} tokens")
    if not cache.is_contiguous():
        # Not .contiguous(): the model writes each step's keys into the cache it holds, which a copy would miss.
        raise ValueError(f"{name}: must be contiguous, got strides {cache.stride()}; allocate the key cache as one "
                         f"contiguous tensor and pass it (or a slice of its first pages)")
    check_in_storage(name, cache)


def _require_on_q_device(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.device != q.device:
        raise ValueError(f"{name}: on {t.device}, expected {q.device} like q")


def no_heads(q: torch.Tensor) -> ValueError:
    """The refusal of a q without heads ([rows, 0, head_dim]), whose logits would sum nothing (0 for every key) and
    each row's top-k be its first k columns, said by nothing. Built only where it raises: the test stays inline,
    since a call a step is host time."""
    return ValueError(f"q: has no index heads ({list(q.shape)}); pass the layer's index query, [rows, heads, "
                      f"head_dim] with heads >= 1")


def _check_scorer_layouts(q: torch.Tensor, weights: torch.Tensor, cache: torch.Tensor) -> None:
    """The tail of check_scoring_inputs, and all that check_scoring_inputs(layout_checked=True) checks but the
    cache's device: the built-in scorers' layouts that the indexer's own checks of a step do not ask for (q
    contiguous, weights of unit column stride), and the key cache whole (checked when the indexer state was built,
    but a tensor can be changed in place, and its storage shrunk, since). q and weights' shapes are checked."""
    if not q.is_contiguous():
        raise ValueError(f"q: must be contiguous, got strides {q.stride()}; pass q.contiguous()")
    # Its shape is checked: the strides are what is wrong (one head's column has no stride to keep).
    if weights.shape[1] > 1 and weights.stride(1) != 1:
        raise ValueError(f"weights: expected [{q.shape[0]}, {q.shape[1]}] with unit column stride, got strides "
                         f"{weights.stride()}; pass weights.contiguous()")
    check_index_k_cache(cache, "cache", q.shape[2])


def check_scoring_inputs(
    q: torch.Tensor,
    weights: torch.Tensor,
    cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    layout_checked: bool = False,
) -> None:
    """Raise TypeError/ValueError naming the argument before anything is launched. ``layout_checked``: the caller
    checked the rest (the indexer's checks of the step: every tensor's type, dtype, device, dense layout, shape,
    unit last stride and storage, the block table against max_model_len), so only q's contiguity, weights' unit
    column stride and the cache are checked, with the same messages."""
    if layout_checked:
        _check_scorer_layouts(q, weights, cache)  # first: it names a cache that is no tensor (no device to read)
        _require_on_q_device("cache", cache, q)
        return
    for name, t in (("q", q), ("weights", weights), ("cache", cache), ("seq_lens", seq_lens),
                    ("block_table", block_table)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        require_dense(name, t)
        _require_on_q_device(name, t, q)
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q: expected float8_e4m3fn, got {q.dtype}")
    if q.dim() != 3:
        raise ValueError(f"q: expected [rows, heads, head_dim], got shape {tuple(q.shape)}")
    rows, heads, _ = q.shape
    if not heads:
        raise no_heads(q)
    if weights.dtype != torch.float32:
        raise TypeError(f"weights: expected float32, got {weights.dtype}")
    if weights.shape != (rows, heads):
        raise ValueError(f"weights: expected [{rows}, {heads}] with unit column stride, got {tuple(weights.shape)}")
    _check_scorer_layouts(q, weights, cache)
    for name, t in (("seq_lens", seq_lens), ("block_table", block_table)):
        if t.dtype != torch.int32:  # a dtype is a TypeError, as every other dtype refusal of the host code
            raise TypeError(f"{name}: expected int32, got {t.dtype}")
    if seq_lens.shape != (rows,):
        raise ValueError(f"seq_lens: expected int32 [{rows}], got {tuple(seq_lens.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != rows:
        raise ValueError(f"block_table: expected int32 [{rows}, pages], got {tuple(block_table.shape)}")
    if block_table.stride(1) != 1:
        # Not .contiguous(): one page a row with another stride is contiguous to torch, which returns it as it is.
        raise ValueError(f"block_table: needs unit column stride (DeepGEMM asserts it), got strides "
                         f"{block_table.stride()}; pass block_table.clone(memory_format=torch.contiguous_format)")
    for name, t in (("q", q), ("weights", weights), ("seq_lens", seq_lens), ("block_table", block_table)):
        check_in_storage(name, t)
    max_model_len = whole_count("max_model_len", max_model_len, 1)
    if block_table.shape[1] * BLOCK_KV < max_model_len:
        raise ValueError(f"max_model_len: {max_model_len} must be positive and fit the block table's "
                         f"{block_table.shape[1]} pages of {BLOCK_KV}")


class TorchScorer:
    """The reference logits behind the scorer interface (no schedule)."""

    name = "torch"
    logits_dtype = torch.float32

    def schedule(self, seq_lens: torch.Tensor) -> torch.Tensor | None:
        return None

    def check_inputs(self, q, weights, cache, seq_lens, block_table, max_model_len, *, layout_checked=False) -> None:
        check_scoring_inputs(q, weights, cache, seq_lens, block_table, max_model_len, layout_checked=layout_checked)

    def logits(self, q, weights, cache, seq_lens, block_table, schedule, max_model_len, *, checked=False):
        if not checked:
            self.check_inputs(q, weights, cache, seq_lens, block_table, max_model_len)
        return _rows_16_bytes_apart(
            reference.indexer_logits_reference(q, weights, cache, seq_lens, block_table, max_model_len))


def _rows_16_bytes_apart(logits: torch.Tensor) -> torch.Tensor:
    """``logits``, or a view of a copy whose row stride is padded to 16 bytes, as DeepGEMM's logits are: the AOT
    top-k reads rows at such a stride only. A ``max_model_len`` that is not a multiple of 4 would otherwise send
    each selection to the exact reference, warned only on the ranks with rows, which raise where warnings are errors
    while an empty-slice rank waits in the all-gather."""
    rows, width = logits.shape
    padded = -(-width * logits.element_size() // 16) * 16 // logits.element_size()
    if padded == width:
        return logits
    return torch.empty(rows, padded, dtype=logits.dtype, device=logits.device)[:, :width].copy_(logits)


def _import_deep_gemm():
    import deep_gemm  # noqa: PLC0415 - optional dependency, GPU machines only

    return deep_gemm


def deepgemm_status(device: torch.device | None = None) -> tuple[bool, str]:
    """Whether DeepGEMM can score on ``device`` (default: the current CUDA device), and why not."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda":
        return False, f"device {device} is not CUDA"
    major, _ = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return False, f"compute capability {major}.x: DeepGEMM's paged MQA logits need sm_90 or sm_100"
    try:
        _import_deep_gemm()
    except Exception as exc:  # ImportError, or a broken extension
        return False, f"deep_gemm does not import: {type(exc).__name__}: {exc}"
    return True, "ok"


class DeepGemmScorer:
    """DeepGEMM's FP8 paged MQA logits, each row scored as a request with ``next_n = 1``.

    DeepGEMM launches on the current CUDA device and keeps one SM count for the process (``num_sms``), not one a
    device: call ``schedule`` and ``logits`` with the tensors' device current, as the indexer does."""

    name = "deepgemm"
    logits_dtype = torch.float32
    # The most rows one schedule (one rank's slice) takes: the indexer's plan refuses a sharded step whose slices
    # exceed it on every rank, where schedule() would refuse only on the ranks whose slice is that long.
    max_schedule_rows = MAX_SCHEDULE_ROWS

    def __init__(self) -> None:
        ok, why = deepgemm_status()
        if not ok:
            raise RuntimeError(f"DeepGemmScorer: {why}")
        self._dg = _import_deep_gemm()
        self.arch_major = torch.cuda.get_device_capability()[0]

    @property
    def num_sms(self) -> int:
        """DeepGEMM's SM count now: its logits launch that many CTAs and assert the schedule has that many rows
        plus one. It is the process's count (DeepGEMM reads the first device it sees, whatever device a tensor is
        on) and ``deep_gemm.set_num_sms`` changes it (e.g. to leave SMs to communication kernels), so it is read a
        call (one pybind getter), not kept from construction and not looked up per device."""
        return int(self._dg.get_num_sms())

    def schedule(self, seq_lens: torch.Tensor) -> torch.Tensor:
        if not isinstance(seq_lens, torch.Tensor):
            raise TypeError(f"seq_lens: expected a CUDA int32 tensor [rows], got {type(seq_lens).__name__}")
        if seq_lens.is_nested or seq_lens.layout != torch.strided:  # its shape raised torch's error, naming nothing
            require_dense("seq_lens", seq_lens)
        if seq_lens.numel() > MAX_SCHEDULE_ROWS:
            raise ValueError(f"seq_lens: {seq_lens.numel()} rows; one DeepGEMM schedule takes at most "
                             f"{MAX_SCHEDULE_ROWS} (its schedule kernel's shared memory): score the rows in steps "
                             f"of at most that many, or shard them over more ranks")
        if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or not seq_lens.is_cuda:
            # A dtype is a TypeError, as check_scoring_inputs' and every other dtype refusal of the host code
            error = TypeError if seq_lens.dtype != torch.int32 else ValueError
            raise error(f"seq_lens: expected CUDA int32 [rows], got {seq_lens.dtype} {tuple(seq_lens.shape)} on "
                        f"{seq_lens.device}; pass one int32 length a row, on the GPU that scores them")
        _check_current_device("seq_lens", seq_lens)
        require_element_aligned("seq_lens", seq_lens)  # the schedule kernel's 4-byte loads
        # 2-D context lengths: DeepGEMM 2.x asserts context_lens.dim() == 2.
        return self._dg.get_paged_mqa_logits_metadata(seq_lens.contiguous().view(-1, 1), BLOCK_KV, self.num_sms)

    def check_inputs(self, q, weights, cache, seq_lens, block_table, max_model_len, *, layout_checked=False) -> None:
        """``check_scoring_inputs`` plus DeepGEMM's own limits (no launch)."""
        check_scoring_inputs(q, weights, cache, seq_lens, block_table, max_model_len, layout_checked=layout_checked)
        self._require_gpu(q)
        _check_current_device("q", q)  # every other input is on q's device (checked)
        _, heads, dim = q.shape
        takes = DEEPGEMM_HEADS.get(self.arch_major, ())
        if heads not in takes:
            raise ValueError(f"q: DeepGEMM on sm_{self.arch_major}0 takes {takes} index heads, got {heads}; score "
                             f"this model with runtime.scoring.TorchScorer")
        if dim > MAX_HEAD_DIM or dim not in (64, 128):
            raise ValueError(f"q: head_dim {dim} must be 64 or 128 for DeepGEMM; score this model with "
                             f"runtime.scoring.TorchScorer")
        # DeepGEMM's host code asserts it (a padded row stride, e.g. a split of a fused projection, would stop
        # the process there instead of raising).
        if not weights.is_contiguous():
            raise ValueError(f"weights: DeepGEMM takes contiguous weights, got strides {weights.stride()}; "
                             f"pass weights.contiguous()")
        # DeepGEMM reads these by TMA, whose descriptors need 16-byte aligned addresses: off a boundary its
        # descriptor encode fails (CUDA_ERROR_INVALID_VALUE, a RuntimeError naming no argument) after the plan's
        # reset (gpu/jobs/deepgemm_alignment.py, deepgemm_alignment_s42.json; seq_lens and block_table run).
        for name, t in (("q", q), ("weights", weights), ("cache", cache)):
            if t.data_ptr() % 16:
                raise ValueError(f"{name}: DeepGEMM reads it by TMA, which needs a 16-byte aligned address, got "
                                 f"one {t.data_ptr() % 16} bytes past a boundary; pass {name}.clone()")
        # And these by 4-byte loads (the indexer refuses them so in its metadata; a direct call was not): off the
        # boundary, as over a storage sliced at a byte offset, the load faults, leaving the CUDA context unusable.
        for name, t in (("seq_lens", seq_lens), ("block_table", block_table)):
            require_element_aligned(name, t)

    @staticmethod
    def _require_gpu(q: torch.Tensor) -> None:
        """DeepGEMM checks no tensor's device: given host tensors, its kernels would read the host's addresses. Every
        other input is on q's device (checked)."""
        if not q.is_cuda:
            raise ValueError(f"q: on {q.device}, but DeepGEMM scores on the GPU; pass the step's tensors on the GPU, "
                             f"or score them on the CPU with runtime.scoring.TorchScorer")

    def check_schedule(self, schedule, device: torch.device, name: str = "schedule") -> None:
        """Raise ValueError naming ``name`` unless ``schedule`` is what ``schedule`` returns for this device: a
        contiguous int32 ``[num_sms + 1, 2]`` tensor on ``device``, with DeepGEMM's SM count now (one built before
        ``deep_gemm.set_num_sms`` changed it is refused). DeepGEMM's host code checks the shape, dtype and
        contiguity but not the device: its kernel would read another device's (or the host's) address."""
        want = (self.num_sms + 1, 2)
        if isinstance(schedule, torch.Tensor):
            # First: a nested tensor's shape, read below, raised torch's RuntimeError, naming nothing.
            require_dense(name, schedule)
        if (not isinstance(schedule, torch.Tensor) or schedule.shape != want or schedule.dtype != torch.int32
                or not schedule.is_contiguous() or schedule.device != device):
            got = (f"{schedule.dtype} {tuple(schedule.shape)} on {schedule.device}"
                   if isinstance(schedule, torch.Tensor) else type(schedule).__name__)
            # None is taken where the plan builds the schedule itself (metadata.schedule), not by logits
            or_none = ", or pass None" if name != "schedule" else ""
            raise ValueError(f"{name}: expected [{want[0]}, 2] from DeepGemmScorer.schedule (contiguous int32 on "
                             f"{device}), got {got}; build it with the scorer's schedule{or_none}")
        check_in_storage(name, schedule)
        if schedule.data_ptr() % SCHEDULE_ALIGN:
            raise ValueError(f"{name}: DeepGEMM reads it in {SCHEDULE_ALIGN}-byte pairs, so it must start at an "
                             f"{SCHEDULE_ALIGN}-byte aligned address, got one {schedule.data_ptr() % SCHEDULE_ALIGN} "
                             f"bytes past; pass {name}.clone(), or the scorer's schedule itself")

    def logits(self, q, weights, cache, seq_lens, block_table, schedule, max_model_len, *, checked=False):
        if not checked:
            self.check_inputs(q, weights, cache, seq_lens, block_table, max_model_len)
            self.check_schedule(schedule, q.device)
        rows, heads, dim = q.shape
        return self._dg.fp8_paged_mqa_logits(
            q.view(rows, 1, heads, dim), cache, weights, seq_lens.contiguous().view(-1, 1),
            block_table, schedule, max_model_len, False,
        )


def _check_current_device(name: str, t: torch.Tensor) -> None:
    """DeepGEMM launches on the current CUDA device with the tensors' addresses: a tensor on another GPU would be
    read (and the logits written) across devices, a fault where peer access is off. The indexer makes the state's
    device current; a direct call must too."""
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        raise ValueError(f"{name}: on {t.device}, but cuda:{torch.cuda.current_device()} is current, where DeepGEMM "
                         f"launches; call the scorer under torch.cuda.device({name}.device)")


def default_scorer(device: torch.device | str) -> Scorer:
    """DeepGEMM where it can run on ``device`` (its scorer built with ``device`` current), else the torch scorer."""
    device = torch.device(device)
    if device.type == "cuda" and deepgemm_status(device)[0]:
        # DeepGemmScorer() asks about the current device (its status, the arch whose head counts it checks): the
        # device asked about here, not the one that happens to be current.
        with torch.cuda.device(device):
            return DeepGemmScorer()
    return TorchScorer()


# ---------------------------------------------------------------------------
# Zero JIT at serving: fill DeepGEMM's cache ahead of time, and prove a step
# compiled nothing.
# ---------------------------------------------------------------------------

def jit_cache_dir() -> Path:
    """DeepGEMM's JIT cache directory: ``$DG_JIT_CACHE_DIR``, else ``~/.deep_gemm``."""
    return Path(os.environ.get("DG_JIT_CACHE_DIR") or Path.home() / ".deep_gemm")


def jit_cache_snapshot(directory: Path | None = None) -> dict[str, tuple[int, int]]:
    """Every file under the cache with its size and mtime; equal snapshots mean nothing compiled."""
    root = Path(directory) if directory is not None else jit_cache_dir()
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*")) if p.is_file()
    }


@dataclass(frozen=True)
class ServingShapes:
    """The shapes a deployment's decode steps score: rows up to ``max_rows`` per rank."""

    max_rows: int = 256
    heads: int = 64
    head_dim: int = 128
    max_model_len: int = 8192  # the logits kernel does not specialize on it

    def __post_init__(self):
        # warm_deepgemm's loop over row buckets would warm nothing for max_rows <= 0 and still report success.
        for name in ("max_rows", "heads", "head_dim", "max_model_len"):
            object.__setattr__(self, name, whole_count(f"ServingShapes.{name}", getattr(self, name), 1))
        if self.max_rows > MAX_SCHEDULE_ROWS:
            raise ValueError(f"ServingShapes.max_rows: {self.max_rows} exceeds the {MAX_SCHEDULE_ROWS} rows one "
                             f"DeepGEMM schedule takes; a rank scores at most that many rows a step")


def use_jit_cache_dir(cache_dir: str | os.PathLike | None) -> None:
    """``DG_JIT_CACHE_DIR`` for this process (None: left as it is). DeepGEMM reads it at its first import, so it
    takes effect only before that."""
    if cache_dir is not None:
        os.environ["DG_JIT_CACHE_DIR"] = str(cache_dir)


def warm_deepgemm(shapes: ServingShapes = ServingShapes(), cache_dir: str | os.PathLike | None = None) -> dict:
    """Fill DeepGEMM's JIT cache for ``shapes`` on this GPU: run the schedule kernel
    for every 32-row bucket up to ``max_rows`` (DeepGEMM specializes it per bucket and
    per SM count) and the logits kernel once (it specializes on heads, head_dim,
    page size, next_n and logits dtype, not on rows or context).

    Call this on the serving GPU model (the SM count is part of the key) before
    serving; ``build_kernels.py --warm-deepgemm`` runs it. ``cache_dir`` sets
    ``DG_JIT_CACHE_DIR`` for this process (it must be set before DeepGEMM's first
    import to take effect). Returns what was compiled and how long it took.
    """
    use_jit_cache_dir(cache_dir)
    ok, why = deepgemm_status()
    if not ok:
        raise RuntimeError(f"warm_deepgemm: {why}")
    before = jit_cache_snapshot()
    scorer = DeepGemmScorer()
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    # One page per row is enough: the kernels do not specialize on context.
    max_model_len = max(BLOCK_KV, shapes.max_model_len)
    pages = -(-max_model_len // BLOCK_KV)
    cache = torch.zeros(pages, BLOCK_KV, 1, shapes.head_dim + reference.INDEX_SCALE_BYTES, dtype=torch.uint8,
                        device=dev)
    buckets = list(range(METADATA_BATCH_ALIGN, shapes.max_rows + METADATA_BATCH_ALIGN, METADATA_BATCH_ALIGN))
    for rows in buckets:
        seq_lens = torch.full((rows,), BLOCK_KV, dtype=torch.int32, device=dev)
        schedule = scorer.schedule(seq_lens)
        q = torch.zeros(rows, shapes.heads, shapes.head_dim, device=dev).to(torch.float8_e4m3fn)
        weights = torch.zeros(rows, shapes.heads, dtype=torch.float32, device=dev)
        table = torch.arange(pages, dtype=torch.int32, device=dev).repeat(rows, 1)
        scorer.logits(q, weights, cache, seq_lens, table, schedule, max_model_len)
    torch.cuda.synchronize()
    after = jit_cache_snapshot()
    return {
        "cache_dir": str(jit_cache_dir()),
        "row_buckets": buckets,
        "heads": shapes.heads,
        "head_dim": shapes.head_dim,
        "num_sms": scorer.num_sms,
        "seconds": time.perf_counter() - t0,
        "files_before": len(before),
        "files_after": len(after),
        "new_files": sorted(set(after) - set(before)),
    }


def step_wall_ms(step) -> float:
    """Wall time of one call of ``step`` in milliseconds, the device synchronized before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def steps_after_pause_ms(step, *, repeats: int = 10, pause_s: float = 0.02) -> list[float]:
    """Wall times of ``repeats`` calls of ``step``, each after what precedes ``check_step_compiles_nothing``'s first
    step (a snapshot of DeepGEMM's cache) and ``pause_s`` seconds idle. A step after a pause costs more than one back
    to back (0.32-0.84 against 0.15-0.21 ms on an H100, first_step_s63_h100.json): a first step is read against
    these."""
    times = []
    for _ in range(whole_count("repeats", repeats, 1)):
        jit_cache_snapshot()
        time.sleep(pause_s)
        times.append(step_wall_ms(step))
    return times


def check_step_compiles_nothing(step, *, repeats: int = 10, first_step_factor: float = 5.0,
                                first_step_slack_ms: float = 250.0) -> dict:
    """Run ``step`` (a zero-argument callable issuing one decode step on the current
    CUDA stream) in a process whose DeepGEMM cache was warmed, and prove it
    compiled nothing: the JIT cache directory is unchanged and the first step's wall
    time is within ``first_step_factor`` x the steady state plus a slack for loading
    the cached cubins (milliseconds; a compile takes seconds). Raises RuntimeError otherwise; returns the timings
    (``steady_range_ms``: the repeats' fastest and slowest, the spread a first step is read against).
    """
    repeats = whole_count("repeats", repeats, 1)  # the steady state is their median
    before = jit_cache_snapshot()
    if not before:
        raise RuntimeError(f"check_step_compiles_nothing: DeepGEMM's cache {jit_cache_dir()} is empty; "
                           f"run build_kernels.py --warm-deepgemm first")
    first_ms = step_wall_ms(step)
    times = [step_wall_ms(step) for _ in range(repeats)]
    steady_ms = sorted(times)[len(times) // 2]
    after = jit_cache_snapshot()
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    result = {"first_ms": first_ms, "steady_ms": steady_ms, "steady_range_ms": (min(times), max(times)),
              "cache_files": len(after), "changed": changed}
    if changed:
        raise RuntimeError(f"a decode step compiled DeepGEMM kernels at serving time: {changed[:5]} changed in "
                           f"{jit_cache_dir()}; warm the cache for these shapes (build_kernels.py --warm-deepgemm)")
    if first_ms > first_step_factor * steady_ms + first_step_slack_ms:
        raise RuntimeError(f"first decode step took {first_ms:.1f} ms against {steady_ms:.2f} ms steady: "
                           f"something compiled or loaded at serving time")
    return result
