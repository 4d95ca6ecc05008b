#!/usr/bin/env bash
# limit: 150
# runtime.load() cold start after the loader's cost work: the benchmark first (7 fresh processes per
# mode, with and without the cuda.bindings import inside load(), then 2 per mode with
# SPARSE_DECODE_AOT_LOAD_PROFILE=1 for the phase breakdown; JSON written after each step), then the
# runtime GPU tests (crafted caches refused by the driver checks included) and verify.
set -x
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
t0=$(date +%s)
python3 benchmarks/bench_runtime.py "$JOB_OUT/runtime.json" --runs 7 --profile-runs 2 2>&1 | tail -40
echo "bench took $(( $(date +%s) - t0 ))s"
python3 -m pytest -q -m gpu tests/test_runtime_gpu.py -rs 2>&1 | tail -15
echo "tests done at $(( $(date +%s) - t0 ))s"
python3 -m runtime verify 2>&1 | tail -6
echo "verify done at $(( $(date +%s) - t0 ))s"
