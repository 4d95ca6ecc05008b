"""Where the indexer's first decode step after a start-up preload spends what a steady step does not.

``first_step_probe.py OUT.json`` (DeepGEMM's cache warm: source gpu/tools/deepgemm_env.sh). In one fresh process,
for 1, 16 and 64 rows (as ``indexer_probe.py --nojit --preload``):
  preloaded_first: the first step on a state that ``preload_decode_rows`` ran on (serving preloads each layer's state);
  fresh_state_first: the first step on a new state over the same buffers' copies after that preload (what
    ``indexer_probe.py --nojit --preload`` times: its preload runs on another state);
  steady: steps back to back; after_pause: ``runtime.scoring.steps_after_pause_ms`` (each step after a cache
    snapshot and a 20 ms idle, as a first step follows a snapshot);
  profile_first / profile_steady: cProfile of a new state's first step and of a steady one, the functions
    whose own time differs most.
Wall times in ms, synchronized before and after each step.
"""

import cProfile
import json
import os
import pstats
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
from indexer_cases import make_state, make_step

import runtime
from benchmarks.common import gpu_info
from runtime.indexer import SingleRank, decode_rows, preload_decode_rows
from runtime.scoring import (
    DeepGemmScorer,
    jit_cache_snapshot,
    step_wall_ms,
    steps_after_pause_ms,
)


def own_times(step) -> dict:
    """cProfile's own time (tottime, ms) of every function one call of ``step`` runs."""
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    step()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof).stats
    return {f"{os.path.basename(f)}:{line}:{name}": v[2] * 1e3 for (f, line, name), v in stats.items()}


def profile_gap(first: dict, steady: dict, top: int = 15) -> list:
    names = set(first) | set(steady)
    gaps = sorted(((first.get(n, 0.0) - steady.get(n, 0.0), n) for n in names), reverse=True)[:top]
    return [{"function": n, "first_ms": round(first.get(n, 0.0), 4), "steady_ms": round(steady.get(n, 0.0), 4)}
            for _, n in gaps]


def main(out_path: str) -> None:
    runtime.load()
    scorer = DeepGemmScorer()
    steps = {rows: make_step(rows, heads=64, head_dim=128, max_model_len=8192, k=512, max_rows=64, device="cuda",
                             seed=rows) for rows in (1, 16, 64)}
    out = {"info": None}
    for rows, step in steps.items():
        def on(state, step=step):
            return lambda: decode_rows(state, step.metadata, step.q, step.weights, SingleRank())

        preloaded = make_state(step, scorer=scorer)
        t0 = time.perf_counter()
        preload_decode_rows(preloaded)
        torch.cuda.synchronize()
        r = {"preload_ms": (time.perf_counter() - t0) * 1e3}
        jit_cache_snapshot()
        r["preloaded_first"] = step_wall_ms(on(preloaded))
        r["fresh_state_first"] = step_wall_ms(on(make_state(step, scorer=scorer)))
        r["steady"] = [step_wall_ms(on(preloaded)) for _ in range(20)]
        pauses = steps_after_pause_ms(on(preloaded))
        r["after_pause"] = pauses
        first = own_times(on(make_state(step, scorer=scorer)))
        steady = own_times(on(preloaded))
        r["profile_first_total_ms"] = round(sum(first.values()), 3)
        r["profile_steady_total_ms"] = round(sum(steady.values()), 3)
        r["profile_gap"] = profile_gap(first, steady)
        med = sorted(r["steady"])[len(r["steady"]) // 2]
        print(f"rows={rows}: preloaded first {r['preloaded_first']:.3f} ms, fresh state first "
              f"{r['fresh_state_first']:.3f}, steady median {med:.3f} (range {min(r['steady']):.3f}-"
              f"{max(r['steady']):.3f}), after a pause {min(pauses):.3f}-{max(pauses):.3f}; profiled first "
              f"{r['profile_first_total_ms']} against steady {r['profile_steady_total_ms']} ms", flush=True)
        for g in r["profile_gap"][:6]:
            print("   ", g, flush=True)
        out[rows] = r
    out["info"] = gpu_info()
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
