#!/usr/bin/env bash
# limit: 420
# topk_roots.py sets, each against its own carried roots: ROOTS_PAIRS="set:root[,root...] ..." ("." is always first),
# one process a set; then, with INDEXER_ROOTS set, indexer_roots.sh on those roots (DeepGEMM logits).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
for pair in ${ROOTS_PAIRS:-}; do
  set_name=${pair%%:*}; roots=${pair#*:}
  echo "=== $set_name: . ${roots//,/ }"
  TOPK_ROOTS_CASES=$set_name timeout 150 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_$set_name.json" . \
    ${roots//,/ } 2>&1 | tail -n 60
done
if [ -n "${INDEXER_ROOTS:-}" ]; then
  bash gpu/jobs/indexer_roots.sh 2>&1 | tail -n 30
fi
