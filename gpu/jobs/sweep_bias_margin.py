"""How far the AOT kernel's systematic error is from the same-precision emulation's on the sparse-MLA random sweep's
calls (H200): the margin behind assert_matches' check |bias(kernel) - bias(emulation)| <= bias_limit(active tokens).
Run from the repository's root.

Replays test_sparse_mla_gpu.test_random_calls_match_the_reference's draws (the same seeds) and writes, per call with
an active token, the two projections (_bias against the reference) as JSON lines to the path given, then a summary
line: the largest |bias(emulation)| and the largest difference, over all calls and over those of 1 to 13 tokens."""

import json
import random
import sys

sys.path.insert(0, "tests")
import test_sparse_mla_gpu as G

from benchmarks.common import gpu_info
from runtime.reference import sparse_mla_active, sparse_mla_decode_reference
from runtime.sparse_mla import sparse_mla_decode, supports_sparse_mla


def main(path, calls):
    rng = random.Random(G.FUZZ_SEED)
    rows = []
    for i in range(calls):
        T, width, (swa_rows, comp_rows), with_sinks, scales = draw = G.fuzz_draw(rng, G._max_tokens)
        args, sinks = G.fuzz_case(i, draw)
        active = int(sparse_mla_active(args[3], args[4], swa_rows, comp_rows).any(1).sum())
        if not active:
            continue
        assert supports_sparse_mla(*args, sinks=sinks), "the AOT kernel must take the call (not the reference)"
        got = sparse_mla_decode(*args, sinks=sinks, **scales).float()
        ref = sparse_mla_decode_reference(*args, sinks=sinks, **scales).float()
        emu = G.emulate(*args, sinks=sinks, p_dtype=G.KERNEL_P_DTYPE, **scales).float()
        rows.append({"call": i, "T": T, "width": width, "pools": [swa_rows, comp_rows], "sinks": with_sinks,
                     "active_tokens": active, "limit": G.bias_limit(active), **scales,
                     "bias_kernel": G._bias(got, ref), "bias_emulation": G._bias(emu, ref)})
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
        summary = {"calls": len(rows)}
        for name, subset in (("all", rows), ("1_to_13_tokens", [r for r in rows if r["T"] <= 13])):
            if not subset:
                continue
            summary[name] = {
                "calls": len(subset),
                "max_abs_bias_emulation": max(abs(r["bias_emulation"]) for r in subset),
                "max_abs_bias_kernel": max(abs(r["bias_kernel"]) for r in subset),
                "max_abs_difference": max(abs(r["bias_kernel"] - r["bias_emulation"]) for r in subset),
                "max_difference_over_limit": max(abs(r["bias_kernel"] - r["bias_emulation"]) / r["limit"]
                                                 for r in subset),
            }
        f.write(json.dumps({"summary": summary, "info": gpu_info()}) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1500)
