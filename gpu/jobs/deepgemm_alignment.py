"""What DeepGEMM's paged MQA logits do with inputs that pass the scorer's checks but start off a 16-byte boundary.

Each case runs in a fresh process (a device-side fault is sticky: it ends the context), scores 8 rows of 64 heads
of 128 over 8K tokens through ``DeepGemmScorer.logits(..., checked=True)`` (the scorer's own checks skipped, as the
indexer's finish calls it), synchronizes, and reports: the exception (type, first line) or the logits' agreement
with the torch scorer, and whether the context still runs a kernel afterwards. The indexer's checks are built from
this record: a misalignment that DeepGEMM turns into a fault or wrong logits must be refused before the plan's reset.

    python3 gpu/jobs/deepgemm_alignment.py --out $OUT/deepgemm_alignment.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# (tensor, byte offset from a 256-byte aligned allocation)
CASES = [("none", 0), ("q", 1), ("q", 4), ("q", 8), ("weights", 4), ("weights", 8), ("cache", 4), ("cache", 8),
         ("seq_lens", 4), ("block_table", 4)]


def _shifted(t, offset: int):
    """A copy of ``t`` (contiguous, same shape and dtype) whose first byte sits ``offset`` bytes past an aligned one."""
    import torch

    raw = torch.empty(t.nbytes + 256, dtype=torch.uint8, device=t.device)
    view = raw[offset: offset + t.nbytes].view(t.dtype).view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 256 == offset and view.is_contiguous()
    return view


def run_case(name: str, offset: int) -> dict:
    import torch

    sys.path.insert(0, ".")
    from runtime.scoring import DeepGemmScorer, TorchScorer
    from tests.indexer_cases import make_step

    step = make_step(8, heads=64, head_dim=128, max_model_len=8192, k=512, device="cuda", seed=3)
    md = step.metadata
    tensors = {"q": step.q, "weights": step.weights, "cache": step.state_args["index_k_cache"],
               "seq_lens": md.seq_lens, "block_table": md.block_table}
    if name != "none":
        tensors[name] = _shifted(tensors[name], offset)
    scorer = DeepGemmScorer()
    schedule = scorer.schedule(tensors["seq_lens"])
    record = {"tensor": name, "offset": offset}
    try:
        got = scorer.logits(tensors["q"], tensors["weights"], tensors["cache"], tensors["seq_lens"],
                            tensors["block_table"], schedule, 8192, checked=True)
        torch.cuda.synchronize()
        want = TorchScorer().logits(step.q, step.weights, step.state_args["index_k_cache"], md.seq_lens,
                                    md.block_table, None, 8192)
        cols = torch.arange(8192, device="cuda")[None, :] < md.seq_lens[:, None]
        err = (got[:, :8192] - want).abs().masked_fill(~cols, 0).max().item()
        record.update(outcome="ran", max_abs_err=err, scale=want.abs().max().item())
    except Exception as exc:  # noqa: BLE001 - the record is what was raised
        record.update(outcome="raised", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    try:
        torch.ones(4, device="cuda").sum().item()
        record["context_ok"] = True
    except Exception as exc:  # noqa: BLE001
        record.update(context_ok=False, context_error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case[0], int(args.case[1]))))
        return
    records = []
    for name, offset in CASES:
        proc = subprocess.run([sys.executable, __file__, "--out", args.out, "--case", name, str(offset)],
                              capture_output=True, text=True, timeout=300, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        rec = json.loads(lines[-1]) if lines else {"tensor": name, "offset": offset, "outcome": "process died",
                                                    "rc": proc.returncode, "stderr": proc.stderr[-600:]}
        print(rec, flush=True)
        records.append(rec)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.common import gpu_info

    with open(args.out, "w") as f:
        json.dump({"info": gpu_info(), "cases": records}, f, indent=1)


if __name__ == "__main__":
    main()
