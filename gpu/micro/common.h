// What the microbenchmarks share: the CUDA error check (a failed call prints one JSON line naming it and ends the
// program) and a launch configuration for a 1-D grid of 1-D clusters.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      printf("{\"error\": \"%s at line %d\"}\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

// A launch of `grid` CTAs of `threads`, in clusters of `cluster` along x; attr must outlive the launch.
inline cudaLaunchConfig_t cluster_launch(int grid, int threads, int smem, int cluster, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}
