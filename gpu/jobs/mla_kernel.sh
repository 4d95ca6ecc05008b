#!/usr/bin/env bash
# limit: 60
# sparse_mla_decode cluster kernel, final mode (R3, 60 s cap): every variant of the committed cache
# against the reference and timed beside the empty kernel of the same grid (one process); then, when
# present, uncommitted experiment builds of the same source: exp_mla_tl (per-step SM clocks written
# over q), exp_mla_f16p (FP16 partials between the CTAs: checked and timed) and exp_mla_1cta (one
# CTA an SM: timed).
# The GPU tests, benchmark and compute-sanitizer runs are in gpu/jobs/mla_support.sh.
set -u
S=gpu/jobs/mla_kernel_smoke.py
export SPARSE_DECODE_AOT_CACHE=$PWD
timeout 28 python3 $S final || echo "final rc=$?"
if [ -f exp_mla_tl/manifests/sm_90a.json ]; then
  SPARSE_DECODE_AOT_CACHE=$PWD/exp_mla_tl timeout 12 python3 $S timeline || echo "timeline rc=$?"
fi
# FP16 partial O between the CTAs (half the DSMEM bytes): checked (numerics change) and timed.
if [ -f exp_mla_f16p/manifests/sm_90a.json ]; then
  SPARSE_DECODE_AOT_CACHE=$PWD/exp_mla_f16p timeout 12 python3 $S check_time640 || echo "f16p rc=$?"
fi
# 120 KiB of shared memory: one CTA an SM (is the T = 24 step from two CTAs sharing an SM?).
if [ -f exp_mla_1cta/manifests/sm_90a.json ]; then
  SPARSE_DECODE_AOT_CACHE=$PWD/exp_mla_1cta timeout 12 python3 $S time640 12 24 || echo "1cta time rc=$?"
fi
