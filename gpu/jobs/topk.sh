#!/usr/bin/env bash
# limit: 150
# decode_topk (final mode): GPU tests, then the benchmark JSON, then compute-sanitizer on small cases.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
run timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py 2>&1 | tail -40
run timeout 55 python3 benchmarks/bench_topk.py --budget 30 --out "$JOB_OUT/bench_topk.json" 2>&1 | tail -120
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck racecheck; do
  run timeout 17 "$SAN" --tool "$tool" --print-limit 20 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -8
done
