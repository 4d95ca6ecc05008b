"""What decode_topk's gathered finish meets on the indexer benchmark's rows, emulated on the CPU.

usage: python benchmarks/indexer_finish_emulation.py [ROWS] [CONTEXT]     (default 8 65536)

The rows are bench_indexer's (random FP8 keys, 64 heads of 128, k = 512) scored by the reference, with the
benchmark's positive head weights and with signed ones. For each row: the first digit's threshold bin (the items
CTA 0's finish gathers, n), what the row must still take from it (krem), and after the finish's first round (key
bits 10-20) the threshold sub-bin's count and remainder: done where they are equal (every item matching the
prefix is taken, and the selection pass runs), else a bin of at most TIE_RANK_MAX items is ranked at once.
"""
import sys

import torch

from benchmarks.bench_indexer import HEAD_DIM, HEADS, K, head_weights, random_cache
from runtime import reference
from runtime.scoring import BLOCK_KV


def threshold_bin(keys: torch.Tensor, k: int, shift: int, bits: int) -> tuple[int, int, int]:
    """(bin, items above it, items in it) of the k-th largest key by bits [shift, shift + bits)."""
    hist = torch.bincount((keys >> shift) & ((1 << bits) - 1), minlength=1 << bits)
    above = hist.flip(0).cumsum(0).flip(0) - hist
    b = int(torch.nonzero((above < k) & (above + hist >= k)).max())
    return b, int(above[b]), int(hist[b])


def row_logits(rows: int, ctx: int, signed: bool, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pages = ctx // BLOCK_KV
    cache = random_cache(rows * pages, gen, device="cpu")
    table = torch.arange(rows * pages, dtype=torch.int32).view(rows, pages)
    seq_lens = torch.full((rows,), ctx, dtype=torch.int32)
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(torch.float8_e4m3fn)
    weights = head_weights(rows, gen, device="cpu", signed=signed)
    return reference.indexer_logits_reference(q, weights, cache, seq_lens, table, ctx)


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 65536
    for signed in (False, True):
        keys = reference.decode_topk_keys(row_logits(rows, ctx, signed)).to(torch.int64) & 0xFFFFFFFF
        for r in range(rows):
            b0, above0, n = threshold_bin(keys[r], K, 21, 11)
            krem = K - above0
            _, above1, count1 = threshold_bin(keys[r][(keys[r] >> 21) == b0], krem, 10, 11)
            print(f"{'signed' if signed else 'positive'} weights, row {r}: n={n} krem={krem} "
                  f"after the first round count={count1} krem={krem - above1} done={krem - above1 == count1}")


if __name__ == "__main__":
    main()
