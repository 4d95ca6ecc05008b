#!/usr/bin/env bash
# limit: 240
# decode_topk candidate build (.gl/cand, carried: a full cache root, e.g. from
# `python build_kernels.py --arch sm_90a --out .gl/cand`): GPU tests and sanitizers on it, then it and
# any other .gl/cand* roots timed beside the committed cache on the cases of gpu/jobs/topk_roots.py.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
export SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand
topk_checks
unset SPARSE_DECODE_AOT_CACHE
run timeout 100 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots.json" . $(ls -d .gl/cand* 2>/dev/null) 2>&1 | tail -12
