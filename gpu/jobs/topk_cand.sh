#!/usr/bin/env bash
# limit: 240
# decode_topk candidate build (.gl/cand, carried: a full cache root, e.g. from
# `python build_kernels.py --arch sm_90a --out .gl/cand`): GPU tests and sanitizers on it, then it and
# any other .gl/cand* roots timed beside the committed cache on the cases of gpu/jobs/topk_roots.py.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
export SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand
run timeout 60 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "not every_variant" 2>&1 | tail -15
run timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k every_variant 2>&1 | tail -8
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run timeout 30 "$SAN" --tool memcheck --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -6
run timeout 30 "$SAN" --tool synccheck --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -3
timeout 45 "$SAN" --tool racecheck --racecheck-report hazard --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick > "$JOB_OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -B2 -A12 "Error: Race" "$JOB_OUT/racecheck.log" | head -40; tail -3 "$JOB_OUT/racecheck.log"
unset SPARSE_DECODE_AOT_CACHE
run timeout 100 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots.json" . $(ls -d .gl/cand* 2>/dev/null) 2>&1 | tail -12
