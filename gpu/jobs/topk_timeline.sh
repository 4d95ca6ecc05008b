#!/usr/bin/env bash
# limit: 60
# decode_topk per-phase clocks from a carried timeline build (.gl/topk_tl: DECODE_TOPK_EXPERIMENT=timeline).
set -u
timeout 50 python3 gpu/jobs/topk_timeline.py .gl/topk_tl "$JOB_OUT/topk_timeline.json"
