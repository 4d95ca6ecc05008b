#!/usr/bin/env bash
# limit: 200
# After host-side changes not yet run on the GPU: decode_topk's GPU tests and sanitizers (committed
# cache), sparse_mla's and the runtime's GPU tests. The indexer job runs beside it.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
topk_checks
bash gpu/jobs/mla_tests.sh
