#!/usr/bin/env bash
# limit: 320
# sparse_mla_decode benchmark alone (every cell of issue 3's grid, Triton peer swept), JSON + table to $JOB_OUT.
# BENCH_ARGS narrows it (e.g. "--widths 640 --tokens 12").
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Alone, 310 s of its 320; run by another job, what that job has left (gpu/tools/job_limit.sh).
source gpu/tools/job_limit.sh
timeout "$(cap 310)" python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json" ${BENCH_ARGS:-}
rc=$?
echo "benchmark rc=$rc"
exit "$rc"  # (it was the echo's 0: a benchmark that crashed or ran out of time passed benchmarks_both.sh)
