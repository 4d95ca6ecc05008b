#!/usr/bin/env bash
# limit: 200
# sparse_mla_decode benchmark alone (every cell of issue 3's grid, Triton peer swept), JSON + table to $JOB_OUT.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
timeout 190 python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json"
echo "benchmark rc=$?"
