#!/usr/bin/env bash
# limit: 200
# decode_topk per-phase clocks of two carried timeline builds on TOPK_TIMELINE_CASES (default long): .gl/tl_plain
# (DECODE_TOPK_EXPERIMENT=timeline: CTA 0's finish rounds) and .gl/tl_gather (timeline_gather: the marked gather
# split), each parsed with its own marks (gpu/jobs/timeline_roots.sh); with the DeepGEMM wheel carried, .gl/tl_plain
# on the indexer's logits too.
set -u
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
export TOPK_TIMELINE_CASES=${TOPK_TIMELINE_CASES:-long}
# Each job given what is left of the limit as its own (gpu/tools/job_limit.sh): the two builds' 2 x 60 s and the
# indexer's 100 came to 220 s against its 200.
source gpu/tools/job_limit.sh
TL_ROOTS="$(ls -d .gl/tl_plain .gl/tl_gather 2>/dev/null)" LIMIT=$(cap 150) bash gpu/jobs/timeline_roots.sh
if ls .whl/*.whl >/dev/null 2>&1; then
  TL_ROOT=.gl/tl_plain LIMIT=$(cap 120) bash gpu/jobs/topk_timeline_indexer.sh
fi
