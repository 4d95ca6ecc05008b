#!/usr/bin/env bash
# limit: 300
# sparse_mla_decode cluster kernel: smoke checks against the reference (each config in its own process,
# so a fault or hang in one does not hide the others), rough timing beside the empty kernel of the same
# grid, and timing experiments. The committed cache (checked in R1) is only timed; experimental caches
# exp_mla*/ (never committed) are checked and timed: *_nopv leaves the second product out (timing only),
# *_tl records per-step clocks over q (timeline only).
set -u
S=gpu/jobs/mla_kernel_smoke.py
run_checks() {  # width sinks...
  local w=$1; shift
  for s in "$@"; do
    timeout 40 python3 $S check $w $s 1 12 49; rc=$?
    [ $rc != 0 ] && echo "check w=$w sinks=$s: rc=$rc"
    [ $rc = 124 ] && return 1
  done
  return 0
}
for c in . exp_mla exp_mla_push exp_mla_nopv exp_mla_tl exp_mla_push_tl; do
  [ -f $c/manifests/sm_90a.json ] || continue
  export SPARSE_DECODE_AOT_CACHE=$PWD/$c
  echo "=== cache $c"
  case $c in
    .) timeout 50 python3 $S time || echo "time rc=$?"
       timeout 40 python3 $S diag 128 265 128266 || echo "diag rc=$?";;
    *_nopv) timeout 50 python3 $S time || echo "time rc=$?";;
    *_tl) timeout 40 python3 $S timeline || echo "timeline rc=$?";;
    *) run_checks 640 0 1 && run_checks 128 1 && { timeout 50 python3 $S time || echo "time rc=$?"; }
       [ $c = exp_mla ] && { timeout 40 python3 $S diag 128 265 128266 || echo "diag rc=$?"; };;
  esac
done
if command -v compute-sanitizer >/dev/null && [ "${MLA_SANITIZE:-0}" = 1 ]; then
  export SPARSE_DECODE_AOT_CACHE=$PWD
  timeout 120 compute-sanitizer --tool memcheck python3 $S check 640 1 12 || echo "memcheck rc=$?"
fi
