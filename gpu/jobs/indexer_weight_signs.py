"""decode_topk on the indexer benchmark's DeepGEMM logits with its head weights as they are (uniform in
[0, 1) / sqrt(heads): every logit a positive sum) beside signed weights (normal / sqrt(heads), as a
linear projection's output is), and on random normal rows: the selection in stream order, and how
spread each row's logits are.

Why: the DeepGEMM logits' selection is slower than random rows' (8 x 64K: 8.49 against ~7.7 us), and
the benchmark's all-positive weights make every logit a sum of 64 positive terms, so a row's logits
sit within about an octave of one value, the radix first digit's worst case. A model's weights come
from a linear projection and carry both signs.

usage: indexer_weight_signs.py OUT.json
"""
import json
import sys

import torch

from benchmarks.bench_indexer import K, head_weights
from benchmarks.common import gpu_info, time_graph
from gpu.jobs.indexer_roots import rotated_inputs
from runtime.scoring import DeepGemmScorer
from runtime.topk import decode_topk, decode_topk_plan

SIZES = ((1, 8192), (1, 65536), (8, 8192), (8, 65536), (8, 262144), (64, 8192))


def spread(x: torch.Tensor) -> dict:
    """Median over rows of log2(max / 99th percentile) and of log2(max / median) of |logit|."""
    a = x.float().abs()
    top = a.amax(1)
    q99 = a.quantile(0.99, dim=1)
    med = a.median(1).values
    return {"octaves_max_over_p99": round(float(torch.log2(top / q99).median()), 3),
            "octaves_max_over_median": round(float(torch.log2(top / med).median()), 3),
            "negative_fraction": round(float((x < 0).float().mean()), 3)}


def main(out_path: str) -> None:
    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cells = []
    for rows, ctx in SIZES:
        inputs = rotated_inputs(scorer, rows, ctx, gen)
        signed = [(inp[0], head_weights(rows, gen, signed=True)) + inp[2:] for inp in inputs]
        sources = {
            "positive_weights": [(scorer.logits(*inp), inp[3]) for inp in inputs],
            "signed_weights": [(scorer.logits(*inp), inp[3]) for inp in signed],
            "random_normal": [(torch.randn(rows, ctx, device="cuda", generator=gen), inp[3]) for inp in inputs],
        }
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        cell = {"rows": rows, "context": ctx, "k": K, "kernel": decode_topk_plan(sources["positive_weights"][0][0],
                                                                                 rows, K, False)}
        for name, xs in sources.items():
            r = time_graph([lambda x=x, e=e: decode_topk(x, e, out, pdl=False) for x, e in xs])
            cell[name] = {"select_in_stream_order_us": round(r["median_us"], 3), **spread(xs[0][0][:, :ctx])}
        print(json.dumps(cell), flush=True)
        cells.append(cell)
        del inputs, signed, sources
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"info": gpu_info(), "cases": cells}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
