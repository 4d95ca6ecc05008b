#!/usr/bin/env bash
# limit: 60
# Where the hardware places 5-CTA clusters (the sparse-MLA width-640 shape): gpu/micro/cluster_placement.cu.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/cluster_placement gpu/micro/cluster_placement.cu \
  && /tmp/cluster_placement | tee "$JOB_OUT/cluster_placement.jsonl" | cut -c1-200
