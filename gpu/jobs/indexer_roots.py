"""decode_topk of several cache roots side by side on indexer logits (DeepGEMM scoring), one process.

usage: indexer_roots.py OUT.json ROOT [ROOT ...]

The logits are those of benchmarks/bench_indexer.py (random FP8 keys, paged, 64 heads of 128;
k = 512); each root's kernel (the one the op routes the shape to) is launched directly in CUDA
graphs over the same rotated input sets, so cache builds compare on real indexer rows. Each root is
also timed behind the scoring (DeepGEMM logits, then the kernel, in one graph: what programmatic dependent
launch can overlap), beside the scoring alone.
"""
import json
import os
import sys

import torch

from benchmarks.bench_indexer import K, rotation_sets, scoring_inputs
from benchmarks.common import gpu_info, time_graph
from runtime.loader import load
from runtime.scoring import DeepGemmScorer
from runtime.topk import decode_topk_plan

SIZES = ((64, 8192), (64, 65536), (64, 262144), (8, 8192), (8, 65536), (8, 262144), (1, 8192), (1, 65536), (1, 262144))


def rotated_inputs(scorer, rows: int, ctx: int, gen) -> list:
    """bench_indexer's scoring inputs in as many sets as take the keys and logits past the L2 several times."""
    return scoring_inputs(scorer, rows, ctx, rotation_sets(rows, ctx), gen)


def indexer_logits(scorer, rows: int, ctx: int, sets: int, gen, signed: bool = False) -> list:
    """`sets` (logits, seq_lens) pairs: DeepGEMM paged MQA logits of bench_indexer's scoring inputs."""
    return [(scorer.logits(*inp), inp[3]) for inp in scoring_inputs(scorer, rows, ctx, sets, gen, signed)]


def launch_topk(kernel, grid, x, ends, out) -> None:
    kernel.launch(grid, x.data_ptr(), ends.data_ptr(), out.data_ptr(), x.shape[1], x.stride(0), out.stride(0), K)


def main() -> None:
    out_path, roots = sys.argv[1], sys.argv[2:]
    caches = {r: load(None if r == "." else r) for r in roots}
    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cells = []
    # INDEXER_ROOTS_CONTEXTS=8192,65536: only those contexts (every size by default).
    contexts = os.environ.get("INDEXER_ROOTS_CONTEXTS")
    sizes = [s for s in SIZES if contexts is None or str(s[1]) in contexts.split(",")]
    for rows, ctx in sizes:
        inputs = rotated_inputs(scorer, rows, ctx, gen)
        xs = [(scorer.logits(*inp), inp[3]) for inp in inputs]
        name, c, grid = decode_topk_plan(xs[0][0], rows, K, False)
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        cell = {"kernel": name, "rows": rows, "context": ctx, "k": K, "us": {}, "after_scoring_us": {}}
        cell["scoring_us"] = round(time_graph([lambda inp=inp: scorer.logits(*inp) for inp in inputs])["median_us"], 2)
        # Each root twice, in order then in reverse (ABBA), so the order of timing does not favour a root.
        for r in roots + roots[::-1]:
            kc = caches[r]
            # A root built before the one-CTA-an-SM twins routes the shape to the two-CTA build.
            kernel = kc.kernel(name if name in kc else name.removesuffix("_full_sm"))
            calls = [lambda x=x, e=e, kernel=kernel: launch_topk(kernel, grid, x, e, out) for x, e in xs]
            cell["us"].setdefault(r, []).append(round(time_graph(calls)["median_us"], 2))
            steps = [lambda inp=inp, kernel=kernel: launch_topk(kernel, grid, scorer.logits(*inp), inp[3], out)
                     for inp in inputs]
            cell["after_scoring_us"].setdefault(r, []).append(round(time_graph(steps)["median_us"], 2))
        print(name, rows, ctx, cell["scoring_us"], cell["us"], cell["after_scoring_us"], flush=True)
        cells.append(cell)
        del xs, inputs
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"info": gpu_info(), "roots": roots, "cases": cells}, f, indent=1)


if __name__ == "__main__":
    main()
