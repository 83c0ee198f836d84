// test_nonfinite_logits.cu: a +inf, -inf or NaN logit in one line of softmax, log_softmax or
// cross_entropy affects that line only, and inside it exactly the elements dualcast's documented
// rule names (src/loss.cu, ops/loss.hpp): a NaN makes its line NaN; k >= 1 elements equal to +inf
// give NaN at those elements and 0 (softmax) / -inf (log_softmax) at the others; -inf among finite
// values gives 0 / -inf there. The rule is checked against a double-precision reference, forward and
// backward, on every line-length path of both backends:
//   CPU: the one-by-one tail and the four-at-a-time groups (any C);
//   GPU: a thread per line (C <= 16, or a reduction along a non-last axis), a warp per line
//        (16 < C < 1024) and a block per line (C >= 1024);
// with poisoned elements in lanes other than lane 0, several lines per launch, and a lane that holds
// nothing but NaNs (its running maximum stays -inf, which the merge of lanes must not drop).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/random.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"
#include "../src/line_stats.hpp"  // the statistics the kernels use, to replay the GPU's merge order
#include "test_util.hpp"

namespace dualcast {
namespace {

constexpr double kInf = INFINITY;
constexpr double kNaN = NAN;

/// Row lengths covering every path: CPU tail/groups, GPU thread (<= 16), warp (17..1023), block.
const std::vector<std::int64_t> kLengths = {1, 3, 5, 11, 16, 17, 33, 257, 1023, 1024, 1025, 2053};
constexpr int kPatterns = 8;

/// Lane stride of the GPU path for a last-axis line of C elements (1: a thread per line).
std::int64_t gpu_group(std::int64_t C) { return C <= 16 ? 1 : (C >= 1024 ? 256 : 32); }

/// Line pattern p of length C: 0, 2, 6 clean; 1 one +inf; 3 one NaN; 4 two +inf and a -inf;
/// 5 a -inf among finite values; 7 NaN in every element of one GPU lane (lane 3), so that lane's
/// running maximum stays -inf. Positions avoid lane 0 wherever C allows.
std::vector<double> make_line(int p, std::int64_t C, std::uint64_t seed) {
  std::vector<double> v(static_cast<std::size_t>(C));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 3.0 * random::normal(seed, i);
  const auto at = [&](std::int64_t k) -> double& { return v[static_cast<std::size_t>(k % C)]; };
  const std::int64_t p1 = C * 2 / 3, p3 = C / 3 + 1, p4 = 1, p2 = C >= 2 ? C - 2 : 0;
  switch (p) {
    case 1: at(p1) = kInf; break;
    case 3: at(p2) = kNaN; break;
    case 4:
      at(p1) = kInf;
      at(p3) = kInf;
      if (p4 % C != p1 % C && p4 % C != p3 % C) at(p4) = -kInf;
      break;
    case 5: at(p4) = -kInf; break;
    case 7:
      for (std::int64_t k = 3 % C; k < C; k += gpu_group(C)) at(k) = kNaN;
      break;
    default: break;
  }
  return v;
}

/// softmax (log = false) or log_softmax of one line in double, under dualcast's rule.
std::vector<double> ref_line(const std::vector<double>& x, bool log) {
  std::vector<double> y(x.size());
  bool nan = false;
  double m = -kInf;
  for (double v : x) {
    nan = nan || std::isnan(v);
    if (v > m) m = v;
  }
  if (nan || m == -kInf) {
    for (double& v : y) v = kNaN;
    return y;
  }
  if (m == kInf) {
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] == kInf ? kNaN : (log ? -kInf : 0.0);
    return y;
  }
  double z = 0.0;
  for (double v : x) z += std::exp(v - m);
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = log ? (x[i] - m) - std::log(z) : std::exp(x[i] - m) / z;
  return y;
}

/// Same NaN/inf pattern, finite values within tol (relative to max(1, |want|)).
void expect_same(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size() && reported < 5; ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isnan(w) ? std::isnan(g)
                    : std::isinf(w) ? g == w
                                    : (std::isfinite(g) && relative_error(g, w) <= tol);
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << w;
      ++reported;
    }
  }
}

/// A tensor [outer, C, inner] whose line (o, i) follows pattern (o * inner + i) % kPatterns, and the
/// reference along axis 1 (values of the lines gathered back into place).
struct Lines {
  Shape shape;
  std::vector<double> x;
  std::vector<std::vector<double>> lines;  // per line, its C values
};

Lines make_lines(std::int64_t outer, std::int64_t C, std::int64_t inner, std::uint64_t seed) {
  Lines L;
  L.shape = inner == 1 && outer >= 1 ? Shape{outer, C} : Shape{outer, C, inner};
  L.x.resize(static_cast<std::size_t>(outer * C * inner));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      const std::int64_t l = o * inner + i;
      L.lines.push_back(make_line(static_cast<int>(l % kPatterns), C, seed + static_cast<std::uint64_t>(l)));
      for (std::int64_t c = 0; c < C; ++c)
        L.x[static_cast<std::size_t>((o * C + c) * inner + i)] = L.lines.back()[static_cast<std::size_t>(c)];
    }
  return L;
}

/// L with its values replaced by x (the same layout), lines gathered again.
Lines regather(const Lines& L, std::vector<double> x, std::int64_t C, std::int64_t inner) {
  Lines r = L;
  r.x = std::move(x);
  for (std::size_t l = 0; l < r.lines.size(); ++l) {
    const std::int64_t o = static_cast<std::int64_t>(l) / inner, i = static_cast<std::int64_t>(l) % inner;
    for (std::int64_t c = 0; c < C; ++c)
      r.lines[l][static_cast<std::size_t>(c)] = r.x[static_cast<std::size_t>((o * C + c) * inner + i)];
  }
  return r;
}

/// Applies per-line `fn(line values, line index) -> line result` and scatters into [outer, C, inner].
template <class Fn>
std::vector<double> per_line(const Lines& L, std::int64_t C, std::int64_t inner, Fn&& fn) {
  std::vector<double> out(L.x.size());
  for (std::size_t l = 0; l < L.lines.size(); ++l) {
    const std::vector<double> r = fn(L.lines[l], l);
    const std::int64_t o = static_cast<std::int64_t>(l) / inner, i = static_cast<std::int64_t>(l) % inner;
    for (std::int64_t c = 0; c < C; ++c)
      out[static_cast<std::size_t>((o * C + c) * inner + i)] = r[static_cast<std::size_t>(c)];
  }
  return out;
}

class NonfiniteLogits : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  [[nodiscard]] Device dev() const { return GetParam(); }

  /// softmax and log_softmax along axis 1 of [outer, C, inner], values and gradients.
  void check_softmax(std::int64_t outer, std::int64_t C, std::int64_t inner, DType dt) {
    const Lines L = make_lines(outer, C, inner, static_cast<std::uint64_t>(C * 7 + inner));
    const std::string what = L.shape.str() + " axis 1 " + dtype_name(dt);
    const double tol = dt == DType::float32 ? kSameResultTolFloat : 1e-12;
    const Tensor x = Tensor::from_vector(L.shape, L.x, dev()).to(dt);
    // The reference sees the values the op sees (rounded to float32 where dt is float32).
    const Lines Lx = regather(L, x.to_vector<double>(), C, inner);
    const std::vector<double> g = Tensor::randn(L.shape, Device::cpu(), 99, DType::float64).to_vector<double>();
    const Tensor gt = Tensor::from_vector(L.shape, g, dev()).to(dt);
    for (const bool log : {false, true}) {
      const std::string op = (log ? "log_softmax " : "softmax ") + what;
      const auto ref_y = per_line(Lx, C, inner, [&](const std::vector<double>& v, std::size_t) { return ref_line(v, log); });
      const Var xv = Var::param(x);
      const Var y = log ? log_softmax(xv, 1) : softmax(xv, 1);
      expect_same(y.value().to_vector<double>(), ref_y, tol, op);
      // Backward: softmax gx = y (g - sum(g y)); log_softmax gx = g - exp(y) sum(g), per line.
      y.backward(gt);
      std::vector<double> ref_g(L.x.size());
      for (std::size_t l = 0; l < Lx.lines.size(); ++l) {
        const std::int64_t o = static_cast<std::int64_t>(l) / inner, i = static_cast<std::int64_t>(l) % inner;
        const auto idx = [&](std::int64_t c) { return static_cast<std::size_t>((o * C + c) * inner + i); };
        double dot = 0.0;
        for (std::int64_t c = 0; c < C; ++c) dot += log ? g[idx(c)] : g[idx(c)] * ref_y[idx(c)];
        for (std::int64_t c = 0; c < C; ++c)
          ref_g[idx(c)] = log ? g[idx(c)] - std::exp(ref_y[idx(c)]) * dot : ref_y[idx(c)] * (g[idx(c)] - dot);
      }
      expect_same(xv.grad().to_vector<double>(), ref_g, dt == DType::float32 ? 1e-3 : 1e-10,
                  op + " gradient");
    }
  }
};

TEST_P(NonfiniteLogits, SoftmaxPoisonStaysInItsLineOnEveryRowLengthPath) {
  for (const DType dt : {DType::float32, DType::float64})
    for (const std::int64_t C : kLengths) check_softmax(2 * kPatterns, C, 1, dt);
}

TEST_P(NonfiniteLogits, SoftmaxPoisonStaysInItsLineAlongANonLastAxis) {
  for (const DType dt : {DType::float32, DType::float64})
    for (const std::int64_t C : {3, 17, 257, 1025}) check_softmax(3, C, 5, dt);
}

TEST_P(NonfiniteLogits, CrossEntropyPoisonStaysInItsRowOnEveryRowLengthPath) {
  for (const DType dt : {DType::float32, DType::float64}) {
    for (const std::int64_t C : kLengths) {
      // Batch A: every pattern; batch B: clean rows and one +inf row (label elsewhere): loss +inf.
      for (const bool only_inf : {false, true}) {
        if (only_inf && C < 2) continue;  // a one-class row's only logit would be the +inf
        const std::int64_t N = only_inf ? 3 : 2 * kPatterns;
        std::vector<double> x;
        std::vector<std::vector<double>> rows;
        for (std::int64_t r = 0; r < N; ++r) {
          const int p = only_inf ? (r == 1 ? 1 : 0) : static_cast<int>(r % kPatterns);
          rows.push_back(make_line(p, C, static_cast<std::uint64_t>(1000 + C * 31 + r)));
        }
        // Labels: away from the +inf elements (row loss +inf), except in the second copy of the
        // patterns, where pattern 1's label is its +inf element (row loss NaN).
        std::vector<int> labels(static_cast<std::size_t>(N));
        for (std::int64_t r = 0; r < N; ++r) {
          int lab = static_cast<int>((r * 5 + 2) % C);
          const auto& row = rows[static_cast<std::size_t>(r)];
          const bool want_inf_label = !only_inf && r >= kPatterns && r % kPatterns == 1;
          for (std::int64_t k = 0; k < C; ++k) {
            const std::int64_t c = (lab + k) % C;
            const bool is_inf = row[static_cast<std::size_t>(c)] == kInf;
            if (is_inf == want_inf_label || C == 1) {
              lab = static_cast<int>(c);
              break;
            }
          }
          labels[static_cast<std::size_t>(r)] = lab;
        }
        for (const auto& row : rows) x.insert(x.end(), row.begin(), row.end());
        const std::string what = "cross_entropy [" + std::to_string(N) + ", " + std::to_string(C) + "] " +
                                 dtype_name(dt) + (only_inf ? " (+inf row only)" : "");
        const Tensor xt = Tensor::from_vector(Shape{N, C}, x, dev()).to(dt);
        const std::vector<double> xr = xt.to_vector<double>();
        // Reference: loss = mean of -log_softmax[label]; gradient (softmax - onehot) / N.
        double loss = 0.0;
        std::vector<double> ref_g(xr.size());
        for (std::int64_t r = 0; r < N; ++r) {
          const std::vector<double> row(xr.begin() + r * C, xr.begin() + (r + 1) * C);
          const std::vector<double> ls = ref_line(row, true), sm = ref_line(row, false);
          const int lab = labels[static_cast<std::size_t>(r)];
          loss -= ls[static_cast<std::size_t>(lab)];
          for (std::int64_t c = 0; c < C; ++c)
            ref_g[static_cast<std::size_t>(r * C + c)] =
                (sm[static_cast<std::size_t>(c)] - (c == lab ? 1.0 : 0.0)) / static_cast<double>(N);
        }
        loss /= static_cast<double>(N);
        if (only_inf) EXPECT_EQ(loss, kInf) << what << " (the reference)";
        const Var xv = Var::param(xt);
        const Var l = cross_entropy(xv, Tensor::from_vector<int>({N}, labels, dev()));
        expect_same({l.item()}, {loss}, dt == DType::float32 ? kSameResultTolFloat : 1e-12, what + " loss");
        l.backward();
        expect_same(xv.grad().to_vector<double>(), ref_g, dt == DType::float32 ? kSameResultTolFloat : 1e-12,
                    what + " gradient");
      }
    }
  }
}

TEST_P(NonfiniteLogits, TheIssuesRowOf257WithOnePlusInfIsNaNOnlyThere) {
  // The failing GPU case of issue 12, several rows, the +inf in lane 1 of the warp and, in the
  // 1025-wide rows, in a lane other than 0 of the block.
  for (const std::int64_t C : {257, 1025}) {
    std::vector<float> x(static_cast<std::size_t>(4 * C), 0.5f);
    const std::int64_t at = C == 257 ? 1 : 300;
    x[static_cast<std::size_t>(C + at)] = INFINITY;  // row 1
    const auto y = softmax(Tensor::from_vector<float>({4, C}, x, dev())).to_vector<double>();
    for (std::int64_t r = 0; r < 4; ++r)
      for (std::int64_t k = 0; k < C; ++k) {
        const double v = y[static_cast<std::size_t>(r * C + k)];
        if (r != 1) EXPECT_NEAR(v, 1.0 / static_cast<double>(C), 1e-6) << C << " " << r << " " << k;
        else if (k == at) EXPECT_TRUE(std::isnan(v)) << C;
        else EXPECT_EQ(v, 0.0) << C << " " << k;
      }
  }
}

/// The GPU's (max, sum) of one line of C elements, replayed on the host with the kernels' own
/// functions: G lanes each run line_stats over elements lane, lane + G, ...; a warp combines by the
/// xor butterfly of __shfl_xor_sync (d = 16, 8, 4, 2, 1, every lane merging its pair with its
/// partner's as read before the step); a block of 256 then merges warp 0's result with warps 1..7
/// in order, as group_allreduce in src/loss.cu does.
template <class T>
void gpu_line_stats(const std::vector<T>& x, int G, T& m, T& s) {
  const std::int64_t C = static_cast<std::int64_t>(x.size());
  if (G == 1) {
    detail::line_stats(x.data(), 0, 1, C, 0, 1, m, s);
    return;
  }
  std::vector<T> ms(static_cast<std::size_t>(G)), ss(static_cast<std::size_t>(G));
  for (int lane = 0; lane < G; ++lane)
    detail::line_stats(x.data(), 0, 1, C, lane, G, ms[static_cast<std::size_t>(lane)],
                       ss[static_cast<std::size_t>(lane)]);
  for (int w = 0; w < G / 32; ++w)
    for (int d = 16; d > 0; d >>= 1) {
      const std::vector<T> m0(ms.begin() + w * 32, ms.begin() + (w + 1) * 32);
      const std::vector<T> s0(ss.begin() + w * 32, ss.begin() + (w + 1) * 32);
      for (int l = 0; l < 32; ++l)
        detail::online_merge(ms[static_cast<std::size_t>(w * 32 + l)], ss[static_cast<std::size_t>(w * 32 + l)],
                             m0[static_cast<std::size_t>(l ^ d)], s0[static_cast<std::size_t>(l ^ d)]);
    }
  m = ms[0];
  s = ss[0];
  for (int w = 1; w < G / 32; ++w)
    detail::online_merge(m, s, ms[static_cast<std::size_t>(w * 32)], ss[static_cast<std::size_t>(w * 32)]);
}

template <class T>
void check_replayed_gpu_lines() {
  for (const std::int64_t C : kLengths)
    for (const int G : {1, 32, 256}) {  // every layout on every length, not only the one launched
      for (int p = 0; p < kPatterns; ++p) {
        const std::vector<double> xd = make_line(p, C, static_cast<std::uint64_t>(C + p));
        std::vector<T> x(xd.begin(), xd.end());
        T m, s;
        gpu_line_stats(x, G, m, s);
        std::vector<double> y(x.size()), ly(x.size());
        for (std::size_t k = 0; k < x.size(); ++k) {  // line_write's formulas
          y[k] = static_cast<double>(detail::lexp(x[k] - m) * (T(1) / s));
          ly[k] = static_cast<double>((x[k] - m) - detail::llog(s));
        }
        const std::vector<double> xr(x.begin(), x.end());
        const std::string what = "C " + std::to_string(C) + " G " + std::to_string(G) + " pattern " +
                                 std::to_string(p) + (sizeof(T) == 4 ? " float32" : " float64");
        const double tol = sizeof(T) == 4 ? kSameResultTolFloat : 1e-12;
        expect_same(y, ref_line(xr, false), tol, "softmax " + what);
        expect_same(ly, ref_line(xr, true), tol, "log_softmax " + what);
      }
    }
}

TEST(NonfiniteLogitsHost, GpuLaneLayoutAndMergeOrderReplayedOnTheHostFollowTheRule) {
  check_replayed_gpu_lines<float>();
  check_replayed_gpu_lines<double>();
}

INSTANTIATE_TEST_SUITE_P(Devices, NonfiniteLogits, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace
}  // namespace dualcast
