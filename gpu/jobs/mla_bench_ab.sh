#!/usr/bin/env bash
# limit: 420
# sparse_mla_decode candidate A/B by the benchmark's own timing (KV pools rotated past the L2; kernel only):
# the committed cache and every full .gl/mlacand[0-9] cache, ROUNDS rounds in alternating order, after each
# candidate's GPU tests (tests/test_sparse_mla_gpu.py against the reference).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
caches=("$PWD")
for d in "$PWD"/.gl/mlacand[0-9]; do [ -f "$d/manifests/sm_90a.json" ] && caches+=("$d"); done
for c in "${caches[@]:1}"; do
  echo "== tests: $c"
  SPARSE_DECODE_AOT_CACHE=$c timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sparse_mla_gpu.py \
    -k "not triton" 2>&1 | tail -2
done
bash gpu/jobs/mla_bench_rounds.sh "${caches[@]}"
