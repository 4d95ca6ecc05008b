"""How often decode_topk's step-1 warp loop gives up its candidate list on a long slice (CPU emulation).

On a slice of at least the warp loop's length (kernels/decode_topk/step1.py: step1_warp), each of a CTA's 16
warps reads its own contiguous part, 256 columns an iteration, into its own segment of the list: the items whose
first digit (the top 11 bits of the order-preserving key) is at or above the warp's bound, each also counted in
the CTA's histogram. When the next iteration's items would not fit above ``refresh`` slots, the warp raises its
bound to the bin of the CTA's k-th largest item counted so far and drops the segment's items below it; if they
still would not fit in the segment (``capacity`` / 16 slots) the warp gives the list up, and the CTA re-reads
its whole slice in the later steps.

Warps run at their own speed (a fixed time an iteration each, 1 + ``spread`` x a standard normal draw): a warp that
ends its part early can fill its segment while the CTA's k-th largest so far, which needs every warp's items,
still sits a bin low. This prints, per configuration, how many of ``--ctas`` emulated CTAs gave a list up and
where in their parts those warps were, and the refreshes' work a CTA (emulate_cta's counts). The spread is a model
parameter, not a measurement, and a refresh costs no time here (a warp that refreshes often would, in the kernel,
fall behind the others and let the CTA's bound catch up). --crowded takes crowded_warp_slice's slices, which the GPU
tests and the sanitizer use.

    python3 benchmarks/step1_list_emulation.py [--columns 524288] [--ks 512,2048] [--spreads 0,0.2,0.5]
        [--capacities 12032,16384] [--refresh 12032] [--scales 1] [--ctas 40] [--crowded]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.contract import decode_topk as contract
from runtime.reference import decode_topk_keys

WARPS = contract.THREADS // 32
ITERATION_COLUMNS = 256  # a warp's 32 groups of 8 columns
BINS = contract.HIST_BINS  # the first digit: the key's top 11 bits
# A CTA's slice past the one-CTA-an-SM twins' table (warp_step1_min_groups: STEP1_TABLE_TILES x THREADS groups of 8
# columns, and one more), where step 1's warp loop runs: the crowded slices' width in the GPU test and the sanitizer.
CROWDED_CTA_COLUMNS = 139264


def kth_bin(hist: torch.Tensor, k: int, bound: int) -> int:
    """The bin of the k-th largest item counted in ``hist``, never below ``bound`` (selection.warp_kth_bin)."""
    from_top = torch.cumsum(hist.flip(0), 0)
    reached = int(torch.searchsorted(from_top, k))
    return bound if reached >= BINS else max(bound, BINS - 1 - reached)


def emulate_cta(bins: torch.Tensor, k: int, capacity: int, refresh: int, speeds: list[float],
                counts: dict | None = None) -> list[float]:
    """Where in its part (0-1) each warp that gave its list up was; ``bins``: the slice's first digits. ``counts``
    (a dict) gets the work the refreshes cost: "refreshes" (k-th bin searches, each a warp's pass over the CTA's
    histogram), "filters" and "filtered_slots" (segment compactions whose bound rose, and the slots they read), and
    "idle_filters" (those whose bound did not rise: a kernel that compacts anyway reads the segment for nothing)."""
    counts = {} if counts is None else counts
    for key in ("refreshes", "filters", "filtered_slots", "idle_filters"):
        counts.setdefault(key, 0)
    seg_cap, refresh_at = capacity // WARPS, min(refresh // WARPS, capacity // WARPS)
    per = bins.numel() // WARPS
    parts = bins.split(per)
    hist = torch.zeros(BINS, dtype=torch.int64)
    segment = [bins.new_empty(0) for _ in range(WARPS)]
    bound, pos, listed = [0] * WARPS, [0] * WARPS, [True] * WARPS
    gave_up = []
    queue = [(speeds[w], w) for w in range(WARPS)]
    heapq.heapify(queue)
    while queue:
        t, w = heapq.heappop(queue)
        items = parts[w][pos[w]:pos[w] + ITERATION_COLUMNS]
        pos[w] += ITERATION_COLUMNS
        passing = items[items >= bound[w]]
        if listed[w] and segment[w].numel() + passing.numel() > refresh_at:
            risen = kth_bin(hist, k, bound[w])
            counts["refreshes"] += 1
            if risen > bound[w]:
                counts["filters"] += 1
                counts["filtered_slots"] += segment[w].numel()
            else:
                counts["idle_filters"] += 1
            bound[w] = risen
            segment[w] = segment[w][segment[w] >= bound[w]]
            passing = items[items >= bound[w]]
            if segment[w].numel() + passing.numel() > seg_cap:
                listed[w] = False
                gave_up.append(pos[w] / per)
        if listed[w]:
            segment[w] = torch.cat([segment[w], passing])
        hist += torch.bincount(passing, minlength=BINS)
        if pos[w] < per:
            heapq.heappush(queue, (t + speeds[w], w))
    return gave_up


def crowded_warp_slice(columns: int, k: int, generator: torch.Generator, warp: int = 5,
                       held: int = 880) -> torch.Tensor:
    """A CTA's slice (FP32, on the CPU) that makes one warp hold a list segment between LIST_CAPACITY's share (752)
    and 1024 slots: standard normal logits, and in the last quarter of ``warp``'s part, the smallest number of
    values of 8-9 (16 at a time) that puts ``held`` of that part's items at or above the slice's k-th largest bin.
    A warp keeps at least those items whatever its bound, so with 752 slots it gives its list up (the CTA re-reads
    its slice); with 1024 it keeps it where that warp's bound has caught up with the CTA's by then (in this
    emulation of 139264-column slices at k 1024 and 2048, spreads up to 0.5: on the tests' seeds always,
    tests/test_topk_reference.py; on 1 of 120 CTAs in step1_list_emulation_s56.txt not)."""
    logits = torch.randn(columns, generator=generator)
    per = columns // WARPS
    tail = warp * per + per * 3 // 4 + torch.randperm(per // 4, generator=generator)
    for highs in range(16, k, 16):
        crowded = logits.clone()
        crowded[tail[:highs]] = 8 + torch.rand(highs, generator=generator)
        bins = decode_topk_keys(crowded) >> 21
        bound = kth_bin(torch.bincount(bins, minlength=BINS), k, 0)
        if int((bins[warp * per:(warp + 1) * per] >= bound).sum()) >= held:
            return crowded
    raise ValueError(f"no slice of {columns} columns crowds {held} of k = {k} items into one warp's part")


def crowded_warp_rows(rows: int, ctas: int, cta_columns: int, k: int, seed: int) -> torch.Tensor:
    """``rows`` rows of ``ctas`` crowded slices each (crowded_warp_slice), FP32 on the CPU: on a cluster of ``ctas``
    CTAs a row of ``ctas * cta_columns`` columns gives every CTA one such slice."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.cat([crowded_warp_slice(cta_columns, k, g) for _ in range(ctas)])
                        for _ in range(rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--columns", type=int, default=1 << 19, help="a CTA's slice (64 x 1M on the 2-CTA twin: 512K)")
    ap.add_argument("--ks", default="512,2048")
    ap.add_argument("--spreads", default="0,0.2,0.5")
    ap.add_argument("--capacities", default=f"{contract.LIST_CAPACITY},{contract.TWIN_LIST_CAPACITY}",
                    help="list capacities (the contract's LIST_CAPACITY, and TWIN_LIST_CAPACITY: the twins')")
    ap.add_argument("--refresh", type=int, default=contract.LIST_CAPACITY,
                    help="the capacity whose share triggers a refresh (LIST_CAPACITY, on every build)")
    ap.add_argument("--scales", default="1", help="factors on the standard normal logits")
    ap.add_argument("--ctas", type=int, default=40)
    ap.add_argument("--crowded", action="store_true", help="crowded_warp_slice's slices instead of normal logits")
    a = ap.parse_args()
    for capacity in [int(c) for c in a.capacities.split(",")]:
        for k in [int(x) for x in a.ks.split(",")]:
            for scale in [float(x) for x in a.scales.split(",")]:
                for spread in [float(x) for x in a.spreads.split(",")]:
                    g = torch.Generator().manual_seed(7)
                    where, counts = [], {}
                    for _ in range(a.ctas):
                        if a.crowded:
                            logits = crowded_warp_slice(a.columns, k, g) * scale
                        else:
                            logits = torch.randn(a.columns, generator=g) * scale
                        bins = decode_topk_keys(logits) >> 21  # the first digit: the key's top 11 bits
                        speeds = (1 + spread * torch.randn(WARPS, generator=g)).clamp(min=0.3).tolist()
                        where.append(emulate_cta(bins, k, capacity, a.refresh, speeds, counts))
                    lost = [w for w in where if w]
                    print(f"capacity {capacity} (refresh at {a.refresh}) k {k} scale {scale} spread {spread}: "
                          f"{len(lost)} of {a.ctas} CTAs re-read their slice; the warps that gave up were at "
                          f"{sorted(round(x, 2) for w in lost for x in w)[:12]} of their parts; a CTA's refresh work: "
                          f"{ {name: round(n / a.ctas, 1) for name, n in counts.items()} }", flush=True)


if __name__ == "__main__":
    main()
