#!/usr/bin/env bash
# limit: 560
# One whole verification pass on the committed tree (carry .whl): every GPU test (DeepGEMM installed from the
# carried wheel), then the sanitizers of both kernel families (sparse MLA's small launches with the edge inputs;
# decode_topk's full mode: every cluster size, the twins and the short-row kernel; its racecheck in shards), then the indexer
# job (tests, benchmark, zero-JIT probes, memcheck of one step). Reports in $JOB_OUT/verify_all.tgz.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
echo "=== 1. all GPU tests"
bash gpu/jobs/all_gpu_tests.sh 2>&1 | tee "$JOB_OUT/all_gpu_tests.log" | tail -25
echo "=== 2. sanitizers (sparse MLA 3 tools + decode_topk full mode: memcheck, synccheck, racecheck in 6 shards; in parallel)"
# decode_topk's three tools side by side with the sparse-MLA ones (racecheck in six shards: 223 s alone on the
# H200), so that the whole job stays inside one call's 600 s
TOOL=all SECONDS_EACH=320 bash gpu/jobs/topk_sanitize_full.sh > "$JOB_OUT/topk_sanitizers.txt" 2>&1 &
bash gpu/tools/mla_sanitize.sh 200
wait
cat "$JOB_OUT/topk_sanitizers.txt"
echo "=== 3. indexer job (took ${SECONDS}s so far)"
mkdir -p "$JOB_OUT/indexer"
# Bounded by what is left of the call's 600 s, so that the archive below is always written: a call brings back at
# most 8 files, two folders deep, and the loose reports would not come back.
ROUND_CAP=$((575 - SECONDS)) JOB_OUT="$JOB_OUT/indexer" bash gpu/jobs/indexer.sh 2>&1 | tee "$JOB_OUT/indexer/indexer.log" \
  | tail -40
echo "=== verify_all took ${SECONDS}s"
# A call brings back at most 8 files: everything goes back as one archive beside this log's tail.
tar czf /tmp/verify_all.tgz -C "$JOB_OUT" . && rm -rf "${JOB_OUT:?}"/* && mv /tmp/verify_all.tgz "$JOB_OUT/"
