#!/usr/bin/env bash
# limit: 420
# Staged outputs (fourteenth session): decode_topk's GPU tests and sanitizers on .gl/cand_so (a CTA without a
# list but CTA 0 stages its above-bin output indices and writes them between the cluster barrier's arrive and
# wait), then topk_roots.py's short, long and twin sets on "." beside it, one process a set.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
top=$JOB_OUT
echo "=== checks on .gl/cand_so"
(export SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand_so JOB_OUT=$top/cand_so; mkdir -p "$JOB_OUT"; topk_checks)
for set in short long twin; do
  TOPK_ROOTS_CASES=$set timeout 100 python3 gpu/jobs/topk_roots.py "$top/topk_roots_$set.json" . .gl/cand_so \
    2>&1 | tail -2
done
