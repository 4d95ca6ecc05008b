#!/usr/bin/env bash
# limit: 150
# decode_topk (final mode): GPU tests, then the benchmark JSON, then compute-sanitizer on small cases.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
run timeout 30 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "not every_variant" 2>&1 | tail -40
run timeout 15 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k every_variant 2>&1 | tail -20
run timeout 40 python3 benchmarks/bench_topk.py --budget 20 --out "$JOB_OUT/bench_topk.json" 2>&1 | tail -120
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run timeout 20 "$SAN" --tool memcheck --print-limit 20 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -8
run timeout 20 "$SAN" --tool synccheck --print-limit 20 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -8
run timeout 22 "$SAN" --tool racecheck --racecheck-report all --print-limit 20 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -12
