"""Indexer decode flow on a GPU: DeepGEMM scoring, AOT top-k, sharding, zero JIT (marker gpu)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from conftest import REQUIRE_GPU
from indexer_cases import (
    Loopback,
    make_state,
    make_step,
    pool_rows_case,
    pool_rows_loop,
)
from runtime import reference
from runtime.indexer import (
    DecodeMetadata,
    SingleRank,
    check_decode_metadata_values,
    decode_rows,
    row_shard_bounds,
    topk_pool_rows,
)
from runtime.scoring import TorchScorer, deepgemm_status

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
HEADS, HEAD_DIM = 64, 128  # DeepSeek's indexer: 64 heads of 128


def _deepgemm():
    ok, why = deepgemm_status()
    if not ok:
        if REQUIRE_GPU:
            pytest.fail(f"DeepGEMM cannot score here: {why}")
        pytest.skip(f"DeepGEMM cannot score here: {why}")
    from runtime.scoring import DeepGemmScorer

    return DeepGemmScorer()


def _step(rows, *, max_model_len=8192, k=512, candidates=None, max_rows=None, seed=0, signed_weights=False):
    return make_step(rows, heads=HEADS, head_dim=HEAD_DIM, max_model_len=max_model_len, k=k, candidates=candidates,
                     max_rows=max_rows, seed=seed, device="cuda", signed_weights=signed_weights)


def _sets(t):
    return t.sort(dim=1).values


@pytest.fixture
def topk_launches(monkeypatch):
    """The names of the decode_topk kernels a test's steps launch. The flow could select by an exact torch path (the
    indexer's own reference, torch.topk) that gives the same sets, which neither a comparison of sets nor a watch on
    decode_topk's fallback tells from the AOT kernel: a flow test counts the kernels launched instead."""
    from runtime import topk

    names = []
    launch_on = topk.launch_on

    def recorded(device, kernel, grid, *args):
        names.append(kernel.name)
        return launch_on(device, kernel, grid, *args)

    monkeypatch.setattr(topk, "launch_on", recorded)
    return names


def _launched(names, mode: str) -> int:
    """How many of ``names`` select in ``mode`` ("token" or "block")."""
    return sum(f"_{mode}_" in name for name in names)


@pytest.mark.parametrize("signed_weights", [False, True])
def test_deepgemm_logits_match_reference(signed_weights):
    scorer = _deepgemm()
    step = _step(12, max_model_len=4096, signed_weights=signed_weights)
    md, a = step.metadata, step.state_args
    got = scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table,
                        scorer.schedule(md.seq_lens), a["max_model_len"])
    want, magnitude = (reference.indexer_logits_reference(step.q, w, a["index_k_cache"], md.seq_lens,
                                                          md.block_table, a["max_model_len"])
                       for w in (step.weights, step.weights.abs()))
    valid = torch.arange(a["max_model_len"], device="cuda")[None, :] < md.seq_lens[:, None]
    # Same FP8 inputs, FP32 math on both sides: the difference is the order of the sums and Hopper's FP8
    # tensor-core accumulation (fewer than FP32's mantissa bits), measured at ~1e-4 of the largest logit on an
    # H200. It scales with the terms' magnitudes, sum_h |w_h| relu(q_h . k): with signed weights (a projection's)
    # the logits cancel, so that sum, not the largest logit, is the scale.
    scale = magnitude[valid].max()
    err = (got.float() - want).abs()[valid].max()
    assert err <= 1e-3 * scale, f"max error {err} against terms up to {scale}"
    if signed_weights:
        assert (want[valid] < 0).any() and (want[valid] > 0).any()


# 64K: rows past the short-row kernel's 16K, so the cluster kernels select DeepGEMM's logits in a flow test too.
@pytest.mark.parametrize("candidates, signed_weights, max_model_len",
                         [(None, False, 8192), (512, False, 8192), (512, True, 8192), (512, False, 65536)])
def test_flow_deepgemm_aot_topk_equals_reference(monkeypatch, topk_launches, candidates, signed_weights,
                                                 max_model_len):
    from runtime import topk

    fallback = []
    real = topk.decode_topk_reference
    monkeypatch.setattr(topk, "decode_topk_reference", lambda *a, **kw: fallback.append(a[0].shape) or real(*a, **kw))
    scorer = _deepgemm()
    step = _step(16, candidates=candidates, signed_weights=signed_weights, max_model_len=max_model_len)
    state = make_state(step, scorer=scorer)
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert not fallback, f"decode_topk ran its torch fallback on logits of shapes {fallback}"
    assert (_launched(topk_launches, "token"), _launched(topk_launches, "block")) == (1, 1 if candidates else 0), \
        topk_launches
    md, a = step.metadata, step.state_args
    logits = scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table,
                           scorer.schedule(md.seq_lens), a["max_model_len"])
    want = reference.decode_topk_reference(logits, md.seq_lens, a["k"])
    assert torch.equal(_sets(state.topk_indices[:16]), _sets(want))
    if candidates:
        want_blocks = reference.decode_topk_reference(logits, md.seq_lens, candidates, block_mode=True)
        assert torch.equal(_sets(state.candidate_blocks[:16]), _sets(want_blocks))
    from runtime.topk import supports_decode_topk

    # decode_topk falls back to decode_topk_reference where the cache refuses the device (one RuntimeWarning):
    # without this the test compares the reference with itself.
    assert supports_decode_topk(logits, 16, a["k"], False), "the AOT top-k must take the 16 rows"
    if candidates:
        assert supports_decode_topk(logits, 16, candidates, True), "the AOT top-k must take the candidate blocks"



def test_flow_inside_torch_compile_equals_eager(topk_launches):
    """decode_rows called from a compiled function (a graph break: the step runs eagerly) with DeepGEMM's scoring and
    the AOT top-k: the same rows as the eager step, each as a set (the kernel's order within a row is not fixed: the
    H100 run of the fifty-seventh session found it differ between the two steps), the top-k kernel launched in both."""
    scorer = _deepgemm()
    step = _step(16, candidates=512)
    eager, compiled_state = make_state(step, scorer=scorer), make_state(step, scorer=scorer)
    decode_rows(eager, step.metadata, step.q, step.weights, SingleRank())

    def run(q, weights):
        return decode_rows(compiled_state, step.metadata, q, weights, SingleRank()) + 0

    torch._dynamo.reset()
    got = torch.compile(run)(step.q, step.weights)
    torch.cuda.synchronize()
    assert torch.equal(_sets(compiled_state.topk_indices), _sets(eager.topk_indices))
    assert torch.equal(_sets(compiled_state.candidate_blocks), _sets(eager.candidate_blocks))
    assert torch.equal(got, compiled_state.topk_indices)  # the compiled function returns the step's buffer
    assert (_launched(topk_launches, "token"), _launched(topk_launches, "block")) == (2, 2), topk_launches

@pytest.mark.parametrize("world,rows", [(2, 18), (4, 18), (4, 20), (4, 64)])
def test_flow_sharded_equals_replicated(monkeypatch, topk_launches, world, rows):
    """Every rank's slice (short and empty last ones at world 4) scored by DeepGEMM and selected by the AOT top-k,
    gathered, equals the replicated step. decode_topk's exact fallback must not run, in the slices or in the
    replicated step: it would select the same sets, so without this check the sharded steps could pass on the
    torch reference (a slice the kernel refuses) and never run the AOT top-k."""
    from runtime import topk

    fallback = []
    real = topk.decode_topk_reference
    monkeypatch.setattr(topk, "decode_topk_reference", lambda *a, **kw: fallback.append(a[0].shape) or real(*a, **kw))
    scorer = _deepgemm()
    step = _step(rows, candidates=512, max_rows=64, seed=rows)
    want = make_state(step, scorer=scorer)
    decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
    assert (_launched(topk_launches, "token"), _launched(topk_launches, "block")) == (1, 1), topk_launches
    group = Loopback(world)
    for rnd in range(2):
        for rank in range(world):
            got = make_state(step, scorer=scorer)
            before = len(topk_launches)
            decode_rows(got, step.metadata, step.q, step.weights, group.for_rank(rank))
            mine = topk_launches[before:]
            has_rows = bool(len(range(*row_shard_bounds(rows, step.metadata.num_requests, world, rank))))
            assert (_launched(mine, "token"), _launched(mine, "block")) == ((1, 1) if has_rows else (0, 0)), \
                (rank, mine)
            if rnd == 1:
                assert torch.equal(_sets(got.topk_indices[:rows]), _sets(want.topk_indices[:rows])), rank
                assert torch.equal(_sets(got.candidate_blocks[:rows]), _sets(want.candidate_blocks[:rows])), rank
    group.check_sharded(step.metadata, gathers=2)
    assert not fallback, f"decode_topk ran its torch fallback on logits of shapes {fallback}"


@pytest.mark.parametrize("schedule_in_graph", [False, True], ids=("plan_builds_schedule", "caller_builds_schedule"))
def test_flow_under_cuda_graph_follows_new_inputs(monkeypatch, schedule_in_graph):
    """A serving stack captures a step once and replays it after writing each step's values into the same
    tensors. Captured here: 12 rows of q (2 of them a graph's padding) over 10 tokens, DeepGEMM's schedule built
    in the graph (by the plan from metadata without one, or by the caller), the AOT top-k selecting; then three
    replays, each on new keys, lengths (0 and full among them), block tables, queries and weights. Every replay's
    rows equal the eager reference on that step's values, the padding rows hold -1 (written with garbage first), and
    decode_topk's torch fallback never runs (it cannot be captured: it would have raised at capture anyway)."""
    from runtime import topk

    scorer = _deepgemm()
    tokens, padded = 10, 12
    steps = [_step(padded, candidates=512, seed=40 + i) for i in range(4)]
    static = steps[0]
    state = make_state(static, scorer=scorer)
    q, weights = static.q.clone(), static.weights.clone()
    seq_lens, table = static.metadata.seq_lens.clone(), static.metadata.block_table.clone()

    def step():
        # The plan reuses a caller's schedule only where it spans all of metadata.seq_lens' rows.
        lens = seq_lens[:tokens] if schedule_in_graph else seq_lens
        schedule = scorer.schedule(lens) if schedule_in_graph else None
        md = DecodeMetadata(lens, table, num_requests=tokens, num_tokens=tokens, max_seq_len=8192,
                            schedule=schedule)
        decode_rows(state, md, q, weights, SingleRank())

    schedules = []
    real_schedule = scorer.schedule
    monkeypatch.setattr(scorer, "schedule", lambda lens: schedules.append(lens.shape) or real_schedule(lens))
    step()  # loads the AOT kernels and DeepGEMM's before capture
    torch.cuda.synchronize()
    assert len(schedules) == 1, "the plan builds the schedule only where the caller did not"
    fallback = []
    real = topk.decode_topk_reference
    monkeypatch.setattr(topk, "decode_topk_reference", lambda *a, **kw: fallback.append(a[0].shape) or real(*a, **kw))
    graph = torch.cuda.CUDAGraph()
    captured, launch_on = [], topk.launch_on
    monkeypatch.setattr(topk, "launch_on", lambda device, kernel, grid, *args: captured.append(kernel.name)
                        or launch_on(device, kernel, grid, *args))
    with torch.cuda.graph(graph):
        step()
    assert (_launched(captured, "token"), _launched(captured, "block")) == (1, 1), f"captured {captured}"
    a = static.state_args
    for new in steps[1:]:
        seq = new.metadata.seq_lens.clone()
        seq[0], seq[3] = 0, a["max_model_len"]
        for dst, src in ((q, new.q), (weights, new.weights), (seq_lens, seq), (table, new.metadata.block_table),
                         (a["index_k_cache"], new.state_args["index_k_cache"])):
            dst.copy_(src)
        state.topk_indices.fill_(7)
        state.candidate_blocks.fill_(7)
        graph.replay()
        logits = scorer.logits(q[:tokens], weights[:tokens], a["index_k_cache"], seq_lens[:tokens],
                               table[:tokens], scorer.schedule(seq_lens[:tokens]), a["max_model_len"])
        want = reference.decode_topk_reference(logits, seq_lens[:tokens], a["k"])
        want_blocks = reference.decode_topk_reference(logits, seq_lens[:tokens], 512, block_mode=True)
        assert torch.equal(_sets(state.topk_indices[:tokens]), _sets(want))
        assert torch.equal(_sets(state.candidate_blocks[:tokens]), _sets(want_blocks))
        assert (state.topk_indices[0] == -1).all(), "a row of length 0 selects nothing"
        assert (state.topk_indices[tokens:padded] == -1).all(), "the padding rows are reset in the graph"
    assert not fallback, f"decode_topk ran its torch fallback on logits of shapes {fallback}"


def test_split_flow_under_cuda_graph_plans_inside_the_capture(topk_launches):
    """plan_decode_rows and finish_decode_rows captured together replay on each step's values, as decode_rows does;
    a finish captured with a plan made before the capture is refused (it baked the plan's DeepGEMM schedule, built
    from seq_lens at the plan and freed with it, into every replay: a longer row's scoring never ends there)."""
    from runtime.indexer import finish_decode_rows, plan_decode_rows

    scorer = _deepgemm()
    tokens = 10
    steps = [_step(tokens, candidates=512, seed=60 + i) for i in range(3)]
    static = steps[0]
    state = make_state(static, scorer=scorer)
    q, weights = static.q.clone(), static.weights.clone()
    seq_lens, table = static.metadata.seq_lens.clone(), static.metadata.block_table.clone()
    md = DecodeMetadata(seq_lens, table, num_requests=tokens, num_tokens=tokens, max_seq_len=8192)
    finish_decode_rows(state, q, weights, plan_decode_rows(state, md, SingleRank()), SingleRank())  # warm
    torch.cuda.synchronize()
    eager_plan = plan_decode_rows(state, md, SingleRank())
    refused = pytest.raises(ValueError, match="plan: made outside the CUDA graph capture")
    with refused, torch.cuda.graph(torch.cuda.CUDAGraph()):
        finish_decode_rows(state, q, weights, eager_plan, SingleRank())
    graph = torch.cuda.CUDAGraph()
    before = len(topk_launches)
    with torch.cuda.graph(graph):
        finish_decode_rows(state, q, weights, plan_decode_rows(state, md, SingleRank()), SingleRank())
    captured = topk_launches[before:]  # the AOT kernels, not an exact torch path (which also captures)
    assert (_launched(captured, "token"), _launched(captured, "block")) == (1, 1), captured
    a = static.state_args
    for new in steps[1:]:
        for dst, src in ((q, new.q), (weights, new.weights), (seq_lens, new.metadata.seq_lens),
                         (table, new.metadata.block_table), (a["index_k_cache"], new.state_args["index_k_cache"])):
            dst.copy_(src)
        state.topk_indices.fill_(7)
        graph.replay()
        logits = scorer.logits(q, weights, a["index_k_cache"], seq_lens, table, scorer.schedule(seq_lens),
                               a["max_model_len"])
        assert torch.equal(_sets(state.topk_indices[:tokens]), _sets(reference.decode_topk_reference(
            logits, seq_lens, a["k"])))
        assert torch.equal(_sets(state.candidate_blocks[:tokens]), _sets(reference.decode_topk_reference(
            logits, seq_lens, 512, block_mode=True)))


def test_value_check_refuses_a_stale_deepgemm_schedule():
    """DeepGEMM's schedule follows seq_lens' values, and one of longer rows than the scoring finds never ends: the
    value check rebuilds it and refuses a stale one, and takes the current one (the rebuild is bit-identical)."""
    import dataclasses

    scorer = _deepgemm()
    step = _step(8)
    state = make_state(step, scorer=scorer)
    md = step.metadata
    current = dataclasses.replace(md, schedule=scorer.schedule(md.seq_lens))
    check_decode_metadata_values(state, current)
    shorter = md.seq_lens // 2
    assert not torch.equal(scorer.schedule(shorter), current.schedule)
    with pytest.raises(ValueError, match=r"^metadata.schedule: the schedule is not the scorer's schedule"):
        check_decode_metadata_values(state, dataclasses.replace(current, seq_lens=shorter))


def test_torch_scorer_flow_agrees_with_deepgemm_flow():
    """The DeepGEMM flow's picks against the torch scorer's FP32 logits. DeepGEMM sums the heads' products in another
    order with Hopper's FP8 accumulation, so its logits differ from the exact ones (~1e-4 of the row's largest logit,
    held within 1e-3 as in test_deepgemm_logits_match_reference; the weights here are positive, so that logit is the
    terms' scale), and two columns can swap only where their exact logits lie within twice that difference: every
    column the DeepGEMM flow takes must score at least the row's k-th exact value less that margin, and every column
    it leaves at most the k-th value plus it. The torch flow selects exactly (no margin)."""
    scorer = _deepgemm()
    step = _step(8)
    dg = make_state(step, scorer=scorer)
    decode_rows(dg, step.metadata, step.q, step.weights, SingleRank())
    ref = make_state(step, scorer=TorchScorer())
    decode_rows(ref, step.metadata, step.q, step.weights, SingleRank())
    a, md = step.state_args, step.metadata
    inputs = (step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table)
    exact = TorchScorer().logits(*inputs, None, a["max_model_len"])
    fast = scorer.logits(*inputs, scorer.schedule(md.seq_lens), a["max_model_len"])
    for r in range(8):
        length = int(md.seq_lens[r])
        n = min(a["k"], length)
        e, f = exact[r, :length].double(), fast[r, :length].double()
        gap = float((e - f).abs().max()) if length else 0.0
        assert gap <= 1e-3 * float(e.abs().max()), f"row {r}: DeepGEMM's logits {gap:.3g} off the FP32 reference"
        for name, row, margin in (("deepgemm", dg.topk_indices[r], 2 * gap), ("torch", ref.topk_indices[r], 0.0)):
            # The sets below drop -1 and repeats: a row padded with a repeated index instead of -1 passed them.
            taken = row[row != -1]
            assert taken.numel() == n and taken.unique().numel() == n, (name, r)
            assert ((taken >= 0) & (taken < length)).all(), (name, r)
            if not n:
                continue
            kth = float(e.topk(n).values[-1])
            left = torch.ones(length, dtype=torch.bool, device=e.device)
            left[taken.long()] = False
            assert float(e[taken.long()].min()) >= kth - margin, f"{name} row {r} takes a column below the k-th"
            if left.any():
                assert float(e[left].max()) <= kth + margin, f"{name} row {r} leaves a column above the k-th"


_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    import runtime
    runtime.load()  # the AOT cache loads at start-up, not in a step
    from indexer_cases import make_state, make_step
    from runtime.indexer import DecodeMetadata, SingleRank, decode_rows
    from runtime.indexer import preload_decode_rows
    from runtime.scoring import DeepGemmScorer, check_step_compiles_nothing, steps_after_pause_ms
    step = make_step(16, heads=64, head_dim=128, max_model_len=8192, k=512, device="cuda")
    state = make_state(step, scorer=DeepGemmScorer())
    bounds = {{}}
    if {preload}:  # start-up as the README's serving recipe does it: the first step then costs a steady one
        preload_decode_rows(state)
        bounds = dict(first_step_factor=3.0, first_step_slack_ms=1.0)
    run = lambda: decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    result = check_step_compiles_nothing(run, **bounds)
    if {preload}:
        # A step after a pause is slower than one back to back (steps_after_pause_ms). Against such steps the first
        # one must not stand out, as loading modules in it would (the cold first step without a preload: ~8 ms).
        paused = steps_after_pause_ms(run)
        result["after_pause_ms"] = paused
        median = sorted(paused)[len(paused) // 2]
        assert result["first_ms"] <= 1.5 * median + 0.1, (result["first_ms"], paused)
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def warmed_deepgemm_cache():
    """An empty DeepGEMM cache directory filled by warm_deepgemm alone (the build step's warm-up), once a module: the
    jobs' own DG_JIT_CACHE_DIR is restored from an earlier round's files, in which a warm-up that missed a kernel the
    step needs would go unnoticed. ~11 s on the H200 (warm_deepgemm_cli_s46.log)."""
    _deepgemm()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory() as tmp:
        env["DG_JIT_CACHE_DIR"] = tmp
        warm = ("from runtime.scoring import ServingShapes, warm_deepgemm; "
                "print(warm_deepgemm(ServingShapes(max_rows=32, heads=64, head_dim=128)))")
        subprocess.run([sys.executable, "-c", warm], env=env, check=True, timeout=600)
        yield env


@pytest.mark.parametrize("preload", [False, True])
def test_warm_cache_first_step_compiles_nothing(preload, warmed_deepgemm_cache):
    """In a fresh process over a DeepGEMM cache that warm_deepgemm filled from empty, the first decode step leaves
    the cache unchanged (nothing compiled) and, without a start-up preload, stays within
    check_step_compiles_nothing's default bound (a compile takes seconds; the cold first step loads modules, ~9 ms in
    indexer_no_jit_s44.json). After preload_decode_rows, the first step's time is the steady state's: within 3x it
    plus 1 ms (0.19-0.24 against 0.12-0.13 ms in indexer_no_jit_preloaded_s44.json), and within 1.5x plus 0.1 ms of
    the median of steps that follow the same pause as it does (a step after a pause costs more than one back to
    back: first_step_s63_h100.json)."""
    # A fresh process: nothing in DeepGEMM's in-memory cache, only the files.
    run = subprocess.run([sys.executable, "-c", _CHECK.format(tests=str(ROOT / "tests"), preload=preload)],
                         env=warmed_deepgemm_cache, capture_output=True, text=True, timeout=300)
    print(run.stdout, run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-3000:]


def test_logits_reference_ignores_lowered_fp32_matmul_precision(fp32_matmul_precision):
    """The torch scorer's logits (indexer_logits_reference) do not change where a process turns on TF32 or BF16
    for FP32 matmuls: the dot products accumulate in FP64. Before, an FP32 einsum rounded q and the keys to TF32."""
    step = _step(4, max_model_len=1024, signed_weights=True)
    md, a = step.metadata, step.state_args

    def logits():
        return reference.indexer_logits_reference(step.q, step.weights, a["index_k_cache"], md.seq_lens,
                                                  md.block_table, a["max_model_len"])

    x, y = torch.randn(64, 512, device="cuda"), torch.randn(512, 640, device="cuda")
    fp32_matmul_precision("highest")
    ieee = logits()
    fp32 = torch.matmul(x, y)
    for precision in ("high", "medium"):
        fp32_matmul_precision(precision)
        assert not torch.equal(torch.matmul(x, y), fp32), "the setting should lower FP32 matmuls"
        assert torch.equal(logits(), ieee), precision


_NCCL_ONE_RANK = textwrap.dedent("""
    import os, sys, torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from indexer_cases import gathers_taken, make_state, make_step
    from runtime.indexer import DistGroup, SingleRank, decode_rows
    from runtime.scoring import TorchScorer
    for i, backend in enumerate(("nccl", "cpu:gloo,cuda:nccl")):
        dist.init_process_group(backend, init_method="file://" + os.path.join({tmp!r}, str(i)), rank=0,
                                world_size=1)
        group = DistGroup()
        rows = torch.arange(24, dtype=torch.int32, device="cuda").view(4, 6)
        with gathers_taken(dist) as used:
            got = group.all_gather(rows[:, :4])  # a strided view, gathered as its contiguous copy
        torch.cuda.synchronize()
        assert used == ["into"], (backend, used)  # one NCCL gather into one tensor, no concatenation
        assert torch.equal(got, rows[:, :4]), backend
        # A whole step through the group (one rank: replicated, nothing to gather) equals SingleRank's.
        step = make_step(16, heads=64, head_dim=128, max_model_len=1024, k=512, device="cuda", seed=i)
        want, state = make_state(step, scorer=TorchScorer()), make_state(step, scorer=TorchScorer())
        decode_rows(want, step.metadata, step.q, step.weights, SingleRank())
        decode_rows(state, step.metadata, step.q, step.weights, group)
        assert torch.equal(state.topk_indices.sort(1).values, want.topk_indices.sort(1).values), backend
        dist.destroy_process_group()
    print("nccl ok")
""")


def test_dist_group_gathers_cuda_rows_through_nccl():
    """DistGroup on an NCCL group, and on the backend per device type that init_process_group() makes without a
    backend ("cpu:gloo,cuda:nccl"): CUDA rows take NCCL's single-tensor gather (the latter took the list gather
    and a concatenation before), and a step through the group equals SingleRank's. One rank: a machine of one
    GPU cannot hold two NCCL ranks; the sharded gathers run on gloo on CI and by Loopback above."""
    if not torch.distributed.is_nccl_available():
        pytest.fail("torch here has no NCCL") if REQUIRE_GPU else pytest.skip("torch here has no NCCL")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run([sys.executable, "-c", _NCCL_ONE_RANK.format(tests=str(ROOT / "tests"), tmp=tmp)],
                             env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0 and "nccl ok" in run.stdout, run.stderr[-3000:]


def test_deepgemm_scorer_refuses_tensors_off_the_current_device(monkeypatch):
    """DeepGEMM launches on the current device with the tensors' addresses: called directly with tensors on
    another GPU it read them across devices. The scorer refuses that, naming the argument (the indexer makes the
    state's device current). One GPU here: the current device is reported as another one."""
    scorer = _deepgemm()
    step = _step(4, max_model_len=1024)
    md, a = step.metadata, step.state_args
    schedule = scorer.schedule(md.seq_lens)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    with pytest.raises(ValueError, match=r"seq_lens: on cuda:0, but cuda:1 is current.*torch.cuda.device"):
        scorer.schedule(md.seq_lens)
    with pytest.raises(ValueError, match=r"q: on cuda:0, but cuda:1 is current"):
        scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table, schedule,
                      a["max_model_len"])
    monkeypatch.undo()
    scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table, schedule,
                  a["max_model_len"])


def test_deepgemm_schedule_takes_exactly_max_schedule_rows():
    """MAX_SCHEDULE_ROWS is DeepGEMM's own limit, not a guess: its schedule kernel builds a schedule of that many rows
    (the last SM's end is the whole batch), one row more hits its shared-memory assert (a RuntimeError naming no
    argument), and the scorer refuses that row count itself, naming seq_lens. A DeepGEMM whose limit moved fails
    here. (Each row count compiles DeepGEMM's schedule kernel once, ~5 s.)"""
    from runtime.scoring import BLOCK_KV, MAX_SCHEDULE_ROWS

    scorer = _deepgemm()
    seq_lens = torch.full((MAX_SCHEDULE_ROWS + 1,), 4096, dtype=torch.int32, device="cuda")
    schedule = scorer.schedule(seq_lens[:MAX_SCHEDULE_ROWS])
    assert tuple(schedule.shape) == (scorer.num_sms + 1, 2)
    assert schedule[-1].tolist() == [MAX_SCHEDULE_ROWS, 0] and schedule[0].tolist() == [0, 0]
    with pytest.raises(RuntimeError, match="smem_size <= meta_smem_cap"):
        scorer._dg.get_paged_mqa_logits_metadata(seq_lens.view(-1, 1), BLOCK_KV, scorer.num_sms)
    with pytest.raises(ValueError, match=rf"^seq_lens: {MAX_SCHEDULE_ROWS + 1} rows; one DeepGEMM schedule takes"):
        scorer.schedule(seq_lens)


def test_unsupported_k_is_said_once_when_a_cuda_state_is_built():
    """A CUDA state whose k (or candidate buffer width) decode_topk does not take warns when it is built, which every
    rank does; its steps select by the exact reference without a warning, so that where warnings are errors no rank
    with rows raises while an empty-slice rank waits in the all-gather. The picks equal torch.topk's."""
    step = make_step(16, heads=HEADS, head_dim=HEAD_DIM, max_model_len=1024, k=16, candidates=12, device="cuda")
    with pytest.warns(RuntimeWarning) as said:
        state = make_state(step, scorer=TorchScorer())
    assert [str(w.message).split(" is not")[0] for w in said if w.category is RuntimeWarning] == [
        "indexer: k = 16", "indexer: candidate_blocks' width = 12"]
    peer = make_state(step, scorer=TorchScorer(), topk_backend="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    decode_rows(peer, step.metadata, step.q, step.weights, SingleRank())
    torch.cuda.synchronize()
    assert torch.equal(_sets(state.topk_indices), _sets(peer.topk_indices))


def test_torch_scorer_logits_of_any_context_length_take_the_aot_topk(topk_launches):
    """A CUDA state scored by the torch scorer with a max_model_len that is not a multiple of 4: its logits' rows sit
    16 bytes apart, so the AOT kernels select, one launch a mode (no slow-path warning, which only ranks with rows
    would give), and the picks equal torch.topk's. 8189 columns make 1024 blocks for 512 candidates: a selection in
    block mode too, not every block taken."""
    from runtime.topk import decode_topk_plan

    step = make_step(16, heads=HEADS, head_dim=HEAD_DIM, max_model_len=8189, k=512, candidates=512, device="cuda")
    step.metadata.seq_lens[0] = 8189  # a row as long as the context: its last group ends at the padding
    state, peer = make_state(step, scorer=TorchScorer()), make_state(step, scorer=TorchScorer(), topk_backend="torch")
    md, a = dataclasses.replace(step.metadata, max_seq_len=8189), step.state_args
    logits = state.scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table, None, 8189)
    assert logits.stride(0) == 8192 and decode_topk_plan(logits, 16, 512, False) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decode_rows(state, md, step.q, step.weights, SingleRank())
    assert (_launched(topk_launches, "token"), _launched(topk_launches, "block")) == (1, 1), topk_launches
    decode_rows(peer, md, step.q, step.weights, SingleRank())
    torch.cuda.synchronize()
    assert torch.equal(_sets(state.topk_indices), _sets(peer.topk_indices))
    assert torch.equal(_sets(state.candidate_blocks), _sets(peer.candidate_blocks))


class _Bf16TorchScorer(TorchScorer):
    logits_dtype = torch.bfloat16

    def logits(self, *args, **kwargs):
        return super().logits(*args, **kwargs).bfloat16()


def test_a_bf16_scorer_selects_by_the_bf16_kernels_loaded_when_the_state_is_built(monkeypatch, topk_launches):
    """A scorer declaring BF16 logits: the state's build loads the BF16 top-k kernels (every rank builds it; the first
    step loaded them on ranks with rows only), the step launches them, one a mode, and the picks equal the reference's
    on the same BF16 logits."""
    from runtime import reference, topk

    step = make_step(16, heads=HEADS, head_dim=HEAD_DIM, max_model_len=8192, k=512, candidates=512, device="cuda")
    monkeypatch.setattr(topk, "_plans", {})  # nothing loaded before the build
    state = make_state(step, scorer=_Bf16TorchScorer())
    index = state.topk_indices.device.index
    assert topk._plans.get((index, "bf16", False)) is not None and topk._plans.get((index, "bf16", True)) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert len(topk_launches) == 2 and all("bf16" in name for name in topk_launches), topk_launches
    md, a = step.metadata, step.state_args
    logits = state.scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table, None, 8192)
    torch.cuda.synchronize()
    for out, width, block_mode in ((state.topk_indices, 512, False), (state.candidate_blocks, 512, True)):
        want = reference.decode_topk_reference(logits, md.seq_lens, width, block_mode=block_mode)
        assert torch.equal(_sets(out[:16, :width]), _sets(want))


def test_a_refused_cache_is_said_by_every_rank_when_its_state_is_built(monkeypatch, tmp_path):
    """Where the AOT cache cannot serve the device (an empty cache root here), every rank says so when it builds its
    state, so where warnings are errors every rank raises there, alike. Left to the first selection, only the ranks
    with rows said it, raising while an empty-slice rank waited in the all-gather (world 7, 16 rows: three ranks hold
    no row). Once said, every rank's sharded step selects by the exact reference without a word, and the gathered
    rows equal torch.topk's."""
    from runtime import loader, topk

    monkeypatch.setenv("SPARSE_DECODE_AOT_CACHE", str(tmp_path))
    step = make_step(16, heads=HEADS, head_dim=HEAD_DIM, max_model_len=1024, k=512, max_rows=32, device="cuda")
    md, world = step.metadata, 7
    assert [r for r in range(world) if not len(range(*row_shard_bounds(16, md.num_requests, world, r)))], "no empty"
    for rank in range(world):  # each rank a process of its own: a refusal is said once a process
        monkeypatch.setattr(loader, "_bound", {})
        monkeypatch.setattr(loader, "_refusals_said", set())
        monkeypatch.setattr(topk, "_plans", {})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="decode_topk: the AOT cache cannot serve cuda:"):
                make_state(step, scorer=TorchScorer())
    peer = make_state(step, scorer=TorchScorer(), topk_backend="torch")
    decode_rows(peer, md, step.q, step.weights, SingleRank())
    group = Loopback(world)
    for rnd in range(2):  # pass 1 fills the store, pass 2 gathers
        for rank in range(world):
            state = make_state(step, scorer=TorchScorer())  # said in this process already: nothing to say
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                decode_rows(state, md, step.q, step.weights, group.for_rank(rank))
            if rnd == 1:
                torch.cuda.synchronize()
                assert torch.equal(_sets(state.topk_indices[:16]), _sets(peer.topk_indices[:16])), rank


# (rows, pages, width, page_size, table_rows, k), as test_pool_rows.py's SHAPES
POOL_ROWS_SHAPES = [(0, 4, 8, 64, None, None), (3, 4, 0, 64, None, None), (2, 0, 7, 64, None, None),
                    (7, 16, 640, 64, 11, 512), (6, 9, 33, 3, 8, None), (64, 64, 2048, 64, 80, 512),
                    (4, 6, 40, 2 ** 20, None, None)]


@pytest.mark.parametrize("rows, pages, width, page_size, table_rows, k", POOL_ROWS_SHAPES)
def test_topk_pool_rows_on_cuda_equals_the_cpu_result(rows, pages, width, page_size, table_rows, k, monkeypatch):
    topk, table = pool_rows_case(7, rows, pages, width, page_size, table_rows=table_rows, k=k)
    want = topk_pool_rows(topk, table, page_size=page_size)
    assert torch.equal(want, pool_rows_loop(topk, table, page_size))
    if rows * width:  # an empty map launches nothing
        _torch_chain_fails(monkeypatch)
    got = topk_pool_rows(topk.cuda(), table.cuda(), page_size=page_size)
    assert got.is_cuda and got.dtype == torch.int32
    assert torch.equal(got.cpu(), want)
    in_place = topk.cuda()
    assert topk_pool_rows(in_place, table.cuda(), page_size=page_size, out=in_place) is in_place
    assert torch.equal(in_place.cpu(), want)


def _torch_chain_fails(monkeypatch) -> None:
    """From now on topk_pool_rows' torch chain fails the test: the values checked next are the kernel's (a CPU
    result wanted is computed before)."""
    from runtime import indexer

    def chain(*args, **kwargs):
        pytest.fail("topk_pool_rows took the torch chain")

    monkeypatch.setattr(indexer, "_pool_rows_torch", chain)


def _kernel_serves(topk: torch.Tensor, table: torch.Tensor) -> bool:
    """Whether the cache's topk_pool_rows kernel takes this map (else the torch chain runs)."""
    from runtime.indexer import _pool_rows_kernel

    return _pool_rows_kernel(topk, None, table.shape[1]) is not None


def test_topk_pool_rows_syncs_nothing_and_replays_in_a_cuda_graph():
    """No device sync (torch's sync debug mode raises at one), and a captured map that replays over new values of
    the same buffers writes their rows."""
    rows, pages, width = 16, 32, 640
    topk, table = (t.cuda() for t in pool_rows_case(8, rows, pages, width, 64, k=512))
    out = torch.empty_like(topk)
    topk_pool_rows(topk, table, out=out)  # warm-up outside capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        topk_pool_rows(topk, table, out=out)
        topk_pool_rows(topk, table)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_pool_rows(topk, table, out=out)
    new_topk, new_table = pool_rows_case(9, rows, pages, width, 64, k=512)
    topk.copy_(new_topk)
    table.copy_(new_table)
    out.fill_(77)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), pool_rows_loop(new_topk, new_table, 64))


def _kernel_nodes(call) -> int:
    """Kernel nodes of ``call()`` captured in a CUDA graph (after one call outside capture, which loads the cache)."""
    from runtime.driver import check, driver

    drv = driver()
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        call()
    cu_graph = drv.CUgraph(graph.raw_cuda_graph())
    _, count = check(drv.cuGraphGetNodes(cu_graph, 0), "cuGraphGetNodes")
    nodes, _ = check(drv.cuGraphGetNodes(cu_graph, count), "cuGraphGetNodes")
    kernel = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    return sum(check(drv.cuGraphNodeGetType(n), "cuGraphNodeGetType") == kernel for n in nodes)


def test_topk_pool_rows_is_one_aot_kernel():
    """On a GPU the cache serves, the map is the cache's kernel, one launch (the torch chain was thirteen), with or
    without out and PDL; an out that overlaps topk_indices shifted by a row takes the torch chain, which computes
    the whole result before writing, and gets the same values."""
    from runtime.indexer import _pool_rows_kernel

    topk, table = (t.cuda() for t in pool_rows_case(10, 12, 64, 512, 64))
    want = pool_rows_loop(topk.cpu(), table.cpu(), 64)
    assert _pool_rows_kernel(topk, None, table.shape[1]) is not None, "no topk_pool_rows kernel for this GPU"
    out = torch.empty_like(topk)
    assert _kernel_nodes(lambda: topk_pool_rows(topk, table, out=out)) == 1
    assert _kernel_nodes(lambda: topk_pool_rows(topk, table, out=out, pdl=False)) == 1
    assert torch.equal(out.cpu(), want)
    buf = torch.empty(13, 512, dtype=torch.int32, device="cuda")
    buf[1:].copy_(topk)
    assert _pool_rows_kernel(buf[1:], buf[:12], table.shape[1]) is None
    topk_pool_rows(buf[1:], table, out=buf[:12])
    assert torch.equal(buf[:12].cpu(), want)


def test_topk_pool_rows_kernel_reads_strided_views_and_writes_row_strided_out(monkeypatch):
    """topk_indices as a buffer's first k columns, as a transposed view and with a zero row stride; the table
    as a column slice; out as sparse_mla_decode's indices[:, 128:], whose other columns stay."""
    topk, table = pool_rows_case(11, 9, 40, 600, 16, table_rows=14)
    wide = torch.full((9, 700), -5, dtype=torch.int32)
    wide[:, :600] = topk
    big_table = torch.full((14, 50), -7, dtype=torch.int32)
    big_table[:, 5:45] = table
    want = pool_rows_loop(topk, table, 16)
    assert _kernel_serves(wide.cuda()[:, :600], big_table[:, 5:45])
    _torch_chain_fails(monkeypatch)
    got = topk_pool_rows(wide.cuda()[:, :600], big_table.cuda()[:, 5:45], page_size=16)
    assert torch.equal(got.cpu(), want)
    transposed = topk.t().contiguous().cuda().t()
    assert torch.equal(topk_pool_rows(transposed, table.cuda(), page_size=16).cpu(), want)
    one_row = topk[:1].cuda().expand(9, 600)
    assert torch.equal(topk_pool_rows(one_row, table.cuda(), page_size=16).cpu(),
                       pool_rows_loop(topk[:1].expand(9, 600).contiguous(), table, 16))
    indices = torch.full((9, 728), 77, dtype=torch.int32, device="cuda")
    topk_pool_rows(topk.cuda(), table.cuda(), page_size=16, out=indices[:, 128:])
    assert torch.equal(indices[:, 128:].cpu(), want) and (indices[:, :128] == 77).all()


@pytest.mark.parametrize("page_size", [1, 64, 1000, 2 ** 20, 2 ** 31 - 1])
def test_topk_pool_rows_kernel_at_the_int32_edges(page_size, monkeypatch):
    """Positions near 2^31 - 1, pages at the table's end, page ids 0, -1, -2^31, near the last that fits and just
    past 2^32 rows (where an int32 row would wrap to a small valid-looking one): every mapped row within int32,
    every other -1, as the CPU result says."""
    pages = 3
    span = pages * page_size
    edge_pos = [0, page_size - 1, page_size, span - 1, span, 2 ** 31 - 1, -1, -(2 ** 31), 2 * page_size + 1]
    topk = torch.tensor([[min(p, 2 ** 31 - 1) for p in edge_pos]] * 5, dtype=torch.int32)
    last = (2 ** 31 - 1) // page_size
    wraps = -(-(2 ** 32) // page_size) if page_size > 2 else 0
    table = torch.tensor([[0, -1, last], [last - 1, -(2 ** 31), 5], [last + 1 if last < 2 ** 31 - 1 else 7, 1, 0],
                          [2 ** 31 - 1, 0, -2], [wraps, wraps + 1, 4]], dtype=torch.int32)
    want = topk_pool_rows(topk, table, page_size=page_size)
    assert torch.equal(want, pool_rows_loop(topk, table, page_size))
    assert _kernel_serves(topk.cuda(), table)
    _torch_chain_fails(monkeypatch)
    got = topk_pool_rows(topk.cuda(), table.cuda(), page_size=page_size)
    assert torch.equal(got.cpu(), want)


def test_topk_pool_rows_kernel_on_many_rows_and_a_table_of_one_page(monkeypatch):
    """4096 rows (the grid's x), 2049 columns (a ninth, one-column block), one page a row; out poisoned, so that an
    unwritten block shows."""
    topk, table = pool_rows_case(12, 4096, 1, 2049, 64)
    want = topk_pool_rows(topk, table)  # CPU: the torch chain
    assert _kernel_serves(topk.cuda(), table)
    _torch_chain_fails(monkeypatch)
    out = torch.full(topk.shape, 77, dtype=torch.int32, device="cuda")
    assert topk_pool_rows(topk.cuda(), table.cuda(), out=out) is out
    assert torch.equal(out.cpu(), want)


def test_topk_pool_rows_past_the_kernels_columns_takes_the_torch_chain():
    """A row of more columns than the grid's 65535 blocks of 256 cover: the exact torch chain, same values."""
    from runtime.indexer import _POOL_ROWS_COLUMNS_MAX, _pool_rows_kernel

    width = _POOL_ROWS_COLUMNS_MAX + 1
    g = torch.Generator(device="cuda").manual_seed(13)
    topk = torch.randint(-2, 4 * 64, (1, width), device="cuda", generator=g, dtype=torch.int32)
    table = torch.tensor([[3, -1, 9, 2]], dtype=torch.int32, device="cuda")
    assert _pool_rows_kernel(topk, None, table.shape[1]) is None
    got = topk_pool_rows(topk, table)
    head = slice(0, 4096)
    assert torch.equal(got[:, head].cpu(), pool_rows_loop(topk[:, head].cpu(), table.cpu(), 64))
    assert torch.equal(got[:, -4096:].cpu(), pool_rows_loop(topk[:, -4096:].cpu(), table.cpu(), 64))


def test_topk_pool_rows_on_a_table_of_2_to_the_31_pages_takes_the_torch_chain():
    """The kernel takes the page count as int32: a table of 2^31 pages (a stride-0 view, no memory) goes to the torch
    chain, which maps position 2^31 - 1 on page 2^31 - 1 where a count capped at 2^31 - 1 would give -1."""
    from runtime.indexer import _pool_rows_kernel

    topk = torch.tensor([[2 ** 31 - 1, 5, -1]], dtype=torch.int32, device="cuda")
    table = torch.full((1, 1), 3, dtype=torch.int32, device="cuda").expand(1, 2 ** 31)
    assert _pool_rows_kernel(topk, None, table.shape[1]) is None
    assert topk_pool_rows(topk, table, page_size=1).tolist() == [[3, 3, -1]]


def test_topk_pool_rows_inside_torch_compile_launches_the_kernel_eagerly():
    """Inside a compiled function the map is a graph break that runs the eager call: the kernel's rows, written
    into a row-strided out as well."""
    topk, table = pool_rows_case(16, 6, 8, 512, 64)
    want = pool_rows_loop(topk, table, 64)
    indices = torch.full((6, 640), 77, dtype=torch.int32, device="cuda")

    def step(topk, table, out):
        return topk_pool_rows(topk, table) + 1, topk_pool_rows(topk, table, out=out)

    torch._dynamo.reset()
    got, written = torch.compile(step, backend="aot_eager")(topk.cuda(), table.cuda(), indices[:, 128:])
    assert torch.equal((got - 1).cpu(), want) and torch.equal(written.cpu(), want)
    assert (indices[:, :128] == 77).all()
