// What the first digit's cluster exchange costs in decode_topk's cluster_select, and what an exchange by the async
// proxy would cost instead.
//
// Question (twenty-ninth session): after step 1 every CTA of a row's cluster has built its first-digit histogram
// with shared atomics, and the select reads the peers' bins of a narrow window through distributed shared memory
// behind a cluster barrier whose arrive is a release: MEMBAR.ALL.GPU on every warp in SASS. A timing-only build
// with a CTA-scope fence instead was 0.2-0.45 us faster (decode_topk_ab_h200.json: select_barrier_s28_ab), but is
// that the GPU-scope fence itself, or the drain of the histogram's outstanding atomics (which any design must wait
// for before the bins are read)? Each CTA here runs the same shape: 512 threads, `items` shared atomics a thread
// (spread over 2048 bins, or all in 16: the indexer's narrow rows), then one exchange, timed on thread 0 from the
// end of its atomics loop to the CTA barrier after the sums:
//   release   barrier.cluster.arrive.release + wait.acquire, then pulls of the window's 4 groups from each peer
//             (the committed kernel's route);
//   ctafence  fence.acq_rel.cta + arrive.relaxed + wait, the same pulls (NOT a valid release: timing only);
//   relaxed   arrive.relaxed + wait, the same pulls (no fence at all: timing only);
//   push      a CTA barrier, then every (group, peer) pair's 16 bytes by st.async onto the peer's mbarrier, whose
//             expected bytes were set at its init; the wait is CTA-scope (valid: the complete_tx is the release);
//   push2     push, after a first round of one st.async word a peer (the floors) that each CTA waits for: the
//             committed kernel's floors decide the window, so a push route needs two one-way trips;
//   fence0    release, but with no atomics before it: the GPU-scope fence's own cost.
//   startrel  push, with the start barrier's arrive a release (the route would need one there, for the zeroed
//             counters peers add to later): timed from before that arrive instead.
// Each launch keeps the largest thread-0 time over its CTAs; the line gives the median over launches and the
// median launch time by events (the launch included).
//
// Answer on the H200 (twenty-ninth session, benchmarks/results/cluster_exchange_s29_h200.jsonl; cycles at 1980 MHz):
// the fence. On 8 CTAs release 1850-2000, ctafence 1470-1665, relaxed 1030-1220, push 1085-1255, push2 1340-1395,
// and fence0 (no atomics at all) 1722: the GPU-scope fence costs ~500 cycles by itself, whatever the atomics. On 16
// CTAs release 2880-2990, relaxed 1650-1800, push 1350-1520, fence0 2693. A valid release need not pay it: what the
// peers read is the releasing CTA's own shared memory, and fence.release.sync_restrict::shared::cta.cluster (a
// CTA-level MEMBAR in SASS) releases exactly that; decode_topk's first digit now uses it (decode_topk_ab_h200.json:
// select_release_s29_ab). startrel is not comparable with the others (it includes the atomics' own time).
//
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/cluster_exchange gpu/micro/cluster_exchange.cu
//   /tmp/cluster_exchange   -> one JSON line a configuration
#include <algorithm>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

#include "common.h"

enum Mode { kRelease, kCtaFence, kRelaxed, kPush, kPush2, kFence0, kStartRelease, kModes };
static const char* kModeNames[kModes] = {"release", "ctafence", "relaxed", "push", "push2", "fence0", "startrel"};

constexpr int kThreads = 512;
constexpr int kBins = 2048;
constexpr int kGroups = 4;          // the window: 16 bins, 4 groups of 4
constexpr int kWindowGroup = 250;   // bins 1000-1015
constexpr int kMaxCluster = 16;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned mapa(unsigned addr, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

__device__ __forceinline__ void pull_window(const unsigned* hist, unsigned* sums, int cluster) {
  int tid = threadIdx.x;
  if (tid < kGroups) {
    unsigned mine = smem_u32(hist + (kWindowGroup + tid) * 4);
    unsigned s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int r = 0; r < cluster; ++r) {
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(mapa(mine, r)) : "memory");
      s0 += v0; s1 += v1; s2 += v2; s3 += v3;
    }
    sums[tid * 4] = s0; sums[tid * 4 + 1] = s1; sums[tid * 4 + 2] = s2; sums[tid * 4 + 3] = s3;
  }
}

__device__ __forceinline__ void wait_parity_cta(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nW:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W;\n}" :: "r"(bar), "r"(parity) : "memory");
}

// Every (group, peer) pair's 16 bytes to the peer's receive area, slot [this rank][group].
__device__ __forceinline__ void push_window(const unsigned* hist, unsigned* recv, unsigned long long* bar, int cluster,
                                            unsigned rank) {
  int tid = threadIdx.x;
  if (tid < kGroups * cluster) {
    int g = tid / cluster, r = tid % cluster;
    const unsigned* src = hist + (kWindowGroup + g) * 4;
    unsigned dst = mapa(smem_u32(recv + (rank * kGroups + g) * 4), r);
    unsigned mbar = mapa(smem_u32(bar), r);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
                 :: "r"(dst), "r"(src[0]), "r"(src[1]), "r"(src[2]), "r"(src[3]), "r"(mbar) : "memory");
  }
}

__device__ __forceinline__ void sum_received(const unsigned* recv, unsigned* sums, int cluster) {
  int tid = threadIdx.x;
  if (tid < kGroups * 4) {
    int g = tid / 4, j = tid % 4;
    unsigned s = 0;
    for (int r = 0; r < cluster; ++r) s += recv[(r * kGroups + g) * 4 + j];
    sums[tid] = s;
  }
}

__global__ void exchange(int mode, int cluster, int items, int narrow, long long* cycles, unsigned* out_sums) {
  __shared__ unsigned hist[kBins];
  __shared__ unsigned recv[kMaxCluster * kGroups * 4];
  __shared__ unsigned floors[kMaxCluster];
  __shared__ unsigned sums[kGroups * 4];
  __shared__ __align__(8) unsigned long long bar[2];  // [0] the window's bytes, [1] the floors' (push2)
  int tid = threadIdx.x;
  unsigned rank = cluster_rank();
  for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
  if (tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bar[0])));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bar[1])));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_u32(&bar[0])), "r"(cluster * kGroups * 16));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_u32(&bar[1])), "r"(cluster * 4));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  long long t_start = clock64();
  if (mode == kStartRelease) arrive_release(); else arrive_relaxed();
  cluster_wait();

  unsigned h = (blockIdx.x * 977u + tid * 131u) ^ 0x9e3779b9u;
  if (mode != kFence0) {
    for (int i = 0; i < items; ++i) {
      h = h * 1664525u + 1013904223u;
      unsigned b = narrow ? kWindowGroup * 4 + (h >> 28) : (h >> 21);
      atomicAdd(&hist[b], 1u);
    }
  }
  long long t0 = clock64();
  switch (mode) {
    // One case a route, on purpose: with the four pull routes in one case (the fence and the arrive under
    // branches), relaxed measured as slow as ctafence (cluster_exchange_s29b_h200.jsonl; cause not looked into).
    // One case a route measures as the first run did (cluster_exchange_s29c_h200.jsonl).
    case kRelease:
    case kFence0:
      arrive_release();
      cluster_wait();
      pull_window(hist, sums, cluster);
      break;
    case kCtaFence:
      asm volatile("fence.acq_rel.cta;" ::: "memory");
      arrive_relaxed();
      cluster_wait();
      pull_window(hist, sums, cluster);
      break;
    case kRelaxed:
      arrive_relaxed();
      cluster_wait();
      pull_window(hist, sums, cluster);
      break;
    case kPush2:
      if (tid < cluster) {
        unsigned dst = mapa(smem_u32(&floors[rank]), tid);
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                     :: "r"(dst), "r"(rank), "r"(mapa(smem_u32(&bar[1]), tid)) : "memory");
      }
      wait_parity_cta(smem_u32(&bar[1]), 0);
      // fall through: the window's push
    case kPush:
    case kStartRelease:
      __syncthreads();
      push_window(hist, recv, bar, cluster, rank);
      wait_parity_cta(smem_u32(&bar[0]), 0);
      sum_received(recv, sums, cluster);
      break;
  }
  __syncthreads();
  long long t1 = clock64();
  if (tid == 0) cycles[blockIdx.x] = t1 - (mode == kStartRelease ? t_start : t0);
  if (tid < kGroups * 4) out_sums[blockIdx.x * kGroups * 4 + tid] = sums[tid];
  // No CTA leaves while a peer may still read its histogram.
  arrive_relaxed();
  cluster_wait();
}

int main() {
  CK(cudaFuncSetAttribute(exchange, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  long long* d_cycles = nullptr;
  unsigned* d_sums = nullptr;
  CK(cudaMalloc(&d_cycles, 256 * sizeof(long long)));
  CK(cudaMalloc(&d_sums, 256 * kGroups * 4 * sizeof(unsigned)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int clusters[] = {8, 16};
  const int item_counts[] = {16, 64};
  const int launches = 60;
  for (int cluster : clusters) {
    int grid = cluster * (cluster == 16 ? 7 : 8);
    for (int items : item_counts) {
      for (int narrow = 0; narrow < 2; ++narrow) {
        std::vector<unsigned> ref;
        for (int mode = 0; mode < kModes; ++mode) {
          cudaLaunchAttribute attr;
          cudaLaunchConfig_t cfg = cluster_launch(grid, kThreads, 0, cluster, &attr);
          std::vector<long long> worst, host(grid);
          std::vector<float> event_us;
          for (int rep = 0; rep < launches; ++rep) {
            CK(cudaEventRecord(e0));
            CK(cudaLaunchKernelEx(&cfg, exchange, mode, cluster, items, narrow, d_cycles, d_sums));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            event_us.push_back(ms * 1000.f);
            CK(cudaMemcpy(host.data(), d_cycles, grid * sizeof(long long), cudaMemcpyDeviceToHost));
            worst.push_back(*std::max_element(host.begin(), host.end()));
          }
          std::vector<unsigned> sums(grid * kGroups * 4);
          CK(cudaMemcpy(sums.data(), d_sums, sums.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
          bool agrees = true;
          if (mode != kFence0) {
            if (ref.empty()) ref = sums;
            agrees = sums == ref;
          }
          std::sort(worst.begin(), worst.end());
          std::sort(event_us.begin(), event_us.end());
          printf("{\"cluster\": %d, \"ctas\": %d, \"items\": %d, \"bins\": \"%s\", \"mode\": \"%s\", "
                 "\"cycles_median\": %lld, \"cycles_p10\": %lld, \"cycles_p90\": %lld, \"event_us_median\": %.2f, "
                 "\"sums_agree\": %s}\n",
                 cluster, grid, items, narrow ? "16" : "2048", kModeNames[mode], worst[launches / 2],
                 worst[launches / 10], worst[launches * 9 / 10], event_us[launches / 2], agrees ? "true" : "false");
        }
      }
    }
  }
  return 0;
}
