#!/usr/bin/env bash
# limit: 60
# sparse_mla_decode AOT kernel vs the reference and the runtime's GPU tests (after a host-side launch change).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Both cut to what is left of the limit (gpu/tools/job_limit.sh): their 40 + 30 s came to more than its 60.
source gpu/tools/job_limit.sh
timeout "$(cap 40)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sparse_mla_gpu.py -k "not triton" 2>&1 \
  | tail -3
timeout "$(cap 30)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_runtime_gpu.py 2>&1 | tail -3
