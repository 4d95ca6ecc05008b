#!/usr/bin/env bash
# limit: 440
# Issue 5 experiment: PDL inside the indexer step (gpu/jobs/indexer_pdl.py), after DeepGEMM's cache is warmed
# for the serving shapes (restored from .whl/dg_jit_cache.tgz where carried). Output under $JOB_OUT. (The limit: the
# warm-up's 120 s and PDL_LIMIT's default 300; without the line run_all.sh gave the job its default 120 s.)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
mkdir -p "$JOB_OUT"
timeout 120 python3 -c "
from runtime.scoring import ServingShapes, warm_deepgemm
print(warm_deepgemm(ServingShapes(max_rows=64)))
" 2>&1 | tail -3
[ -d $DG_JIT_CACHE_DIR ] && tar czf "$JOB_OUT/dg_jit_cache.tgz" -C /tmp dg_jit_cache
timeout ${PDL_LIMIT:-300} python3 gpu/jobs/indexer_pdl.py --rounds ${PDL_ROUNDS:-3} ${PDL_ARGS:-} --out "$JOB_OUT/indexer_pdl.json"
echo "rc=$? job took ${SECONDS}s"
