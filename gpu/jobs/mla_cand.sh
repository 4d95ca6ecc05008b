#!/usr/bin/env bash
# limit: 570
# sparse_mla_decode candidates: the committed cache and every .gl/mlacand* cache (built from a
# changed source) checked against the reference and timed L2-warm beside each other (one process a
# cache, two rounds, alternating order); .gl/mlacand*_tl caches are timeline builds
# (SPARSE_MLA_EXPERIMENT=timeline) whose per-step clocks are printed instead.
set -u
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
S=gpu/jobs/mla_kernel_smoke.py
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh), the benchmark's rounds given what is left as
# their own: every cache's checks (3 x 40 s) and timings (2 x 40), and with CAND_BENCH its two rounds (2 x 60), add
# up past 570 s from three caches on (two with CAND_BENCH).
source gpu/tools/job_limit.sh
caches=("$PWD"); tls=()
for d in .gl/mlacand*; do
  [ -f "$d/manifests/sm_90a.json" ] || continue
  case "$d" in *_tl) tls+=("$d") ;; *) caches+=("$PWD/$d") ;; esac
done
for c in "${caches[@]}"; do
  echo "== checks: $c"
  SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 40)" python3 $S check 640 1 1 12 49 || echo "check rc=$?"
  SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 40)" python3 $S check 640 0 12 || echo "check rc=$?"
  SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 40)" python3 $S check 128 1 1 12 49 || echo "check rc=$?"
done
for round in 1 2; do
  for c in "${caches[@]}"; do
    echo "== timing round $round: $c"
    SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 40)" python3 $S time || echo "time rc=$?"
  done
done
for c in "${tls[@]}"; do
  echo "== timeline: $c"
  SPARSE_DECODE_AOT_CACHE=$PWD/$c timeout "$(cap 30)" python3 $S timeline || echo "timeline rc=$?"
  SPARSE_DECODE_AOT_CACHE=$PWD/$c timeout "$(cap 30)" python3 $S timeline_cold || echo "timeline_cold rc=$?"
done
# The benchmark's own timing (KV pools rotated, and all inputs cold), kernel only, every cache, twice.
if [ -n "${CAND_BENCH:-}" ]; then
  ROUNDS=2 BENCH_OUT=$JOB_OUT MLA_BENCH_ARGS=$CAND_BENCH LIMIT=$(cap 360) bash gpu/jobs/mla_bench_rounds.sh \
    "${caches[@]}"
fi
