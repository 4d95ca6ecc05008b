#!/usr/bin/env bash
# limit: 590
# The two issue benchmarks in one call (carry .whl): sparse_mla_decode's whole grid (mla_bench.sh), then the indexer
# job (indexer.sh: DeepGEMM warmed from the carried cache, its GPU tests, the step benchmark, the zero-JIT probes,
# memcheck of one step) bounded by what is left of the call. The indexer's reports go back as one archive: a call
# brings back at most 8 files.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Both parts cut to what is left of LIMIT (its own 590, or run_all.sh's cut; gpu/tools/job_limit.sh): the indexer job
# was given 575 - SECONDS whatever the cut, so a shorter one killed it before its archive was made.
source gpu/tools/job_limit.sh
echo "=== sparse_mla_decode benchmark"
LIMIT=$(cap 320) bash gpu/jobs/mla_bench.sh
mla_rc=$?
echo "=== indexer job (took ${SECONDS}s so far)"
# A folder of this call's own: the fixed /tmp/indexer_job kept an earlier call's reports on a warm machine, so an
# indexer benchmark that wrote nothing this time sent the earlier call's bench_indexer.json back as this one's.
work=$(mktemp -d /tmp/indexer_job.XXXXXX)
trap 'rm -rf "$work"' EXIT  # (also where the job is cut off)
ROUND_CAP=$(time_left) JOB_OUT=$work bash gpu/jobs/indexer.sh 2>&1 | tee "$work/indexer.log" | tail -40
indexer_rc=${PIPESTATUS[0]}  # the indexer job's own (the pipeline's was tail's 0)
cp "$work/bench_indexer.json" "$JOB_OUT/" 2>/dev/null
tar czf "$JOB_OUT/indexer_job.tgz" -C "$work" .
# The job's exit status (it was the echo's 0 whatever ran): both parts exited 0.
echo "=== took ${SECONDS}s: sparse_mla_decode benchmark rc=$mla_rc, indexer job rc=$indexer_rc"
[ "$mla_rc" -eq 0 ] && [ "$indexer_rc" -eq 0 ]
