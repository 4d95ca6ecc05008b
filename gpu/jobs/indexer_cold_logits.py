"""Issue 5 experiment: does the selection inside the step read its logits from DRAM?

`indexer_s41.json` measured the selection's marginal cost in the step 0.7-2.0 us above its standalone time where
DeepGEMM streams more key bytes than the L2 holds (none at 8K contexts). If the logits written early in the scoring
are evicted by the key stream, the standalone selection over logits rotated past the L2 should cost what the
selection adds to the step. This job times decode_topk in stream order (CUDA-graph replay, as the benchmark) over
the same rows' DeepGEMM logits:

- ``warm``: two copies of the logits, alternating (they stay in the L2, as the benchmark's standalone timing);
- ``cold``: enough copies to pass 3 x the L2 (at most 256), so every launch reads from DRAM;

beside the step and the step without its selection (the marginal cost) of the same inputs.
Usage: ``python3 gpu/jobs/indexer_cold_logits.py --out FILE.json``.
"""

from __future__ import annotations

import argparse
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
    time_calls,
)
from benchmarks.common import l2_bytes
from runtime import topk
from runtime.indexer import SingleRank
from runtime.scoring import DeepGemmScorer

SIZES = [(1, 8192), (8, 8192), (1, 65536), (8, 65536), (1, 262144), (8, 262144), (64, 65536)]


def select_over(copies, row_ends, out) -> dict:
    return time_calls([lambda c=c: topk.decode_topk(c, row_ends, out, pdl=False) for c in copies])


def bench_size(rows, ctx, scorer, gen) -> dict:
    inputs = step_inputs(scorer, rows, ctx, gen)
    tp = SingleRank()
    a = inputs[0]
    logits, row_ends, out = a.logits, a.md.seq_lens, a.auto.topk_indices
    cold_copies = max(2, min(256, -(-3 * l2_bytes() // logits.nbytes)))
    res = {"rows": rows, "context": ctx, "k": K, "logits_bytes": logits.nbytes, "cold_copies": cold_copies,
           "topk_kernel": topk.decode_topk_plan(logits, rows, K, False)}

    for round_ in range(2):
        warm = [logits.clone() for _ in range(2)]
        res.setdefault("warm_us", []).append(select_over(warm, row_ends, out)["median_us"])
        del warm
        cold = [logits.clone() for _ in range(cold_copies)]
        res.setdefault("cold_us", []).append(select_over(cold, row_ends, out)["median_us"])
        del cold
        res.setdefault("step_us", []).append(
            time_calls([lambda s=s: decode_step(s.auto, s.md, s.q, s.weights, tp) for s in inputs])["median_us"])
        res.setdefault("step_without_select_us", []).append(
            time_calls([lambda s=s: plan_and_logits(s, scorer, tp) for s in inputs])["median_us"])
    res["marginal_us"] = [s - n for s, n in zip(res["step_us"], res["step_without_select_us"])]
    del inputs
    torch.cuda.empty_cache()
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    run_sizes(SIZES, lambda rows, ctx: bench_size(rows, ctx, scorer, gen), args.out, "indexer_cold_logits", _describe)


def _describe(r: dict) -> str:
    return (f"{r['rows']:3d} x {r['context']:6d}: warm {r['warm_us']} cold {r['cold_us']} marginal "
            f"{[round(x, 2) for x in r['marginal_us']]} ({r['cold_copies']} copies)")

if __name__ == "__main__":
    main()
