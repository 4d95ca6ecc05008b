"""Issue 5 experiment: keep the step's logits in the L2 with a persisting access-policy window.

`indexer_s41.json` and `indexer_cold_logits_s41.json` found the selection costing the step 0.6-2.4 us more than
it takes alone wherever DeepGEMM streams more key bytes than the L2 holds: the logits written early in the scoring
are evicted by the key stream before the selection reads them. An access-policy window over the logits with
``hitProp = PERSISTING`` keeps their lines in the L2's set-aside part, which the streaming keys cannot evict.

This job times, side by side in alternating rounds (CUDA-graph replay, the benchmark's input rotation):

- ``step`` / ``nosel``: the stock step (plan + logits + selection) and the step without its selection, with no
  persisting L2 set-aside (the whole L2 normal, as the benchmark runs);
- ``step_window`` / ``nosel_window``: the same graphs with every kernel node given an access-policy window over
  the address span of the logits the capture allocated (``hitRatio`` = set-aside / span where the span is larger),
  with the device's persisting L2 set-aside at its maximum;
- ``step_setaside`` / ``nosel_setaside``: the stock graphs with that set-aside but no window (what the set-aside
  alone costs: the rest of the L2 is smaller for every kernel);

so the selection's marginal cost in the step is ``step - nosel`` every way. Each mode's picks are checked against
the stock step's. Usage: ``python3 gpu/jobs/indexer_l2_window.py --out FILE.json [--rounds 3]``.

(A first run, ``indexer_l2_window_s49a.json``, kept the set-aside for every mode and counted warm-up logits in the
window's span; ``indexer_l2_window_s49b.json`` kept the set-aside for every mode.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_indexer import (
    K,
    decode_step,
    plan_and_logits,
    run_sizes,
    step_inputs,
)
from benchmarks.common import capture_graph, time_graph
from runtime.driver import check, driver
from runtime.indexer import SingleRank
from runtime.scoring import DeepGemmScorer

SIZES = [(1, 8192), (8, 8192), (1, 65536), (8, 65536), (64, 65536), (1, 262144), (8, 262144), (64, 262144)]
MODES = ("step", "nosel", "step_window", "nosel_window", "step_setaside", "nosel_setaside")


class LogitsRecorder:
    """Wraps a scorer's ``logits`` and records the address range of every logits tensor it returns in a capture."""

    def __init__(self, scorer: DeepGemmScorer):
        self.scorer, self.inner, self.ranges = scorer, scorer.logits, []

    def logits(self, q, weights, cache, seq_lens, block_table, schedule, max_model_len, *, checked=False):
        out = self.inner(q, weights, cache, seq_lens, block_table, schedule, max_model_len, checked=checked)
        if torch.cuda.is_current_stream_capturing():  # the graph's own logits, not the warm-up calls'
            self.ranges.append((out.data_ptr(), out.data_ptr() + out.nbytes))
        return out


def persisting_limits() -> dict:
    drv = driver()
    dev = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    attr = drv.CUdevice_attribute
    return {
        "max_persisting_l2_bytes": check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
                                                                  dev), "cuDeviceGetAttribute"),
        "max_window_bytes": check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE,
                                                           dev), "cuDeviceGetAttribute"),
    }


def window_setter(recorder: LogitsRecorder, limits: dict, record: dict):
    """A ``time_graph`` configure hook: every kernel node gets a persisting window over the captured logits."""
    drv = driver()

    def configure(graph: torch.cuda.CUDAGraph) -> None:
        lo = min(a for a, _ in recorder.ranges)
        hi = max(b for _, b in recorder.ranges)
        span = min(hi - lo, limits["max_window_bytes"])
        value = drv.CUkernelNodeAttrValue()
        window = value.accessPolicyWindow
        window.base_ptr = lo
        window.num_bytes = span
        window.hitRatio = min(1.0, limits["max_persisting_l2_bytes"] / max(span, 1))
        window.hitProp = drv.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
        window.missProp = drv.CUaccessProperty.CU_ACCESS_PROPERTY_STREAMING
        value.accessPolicyWindow = window
        cu_graph = drv.CUgraph(graph.raw_cuda_graph())
        _, count = check(drv.cuGraphGetNodes(cu_graph, 0), "cuGraphGetNodes")
        nodes, _ = check(drv.cuGraphGetNodes(cu_graph, count), "cuGraphGetNodes")
        kernels = 0
        for node in nodes:
            if check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType") == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                check(drv.cuGraphKernelNodeSetAttribute(
                    node, drv.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, value),
                    "cuGraphKernelNodeSetAttribute")
                kernels += 1
        record.update(window_bytes=span, distinct_logits_ranges=len(set(recorder.ranges)),
                      hit_ratio=window.hitRatio, kernel_nodes=kernels)

    return configure


def set_aside(nbytes: int) -> None:
    """The device's persisting L2 set-aside (0: every line normal)."""
    drv = driver()
    check(drv.cuCtxSetLimit(drv.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, nbytes), "cuCtxSetLimit")
    check(drv.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")


def timed(mode: str, inputs, scorer, recorder, limits, record) -> float:
    tp = SingleRank()
    set_aside(0 if mode in ("step", "nosel") else limits["max_persisting_l2_bytes"])
    if mode.startswith("step"):
        calls = [lambda a=a: decode_step(a.auto, a.md, a.q, a.weights, tp) for a in inputs]
    else:
        calls = [lambda a=a: plan_and_logits(a, scorer, tp) for a in inputs]
    recorder.ranges.clear()
    configure = window_setter(recorder, limits, record.setdefault(mode, {})) if mode.endswith("window") else None
    return time_graph(calls, configure=configure)["median_us"]


def picks_after(mode_window: bool, a, recorder, limits) -> torch.Tensor:
    """The stock step's picks, or the windowed graph's (one replay of a captured step)."""
    tp = SingleRank()
    decode_step(a.auto, a.md, a.q, a.weights, tp)  # warm (DeepGEMM's first launch outside capture)
    torch.cuda.synchronize()
    a.auto.topk_indices.fill_(-7)
    recorder.ranges.clear()
    graph = capture_graph(lambda: decode_step(a.auto, a.md, a.q, a.weights, tp),
                          window_setter(recorder, limits, {}) if mode_window else None)
    graph.replay()
    torch.cuda.synchronize()
    return a.auto.topk_indices.sort(dim=1).values.clone()


def bench_size(rows, ctx, scorer, recorder, limits, gen, rounds) -> dict:
    inputs = step_inputs(scorer, rows, ctx, gen)
    res = {"rows": rows, "context": ctx, "k": K, "input_sets": len(inputs),
           "logits_bytes": inputs[0].logits.nbytes, "windows": {}}
    stock = picks_after(False, inputs[0], recorder, limits)
    res["window_picks_equal_stock"] = bool(torch.equal(picks_after(True, inputs[0], recorder, limits), stock))
    medians = {m: [] for m in MODES}
    for _ in range(rounds):
        for m in MODES:
            medians[m].append(timed(m, inputs, scorer, recorder, limits, res["windows"]))
    res["median_us_by_round"] = medians
    best = {m: statistics.median(v) for m, v in medians.items()}
    res["median_us"] = best
    for suffix in ("", "_window", "_setaside"):
        marginal = best["step" + suffix] - best["nosel" + suffix]
        res["select_marginal" + suffix + "_us"] = marginal
        res["share_marginal" + suffix] = marginal / best["step" + suffix]
    del inputs
    torch.cuda.empty_cache()
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    scorer = DeepGemmScorer()
    recorder = LogitsRecorder(scorer)
    scorer.logits = recorder.logits  # the states share this scorer: every step's logits are recorded
    torch.zeros(1, device="cuda")
    limits = persisting_limits()
    drv = driver()
    set_aside(limits["max_persisting_l2_bytes"])  # what the driver grants, recorded
    limits["set_aside_bytes"] = check(drv.cuCtxGetLimit(drv.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE),
                                      "cuCtxGetLimit")
    print("limits", limits, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    run_sizes(SIZES, lambda rows, ctx: bench_size(rows, ctx, scorer, recorder, limits, gen, args.rounds), args.out,
              "indexer_l2_window", _describe, limits=limits)


def _describe(r: dict) -> str:
    b = r["median_us"]
    return (f"{r['rows']:3d} x {r['context']:6d}: " + " ".join(f"{m}={b[m]:.2f}" for m in MODES)
            + f" | marginal {r['select_marginal_us']:.2f} / window {r['select_marginal_window_us']:.2f}"
            + f" / set-aside {r['select_marginal_setaside_us']:.2f} us"
            + f" share {r['share_marginal']:.3f} / {r['share_marginal_window']:.3f} / {r['share_marginal_setaside']:.3f}"
            + f" picks equal {r['window_picks_equal_stock']}")


if __name__ == "__main__":
    main()
