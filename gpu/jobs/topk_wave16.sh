#!/usr/bin/env bash
# limit: 120
# 8 and 16 CTAs a row on 8-14 rows: the committed cache (one CTA an SM for 8 and 16) beside .gl/cand* caches
# (e.g. compiled for two CTAs an SM: one wave of 16 holds 8 rows), topk_roots.py's "wave16" set; the candidates'
# GPU tests first (decode_topk, -x).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
for root in $(ls -d .gl/cand* 2>/dev/null); do
  SPARSE_DECODE_AOT_CACHE=$PWD/$root timeout 40 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "few_rows or grid" 2>&1 | tail -2
done
TOPK_ROOTS_CASES=wave16 timeout 90 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_wave16.json" . $(ls -d .gl/cand* 2>/dev/null)
