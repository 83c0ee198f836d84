// model.hpp: the models of the MNIST runner (logistic regression and the 784-256-100-10 ReLU MLP),
// their seeded initialisation, the forward pass, the minibatch gather and the scoring of a test batch's
// logits (resnet_train uses the last two as well). Header-only so that
// tests/test_training_memory.cu trains exactly this code. Include it from a .cu file: the gather is a
// parallel_for body, compiled by nvcc in CUDA builds.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/random.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace mnist {

using dualcast::Device;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;

/// Layer widths of a named model: "logreg" 784 -> 10, "mlp" 784 -> 256 -> 100 -> 10.
inline std::vector<std::int64_t> model_widths(const std::string& name, std::int64_t inputs = 784,
                                              std::int64_t classes = 10) {
  if (name == "logreg") return {inputs, classes};
  if (name == "mlp") return {inputs, 256, 100, classes};
  DUALCAST_FAIL("unknown model '", name, "' (expected logreg or mlp)");
}

/// A stack of affine layers y = x W + b, W [in, out], with ReLU between layers (none after the last).
struct Model {
  std::vector<Var> weights;
  std::vector<Var> biases;

  /// Weights and biases uniform in +-1/sqrt(fan_in) (PyTorch's nn.Linear default). Drawn on the CPU
  /// from counter-based streams seeded from `seed`, then moved, so every device starts identical.
  static Model create(const std::vector<std::int64_t>& widths, Device device, std::uint64_t seed) {
    DUALCAST_CHECK(widths.size() >= 2, "Model::create: need at least two layer widths");
    Model m;
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(widths[l]));
      const std::uint64_t s = seed * 1000003ull + 2 * l;
      Tensor w = Tensor::uniform(Shape{widths[l], widths[l + 1]}, Device::cpu(), s, -bound, bound);
      Tensor b = Tensor::uniform(Shape{widths[l + 1]}, Device::cpu(), s + 1, -bound, bound);
      m.weights.push_back(Var::param(w.to(device)));
      m.biases.push_back(Var::param(b.to(device)));
    }
    return m;
  }

  [[nodiscard]] std::vector<Var> params() const {
    std::vector<Var> p;
    for (std::size_t l = 0; l < weights.size(); ++l) {
      p.push_back(weights[l]);
      p.push_back(biases[l]);
    }
    return p;
  }

  [[nodiscard]] std::int64_t num_params() const {
    std::int64_t n = 0;
    for (const Var& p : params()) n += p.numel();
    return n;
  }

  /// Logits [B, classes] of a batch x [B, inputs].
  [[nodiscard]] Var forward(const Var& x) const {
    Var h = x;
    for (std::size_t l = 0; l < weights.size(); ++l) {
      h = dualcast::matmul(h, weights[l]) + biases[l];
      if (l + 1 < weights.size()) h = dualcast::relu(h);
    }
    return h;
  }
};

namespace detail {
template <class T>
void gather_rows_kernel(Device device, T* out, const T* src, const float* index, std::int64_t rows,
                        std::int64_t cols) {
  dualcast::parallel_for(device, rows * cols, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t r = i / cols;
    const std::int64_t c = i - r * cols;
    out[i] = src[static_cast<std::int64_t>(index[r]) * cols + c];
  });
}
}  // namespace detail

/// Rows `index` (a float32 [B] tensor of row numbers on src's device) of a float32 src [N, C] or [N]:
/// one kernel. The result has shape [B, C] or [B].
inline Tensor gather_rows(const Tensor& src, const Tensor& index) {
  DUALCAST_CHECK(src.dtype() == dualcast::DType::float32 && index.dtype() == dualcast::DType::float32,
                 "gather_rows: float32 tensors expected");
  DUALCAST_CHECK(src.device() == index.device(), "gather_rows: src and index on different devices");
  DUALCAST_CHECK(src.rank() == 1 || src.rank() == 2, "gather_rows: src must be [N] or [N, C]");
  const std::int64_t rows = index.numel();
  const std::int64_t cols = src.rank() == 2 ? src.shape()[1] : 1;
  Tensor out = src.rank() == 2 ? Tensor::empty(Shape{rows, cols}, src.dtype(), src.device())
                               : Tensor::empty(Shape{rows}, src.dtype(), src.device());
  detail::gather_rows_kernel<float>(src.device(), out.data<float>(), src.data<float>(),
                                    index.data<float>(), rows, cols);
  return out;
}

/// A permutation of 0..n-1 for epoch `epoch` of a run seeded with `seed` (Fisher-Yates on the
/// library's counter-based generator: the same order on every machine and standard library).
inline std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, int epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
  const std::uint64_t key = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch) + 1;
  for (std::int64_t i = n - 1; i > 0; --i) {
    // uniform() is in (0, 1]: j in [0, i].
    auto j = static_cast<std::int64_t>(dualcast::random::uniform(key, static_cast<std::uint64_t>(i)) *
                                       static_cast<double>(i + 1));
    if (j > i) j = i;
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

/// rows[begin, end) as a float index tensor on `device` (gather_rows' index).
inline Tensor index_tensor(const std::vector<std::int64_t>& rows, std::size_t begin, std::size_t end,
                           dualcast::Device device) {
  std::vector<float> idx(rows.begin() + static_cast<std::ptrdiff_t>(begin),
                         rows.begin() + static_cast<std::ptrdiff_t>(end));
  return Tensor::from_vector<float>(dualcast::Shape{static_cast<std::int64_t>(idx.size())}, idx, device);
}

/// Scores `count` rows of logits (row-major, the same number of classes each) against
/// labels[first, first + count): adds their softmax cross-entropy (nats, in double) to `loss_sum` and
/// the rows whose argmax is the label to `correct`.
inline void score_logits(const std::vector<float>& logits, std::int64_t count, const std::vector<float>& labels,
                         std::int64_t first, double& loss_sum, std::int64_t& correct) {
  const std::int64_t classes = static_cast<std::int64_t>(logits.size()) / count;
  for (std::int64_t r = 0; r < count; ++r) {
    const float* z = logits.data() + r * classes;
    std::int64_t best = 0;
    double mx = z[0];
    for (std::int64_t c = 1; c < classes; ++c)
      if (z[c] > mx) mx = z[c], best = c;
    double se = 0;
    for (std::int64_t c = 0; c < classes; ++c) se += std::exp(static_cast<double>(z[c]) - mx);
    const auto label = static_cast<std::int64_t>(labels[static_cast<std::size_t>(first + r)]);
    loss_sum += mx + std::log(se) - static_cast<double>(z[label]);
    if (best == label) ++correct;
  }
}

}  // namespace mnist
