#!/usr/bin/env bash
# The two benchmark grids the issues set on an H200 (decode_topk, then sparse MLA while more than 150 s of the job's
# time are left), run by a job that finds itself on one. Usage: bash gpu/tools/h200_grids.sh OUTDIR SECONDS_USED
# SECONDS_LEFT (the job's time left less its packing: `$(time_left)` of gpu/tools/job_limit.sh). The decode_topk grid's
# 120 s is cut to that too: it ran whole whatever was left, past the job's limit.
OUTDIR=$1; used=$2; left=${3:?the seconds left of the job (job_limit.sh time_left)}  # (unset: timeout 0, none)
echo "=== decode_topk grid (${used}s)"
timeout $((left < 120 ? left : 120)) python3 benchmarks/bench_topk.py --out "$OUTDIR/decode_topk.json" 2>&1 | tail -6
left=$((left - SECONDS))
if [ "$left" -gt 150 ]; then
  echo "=== sparse-MLA grid ($((used + SECONDS))s)"
  timeout "$left" python3 benchmarks/bench_sparse_mla.py --out "$OUTDIR/bench_sparse_mla.json" 2>&1 | tail -14
fi
