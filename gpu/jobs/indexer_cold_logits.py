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

from benchmarks.bench_indexer import K, step_inputs, time_calls  # noqa: E402
from benchmarks.common import gpu_info, l2_bytes, write_json  # noqa: E402
from runtime import topk  # noqa: E402
from runtime.indexer import SingleRank, finish_decode_rows, plan_decode_rows  # noqa: E402
from runtime.scoring import DeepGemmScorer  # noqa: E402

SIZES = [(1, 8192), (8, 8192), (1, 65536), (8, 65536), (1, 262144), (8, 262144), (64, 65536)]


def select_over(copies, row_ends, out) -> dict:
    return time_calls([lambda c=c: topk.decode_topk(c, row_ends, out, pdl=False) for c in copies])


def bench_size(rows, ctx, scorer, gen) -> dict:
    inputs = step_inputs(scorer, rows, ctx, gen)
    tp = SingleRank()
    cache = inputs[0].auto.index_k_cache
    a = inputs[0]
    logits, row_ends, out = a.logits, a.md.seq_lens, a.auto.topk_indices
    cold_copies = max(2, min(256, -(-3 * l2_bytes() // logits.nbytes)))
    res = {"rows": rows, "context": ctx, "k": K, "logits_bytes": logits.nbytes, "cold_copies": cold_copies,
           "topk_kernel": topk.decode_topk_plan(logits, rows, K, False)}

    def step(s):
        finish_decode_rows(s.auto, s.q, s.weights, plan_decode_rows(s.auto, s.md, tp), tp)

    def plan_and_logits(s):
        plan_decode_rows(s.auto, s.md, tp)
        scorer.logits(s.q, s.weights, cache, s.md.seq_lens, s.md.block_table, s.schedule, ctx)

    for round_ in range(2):
        warm = [logits.clone() for _ in range(2)]
        res.setdefault("warm_us", []).append(select_over(warm, row_ends, out)["median_us"])
        del warm
        cold = [logits.clone() for _ in range(cold_copies)]
        res.setdefault("cold_us", []).append(select_over(cold, row_ends, out)["median_us"])
        del cold
        res.setdefault("step_us", []).append(time_calls([lambda s=s: step(s) for s in inputs])["median_us"])
        res.setdefault("step_without_select_us", []).append(
            time_calls([lambda s=s: plan_and_logits(s) for s in inputs])["median_us"])
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
    results = []
    for rows, ctx in SIZES:
        try:
            r = bench_size(rows, ctx, scorer, gen)
            print(f"{rows:3d} x {ctx:6d}: warm {r['warm_us']} cold {r['cold_us']} marginal "
                  f"{[round(x, 2) for x in r['marginal_us']]} ({r['cold_copies']} copies)", flush=True)
        except Exception as exc:
            r = {"rows": rows, "context": ctx, "error": f"{type(exc).__name__}: {exc}"[:500]}
            print(r, flush=True)
        results.append(r)
        write_json(args.out, {"bench": "indexer_cold_logits", "info": gpu_info(), "results": results})


if __name__ == "__main__":
    main()
