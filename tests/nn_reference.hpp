// nn_reference.hpp: what the convolutional-network tests share: naive double-precision references of
// conv2d, the poolings and batch norm written straight from their definitions, a tolerance check over
// whole tensors, and an error-message check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/conv.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast::testing {

/// Worst relative_error (gradcheck.hpp) of got against want, with the position, as a gtest check.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = relative_error(got[i], want[i]);
    if (e > worst || std::isnan(e)) {
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " got " << (got.empty() ? 0.0 : got[at])
                        << " want " << (want.empty() ? 0.0 : want[at]);
}

inline void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  expect_close(got.to_vector<double>(), want.to_vector<double>(), tol, what);
}

/// max |got - want| / rms(want): the error of a long float sum judged against the size of the sums
/// (elementwise relative errors mislead where a sum of large terms lands near zero).
inline void expect_close_to_scale(const std::vector<double>& got, const std::vector<double>& want,
                                  double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double sq = 0, worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    sq += want[i] * want[i];
    const double e = std::fabs(got[i] - want[i]);
    if (e > worst || std::isnan(e)) {
      worst = e;
      at = i;
    }
  }
  const double rms = std::sqrt(sq / static_cast<double>(std::max<std::size_t>(1, want.size())));
  EXPECT_LE(worst / rms, tol) << what << ": element " << at << " got " << got[at] << " want "
                              << want[at] << " (rms " << rms << ")";
}

/// fn() throws dualcast::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts, const std::string& what = "") {
  try {
    fn();
    ADD_FAILURE() << what << ": no dualcast::Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << what << ": message lacks '" << p << "': " << msg;
  }
}

/// conv2d by definition (cross-correlation, zero padding), in double.
inline std::vector<double> naive_conv2d(const std::vector<double>& x, const Shape& xs,
                                        const std::vector<double>& w, const Shape& ws,
                                        const Conv2dOptions& o) {
  const std::int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const std::int64_t O = ws[0], Cg = ws[1], KH = ws[2], KW = ws[3];
  const std::int64_t G = o.groups, Og = O / G;
  const std::int64_t OH = (H + 2 * o.padding.h - o.dilation.h * (KH - 1) - 1) / o.stride.h + 1;
  const std::int64_t OW = (W + 2 * o.padding.w - o.dilation.w * (KW - 1) - 1) / o.stride.w + 1;
  std::vector<double> y(static_cast<std::size_t>(N * O * OH * OW), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t oc = 0; oc < O; ++oc) {
      const std::int64_t g = oc / Og;
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0.0;
          for (std::int64_t j = 0; j < Cg; ++j)
            for (std::int64_t kh = 0; kh < KH; ++kh)
              for (std::int64_t kw = 0; kw < KW; ++kw) {
                const std::int64_t ih = oh * o.stride.h - o.padding.h + kh * o.dilation.h;
                const std::int64_t iw = ow * o.stride.w - o.padding.w + kw * o.dilation.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const std::int64_t c = g * Cg + j;
                acc += x[static_cast<std::size_t>(((n * C + c) * H + ih) * W + iw)] *
                       w[static_cast<std::size_t>(((oc * Cg + j) * KH + kh) * KW + kw)];
              }
          y[static_cast<std::size_t>(((n * O + oc) * OH + oh) * OW + ow)] = acc;
        }
    }
  return y;
}

enum class NaivePool { max, avg, avg_exclude_pad };

/// Window pooling by definition; padding is -inf (max) or 0 (avg).
inline std::vector<double> naive_pool(const std::vector<double>& x, const Shape& xs, NaivePool kind,
                                      Size2 k, Size2 s, Size2 p) {
  const std::int64_t NC = xs[0] * xs[1], H = xs[2], W = xs[3];
  const std::int64_t OH = (H + 2 * p.h - k.h) / s.h + 1, OW = (W + 2 * p.w - k.w) / s.w + 1;
  std::vector<double> y;
  for (std::int64_t nc = 0; nc < NC; ++nc)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        std::int64_t inside = 0;
        for (std::int64_t i = 0; i < k.h; ++i)
          for (std::int64_t j = 0; j < k.w; ++j) {
            const std::int64_t h = oh * s.h - p.h + i, w = ow * s.w - p.w + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = x[static_cast<std::size_t>((nc * H + h) * W + w)];
            best = std::max(best, v);
            sum += v;
            ++inside;
          }
        if (kind == NaivePool::max) y.push_back(best);
        else if (kind == NaivePool::avg) y.push_back(sum / static_cast<double>(k.h * k.w));
        else y.push_back(sum / static_cast<double>(inside));
      }
  return y;
}

/// Adaptive average pooling by PyTorch's window rule.
inline std::vector<double> naive_adaptive_avg(const std::vector<double>& x, const Shape& xs, Size2 out) {
  const std::int64_t NC = xs[0] * xs[1], H = xs[2], W = xs[3];
  std::vector<double> y;
  for (std::int64_t nc = 0; nc < NC; ++nc)
    for (std::int64_t oh = 0; oh < out.h; ++oh)
      for (std::int64_t ow = 0; ow < out.w; ++ow) {
        const std::int64_t h0 = oh * H / out.h, h1 = ((oh + 1) * H + out.h - 1) / out.h;
        const std::int64_t w0 = ow * W / out.w, w1 = ((ow + 1) * W + out.w - 1) / out.w;
        double sum = 0;
        for (std::int64_t h = h0; h < h1; ++h)
          for (std::int64_t w = w0; w < w1; ++w) sum += x[static_cast<std::size_t>((nc * H + h) * W + w)];
        y.push_back(sum / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
  return y;
}

/// Per-channel batch mean and biased variance of x [N, C, *], in double.
inline void naive_batch_stats(const std::vector<double>& x, const Shape& xs, std::vector<double>& mean,
                              std::vector<double>& var) {
  const std::int64_t N = xs[0], C = xs[1];
  const std::int64_t inner = xs.numel() / std::max<std::int64_t>(1, N * C);
  mean.assign(static_cast<std::size_t>(C), 0.0);
  var.assign(static_cast<std::size_t>(C), 0.0);
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t r = 0; r < inner; ++r) s += x[static_cast<std::size_t>((n * C + c) * inner + r)];
    const double m = s / static_cast<double>(N * inner);
    double v = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t r = 0; r < inner; ++r) {
        const double d = x[static_cast<std::size_t>((n * C + c) * inner + r)] - m;
        v += d * d;
      }
    mean[static_cast<std::size_t>(c)] = m;
    var[static_cast<std::size_t>(c)] = v / static_cast<double>(N * inner);
  }
}

}  // namespace dualcast::testing
