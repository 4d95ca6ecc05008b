"""What a DeepGEMM schedule that no longer matches seq_lens does to the indexer's scoring, and what the value
check says of it. One step of 4 rows of 8K (64 heads of 128): the plan builds the slice's schedule from seq_lens,
then seq_lens is written shorter before the finish. Each case runs in a child process under a timeout, since the
stale one is expected not to end. Writes one JSON object to the path given (default: stdout).

Run from the checkout with DeepGEMM importable: python3 gpu/jobs/stale_schedule_probe.py $OUT/stale_schedule.json"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CHILD = r"""
import sys, torch
sys.path.insert(0, "tests")
from indexer_cases import make_step, make_state
import runtime.indexer as ix
case = sys.argv[1]
step = make_step(4, heads=64, head_dim=128, max_model_len=8192, k=512, device="cuda", short_rows=False)
state, md = make_state(step), step.metadata
print(type(state.scorer).__name__, flush=True)
md.seq_lens.fill_(8192)
ix.CHECK_METADATA_VALUES = case == "stale_checked"
plan = ix.plan_decode_rows(state, md, ix.SingleRank())
if case != "current":
    md.seq_lens.fill_(64)  # written between plan and finish
try:
    ix.finish_decode_rows(state, step.q, step.weights, plan, ix.SingleRank())
    torch.cuda.synchronize()
    print("finished", flush=True)
except ValueError as e:
    print("refused:", e, flush=True)
"""


def run(case: str, timeout_s: float) -> dict:
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, timeout=timeout_s)
        rc, out = done.returncode, (done.stdout + done.stderr).strip().splitlines()
        timed_out = False
    except subprocess.TimeoutExpired as e:
        rc, timed_out = None, True
        out = ((e.stdout or b"").decode() + (e.stderr or b"").decode()).strip().splitlines()
    return {"case": case, "timeout_s": timeout_s, "timed_out": timed_out, "returncode": rc,
            "seconds": round(time.perf_counter() - start, 2), "output_tail": out[-4:]}


def main() -> None:
    results = [run("current", 120), run("stale", 30), run("stale_checked", 120)]
    from benchmarks.common import gpu_info

    text = json.dumps({"probe": "stale_schedule", "info": gpu_info(), "cwd": os.getcwd(), "results": results},
                      indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
