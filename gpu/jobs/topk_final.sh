#!/usr/bin/env bash
# limit: 240
# decode_topk on the committed tree: GPU tests (every variant too) and compute-sanitizer, then the benchmark
# without the cluster sweep (JSON + table to $JOB_OUT; each cell also in stream order, without PDL).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which topk_checks.sh sources): the checks' 205 s
# and the benchmark's 150 came to 355 s against its 240.
source gpu/tools/topk_checks.sh
topk_checks
run timeout "$(cap 150)" python3 benchmarks/bench_topk.py --budget 130 --no-sweep --out "$JOB_OUT/bench_topk.json" \
  2>&1 | tail -8
