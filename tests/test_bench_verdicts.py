"""The benchmarks' verdicts, from committed raw results: a target is judged only on what the issue defines and on
timings that were measured as the method says (CPU; the timings themselves are GPU work)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _indexer_size(rows: int, ctx: int) -> dict:
    sizes = json.loads((RESULTS / "indexer_s51b.json").read_text())["results"]
    (size,) = [r for r in sizes if (r["rows"], r["context"]) == (rows, ctx)]
    return copy.deepcopy(size)


def test_the_indexer_share_is_met_only_where_both_shares_are():
    """8 x 64K in indexer_s51b.json: the selection timed alone is 0.244 of the step, what it adds to the step 0.263.
    The run recorded it met on the first alone; judged on both it is missed."""
    from benchmarks.bench_indexer import judge

    size = judge(_indexer_size(8, 65536))
    assert size["meets_target_alone"] and not size["meets_target_marginal"]
    assert size["meets_target"] is False
    assert judge(_indexer_size(64, 65536))["meets_target"] is True
    assert judge(_indexer_size(1, 8192))["meets_target"] is False


@pytest.mark.parametrize("timing, judged", [("step", False), ("select_in_stream_order", False),
                                            ("step_without_select", False), ("select_torch", True)])
def test_an_indexer_share_resting_on_an_eager_timing_is_not_judged(timing, judged):
    """A call that could not be captured is timed eagerly, host time included (~100 us a step), which makes any share
    of it small: a verdict resting on one is None, not met."""
    from benchmarks.bench_indexer import judge

    size = _indexer_size(64, 65536)
    size[timing]["graph_error"] = "RuntimeError: a host sync during capture"
    size = judge(size)
    assert size["eager_timings"] == [timing]
    assert (size["meets_target"] is not None) == judged


def _mla_result() -> dict:
    return json.loads((RESULTS / "sparse_mla_s51.json").read_text())


def test_the_mla_speedup_is_judged_against_a_fully_swept_triton_peer_only(tmp_path):
    """Without the Triton peer the best peer is the torch reference (~35x the kernel's time), and a quick sweep is
    not the tuned peer the issue asks for: the speedup target is then not judged (None), never met."""
    from benchmarks.bench_sparse_mla import finish

    full = _mla_result()
    finish(full, tmp_path / "full.json")
    assert full["target_check"]["speedup_ok"] is False
    no_triton = _mla_result()
    for case in no_triton["cases"]:
        case.pop("triton")
        case["speedup_vs_best_peer"] = case["speedup_vs"]["reference"]
    finish(no_triton, tmp_path / "no_triton.json")
    assert no_triton["target_check"]["speedup_ok"] is None
    no_plain_peer = _mla_result()
    for case in no_plain_peer["cases"]:
        case["triton_in_stream_order"] = {"error": "no config of the sweep gave a right output without PDL"}
    finish(no_plain_peer, tmp_path / "no_plain_peer.json")
    assert no_plain_peer["target_check"]["speedup_ok"] is None
    quick = _mla_result()
    quick["quick_sweep"] = True
    finish(quick, tmp_path / "quick.json")
    assert quick["target_check"]["speedup_ok"] is None


def test_a_triton_config_label_tells_configs_apart_by_every_field():
    """The label named block, tiles and warps only, so two configs of the sweep (FP16 partials or not, another
    stage count) shared one label in the table and in HISTORY."""
    from benchmarks.bench_sparse_mla import config_label

    base = {"block_n": 32, "tiles": 1, "num_warps": 4, "num_stages": 2, "fp8_pv": False, "kv_major": True,
            "pdl": True, "fp16_partials": False}
    changed = {"block_n": 64, "tiles": 2, "num_warps": 8, "num_stages": 3, "fp8_pv": True, "kv_major": False,
               "pdl": False, "fp16_partials": True}
    labels = {config_label(base)} | {config_label({**base, field: value}) for field, value in changed.items()}
    assert len(labels) == 1 + len(changed)


def test_a_result_records_the_switches_and_packages_that_change_a_measurement():
    from benchmarks.common import package_versions, run_switches

    environ = {"SPARSE_DECODE_AOT_CHECK_METADATA": "1", "DG_JIT_CACHE_DIR": "/c", "CUDA_LAUNCH_BLOCKING": "1",
               "HOME": "/root"}
    assert run_switches(environ) == {"CUDA_LAUNCH_BLOCKING": "1", "DG_JIT_CACHE_DIR": "/c",
                                     "SPARSE_DECODE_AOT_CHECK_METADATA": "1"}
    assert set(package_versions(("pytest", "no-such-package-here"))) == {"pytest"}


def test_the_stream_order_peer_is_the_fastest_right_config_without_pdl(monkeypatch):
    """best_in_stream_order on stand-ins (its timings are GPU work): the PDL winner and the sweep's next fastest are
    run without PDL, a wrong output is left out, and the fastest right one is the peer, with every candidate's time."""
    import dataclasses

    import benchmarks.bench_sparse_mla as bench

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        block_n: int
        pdl: bool = True

    class Op:
        def __init__(self, T, width, device, cfg):
            self.cfg = cfg

    wrong = {Cfg(16, pdl=False)}
    times = {Cfg(64, pdl=False): 9.0, Cfg(32, pdl=False): 8.0, Cfg(128, pdl=False): 8.5, Cfg(256, pdl=False): 1.0}

    def check_output(op, inp):
        if op.cfg in wrong:
            raise RuntimeError("output differs from the reference")
        return 0.01

    monkeypatch.setattr(bench, "check_output", check_output)
    monkeypatch.setattr(bench, "time_op", lambda op, inp, sets: {"median_us": times[op.cfg]})
    tsm = type("tsm", (), {"TritonSparseMla": Op})
    sweep = [(5.0, Cfg(16)), (6.0, Cfg(32)), (7.0, Cfg(64)), (7.5, Cfg(128)), (9.0, Cfg(256))]
    inp = type("inp", (), {"sets": 4})
    logged = []
    best = bench.best_in_stream_order(tsm, 12, 640, Cfg(64), sweep, inp, logged.append)
    assert best["config"] == {"block_n": 32, "pdl": False} and best["median_us"] == 8.0
    assert set(best["candidates_us"].values()) == {9.0, 8.0, 8.5}  # the winner and three more; 256 not among them
    assert len(logged) == 1 and "differs" in logged[0]
    wrong.update(times)
    assert "error" in bench.best_in_stream_order(tsm, 12, 640, Cfg(64), sweep, inp, logged.append)


def test_a_decode_topk_target_whose_cell_was_not_measured_is_not_met(tmp_path, monkeypatch):
    """A run that stops before a target's cell (a cell whose rows differ from the reference raises; --budget skips the
    rest) wrote targets for the measured cells only: every listed target met, the missing ones absent. A target whose
    cell was not measured is listed, not met."""
    import sys

    import benchmarks.bench_topk as bench

    stop = (64, 262144, 2048, "f32", False)  # one of the 60 %-of-copy-bandwidth cells, second in the grid

    def cell(rows, length, k, dtype, block_mode=False):
        if (rows, length, k, dtype, block_mode) == stop:
            raise RuntimeError("decode_topk's rows [3] differ from the exact reference's: the cell is not timed")
        return {"rows": rows, "length": length, "k": k, "dtype": dtype, "block_mode": block_mode, "bytes": 1,
                "kernel": {"name": "x", "cluster": 1, "grid": rows}, "op": {"median_us": 1.0},
                "op_in_stream_order": {"median_us": 1.0}, "torch_topk": {"median_us": 10.0},
                "speedup_vs_torch_topk": 10.0, "speedup_in_stream_order": 10.0, "fraction_of_copy_bw": 0.9,
                "floor": {"floor_us": 0.5}}

    monkeypatch.setattr(bench, "bench_cell", cell)
    monkeypatch.setattr(bench.common, "gpu_info", lambda: {"gpu": "stand-in"})
    monkeypatch.setattr(bench.common, "copy_bandwidth_gbs", lambda: 1.0)
    out = tmp_path / "topk.json"
    monkeypatch.setattr(sys, "argv", ["bench_topk.py", "--out", str(out), "--no-sweep"])
    with pytest.raises(RuntimeError, match="differ"):
        bench.main()
    found = json.loads(out.read_text())["targets"]
    assert len(found) == 51  # the grid: 48 speedups, the 12 us cell and two bandwidth cells
    bandwidth = {t["cell"]: t["met"] for t in found if t["target"] == ">= 60% of copy bandwidth"}
    assert bandwidth == {"f32 rows=64 len=262144 k=2048": False, "f32 rows=64 len=262144 k=512": False}
    assert not all(t["met"] for t in found)


def test_a_quick_decode_topk_run_lists_the_targets_it_did_not_measure(tmp_path, monkeypatch):
    """--quick times the targets' six cells only; its targets were judged over those cells alone, so its record
    listed 8 targets, every one met, and none of the other 43 (nothing in the record says it was a quick run). Judged
    over the issue's whole grid, the 43 are listed as not run, not met."""
    import sys

    import benchmarks.bench_topk as bench

    def cell(rows, length, k, dtype, block_mode=False):
        return {"rows": rows, "length": length, "k": k, "dtype": dtype, "block_mode": block_mode, "bytes": 1,
                "kernel": {"name": "x", "cluster": 1, "grid": rows}, "op": {"median_us": 1.0},
                "op_in_stream_order": {"median_us": 1.0}, "torch_topk": {"median_us": 10.0},
                "speedup_vs_torch_topk": 10.0, "speedup_in_stream_order": 10.0, "fraction_of_copy_bw": 0.9,
                "floor": {"floor_us": 0.5}}

    monkeypatch.setattr(bench, "bench_cell", cell)
    monkeypatch.setattr(bench.common, "gpu_info", lambda: {"gpu": "stand-in"})
    monkeypatch.setattr(bench.common, "copy_bandwidth_gbs", lambda: 1.0)
    out = tmp_path / "topk.json"
    monkeypatch.setattr(sys, "argv", ["bench_topk.py", "--out", str(out), "--quick", "--no-sweep"])
    bench.main()
    record = json.loads(out.read_text())
    assert len(record["cells"]) == 6
    found = record["targets"]
    assert len(found) == 51
    assert sum(t["met"] for t in found) == 8
    assert sum(bool(t.get("not_run")) for t in found) == 43 and not any(t["met"] for t in found if t.get("not_run"))


def test_decode_topk_targets_of_a_full_grid_are_unchanged():
    """Where every cell of the grid ran, the grid adds nothing: the committed record's targets recomputed equal."""
    from benchmarks.bench_topk import targets

    record = json.loads((RESULTS / "decode_topk_s61_h100.json").read_text())
    grid = [(c["rows"], c["length"], c["k"], c["dtype"], c["block_mode"]) for c in record["cells"]]
    assert targets(record["cells"], grid) == record["targets"]


def test_an_mla_target_with_a_nan_timing_is_not_met(tmp_path):
    """Each target is judged as launched and in stream order; max(4.0, nan) is 4.0 and min(3.5, nan) is 3.5, so a NaN
    in stream order passed all three checks on max/min. A NaN (or missing) value fails its check."""
    from benchmarks.bench_sparse_mla import finish

    nan = float("nan")
    for field in ("as launched", "in stream order"):
        result = _mla_result()
        (case,) = [c for c in result["cases"] if (c["T"], c["width"]) == (12, 640)]
        case["kernel"]["median_us"], case["kernel_in_stream_order"]["median_us"] = 4.0, 4.5
        case["kernel_over_floor"], case["kernel_in_stream_order_over_floor"] = 1.5, 1.6
        case["speedup_vs_best_peer"], case["speedup_vs_best_peer_in_stream_order"] = 3.5, 3.2
        finish(result, tmp_path / "met.json")
        assert all(result["target_check"][k] is True for k in ("kernel_us_ok", "speedup_ok", "over_floor_ok"))
        if field == "as launched":
            case["kernel"]["median_us"] = case["kernel_over_floor"] = case["speedup_vs_best_peer"] = nan
        else:
            case["kernel_in_stream_order"]["median_us"] = nan
            case["kernel_in_stream_order_over_floor"] = case["speedup_vs_best_peer_in_stream_order"] = nan
        finish(result, tmp_path / "nan.json")
        assert [result["target_check"][k] for k in ("kernel_us_ok", "speedup_ok", "over_floor_ok")] == [False] * 3, field
