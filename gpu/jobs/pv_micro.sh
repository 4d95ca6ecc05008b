#!/usr/bin/env bash
# limit: 60
# Microbenchmark of the second product's routes (gpu/micro/pv_route.cu), compiled here with nvcc.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/pv_route gpu/micro/pv_route.cu && /tmp/pv_route | tee "$JOB_OUT/pv_route.jsonl"
