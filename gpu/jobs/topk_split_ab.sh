#!/usr/bin/env bash
# limit: 400
# The working tree's decode_topk (every kernel's short-slice pass split branch-free) against the last commit's
# cache in .gl/head: the working tree's GPU tests and sanitizers, both caches on topk_roots.py's "short" and "row"
# sets, then the working tree's benchmark and, with the DeepGEMM wheel carried, the indexer's tests and benchmark.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
topk_checks
for set in short row; do
  TOPK_ROOTS_CASES=$set run timeout 120 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_${set}_ab.json" . .gl/head 2>&1 | tail -3
done
run timeout 80 python3 benchmarks/bench_topk.py --budget 70 --no-sweep --out "$JOB_OUT/bench_topk.json" 2>&1 | tail -4
if ls .whl/*.whl >/dev/null 2>&1; then
  ROUND_CAP=110 bash gpu/jobs/indexer.sh 2>&1 | grep -E "passed|failed|rows=|ERROR SUMMARY|rc=" | head -30
fi
