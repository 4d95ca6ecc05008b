#!/usr/bin/env bash
# limit: 200
# decode_topk per-phase clocks of two carried timeline builds on TOPK_TIMELINE_CASES (default long): .gl/tl_plain
# (DECODE_TOPK_EXPERIMENT=timeline: CTA 0's finish rounds) and .gl/tl_gather (timeline_gather: the marked gather
# split), each parsed with its own marks; with the DeepGEMM wheel carried, .gl/tl_plain on the indexer's logits too.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
export TOPK_TIMELINE_CASES=${TOPK_TIMELINE_CASES:-long}
timeout 40 python3 gpu/jobs/topk_timeline.py .gl/tl_plain "$JOB_OUT/timeline_plain.json" 2>&1 | grep -v "^    .*min       0"
if [ -d .gl/tl_gather ]; then
  TOPK_TIMELINE_MARKS=gather timeout 40 python3 gpu/jobs/topk_timeline.py .gl/tl_gather "$JOB_OUT/timeline_gather.json" \
    2>&1 | grep -E "rows=|gather|pushes|finish"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  TL_ROOT=.gl/tl_plain bash gpu/jobs/topk_timeline_indexer.sh
fi
