#!/usr/bin/env bash
# limit: 60
# sparse_mla_decode cluster kernel: every variant of the committed cache against the reference and
# timed beside the empty kernel of the same grid (one process, L2-warm); then, when carried, an
# earlier cache (.gl/mla_old: timed the same way, for an A/B in one run) and a per-step clock build
# of the same source (.gl/mla_tl: SPARSE_MLA_EXPERIMENT=timeline, clocks written over q).
# The GPU tests, benchmark and compute-sanitizer runs are in gpu/jobs/mla_support.sh.
set -u
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
S=gpu/jobs/mla_kernel_smoke.py
export SPARSE_DECODE_AOT_CACHE=$PWD
timeout 28 python3 $S final || echo "final rc=$?"
if [ -f .gl/mla_old/manifests/sm_90a.json ]; then
  echo "== earlier cache (.gl/mla_old)"
  SPARSE_DECODE_AOT_CACHE=$PWD/.gl/mla_old timeout 12 python3 $S time640 1 12 24 48 || echo "old time rc=$?"
fi
if [ -f .gl/mla_tl/manifests/sm_90a.json ]; then
  echo "== timeline build (.gl/mla_tl)"
  SPARSE_DECODE_AOT_CACHE=$PWD/.gl/mla_tl timeout 12 python3 $S timeline || echo "timeline rc=$?"
fi
