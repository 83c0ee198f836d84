// cpu_simd_cases.hpp: the checks of the CPU broadcast tiles (kernels/broadcast_cpu.cuh: SIMD lanes,
// libmvec's vector exp/tanh/...) against the scalar chunks they replace, on the same inputs, in each
// instruction set this CPU has (AVX2, AVX-512): every branch of a functor with data-dependent control
// flow (lanes of one vector taking different branches), the arities of CpuSimdArities, two outputs,
// both partials policies, a call whose last tile is partial, tiles that gather chunk by chunk and
// tiles that lie in one innermost row (every broadcast pattern: row and column flags, a row broadcast
// over columns, a one-element tensor, a number), and inf, NaN and huge arguments in every vectorised
// math function. Included by test_cpu_simd.cu (float32, float64) and test_cpu_simd_half.cu
// (bfloat16, float16), each of which names its dtypes and arities: two translation units, so that
// the 16-bit bodies (what DUALCAST_BROADCAST_HALF=0 leaves out of the float one) compile beside the
// float ones and only for the arities they need. On a build without the tiles they check nothing
// and say so.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "hmlstm_update.hpp"

using namespace dualcast;

namespace {

using dualcast::testing::HmlstmUpdate;

struct HmlstmCell {
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto h, auto f, auto i, auto o, auto g) const {
    using D = decltype(c * f);
    if (z == 1) {
      const D cn = sigmoid(i) * tanh(g);
      return std::tuple<D, D>(cn, sigmoid(o) * tanh(cn));
    }
    if (zb == 0) return std::tuple<D, D>(c, h);
    const D cn = sigmoid(f) * c + sigmoid(i) * tanh(g);
    return std::tuple<D, D>(cn, sigmoid(o) * tanh(cn));
  }
};

struct ArityProduct {
  DUALCAST_HD auto operator()(auto... x) const {
    auto term = [](auto v) { return tanh(v > 0.5 ? v : -v); };
    return (term(x) * ...);
  }
};

// One math function of math.hpp per output, two arguments (for pow and hypot).
struct EveryFunction {
  DUALCAST_HD auto operator()(auto x, auto y) const {
    return std::make_tuple(exp(x), log(x), log1p(x), expm1(x), tanh(x), sin(x), cos(x), tan(x),
                           erf(x), cbrt(x), sigmoid(x), softplus(x), gelu(x), pow(x, y),
                           hypot(x, y));
  }
};

#if DUALCAST_CPU_TILES
/// How far tiles and chunks may differ in dtype t. Both compute in float (double for float64); the
/// tiles' libmvec differs by <= 4 ulp, which a sum that cancels amplifies (kSameResultTolFloat). A
/// 16-bit result is rounded once from such a float, so one step of its rounding may move; a gradient
/// sums two such products at most here (two outputs), hence two steps.
double tiles_tolerance(DType t) {
  if (t == DType::bfloat16) return 2 * kSameResultTolBfloat16;
  if (t == DType::float16) return 2 * kSameResultTolFloat16;
  return kSameResultTolFloat;
}

/// The same numbers, up to tiles_tolerance; NaN where the other has NaN, the same infinity where
/// the other has one.
void expect_same(const Tensor& tiles, const Tensor& scalar, const std::string& what) {
  const double tol = tiles_tolerance(scalar.dtype());
  const auto a = tiles.to(DType::float64).to_vector<double>();
  const auto b = scalar.to(DType::float64).to_vector<double>();
  ASSERT_EQ(a.size(), b.size()) << what;
  int shown = 0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    bool ok;
    if (std::isnan(b[j]) || std::isnan(a[j])) ok = std::isnan(a[j]) && std::isnan(b[j]);
    else if (std::isinf(b[j]) || std::isinf(a[j])) ok = a[j] == b[j];
    else ok = relative_error(a[j], b[j]) <= tol;
    if (!ok && shown++ < 5) ADD_FAILURE() << what << "[" << j << "]: tiles " << a[j] << ", scalar " << b[j];
  }
}

/// Inputs with special values sprinkled in (every 7th element +-inf, NaN, +-1e4 or +-100).
Tensor inputs(const Shape& s, std::uint64_t seed, DType t, bool special) {
  std::vector<double> v = Tensor::randn(s, Device::cpu(), seed, DType::float64).to_vector<double>();
  const double sp[] = {double(INFINITY), -double(INFINITY), double(NAN), 1e4, -1e4, 100, -100, 0.0, -0.0};
  if (special)
    for (std::size_t j = 3; j < v.size(); j += 7) v[j] = sp[(j / 7 + seed) % 9];
  return Tensor::from_vector(s, v, Device::cpu()).to(t);
}

/// The tiles' instruction sets this CPU has.
std::vector<detail::TileIsa> tile_isas() {
  std::vector<detail::TileIsa> isas{detail::TileIsa::avx2};
  if (detail::cpu_has_avx512_tiles()) isas.push_back(detail::TileIsa::avx512);
  return isas;
}

const char* isa_name(detail::TileIsa isa) { return isa == detail::TileIsa::avx512 ? "avx512" : "avx2"; }

/// Runs `call` (forward, then backward with a fixed adjoint) with the scalar chunks and with the
/// tiles of every instruction set this CPU has, and compares outputs and gradients.
template <class Call>
void compare_tiles_with_scalar(const std::vector<Tensor>& in, const Call& call, const std::string& what) {
  // Put the process's choice back however this ends (a failed ASSERT or an exception included).
  struct Restore {
    bool tiles = detail::cpu_simd_tiles();
    detail::TileIsa isa = detail::cpu_tile_isa();
    ~Restore() {
      detail::cpu_simd_tiles() = tiles;
      detail::cpu_tile_isa() = isa;
    }
  } restore;
  auto run = [&](bool tiles, std::vector<Tensor>& outs, std::vector<Tensor>& grads) {
    detail::cpu_simd_tiles() = tiles;
    std::vector<Var> v;
    for (const auto& t : in) v.push_back(Var::param(t));
    std::vector<Var> o = call(v);
    Var total;
    for (std::size_t m = 0; m < o.size(); ++m) {
      outs.push_back(o[m].value());
      const Tensor adj = Tensor::randn(o[m].value().shape(), Device::cpu(), 900 + m, o[m].value().dtype());
      const Var term = o[m] * Var::constant(adj);
      total = total.defined() ? total + term : term;
    }
    total.backward(Tensor::ones(total.value().shape(), total.value().dtype(), Device::cpu()));
    for (auto& x : v) grads.push_back(x.grad());
  };
  std::vector<Tensor> scalar_outs, scalar_grads;
  run(false, scalar_outs, scalar_grads);
  for (detail::TileIsa isa : tile_isas()) {
    detail::cpu_tile_isa() = isa;
    std::vector<Tensor> outs, grads;
    run(true, outs, grads);
    const std::string where = what + " (" + isa_name(isa) + ")";
    for (std::size_t m = 0; m < outs.size(); ++m)
      expect_same(outs[m], scalar_outs[m], where + " output " + std::to_string(m));
    for (std::size_t k = 0; k < grads.size(); ++k)
      expect_same(grads[k], scalar_grads[k], where + " gradient " + std::to_string(k));
  }
}

#endif  // DUALCAST_CPU_TILES

class CpuSimd : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
#if DUALCAST_CPU_TILES
    if (!detail::cpu_simd_tiles()) GTEST_SKIP() << "this CPU has no AVX2 (or DUALCAST_CPU_SIMD=0)";
#else
    GTEST_SKIP() << "built without the CPU SIMD tiles (DUALCAST_CPU_SIMD off or not GCC on x86-64)";
#endif
  }
};

}  // namespace

#if DUALCAST_CPU_TILES

TEST_P(CpuSimd, VectorisedChunkEqualsScalarChunkForEveryBranch) {
  const DType t = GetParam();
  // rows x cols with cols a multiple of the chunk width (the fast path) and a partial last tile;
  // flags per column: neighbouring lanes take different branches. Also per row (uniform lanes).
  const std::int64_t rows = 37, cols = 36;
  for (bool per_column : {true, false}) {
    const Shape fs = per_column ? Shape{1, cols} : Shape{rows, 1};
    std::vector<double> z = Tensor::bernoulli(fs, 0.5, Device::cpu(), 5).to_vector<double>();
    std::vector<double> zb = Tensor::bernoulli(fs, 0.5, Device::cpu(), 6).to_vector<double>();
    z[0] = 1; z[1] = 0; zb[1] = 0; z[2] = 0; zb[2] = 1;  // every branch
    const Tensor tz = Tensor::from_vector(fs, z, Device::cpu()).to(t);
    const Tensor tzb = Tensor::from_vector(fs, zb, Device::cpu()).to(t);
    for (bool special : {false, true}) {
      std::vector<Tensor> in;
      for (int k = 0; k < 4; ++k) in.push_back(inputs({rows, cols}, 20 + k, t, special));
      for (Partials p : {Partials::recompute, Partials::store}) {
        compare_tiles_with_scalar(in, [&](const std::vector<Var>& v) {
          return std::vector<Var>{broadcast(p, HmlstmUpdate{}, tz, tzb, v[0], v[1], v[2], v[3])};
        }, std::string(partials_name(p)) + (per_column ? " divergent" : " uniform") +
               (special ? " special" : ""));
      }
    }
  }
}

TEST_P(CpuSimd, TilesInOneRowEqualScalarChunksForEveryBroadcastPattern) {
  const DType t = GetParam();
  // 128 columns: a multiple of every tile width (16-32 floats, 8-16 doubles), so every tile lies in
  // one innermost row and reads each argument with one offset, whatever its pattern; 11 rows make
  // the call's last tile a full one; 124 columns (a multiple of the chunk width, of no tile width) the chunk-by-chunk
  // gather's case for the same patterns.
  for (std::int64_t cols : {128, 124}) {
    const std::int64_t rows = 11;
    std::vector<double> z = Tensor::bernoulli({rows, 1}, 0.5, Device::cpu(), 15).to_vector<double>();
    std::vector<double> zb = Tensor::bernoulli({1, cols}, 0.5, Device::cpu(), 16).to_vector<double>();
    z[0] = 1; z[1] = 0; z[2] = 0; zb[0] = 0; zb[1] = 1;  // every branch
    const Tensor tz = Tensor::from_vector({rows, 1}, z, Device::cpu()).to(t);     // row flags
    const Tensor tzb = Tensor::from_vector({1, cols}, zb, Device::cpu()).to(t);   // column flags
    for (bool special : {false, true}) {
      const std::vector<Tensor> in{inputs({1, cols}, 50, t, special),     // c: one row, every row
                                   inputs({rows, cols}, 51, t, special),  // f: the output's shape
                                   inputs({1}, 52, t, false),             // i: one element
                                   inputs({rows, 1}, 53, t, special)};    // g: one value per row
      const std::string shape = " cols " + std::to_string(cols) + (special ? " special" : "");
      for (Partials p : {Partials::recompute, Partials::store}) {
        compare_tiles_with_scalar(in, [&](const std::vector<Var>& v) {
          return std::vector<Var>{broadcast(p, HmlstmUpdate{}, tz, tzb, v[0], v[1], v[2], v[3])};
        }, std::string(partials_name(p)) + shape);
        compare_tiles_with_scalar({in[0], in[1], in[3]}, [&](const std::vector<Var>& v) {
          return std::vector<Var>{broadcast(p, HmlstmUpdate{}, tz, tzb, v[0], v[1], 0.75, v[2])};
        }, std::string(partials_name(p)) + " number for i" + shape);
      }
    }
  }
}

TEST_P(CpuSimd, VectorisedChunkEqualsScalarChunkForTwoOutputs) {
  const DType t = GetParam();
  const Tensor z = Tensor::bernoulli({1, 20}, 0.5, Device::cpu(), 7).to(t);
  const Tensor zb = Tensor::bernoulli({1, 20}, 0.5, Device::cpu(), 8).to(t);
  std::vector<Tensor> in;
  for (int k = 0; k < 6; ++k) in.push_back(inputs({50, 20}, 30 + k, t, true));
  for (Partials p : {Partials::recompute, Partials::store}) {
    compare_tiles_with_scalar(in, [&](const std::vector<Var>& v) {
      auto [c, h] = broadcast(p, HmlstmCell{}, z, zb, v[0], v[1], v[2], v[3], v[4], v[5]);
      return std::vector<Var>{c, h};
    }, std::string("cell ") + partials_name(p));
  }
}

template <std::size_t... I>
std::vector<Var> arity_call(Partials p, const std::vector<Var>& v, std::index_sequence<I...>) {
  return {broadcast(p, ArityProduct{}, v[I]...)};
}

template <int K>
void check_arity(DType t) {
  std::vector<Tensor> in;
  for (int k = 0; k < K; ++k) in.push_back(inputs({1000 + 16}, 40 + k, t, K % 3 == 0));
  for (Partials p : {Partials::recompute, Partials::store})
    compare_tiles_with_scalar(in, [&](const std::vector<Var>& v) {
      return arity_call(p, v, std::make_index_sequence<K>{});
    }, "arity " + std::to_string(K) + " " + partials_name(p));
}

TEST_P(CpuSimd, VectorisedChunkEqualsScalarChunkForEveryArity) {
  const DType t = GetParam();
  [&]<int... K>(std::integer_sequence<int, K...>) { (check_arity<K>(t), ...); }(CpuSimdArities{});
}

TEST_P(CpuSimd, VectorMathKeepsSpecialValuesAndAccuracy) {
  const DType t = GetParam();
  // x over a wide range (and inf, NaN, 0, -0, huge), y a second argument for pow and hypot.
  std::vector<double> xs, ys;
  for (double v = -60; v <= 60; v += 0.37) xs.push_back(v);
  for (double v : std::initializer_list<double>{0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-30, 1e30, -1e30, 88.7, 89.0, -104.0,
                   709.0, 710.0, 1e300, 1e4, -1e4, 3e38, 0.5, 1.0, 2.0})
    xs.push_back(v);
  while (xs.size() % 16 != 0) xs.push_back(0.25);
  for (std::size_t j = 0; j < xs.size(); ++j) ys.push_back(j % 5 == 0 ? 2.0 : 0.5 + 0.01 * double(j % 97));
  const auto n = static_cast<std::int64_t>(xs.size());
  const std::vector<Tensor> in{Tensor::from_vector({n}, xs, Device::cpu()).to(t),
                               Tensor::from_vector({n}, ys, Device::cpu()).to(t)};
  compare_tiles_with_scalar(in, [&](const std::vector<Var>& v) {
    auto r = broadcast(Partials::recompute, EveryFunction{}, v[0], v[1]);
    std::vector<Var> out;
    std::apply([&](auto&... o) { (out.push_back(o), ...); }, r);
    return out;
  }, "math");
}

#endif  // DUALCAST_CPU_TILES

TEST_P(CpuSimd, TilesAreOnWhereTheBuildAndCpuAllowThem) {
  // Reached only when SetUp did not skip: the tiles are compiled and this CPU runs them.
  SUCCEED();
}

