"""The scorer module's argument refusals on the CPU: each names the argument, with the exception type the host code
uses everywhere (TypeError for a type or dtype, ValueError for a value)."""

from __future__ import annotations

import pytest
from indexer_cases import make_step

from runtime import scoring


def _inputs(**replace):
    step = make_step(4, heads=32, head_dim=64, k=16)
    md = step.metadata
    args = {"q": step.q, "weights": step.weights, "cache": step.state_args["index_k_cache"],
            "seq_lens": md.seq_lens, "block_table": md.block_table, "max_model_len": step.state_args["max_model_len"]}
    args.update(replace)
    return args


@pytest.mark.parametrize("name", ["seq_lens", "block_table"])
def test_scoring_inputs_of_another_dtype_are_a_type_error(name):
    """An int64 seq_lens or block_table was a ValueError; every other dtype refusal is a TypeError."""
    args = _inputs()
    args[name] = args[name].long()
    with pytest.raises(TypeError, match=f"{name}: expected int32, got torch.int64"):
        scoring.check_scoring_inputs(**args)
    scoring.check_scoring_inputs(**_inputs())


@pytest.mark.parametrize("value, error", [(100.5, TypeError), (True, TypeError), ("256", TypeError),
                                          (None, TypeError), (0, ValueError), (-64, ValueError)])
def test_scoring_refuses_a_max_model_len_that_is_not_a_positive_count(value, error):
    """The check compared max_model_len with 0 only: a float, a string or None failed inside torch or the comparison
    with errors naming nothing, and True passed as a context of one column."""
    with pytest.raises(error, match="^max_model_len: expected"):
        scoring.check_scoring_inputs(**_inputs(max_model_len=value))
    args = _inputs()
    too_long = args["block_table"].shape[1] * scoring.BLOCK_KV + 1
    with pytest.raises(ValueError, match="^max_model_len: .* must be positive and fit the block table"):
        scoring.check_scoring_inputs(**_inputs(max_model_len=too_long))


@pytest.mark.parametrize("major, ok", [(8, False), (9, True), (10, True), (12, False)])
def test_deepgemm_status_takes_sm90_and_sm100_only(major, ok, monkeypatch):
    """DeepGEMM's paged MQA logits run on sm_90 and sm_100: another arch (an Ampere, a consumer Blackwell) gets the
    torch scorer, said by deepgemm_status. (A GPU of that arch stood in for: CUDA and the import are faked.)"""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    monkeypatch.setattr(scoring, "_import_deep_gemm", lambda: object())
    got = scoring.deepgemm_status(torch.device("cuda", 0))
    refused = f"compute capability {major}.x: DeepGEMM's paged MQA logits need sm_90 or sm_100"
    assert got == ((True, "ok") if ok else (False, refused))


@pytest.mark.parametrize("current_major", [8, 10])
def test_default_scorer_builds_deepgemms_scorer_for_the_device_it_was_asked_about(current_major, monkeypatch):
    """default_scorer(device) asked deepgemm_status about ``device``, then built DeepGemmScorer() with whichever device
    was current, and the scorer reads its arch there (and asks deepgemm_status of it again). With cuda:1 an sm_90 and
    cuda:0 current: an sm_80 made default_scorer("cuda:1") raise "DeepGemmScorer: compute capability 8.x" instead of
    returning a scorer; an sm_100 gave a scorer that checks sm_100's head counts for the sm_90. (Two GPUs stood in
    for: torch.cuda.device switches the current one, the import is faked.)"""
    import contextlib

    import torch

    current = {"index": 0}
    majors = {0: current_major, 1: 9}

    @contextlib.contextmanager
    def switch(device):
        before, current["index"] = current["index"], index_of(device)
        try:
            yield
        finally:
            current["index"] = before

    def index_of(device):  # None, "cuda": the current device
        if isinstance(device, int):
            return device
        index = None if device is None else torch.device(device).index
        return current["index"] if index is None else index

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", switch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (majors[index_of(device)], 0))
    monkeypatch.setattr(scoring, "_import_deep_gemm", lambda: object())
    scorer = scoring.default_scorer("cuda:1")
    assert isinstance(scorer, scoring.DeepGemmScorer) and scorer.arch_major == 9
    assert current["index"] == 0, "the current device is left as it was"
    assert isinstance(scoring.default_scorer(torch.device("cuda", 0)),
                      scoring.TorchScorer if current_major == 8 else scoring.DeepGemmScorer)


def test_deepgemm_schedule_refuses_what_is_not_a_tensor():
    """schedule(None) raised AttributeError ('NoneType' has no dtype), naming nothing."""
    scorer = object.__new__(scoring.DeepGemmScorer)  # no DeepGEMM here: the check runs before any call into it
    for bad in (None, [1, 2]):
        with pytest.raises(TypeError, match="seq_lens: expected a CUDA int32 tensor"):
            scorer.schedule(bad)


@pytest.mark.parametrize("shape", ["flat", "4-D"])
def test_scoring_refuses_q_of_another_rank_naming_it(shape):
    """q must be [rows, heads, head_dim]: without the rank check, a 2-D or 4-D q met Python's tuple unpacking
    ("not enough values to unpack"), a ValueError naming nothing."""
    q = _inputs()["q"]
    bad = q.flatten(1) if shape == "flat" else q.unsqueeze(1)
    with pytest.raises(ValueError, match=r"^q: expected \[rows, heads, head_dim\], got shape"):
        scoring.check_scoring_inputs(**_inputs(q=bad))


def test_scoring_refuses_weights_of_another_dtype():
    """FP16 weights (a projection's output dtype) are a TypeError naming weights, as the indexer's own check refuses
    them: without the scorer's check a direct call took them (DeepGEMM reads its weights as FP32)."""
    with pytest.raises(TypeError, match=r"^weights: expected float32, got torch.float16"):
        scoring.check_scoring_inputs(**_inputs(weights=_inputs()["weights"].half()))


def test_deepgemm_schedule_refuses_cpu_seq_lens():
    """DeepGEMM's schedule kernel reads seq_lens on the GPU: CPU ones are refused naming them, before any call into
    DeepGEMM (a check of dtype and rank alone handed them on, to fail inside it)."""
    import torch

    scorer = object.__new__(scoring.DeepGemmScorer)  # no DeepGEMM here: the check runs before any call into it
    with pytest.raises(ValueError, match=r"^seq_lens: expected CUDA int32 \[rows\], got torch.int32 \(4,\) on cpu"):
        scorer.schedule(torch.ones(4, dtype=torch.int32))


def test_deepgemm_schedule_refuses_seq_lens_of_another_dtype_as_a_type_error():
    """int64 seq_lens were a ValueError, unlike every other dtype refusal of the host code (check_scoring_inputs'
    of the same seq_lens included); the refusal now says what to pass too."""
    import torch

    scorer = object.__new__(scoring.DeepGemmScorer)  # no DeepGEMM here: the check runs before any call into it
    with pytest.raises(TypeError, match=r"^seq_lens: expected CUDA int32 \[rows\], got torch.int64 \(4,\) on cpu; "
                                        r"pass one int32 length a row, on the GPU that scores them$"):
        scorer.schedule(torch.ones(4, dtype=torch.int64))


@pytest.mark.parametrize("bad", ["q", "weights", "block_table", "cache"])
def test_layout_refusals_give_the_strides_and_the_fix(bad):
    """A strided q, block table or key cache was refused as "must be contiguous" or "needs unit column stride" without
    what to pass, and weights of the right shape but another column stride as "expected [4, 32] with unit column
    stride, got (4, 32)": the shape it had, not the strides that were wrong."""
    import torch

    a = _inputs()
    t = a[bad]
    if bad == "q":
        a[bad] = t.transpose(0, 1).contiguous().transpose(0, 1)
    elif bad == "cache":  # every other page of a larger cache
        a[bad] = torch.zeros(2 * t.shape[0], *t.shape[1:], dtype=t.dtype)[::2].copy_(t)
    else:  # every other column of a wider tensor
        a[bad] = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)[:, ::2].copy_(t)
    fix = {"q": r"pass q\.contiguous\(\)", "weights": r"pass weights\.contiguous\(\)",
           "block_table": r"pass block_table\.clone\(memory_format=torch\.contiguous_format\)",
           "cache": r"allocate the key cache as one contiguous tensor and pass it"}[bad]
    with pytest.raises(ValueError, match=rf"^{bad}: .*, got strides \({', '.join(map(str, a[bad].stride()))}\); {fix}"):
        scoring.check_scoring_inputs(**a)


def test_nested_key_cache_and_seq_lens_are_named(recwarn):
    """A nested index-key cache (IndexerState, check_index_k_cache) or seq_lens (DeepGemmScorer.schedule) raised
    torch's "NestedTensorImpl doesn't support sizes" RuntimeError, naming no argument, from the refusal's message."""
    import dataclasses

    import torch
    from indexer_cases import make_state

    cache = _inputs()["cache"]
    nested = torch.nested.nested_tensor([cache[:2], cache[2:3]])
    with pytest.raises(TypeError, match="index_k_cache must be a dense .* got a nested tensor"):
        scoring.check_index_k_cache(nested, "index_k_cache")
    step = make_step(4, heads=32, head_dim=64, k=16)
    with pytest.raises(TypeError, match="index_k_cache must be a dense"):
        make_state(dataclasses.replace(step, state_args={**step.state_args, "index_k_cache": nested}),
                   scorer=scoring.TorchScorer())
    scorer = object.__new__(scoring.DeepGemmScorer)  # no DeepGEMM here: the check runs before any call into it
    lens = torch.nested.nested_tensor([torch.ones(2, dtype=torch.int32), torch.ones(3, dtype=torch.int32)])
    with pytest.raises(TypeError, match="seq_lens must be a dense .* got a nested tensor"):
        scorer.schedule(lens)


@pytest.mark.parametrize("field", ["max_rows", "heads", "head_dim", "max_model_len"])
@pytest.mark.parametrize("value", [0, -32, 2.5, True])
def test_serving_shapes_take_positive_counts(field, value):
    """ServingShapes(max_rows=0) made warm_deepgemm loop over no row bucket, warm nothing and report success."""
    with pytest.raises((TypeError, ValueError), match=f"ServingShapes.{field}: expected"):
        scoring.ServingShapes(**{field: value})
    assert scoring.ServingShapes(**{field: 64}).__getattribute__(field) == 64


def test_serving_shapes_take_rows_up_to_one_schedule():
    """A rank scores at most MAX_SCHEDULE_ROWS rows a step: ServingShapes takes that many and refuses one more (a check
    moved by one refused the largest step one DeepGEMM schedule takes)."""
    most = scoring.MAX_SCHEDULE_ROWS
    assert scoring.ServingShapes(max_rows=most).max_rows == most
    with pytest.raises(ValueError, match=f"^ServingShapes.max_rows: {most + 1} exceeds the {most} rows"):
        scoring.ServingShapes(max_rows=most + 1)


@pytest.mark.parametrize("repeats", [0, -1, 1.5])
def test_check_step_compiles_nothing_needs_a_steady_state(repeats, monkeypatch):
    """repeats=0 raised IndexError from the median of no steady step, after running the step once."""
    ran = []
    monkeypatch.setattr(scoring, "jit_cache_snapshot", lambda directory=None: {"kernel.cubin": (1, 1)})
    with pytest.raises((TypeError, ValueError), match="repeats: expected"):
        scoring.check_step_compiles_nothing(lambda: ran.append(1), repeats=repeats)
    assert ran == [], "the step ran before the refusal"


def test_check_step_compiles_nothing_takes_the_median_steady_step(monkeypatch):
    """The steady state is the median of the repeats, so one slow repeat (a preemption, a GC pause) neither hides a
    slow first step nor passes for the steady time. On a scripted clock (each step advances it: first 10 ms, then
    repeats of 1, 100 and 1 ms) the steady time is 1 ms and a first step of 10 ms is over 5 x that; a maximum of the
    repeats (100 ms) took it."""
    import types

    clock = [0.0]
    monkeypatch.setattr(scoring, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(scoring, "jit_cache_snapshot", lambda directory=None: {"kernel.cubin": (1, 1)})
    monkeypatch.setattr(scoring.torch.cuda, "synchronize", lambda *a: None)

    def steps(*ms):
        left = list(ms)

        def step():
            clock[0] += left.pop(0) / 1e3
        return step

    with pytest.raises(RuntimeError, match=r"first decode step took 10\.0 ms against 1\.00 ms steady"):
        scoring.check_step_compiles_nothing(steps(10, 1, 100, 1), repeats=3, first_step_slack_ms=0.0)
    result = scoring.check_step_compiles_nothing(steps(10, 1, 100, 1), repeats=3, first_step_factor=20.0,
                                                 first_step_slack_ms=0.0)
    assert result["first_ms"] == pytest.approx(10.0) and result["steady_ms"] == pytest.approx(1.0)


def test_steps_after_pause_ms_times_each_step_after_a_snapshot_and_a_pause(monkeypatch):
    """Each timed step follows a cache snapshot and the pause, as check_step_compiles_nothing's first step follows its
    snapshot; the pause is not timed. On a scripted clock (steps of 2, 3 and 4 ms; pauses that advance it 20 ms)."""
    import types

    clock, events = [0.0], []

    def sleep(seconds):
        events.append("pause")
        clock[0] += seconds

    monkeypatch.setattr(scoring, "time", types.SimpleNamespace(perf_counter=lambda: clock[0], sleep=sleep))
    monkeypatch.setattr(scoring, "jit_cache_snapshot", lambda directory=None: events.append("snapshot") or {})
    monkeypatch.setattr(scoring.torch.cuda, "synchronize", lambda *a: None)
    left = [2, 3, 4]

    def step():
        events.append("step")
        clock[0] += left.pop(0) / 1e3

    assert scoring.steps_after_pause_ms(step, repeats=3, pause_s=0.02) == pytest.approx([2.0, 3.0, 4.0])
    assert events == ["snapshot", "pause", "step"] * 3
    with pytest.raises((TypeError, ValueError), match="repeats: expected"):
        scoring.steps_after_pause_ms(step, repeats=0)


def test_check_step_compiles_nothing_refuses_each_sign_of_a_compile(tmp_path, monkeypatch):
    """The zero-JIT proof's own refusals (its GPU test only sees it pass): an empty cache before the step, a file the
    step adds to DeepGEMM's cache or rewrites there, and a first step slower than the steady state allows each raise;
    a step that touches nothing passes with its timings. (The device sync is stood in for: CPU steps.)"""
    import time

    cache = tmp_path / "dg_cache"
    monkeypatch.setattr(scoring, "jit_cache_dir", lambda: cache)
    monkeypatch.setattr(scoring.torch.cuda, "synchronize", lambda *a: None)
    with pytest.raises(RuntimeError, match="cache .* is empty; run build_kernels.py --warm-deepgemm"):
        scoring.check_step_compiles_nothing(lambda: None)
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels" / "a.cubin").write_bytes(b"x")
    result = scoring.check_step_compiles_nothing(lambda: None, repeats=3)
    assert result["changed"] == [] and result["cache_files"] == 1
    fastest, slowest = result["steady_range_ms"]
    assert 0 <= fastest <= result["steady_ms"] <= slowest

    def adds_a_kernel():
        (cache / "kernels" / "b.cubin").write_bytes(b"y")

    def rewrites_a_kernel():
        (cache / "kernels" / "a.cubin").write_bytes(b"longer")

    for step, name in ((adds_a_kernel, "b.cubin"), (rewrites_a_kernel, "a.cubin")):
        with pytest.raises(RuntimeError, match=rf"compiled DeepGEMM kernels at serving time: .*kernels/{name}"):
            scoring.check_step_compiles_nothing(step, repeats=2)
    calls = []

    def slow_first():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.05)

    with pytest.raises(RuntimeError, match="first decode step took .* steady: something compiled or loaded"):
        scoring.check_step_compiles_nothing(slow_first, repeats=3, first_step_factor=2.0, first_step_slack_ms=1.0)


@pytest.mark.parametrize("layout", ["sparse", "nested"])
def test_deepgemm_check_schedule_names_a_schedule_without_strides(layout):
    """check_schedule read the shape and contiguity before require_dense: a nested schedule raised torch's
    "NestedTensorImpl doesn't support sizes" RuntimeError, naming nothing, and a sparse one was told its shape, dtype
    and device were wrong while they were [5, 2] int32 on the device asked for."""
    import types

    import torch

    scorer = object.__new__(scoring.DeepGemmScorer)  # no DeepGEMM here: the check runs before any call into it
    scorer._dg = types.SimpleNamespace(get_num_sms=lambda: 4)
    schedule = {"sparse": torch.zeros(5, 2, dtype=torch.int32).to_sparse(),
                "nested": torch.nested.nested_tensor([torch.zeros(2, dtype=torch.int32)] * 5)}[layout]
    with pytest.raises(TypeError, match="^schedule must be a dense"):
        scorer.check_schedule(schedule, torch.device("cpu"))
    scorer.check_schedule(torch.zeros(5, 2, dtype=torch.int32), torch.device("cpu"))
