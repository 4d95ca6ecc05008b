#!/usr/bin/env bash
# One device call runs every job under gpu/jobs (or those named), each under its own time limit,
# and packs their logs and result files into $OUT/results.tar.gz (the device returns at most 8 files).
# A job is gpu/jobs/<name>.sh; it gets JOB_OUT (a folder for its files) and runs from the repo root.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# A stage of this call's own, removed on exit (what it holds is packed into $OUT after each job); its path printed
# first, for whoever ends the call with a SIGKILL, which no trap sees.
stage=$(mktemp -d /tmp/gpu_out.XXXXXX) || exit 1
trap 'rm -rf "$stage"' EXIT
echo "stage $stage"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$stage/gpu.txt" 2>&1
git rev-parse HEAD > "$stage/commit.txt" 2>/dev/null; git status --short >> "$stage/commit.txt" 2>/dev/null
jobs=("$@"); [ ${#jobs[@]} -eq 0 ] && jobs=($(ls gpu/jobs/*.sh | xargs -n1 basename | sed 's/\.sh$//'))
summary="$stage/summary.txt"; : > "$summary"
# Packed after every job, and every job's limit cut to what is left of the call (CALL_LIMIT seconds, default 590 of
# its 600; less 15: --kill-after's 10 and the packing): the jobs were packed once, at the end, so jobs whose limits
# summed past the call's 600 s were cut off by the call and brought nothing back, not even the ones that had finished.
call_limit=${CALL_LIMIT:-590}
pack() { tar czf "$OUT/results.tar.gz" -C "$stage" .; cp "$summary" "$OUT/summary.txt"; }
for j in "${jobs[@]}"; do
  limit=$(grep -m1 '^# limit:' "gpu/jobs/$j.sh" | awk '{print $3}'); limit=${limit:-120}
  # ROUND_CAP (seconds) caps every job of a round, to keep the round inside the device budget.
  if [ -n "${ROUND_CAP:-}" ] && [ "$limit" -gt "$ROUND_CAP" ]; then limit=$ROUND_CAP; fi
  left=$((call_limit - 15 - SECONDS))
  if [ "$left" -lt 10 ]; then echo "$j skipped: ${left}s left of the call" | tee -a "$summary"; continue; fi
  [ "$limit" -gt "$left" ] && limit=$left
  export JOB_OUT="$stage/$j"; mkdir -p "$JOB_OUT"
  t0=$(date +%s)
  # LIMIT: the job's seconds as cut here, which jobs that bound their steps read (gpu/tools/job_limit.sh,
  # verify_all.sh): without it they kept to their own line and the timeout below cut their last step, reports and all
  LIMIT=$limit timeout --kill-after=10 "$limit" bash "gpu/jobs/$j.sh" > "$JOB_OUT/log.txt" 2>&1
  rc=$?
  echo "$j rc=$rc ${limit}s-limit took=$(( $(date +%s) - t0 ))s" | tee -a "$summary"
  tail -n 8 "$JOB_OUT/log.txt" | sed "s/^/  [$j] /"
  pack
done
pack
