// graph.hpp: Graph, a training step recorded once and replayed (a CUDA graph on a GPU).
//
// Because dualcast's branches live inside its kernels, the sequence of kernels, copies and cuBLAS
// calls a step issues does not depend on the data. Graph::capture runs the step's host code once
// while CUDA stream capture records that sequence on the device's one stream
// (detail::stream(device)); replay() launches the recorded graph: one host call instead of thousands
// of launches. On the CPU device the same program runs unchanged: capture stores the callable and
// replay calls it.
//
//   Graph step;
//   step.capture(dev, [&] { opt.zero_grad(); Var l = loss(x_in); l.backward(); opt.step();
//                           loss_out.copy_(l.value()); });
//   for (...) { x_in.copy_(batch); step.replay(); log(loss_out.item()); }
//
// Rules (docs/design.md, "Whole-step capture"):
//  * Capture records the device work without running it. Inputs are the tensors the step reads
//    (allocated before capture, fed in place with copy_ between replays); outputs are tensors the
//    step writes (copy_ into tensors allocated before capture, or tensors created during the capture
//    and kept alive, e.g. parameter gradients).
//  * Everything allocated while capturing comes from a memory pool owned by the Graph; those blocks
//    keep their addresses across replays and return to the caching allocator when the Graph is
//    destroyed and no tensor holds them any more. Replays allocate nothing.
//  * What cannot be recorded is a dualcast::Error during capture, naming the operation: host reads
//    of device values (Tensor::item, to_vector, norm), copies between the device and the host or
//    another device, synchronize, empty_cache, capturing inside a capture, replaying inside a
//    capture. The capture is then ended and discarded, the Graph stays empty and the library keeps
//    working.
//  * State that changes between steps must live on the device: the optimizers keep their learning
//    rate and Adam its step counts and bias corrections in device scalars (optim.hpp); random
//    tensors take an explicit seed (no hidden generator state is advanced).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "dualcast/device.hpp"

namespace dualcast {

class Graph {
 public:
  /// An empty graph: captured() is false and replay() is an Error until capture() succeeds.
  Graph();
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Records fn's work on `device`. CUDA: fn runs once under stream capture (its device work is
  /// recorded, not executed), then the graph is instantiated. CPU: fn is stored (not run).
  /// Errors: a Graph already captured or moved from; a capture already in progress (nested
  /// captures); anything fn does that cannot be captured (the capture is then discarded and the
  /// exception propagates).
  template <class F>
  void capture(Device device, F&& fn) {
    static_assert(std::is_invocable_v<F&>, "Graph::capture: fn must be callable with no arguments");
    capture_impl(device, std::function<void()>(std::forward<F>(fn)));
  }

  /// Runs the recorded step once (asynchronous on a GPU, like any dualcast work: read results with
  /// item() or to_vector(), which wait). Errors: nothing captured yet, a moved-from Graph, a replay
  /// while a capture is in progress on the device.
  void replay();
  /// replay(), checking that `device` is the one the graph was captured on (an Error otherwise).
  void replay(Device device);

  /// Whether capture() has succeeded (false for a moved-from Graph).
  [[nodiscard]] bool captured() const;
  /// The device captured on (an Error before capture).
  [[nodiscard]] Device device() const;
  /// Nodes of the recorded CUDA graph (kernels, copies, memsets); 0 on the CPU or before capture.
  [[nodiscard]] std::size_t num_nodes() const;

 private:
  struct Impl;
  void capture_impl(Device device, std::function<void()> fn);
  Impl& impl(const char* op) const;
  std::unique_ptr<Impl> impl_;
};

/// Whether a Graph is capturing on `device` right now (always false for the CPU). Code that must
/// behave differently under capture (e.g. skip a host read) asks this.
bool capturing(Device device);

namespace detail {
/// Throws a dualcast::Error naming `what` when a graph capture is in progress on `device`: used by
/// every operation that cannot be recorded in a CUDA graph (host reads, host copies, syncs).
void check_not_capturing(Device device, const char* what);
}  // namespace detail

}  // namespace dualcast
