"""How the indexer's logits fill decode_topk's first digit and its gathered finish's first round (CPU).

decode_topk's first digit is the top 11 bits of the order-preserving key (sign, exponent,
two mantissa bits). For each row this prints how many of those bins the row occupies and
how many items share the k-th largest item's bin (n): the items step 1 cannot filter out and
CTA 0's gathered finish must resolve. Then the finish's first round (key bits 10-20) over
those n items: the threshold sub-bin's count and what the row must still take from it; where
they are equal the round resolves the list (done: the selection pass runs), else a sub-bin of
at most 64 items is ranked at once. The indexer's logits (sum over heads of weight * ReLU(q . k),
as runtime.reference computes them from bench_indexer.py's random FP8 queries and keys) are
positive with the benchmark's head weights and span a few octaves; signed weights spread them.

Usage: ``python3 benchmarks/logit_bins.py [--rows R --context C] [--out FILE.json]``
(default: 4 rows of 8K and one of 64K; with --rows/--context, that one size).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_indexer import HEAD_DIM, HEADS, head_weights, random_cache  # noqa: E402
from benchmarks.common import tree_info
from runtime import reference  # noqa: E402
from runtime.scoring import BLOCK_KV  # noqa: E402

FIRST_DIGIT = (21, 11)  # (shift, bits) of the 32-bit key's first digit
FIRST_ROUND = (10, 11)  # the gathered finish's first round (FP32)
K = 512


def indexer_rows(rows: int, ctx: int, signed: bool = False, seed: int = 1) -> torch.Tensor:
    """Reference logits of bench_indexer's inputs (full rows of ctx tokens), drawn on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    pages = ctx // BLOCK_KV
    cache = random_cache(rows * pages, gen, device="cpu")
    table = torch.arange(rows * pages, dtype=torch.int32).view(rows, pages)
    seq_lens = torch.full((rows,), ctx, dtype=torch.int32)
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(torch.float8_e4m3fn)
    weights = head_weights(rows, gen, device="cpu", signed=signed)
    return reference.indexer_logits_reference(q, weights, cache, seq_lens, table, ctx)


def threshold_bin(keys: torch.Tensor, k: int, digit: tuple[int, int]) -> tuple[int, int, int]:
    """(bin, items above it, items in it) of the k-th largest key by the digit's bits."""
    shift, bits = digit
    hist = torch.bincount((keys >> shift) & ((1 << bits) - 1), minlength=1 << bits)
    above = hist.flip(0).cumsum(0).flip(0) - hist
    b = int(torch.nonzero((above < k) & (above + hist >= k)).max())
    return b, int(above[b]), int(hist[b])


def bin_stats(logits: torch.Tensor, k: int) -> list[dict]:
    out = []
    for row in logits:
        keys = reference.decode_topk_keys(row).to(torch.int64) & 0xFFFFFFFF
        b0, above0, n = threshold_bin(keys, k, FIRST_DIGIT)
        krem = k - above0
        _, above1, count1 = threshold_bin(keys[(keys >> FIRST_DIGIT[0]) == b0], krem, FIRST_ROUND)
        out.append({"bins_occupied": int(torch.unique(keys >> FIRST_DIGIT[0]).numel()), "in_kth_bin": n,
                    "above_kth_bin": above0, "krem": krem, "first_round_count": count1,
                    "first_round_krem": krem - above1, "first_round_done": krem - above1 == count1,
                    "min": float(row.min()), "max": float(row.max())})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, help="one size: rows (with --context)")
    ap.add_argument("--context", type=int, help="one size: columns a row")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    sizes = ((args.rows, args.context),) if args.rows and args.context else ((4, 8192), (1, 65536))
    results = []
    for rows, ctx in sizes:
        sources = (("indexer", indexer_rows(rows, ctx)), ("indexer_signed", indexer_rows(rows, ctx, signed=True)),
                   ("randn", torch.randn(rows, ctx, generator=torch.Generator().manual_seed(0))))
        for name, logits in sources:
            cell = {"source": name, "context": ctx, "k": K, "rows": bin_stats(logits, K)}
            results.append(cell)
            print(name, ctx, K, "(bins occupied, n, krem, first-round count, first-round krem, done):",
                  [(r["bins_occupied"], r["in_kth_bin"], r["krem"], r["first_round_count"], r["first_round_krem"],
                    r["first_round_done"]) for r in cell["rows"]], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"info": tree_info(), "first_digit_bits": FIRST_DIGIT[1],
                                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
