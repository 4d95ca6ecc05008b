#!/usr/bin/env bash
# limit: 90
# decode_topk: cluster sizes 1, 2 and 4 side by side on short rows (the op's routing), for every root.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
TOPK_ROOTS_CASES=small timeout 80 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_small.json" . $(ls -d .gl/cand* 2>/dev/null) 2>&1 | tail -20
