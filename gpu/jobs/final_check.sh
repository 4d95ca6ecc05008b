#!/usr/bin/env bash
# limit: 200
# Lead's last pass: runtime tests and benchmark, then compute-sanitizer memcheck of the loader and of
# each family's small-case script (earlier rounds' memcheck counts included the loader's probing of
# cuFuncGetParamInfo past the last parameter, a failing API call by design, since removed).
set -xo pipefail  # a step's failure is its status, not tail's
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_REQUIRE_GPU=1
failed=()
python3 -m runtime verify || failed+=("verify")
python3 -m pytest -q -m gpu tests/test_runtime_gpu.py -rs 2>&1 | tail -5 || failed+=("runtime GPU tests")
python3 benchmarks/bench_runtime.py "$JOB_OUT/runtime.json" --profile 2>&1 | tail -60 || failed+=("bench_runtime")
# --error-exitcode: memcheck's own status is 0 whatever it reports
S="${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer} --tool memcheck --error-exitcode 3"
timeout 40 $S --print-limit 5 python3 -m runtime verify 2>&1 | tail -4 || failed+=("memcheck: verify")
timeout 40 $S --report-api-errors no --print-limit 5 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -4 \
  || failed+=("memcheck: decode_topk")
timeout 40 $S --report-api-errors no --print-limit 5 python3 gpu/jobs/mla_support_sanitize.py 2>&1 | tail -6 \
  || failed+=("memcheck: sparse MLA")
[ ${#failed[@]} -eq 0 ] || echo "final_check: FAILED: ${failed[*]}"
[ ${#failed[@]} -eq 0 ]
