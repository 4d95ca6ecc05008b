"""A/B of the host ops' eager host time in one process: two trees' runtime packages side by side.

``ab/old/runtime`` and ``ab/new/runtime`` (``git archive REV runtime``) are imported as ``runtime_old`` and
``runtime_new`` (the package imports itself relatively only), both loading the checkout's cubins. Each op's calls
run in blocks of 100 (inside the launch queue, so no call waits for the GPU), the two versions' blocks interleaved
and their order alternated, a device synchronize after each block outside the clock: the host's speed, which
drifts between processes and machine starts by tens of percent, is common to both. Reported per op: each
version's median microseconds a call, and the median of the paired ratios new / old; the JSON's ``env`` is the
checkout's (``gpu_info``) and ``runtime_sha256`` each tree's runtime files (path and bytes, as ``source_digest``
reads them; the forty-third session's ``host_ab_s43.json`` predates both: its trees were 7566dc6 and 1237d75).
Usage: ``python3 gpu/jobs/host_ab.py OUT.json [--blocks N]`` from the checkout, DeepGEMM importable.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("SPARSE_DECODE_AOT_CACHE", str(ROOT))
sys.path.insert(0, str(ROOT))
FP8 = torch.float8_e4m3fn
BLOCK = 100


def import_tree(version: str):
    """The runtime package of ``ab/<version>/`` as the module ``runtime_<version>``."""
    name, folder = f"runtime_{version}", ROOT / "ab" / version / "runtime"
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    for sub in ("sparse_mla", "topk", "indexer", "scoring", "reference"):
        importlib.import_module(f"{name}.{sub}")
    return module


def cases(rt, gen) -> dict:
    """The ops' calls on the same shapes as benchmarks/bench_host.py, through the package ``rt``."""
    from benchmarks.bench_host import sparse_mla_inputs

    q, swa, comp, indices, lens, out, kw = sparse_mla_inputs(gen)
    logits = torch.randn(8, 65536, device="cuda", generator=gen)
    ends = torch.full((8,), 65536, dtype=torch.int32, device="cuda")
    top = torch.empty(8, 512, dtype=torch.int32, device="cuda")
    mla, topk = rt.sparse_mla, rt.topk
    calls = {
        "sparse_mla_decode_T12_w640_out": lambda: mla.sparse_mla_decode(
            q, swa, comp, indices, lens, out=out, **kw),
        "decode_topk_8x64K_k512": lambda: topk.decode_topk(logits, ends, top),
    }
    ok, _ = rt.scoring.deepgemm_status(torch.device("cuda"))
    if ok:
        calls["decode_rows_8x64K_k512"] = indexer_step(rt, gen)
    return calls


def indexer_step(rt, gen):
    """One single-rank decode_rows of 8 rows x 64K tokens, 64 heads of 128, k 512, DeepGEMM scoring."""
    rows, ctx, heads, dim, k = 8, 65536, 64, 128, 512
    from benchmarks.bench_indexer import head_weights, random_cache

    scorer = rt.scoring.DeepGemmScorer()
    pages = ctx // rt.scoring.BLOCK_KV
    cache = random_cache(rows * pages, gen)
    table = torch.arange(rows * pages, dtype=torch.int32, device="cuda").view(rows, pages)
    seq_lens = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(rows, heads, dim, device="cuda", generator=gen).to(FP8)
    weights = head_weights(rows, gen)
    state = rt.indexer.IndexerState(torch.full((rows, k), -1, dtype=torch.int32, device="cuda"), k, cache, ctx,
                                    scorer=scorer)
    md = rt.indexer.DecodeMetadata(seq_lens, table, num_requests=rows, num_tokens=rows, max_seq_len=ctx,
                                   schedule=scorer.schedule(seq_lens))
    tp = rt.indexer.SingleRank()
    return lambda: rt.indexer.decode_rows(state, md, q, weights, tp)


def runtime_digest(version: str) -> str:
    """``source_digest`` of ``ab/<version>/runtime``'s .py files, named as in the checkout."""
    from benchmarks.common import source_digest

    folder = ROOT / "ab" / version
    return source_digest(lambda: [(str(p.relative_to(folder)), p.read_bytes())
                                  for p in sorted((folder / "runtime").rglob("*.py"))])


def main() -> None:
    from benchmarks.bench_host import block_us
    from benchmarks.common import gpu_info

    out_path = sys.argv[1]
    blocks = int(sys.argv[sys.argv.index("--blocks") + 1]) if "--blocks" in sys.argv else 61
    trees = {v: cases(import_tree(v), torch.Generator(device="cuda").manual_seed(0)) for v in ("old", "new")}
    result = {"env": gpu_info(), "runtime_sha256": {v: runtime_digest(v) for v in trees}, "block": BLOCK,
              "blocks": blocks, "ops": {}}
    for op in trees["new"]:
        for v in trees:
            for _ in range(3):
                trees[v][op]()  # warm: the first calls load kernels and fill memos
        torch.cuda.synchronize()
        times = {"old": [], "new": []}
        for i in range(blocks):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for v in order:
                times[v].append(block_us(trees[v][op], BLOCK))
        ratios = [n / o for n, o in zip(times["new"], times["old"])]
        result["ops"][op] = {"old_us": statistics.median(times["old"]), "new_us": statistics.median(times["new"]),
                             "new_over_old": statistics.median(ratios), "old_all": times["old"],
                             "new_all": times["new"]}
        r = result["ops"][op]
        print(f"{op:34s} old {r['old_us']:7.2f} us  new {r['new_us']:7.2f} us  new/old {r['new_over_old']:.3f}",
              flush=True)
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
