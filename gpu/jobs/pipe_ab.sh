#!/usr/bin/env bash
# limit: 420
# Pipelined marked-gather rounds (fourteenth session): decode_topk's GPU tests and sanitizers on .gl/cand_pipe
# (round r + 1's loads issued before round r's split), then topk_roots.py's long and twin sets on "." beside
# .gl/cand_pipe and .gl/cand_pipe2 (two rounds ahead), one process a set.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
top=$JOB_OUT
echo "=== checks on .gl/cand_pipe"
(export SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand_pipe JOB_OUT=$top/cand_pipe; mkdir -p "$JOB_OUT"; topk_checks)
for set in long twin; do
  TOPK_ROOTS_CASES=$set timeout 100 python3 gpu/jobs/topk_roots.py "$top/topk_roots_$set.json" . .gl/cand_pipe \
    .gl/cand_pipe2 2>&1 | tail -2
done
