#!/usr/bin/env bash
# limit: 420
# sparse_mla_decode cluster kernel: smoke checks against the reference (each config in its own process,
# so a fault or hang in one does not hide the others), a saved small case for offline debugging, rough
# timing. Runs the committed cache and, when present, experimental ones in exp_mla*/ (never committed).
set -u
S=gpu/jobs/mla_kernel_smoke.py
caches=(".")
for e in exp_mla exp_mla_push exp_mla_nopv exp_mla_tl exp_mla_push_tl; do [ -f $e/manifests/sm_90a.json ] && caches+=("$e"); done
for c in "${caches[@]}"; do
  export SPARSE_DECODE_AOT_CACHE=$PWD/$c
  echo "=== cache $c"
  hung=0
  # exp_mla_nopv leaves the second product out (wrong results by design): timing only.
  [ "$c" = exp_mla_nopv ] && { timeout 50 python3 $S time || echo "time rc=$?"; continue; }
  # exp_mla*_tl record per-step clocks over q (timing experiment).
  case $c in *_tl) timeout 40 python3 $S timeline || echo "timeline rc=$?"; continue;; esac
  for w in 128 640; do
    for s in 0 1; do
      [ $hung = 1 ] && continue
      timeout 40 python3 $S check $w $s 1 12 49; rc=$?
      [ $rc != 0 ] && echo "check w=$w sinks=$s: rc=$rc"
      [ $rc = 124 ] && hung=1 && echo "hang: skipping the rest of cache $c"
    done
  done
  [ $hung = 0 ] && { timeout 50 python3 $S time || echo "time rc=$?"; }
done
export SPARSE_DECODE_AOT_CACHE=$PWD
timeout 60 python3 $S save "$JOB_OUT" || echo "save rc=$?"
if command -v compute-sanitizer >/dev/null && [ "${MLA_SANITIZE:-0}" = 1 ]; then
  timeout 120 compute-sanitizer --tool memcheck python3 $S check 640 1 12 || echo "memcheck rc=$?"
fi
