#!/usr/bin/env bash
# limit: 560
# decode_topk's step-1 table (long CTA-tile slices re-read only the marked groups), one call:
#   decode_topk's GPU tests and sanitizers on the working tree's cache (gpu/tools/topk_checks.sh);
#   topk_roots.py's case sets ROOTS_SETS (default "long") on "." beside .gl/head (the last commit's cache)
#   and every carried .gl/cand* root;
#   the benchmark (bench_topk.py, no sweep);
#   with the DeepGEMM wheel carried (.whl): the indexer's GPU tests and benchmark (gpu/jobs/indexer.sh).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
[ -z "${SKIP_CHECKS:-}" ] && topk_checks
others=$(ls -d .gl/head .gl/cand* 2>/dev/null)
for set in ${ROOTS_SETS:-long}; do
  TOPK_ROOTS_CASES=$set run timeout 200 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_$set.json" . $others 2>&1 \
    | tail -5
done
run timeout 90 python3 benchmarks/bench_topk.py --budget 80 --no-sweep --out "$JOB_OUT/bench_topk.json" 2>&1 | tail -8
if ls .whl/*.whl >/dev/null 2>&1; then
  ROUND_CAP=100 bash gpu/jobs/indexer.sh 2>&1 | tail -40
fi
