// memory_pool.hpp (private): the caching allocator's graph pools, as src/graph.cpp drives them.
//
// While a Graph captures on a device, every allocation there is served from a pool that belongs to
// the graph (its own free blocks first, then blocks moved out of the general cache, then cudaMalloc
// in relaxed capture mode), and every block freed there goes to that pool, including blocks
// allocated before the capture (the graph may read them). After the capture, blocks of the pool that
// are freed return to the pool, never to the general cache: a replay writes them again. When the
// graph is released, the pool's blocks return to the general cache as soon as none is in use.
#pragma once

#include "dualcast/device.hpp"

namespace dualcast::detail {

struct GraphPool;  // defined in src/memory.cpp

/// Routes the allocations and frees of `device` to a new pool from now on. A capture already in
/// progress on the device is a dualcast::Error.
GraphPool* pool_begin_capture(Device device);
/// Stops routing to `pool` (the capture ended, successfully or not); its blocks stay in it.
void pool_end_capture(Device device, GraphPool* pool) noexcept;
/// The graph owning `pool` is gone (or its capture failed): the pool's blocks go back to the
/// general cache once no live buffer holds one of them.
void pool_release(Device device, GraphPool* pool) noexcept;
/// Whether a capture routes the allocations of `device` now (false for the CPU).
bool pool_capturing(Device device) noexcept;

}  // namespace dualcast::detail
