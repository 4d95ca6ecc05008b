#!/usr/bin/env bash
# limit: 200
# After host-side changes not yet run on the GPU: decode_topk's GPU tests and sanitizers (committed
# cache), sparse_mla's and the runtime's GPU tests. The indexer job runs beside it.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
# The checks' 205 s and mla_tests.sh's 60 came to more than its 200: each step is cut to what is left of the limit
# (gpu/tools/job_limit.sh, which topk_checks.sh sources), mla_tests.sh given what is left as its own.
source gpu/tools/topk_checks.sh
topk_checks
LIMIT=$(cap 60) bash gpu/jobs/mla_tests.sh
