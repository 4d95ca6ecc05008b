#!/usr/bin/env bash
# limit: 150
# Per-phase clocks of the short-row decode_topk kernel from the carried timeline build .gl/tl_row
# (DECODE_TOPK_EXPERIMENT=timeline): random rows (TOPK_TIMELINE_CASES=row), then the indexer benchmark's shapes on
# its DeepGEMM logits beside random ones (TOPK_TIMELINE_INPUT=indexer, with the DeepGEMM wheel carried in .whl).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
TOPK_TIMELINE_CASES=row timeout 40 python3 gpu/jobs/topk_timeline.py .gl/tl_row "$JOB_OUT/timeline_row.json"
if ls .whl/*.whl >/dev/null 2>&1; then
  source gpu/tools/deepgemm_env.sh
  TOPK_TIMELINE_INPUT=indexer timeout 90 python3 gpu/jobs/topk_timeline.py .gl/tl_row "$JOB_OUT/timeline_row_indexer.json"
fi
