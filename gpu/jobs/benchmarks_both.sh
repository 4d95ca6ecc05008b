#!/usr/bin/env bash
# limit: 590
# The two issue benchmarks in one call (carry .whl): sparse_mla_decode's whole grid (mla_bench.sh), then the indexer
# job (indexer.sh: DeepGEMM warmed from the carried cache, its GPU tests, the step benchmark, the zero-JIT probes,
# memcheck of one step) bounded by what is left of the call. The indexer's reports go back as one archive: a call
# brings back at most 8 files.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
echo "=== sparse_mla_decode benchmark"
bash gpu/jobs/mla_bench.sh
echo "=== indexer job (took ${SECONDS}s so far)"
mkdir -p /tmp/indexer_job
ROUND_CAP=$((575 - SECONDS)) JOB_OUT=/tmp/indexer_job bash gpu/jobs/indexer.sh 2>&1 | tee /tmp/indexer_job/indexer.log \
  | tail -40
cp /tmp/indexer_job/bench_indexer.json "$JOB_OUT/" 2>/dev/null
tar czf "$JOB_OUT/indexer_job.tgz" -C /tmp/indexer_job .
echo "=== took ${SECONDS}s"
