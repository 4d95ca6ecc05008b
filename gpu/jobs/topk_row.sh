#!/usr/bin/env bash
# limit: 420
# The short-row decode_topk kernel (one CTA a row) on the working tree's cache: decode_topk's GPU tests and
# sanitizers (gpu/tools/topk_checks.sh, row kernel included), the row kernel beside cluster sizes 1, 2 and 4
# (topk_roots.py's "row" set: the op's routing), then, with the DeepGEMM wheel carried (.whl), the indexer's
# GPU tests and benchmark (gpu/jobs/indexer.sh steps 1-3, INDEXER_STEPS=3).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
[ -z "${SKIP_CHECKS:-}" ] && topk_checks
TOPK_ROOTS_CASES=row run timeout 150 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_row.json" . 2>&1 | tail -70
if [ -n "${BENCH_TOPK:-}" ]; then
  run timeout 80 python3 benchmarks/bench_topk.py --budget 70 --no-sweep --out "$JOB_OUT/bench_topk.json" 2>&1 | tail -8
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  ROUND_CAP=150 bash gpu/jobs/indexer.sh 2>&1 | tail -40
fi
