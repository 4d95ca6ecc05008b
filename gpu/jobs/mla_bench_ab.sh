#!/usr/bin/env bash
# limit: 420
# sparse_mla_decode candidate A/B by the benchmark's own timing (KV pools rotated past the L2; kernel only):
# the committed cache and every full .gl/mlacand[0-9] cache, ROUNDS rounds in alternating order, after each
# candidate's GPU tests (tests/test_sparse_mla_gpu.py against the reference).
# BENCH_OUT (default /tmp) gets the rounds' files packed as mla_ab_rounds.tgz.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh), the rounds given what is left as their own: a
# candidate's tests (120 s) and the rounds (3 x 2 x 60 s with one candidate) came to 480 s against its 420.
source gpu/tools/job_limit.sh
caches=("$PWD")
for d in "$PWD"/.gl/mlacand[0-9]; do [ -f "$d/manifests/sm_90a.json" ] && caches+=("$d"); done
for c in "${caches[@]:1}"; do
  echo "== tests: $c"
  SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 120)" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_sparse_mla_gpu.py -k "not triton" 2>&1 | tail -2
done
# The rounds' files (a JSON and a table per cache and round: 12 with one candidate) packed into one, mla_ab_rounds.tgz:
# a device call brings back 8 files, and BENCH_OUT=$OUT lost four rounds and the job's log to that limit.
# Packed on exit, so that a run cut by an outer timeout still brings back the rounds it finished.
rounds=$(mktemp -d)
trap 'tar czf "${BENCH_OUT:-/tmp}/mla_ab_rounds.tgz" -C "$rounds" . && rm -rf "$rounds"' EXIT
LIMIT=$(cap 360) BENCH_OUT=$rounds bash gpu/jobs/mla_bench_rounds.sh "${caches[@]}"
