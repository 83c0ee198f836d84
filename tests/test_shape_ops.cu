// test_shape_ops.cu: transpose, permute, reshape, slice, concat, split, broadcast_to. Values against
// naive host index arithmetic (float32, float64 and uint8 masks), gradients against finite
// differences (float64) on odd and size-1 shapes, one node for split, CPU == GPU bit for bit, and
// argument errors that name the op and shapes, after which the ops still work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/shape.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

class ShapeOps : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
  /// 0, 1, 2, ... of the given shape and dtype on the test's device (exact; modulo 251 for uint8).
  Tensor iota(const Shape& s, DType dt = DType::float32) const {
    std::vector<double> v(static_cast<std::size_t>(s.numel()));
    std::iota(v.begin(), v.end(), 0.0);
    if (dt == DType::uint8)
      for (double& e : v) e = std::fmod(e, 251.0);
    return Tensor::from_vector(s, v, dev()).to(dt);
  }
};

/// Row-major multi-index of flat index i in shape s.
std::vector<std::int64_t> unravel(std::int64_t i, const Shape& s) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<std::size_t>(d)] = i % s[d];
    i /= s[d];
  }
  return idx;
}
std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& s) {
  std::int64_t i = 0;
  for (int d = 0; d < s.rank(); ++d) i = i * s[d] + idx[static_cast<std::size_t>(d)];
  return i;
}

/// Expects `fn` to throw dualcast::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no dualcast::Error thrown (expected one mentioning " << parts.at(0) << ")";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

template <class F>
void expect_gradients_match(const F& f, const std::vector<Tensor>& inputs, const std::string& what) {
  const GradCheckResult r = check_gradients(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

const DType kAllDTypes[] = {DType::float32, DType::float64, DType::uint8};

// ---- transpose and permute ----------------------------------------------------------------------

TEST_P(ShapeOps, TransposeSwapsTheLastTwoDimensions) {
  for (DType dt : kAllDTypes)
    // Small, size-1 and tile-straddling sizes (the GPU transposes through 32 x 32 tiles).
    for (const Shape& s : {Shape{3, 5}, Shape{1, 7}, Shape{4, 1}, Shape{2, 3, 5}, Shape{2, 1, 3, 4},
                           Shape{37, 70}, Shape{3, 33, 65}}) {
      const Tensor x = iota(s, dt);
      const Tensor y = transpose(x);
      Shape want = s;
      std::swap(want[s.rank() - 1], want[s.rank() - 2]);
      ASSERT_EQ(y.shape(), want);
      EXPECT_EQ(y.dtype(), dt);
      const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
      for (std::int64_t i = 0; i < y.numel(); ++i) {
        auto idx = unravel(i, want);
        std::swap(idx[idx.size() - 1], idx[idx.size() - 2]);
        ASSERT_EQ(yv[static_cast<std::size_t>(i)], xv[static_cast<std::size_t>(ravel(idx, s))])
            << s.str() << " " << dtype_name(dt) << " element " << i;
      }
    }
}

TEST_P(ShapeOps, PermuteMovesEveryElementToItsPermutedIndex) {
  const std::vector<std::vector<int>> perms = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1},
                                               {0, 2, 1, 3}, {-1, 0, 1, 2}, {1, 0, 3, 2}};
  // In the second shape {-1, 0, 1, 2} is a [5*40, 33] matrix transpose once dimensions merge.
  for (const Shape& s : {Shape{2, 3, 1, 4}, Shape{5, 40, 1, 33}})
    for (DType dt : kAllDTypes)
      for (const std::vector<int>& p : perms) {
        const Tensor x = iota(s, dt);
        const Tensor y = permute(x, p);
        std::vector<std::size_t> perm;
        for (int d : p) perm.push_back(static_cast<std::size_t>(d < 0 ? d + 4 : d));
        Shape want = s;
        for (int i = 0; i < 4; ++i) want[i] = s[static_cast<int>(perm[static_cast<std::size_t>(i)])];
        ASSERT_EQ(y.shape(), want);
        const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
        for (std::int64_t i = 0; i < y.numel(); ++i) {
          const auto oi = unravel(i, want);
          std::vector<std::int64_t> ii(4);
          for (std::size_t d = 0; d < 4; ++d) ii[perm[d]] = oi[d];
          ASSERT_EQ(yv[static_cast<std::size_t>(i)], xv[static_cast<std::size_t>(ravel(ii, s))])
              << s.str() << " " << dtype_name(dt) << " element " << i;
        }
      }
}

TEST_P(ShapeOps, TransposeAndPermuteGradientsMatchFiniteDifferences) {
  std::uint64_t seed = 1;
  for (const Shape& s : {Shape{3, 5}, Shape{1, 4}, Shape{2, 3, 1}})
    expect_gradients_match([](const std::vector<Var>& v) { return transpose(v[0]); },
                           {Tensor::randn(s, dev(), seed++, DType::float64)}, "transpose " + s.str());
  for (const std::vector<int>& p : {std::vector<int>{1, 3, 0, 2}, {3, 2, 1, 0}, {0, 2, 1, 3}})
    expect_gradients_match([&p](const std::vector<Var>& v) { return permute(v[0], p); },
                           {Tensor::randn(Shape{2, 3, 1, 5}, dev(), seed++, DType::float64)},
                           "permute");
}

// ---- reshape ------------------------------------------------------------------------------------

TEST_P(ShapeOps, ReshapeInfersMinusOneAndSharesStorage) {
  const Tensor x = iota(Shape{2, 3, 4});
  const Tensor a = reshape(x, {4, -1});
  EXPECT_EQ(a.shape(), (Shape{4, 6}));
  EXPECT_TRUE(a.shares_storage(x));
  EXPECT_EQ(a.to_vector<double>(), x.to_vector<double>());
  EXPECT_EQ(reshape(x, {-1}).shape(), (Shape{24}));
  EXPECT_EQ(reshape(x, Shape{1, 24, 1}).shape(), (Shape{1, 24, 1}));
  EXPECT_EQ(reshape(x, std::vector<std::int64_t>{2, -1, 2}).shape(), (Shape{2, 6, 2}));
  EXPECT_EQ(reshape(Tensor::zeros(Shape{0, 3}, DType::float32, dev()), {3, 0}).shape(), (Shape{3, 0}));
  const Var v = reshape(Var::param(x), {-1, 2});
  EXPECT_EQ(v.shape(), (Shape{12, 2}));
  EXPECT_TRUE(v.value().shares_storage(x));
}

TEST_P(ShapeOps, ReshapeGradientMatchesFiniteDifferences) {
  expect_gradients_match([](const std::vector<Var>& v) { return reshape(v[0], {5, -1}); },
                         {Tensor::randn(Shape{3, 5, 1}, dev(), 1, DType::float64)}, "reshape");
  // The adjoint view is shared: a later accumulation into the same input must not corrupt it.
  expect_gradients_match(
      [](const std::vector<Var>& v) {
        return concat({reshape(v[0], {-1}), reshape(v[0], {-1}), reshape(v[0], Shape{6})}, 0);
      },
      {Tensor::randn(Shape{2, 3}, dev(), 2, DType::float64)}, "reshape used three times");
}

// ---- slice --------------------------------------------------------------------------------------

TEST_P(ShapeOps, SliceTakesTheRangeAlongTheAxis) {
  const Shape s{3, 5, 2};
  for (DType dt : kAllDTypes)
    for (int axis : {0, 1, 2, -1})
      for (const auto& [start, stop] : {std::pair<std::int64_t, std::int64_t>{0, 1}, {1, 2}, {0, 2},
                                        {-2, -1}, {1, 1}, {-1, 2}}) {
        const int ax = axis < 0 ? axis + 3 : axis;
        const std::int64_t size = s[ax];
        const std::int64_t b = start < 0 ? start + size : start, e = stop < 0 ? stop + size : stop;
        if (b > e) continue;  // e.g. [-1, 2) on an axis of size 2 is empty-reversed: tested as an error
        const Tensor x = iota(s, dt);
        const Tensor y = slice(x, axis, start, stop);
        Shape want = s;
        want[ax] = e - b;
        ASSERT_EQ(y.shape(), want);
        const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
        for (std::int64_t i = 0; i < y.numel(); ++i) {
          auto idx = unravel(i, want);
          idx[static_cast<std::size_t>(ax)] += b;
          ASSERT_EQ(yv[static_cast<std::size_t>(i)], xv[static_cast<std::size_t>(ravel(idx, s))]);
        }
      }
}

TEST_P(ShapeOps, SliceGradientMatchesFiniteDifferences) {
  std::uint64_t seed = 10;
  for (const auto& [s, axis, start, stop] :
       {std::tuple{Shape{4, 5}, 1, std::int64_t{1}, std::int64_t{4}},
        std::tuple{Shape{4, 5}, 0, std::int64_t{-1}, std::int64_t{4}},
        std::tuple{Shape{3, 1, 7}, 2, std::int64_t{0}, std::int64_t{7}},
        std::tuple{Shape{3, 1, 7}, 1, std::int64_t{0}, std::int64_t{1}},
        std::tuple{Shape{2, 6, 3}, -2, std::int64_t{2}, std::int64_t{5}}})
    expect_gradients_match(
        [=](const std::vector<Var>& v) { return slice(v[0], axis, start, stop); },
        {Tensor::randn(s, dev(), seed++, DType::float64)}, "slice " + s.str());
}

// ---- concat -------------------------------------------------------------------------------------

TEST_P(ShapeOps, ConcatJoinsAlongTheAxis) {
  for (DType dt : kAllDTypes) {
    const Tensor a = iota(Shape{2, 3}, dt), b = iota(Shape{2, 1}, dt), c = iota(Shape{2, 2}, dt);
    const Tensor y = concat({a, b, c}, 1);  // a braced list of Tensors picks the Tensor overload
    static_assert(std::is_same_v<decltype(concat({a, b, c}, 1)), Tensor>);
    ASSERT_EQ(y.shape(), (Shape{2, 6}));
    EXPECT_EQ(y.to_vector<double>(),
              (std::vector<double>{0, 1, 2, 0, 0, 1, 3, 4, 5, 1, 2, 3}))
        << dtype_name(dt);
    const Tensor z = concat(std::vector<Tensor>{a, a}, 0);
    ASSERT_EQ(z.shape(), (Shape{4, 3}));
    EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  }
  // Empty pieces and a single piece.
  const Tensor e = Tensor::zeros(Shape{2, 0}, DType::float32, dev());
  EXPECT_EQ(concat({e, iota(Shape{2, 2}), e}, -1).to_vector<double>(), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(concat({iota(Shape{3})}, 0).to_vector<double>(), (std::vector<double>{0, 1, 2}));
}

TEST_P(ShapeOps, ConcatOfMoreThanEightPiecesIsCorrect) {
  std::vector<Tensor> pieces;
  double next = 0;
  for (int p = 0; p < 19; ++p) {
    const std::int64_t w = p % 3;  // widths 0, 1, 2, 0, 1, 2, ...
    std::vector<double> v(static_cast<std::size_t>(2 * w));
    for (double& e : v) e = next++;
    pieces.push_back(Tensor::from_vector(Shape{2, w}, v, dev()));
  }
  // Row r of the result is row r of every piece in turn.
  std::vector<double> want;
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t p = 0; p < 19; ++p) {
      const std::size_t w = p % 3;
      const std::vector<double> v = pieces[p].to_vector<double>();
      want.insert(want.end(), v.begin() + static_cast<std::ptrdiff_t>(r * w),
                  v.begin() + static_cast<std::ptrdiff_t>((r + 1) * w));
    }
  const Tensor y = concat(pieces, 1);
  ASSERT_EQ(y.shape(), (Shape{2, 18}));
  EXPECT_EQ(y.to_vector<double>(), want);
  // And back: split into the same pieces.
  std::vector<std::int64_t> sizes;
  for (int p = 0; p < 19; ++p) sizes.push_back(p % 3);
  const std::vector<Tensor> back = split(y, 1, sizes);
  ASSERT_EQ(back.size(), 19u);
  for (int p = 0; p < 19; ++p)
    EXPECT_EQ(back[static_cast<std::size_t>(p)].to_vector<double>(),
              pieces[static_cast<std::size_t>(p)].to_vector<double>())
        << "piece " << p;
}

TEST_P(ShapeOps, ConcatGradientMatchesFiniteDifferences) {
  std::uint64_t seed = 20;
  for (int axis : {0, 1, -1}) {
    std::vector<Tensor> in;
    for (std::int64_t w : {1, 3, 2}) {
      Shape s{2, 3, 4};
      s[axis < 0 ? axis + 3 : axis] = w;
      in.push_back(Tensor::randn(s, dev(), seed++, DType::float64));
    }
    expect_gradients_match([axis](const std::vector<Var>& v) { return concat(v, axis); }, in,
                           "concat axis " + std::to_string(axis));
  }
  // Eleven pieces (two kernel groups), one input repeated, one a constant.
  std::vector<Tensor> in;
  for (int p = 0; p < 10; ++p) in.push_back(Tensor::randn(Shape{3, 1 + p % 2}, dev(), seed++, DType::float64));
  const Tensor constant = Tensor::randn(Shape{3, 2}, dev(), seed++, DType::float64);
  expect_gradients_match(
      [&](const std::vector<Var>& v) {
        std::vector<Var> parts(v.begin(), v.end());
        parts.push_back(v[0]);
        parts.insert(parts.begin() + 3, Var(constant));
        return concat(parts, 1);
      },
      in, "concat of 12 pieces");
}

TEST_P(ShapeOps, ConcatMixesVarsAndTensors) {
  const Var p = Var::param(Tensor::randn(Shape{2, 2}, dev(), 1, DType::float64));
  const Tensor t = Tensor::randn(Shape{2, 1}, dev(), 2, DType::float64);
  const Var y = concat({p, t}, 1);  // a braced list with a Var picks the Var overload
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_TRUE(y.requires_grad());
  y.backward(Tensor::ones(Shape{2, 3}, DType::float64, dev()));
  EXPECT_EQ(p.grad().to_vector<double>(), (std::vector<double>{1, 1, 1, 1}));
}

// ---- split --------------------------------------------------------------------------------------

TEST_P(ShapeOps, SplitCutsThePiecesInOrder) {
  for (DType dt : kAllDTypes) {
    const Tensor x = iota(Shape{2, 5}, dt);
    const std::vector<Tensor> parts = split(x, 1, {2, 0, 3});
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[0].shape(), (Shape{2, 2}));
    EXPECT_EQ(parts[1].shape(), (Shape{2, 0}));
    EXPECT_EQ(parts[2].shape(), (Shape{2, 3}));
    EXPECT_EQ(parts[0].to_vector<double>(), (std::vector<double>{0, 1, 5, 6}));
    EXPECT_EQ(parts[2].to_vector<double>(), (std::vector<double>{2, 3, 4, 7, 8, 9}));
    const std::vector<Tensor> rows = split(x, 0, {1, 1});
    EXPECT_EQ(rows[1].to_vector<double>(), (std::vector<double>{5, 6, 7, 8, 9}));
  }
}

TEST_P(ShapeOps, HmlstmGateSplitIsOneNodeAndItsGradientMatchesFiniteDifferences) {
  // The HM-LSTM gate block: one [B, 4H+1] product cut into f, i, o, g (H each) and z (1).
  const std::int64_t B = 3, H = 4;
  const Var x = Var::param(Tensor::randn(Shape{B, 4 * H + 1}, dev(), 1, DType::float64));
  const auto before = autograd_stats().nodes_created;
  const std::vector<Var> gates = split(x, 1, {H, H, H, H, 1});
  EXPECT_EQ(autograd_stats().nodes_created, before + 1);
  ASSERT_EQ(gates.size(), 5u);
  EXPECT_EQ(gates[4].shape(), (Shape{B, 1}));
  for (const Var& g : gates) EXPECT_TRUE(g.requires_grad());

  expect_gradients_match(
      [&](const std::vector<Var>& v) {
        const std::vector<Var> s = split(v[0], 1, {H, H, H, H, 1});
        // Reordered, one gate unused (its adjoint is zero), one used twice.
        return concat({s[4], s[2], s[0], s[3], s[0]}, 1);
      },
      {Tensor::randn(Shape{B, 4 * H + 1}, dev(), 2, DType::float64)}, "hm-lstm split");
  std::uint64_t seed = 3;
  for (int axis : {0, 2, -1})
    expect_gradients_match(
        [axis](const std::vector<Var>& v) {
          const std::vector<Var> s = split(v[0], axis, {1, 0, 2});
          return concat({s[2], s[1], s[0]}, axis);
        },
        {Tensor::randn(Shape{3, 2, 3}, dev(), seed++, DType::float64)},
        "split axis " + std::to_string(axis));
}

TEST_P(ShapeOps, SplitPiecesWithoutAdjointCountAsZero) {
  const Var x = Var::param(Tensor::randn(Shape{2, 5}, dev(), 1, DType::float64));
  Var used;
  {
    const std::vector<Var> parts = split(x, 1, {2, 3});
    used = parts[1];
  }  // parts[0] is gone: its adjoint never exists
  used.backward(Tensor::ones(Shape{2, 3}, DType::float64, dev()));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 1, 1, 1, 0, 0, 1, 1, 1}));
}

// ---- broadcast_to -------------------------------------------------------------------------------

TEST_P(ShapeOps, BroadcastToRepeatsAlongNewAndSizeOneDimensions) {
  for (DType dt : kAllDTypes) {
    const Tensor x = iota(Shape{3, 1}, dt);
    const Tensor y = broadcast_to(x, Shape{2, 3, 4});
    ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
    const std::vector<double> yv = y.to_vector<double>();
    for (std::int64_t i = 0; i < y.numel(); ++i)
      ASSERT_EQ(yv[static_cast<std::size_t>(i)], static_cast<double>(unravel(i, y.shape())[1]));
  }
  // The reference systems' GPU test: (200, 300) -> (130, 200, 300).
  const Tensor x = Tensor::randn(Shape{200, 300}, dev(), 5);
  const Tensor y = broadcast_to(x, Shape{130, 200, 300});
  const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (std::size_t i = 0; i < yv.size(); i += 997) ASSERT_EQ(yv[i], xv[i % xv.size()]);
  EXPECT_EQ(broadcast_to(x, Shape{200, 300}).to_vector<double>(), xv);
}

TEST_P(ShapeOps, BroadcastToGradientSumsOverBroadcastDimensions) {
  std::uint64_t seed = 30;
  for (const auto& [from, to] : {std::pair{Shape{3, 1}, Shape{2, 3, 4}}, std::pair{Shape{1}, Shape{5, 7}},
                                 std::pair{Shape{}, Shape{2, 3}}, std::pair{Shape{4, 1, 3}, Shape{4, 2, 3}},
                                 std::pair{Shape{1, 5}, Shape{1, 5}}, std::pair{Shape{2, 1, 1}, Shape{3, 2, 5, 1}}})
    expect_gradients_match([to](const std::vector<Var>& v) { return broadcast_to(v[0], to); },
                           {Tensor::randn(from, dev(), seed++, DType::float64)},
                           "broadcast_to " + from.str() + " -> " + to.str());
  // A large reduction: every element of the adjoint counts.
  const Var x = Var::param(Tensor::ones(Shape{1, 3}, DType::float64, dev()));
  const Var y = broadcast_to(x, Shape{40000, 3});
  y.backward(Tensor::ones(Shape{40000, 3}, DType::float64, dev()));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{40000, 40000, 40000}));
}

// ---- pure-Tensor forms ----------------------------------------------------------------------------

TEST_P(ShapeOps, TensorOverloadsReturnTensorsAndRecordNothing) {
  const Tensor x = Tensor::randn(Shape{2, 3, 4}, dev(), 1);
  static_assert(std::is_same_v<decltype(transpose(x)), Tensor>);
  static_assert(std::is_same_v<decltype(permute(x, {2, 0, 1})), Tensor>);
  static_assert(std::is_same_v<decltype(reshape(x, {-1})), Tensor>);
  static_assert(std::is_same_v<decltype(slice(x, 0, 0, 1)), Tensor>);
  static_assert(std::is_same_v<decltype(split(x, 0, {1, 1})), std::vector<Tensor>>);
  static_assert(std::is_same_v<decltype(broadcast_to(x, Shape{2, 2, 3, 4})), Tensor>);
  static_assert(std::is_same_v<decltype(transpose(Var(x))), Var>);
  const auto before = autograd_stats().nodes_created;
  (void)transpose(x);
  (void)permute(x, {2, 0, 1});
  (void)reshape(x, {-1});
  (void)slice(x, 1, 0, 2);
  (void)concat({x, x}, 0);
  (void)split(x, 2, {1, 3});
  (void)broadcast_to(x, Shape{2, 2, 3, 4});
  {
    NoGradGuard guard;
    const Var p = Var::param(x);
    EXPECT_FALSE(transpose(p).requires_grad());
    EXPECT_FALSE(split(p, 0, {1, 1})[0].requires_grad());
  }
  EXPECT_EQ(autograd_stats().nodes_created, before);
}

// ---- errors -------------------------------------------------------------------------------------

TEST_P(ShapeOps, BadArgumentsRaiseErrorsNamingShapesAndTheNextOpStillWorks) {
  const Tensor x = Tensor::randn(Shape{2, 3}, dev(), 1);
  expect_error([&] { (void)transpose(Tensor::randn(Shape{5}, dev(), 1)); }, {"transpose", "[5]", "rank"});
  expect_error([&] { (void)transpose(Var()); }, {"transpose", "undefined"});
  expect_error([&] { (void)permute(x, {0}); }, {"permute", "[2, 3]", "rank"});
  expect_error([&] { (void)permute(x, {0, 0}); }, {"permute", "not a permutation"});
  expect_error([&] { (void)permute(x, {0, 2}); }, {"permute", "out of range", "[2, 3]"});
  expect_error([&] { (void)reshape(x, {4, 2}); }, {"reshape", "[2, 3]", "[4, 2]"});
  expect_error([&] { (void)reshape(x, {-1, -1}); }, {"reshape", "more than one -1"});
  expect_error([&] { (void)reshape(x, {4, -1}); }, {"reshape", "infer", "[2, 3]"});
  expect_error([&] { (void)reshape(x, {-2, 3}); }, {"reshape", "negative"});
  expect_error([&] { (void)slice(x, 1, 2, 4); }, {"slice", "[2, 4)", "[2, 3]"});
  expect_error([&] { (void)slice(x, 1, 2, 1); }, {"slice", "[2, 1)"});
  expect_error([&] { (void)slice(x, 0, -3, 1); }, {"slice", "[-3, 1)"});
  expect_error([&] { (void)slice(x, 2, 0, 1); }, {"slice", "axis 2", "[2, 3]"});
  expect_error([&] { (void)concat(std::vector<Tensor>{}, 0); }, {"concat", "empty"});
  expect_error([&] { (void)concat({x, Tensor::randn(Shape{3, 3}, dev(), 2)}, 1); },
               {"concat", "xs[1]", "[3, 3]", "[2, 3]"});
  expect_error([&] { (void)concat({x, Tensor::randn(Shape{2, 3, 1}, dev(), 2)}, 0); }, {"concat", "[2, 3, 1]"});
  expect_error([&] { (void)concat({x, x.to(DType::float64)}, 0); }, {"concat", "dtype", "float64"});
  expect_error([&] { (void)concat({x, x}, -3); }, {"concat", "axis -3"});
  expect_error([&] { (void)split(x, 1, {1, 1}); }, {"split", "sum to 2", "[2, 3]"});
  expect_error([&] { (void)split(x, 1, {4, -1}); }, {"split", "negative"});
  expect_error([&] { (void)split(x, 1, {}); }, {"split", "empty"});
  expect_error([&] { (void)split(x, 5, {3}); }, {"split", "axis 5"});
  expect_error([&] { (void)broadcast_to(x, Shape{2, 4}); }, {"broadcast_to", "[2, 3]", "[2, 4]"});
  expect_error([&] { (void)broadcast_to(x, Shape{3}); }, {"broadcast_to", "[2, 3]", "[3]"});
  if (cuda_available()) {
    const Device other = dev().is_cpu() ? Device::cuda(0) : Device::cpu();
    expect_error([&] { (void)concat({x, x.to(other)}, 0); }, {"concat", "devices"});
  }
  EXPECT_THROW((void)split(Var::param(x), 0, {3}), Error);
  // Nothing is left broken.
  const std::vector<Tensor> parts = split(x, 1, {1, 2});
  EXPECT_EQ(concat(parts, 1).to_vector<double>(), x.to_vector<double>());
  EXPECT_EQ(transpose(transpose(x)).to_vector<double>(), x.to_vector<double>());
}

// ---- CPU vs GPU ---------------------------------------------------------------------------------

TEST_P(ShapeOps, GpuResultsEqualCpuResultsExactly) {
  if (!dev().is_cuda()) GTEST_SKIP() << "compares a CUDA device against the CPU";
  auto run = [](Device d) {
    const Var x = Var::param(Tensor::randn(Shape{6, 33, 17}, d, 42));
    const Var w = Var::param(Tensor::randn(Shape{17, 1}, d, 43));
    const std::vector<Var> parts = split(permute(x, {2, 0, 1}), 0, {5, 5, 5, 1, 1});  // [.., 6, 33]
    const Var a = slice(transpose(parts[0]), 1, 3, 30);                                 // [5, 27, 6]
    const Var b = transpose(slice(parts[2], 2, 0, 27));                                 // [5, 27, 6]
    const Var c = broadcast_to(reshape(slice(w, 0, 0, 5), {5, 1, 1}), Shape{5, 27, 6});
    const Var e = slice(reshape(parts[4], {1, 33, 6}), 1, 0, 27);                        // [1, 27, 6]
    const Var z = concat({a, b, c, e}, 0);
    z.backward(Tensor::randn(z.shape(), d, 44));
    return std::vector<std::vector<double>>{z.value().to_vector<double>(), x.grad().to_vector<double>(),
                                            w.grad().to_vector<double>()};
  };
  const auto cpu = run(Device::cpu());
  const auto gpu = run(GetParam());
  // Data movement is exact; the broadcast gradient is a sum of equal terms in a fixed order.
  EXPECT_EQ(gpu[0], cpu[0]);
  EXPECT_EQ(gpu[1], cpu[1]);
  ASSERT_EQ(gpu[2].size(), cpu[2].size());
  for (std::size_t i = 0; i < cpu[2].size(); ++i)
    EXPECT_LE(relative_error(gpu[2][i], cpu[2][i]), kSameResultTolFloat);
}

INSTANTIATE_TEST_SUITE_P(Devices, ShapeOps, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
