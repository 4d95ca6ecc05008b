#!/usr/bin/env bash
# limit: 150
# sparse_mla_decode checks of a final tree: the AOT kernel's and the runtime's GPU tests, then
# compute-sanitizer memcheck/racecheck/synccheck (in parallel) on small launches of both widths with
# and without sinks. The benchmark is gpu/jobs/mla_bench.sh (run it after this job).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider -rs"
echo "== AOT kernel vs reference"
timeout 50 $PYTEST tests/test_sparse_mla_gpu.py -k "not triton" 2>&1 | tee "$JOB_OUT/pytest_kernel.txt" | tail -n 4
echo "== runtime GPU tests"
timeout 40 $PYTEST tests/test_runtime_gpu.py 2>&1 | tee "$JOB_OUT/pytest_runtime.txt" | tail -n 4
echo "== compute-sanitizer memcheck, racecheck, synccheck (in parallel)"
for tool in memcheck racecheck synccheck; do
  timeout 50 compute-sanitizer --tool "$tool" --error-exitcode 3 \
    python3 gpu/jobs/mla_support_sanitize.py 5 > "$JOB_OUT/sanitizer_$tool.txt" 2>&1 &
done
for tool in memcheck racecheck synccheck; do wait -n; done
for tool in memcheck racecheck synccheck; do echo "-- $tool"; tail -n 4 "$JOB_OUT/sanitizer_$tool.txt"; done
