#!/usr/bin/env bash
# The two benchmark grids the issues set on an H200 (decode_topk, then sparse MLA while more than 150 s of the job's
# LIMIT are left), run by a job that finds itself on one. Usage: bash gpu/tools/h200_grids.sh OUTDIR SECONDS_USED
OUTDIR=$1; used=$2
echo "=== decode_topk grid (${used}s)"
timeout 120 python3 benchmarks/bench_topk.py --out "$OUTDIR/decode_topk.json" 2>&1 | tail -6
left=$((${LIMIT:-560} - used - SECONDS - 10))
if [ "$left" -gt 150 ]; then
  echo "=== sparse-MLA grid ($((used + SECONDS))s)"
  timeout "$left" python3 benchmarks/bench_sparse_mla.py --out "$OUTDIR/bench_sparse_mla.json" 2>&1 | tail -14
fi
