// cuda_emulation.hpp: a CPU stand-in for the few CUDA primitives dualcast's fused attention kernels
// use, so that those kernels' very code runs (slowly) on a machine without a GPU. Compiled by the
// host compiler only (never nvcc: it defines float4 and friends itself).
//
// Execution model: a launch runs the blocks one after another; a block runs one std::thread per CUDA
// thread, __syncthreads and __syncwarp are std::barriers, a warp shuffle goes through a per-warp
// exchange buffer between two warp barriers (so every lane of the warp must call it, as on the GPU),
// atomicAdd is std::atomic_ref, cp.async copies land only when their thread waits for them (so a
// read before the wait sees the old contents), and copies still in flight when a thread finishes are
// counted in emu::unwaited_copies. Dynamic shared memory is filled with 0xFF bytes first (NaN in
// float32 and float64), so a kernel that reads shared memory it never wrote produces NaN. What this
// cannot show: timing, occupancy, register pressure, and races that the host's scheduling happens
// not to expose. 16-byte vector accesses at addresses that are not 16-byte aligned (a fault on the
// GPU, harmless on x86) are counted in emu::misaligned.
// The tensor-core kernels' two warp-collective instructions are emulated from the PTX ISA's
// fragment layouts: ldmatrix (.x4, plain and .trans; every row address must lie in the block's
// shared memory, else emu::out_of_smem counts it) and mma.sync m16n8k16 (bf16/fp16 operands, float
// sums). Each lane posts its operands to a per-warp exchange between two warp barriers, so, as on
// the GPU, all 32 lanes must take part.
// Because a copy here lands only when its own thread waits, a copy issued into a tile that other
// warps are still reading would go unnoticed; so every 16-byte chunk of shared memory keeps a stamp
// of the barrier interval (between two __syncthreads) in which warps last read it by ldmatrix and
// in which cp.async last targeted it: a read and a copy of one chunk by different warps in one
// interval is a write-after-read race on the GPU (emu::smem_races). Both sides stamp first and
// check the other after (sequentially consistent atomics), so the race is seen whatever the host's
// interleaving. cp.async destinations and ldmatrix rows outside the block's shared memory count in
// emu::out_of_smem.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "dualcast/half.hpp"

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define DUALCAST_ATTENTION_EMULATION 1

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline double2 make_double2(double a, double b) { return {a, b}; }
struct EmuDim3 { unsigned x = 0, y = 0, z = 0; };

namespace emu {
/// A chunk's stamp: the barrier interval (high bits) and the warps (low 8 bits, one per warp).
struct ChunkStamps {
  std::atomic<std::uint64_t> read{0}, copy{0};
};
/// Adds warp w to the stamp if it is of interval `epoch`, else restarts it there; returns the warps
/// of the other stamp of the same interval, other than w.
inline std::uint64_t stamp(std::atomic<std::uint64_t>& mine, const std::atomic<std::uint64_t>& other,
                           std::uint64_t epoch, int w) {
  const std::uint64_t bit = std::uint64_t(1) << w;
  std::uint64_t cur = mine.load();
  for (;;) {
    const std::uint64_t next = (cur >> 8) == epoch ? (cur | bit) : ((epoch << 8) | bit);
    if (mine.compare_exchange_weak(cur, next)) break;
  }
  const std::uint64_t o = other.load();
  return (o >> 8) == epoch ? (o & 0xFF & ~bit) : 0;
}
struct EpochCounter {
  std::atomic<std::uint64_t>* epoch;
  void operator()() noexcept { epoch->fetch_add(1); }
};
struct Block {
  std::atomic<std::uint64_t> epoch{1};  // barrier intervals: __syncthreads completions + 1
  std::unique_ptr<std::barrier<EpochCounter>> bar;
  std::unique_ptr<ChunkStamps[]> chunks;  // one per 16 bytes of shared memory
  std::unique_ptr<std::barrier<>> warp_bar[8];
  double shfl[8][32];
  std::uintptr_t xaddr[8][32];   // ldmatrix row addresses
  std::uint32_t xa[8][32][4];    // mma A fragments
  std::uint32_t xb[8][32][2];    // mma B fragments
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
};
inline thread_local Block* blk = nullptr;
inline thread_local EmuDim3 tid, bid;
inline EmuDim3 grid;
inline std::atomic<long> misaligned{0};  ///< 16-byte vector accesses at unaligned addresses
inline std::atomic<long> out_of_smem{0};  ///< ldmatrix rows, cp.async destinations outside shared memory
inline std::atomic<long> smem_races{0};   ///< a chunk read (ldmatrix) and copied into (cp.async) by
                                          ///< different warps between the same two barriers

/// The stamps of the shared-memory chunk at p, or null (counted) outside the block's shared memory.
inline ChunkStamps* chunk_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto lo = reinterpret_cast<std::uintptr_t>(blk->smem);
  if (a < lo || a + 16 > lo + blk->smem_bytes) {
    out_of_smem.fetch_add(1);
    return nullptr;
  }
  return &blk->chunks[(a - lo) / 16];
}
}  // namespace emu
#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define gridDim (emu::grid)
inline void __syncthreads() { emu::blk->bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::blk->warp_bar[emu::tid.x / 32]->arrive_and_wait(); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int d) {
  const int w = emu::tid.x / 32, lane = emu::tid.x % 32;
  emu::blk->shfl[w][lane] = static_cast<double>(v);
  emu::blk->warp_bar[w]->arrive_and_wait();
  const T r = static_cast<T>(emu::blk->shfl[w][lane ^ d]);
  emu::blk->warp_bar[w]->arrive_and_wait();
  return r;
}
template <class T>
T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
using std::fma;
using std::fmax;
using std::exp2;
using std::log2;

namespace emu {
/// cp.async as the hardware allows it to behave at the latest: a copy lands only when its thread
/// waits for its group, so a kernel that reads a tile before cp_async_wait (or, with the barrier
/// missing, before the issuing thread waited) reads the old contents.
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
};
inline thread_local std::vector<PendingCopy> open_group;
inline thread_local std::vector<std::vector<PendingCopy>> committed;
inline std::atomic<long> unwaited_copies{0};  ///< copies still in flight when a thread finished
inline void land(const std::vector<PendingCopy>& group) {
  for (const PendingCopy& c : group) {
    std::memcpy(c.dst, c.src, static_cast<std::size_t>(c.bytes));
    std::memset(static_cast<unsigned char*>(c.dst) + c.bytes, 0, static_cast<std::size_t>(16 - c.bytes));
  }
}
}  // namespace emu

namespace dualcast::attention_detail::kernels::emulation {
inline unsigned char* shared_memory() { return emu::blk->smem; }
inline void cp_async16(void* smem, const void* gmem, int src_bytes) {
  if (emu::ChunkStamps* c = emu::chunk_of(smem)) {
    if (emu::stamp(c->copy, c->read, emu::blk->epoch.load(), static_cast<int>(emu::tid.x / 32)))
      emu::smem_races.fetch_add(1);
  }
  emu::open_group.push_back({smem, gmem, src_bytes});
}
inline void cp_async_commit() {
  emu::committed.push_back(std::move(emu::open_group));
  emu::open_group.clear();
}
inline void cp_async_wait(int n) {
  while (static_cast<int>(emu::committed.size()) > n) {
    emu::land(emu::committed.front());
    emu::committed.erase(emu::committed.begin());
  }
}
/// A 16-byte vector access on the GPU needs a 16-byte aligned address; x86 would not complain.
inline void check_aligned16(const void* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) emu::misaligned.fetch_add(1);
}

/// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane L posts the address of row L % 8 of
/// matrix L / 8; it receives in r[j] row L / 4 of matrix j, elements 2 (L % 4) and 2 (L % 4) + 1
/// (trans: those of the transposed matrix, i.e. rows 2 (L % 4) and 2 (L % 4) + 1, column L / 4).
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans) {
  const int w = static_cast<int>(emu::tid.x / 32), lane = static_cast<int>(emu::tid.x % 32);
  check_aligned16(row);
  if (emu::ChunkStamps* c = emu::chunk_of(row)) {
    if (emu::stamp(c->read, c->copy, emu::blk->epoch.load(), w)) emu::smem_races.fetch_add(1);
  }
  emu::blk->xaddr[w][lane] = reinterpret_cast<std::uintptr_t>(row);
  emu::blk->warp_bar[w]->arrive_and_wait();
  for (int j = 0; j < 4; ++j) {
    if (!trans) {
      std::memcpy(&r[j], reinterpret_cast<const unsigned char*>(emu::blk->xaddr[w][8 * j + lane / 4]) + 4 * (lane % 4), 4);
    } else {
      std::uint16_t e0, e1;
      std::memcpy(&e0, reinterpret_cast<const unsigned char*>(emu::blk->xaddr[w][8 * j + 2 * (lane % 4)]) + 2 * (lane / 4), 2);
      std::memcpy(&e1, reinterpret_cast<const unsigned char*>(emu::blk->xaddr[w][8 * j + 2 * (lane % 4) + 1]) + 2 * (lane / 4), 2);
      r[j] = std::uint32_t(e0) | (std::uint32_t(e1) << 16);
    }
  }
  emu::blk->warp_bar[w]->arrive_and_wait();
}

/// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += A B with the fragments of the PTX ISA (A:
/// a0 (row g, k 2c, 2c+1), a1 (row g+8), a2 (k + 8), a3 (row g+8, k + 8); B: b0 (k 2c, 2c+1 of column
/// g), b1 (k + 8); C: (row g, cols 2c, 2c+1), (row g+8, ...); g = lane / 4, c = lane % 4). Products
/// of 16-bit values are exact in float; the sums run in k order.
inline void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                         bool bf16) {
  const int w = static_cast<int>(emu::tid.x / 32), lane = static_cast<int>(emu::tid.x % 32);
  for (int x = 0; x < 4; ++x) emu::blk->xa[w][lane][x] = a[x];
  emu::blk->xb[w][lane][0] = b0;
  emu::blk->xb[w][lane][1] = b1;
  emu::blk->warp_bar[w]->arrive_and_wait();
  auto value = [bf16](std::uint32_t reg, int half) {
    const auto bits = static_cast<std::uint16_t>(reg >> (16 * half));
    return bf16 ? dualcast::detail::bf16_bits_to_float(bits) : dualcast::detail::fp16_bits_to_float(bits);
  };
  auto A = [&](int row, int k) {
    return value(emu::blk->xa[w][4 * (row % 8) + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  auto B = [&](int k, int col) { return value(emu::blk->xb[w][4 * col + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2); };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    out[e] = sum;
  }
  emu::blk->warp_bar[w]->arrive_and_wait();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
}  // namespace dualcast::attention_detail::kernels::emulation

namespace emu {
template <class... A>
void launch(void (*kernel)(A...), unsigned blocks, unsigned threads, std::size_t smem, A... args) {
  grid.x = blocks;
  for (unsigned b = 0; b < blocks; ++b) {
    std::vector<unsigned char> buf(smem + 64, 0xFF);  // NaN poison: unwritten shared memory shows
    auto* base = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(buf.data()) + 63) / 64 * 64);
    Block block;
    block.bar = std::make_unique<std::barrier<EpochCounter>>(threads, EpochCounter{&block.epoch});
    block.chunks = std::make_unique<ChunkStamps[]>(smem / 16 + 1);
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) block.warp_bar[w] = std::make_unique<std::barrier<>>(32);
    block.smem = base;
    block.smem_bytes = smem;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t)
      ts.emplace_back([&, t, b] {
        blk = &block;
        tid.x = t;
        bid.x = b;
        kernel(args...);
        long left = static_cast<long>(open_group.size());
        for (const auto& g : committed) left += static_cast<long>(g.size());
        if (left) unwaited_copies.fetch_add(left);
        open_group.clear();
        committed.clear();
      });
    for (auto& t : ts) t.join();
  }
}
}  // namespace emu
