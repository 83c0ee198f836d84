// shape_ops_pieces.cu: slice, concat, split and broadcast_to, on the tape (transpose, permute and
// reshape are in shape_ops.cu, which says how the copy kernels are written).
//
// broadcast_to's gradient is dualcast::sum_to (ops/reduce.hpp): the adjoint summed over the
// broadcast dimensions.
#include "dualcast/ops/shape.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "dualcast/error.hpp"
#include "dualcast/indexing.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/parallel.hpp"
#include "shape_ops_common.hpp"

namespace dualcast {

namespace shape_ops_detail {
namespace {

// ---- slice -------------------------------------------------------------------------------------

/// x viewed as [outer, size * inner] with the slice taking columns [off, off + seg) of every row.
struct SliceGeometry {
  int axis = 0;
  std::int64_t start = 0, stop = 0;
  std::int64_t outer = 1, row = 0, seg = 0, off = 0;
};

SliceGeometry check_slice(const Tensor& x, int axis, std::int64_t start, std::int64_t stop) {
  check_defined(x, "slice", "x");
  SliceGeometry g;
  g.axis = normalize_axis("slice", axis, x.shape());
  const std::int64_t size = x.shape()[g.axis];
  g.start = start < 0 ? start + size : start;
  g.stop = stop < 0 ? stop + size : stop;
  DUALCAST_CHECK(g.start >= 0 && g.start <= g.stop && g.stop <= size, "slice: bounds [", start, ", ",
                 stop, ") are invalid for axis ", axis, " of size ", size, " of 'x' with shape ",
                 x.shape().str(), " (need 0 <= start <= stop <= ", size,
                 " after counting negative bounds from the end)");
  const std::int64_t inner = product(x.shape(), g.axis + 1, x.rank());
  g.outer = product(x.shape(), 0, g.axis);
  g.row = size * inner;
  g.seg = (g.stop - g.start) * inner;
  g.off = g.start * inner;
  return g;
}

template <class W>
void slice_kernel(Device d, W* out, const W* in, std::int64_t outer, std::int64_t row,
                  std::int64_t seg, std::int64_t off) {
  parallel_for(d, outer * seg, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t o = i / seg;
    out[i] = in[o * row + off + (i - o * seg)];
  });
}

/// The slice's adjoint scattered into a zero tensor of the input's shape, in one pass.
template <class W>
void slice_backward_kernel(Device d, W* gin, const W* gout, std::int64_t outer, std::int64_t row,
                           std::int64_t seg, std::int64_t off) {
  parallel_for(d, outer * row, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t o = i / row;
    const std::int64_t c = i - o * row - off;
    gin[i] = (c >= 0 && c < seg) ? gout[o * seg + c] : W(0);
  });
}

Tensor slice_tensor(const Tensor& x, const SliceGeometry& g) {
  Shape out_shape = x.shape();
  out_shape[g.axis] = g.stop - g.start;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  dispatch_word(x.dtype(), "slice", [&](auto tag) {
    using W = decltype(tag);
    slice_kernel<W>(x.device(), static_cast<W*>(out.raw_data()), static_cast<const W*>(x.raw_data()),
                    g.outer, g.row, g.seg, g.off);
  });
  return out;
}

class SliceNode final : public Node {
 public:
  SliceNode(Shape in_shape, SliceGeometry g) : in_shape_(in_shape), g_(g) {}
  [[nodiscard]] const char* name() const override { return "slice"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& go = grad_outputs[0];
    if (!go.defined() || !inputs[0]) return;
    Tensor gi = Tensor::empty(in_shape_, go.dtype(), go.device());
    if (gi.numel() > 0) {
      dispatch_word(go.dtype(), "slice backward", [&](auto tag) {
        using W = decltype(tag);
        slice_backward_kernel<W>(go.device(), static_cast<W*>(gi.raw_data()),
                                 static_cast<const W*>(go.raw_data()), g_.outer, g_.row, g_.seg,
                                 g_.off);
      });
    }
    detail::accumulate_grad(*inputs[0], std::move(gi), true);
  }

 private:
  Shape in_shape_;
  SliceGeometry g_;
};

// ---- concat and split --------------------------------------------------------------------------

inline constexpr int kMaxPieces = 8;

/// Up to kMaxPieces pieces of a tensor viewed as [outer, row]: piece p is the contiguous
/// [outer, begin[p+1] - begin[p]] block of columns [begin[p], begin[p+1]). A null pointer means
/// zeros (concat) or "not wanted" (split).
template <class Ptr>
struct PieceTable {
  int count = 0;
  Ptr ptr[kMaxPieces] = {};
  std::int64_t begin[kMaxPieces + 1] = {};

  /// The piece p holding column c (begin[0] <= c < begin[count]); `at` is the offset of element
  /// (o, c) in that piece.
  DUALCAST_HD DUALCAST_INLINE int locate(std::int64_t o, std::int64_t c, std::int64_t& at) const {
    int p = 0;
    while (p + 1 < count && c >= begin[p + 1]) ++p;
    at = o * (begin[p + 1] - begin[p]) + (c - begin[p]);
    return p;
  }
};

/// For the n pieces of a tensor of shape `shape` along `axis` (the tensor viewed as [outer, row]),
/// calls launch(t, outer, row) for tables of at most kMaxPieces pieces, in order: ptr_of(k) is
/// piece k's pointer (null: zeros for concat, not wanted for split), sizes[k] its extent along the
/// axis.
template <class Ptr, class PtrOf, class Launch>
void for_piece_tables(const Shape& shape, int axis, std::size_t n,
                      const std::vector<std::int64_t>& sizes, const PtrOf& ptr_of,
                      const Launch& launch) {
  const std::int64_t inner = product(shape, axis + 1, shape.rank());
  const std::int64_t outer = product(shape, 0, axis);
  const std::int64_t row = shape[axis] * inner;
  std::int64_t col = 0;
  for (std::size_t first = 0; first < n; first += kMaxPieces) {
    PieceTable<Ptr> t;
    t.count = static_cast<int>(std::min<std::size_t>(kMaxPieces, n - first));
    t.begin[0] = col;
    for (int p = 0; p < t.count; ++p) {
      const std::size_t k = first + static_cast<std::size_t>(p);
      t.ptr[p] = ptr_of(k);
      col += sizes[k] * inner;
      t.begin[p + 1] = col;
    }
    launch(t, outer, row);
  }
}

/// Copies between `whole`, viewed as [outer, row], and the table's pieces (its columns [begin[0],
/// begin[count])): Concat: into `whole` from the pieces (zeros for a null one); else from `whole`
/// into the non-null pieces.
template <bool Concat, class W>
void pieces_kernel(Device d, std::conditional_t<Concat, W*, const W*> whole, std::int64_t outer,
                   std::int64_t row, PieceTable<std::conditional_t<Concat, const W*, W*>> t) {
  const std::int64_t c0 = t.begin[0], width = t.begin[t.count] - c0;
  if (width == 0) return;
  parallel_for(d, outer * width, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t o = i / width;
    const std::int64_t c = c0 + (i - o * width);
    std::int64_t at;
    const auto piece = t.ptr[t.locate(o, c, at)];
    const auto elem = whole + (o * row + c);  // (nvcc: no first capture inside `if constexpr`)
    if constexpr (Concat) *elem = piece != nullptr ? piece[at] : W(0);
    else if (piece != nullptr) piece[at] = *elem;
  });
}

/// Writes `pieces` (null or undefined: zeros) side by side along `axis` into `out`, one kernel per
/// kMaxPieces pieces. sizes[p] is piece p's extent along the axis.
void concat_into(Tensor& out, int axis, const std::vector<const Tensor*>& pieces,
                 const std::vector<std::int64_t>& sizes) {
  if (out.numel() == 0) return;
  dispatch_word(out.dtype(), "concat", [&](auto tag) {
    using W = decltype(tag);
    for_piece_tables<const W*>(
        out.shape(), axis, pieces.size(), sizes,
        [&](std::size_t k) -> const W* {
          const Tensor* src = pieces[k];
          return src != nullptr && src->defined() ? static_cast<const W*>(src->raw_data()) : nullptr;
        },
        [&](const PieceTable<const W*>& t, std::int64_t outer, std::int64_t row) {
          pieces_kernel<true, W>(out.device(), static_cast<W*>(out.raw_data()), outer, row, t);
        });
  });
}

/// Copies the pieces of `in` along `axis` into `outs` (undefined entries are skipped), one kernel
/// per kMaxPieces pieces.
void split_into(const Tensor& in, int axis, std::vector<Tensor>& outs,
                const std::vector<std::int64_t>& sizes) {
  if (in.numel() == 0) return;
  dispatch_word(in.dtype(), "split", [&](auto tag) {
    using W = decltype(tag);
    for_piece_tables<W*>(
        in.shape(), axis, outs.size(), sizes,
        [&](std::size_t k) -> W* {
          Tensor& dst = outs[k];
          return dst.defined() && dst.numel() > 0 ? static_cast<W*>(dst.raw_data()) : nullptr;
        },
        [&](const PieceTable<W*>& t, std::int64_t outer, std::int64_t row) {
          bool any = false;  // a table of unwanted pieces launches nothing
          for (int p = 0; p < t.count; ++p) any = any || t.ptr[p] != nullptr;
          if (any)
            pieces_kernel<false, W>(in.device(), static_cast<const W*>(in.raw_data()), outer, row, t);
        });
  });
}

/// Checks concat's arguments; returns the normalised axis and each piece's extent along it.
int check_concat(const std::vector<const Tensor*>& xs, int axis, std::vector<std::int64_t>& sizes) {
  DUALCAST_CHECK(!xs.empty(), "concat: needs at least one tensor, got an empty list");
  const Tensor& x0 = *xs[0];
  check_defined(x0, "concat", "xs[0]");
  const int ax = normalize_axis("concat", axis, x0.shape());
  sizes.clear();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& xi = *xs[i];
    const std::string name = "xs[" + std::to_string(i) + "]";
    check_same_device_dtype("concat", "xs[0]", x0, name.c_str(), xi);
    bool ok = xi.rank() == x0.rank();
    for (int d = 0; ok && d < x0.rank(); ++d) ok = d == ax || xi.shape()[d] == x0.shape()[d];
    DUALCAST_CHECK(ok, "concat: along axis ", axis, ", '", name, "' of shape ", xi.shape().str(),
                   " does not match 'xs[0]' of shape ", x0.shape().str(),
                   " (same rank and equal sizes in every other dimension required)");
    sizes.push_back(xi.shape()[ax]);
  }
  // The result: the pieces' total along the axis, and its element count, must be countable.
  Shape out = x0.shape();
  std::int64_t total = 0;
  for (const std::int64_t s : sizes)
    DUALCAST_CHECK(!__builtin_add_overflow(total, s, &total), "concat: along axis ", axis,
                   " the ", xs.size(), " pieces' sizes add up to more than a 64-bit count holds");
  out[ax] = total;
  (void)checked_numel("concat", "the result", out);
  return ax;
}

Tensor concat_tensors(const std::vector<const Tensor*>& xs, int ax,
                      const std::vector<std::int64_t>& sizes) {
  Shape out_shape = xs[0]->shape();
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  out_shape[ax] = total;
  Tensor out = Tensor::empty(out_shape, xs[0]->dtype(), xs[0]->device());
  concat_into(out, ax, xs, sizes);
  return out;
}

int check_split(const Tensor& x, int axis, const std::vector<std::int64_t>& sizes) {
  check_defined(x, "split", "x");
  const int ax = normalize_axis("split", axis, x.shape());
  auto sizes_str = [&] {
    std::string r = "{";
    for (std::size_t i = 0; i < sizes.size(); ++i) r += (i ? ", " : "") + std::to_string(sizes[i]);
    return r + "}";
  };
  DUALCAST_CHECK(!sizes.empty(), "split: sizes is empty for 'x' of shape ", x.shape().str());
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    DUALCAST_CHECK(s >= 0, "split: sizes ", sizes_str(), " has a negative entry ", s,
                   " for 'x' of shape ", x.shape().str());
    DUALCAST_CHECK(!__builtin_add_overflow(total, s, &total), "split: sizes ", sizes_str(),
                   " add up to more than a 64-bit count holds, for 'x' of shape ", x.shape().str());
  }
  DUALCAST_CHECK(total == x.shape()[ax], "split: sizes ", sizes_str(), " sum to ", total,
                 " but axis ", axis, " of 'x' with shape ", x.shape().str(), " has size ",
                 x.shape()[ax]);
  return ax;
}

std::vector<Tensor> split_tensors(const Tensor& x, int ax, const std::vector<std::int64_t>& sizes) {
  std::vector<Tensor> outs;
  outs.reserve(sizes.size());
  for (std::int64_t s : sizes) {
    Shape sh = x.shape();
    sh[ax] = s;
    outs.push_back(Tensor::empty(sh, x.dtype(), x.device()));
  }
  split_into(x, ax, outs, sizes);
  return outs;
}

class ConcatNode final : public Node {
 public:
  ConcatNode(int axis, std::vector<std::int64_t> sizes, std::vector<Shape> shapes)
      : axis_(axis), sizes_(std::move(sizes)), shapes_(std::move(shapes)) {}
  [[nodiscard]] const char* name() const override { return "concat"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (!g.defined()) return;
    std::vector<Tensor> pieces(shapes_.size());
    for (std::size_t i = 0; i < shapes_.size(); ++i)
      if (inputs[i]) pieces[i] = Tensor::empty(shapes_[i], g.dtype(), g.device());
    split_into(g, axis_, pieces, sizes_);
    for (std::size_t i = 0; i < shapes_.size(); ++i)
      if (inputs[i]) detail::accumulate_grad(*inputs[i], std::move(pieces[i]), true);
  }

 private:
  int axis_;
  std::vector<std::int64_t> sizes_;
  std::vector<Shape> shapes_;
};

class SplitNode final : public Node {
 public:
  SplitNode(Shape in_shape, int axis, std::vector<std::int64_t> sizes)
      : in_shape_(in_shape), axis_(axis), sizes_(std::move(sizes)) {}
  [[nodiscard]] const char* name() const override { return "split"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!inputs[0]) return;
    const Tensor* any = nullptr;
    std::vector<const Tensor*> pieces;
    for (const Tensor& g : grad_outputs) {
      pieces.push_back(&g);
      if (g.defined() && any == nullptr) any = &g;
    }
    if (any == nullptr) return;
    // One pass: pieces without an adjoint are written as zeros.
    Tensor gi = Tensor::empty(in_shape_, any->dtype(), any->device());
    concat_into(gi, axis_, pieces, sizes_);
    detail::accumulate_grad(*inputs[0], std::move(gi), true);
  }

 private:
  Shape in_shape_;
  int axis_;
  std::vector<std::int64_t> sizes_;
};

// ---- broadcast_to ----------------------------------------------------------------------------------

void check_broadcast(const Tensor& x, const Shape& shape) {
  check_defined(x, "broadcast_to", "x");
  (void)checked_numel("broadcast_to", "shape", shape);
  const Shape& s = x.shape();
  DUALCAST_CHECK(s.rank() <= shape.rank(), "broadcast_to: cannot broadcast 'x' of shape ", s.str(),
                 " (rank ", s.rank(), ") to the lower-rank shape ", shape.str());
  const int offset = shape.rank() - s.rank();
  for (int d = 0; d < s.rank(); ++d)
    DUALCAST_CHECK(s[d] == shape[offset + d] || s[d] == 1, "broadcast_to: cannot broadcast 'x' of shape ",
                   s.str(), " to shape ", shape.str(), " (dimension ", d - s.rank(), ": ", s[d],
                   " vs ", shape[offset + d], "; sizes must be equal or 1)");
}

template <class W>
void broadcast_kernel(Device d, W* out, const W* in, std::int64_t n, BroadcastIndexer<1> ix) {
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) {
    std::int64_t off[1];
    ix.offsets(i, off);
    out[i] = in[off[0]];
  });
}

Tensor broadcast_tensor(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const BroadcastIndexer<1> ix = make_indexer<1>(shape, {x.shape()});
  dispatch_word(x.dtype(), "broadcast_to", [&](auto tag) {
    using W = decltype(tag);
    broadcast_kernel<W>(x.device(), static_cast<W*>(out.raw_data()),
                        static_cast<const W*>(x.raw_data()), out.numel(), ix);
  });
  return out;
}

class BroadcastNode final : public Node {
 public:
  explicit BroadcastNode(Shape in_shape) : in_shape_(in_shape) {}
  [[nodiscard]] const char* name() const override { return "broadcast_to"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (!g.defined() || !inputs[0]) return;
    Tensor gi = sum_to(g, in_shape_);  // g itself when nothing was broadcast
    const bool fresh = !gi.shares_storage(g);
    detail::accumulate_grad(*inputs[0], std::move(gi), fresh);
  }

 private:
  Shape in_shape_;
};

}  // namespace
}  // namespace shape_ops_detail

namespace sod = shape_ops_detail;

// ---- public API ----------------------------------------------------------------------------------
Tensor slice(const Tensor& x, int axis, std::int64_t start, std::int64_t stop) {
  return sod::slice_tensor(x, sod::check_slice(x, axis, start, stop));
}

Var slice(const Var& x, int axis, std::int64_t start, std::int64_t stop) {
  sod::check_var(x, "slice", "x");
  const Tensor& xv = x.value();
  const sod::SliceGeometry g = sod::check_slice(xv, axis, start, stop);
  Tensor out = sod::slice_tensor(xv, g);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x})) node = std::make_shared<sod::SliceNode>(xv.shape(), g);
  return detail::record1(std::move(node), {x}, std::move(out));
}

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  std::vector<const Tensor*> ptrs;
  ptrs.reserve(xs.size());
  for (const Tensor& t : xs) ptrs.push_back(&t);
  std::vector<std::int64_t> sizes;
  const int ax = sod::check_concat(ptrs, axis, sizes);
  return sod::concat_tensors(ptrs, ax, sizes);
}

Tensor concat(std::initializer_list<Tensor> xs, int axis) {
  return concat(std::vector<Tensor>(xs), axis);
}

Var concat(const std::vector<Var>& xs, int axis) {
  std::vector<const Tensor*> ptrs;
  ptrs.reserve(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    DUALCAST_CHECK(xs[i].defined(), "concat: argument 'xs[", i, "]' is an undefined Var");
    ptrs.push_back(&xs[i].value());
  }
  std::vector<std::int64_t> sizes;
  const int ax = sod::check_concat(ptrs, axis, sizes);
  Tensor out = sod::concat_tensors(ptrs, ax, sizes);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad(xs)) {
    std::vector<Shape> shapes;
    for (const Tensor* t : ptrs) shapes.push_back(t->shape());
    node = std::make_shared<sod::ConcatNode>(ax, sizes, std::move(shapes));
  }
  return detail::record1(std::move(node), xs, std::move(out));
}

std::vector<Tensor> split(const Tensor& x, int axis, const std::vector<std::int64_t>& sizes) {
  const int ax = sod::check_split(x, axis, sizes);
  return sod::split_tensors(x, ax, sizes);
}

std::vector<Var> split(const Var& x, int axis, const std::vector<std::int64_t>& sizes) {
  sod::check_var(x, "split", "x");
  const Tensor& xv = x.value();
  const int ax = sod::check_split(xv, axis, sizes);
  std::vector<Tensor> outs = sod::split_tensors(xv, ax, sizes);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x})) node = std::make_shared<sod::SplitNode>(xv.shape(), ax, sizes);
  return detail::record(std::move(node), {x}, std::move(outs));
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  sod::check_broadcast(x, shape);
  return sod::broadcast_tensor(x, shape);
}

Var broadcast_to(const Var& x, const Shape& shape) {
  sod::check_var(x, "broadcast_to", "x");
  const Tensor& xv = x.value();
  sod::check_broadcast(xv, shape);
  Tensor out = sod::broadcast_tensor(xv, shape);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x})) node = std::make_shared<sod::BroadcastNode>(xv.shape());
  return detail::record1(std::move(node), {x}, std::move(out));
}

}  // namespace dualcast
