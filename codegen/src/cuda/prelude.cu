// Helpers every g4c kernel uses. Floats narrower than f32 are stored as raw 16-bit words and
// computed in f32, rounded to their type after every op, as the reference interpreter does; so
// nothing here needs cuda_fp16.h, and Turing (no bf16 arithmetic) only ever shifts bf16 bits.
typedef unsigned short u16;
typedef unsigned char u8;

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
__device__ __forceinline__ unsigned ld_word(const u8* p, int w) { return ((const unsigned*)p)[w]; }
// Value i of a word, sign-extended.
__device__ __forceinline__ int nib(unsigned word, int i) { return ((int)(word << (28 - 4 * i))) >> 28; }
// Eight consecutive floats of 16-byte-aligned shared memory, in two 128-bit loads.
#ifndef G4C_HOST_EMULATION
__device__ __forceinline__ void ld8(const float* p, float* v) {
  const float4 x = *(const float4*)p, y = *(const float4*)(p + 4);
  v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w; v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
}
#else
inline void ld8(const float* p, float* v) { for (int i = 0; i < 8; ++i) v[i] = p[i]; }
#endif
__device__ __forceinline__ float fmax_nan(float a, float b) { return (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }
__device__ __forceinline__ float fmin_nan(float a, float b) { return (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fminf(a, b); }
__device__ __forceinline__ float sgn(float a) { return (a == 0.f || isnan(a)) ? a : copysignf(1.f, a); }
__device__ __forceinline__ int isgn(int a) { return (a > 0) - (a < 0); }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmin_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
