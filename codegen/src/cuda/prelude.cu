// Helpers every g4c kernel uses. Floats narrower than f32 are stored as raw 16-bit words and
// computed in f32, rounded to their type after every op, as the reference interpreter does; so
// nothing here needs cuda_fp16.h, and Turing (no bf16 arithmetic) only ever shifts bf16 bits.
typedef unsigned short u16;
typedef unsigned char u8;
// `p`, the address of a load `bytes` wide, which a GPU needs `bytes`-aligned (else it faults); the
// host emulator, whose loads do not care, checks it.
#ifdef G4C_HOST_EMULATION
#define ALIGNED(p, bytes) g4c_aligned(p, bytes)
#else
#define ALIGNED(p, bytes) (p)
#endif

#ifndef G4C_HOST_EMULATION
__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
// Round to nearest even; a NaN stays a (quiet) NaN of the same sign.
__device__ __forceinline__ u16 f2b(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float rf16(float x) { return h2f(f2h(x)); }
__device__ __forceinline__ float rbf16(float x) { return b2f(f2b(x)); }
__device__ __forceinline__ int ld_i4(const u8* p, int i) {
  int b = p[i >> 1];
  int n = (i & 1) ? (b >> 4) : (b & 15);
  return (n ^ 8) - 8;
}
// Word `w` of a packed 4-bit array (4-byte aligned): values 8w .. 8w + 7, value 8w + i in bits
// 4i .. 4i + 3, as ld_i4 reads them one by one.
__device__ __forceinline__ unsigned ld_word(const u8* p, int w) { return ((const unsigned*)ALIGNED(p, 4))[w]; }
// Value i of a word, sign-extended.
__device__ __forceinline__ int nib(unsigned word, int i) { return ((int)(word << (28 - 4 * i))) >> 28; }
// Fused multiply-adds of two bf16 or f16 pairs, each half rounded once to nearest even: sm_80's
// fma.rn.bf16x2 and sm_53's fma.rn.f16x2. The host's stand-in rounds fmaf's f32 result, which is
// the same for the operands g4c passes them (a product of a 4-bit integer and a 16-bit float is
// exact in f32, and so is its sum with -0 or with the integer 136 or 1032).
#ifdef G4C_HOST_EMULATION
template <float (*widen)(u16), u16 (*narrow)(float)> unsigned fma_pairs(unsigned a, unsigned b, unsigned c) {
  const u16 lo = narrow(fmaf(widen((u16)a), widen((u16)b), widen((u16)c)));
  const u16 hi = narrow(fmaf(widen((u16)(a >> 16)), widen((u16)(b >> 16)), widen((u16)(c >> 16))));
  return lo | ((unsigned)hi << 16);
}
__device__ __forceinline__ unsigned fma_bf16x2(unsigned a, unsigned b, unsigned c) { return fma_pairs<b2f, f2b>(a, b, c); }
__device__ __forceinline__ unsigned fma_f16x2(unsigned a, unsigned b, unsigned c) { return fma_pairs<h2f, f2h>(a, b, c); }
#else
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned fma_bf16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
#endif
__device__ __forceinline__ unsigned fma_f16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
#endif
// The 8 values of a packed word times a 16-bit `scale`, each rounded once to the scale's type, into
// v[0..8], two values per instruction and without converting integers: each nibble, offset to
// q + 8, is put in the low mantissa bits of `zero` (128 in bf16, 1024 in f16: their last mantissa
// bit is worth 1), `minus_zero` (-136, -1032) leaves q exactly, and one multiply by the scale in
// the 16-bit type rounds q·s once, as rounding the f32 product does. -0 as the addend keeps the
// sign of a zero product. Nibbles j and j + 4 share a pair, so a shift and a mask free each pair.
template <unsigned (*fma2)(unsigned, unsigned, unsigned), float (*widen)(u16)>
__device__ __forceinline__ void dequant8_pairs(unsigned word, u16 scale, unsigned zero, unsigned one, unsigned minus_zero,
                                               float* v) {
  const unsigned x = word ^ 0x88888888u;
  const unsigned s2 = (unsigned)scale * 0x10001u;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned q = fma2(((x >> (4 * j)) & 0x000f000fu) | zero, one, minus_zero);
    const unsigned w = fma2(q, s2, 0x80008000u);
    v[j] = widen((u16)w);
    v[j + 4] = widen((u16)(w >> 16));
  }
}
// rbf16((float)nib(word, i) * s) for a bf16 value `s` (GPUs with bf16 arithmetic, sm_80 on).
#if defined(G4C_HOST_EMULATION) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ void dequant8_bf16(unsigned word, float s, float* v) {
  dequant8_pairs<fma_bf16x2, b2f>(word, (u16)(__float_as_uint(s) >> 16), 0x43004300u, 0x3f803f80u, 0xc308c308u, v);
}
#endif
// rf16((float)nib(word, i) * s). Turing converts integers and floats at a quarter of its multiply
// rate, two conversions a weight value by value. The pairs multiply by `s` in f16, so a scale f16
// cannot hold exactly (a bf16 or f32 scale outside f16's range, say) is taken value by value.
__device__ __forceinline__ void dequant8_f16(unsigned word, float s, float* v) {
  const u16 sh = f2h(s);
  if (h2f(sh) != s) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = rf16((float)nib(word, i) * s);
    return;
  }
  dequant8_pairs<fma_f16x2, h2f>(word, sh, 0x64006400u, 0x3c003c00u, 0xe408e408u, v);
}
// Eight consecutive floats of 16-byte-aligned shared memory, in two 128-bit loads.
#ifndef G4C_HOST_EMULATION
__device__ __forceinline__ void ld8(const float* p, float* v) {
  const float4 x = *(const float4*)p, y = *(const float4*)(p + 4);
  v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w; v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
}
#else
inline void ld8(const float* p, float* v) { std::memcpy(v, ALIGNED(p, 16), 32); }
#endif
// Eight consecutive 16-bit elements of 16-byte-aligned memory in one 128-bit load, as four pairs
// (the first element in the low half of v[0]).
#ifndef G4C_HOST_EMULATION
__device__ __forceinline__ void ld8_pairs(const u16* p, unsigned* v) {
  const uint4 x = *(const uint4*)p;
  v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
}
#else
inline void ld8_pairs(const u16* p, unsigned* v) { std::memcpy(v, ALIGNED(p, 16), 16); }
#endif
// Two consecutive 16-bit elements (4-byte aligned) as one MMA operand register, the first in the
// low half.
__device__ __forceinline__ unsigned ld_pair(const u16* p) { return *(const unsigned*)ALIGNED(p, 4); }
// mma.sync with f32 accumulators, D += A · B, fragments as the PTX ISA lays them out (row-major A,
// column-major B). m16n8k8 f16 is Turing's; m16n8k16 (f16, bf16) needs sm_80.
#ifndef G4C_HOST_EMULATION
__device__ __forceinline__ void mma_f16_k8(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(b[0]));
}
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void mma_f16_k16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16_k16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
#endif
// Programmatic dependent launch (sm_90): launched with it, a kernel's blocks may be scheduled while
// the kernel before it still runs. Every g4c kernel lets the next one be scheduled as it starts,
// and then waits for the one before it to finish and its writes to be visible, before it reads
// or writes anything but weights: what the launch saves is the gap between the two. Launched
// without it, or compiled for an older GPU, both are nothing.
//
// The wait takes the pointers to what a kernel before may write or read (a call's inputs and
// output) and hands each to an empty asm that may access memory through it: the compiler must
// then keep their loads and stores after the wait, and reads an input coherently. Otherwise NVVM
// reads an input the kernel does not write through the non-coherent path (`ld.global.nc`, for
// data unchanged during the kernel's whole life), and ptxas moved such loads of a matvec's
// staging above a bare `griddepcontrol.wait`, into the kernel before's last writes.
#ifndef G4C_HOST_EMULATION
__device__ __forceinline__ void written_before(const void* p) { asm volatile("" ::"l"(p) : "memory"); }
#else
__device__ __forceinline__ void written_before(const void*) {}
#endif
#if !defined(G4C_HOST_EMULATION) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void let_next_kernel_start() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
template <typename... Written> __device__ __forceinline__ void await_previous_kernel(const Written*... written) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  (written_before(written), ...);
}
#else
__device__ __forceinline__ void let_next_kernel_start() {}
template <typename... Written> __device__ __forceinline__ void await_previous_kernel(const Written*...) {}
#endif
// A launch's shared-memory region (`SharedRegion`): a static array up to 48 KiB; beyond, `extern`,
// its bytes passed at launch as dynamic shared memory (the runtime opts the function in to them).
// On the host emulator each is its block's region, which it fills with NaNs before each block (a
// GPU's is not initialized either), and it checks that a dynamic one's launch passed its bytes.
#ifndef G4C_HOST_EMULATION
#define STATIC_REGION(name, bytes) __shared__ __align__(16) unsigned char name[bytes]
#define DYNAMIC_REGION(name, bytes) extern __shared__ __align__(16) unsigned char name[]
#else
#define STATIC_REGION(name, bytes) unsigned char* const name = g4c_block_region(bytes, false)
#define DYNAMIC_REGION(name, bytes) unsigned char* const name = g4c_block_region(bytes, true)
#endif
// Work that needs what several blocks wrote runs on the last of them to finish (a split GEMM's sum
// of its tile's partial sums, a call's tail `KernelCall::tail`), which `last_block_of` tells each
// of `blocks` blocks: every block counts itself in `count` once its writes are fenced, and the
// last, fenced after its count, sees them all; it resets the count for the next launch, whose
// blocks touch it only once they have waited for this one. Every thread of the block calls it.
// A tail reads what its call wrote during this very kernel: its pointers go through
// `written_in_this_kernel`, so that none is read through the non-coherent path, which is for data
// no thread of the kernel writes.
__device__ __forceinline__ bool last_block_of(unsigned* count, unsigned blocks) {
  __threadfence();
  __syncthreads();
  const bool last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(count, 1u) == blocks - 1);
  if (last) {
    __threadfence();
    if (threadIdx.x == 0) *count = 0;
  }
  return last;
}
template <typename... Written> __device__ __forceinline__ void written_in_this_kernel(const Written*... written) {
  (written_before(written), ...);
}
// Asks L2 for the global bytes [p, p + bytes), the block's threads a 128-byte line each at a time:
// what a block will read that no kernel writes (weights). `prefetch_l2_lines` asks on every GPU (a
// block striding over a matvec's columns asks for its next group's weights while it works on one:
// `kernel/matvec.rs`); `prefetch_l2` asks ahead of a block's wait for the kernel before it
// (`kernel/ahead.rs`), so only where kernels wait (sm_90; elsewhere it would come just before the
// loads it serves). The host emulator defines its own, which check that the bytes lie within one of
// the launch's arguments.
#if !defined(G4C_HOST_EMULATION)
__device__ __forceinline__ void prefetch_l2_lines(const void* p, unsigned bytes) {
  const u8* const first = (const u8*)p;
  // Lines from the one holding `first`, each asked for by an address of it within the bytes.
  const unsigned before = (unsigned)(unsigned long long)first & 127;
  for (unsigned line = threadIdx.x * 128; line < before + bytes; line += blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(first + (line > before ? line - before : 0)));
}
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  prefetch_l2_lines(p, bytes);
#endif
}
#endif
// IEEE max and min: the canonical NaN if either operand is NaN (fmaxf and fminf return the other
// one), as the interpreter's. Without a branch: written as `isnan(a) || isnan(b) ? NaN : ...`,
// the compiler skips loading `b` once a running maximum is NaN, so an unrolled reduction waits
// for each load before issuing the next.
__device__ __forceinline__ unsigned nan_mask(float a, float b) {
  const unsigned nan_a = (__float_as_uint(a) & 0x7fffffffu) > 0x7f800000u;
  const unsigned nan_b = (__float_as_uint(b) & 0x7fffffffu) > 0x7f800000u;
  return 0u - (nan_a | nan_b);
}
__device__ __forceinline__ float nan_or(float x, unsigned mask) {
  return __uint_as_float((__float_as_uint(x) & ~mask) | (0x7fc00000u & mask));
}
__device__ __forceinline__ float fmax_nan(float a, float b) { return nan_or(fmaxf(a, b), nan_mask(a, b)); }
__device__ __forceinline__ float fmin_nan(float a, float b) { return nan_or(fminf(a, b), nan_mask(a, b)); }
__device__ __forceinline__ float sgn(float a) { return (a == 0.f || isnan(a)) ? a : copysignf(1.f, a); }
__device__ __forceinline__ int isgn(int a) { return (a > 0) - (a < 0); }
// A reduction's combining step, per accumulator type (float's max and min propagate NaN).
__device__ __forceinline__ float max_of(float a, float b) { return fmax_nan(a, b); }
__device__ __forceinline__ float min_of(float a, float b) { return fmin_nan(a, b); }
__device__ __forceinline__ int max_of(int a, int b) { return max(a, b); }
__device__ __forceinline__ int min_of(int a, int b) { return min(a, b); }
// The same over a warp's lanes, a butterfly of xor shuffles; every lane gets the result. (The host
// emulator has its own butterfly, which exchanges the lanes' values once rather than five times.)
#ifndef G4C_HOST_EMULATION
template <typename T, typename F> __device__ __forceinline__ T warp_butterfly(T v, F combine) {
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
#endif
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
  return warp_butterfly(v, [](T a, T b) { return a + b; });
}
template <typename T> __device__ __forceinline__ T warp_max(T v) {
  return warp_butterfly(v, [](T a, T b) { return max_of(a, b); });
}
template <typename T> __device__ __forceinline__ T warp_min(T v) {
  return warp_butterfly(v, [](T a, T b) { return min_of(a, b); });
}
