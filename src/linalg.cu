// linalg.cu: matmul on the tape. Every product is one call of the row-major GEMM in blas.hpp
// (CBLAS on the CPU, cuBLAS on CUDA devices); no kernel of our own is needed.
//
// Batched products use the strided-batched GEMM, with stride 0 for a 2-D operand shared by the batch.
// A [B, m, k] x [k, n] product without trans_a is one plain GEMM of [B*m, k] x [k, n]. The gradient of
// a shared 2-D operand is a sum over the batch of per-entry products: one GEMM when the batch folds
// into the contraction (sum_b X_b^T Y_b = X^T Y over the stacked rows), otherwise a batched GEMM into
// a temporary followed by one GEMM with a row of ones (sum over the leading axis).
#include "dualcast/ops/linalg.hpp"

#include <memory>
#include <string>

#include "blas.hpp"
#include "gemm_skinny.hpp"
#include "dualcast/error.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/precision.hpp"

namespace dualcast {

namespace linalg_detail {
namespace {

const char* flag(bool b) { return b ? "true" : "false"; }

/// Sizes of op(A) op(B): batch is 0 for a 2-D result.
struct MatmulDims {
  std::int64_t batch = 0;
  bool a_batched = false, b_batched = false;
  std::int64_t m = 0, n = 0, k = 0;
};

MatmulDims check_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_same_device_dtype("matmul", "a", a, "b", b);
  DUALCAST_CHECK(is_floating(a.dtype()), "matmul: unsupported dtype ", dtype_name(a.dtype()),
                 " of 'a' ", a.shape().str(), " and 'b' ", b.shape().str(),
                 " (expected float32, float64, bfloat16 or float16)");
  DUALCAST_CHECK(a.rank() == 2 || a.rank() == 3, "matmul: argument 'a' has shape ", a.shape().str(),
                 " (rank ", a.rank(), "); expected a 2-D [m, k] or 3-D [batch, m, k] tensor (with 'b' ",
                 b.shape().str(), ")");
  DUALCAST_CHECK(b.rank() == 2 || b.rank() == 3, "matmul: argument 'b' has shape ", b.shape().str(),
                 " (rank ", b.rank(), "); expected a 2-D [k, n] or 3-D [batch, k, n] tensor (with 'a' ",
                 a.shape().str(), ")");
  MatmulDims d;
  d.a_batched = a.rank() == 3;
  d.b_batched = b.rank() == 3;
  if (d.a_batched && d.b_batched)
    DUALCAST_CHECK(a.shape()[0] == b.shape()[0], "matmul: batch sizes differ: 'a' ",
                   a.shape().str(), " has batch ", a.shape()[0], ", 'b' ", b.shape().str(),
                   " has batch ", b.shape()[0]);
  d.batch = d.a_batched ? a.shape()[0] : (d.b_batched ? b.shape()[0] : 0);
  const int ra = a.rank(), rb = b.rank();
  const std::int64_t a_rows = a.shape()[ra - 2], a_cols = a.shape()[ra - 1];
  const std::int64_t b_rows = b.shape()[rb - 2], b_cols = b.shape()[rb - 1];
  d.m = ta ? a_cols : a_rows;
  const std::int64_t ka = ta ? a_rows : a_cols;
  const std::int64_t kb = tb ? b_cols : b_rows;
  d.n = tb ? b_rows : b_cols;
  DUALCAST_CHECK(ka == kb, "matmul: inner dimensions differ: 'a' ", a.shape().str(),
                 " (trans_a=", flag(ta), ") gives k=", ka, " but 'b' ", b.shape().str(),
                 " (trans_b=", flag(tb), ") gives k=", kb);
  d.k = ka;
  // Empty operands can still ask for a result too large to count ([m, 0] x [0, n]).
  const Shape out = d.a_batched || d.b_batched ? Shape{d.batch, d.m, d.n} : Shape{d.m, d.n};
  std::int64_t n = 1;
  for (int i = 0; i < out.rank(); ++i)
    DUALCAST_CHECK(out[i] == 0 || !__builtin_mul_overflow(n, out[i], &n), "matmul: the result ",
                   out.str(), " of 'a' ", a.shape().str(), " and 'b' ", b.shape().str(),
                   " has more elements than a 64-bit count holds");
  return d;
}

/// C = op(A) op(B) for checked operands (see matmul's shape rules).
Tensor product(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const MatmulDims d = check_matmul(a, b, ta, tb);
  const bool batched = d.a_batched || d.b_batched;
  const Shape out_shape = batched ? Shape{d.batch, d.m, d.n} : Shape{d.m, d.n};
  Tensor c = Tensor::empty(out_shape, a.dtype(), a.device());
  if (c.numel() == 0) return c;
  const std::int64_t lda = ta ? d.m : d.k, ldb = tb ? d.k : d.n, ldc = d.n;
  if (!d.b_batched && (!d.a_batched || !ta)) {
    // Plain GEMM; a batched A without transpose is the matrix of its stacked rows.
    const std::int64_t rows = d.a_batched ? d.batch * d.m : d.m;
    detail::gemm(a.device(), a.dtype(), ta, tb, rows, d.n, d.k, 1.0, a.raw_data(), lda, 0,
                 b.raw_data(), ldb, 0, 0.0, c.raw_data(), ldc, 0, 1);
  } else {
    detail::gemm(a.device(), a.dtype(), ta, tb, d.m, d.n, d.k, 1.0, a.raw_data(), lda,
                 d.a_batched ? d.m * d.k : 0, b.raw_data(), ldb, d.b_batched ? d.k * d.n : 0, 0.0,
                 c.raw_data(), ldc, d.m * d.n, d.batch);
  }
  return c;
}

/// sum_b op(X_b) op(Y_b) for 3-D X and Y with equal batch: the gradient of a 2-D operand that was
/// shared by the batch.
Tensor product_summed_over_batch(const Tensor& x, const Tensor& y, bool tx, bool ty) {
  const MatmulDims d = check_matmul(x, y, tx, ty);
  Tensor out = Tensor::empty(Shape{d.m, d.n}, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  if (tx && !ty) {
    // X_b stored [k, m], Y_b stored [k, n]: the stacked [B*k, m]^T [B*k, n] is the whole sum.
    detail::gemm(x.device(), x.dtype(), true, false, d.m, d.n, d.batch * d.k, 1.0, x.raw_data(), d.m,
                 0, y.raw_data(), d.n, 0, 0.0, out.raw_data(), d.n, 0, 1);
    return out;
  }
  const Tensor per_entry = product(x, y, tx, ty);  // [B, m, n]
  const Tensor ones = Tensor::ones(Shape{1, d.batch}, x.dtype(), x.device());
  // [1, B] x [B, m*n]: the sum over the leading axis.
  detail::gemm(x.device(), x.dtype(), false, false, 1, d.m * d.n, d.batch, 1.0, ones.raw_data(),
               d.batch, 0, per_entry.raw_data(), d.m * d.n, 0, 0.0, out.raw_data(), d.m * d.n, 0, 1);
  return out;
}

/// op(X) op(Y), summed over the batch when the result must have `target_rank` 2 but is batched.
Tensor product_to_rank(const Tensor& x, const Tensor& y, bool tx, bool ty, int target_rank) {
  const bool batched_result = x.rank() == 3 || y.rank() == 3;
  if (target_rank == 2 && batched_result) return product_summed_over_batch(x, y, tx, ty);
  return product(x, y, tx, ty);
}

class MatmulNode final : public Node {
 public:
  MatmulNode(bool ta, bool tb, int rank_a, int rank_b)
      : ta_(ta), tb_(tb), rank_a_(rank_a), rank_b_(rank_b) {}
  [[nodiscard]] const char* name() const override { return "matmul"; }

  Tensor a_;  // kept only when b needs a gradient
  Tensor b_;  // kept only when a needs a gradient

  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (!g.defined()) return;
    if (inputs[0]) {
      // dA = dC op(B)^T, stored the way A is: (dC op(B)^T)^T = op(B) dC^T when trans_a.
      Tensor ga = ta_ ? product_to_rank(b_, g, tb_, true, rank_a_)
                      : product_to_rank(g, b_, false, !tb_, rank_a_);
      detail::accumulate_grad(*inputs[0], std::move(ga), /*owned=*/true);
    }
    if (inputs[1]) {
      // dB = op(A)^T dC, stored the way B is: (op(A)^T dC)^T = dC^T op(A) when trans_b.
      Tensor gb = tb_ ? product_to_rank(g, a_, true, ta_, rank_b_)
                      : product_to_rank(a_, g, !ta_, false, rank_b_);
      detail::accumulate_grad(*inputs[1], std::move(gb), /*owned=*/true);
    }
  }
  void release_saved() override {
    a_ = Tensor();
    b_ = Tensor();
  }

 private:
  bool ta_, tb_;
  int rank_a_, rank_b_;
};

}  // namespace
}  // namespace linalg_detail

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  if (autocast_enabled() && a.defined() && b.defined()) {
    const DType da = detail::autocast_target(a.dtype()), db = detail::autocast_target(b.dtype());
    if (da != a.dtype() || db != b.dtype())
      return linalg_detail::product(a.to(da), b.to(db), trans_a, trans_b);
  }
  return linalg_detail::product(a, b, trans_a, trans_b);
}

Var matmul(const Var& a, const Var& b, bool trans_a, bool trans_b) {
  DUALCAST_CHECK(a.defined() && b.defined(), "matmul: argument '", a.defined() ? "b" : "a",
                 "' is an undefined Var");
  if (autocast_enabled()) {
    // The cast operands are 16-bit, which autocast_target leaves alone: one level of recursion.
    const DType da = detail::autocast_target(a.dtype()), db = detail::autocast_target(b.dtype());
    if (da != a.dtype() || db != b.dtype())
      return matmul(cast(a, da), cast(b, db), trans_a, trans_b);
  }
  const Tensor& av = a.value();
  const Tensor& bv = b.value();
  Tensor c = linalg_detail::product(av, bv, trans_a, trans_b);
  std::shared_ptr<linalg_detail::MatmulNode> node;
  if (grad_enabled() && (a.requires_grad() || b.requires_grad())) {
    node = std::make_shared<linalg_detail::MatmulNode>(trans_a, trans_b, av.rank(), bv.rank());
    if (b.requires_grad()) node->a_ = av;
    if (a.requires_grad()) node->b_ = bv;
  }
  return detail::record1(std::move(node), {a, b}, std::move(c));
}

Tensor matmul_rounded(const Tensor& a, const Tensor& b, DType dtype, bool trans_a, bool trans_b) {
  DUALCAST_CHECK(dtype == DType::bfloat16 || dtype == DType::float16, "matmul_rounded: argument 'dtype' is ",
                 dtype_name(dtype), "; expected bfloat16 or float16");
  DUALCAST_CHECK(a.defined() && b.defined(), "matmul_rounded: argument '", a.defined() ? "b" : "a",
                 "' is an undefined Tensor");
  for (const auto* x : {&a, &b}) {
    const char* name = x == &a ? "a" : "b";
    DUALCAST_CHECK(x->dtype() == DType::float32 || x->dtype() == dtype, "matmul_rounded: argument '", name, "' ",
                   x->shape().str(), " is ", dtype_name(x->dtype()), "; expected float32 or ", dtype_name(dtype));
    DUALCAST_CHECK(x->rank() == 2, "matmul_rounded: argument '", name, "' has shape ", x->shape().str(),
                   "; expected a 2-D matrix (with 'a' ", a.shape().str(), ", 'b' ", b.shape().str(), ")");
    DUALCAST_CHECK(x->is_contiguous(), "matmul_rounded: argument '", name, "' ", x->shape().str(),
                   " is not contiguous");
  }
  DUALCAST_CHECK(a.device() == b.device(), "matmul_rounded: 'a' ", a.shape().str(), " is on ", a.device().str(),
                 " and 'b' ", b.shape().str(), " on ", b.device().str());
  const std::int64_t m = trans_a ? a.shape()[1] : a.shape()[0], ka = trans_a ? a.shape()[0] : a.shape()[1];
  const std::int64_t n = trans_b ? b.shape()[0] : b.shape()[1], kb = trans_b ? b.shape()[1] : b.shape()[0];
  DUALCAST_CHECK(ka == kb, "matmul_rounded: inner dimensions differ: 'a' ", a.shape().str(), " (trans_a=",
                 trans_a ? "true" : "false", ") gives k=", ka, " but 'b' ", b.shape().str(), " (trans_b=",
                 trans_b ? "true" : "false", ") gives k=", kb);
  const Device dev = a.device();
  Tensor c = Tensor::empty({m, n}, DType::float32, dev);
  if (m == 0 || n == 0) return c;
  if (ka == 0) {
    c.fill_(0.0);
    return c;
  }
  // Operands are rounded once; a float32 A stays as it is for the skinny kernel, which rounds it as it loads.
  const Tensor b16 = b.dtype() == dtype ? b : b.to(dtype);
  auto library = [&] {
    const Tensor a16 = a.dtype() == dtype ? a : a.to(dtype);
    detail::gemm_16_to_32(dev, dtype, trans_a, trans_b, m, n, ka, a16.raw_data(), a16.shape()[1], b16.raw_data(),
                          b16.shape()[1], c.data<float>(), n);
  };
  if (detail::skinny_gemm_fits(dev, m, n, ka, trans_a, a.dtype(), dtype)) {
    auto ours = [&] {
      detail::skinny_gemm(dev, a.dtype(), dtype, trans_b, m, n, ka, a.raw_data(), a.shape()[1], b16.raw_data(),
                          b16.shape()[1], c.data<float>(), n);
    };
    const std::string key = std::string(dtype_name(dtype)) + " a " + dtype_name(a.dtype()) +
                            (trans_b ? " b^T " : " b ") + std::to_string(m) + "x" + std::to_string(n) + "x" +
                            std::to_string(ka) + " lda " + std::to_string(a.shape()[1]) + " ldb " +
                            std::to_string(b16.shape()[1]);
    if (detail::choose_skinny(dev, key, ours, library)) {
      ours();
      return c;
    }
  }
  library();
  return c;
}

}  // namespace dualcast
