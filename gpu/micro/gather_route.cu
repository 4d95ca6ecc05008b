// Microbenchmark (issue 3, gather route): how fast CTAs of 128 threads gather 128 random 512-byte
// FP8 rows each into shared memory on the H200, with the rows cold in L2 (every launch reads its
// own random rows of an 8 GiB pool). The sparse-MLA kernel's step 3 does this with cp.async.
// Routes:
//   0 cp.async 16 B, the kernel's mapping (8 threads a 128-byte K block of a row, 4 commit groups)
//   1 cp.async.bulk, one 512-byte copy a row (thread = row), one mbarrier, rows 528 bytes apart
//   2 cp.async.bulk, four 128-byte copies a row into four K-block tiles, one mbarrier a K block
//   3 TMA tensor copies, box [1 row x 128 B] with the 128-byte swizzle, four a row, an mbarrier a K block
//   4 ld.global.v4 into registers, then st.shared (swizzled)
//   5 cp.async 16 B, a warp per row (32 lanes x 16 B), 4 commit groups
//   6 route 0 after an L2 prefetch (prefetch.global.L2) of every 128-byte line of the CTA's rows
//   7 route 1 after the same L2 prefetch
//   8 route 0 on G CTAs plus G helper CTAs (other SMs) that prefetch.global.L2 the same rows (4 lines a row)
//  10 route 0 plus G helper CTAs issuing cp.async.bulk.prefetch.L2 (512 bytes a row) for the same rows
//  12 route 0 with half the rows a CTA (64) on twice the CTAs: the same bytes over twice the SMs
//  13 route 0 with an L2 prefetch size of 256 bytes on every copy (cp.async ... .L2::256B)
//  14 route 0 with .L2::128B
//  15 route 5 with .L2::256B
//  16 the rows split between the two copy paths: rows 0-63 by route 0's cp.async mapping (the load/store unit),
//     rows 64-127 by one 512-byte cp.async.bulk a row (the TMA unit, route 1), issued first, one mbarrier
//  17 as 16, the second half by route 3's four swizzled tensor copies a row (the kernel's tile layout for all rows)
//  18 as 16 with 96 rows by cp.async and 32 by bulk copies
//  19 as 16 with 32 rows by cp.async and 96 by bulk copies
//   9 no gather: index loads only (the launch and index floor)
// (twenty-fifth session: routes 8, 10 and 12 ask whether idle SMs can speed a CTA's gather. They cannot: at 60
// CTAs 3.25-3.49 us a launch against route 0's 3.16, benchmarks/results/sparse_mla_ab_h200_s25.json.)
// Each route's shared-memory image of launch 0, CTA 0 is checked against the rows it should hold.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>

#include "common.h"

constexpr int ROWS = 128, ROWB = 512, PITCH = 528, SMEM = 113 * 1024, BAR_OFF = 70 * 1024;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ int swz(int row, int c16) { return row * 128 + ((c16 ^ (row & 7)) << 4); }
// HINT: the L2 prefetch size asked with each copy (0 none, 1 .L2::128B, 2 .L2::256B): on a miss the L2 fetches
// that many bytes around the line, so a 512-byte row's later lines may already be on their way.
template <int HINT = 0>
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  if (HINT == 2) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes));
  } else if (HINT == 1) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes));
  }
}
__device__ __forceinline__ void bar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
__device__ __forceinline__ void bar_expect(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes));
}
__device__ __forceinline__ void bar_wait(uint32_t bar, int phase) {
  asm volatile("{\n .reg .pred p;\n W:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}"
               :: "r"(bar), "r"(phase) : "memory");
}
__device__ __forceinline__ void bulk(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// The kernel's cp.async mapping: 8 threads a 128-byte K block of a row, rows r0 + 16 i (i < N), one commit group a
// K block, into 128B-swizzled K-major tiles; then every thread's rows have landed.
template <int N, int HINT = 0>
__device__ __forceinline__ void cp_async_rows(uint32_t s, const uint8_t* pool, const int* idx, int tid) {
  int c16 = tid & 7, r0 = tid >> 3;
  long long off[N];
#pragma unroll
  for (int i = 0; i < N; ++i) off[i] = (long long)idx[r0 + 16 * i] * ROWB + c16 * 16;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      cp_async16<HINT>(s + kb * 16384 + swz(r0 + 16 * i, c16), pool + off[i] + kb * 128, 16);
    asm volatile("cp.async.commit_group;");
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
}

// A warp a row (route 5): lane l copies bytes 16 l .. 16 l + 15 of each of the warp's 32 rows, 4 commit groups.
template <int HINT>
__device__ __forceinline__ void warp_rows(uint32_t s, const uint8_t* pool, const int* idx, int tid) {
  int w = tid >> 5, lane = tid & 31, kb = lane >> 3, c16 = lane & 7;
  long long off[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) off[i] = (long long)idx[32 * w + i] * ROWB + lane * 16;
#pragma unroll
  for (int part = 0; part < 4; ++part) {
#pragma unroll
    for (int i = 8 * part; i < 8 * part + 8; ++i)
      cp_async16<HINT>(s + kb * 16384 + swz(32 * w + i, c16), pool + off[i], 16);
    asm volatile("cp.async.commit_group;");
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
}

// Routes 16-19: rows 0..R-1 by cp_async_rows, rows R..127 by the TMA unit (thread t < 128 - R issues row R + t's copy
// first). The bulk rows fill the tiles' rows the cp.async part leaves free (32 - R / 4 rows of 512 bytes a tile).
template <int R, bool TMA_SWZ>
__device__ __forceinline__ void mixed_rows(uint32_t s, uint32_t bar, const uint8_t* pool, const int* idx, int tid,
                                           const CUtensorMap* map) {
  constexpr int B = ROWS - R, PER_TILE = 32 - R / 4;
  if (tid == 0) bar_expect(bar, B * ROWB);
  if (tid < B) {
    const int row = idx[R + tid];
    if (TMA_SWZ) {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) tma2d(s + kb * 16384 + (R + tid) * 128, map, kb * 128, row, bar);
    } else {
      bulk(s + (tid / PER_TILE) * 16384 + R * 128 + (tid % PER_TILE) * ROWB, pool + (long long)row * ROWB, ROWB, bar);
    }
  }
  cp_async_rows<R / 16>(s, pool, idx, tid);
  bar_wait(bar, 0);
}

template <int ROUTE>
__global__ void __launch_bounds__(128) gather(const uint8_t* __restrict__ pool, const int* __restrict__ idx_all,
                                              long long* cyc, uint8_t* dump, int launch,
                                              const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x;
  const uint32_t s = smem_u32(smem), bars = s + BAR_OFF;
  constexpr bool HELPED = ROUTE == 8 || ROUTE == 10;
  const int G = HELPED ? gridDim.x / 2 : gridDim.x;
  const int cta = blockIdx.x % G;
  const int* idx = idx_all + ((size_t)launch * G + cta) * (ROUTE == 12 ? ROWS / 2 : ROWS);
  if (HELPED && blockIdx.x >= G) {  // helper: the main CTA's rows into L2, nothing into shared memory
    const uint8_t* row = pool + (long long)idx[tid] * ROWB;
    if (ROUTE == 8) {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) asm volatile("prefetch.global.L2 [%0];" :: "l"(row + kb * 128));
    } else {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(row), "r"(ROWB) : "memory");
    }
    return;
  }
  if (ROUTE == 1 || ROUTE == 2 || ROUTE == 3 || ROUTE == 7 || (ROUTE >= 16 && ROUTE <= 19)) {
    if (tid == 0) {
      for (int b = 0; b < 4; ++b) bar_init(bars + 8 * b, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  long long t0 = clock64();
  if (ROUTE == 6 || ROUTE == 7) {
    const uint8_t* row = pool + (long long)idx[tid] * ROWB;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) asm volatile("prefetch.global.L2 [%0];" :: "l"(row + kb * 128));
  }
  if (ROUTE == 0 || ROUTE == 6 || HELPED) {
    cp_async_rows<8>(s, pool, idx, tid);
  } else if (ROUTE == 16) {
    mixed_rows<64, false>(s, bars, pool, idx, tid, &map);
  } else if (ROUTE == 17) {
    mixed_rows<64, true>(s, bars, pool, idx, tid, &map);
  } else if (ROUTE == 18) {
    mixed_rows<96, false>(s, bars, pool, idx, tid, &map);
  } else if (ROUTE == 19) {
    mixed_rows<32, false>(s, bars, pool, idx, tid, &map);
  } else if (ROUTE == 12) {
    cp_async_rows<4>(s, pool, idx, tid);
  } else if (ROUTE == 13) {
    cp_async_rows<8, 2>(s, pool, idx, tid);
  } else if (ROUTE == 14) {
    cp_async_rows<8, 1>(s, pool, idx, tid);
  } else if (ROUTE == 15) {
    warp_rows<2>(s, pool, idx, tid);
  } else if (ROUTE == 5) {
    warp_rows<0>(s, pool, idx, tid);
  } else if (ROUTE == 1 || ROUTE == 7) {
    long long src = (long long)idx[tid] * ROWB;
    if (tid == 0) bar_expect(bars, ROWS * ROWB);
    bulk(s + tid * PITCH, pool + src, ROWB, bars);
    bar_wait(bars, 0);
  } else if (ROUTE == 2) {
    long long src = (long long)idx[tid] * ROWB;
    if (tid < 4) bar_expect(bars + 8 * tid, ROWS * 128);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) bulk(s + kb * 16384 + tid * 128, pool + src + kb * 128, 128, bars + 8 * kb);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) bar_wait(bars + 8 * kb, 0);
  } else if (ROUTE == 3) {
    int row = idx[tid];
    if (tid < 4) bar_expect(bars + 8 * tid, ROWS * 128);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) tma2d(s + kb * 16384 + tid * 128, &map, kb * 128, row, bars + 8 * kb);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) bar_wait(bars + 8 * kb, 0);
  } else if (ROUTE == 4) {
    int c16 = tid & 7, r0 = tid >> 3;
    uint4 v[32];
    long long off[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) off[i] = (long long)idx[r0 + 16 * i] * ROWB + c16 * 16;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int i = 0; i < 8; ++i) v[kb * 8 + i] = __ldcg((const uint4*)(pool + off[i] + kb * 128));
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int i = 0; i < 8; ++i) *(uint4*)(smem + kb * 16384 + swz(r0 + 16 * i, c16)) = v[kb * 8 + i];
    __syncthreads();
  } else {
    volatile int x = idx[tid];
    (void)x;
    __syncthreads();
  }
  long long t1 = clock64();
  if (tid == 0) cyc[blockIdx.x] = t1 - t0;  // helpers return before: their slots keep a main CTA's or 0
  if (launch == 0 && blockIdx.x == 0 && dump) {
    for (int i = tid; i < 70 * 1024 / 16; i += 128) ((uint4*)dump)[i] = ((uint4*)smem)[i];
  }
}

__global__ void fill(uint8_t* pool, size_t bytes) {
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < bytes; k += (size_t)gridDim.x * blockDim.x)
    pool[k] = (uint8_t)(((k / ROWB) * 131 + (k % ROWB) * 7) & 255);
}

typedef void (*kfn)(const uint8_t*, const int*, long long*, uint8_t*, int, const CUtensorMap);

template <int R> kfn pick() { return gather<R>; }

// Byte j of row r in the image of route R (-1: not held there).
static long image_off(int route, int r, int j) {
  int kb = j / 128, c16 = (j % 128) / 16, b = j % 16;
  if (route == 1 || route == 7) return (long)r * PITCH + j;
  if (route == 2) return kb * 16384 + r * 128 + (j % 128);
  const int split = route == 16 ? 64 : route == 18 ? 96 : route == 19 ? 32 : ROWS;
  if (r >= split) {  // a bulk row of routes 16, 18, 19: 512 bytes in a tile's free rows
    const int per_tile = 32 - split / 4, b2 = r - split;
    return (b2 / per_tile) * 16384 + split * 128 + (b2 % per_tile) * ROWB + j;
  }
  return kb * 16384 + r * 128 + ((c16 ^ (r & 7)) << 4) + b;  // 0, 3, 4, 5: 128B swizzle
}

int main() {
  // GATHER_POOL_MIB: the pool's size (default 8 GiB: random rows far apart, every page's translation cold);
  // GATHER_GRIDS="5 60": the gathering grids (default 60 132 264; 5 CTAs are one width-640 token's cluster).
  size_t pool_rows = (size_t)16 << 20;  // 8 GiB of 512-byte rows
  if (const char* env = getenv("GATHER_POOL_MIB")) pool_rows = (size_t)atol(env) << 11;
  const int NL = 200;
  std::vector<int> grids = {60, 132, 264};
  if (const char* env = getenv("GATHER_GRIDS")) {
    grids.clear();
    for (const char* c = env; *c;) {
      char* end; long v = strtol(c, &end, 10);
      if (end == c) { ++c; continue; }
      grids.push_back((int)v); c = end;
    }
  }
  uint8_t* pool; CK(cudaMalloc(&pool, pool_rows * ROWB));
  fill<<<4096, 256>>>(pool, pool_rows * ROWB);  // byte j of row r: (r * 131 + j * 7) & 255
  CK(cudaDeviceSynchronize());
  std::mt19937_64 rng(7);
  std::vector<int> h_idx((size_t)NL * 264 * ROWS);
  for (auto& x : h_idx) x = (int)(rng() % pool_rows);
  int* idx; CK(cudaMalloc(&idx, h_idx.size() * 4));
  CK(cudaMemcpy(idx, h_idx.data(), h_idx.size() * 4, cudaMemcpyHostToDevice));
  long long* cyc; CK(cudaMalloc(&cyc, 264 * 8));
  uint8_t* dump; CK(cudaMalloc(&dump, 70 * 1024));

  CUtensorMap map;
  {
    cuuint64_t dims[2] = {ROWB, pool_rows};
    cuuint64_t strides[1] = {ROWB};
    cuuint32_t box[2] = {128, 1}, estr[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, pool, dims, strides, box, estr,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("{\"error\": \"tensor map %d\"}\n", (int)r); return 1; }
  }
  // GATHER_ROUTES="0 8 10 12 9" runs those routes only (default: all).
  std::vector<int> routes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 9};
  std::vector<kfn> fns = {pick<0>(), pick<1>(), pick<2>(), pick<3>(), pick<4>(), pick<5>(), pick<6>(), pick<7>(),
                          pick<8>(), pick<10>(), pick<12>(), pick<13>(), pick<14>(), pick<15>(), pick<16>(),
                          pick<17>(), pick<18>(), pick<19>(), pick<9>()};
  std::vector<int> wanted;
  if (const char* env = getenv("GATHER_ROUTES")) {
    for (const char* c = env; *c;) {
      char* end; long v = strtol(c, &end, 10);
      if (end == c) { ++c; continue; }
      wanted.push_back((int)v); c = end;
    }
  }
  for (auto f : fns) CK(cudaFuncSetAttribute((const void*)f, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (size_t ri = 0; ri < routes.size(); ++ri) {
    int route = routes[ri];
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), route) == wanted.end()) continue;
    for (int G0 : grids) {
      // Routes 8 and 10 launch G0 helpers beside G0 gathering CTAs; route 12 2 G0 CTAs of 64 rows.
      const int G = (route == 8 || route == 10 || route == 12) ? 2 * G0 : G0;
      if (G > 264) continue;
      const int check_rows = route == 12 ? ROWS / 2 : ROWS;
      // Check: launch 0, CTA 0's image.
      CK(cudaMemset(dump, 0, 70 * 1024));
      fns[ri]<<<G, 128, SMEM, st>>>(pool, idx, cyc, dump, 0, map);
      CK(cudaStreamSynchronize(st));
      long bad = 0;
      if (route != 9) {
        std::vector<uint8_t> img(70 * 1024);
        CK(cudaMemcpy(img.data(), dump, img.size(), cudaMemcpyDeviceToHost));
        for (int r = 0; r < check_rows; ++r)
          for (int j = 0; j < ROWB; ++j) {
            size_t row = h_idx[r];
            if (img[image_off(route, r, j)] != (uint8_t)((row * 131 + j * 7) & 255)) ++bad;
          }
      }
      // Timing: a graph of NL launches, each on its own rows; replayed 5 times (rows re-used only
      // every NL launches: 200 x G x 64 KiB, far past the L2).
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int l = 0; l < NL; ++l) fns[ri]<<<G, 128, SMEM, st>>>(pool, idx, cyc, nullptr, l, map);
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, st));
      std::vector<float> us;
      for (int rep = 0; rep < 5; ++rep) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(ms * 1000.f / NL);
      }
      std::sort(us.begin(), us.end());
      const int gathering = (route == 8 || route == 10) ? G0 : G;
      std::vector<long long> c(gathering);
      CK(cudaMemcpy(c.data(), cyc, gathering * 8, cudaMemcpyDeviceToHost));
      std::sort(c.begin(), c.end());
      printf("{\"route\": %d, \"ctas\": %d, \"grid\": %d, \"pool_mib\": %zu, \"us_per_launch_median\": %.3f, "
             "\"us_min\": %.3f, \"cycles_median\": %lld, \"cycles_max\": %lld, \"image_bad_bytes\": %ld}\n",
             route, G0, G, pool_rows >> 11, us[2], us[0], c[gathering / 2], c[gathering - 1], bad);
      fflush(stdout);
      CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    }
  }
  return 0;
}
