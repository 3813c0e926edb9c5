// convgen's fixed Hopper (sm_90a) helpers: the tensor memory accelerator's copies, the
// mbarriers that hand shared-memory stages between a producer and its consumers, the
// warpgroup MMA's ordering instructions and matrix descriptors, and register rebalancing.
// Each is one PTX instruction (PTX ISA 8.x: "cp.async.bulk.tensor", "mbarrier",
// "wgmma", "setmaxnreg") with the operand types the instruction wants, so a kernel reads
// as its algorithm.  Nothing here depends on a kernel's shape.
//
// Include after convgen/device.h, in kernels compiled for sm_90a.
#pragma once

namespace {

// A CUtensorMap (cuda.h), opaque: the host encodes it (convgen/tma.py) and passes its 128
// bytes by value as a __grid_constant__ kernel parameter, where the copy engine reads it.
struct alignas(64) TmaMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// ---- mbarriers: a phase completes when `count` arrivals and the expected bytes are in ----
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes the barriers' initialisation visible to the copy engine (the async proxy) before use.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces the bytes the copies signalling this phase will bring.
__device__ __forceinline__ void mbar_expect_bytes(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Waits until the phase of parity `parity` has completed.  A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: a producer's first pass over an empty ring.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  } while (!done);
}

// ---- thread-block clusters (a TmaWgmma plan's cluster > 1) ----
// This block's rank within its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of the cluster's blocks, as __syncthreads is for one block: after it, what each
// block wrote before it (its barriers' initialisation) is visible to the others.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// One arrival on the barrier at the same place in block `rank` of the cluster's shared memory.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned long long* bar, unsigned rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n"
      ::"r"(smem_u32(bar)), "r"(rank) : "memory");
}

// ---- the tensor memory accelerator: one instruction copies a box, completing on a barrier ----
__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// A tiled box of a 2-D tensor, its corner at (c0 innermost, c1); outside the tensor reads zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaMap* map, unsigned long long* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1) : "memory");
}

// The same box written to the same place in the shared memory of each block of the cluster
// that `blocks` has a bit for, each copy completing on that block's barrier at `bar`'s place.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const TmaMap* map, unsigned long long* bar, int c0,
                                                      int c1, unsigned short blocks) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4}], [%2], %5;\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(blocks) : "memory");
}

// A tiled box of a 3-D tensor, its corner at (c0 innermost, c1, c2).
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaMap* map, unsigned long long* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const TmaMap* map, unsigned long long* bar, int c0,
                                                      int c1, int c2, unsigned short blocks) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4, %5}], [%2], %6;\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(blocks) : "memory");
}

// A tiled box of a 4-D tensor (NHWC x as channels, columns, rows, image), its corner at
// (c0 innermost, .., c3); coordinates outside the tensor, negative ones too, read zeros.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaMap* map, unsigned long long* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

// An im2col box of a 4-D NHWC tensor: the map's pixels-per-column pixels, walked in N, H, W
// order through the map's bounding box from input pixel (n, h, w), each shifted by the
// filter tap's offset (off_w, off_h), channels c.. of each; outside the image reads zeros.
__device__ __forceinline__ void tma_load_im2col(void* dst, const TmaMap* map, unsigned long long* bar, int c, int w,
                                                int h, int n, unsigned short off_w, unsigned short off_h) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c), "r"(w), "r"(h), "r"(n), "h"(off_w), "h"(off_h)
      : "memory");
}

// ---- the copy engine's stores: a box of shared memory into a tensor, in bulk groups ----
// The writing threads' shared-memory stores, made visible to the copy engine (the async
// proxy) before one of them hands it the box.
__device__ __forceinline__ void tma_store_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The box at src into a 2-D tensor's tiled map, its corner at (c0 innermost, c1); the
// box's elements outside the tensor are not written.  It joins this thread's open bulk group.
__device__ __forceinline__ void tma_store_2d(const TmaMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               ::"l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
}

// One 16-byte store into shared memory at `addr`, as one instruction (NVVM splits a uint4
// whose words come from fp16 conversions into four stores).
__device__ __forceinline__ void st_shared16(unsigned addr, const uint4& w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
}

// Closes this thread's open bulk group.
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Until at most N of this thread's bulk groups still read their shared memory, which may then
// be written again.
template <int N> __device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Until every bulk group of this thread has written its tensor.
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- warpgroup MMAs ----
// Before a warpgroup's first wgmma of a batch: orders its earlier register and shared-memory
// accesses before the MMAs read them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed batches are still in flight.
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The matrix descriptor of a K-major operand tile staged with the 128-byte swizzle (as the
// TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B): rows of 64 fp16 (128 bytes), 8-row atoms
// 1024 bytes apart (SBO), the tile 1024-byte aligned.  A k16 step inside the atom moves the
// start address by 32 bytes; the hardware applies the swizzle to the address it forms.
__device__ __forceinline__ unsigned long long sw128_desc(const void* tile, int k_bytes) {
  const unsigned addr = smem_u32(tile) + static_cast<unsigned>(k_bytes);
  return static_cast<unsigned long long>((addr >> 4) & 0x3FFF) | (1ull << 16) |  // LBO: unused by swizzled K-major
         (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);       // SBO, layout: 128-byte swizzle
}

// The descriptor of an MN-major operand tile (wgmma's transposed A or B) staged with the
// 128-byte swizzle, as TMA boxes of 64 M (or N) columns x k rows write it: each k row is 64
// fp16 along M or N (128 bytes), 8-row atoms 1024 bytes apart along k (SBO), and the next
// 64 columns of M or N `mn_bytes` on (LBO: one box).  A k16 step moves the start by two
// atoms (2048 bytes), so it stays on the swizzle's 1024-byte boundary.
__device__ __forceinline__ unsigned long long sw128_mn_desc(const void* tile, unsigned mn_bytes) {
  return static_cast<unsigned long long>((smem_u32(tile) >> 4) & 0x3FFF) |
         (static_cast<unsigned long long>((mn_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);
}

// ---- register rebalancing between a warpgroup that only copies and those that multiply ----
template <int N> __device__ __forceinline__ void regs_release() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_claim() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// A barrier among the consumer warpgroups' `threads` threads (and any reader's warps that join
// them), id 1; 0 is __syncthreads.
__device__ __forceinline__ void consumers_sync(int threads) { asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory"); }

}  // namespace
