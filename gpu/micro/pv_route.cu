// Microbenchmark (issue 3, PV route): cycles for one warp's share of O = P V on Hopper, where V is a
// [128 rows x 512 dims] FP8 tile in shared memory (dims contiguous) and P [16 heads x 128 rows].
// Routes: FP16 mma.sync (m16n8k16, FP32 accumulate) with V converted to FP16 in registers, either
// by cvt (F2FP) or by integer bit moves; plus conversion-only and MMA-only bounds.
#include <cstdint>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_fp16.h>

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s)); return d;
}
__device__ __forceinline__ uint32_t cvt_e4m3x2(uint32_t x16) {
  uint32_t d; asm("{.reg .b16 t; mov.b32 {t, _}, %1; cvt.rn.f16x2.e4m3x2 %0, t;}" : "=r"(d) : "r"(x16)); return d;
}
// FP8 E4M3 pair (bytes placed in the high byte of each 16-bit lane) -> FP16 pair of x * 2^-8.
__device__ __forceinline__ uint32_t bits_e4m3x2(uint32_t hi_bytes) {
  uint32_t d; asm("lop3.b32 %0, %1, %2, %3, 0xe4;" : "=r"(d) : "r"(0x80008000u), "r"(hi_bytes), "r"((hi_bytes >> 1) & 0x3f803f80u));
  return d;  // (a & b) | (~a & c) with a = sign mask
}
__device__ __forceinline__ void hmma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int ROUTE>  // 0: cvt, 1: bits, 2: mma only (no V), 3: convert only (no mma)
__global__ void __launch_bounds__(128) pv(float* out, long long* cycles, const uint8_t* vg) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* sv = smem;                 // [128 rows][512 dims] fp8, 16B chunks XOR-swizzled by row & 7 within each 128B block
  __half* sp = (__half*)(smem + 65536);  // [16 heads][128 rows] f16
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = tid; i < 65536 / 16; i += 128) ((uint4*)sv)[i] = ((const uint4*)vg)[i];
  for (int i = tid; i < 16 * 128; i += 128) sp[i] = __float2half(0.001f * (i % 7));
  __syncthreads();
  float acc[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  long long t0 = clock64();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {  // 32 rows a step
    // P fragments for two k16 steps (heads x rows, row-major f16, 256 B a head)
    uint32_t pa[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = lane & 15, c = 32 * kk + 16 * h + 8 * (lane >> 4);
      ldsm_x4(smem_u32(sp + r * 128 + c), pa[h][0], pa[h][1], pa[h][2], pa[h][3]);
    }
#pragma unroll
    for (int dg = 0; dg < 8; ++dg) {  // 16-dim groups of this warp's 128 dims
      int mi = lane >> 3, i = lane & 7;
      int row = 32 * kk + 8 * mi + i;
      int dim = 128 * warp + 16 * dg;
      int blk = dim >> 7, c16 = (dim & 127) >> 4;
      uint32_t addr = smem_u32(sv + blk * 16384 + row * 128 + ((c16 ^ (row & 7)) << 4));
      uint32_t x[4];
      ldsm_x4_t(addr, x[0], x[1], x[2], x[3]);
      // x[m]: rows 8m + 2t, 8m + 2t + 1 x dims 2g, 2g + 1 (bytes r0d0 r0d1 r1d0 r1d1)
      uint32_t be[4], bo[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (ROUTE == 0 || ROUTE == 3) {
          uint32_t y = prmt(x[m], 0, 0x3120);  // r0d0 r1d0 r0d1 r1d1
          be[m] = cvt_e4m3x2(y & 0xffff);
          bo[m] = cvt_e4m3x2(y >> 16);
        } else if (ROUTE == 1) {
          be[m] = bits_e4m3x2(prmt(x[m], 0, 0x2404));  // lanes: r0d0 << 8, r1d0 << 8
          bo[m] = bits_e4m3x2(prmt(x[m], 0, 0x3414));
        } else {
          be[m] = x[m]; bo[m] = x[m] ^ 0x1234;
        }
      }
      if (ROUTE != 3) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          hmma(acc[2 * dg], pa[h][0], pa[h][1], pa[h][2], pa[h][3], be[2 * h], be[2 * h + 1]);
          hmma(acc[2 * dg + 1], pa[h][0], pa[h][1], pa[h][2], pa[h][3], bo[2 * h], bo[2 * h + 1]);
        }
      } else {
#pragma unroll
        for (int m = 0; m < 4; ++m) { acc[2 * dg][m] += __uint_as_float(be[m]); acc[2 * dg + 1][m] += __uint_as_float(bo[m]); }
      }
    }
  }
  // make the accumulators observable before the stop clock
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  asm volatile("" :: "f"(s));
  __syncwarp();
  long long t1 = clock64();
  out[blockIdx.x * 128 + tid] = s;
  if (lane == 0) cycles[blockIdx.x * 4 + warp] = t1 - t0;
}

template <int R>
void run(const char* name, int ctas, float* out, long long* cyc, uint8_t* vg) {
  cudaFuncSetAttribute(pv<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536 + 4096);
  for (int rep = 0; rep < 3; ++rep) pv<R><<<ctas, 128, 65536 + 4096>>>(out, cyc, vg);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int rep = 0; rep < 20; ++rep) pv<R><<<ctas, 128, 65536 + 4096>>>(out, cyc, vg);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  std::vector<long long> h(ctas * 4);
  cudaMemcpy(h.data(), cyc, h.size() * 8, cudaMemcpyDeviceToHost);
  std::sort(h.begin(), h.end());
  printf("{\"route\": \"%s\", \"ctas\": %d, \"warp_cycles_median\": %lld, \"warp_cycles_max\": %lld, \"us_per_launch\": %.3f, \"err\": \"%s\"}\n",
         name, ctas, h[h.size() / 2], h.back(), ms * 1000 / 20, cudaGetErrorString(cudaGetLastError()));
}

int main() {
  float* out; long long* cyc; uint8_t* vg;
  cudaMalloc(&out, 264 * 128 * 4); cudaMalloc(&cyc, 264 * 4 * 8); cudaMalloc(&vg, 65536);
  std::vector<uint8_t> hv(65536); for (int i = 0; i < 65536; ++i) hv[i] = (uint8_t)((i * 37) & 0x77);
  cudaMemcpy(vg, hv.data(), 65536, cudaMemcpyHostToDevice);
  for (int ctas : {132, 264}) {
    run<0>("cvt_f2fp+hmma", ctas, out, cyc, vg);
    run<1>("bits+hmma", ctas, out, cyc, vg);
    run<2>("hmma_only", ctas, out, cyc, vg);
    run<3>("cvt_only", ctas, out, cyc, vg);
  }
  return 0;
}
