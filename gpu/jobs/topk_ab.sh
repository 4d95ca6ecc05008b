#!/usr/bin/env bash
# limit: 120
# decode_topk A/B: every carried candidate root (.gl/cand*) timed beside the committed cache.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
roots=(. $(ls -d .gl/cand* 2>/dev/null))
echo "+ roots ${roots[*]}"
timeout 100 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots.json" "${roots[@]}" 2>&1 | tail -12
