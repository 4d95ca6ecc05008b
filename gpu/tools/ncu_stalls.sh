# Sourced by gpu/jobs/profile*.sh: Nsight Compute stall sampling at the finest interval.
# stall_profile TAG KERNEL_REGEX CASE_ARGS...  profiles the third launch of the kernels matching
# KERNEL_REGEX in `python3 gpu/jobs/profile_cases.py CASE_ARGS...` and writes $JOB_OUT/TAG.sass.csv
# (per-SASS-instruction stall samples, executions and shared-memory wavefronts) and TAG.details.txt.
# NCU_CACHE_CONTROL=none: caches kept between launches (ncu flushes them before the profiled one by default).
# Each profile's 50 s cut to what is left of the sourcing job's limit (gpu/tools/job_limit.sh): five of them are 250 s.
source gpu/tools/job_limit.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
stall_profile() {
  local tag=$1 regex=$2; shift 2
  mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
  echo "+ $tag"
  timeout "$(cap 50)" "$NCU" --clock-control none --cache-control "${NCU_CACHE_CONTROL:-all}" \
    --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --warp-sampling-interval 0 \
    --import-source no -f -o "$JOB_OUT/$tag" python3 gpu/jobs/profile_cases.py "$@" > "$JOB_OUT/$tag.ncu.log" 2>&1
  echo "rc=$?"
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/$tag.sass.csv" 2>&1
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page details > "$JOB_OUT/$tag.details.txt" 2>&1
  grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/$tag.details.txt"; rm -f "$JOB_OUT/$tag.ncu-rep"
}
