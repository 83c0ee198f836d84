// test_gates.cu: LayerGates (gates.hpp), the HM-LSTM's gate products with a stacked weight gradient:
// the same loss and gradients as the per-step products inside the network, and gradients against
// finite differences when the gate inputs already hold gradients of every kind (owned buffers,
// views the input does not own, none, one Var passed as several inputs), which the backward kernel
// accumulates into itself.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "gates.hpp"
#include "test_network_util.hpp"

using namespace dualcast;
using namespace hmlstm;
using namespace hmlstm::testing;

namespace {

class GatesTest : public ::testing::TestWithParam<Device> {};

constexpr std::int64_t kB = 3, kH = 5;

/// A scalar of one step's five gates, nonlinear in each so every gradient depends on the values.
Var gates_loss(const std::vector<Var>& g) {
  return sum(g[0] * g[1]) + sum(g[2]) + sum(g[3] * g[3]) + sum(g[4] * g[4] * g[4]);
}

}  // namespace

// The inputs' gradients before the gate node's backward runs (readers recorded after the step run
// first): below's is a view it does not own (reshape's backward), h's and zb's are buffers they own
// (broadcast's backward), z's and above's do not exist yet.
TEST_P(GatesTest, GateInputGradientsAccumulateIntoEveryKindOfEarlierGradient) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  auto f = [&](const std::vector<Var>& x) {
    LayerGates gates(x[5], 1, kB, kH, /*has_above=*/true);
    const std::vector<Var> g = gates.step(0, x[0], x[1], x[2], x[3], x[4]);
    return gates_loss(g) + sum(reshape(x[0], {kB * kH}) * reshape(x[0], {kB * kH})) + sum(x[2] * x[2] * 0.5) +
           sum(x[1] * 3.0);
  };
  const std::vector<Tensor> in = {
      Tensor::uniform({kB, kH}, d, 1, -1.0, 1.0, DType::float64),  // below
      Tensor::uniform({kB, 1}, d, 2, 0.5, 1.5, DType::float64),    // zb
      Tensor::uniform({kB, kH}, d, 3, -1.0, 1.0, DType::float64),  // h
      Tensor::uniform({kB, 1}, d, 4, 0.5, 1.5, DType::float64),    // z
      Tensor::uniform({kB, kH}, d, 5, -1.0, 1.0, DType::float64),  // above
      Tensor::uniform({K, G}, d, 6, -0.5, 0.5, DType::float64)};   // Wcat
  const GradCheckResult r = check_gradients(f, in);
  EXPECT_TRUE(r.ok) << r.message;
}

// One Var as below, h and above, another as zb and z: the repeated inputs take fresh buffers added
// after the kernel, the first of each accumulates in place.
TEST_P(GatesTest, AVarPassedAsSeveralGateInputsGetsEveryContribution) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  auto f = [&](const std::vector<Var>& x) {
    LayerGates gates(x[2], 1, kB, kH, /*has_above=*/true);
    const std::vector<Var> g = gates.step(0, x[0], x[1], x[0], x[1], x[0]);
    return gates_loss(g) + sum(x[0] * x[0]);
  };
  const std::vector<Tensor> in = {Tensor::uniform({kB, kH}, d, 7, -1.0, 1.0, DType::float64),
                                  Tensor::uniform({kB, 1}, d, 8, 0.5, 1.5, DType::float64),
                                  Tensor::uniform({K, G}, d, 9, -0.5, 0.5, DType::float64)};
  const GradCheckResult r = check_gradients(f, in);
  EXPECT_TRUE(r.ok) << r.message;
}

/// One row per branch of the cell: FLUSH (z = 1), COPY (z = 0, zb = 0), UPDATE (z = 0, zb = 1).
struct Flags {
  Tensor z, zb;
};
Flags branch_flags(Device d) {
  return {Tensor::from_vector<double>({kB, 1}, {1, 0, 0}, d), Tensor::from_vector<double>({kB, 1}, {1, 0, 1}, d)};
}

/// A scalar of the fused step's outputs (c', h', z'), nonlinear in each.
Var cell_loss(const std::vector<Var>& o) { return sum(o[0] * o[0]) + sum(o[1] * o[0]) + sum(o[1]) + sum(o[2] * o[2]); }

// The fused layer-step (gates, cell and boundary detector in one node; the soft boundary, so that
// finite differences see every path) in every branch of the cell, with earlier gradients of every
// kind: c's a buffer it owns, below's a view it does not own, h's none (a fresh buffer gets the cell's
// part and then the gate inputs' part), the others none.
TEST_P(GatesTest, FusedCellStepGradientsMatchFiniteDifferencesWithEveryKindOfEarlierGradient) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 1.5, DType::float64, d);
  auto f = [&](const std::vector<Var>& x) {
    LayerGates gates(x[6], 1, kB, kH, /*has_above=*/true);
    const std::vector<Var> o = gates.cell_step(0, x[0], x[1], x[2], x[3], x[4], x[5], fl.z, fl.zb, slope, true);
    return cell_loss(o) + sum(x[5] * x[5]) + sum(reshape(x[0], {kB * kH}) * reshape(x[0], {kB * kH}));
  };
  const std::vector<Tensor> in = {
      Tensor::uniform({kB, kH}, d, 41, -1.0, 1.0, DType::float64),  // below
      Tensor::uniform({kB, 1}, d, 42, 0.5, 1.5, DType::float64),    // zb
      Tensor::uniform({kB, kH}, d, 43, -1.0, 1.0, DType::float64),  // h
      Tensor::uniform({kB, 1}, d, 44, 0.5, 1.5, DType::float64),    // z
      Tensor::uniform({kB, kH}, d, 45, -1.0, 1.0, DType::float64),  // above
      Tensor::uniform({kB, kH}, d, 46, -1.0, 1.0, DType::float64),  // c
      Tensor::uniform({K, G}, d, 47, -0.5, 0.5, DType::float64)};   // Wcat
  const GradCheckResult r = check_gradients(f, in);
  EXPECT_TRUE(r.ok) << r.message;
}

// One Var as below, h, above and c: the repeated inputs take fresh buffers added afterwards.
TEST_P(GatesTest, FusedCellStepGivesAVarPassedAsSeveralInputsEveryContribution) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 0.7, DType::float64, d);
  auto f = [&](const std::vector<Var>& x) {
    LayerGates gates(x[2], 1, kB, kH, /*has_above=*/true);
    return cell_loss(gates.cell_step(0, x[0], x[1], x[0], x[1], x[0], x[0], fl.z, fl.zb, slope, true));
  };
  const std::vector<Tensor> in = {Tensor::uniform({kB, kH}, d, 51, -1.0, 1.0, DType::float64),
                                  Tensor::uniform({kB, 1}, d, 52, 0.5, 1.5, DType::float64),
                                  Tensor::uniform({K, G}, d, 53, -0.5, 0.5, DType::float64)};
  const GradCheckResult r = check_gradients(f, in);
  EXPECT_TRUE(r.ok) << r.message;
}

// h met first with a gradient it owns, and the same Var as c: the cell's part of h's gradient, the
// gate inputs' part and c's (added afterwards, a repeated input) all arrive.
TEST_P(GatesTest, FusedCellStepWithHOwningItsGradientAndCTheSameVar) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 1.5, DType::float64, d);
  auto f = [&](const std::vector<Var>& x) {
    LayerGates gates(x[5], 1, kB, kH, /*has_above=*/true);
    return cell_loss(gates.cell_step(0, x[0], x[1], x[2], x[3], x[4], x[2], fl.z, fl.zb, slope, true)) +
           sum(x[2] * x[2] * 0.5);
  };
  const std::vector<Tensor> in = {
      Tensor::uniform({kB, kH}, d, 61, -1.0, 1.0, DType::float64), Tensor::uniform({kB, 1}, d, 62, 0.5, 1.5, DType::float64),
      Tensor::uniform({kB, kH}, d, 63, -1.0, 1.0, DType::float64), Tensor::uniform({kB, 1}, d, 64, 0.5, 1.5, DType::float64),
      Tensor::uniform({kB, kH}, d, 65, -1.0, 1.0, DType::float64), Tensor::uniform({K, G}, d, 66, -0.5, 0.5, DType::float64)};
  const GradCheckResult r = check_gradients(f, in);
  EXPECT_TRUE(r.ok) << r.message;
}

// h and c with earlier gradients they do not own (reshape's backward): fresh buffers that start
// from them.
TEST_P(GatesTest, FusedCellStepWithViewsAsTheEarlierGradientsOfHAndC) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 1.5, DType::float64, d);
  auto sq = [](const Var& v) { return sum(reshape(v, {kB * kH}) * reshape(v, {kB * kH})); };
  auto f = [&](const std::vector<Var>& x) {
    LayerGates gates(x[6], 1, kB, kH, /*has_above=*/true);
    return cell_loss(gates.cell_step(0, x[0], x[1], x[2], x[3], x[4], x[5], fl.z, fl.zb, slope, true)) + sq(x[2]) +
           sq(x[5]);
  };
  const std::vector<Tensor> in = {
      Tensor::uniform({kB, kH}, d, 71, -1.0, 1.0, DType::float64), Tensor::uniform({kB, 1}, d, 72, 0.5, 1.5, DType::float64),
      Tensor::uniform({kB, kH}, d, 73, -1.0, 1.0, DType::float64), Tensor::uniform({kB, 1}, d, 74, 0.5, 1.5, DType::float64),
      Tensor::uniform({kB, kH}, d, 75, -1.0, 1.0, DType::float64), Tensor::uniform({kB, kH}, d, 76, -1.0, 1.0, DType::float64),
      Tensor::uniform({K, G}, d, 77, -0.5, 0.5, DType::float64)};
  const GradCheckResult r = check_gradients(f, in);
  EXPECT_TRUE(r.ok) << r.message;
}

// The top layer (no layer above) without zb, with only one of c', h', z' used (the others' incoming
// gradients undefined), and two steps chained through one stack.
TEST_P(GatesTest, FusedCellStepOfTheTopLayerWithOneOutputUsedAndTwoStepsChained) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 0.9, DType::float64, d);
  const Tensor z1 = Tensor::from_vector<double>({kB, 1}, {0, 1, 0}, d);
  for (int used = 0; used < 3; ++used) {
    auto f = [&](const std::vector<Var>& x) {
      LayerGates gates(x[3], 2, kB, kH, /*has_above=*/false);
      const std::vector<Var> o = gates.cell_step(0, x[0], Var(), x[1], Var(), Var(), x[2], fl.z, Tensor(), slope, true);
      const std::vector<Var> p = gates.cell_step(1, o[1], o[2], o[1], Var(), Var(), o[0], z1, fl.zb, slope, true);
      return sum(p[used] * p[used]);
    };
    const std::vector<Tensor> in = {
        Tensor::uniform({kB, kH}, d, 81, -1.0, 1.0, DType::float64), Tensor::uniform({kB, kH}, d, 82, -1.0, 1.0, DType::float64),
        Tensor::uniform({kB, kH}, d, 83, -1.0, 1.0, DType::float64),
        Tensor::uniform({2 * kH + 4, G}, d, 84, -0.5, 0.5, DType::float64)};
    const GradCheckResult r = check_gradients(f, in);
    EXPECT_TRUE(r.ok) << "output " << used << ": " << r.message;
  }
}

// Misuse is an error naming the input, and the gates keep working afterwards.
TEST_P(GatesTest, FusedCellStepRejectsInputsOfTheWrongShapeOrLayout) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 3 * kH + 4, G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 1.0, DType::float64, d);
  auto u = [&](const Shape& s, std::uint64_t seed) { return Var(Tensor::uniform(s, d, seed, -1.0, 1.0, DType::float64)); };
  LayerGates gates(u({K, G}, 91), 2, kB, kH, /*has_above=*/true);
  const Var bh = u({kB, kH}, 92), b1 = u({kB, 1}, 93);
  EXPECT_THROW(gates.cell_step(0, bh, b1, bh, b1, bh, u({kH, kB}, 94), fl.z, fl.zb, slope, false), Error);  // c
  EXPECT_THROW(gates.cell_step(0, u({kB, kH + 1}, 95), b1, bh, b1, bh, bh, fl.z, fl.zb, slope, false), Error);
  EXPECT_THROW(gates.cell_step(0, bh, b1, bh, b1, bh, bh, fl.z.to(DType::float32), fl.zb, slope, false), Error);
  EXPECT_THROW(gates.cell_step(0, bh, b1, bh, b1, bh, bh, fl.z, fl.zb, Tensor(), false), Error);  // slope
  EXPECT_EQ(gates.cell_step(0, bh, b1, bh, b1, bh, bh, fl.z, fl.zb, slope, false).size(), 3u);
}

// The mixed-mode network takes the fused node: fewer tape nodes than with the library broadcasts.
TEST_P(GatesTest, TheMixedNetworkTakesTheFusedLayerStep) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  NetworkConfig a = tiny(d, DType::float64, CellMode::mixed);
  NetworkConfig b = a;
  b.fused_cell = false;
  const Tensor tokens = random_tokens(a.seq, a.batch, a.vocab, 38);
  HmlstmNetwork na(a), nb(b);
  const auto n0 = autograd_stats().nodes_created;
  const Var la = na.loss(tokens);
  const auto n1 = autograd_stats().nodes_created;
  const Var lb = nb.loss(tokens);
  const auto n2 = autograd_stats().nodes_created;
  // Per layer-step the fused node replaces the gate node and two broadcasts.
  EXPECT_EQ((n2 - n1) - (n1 - n0), static_cast<decltype(n0)>(2 * 3 * a.seq));
}

// The fused step against the gates as Vars with the cell and boundary as library broadcasts: the same
// loss and gradients in mixed mode, STE and soft boundary (float64: to rounding; float32: to float
// tolerance).
TEST_P(GatesTest, FusedCellStepEqualsTheLibraryBroadcasts) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  for (DType dt : {DType::float64, DType::float32})
    for (bool soft : {false, true}) {
      NetworkConfig a = tiny(d, dt, CellMode::mixed);
      a.hidden = 16;
      a.batch = 6;
      a.seq = 9;
      a.soft_boundary = soft;
      NetworkConfig b = a;
      b.fused_cell = false;
      const Tensor tokens = random_tokens(a.seq, a.batch, a.vocab, 37);
      HmlstmNetwork na(a), nb(b);
      nb.load_params_from(na);
      Var la = na.loss(tokens), lb = nb.loss(tokens);
      la.backward();
      lb.backward();
      const double tol = dt == DType::float64 ? 1e-11 : 2e-5;
      const std::string what = std::string(soft ? "soft " : "ste ") + dtype_name(dt);
      EXPECT_NEAR(la.item(), lb.item(), tol * std::fabs(lb.item())) << what;
      EXPECT_EQ(na.boundary_flags(), nb.boundary_flags()) << what;
      const auto names = na.param_names();
      for (std::size_t k = 0; k < names.size(); ++k)
        EXPECT_LE(array_error(na.params()[k].grad(), nb.params()[k].grad(), ErrorScale::largest), tol)
            << what << " " << names[k];
    }
}

// The gate products through LayerGates (one fused gate-input kernel per step, the bias as a row of the
// product, the weight gradient of all T steps as one product) against the per-step form: the same
// loss and gradients, in both modes (float64: to rounding; float32: to float tolerance).
TEST_P(GatesTest, StackedGatesEqualThePerStepProducts) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  for (DType dt : {DType::float64, DType::float32})
    for (CellMode mode : {CellMode::mixed, CellMode::reverse}) {
      NetworkConfig a = tiny(d, dt, mode);
      a.hidden = 16;
      a.batch = 6;
      a.seq = 9;
      NetworkConfig b = a;
      a.stacked_weight_grad = true;
      b.stacked_weight_grad = false;
      const Tensor tokens = random_tokens(a.seq, a.batch, a.vocab, 31);
      HmlstmNetwork na(a), nb(b);
      for (const char* bias : {"b1", "b2", "b3"}) {  // non-zero biases: the bias row is exercised
        Tensor v = na.param(bias).value();
        v.copy_(Tensor::uniform(v.shape(), d, 82, -0.5, 0.5, dt));
      }
      nb.load_params_from(na);
      Var la = na.loss(tokens), lb = nb.loss(tokens);
      la.backward();
      lb.backward();
      const double tol = dt == DType::float64 ? 1e-11 : 2e-5;
      const std::string what = std::string(cell_mode_name(mode)) + " " + dtype_name(dt);
      EXPECT_NEAR(la.item(), lb.item(), tol * std::fabs(lb.item())) << what;
      EXPECT_EQ(na.boundary_flags(), nb.boundary_flags()) << what;
      const auto names = na.param_names();
      for (std::size_t k = 0; k < names.size(); ++k) {
        ASSERT_TRUE(na.params()[k].has_grad()) << names[k];
        EXPECT_LE(array_error(na.params()[k].grad(), nb.params()[k].grad(), ErrorScale::largest), tol)
            << what << " " << names[k];
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Devices, GatesTest, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         device_name_param);
