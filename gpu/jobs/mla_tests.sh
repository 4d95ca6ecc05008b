#!/usr/bin/env bash
# limit: 60
# sparse_mla_decode AOT kernel vs the reference and the runtime's GPU tests (after a host-side launch change).
set -uo pipefail  # a pytest failure is the step's status, not tail's
export PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_REQUIRE_GPU=1
# Both cut to what is left of the limit (gpu/tools/job_limit.sh): their 40 + 30 s came to more than its 60.
source gpu/tools/job_limit.sh
failed=()
timeout "$(cap 40)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sparse_mla_gpu.py -k "not triton" 2>&1 \
  | tail -3 || failed+=("sparse MLA GPU tests")
timeout "$(cap 30)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_runtime_gpu.py 2>&1 | tail -3 \
  || failed+=("runtime GPU tests")
[ ${#failed[@]} -eq 0 ] || echo "mla_tests: FAILED: ${failed[*]}"
[ ${#failed[@]} -eq 0 ]
