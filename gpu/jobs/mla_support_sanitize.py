"""Launch the sparse-MLA kernel for both widths, with and without sinks, on small batches.

Run under compute-sanitizer (memcheck, racecheck, synccheck) by gpu/jobs/mla_support.sh; the
inputs mix the masking cases of tests/test_sparse_mla_gpu.py (indices past the pools, -1, empty
tokens, whole chunks masked) so every branch of the kernel runs. Prints one line per launch, then
"N/M launches finite" once all ran (gpu/tools/mla_sanitize.sh's verdict reads it); exits non-zero where an output
is not finite.
"""

import sys

import torch

sys.path.insert(0, ".")
from runtime.sparse_mla import sparse_mla_decode, supports_sparse_mla  # noqa: E402
from tests.test_sparse_mla_gpu import (BMM1_SCALE, BMM2_SCALE, COMP_ROWS, SWA_ROWS, make_case,  # noqa: E402
                                      make_edge_case)

T = int(sys.argv[1]) if len(sys.argv) > 1 else 7
launches = finite_launches = 0
for width in (128, 640):
    for with_sinks in (True, False):
        args, sinks = make_case(T, width, seed=width + with_sinks)
        sinks = sinks if with_sinks else None
        assert supports_sparse_mla(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE), "no kernel"
        out = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out.float()).all())
        launches, finite_launches = launches + 1, finite_launches + finite
        print(f"width {width} sinks {with_sinks}: T={T} finite={finite}", flush=True)

# make_edge_case: lens past the width and negative, indices -2 / INT32_MIN / INT32_MAX / exactly a pool's end, and
# empty pools (a zero-row pool's pointer may be anything): no input may make the kernel read outside a pool.
for width in (128, 640):
    for with_sinks in (True, False):
        for rows in ((SWA_ROWS, COMP_ROWS), (SWA_ROWS, 0), (0, COMP_ROWS)):
            args, sinks = make_edge_case(width, swa_rows=rows[0], comp_rows=rows[1], seed=width)
            sinks = sinks if with_sinks else None
            assert supports_sparse_mla(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE), "no kernel"
            out = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
            torch.cuda.synchronize()
            finite = bool(torch.isfinite(out.float()).all())
            launches, finite_launches = launches + 1, finite_launches + finite
            print(f"edge width {width} sinks {with_sinks} pools {rows}: finite={finite}", flush=True)
# The sanitizers' summaries count device faults only: a launch whose output is not finite (the reference tests assert
# it is) fails here, and the count shows that every launch ran (a run cut short by its timeout prints no count).
print(f"{finite_launches}/{launches} launches finite", flush=True)
sys.exit(0 if finite_launches == launches else 1)
