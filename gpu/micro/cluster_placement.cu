// Where the hardware places the CTAs of a grid of 5-CTA clusters (the sparse-MLA kernel's width-640 shape):
// every CTA records its SM, and the host counts the SMs that hold two CTAs at once.
//
// Question (twenty-sixth session): at T = 12 the kernel's 60 CTAs could take 60 of the 132 SMs, one each, but
// its shared memory allows two an SM, so the cluster scheduler may pack two CTAs of different clusters onto one
// SM (sharing its load pipes during the gather) while other SMs idle. Each CTA spins long enough that the whole
// grid is resident together; dynamic shared memory as the kernel's (two an SM) or over half an SM (one an SM).
//
// Answer on the H200 (twenty-sixth session, benchmarks/results/cluster_placement_s26_h200.jsonl): no. Up to T = 12
// every CTA has an SM of its own at either shared-memory size (60 CTAs on 60 SMs; a cluster takes SMs of one GPC,
// e.g. 10, 11, 26, 27, 42); from T = 24 (120 CTAs) some SMs hold two (6 at T = 24, 111 at T = 48) at either size,
// since the clusters must fit the GPCs. So at T = 12 the gather is not sharing SMs, and launching at one CTA an SM
// changes nothing there.
//
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/cluster_placement gpu/micro/cluster_placement.cu
//   /tmp/cluster_placement   -> one JSON line a configuration
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

#include "common.h"

__global__ void record_sm(int* sm_of_cta, long long spin_cycles) {
  extern __shared__ char smem[];
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  if (threadIdx.x == 0) {
    smem[0] = 1;
    sm_of_cta[blockIdx.x] = smid;
  }
  long long t0 = clock64();
  while (clock64() - t0 < spin_cycles) {
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  int* d_sm = nullptr;
  CK(cudaMalloc(&d_sm, 4096 * sizeof(int)));
  const int kernel_smem = 65536 + 8192 + 2048 + 2048 + 1024 + 1024;  // the contract's bytes + alignment slack
  const int smem_sizes[] = {kernel_smem, 120 * 1024};
  const int clusters[] = {5, 1};
  const int tokens[] = {1, 6, 12, 24, 26, 48};
  for (int cluster : clusters) {
    for (int smem : smem_sizes) {
      for (int T : tokens) {
        int grid = T * 5;
        cudaLaunchAttribute attr;
        cudaLaunchConfig_t cfg = cluster_launch(grid, 128, smem, cluster, &attr);
        CK(cudaMemset(d_sm, 0xff, grid * sizeof(int)));
        // Two launches: the first warms the launch path, the second is recorded.
        for (int rep = 0; rep < 2; ++rep) CK(cudaLaunchKernelEx(&cfg, record_sm, d_sm, 40000LL));
        CK(cudaDeviceSynchronize());
        std::vector<int> sm_of(grid);
        CK(cudaMemcpy(sm_of.data(), d_sm, grid * sizeof(int), cudaMemcpyDeviceToHost));
        std::vector<int> ctas_on(sms, 0);
        for (int s : sm_of) if (s >= 0 && s < sms) ctas_on[s]++;
        int used = 0, doubled = 0, most = 0;
        for (int c : ctas_on) {
          used += c > 0;
          doubled += c > 1;
          most = c > most ? c : most;
        }
        printf("{\"cluster\": %d, \"smem\": %d, \"T\": %d, \"ctas\": %d, \"sms_used\": %d, \"sms_with_2plus\": %d, "
               "\"most_on_one_sm\": %d, \"sm_of_cta\": [",
               cluster, smem, T, grid, used, doubled, most);
        for (int i = 0; i < grid; ++i) printf("%s%d", i ? ", " : "", sm_of[i]);
        printf("]}\n");
      }
    }
  }
  return 0;
}
