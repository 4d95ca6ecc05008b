#!/usr/bin/env bash
# limit: 90
# decode_topk cache roots (. and carried .gl/*) side by side on the indexer benchmark's DeepGEMM logits.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
# Alone, 80 s of its 90 (less the set-up's seconds); run by another job, what that job has left
# (gpu/tools/job_limit.sh).
source gpu/tools/job_limit.sh
# INDEXER_ROOTS names the roots beside "." (default: every carried .gl/* but timeline builds, whose marks
# overwrite the logits).
timeout "$(cap 80)" python3 gpu/jobs/indexer_roots.py "$JOB_OUT/indexer_roots.json" . \
  ${INDEXER_ROOTS:-$(ls -d .gl/* 2>/dev/null | grep -v "^.gl/tl_")}
