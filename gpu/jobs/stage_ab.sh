#!/usr/bin/env bash
# limit: 300
# Candidate caches carried as .gl/cand*: decode_topk's GPU tests and sanitizers on each, or on those STAGE_AB_CHECK
# names (gpu/tools/topk_checks.sh with SPARSE_DECODE_AOT_CACHE naming it), then topk_roots.py's sets
# STAGE_AB_SETS (default: long row) on "." beside them, one process a set.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
top=$JOB_OUT
# STAGE_AB_CHECK names the candidates that get the checks (default: every .gl/cand*).
for c in ${STAGE_AB_CHECK:-$(ls -d .gl/cand* 2>/dev/null)}; do
  echo "=== checks on $c"
  (export SPARSE_DECODE_AOT_CACHE=$PWD/$c JOB_OUT=$top/$(basename "$c"); mkdir -p "$JOB_OUT"; topk_checks)
done
for set in ${STAGE_AB_SETS:-long row}; do
  TOPK_ROOTS_CASES=$set timeout 90 python3 gpu/jobs/topk_roots.py "$top/topk_roots_$set.json" . \
    $(ls -d .gl/cand* 2>/dev/null) 2>&1 | tail -2
done
