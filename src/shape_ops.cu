// shape_ops.cu: transpose, permute and reshape, on the tape (slice, concat, split and broadcast_to
// are in shape_ops_pieces.cu).
//
// Data movement does not care about the element type, only its size, so the copy kernels are
// instantiated for 1-, 2-, 4- and 8-byte words (uint8 masks, 16-bit floats, float32, float64) rather
// than per dtype.
// Each op is one parallel_for pass over its output (a grid-stride kernel on a CUDA device); the
// kernels sit in named function templates because nvcc rejects extended lambdas inside the generic
// lambdas of a dtype dispatch. A permutation that is a (batched) matrix transpose once adjacent
// dimensions merge runs, on a CUDA device, through 32 x 32 shared-memory tiles (coalesced reads and
// writes: about 2.5 TB/s against 0.7-0.9 TB/s element-wise on an H200, whose copy reaches 4.2 TB/s).
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

// ---- permute -----------------------------------------------------------------------------------

/// Output dimensions (collapsed) and, per output dimension, the input's element stride.
struct PermutePlan {
  int rank = 0;
  std::int64_t dims[kMaxRank] = {};
  std::int64_t in_strides[kMaxRank] = {};
};

/// One output element per index: the input offset from the output's coordinates. I is the index
/// type: 32-bit whenever the tensor has fewer than 2^32 elements (divisions are several times
/// cheaper), 64-bit otherwise.
template <class W, class I>
void permute_kernel(Device d, W* out, const W* in, std::int64_t n, PermutePlan p) {
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) {
    I rem = static_cast<I>(i), off = 0;
    for (int k = p.rank - 1; k >= 0; --k) {
      const I dim = static_cast<I>(p.dims[k]);
      const I q = rem / dim;
      off += (rem - q * dim) * static_cast<I>(p.in_strides[k]);
      rem = q;
    }
    out[i] = in[off];
  });
}

#if defined(__CUDACC__)
// The batched matrix transpose [B, R, C] -> [B, C, R] through shared-memory tiles: both the reads
// and the writes are coalesced (the element-wise kernel reads with stride R, several times slower).
inline constexpr int kTile = 32, kTileRows = 8;

template <class W>
__global__ void __launch_bounds__(kTile * kTileRows)
    shape_ops_transpose_tiles(W* out, const W* in, std::int64_t rows, std::int64_t cols,
                              std::int64_t tiles_r, std::int64_t tiles_c, std::int64_t tiles) {
  __shared__ W tile[kTile][kTile + 1];
  const std::int64_t per_matrix = tiles_r * tiles_c;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t b = t / per_matrix, rem = t - b * per_matrix;
    const std::int64_t r0 = rem / tiles_c * kTile, c0 = rem % tiles_c * kTile;
    const W* src = in + b * rows * cols;
    W* dst = out + b * rows * cols;
    const std::int64_t c = c0 + threadIdx.x;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const std::int64_t r = r0 + j;
      if (r < rows && c < cols) tile[j][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    const std::int64_t r = r0 + threadIdx.x;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const std::int64_t c2 = c0 + j;
      if (c2 < cols && r < rows) dst[c2 * rows + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

template <class W>
void transpose_tiles(Device d, W* out, const W* in, std::int64_t batch, std::int64_t rows,
                     std::int64_t cols) {
  detail::DeviceGuard guard(d);
  const std::int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = batch * tiles_r * tiles_c;
  const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(d)) * 8;
  const auto grid = static_cast<unsigned>(tiles < cap ? tiles : cap);
  shape_ops_transpose_tiles<W><<<grid, dim3(kTile, kTileRows), 0, detail::stream(d)>>>(out, in, rows, cols, tiles_r,
                                                                 tiles_c, tiles);
  DUALCAST_CUDA_CHECK_LAUNCH();
}
#endif

std::vector<int> normalize_permutation(const char* op, const Shape& s, const std::vector<int>& dims) {
  auto dims_str = [&] {
    std::string r = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) r += (i ? ", " : "") + std::to_string(dims[i]);
    return r + "]";
  };
  DUALCAST_CHECK(static_cast<int>(dims.size()) == s.rank(), op, ": dims ", dims_str(), " has ",
                 dims.size(), " entries but 'x' of shape ", s.str(), " has rank ", s.rank());
  std::vector<int> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int r = s.rank();
    const int k = dims[i] < 0 ? dims[i] + r : dims[i];
    DUALCAST_CHECK(k >= 0 && k < r, op, ": dims ", dims_str(), " entry ", dims[i],
                   " out of range for 'x' of shape ", s.str(), " (rank ", r, ")");
    DUALCAST_CHECK(!seen[static_cast<std::size_t>(k)], op, ": dims ", dims_str(),
                   " is not a permutation (dimension ", k, " repeated) for 'x' of shape ", s.str());
    seen[static_cast<std::size_t>(k)] = true;
    perm[i] = k;
  }
  return perm;
}

/// x with its dimensions reordered by a checked permutation (a new contiguous tensor).
Tensor permute_tensor(const Tensor& x, const std::vector<int>& perm) {
  const Shape& s = x.shape();
  Shape out_shape = s;
  for (std::size_t i = 0; i < perm.size(); ++i) out_shape[static_cast<int>(i)] = s[perm[i]];
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  // Collapse: drop size-1 dimensions, merge neighbours whose input strides chain.
  const Shape in_strides = contiguous_strides(s);
  PermutePlan p;
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const std::int64_t dim = s[perm[i]], stride = in_strides[perm[i]];
    if (dim == 1) continue;
    if (p.rank > 0 && p.in_strides[p.rank - 1] == stride * dim) {
      p.dims[p.rank - 1] *= dim;
      p.in_strides[p.rank - 1] = stride;
    } else {
      p.dims[p.rank] = dim;
      p.in_strides[p.rank] = stride;
      ++p.rank;
    }
  }
  const bool plain_copy = p.rank == 0 || (p.rank == 1 && p.in_strides[0] == 1);
  // A batched matrix transpose: output [B, C, R] reading input [B, R, C] (B = 1 when rank 2).
  const int r = p.rank;
  const bool matrix_transpose =
      r >= 2 && r <= 3 && p.in_strides[r - 2] == 1 && p.in_strides[r - 1] == p.dims[r - 2] &&
      (r == 2 || p.in_strides[0] == p.dims[1] * p.dims[2]);
  if (plain_copy) {  // only size-1 dimensions moved
    copy_bytes(out.raw_data(), out.device(), x.raw_data(), x.device(), x.nbytes());
    return out;
  }
  dispatch_word(x.dtype(), "permute", [&](auto tag) {
    using W = decltype(tag);
    const W* in = static_cast<const W*>(x.raw_data());
    W* o = static_cast<W*>(out.raw_data());
#if defined(__CUDACC__)
    if (matrix_transpose && x.device().is_cuda()) {
      transpose_tiles<W>(x.device(), o, in, r == 3 ? p.dims[0] : 1, p.dims[r - 1], p.dims[r - 2]);
      return;
    }
#endif
    (void)matrix_transpose;
    if (n <= std::int64_t{0xffffffff}) permute_kernel<W, std::uint32_t>(x.device(), o, in, n, p);
    else permute_kernel<W, std::int64_t>(x.device(), o, in, n, p);
  });
  return out;
}

class PermuteNode final : public Node {
 public:
  PermuteNode(const char* name, std::vector<int> inverse) : name_(name), inverse_(std::move(inverse)) {}
  [[nodiscard]] const char* name() const override { return name_; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined() || !inputs[0]) return;
    detail::accumulate_grad(*inputs[0], permute_tensor(grad_outputs[0], inverse_), true);
  }

 private:
  const char* name_;
  std::vector<int> inverse_;
};

Var permute_var(const char* op, const Var& x, const std::vector<int>& perm) {
  Tensor out = permute_tensor(x.value(), perm);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x})) {
    std::vector<int> inverse(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<int>(i);
    node = std::make_shared<PermuteNode>(op, std::move(inverse));
  }
  return detail::record1(std::move(node), {x}, std::move(out));
}

std::vector<int> transpose_permutation(const Tensor& x) {
  check_defined(x, "transpose", "x");
  DUALCAST_CHECK(x.rank() >= 2, "transpose: argument 'x' of shape ", x.shape().str(), " has rank ",
                 x.rank(), "; transpose swaps the last two dimensions and needs rank >= 2");
  std::vector<int> perm(static_cast<std::size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return perm;
}

// ---- reshape -----------------------------------------------------------------------------------

Shape resolve_shape(const Tensor& x, const std::vector<std::int64_t>& spec) {
  check_defined(x, "reshape", "x");
  auto spec_str = [&] {
    std::string r = "[";
    for (std::size_t i = 0; i < spec.size(); ++i) r += (i ? ", " : "") + std::to_string(spec[i]);
    return r + "]";
  };
  DUALCAST_CHECK(static_cast<int>(spec.size()) <= kMaxRank, "reshape: target shape ", spec_str(),
                 " exceeds the maximum rank ", kMaxRank);
  int infer = -1;
  std::int64_t known = 1;
  bool has_zero = false;
  for (std::size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == -1) {
      DUALCAST_CHECK(infer < 0, "reshape: target shape ", spec_str(),
                     " has more than one -1 (only one dimension can be inferred) for 'x' of shape ",
                     x.shape().str());
      infer = static_cast<int>(i);
    } else {
      DUALCAST_CHECK(spec[i] >= 0, "reshape: target shape ", spec_str(), " has a negative size ",
                     spec[i], " (only -1 is allowed, to infer one dimension) for 'x' of shape ",
                     x.shape().str());
      has_zero = has_zero || spec[i] == 0;
      DUALCAST_CHECK(spec[i] == 0 || !__builtin_mul_overflow(known, spec[i], &known),
                     "reshape: target shape ", spec_str(), " has more elements than a 64-bit count "
                     "holds, for 'x' of shape ", x.shape().str(), " (", x.numel(), " elements)");
    }
  }
  if (has_zero) known = 0;
  std::vector<std::int64_t> dims = spec;
  if (infer >= 0) {
    DUALCAST_CHECK(known != 0 && x.numel() % known == 0, "reshape: cannot infer the -1 in ",
                   spec_str(), " for 'x' of shape ", x.shape().str(), " (", x.numel(),
                   " elements)");
    dims[static_cast<std::size_t>(infer)] = x.numel() / known;
  } else {
    DUALCAST_CHECK(known == x.numel(), "reshape: cannot reshape 'x' of shape ", x.shape().str(),
                   " (", x.numel(), " elements) to ", spec_str(), " (", known, " elements)");
  }
  return Shape(dims);
}

class ReshapeNode final : public Node {
 public:
  explicit ReshapeNode(Shape in_shape) : in_shape_(in_shape) {}
  [[nodiscard]] const char* name() const override { return "reshape"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined() || !inputs[0]) return;
    // A view of the adjoint: shared storage, so not ours to update in place.
    detail::accumulate_grad(*inputs[0], grad_outputs[0].view(in_shape_), false);
  }

 private:
  Shape in_shape_;
};

Var reshape_var(const Var& x, const std::vector<std::int64_t>& spec) {
  check_var(x, "reshape", "x");
  const Tensor& xv = x.value();
  Tensor out = xv.view(resolve_shape(xv, spec));
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x})) node = std::make_shared<ReshapeNode>(xv.shape());
  return detail::record1(std::move(node), {x}, std::move(out));
}

}  // namespace
}  // namespace shape_ops_detail

namespace sod = shape_ops_detail;

// ---- public API ----------------------------------------------------------------------------------

Tensor transpose(const Tensor& x) { return sod::permute_tensor(x, sod::transpose_permutation(x)); }

Var transpose(const Var& x) {
  sod::check_var(x, "transpose", "x");
  return sod::permute_var("transpose", x, sod::transpose_permutation(x.value()));
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  check_defined(x, "permute", "x");
  return sod::permute_tensor(x, sod::normalize_permutation("permute", x.shape(), dims));
}

Var permute(const Var& x, const std::vector<int>& dims) {
  sod::check_var(x, "permute", "x");
  return sod::permute_var("permute", x, sod::normalize_permutation("permute", x.shape(), dims));
}

Var reshape(const Var& x, std::initializer_list<std::int64_t> shape) {
  return sod::reshape_var(x, std::vector<std::int64_t>(shape));
}
Var reshape(const Var& x, const std::vector<std::int64_t>& shape) { return sod::reshape_var(x, shape); }
Var reshape(const Var& x, const Shape& shape) { return sod::reshape_var(x, shape.vec()); }
Tensor reshape(const Tensor& x, std::initializer_list<std::int64_t> shape) {
  return reshape(x, std::vector<std::int64_t>(shape));
}
Tensor reshape(const Tensor& x, const std::vector<std::int64_t>& shape) {
  return x.view(sod::resolve_shape(x, shape));
}
Tensor reshape(const Tensor& x, const Shape& shape) { return reshape(x, shape.vec()); }

}  // namespace dualcast
