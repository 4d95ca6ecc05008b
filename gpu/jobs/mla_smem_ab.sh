#!/usr/bin/env bash
# limit: 420
# sparse_mla_decode candidate A/B (gpu/jobs/mla_cand.sh: checks, L2-warm timing, timelines and, with CAND_BENCH,
# the benchmark's KV-rotated timing) plus each cache's shared-memory wavefronts and bank conflicts at T = 12
# width 640 under Nsight Compute (one launch, metrics only).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh), mla_cand.sh given what is left as its own: two
# caches' ncu runs (2 x 60 s) and their mla_cand.sh steps (2 x 200) came to 520 s against its 420.
source gpu/tools/job_limit.sh
M=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_cmd_read.sum,gpu__time_duration.sum
for c in "$PWD" "$PWD"/.gl/mlacand[0-9]; do
  [ -f "$c/manifests/sm_90a.json" ] || continue
  echo "== ncu shared wavefronts: $c"
  SPARSE_DECODE_AOT_CACHE=$c timeout "$(cap 60)" "$NCU" --metrics $M --kernel-name regex:sparse_mla --launch-skip 2 \
    --launch-count 1 python3 gpu/jobs/profile_cases.py mla 12 640 2>&1 | grep -E "sparse_mla|l1tex|gpu__time" | head -8
done
LIMIT=$(cap 570) bash gpu/jobs/mla_cand.sh
