// Host emulation of the CUDA C that g4c emits, so the kernels NVRTC compiles for a GPU also run on
// the CPU: the same source, compiled by the host C++ compiler with these definitions.
//
// A GPU runs a launch's blocks, a block's warps and a warp's lanes in any order; the emulator runs
// them one after another, in orders that change so that a kernel relying on one order (reading
// what another block, warp or lane writes, with no barrier between) reads it unwritten in another.
// Which orders a launch takes comes from the bits of its count times 2^32 / golden ratio
// (`g4c_orders`), whose top bits take every value along any arithmetic run of counts: a sequence of
// N launches, run step after step, gives each of them every order.
//
// A launch runs its blocks one after another, each to its end: the even ones upward, then the odd
// ones downward, so that for any distance some block runs before the one that far above it and
// some after (given blocks enough: the first and the last, and the two of a 2-block launch, take
// both orders across launches, the whole order mirrored in some of them).
//
// Kernels that synchronize (`__syncthreads`, warp shuffles) run each block's threads as coroutines
// on one host thread (a stack switch): a barrier switches to the next thread, and since every
// thread meets the same barriers in the same order, running the threads round-robin from barrier
// to barrier is exactly a barrier. A warp's exchange waits for its warp alone: between two of the
// block's barriers each warp runs on its own, in turn, so that shared memory one warp writes and
// another reads without a block barrier between them shows as it could on a GPU: the last warp
// first (a warp writing what an earlier one has yet to read) or the first first (a warp reading
// what a later one has yet to write), flipping from block to block. Within a warp the lanes run in
// turn from warp barrier to warp barrier, lane 0 first or lane 31 first, flipping every other
// block, so that a lane reading shared memory another lane wrote without a barrier between them
// (which a GPU's independently scheduled lanes may run in either order) reads it unwritten in one
// of the orders.
//
// Barriers must be met uniformly, as a GPU needs and the round-robin assumes: every lane of a warp
// at each of its exchanges, every thread of a block at each of its barriers. A launch in which a
// warp's lanes part ways (some at an exchange, others at a block barrier or returned) or a block's
// threads do (some returned while others wait at a barrier), or in which a warp's lanes meet at two
// different exchanges (a butterfly summing and one taking the maximum, or a butterfly and a
// tensor-core product), is refused. (Two places in a kernel taking the same exchange are not told
// apart: on sm_70 and later, shuffles of the same kind at two places do meet.)
//
// The other kernels run their threads in a plain loop, the first or the last first as lanes do.
#pragma once
#define G4C_HOST_EMULATION 1
#include <ucontext.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cstdint>
#include <vector>

// Internal linkage throughout: GCC makes inline variables process-wide (STB_GNU_UNIQUE), which would
// let two loaded programs, emulated at once, share one launch's state.
struct g4c_dim3 { unsigned x = 0, y = 0, z = 0; };
static g4c_dim3 threadIdx, blockIdx, blockDim, gridDim;
static float g4c_exchange[1024];

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
using std::isnan;
using std::max;
using std::min;

static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }

// A kernel is called with G4C_MAX_ARGS pointers, of which it reads its own (the x86-64 and AArch64
// calling conventions let a caller pass more arguments than the callee takes).
#define G4C_MAX_ARGS 64
#define G4C_P8 void*, void*, void*, void*, void*, void*, void*, void*
#define G4C_A8(n) a[n], a[n + 1], a[n + 2], a[n + 3], a[n + 4], a[n + 5], a[n + 6], a[n + 7]
typedef void (*g4c_kernel)(G4C_P8, G4C_P8, G4C_P8, G4C_P8, G4C_P8, G4C_P8, G4C_P8, G4C_P8);

// The coroutines of one block.
static std::vector<std::vector<char>> g4c_stacks;
static unsigned g4c_current;
static g4c_kernel g4c_running;
static void* g4c_args[G4C_MAX_ARGS];
// The bytes of each argument's buffer, and whether a prefetch asked for bytes outside all of them.
static unsigned long long g4c_arg_bytes[G4C_MAX_ARGS];
static int g4c_nargs;
static bool g4c_prefetch_outside;
// Whether a load or an atomic read an address its width does not divide, where a GPU faults
// ("misaligned address"); the host's loads do not. g4c's prelude passes each wide load's address
// through `g4c_aligned` (its `ALIGNED`).
static bool g4c_misaligned;
template <typename T> static inline T* g4c_aligned(T* p, unsigned bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) g4c_misaligned = true;
  return p;
}

static void g4c_call() {
  void** a = g4c_args;
  g4c_running(G4C_A8(0), G4C_A8(8), G4C_A8(16), G4C_A8(24), G4C_A8(32), G4C_A8(40), G4C_A8(48), G4C_A8(56));
}

// Set by a thread whose kernel returned (rather than reaching a barrier) before it goes back to the
// scheduler for good.
static bool g4c_thread_returned;

#if defined(__x86_64__)
// Switching coroutines on x86-64: push the callee-saved registers, save the stack pointer in
// `*from`, continue on stack `to` where its own switch left off. glibc's swapcontext also saves the
// signal mask, a system call per switch, which made barriers most of an emulated launch's time.
// `noipa`: callers must assume it clobbers every caller-saved register, as any call does (with
// interprocedural register allocation, GCC could see an asm body that names few registers).
static void* g4c_scheduler_sp;
static std::vector<void*> g4c_thread_sp;
__attribute__((naked, noipa)) static void g4c_switch(void** from, void* to) {
  asm volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
static void g4c_thread_main() {
  g4c_call();
  g4c_thread_returned = true;
  void* finished;
  g4c_switch(&finished, g4c_scheduler_sp);
  __builtin_unreachable();
}
// Thread `t`'s stack as a switch away from it would leave it, about to enter g4c_thread_main as if
// called (the stack 16-byte aligned below a return address it never uses).
static void g4c_prepare(unsigned t) {
  g4c_thread_sp.resize(g4c_stacks.size());
  void** sp = (void**)((uintptr_t)(g4c_stacks[t].data() + g4c_stacks[t].size()) & ~(uintptr_t)15);
  *--sp = nullptr;
  *--sp = (void*)g4c_thread_main;
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  g4c_thread_sp[t] = sp;
}
static inline void g4c_resume(unsigned t) { g4c_switch(&g4c_scheduler_sp, g4c_thread_sp[t]); }
// Back to the scheduler, which resumes the next thread; this one continues when its turn comes.
static inline void g4c_yield() { g4c_switch(&g4c_thread_sp[g4c_current], g4c_scheduler_sp); }
#else
static ucontext_t g4c_scheduler;
static std::vector<ucontext_t> g4c_threads;
static void g4c_thread_main() {
  g4c_call();
  g4c_thread_returned = true;
}
static void g4c_prepare(unsigned t) {
  g4c_threads.resize(g4c_stacks.size());
  getcontext(&g4c_threads[t]);
  g4c_threads[t].uc_stack.ss_sp = g4c_stacks[t].data();
  g4c_threads[t].uc_stack.ss_size = g4c_stacks[t].size();
  g4c_threads[t].uc_link = &g4c_scheduler;
  makecontext(&g4c_threads[t], g4c_thread_main, 0);
}
static inline void g4c_resume(unsigned t) { swapcontext(&g4c_scheduler, &g4c_threads[t]); }
static inline void g4c_yield() { swapcontext(&g4c_threads[g4c_current], &g4c_scheduler); }
#endif

// Whether the thread that last went back to the scheduler waits at its block's barrier, rather
// than at its warp's.
static bool g4c_at_block_barrier;
static inline void __syncthreads() {
  g4c_at_block_barrier = true;
  g4c_yield();
}
// A warp's barrier: its lanes' exchanges (shuffles, tensor-core fragments) wait for its lanes only.
// `site` names the exchange and its step, so that lanes at different ones are told apart.
static const void* g4c_warp_site;
static inline void g4c_warp_barrier(const void* site) {
  g4c_at_block_barrier = false;
  g4c_warp_site = site;
  g4c_yield();
}

// A barrier that returns whether any thread of the block passed a non-zero `predicate`: the votes
// are taken between two barriers, after a first that keeps the previous vote's readers from seeing
// this one's reset.
static int g4c_vote;
static inline int __syncthreads_or(int predicate) {
  __syncthreads();
  if (threadIdx.x == 0) g4c_vote = 0;
  __syncthreads();
  if (predicate) g4c_vote = 1;
  __syncthreads();
  return g4c_vote;
}

// Blocks run one after another, each to its end (see the top): a block's writes are seen by every
// later one.
static inline void __threadfence() {}
static inline unsigned atomicAdd(unsigned* address, unsigned value) {
  const unsigned old = *g4c_aligned(address, 4);
  *address = old + value;
  return old;
}
static inline float __ldcg(const float* p) { return *g4c_aligned(p, 4); }
// An L2 prefetch (`prefetch_l2_lines` and `prefetch_l2` in g4c's prelude) fetches nothing here; it
// checks instead that the bytes asked for lie within one of the launch's arguments, as the GPU's
// must.
static inline void prefetch_l2_lines(const void* p, unsigned bytes) {
  const char* const first = (const char*)p;
  for (int i = 0; i < g4c_nargs; ++i) {
    const char* const arg = (const char*)g4c_args[i];
    if (first >= arg && bytes <= g4c_arg_bytes[i] && (unsigned long long)(first - arg) <= g4c_arg_bytes[i] - bytes) return;
  }
  g4c_prefetch_outside = true;
}
static inline void prefetch_l2(const void* p, unsigned bytes) { prefetch_l2_lines(p, bytes); }

// A block's shared-memory region (`STATIC_REGION` and `DYNAMIC_REGION` in g4c's prelude), 16-byte
// aligned, at most a block's opt-in on any GPU (`G4C_MAX_DYNAMIC_SMEM`, which `emulator_header`
// defines from the targets' table). Before each block each of its 32-bit words is
// 0x7fffffff: a NaN as a float, as either half an f16 or bf16 NaN, and as an int the largest (an
// index far out of range), so that a kernel reading what its block did not write (uninitialized on
// a GPU; left by the block before here) computes NaN or reads far away. A dynamic region larger
// than the bytes its launch passed marks the launch, where a GPU would read and write past the
// block's shared memory; so does a block that changed any of the words just past the bytes it
// asked for (`g4c_check_region_end`), which on a GPU are another block's or none.
#ifndef G4C_MAX_DYNAMIC_SMEM
#error "G4C_MAX_DYNAMIC_SMEM: the most dynamic shared memory a block may take, from the targets' table"
#endif
alignas(16) static uint32_t g4c_region[(G4C_MAX_DYNAMIC_SMEM + 3) / 4];
// The most bytes a block of the launch asked for: what the next block's filling covers.
static unsigned g4c_region_used;
// The bytes the running block asked for.
static unsigned g4c_block_bytes;
static unsigned g4c_dynamic_smem_bytes;
static bool g4c_dynamic_smem_short;
static bool g4c_region_overrun;
static inline unsigned char* g4c_block_region(unsigned bytes, bool dynamic) {
  if (dynamic && bytes > g4c_dynamic_smem_bytes) g4c_dynamic_smem_short = true;
  g4c_block_bytes = std::max(g4c_block_bytes, std::min(bytes, (unsigned)G4C_MAX_DYNAMIC_SMEM));
  g4c_region_used = std::max(g4c_region_used, g4c_block_bytes);
  return reinterpret_cast<unsigned char*>(g4c_region);
}
// After a block: whether it left the words of its region's next KiB as they were filled (every
// block's filling covers at least them: the first of a launch fills the whole region).
static void g4c_check_region_end() {
  const unsigned from = (g4c_block_bytes + 3) / 4, end = (G4C_MAX_DYNAMIC_SMEM + 3) / 4;
  for (unsigned i = from; i < std::min(from + 256, end); ++i) {
    if (g4c_region[i] != 0x7fffffffu) g4c_region_overrun = true;
  }
}

// A warp's butterfly (`warp_butterfly` in g4c's prelude) in one exchange: each lane leaves its
// value, the warp's barrier, then each computes every step of the butterfly over its warp's 32
// values, so it combines exactly what the xor shuffles would (the five shuffles would cost ten
// barriers); the warp's barrier again before the exchange is reused.
template <typename T, typename F> static inline T warp_butterfly(T v, F combine) {
  static_assert(sizeof(T) == 4, "lanes exchange 32-bit values");
  static const char site[2] = {};  // one per type and combining function
  std::memcpy(&g4c_exchange[threadIdx.x], &v, 4);
  g4c_warp_barrier(&site[0]);
  T lanes[32];
  std::memcpy(lanes, &g4c_exchange[threadIdx.x & ~31u], sizeof lanes);
  g4c_warp_barrier(&site[1]);
  for (int o = 16; o > 0; o >>= 1) {
    T next[32];
    for (int l = 0; l < 32; ++l) next[l] = combine(lanes[l], lanes[l ^ o]);
    std::memcpy(lanes, next, sizeof lanes);
  }
  return lanes[threadIdx.x & 31];
}

// mma.sync on the host: each lane of the warp leaves its fragments, the warp's barrier, then each
// computes its own accumulators from its warp's, summing in k order in f32; the warp's barrier
// again before the fragments are overwritten. Element (row, k) of A is in lane (row % 8) * 4 +
// (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2; element (k, col) of B in lane
// col * 4 + (k % 8) / 2, register k >= 8, half k % 2; accumulator r of a lane (g, t) =
// (lane / 4, lane % 4) is (row g + 8 (r >= 2), column 2t + r % 2).
static unsigned g4c_mma_a[1024][4], g4c_mma_b[1024][2];
template <int K, float (*Widen)(unsigned short)>
static inline void g4c_mma(float* d, const unsigned* a, const unsigned* b) {
  static const char site[2] = {};  // one per shape and type
  for (int i = 0; i < K / 4; ++i) g4c_mma_a[threadIdx.x][i] = a[i];
  for (int i = 0; i < K / 8; ++i) g4c_mma_b[threadIdx.x][i] = b[i];
  g4c_warp_barrier(&site[0]);
  const unsigned lane = threadIdx.x & 31, warp0 = threadIdx.x - lane, g = lane >> 2, t = lane & 3;
  auto half = [](unsigned word, int k) { return (unsigned short)(word >> (16 * (k & 1))); };
  float out[4];
  for (int r = 0; r < 4; ++r) {
    const unsigned row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
    float sum = d[r];
    for (int k = 0; k < K; ++k) {
      const unsigned a_word = g4c_mma_a[warp0 + (row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)];
      const unsigned b_word = g4c_mma_b[warp0 + col * 4 + (k % 8) / 2][k >= 8];
      sum += Widen(half(a_word, k)) * Widen(half(b_word, k));
    }
    out[r] = sum;
  }
  g4c_warp_barrier(&site[1]);
  for (int r = 0; r < 4; ++r) d[r] = out[r];
}
static inline float g4c_widen_bf16(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
static inline void mma_f16_k8(float* d, const unsigned* a, const unsigned* b) { g4c_mma<8, h2f>(d, a, b); }
static inline void mma_f16_k16(float* d, const unsigned* a, const unsigned* b) { g4c_mma<16, h2f>(d, a, b); }
static inline void mma_bf16_k16(float* d, const unsigned* a, const unsigned* b) { g4c_mma<16, g4c_widen_bf16>(d, a, b); }

// Launches emulated so far.
static unsigned g4c_launches;
// The orders of the launch counted `launch` (see the top): its top three bits mirror the blocks'
// order, flip the warps' order, and flip the lanes' order.
static inline unsigned g4c_orders(unsigned launch) { return launch * 0x9e3779b9u; }
// Whether the launch's threads met barriers apart.
static bool g4c_barriers_apart;

// Runs `grid` blocks of `block` threads of `kernel` on `args` (at most G4C_MAX_ARGS pointers, to
// buffers of `arg_bytes`) with `dynamic_smem` bytes of dynamic shared memory: 0, or 1 for a launch
// it cannot run, 2 for one that prefetched bytes outside its arguments, 3 for one whose kernel
// declared a dynamic region larger than the launch passed, 4 for one whose threads met barriers
// apart (see the top), 5 for one that read an address its load's width does not divide, 6 for one
// that wrote past its blocks' shared-memory region.
extern "C" int g4c_emulate(void* kernel, void** args, const unsigned long long* arg_bytes, int nargs, unsigned grid,
                           unsigned block, int synchronizes, unsigned dynamic_smem) {
  if (nargs > G4C_MAX_ARGS || grid == 0 || block == 0 || block > 1024 || dynamic_smem > G4C_MAX_DYNAMIC_SMEM) return 1;
  ++g4c_launches;
  g4c_dynamic_smem_bytes = dynamic_smem;
  g4c_dynamic_smem_short = false;
  g4c_region_overrun = false;
  g4c_region_used = G4C_MAX_DYNAMIC_SMEM;
  for (int i = 0; i < G4C_MAX_ARGS; ++i) {
    g4c_args[i] = i < nargs ? args[i] : nullptr;
    g4c_arg_bytes[i] = i < nargs ? arg_bytes[i] : 0;
  }
  g4c_nargs = nargs;
  g4c_prefetch_outside = false;
  g4c_misaligned = false;
  g4c_barriers_apart = false;
  g4c_running = (g4c_kernel)kernel;
  blockDim = {block, 1, 1};
  gridDim = {grid, 1, 1};
  const unsigned orders = g4c_orders(g4c_launches), evens = (grid + 1) / 2;
  for (unsigned block_turn = 0; block_turn < grid; ++block_turn) {
    const unsigned up_down = block_turn < evens ? 2 * block_turn : 2 * (grid - 1 - block_turn) + 1;
    const unsigned b = (orders >> 31) ? grid - 1 - up_down : up_down;
    blockIdx = {b, 0, 0};
    std::fill_n(g4c_region, (g4c_region_used + 3) / 4, 0x7fffffffu);
    if (block_turn == 0) g4c_region_used = 0;
    g4c_block_bytes = 0;
    const bool last_warp_first = ((orders >> 30) ^ b) & 1, last_lane_first = ((orders >> 29) ^ (b >> 1)) & 1;
    if (!synchronizes) {
      for (unsigned i = 0; i < block; ++i) {
        threadIdx = {last_lane_first ? block - 1 - i : i, 0, 0};
        g4c_call();
      }
      g4c_check_region_end();
      continue;
    }
    g4c_stacks.resize(block);
    std::vector<char> done(block, 0);
    for (unsigned t = 0; t < block; ++t) {
      g4c_stacks[t].resize(256 * 1024);
      g4c_prepare(t);
    }
    // Round by round, each round up to the block's next barrier: warp by warp, each warp's lanes
    // round-robin through its own barriers until every lane waits at the block's barrier or has
    // returned.
    std::vector<char> at_block_barrier(block, 0);
    const unsigned warps = (block + 31) / 32;
    unsigned remaining = block;
    while (remaining > 0) {
      for (unsigned turn = 0; turn < warps; ++turn) {
        const unsigned warp = last_warp_first ? warps - 1 - turn : turn;
        const unsigned lanes = std::min(block - warp * 32, 32u);
        for (bool at_warp_barrier = true; at_warp_barrier;) {
          // Where each lane resumed in this pass stopped: at the warp's barrier, the block's, or
          // returned. A pass that stops them in more than one, or at more than one exchange, is a
          // warp parting ways.
          bool stopped[3] = {false, false, false};
          const void* exchange = nullptr;
          for (unsigned lane = 0; lane < lanes; ++lane) {
            const unsigned t = warp * 32 + (last_lane_first ? lanes - 1 - lane : lane);
            if (done[t] || at_block_barrier[t]) continue;
            g4c_current = t;
            threadIdx = {t, 0, 0};
            g4c_thread_returned = false;
            g4c_resume(t);
            if (g4c_thread_returned) {
              done[t] = 1;
              --remaining;
              stopped[2] = true;
            } else if (g4c_at_block_barrier) {
              at_block_barrier[t] = 1;
              stopped[1] = true;
            } else {
              if (exchange != nullptr && exchange != g4c_warp_site) g4c_barriers_apart = true;
              exchange = g4c_warp_site;
              stopped[0] = true;
            }
          }
          at_warp_barrier = stopped[0];
          if (stopped[0] + stopped[1] + stopped[2] > 1) g4c_barriers_apart = true;
        }
      }
      // Every thread now waits at the block's barrier or has returned: not some of each.
      if (remaining > 0 && remaining < block) g4c_barriers_apart = true;
      std::fill(at_block_barrier.begin(), at_block_barrier.end(), 0);
    }
    g4c_check_region_end();
  }
  return g4c_region_overrun ? 6 : g4c_misaligned ? 5 : g4c_barriers_apart ? 4 : g4c_dynamic_smem_short ? 3 : g4c_prefetch_outside ? 2 : 0;
}
