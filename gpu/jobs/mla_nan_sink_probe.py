"""What a NaN sink gives on the H200 (sparse_mla_decode documents it as undefined; the reference gives NaN).

The host op cannot check the sinks' values (they live on the device; reading them back would wait for it), so a
NaN sink reaches the kernel. This probe records, per width, the NaN head's output (NaN count, largest magnitude)
and whether every other head equals the same call's output with that sink at 0.
Usage: ``python3 gpu/jobs/mla_nan_sink_probe.py --out FILE.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import gpu_info, write_json
from runtime.reference import sparse_mla_decode_reference
from runtime.sparse_mla import sparse_mla_decode
from tests.test_sparse_mla_gpu import BMM1_SCALE, BMM2_SCALE, make_case


def probe(width: int, head: int = 3) -> dict:
    args, sinks = make_case(12, width, seed=5)
    kw = {"bmm1_scale": BMM1_SCALE, "bmm2_scale": BMM2_SCALE}
    nan_sinks = sinks.clone()
    nan_sinks[head] = float("nan")
    zero_sinks = sinks.clone()
    zero_sinks[head] = 0.0
    got = sparse_mla_decode(*args, sinks=nan_sinks, **kw).float()
    base = sparse_mla_decode(*args, sinks=zero_sinks, **kw).float()
    want = sparse_mla_decode_reference(*args, sinks=nan_sinks, **kw).float()
    torch.cuda.synchronize()
    others = [h for h in range(16) if h != head]
    active = got[:, head].abs().amax(dim=1) > 0
    return {
        "width": width, "nan_head": head,
        "kernel_nan_elements": int(got[:, head].isnan().sum()),
        "kernel_largest_magnitude": float(got[:, head].nan_to_num(0.0).abs().max()),
        "tokens_with_nonzero_output": int(active.sum()),
        "reference_nan_elements": int(want[:, head].isnan().sum()),
        "elements_per_head": got[:, head].numel(),
        "other_heads_equal_zero_sink_call": bool(torch.equal(got[:, others], base[:, others])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = [probe(width) for width in (128, 640)]
    for r in results:
        print(r)
    write_json(args.out, {"bench": "mla_nan_sink_probe", "info": gpu_info(), "results": results})


if __name__ == "__main__":
    main()
