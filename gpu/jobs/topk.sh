#!/usr/bin/env bash
# limit: 300
# decode_topk: kernel vs reference (marker gpu), then the benchmark (quick grid unless TOPK_FULL=1).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
run timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "every_cluster or graph or padded or out_row or fallback" --maxfail=3 2>&1 | tail -40
run timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "grid or adversarial" --maxfail=6 2>&1 | tail -60
run timeout 80 python3 benchmarks/bench_topk.py --quick --out "$JOB_OUT/bench_topk_quick.json"
