"""Indexer decode flow on the CPU: shard math, the torch-scored flow, and gloo runs.

The shard math is checked exhaustively against a brute-force definition; the
flow against the references; and multi-process gloo runs (world 2 and 4) check
that ranks scoring only their slices gather the same buffers as a replicated run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import sys
import tempfile
import time
import types
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from indexer_cases import Loopback, gathers_taken, make_state, make_step
from odd_tensors import Storageless, at_byte_offset

from runtime import reference
from runtime.indexer import (
    ROW_SHARD_MIN_ROWS,
    DecodeMetadata,
    DistGroup,
    IndexerState,
    SingleRank,
    decode_rows,
    finish_decode_rows,
    plan_decode_rows,
    row_shard_bounds,
    row_shard_rows,
)
from runtime.scoring import TorchScorer

# ---------------------------------------------------------------------------
# Shard math
# ---------------------------------------------------------------------------

def _brute_slices(rows: int, requests: int, world: int):
    """The definition, by enumeration: None when replicated, else every rank's
    [start, end): equal even-sized slices (the smallest even size whose world
    slices cover the rows) in rank order, clipped to the rows."""
    if world < 2 or requests == 0 or rows % requests != 0 or rows < ROW_SHARD_MIN_ROWS:
        return None, None
    size = 2
    while size * world < rows:
        size += 2
    owner = {}
    for r in range(rows):
        owner.setdefault(r // size, []).append(r)
    slices = []
    for rank in range(world):
        mine = owner.get(rank, [])
        slices.append((mine[0], mine[-1] + 1) if mine else (rows, rows))
    return size, slices


@pytest.mark.parametrize("world", range(1, 9))
def test_shard_math_matches_brute_force(world):
    for rows in range(257):
        for requests in sorted({0, 1, 2, 3, 4, 5, 7, 8, 16, rows, rows + 1, max(1, rows // 2), max(1, rows // 4)}):
            size, slices = _brute_slices(rows, requests, world)
            assert row_shard_rows(rows, requests, world) == size, (rows, requests, world)
            for rank in range(world):
                got = row_shard_bounds(rows, requests, world, rank)
                assert got == (None if slices is None else slices[rank]), (rows, requests, world, rank)
            if slices is not None:
                covered = [r for s, e in slices for r in range(s, e)]
                assert covered == list(range(rows))
                assert all(s % 2 == 0 for s, e in slices if e > s)


@pytest.mark.parametrize("world", range(1, 9))
def test_shard_math_every_request_count(world):
    """Every request count 0 .. rows + 1 (past rows, none divides a nonzero count), not a sample: the test above
    draws 13 counts a row count, so most divisors (e.g. 3 or 6 rows a request at 18 or 36 rows) were never asked.
    Whether the step is uniform is enumerated (rows among 0, n, 2n, ...), the slices split once per row count."""
    for rows in range(257):
        split = _brute_slices(rows, 1, world)  # one request: sharded exactly where rows and world allow
        for requests in range(rows + 2):
            uniform = requests > 0 and rows in range(0, rows + 1, requests)
            size, slices = split if uniform else (None, None)
            assert row_shard_rows(rows, requests, world) == size, (rows, requests, world)
            for rank in range(world):
                got = row_shard_bounds(rows, requests, world, rank)
                assert got == (None if slices is None else slices[rank]), (rows, requests, world, rank)


def test_shard_math_checks_arguments():
    with pytest.raises(ValueError, match="world_size"):
        row_shard_rows(16, 16, 0)
    with pytest.raises(ValueError, match="num_rows"):
        row_shard_rows(-1, 1, 2)
    with pytest.raises(ValueError, match=r"rank: expected an int in \[0, 2\) \(world_size 2\), got 2; pass"):
        row_shard_bounds(16, 16, 2, 2)


# ---------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------

def test_cache_pack_roundtrip():
    keys = torch.randn(3, 64, 32)
    values, scales = reference.quantize_index_keys(keys)
    v, s = reference.unpack_index_k_cache(reference.pack_index_k_cache(values, scales))
    assert torch.equal(v.view(torch.uint8), values.view(torch.uint8)) and torch.equal(s, scales)
    # Each key's largest magnitude maps onto E4M3's largest value (448), and the values round to within half an E4M3
    # step (2^-4 relative, 2^-10 of the scale in the subnormals) of the key.
    assert torch.equal(values.float().abs().amax(dim=-1), torch.full((3, 64), 448.0))
    err = (values.float() * scales[..., None] - keys).abs()
    assert (err <= keys.abs() * 2**-4 + scales[..., None] * 2**-10).all()


def test_logits_reference_refuses_mismatched_shapes_naming_them():
    """The reference scorer is public: weights, seq_lens or a block table of another row count indexed or broadcast
    into torch's errors naming no argument (or scored the wrong rows)."""
    step = make_step(3, heads=4, head_dim=32, max_model_len=128, k=8)
    md, a = step.metadata, step.state_args
    args = dict(q=step.q, weights=step.weights, cache=a["index_k_cache"], seq_lens=md.seq_lens,
                block_table=md.block_table, max_model_len=a["max_model_len"])
    for name, bad, said in (("q", step.q[0], "q must be"), ("weights", step.weights[:, :2], "weights must"),
                            ("weights", step.weights[:2], "weights must"), ("seq_lens", md.seq_lens[:2], "seq_lens must"),
                            ("block_table", md.block_table[:2], "block_table must"),
                            ("block_table", md.block_table[0], "block_table must")):
        with pytest.raises(ValueError, match=said):
            reference.indexer_logits_reference(**{**args, name: bad})


def test_logits_reference_matches_token_loop():
    step = make_step(5, heads=4, head_dim=32, max_model_len=200, k=8, signed_weights=True)
    assert (step.weights < 0).any(), "negative head weights: relu before the weight, not after"
    # A row as long as the context: its last page is partial (200 = 3 * 64 + 8), so a page count rounded down
    # drops columns 192..199 (the random lengths of this step all end before them).
    step.metadata.seq_lens[0] = 200
    # Page ids past a row's ceil(seq_lens / 64) pages are never read (the host op checks only those): garbage there,
    # past the cache's pages or negative, must not change the logits (nor raise).
    step.metadata.seq_lens[1] = 64
    unread = torch.arange(step.metadata.block_table.shape[1])[None, :] >= (step.metadata.seq_lens[:, None] + 63) // 64
    garbage = torch.tensor([2**31 - 1, -1, -(2**31), 10**6], dtype=torch.int32).repeat(5, 1)[:, :unread.shape[1]]
    step.metadata.block_table[unread] = garbage[unread]
    assert unread[1].sum() == 3
    a = step.state_args
    logits = reference.indexer_logits_reference(step.q, step.weights, a["index_k_cache"], step.metadata.seq_lens,
                                                step.metadata.block_table, a["max_model_len"])
    values, scales = reference.unpack_index_k_cache(a["index_k_cache"])
    lens = step.metadata.seq_lens.tolist()
    for r in range(5):
        n = lens[r]
        for t in range(200):  # every column: the row's last key (n - 1) and the first past it (n) included
            if t >= n:
                assert logits[r, t] == float("-inf"), (r, t, n)
                continue
            page = int(step.metadata.block_table[r, t // 64])
            key = values[page, t % 64].float() * scales[page, t % 64]
            want = (torch.relu(step.q[r].float() @ key) * step.weights[r]).sum()
            torch.testing.assert_close(logits[r, t], want, rtol=1e-5, atol=1e-5)


def test_logits_reference_computes_as_deepgemms_kernel_on_odd_keys_and_queries():
    """DeepGEMM's kernel computes scale * sum_h w_h * fmaxf(q_h . k, 0): the key's scale outside the clamp, and a NaN
    product taken as 0 (fmaxf). The reference clamped the scaled product and kept NaN: for a key of negative scale
    it gave 0 where the kernel gives -8, and NaN for a query head of NaN where the kernel drops that head."""
    values = torch.ones(1, 64, 16).to(torch.float8_e4m3fn)
    scales = torch.full((1, 64), 0.5)
    scales[0, 1] = -0.5
    cache = reference.pack_index_k_cache(values, scales)
    q = torch.ones(1, 2, 16)
    q[0, 1, 3] = float("nan")
    q = q.to(torch.float8_e4m3fn)
    weights = torch.ones(1, 2)
    logits = reference.indexer_logits_reference(q, weights, cache, torch.tensor([2], dtype=torch.int32),
                                                torch.zeros(1, 1, dtype=torch.int32), 3)
    # head 0: q . k = 16, head 1: NaN (dropped): 0.5 * 16 and -0.5 * 16; column 2 lies past the row's length
    assert logits.tolist() == [[8.0, -8.0, float("-inf")]]


def _brute_topk(row, end, k, block_mode):
    vals = [float("-inf") if v != v else v for v in row.tolist()[:end]]
    if block_mode:
        vals = [max(vals[i:i + 8]) for i in range(0, len(vals), 8)]
    order = sorted(range(len(vals)), key=lambda i: (-vals[i], i))[:k]
    return order + [-1] * (k - len(order))


@pytest.mark.parametrize("block_mode", [False, True])
def test_topk_reference_matches_brute_force(block_mode):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 4, (12, 100), generator=g).float()  # many exact ties
    logits[2, 5] = float("nan")
    logits[3, :10] = float("-inf")
    ends = torch.tensor([100, 0, 1, 10, 7, 64, 99, 3, 8, 9, 50, 100], dtype=torch.int32)
    k = 9
    got = reference.decode_topk_reference(logits, ends, k, block_mode=block_mode)
    for r in range(12):
        assert got[r].tolist() == _brute_topk(logits[r], int(ends[r]), k, block_mode), r


# ---------------------------------------------------------------------------
# The flow, one process
# ---------------------------------------------------------------------------

def _expected(step, block_mode=False):
    a, md = step.state_args, step.metadata
    logits = reference.indexer_logits_reference(step.q, step.weights, a["index_k_cache"], md.seq_lens,
                                                md.block_table, a["max_model_len"])
    width = a["candidates"].shape[1] if block_mode else a["k"]
    return reference.decode_topk_reference(logits[: md.num_tokens], md.seq_lens[: md.num_tokens], width,
                                            block_mode=block_mode)


@pytest.mark.parametrize("candidates", [None, 12])
def test_flow_single_rank_matches_reference(candidates):
    step = make_step(20, k=16, candidates=candidates, max_rows=24)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(7)  # stale rows from an earlier step
    out = decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert out is state.topk_indices
    assert torch.equal(out[:20], _expected(step))
    assert (out[20:] == 7).all()  # rows past the step are untouched
    if candidates:
        assert torch.equal(state.candidate_blocks[:20], _expected(step, block_mode=True))


def test_plan_and_finish_run_on_the_state_device(monkeypatch):
    """plan_decode_rows and finish_decode_rows make the state's device current while they issue work (DeepGEMM
    and torch's fills and copies go to the current device's stream): each enters _on_device with it."""
    from runtime import indexer

    entered = []
    real = indexer._on_device

    def recording(device):
        entered.append(device)
        return real(device)

    monkeypatch.setattr(indexer, "_on_device", recording)
    step = make_step(20, k=16, max_rows=24)
    state = make_state(step, scorer=TorchScorer())
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert entered == [state.topk_indices.device] * 2
    assert torch.equal(state.topk_indices[:20], _expected(step))


class _CurrentDeviceScorer(TorchScorer):
    """The torch scorer behind DeepGemmScorer's checks that q and seq_lens are on the current device (its kernels
    launch there), with a schedule of seq_lens' values: ``current`` is the device that ``making_current`` (the
    indexer's _on_device, patched) made current; None is the process's own, not the state's."""

    def __init__(self):
        self.current = None

    def _require_current(self, name, t):
        if self.current != t.device:
            raise ValueError(f"{name}: on {t.device}, but {self.current} is current")

    def check_inputs(self, q, *args, **kwargs):
        self._require_current("q", q)
        super().check_inputs(q, *args, **kwargs)

    def schedule(self, seq_lens):
        self._require_current("seq_lens", seq_lens)
        return seq_lens.clone()

    @contextlib.contextmanager
    def making_current(self, device):
        was, self.current = self.current, device
        try:
            yield
        finally:
            self.current = was


def test_decode_rows_checks_the_scoring_inputs_with_the_state_device_current(monkeypatch):
    """A state on another GPU than the current one (cuda:1 while cuda:0 is current): plan_decode_rows and
    finish_decode_rows make its device current before they check anything, decode_rows only after it had the scorer
    check the step, so DeepGemmScorer refused (q off the current device) the very step that plan + finish took."""
    from runtime import indexer

    scorer = _CurrentDeviceScorer()
    monkeypatch.setattr(indexer, "_on_device", scorer.making_current)
    step = make_step(20, k=16, max_rows=24)
    planned = make_state(step, scorer=scorer)
    finish_decode_rows(planned, step.q, step.weights, plan_decode_rows(planned, step.metadata, SingleRank()),
                       SingleRank())
    state = make_state(step, scorer=scorer)
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices, planned.topk_indices)
    assert torch.equal(state.topk_indices[:20], _expected(step))


def test_aot_selection_of_an_unsupported_k_is_said_when_the_state_is_built():
    """A k the AOT top-k does not take goes to the exact reference. The RuntimeWarning naming it is said when the state
    is built, which every rank does, not by the selection, which only ranks with rows run: where warnings are
    errors, those would raise while an empty-slice rank waited in the all-gather. (The state's own call is for CUDA
    states only; the CPU selects by the reference anyway.)"""
    from runtime import indexer

    state = make_state(make_step(3, k=16), scorer=TorchScorer())
    with pytest.warns(RuntimeWarning, match="k = 16 is not one of decode_topk's") as said:
        indexer._warn_widths_the_aot_topk_does_not_take(state)
    assert len(said) == 1
    logits = torch.randn(3, 100)
    ends = torch.tensor([100, 5, 0], dtype=torch.int32)
    out = torch.empty(3, 16, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        indexer._aot_select(logits, ends, out, False)
    assert torch.equal(out, reference.decode_topk_reference(logits, ends, 16))


def test_flow_torch_topk_backend_same_sets():
    step = make_step(8, k=16)
    auto = decode_rows(make_state(step, scorer=TorchScorer()), step.metadata, step.q, step.weights, SingleRank())
    peer = make_state(step, scorer=TorchScorer(), topk_backend="torch")
    # The torch backend selects with torch.topk on the CPU too (the auto backend with the reference here): the
    # same row sets (random logits: no tie at a row's k-th value).
    calls = []
    from runtime import indexer

    select = indexer._torch_topk_select
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexer, "_torch_topk_select", lambda *a: calls.append(a[0].shape) or select(*a))
        got = decode_rows(peer, step.metadata, step.q, step.weights, SingleRank())
    assert calls, "the torch backend ran torch.topk"
    assert torch.equal(got.sort(dim=1).values, auto.sort(dim=1).values)


@pytest.mark.parametrize("block_mode, k", [(False, 40), (True, 4)])
def test_torch_topk_select_ranks_nan_and_infinities_as_the_reference(block_mode, k):
    """NaN and -inf candidates rank below every finite value (the reference's NaN is -inf), +inf above: rows of
    distinct finite values with NaN, +inf and -inf columns, and more candidates than k, so that the k-th value
    lies among the finite negatives and a NaN read as 0 would be taken (every finite value is negative, so in block
    mode too: a NaN block read as 0 would outrank every finite block)."""
    from runtime.indexer import _torch_topk_select

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 64, generator=g) - 10
    assert (logits < 0).all()
    logits[:, 1] = float("nan")
    logits[:, 9] = float("-inf")
    logits[0, 5] = float("inf")
    logits[1, 40:48] = float("nan")  # a whole block of NaN (block mode: scores -inf)
    ends = torch.tensor([64, 60, 50], dtype=torch.int32)
    out = torch.empty(3, k, dtype=torch.int32)
    _torch_topk_select(logits, ends, out, block_mode)
    ref = reference.decode_topk_reference(logits, ends, k, block_mode=block_mode)
    # The premise: k finite candidates in every row, so no NaN or -inf column (block mode: the NaN block) is the
    # reference's.
    assert (ref >= 0).all()
    if block_mode:
        assert not (ref[1] == 5).any()
    else:
        assert not ((ref == 1) | (ref == 9)).any()
    assert torch.equal(out.sort(dim=1).values, ref.sort(dim=1).values), (out, ref)


def test_torch_topk_select_same_sets_as_reference():
    from runtime.indexer import _torch_topk_select

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 300, generator=g)
    ends = torch.tensor([300, 5, 0, 17, 299, 64], dtype=torch.int32)
    for block_mode, k in ((False, 16), (True, 8)):
        out = torch.empty(6, k, dtype=torch.int32)
        _torch_topk_select(logits, ends, out, block_mode)
        ref = reference.decode_topk_reference(logits, ends, k, block_mode=block_mode)
        assert torch.equal(out.sort(dim=1).values, ref.sort(dim=1).values)


@pytest.mark.parametrize("block_mode", [False, True])
def test_torch_topk_select_puts_a_short_rows_candidates_before_its_minus_ones(block_mode):
    """A row with fewer candidates than k holds them first, then -1, in the torch backend as in decode_topk and the
    reference: a consumer may take a row's count of active columns as a prefix (the seed's sparse MLA masks columns at
    or past its lens). Unsorted, torch.topk mixed the columns past the row's end among the candidates."""
    from runtime.indexer import _torch_topk_select

    g = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 4096, generator=g)
    ends = torch.tensor([3, 100, 700, 4096], dtype=torch.int32)
    out = torch.empty(4, 512, dtype=torch.int32)
    _torch_topk_select(logits, ends, out, block_mode)
    ref = reference.decode_topk_reference(logits, ends, 512, block_mode=block_mode)
    counts = (ref >= 0).sum(dim=1)
    assert (counts < 512).sum() >= 2, counts  # the premise: short rows in either mode
    for row, n in enumerate(counts.tolist()):
        assert torch.equal(out[row, :n].sort().values, ref[row, :n].sort().values), row
        assert (out[row, n:] == -1).all(), row


def test_plan_gates_and_reset():
    step = make_step(18, k=8, max_rows=18)
    state = make_state(step, scorer=TorchScorer())
    md = step.metadata
    assert plan_decode_rows(state, None, SingleRank()) is None
    prefill = DecodeMetadata(md.seq_lens, md.block_table, md.num_requests, md.num_tokens, md.max_seq_len,
                             num_prefills=1)
    state.topk_indices.fill_(5)
    assert plan_decode_rows(state, prefill, SingleRank()) is None
    assert (state.topk_indices == 5).all()  # nothing issued
    assert finish_decode_rows(state, step.q, step.weights, None, SingleRank()) is None

    plan = plan_decode_rows(state, md, SingleRank())
    assert (plan.shard, plan.start, plan.end) == (None, 0, 18)
    assert (state.topk_indices == -1).all()
    # World 4 wants slices of 6 (24 rows of buffer): 18 rows do not fit, so replicated.
    plan = plan_decode_rows(state, md, _Fixed(rank=3, world_size=4))
    assert (plan.shard, plan.start, plan.end) == (None, 0, 18)


def test_preload_runs_every_row_count_and_clears():
    from runtime.indexer import preload_decode_rows

    class RowCounts(TorchScorer):
        def __init__(self):
            super().__init__()
            self.steps = []

        def logits(self, q, *args, **kwargs):
            self.steps.append(q.shape[0])
            return super().logits(q, *args, **kwargs)

    step = make_step(6, heads=4, head_dim=32, max_model_len=128, k=8, candidates=8, max_rows=6)
    scorer = RowCounts()
    state = make_state(step, scorer=scorer)
    preload_decode_rows(state, heads=4)
    assert scorer.steps == [1, 2, 3, 4, 5, 6]  # a step of every row count, each scored
    assert (state.topk_indices == -1).all() and (state.candidate_blocks == -1).all()
    with pytest.raises(ValueError, match="max_rows"):
        preload_decode_rows(state, 7)


def test_state_refuses_a_cache_of_no_page():
    """A key cache of no page has nothing to score: DeepGEMM's key descriptor would span no page and the torch scorer's
    gather raised an IndexError naming nothing, after the plan's reset (with every seq_lens 0 the metadata met its
    contract); preload's dummy rows read page 0. Refused when the state is built, and by the scorers' own check."""
    from runtime.indexer import IndexerState
    from runtime.scoring import check_scoring_inputs

    step = make_step(2, heads=4, head_dim=32, max_model_len=128, k=8, max_rows=2)
    a = step.state_args
    with pytest.raises(ValueError, match="^index_k_cache: has no page"):
        IndexerState(a["topk"].clone(), a["k"], a["index_k_cache"][:0], a["max_model_len"], scorer=TorchScorer())
    md = step.metadata
    with pytest.raises(ValueError, match="^cache: has no page"):
        check_scoring_inputs(step.q, step.weights, a["index_k_cache"][:0], md.seq_lens, md.block_table, 128)


def test_input_checks_name_the_argument():
    step = make_step(4, k=8)
    state = make_state(step, scorer=TorchScorer())
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    with pytest.raises(TypeError, match=r"^q: expected float8_e4m3fn"):
        finish_decode_rows(state, step.q.float(), step.weights, plan, SingleRank())
    with pytest.raises(TypeError, match=r"^weights: expected a float32 tensor"):
        finish_decode_rows(state, step.q, step.weights.half(), plan, SingleRank())
    with pytest.raises(ValueError, match=r"^q: 2 rows, the step has 4"):
        finish_decode_rows(state, step.q[:2], step.weights, plan, SingleRank())
    with pytest.raises(ValueError, match=r"^k: 9 must be in \[1, 8\]"):
        make_state(make_step(4, k=8)).__class__(topk_indices=torch.zeros(4, 8, dtype=torch.int32), k=9,
                                                index_k_cache=state.index_k_cache, max_model_len=64)
    big = DecodeMetadata(step.metadata.seq_lens, step.metadata.block_table, 4, 99, 10)
    with pytest.raises(ValueError, match="num_tokens"):
        plan_decode_rows(state, big, SingleRank())


class _Fixed:
    """A group that never gathers (for plans that stay replicated)."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def all_gather(self, local):
        raise AssertionError("a replicated step must not gather")


@pytest.mark.parametrize("world,rows,candidates", [(2, 18, None), (4, 18, 12), (4, 20, None), (8, 40, 12)])
def test_flow_simulated_ranks_match_replicated(world, rows, candidates):
    step = make_step(rows, heads=8, head_dim=32, max_model_len=256, k=16, candidates=candidates, max_rows=64)
    want = make_state(step, scorer=TorchScorer())
    decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
    group = Loopback(world)
    for _ in range(2):  # pass 1 fills the store, pass 2 gathers
        for rank in range(world):
            state = make_state(step, scorer=TorchScorer())
            decode_rows(state, step.metadata, step.q, step.weights, group.for_rank(rank))
            if _ == 1:
                assert torch.equal(state.topk_indices[:rows], want.topk_indices[:rows]), rank
                if candidates:
                    assert torch.equal(state.candidate_blocks[:rows], want.candidate_blocks[:rows]), rank
    group.check_sharded(step.metadata, gathers=2 if candidates else 1)


# ---------------------------------------------------------------------------
# Multi-process gloo runs
# ---------------------------------------------------------------------------

class _RecordingScorer(TorchScorer):
    """The torch scorer, recording how many rows it scored."""

    def __init__(self):
        self.rows = 0

    def logits(self, q, *args, **kwargs):
        self.rows += q.shape[0]
        return super().logits(q, *args, **kwargs)


class _TopkOnlyGather:
    """A custom gather that takes only the top-k rows (width k): the candidate
    blocks then go through torch.distributed, so both paths run."""

    def __init__(self, group, k):
        self.group, self.k, self.used = group, k, 0

    def accepts(self, local):
        return local.shape[1] == self.k

    def __call__(self, local):
        self.used += 1
        return self.group.all_gather(local)


# (rows, requests, candidates): slices of 8/8, short 10/8, below the minimum,
# two rows a request, rows not a multiple of the requests, empty and short last
# slices at world 4, and the candidate blocks.
GLOO_CASES = [(16, 16, None), (18, 18, 12), (8, 8, None), (32, 16, None), (20, 3, None), (18, 9, 12), (20, 20, None),
              (64, 64, 12)]


def _gloo_worker(rank, world, init_file):
    _init_gloo(rank, world, init_file)
    try:
        group = DistGroup()
        for rows, requests, candidates in GLOO_CASES:
            step = make_step(rows, requests=requests, heads=8, head_dim=32, max_model_len=256, k=16,
                             candidates=candidates, max_rows=64, seed=rows)
            want = make_state(step, scorer=TorchScorer())
            decode_rows(want, step.metadata, step.q, step.weights, SingleRank())

            scorer = _RecordingScorer()
            got = make_state(step, scorer=scorer)
            # Rows past the step differ by rank and stay as they are: a gather that copied a short or empty last
            # slice's padding (the last rank's rows past the step) over them is caught on the other ranks.
            got.topk_indices[rows:] = 1000 + rank
            if candidates:
                got.candidate_blocks[rows:] = 1000 + rank
            gather = _TopkOnlyGather(group, 16)
            plan = plan_decode_rows(got, step.metadata, group)
            finish_decode_rows(got, step.q, step.weights, plan, group, gather)

            bounds = row_shard_bounds(rows, requests, world, rank)
            start, end = bounds or (0, rows)
            assert (plan.start, plan.end) == (start, end), (rows, rank)
            assert scorer.rows == end - start, (rows, rank, scorer.rows)  # only its slice
            assert gather.used == (0 if bounds is None else 1)
            assert torch.equal(got.topk_indices[:rows], want.topk_indices[:rows]), (rows, rank)
            assert (got.topk_indices[rows:] == 1000 + rank).all(), (rows, rank)
            if candidates:
                assert torch.equal(got.candidate_blocks[:rows], want.candidate_blocks[:rows]), (rows, rank)
                assert (got.candidate_blocks[rows:] == 1000 + rank).all(), (rows, rank)
    finally:
        dist.destroy_process_group()


# A rank left waiting in a collective (one that another rank skipped or mismatched) raises after this, not after
# gloo's default of 30 minutes; a whole run takes ~3 s alone, under a minute with three runs on 2 cores.
GLOO_TIMEOUT = datetime.timedelta(seconds=120)
GLOO_DEADLINE_S = 300


def _init_gloo(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=GLOO_TIMEOUT)


def _spawn_gloo(worker, world):
    """Run ``worker(rank, world, init_file)`` in ``world`` processes that share a gloo rendezvous file; fail after
    GLOO_DEADLINE_S, and leave no rank running whatever happens (a failed rank's exception is raised here)."""
    with tempfile.TemporaryDirectory() as tmp:
        threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = threads or "1"  # the ranks' only; restored for the rest of the session
        try:
            ctx = mp.start_processes(worker, args=(world, os.path.join(tmp, "init")), nprocs=world, join=False,
                                     start_method="spawn")
        finally:
            if threads is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = threads
        deadline = time.monotonic() + GLOO_DEADLINE_S
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    pytest.fail(f"gloo ranks still running after {GLOO_DEADLINE_S} s: a collective hung")
        finally:
            for process in ctx.processes:
                if process.is_alive():
                    process.kill()
                process.join()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_sharded_equals_replicated(world):
    _spawn_gloo(_gloo_worker, world)


def _gloo_mixed_backend_worker(rank, world, init_file):
    _init_gloo(rank, world, init_file)
    try:
        real_backend = dist.get_backend
        dist.get_backend = lambda group=None: "cpu:gloo,cuda:nccl"  # what init_process_group() makes on a GPU
        try:
            group = DistGroup()
        finally:
            dist.get_backend = real_backend
        assert group._nccl, "a backend per device type that names nccl gathers CUDA tensors through NCCL"
        with gathers_taken(dist) as used:
            local = torch.arange(12, dtype=torch.int32).view(3, 4) + 100 * rank
            got = group.all_gather(local[:, :3])  # a strided view: gathered as its contiguous copy
        # CPU tensors go to that backend's gloo part: the list gather, which every torch's gloo takes.
        assert used == ["list"], used
        want = torch.cat([torch.arange(12, dtype=torch.int32).view(3, 4)[:, :3] + 100 * r for r in range(world)])
        assert torch.equal(got, want)
    finally:
        dist.destroy_process_group()


def test_dist_group_reads_a_backend_per_device_type():
    """DistGroup took its single-tensor NCCL gather only where the backend was exactly "nccl"; a group made by
    init_process_group() without a backend reports "cpu:gloo,cuda:nccl", and its CUDA rows went through the list
    gather and a concatenation. The CUDA side runs on the H200 (test_indexer_gpu.py)."""
    _spawn_gloo(_gloo_mixed_backend_worker, 2)


def _gloo_outside_subgroup_worker(rank, world, init_file):
    _init_gloo(rank, world, init_file)
    try:
        subgroup = dist.new_group(ranks=[0])  # every rank makes it; rank 1 is not in it
        if rank == 0:
            assert (DistGroup(subgroup).rank, DistGroup(subgroup).world_size) == (0, 1)
        else:
            with pytest.raises(ValueError, match=r"group: this process \(global rank 1\) is not a member"):
                DistGroup(subgroup)
    finally:
        dist.destroy_process_group()


def test_dist_group_of_a_subgroup_this_rank_is_outside():
    """DistGroup(subgroup) on a rank outside the subgroup raised torch's "Invalid process group specified" from its
    world size, naming no argument (torch gives such a rank -1 for its rank): a ValueError naming group (review-65a)."""
    _spawn_gloo(_gloo_outside_subgroup_worker, 2)


def _gloo_group_of_another_type_worker(rank, world, init_file):
    _init_gloo(rank, world, init_file)
    try:
        for group, kind in (([0], "list"), (types.SimpleNamespace(device_group=dist.group.WORLD), "SimpleNamespace")):
            with pytest.raises(TypeError, match=rf"^group: expected a torch.distributed ProcessGroup or None, got "
                                                rf"{kind}; pass dist.new_group\(ranks\)"):
                DistGroup(group)
        assert (DistGroup(dist.group.WORLD).rank, DistGroup(None).world_size) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_dist_group_of_another_type_is_refused_naming_group():
    """DistGroup([0]) (a list of ranks for the group) raised torch's "unhashable type: 'list'" from its rank lookup,
    naming nothing; a framework's group object that holds a ProcessGroup, torch's "Group ... is not registered". A
    TypeError naming group and the fix."""
    _spawn_gloo(_gloo_group_of_another_type_worker, 1)


@pytest.mark.parametrize("backend, takes_cpu", [("nccl", False), ("gloo", True), ("cpu:gloo,cuda:nccl", True),
                                                ("cuda:nccl", False), ("mpi", True)])
def test_dist_group_refuses_rows_on_a_device_its_backend_does_not_gather(backend, takes_cpu):
    """CPU buffers on an NCCL group: the gather failed inside torch.distributed after every rank with rows had scored.
    Refused by the plan, naming tp, before the reset (a backend this check does not know, such as mpi, is trusted)."""
    group = object.__new__(DistGroup)  # a group of this backend, at rank 0 of 2 (NCCL cannot start on this CPU)
    group.rank, group.world_size, group.group = 0, 2, None
    group._read_backend(backend)
    group._dist = None
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    if takes_cpu:
        assert plan_decode_rows(state, step.metadata, group).shard is not None
        return
    with pytest.raises(ValueError, match=r"^tp: its backend gathers \['cuda'\] tensors, the state's rows are on cpu"):
        plan_decode_rows(state, step.metadata, group)
    assert (state.topk_indices == 5).all(), "reset before the refusal"


# ---------------------------------------------------------------------------
# Review regressions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["block_table", "q"])
def test_invalid_inputs_raise_on_every_rank_before_gathering(bad):
    """World 4, 18 rows: rank 3's slice is empty. Invalid inputs must raise on it
    too, not send it into the gathers while ranks 0-2 raise (a hang on a real group)."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    md, q = step.metadata, step.q
    if bad == "block_table":  # 2 pages of 64 cannot cover max_model_len 256
        md = DecodeMetadata(md.seq_lens, md.block_table[:, :2], md.num_requests, md.num_tokens, md.max_seq_len)
    else:  # a strided query: the scorer takes contiguous ones only
        q = q.transpose(0, 1).contiguous().transpose(0, 1)
    for rank in range(4):
        state = make_state(step, scorer=TorchScorer())
        state.topk_indices.fill_(5)
        why = {"block_table": r"^metadata\.block_table: 2 pages of 64 do not cover", "q": r"^q: must be contiguous"}[bad]
        with pytest.raises(ValueError, match=why):
            plan = plan_decode_rows(state, md, _Fixed(rank=rank, world_size=4))
            finish_decode_rows(state, q, step.weights, plan, _Fixed(rank=rank, world_size=4))
        if bad == "block_table":
            assert (state.topk_indices == 5).all()  # rejected before anything was issued


class _ScheduleRowsScorer(TorchScorer):
    """A scorer whose schedule records the rows it was built for."""

    def schedule(self, seq_lens):
        return torch.tensor([seq_lens.shape[0]])

    def logits(self, q, weights, cache, seq_lens, block_table, schedule, max_model_len, **kwargs):
        assert schedule is not None and int(schedule[0]) == q.shape[0], "schedule of other rows"
        return super().logits(q, weights, cache, seq_lens, block_table, schedule, max_model_len, **kwargs)


def test_replicated_step_does_not_reuse_schedule_of_padded_rows():
    """seq_lens may hold more rows than the step (padding); the caller's schedule spans
    all of them, so a replicated step of fewer rows needs its own (the seed's rule)."""
    step = make_step(24, k=16, max_rows=24)
    scorer = _ScheduleRowsScorer()
    md = step.metadata
    padded = DecodeMetadata(md.seq_lens, md.block_table, 20, 20, md.max_seq_len, schedule=scorer.schedule(md.seq_lens))
    state = make_state(step, scorer=scorer)
    out = decode_rows(state, padded, step.q, step.weights, SingleRank())
    want = make_state(step, scorer=TorchScorer())
    decode_rows(want, DecodeMetadata(md.seq_lens[:20], md.block_table[:20], 20, 20, md.max_seq_len),
                step.q[:20], step.weights[:20], SingleRank())
    assert torch.equal(out[:20], want.topk_indices[:20])


def test_negative_num_tokens_is_rejected():
    step = make_step(4, k=8)
    md = step.metadata
    with pytest.raises(ValueError, match="num_tokens"):
        plan_decode_rows(make_state(step, scorer=TorchScorer()),
                         DecodeMetadata(md.seq_lens, md.block_table, 4, -1, md.max_seq_len), SingleRank())


@pytest.mark.parametrize("block_mode", [False, True])
def test_torch_topk_select_keeps_minus_inf_candidates_inside_the_row(block_mode):
    from runtime.indexer import _torch_topk_select

    logits = torch.full((2, 64), float("-inf"))
    logits[:, 0] = 1.0
    logits[0, 1] = float("nan")
    ends = torch.tensor([3, 20], dtype=torch.int32)
    k = 4
    out = torch.empty(2, k, dtype=torch.int32)
    _torch_topk_select(logits, ends, out, block_mode)
    ref = reference.decode_topk_reference(logits, ends, k, block_mode=block_mode)
    # Row 0 has fewer candidates than k (no ties to break): the reference's set exactly.
    assert torch.equal(out[0].sort().values, ref[0].sort().values), (out, ref)
    if block_mode:  # 3 blocks, fewer than k: the reference's set
        assert sorted(out[1].tolist()) == sorted(ref[1].tolist()), out
    else:  # ties at the threshold (torch's tie order): the best, then columns inside the row
        assert 0 in out[1].tolist() and ((out[1] >= 0) & (out[1] < 20)).all(), out


def test_finish_rejects_a_plan_of_another_rank_or_state():
    """A plan carries the group and buffers it was made for: another rank's plan would gather slices of
    the wrong rows, another state's (fewer rows) could gather past its buffers."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    plan = plan_decode_rows(state, step.metadata, _Fixed(rank=1, world_size=4))
    with pytest.raises(ValueError, match="tp: rank 2 of 4"):
        finish_decode_rows(state, step.q, step.weights, plan, _Fixed(rank=2, world_size=4))
    other = make_state(make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=40),
                       scorer=TorchScorer())
    with pytest.raises(ValueError, match="plan: made for a state of 64"):
        finish_decode_rows(other, step.q, step.weights, plan, _Fixed(rank=1, world_size=4))
    # The same rows, other buffers: another layer's state, or this one without its candidate buffer.
    for twin in (make_state(step, scorer=TorchScorer()),
                 dataclasses.replace(state, candidate_blocks=torch.full((64, 4), -1, dtype=torch.int32))):
        before = twin.topk_indices.clone()
        with pytest.raises(ValueError, match="plan: made for another state's top-k or candidate buffers"):
            finish_decode_rows(twin, step.q, step.weights, plan, _Fixed(rank=1, world_size=4))
        assert torch.equal(twin.topk_indices, before)


class _CheckCountingScorer(TorchScorer):
    """The torch scorer, counting its input checks and the logits calls that ran one."""

    def __init__(self):
        self.checks = 0

    def check_inputs(self, *args):
        self.checks += 1
        super().check_inputs(*args)


def _step_beside_torch_scorer(scorer):
    """One decode_rows step of 6 rows through ``scorer`` and through a plain TorchScorer: (step, its state, the
    plain state), the top-k rows asserted equal."""
    step = make_step(6, k=8)
    state, want = make_state(step, scorer=scorer), make_state(step, scorer=TorchScorer())
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices, want.topk_indices)
    return step, state, want


def test_finish_checks_the_scoring_inputs_once():
    """finish_decode_rows checks the whole step's scoring inputs (every rank, even with an empty slice), so
    the scorer is told not to check its slice again: one check a step, not two (~3.4 µs of host time)."""
    scorer = _CheckCountingScorer()
    step, state, _ = _step_beside_torch_scorer(scorer)
    assert scorer.checks == 1
    # A direct call still checks: checked=False is the default.
    md = step.metadata
    with pytest.raises(TypeError, match="q"):
        scorer.logits(step.q.float(), step.weights, state.index_k_cache, md.seq_lens, md.block_table, None,
                      state.max_model_len)
    assert scorer.checks == 2


class _LayoutRecordingScorer(TorchScorer):
    """The torch scorer, recording the layout_checked of each input check."""

    def __init__(self):
        self.asked = []

    def check_inputs(self, *args, layout_checked=False):
        self.asked.append(layout_checked)
        super().check_inputs(*args, layout_checked=layout_checked)


def test_the_step_leaves_the_scorer_its_own_checks():
    """decode_rows checks q, weights and the metadata itself right before the scorer's input check, and the finish
    of a separate plan checks q and weights and that the metadata is as the plan checked it: the scorer repeated
    those checks on the same tensors (host time on every layer of an eager step). A scorer that takes
    layout_checked now checks only what they do not; a scorer without the keyword (_CheckCountingScorer) is called
    as before."""
    scorer = _LayoutRecordingScorer()
    step, state, want = _step_beside_torch_scorer(scorer)
    assert scorer.asked == [True]
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert scorer.asked == [True, True] and torch.equal(state.topk_indices, want.topk_indices)
    strided = step.q.transpose(0, 1).contiguous().transpose(0, 1)
    refusal = r"^q: must be contiguous, got strides \(\d+, \d+, 1\); pass q\.contiguous\(\)$"
    with pytest.raises(ValueError, match=refusal):
        decode_rows(state, step.metadata, strided, step.weights, SingleRank())
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    with pytest.raises(ValueError, match=refusal):
        finish_decode_rows(state, strided, step.weights, plan, SingleRank())


def test_finish_refuses_the_plan_of_a_state_with_a_longer_context():
    """A state that shares the plan's buffers (dataclasses.replace of it) may have a longer max_model_len than the
    plan's state, which the plan's metadata does not cover (4 pages of 64 against 512 columns). Until plan serials
    were unique in the process, the other state's first plan had the same serial and the finish reached its own
    context check; now the plan is refused as another state's, before anything is scored."""
    import dataclasses

    step = make_step(6, k=8, max_model_len=256)
    md = step.metadata
    state = make_state(step, scorer=TorchScorer())
    longer = dataclasses.replace(state, max_model_len=512)
    wide = DecodeMetadata(md.seq_lens.clone(), torch.cat([md.block_table, md.block_table], 1), md.num_requests,
                          md.num_tokens, md.max_seq_len)
    plan_decode_rows(longer, wide, SingleRank())
    plan = plan_decode_rows(state, md, SingleRank())
    assert md.block_table.shape[1] == 4 and plan.buffers == (longer.topk_indices.data_ptr(), None)
    with pytest.raises(ValueError, match=r"^plan: not this state's latest plan .*another state"):
        finish_decode_rows(longer, step.q, step.weights, plan, SingleRank())
    assert (longer.topk_indices[:6] == -1).all()  # nothing scored
    # A plan whose serial was replaced by hand still meets the finish's own context check.
    forged = dataclasses.replace(plan, serial=longer._plans)
    with pytest.raises(ValueError, match=r"^metadata\.block_table: 4 pages of 64 do not cover max_model_len 512"):
        finish_decode_rows(longer, step.q, step.weights, forged, SingleRank())
    assert (longer.topk_indices[:6] == -1).all()


def test_lean_scorer_check_still_checks_the_key_cache():
    """The key cache was checked when the state was built, but a tensor can be changed in place since: the lean
    check refuses it as the whole check does."""
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    cache = state.index_k_cache
    pages, _, _, width = cache.shape  # the same bytes, pages and rows transposed: no longer contiguous
    cache.as_strided_(cache.shape, (width, pages * width, width, 1))
    with pytest.raises(ValueError, match=r"^index_k_cache: must be contiguous|^cache: must be contiguous"):
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())


@pytest.mark.parametrize("max_model_len", [509, 510, 511, 512])
def test_torch_scorer_logits_rows_sit_16_bytes_apart(max_model_len):
    """The torch scorer's logits have DeepGEMM's row layout: a row stride padded to 16 bytes, so the AOT top-k can
    read them whatever max_model_len is (contiguous rows of 509-511 FP32 columns sent every selection to the exact
    reference, warned on ranks with rows only). The values are the reference's."""
    step = make_step(5, max_model_len=max_model_len)
    md, a = step.metadata, step.state_args
    args = (step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table)
    got = TorchScorer().logits(*args, None, max_model_len)
    assert got.shape == (5, max_model_len) and got.stride() == (512, 1)
    assert torch.equal(got, reference.indexer_logits_reference(*args, max_model_len))


@pytest.mark.parametrize("max_model_len", [509, 510, 511])
def test_flow_selects_the_same_from_padded_torch_scorer_logits(max_model_len):
    """The whole step on the torch scorer's padded logits, both backends, candidate blocks too, with one row as long
    as the context (its last group ends at the padding): the picks equal the selection reference's on the contiguous
    reference logits, and no warning is given."""
    step = make_step(6, max_model_len=max_model_len, k=512, candidates=64)
    step.metadata.seq_lens[0] = max_model_len
    md, a = dataclasses.replace(step.metadata, max_seq_len=max_model_len), step.state_args
    logits = reference.indexer_logits_reference(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table,
                                                max_model_len)
    want = reference.decode_topk_reference(logits, md.seq_lens, 512).sort(1).values
    want_blocks = reference.decode_topk_reference(logits, md.seq_lens, 64, block_mode=True).sort(1).values
    for backend in ("auto", "torch"):
        state = make_state(step, scorer=TorchScorer(), topk_backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            decode_rows(state, md, step.q, step.weights, SingleRank())
        assert torch.equal(state.topk_indices[:6, :512].sort(1).values, want), backend
        assert torch.equal(state.candidate_blocks[:6].sort(1).values, want_blocks), backend


def test_a_scorer_whose_signature_cannot_be_read_gets_no_optional_keyword():
    """layout_checked is optional: a check_inputs whose signature cannot be read (a compiled method) is called
    without it, not with a keyword it may not take."""

    class _Compiled:
        def __init__(self, inner):
            self.inner, self.calls = inner, []

        @property
        def __signature__(self):
            raise ValueError("no signature found for builtin")

        def __call__(self, *args):
            self.calls.append(len(args))
            return self.inner(*args)

    step = make_step(6, k=8)
    scorer = TorchScorer()
    scorer.check_inputs = _Compiled(scorer.check_inputs)
    state = make_state(step, scorer=scorer)
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert scorer.check_inputs.calls == [6]


@pytest.mark.parametrize("change", ["storage shrunk", "dtype"])
def test_finish_refuses_metadata_tensors_changed_since_the_plan(change):
    """The finish relies on the plan's checks of the metadata's tensors: one whose storage shrank since, or replaced
    by a view of the same memory as another dtype, is refused before anything is scored."""
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    md = step.metadata
    md.seq_lens = md.seq_lens.clone()
    plan = plan_decode_rows(state, md, SingleRank())
    if change == "dtype":
        md.seq_lens = md.seq_lens.view(torch.float32)
        why = r"^metadata\.seq_lens: changed since plan_decode_rows"
    else:  # the resize may move the memory (then the layout check names it) or keep it (the storage check)
        md.seq_lens.untyped_storage().resize_(4)
        why = r"^metadata\.seq_lens: (changed since plan_decode_rows|its view ends at byte)"
    before = state.topk_indices.clone()
    with pytest.raises(ValueError, match=why):
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert torch.equal(state.topk_indices, before)


@pytest.mark.parametrize("bad", ["q strided", "weights column stride", "cache storage shrunk"])
def test_lean_scorer_check_refuses_what_the_indexer_does_not_check(bad):
    """check_inputs(layout_checked=True) still refuses what the indexer's own checks do not cover, with the message
    of the whole check: a strided q, weights of non-unit column stride, a key cache whose storage shrank."""
    step = make_step(4, k=8)
    md, q, weights = step.metadata, step.q, step.weights
    cache = step.state_args["index_k_cache"].clone()
    if bad == "q strided":
        q = q.transpose(0, 1).contiguous().transpose(0, 1)
    elif bad == "weights column stride":
        weights = weights.t().contiguous().t()
    else:
        cache.untyped_storage().resize_(cache.nbytes // 2)
    said = []
    for lean in (False, True):
        with pytest.raises(ValueError) as refused:
            TorchScorer().check_inputs(q, weights, cache, md.seq_lens, md.block_table,
                                       step.state_args["max_model_len"], layout_checked=lean)
        said.append(str(refused.value))
    assert said[0] == said[1] and said[0].startswith(bad.split()[0]), said


def test_state_refuses_a_scorer_without_the_interface():
    class _NoCheck:
        name = "partial"

        def schedule(self, seq_lens):
            return None

        def logits(self, *args, **kwargs):
            raise AssertionError("never called")

    step = make_step(4, k=8)
    with pytest.raises(TypeError, match="scorer: _NoCheck lacks check_inputs"):
        make_state(step, scorer=_NoCheck())


# ---------------------------------------------------------------------------
# Second review's regressions
# ---------------------------------------------------------------------------

def _tiny_cache(head_dim=32):
    return torch.zeros(1, reference.INDEX_BLOCK_KV, 1, head_dim + reference.INDEX_SCALE_BYTES, dtype=torch.uint8)


def test_state_refuses_logits_wider_than_the_selection_takes():
    """max_model_len past runtime.topk.MAX_WIDTH: only ranks with rows would select (and raise) while an
    empty-slice rank enters the all-gather, so the state refuses it on every rank, before any step."""
    from runtime import topk
    from runtime.indexer import IndexerState

    def state(width):
        return IndexerState(torch.zeros(32, 16, dtype=torch.int32), 16, _tiny_cache(), width, scorer=TorchScorer())

    with pytest.raises(ValueError, match=r"max_model_len: 2097152 exceeds .* 2097151 columns"):
        state(1 << 21)
    assert state(topk.MAX_WIDTH).max_model_len == topk.MAX_WIDTH
    wide = IndexerState(torch.zeros(32, 16, dtype=torch.int32), 16, _tiny_cache(), 1 << 21, scorer=TorchScorer(),
                        topk_backend="torch")  # torch.topk has no width limit
    assert wide.max_model_len == 1 << 21


def test_deepgemm_scorer_refuses_weights_with_a_padded_row_stride():
    """DeepGEMM's host code asserts weights.is_contiguous(); its scorer's check says so first (built without
    __init__, which needs a GPU, as on an H200)."""
    scorer = _cpu_deepgemm_scorer()
    rows, heads, dim = 4, 64, 128
    q = torch.zeros(rows, heads, dim).to(torch.float8_e4m3fn)
    cache = _tiny_cache(dim).expand(2, -1, -1, -1).contiguous()
    seq_lens, table = torch.ones(rows, dtype=torch.int32), torch.zeros(rows, 2, dtype=torch.int32)
    split = torch.zeros(rows, heads + 8)[:, :heads]  # e.g. a split of a fused projection
    with pytest.raises(ValueError, match=r"weights: DeepGEMM takes contiguous weights.*weights.contiguous\(\)"):
        scorer.check_inputs(q, split, cache, seq_lens, table, 128)
    scorer.check_inputs(q, split.contiguous(), cache, seq_lens, table, 128)


def test_shard_math_takes_any_integer_and_refuses_bools_and_floats():
    """Counts often arrive as numpy integers; bools and floats are refused naming the argument."""
    np = pytest.importorskip("numpy")
    assert row_shard_rows(np.int64(32), np.int32(32), np.int64(4)) == row_shard_rows(32, 32, 4) == 8
    bounds = row_shard_bounds(np.int64(32), 32, 4, np.int64(3))
    assert bounds == (24, 32) and all(type(b) is int for b in bounds)
    for args, name in (((True, 16, 2), "num_rows"), ((16, 16.0, 2), "num_requests"), ((16, 16, 2.0), "world_size")):
        with pytest.raises(TypeError, match=name):
            row_shard_rows(*args)
    with pytest.raises(TypeError, match="rank"):
        row_shard_bounds(16, 16, 2, False)
    with pytest.raises(TypeError, match="rank"):
        row_shard_bounds(16, 16, 2, 1.0)
    with pytest.raises(ValueError, match="world_size"):
        row_shard_rows(16, 16, np.int64(0))


def test_metadata_counts_take_any_integer_and_refuse_bools_and_floats():
    """The metadata's counts may be numpy integers (the step equals the one with Python ints); bools, floats and
    negative counts are refused when the metadata is built, naming the field."""
    np = pytest.importorskip("numpy")
    step = make_step(12, k=8)
    md = step.metadata
    numpy_md = DecodeMetadata(md.seq_lens, md.block_table, np.int64(md.num_requests), np.int32(md.num_tokens),
                              np.int64(md.max_seq_len), num_prefills=np.int64(0))
    assert all(type(getattr(numpy_md, f)) is int for f in ("num_requests", "num_tokens", "max_seq_len", "num_prefills"))
    state = make_state(step, scorer=TorchScorer())
    decode_rows(state, numpy_md, step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices[:12], _expected(step)[:12])
    for field, value, exc in (("num_tokens", True, TypeError), ("num_requests", 4.0, TypeError),
                              ("max_seq_len", -1, ValueError), ("num_prefills", None, TypeError)):
        kw = dict(num_requests=md.num_requests, num_tokens=md.num_tokens, max_seq_len=md.max_seq_len, num_prefills=0)
        kw[field] = value
        with pytest.raises(exc, match=f"metadata.{field}"):
            DecodeMetadata(md.seq_lens, md.block_table, **kw)


def _padded_step_after_a_full_one(candidates=None):
    """A step of 24 rows, then a CUDA graph's step padded to those 24 rows with 20 real ones: (step, state, the
    padded step's metadata), the state's buffers as the padded step left them."""
    step = make_step(24, k=16, candidates=candidates, max_rows=24)
    state = make_state(step, scorer=TorchScorer())
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())  # the previous step: 24 rows
    assert (state.topk_indices[20:24] >= 0).any()
    md = step.metadata
    padded = DecodeMetadata(md.seq_lens, md.block_table, 20, 20, md.max_seq_len)
    decode_rows(state, padded, step.q, step.weights, SingleRank())  # q has the padded step's 24 rows
    return step, state, padded


def test_padded_rows_of_the_step_are_reset():
    """A CUDA graph padded to 24 rows with 20 real ones: rows 20-23 of the top-k buffer are reset to -1 (the
    seed resets every token of the step), not left with the previous step's indices."""
    step, state, _ = _padded_step_after_a_full_one()
    assert (state.topk_indices[20:24] == -1).all()
    assert torch.equal(state.topk_indices[:20], _expected(step)[:20])


def test_padded_rows_of_the_candidate_buffer_are_reset():
    """The candidate buffer's padded rows are reset as the top-k buffer's are: a CUDA graph padded to 24 rows with 20
    real ones after a step of 24 rows left rows 20-23 holding the earlier step's candidate blocks (review-65a)."""
    step, state, padded = _padded_step_after_a_full_one(candidates=12)
    assert (state.topk_indices[20:24] == -1).all() and (state.candidate_blocks[20:24] == -1).all()
    assert torch.equal(state.candidate_blocks[:20], _expected(step, block_mode=True)[:20])
    state.candidate_blocks.fill_(5)
    plan_decode_rows(state, padded, SingleRank(), padded_tokens=22)  # the split flow: the plan resets them
    assert (state.candidate_blocks[20:22] == -1).all() and (state.candidate_blocks[22:] == 5).all()


def test_plan_resets_padded_tokens_and_checks_them():
    step = make_step(20, k=16, max_rows=24)
    state = make_state(step, scorer=TorchScorer())
    md = step.metadata
    state.topk_indices.fill_(5)
    plan_decode_rows(state, md, SingleRank())
    assert (state.topk_indices[:20] == -1).all() and (state.topk_indices[20:] == 5).all()  # default: num_tokens
    plan_decode_rows(state, md, SingleRank(), padded_tokens=22)
    assert (state.topk_indices[:22] == -1).all() and (state.topk_indices[22:] == 5).all()
    state.topk_indices.fill_(5)
    for bad, error in ((19, ValueError), (25, ValueError), (22.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="padded_tokens"):
            plan_decode_rows(state, md, SingleRank(), padded_tokens=bad)
    assert (state.topk_indices == 5).all()  # refused before anything was issued
    # decode_rows passes q's rows, up to the buffer's: a q cut from a larger preallocated buffer is taken.
    decode_rows(state, md, torch.cat([step.q, step.q[:10]]), torch.cat([step.weights, step.weights[:10]]),
                SingleRank())
    assert (state.topk_indices[20:24] == -1).all()
    assert torch.equal(state.topk_indices[:20], _expected(step)[:20])


class _AlignedOnlyGather:
    """A custom gather that, like a one-shot kernel needing 16-byte aligned inputs, takes only aligned ones,
    recording what it was asked about and what it chose."""

    def __init__(self, group):
        self.group, self.asked, self.choices = group, [], []

    def accepts(self, local):
        self.asked.append((local.is_contiguous(), local.data_ptr() % 256))
        self.choices.append(local.data_ptr() % 16 == 0)
        return self.choices[-1]

    def __call__(self, local):
        return self.group.all_gather(local)


def _gloo_alignment_worker(rank, world, init_file):
    _init_gloo(rank, world, init_file)
    try:
        group = DistGroup()
        # 18 rows in slices of 10: rank 1's candidate rows start 10 x 12 bytes into the 3-column buffer.
        step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, candidates=3, max_rows=64)
        want = make_state(step, scorer=TorchScorer())
        decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
        got = make_state(step, scorer=TorchScorer())
        gather = _AlignedOnlyGather(group)
        decode_rows(got, step.metadata, step.q, step.weights, group, gather)

        assert gather.asked == [(True, 0), (True, 0)], gather.asked  # top-k rows, then the candidate blocks
        every_rank = [None] * world
        dist.all_gather_object(every_rank, gather.choices)
        assert all(choices == every_rank[0] for choices in every_rank), every_rank
        assert torch.equal(got.topk_indices[:18], want.topk_indices[:18])
        assert torch.equal(got.candidate_blocks[:18], want.candidate_blocks[:18])
    finally:
        dist.destroy_process_group()


def test_gloo_every_rank_picks_the_same_gather():
    """A custom gather's accepts sees a tensor laid out alike on every rank (contiguous, 256-byte aligned), so
    an alignment-checking accepts cannot take the custom gather on one rank and torch.distributed on another
    (a deadlock on a real group)."""
    _spawn_gloo(_gloo_alignment_worker, 2)


def _with(md, *, seq_lens=None, block_table=None):
    return DecodeMetadata(md.seq_lens if seq_lens is None else seq_lens,
                          md.block_table if block_table is None else block_table,
                          md.num_requests, md.num_tokens, md.max_seq_len)


def test_metadata_value_check_catches_each_bad_value():
    """seq_lens in [0, max_model_len]; the ids of a row's first ceil(seq_lens / 64) pages index the cache.
    Ids past the pages a row reads (padding) are not read, so they are not checked."""
    from runtime.indexer import check_decode_metadata_values

    step = make_step(6, heads=8, head_dim=32, max_model_len=256, k=8)
    state = make_state(step, scorer=TorchScorer())
    md, pages = step.metadata, state.index_k_cache.shape[0]
    check_decode_metadata_values(state, md)
    lens = md.seq_lens.clone()
    lens[2] = 130  # reads pages 0-2 of its row
    table = md.block_table.clone()
    table[2, 3] = -1  # a page it does not read
    table[4:, :] = -7  # rows past the step
    check_decode_metadata_values(state, DecodeMetadata(lens, table, 4, 4, 256))

    edges = md.seq_lens.clone()
    edges[0], edges[1] = 0, 256  # both ends of [0, max_model_len] are lengths a step may hold
    check_decode_metadata_values(state, _with(md, seq_lens=edges))
    for value, where in ((257, "row 3 holds 257"), (-1, "row 3 holds -1")):
        bad = md.seq_lens.clone()
        bad[3] = value
        with pytest.raises(ValueError, match=f"metadata.seq_lens: {where}, outside \\[0, 256\\]"):
            check_decode_metadata_values(state, _with(md, seq_lens=bad))
    for value in (pages, -1):
        bad = table.clone()
        bad[2, 2] = value
        with pytest.raises(ValueError, match=f"metadata.block_table: row 2 reads page 2 as id {value}, outside"):
            check_decode_metadata_values(state, DecodeMetadata(lens, bad, 4, 4, 256))


def test_metadata_value_check_rebuilds_the_schedule_with_the_state_device_current(monkeypatch):
    """check_decode_metadata_values rebuilds the scorer's schedule to compare with metadata.schedule; it did so with
    the process's current device, not the state's, so for a state on cuda:1 while cuda:0 was current
    DeepGemmScorer.schedule refused seq_lens (off the current device) where the metadata was right. It makes the
    state's device current, as the plan that runs it under SPARSE_DECODE_AOT_CHECK_METADATA does."""
    from runtime import indexer
    from runtime.indexer import check_decode_metadata_values

    scorer = _CurrentDeviceScorer()
    monkeypatch.setattr(indexer, "_on_device", scorer.making_current)
    step = make_step(6, heads=8, head_dim=32, max_model_len=256, k=8)
    state = make_state(step, scorer=scorer)
    with scorer.making_current(state.topk_indices.device):
        md = _with_schedule(step.metadata, scorer.schedule(step.metadata.seq_lens))
    check_decode_metadata_values(state, md)
    monkeypatch.setattr(indexer, "CHECK_METADATA_VALUES", True)
    finish_decode_rows(state, step.q, step.weights, plan_decode_rows(state, md, SingleRank()), SingleRank())
    assert torch.equal(state.topk_indices[:6], _expected(step))


def test_metadata_value_check_runs_in_the_plan_when_asked(monkeypatch):
    """SPARSE_DECODE_AOT_CHECK_METADATA (read at import into CHECK_METADATA_VALUES) makes plan_decode_rows
    check the device values before it issues anything; unset, the plan trusts them (no device sync)."""
    from runtime import indexer

    step = make_step(6, heads=8, head_dim=32, max_model_len=256, k=8)
    bad_lens = step.metadata.seq_lens.clone()
    bad_lens[5] = 300
    bad = _with(step.metadata, seq_lens=bad_lens)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    monkeypatch.setattr(indexer, "CHECK_METADATA_VALUES", True)
    with pytest.raises(ValueError, match="metadata.seq_lens: row 5 holds 300"):
        plan_decode_rows(state, bad, SingleRank())
    assert (state.topk_indices == 5).all()  # refused before anything was issued
    assert plan_decode_rows(state, step.metadata, SingleRank()) is not None
    monkeypatch.setattr(indexer, "CHECK_METADATA_VALUES", False)
    assert plan_decode_rows(state, bad, SingleRank()) is not None


class _LengthScheduleScorer(TorchScorer):
    """The torch scorer with a schedule that, like DeepGEMM's, depends on seq_lens' values."""

    def schedule(self, seq_lens):
        return seq_lens.cumsum(0, dtype=torch.int32)


def test_metadata_value_check_refuses_a_stale_schedule(monkeypatch):
    """A schedule of other seq_lens values than the step's (a caller's, built for an earlier step; or the plan's,
    after seq_lens was written between plan and finish) would have DeepGEMM's scoring run past its rows or never
    end: the value check refuses it, in the plan and, where asked, in the finish before it scores."""
    from runtime import indexer
    from runtime.indexer import check_decode_metadata_values

    step = make_step(6, heads=8, head_dim=32, max_model_len=256, k=8)
    lens = step.metadata.seq_lens.clone()
    scorer = _LengthScheduleScorer()
    state = make_state(step, scorer=scorer)
    stale = DecodeMetadata(lens, step.metadata.block_table, 6, 6, step.metadata.max_seq_len,
                           schedule=scorer.schedule(lens + 1))
    with pytest.raises(ValueError, match=r"^metadata.schedule: the schedule is not the scorer's schedule"):
        check_decode_metadata_values(state, stale)
    current = dataclasses.replace(stale, schedule=scorer.schedule(lens))
    check_decode_metadata_values(state, current)
    monkeypatch.setattr(indexer, "CHECK_METADATA_VALUES", True)
    state.topk_indices.fill_(5)
    with pytest.raises(ValueError, match=r"^metadata.schedule: "):
        plan_decode_rows(state, stale, SingleRank())
    assert (state.topk_indices == 5).all()  # refused before anything was issued
    for md in (current, _with(step.metadata, seq_lens=lens)):  # the caller's schedule, and the plan's own
        plan = plan_decode_rows(state, md, SingleRank())
        lens[2] -= 1  # written between plan and finish
        with pytest.raises(ValueError, match=r"^metadata.seq_lens: .*changed since plan_decode_rows"):
            finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
        lens[2] += 1
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())


def test_finish_captured_with_a_plan_made_outside_the_capture_is_refused(monkeypatch):
    """A finish captured into a CUDA graph bakes the plan's schedule tensor into every replay: one the plan built
    outside the capture (or a caller's schedule it kept) holds seq_lens' values of that moment, and a replay of
    longer rows never ends in DeepGEMM's scoring, nor does the graph hold the plan's reset. Such a finish is refused
    before it issues anything; a plan and finish in one capture (or both eager), and decode_rows, run. (The capture
    state is simulated here: the GPU test captures for real.)"""
    from runtime import indexer

    capturing = {"now": False}
    monkeypatch.setattr(indexer, "_capturing", lambda device: capturing["now"], raising=False)
    step = make_step(6, heads=8, head_dim=32, max_model_len=256, k=8)
    scorer = _LengthScheduleScorer()
    state = make_state(step, scorer=scorer)
    want = make_state(step, scorer=scorer)
    decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
    callers = _with_schedule(step.metadata, scorer.schedule(step.metadata.seq_lens))
    for md in (step.metadata, callers):  # the plan's own schedule, and the caller's it keeps
        plan = plan_decode_rows(state, md, SingleRank())
        state.topk_indices.fill_(5)
        capturing["now"] = True
        with pytest.raises(ValueError, match=r"^plan: made outside the CUDA graph capture"):
            finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
        assert (state.topk_indices == 5).all()  # refused before anything was issued
        plan = plan_decode_rows(state, md, SingleRank())  # inside the capture: its schedule and reset are too
        assert torch.equal(finish_decode_rows(state, step.q, step.weights, plan, SingleRank()), want.topk_indices)
        assert torch.equal(decode_rows(state, md, step.q, step.weights, SingleRank()), want.topk_indices)
        capturing["now"] = False
        plan = plan_decode_rows(state, md, SingleRank())
        assert torch.equal(finish_decode_rows(state, step.q, step.weights, plan, SingleRank()), want.topk_indices)


def test_captured_finish_of_a_sharded_plan_made_outside_is_refused_on_every_rank(monkeypatch):
    """18 rows over 4 ranks: rank 3's slice is empty and holds no schedule. A plan made outside the capture with
    its finish captured was refused on ranks 0-2 only, while rank 3 went on into the all-gather (a hang with a real
    group). Every rank now refuses before its gather, and in one capture (or eager) every rank finishes."""
    from runtime import indexer

    capturing = {"now": False}
    monkeypatch.setattr(indexer, "_capturing", lambda device: capturing["now"], raising=False)
    step = make_step(18, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    scorer = _LengthScheduleScorer()
    world = 4
    assert len(range(*row_shard_bounds(18, step.metadata.num_requests, world, world - 1))) == 0
    gathered = []

    class _Counting(Loopback):
        def all_gather(self, local):
            gathered.append(self.rank)
            return super().all_gather(local)

    group = _Counting(world)
    for rank in range(world):
        state = make_state(step, scorer=scorer)
        capturing["now"] = False
        plan = plan_decode_rows(state, step.metadata, group.for_rank(rank))
        capturing["now"] = True
        with pytest.raises(ValueError, match=r"^plan: made outside the CUDA graph capture"):
            finish_decode_rows(state, step.q, step.weights, plan, group.for_rank(rank))
        plan = plan_decode_rows(state, step.metadata, group.for_rank(rank))  # in the same capture: runs
        finish_decode_rows(state, step.q, step.weights, plan, group.for_rank(rank))
    assert gathered == list(range(world)), "each rank gathered once, after its plan in the capture"


def test_metadata_value_check_passes_empty_slices_with_the_callers_schedule(monkeypatch):
    """With the value check on, a rank whose slice is empty (18 rows over 8 ranks: ranks 6 and 7) compared the
    caller's schedule of the whole step, which its plan keeps and never scores with, against one rebuilt from its
    zero rows, and raised 'changed since plan_decode_rows' on correct metadata, while the other ranks went on into
    the all-gather (a hang with a real group). Every rank now finishes, and the gathered rows equal a replicated
    run's. A seq_lens written between plan and finish is refused on every rank alike: on the rank whose slice holds
    the row, on a rank whose slice does not (it compared its own rows only, and went on into the all-gather while the
    first raised), and on an empty slice's."""
    from runtime import indexer

    monkeypatch.setattr(indexer, "CHECK_METADATA_VALUES", True)
    step = make_step(18, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    scorer = _LengthScheduleScorer()
    md = _with_schedule(step.metadata, scorer.schedule(step.metadata.seq_lens))
    want = make_state(step, scorer=scorer)
    decode_rows(want, md, step.q, step.weights, SingleRank())
    world = 8
    empty = [r for r in range(world) if len(range(*row_shard_bounds(18, md.num_requests, world, r))) == 0]
    assert empty, "the case has no empty slice"
    group = Loopback(world)
    for pass_ in range(2):  # pass 1 fills the store, pass 2 gathers
        for rank in range(world):
            state = make_state(step, scorer=scorer)
            plan = plan_decode_rows(state, md, group.for_rank(rank))
            finish_decode_rows(state, step.q, step.weights, plan, group.for_rank(rank))
            if pass_ == 1:
                assert torch.equal(state.topk_indices[:18], want.topk_indices[:18]), rank
    group.check_sharded(md, gathers=1)
    states = [make_state(step, scorer=scorer) for _ in range(world)]
    plans = [plan_decode_rows(states[rank], md, group.for_rank(rank)) for rank in range(world)]
    md.seq_lens[0] -= 1  # written between plan and finish: row 0 is rank 0's
    for rank in (0, 1, *empty):
        with pytest.raises(ValueError, match=r"^metadata.seq_lens: .*changed since plan_decode_rows"):
            finish_decode_rows(states[rank], step.q, step.weights, plans[rank], group.for_rank(rank))


@pytest.mark.parametrize("value,enabled", [("1", True), ("0", False), ("", False)])
def test_metadata_value_check_follows_the_environment(value, enabled):
    import subprocess
    import sys

    env = dict(os.environ, SPARSE_DECODE_AOT_CHECK_METADATA=value)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", "import runtime.indexer as i; print(i.CHECK_METADATA_VALUES)"],
                         env=env, cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(enabled)


def test_state_refuses_a_scorer_whose_logits_lacks_checked():
    """The step calls logits(..., checked=True), on ranks with rows only: a scorer of the older interface would
    raise there while an empty-slice rank waits in the all-gather, so the state refuses it when built."""

    class _OldLogits(TorchScorer):
        def logits(self, q, weights, cache, seq_lens, block_table, schedule, max_model_len):
            raise AssertionError("never called")

    class _Forwarding(TorchScorer):
        def logits(self, *args, **kwargs):
            return super().logits(*args, **kwargs)

    step = make_step(4, k=8)
    with pytest.raises(TypeError, match="scorer: _OldLogits.logits takes no keyword 'checked'"):
        make_state(step, scorer=_OldLogits())
    state = make_state(step, scorer=_Forwarding())  # **kwargs takes it
    want = make_state(step, scorer=TorchScorer())
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices, want.topk_indices)


# ---------------------------------------------------------------------------
# Thirty-eighth session's review: arguments refused before anything is issued
# ---------------------------------------------------------------------------

def test_state_scalars_take_any_integer_and_refuse_bools():
    """k and max_model_len may be numpy integers (held as ints); a bool is refused, not read as 1."""
    np = pytest.importorskip("numpy")
    from runtime.indexer import IndexerState

    def state(k, width):
        return IndexerState(torch.zeros(32, 16, dtype=torch.int32), k, _tiny_cache(), width, scorer=TorchScorer())

    made = state(np.int64(8), np.int64(512))
    assert (made.k, made.max_model_len) == (8, 512) and type(made.k) is int and type(made.max_model_len) is int
    for k, width, name in ((True, 512, "k"), (8, True, "max_model_len"), (8.0, 512, "k"), (8, 512.0, "max_model_len")):
        with pytest.raises(TypeError, match=name):
            state(k, width)
    with pytest.raises(ValueError, match=r"k: 17 must be in \[1, 16\]"):
        state(17, 512)


@pytest.mark.parametrize("cache, exc", [
    (torch.zeros(4, 64, 36, dtype=torch.uint8), ValueError),  # 3-D: a shape problem
    (torch.zeros((), dtype=torch.uint8), ValueError),
    (torch.zeros(4, 32, 1, 36, dtype=torch.uint8), ValueError),  # 32-token pages
    (torch.zeros(4, 64, 2, 36, dtype=torch.uint8), ValueError),
    (torch.zeros(4, 64, 1, 4, dtype=torch.uint8), ValueError),  # no head dims
    (torch.zeros(4, 64, 1, 72, dtype=torch.uint8)[..., :36], ValueError),  # not contiguous
    (torch.zeros(4, 64, 1, 36, dtype=torch.int8), TypeError),
])
def test_state_refuses_a_key_cache_of_another_layout(cache, exc):
    """The key cache's layout is checked when the state is built, naming index_k_cache, not at the first finish
    after a plan has reset the buffers."""
    from runtime.indexer import IndexerState

    with pytest.raises(exc, match="index_k_cache"):
        IndexerState(torch.zeros(32, 16, dtype=torch.int32), 16, cache, 256, scorer=TorchScorer())


def test_state_and_plan_refuse_buffers_sharing_memory():
    """The step writes the top-k and candidate buffers while it reads the key cache and the metadata: a buffer
    sharing memory with another is refused, naming both, and the plan resets nothing first."""
    from runtime.indexer import IndexerState

    step = make_step(6, k=8, candidates=12, max_rows=8)
    a = step.state_args
    topk = a["topk"].clone()
    with pytest.raises(ValueError, match="topk_indices overlaps candidate_blocks"):
        IndexerState(topk, a["k"], a["index_k_cache"], a["max_model_len"],
                     candidate_blocks=topk.view(-1)[-4 * topk.shape[0]:].view(topk.shape[0], 4), scorer=TorchScorer())
    cache_bytes = a["index_k_cache"].numel()
    shared = torch.zeros(cache_bytes + 4096, dtype=torch.uint8)
    cache = shared[:cache_bytes].view(a["index_k_cache"].shape)
    with pytest.raises(ValueError, match="topk_indices overlaps index_k_cache"):  # the cache's last 512 bytes
        IndexerState(shared[cache_bytes - 512:cache_bytes + 512].view(torch.int32).view(32, 8), a["k"], cache,
                     a["max_model_len"], scorer=TorchScorer())
    with pytest.raises(ValueError, match="candidate_blocks overlaps index_k_cache"):  # the cache's last 384 bytes
        IndexerState(topk, a["k"], cache, a["max_model_len"], scorer=TorchScorer(),
                     candidate_blocks=shared[cache_bytes - 384:cache_bytes + 384].view(torch.int32).view(16, 12))
    state = make_state(step, scorer=TorchScorer())
    md = step.metadata
    state.topk_indices.fill_(5)
    lens_in_topk = state.topk_indices[7, :6].copy_(md.seq_lens[:6])
    with pytest.raises(ValueError, match="metadata.seq_lens overlaps topk_indices"):
        plan_decode_rows(state, DecodeMetadata(lens_in_topk, md.block_table, 6, 6, md.max_seq_len), SingleRank())
    table_in_cand = state.candidate_blocks.view(-1)[-md.block_table.numel():].view(md.block_table.shape)
    table_in_cand.copy_(md.block_table)
    with pytest.raises(ValueError, match="metadata.block_table overlaps candidate_blocks"):
        plan_decode_rows(state, DecodeMetadata(md.seq_lens, table_in_cand, 6, 6, md.max_seq_len), SingleRank())
    assert (state.topk_indices[:6] == 5).all(), "refused before the reset"


def test_state_fields_are_fixed_once_checked():
    """Every step trusts the fields the state checked at construction: reassigning one afterwards (a top-k buffer
    over the key cache, k = -3 or past the buffer's width) is refused naming it; dataclasses.replace checks anew."""
    step = make_step(6, k=8, max_rows=8)
    state = make_state(step, scorer=TorchScorer())
    over_cache = state.index_k_cache.view(-1)[:256].view(torch.int32).view(8, 8)
    for name, value in (("topk_indices", over_cache), ("k", -3), ("k", 10 ** 6), ("scorer", None)):
        with pytest.raises(AttributeError, match=rf"^{name}: an IndexerState's fields are fixed"):
            setattr(state, name, value)
    assert state.k == 8 and state.topk_indices.data_ptr() != over_cache.data_ptr()
    with pytest.raises(ValueError, match="topk_indices overlaps index_k_cache"):
        dataclasses.replace(state, topk_indices=over_cache)
    with pytest.raises(ValueError, match=r"^k: "):
        dataclasses.replace(state, k=10 ** 6)
    smaller = dataclasses.replace(state, k=4)
    plan = plan_decode_rows(smaller, step.metadata, SingleRank())  # the plan serial is still recorded
    finish_decode_rows(smaller, step.q, step.weights, plan, SingleRank())
    assert smaller._plans == plan.serial > 0


class _NoGather:
    rank, world_size = 0, 4


@pytest.mark.parametrize("tp, all_gather, exc, match", [
    (None, None, TypeError, "tp: expected a TPGroup"),
    (_Fixed(None, 4), None, TypeError, "tp.rank"),
    (_Fixed(0.0, 4), None, TypeError, "tp.rank"),
    (_Fixed(0, "4"), None, TypeError, "tp.world_size"),
    (_Fixed(4, 4), None, ValueError, "rank 4 outside world size 4"),
    (_NoGather(), None, TypeError, "tp: _NoGather has no callable all_gather"),
    (Loopback(4), lambda local: local, TypeError, "all_gather: expected None or a RowGather"),
    (Loopback(4), 42, TypeError, "all_gather"),
])
def test_group_and_gather_are_checked_before_scoring(tp, all_gather, exc, match):
    """A sharded step (18 rows over 4 ranks) with a malformed group or gather raises naming it before the scorer
    runs, on every path (the plan for the group's shape, the finish for the gathers)."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    scorer = _RecordingScorer()
    state = make_state(step, scorer=scorer)
    with pytest.raises(exc, match=match):
        decode_rows(state, step.metadata, step.q, step.weights, tp, all_gather)
    assert scorer.rows == 0


@pytest.mark.parametrize("bad", ["q dtype", "weights dtype", "q rows"])
def test_decode_rows_refuses_the_query_before_resetting(bad):
    """decode_rows has every argument at once: a query the finish would refuse is refused before the plan resets
    the top-k rows, so the buffers keep the previous step's rows."""
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    q, w = step.q, step.weights
    q, w = {"q dtype": (q.float(), w), "weights dtype": (q, w.half()), "q rows": (q[:2], w)}[bad]
    why = {"q dtype": r"^q: expected float8_e4m3fn", "weights dtype": r"^weights: expected a float32 tensor",
           "q rows": r"^q: 2 rows, the step has 6"}[bad]
    with pytest.raises((TypeError, ValueError), match=why):
        decode_rows(state, step.metadata, q, w, SingleRank())
    assert (state.topk_indices == 5).all()


@pytest.mark.parametrize("bad, error, refusal", [
    ("q of another rank", ValueError,
     r"^q: expected float8_e4m3fn \[rows, heads, head_dim\], got shape \(6, 2048\); pass one query a decode row"),
    ("q of another dtype", TypeError,
     r"^q: expected float8_e4m3fn \[rows, heads, head_dim\], got torch\.bfloat16; pass the layer's FP8 index query$"),
    ("weights of another dtype", TypeError,
     r"^weights: expected a float32 tensor \[rows, heads\], got torch\.float16; pass weights\.float\(\)$"),
    ("int64 seq_lens", TypeError,
     r"^metadata\.seq_lens: expected an int32 tensor, got torch\.int64; build the metadata with int32 seq_lens$"),
    ("column-strided block table", ValueError,
     (r"^metadata\.block_table: expected 2-D with unit last stride, got shape \(6, 8\) with strides \(16, 2\); "
      r"pass a 2-D tensor whose last dimension is contiguous "
      r"\(block_table\.clone\(memory_format=torch\.contiguous_format\)\)$")),
])
def test_query_and_metadata_refusals_say_what_was_given_and_the_fix(bad, error, refusal):
    """The query's and the metadata's refusals said what was expected only ("q: expected float8_e4m3fn [rows, heads,
    head_dim]", "metadata.seq_lens: expected an int32 tensor"), a block table of unit row but not column stride was
    told its shape, which was right, and an FP8 q of another rank was a TypeError (check_scoring_inputs' refusal of
    the same q a ValueError). Each is refused before the plan's reset, with what was given and what to pass."""
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    md, q, w = step.metadata, step.q, step.weights
    if bad == "q of another rank":
        q = q.flatten(1)
    elif bad == "q of another dtype":
        q = q.to(torch.bfloat16)
    elif bad == "weights of another dtype":
        w = w.half()
    elif bad == "int64 seq_lens":
        md = dataclasses.replace(md, seq_lens=md.seq_lens.long())
    else:
        wide = torch.zeros(6, 16, dtype=torch.int32)
        wide[:, ::2] = md.block_table
        md = dataclasses.replace(md, block_table=wide[:, ::2])
    with pytest.raises(error, match=refusal):
        decode_rows(state, md, q, w, SingleRank())
    assert (state.topk_indices == 5).all()


@pytest.mark.parametrize("bad, error, refusal", [
    ("1-D", ValueError, r"^topk_indices: expected int32 \[rows, columns\], got shape \(6,\); allocate it 2-D"),
    ("int64", TypeError, (r"^topk_indices: expected int32 \[rows, columns\], got torch\.int64 \(6, 8\); allocate "
                          r"it with dtype=torch\.int32$")),
    ("strided", ValueError, r"^topk_indices: must be contiguous, got strides \(16, 2\); allocate it contiguous"),
])
def test_a_top_k_buffer_refusal_says_what_was_given_and_the_fix(bad, error, refusal):
    """A 1-D top-k buffer was a TypeError (a shape, which the host ops refuse as a ValueError), and a strided one was
    refused as "must be contiguous" without what to pass."""
    step = make_step(6, k=8)
    buffer = {"1-D": torch.zeros(6, dtype=torch.int32), "int64": torch.zeros(6, 8, dtype=torch.int64),
              "strided": torch.zeros(6, 16, dtype=torch.int32)[:, ::2]}[bad]
    with pytest.raises(error, match=refusal):
        IndexerState(topk_indices=buffer, k=4, index_k_cache=step.state_args["index_k_cache"],
                     max_model_len=step.state_args["max_model_len"], scorer=TorchScorer())


@pytest.mark.parametrize("bad", ["weights", "metadata.block_table", "metadata.seq_lens"])
def test_decode_rows_refuses_sparse_layouts_naming_them(bad):
    """A sparse (COO / CSR) tensor has no strides to check: it is refused with a TypeError naming it, before the
    reset, instead of torch's own RuntimeError from its stride() or is_contiguous()."""
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    md, w = step.metadata, step.weights
    if bad == "weights":
        w = w.to_sparse_csr()
    elif bad == "metadata.block_table":
        md = dataclasses.replace(md, block_table=md.block_table.to_sparse_csr())
    else:
        md = dataclasses.replace(md, seq_lens=md.seq_lens.to_sparse())
    with pytest.raises(TypeError, match=f"{bad} must be a dense"):
        decode_rows(state, md, step.q, w, SingleRank())
    assert (state.topk_indices == 5).all()


@pytest.mark.parametrize("bad", ["q", "weights", "metadata.block_table", "metadata.seq_lens"])
def test_decode_rows_refuses_negated_views_naming_them(bad):
    """A lazily negated view (torch._neg_view; the imaginary part of a conjugate view) holds its values un-negated in
    memory, which DeepGEMM and the top-k read: refused naming it, before the reset."""
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    md, q, w = step.metadata, step.q, step.weights
    if bad == "q":
        q = torch._neg_view(q)
    elif bad == "weights":
        w = torch._neg_view(w)
    else:
        field_ = bad.split(".")[1]
        md = dataclasses.replace(md, **{field_: torch._neg_view(getattr(md, field_))})
    with pytest.raises(TypeError, match=f"{bad} is a lazily negated view"):
        decode_rows(state, md, q, w, SingleRank())
    assert (state.topk_indices == 5).all()


def test_state_refuses_sparse_buffers_and_cache():
    step = make_step(6, k=8)
    state = make_state(step, scorer=TorchScorer())
    with pytest.raises(TypeError, match="topk_indices must be a dense"):
        IndexerState(state.topk_indices.to_sparse_csr(), 8, state.index_k_cache, state.max_model_len,
                     scorer=TorchScorer())
    with pytest.raises(TypeError, match="must be a dense"):
        IndexerState(state.topk_indices, 8, state.index_k_cache.to_sparse(), state.max_model_len,
                     scorer=TorchScorer())


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_int32_tensors_off_a_word_boundary_are_refused_naming_them(offset):
    """DeepGEMM and decode_topk read seq_lens and block_table, and decode_topk writes the state's buffers, by 4-byte
    accesses, which fault on the device off a 4-byte boundary: refused when the state is built, and before a step's
    reset for the metadata's."""
    step = make_step(6, k=8, candidates=8)
    state = make_state(step, scorer=TorchScorer())
    for name in ("topk_indices", "candidate_blocks"):
        with pytest.raises(ValueError, match=f"^{name} must start at a 4-byte aligned address"):
            dataclasses.replace(state, **{name: at_byte_offset(getattr(state, name), offset)})
    state.topk_indices.fill_(5)
    for name in ("seq_lens", "block_table"):
        md = dataclasses.replace(step.metadata, **{name: at_byte_offset(getattr(step.metadata, name), offset)})
        with pytest.raises(ValueError, match=rf"^metadata\.{name} must start at a 4-byte aligned address"):
            decode_rows(state, md, step.q, step.weights, SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"


def test_storageless_wrappers_are_refused_naming_them():
    """A DTensor-like wrapper reports a plain layout, shape and storage size but data_ptr 0, which DeepGEMM and the
    top-k would dereference: refused when the state is built, and before a step's reset for the step's tensors."""
    step = make_step(6, k=8, candidates=8)
    state = make_state(step, scorer=TorchScorer())
    for name in ("topk_indices", "candidate_blocks", "index_k_cache"):
        with pytest.raises(TypeError, match=f"^{name} is a Storageless without memory of its own"):
            dataclasses.replace(state, **{name: Storageless(getattr(state, name))})
    state.topk_indices.fill_(5)
    md, q, w = step.metadata, step.q, step.weights
    for name in ("metadata.seq_lens", "metadata.block_table", "q", "weights"):
        args = {"md": md, "q": q, "w": w}
        if name.startswith("metadata."):
            field_ = name.split(".")[1]
            args["md"] = dataclasses.replace(md, **{field_: Storageless(getattr(md, field_))})
        else:
            args[name[0]] = Storageless(args[name[0]])
        with pytest.raises(TypeError, match=rf"^{name} is a Storageless without memory of its own"):
            decode_rows(state, args["md"], args["q"], args["w"], SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"


# ---------------------------------------------------------------------------
# Review of the indexer flow: refusals before the reset, the caller's schedule, preload
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["tp without all_gather", "all_gather", "strided q"])
def test_decode_rows_refuses_what_it_holds_before_resetting(bad):
    """decode_rows holds every argument: a group that cannot gather, a gather that is no RowGather and a query
    the scorer refuses are refused before the plan resets the top-k rows (the buffers keep the previous step's
    rows), as a query of the wrong dtype already is. plan_decode_rows refuses the group itself."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    q, tp, gather = step.q, Loopback(4), None
    if bad == "tp without all_gather":
        tp = _NoGather()
    elif bad == "all_gather":
        gather = lambda local: local  # noqa: E731 - no accepts
    else:
        q = q.transpose(0, 1).contiguous().transpose(0, 1)
    scorer = _RecordingScorer()
    state = make_state(step, scorer=scorer)
    state.topk_indices.fill_(5)
    with pytest.raises((TypeError, ValueError), match=bad.split()[-1] if bad != "strided q" else "q: must be"):
        decode_rows(state, step.metadata, q, step.weights, tp, gather)
    assert (state.topk_indices == 5).all(), "reset before the refusal"
    assert scorer.rows == 0
    if bad == "tp without all_gather":
        with pytest.raises(TypeError, match="all_gather"):
            plan_decode_rows(state, step.metadata, _NoGather())
        assert (state.topk_indices == 5).all()


def test_preload_stops_at_the_smaller_buffer():
    """A candidate buffer of fewer rows than the top-k buffer bounds a step's rows: preload's default runs up to
    it (not up to the top-k rows, raising midway after some steps ran) and leaves both buffers' rows at -1."""
    from runtime.indexer import IndexerState, preload_decode_rows

    step = make_step(6, heads=4, head_dim=32, max_model_len=128, k=8, max_rows=6)
    a = step.state_args
    state = IndexerState(a["topk"].clone(), a["k"], a["index_k_cache"], a["max_model_len"],
                         candidate_blocks=torch.zeros(4, 8, dtype=torch.int32), scorer=TorchScorer())
    preload_decode_rows(state, heads=4)
    assert (state.topk_indices[:4] == -1).all() and (state.candidate_blocks == -1).all()
    with pytest.raises(ValueError, match=r"max_rows: 5 must be in \[1, 4\]"):
        preload_decode_rows(state, 5, heads=4)


class _FakeDeepGemm(types.ModuleType):
    """The deep_gemm calls the scorer makes, on the CPU: the process's SM count (set_num_sms moves it, as in
    DeepGEMM), a schedule of that count, and logits from the reference behind DeepGEMM's own schedule assert."""

    def __init__(self, num_sms: int):
        super().__init__("deep_gemm")
        self.num_sms, self.schedule_sms, self.logits_schedules = num_sms, [], []

    def get_num_sms(self):
        return self.num_sms

    def set_num_sms(self, num_sms):
        self.num_sms = num_sms

    def get_paged_mqa_logits_metadata(self, context_lens, block_kv, num_sms):
        assert context_lens.dim() == 2 and block_kv == reference.INDEX_BLOCK_KV
        self.schedule_sms.append(num_sms)
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_paged_mqa_logits(self, q, cache, weights, context_lens, block_table, schedule, max_context_len, clean):
        assert tuple(schedule.shape) == (self.num_sms + 1, 2), "DeepGEMM asserts the schedule has num_sms + 1 rows"
        self.logits_schedules.append(schedule)
        return reference.indexer_logits_reference(q[:, 0], weights, cache, context_lens[:, 0], block_table,
                                                  max_context_len)


def _install_fake_deep_gemm(monkeypatch, num_sms=4, arch_major=9) -> _FakeDeepGemm:
    """A fake deep_gemm module and a GPU of compute capability arch_major.x, so that DeepGemmScorer() builds."""
    from runtime import scoring

    dg = _FakeDeepGemm(num_sms)
    monkeypatch.setitem(sys.modules, "deep_gemm", dg)
    monkeypatch.setattr(scoring, "deepgemm_status", lambda device=None: (True, "ok"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (arch_major, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # the scorer checks a CUDA tensor is on it
    # The steps here are on the CPU, which the real scorer refuses (test_deepgemm_scorer_refuses_host_tensors)
    monkeypatch.setattr(scoring.DeepGemmScorer, "_require_gpu", staticmethod(lambda q: None))
    return dg


def _cpu_deepgemm_scorer(num_sms=4):
    """A DeepGemmScorer built without __init__ (which needs a GPU), as on an H200 with num_sms SMs, that takes CPU
    steps: its DeepGEMM is the fake (the real scorer refuses host tensors:
    test_deepgemm_scorer_refuses_host_tensors)."""
    from runtime.scoring import DeepGemmScorer

    class CpuDeepGemmScorer(DeepGemmScorer):
        _require_gpu = staticmethod(lambda q: None)

    scorer = object.__new__(CpuDeepGemmScorer)
    scorer._dg, scorer.arch_major = _FakeDeepGemm(num_sms), 9
    return scorer


def _host_deepgemm_scorer(num_sms=4):
    """A DeepGemmScorer as _cpu_deepgemm_scorer's, but with the real scorer's refusal of host tensors."""
    from runtime.scoring import DeepGemmScorer

    scorer = object.__new__(DeepGemmScorer)
    scorer._dg, scorer.arch_major = _FakeDeepGemm(num_sms), 9
    return scorer


def test_deepgemm_scorer_refuses_host_tensors():
    """DeepGEMM checks no tensor's device: host tensors (q, weights, cache, seq_lens, block_table and a [num_sms + 1,
    2] int32 schedule) passed every check and reached fp8_paged_mqa_logits, whose kernels would read the host's
    addresses; directly and through a CPU state's replicated step with the caller's schedule (only schedule()
    refused host seq_lens, and that step does not call it). Now q is named, before any DeepGEMM call."""
    step = make_step(8, heads=32, head_dim=64, k=16)
    md = step.metadata
    scorer = _host_deepgemm_scorer()
    schedule = torch.zeros(scorer.num_sms + 1, 2, dtype=torch.int32)
    refusal = r"^q: on cpu, but DeepGEMM scores on the GPU; .* or score them on the CPU with .*TorchScorer$"
    with pytest.raises(ValueError, match=refusal):
        scorer.logits(step.q, step.weights, step.state_args["index_k_cache"], md.seq_lens, md.block_table, schedule,
                      step.state_args["max_model_len"])
    state = make_state(step, scorer=scorer)
    with_schedule = dataclasses.replace(md, schedule=schedule)
    with pytest.raises(ValueError, match=refusal):
        decode_rows(state, with_schedule, step.q, step.weights, SingleRank())
    assert scorer._dg.logits_schedules == []


def test_deepgemm_logits_without_a_schedule_are_not_told_to_pass_none():
    """The schedule refusal ended "or pass None" wherever it was raised: right for the plan's metadata.schedule
    (None builds one), wrong for logits(schedule=None), which was then told to pass what it had passed."""
    step = make_step(4, heads=32, head_dim=64, k=16)
    md = step.metadata
    scorer = _cpu_deepgemm_scorer()
    with pytest.raises(ValueError, match=r"^schedule: expected \[5, 2\] .*got NoneType; build it with the scorer's "
                                         r"schedule$"):
        scorer.logits(step.q, step.weights, step.state_args["index_k_cache"], md.seq_lens, md.block_table, None,
                      step.state_args["max_model_len"])
    with pytest.raises(ValueError, match=r"^metadata\.schedule: .*; build it with the scorer's schedule, or pass "
                                         r"None$"):
        scorer.check_schedule(torch.zeros(3, 2, dtype=torch.int32), torch.device("cpu"), "metadata.schedule")


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """t [rows, 1] laid out as the transpose of a [1, rows] row: strides (1, rows), contiguous to torch."""
    return torch.empty(1, t.shape[0], dtype=t.dtype).copy_(t.t()).t()


def test_one_column_tensors_with_another_stride_are_taken_or_given_a_fix_that_works():
    """A one-element last dimension with a non-unit stride is contiguous to torch, whose .contiguous() returns it as
    it is: weights of one head were refused with "pass weights.contiguous()" (the torch scorer reads them at any
    stride; DeepGEMM takes no single head), and a one-page block table and a one-row step's seq_lens with fixes
    that changed nothing. The weights are taken; the others' fix is a copy in the default layout, which is taken."""
    step = make_step(4, heads=1, head_dim=64, k=16)
    md, cache, mml = step.metadata, step.state_args["index_k_cache"], step.state_args["max_model_len"]
    one_head = _transposed(step.weights)
    assert one_head.is_contiguous() and one_head.stride(1) != 1
    want = TorchScorer().logits(step.q, step.weights, cache, md.seq_lens, md.block_table, None, mml)
    assert torch.equal(TorchScorer().logits(step.q, one_head, cache, md.seq_lens, md.block_table, None, mml), want)

    one_page = _transposed(md.block_table[:, :1])
    from runtime.scoring import check_scoring_inputs

    with pytest.raises(ValueError, match=r"^block_table: .*; pass block_table\.clone\(memory_format=torch\."
                                         r"contiguous_format\)$"):
        check_scoring_inputs(step.q, step.weights, cache, md.seq_lens, one_page, 64)
    copied = one_page.clone(memory_format=torch.contiguous_format)
    check_scoring_inputs(step.q, step.weights, cache, md.seq_lens, copied, 64)

    one_row = make_step(1, heads=32, head_dim=64, k=16)
    state = make_state(one_row, scorer=TorchScorer())
    lens = torch.empty(1, 2, dtype=torch.int32)[:, 0].copy_(one_row.metadata.seq_lens)
    assert lens.is_contiguous() and lens.stride() == (2,)
    with pytest.raises(ValueError, match=r"\(seq_lens\.clone\(memory_format=torch\.contiguous_format\)\)$"):
        decode_rows(state, dataclasses.replace(one_row.metadata, seq_lens=lens), one_row.q, one_row.weights,
                    SingleRank())
    fixed = dataclasses.replace(one_row.metadata, seq_lens=lens.clone(memory_format=torch.contiguous_format))
    decode_rows(state, fixed, one_row.q, one_row.weights, SingleRank())
    assert torch.equal(state.topk_indices[:1], _expected(one_row)[:1])


def test_the_lean_scoring_check_names_a_cache_that_is_no_tensor():
    """check_scoring_inputs(layout_checked=True) read cache.device before checking the cache: None raised an
    AttributeError naming nothing."""
    from runtime.scoring import check_scoring_inputs

    step = make_step(4, heads=32, head_dim=64, k=16)
    md = step.metadata
    with pytest.raises(TypeError, match=r"^cache: expected uint8 \[blocks, 64, 1, 68\], got NoneType$"):
        check_scoring_inputs(step.q, step.weights, None, md.seq_lens, md.block_table, 512, layout_checked=True)


@pytest.mark.parametrize("bad", ["shape", "dtype", "device", "4 bytes off", "storageless"])
def test_plan_refuses_a_caller_schedule_deepgemm_cannot_take(bad):
    """A replicated step reuses metadata.schedule as DeepGEMM's schedule. One of another shape, dtype or device is
    refused by the plan, naming metadata.schedule, before the top-k rows are reset: DeepGEMM does not check its
    device (its kernel would read another device's or the host's address), and the others raised only from the
    finish, after the reset."""
    step = make_step(8, heads=32, head_dim=64, k=16)
    # DeepGEMM reads a schedule in 8-byte pairs: 4 bytes off, as a caller's buffer of seq_lens then the schedule
    # would put it, faults on the device.
    schedule = {"shape": torch.zeros(3, 2, dtype=torch.int32), "dtype": torch.zeros(5, 2, dtype=torch.int64),
                "device": torch.zeros(5, 2, dtype=torch.int32, device="meta"),
                "4 bytes off": torch.zeros(11, dtype=torch.int32)[1:].view(5, 2),
                "storageless": Storageless(torch.zeros(5, 2, dtype=torch.int32))}[bad]
    md = step.metadata
    with_schedule = DecodeMetadata(md.seq_lens, md.block_table, md.num_requests, md.num_tokens, md.max_seq_len,
                                   schedule=schedule)
    state = make_state(step, scorer=_cpu_deepgemm_scorer())
    state.topk_indices.fill_(5)
    match = {"4 bytes off": "metadata.schedule: DeepGEMM reads it in 8-byte pairs",
             "storageless": "metadata.schedule is a Storageless"}.get(bad, "metadata.schedule: expected")
    with pytest.raises((ValueError, TypeError), match=match):
        plan_decode_rows(state, with_schedule, SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"
    good = DecodeMetadata(md.seq_lens, md.block_table, md.num_requests, md.num_tokens, md.max_seq_len,
                          schedule=torch.zeros(5, 2, dtype=torch.int32))
    plan = plan_decode_rows(state, good, SingleRank())
    assert plan.schedule is good.schedule


def test_finish_refuses_a_schedule_for_another_sm_count():
    """DeepGEMM's logits assert the schedule has its SM count's rows plus one: a set_num_sms between plan and finish
    stopped the step inside DeepGEMM, after the reset and only on ranks with rows."""
    step = make_step(8, heads=32, head_dim=64, k=16)
    md = step.metadata
    scorer = _cpu_deepgemm_scorer(num_sms=4)
    state = make_state(step, scorer=scorer)
    with_schedule = dataclasses.replace(md, schedule=torch.zeros(5, 2, dtype=torch.int32))
    plan = plan_decode_rows(state, with_schedule, SingleRank())
    scorer._dg.set_num_sms(8)
    with pytest.raises(ValueError, match=r"^plan: its schedule is for 4 SMs, the scorer now launches 8"):
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert scorer._dg.logits_schedules == []


def test_plan_builds_its_schedule_before_the_reset():
    """A schedule the scorer refuses (DeepGEMM's takes at most MAX_SCHEDULE_ROWS rows, its schedule kernel's shared
    memory) leaves the buffers as they were."""
    from runtime.scoring import MAX_SCHEDULE_ROWS

    class Refusing(TorchScorer):
        def schedule(self, seq_lens):
            raise ValueError("seq_lens: refused")

    step = make_step(8, k=8)
    state = make_state(step, scorer=Refusing())
    state.topk_indices.fill_(5)
    with pytest.raises(ValueError, match="seq_lens: refused"):
        plan_decode_rows(state, step.metadata, SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"
    with pytest.raises(ValueError, match=rf"^seq_lens: {MAX_SCHEDULE_ROWS + 1} rows; one DeepGEMM schedule takes"):
        _cpu_deepgemm_scorer().schedule(torch.zeros(MAX_SCHEDULE_ROWS + 1, dtype=torch.int32))
    assert MAX_SCHEDULE_ROWS == 58112


@pytest.mark.parametrize("change", ["set_ over the key cache", "as_strided_ overlapping rows", "candidate rows"])
def test_plan_refuses_a_buffer_changed_in_place(change):
    """A state's fields cannot be reassigned, but a buffer can be changed in place (set_, as_strided_): the checks
    made when the state was built (apart from the key cache, rows of their own) then no longer held, and a step wrote
    the top-k rows into the key cache or into each other's rows."""
    step = make_step(6, k=8, candidates=8)
    state = make_state(step, scorer=TorchScorer(), topk_backend="torch")
    if change == "set_ over the key cache":
        state.topk_indices.set_(state.index_k_cache.untyped_storage(), 0, state.topk_indices.shape,
                                state.topk_indices.stride())
    elif change == "as_strided_ overlapping rows":
        state.topk_indices.as_strided_((6, 8), (2, 1))
    else:
        state.candidate_blocks.as_strided_((6, 8), (2, 1))
    name = "candidate_blocks" if change == "candidate rows" else "topk_indices"
    with pytest.raises(ValueError, match=f"^{name}: changed in place since the state was built"):
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())


def test_preload_checks_its_counts():
    from runtime.indexer import preload_decode_rows

    step = make_step(4, heads=4, head_dim=32, max_model_len=128, k=8, max_rows=4)
    state = make_state(step, scorer=TorchScorer())
    with pytest.raises(TypeError, match="^max_rows"):
        preload_decode_rows(state, 2.5, heads=4)
    with pytest.raises(TypeError, match="^heads"):
        preload_decode_rows(state, 2, heads=True)
    with pytest.raises(ValueError, match="^heads"):
        preload_decode_rows(state, 2, heads=-1)


def test_decode_rows_checks_the_metadata_once_a_step(monkeypatch):
    """decode_rows checks the metadata before its plan (to name its fields before the scorer reads them): the plan
    must not check it again, a second ~4 us of host time on every eager step. plan_decode_rows alone still checks
    it, and a bad metadata is still refused before the reset."""
    import runtime.indexer as ix

    calls = []
    real = ix._check_metadata
    monkeypatch.setattr(ix, "_check_metadata", lambda state, md: calls.append(md) or real(state, md))
    monkeypatch.setattr(ix, "CHECK_METADATA_VALUES", False)
    step = make_step(8, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    want = make_state(step, scorer=TorchScorer())
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert len(calls) == 1
    plan = plan_decode_rows(want, step.metadata, SingleRank())
    assert len(calls) == 2  # the plan alone still checks
    finish_decode_rows(want, step.q, step.weights, plan, SingleRank())
    assert torch.equal(state.topk_indices, want.topk_indices)
    short = DecodeMetadata(step.metadata.seq_lens[:4], step.metadata.block_table, 8, 8, step.metadata.max_seq_len)
    state.topk_indices.fill_(5)
    with pytest.raises(ValueError, match="metadata.seq_lens: 4 rows"):
        decode_rows(state, short, step.q, step.weights, SingleRank())
    assert (state.topk_indices == 5).all()


# ---------------------------------------------------------------------------
# Review (rev2-s41): the query against the state's buffers, stale plans
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["q", "weights"])
def test_decode_rows_refuses_a_query_sharing_the_topk_buffer(bad):
    """q or weights cut from the memory of the top-k buffer (one arena): the plan's reset to -1 overwrote the query
    rows before the finish read them (fp8 0xff is NaN), and the step returned wrong rows silently. Refused, naming
    both, before the reset; the split API refuses it in the finish."""
    from runtime.indexer import IndexerState

    step = make_step(6, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=8)
    a = step.state_args
    arena = torch.zeros(64, 16, dtype=torch.int32)
    topk = arena[:8]
    q, w = step.q, step.weights
    if bad == "q":
        q = arena.view(torch.uint8).view(-1)[: q.numel()].view(torch.float8_e4m3fn).view(q.shape).copy_(q)
    else:
        w = arena.view(-1)[: w.numel()].view(torch.float32).view(w.shape).copy_(w)
    state = IndexerState(topk, 16, a["index_k_cache"], a["max_model_len"], scorer=TorchScorer())
    state.topk_indices.fill_(5)
    if bad == "q":
        q.copy_(step.q)
    else:
        w.copy_(step.weights)
    before = arena.clone()
    with pytest.raises(ValueError, match=f"{bad} overlaps topk_indices"):
        decode_rows(state, step.metadata, q, w, SingleRank())
    assert torch.equal(arena, before), "reset before the refusal"
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    with pytest.raises(ValueError, match=f"{bad} overlaps topk_indices"):
        finish_decode_rows(state, q, w, plan, SingleRank())


def test_finish_refuses_an_earlier_steps_plan():
    """A plan made before the latest plan of the same state (an earlier step's): its finish scored that step's
    rows with that step's schedule against this step's query, and rows the latest plan reset stayed -1, all without
    an error. Refused naming the plan; the latest plan still finishes, as often as asked."""
    step = make_step(24, k=16, max_rows=24)
    md = step.metadata
    state = make_state(step, scorer=TorchScorer())
    earlier = plan_decode_rows(state, DecodeMetadata(md.seq_lens[:12], md.block_table[:12], 12, 12, md.max_seq_len),
                               SingleRank())
    latest = plan_decode_rows(state, md, SingleRank())
    with pytest.raises(ValueError, match=rf"plan: not this state's latest plan \(plan {earlier.serial}; the state's "
                                         rf"latest is plan {latest.serial}"):
        finish_decode_rows(state, step.q, step.weights, earlier, SingleRank())
    assert (state.topk_indices == -1).all()
    for _ in range(2):
        finish_decode_rows(state, step.q, step.weights, latest, SingleRank())
        assert torch.equal(state.topk_indices, _expected(step))


def test_finish_refuses_the_plan_of_another_state_sharing_the_buffers():
    """Plan serials were counted per state, so a state's first plan and another state's first plan, over the same
    buffers (dataclasses.replace of it with another scorer, as layers share the top-k buffer), had equal serials: the
    finish took one state's plan on the other, and its scorer failed inside with an error naming no argument (here
    the plan's schedule is not the other scorer's). Serials are unique in the process: refused naming the plan."""

    class OtherScorer(TorchScorer):
        def schedule(self, seq_lens):
            return ("other", int(seq_lens.shape[0]))

        def logits(self, *args, checked=False):
            assert args[5] == ("other", 24), "scored with another scorer's schedule"
            return super().logits(*args, checked=checked)

    step = make_step(24, k=16, max_rows=24)
    a = make_state(step, scorer=TorchScorer())
    b = dataclasses.replace(a, scorer=OtherScorer())
    plan_a = plan_decode_rows(a, step.metadata, SingleRank())
    plan_b = plan_decode_rows(b, step.metadata, SingleRank())
    assert plan_a.buffers == plan_b.buffers and plan_a.serial != plan_b.serial
    with pytest.raises(ValueError, match=r"^plan: not this state's latest plan .*another state"):
        finish_decode_rows(b, step.q, step.weights, plan_a, SingleRank())
    finish_decode_rows(b, step.q, step.weights, plan_b, SingleRank())
    assert torch.equal(b.topk_indices, _expected(step))


@pytest.mark.parametrize("change", ["num_tokens", "seq_lens", "block_table", "max_seq_len", "schedule"])
def test_finish_refuses_metadata_changed_since_the_plan(change):
    """The finish scores through the plan's metadata object. Fields replaced in place after the plan (a smaller
    num_tokens and a shorter seq_lens: the finish checked the query against the new count while it scored the
    plan's rows, reading rows of the new tensors no check had seen) are refused naming the field, before anything
    is scored; the unchanged metadata finishes."""
    step = make_step(24, k=16, max_rows=24)
    md = step.metadata
    state = make_state(step, scorer=TorchScorer())
    plan = plan_decode_rows(state, md, SingleRank())
    saved = {name: getattr(md, name) for name in ("num_tokens", "seq_lens", "block_table", "max_seq_len", "schedule")}
    if change == "num_tokens":
        md.num_tokens = 12
    elif change in ("seq_lens", "block_table"):
        setattr(md, change, saved[change][:12].clone())
    elif change == "max_seq_len":
        md.max_seq_len = saved["max_seq_len"] - 1
    else:
        md.schedule = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"metadata.{change}: changed since plan_decode_rows"):
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert (state.topk_indices == -1).all(), "scored before the refusal"
    for name, value in saved.items():
        setattr(md, name, value)
    finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert torch.equal(state.topk_indices, _expected(step))


# ---------------------------------------------------------------------------
# Review of the scorers (review-scoring): DeepGEMM faked on the CPU
# ---------------------------------------------------------------------------

def _with_schedule(md: DecodeMetadata, schedule) -> DecodeMetadata:
    return DecodeMetadata(md.seq_lens, md.block_table, md.num_requests, md.num_tokens, md.max_seq_len,
                          schedule=schedule)


def test_deepgemm_scorer_follows_deep_gemms_sm_count(monkeypatch):
    """DeepGEMM's logits assert that the schedule has its SM count plus one rows: one count for the process, which
    deep_gemm.set_num_sms moves (a server leaves SMs to communication kernels so). The scorer kept the count it was
    built with, so after set_num_sms its check refused a schedule of DeepGEMM's count and passed a stale one, which
    DeepGEMM then asserted on after the plan's reset, and its own schedule was stale too. It reads the count a call."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runtime.scoring import DeepGemmScorer

    dg = _install_fake_deep_gemm(monkeypatch, num_sms=8)
    scorer = DeepGemmScorer()
    dg.set_num_sms(4)
    assert scorer.num_sms == 4
    step = make_step(8, heads=32, head_dim=64, k=16)
    state = make_state(step, scorer=scorer)
    state.topk_indices.fill_(5)
    stale = torch.zeros(9, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"metadata.schedule: expected \[5, 2\]"):
        plan_decode_rows(state, _with_schedule(step.metadata, stale), SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"
    plan = plan_decode_rows(state, _with_schedule(step.metadata, torch.zeros(5, 2, dtype=torch.int32)), SingleRank())
    finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert dg.logits_schedules == [plan.schedule]
    assert torch.equal(state.topk_indices, _expected(step))
    with FakeTensorMode():  # a CUDA seq_lens without a GPU
        seq_lens = torch.ones(8, dtype=torch.int32, device="cuda")
    scorer.schedule(seq_lens)
    assert dg.schedule_sms == [4]


@pytest.mark.parametrize("arch, heads, ok", [(10, 128, False), (10, 48, False), (10, 4, False), (10, 8, True),
                                             (10, 16, True), (10, 64, True), (9, 16, False), (9, 32, True)])
def test_deepgemm_scorer_refuses_heads_its_arch_does_not_take(monkeypatch, arch, heads, ok):
    """DeepGEMM's sm_100 paged logits take 8, 16, 32 or 64 index heads (sm_90: 32 or 64). Only sm_90's were checked,
    so on a B200 a model of 128 heads passed check_inputs and met DeepGEMM's assert (or a failed JIT compile at the
    first step) after the plan's reset, on ranks with rows only. Refused naming q and the torch scorer, before the
    reset."""
    from runtime.scoring import DeepGemmScorer

    dg = _install_fake_deep_gemm(monkeypatch, arch_major=arch)
    step = make_step(8, heads=heads, head_dim=64, k=16)
    state = make_state(step, scorer=DeepGemmScorer())
    md = _with_schedule(step.metadata, torch.zeros(dg.num_sms + 1, 2, dtype=torch.int32))
    state.topk_indices.fill_(5)
    if ok:
        decode_rows(state, md, step.q, step.weights, SingleRank())
        assert torch.equal(state.topk_indices, _expected(step))
        return
    with pytest.raises(ValueError, match=rf"q: DeepGEMM on sm_{arch}0 takes .* index heads, got {heads}; .*TorchScorer"):
        decode_rows(state, md, step.q, step.weights, SingleRank())
    assert (state.topk_indices == 5).all() and not dg.logits_schedules


def test_deepgemm_schedule_is_checked_once_a_step(monkeypatch):
    """A replicated step reusing the caller's schedule checked it in the plan (before the reset, naming
    metadata.schedule) and again in DeepGemmScorer.logits, though the finish calls it with checked=True (~2 us of
    host time each). The plan's check stays; logits checks the schedule only where it checks the inputs."""
    from runtime.scoring import DeepGemmScorer

    dg = _install_fake_deep_gemm(monkeypatch)
    calls = []
    real = DeepGemmScorer.check_schedule
    monkeypatch.setattr(DeepGemmScorer, "check_schedule", lambda self, schedule, device, name="schedule":
                        calls.append(name) or real(self, schedule, device, name))
    step = make_step(8, heads=32, head_dim=64, k=16)
    state = make_state(step, scorer=DeepGemmScorer())
    md = _with_schedule(step.metadata, torch.zeros(dg.num_sms + 1, 2, dtype=torch.int32))
    decode_rows(state, md, step.q, step.weights, SingleRank())
    assert calls == ["metadata.schedule"]
    assert torch.equal(state.topk_indices, _expected(step))
    a = step.state_args  # a direct, unchecked call still checks it
    with pytest.raises(ValueError, match=r"schedule: expected \[5, 2\]"):
        state.scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table,
                            torch.zeros(3, 2, dtype=torch.int32), a["max_model_len"])
    assert len(dg.logits_schedules) == 1


@pytest.mark.parametrize("name", ["q", "weights", "index_k_cache"])
def test_deepgemm_scorer_refuses_inputs_off_a_16_byte_boundary(name):
    """DeepGEMM reads q, weights and the key cache by TMA: started off a 16-byte boundary, its descriptor encode
    failed with CUDA_ERROR_INVALID_VALUE on the H200 (deepgemm_alignment_s42.json), a RuntimeError naming no
    argument, raised from the finish after the plan had reset the rows. decode_rows now refuses it, naming the
    tensor, before the reset; an aligned copy runs."""
    step = make_step(8, heads=32, head_dim=64, k=16)
    tensors = {"q": step.q, "weights": step.weights, "index_k_cache": step.state_args["index_k_cache"]}
    t = tensors[name]
    raw = torch.empty(t.nbytes + 64, dtype=torch.uint8)
    offset = (4 - raw.data_ptr()) % 16 or 4  # 4 bytes past a boundary: a float32's alignment, not TMA's
    shifted = raw[offset: offset + t.nbytes].view(t.dtype).view(t.shape)
    shifted.copy_(t)
    tensors[name] = shifted
    step.state_args["index_k_cache"] = tensors["index_k_cache"]
    state = make_state(step, scorer=_cpu_deepgemm_scorer())
    state.topk_indices.fill_(5)
    shown = "cache" if name == "index_k_cache" else name
    with pytest.raises(ValueError, match=f"{shown}: DeepGEMM reads it by TMA"):
        decode_rows(state, step.metadata, tensors["q"], tensors["weights"], SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"


# ---------------------------------------------------------------------------
# Review of the decode flow (review-indexer): the gathers' results
# ---------------------------------------------------------------------------

class _WrongGather:
    """A gather that takes every slice and returns a result of another form than every rank's slice concatenated
    along dim 0 (the other rank's rows: this rank's, a stand-in), as a custom one-shot gather or a TP wrapper may."""

    def __init__(self, form, world=2):
        self.form, self.world_size, self.rank = form, world, 0

    def accepts(self, local):
        return True

    def __call__(self, local):
        rows = local.shape[0]
        if self.form == "workspace":  # the whole fixed-size workspace: 16 rows a rank's slot, the slice first
            out = torch.full((self.world_size * 16, *local.shape[1:]), 0, dtype=local.dtype)
            for r in range(self.world_size):
                out[r * 16: r * 16 + rows] = local
            return out
        whole = torch.cat([local] * self.world_size)
        if self.form == "float32 bits":
            return whole.view(torch.float32)
        if self.form == "stacked":
            return whole.view(self.world_size, rows, *local.shape[1:])
        return whole.to("meta")  # another device

    all_gather = __call__


@pytest.mark.parametrize("form, exc", [("workspace", ValueError), ("float32 bits", TypeError),
                                       ("stacked", ValueError), ("device", ValueError)])
@pytest.mark.parametrize("through", ["all_gather", "tp.all_gather"])
def test_gather_result_of_another_form_is_refused(form, exc, through):
    """World 2, 18 rows: rank 0 scores rows 0-9 and takes rows 10-17 from the gather. A result that is not the
    [2 x 10, columns] int32 concatenation was copied into the buffers as it came: a fixed-size workspace put rank 0's
    unused slots in rows 10-15 and float32 bits turned every index into 0, both without an error; a stacked result or
    one on another device raised torch's error naming neither gather. Each is refused naming the gather that
    returned it, before anything is copied."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    wrong = _WrongGather(form)
    tp, gather = (Loopback(2), wrong) if through == "all_gather" else (wrong, None)
    with pytest.raises(exc, match=f"^{through}: returned .*concatenated along dim 0 in rank order, torch.int32 "
                                  r"\[20, 16\] on cpu"):
        decode_rows(state, step.metadata, step.q, step.weights, tp, gather)
    assert (state.topk_indices[10:18] == -1).all(), "rows copied from the refused result"


class _AnsweringGather(_WrongGather):
    """A gather whose accepts answers ``answer`` (a function of the slice); gathering, it returns every rank's slice
    (this rank's, a stand-in) and counts its calls."""

    def __init__(self, answer):
        super().__init__("right")
        self.answer, self.used = answer, 0

    def accepts(self, local):
        return self.answer(local)

    def __call__(self, local):
        self.used += 1
        return torch.cat([local] * self.world_size)


@pytest.mark.parametrize("answer, shown", [
    (lambda local: "False", "str 'False'"),
    (lambda local: 1, "int 1"),
    (lambda local: None, "NoneType"),
    (lambda local: torch.tensor([True, False]), "Tensor"),
    (lambda local: torch.tensor(local.shape[1] == 16), "Tensor"),
])
def test_a_gather_whose_accepts_answers_no_bool_is_refused_naming_it(answer, shown):
    """World 2, 18 rows: accepts answered "False" and the custom gather took the rows (a string's truth), a tensor of
    two elements raised torch's 'Boolean value of Tensor with more than one value is ambiguous', naming nothing, and
    a tensor of one was read back (a device sync on a GPU, refused inside a CUDA graph capture). A TypeError naming
    all_gather's accepts, before any gather; a numpy bool is taken as the bool it is. decode_rows asks before the
    plan's reset (it refused after the reset and the scoring, its docstring saying everything was refused before):
    the buffer is left as it was. The split flow's finish, given all_gather after the plan, refuses it there."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(7)
    gather = _AnsweringGather(answer)
    refusal = rf"^all_gather: _AnsweringGather.accepts returned {shown}, not a bool"
    with pytest.raises(TypeError, match=refusal):
        decode_rows(state, step.metadata, step.q, step.weights, Loopback(2), gather)
    assert gather.used == 0 and (state.topk_indices == 7).all()
    rank = Loopback(2)
    plan = plan_decode_rows(state, step.metadata, rank)
    with pytest.raises(TypeError, match=refusal):
        finish_decode_rows(state, step.q, step.weights, plan, rank, gather)
    assert gather.used == 0


def test_a_gather_whose_accepts_answers_a_numpy_bool_is_taken():
    np = pytest.importorskip("numpy")
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    for answer, used in ((np.bool_(True), 1), (np.bool_(False), 0)):
        gather = _AnsweringGather(lambda local, answer=answer: answer)
        decode_rows(make_state(step, scorer=TorchScorer()), step.metadata, step.q, step.weights, Loopback(2), gather)
        assert gather.used == used


class _OddGather(_WrongGather):
    """Every rank's slice concatenated as asked, but sparse, nested, or in ``buffer``'s own memory one row off (rows
    that the copy into the buffer would read after writing them)."""

    def __init__(self, form, buffer):
        super().__init__(form)
        self.buffer = buffer

    def __call__(self, local):
        whole = torch.cat([local] * self.world_size)
        if self.form == "sparse":
            return whole.to_sparse()
        if self.form == "nested":
            return torch.nested.nested_tensor([local] * self.world_size)
        b = self.buffer
        shifted = torch.empty(0, dtype=b.dtype).set_(b.untyped_storage(), b.storage_offset() + b.stride(0),
                                                     whole.shape, b.stride())
        return shifted.copy_(whole)

    all_gather = __call__


@pytest.mark.parametrize("form, exc, match", [
    ("sparse", TypeError, "all_gather's result must be a dense"),
    ("nested", TypeError, "all_gather's result must be a dense .*got a nested tensor"),
    ("one row off", ValueError, "all_gather: returned rows that share memory"),
])
def test_gather_result_sparse_or_over_the_buffer_is_refused(form, exc, match):
    """torch's own errors (a sparse copy, a nested result's shape, a partly overlapping copy) named no gather."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    with pytest.raises(exc, match=f"^{match}"):
        decode_rows(state, step.metadata, step.q, step.weights, Loopback(2), _OddGather(form, state.topk_indices))


def test_decode_rows_does_not_check_its_own_plan_again(monkeypatch):
    """decode_rows makes its plan from its arguments and finishes it at once, after checking every argument before
    the plan: the finish's comparison of the plan with the group, the state and the metadata (which the plan recorded
    for it) and its gather checks cannot fail there, and cost ~8 us of host time a step (measured on this CPU).
    decode_rows skips them; the split API still records and checks (its refusals have their own tests)."""
    import runtime.indexer as ix

    calls = {name: 0 for name in ("_rank_and_world", "_metadata_view", "_buffers_of", "_check_gathers")}

    def counting(name):
        real = getattr(ix, name)

        def count(*args):
            calls[name] += 1
            return real(*args)
        return count

    for name in calls:
        monkeypatch.setattr(ix, name, counting(name))
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, candidates=12, max_rows=64)
    want = make_state(step, scorer=TorchScorer())
    decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
    group = Loopback(2)
    for rank in (0, 1, 0):  # the last pass gathers both ranks' slices
        state = make_state(step, scorer=TorchScorer())
        calls.update(dict.fromkeys(calls, 0))
        decode_rows(state, step.metadata, step.q, step.weights, group.for_rank(rank))
        assert calls == {"_rank_and_world": 1, "_metadata_view": 0, "_buffers_of": 0, "_check_gathers": 0}
    assert torch.equal(state.topk_indices, want.topk_indices)
    assert torch.equal(state.candidate_blocks, want.candidate_blocks)
    calls.update(dict.fromkeys(calls, 0))
    plan = plan_decode_rows(state, step.metadata, group.for_rank(0))
    finish_decode_rows(state, step.q, step.weights, plan, group)
    assert calls == {"_rank_and_world": 2, "_metadata_view": 2, "_buffers_of": 2, "_check_gathers": 1}
    assert torch.equal(state.topk_indices, want.topk_indices)


@pytest.mark.parametrize("buffer", ["topk_indices", "candidate_blocks"])
def test_plan_refuses_a_caller_schedule_sharing_the_buffers(buffer):
    """A replicated step reuses metadata.schedule, which DeepGEMM reads in the finish, after the plan's reset (and,
    in the step's later layers, after this layer's selection). Cut from the memory of the top-k buffer (one int32
    arena), the reset overwrote it with -1s before DeepGEMM read it; from the candidate buffer's, the selection wrote
    block ids into it for the next layer: both without an error. Refused naming both, before the reset, as the
    metadata's other tensors are."""
    step = make_step(8, heads=32, head_dim=64, k=16, candidates=16)
    scorer = _cpu_deepgemm_scorer()
    state = make_state(step, scorer=scorer)
    state.topk_indices.fill_(5)
    schedule = getattr(state, buffer).view(-1)[-10:].view(5, 2)  # in the buffer's last row, which the step resets
    schedule.copy_(torch.arange(10, dtype=torch.int32).view(5, 2))
    before = state.topk_indices.clone()
    with pytest.raises(ValueError, match=f"metadata.schedule overlaps {buffer}'s memory.*memory of its own"):
        decode_rows(state, _with_schedule(step.metadata, schedule), step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices, before) and not scorer._dg.logits_schedules, "reset before the refusal"
    assert schedule.view(-1).tolist() == list(range(10))


@pytest.mark.parametrize("call", ["plan count", "plan seed metadata", "decode_rows", "finish tensor", "finish str"])
def test_metadata_and_plan_of_another_type_are_refused_naming_them(call):
    """The seed's plan takes the step's token count where plan_decode_rows takes the metadata, and a port may pass
    the seed's metadata class, or shift finish_decode_rows' arguments by the seed's hidden_states: each met an
    AttributeError naming a field ('int' object has no attribute 'num_prefills', 'Tensor' ... 'rank'). A TypeError
    names the argument and what to pass, before anything is issued."""
    step = make_step(8, k=16)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    seed_metadata = types.SimpleNamespace(num_prefills=0, num_decode_tokens=8, num_decodes=8)
    run, name = {
        "plan count": (lambda: plan_decode_rows(state, 8, SingleRank()), "metadata"),
        "plan seed metadata": (lambda: plan_decode_rows(state, seed_metadata, SingleRank()), "metadata"),
        "decode_rows": (lambda: decode_rows(state, seed_metadata, step.q, step.weights, SingleRank()), "metadata"),
        "finish tensor": (lambda: finish_decode_rows(state, step.q, step.weights, step.weights, SingleRank()), "plan"),
        "finish str": (lambda: finish_decode_rows(state, step.q, step.weights, "plan", SingleRank()), "plan"),
    }[call]
    with pytest.raises(TypeError, match=f"^{name}: expected .*, got "):
        run()
    assert (state.topk_indices == 5).all()


@pytest.mark.parametrize("call", ["plan", "finish", "decode_rows", "preload", "check values", "check no metadata"])
def test_a_state_of_another_type_is_refused_naming_it(call):
    """A port that passes the seed's layer object (or None) where the state goes met an AttributeError naming one of
    the state's fields ('NoneType' object has no attribute 'topk_indices'). A TypeError names the argument first."""
    from runtime.indexer import check_decode_metadata_values, preload_decode_rows

    step = make_step(8, k=16)
    state = make_state(step, scorer=TorchScorer())
    layer = types.SimpleNamespace(topk_indices_buffer=state.topk_indices)
    run, name = {
        "plan": (lambda: plan_decode_rows(layer, step.metadata, SingleRank()), "state"),
        "finish": (lambda: finish_decode_rows(None, step.q, step.weights, None, SingleRank()), "state"),
        "decode_rows": (lambda: decode_rows({}, step.metadata, step.q, step.weights, SingleRank()), "state"),
        "preload": (lambda: preload_decode_rows(None), "state"),
        "check values": (lambda: check_decode_metadata_values(layer, step.metadata), "state"),
        "check no metadata": (lambda: check_decode_metadata_values(state, None), "metadata"),
    }[call]
    with pytest.raises(TypeError, match=f"^{name}: expected .*, got "):
        run()


def test_a_none_plan_supersedes_the_previous_plan():
    """A step the flow does not serve (a prefill, no metadata, no tokens) returned None without touching the state,
    so the previous step's plan stayed its latest: finished after the stock path had filled the buffer, it wrote the
    previous step's rows over them without an error. A None plan is now the latest: the old one is refused."""
    step = make_step(12, k=16, max_rows=12)
    md = step.metadata
    prefill = DecodeMetadata(md.seq_lens, md.block_table, md.num_requests, md.num_tokens, md.max_seq_len,
                             num_prefills=1)
    empty = DecodeMetadata(md.seq_lens[:0], md.block_table[:0], 0, 0, 0)
    for stock_step in (None, prefill, empty):
        state = make_state(step, scorer=TorchScorer())
        plan = plan_decode_rows(state, md, SingleRank())
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
        assert plan_decode_rows(state, stock_step, SingleRank()) is None
        state.topk_indices.fill_(7)  # the stock path's rows
        with pytest.raises(ValueError, match=r"^plan: not this state's latest plan .*returned None"):
            finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
        assert (state.topk_indices == 7).all()
        decode_rows(state, md, step.q, step.weights, SingleRank())  # the next served step runs as ever
        assert torch.equal(state.topk_indices, _expected(step))


def test_metadata_num_tokens_reassigned_after_construction_is_taken_as_the_constructor_takes_it():
    """A metadata object kept across steps and updated in place: a numpy or tensor integer assigned to num_tokens was
    refused as 'expected an int >= 0, got np.int64(12)', and a bool went on to fail naming num_rows. Integers are
    taken (held as a Python int), a bool or float is refused naming metadata.num_tokens, when assigned."""
    np = pytest.importorskip("numpy")
    step = make_step(12, k=16, max_rows=12)
    md = dataclasses.replace(step.metadata)
    state = make_state(step, scorer=TorchScorer())
    for value in (np.int64(12), torch.tensor(12)):
        md.num_tokens = value
        decode_rows(state, md, step.q, step.weights, SingleRank())
        assert type(md.num_tokens) is int and torch.equal(state.topk_indices, _expected(step))
    for value, exc in ((True, TypeError), (12.0, TypeError), (-1, ValueError)):
        with pytest.raises(exc, match="^metadata.num_tokens: expected"):
            md.num_tokens = value
        assert md.num_tokens == 12


@pytest.mark.parametrize("field", ["num_requests", "num_tokens", "max_seq_len", "num_prefills"])
def test_every_metadata_count_reassigned_after_construction_is_checked_as_the_constructor_checks_it(field):
    """Only num_tokens was checked again at the step: num_prefills or num_requests reassigned to None or a string
    failed with Python's comparison TypeError naming nothing, a float num_requests was refused as row_shard_rows'
    'num_requests', and num_prefills=True or 0.5 quietly sent the step down the stock path (the constructor refuses
    each). Every count is refused when assigned, naming metadata.<field>, and keeps its value; integers are taken."""
    np = pytest.importorskip("numpy")
    step = make_step(12, k=16, max_rows=12)
    md = dataclasses.replace(step.metadata)
    was = getattr(md, field)
    for value, exc in ((None, TypeError), ("3", TypeError), (True, TypeError), (0.5, TypeError), (3.0, TypeError),
                       (-1, ValueError)):
        with pytest.raises(exc, match=f"^metadata.{field}: expected an integer"):
            setattr(md, field, value)
        assert getattr(md, field) == was
    setattr(md, field, np.int64(was))
    assert type(getattr(md, field)) is int
    state = make_state(step, scorer=TorchScorer())
    decode_rows(state, md, step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices, _expected(step))


def test_metadata_fields_read_as_fast_as_those_of_a_plain_dataclass():
    """DecodeMetadata's __setattr__ stored each field through self.__dict__: reading __dict__ moves CPython's inline
    attribute values into a dict, and each field read then cost ~20 ns instead of ~5 (3.11), for the 26 reads of a
    decode_rows step (42 of a plan and finish) in every layer the metadata serves, to save ~0.06 us a field when it
    is built. Its fields read as fast as a plain dataclass's (within 1.5x: the minimum of repeated timings)."""
    import timeit

    # DecodeMetadata's fields, defaults included, without its __setattr__
    Plain = dataclasses.make_dataclass("Plain", [
        (f.name, f.type) if f.default is dataclasses.MISSING else (f.name, f.type, dataclasses.field(default=f.default))
        for f in dataclasses.fields(DecodeMetadata)])

    step = make_step(8, k=16)
    md = step.metadata
    built = {cls: cls(md.seq_lens, md.block_table, num_requests=md.num_requests, num_tokens=md.num_tokens,
                      max_seq_len=md.max_seq_len) for cls in (DecodeMetadata, Plain)}

    def reads(m):
        for _ in range(100):
            m.num_tokens, m.seq_lens, m.block_table, m.schedule  # noqa: B018 - the reads are what is timed
            m.num_prefills, m.num_requests, m.max_seq_len  # noqa: B018

    best = {cls: min(timeit.repeat(lambda m=m: reads(m), number=200, repeat=15)) for cls, m in built.items()}
    assert best[DecodeMetadata] < 1.5 * best[Plain], best


def test_aot_selection_of_an_unsupported_candidate_width_names_the_candidate_buffer():
    """Block mode selects as many blocks as the candidate buffer is wide: a width the AOT top-k does not take was said
    as 'k = 12 is not one of decode_topk's ...; use a supported k', though the state's k may be a supported one. The
    warning names candidate_blocks' width; the token mode's still names k (both said when the state is built)."""
    from runtime import indexer

    state = make_state(make_step(3, k=512, max_model_len=1024, candidates=12), scorer=TorchScorer())
    with pytest.warns(RuntimeWarning, match="candidate_blocks' width = 12 is not one of decode_topk's k .*use a "
                                            "supported candidate_blocks' width") as said:
        indexer._warn_widths_the_aot_topk_does_not_take(state)
    assert len(said) == 1  # k = 512 is taken
    logits = torch.randn(3, 100)
    ends = torch.tensor([100, 5, 0], dtype=torch.int32)
    out = torch.empty(3, 12, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        indexer._aot_select(logits, ends, out, True)
    assert torch.equal(out, reference.decode_topk_reference(logits, ends, 12, block_mode=True))


class _CudaLookingBuffer(torch.Tensor):
    """CPU memory that the state's own check takes for a CUDA buffer (it warns for CUDA states only)."""

    @property
    def is_cuda(self):
        return True


def test_a_states_width_warning_names_the_line_that_built_it():
    """The unsupported-k warning is raised inside the state's __post_init__, under the __init__ that dataclasses
    generate, and under dataclasses.replace where a state is rebuilt: it names the test's own line either way, so a
    filter by module and Python's once-per-line default act on the serving code's line, not on runtime/indexer.py."""
    step = make_step(3, k=512, max_model_len=1024)
    a = step.state_args
    cuda_looking = a["topk"].clone().as_subclass(_CudaLookingBuffer)
    with pytest.warns(RuntimeWarning, match="k = 16 is not one of decode_topk's") as built:
        state = IndexerState(topk_indices=cuda_looking, k=16, index_k_cache=a["index_k_cache"],
                             max_model_len=a["max_model_len"], scorer=TorchScorer())
    with pytest.warns(RuntimeWarning, match="k = 8 is not one of decode_topk's") as replaced:
        dataclasses.replace(state, k=8)
    for said in (built, replaced):
        assert len(said) == 1 and said[0].filename == __file__, said[0].filename


def test_a_cuda_state_loads_the_aot_topk_when_built(monkeypatch):
    """The AOT top-k's kernels are loaded when a CUDA state is built, which every rank does: left to the first
    selection, only ranks with rows loaded, and a refused or partial cache's RuntimeWarning (an error where warnings
    are errors) or a load inside a captured step raised there while an empty-slice rank waited in the all-gather.
    Token mode loads for k, block mode for the candidate buffer's width, each only where decode_topk takes it, for
    the dtype the scorer declares (a BF16 scorer's kernels were loaded at its first step, on ranks with rows only)."""
    from runtime import topk

    loads = []
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: loads.append((dtype, block_mode)))
    load_kernels = topk.load_kernels  # on cuda:0, which the CUDA-looking CPU buffer cannot name
    monkeypatch.setattr(topk, "load_kernels", lambda device, *a: load_kernels(torch.device("cuda", 0), *a))
    step = make_step(3, k=512, max_model_len=8192, candidates=1024)
    a = step.state_args

    def build(k, candidates):
        IndexerState(topk_indices=a["topk"].clone().as_subclass(_CudaLookingBuffer), k=k,
                     index_k_cache=a["index_k_cache"], max_model_len=a["max_model_len"],
                     candidate_blocks=None if candidates is None else a["candidates"][:, :candidates].clone(),
                     scorer=TorchScorer())

    build(512, 1024)
    assert loads == [("f32", False), ("f32", True)]
    loads.clear()
    with pytest.warns(RuntimeWarning, match="is not one of decode_topk's k"):
        build(16, 12)  # neither width is decode_topk's: both select by the reference, nothing to load
    assert loads == []
    build(512, None)
    assert loads == [("f32", False)]
    make_state(step, scorer=TorchScorer())  # a CPU state selects by the reference
    assert loads == [("f32", False)]
    loads.clear()
    IndexerState(topk_indices=a["topk"].clone().as_subclass(_CudaLookingBuffer), k=512,
                 index_k_cache=a["index_k_cache"], max_model_len=a["max_model_len"],
                 candidate_blocks=a["candidates"].clone(), scorer=_Bf16Scorer())
    assert loads == [("bf16", False), ("bf16", True)]  # the scorer's declared dtype, not the FP32 kernels


def test_a_refused_cache_is_said_when_the_state_is_built(monkeypatch):
    """A cache that cannot serve the device is said (once, a RuntimeWarning naming the line that built the state)
    while the state is built, and the answer is memoized: the steps select by the exact reference without loading or
    saying it again."""
    import runtime
    from runtime import loader, topk

    def refuse(device=None, root=None):
        raise runtime.CacheError("no manifest for this device's arch")

    monkeypatch.setattr(runtime, "load", refuse)
    monkeypatch.setattr(loader, "_bound", {})
    monkeypatch.setattr(loader, "_refusals_said", set())
    monkeypatch.setattr(topk, "_plans", {})
    load_kernels = topk.load_kernels  # on cuda:0, which the CUDA-looking CPU buffer cannot name
    monkeypatch.setattr(topk, "load_kernels", lambda device, *a: load_kernels(torch.device("cuda", 0), *a))
    step = make_step(3, k=512, max_model_len=1024)
    a = step.state_args
    with pytest.warns(RuntimeWarning, match="decode_topk: the AOT cache cannot serve .*no manifest") as said:
        IndexerState(topk_indices=a["topk"].clone().as_subclass(_CudaLookingBuffer), k=512,
                     index_k_cache=a["index_k_cache"], max_model_len=a["max_model_len"], scorer=TorchScorer())
    assert len(said) == 1 and said[0].filename == __file__, said[0].filename
    assert topk._plans == {(0, "f32", False): None}  # memoized: the selections take the reference


@pytest.mark.parametrize("which", ["topk_indices", "candidate_blocks"])
def test_buffers_made_in_inference_mode_are_refused_outside_it_before_any_write(which):
    """A buffer made under torch.inference_mode() takes no in-place write outside it: the plan (and the finish of a
    plan made inside the mode) refuses it by name before writing anything; inside the mode the step runs."""
    step = make_step(20, k=16, candidates=12, max_rows=24)
    state = make_state(step, scorer=TorchScorer())
    with torch.inference_mode():
        made_there = getattr(state, which).clone()
    state = dataclasses.replace(state, **{which: made_there})
    before = (state.topk_indices.clone(), state.candidate_blocks.clone())
    with pytest.raises(ValueError, match=f"{which}: made under torch.inference_mode"):
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    with pytest.raises(ValueError, match=f"{which}: made under torch.inference_mode"):
        plan_decode_rows(state, step.metadata, SingleRank())
    with torch.inference_mode():
        plan = plan_decode_rows(state, step.metadata, SingleRank())
    with pytest.raises(ValueError, match=f"{which}: made under torch.inference_mode"):
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert torch.equal(state.topk_indices[20:], before[0][20:]) and torch.equal(state.candidate_blocks, before[1])
    with torch.inference_mode():
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert torch.equal(state.topk_indices[:20], _expected(step))
    assert torch.equal(state.candidate_blocks[:20], _expected(step, block_mode=True))


class _ScorerOfSms(TorchScorer):
    """Torch logits behind DeepGemmScorer's SM-count rules: a schedule of num_sms + 1 rows, which check_schedule and
    the finish compare with the scorer's SM count now."""

    def __init__(self, num_sms):
        self.num_sms = num_sms

    def schedule(self, seq_lens):
        return torch.zeros(self.num_sms + 1, 2, dtype=torch.int32)

    def check_schedule(self, schedule, device, name="schedule"):
        if not isinstance(schedule, torch.Tensor) or schedule.shape != (self.num_sms + 1, 2):
            raise ValueError(f"{name}: expected [{self.num_sms + 1}, 2]")


def test_an_empty_slice_rank_keeps_no_schedule_to_refuse():
    """Ranks with rows schedule their own slice and ignore the caller's schedule; the rank with an empty slice kept it,
    and its finish alone refused it (built for another SM count): the others waited in the all-gather. It keeps none
    now, so every rank gathers and the rows equal a replicated run's."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    md = step.metadata
    md.schedule = torch.zeros(5, 2, dtype=torch.int32)  # the caller's, for 4 SMs; the scorer now launches 8
    scorer = _ScorerOfSms(num_sms=8)
    world = 4
    assert row_shard_bounds(18, md.num_requests, world, world - 1) == (18, 18)
    group = Loopback(world)
    for second in (False, True):  # the first pass fills the group's store, the second gathers every slice
        for rank in range(world):
            state = make_state(step, scorer=scorer)
            plan = plan_decode_rows(state, md, group.for_rank(rank))
            assert (plan.schedule is None) == (rank == world - 1)
            finish_decode_rows(state, step.q, step.weights, plan, group.for_rank(rank))
            if second:
                assert torch.equal(state.topk_indices[:18], _expected(step)), rank
    group.check_sharded(md, gathers=1)


@pytest.mark.parametrize("rows", [{"end": 12}, {"start": 2}, {"shard": 4}, {"num_rows": 12}])
def test_finish_refuses_a_plan_whose_rows_were_replaced(rows):
    """The finish writes the plan's rows: a plan whose rows were replaced (dataclasses.replace keeps its serial) wrote
    rows past the step's that no plan reset. Refused before anything is scored; the plan's fields are fixed."""
    full = make_step(12, k=16, max_rows=16)
    md = DecodeMetadata(full.metadata.seq_lens, full.metadata.block_table, num_requests=8, num_tokens=8,
                        max_seq_len=int(full.metadata.seq_lens[:8].max()))
    state = make_state(full, scorer=TorchScorer())
    plan = plan_decode_rows(state, md, SingleRank())
    assert (plan.num_rows, plan.shard, plan.start, plan.end) == (8, None, 0, 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.end = 12
    state.topk_indices.fill_(7)
    with pytest.raises(ValueError, match=r"^plan: its rows \(num_rows, shard, start, end\) = .* are not what "
                                         r"plan_decode_rows gives .*\(8, None, 0, 8\); pass the plan_decode_rows"):
        finish_decode_rows(state, full.q, full.weights, dataclasses.replace(plan, **rows), SingleRank())
    assert (state.topk_indices == 7).all()
    finish_decode_rows(state, full.q, full.weights, plan, SingleRank())
    assert torch.equal(state.topk_indices[:8], _expected(full)[:8]) and (state.topk_indices[8:] == 7).all()


class _NarrowScorer(TorchScorer):
    def logits(self, *args, **kwargs):  # sized by 64 columns, not max_model_len
        return super().logits(*args, **kwargs)[:, :64]


class _FirstRowScorer(TorchScorer):
    def logits(self, *args, **kwargs):  # the slice's first row only
        return super().logits(*args, **kwargs)[:1]


@pytest.mark.parametrize("scorer", [_NarrowScorer, _FirstRowScorer])
def test_logits_of_another_shape_than_the_scorer_promises_are_refused(scorer):
    """A scorer's logits are [rows, max_model_len]: narrower ones lost every column past their width from the
    selection without a word, and fewer rows failed in torch's copy with a message naming nothing."""
    step = make_step(8, heads=8, head_dim=32, max_model_len=192, k=16, candidates=12)
    state = make_state(step, scorer=scorer())
    with pytest.raises(ValueError, match=rf"^scorer: {scorer.__name__}\.logits returned shape \(\d+, \d+\) for 8 "
                                         r"rows, expected \[8, 192\]"):
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())


class _HalfScorer(TorchScorer):
    def logits(self, *args, **kwargs):  # FP16, which no selection path is promised
        return super().logits(*args, **kwargs).half()


class _UndeclaredBf16Scorer(TorchScorer):
    def logits(self, *args, **kwargs):  # BF16 without saying so: the state loaded the FP32 kernels only
        return super().logits(*args, **kwargs).bfloat16()


class _Bf16Scorer(_UndeclaredBf16Scorer):
    logits_dtype = torch.bfloat16


class _ColumnStridedScorer(TorchScorer):
    def logits(self, *args, **kwargs):  # the right values, column-major
        return super().logits(*args, **kwargs).t().contiguous().t()


@pytest.mark.parametrize("scorer, error, message", [
    (_HalfScorer, TypeError, (r"torch.float16 logits, expected torch.float32 \(its logits_dtype\); return float32 "
                              r"logits, or bfloat16 ones with logits_dtype = torch.bfloat16 on the scorer")),
    (_UndeclaredBf16Scorer, TypeError, r"torch.bfloat16 logits, expected torch.float32 \(its logits_dtype\)"),
    (_ColumnStridedScorer, ValueError, (r"logits on cpu with strides \(1, 8\), expected them on cpu .* with unit "
                                        r"column stride; implement ")),
])
def test_logits_of_another_dtype_or_layout_are_refused_before_any_row_is_written(scorer, error, message):
    """decode_topk refused such logits naming its own argument, after the candidate selection (the exact reference,
    which takes any dtype and layout) had written the candidate rows; on the CPU they were selected. Refused now,
    naming the scorer, with the top-k and candidate rows as the plan left them."""
    step = make_step(8, heads=8, head_dim=32, max_model_len=192, k=16, candidates=12)
    state = make_state(step, scorer=scorer())
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    state.topk_indices.fill_(7)
    state.candidate_blocks.fill_(5)
    with pytest.raises(error, match=rf"^scorer: {scorer.__name__}\.logits returned {message}"):
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())
    assert (state.topk_indices == 7).all() and (state.candidate_blocks == 5).all()


def test_a_scorer_declaring_bf16_logits_is_selected_on_them():
    """A scorer that says ``logits_dtype = torch.bfloat16`` has its BF16 logits selected (the exact reference on the
    CPU), each row the reference's top-k of the BF16 logits."""
    from runtime import reference

    step = make_step(8, heads=8, head_dim=32, max_model_len=192, k=16, candidates=12)
    state = make_state(step, scorer=_Bf16Scorer())
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    logits = _Bf16Scorer().logits(step.q, step.weights, state.index_k_cache, step.metadata.seq_lens,
                                  step.metadata.block_table, None, state.max_model_len)
    assert logits.dtype == torch.bfloat16
    seq_lens = step.metadata.seq_lens
    assert torch.equal(state.topk_indices[:8, :16], reference.decode_topk_reference(logits, seq_lens, 16))
    assert torch.equal(state.candidate_blocks[:8],
                       reference.decode_topk_reference(logits, seq_lens, 12, block_mode=True))


@pytest.mark.parametrize("dtype", [torch.float16, "bfloat16", torch.tensor(1.0)])
def test_a_scorer_declaring_another_logits_dtype_is_refused_when_the_state_is_built(dtype):
    """decode_topk selects FP32 or BF16 logits: another declared dtype (or a name, or no dtype at all) is refused
    while the state is built, on every rank, naming the scorer's attribute."""
    scorer = TorchScorer()
    scorer.logits_dtype = dtype
    step = make_step(8, heads=8, head_dim=32, max_model_len=192, k=16, candidates=12)
    with pytest.raises(TypeError, match=r"^scorer: TorchScorer\.logits_dtype is .*; return float32 logits, or "
                                        r"bfloat16 ones with logits_dtype = torch\.bfloat16"):
        make_state(step, scorer=scorer)


@pytest.mark.parametrize("change", ["as_strided_ overlapping rows", "candidate rows"])
def test_finish_refuses_a_buffer_changed_in_place_since_the_plan(change):
    """The plan refuses a buffer changed in place since the state was built; the finish, which writes the rows, took
    one changed between plan and finish (same address and rows, overlapping rows): rows selected into each other."""
    step = make_step(20, k=16, max_rows=24, candidates=12)
    state = make_state(step, scorer=TorchScorer())
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    if change == "candidate rows":
        state.candidate_blocks.as_strided_(state.candidate_blocks.shape, (6, 1))
    else:
        state.topk_indices.as_strided_(state.topk_indices.shape, (8, 1))
    name = "candidate_blocks" if change == "candidate rows" else "topk_indices"
    with pytest.raises(ValueError, match=rf"^{name}: changed in place since the state was built"):
        finish_decode_rows(state, step.q, step.weights, plan, SingleRank())


def test_an_sm_count_changed_since_the_plan_is_refused_on_every_rank():
    """deep_gemm.set_num_sms between plan and finish: the ranks with rows refused their schedule, while the rank with an
    empty slice (no schedule) went on into the all-gather, where it waited for them. Every rank refuses now."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    scorer, world = _ScorerOfSms(num_sms=4), 4
    assert row_shard_bounds(18, step.metadata.num_requests, world, world - 1) == (18, 18)
    group = Loopback(world)
    states = [make_state(step, scorer=scorer) for _ in range(world)]
    plans = [plan_decode_rows(states[r], step.metadata, group.for_rank(r)) for r in range(world)]
    scorer.num_sms = 8
    for rank in range(world):
        with pytest.raises(ValueError, match=r"^plan: (its schedule is for|made while the scorer launched) 4 SMs, (the scorer|it) now launches 8"):
            finish_decode_rows(states[rank], step.q, step.weights, plans[rank], group.for_rank(rank))
    assert group.store == {}, "a rank entered the all-gather"


def test_slices_longer_than_one_schedule_are_refused_on_every_rank(monkeypatch):
    """A sharded step whose full slices exceed DeepGEMM's MAX_SCHEDULE_ROWS: rank 0's schedule was refused while rank 1,
    whose last slice is 2 rows shorter and fits, planned (resetting its rows) and went on into the all-gather. Every
    rank refuses now, naming metadata.num_tokens, before any reset."""
    from runtime import scoring
    from runtime.scoring import MAX_SCHEDULE_ROWS

    monkeypatch.setattr(scoring, "_check_current_device", lambda name, t: None)  # the CUDA-looking CPU seq_lens
    rows, world = 2 * MAX_SCHEDULE_ROWS + 2, 2
    assert [row_shard_bounds(rows, rows, world, r) for r in range(world)] == [
        (0, MAX_SCHEDULE_ROWS + 2), (MAX_SCHEDULE_ROWS + 2, rows)]
    seq_lens = torch.ones(rows, dtype=torch.int32).as_subclass(_CudaLookingBuffer)
    md = DecodeMetadata(seq_lens, torch.zeros(rows, 1, dtype=torch.int32), rows, rows, 1)
    for rank in range(world):
        state = IndexerState(torch.full((rows + 2, 16), 5, dtype=torch.int32), 16, _tiny_cache(), 64,
                             scorer=_cpu_deepgemm_scorer())
        with pytest.raises(ValueError, match=rf"^metadata.num_tokens: {rows} rows make slices of "
                                             rf"{MAX_SCHEDULE_ROWS + 2} rows over 2 ranks"):
            plan_decode_rows(state, md, _Fixed(rank, world))
        assert (state.topk_indices == 5).all(), rank


# ---------------------------------------------------------------------------
# Mutation audit of the plan/finish flow (review-63a): each test fails on the mutant its docstring names
# ---------------------------------------------------------------------------

def _run_ranks(step, world, scorer_of_rank, gathers):
    """Every rank of a Loopback group plans and finishes ``step`` twice (the second pass gathers every slice); the
    second pass's states, by rank. ``gathers``: the all-gathers the sharded step makes."""
    group, states = Loopback(world), []
    for _ in range(2):
        states = []
        for rank in range(world):
            state = make_state(step, scorer=scorer_of_rank(rank))
            plan = plan_decode_rows(state, step.metadata, group.for_rank(rank))
            finish_decode_rows(state, step.q, step.weights, plan, group.for_rank(rank))
            states.append(state)
    group.check_sharded(step.metadata, gathers=gathers)
    return states


def test_a_candidate_buffer_short_of_every_slice_keeps_the_step_replicated():
    """World 4, 18 rows: slices of 6 span 24 rows. The top-k buffer holds them, the candidate buffer holds the step's
    18 rows only, so the step stays replicated (the gather of the candidate rows would take the last slice from
    rows past the buffer's end: a short slice, or none). Killed: _slice_of asking the top-k buffer alone."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, candidates=12, max_rows=64)
    step.state_args["candidates"] = torch.zeros(18, 12, dtype=torch.int32)
    for rank in range(4):
        state = make_state(step, scorer=TorchScorer())
        plan = plan_decode_rows(state, step.metadata, _Fixed(rank, 4))
        assert (plan.shard, plan.start, plan.end) == (None, 0, 18), rank
        finish_decode_rows(state, step.q, step.weights, plan, _Fixed(rank, 4))
        assert torch.equal(state.topk_indices[:18], _expected(step)), rank
        assert torch.equal(state.candidate_blocks, _expected(step, block_mode=True)), rank


class _CappedScorer(TorchScorer):
    """The torch scorer with a DeepGemmScorer-style cap on the rows one schedule takes."""

    def __init__(self, max_schedule_rows):
        self.max_schedule_rows = max_schedule_rows


@pytest.mark.parametrize("cap", [10, 9])
def test_slices_exactly_one_schedule_long_are_planned(cap):
    """World 2, 20 rows: slices of 10. A scorer whose schedule takes 10 rows scores them (the same rows as a
    replicated run); one taking 9 is refused on every rank. Killed: the plan refusing slices of the cap itself
    (``shard >= most``)."""
    step = make_step(20, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    if cap == 9:
        for rank in range(2):
            with pytest.raises(ValueError, match=r"^metadata.num_tokens: 20 rows make slices of 10 rows over 2"):
                plan_decode_rows(make_state(step, scorer=_CappedScorer(cap)), step.metadata, _Fixed(rank, 2))
        return
    for rank, state in enumerate(_run_ranks(step, 2, lambda rank: _CappedScorer(cap), gathers=1)):
        assert torch.equal(state.topk_indices[:20], _expected(step)), rank


def test_the_schedule_cap_refusal_names_a_step_that_is_taken():
    """A cap of 9 over 2 ranks was told "steps of at most 18", whose slices of 9 round up to an even 10 and are
    refused too. It says 16, which is planned."""
    import re

    step = make_step(20, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    with pytest.raises(ValueError, match=r"steps of at most 16, or shard") as refused:
        plan_decode_rows(make_state(step, scorer=_CappedScorer(9)), step.metadata, _Fixed(0, 2))
    most = int(re.search(r"steps of at most (\d+)", str(refused.value)).group(1))
    small = make_step(most, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    assert plan_decode_rows(make_state(small, scorer=_CappedScorer(9)), small.metadata, _Fixed(0, 2)).shard == 8


def test_metadata_of_other_dimensions_is_told_a_fix_that_works():
    """seq_lens [rows, 1] (DeepGEMM's context_lens layout) was told to clone(memory_format=...), which keeps its two
    dimensions: refused again. A wrong dimension count is told to reshape, which is taken."""
    step = make_step(8, heads=4, head_dim=32, max_model_len=128, k=16)
    md = step.metadata
    state = make_state(step, scorer=TorchScorer())
    two_d = dataclasses.replace(md, seq_lens=md.seq_lens.view(-1, 1))
    with pytest.raises(ValueError, match=r"^metadata\.seq_lens: expected 1-D, got shape \(8, 1\); pass "
                                         r"seq_lens\.reshape\(-1\), one length a row$"):
        decode_rows(state, two_d, step.q, step.weights, SingleRank())
    decode_rows(state, dataclasses.replace(two_d, seq_lens=two_d.seq_lens.reshape(-1)), step.q, step.weights,
                SingleRank())
    assert torch.equal(state.topk_indices[:8], _expected(step))
    with pytest.raises(ValueError, match=r"^metadata\.block_table: expected 2-D, got shape \(8, 1, 2\); pass "
                                         r"\[rows, pages\]$"):
        decode_rows(state, dataclasses.replace(md, block_table=md.block_table.view(8, 1, -1)), step.q, step.weights,
                    SingleRank())


def test_setting_a_checked_states_attribute_names_replace_only_for_its_fields():
    """state.max_rows = 2 (max_rows is a property, no field) was told dataclasses.replace(state, max_rows=...), which
    raises TypeError; only a field the state is built with is told so."""
    state = make_state(make_step(4, heads=4, head_dim=32, max_model_len=128, k=16), scorer=TorchScorer())
    with pytest.raises(AttributeError, match=r"^max_rows: an IndexerState's fields are fixed once checked; build "
                                             r"another state$"):
        state.max_rows = 2
    with pytest.raises(AttributeError, match=r"^k: .*e\.g\. dataclasses\.replace\(state, k=\.\.\.\), which checks it$"):
        state.k = 8
    assert dataclasses.replace(state, k=8).k == 8


@pytest.mark.parametrize("rank, world_size", [(0, 2), (1, 2), (1, 1)])
def test_single_rank_is_one_rank(rank, world_size):
    """SingleRank(world_size=2), filled with a caller's own rank and world size, sharded the step, reset the buffer,
    scored its half and then failed in the gather, told to return every rank's slice, which it cannot. It is
    refused when made, naming the group to pass."""
    name = "world_size" if world_size != 1 else "rank"  # the one that is wrong
    with pytest.raises(ValueError, match=rf"^{name}: SingleRank is the group of one rank \(rank 0 of 1\), got "
                                         rf"rank {rank} of {world_size}; pass SingleRank\(\) for one rank, "
                                         rf"runtime\.indexer\.DistGroup\(group\) for a group of several$"):
        SingleRank(rank=rank, world_size=world_size)
    assert SingleRank() == SingleRank(0, 1)


class _ScheduledScorer(_ScorerOfSms):
    """Scores only under a schedule, as DeepGEMM does (its logits read the schedule; None faults on the device)."""

    def logits(self, q, weights, cache, seq_lens, block_table, schedule, *args, **kwargs):
        assert isinstance(schedule, torch.Tensor), f"scored {q.shape[0]} rows without a schedule"
        return super().logits(q, weights, cache, seq_lens, block_table, schedule, *args, **kwargs)


def test_an_empty_slice_rank_scores_nothing():
    """World 4, 18 rows: rank 3's slice [18, 18) is empty, and its plan keeps no schedule, so its finish must not
    call the scorer at all (DeepGEMM given no schedule would fault); it gathers the others' rows. Killed: the finish
    scoring when ``end >= start``."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=192, k=16, max_rows=64)
    assert row_shard_bounds(18, step.metadata.num_requests, 4, 3) == (18, 18)
    for rank, state in enumerate(_run_ranks(step, 4, lambda rank: _ScheduledScorer(num_sms=4), gathers=1)):
        assert torch.equal(state.topk_indices[:18], _expected(step)), rank


@pytest.mark.parametrize("world", [1, 2])
def test_a_topk_buffer_wider_than_k_gets_k_columns(world):
    """topk_indices 24 wide with k = 16: the step selects the top 16 into the first 16 columns and leaves the other 8
    as the plan's reset left them, -1 (sharded too: the gathers move the 16 columns). Killed: the selection writing
    the buffer's whole width (the top 24, whose first 16 columns are not the top 16)."""
    step = make_step(20, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    step.state_args["topk"] = torch.full((64, 24), 7, dtype=torch.int32)
    if world == 1:
        state = make_state(step, scorer=TorchScorer())
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
        states = [state]
    else:
        states = _run_ranks(step, world, lambda rank: TorchScorer(), gathers=1)
    for rank, state in enumerate(states):
        assert torch.equal(state.topk_indices[:20, :16], _expected(step)), rank
        assert (state.topk_indices[:20, 16:] == -1).all(), rank
        assert (state.topk_indices[20:] == 7).all(), rank


class _EveryOtherRowGather(_WrongGather):
    """Every rank's slice concatenated as asked, written into the top-k buffer from its first row at twice its row
    stride: the result starts where the rows it is copied into start, but its rows are other rows of the buffer."""

    def __init__(self, buffer):
        super().__init__("every other row")
        self.buffer = buffer

    def __call__(self, local):
        whole = torch.cat([local] * self.world_size)
        b = self.buffer
        spread = torch.empty(0, dtype=b.dtype).set_(b.untyped_storage(), b.storage_offset(), whole.shape,
                                                    (2 * b.stride(0), 1))
        return spread.copy_(whole)

    all_gather = __call__


def test_gather_result_at_the_buffers_start_with_another_row_stride_is_refused():
    """A result that starts at the buffer rows it is copied into is those very rows only at their row stride: at
    twice it, its row i is buffer row 2i, which the copy overwrites before reading it. Killed:
    _shares_memory_elsewhere taking the same start address as the same elements."""
    step = make_step(18, heads=8, head_dim=32, max_model_len=256, k=16, max_rows=64)
    state = make_state(step, scorer=TorchScorer())
    with pytest.raises(ValueError, match="^all_gather: returned rows that share memory with the buffer rows"):
        decode_rows(state, step.metadata, step.q, step.weights, Loopback(2),
                    _EveryOtherRowGather(state.topk_indices))


@pytest.mark.parametrize("backend, cuda, cpu", [("gloo", True, True), ("nccl", True, False),
                                                ("cpu:gloo", False, True), ("cpu:gloo,cuda:nccl", True, True)])
def test_dist_group_device_types_per_backend(backend, cuda, cpu):
    """gloo gathers CUDA tensors as well as CPU ones; NCCL CUDA only; a backend per device type exactly those
    named. (The check reads the device type only: no CUDA device is needed.) Killed: gloo's set without cuda, which
    refused a gloo group's CUDA rows."""
    group = object.__new__(DistGroup)
    group._read_backend(backend)
    for device, takes in ((torch.device("cuda", 0), cuda), (torch.device("cpu"), cpu)):
        if takes:
            group.check_device(device)
        else:
            with pytest.raises(ValueError, match=rf"^tp: its backend gathers .* on {device}"):
                group.check_device(device)


def test_state_refuses_a_scorer_class_for_an_instance():
    """scorer=TorchScorer (the class, not TorchScorer()) passed the interface check, its methods being functions of
    the class, and every step then raised Python's TypeError about a missing 'max_model_len' (the query bound as
    self): refused when the state is built, naming scorer and the fix."""
    step = make_step(8, k=16)
    with pytest.raises(TypeError, match=r"^scorer: got the class TorchScorer; pass an instance, TorchScorer\(\)"):
        make_state(step, scorer=TorchScorer)
    make_state(step, scorer=TorchScorer())


@pytest.mark.parametrize("layout", ["sparse", "nested"])
def test_plan_refuses_a_schedule_without_strides_before_the_reset(layout):
    """plan_decode_rows records where metadata.schedule is (_metadata_view: its data_ptr, shape, strides) after the
    reset: a sparse or nested schedule (which the torch scorer never reads) raised torch's RuntimeError there, naming
    nothing, with the top-k rows already reset. Refused before, naming the field."""
    step = make_step(8, k=16)
    schedule = {"sparse": torch.zeros(5, 2, dtype=torch.int32).to_sparse(),
                "nested": torch.nested.nested_tensor([torch.zeros(2, dtype=torch.int32)] * 5)}[layout]
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    with pytest.raises(TypeError, match="^metadata.schedule must be a dense"):
        plan_decode_rows(state, dataclasses.replace(step.metadata, schedule=schedule), SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_state_steps_as_the_original(how):
    """copy.deepcopy of a state (of a layer holding it), or a pickle round trip, kept the original's record of where
    its buffers were: every step on the copy was refused as 'topk_indices: changed in place since the state was
    built', which it was not. The copy records its own buffers and steps as the original does."""
    import copy
    import io

    step = make_step(20, k=16, candidates=12, max_rows=24)
    state = make_state(step, scorer=TorchScorer())
    if how == "deepcopy":
        copied = copy.deepcopy(state)
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        copied = torch.load(buffer, weights_only=False)
    assert copied.topk_indices.data_ptr() != state.topk_indices.data_ptr()
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    decode_rows(copied, step.metadata, step.q, step.weights, SingleRank())
    assert torch.equal(copied.topk_indices, state.topk_indices)
    assert torch.equal(copied.candidate_blocks, state.candidate_blocks)


def test_a_query_of_no_heads_is_refused_naming_it():
    """q [rows, 0, head_dim] with weights [rows, 0] passed every check: the torch scorer summed no heads into logits
    of 0 for every key, and each row's 'top-k' was its first k columns, without a word. Refused by the flow and the
    scorer's checks, naming q, before the reset."""
    step = make_step(8, k=16)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    q, weights = step.q[:, :0], step.weights[:, :0]
    with pytest.raises(ValueError, match=r"^q: has no index heads \(\[8, 0, 64\]\)"):
        decode_rows(state, step.metadata, q, weights, SingleRank())
    assert (state.topk_indices == 5).all(), "reset before the refusal"
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    with pytest.raises(ValueError, match=r"^q: has no index heads"):
        finish_decode_rows(state, q, weights, plan, SingleRank())
    md = step.metadata
    with pytest.raises(ValueError, match=r"^q: has no index heads"):
        TorchScorer().logits(q, weights, step.state_args["index_k_cache"], md.seq_lens, md.block_table, None,
                             step.state_args["max_model_len"])
