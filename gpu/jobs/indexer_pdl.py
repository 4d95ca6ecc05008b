"""Issue 5 experiment: programmatic dependent launch (PDL) inside the indexer step.

DeepGEMM's paged MQA-logits kernel waits on its grid dependency after its prologue (barrier set-up) and can be
launched with PDL (``deep_gemm.set_pdl``); decode_topk waits before any global access and can be launched with PDL
too. Neither DeepGEMM kernel triggers its dependents early, so behind it a PDL launch can only start as its CTAs
exit. This job measures what that buys in the benchmark's step (plan + logits + selection, CUDA-graph replay,
inputs rotated as in benchmarks/bench_indexer.py), side by side in one process, alternating rounds:

- ``dg{0,1}_sel{0,1}``: DeepGEMM's launches with / without PDL x the selection with / without it;
- ``dg{0,1}_nosel``: the same step without the selection (plan + logits), so the selection's marginal cost in
  the step is ``dgX_selY - dgX_nosel``.

The picks of every mode are checked against the stock mode's (dg0_sel0) on one input set.
Usage: ``python3 gpu/jobs/indexer_pdl.py --out FILE.json [--rounds 2] [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_indexer import K, decode_step, run_sizes, step_inputs, time_calls
from runtime import indexer, topk
from runtime.indexer import SingleRank
from runtime.scoring import DeepGemmScorer, _import_deep_gemm

SELECT_PDL = [False]


def _select_with_pdl_switch(logits, row_ends, out, block_mode) -> None:
    topk.decode_topk(logits, row_ends, out, block_mode=block_mode, pdl=SELECT_PDL[0])


indexer._aot_select = _select_with_pdl_switch  # _selector looks the name up at every call


def _no_select(logits, row_ends, out, block_mode) -> None:
    """The step without its selection (plan + logits only)."""


def run_mode(mode: str, inputs, tp, dg) -> dict:
    dg_pdl, rest = mode.split("_")
    dg.set_pdl(dg_pdl == "dg1")
    if rest == "nosel":
        indexer._aot_select = _no_select
    else:
        indexer._aot_select = _select_with_pdl_switch
        SELECT_PDL[0] = rest == "sel1"

    try:
        return time_calls([lambda a=a: decode_step(a.auto, a.md, a.q, a.weights, tp) for a in inputs])
    finally:
        dg.set_pdl(False)
        indexer._aot_select = _select_with_pdl_switch
        SELECT_PDL[0] = False


def picks(mode: str, a, tp, dg) -> torch.Tensor:
    dg.set_pdl(mode.startswith("dg1"))
    SELECT_PDL[0] = mode.endswith("sel1")
    try:
        a.auto.topk_indices.fill_(-7)
        decode_step(a.auto, a.md, a.q, a.weights, tp)
        torch.cuda.synchronize()
        return a.auto.topk_indices.sort(dim=1).values.clone()
    finally:
        dg.set_pdl(False)
        SELECT_PDL[0] = False


MODES = ("dg0_sel0", "dg0_sel1", "dg1_sel1", "dg1_sel0", "dg0_nosel", "dg1_nosel")


def bench_size(rows: int, ctx: int, scorer, gen, dg, rounds: int) -> dict:
    inputs = step_inputs(scorer, rows, ctx, gen)
    tp = SingleRank()
    res = {"rows": rows, "context": ctx, "k": K, "input_sets": len(inputs),
           "topk_kernel": topk.decode_topk_plan(inputs[0].logits, rows, K, False)}
    stock = picks("dg0_sel0", inputs[0], tp, dg)
    res["picks_equal_to_stock"] = {m: bool(torch.equal(picks(m, inputs[0], tp, dg), stock))
                                   for m in MODES if "nosel" not in m}
    medians = {m: [] for m in MODES}
    for _ in range(rounds):
        for m in MODES:
            medians[m].append(run_mode(m, inputs, tp, dg)["median_us"])
    res["median_us_by_round"] = medians
    best = {m: statistics.median(v) for m, v in medians.items()}
    res["median_us"] = best
    for dgm in ("dg0", "dg1"):
        for sel in ("sel0", "sel1"):
            res[f"select_marginal_{dgm}_{sel}_us"] = best[f"{dgm}_{sel}"] - best[f"{dgm}_nosel"]
    res["share_stock"] = (best["dg0_sel0"] - best["dg0_nosel"]) / best["dg0_sel0"]
    res["share_pdl_both"] = (best["dg1_sel1"] - best["dg1_nosel"]) / best["dg1_sel1"]
    del inputs
    torch.cuda.empty_cache()
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 x 8K, 8 x 8K, 1 x 64K, 1 x 256K only")
    args = parser.parse_args()
    sizes = list(itertools.product((1, 8, 64), (8192, 65536, 262144)))
    if args.quick:
        sizes = [(1, 8192), (8, 8192), (1, 65536), (1, 262144)]
    dg = _import_deep_gemm()
    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    run_sizes(sizes, lambda rows, ctx: bench_size(rows, ctx, scorer, gen, dg, args.rounds), args.out, "indexer_pdl",
              _describe)


def _describe(r: dict) -> str:
    b = r["median_us"]
    return (f"{r['rows']:3d} x {r['context']:6d}: " + " ".join(f"{m}={b[m]:.2f}" for m in MODES)
            + f" | share stock {r['share_stock']:.3f} pdl {r['share_pdl_both']:.3f} picks {r['picks_equal_to_stock']}")

if __name__ == "__main__":
    main()
