#!/usr/bin/env bash
# limit: 300
# decode_topk candidates (.gl/cand*, carried) on short slices: on each, the GPU tests (and, unless SKIP_CHECKS=1,
# the sanitizers); then all beside the committed cache on the short-slice cases (TOPK_ROOTS_CASES=short) and
# on the indexer's DeepGEMM logits (needs the carried .whl).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
roots=$(ls -d .gl/cand* 2>/dev/null)
for root in $roots; do
  echo "== $root"
  if [ -z "${SKIP_CHECKS:-}" ]; then
    SPARSE_DECODE_AOT_CACHE=$PWD/$root topk_checks
  else
    SPARSE_DECODE_AOT_CACHE=$PWD/$root run timeout 90 python3 -m pytest -q -x -p no:cacheprovider -m gpu \
      tests/test_topk_gpu.py 2>&1 | tail -4
  fi
done
for set in ${ROOTS_SETS:-short}; do
  TOPK_ROOTS_CASES=$set run timeout 90 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_$set.json" . $roots 2>&1 | tail -20
done
bash gpu/jobs/indexer_roots.sh 2>&1 | tail -8
