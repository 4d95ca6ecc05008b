#!/usr/bin/env bash
# limit: 300
# The short-row decode_topk kernel, working tree against the cache carried in .gl/head (the last commit's): the
# working tree's decode_topk GPU tests and sanitizers, both caches side by side on topk_roots.py's "row" set, and
# any .gl/cand* caches too, and the working tree's timeline build (.gl/tl_row) on random rows.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/topk_checks.sh
[ -z "${SKIP_CHECKS:-}" ] && topk_checks
TOPK_ROOTS_CASES=row run timeout 250 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_row_ab.json" . .gl/head $(ls -d .gl/cand* 2>/dev/null) 2>&1 | tail -5
[ -d .gl/tl_row ] && TOPK_TIMELINE_CASES=row timeout 40 python3 gpu/jobs/topk_timeline.py .gl/tl_row "$JOB_OUT/timeline_row.json"
