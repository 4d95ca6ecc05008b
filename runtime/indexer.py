"""The indexer's decode flow: row sharding, scoring, top-k selection, all-gather.

A decode step's indexer turns each row's index query into the ``k`` compressed
tokens that its sparse attention reads. ``decode_rows`` runs it in two parts:

- ``plan_decode_rows`` takes the gates, picks the rows this rank scores, resets
  the step's top-k rows and builds the slice's scoring schedule. It reads no
  index query and no key, so a caller can issue it while they are computed.
- ``finish_decode_rows`` scores the slice (DeepGEMM's paged MQA logits, or the
  torch scorer), selects the top-k (and, where the layer keeps them, the
  candidate blocks) with ``decode_topk`` from the AOT cache, and all-gathers
  every rank's int32 rows back into the full buffers.

Row sharding: the indexer is replicated across the tensor-parallel ranks. In a
uniform decode step of at least ``ROW_SHARD_MIN_ROWS`` rows, rank ``r`` scores
only rows ``[r n, (r + 1) n)`` (``n`` even, so the last slices may be short or
empty) and the gathers rebuild the rest. The gates read only host state every
rank shares (row and request counts, buffer sizes), so all ranks take the same
branch and issue the same collectives.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import operator
from dataclasses import dataclass, field, fields
from typing import Callable, Protocol

import torch

from . import reference, topk
from .arguments import (
    dtype_or_type,
    mark_written,
    require_dense,
    require_element_aligned,
    require_flag,
    whole_count,
    write_result,
)
from .contract import topk_pool_rows as topk_contract
from .errors import warn_at_caller
from .loader import capturing_on, env_flag, launch_on, memo_kernel
from .overlap import check_in_storage, first_overlap
from .scoring import Scorer, check_index_k_cache, default_scorer, no_heads

# Checking the metadata's device values costs a device sync a step, which a serving step cannot pay: a
# debugging run opts in. Read once, at import, to keep the plan's host time.
CHECK_METADATA_ENV = "SPARSE_DECODE_AOT_CHECK_METADATA"
CHECK_METADATA_VALUES = env_flag(CHECK_METADATA_ENV)

# Below this many rows a step is launch-bound: a slice saves no time and the
# gathers would add two collectives, so it stays replicated.
ROW_SHARD_MIN_ROWS = 16
CANDIDATE_BLOCK_SIZE = 8  # the only block size decode_topk's block mode scores
# Where every rank's gathered slice starts: torch's CUDA allocations are 512-byte aligned, so a slice of a
# buffer whose rows are a 256-byte multiple (the top-k and candidate buffers' 512+ int32 columns) needs no
# copy, and a custom gather's vector loads of any width line up.
GATHER_ALIGN_BYTES = 256

TopkBackend = str  # "auto": decode_topk (AOT kernel, exact fallback); "torch": torch.topk


# ---------------------------------------------------------------------------
# The project's own small types
# ---------------------------------------------------------------------------

_PLAN_SERIALS = itertools.count(1)  # plan_decode_rows numbers its plans from one counter (next() holds the GIL)


@dataclass
class IndexerState:
    """One indexer layer's buffers and constants.

    ``topk_indices`` is ``[max_rows, >= k]`` int32 (the first ``k`` columns are the
    step's top-k); ``candidate_blocks`` (optional) is ``[max_rows, blocks]`` int32,
    written in block mode; ``index_k_cache`` is DeepGEMM's fused paged FP8 layout
    ``uint8 [pages, 64, 1, head_dim + 4]`` (see ``reference.pack_index_k_cache``);
    ``max_model_len`` is the logits width in compressed tokens, at most
    ``runtime.topk.MAX_WIDTH``.
    """

    topk_indices: torch.Tensor
    k: int
    index_k_cache: torch.Tensor
    max_model_len: int
    candidate_blocks: torch.Tensor | None = None
    candidate_block_size: int = CANDIDATE_BLOCK_SIZE
    scorer: Scorer | None = None  # None: DeepGEMM where it runs, else torch
    topk_backend: TopkBackend = "auto"
    # The serial of the latest plan made on this state (0: none). A plan carries its serial, and the finish takes only
    # the state's latest: an earlier step's plan holds that step's rows and schedule, while the latest plan reset this
    # step's. Serials are unique in the process (_PLAN_SERIALS), so a plan made on another state that shares these
    # buffers (dataclasses.replace of this one, or a layer sharing the top-k buffer) never passes for this one's.
    _plans: int = field(default=0, init=False, repr=False, compare=False)
    # Whether the scorer's check_inputs takes layout_checked (the built-in ones do; the keyword is optional).
    _lean_scorer_checks: bool = field(default=False, init=False, repr=False, compare=False)
    # The scorer's logits dtype (its optional logits_dtype), read once: the kernels loaded at build are that dtype's.
    _logits_dtype: torch.dtype = field(default=torch.float32, init=False, repr=False, compare=False)
    _checked: bool = field(default=False, init=False, repr=False, compare=False)
    # Where the buffers are and how they are laid out when the state is checked: a plan refuses a buffer changed in
    # place since (set_, as_strided_), which no field assignment shows and which may no longer pass the checks.
    _layout: tuple = field(default=(), init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value) -> None:
        # The fields are checked once, here, and every step trusts them: one reassigned afterwards would bypass the
        # checks (a top-k buffer laid over the key cache, a k past the buffer's width or below 1).
        if self._checked and name != "_plans":
            # dataclasses.replace takes the fields the state is built with, no other name
            built_with = name in {f.name for f in fields(self) if f.init}
            fix = f", e.g. dataclasses.replace(state, {name}=...), which checks it" if built_with else ""
            raise AttributeError(f"{name}: an IndexerState's fields are fixed once checked; build another state{fix}")
        object.__setattr__(self, name, value)

    def __setstate__(self, state: dict) -> None:
        # A copy (copy.copy, copy.deepcopy, pickle) holds the checked fields; a deep copy's or a pickle's buffers are
        # new ones, kept apart and laid out as the original's. Where they are is recorded anew (the original's
        # addresses had every step refuse them as changed in place), and no plan of the original is the copy's latest.
        self.__dict__.update(state)
        object.__setattr__(self, "_layout", _buffer_layouts(self))
        object.__setattr__(self, "_plans", 0)

    def __post_init__(self) -> None:
        _check_int32_rows("topk_indices", self.topk_indices)
        self.k = whole_count("k", self.k, 1)
        if self.k > self.topk_indices.shape[1]:
            raise ValueError(f"k: {self.k} must be in [1, {self.topk_indices.shape[1]}] (topk_indices' width)")
        if self.candidate_blocks is not None:
            _check_int32_rows("candidate_blocks", self.candidate_blocks)
            if self.candidate_blocks.device != self.topk_indices.device:
                raise ValueError(f"candidate_blocks: on {self.candidate_blocks.device}, topk_indices on "
                                 f"{self.topk_indices.device}; allocate both on the device that serves the layer")
        # A whole count first: 8.0 == 8 passed the comparison and stayed a float in the fixed state.
        self.candidate_block_size = whole_count("candidate_block_size", self.candidate_block_size, 1)
        if self.candidate_block_size != CANDIDATE_BLOCK_SIZE:
            raise ValueError(f"candidate_block_size: only {CANDIDATE_BLOCK_SIZE} is supported")
        check_index_k_cache(self.index_k_cache, "index_k_cache")
        if self.index_k_cache.device != self.topk_indices.device:
            raise ValueError(f"index_k_cache: on {self.index_k_cache.device}, topk_indices on "
                             f"{self.topk_indices.device}; allocate both on the device that serves the layer")
        self._check_buffers_apart()
        self.max_model_len = whole_count("max_model_len", self.max_model_len, 1)
        # The logits are max_model_len wide and decode_topk (kernel and exact fallback) refuses wider ones, but
        # only ranks with rows select: refused here, no rank raises while an empty-slice rank waits in the
        # all-gather. torch.topk (topk_backend="torch") has no such limit.
        if self.topk_backend == "auto" and self.max_model_len > topk.MAX_WIDTH:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the top-k selection's "
                             f"{topk.MAX_WIDTH} columns (runtime.topk.MAX_WIDTH); serve a shorter context")
        if self.topk_backend not in ("auto", "torch"):
            raise ValueError(f"topk_backend: expected 'auto' or 'torch', got {self.topk_backend!r}")
        if self.scorer is None:
            self.scorer = default_scorer(self.topk_indices.device)  # built with that device current
        if isinstance(self.scorer, type):
            # A class has the interface's methods as plain functions: every step would bind the query as self and
            # raise Python's TypeError about a missing argument.
            name = self.scorer.__name__
            raise TypeError(f"scorer: got the class {name}; pass an instance, {name}()")
        missing = [m for m in ("schedule", "check_inputs", "logits") if not callable(getattr(self.scorer, m, None))]
        if missing:
            raise TypeError(f"scorer: {type(self.scorer).__name__} lacks {', '.join(missing)}; implement "
                            f"runtime.scoring.Scorer")
        # The step calls logits(..., checked=True): a scorer without the keyword would raise only on ranks with
        # rows, while an empty-slice rank waits in the all-gather. Asked once here, not per step.
        if not _takes_keyword(self.scorer.logits, "checked"):
            raise TypeError(f"scorer: {type(self.scorer).__name__}.logits takes no keyword 'checked'; implement "
                            f"runtime.scoring.Scorer (logits(..., *, checked=False))")
        # An optional keyword: a signature that cannot be read (a compiled method) is not given it.
        self._lean_scorer_checks = _takes_keyword(self.scorer.check_inputs, "layout_checked", unreadable=False)
        self._logits_dtype = _declared_logits_dtype(self.scorer)
        if self.topk_backend == "auto" and self.topk_indices.is_cuda:  # last: a state refused above says nothing
            _warn_widths_the_aot_topk_does_not_take(self)
            _load_the_aot_topk(self)
        self._layout = _buffer_layouts(self)
        self._checked = True

    @property
    def max_rows(self) -> int:
        return self.topk_indices.shape[0]

    def _check_buffers_apart(self) -> None:
        """The step writes the top-k and candidate buffers while it reads the key cache: none may share memory."""
        written = (("topk_indices", self.topk_indices), ("candidate_blocks", self.candidate_blocks))
        for i, (name, buf) in enumerate(written):
            read_or_written = written[i + 1:] + (("index_k_cache", self.index_k_cache),)
            other = None if buf is None else first_overlap(buf, read_or_written)
            if other is not None:
                raise ValueError(f"{name} overlaps {other}'s memory: the step writes {name} while it reads or writes "
                                 f"{other}; give each buffer memory of its own")


@dataclass
class DecodeMetadata:
    """The step's decode rows: one row per query token.

    ``seq_lens`` ``[>= num_tokens]`` int32: each row's valid compressed tokens;
    ``block_table`` ``[>= num_tokens, pages]`` int32: each row's pages of the index-key
    cache (a request's rows repeat its table); ``num_tokens``: the rows the step scores
    (a CUDA graph's padded rows past them are reset, not scored: ``padded_tokens``
    of ``plan_decode_rows``); ``num_requests``: its requests (rows a whole
    multiple of them may be sharded, ``row_shard_rows``); ``max_seq_len``: the
    largest of the rows' ``seq_lens``, in compressed tokens like them (at most the
    state's ``max_model_len``); ``schedule``: the scorer's schedule of all the rows,
    if the caller built one; ``num_prefills`` > 0 sends the step down the caller's
    stock path.

    The device values are trusted, as the seed trusts its metadata: checking them
    would cost a device sync a step. For each row ``r < num_tokens`` the caller
    guarantees ``0 <= seq_lens[r] <= max_model_len`` (DeepGEMM writes logits for the
    positions below it into a ``[rows, max_model_len]`` buffer) and that the ids of
    the row's first ``ceil(seq_lens[r] / 64)`` pages in ``block_table`` index the
    index-key cache's pages (DeepGEMM reads them). Breaking it reads and writes
    outside those buffers. A schedule is built from ``seq_lens``' values: the caller's
    ``schedule`` must be the scorer's ``schedule(seq_lens)`` of the step's values (rebuilt
    every step after they are written; in a CUDA graph, inside the graph), and those
    values may not change between ``plan_decode_rows`` (which builds a slice's schedule
    from them) and ``finish_decode_rows``: DeepGEMM's scoring under a schedule of longer
    rows than it finds never ends (its SMs stop only at the scheduled positions).
    ``check_decode_metadata_values`` checks all of it, and ``plan_decode_rows`` and
    ``finish_decode_rows`` run that check where ``SPARSE_DECODE_AOT_CHECK_METADATA``
    is set (to anything but "" or "0") when the process imports this module.
    """

    seq_lens: torch.Tensor
    block_table: torch.Tensor
    num_requests: int
    num_tokens: int
    max_seq_len: int
    schedule: torch.Tensor | None = None
    num_prefills: int = 0

    def __setattr__(self, name: str, value) -> None:
        # Counts often arrive as numpy or tensor-derived integers: held as Python ints >= 0 whether passed to the
        # constructor (its field assignments come here) or assigned to a metadata object kept across steps, which
        # every step then trusts. Checked when built alone, a count reassigned to None or a string met the step's
        # comparisons (Python's TypeError, naming no field), a float num_requests was refused as row_shard_rows'
        # 'num_requests', and num_prefills=True or 0.5 took the stock path without a word.
        if name in _METADATA_COUNTS and (type(value) is not int or value < 0):
            value = whole_count(_METADATA_COUNTS[name], value, 0)
        # Not self.__dict__[name] = value, ~0.06 us a field faster to build: reading __dict__ moves the object's
        # attributes from CPython's inline values into a dict, and each field read then costs ~20 ns instead of ~5
        # (3.11), 26 reads a decode_rows step and 42 a plan and finish, in each layer that the metadata serves.
        _set_field(self, name, value)


# DecodeMetadata's counts, and the names their refusals give them.
_METADATA_COUNTS = {name: f"metadata.{name}" for name in ("num_requests", "num_tokens", "max_seq_len", "num_prefills")}
_set_field = object.__setattr__  # a global: ~0.03 us a field less than object.__setattr__'s two lookups


class TPGroup(Protocol):
    """A tensor-parallel group: this rank, the world size, and a dim-0 all-gather of
    equal-sized tensors in rank order."""

    rank: int
    world_size: int

    def all_gather(self, local: torch.Tensor) -> torch.Tensor: ...


class RowGather(Protocol):
    """A custom all-gather (e.g. a one-shot kernel) that takes some tensors.

    Every rank asks ``accepts`` and the ranks must agree: one taking the custom gather
    while another takes ``torch.distributed`` deadlocks. So ``accepts`` may depend only
    on what is equal on every rank: the shape, dtype, device, contiguity, and that the
    start is ``GATHER_ALIGN_BYTES``-aligned. ``local`` is always contiguous and aligned
    so (the flow copies a view that is not), but its address differs between ranks, so
    a finer alignment of it is not such a property. It answers a bool (a numpy bool is taken; a string or a
    tensor is refused, naming ``all_gather``)."""

    def accepts(self, local: torch.Tensor) -> bool: ...

    def __call__(self, local: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class SingleRank:
    """The group of one rank: nothing to gather."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        # Filled with a caller's own rank and world size, it sharded the step, reset the buffers and scored its
        # slice, then failed in the gather, whose fix (return every rank's slice) it cannot follow.
        if (self.rank, self.world_size) != (0, 1):
            name = "world_size" if self.world_size != 1 else "rank"
            raise ValueError(f"{name}: SingleRank is the group of one rank (rank 0 of 1), got rank {self.rank} of "
                             f"{self.world_size}; pass SingleRank() for one rank, runtime.indexer.DistGroup(group) for "
                             f"a group of several")

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        return local


class DistGroup:
    """A ``torch.distributed`` process group (NCCL on GPUs, gloo on CPUs)."""

    def __init__(self, group=None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("DistGroup: torch.distributed is not initialized")
        self._dist = dist
        # Not a group (a list of its ranks, a framework's object holding one): torch's rank lookup raised its own
        # error ("unhashable type: 'list'", "Group ... is not registered"), naming no argument. new_group gives a
        # process outside the group NON_GROUP_MEMBER, refused below naming the fix for that.
        if not (group is None or group is dist.GroupMember.NON_GROUP_MEMBER or isinstance(group, dist.ProcessGroup)):
            raise TypeError(f"group: expected a torch.distributed ProcessGroup or None, got {type(group).__name__}; "
                            f"pass dist.new_group(ranks) (or the ProcessGroup a framework's group object holds)")
        self.group = group
        self.rank = dist.get_rank(group)
        if self.rank < 0:  # torch's answer for a process outside the group (its world size would raise, naming none)
            raise ValueError(f"group: this process (global rank {dist.get_rank()}) is not a member of the group; make "
                             f"a DistGroup only on the group's ranks (others run the step with their own group)")
        self.world_size = dist.get_world_size(group)
        # "nccl", or a backend per device type ("cpu:gloo,cuda:nccl", what init_process_group() without a backend
        # makes): CUDA tensors gather through NCCL there too, straight into one tensor.
        self._read_backend(str(dist.get_backend(group)))

    def _read_backend(self, backend: str) -> None:
        """How this group's rows travel: straight into one tensor through NCCL, and which device types it gathers."""
        self._nccl = "nccl" in backend
        self._device_types = _device_types_served(backend)

    def check_device(self, device: torch.device) -> None:
        """Refuse (ValueError naming ``tp``) rows on a device type this group's backend does not gather, e.g. CPU
        buffers on an NCCL group: the gather would fail inside torch.distributed after the step was scored."""
        if self._device_types is not None and device.type not in self._device_types:
            raise ValueError(f"tp: its backend gathers {sorted(self._device_types)} tensors, the state's rows are on "
                             f"{device}; give the state buffers on one of those, or a group of a backend for "
                             f"{device.type} (gloo for cpu)")

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        local = local.contiguous()
        if self._nccl and local.is_cuda:
            out = local.new_empty((self.world_size * local.shape[0], *local.shape[1:]))
            self._dist.all_gather_into_tensor(out, local, group=self.group)
            return out
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        self._dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=0)


def _device_types_served(backend: str) -> set | None:
    """The device types a ``torch.distributed`` backend string gathers (None: not known here, not checked): NCCL
    CUDA only, gloo CPU and CUDA; "cpu:gloo,cuda:nccl" names one backend a device type."""
    if ":" in backend:
        return {part.split(":", 1)[0] for part in backend.split(",") if ":" in part}
    return {"nccl": {"cuda"}, "gloo": {"cpu", "cuda"}}.get(backend)


@dataclass(frozen=True)
class DecodeRowsPlan:
    """The rows this rank scores in ``finish_decode_rows``, and their schedule (fixed: the finish writes the rows it
    names, and checks them against the metadata and group it is given: ``_check_plan_slice``)."""

    metadata: DecodeMetadata
    max_seq_len: int
    num_rows: int
    shard: int | None  # rows of each rank's slice; None: replicated
    start: int
    end: int
    schedule: torch.Tensor | None  # the scorer's schedule of rows [start, end)
    rank: int = 0  # the TP group the slice was planned for: finish checks it gets the same one
    world_size: int = 1
    buffer_rows: int = 0  # the planned state's top-k rows: finish checks it gets the same state's buffers
    buffers: tuple = ()  # where the planned state's buffers are (_buffers_of): finish checks it gets those
    serial: int = 0  # unique in the process (_PLAN_SERIALS): finish takes only its state's latest plan
    metadata_view: tuple = ()  # what the plan read of the metadata (_metadata_view): finish checks it is unchanged
    # With CHECK_METADATA_VALUES: seq_lens' values as the plan read them, which finish_decode_rows compares on every
    # rank (None otherwise).
    seq_lens_at_plan: torch.Tensor | None = None
    # The scorer's SM count when the plan was made (None: it has none), on every rank, with rows or not: the finish
    # compares it with the count now on every rank alike (a rank with an empty slice holds no schedule to compare).
    num_sms: int | None = None
    # A split-flow plan holding a schedule, made outside a CUDA graph capture: a finish captured into a graph with it
    # is refused (_check_capture_of_finish). False inside a capture, in decode_rows, and without a schedule.
    schedule_outside_capture: bool = False


# ---------------------------------------------------------------------------
# Row sharding
# ---------------------------------------------------------------------------

def row_shard_rows(num_rows: int, num_requests: int, world_size: int) -> int | None:
    """Rows each rank's slice spans, or None when the step stays replicated.

    Replicated: one rank; no requests; rows not a whole multiple of the requests
    (not a uniform decode step: some capture and profiling runs); fewer than
    ``ROW_SHARD_MIN_ROWS`` rows. Otherwise the ceiling share rounded up to an even
    count, so every slice starts on an even row (DeepGEMM's sm_100 varlen mode reads
    per-row int32 ``indices`` 8 bytes at a time; one rule for both archs); the last
    ranks' slices may then be short or empty. Rows are
    independent, so a slice may split a request's rows.
    """
    num_rows = whole_count("num_rows", num_rows, 0)
    num_requests = whole_count("num_requests", num_requests, 0)
    world_size = whole_count("world_size", world_size, 1)
    if world_size < 2 or not num_requests or num_rows % num_requests:
        return None
    if num_rows < ROW_SHARD_MIN_ROWS:
        return None
    rows = -(-num_rows // world_size)
    return rows + rows % 2


def row_shard_bounds(num_rows: int, num_requests: int, world_size: int, rank: int) -> tuple[int, int] | None:
    """Rows ``[start, end)`` that ``rank`` scores (empty for a rank past the last row),
    or None when the step stays replicated."""
    rows = row_shard_rows(num_rows, num_requests, world_size)
    rank = whole_count("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}) (world_size {world_size}), got {rank}; pass "
                         f"this process's rank within the tensor-parallel group")
    if rows is None:
        return None
    num_rows = operator.index(num_rows)  # checked by row_shard_rows; a Python int keeps the bounds Python ints
    start = min(rank * rows, num_rows)
    return start, min(start + rows, num_rows)


# ---------------------------------------------------------------------------
# Plan and finish
# ---------------------------------------------------------------------------

def _on_device(device: torch.device):
    """``device`` made current for a block (nothing on a CPU state): DeepGEMM's kernels and torch's fills and
    copies go to the current device's stream, so a state on cuda:1 while cuda:0 is current must switch first,
    as the host ops' launch_on does."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _check_state(state) -> None:
    """A TypeError naming ``state`` unless it is an IndexerState (the seed's flow passes its layer object there)."""
    if not isinstance(state, IndexerState):
        raise TypeError(f"state: expected a runtime.indexer.IndexerState, got {type(state).__name__}; build the "
                        f"layer's IndexerState (top-k buffer, k, index-key cache, max_model_len) once and pass it "
                        f"every step")


def _on_state_device(step):
    """``step(state, ...)`` run with the state's GPU current."""
    @functools.wraps(step)
    def on_state_device(state, *args, **kwargs):
        _check_state(state)
        with _on_device(state.topk_indices.device):
            return step(state, *args, **kwargs)
    return on_state_device


@_on_state_device
def plan_decode_rows(
    state: IndexerState, metadata: DecodeMetadata | None, tp: TPGroup, *, padded_tokens: int | None = None
) -> DecodeRowsPlan | None:
    """The first part of ``decode_rows``: None when the caller's stock path should
    run (nothing issued); else reset the step's top-k rows to -1 and build the
    schedule of this rank's slice when it is not the whole step. Reads no query or key.

    Unlike the seed's plan, which returns None for a step that stays replicated (one rank, a small step, rows not a
    multiple of requests, buffers that cannot hold every rank's slice) so that its stock indexer runs, this flow is
    the indexer: such a step gets a plan whose slice is the whole step, and None is kept for what the flow does not
    serve (no metadata, prefills, no tokens).

    ``padded_tokens``: the step's tokens including a CUDA graph's padding (default
    ``metadata.num_tokens``), in ``[metadata.num_tokens, state.max_rows]``. The reset
    spans them all, so padded rows hold -1, not an earlier step's indices; the padded
    rows of ``candidate_blocks`` (those it has) are reset too."""
    if torch.compiler.is_compiling():  # traced by torch.compile: run eagerly, a graph break (_decode_rows_eagerly)
        return _plan_decode_rows_eagerly(state, metadata, tp, padded_tokens)
    return _plan_decode_rows_body(state, metadata, tp, padded_tokens)


def _plan_decode_rows_body(state, metadata, tp, padded_tokens):
    """plan_decode_rows' body (what its eager wrapper runs: see _disable)."""
    _check_metadata_type(metadata)
    return _plan(state, metadata, tp, padded_tokens, by_decode_rows=False)


def _check_metadata_type(metadata) -> None:
    """A TypeError naming ``metadata`` unless it is a DecodeMetadata or None: the seed's plan takes the step's token
    count in its place, and its metadata is another class; either met an AttributeError naming one of its fields."""
    if metadata is not None and not isinstance(metadata, DecodeMetadata):
        raise TypeError(f"metadata: expected a runtime.indexer.DecodeMetadata or None, got {type(metadata).__name__}; "
                        f"build a DecodeMetadata of the step's decode rows (None runs the caller's stock path)")


def _plan(state: IndexerState, metadata: DecodeMetadata | None, tp: TPGroup, padded_tokens: int | None, *,
          by_decode_rows: bool) -> DecodeRowsPlan | None:
    """plan_decode_rows on the state's device; ``by_decode_rows``: decode_rows ran ``_check_metadata`` on this
    metadata before the plan and finishes the plan at once, so neither the metadata check nor the record of what
    ``finish_decode_rows`` compares (where the buffers are, the metadata's fields) is made twice or for nothing:
    host time on every step."""
    if metadata is None or metadata.num_prefills > 0:
        _no_plan(state)
        return None
    if metadata.num_tokens == 0:
        _no_plan(state)
        return None
    num_rows = metadata.num_tokens
    if CHECK_METADATA_VALUES:
        check_decode_metadata_values(state, metadata)
    elif not by_decode_rows:
        _check_metadata(state, metadata)
    reset_rows = num_rows if padded_tokens is None else whole_count("padded_tokens", padded_tokens, 0)
    if not num_rows <= reset_rows <= state.max_rows:
        raise ValueError(f"padded_tokens: {reset_rows} must be in [{num_rows}, {state.max_rows}] (metadata.num_tokens "
                         f"to topk_indices' rows); pass the step's token count with its padding (decode_rows "
                         f"passes q's rows) and size the buffer for it")
    rank, world_size = _rank_and_world(tp)
    _check_metadata_apart(state, metadata)

    shard, start, end = _slice_of(state, num_rows, metadata.num_requests, rank, world_size)
    most = getattr(state.scorer, "max_schedule_rows", None)
    if shard is not None and isinstance(most, int) and shard > most:
        # The ranks' slices differ in length (the last may be short or empty): left to the scorer's schedule, the
        # ranks with a full slice would refuse while the others planned and waited in the all-gather.
        # Slices span an even count of rows (row_shard_rows): an odd cap takes one row less a rank.
        raise ValueError(f"metadata.num_tokens: {num_rows} rows make slices of {shard} rows over {world_size} ranks; "
                         f"one {type(state.scorer).__name__} schedule takes at most {most} rows: score the rows in "
                         f"steps of at most {max(most - most % 2, 2) * world_size}, or shard them over more ranks")
    if shard is not None:
        _check_tp_gather(tp, state.topk_indices.device)  # the finish gathers through it: refused before the reset
    # A rank with an empty slice scores nothing: it keeps no schedule, which the finish would check (against the
    # scorer's SM count) on that rank alone while the others wait in the all-gather.
    schedule = metadata.schedule if end > start else None
    # The caller's schedule spans all of seq_lens (which may hold more rows than the
    # step's): reuse it only where the slice is exactly those rows.
    own_schedule = end > start and (end - start < metadata.seq_lens.shape[0] or schedule is None)
    check_schedule = getattr(state.scorer, "check_schedule", None)
    if end > start and not own_schedule and callable(check_schedule):
        # The scorer reads it, and its logits(checked=True) does not check it again.
        check_schedule(schedule, state.topk_indices.device, "metadata.schedule")
        if isinstance(schedule, torch.Tensor) and schedule.is_contiguous():  # DeepGemmScorer's is (checked)
            # Read by the scoring after the reset below, and by the step's later layers after this one's selection.
            _check_read_apart(state, (("metadata.schedule", schedule),), "give the schedule memory of its own")

    _check_buffers_as_built(state)
    # What finish_decode_rows compares against the state and metadata it is given (decode_rows finishes its plan at
    # once, with the same ones), read before the reset: a schedule it cannot read is refused with the rows as they were.
    buffers, view = ((), ()) if by_decode_rows else (_buffers_of(state), _metadata_view(metadata))
    if own_schedule:
        # Before the reset: a schedule the scorer refuses (too many rows for DeepGEMM's) leaves the buffers as
        # they were.
        schedule = state.scorer.schedule(_rows(metadata.seq_lens, start, end))
    state._plans = next(_PLAN_SERIALS)
    _rows(state.topk_indices, 0, reset_rows).fill_(-1)
    if state.candidate_blocks is not None and reset_rows > num_rows:
        # The finish writes the step's candidate rows, not a CUDA graph's padded ones: reset, they hold -1 as the
        # padded top-k rows do, not an earlier, larger step's blocks (a slice past the buffer's rows is empty).
        state.candidate_blocks[num_rows:reset_rows].fill_(-1)
    seq_lens_at_plan = metadata.seq_lens.clone() if CHECK_METADATA_VALUES and not by_decode_rows else None
    sms = getattr(state.scorer, "num_sms", None)
    # Asked only where a separate finish will read a schedule, or where the step is sharded (one query of the stream a
    # plan, ~0.3 us): a rank whose slice is empty holds no schedule, and would go on into the all-gather while the
    # ranks with rows refused the captured finish.
    outside = (not by_decode_rows and (schedule is not None or shard is not None)
               and not _capturing(state.topk_indices.device))
    return DecodeRowsPlan(metadata, metadata.max_seq_len, num_rows, shard, start, end, schedule, rank,
                          world_size, state.topk_indices.shape[0], buffers, state._plans, view, seq_lens_at_plan,
                          sms if isinstance(sms, int) else None, outside)


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` (the state's) is being captured into a CUDA graph. No CPU stream is."""
    return device.type == "cuda" and capturing_on(device)


def _check_capture_of_finish(state: IndexerState, plan: DecodeRowsPlan) -> None:
    """Refuse a finish captured into a CUDA graph whose plan was made outside the capture and holds a schedule: the
    graph would score every replay under that tensor, built from seq_lens' values when the plan ran (and freed, its
    memory reused, once the plan is dropped), so a replay whose rows are longer never ends in DeepGEMM's scoring; and
    the plan's reset of the rows would not be in the graph either. A sharded step's is refused on every rank alike,
    an empty slice's too (it holds no schedule, but the graph would lack its reset and its ranks' refusals)."""
    if plan.schedule_outside_capture and _capturing(state.topk_indices.device):
        raise ValueError("plan: made outside the CUDA graph capture that finish_decode_rows is captured in, with a "
                         "schedule built from seq_lens' values at the plan (or for a sharded step, refused on every "
                         "rank alike): every replay would score under it (and without the plan's reset); call "
                         "plan_decode_rows inside the same capture (or capture decode_rows), after the step's "
                         "seq_lens are written")


def _slice_of(state: IndexerState, num_rows: int, num_requests: int, rank: int, world_size: int) -> tuple:
    """(shard, start, end): this rank's rows of the step, sharded where ``row_shard_rows`` says so and the buffers
    hold every slice, else all of them (shard None)."""
    shard = row_shard_rows(num_rows, num_requests, world_size)
    if shard is not None and any(
        buf is not None and buf.shape[0] < world_size * shard
        for buf in (state.topk_indices, state.candidate_blocks)
    ):
        shard = None  # the slices' rows past the step's do not fit the buffers
    bounds = None if shard is None else row_shard_bounds(num_rows, num_requests, world_size, rank)
    return (shard, *(bounds or (0, num_rows)))


def _check_plan_slice(state: IndexerState, plan: DecodeRowsPlan, rank: int, world_size: int) -> None:
    """The finish scores and writes the plan's rows: a plan whose rows were replaced since (dataclasses.replace keeps
    its serial) would write rows the plan did not reset, past the step's, or gather slices of another size."""
    md = plan.metadata
    expected = (md.num_tokens, *_slice_of(state, md.num_tokens, md.num_requests, rank, world_size))
    if (plan.num_rows, plan.shard, plan.start, plan.end) != expected:
        raise ValueError(f"plan: its rows (num_rows, shard, start, end) = "
                         f"{(plan.num_rows, plan.shard, plan.start, plan.end)} are not what plan_decode_rows gives "
                         f"for its metadata and this group, {expected}; pass the plan_decode_rows result itself")


def _no_plan(state: IndexerState) -> None:
    """Record a step the flow does not serve (the caller's stock path runs; the plan is None) as the state's latest
    plan, so that the finish refuses an earlier step's plan as any superseded one (the rows may hold what the stock
    path wrote since). Issues nothing."""
    state._plans = next(_PLAN_SERIALS)


def _metadata_view(md: DecodeMetadata) -> tuple:
    """The metadata fields a plan depends on, as (name, value) pairs: the counts, and where each tensor is and how
    it is laid out. The plan chose its rows, slices and reset from them, and the finish scores through the same
    object; fields replaced in between (a smaller num_tokens, a shorter seq_lens) would have the finish read rows
    the plan never checked. Device values are not compared: they may be written between plan and finish."""
    def where(name, t):
        if not isinstance(t, torch.Tensor):
            return type(t).__name__
        try:
            return t.data_ptr(), tuple(t.shape), t.stride(), t.device, t.dtype
        except RuntimeError:  # sparse, nested or without memory (a schedule the torch scorer never reads): named
            require_dense(f"metadata.{name}", t)
            raise
    return (("num_tokens", md.num_tokens), ("num_requests", md.num_requests), ("max_seq_len", md.max_seq_len),
            ("num_prefills", md.num_prefills), ("seq_lens", where("seq_lens", md.seq_lens)),
            ("block_table", where("block_table", md.block_table)), ("schedule", where("schedule", md.schedule)))


def _check_metadata_unchanged(plan: DecodeRowsPlan) -> None:
    if not plan.metadata_view:
        return
    for (name, planned), (_, now) in zip(plan.metadata_view, _metadata_view(plan.metadata)):
        if planned != now:
            raise ValueError(f"metadata.{name}: changed since plan_decode_rows (the plan chose its rows, slices and "
                             f"schedule from the earlier one); leave the metadata as it is between plan and finish, "
                             f"or plan again")


def _buffer_layouts(state: IndexerState) -> tuple:
    """(address, shape, strides) of the top-k buffer, then of the candidate buffer (None where there is none)."""
    t, c = state.topk_indices, state.candidate_blocks
    return (t.data_ptr(), t.shape, t.stride()), None if c is None else (c.data_ptr(), c.shape, c.stride())


def _check_buffers_as_built(state: IndexerState) -> None:
    """The plan's and the finish's check of the buffers they write, before any write. They were checked when the state
    was built; a storage shrunk since (FSDP-style) would take the writes into freed memory (torch's slice assignment
    does not check it), one changed in place (as_strided_ to overlapping rows, set_) would take overlapping rows."""
    check_in_storage("topk_indices", state.topk_indices)
    if state.candidate_blocks is not None:
        check_in_storage("candidate_blocks", state.candidate_blocks)
    _check_buffers_unchanged(state)
    _check_buffers_writable_here(state)


def _check_buffers_unchanged(state: IndexerState) -> None:
    """A plan's check, once a step on every layer: one comparison where nothing changed (~1 us of host time)."""
    now = _buffer_layouts(state)
    if now == state._layout:
        return
    for name, was, is_ in zip(("topk_indices", "candidate_blocks"), state._layout, now, strict=True):
        if was != is_:
            raise ValueError(f"{name}: changed in place since the state was built (now at {is_[0]:#x}, "
                             f"{tuple(is_[1])} with strides {is_[2]}; it was {was[0]:#x}, {tuple(was[1])}, {was[2]}), "
                             f"past the checks the state made of it; build another state for it "
                             f"(dataclasses.replace(state, {name}=...))")


def _check_buffers_writable_here(state: IndexerState) -> None:
    """Buffers made under torch.inference_mode() take no in-place write outside it: refused before the step writes
    any (torch would raise at the first write, which for the candidate buffer comes after the scoring and the
    selection, with the top-k rows half written)."""
    if torch.is_inference_mode_enabled():
        return
    for name in ("topk_indices", "candidate_blocks"):
        buf = getattr(state, name)
        if buf is not None and buf.is_inference():
            raise ValueError(f"{name}: made under torch.inference_mode(), which refuses writes to it outside that "
                             f"mode; step the indexer inside torch.inference_mode() too, or allocate the buffer "
                             f"outside it")


def _buffers_of(state: IndexerState) -> tuple:
    """Where the state's buffers are as the plan saw them (the top-k rows are ``buffer_rows``; the candidate
    buffer's rows too): the plan's reset, shard choice (which asks whether the buffers hold every slice) and
    schedule are for those."""
    cand = state.candidate_blocks
    return state.topk_indices.data_ptr(), None if cand is None else (cand.data_ptr(), cand.shape[0])


@_on_state_device
def finish_decode_rows(
    state: IndexerState,
    q: torch.Tensor,
    weights: torch.Tensor,
    plan: DecodeRowsPlan | None,
    tp: TPGroup,
    all_gather: RowGather | None = None,
) -> torch.Tensor | None:
    """The rest of ``decode_rows`` once the index query ``q`` (FP8 ``[rows, heads,
    head_dim]``) and ``weights`` (FP32 ``[rows, heads]``) are ready: score and select
    the planned rows, then gather every rank's slice. Returns the top-k buffer
    (None, doing nothing, when ``plan`` is None). ``plan`` must be the state's latest
    ``plan_decode_rows`` result (an earlier one is refused: it holds another step's rows),
    its metadata's fields as the plan saw them (replaced counts or tensors are refused;
    the block table's device values may change, ``seq_lens``' may not: the plan built the
    schedule from them), and ``q`` and ``weights`` may not share
    memory with the state's buffers, which the plan reset before they are read. Captured
    into a CUDA graph, the finish takes a plan captured with it: one made outside the
    capture that holds a schedule is refused (every replay would score under it)."""
    if torch.compiler.is_compiling():  # traced by torch.compile: run eagerly, a graph break (_decode_rows_eagerly)
        return _finish_decode_rows_eagerly(state, q, weights, plan, tp, all_gather)
    return _finish_decode_rows_body(state, q, weights, plan, tp, all_gather)


def _finish_decode_rows_body(state, q, weights, plan, tp, all_gather):
    """finish_decode_rows' body (what its eager wrapper runs: see _disable)."""
    return _finish(state, q, weights, plan, tp, all_gather, by_decode_rows=False)


def _finish(state, q, weights, plan, tp, all_gather, *, by_decode_rows: bool, accepted: tuple | None = None):
    """finish_decode_rows; ``by_decode_rows``: decode_rows made ``plan`` a moment ago from these arguments, having
    checked q, weights and all_gather before it, so none of the finish's checks could fail: not run again.
    ``accepted``: all_gather's answers for the two buffers, asked by decode_rows before the plan (else asked here)."""
    if plan is None:
        return None
    if not by_decode_rows:
        _check_finish(state, q, weights, plan, tp, all_gather)
        if CHECK_METADATA_VALUES:  # the device values may have been written since the plan checked them
            _check_seq_lens_unchanged(plan)
            _check_metadata_ranges(state, plan.metadata)
    if plan.end > plan.start:
        _decode_rows(state, q, weights, plan)
    if plan.shard is not None:
        taken_topk, taken_candidates = accepted or (None, None)
        _all_gather_rows(_topk_columns(state), plan.shard, plan.num_rows, tp, all_gather, taken_topk)
        if state.candidate_blocks is not None:
            _all_gather_rows(state.candidate_blocks, plan.shard, plan.num_rows, tp, all_gather, taken_candidates)
    return state.topk_indices


def _check_schedule_for_sms_now(state: IndexerState, plan: DecodeRowsPlan) -> None:
    """DeepGEMM's logits launch its SM count's CTAs and assert the schedule holds as many rows plus one: a
    ``deep_gemm.set_num_sms`` between plan and finish would stop the step there, after the plan's reset and only on
    the ranks with rows."""
    sms = getattr(state.scorer, "num_sms", None)
    if isinstance(plan.schedule, torch.Tensor) and isinstance(sms, int) and plan.schedule.shape[0] != sms + 1:
        raise ValueError(f"plan: its schedule is for {plan.schedule.shape[0] - 1} SMs, the scorer now launches {sms} "
                         f"(deep_gemm.set_num_sms since the plan); plan the step again")
    if isinstance(sms, int) and isinstance(plan.num_sms, int) and plan.num_sms != sms:
        # Every rank, an empty slice's included: refused on the ranks with a schedule alone, it left an empty-slice
        # rank waiting in the all-gather.
        raise ValueError(f"plan: made while the scorer launched {plan.num_sms} SMs, it now launches {sms} "
                         f"(deep_gemm.set_num_sms since the plan); plan the step again")


def _check_finish(state, q, weights, plan, tp, all_gather) -> None:
    """What finish_decode_rows refuses before it scores: a plan of another group or state, or not the state's
    latest; a plan with a schedule made outside the CUDA graph capture the finish is in; metadata changed since the
    plan; a sharded step's gathers; the query."""
    if not isinstance(plan, DecodeRowsPlan):
        raise TypeError(f"plan: expected the DecodeRowsPlan (or None) that plan_decode_rows returned, got "
                        f"{type(plan).__name__}; pass its result")
    rank, world_size = _rank_and_world(tp)
    if (plan.rank, plan.world_size) != (rank, world_size):
        raise ValueError(f"tp: rank {rank} of {world_size}, but the plan is for rank {plan.rank} of "
                         f"{plan.world_size}; pass the plan_decode_rows result of this rank's group")
    if plan.buffer_rows != state.topk_indices.shape[0]:
        raise ValueError(f"plan: made for a state of {plan.buffer_rows} top-k rows, this one has "
                         f"{state.topk_indices.shape[0]}; pass the plan_decode_rows result of this state")
    if plan.buffers and plan.buffers != _buffers_of(state):
        raise ValueError("plan: made for another state's top-k or candidate buffers (it reset those rows and chose "
                         "its slices for them); pass the plan_decode_rows result of this state")
    if plan.serial != state._plans:
        raise ValueError(f"plan: not this state's latest plan (plan {plan.serial}; the state's latest is plan "
                         f"{state._plans}, made since: it reset the top-k rows of its own step, or returned None and "
                         f"left them to the stock path): an earlier plan, or one made "
                         f"on another state; pass the latest plan_decode_rows result of this state")
    _check_capture_of_finish(state, plan)
    _check_metadata_unchanged(plan)
    _check_plan_slice(state, plan, rank, world_size)
    _check_buffers_as_built(state)  # the finish writes them too: changed since the plan, they are refused alike
    _check_schedule_for_sms_now(state, plan)
    if plan.shard is not None:
        _check_gathers(tp, all_gather, state.topk_indices.device)
    _check_query(q, weights, plan.num_rows, state)
    # The plan checked the metadata's tensors, and they are laid out as it saw them (_check_metadata_unchanged):
    # their storage, which may have shrunk since, is checked again, and their fit to this state's context (a plan
    # made on another state, e.g. dataclasses.replace of this one with another max_model_len, is refused above by
    # its serial; this check stays for a plan whose fields were replaced by hand).
    md = plan.metadata
    check_in_storage("metadata.seq_lens", md.seq_lens)
    check_in_storage("metadata.block_table", md.block_table)
    _check_metadata_fits_context(state, md)
    # Every rank checks the whole step's scoring inputs, not only its slice: a rank
    # with an empty slice scores nothing and would otherwise enter the gathers while
    # the others raise.
    _check_scoring(state, md, q, weights)


def decode_rows(
    state: IndexerState,
    metadata: DecodeMetadata | None,
    q: torch.Tensor,
    weights: torch.Tensor,
    tp: TPGroup,
    all_gather: RowGather | None = None,
) -> torch.Tensor | None:
    """``plan_decode_rows`` then ``finish_decode_rows``: the step's top-k buffer, or
    None when the caller's stock path should run. Rows of ``q`` past
    ``metadata.num_tokens`` are a CUDA graph's padding: their top-k and candidate rows are reset too.
    Everything the finish would refuse is refused before the plan's reset, so an
    ``all_gather`` that is not a RowGather is refused on every step with rows, not
    only on one that shards (``finish_decode_rows`` looks at it only where it shards), and
    one whose ``accepts`` answers no bool before the reset."""
    if torch.compiler.is_compiling():  # traced by torch.compile: run eagerly, a graph break (_decode_rows_eagerly)
        return _decode_rows_eagerly(state, metadata, q, weights, tp, all_gather)
    return _decode_rows_body(state, metadata, q, weights, tp, all_gather)


def _decode_rows_body(state, metadata, q, weights, tp, all_gather):
    """decode_rows' body (what its eager wrapper runs: see _disable)."""
    _check_state(state)
    _check_metadata_type(metadata)
    has_rows = metadata is not None and metadata.num_prefills == 0 and metadata.num_tokens > 0
    # The state's device current for the checks too, as plan_decode_rows and finish_decode_rows make it before
    # theirs: DeepGemmScorer's check_inputs refuses a q off the current device (where its kernels launch).
    with _on_device(state.topk_indices.device):
        if has_rows:  # every argument is here: what the finish would refuse is refused before the plan resets
            _check_row_gather(all_gather)
            # The metadata first: a step larger than the state's buffers is the metadata's fault, not q's.
            _check_metadata(state, metadata)  # names the metadata's fields before the scorer reads them
            _check_query(q, weights, metadata.num_tokens, state)
            # Its checks of q, weights and the metadata just now leave the scorer its own limits to check.
            _check_scoring(state, metadata, q, weights)
        accepted = _ask_accepts_before_the_reset(state, metadata, tp, all_gather) if has_rows else None
        # A plan is made only for a step with rows, whose arguments were all checked above.
        plan = _plan(state, metadata, tp, _padded_tokens(state, metadata, q), by_decode_rows=has_rows)
        return _finish(state, q, weights, plan, tp, all_gather, by_decode_rows=has_rows, accepted=accepted)


# Traced by torch.compile, the indexer's steps run eagerly: each is a graph break, where the tracer would otherwise
# follow host logic it cannot take (checks of tensors' storage sizes, which symbolic shapes refuse; the scorer's
# and the all-gather's calls) and fail the compile. Selection inside them is decode_topk, a custom op.
# torch._disable_dynamo is torch.compiler.disable made on first use: the latter imports the compiler at once
# (1.4 s here), which a process that never compiles should not pay at import. The wrappers run the steps' bodies,
# not the public functions: under a non-strict torch.export no Dynamo runs, is_compiling() stays True inside a
# disabled function, and a public function's wrapper called itself until a RecursionError (the fake tensors are then
# refused by the checks, naming the argument, as before the steps ran eagerly).
_disable = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable
_plan_decode_rows_eagerly = _disable(_plan_decode_rows_body)
_finish_decode_rows_eagerly = _disable(_finish_decode_rows_body)
_decode_rows_eagerly = _disable(_decode_rows_body)


def _padded_tokens(state: IndexerState, metadata: DecodeMetadata | None, q) -> int | None:
    """``q``'s rows where they pad the step past ``metadata.num_tokens``, else None (the plan's default),
    at most the buffer's rows (a q cut from a larger preallocated buffer pads no more rows than the top-k
    buffer holds). Anything malformed is left to the plan's and the finish's checks, which name it."""
    if metadata is None or not isinstance(q, torch.Tensor) or q.dim() == 0:
        return None
    if not isinstance(metadata.num_tokens, int) or q.shape[0] <= metadata.num_tokens:
        return None
    return max(metadata.num_tokens, min(q.shape[0], state.max_rows))


def preload_decode_rows(state: IndexerState, max_rows: int | None = None, heads: int = 64) -> None:
    """Run a dummy decode step for every row count up to ``max_rows`` (default: the rows
    both buffers hold, the smaller of ``topk_indices``' and ``candidate_blocks``' rows) at
    start-up, so that every kernel a step can pick (DeepGEMM's, from its warm JIT cache,
    and the AOT top-k's cluster variants, loaded lazily by the driver) is resident before
    the first real step: that step then costs what a steady one does. Leaves the buffers'
    first ``max_rows`` rows at -1. ``heads``: the model's index heads (q's second dimension), which
    the dummy steps score: DeepGEMM compiles its logits kernel per head count, so another count
    preloads a kernel the steps never use and leaves theirs to the first step. Compiles nothing when
    DeepGEMM's cache was warmed for those heads (``runtime.scoring.warm_deepgemm``). Its dummy rows
    read page 0 of the key cache (a state's cache has at least one)."""
    _check_state(state)
    # A step's rows fit both buffers (the plan refuses more rows than the candidate buffer holds).
    most = state.max_rows if state.candidate_blocks is None else min(state.max_rows, state.candidate_blocks.shape[0])
    max_rows = most if max_rows is None else whole_count("max_rows", max_rows, 1)
    heads = whole_count("heads", heads, 1)
    if not 0 < max_rows <= most:
        raise ValueError(f"max_rows: {max_rows} must be in [1, {most}] (the top-k and candidate buffers' rows)")
    dev = state.topk_indices.device
    dim = state.index_k_cache.shape[-1] - reference.INDEX_SCALE_BYTES
    pages = _pages_for(state.max_model_len)
    seq_lens = torch.ones(max_rows, dtype=torch.int32, device=dev)
    table = torch.zeros(max_rows, pages, dtype=torch.int32, device=dev)
    q = torch.zeros(max_rows, heads, dim, device=dev).to(torch.float8_e4m3fn)
    weights = torch.zeros(max_rows, heads, dtype=torch.float32, device=dev)
    for rows in range(1, max_rows + 1):
        md = DecodeMetadata(seq_lens[:rows], table[:rows], num_requests=rows, num_tokens=rows, max_seq_len=1)
        decode_rows(state, md, q[:rows], weights[:rows], SingleRank())
    state.topk_indices[:max_rows] = -1
    if state.candidate_blocks is not None:
        state.candidate_blocks[:max_rows] = -1


def _decode_rows(state: IndexerState, q: torch.Tensor, weights: torch.Tensor, plan: DecodeRowsPlan) -> None:
    """Score rows ``[start, end)`` and select into the same rows of the buffers."""
    md, start, end = plan.metadata, plan.start, plan.end
    seq_lens = _rows(md.seq_lens, start, end)
    logits = state.scorer.logits(
        _rows(q, start, end), _rows(weights, start, end), state.index_k_cache, seq_lens,
        _rows(md.block_table, start, end), plan.schedule, state.max_model_len, checked=True,
    )  # finish_decode_rows checked the whole step's rows; the plan built or checked the schedule
    _check_logits(state, logits, end - start)
    select = _selector(state, logits)
    if state.candidate_blocks is not None:
        select(logits, seq_lens, _rows(state.candidate_blocks, start, end), True)
    select(logits, seq_lens, _rows(_topk_columns(state), start, end), False)


def _check_logits(state: IndexerState, logits, rows: int) -> None:
    """A scorer's logits are FP32 (or BF16, which decode_topk also takes) ``[rows, max_model_len]`` of unit column
    stride on the state's device (runtime.scoring.Scorer): narrower ones would lose the columns past their width from
    every selection without a word, another row count failed in torch's copy, and another dtype, layout or device
    was refused by decode_topk naming its ``logits`` (or, on the CPU, selected) after the candidate rows had been
    written. Checked before any selection writes a row."""
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else None
    name = f"scorer: {type(state.scorer).__name__}.logits returned"
    if shape != (rows, state.max_model_len):
        got = f"shape {shape}" if shape is not None else type(logits).__name__
        raise ValueError(f"{name} {got} for {rows} rows, expected [{rows}, {state.max_model_len}] (rows, "
                         f"max_model_len); implement runtime.scoring.Scorer")
    if logits.dtype != state._logits_dtype:
        raise TypeError(f"{name} {logits.dtype} logits, expected {state._logits_dtype} (its logits_dtype); "
                        f"{_LOGITS_DTYPE_FIX}")
    if logits.device != state.topk_indices.device or (state.max_model_len > 1 and logits.stride(1) != 1):
        raise ValueError(f"{name} logits on {logits.device} with strides {logits.stride()}, expected them on "
                         f"{state.topk_indices.device} (the top-k buffer's device) with unit column stride; implement "
                         f"runtime.scoring.Scorer")


_LOGITS_DTYPES = (torch.float32, torch.bfloat16)
_LOGITS_DTYPE_FIX = ("return float32 logits, or bfloat16 ones with logits_dtype = torch.bfloat16 on the scorer "
                     "(runtime.scoring.Scorer)")


def _declared_logits_dtype(scorer) -> torch.dtype:
    """The scorer's ``logits_dtype`` (float32 where it declares none), float32 or bfloat16, which decode_topk takes.
    Asked when the state is built, so that the kernels for it load then (``_load_the_aot_topk``: on every rank) rather
    than at the first step that returns such logits; a step's logits of another dtype are refused."""
    dtype = getattr(scorer, "logits_dtype", torch.float32)
    if not isinstance(dtype, torch.dtype) or dtype not in _LOGITS_DTYPES:
        raise TypeError(f"scorer: {type(scorer).__name__}.logits_dtype is {dtype!r}; {_LOGITS_DTYPE_FIX}")
    return dtype


def _rows(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``t[start:end]``, or ``t`` itself where that is all its rows: a slice costs ~3 us of host time (a single-rank
    eager step takes its tensors' every row, four to six times a layer)."""
    return t if start == 0 and end == t.shape[0] else t[start:end]


def _topk_columns(state: IndexerState) -> torch.Tensor:
    """The top-k buffer's first ``k`` columns (the buffer itself where it is ``k`` wide)."""
    buffer = state.topk_indices
    return buffer if buffer.shape[1] == state.k else buffer[:, : state.k]


def _all_gather_rows(
    buffer: torch.Tensor, rows: int, num_rows: int, tp: TPGroup, all_gather: RowGather | None,
    taken: bool | None = None,
) -> None:
    """Gather every rank's ``rows``-row slice of ``buffer`` into its first ``num_rows``
    rows; rows past ``num_rows`` (a short or empty last slice) are dropped. ``taken``: all_gather's answer for
    this slice's layout where already asked, else None (asked here)."""
    local = _same_layout_on_every_rank(buffer[tp.rank * rows: (tp.rank + 1) * rows])
    if taken is None:
        taken = _accepts(all_gather, local)
    if taken:
        gathered, source = all_gather(local), "all_gather"
    else:
        gathered, source = tp.all_gather(local), "tp.all_gather"
    _check_gathered(source, gathered, local, tp.world_size)
    rows_now, gathered_rows = buffer[:num_rows], gathered[:num_rows]
    if _shares_memory_elsewhere(gathered_rows, rows_now):
        raise ValueError(f"{source}: returned rows that share memory with the buffer rows they are copied into, at "
                         f"other positions; return them in memory of their own (or exactly in those rows)")
    rows_now.copy_(gathered_rows)


def _ask_accepts_before_the_reset(state: IndexerState, metadata: DecodeMetadata, tp, all_gather) -> tuple | None:
    """decode_rows asks a custom gather's ``accepts`` about the slices the finish will gather (their layout, all
    that the answer may rest on), so that an answer that is no bool is refused before the plan's reset, not after
    the scoring (the split flow's finish refuses it there: its plan is made without ``all_gather``). Returns the
    answers for the top-k rows and the candidate rows, which the finish takes instead of asking again (None where
    nothing was asked: no custom gather, or a step that does not shard)."""
    if all_gather is None:
        return None
    rank, world_size = _rank_and_world(tp)
    shard, _, _ = _slice_of(state, metadata.num_tokens, metadata.num_requests, rank, world_size)
    if shard is None:
        return None
    slices = (None if buffer is None else buffer[rank * shard: (rank + 1) * shard]
              for buffer in (_topk_columns(state), state.candidate_blocks))
    return tuple(None if local is None else _accepts(all_gather, _gather_layout(local)) for local in slices)


def _accepts(all_gather: RowGather | None, local: torch.Tensor) -> bool:
    """Whether ``all_gather`` takes ``local`` (False where there is none), its answer checked."""
    taken = all_gather is not None and all_gather.accepts(local)
    if taken is not True and taken is not False:  # two comparisons where it answers a bool
        taken = _accepts_answer(all_gather, taken)
    return taken


def _accepts_answer(all_gather: RowGather, answer) -> bool:
    """A RowGather's ``accepts`` answer that is no Python bool: a numpy bool is taken, anything else refused naming
    ``all_gather`` (every rank alike: the answer rests on what is equal on every rank). Taken by its truth, "False"
    chose the custom gather, a tensor of more than one element raised torch's RuntimeError naming nothing, and a
    CUDA tensor's truth waits for the device (which a CUDA graph capture refuses)."""
    kind = type(answer)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):
        return bool(answer)
    shown = f"{kind.__name__} {answer!r}" if isinstance(answer, (str, int, float)) else kind.__name__
    raise TypeError(f"all_gather: {type(all_gather).__name__}.accepts returned {shown}, not a bool; return True or "
                    f"False (every rank alike)")


def _shares_memory_elsewhere(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether ``src`` overlaps ``dst`` other than as the very same elements (a gather that wrote the rows in place
    leaves nothing to copy)."""
    same = src.data_ptr() == dst.data_ptr() and src.stride() == dst.stride()
    return not same and first_overlap(dst, (("src", src),)) is not None


def _check_gathered(source: str, gathered, local: torch.Tensor, world_size: int) -> None:
    """Refuse, naming ``source``, a gather result that is not every rank's slice stacked along dim 0 (``local``'s
    dtype and device, ``world_size`` x its rows): the copy into the buffers would broadcast, convert or cross devices
    without an error, e.g. a gather returning its whole fixed-size workspace (the later ranks' rows read from rank 0's
    unused slots) or the int32 bits viewed as float32 (every index turned to 0). One gather gives every rank the
    same kind of result, so every rank raises here and none is left waiting in a later collective."""
    want = (operator.index(world_size) * local.shape[0], *local.shape[1:])
    fix = (f"return every rank's slice concatenated along dim 0 in rank order, {local.dtype} {list(want)} on "
           f"{local.device}")
    if not isinstance(gathered, torch.Tensor) or gathered.dtype != local.dtype:
        raise TypeError(f"{source}: returned {dtype_or_type(gathered)}; {fix}")
    # A sparse result, or a wrapper without memory of its own; first, since a nested result's shape raises torch's
    # RuntimeError ('NestedTensorImpl doesn't support sizes'), naming no gather.
    require_dense(f"{source}'s result", gathered)
    if gathered.shape != want or gathered.device != local.device:
        raise ValueError(f"{source}: returned {list(gathered.shape)} on {gathered.device}; {fix}")


def _gather_layout(local: torch.Tensor) -> torch.Tensor:
    """A tensor laid out as ``_same_layout_on_every_rank(local)`` will be (``local`` itself, or an uninitialised
    aligned one of its shape), without copying its values: what ``accepts`` is asked about before the rows exist."""
    if local.is_contiguous() and local.data_ptr() % GATHER_ALIGN_BYTES == 0:
        return local
    return _aligned_empty(local.shape, local.dtype, local.device)


def _same_layout_on_every_rank(local: torch.Tensor) -> torch.Tensor:
    """``local``, or a copy of it, contiguous and starting ``GATHER_ALIGN_BYTES``-aligned. A rank's slice
    starts ``rank x rows`` rows into the buffer, so whether the view is aligned can depend on the rank (a
    3-column int32 buffer); a copy makes it so on every rank. A column slice of a wider buffer is copied too,
    as it was before (a gather takes contiguous rows)."""
    laid = _gather_layout(local)
    return laid if laid is local else laid.copy_(local)


def _aligned_empty(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous tensor starting ``GATHER_ALIGN_BYTES``-aligned: a fresh allocation alone
    is not (torch's CPU allocator aligns to 64 bytes), so it is cut from a larger byte buffer."""
    nbytes = shape.numel() * dtype.itemsize
    raw = torch.empty(nbytes + GATHER_ALIGN_BYTES - 1, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % GATHER_ALIGN_BYTES
    return raw[skip: skip + nbytes].view(dtype).view(shape)


# ---------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------

Select = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], None]


def _selector(state: IndexerState, logits: torch.Tensor) -> Select:
    """The selection for these logits: the "torch" backend's ``torch.topk`` on any device; with
    "auto", ``decode_topk`` on CUDA (the AOT kernel where ``supports_decode_topk`` allows, its
    exact fallback elsewhere), else the exact torch selection."""
    if state.topk_backend == "torch":
        return _torch_topk_select
    if logits.is_cuda:
        return _aot_select
    return _reference_select


def _selection_widths(state: IndexerState) -> list:
    """(what, width, block_mode) of each selection a step makes: token mode k wide into the top-k buffer, and block
    mode, whose k is the candidate buffer's width, into that buffer."""
    widths = [("k", state.k, False)]
    if state.candidate_blocks is not None:
        widths.append(("candidate_blocks' width", state.candidate_blocks.shape[1], True))
    return widths


def _warn_widths_the_aot_topk_does_not_take(state: IndexerState) -> None:
    """Said once, when the state is built (every rank builds it): a k, or in block mode a candidate buffer width, that
    decode_topk does not take sends every step's selection to the exact reference. Said at each step instead, only
    ranks with rows would say it, and where warnings are errors they would raise while an empty-slice rank waits in
    the all-gather."""
    for what, width, _ in _selection_widths(state):
        if width not in topk.SUPPORTED_K:
            warn_at_caller(f"indexer: {what} = {width} is not one of decode_topk's k {topk.SUPPORTED_K}, so the "
                           f"exact torch reference selects (milliseconds); use a supported {what} for the AOT top-k")


def _load_the_aot_topk(state: IndexerState) -> None:
    """Load the AOT cache's top-k kernels for the state's selections (the scorer's logits dtype, token mode into the
    top-k buffer, block mode into the candidate buffer) when the state is built, which every rank does. A refused or
    partial cache is then said by every rank alike (a RuntimeWarning, raised where warnings are errors), and a first
    load cannot fall inside a captured step. Left to the first selection, only ranks with rows would load, and they
    would warn or raise while an empty-slice rank waited in the all-gather."""
    for _, width, block_mode in _selection_widths(state):
        if width in topk.SUPPORTED_K:  # another width selects by the reference: no kernel to load
            topk.load_kernels(state.topk_indices.device, state._logits_dtype, block_mode)


def _aot_select(logits, row_ends, out, block_mode) -> None:
    """``decode_topk`` (the AOT kernel, or its exact fallback), straight into ``out`` (a column slice of a wider
    buffer is a row stride to it, not a temporary and a copy); a k it does not take goes to the reference (said
    when the state was built)."""
    if out.shape[1] not in topk.SUPPORTED_K:
        _reference_select(logits, row_ends, out, block_mode)
    else:
        # Right behind DeepGEMM's scoring, which does not trigger its dependents early: plain stream order. A PDL
        # launch there measured 0.1-0.4 us slower a step, with or without deep_gemm.set_pdl(True)
        # (benchmarks/results/indexer_pdl_s41.json, gpu/jobs/indexer_pdl.py).
        topk.decode_topk(logits, row_ends, out, block_mode=block_mode, pdl=False)


def _reference_select(logits, row_ends, out, block_mode) -> None:
    out.copy_(reference.decode_topk_reference(logits, row_ends, out.shape[1], block_mode=block_mode))


def _torch_topk_select(logits, row_ends, out, block_mode) -> None:
    """The peer the AOT top-k is measured against: mask past each row's end,
    ``torch.topk`` (unsorted: the rows are sets), a row with fewer than k candidates holding them first, then -1.
    (Tie order is torch's.)"""
    rows, width = logits.shape
    k = out.shape[1]
    ends = row_ends.long()
    # Candidates scoring -inf or NaN rank below every finite value but above the
    # columns past the row's end (-inf), as in the reference.
    lowest = torch.finfo(logits.dtype).min
    x = torch.where(torch.arange(width, device=logits.device)[None, :] < ends[:, None],
                    logits.nan_to_num(nan=lowest, posinf=float("inf"), neginf=lowest),
                    torch.full_like(logits, float("-inf")))
    if block_mode:
        # A block past the row's end holds only -inf columns, so its max is -inf too.
        blocks = -(-width // CANDIDATE_BLOCK_SIZE)
        padded = torch.full((rows, blocks * CANDIDATE_BLOCK_SIZE), float("-inf"), device=x.device)
        padded[:, :width] = x
        x = padded.view(rows, blocks, CANDIDATE_BLOCK_SIZE).amax(dim=2)
        width = blocks
    take = min(k, width)
    _, idx = torch.topk(x, take, dim=1, sorted=False)
    # Every column below a row's end is a candidate (-inf and NaN were made finite above), so a row of fewer than
    # ``take`` holds all of them: columns 0..count-1, then -1, as decode_topk's rows do (a consumer may count a row's
    # active columns as a prefix, as the sparse MLA's lens does; unsorted, torch.topk mixed the columns past the end
    # among them). Elementwise, no sort: the peer costs what the bare torch.topk flow does.
    count = ends.clamp(0, logits.shape[1])
    if block_mode:
        count = (count + CANDIDATE_BLOCK_SIZE - 1) // CANDIDATE_BLOCK_SIZE
    columns = torch.arange(take, device=idx.device)
    short_rows = torch.where(columns[None, :] < count[:, None], columns[None, :], -1)
    out[:, :take] = torch.where(count[:, None] >= take, idx, short_rows).to(torch.int32)
    if take < k:
        out[:, take:] = -1


# ---------------------------------------------------------------------------
# Top-k positions to pool rows
# ---------------------------------------------------------------------------

_INT32_MAX = 2 ** 31 - 1


def topk_pool_rows(topk_indices: torch.Tensor, block_table: torch.Tensor, *, page_size: int = reference.INDEX_BLOCK_KV,
                   out: torch.Tensor | None = None, pdl: bool = True) -> torch.Tensor:
    """Map the indexer's top-k rows (compressed-token positions of each row's request) to rows of a paged pool.

    Position ``p`` of row ``r`` is row ``block_table[r, p // page_size] * page_size + p % page_size`` of a pool
    paged as ``block_table`` says (the index-key cache's 64-token pages, as
    ``reference.indexer_logits_reference`` reads them, or a compressed KV pool paged alike). -1 stays -1, and so
    does a position that cannot be mapped: negative, at or past the table's ``pages * page_size``, on a page whose
    id is negative (unallocated), or whose row does not fit int32. ``sparse_mla_decode`` masks -1, so the result can
    fill its ``indices``' compressed columns (past the first 128, which index the sliding-window pool).

    ``topk_indices``: int32 ``[rows, width]`` (any strides: ``state.topk_indices[:rows, :k]`` is taken as is; its
    columns past ``k`` hold -1); ``block_table``: int32 ``[>= rows, pages]`` on the same device, of which the first
    ``rows`` rows are read (``metadata.block_table``); ``page_size``: tokens a page. Returns int32 ``[rows, width]``,
    written into ``out`` where given (int32, the same shape and device, each row's columns consecutive and the rows
    apart: a contiguous tensor, or ``indices[:, 128:]`` of ``sparse_mla_decode``'s indices, written there directly;
    ``out=topk_indices`` maps in place). Every argument is checked before anything runs (TypeError/ValueError naming
    it).

    On a GPU the AOT cache serves, one kernel maps every column (``topk_pool_rows`` in the manifest), launched with
    programmatic dependent launch unless ``pdl=False``: it waits for the previous grid before reading anything and
    lets the next one (``sparse_mla_decode``) start its prologue. Elsewhere, and for an ``out`` that overlaps
    ``topk_indices`` other than as the same tensor, the same result comes from torch ops (the exact fallback).
    Either way there is no device sync and no branch on values, as capture in a CUDA graph needs (the first call on
    a device loads the cache: make it before capturing). Inside a function torch.compile traces it runs eagerly, a
    graph break, as the indexer's steps do."""
    if torch.compiler.is_compiling():  # traced by torch.compile: run eagerly, a graph break (_topk_pool_rows_eagerly)
        return _topk_pool_rows_eagerly(topk_indices, block_table, page_size, out, pdl)
    return _topk_pool_rows_body(topk_indices, block_table, page_size, out, pdl)


def _topk_pool_rows_body(topk_indices, block_table, page_size, out, pdl) -> torch.Tensor:
    """topk_pool_rows' body. Its eager wrapper calls this, not topk_pool_rows: under a non-strict torch.export no
    Dynamo runs, is_compiling() stays True inside a disabled function, and the wrapper would call itself forever."""
    _check_int32_rows("topk_indices", topk_indices, written=False)
    _check_int32_rows("block_table", block_table, written=False)
    page_size = whole_count("page_size", page_size, 1)
    if page_size > _INT32_MAX:
        raise ValueError(f"page_size: {page_size} exceeds 2^31 - 1; the positions and pool rows are int32, so a "
                         f"page holds fewer tokens")
    require_flag("pdl", pdl)
    rows, width = topk_indices.shape
    device = topk_indices.device
    if block_table.device != device:
        raise ValueError(f"block_table: on {block_table.device}, topk_indices on {device}; pass both on one device")
    if block_table.shape[0] < rows:
        raise ValueError(f"block_table: {block_table.shape[0]} rows, topk_indices has {rows}; pass the step's table "
                         f"(a row of it for every top-k row, the first rows read)")
    if out is not None:
        _check_int32_rows("out", out, contiguous=False)
        if out.device != device:
            raise ValueError(f"out: on {out.device}, topk_indices on {device}; pass an out on topk_indices' device")
        if out.shape != topk_indices.shape:
            raise ValueError(f"out: shape {tuple(out.shape)}, expected topk_indices' {tuple(topk_indices.shape)}; "
                             f"allocate it as torch.empty(topk_indices.shape, dtype=torch.int32, "
                             f"device=topk_indices.device) (or pass out=None)")
        if (width > 1 and out.stride(1) != 1) or (rows > 1 and out.stride(0) < width):
            raise ValueError(f"out: strides {out.stride()}; pass rows of consecutive columns that do not overlap "
                             f"(a contiguous tensor, or a column slice of one such as indices[:, 128:])")
        # The block table is the step's metadata, which every layer reads: pool rows written over it are a mistake.
        if first_overlap(out, (("block_table", block_table),)) is not None:
            raise ValueError("out overlaps block_table's memory: pool rows would overwrite the page ids every layer "
                             "reads; pass an out of its own (or out=topk_indices, to map in place)")
    kernel = _pool_rows_kernel(topk_indices, out, block_table.shape[1]) if topk_indices.numel() else None
    if kernel is not None:
        if out is None:
            out = torch.empty((rows, width), dtype=torch.int32, device=device)
        # The kernel reads the table's first rows only (grid x = rows): no view of them needed
        _launch_pool_rows(kernel if pdl else kernel.in_stream_order(), topk_indices, block_table, page_size, out)
        return out
    result = _pool_rows_torch(topk_indices, block_table[:rows], page_size)
    if out is None:  # contiguous, as the kernel's out: torch's ops keep a column-major topk_indices' layout
        return result.to(torch.int32, memory_format=torch.contiguous_format)
    write_result(out, result)  # casts to int32; takes an out made under inference_mode too
    return out


_topk_pool_rows_eagerly = _disable(_topk_pool_rows_body)
_POOL_ROWS_COLUMNS_MAX = 65535 * topk_contract.THREADS  # grid y (column blocks) is at most 65535


def _pool_rows_kernel(topk_indices: torch.Tensor, out: torch.Tensor | None, table_pages: int):
    """The cached topk_pool_rows kernel where it takes this call, else None (the torch chain runs): a CUDA device
    the cache serves, rows and columns within the grid, a table of fewer than 2^31 pages (the kernel takes the count
    as int32), and an ``out`` that is ``topk_indices`` itself or apart from it (each thread reads its column before
    writing it; a shifted overlap would read what another thread wrote)."""
    rows, width = topk_indices.shape
    if not topk_indices.is_cuda or rows > _INT32_MAX or width > _POOL_ROWS_COLUMNS_MAX or table_pages > _INT32_MAX:
        return None
    if out is not None and not (out.data_ptr() == topk_indices.data_ptr() and out.stride() == topk_indices.stride()) \
            and first_overlap(out, (("topk_indices", topk_indices),)) is not None:
        return None
    index = topk_indices.device.index  # a CUDA tensor's device always names its index
    if index not in _pool_rows_kernels:
        return memo_kernel(_pool_rows_kernels, index, "topk_pool_rows", index, topk_contract.NAME)
    return _pool_rows_kernels[index]


_pool_rows_kernels: dict = {}


def _launch_pool_rows(kernel, topk_indices, table, page_size: int, out) -> None:
    """One launch over ``(rows, column blocks)`` (``_pool_rows_kernel`` took the shapes: every count fits int32);
    ``table``: the block table, of which the first ``rows`` rows are read."""
    rows, width = topk_indices.shape
    blocks = -(-width // topk_contract.THREADS)
    launch_on(topk_indices.device, kernel, (rows, blocks, 1), topk_indices.data_ptr(), table.data_ptr(),
              out.data_ptr(), *topk_indices.stride(), *table.stride(), out.stride(0), width, table.shape[1],
              page_size)
    mark_written(out)


def _pool_rows_torch(topk_indices: torch.Tensor, table: torch.Tensor, page_size: int) -> torch.Tensor:
    """topk_pool_rows' exact torch fallback: the mapping as int64 ``[rows, width]`` (thirteen kernels on a GPU with
    the casts, which test_pool_rows counts)."""
    rows, width = topk_indices.shape
    pages = table.shape[1]
    if pages == 0 or not topk_indices.numel():  # shapes only: nothing to gather from, or nothing to map
        return torch.full((rows, width), -1, dtype=torch.int32, device=topk_indices.device)
    pos = topk_indices.long()
    page = pos.div(page_size, rounding_mode="floor")  # negative positions land on negative pages
    # On the table (0 <= page < pages, i.e. 0 <= pos < pages * page_size): a page clamped onto it is unchanged.
    # Only clamped pages are gathered: a CUDA gather out of bounds is a device-side assert, ending the process.
    clamped = page.clamp(0, pages - 1)
    on_table = clamped == page
    ids = table.gather(1, clamped)
    # ids * page_size + pos % page_size in one kernel, in int64 (< 2^62 + 2^31: page_size < 2^31). It is
    # negative exactly where the page id is (an unallocated page): the offset is below page_size.
    mapped = torch.add(pos.remainder(page_size), ids, alpha=page_size)
    result = torch.where(on_table, mapped, -1).clamp_(min=-1)
    # A row past int32 would wrap to another row, or to a negative one, in sparse_mla_decode's int32 indices.
    # Refusing it needs its value on the host (a device sync, impossible in a CUDA graph), so it becomes -1,
    # as no pool that sparse_mla_decode takes has that row: it refuses pools of 2^31 rows or more, and masks an
    # index past its pool's rows anyway.
    return result.masked_fill_(result > _INT32_MAX, -1)


# ---------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------

def _takes_keyword(fn, name: str, *, unreadable: bool = True) -> bool:
    """Whether ``fn`` can be called with the keyword argument ``name`` (by name or through ``**kwargs``); where its
    signature cannot be read (a builtin), ``unreadable`` (True: let the call say)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return unreadable
    return any(p.kind == p.VAR_KEYWORD or (p.name == name and p.kind != p.POSITIONAL_ONLY) for p in params)


def _check_int32_rows(name: str, t: torch.Tensor, *, written: bool = True, contiguous: bool = True) -> None:
    """A TypeError/ValueError naming ``name`` unless ``t`` is an int32 ``[rows, columns]`` tensor inside its storage
    and 4-byte aligned; one the caller writes (``written``) must also be contiguous unless ``contiguous`` is False
    (topk_pool_rows' out, whose strides it checks itself), while one only read (topk_pool_rows' inputs) may be any
    strided view, such as a buffer's first ``k`` columns."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    require_dense(name, t, written=written)
    if t.dtype != torch.int32:
        fix = "allocate it with dtype=torch.int32" if written else f"pass {name}.int()"
        raise TypeError(f"{name}: expected int32 [rows, columns], got {t.dtype} {tuple(t.shape)}; {fix}")
    if t.dim() != 2:  # a shape is a ValueError, as the host ops' (decode_topk's out)
        raise ValueError(f"{name}: expected int32 [rows, columns], got shape {tuple(t.shape)}; allocate it 2-D, one "
                         f"row a decode token")
    if written and contiguous and not t.is_contiguous():
        # Not .contiguous(): the step writes the buffer in place, and a copy would take the rows instead
        raise ValueError(f"{name}: must be contiguous, got strides {t.stride()}; allocate it contiguous (a slice of "
                         f"a buffer's first rows is)")
    check_in_storage(name, t)
    require_element_aligned(name, t)  # decode_topk's out: written by 4-byte stores (and read so on the device)


@_on_state_device  # the scorer's schedule, rebuilt to compare, is built on the current device (DeepGemmScorer's)
def check_decode_metadata_values(state: IndexerState, metadata: DecodeMetadata) -> None:
    """Check the step's metadata, its device values included, against ``DecodeMetadata``'s contract: every
    row ``r < num_tokens`` has ``0 <= seq_lens[r] <= state.max_model_len``, and the block-table ids of its
    first ``ceil(seq_lens[r] / 64)`` pages index ``state.index_k_cache``'s pages. Raises ValueError naming
    the field and the first offending row. Synchronizes with the device (it reads the values back), so a
    serving step does not call it, and a CUDA graph capture cannot; a test or an eager debugging run does, or
    sets ``SPARSE_DECODE_AOT_CHECK_METADATA`` for ``plan_decode_rows`` and ``finish_decode_rows`` to. A
    ``metadata.schedule`` must equal the scorer's schedule of ``seq_lens``' values (rebuilt here to compare)."""
    if not isinstance(metadata, DecodeMetadata):  # None included: there is no stock path to run here
        raise TypeError(f"metadata: expected a runtime.indexer.DecodeMetadata, got {type(metadata).__name__}; pass "
                        f"the step's metadata")
    _check_metadata_ranges(state, metadata)
    _check_schedule_current(state, metadata.schedule, metadata.seq_lens, "metadata.schedule",
                            "build it with the scorer's schedule(metadata.seq_lens) after seq_lens are written, "
                            "every step")


def _check_metadata_ranges(state: IndexerState, metadata: DecodeMetadata) -> None:
    """``check_decode_metadata_values`` but the schedule: the layout, then each row's length and page ids."""
    _check_metadata(state, metadata)
    rows = metadata.num_tokens
    lens = metadata.seq_lens[:rows].long()
    row = _first_true((lens < 0) | (lens > state.max_model_len))
    if row is not None:
        raise ValueError(f"metadata.seq_lens: row {row} holds {int(lens[row])}, outside [0, {state.max_model_len}] "
                         f"(0 to max_model_len); fix the metadata builder, or build the state for a longer context")
    table = metadata.block_table[:rows].long()
    pages = state.index_k_cache.shape[0]
    read = torch.arange(table.shape[1], device=table.device)[None, :] < _pages_for(lens)[:, None]
    outside = read & ((table < 0) | (table >= pages))
    row = _first_true(outside.any(dim=1))
    if row is not None:
        page = _first_true(outside[row])
        raise ValueError(f"metadata.block_table: row {row} reads page {page} as id {int(table[row, page])}, outside "
                         f"index_k_cache's {pages} pages; a row's first ceil(seq_lens / "
                         f"{reference.INDEX_BLOCK_KV}) ids must index the cache: fix the metadata builder")


def _check_seq_lens_unchanged(plan: DecodeRowsPlan) -> None:
    """The plan built its slice's schedule from seq_lens' values (or checked the caller's against them): values
    written since would have DeepGEMM's scoring run past its rows or never end. The whole step's values are compared,
    not the slice's, so every rank of the group raises alike, none left waiting in the all-gather (a rank whose
    slice does not hold the row written would pass a check of its slice alone)."""
    if plan.seq_lens_at_plan is None:  # planned before the check was switched on
        return
    if not torch.equal(plan.seq_lens_at_plan, plan.metadata.seq_lens):
        raise ValueError("metadata.seq_lens: its values changed since plan_decode_rows built the schedule from "
                         "them; write them before the plan")


def _check_schedule_current(state: IndexerState, schedule, seq_lens: torch.Tensor, name: str, fix: str) -> None:
    """A ValueError naming ``name`` unless ``schedule`` (None: nothing to check) is the scorer's schedule of
    ``seq_lens``' values now: one of longer rows than the scoring finds never ends there (DeepGEMM's SMs stop only
    at their scheduled positions). Rebuilds the schedule to compare (a launch and a device sync)."""
    if not isinstance(schedule, torch.Tensor):
        return
    want = state.scorer.schedule(seq_lens)
    if not (isinstance(want, torch.Tensor) and want.shape == schedule.shape and torch.equal(want, schedule)):
        raise ValueError(f"{name}: the schedule is not the scorer's schedule of seq_lens' current values (the "
                         f"scoring would run past the rows, or never end); {fix}")


def _pages_for(tokens):
    """Pages of the index-key cache that ``tokens`` compressed tokens span (an int, or a tensor of them)."""
    return -(-tokens // reference.INDEX_BLOCK_KV)


def _first_true(mask: torch.Tensor) -> int | None:
    """The first index where the 1-D ``mask`` holds, or None (reads it back: a device sync)."""
    hits = mask.nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def _rank_and_world(tp) -> tuple[int, int]:
    """``tp``'s (rank, world size) as ints, checked: 0 <= rank < world size."""
    if not hasattr(tp, "rank") or not hasattr(tp, "world_size"):
        raise TypeError(f"tp: expected a TPGroup (rank, world_size, all_gather), got {type(tp).__name__}; pass "
                        f"runtime.indexer.SingleRank() for one rank, runtime.indexer.DistGroup(group) for a "
                        f"torch.distributed group")
    rank = whole_count("tp.rank", tp.rank, 0)
    world_size = whole_count("tp.world_size", tp.world_size, 1)
    if rank >= world_size:
        raise ValueError(f"tp: rank {rank} outside world size {world_size}; a group's rank must be in "
                         f"[0, {world_size}): pass the group this process belongs to, with its own rank")
    return rank, world_size


def _check_scoring(state: IndexerState, md: DecodeMetadata, q, weights) -> None:
    """The scorer's checks of the whole step's rows (launches nothing), then that the query rows it reads share no
    memory with the state's buffers: the plan resets the top-k rows before the finish reads q and weights.
    ``_check_query`` has just run on q and weights, and ``_check_metadata`` on the metadata's tensors (decode_rows; the
    finish of a separate plan checks them unchanged since its plan, their storage and their fit to its state), so a
    scorer that takes ``layout_checked`` checks only what those do not (``runtime.scoring.check_scoring_inputs``)."""
    n = md.num_tokens
    q_rows, weight_rows = _rows(q, 0, n), _rows(weights, 0, n)
    lean = {"layout_checked": True} if state._lean_scorer_checks else {}
    state.scorer.check_inputs(q_rows, weight_rows, state.index_k_cache, _rows(md.seq_lens, 0, n),
                              _rows(md.block_table, 0, n), state.max_model_len, **lean)
    # The built-in scorers take a contiguous q and 2-D weights of unit column stride, layouts whose extents
    # first_overlap reads exactly; another scorer's other layouts are not compared.
    read = [(name, t) for name, t in (("q", q_rows), ("weights", weight_rows))
            if t.is_contiguous() or (t.dim() == 2 and t.stride(1) == 1)]
    _check_read_apart(state, read, "give the query memory of its own")


def _check_gathers(tp, all_gather, device: torch.device) -> None:
    """A sharded step gathers the rows back: by ``all_gather`` where it accepts them, else by ``tp.all_gather``.
    Checked before anything is scored, so no rank launches work and then raises."""
    _check_row_gather(all_gather)
    _check_tp_gather(tp, device)


def _check_row_gather(all_gather) -> None:
    if all_gather is not None and not (callable(all_gather) and callable(getattr(all_gather, "accepts", None))):
        raise TypeError(f"all_gather: expected None or a RowGather (callable, with accepts(local)), got "
                        f"{type(all_gather).__name__}")


def _check_tp_gather(tp, device: torch.device) -> None:
    if not callable(getattr(tp, "all_gather", None)):
        raise TypeError(f"tp: {type(tp).__name__} has no callable all_gather, which a sharded step needs; implement "
                        f"runtime.indexer.TPGroup")
    if isinstance(tp, DistGroup):
        tp.check_device(device)


def _check_metadata_apart(state: IndexerState, md: DecodeMetadata) -> None:
    _check_read_apart(state, (("metadata.seq_lens", md.seq_lens), ("metadata.block_table", md.block_table)),
                      "give the metadata memory of its own")


def _check_read_apart(state: IndexerState, read, fix: str) -> None:
    """The plan resets, and the finish writes, the state's buffers while the step reads ``read`` ((name, tensor)
    pairs): a ValueError naming both where one shares their memory."""
    for name, buf in (("topk_indices", state.topk_indices), ("candidate_blocks", state.candidate_blocks)):
        other = None if buf is None else first_overlap(buf, read)
        if other is not None:
            raise ValueError(f"{other} overlaps {name}'s memory: the step writes {name} while it reads {other}; {fix}")


def _check_metadata(state: IndexerState, md: DecodeMetadata) -> None:
    rows = md.num_tokens
    dev = state.topk_indices.device
    if rows > state.max_rows:
        raise ValueError(f"metadata.num_tokens: {rows} rows exceed topk_indices' {state.max_rows}")
    if state.candidate_blocks is not None and rows > state.candidate_blocks.shape[0]:
        raise ValueError(f"metadata.num_tokens: {rows} rows exceed candidate_blocks' {state.candidate_blocks.shape[0]}")
    for name, t, dims in (("seq_lens", md.seq_lens, 1), ("block_table", md.block_table, 2)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise TypeError(f"metadata.{name}: expected an int32 tensor, got {dtype_or_type(t)}; build the metadata "
                            f"with int32 {name}")
        require_dense(f"metadata.{name}", t)
        if t.device != dev:
            raise ValueError(f"metadata.{name}: on {t.device}, expected {dev}")
        if t.dim() != dims:
            raise ValueError(f"metadata.{name}: expected {dims}-D, got shape {tuple(t.shape)}; pass "
                             + (f"{name}.reshape(-1), one length a row" if dims == 1 else "[rows, pages]"))
        if t.stride(-1) != 1:
            # A one-element last dimension with another stride is contiguous to torch (.contiguous() returns it)
            raise ValueError(f"metadata.{name}: expected {dims}-D with unit last stride, got shape {tuple(t.shape)} "
                             f"with strides {t.stride()}; pass a {dims}-D tensor whose last dimension is contiguous "
                             f"({name}.clone(memory_format=torch.contiguous_format))")
        if t.shape[0] < rows:
            raise ValueError(f"metadata.{name}: {t.shape[0]} rows, the step has {rows}")
        check_in_storage(f"metadata.{name}", t)
        require_element_aligned(f"metadata.{name}", t)  # read by 4-byte loads: DeepGEMM's, decode_topk's row ends
    _check_metadata_fits_context(state, md)


def _check_metadata_fits_context(state: IndexerState, md: DecodeMetadata) -> None:
    """The metadata against the state's context length (the block table must cover it; DeepGEMM writes logits that
    wide). The finish runs it again, for a plan whose fields were replaced by hand: a plan made on another state
    (which may share the buffers but not the max_model_len) is refused by its serial first."""
    if md.block_table.shape[1] * reference.INDEX_BLOCK_KV < state.max_model_len:
        raise ValueError(f"metadata.block_table: {md.block_table.shape[1]} pages of {reference.INDEX_BLOCK_KV} "
                         f"do not cover max_model_len {state.max_model_len}")
    if md.max_seq_len > state.max_model_len:
        raise ValueError(f"metadata.max_seq_len: {md.max_seq_len} exceeds max_model_len {state.max_model_len}")


def _check_query(q: torch.Tensor, weights: torch.Tensor, num_rows: int, state: IndexerState) -> None:
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q: expected float8_e4m3fn [rows, heads, head_dim], got {dtype_or_type(q)}; pass the "
                        f"layer's FP8 index query")
    require_dense("q", q)  # first: a nested tensor's shape, read below, raises torch's error, naming nothing
    if q.dim() != 3:  # a shape is a ValueError, as check_scoring_inputs' of the same q
        raise ValueError(f"q: expected float8_e4m3fn [rows, heads, head_dim], got shape {tuple(q.shape)}; pass "
                         f"one query a decode row, q.view(rows, heads, head_dim)")
    if q.shape[0] < num_rows:
        raise ValueError(f"q: {q.shape[0]} rows, the step has {num_rows} (metadata.num_tokens)")
    if q.shape[2] + reference.INDEX_SCALE_BYTES != state.index_k_cache.shape[-1]:
        raise ValueError(f"q: head_dim {q.shape[2]} does not match index_k_cache's {tuple(state.index_k_cache.shape)}")
    if not q.shape[1]:
        raise no_heads(q)
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
        raise TypeError(f"weights: expected a float32 tensor [rows, heads], got {dtype_or_type(weights)}; pass "
                        f"weights.float()")
    require_dense("weights", weights)
    if weights.dim() != 2 or weights.shape[0] < num_rows or weights.shape[1] != q.shape[1]:
        raise ValueError(f"weights: expected [>= {num_rows}, {q.shape[1]}] (the step's rows, q's heads), got "
                         f"{tuple(weights.shape)}")
    for name, t in (("q", q), ("weights", weights)):
        if t.device != state.topk_indices.device:
            raise ValueError(f"{name}: on {t.device}, expected {state.topk_indices.device}")
        check_in_storage(name, t)  # before the step slices them (torch refuses that with its own error)
