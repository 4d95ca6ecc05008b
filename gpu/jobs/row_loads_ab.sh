#!/usr/bin/env bash
# limit: 560
# The short-row kernel's row loads issued beside its row end's load (sixty-fifth session) as a candidate cache root,
# .gl/cand_spec (python build_kernels.py --arch sm_90a --jobs 2 --out .gl/cand_spec on the candidate source; carry
# .gl/cand_spec), beside the committed cache: the row kernels on random rows whose ends are the whole width, an eighth
# of it (reads past the end are the candidate's cost) and random (gpu/jobs/topk_roots.py, TOPK_ROOTS_CASES=row_only,
# each order of the two roots once), on the indexer's DeepGEMM logits at 8K (gpu/jobs/indexer_roots.py), then
# decode_topk's GPU tests and quick sanitizers against the candidate (gpu/tools/topk_checks.sh).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
JOB_OUT=${JOB_OUT:?}
mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
source gpu/tools/deepgemm_env.sh
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which topk_checks.sh sources): the row kernels'
# 4 x 100 s, the indexer logits' 120 and the checks' 205 came to 725 s against the job's 560.
source gpu/tools/topk_checks.sh
cand=$PWD/.gl/cand_spec  # absolute: SPARSE_DECODE_AOT_CACHE takes no relative path
for ends in full short random; do
  i=0
  for order in ". $cand" "$cand ."; do
    i=$((i + 1))
    echo "=== row kernels, ends $ends, roots $order (${SECONDS}s)"
    TOPK_ROOTS_CASES=row_only TOPK_ROOTS_ENDS=$ends timeout "$(cap 100)" python3 gpu/jobs/topk_roots.py \
      "$JOB_OUT/row_${ends}_$i.json" $order | tail -4
    [ "$ends" = full ] || break  # one order for the others: the time goes to the checks
  done
done
echo "=== indexer logits (${SECONDS}s)"
INDEXER_ROOTS_CONTEXTS=8192 timeout "$(cap 120)" python3 gpu/jobs/indexer_roots.py "$JOB_OUT/indexer_roots.json" \
  . "$cand" | tail -4
echo "=== checks against $cand (${SECONDS}s)"
SPARSE_DECODE_AOT_CACHE=$cand topk_checks
echo "=== row_loads_ab took ${SECONDS}s"
