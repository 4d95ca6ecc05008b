#!/usr/bin/env bash
# limit: 360
# The sparse_mla_decode A/B timing loop shared by mla_bench_ab.sh and mla_cand.sh: benchmarks/bench_sparse_mla.py
# (KV pools rotated past the L2; kernel only, no peers) on every cache given as an argument, ROUNDS rounds (default
# 3), the order reversed every second round so that no cache always runs first. MLA_BENCH_ARGS picks the cells;
# BENCH_OUT (default /tmp) gets each run's JSON as bench_<cache>_<round>.json.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each run's 60 s cut to what is left of the limit (gpu/tools/job_limit.sh; a job that runs this one passes what it
# has left): ROUNDS x caches runs add up past 360 s from three caches on.
source gpu/tools/job_limit.sh
caches=("$@")
for round in $(seq 1 "${ROUNDS:-3}"); do
  order=("${caches[@]}"); [ $((round % 2)) -eq 0 ] && order=($(printf '%s\n' "${caches[@]}" | tac))
  for c in "${order[@]}"; do
    echo "== bench round $round: $c"
    SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 60)" python3 benchmarks/bench_sparse_mla.py --no-triton \
      --no-reference --out "${BENCH_OUT:-/tmp}/bench_$(basename "$c")_$round.json" \
      ${MLA_BENCH_ARGS:---widths 640 128 --tokens 1 12 48} | grep "^w="
  done
done
