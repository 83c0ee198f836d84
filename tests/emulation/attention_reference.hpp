// attention_reference.hpp: what the emulated attention kernels' tests share (test_attention_emulation,
// test_attention_mma_emulation): a case's sizes and mask kind, the masks themselves, and the float64
// reference of the output, the log-sum-exp (base 2) and the three gradients, from the definition.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention_internal.hpp"

namespace dualcast::attention_detail::testing {

struct Case {
  std::int64_t B, H, Sq, Sk, D;
  bool causal;
  int mask;  // 0 none, 1 boolean key padding [B, 1, 1, Sk] (batch 0 all masked), 2 additive [Sq, Sk]
             // with -inf entries and one fully masked row, 3 boolean [B, H, Sq, Sk]
};

struct Reference {
  std::vector<double> o, lse2, dq, dk, dv;
};

/// Forward and backward from the definition, in double (lse in base 2, -inf for masked rows).
inline Reference reference(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout,
                    const std::vector<double>& mask, double scale) {
  const std::int64_t Sq = c.Sq, Sk = c.Sk, D = c.D, BH = c.B * c.H;
  Reference r;
  r.o.assign(static_cast<std::size_t>(BH * Sq * D), 0.0);
  r.lse2.assign(static_cast<std::size_t>(BH * Sq), -INFINITY);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(static_cast<std::size_t>(BH * Sk * D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  std::vector<double> s(static_cast<std::size_t>(Sk)), p(s.size()), dp(s.size());
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t bh = 0; bh < BH; ++bh)
    for (std::int64_t i = 0; i < Sq; ++i) {
      double m = -INFINITY;
      for (std::int64_t j = 0; j < Sk; ++j) {
        double x = 0.0;
        for (std::int64_t d = 0; d < D; ++d) x += q[at((bh * Sq + i) * D + d)] * k[at((bh * Sk + j) * D + d)];
        x *= scale;
        const double mv = mask.empty() ? 0.0 : mask[at((bh * Sq + i) * Sk + j)];
        if (c.causal && j > i) x = -INFINITY;
        else if ((c.mask == 1 || c.mask == 3) && mv == 0.0) x = -INFINITY;
        else if (c.mask == 2) x += mv;
        s[at(j)] = x;
        m = std::max(m, x);
      }
      if (m == -INFINITY) continue;
      double z = 0.0;
      for (std::int64_t j = 0; j < Sk; ++j) z += std::exp(s[at(j)] - m);
      r.lse2[at(bh * Sq + i)] = (m + std::log(z)) / std::log(2.0);
      for (std::int64_t j = 0; j < Sk; ++j) p[at(j)] = std::exp(s[at(j)] - m) / z;
      double dot = 0.0;
      for (std::int64_t j = 0; j < Sk; ++j) {
        dp[at(j)] = 0.0;
        for (std::int64_t d = 0; d < D; ++d) {
          r.o[at((bh * Sq + i) * D + d)] += p[at(j)] * v[at((bh * Sk + j) * D + d)];
          dp[at(j)] += dout[at((bh * Sq + i) * D + d)] * v[at((bh * Sk + j) * D + d)];
        }
        dot += dp[at(j)] * p[at(j)];
      }
      for (std::int64_t j = 0; j < Sk; ++j) {
        const double ds = p[at(j)] * (dp[at(j)] - dot) * scale;
        for (std::int64_t d = 0; d < D; ++d) {
          r.dq[at((bh * Sq + i) * D + d)] += ds * k[at((bh * Sk + j) * D + d)];
          r.dk[at((bh * Sk + j) * D + d)] += ds * q[at((bh * Sq + i) * D + d)];
          r.dv[at((bh * Sk + j) * D + d)] += p[at(j)] * dout[at((bh * Sq + i) * D + d)];
        }
      }
    }
  return r;
}

/// A case's mask (none for mask kind 0): the kernels' view of it, its storage (additive values of
/// type A) and the mask broadcast to [B, H, Sq, Sk] in double for the reference.
template <class A>
struct MaskData {
  std::vector<std::uint8_t> keep;
  std::vector<A> add;
  std::vector<double> full;
  MaskView view;
};

/// Kind 1: boolean key padding [B, 1, 1, Sk] (batch 0 all masked); 2: additive [Sq, Sk] with -inf
/// entries and a fully masked row; 3: boolean [B, H, Sq, Sk]. The view points into md.
template <class A>
void make_mask(const Case& c, std::mt19937& gen, MaskData<A>& md) {
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  const std::int64_t B = c.B, H = c.H, Sq = c.Sq, Sk = c.Sk;
  auto& keep = md.keep;
  auto& add = md.add;
  auto& full = md.full;
  auto& mv = md.view;
  const auto full_from = [&](auto&& value_at) {
    full.resize(static_cast<std::size_t>(B * H * Sq * Sk));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < Sq; ++i)
          for (std::int64_t j = 0; j < Sk; ++j)
            full[static_cast<std::size_t>(((b * H + h) * Sq + i) * Sk + j)] = value_at(b, h, i, j);
  };
  if (c.mask == 1) {
    keep.resize(static_cast<std::size_t>(B * Sk));
    for (std::size_t j = 0; j < keep.size(); ++j) keep[j] = j >= static_cast<std::size_t>(Sk) && uniform(gen) < 0.8;
    mv = MaskView{keep.data(), MaskKind::boolean, Sk, 0, 0, 1};
    full_from([&](auto b, auto, auto, auto j) { return double(keep[static_cast<std::size_t>(b * Sk + j)]); });
  } else if (c.mask == 2) {
    add.resize(static_cast<std::size_t>(Sq * Sk));
    for (auto& x : add) x = uniform(gen) < 0.1 ? static_cast<A>(-INFINITY) : static_cast<A>(normal(gen));
    const std::int64_t dead = std::min<std::int64_t>(3, Sq - 1);
    for (std::int64_t j = 0; j < Sk; ++j) add[static_cast<std::size_t>(dead * Sk + j)] = static_cast<A>(-INFINITY);
    mv = MaskView{add.data(), MaskKind::additive, 0, 0, Sk, 1};
    full_from([&](auto, auto, auto i, auto j) { return double(add[static_cast<std::size_t>(i * Sk + j)]); });
  } else if (c.mask == 3) {
    keep.resize(static_cast<std::size_t>(B * H * Sq * Sk));
    for (auto& x : keep) x = uniform(gen) < 0.7;
    mv = MaskView{keep.data(), MaskKind::boolean, H * Sq * Sk, Sq * Sk, Sk, 1};
    full.assign(keep.begin(), keep.end());
  }
}

}  // namespace dualcast::attention_detail::testing
