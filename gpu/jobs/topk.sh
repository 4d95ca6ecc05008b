#!/usr/bin/env bash
# limit: 110
# decode_topk: kernel vs reference (marker gpu), then the benchmark (targets' cells first, within a time budget).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
run timeout 25 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "every_cluster or graph or padded or out_row or fallback" --maxfail=3 2>&1 | tail -25
run timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "grid or adversarial" --maxfail=4 2>&1 | tail -40
run timeout 40 python3 benchmarks/bench_topk.py --budget 20 --out "$JOB_OUT/bench_topk.json"
