#!/usr/bin/env bash
# limit: 90
# decode_topk cache roots (. and carried .gl/*) side by side on the indexer benchmark's DeepGEMM logits.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
timeout 80 python3 gpu/jobs/indexer_roots.py "$JOB_OUT/indexer_roots.json" . $(ls -d .gl/* 2>/dev/null)
