"""Issue 5 experiment: why the selection adds more to the indexer step than it takes alone.

In `indexer_pdl_s41.json` the selection's marginal cost in the step (step - step without it) was 0.1-0.6 us above
its standalone stream-order time at most sizes and 2.8 us above at 8 x 256K. One candidate cause: the SMs'
L1 / shared-memory split. DeepGEMM's logits kernel, the top-k reset (torch's fill) and decode_topk ask for
different amounts of shared memory, and an SM whose split does not fit the next CTA must drain and reconfigure
first. This job times, side by side in one process (alternating rounds, CUDA-graph replay, the benchmark's
rotated inputs):

- ``select``: decode_topk alone in stream order (the benchmark's judged selection);
- ``step`` and ``step_without_select`` (plan + logits), their difference the marginal selection;

once with the cache as loaded and once with every decode_topk kernel's preferred carveout set to the largest
shared-memory split (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 100).
Usage: ``python3 gpu/jobs/indexer_carveout.py --out FILE.json [--rounds 3]``.
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
    time_calls,
)
from runtime import loader, topk
from runtime.indexer import SingleRank
from runtime.scoring import DeepGemmScorer

SIZES = [(1, 8192), (8, 8192), (1, 65536), (1, 262144), (8, 65536), (8, 262144), (64, 65536)]


def set_carveout(percent: int) -> None:
    """Every decode_topk kernel's preferred shared-memory carveout (-1: the driver's default)."""
    from cuda.bindings import driver as drv

    cache = loader.load(device=0)
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    for name in cache.names("decode_topk"):
        err, = drv.cuKernelSetAttribute(attr, percent, cache.kernel(name)._function, drv.CUdevice(0))
        if err:
            raise RuntimeError(f"cuKernelSetAttribute({name}, carveout {percent}): {err}")


def timings(inputs, scorer, tp) -> dict:
    return {
        "select": time_calls([lambda a=a: topk.decode_topk(a.logits, a.md.seq_lens, a.auto.topk_indices, pdl=False)
                              for a in inputs])["median_us"],
        "step": time_calls([lambda a=a: decode_step(a.auto, a.md, a.q, a.weights, tp) for a in inputs])["median_us"],
        "step_without_select": time_calls([lambda a=a: plan_and_logits(a, scorer, tp) for a in inputs])["median_us"],
    }


def bench_size(rows, ctx, scorer, gen, rounds) -> dict:
    inputs = step_inputs(scorer, rows, ctx, gen)
    tp = SingleRank()
    res = {"rows": rows, "context": ctx, "k": K, "input_sets": len(inputs),
           "topk_kernel": topk.decode_topk_plan(inputs[0].logits, rows, K, False)}
    by_round = {"default": [], "carveout_100": []}
    for _ in range(rounds):
        for mode, percent in (("default", -1), ("carveout_100", 100)):
            set_carveout(percent)
            by_round[mode].append(timings(inputs, scorer, tp))
    set_carveout(-1)
    res["by_round"] = by_round
    for mode, runs in by_round.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        med["select_marginal"] = med["step"] - med["step_without_select"]
        res[mode] = med
    del inputs
    torch.cuda.empty_cache()
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    run_sizes(SIZES, lambda rows, ctx: bench_size(rows, ctx, scorer, gen, args.rounds), args.out, "indexer_carveout",
              _describe)


def _describe(r: dict) -> str:
    return f"{r['rows']:3d} x {r['context']:6d}: " + " | ".join(
        f"{m}: " + " ".join(f"{k}={v:.2f}" for k, v in r[m].items()) for m in ("default", "carveout_100"))

if __name__ == "__main__":
    main()
