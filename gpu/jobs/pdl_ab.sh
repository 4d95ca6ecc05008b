#!/usr/bin/env bash
# limit: 150
# Programmatic dependent launch, A/B in one process (topk_roots.py, case sets "long" and "row"): the working
# tree's cache (wait, then launch_dependents at once) beside the carried .gl/head (the cache before PDL) and
# any .gl/cand* (e.g. launch_dependents only after step 1).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
for set in long row; do
  TOPK_ROOTS_CASES=$set timeout 70 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_$set.json" . \
    $(ls -d .gl/head .gl/cand* 2>/dev/null) 2>&1 | tail -3
done
