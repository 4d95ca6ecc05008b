#!/usr/bin/env bash
# limit: 480
# Candidate caches carried as .gl/cand*: decode_topk's GPU tests and sanitizers on each, or on those STAGE_AB_CHECK
# names (gpu/tools/topk_checks.sh with SPARSE_DECODE_AOT_CACHE naming it), then topk_roots.py's sets
# STAGE_AB_SETS (default: long row) on "." beside them, one process a set. A set given as "set:root,root" runs
# against those roots only; with INDEXER_ROOTS set, indexer_roots.sh last (DeepGEMM logits).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which topk_checks.sh sources), indexer_roots.sh
# given what is left as its own: one candidate's checks (205 s) and the two default sets (2 x 150) came to 505 s
# against its 480, each further candidate's checks and the indexer's logits (90, with INDEXER_ROOTS) more.
source gpu/tools/topk_checks.sh
top=$JOB_OUT
# STAGE_AB_CHECK names the candidates that get the checks (default: every .gl/cand*).
for c in ${STAGE_AB_CHECK:-$(ls -d .gl/cand* 2>/dev/null)}; do
  echo "=== checks on $c"
  (export SPARSE_DECODE_AOT_CACHE=$PWD/$c JOB_OUT=$top/$(basename "$c"); mkdir -p "$JOB_OUT"; topk_checks)
done
for entry in ${STAGE_AB_SETS:-long row}; do
  set_name=${entry%%:*}
  roots=$(ls -d .gl/cand* 2>/dev/null)
  case $entry in *:*) roots=${entry#*:}; roots=${roots//,/ } ;; esac
  TOPK_ROOTS_CASES=$set_name timeout "$(cap 150)" python3 gpu/jobs/topk_roots.py "$top/topk_roots_$set_name.json" \
    . $roots 2>&1 | tail -2
done
if [ -n "${INDEXER_ROOTS:-}" ]; then
  LIMIT=$(cap 90) bash gpu/jobs/indexer_roots.sh 2>&1 | tail -n 30
fi
