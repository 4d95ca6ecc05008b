#!/usr/bin/env bash
# limit: 300
# decode_topk candidate builds (.gl/cand*, carried: full cache roots, e.g. from
# `python build_kernels.py --only decode_topk --arch sm_90a --out .gl/cand`): on each, the GPU tests and, unless
# SKIP_CHECKS=1, the sanitizers; then all of them timed beside the committed cache, one process, on the case sets
# ROOTS_SETS names (gpu/jobs/topk_roots.py's TOPK_ROOTS_CASES; "default" is its default set), and, where the
# DeepGEMM wheel is carried (.whl), on the indexer benchmark's DeepGEMM logits.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which topk_checks.sh sources), indexer_roots.sh
# given what is left as its own: one candidate's checks (205 s) and the default set (90) left 5 s of its 300, before
# the indexer's logits (90, with the wheel carried) and each further candidate's checks.
source gpu/tools/topk_checks.sh
roots=$(ls -d .gl/cand* 2>/dev/null)
for root in $roots; do
  echo "== $root"
  if [ -z "${SKIP_CHECKS:-}" ]; then
    SPARSE_DECODE_AOT_CACHE=$PWD/$root topk_checks
  else
    SPARSE_DECODE_AOT_CACHE=$PWD/$root run timeout "$(cap 90)" python3 -m pytest -q -x -p no:cacheprovider -m gpu \
      tests/test_topk_gpu.py 2>&1 | tail -4
  fi
done
for set in ${ROOTS_SETS:-default}; do
  TOPK_ROOTS_CASES=$set run timeout "$(cap 90)" python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_$set.json" \
    . $roots 2>&1 | tail -20
done
if ls .whl/*.whl >/dev/null 2>&1; then
  LIMIT=$(cap 90) bash gpu/jobs/indexer_roots.sh 2>&1 | tail -8
fi
