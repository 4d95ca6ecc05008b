#!/usr/bin/env bash
# limit: 120
# Microbenchmark of the sparse-MLA gather's routes (gpu/micro/gather_route.cu), compiled here with nvcc.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/gather_route gpu/micro/gather_route.cu -lcuda \
  && GATHER_ROUTES="${GATHER_ROUTES:-}" /tmp/gather_route | tee "$JOB_OUT/gather_route.jsonl"
