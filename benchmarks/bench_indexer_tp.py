"""Row-sharded indexer over NCCL (issue 6): every rank scores only its slice.

Run with one process per GPU, for any world size:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --standalone --nproc-per-node N benchmarks/bench_indexer_tp.py --out FILE.json

For batch in {16, 18, 64} rows (18 leaves the last slices short or empty at
world 4) each rank builds the same step (same seeds), runs it replicated (world
of one, no collective) and row-sharded (DistGroup), checks that the gathered
top-k rows and candidate blocks equal the replicated run on every rank (as sets
per row: the AOT kernel's order within a row is unspecified), checks that the
rank scored only its slice, and times both (eager steps; the sharded one
includes its gathers). Rank 0 writes the JSON with the world size.

Its timing is host wall time of synchronized eager steps with the inputs L2-warm, not
DESIGN.md's graph-replay method over inputs rotated past the L2: a step's NCCL
all-gather is what it compares (sharded against replicated on one machine), and
its numbers are not comparable with bench_indexer.py's.

``--cpu-smoke``: the same logic on CPU processes over gloo with the torch scorer
and a small context (checks the script without GPUs; timings meaningless).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                   ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(var, value)  # never NVLink multicast

from benchmarks.bench_indexer import HEAD_DIM, HEADS, K, head_weights, random_cache  # noqa: E402
from runtime.indexer import (  # noqa: E402
    DecodeMetadata,
    DistGroup,
    IndexerState,
    SingleRank,
    decode_rows,
    row_shard_bounds,
)
from runtime.scoring import BLOCK_KV, DeepGemmScorer, TorchScorer  # noqa: E402

CANDIDATES = 512


class CountingScorer:
    """Wraps a scorer and counts the rows it scored (to prove a rank scored only its slice)."""

    def __init__(self, inner):
        self.inner, self.name, self.rows = inner, inner.name, 0

    def schedule(self, seq_lens):
        return self.inner.schedule(seq_lens)

    def check_inputs(self, *args):
        self.inner.check_inputs(*args)

    def logits(self, q, *args, **kwargs):
        self.rows += q.shape[0]
        return self.inner.logits(q, *args, **kwargs)


def make_inputs(rows: int, ctx: int, seed: int, device: str):
    """The same step on every rank: generated from one seed on each rank's device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages_per_row = ctx // BLOCK_KV
    cache = random_cache(rows * pages_per_row, gen, device)
    table = torch.arange(rows * pages_per_row, dtype=torch.int32, device=device).view(rows, pages_per_row)
    lens = ctx - torch.randint(0, BLOCK_KV * 4, (rows,), device=device, generator=gen).to(torch.int32)
    md = DecodeMetadata(lens, table, num_requests=rows, num_tokens=rows, max_seq_len=ctx)
    q = torch.randn(rows, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.float8_e4m3fn)
    w = head_weights(rows, gen, device)
    return cache, md, q, w


def new_state(rows_cap: int, cache, ctx: int, scorer) -> IndexerState:
    dev = cache.device
    return IndexerState(torch.full((rows_cap, K), -1, dtype=torch.int32, device=dev), K, cache, ctx,
                        candidate_blocks=torch.full((rows_cap, CANDIDATES), -1, dtype=torch.int32, device=dev),
                        scorer=scorer)


def time_steps(fn, device: str, repeats: int = 20, warmup: int = 3) -> dict:
    """Median wall microseconds of ``fn`` over ``repeats`` (synchronized), all ranks in step."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    dist.barrier()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times), "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 18, 64])
    parser.add_argument("--out", default="benchmarks/results/indexer_tp.json")
    parser.add_argument("--cpu-smoke", action="store_true", help="gloo on CPU with the torch scorer")
    args = parser.parse_args()

    if args.cpu_smoke:
        device, backend, ctx = "cpu", "gloo", min(args.context, 4096)
        dist.init_process_group(backend)
        inner = TorchScorer()
    else:
        device, backend, ctx = "cuda", "nccl", args.context
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group(backend, device_id=torch.device("cuda", local))
        inner = DeepGemmScorer()
    group = DistGroup()
    results = []
    for rows in args.rows:
        cache, md, q, w = make_inputs(rows, ctx, seed=rows, device=device)
        cap = rows + 2 * group.world_size + 2  # room for world x slice rows
        want = new_state(cap, cache, ctx, inner)
        scorer = CountingScorer(inner)
        got = new_state(cap, cache, ctx, scorer)
        replicated = lambda: decode_rows(want, md, q, w, SingleRank())  # noqa: E731
        sharded = lambda: decode_rows(got, md, q, w, group)  # noqa: E731
        replicated()
        sharded()
        bounds = row_shard_bounds(rows, rows, group.world_size, group.rank)
        start, end = bounds or (0, rows)
        only_slice = scorer.rows == end - start
        equal = bool(
            torch.equal(got.topk_indices[:rows].sort(dim=1).values, want.topk_indices[:rows].sort(dim=1).values)
            and torch.equal(got.candidate_blocks[:rows].sort(dim=1).values,
                            want.candidate_blocks[:rows].sort(dim=1).values))
        flags = torch.tensor([int(equal), int(only_slice)], device=device)
        everyone = [torch.zeros_like(flags) for _ in range(group.world_size)]
        dist.all_gather(everyone, flags)
        t_rep = time_steps(replicated, device)
        t_shard = time_steps(sharded, device)
        res = {"rows": rows, "context": ctx, "k": K, "candidates": CANDIDATES,
               "slices": [row_shard_bounds(rows, rows, group.world_size, r) for r in range(group.world_size)],
               "equal_on_every_rank": all(int(f[0]) for f in everyone),
               "each_rank_scored_only_its_slice": all(int(f[1]) for f in everyone),
               "replicated": t_rep, "sharded": t_shard, "speedup": t_rep["median_us"] / t_shard["median_us"]}
        results.append(res)
        if group.rank == 0:
            print(f"world={group.world_size} rows={rows} slices={res['slices']} equal={res['equal_on_every_rank']} "
                  f"only_slice={res['each_rank_scored_only_its_slice']} replicated={t_rep['median_us']:.1f}us "
                  f"sharded={t_shard['median_us']:.1f}us speedup={res['speedup']:.2f}", flush=True)
        del cache, want, got
        if device == "cuda":
            torch.cuda.empty_cache()
    if group.rank == 0:
        from benchmarks.common import write_json

        info = {"world_size": group.world_size, "backend": backend}
        if device == "cuda":
            from benchmarks.common import gpu_info

            info.update(gpu_info())
        write_json(args.out, {"bench": "indexer_row_sharded", "world_size": group.world_size, "info": info,
                              "results": results})
    ok = all(r["equal_on_every_rank"] and r["each_rank_scored_only_its_slice"] for r in results)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
