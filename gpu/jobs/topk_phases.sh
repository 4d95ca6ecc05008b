#!/usr/bin/env bash
# limit: 150
# decode_topk: where the time goes. Builds that stop after each phase (.gl/stopN from
# gpu/jobs/make_stop_builds.py, carried) timed beside the committed cache (gpu/jobs/topk_roots.py),
# and one ncu of a long-row case (of .gl/cand where there is one).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
roots=(.); for r in .gl/cand .gl/stop9 .gl/stop1 .gl/stop2 .gl/stop3; do [ -d "$r" ] && roots+=("$r"); done
echo "+ roots ${roots[*]}"
timeout 90 python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots.json" "${roots[@]}" 2>&1 | tail -20
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -d .gl/cand ] && export SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand  # profile the candidate where there is one
timeout 45 "$NCU" --clock-control none --kernel-name regex:decode_topk --launch-skip 2 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --section SpeedOfLight --section LaunchStats --section Occupancy \
  --import-source no -f -o "$JOB_OUT/c2_64x256k" python3 gpu/jobs/profile_cases.py topk decode_topk_f32_token_c2 64 262144 2048 > /dev/null 2>&1
"$NCU" -i "$JOB_OUT/c2_64x256k.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/c2_64x256k.sass.csv" 2>&1
"$NCU" -i "$JOB_OUT/c2_64x256k.ncu-rep" --page details > "$JOB_OUT/c2_64x256k.details.txt" 2>&1; rm -f "$JOB_OUT/c2_64x256k.ncu-rep"
grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/c2_64x256k.details.txt"
