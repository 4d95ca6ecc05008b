#!/usr/bin/env bash
# limit: 90
# decode_topk: the same work per SM at one and at two CTAs an SM (is step 1 latency-bound?).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
TOPK_ROOTS_CASES=occupancy timeout 80 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_occ.json" . 2>&1 | tail -12
