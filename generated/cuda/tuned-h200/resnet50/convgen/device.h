// convgen's fixed device helpers: vector types, index math, asynchronous copies, the operand
// Stager, element-type traits, stores and the split-K sums.  Nothing here depends on a kernel's
// shape (those constants are emitted with each kernel), so every kernel includes this one
// header instead of carrying its own copy.  NVRTC and hiprtc find it through the -I that
// convgen/compile.py passes; `convgen emit -o DIR` writes it to DIR/convgen/, for nvcc -I DIR.
//
// The including kernel first includes its backend's headers, defines half_t (the 16-bit element
// its stages and MMAs hold: __half, or a bfloat16 type), and says what the target has
// (convgen/targets.py decides, the kernel template writes it down):
//   CONVGEN_CP_ASYNC     1: cp.async global->shared copies (sm_80+); 0: stubs, staging goes through registers
//   CONVGEN_PTX_STORE16  1: 16-byte global stores written in PTX (NVVM splits some uint4 stores)
//   CONVGEN_BF16         1: half_t is bfloat16 (defined only then; convgen/dtypes.py)
//   CONVGEN_HOST         defined only by tests/host_kernel.py, which runs kernels on the host and
//                        supplies cp.async (and convgen/mma_sync.h's instructions) itself
#pragma once

#if !defined(CONVGEN_CP_ASYNC) || !defined(CONVGEN_PTX_STORE16)
#error "define CONVGEN_CP_ASYNC and CONVGEN_PTX_STORE16 (0 or 1) before including convgen/device.h"
#endif
#ifndef CONVGEN_BF16
#define CONVGEN_BF16 0
#endif

namespace {

// ---- vector types: V fp16 values moved as one access of 2*V bytes ----
template <int V> struct HalfVec;
template <> struct HalfVec<1> { typedef unsigned short T; };
template <> struct HalfVec<2> { typedef unsigned int T; };
template <> struct HalfVec<4> { typedef uint2 T; };
template <> struct HalfVec<8> { typedef uint4 T; };

// V fp32 values read by a gather that casts on the fly.
template <int V> struct FloatVec { float v[V]; };

// Index math on values known to be non-negative divides as unsigned: a division by a
// compile-time constant then needs no sign fix-ups, and the compiler can prove that
// (t + i*THREADS) % VECS is the same column for every access i of a thread.
// (D = 0 is an empty stride class, which has no rows: never called.)
template <int D> __device__ __forceinline__ int udiv(int a) {
  if constexpr (D == 0) return 0; else return static_cast<int>(static_cast<unsigned>(a) / D);
}
template <long long D> __device__ __forceinline__ long long udiv64(long long a) {
  if constexpr (D == 0) return 0; else return static_cast<long long>(static_cast<unsigned long long>(a) / D);
}

// float to the kernel's 16-bit element, rounded to nearest even: the same as numpy's
// astype(float16), or ml_dtypes' astype(bfloat16) (CUDA's and rocWMMA's bf16 casts round so).
__device__ __forceinline__ half_t round_half_t(float f) {
#if CONVGEN_BF16
  return static_cast<half_t>(f);
#else
  return __float2half_rn(f);
#endif
}

__device__ __forceinline__ unsigned short f2h_bits(float f) {
  half_t h = round_half_t(f);
  return *reinterpret_cast<unsigned short*>(&h);
}

template <int V> __device__ __forceinline__ typename HalfVec<V>::T load_halves(const half_t* p) {
  return *reinterpret_cast<const typename HalfVec<V>::T*>(p);
}

template <int V> __device__ __forceinline__ FloatVec<V> load_floats(const float* p) {
  FloatVec<V> out;
#pragma unroll
  for (int i = 0; i < V; ++i) out.v[i] = p[i];
  return out;
}

template <int V> __device__ __forceinline__ typename HalfVec<V>::T to_halves(const FloatVec<V>& f) {
  typename HalfVec<V>::T out;
  unsigned short* h = reinterpret_cast<unsigned short*>(&out);
#pragma unroll
  for (int i = 0; i < V; ++i) h[i] = f2h_bits(f.v[i]);
  return out;
}

#if CONVGEN_CP_ASYNC && !defined(CONVGEN_HOST)  // (CONVGEN_HOST: tests/host_kernel.py supplies host copies)
// ---- cp.async (sm_80+): global -> shared without a register round trip;
//      src_bytes = 0 zero-fills, which is how the padding halo and tile edges are staged ----
// .ca keeps the line in L1: an im2col gather reads each input pixel once per filter tap.
// L2_PREFETCH also asks L2 for the aligned CONVGEN_L2_PREFETCH around a copy that reads (PTX's
// .level::prefetch_size, a hint), for the copies whose block reads the rest of those bytes
// soon: on an H100 it made depthwise wgrad's staged boxes 1.05-1.13x faster on MobileNetV2's
// three largest layers, and a pointwise dgrad's dy (64 bytes of a 192-byte pixel a step)
// 1.11x, but it cost depthwise fprop and dgrad up to 21% (their halos' 256 bytes hold other
// blocks' channels), and changed nothing elsewhere (benchmarks/NOTES.md, thirty-sixth
// session).  A zero-filling copy's address may lie outside the tensor: it gets no hint.
#ifndef CONVGEN_L2_PREFETCH
#define CONVGEN_L2_PREFETCH ".L2::256B"
#endif
template <int BYTES, bool L2_PREFETCH = false>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, bool pred) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (L2_PREFETCH) {
    if (pred)
      asm volatile("cp.async.ca.shared.global" CONVGEN_L2_PREFETCH " [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(BYTES));
    else
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2, 0;\n" ::"r"(dst), "l"(gmem), "n"(BYTES));
  } else {
    const int src_bytes = pred ? BYTES : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(BYTES), "r"(src_bytes));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#elif !CONVGEN_CP_ASYNC
// No asynchronous copies on this target: every operand is staged through registers.
template <int BYTES, bool L2_PREFETCH = false> __device__ __forceinline__ void cp_async(void*, const void*, bool) {}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}
#endif

// A gather may define begin(kt), run once per k-step before its accesses: work every access
// of the step shares (wgrad's pixel decomposition of a thread's first row) is done there once.
template <class Gather>
__device__ __forceinline__ auto begin_step(Gather& g, int kt, int) -> decltype(g.begin(kt)) { return g.begin(kt); }
template <class Gather>
__device__ __forceinline__ void begin_step(Gather&, int, long) {}

// A gather whose copies should carry the L2 prefetch hint (see cp_async) says so with a
// static constexpr bool L2_PREFETCH; the others need not mention it.
template <class Gather, class = void> struct L2Prefetch { static constexpr bool value = false; };
template <class Gather>
struct L2Prefetch<Gather, decltype(void(Gather::L2_PREFETCH))> { static constexpr bool value = Gather::L2_PREFETCH; };

// ---- Stager: moves one operand's tile from its gather to a shared-memory stage ----
// A Gather (defined per pass, like CUTLASS's conv iterators) says where access i of
// this thread reads at k-step kt and where it lands in the stage; the Stager does
// the copy, asynchronously (cp.async) when Gather::ASYNC, else through registers so
// the global loads of tile kt+STAGES-1 overlap the MMAs of tile kt.
template <class Gather>
struct Stager {
  Gather g;
  typename Gather::Reg regs[Gather::ITERS];

  __device__ __forceinline__ void async_copy(half_t* stage, int kt) {
    begin_step(g, kt, 0);
#pragma unroll
    for (int i = 0; i < Gather::ITERS; ++i) {
      if (!g.slot_valid(i)) continue;
      bool ok;
      const typename Gather::T* src = g.address(i, kt, ok);
      cp_async<2 * Gather::V, L2Prefetch<Gather>::value>(stage + g.smem_offset(i), src, ok);
    }
  }

  __device__ __forceinline__ void fetch(int kt) {
    begin_step(g, kt, 0);
#pragma unroll
    for (int i = 0; i < Gather::ITERS; ++i) {
      bool ok;
      const typename Gather::T* src = g.address(i, kt, ok);
      regs[i] = ok && g.slot_valid(i) ? Gather::load(src) : typename Gather::Reg{};
    }
  }

  __device__ __forceinline__ void store(half_t* stage) {
    if constexpr (Gather::Map::PAIRED) {  // accesses i and i+1 are neighbouring fp16 columns
#pragma unroll
      for (int i = 0; i < Gather::ITERS; i += 2) {
        const unsigned lo = Gather::to_half(regs[i]), hi = Gather::to_half(regs[i + 1]);
        *reinterpret_cast<unsigned*>(stage + g.smem_offset(i)) = lo | (hi << 16);
      }
    } else {
#pragma unroll
      for (int i = 0; i < Gather::ITERS; ++i) {
        if (!g.slot_valid(i)) continue;
        *reinterpret_cast<typename HalfVec<Gather::V>::T*>(stage + g.smem_offset(i)) = Gather::to_half(regs[i]);
      }
    }
  }

  // Stage tile kt: async operands are in flight on return, register operands are
  // in registers until store().
  __device__ __forceinline__ void issue(half_t* stage, int kt) {
    if constexpr (Gather::ASYNC) async_copy(stage, kt); else fetch(kt);
  }
  __device__ __forceinline__ void finish(half_t* stage) {
    if constexpr (!Gather::ASYNC) store(stage);
  }
};

// Element-type traits of a gather: what it reads from global memory and how that
// becomes half_t (fp16 or bf16) in shared memory.
template <typename TIn, int VEC> struct ReadAs;
template <int VEC> struct ReadAs<half_t, VEC> {
  static constexpr int V = VEC;
  typedef half_t T;
  typedef typename HalfVec<VEC>::T Reg;
  __device__ __forceinline__ static Reg load(const T* p) { return load_halves<VEC>(p); }
  __device__ __forceinline__ static typename HalfVec<VEC>::T to_half(const Reg& r) { return r; }
};
template <int VEC> struct ReadAs<float, VEC> {
  static constexpr int V = VEC;
  typedef float T;
  typedef FloatVec<VEC> Reg;
  __device__ __forceinline__ static Reg load(const T* p) { return load_floats<VEC>(p); }
  __device__ __forceinline__ static typename HalfVec<VEC>::T to_half(const Reg& r) { return to_halves<VEC>(r); }
};

template <typename OutT> __device__ __forceinline__ OutT from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float v) { return round_half_t(v); }

// One 16-byte global store.
__device__ __forceinline__ void store16(void* p, const uint4& w) {
#if CONVGEN_PTX_STORE16
  // In PTX: NVVM splits a uint4 store whose words come from fp16 conversions into four
  // 4-byte stores (seen with NVRTC 13 for sm_90), which quadruples the epilogue's stores.
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
#else
  *reinterpret_cast<uint4*>(p) = w;
#endif
}

// Stores v[0..N) at out[0..N), converted to OutT, in the widest stores the run's size
// allows (out aligned to the run): 16-byte words, one 8- or 4-byte word, or element by element.
template <typename OutT, int N>
__device__ __forceinline__ void store_vec(OutT* out, const float (&v)[N]) {
  constexpr int BYTES = N * static_cast<int>(sizeof(OutT));
  union Words { uint4 w16[BYTES >= 16 ? BYTES / 16 : 1]; uint2 w8; unsigned w4; OutT e[N]; };  // the run as vector words
  Words tmp;
#pragma unroll
  for (int e = 0; e < N; ++e) tmp.e[e] = from_float<OutT>(v[e]);
  if constexpr (BYTES % 16 == 0) {
#pragma unroll
    for (int b = 0; b < BYTES / 16; ++b) store16(reinterpret_cast<uint4*>(out) + b, tmp.w16[b]);
  } else if constexpr (BYTES == 8) {
    *reinterpret_cast<uint2*>(out) = tmp.w8;
  } else if constexpr (BYTES == 4) {
    *reinterpret_cast<unsigned*>(out) = tmp.w4;
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = tmp.e[e];
  }
}

// Reads N values of T at p (aligned to the run, or to 16 bytes) as floats, in the widest
// loads the run allows: the residual's runs, read as y's are stored (store_vec).
template <typename T, int N>
__device__ __forceinline__ void load_run(const T* __restrict__ p, float (&v)[N]) {
  constexpr int BYTES = N * static_cast<int>(sizeof(T));
  union Words { uint4 w16[BYTES >= 16 ? BYTES / 16 : 1]; uint2 w8; T e[N]; };
  Words tmp;
  if constexpr (BYTES % 16 == 0) {
#pragma unroll
    for (int b = 0; b < BYTES / 16; ++b) tmp.w16[b] = reinterpret_cast<const uint4*>(p)[b];
  } else if constexpr (BYTES == 8) {
    tmp.w8 = *reinterpret_cast<const uint2*>(p);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) tmp.e[e] = p[e];
  }
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = static_cast<float>(tmp.e[e]);
}

// ---- the split-K reduction's sums ----
template <int V> struct Sum { float v[V]; };

// A load through L2 (ld.global.cg), for slices other blocks of the same kernel wrote (the
// split-K sums of plan split_reduce "grid", CUDA only: the planner never gives HIP one).
template <class T> __device__ __forceinline__ T load_l2(const T* p) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return *p;
#else
  return __ldcg(p);
#endif
}

template <int V, bool COHERENT = false> __device__ __forceinline__ void add_slice(Sum<V>& s, const float* __restrict__ p) {
  if constexpr (V == 4 && COHERENT) {
    const float4 f = load_l2(reinterpret_cast<const float4*>(p));
    s.v[0] += f.x; s.v[1] += f.y; s.v[2] += f.z; s.v[3] += f.w;
  } else if constexpr (V == 4) {  // the launcher keeps every slice 16-byte aligned (N % 4 == 0)
    const float4 f = *reinterpret_cast<const float4*>(p);
    s.v[0] += f.x; s.v[1] += f.y; s.v[2] += f.z; s.v[3] += f.w;
  } else if constexpr (COHERENT) {
#pragma unroll
    for (int e = 0; e < V; ++e) s.v[e] += load_l2(p + e);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) s.v[e] += p[e];
  }
}

template <int V> __device__ __forceinline__ void add_sum(Sum<V>& s, const Sum<V>& t) {
#pragma unroll
  for (int e = 0; e < V; ++e) s.v[e] += t.v[e];
}

// ---- a butterfly step within a warp (the depthwise wgrad's per-channel sums) ----
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}

}  // namespace
