"""Does one DeepGEMM schedule take exactly runtime.scoring.MAX_SCHEDULE_ROWS rows? The bound (58,112) was read from
DeepGEMM 2.5's compiled host code (its schedule kernel keeps a 4-byte word a row, rounded up to 32 rows, in the arch's
232,448 bytes of shared memory, and asserts it), not run. Each case runs in a child process, since the assert is
expected to stop the process: the scorer's schedule at the bound (expected: a [num_sms + 1, 2] schedule, its last
entry the whole work), DeepGEMM's own call at the bound + 1 and + 32 (expected: the assert), and the scorer's refusal
at the bound + 1 (expected: a ValueError before DeepGEMM is called). Writes one JSON object to the path given.

Run from the checkout with DeepGEMM importable: python3 gpu/jobs/schedule_rows_probe.py $OUT/schedule_rows.json"""

from __future__ import annotations

import json
import subprocess
import sys
import time

CHILD = r"""
import json, sys, torch
import runtime.scoring as sc
case, rows = sys.argv[1], int(sys.argv[2])
seq_lens = torch.full((rows,), 4096, dtype=torch.int32, device="cuda")
scorer = sc.DeepGemmScorer()
if case == "scorer":
    try:
        s = scorer.schedule(seq_lens)
    except ValueError as e:
        print(json.dumps({"refused": str(e)[:200]}), flush=True)
        sys.exit(0)
else:  # DeepGEMM's own call, past the scorer's check
    s = scorer._dg.get_paged_mqa_logits_metadata(seq_lens.view(-1, 1), sc.BLOCK_KV, scorer.num_sms)
torch.cuda.synchronize()
print(json.dumps({"shape": list(s.shape), "num_sms": scorer.num_sms, "last": s[-1].tolist(),
                  "first": s[0].tolist()}), flush=True)
"""


def run(case: str, rows: int) -> dict:
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, case, str(rows)], check=False, capture_output=True,
                             text=True, timeout=120)
        result = {"returncode": out.returncode, "stdout": out.stdout[-1500:], "stderr": out.stderr[-1500:]}
    except subprocess.TimeoutExpired:
        result = {"timed_out": True}
    result.update(case=case, rows=rows, seconds=round(time.perf_counter() - start, 1))
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    import runtime.scoring as sc
    from benchmarks.common import gpu_info

    bound = sc.MAX_SCHEDULE_ROWS
    cases = [("scorer", bound), ("deepgemm", bound), ("deepgemm", bound + 1), ("deepgemm", bound + 32),
             ("scorer", bound + 1)]
    record = {"info": gpu_info(), "max_schedule_rows": bound, "cases": [run(case, rows) for case, rows in cases]}
    text = json.dumps(record, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
