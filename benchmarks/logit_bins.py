"""How the indexer's logits fill decode_topk's first digit, beside the benchmark's randn rows (CPU).

decode_topk's first digit is the top 11 bits of the order-preserving key (sign, exponent,
two mantissa bits). For each row this prints how many of those bins the row occupies and
how many items share the k-th largest item's bin: the items step 1 cannot filter out and the
gathered finish must resolve. The indexer's logits (sum over heads of weight * ReLU(q . k),
as runtime.reference computes them from random FP8 queries and keys like
benchmarks/bench_indexer.py) are positive and span a few octaves.

Usage: ``python3 benchmarks/logit_bins.py [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_indexer import HEAD_DIM, HEADS, head_weights  # noqa: E402
from runtime import reference  # noqa: E402
from runtime.scoring import BLOCK_KV  # noqa: E402

FIRST_DIGIT_SHIFT = 21  # 32-bit keys: the top 11 bits


def indexer_rows(rows: int, ctx: int, gen: torch.Generator) -> torch.Tensor:
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(torch.float8_e4m3fn)
    weights = head_weights(rows, gen, device="cpu")
    keys = torch.randn(rows * ctx // BLOCK_KV, BLOCK_KV, HEAD_DIM, generator=gen)
    values, scales = reference.quantize_index_keys(keys)
    cache = reference.pack_index_k_cache(values, scales)
    table = torch.arange(rows * ctx // BLOCK_KV, dtype=torch.int32).view(rows, ctx // BLOCK_KV)
    seq_lens = torch.full((rows,), ctx, dtype=torch.int32)
    return reference.indexer_logits_reference(q, weights, cache, seq_lens, table, ctx)


def bin_stats(logits: torch.Tensor, k: int) -> list[dict]:
    out = []
    for row in logits:
        bins = reference.decode_topk_keys(row) >> FIRST_DIGIT_SHIFT
        kth_bin = int(reference.decode_topk_keys(torch.topk(row, k).values[-1:])[0] >> FIRST_DIGIT_SHIFT)
        out.append({"bins_occupied": int(torch.unique(bins).numel()), "in_kth_bin": int((bins == kth_bin).sum()),
                    "above_kth_bin": int((bins > kth_bin).sum()), "min": float(row.min()), "max": float(row.max())})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    results = []
    for ctx, k in ((8192, 512), (65536, 512)):
        rows = 4 if ctx <= 8192 else 1
        sources = (("indexer", indexer_rows(rows, ctx, gen)), ("randn", torch.randn(rows, ctx, generator=gen)))
        for name, logits in sources:
            cell = {"source": name, "context": ctx, "k": k, "rows": bin_stats(logits, k)}
            results.append(cell)
            print(name, ctx, k, [(r["bins_occupied"], r["in_kth_bin"]) for r in cell["rows"]], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"first_digit_bits": 11, "results": results}, indent=1))


if __name__ == "__main__":
    main()
