// test_gates.cu: LayerGates (gates.hpp), the HM-LSTM's gate products with a stacked weight gradient:
// the same loss and gradients as the per-step products inside the network, and gradients against
// finite differences when the gate inputs already hold gradients of every kind (owned buffers,
// views the input does not own, none, one Var passed as several inputs), which the backward kernel
// accumulates into itself; under Autocast, products of the rounded operands in both modes, near the
// float32 network, the same on the GPU as on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/precision.hpp"
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

/// Two small mixed-mode networks from the same parameters, the second's config changed by `change`,
/// their losses and gradients on the same tokens, handed to check(na, nb, la, lb, dt, what) for each
/// dtype (float64, float32) and boundary (STE, soft).
template <class Change, class Check>
void compare_networks(Device d, std::uint64_t token_seed, Change change, Check check) {
  for (DType dt : {DType::float64, DType::float32})
    for (bool soft : {false, true}) {
      NetworkConfig a = tiny(d, dt, CellMode::mixed);
      a.hidden = 16;
      a.batch = 6;
      a.seq = 9;
      a.soft_boundary = soft;
      NetworkConfig b = a;
      change(b);
      const Tensor tokens = random_tokens(a.seq, a.batch, a.vocab, token_seed);
      HmlstmNetwork na(a), nb(b);
      nb.load_params_from(na);
      Var la = na.loss(tokens), lb = nb.loss(tokens);
      la.backward();
      lb.backward();
      check(na, nb, la, lb, dt, std::string(soft ? "soft " : "ste ") + dtype_name(dt));
    }
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

// A cell kernel that also writes the next step's gate inputs (NextInputs: this cell's h' times its z'
// bottom-up), against finite differences: the next step called with exactly those inputs (it runs
// no gate-input kernel) and with another h (it must pack its own, or its gradients would not match).
TEST_P(GatesTest, FusedCellStepWritingTheNextStepsInputsKeepsItsGradients) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 0.9, DType::float64, d);
  const Tensor z1 = Tensor::from_vector<double>({kB, 1}, {0, 1, 0}, d);
  for (bool as_written : {true, false}) {
    auto f = [&](const std::vector<Var>& x) {
      LayerGates gates(x[3], 2, kB, kH, /*has_above=*/false);
      const NextInputs next{&gates, 1, /*from_this_cell=*/true, Var(), Var(), x[1], Var(), Var()};
      const std::vector<Var> o =
          gates.cell_step(0, x[0], Var(), x[1], Var(), Var(), x[2], fl.z, Tensor(), slope, true, next);
      const std::vector<Var> p =
          gates.cell_step(1, o[1], o[2], as_written ? x[1] : x[2], Var(), Var(), o[0], z1, fl.zb, slope, true);
      return sum(p[1] * p[1]) + sum(p[0] * p[2]);
    };
    const std::vector<Tensor> in = {
        Tensor::uniform({kB, kH}, d, 181, -1.0, 1.0, DType::float64),
        Tensor::uniform({kB, kH}, d, 182, -1.0, 1.0, DType::float64),
        Tensor::uniform({kB, kH}, d, 183, -1.0, 1.0, DType::float64),
        Tensor::uniform({2 * kH + 4, G}, d, 184, -0.5, 0.5, DType::float64)};
    const GradCheckResult r = check_gradients(f, in);
    EXPECT_TRUE(r.ok) << (as_written ? "as written: " : "other inputs: ") << r.message;
  }
}

// The network with each cell kernel writing the next layer-step's gate inputs against the network
// whose steps pack their own: the same numbers (the same products of the same values), so the same
// loss and gradients bit for bit, STE and soft boundary, float64 and float32.
TEST_P(GatesTest, CellWritingTheNextInputsChangesNoLossOrGradient) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  compare_networks(
      d, 39, [](NetworkConfig& b) { b.cell_writes_next_inputs = false; },
      [](HmlstmNetwork& na, HmlstmNetwork& nb, const Var& la, const Var& lb, DType, const std::string& what) {
        EXPECT_EQ(la.value().to_vector<double>(), lb.value().to_vector<double>()) << what;
        const auto names = na.param_names();
        for (std::size_t k = 0; k < names.size(); ++k)
          EXPECT_EQ(na.params()[k].grad().to_vector<double>(), nb.params()[k].grad().to_vector<double>())
              << what << " " << names[k];
      });
}

// The next layer-step's inputs are checked as that step checks its own: a wrong one is an Error
// naming it, and the gates keep working.
TEST_P(GatesTest, FusedCellStepRejectsNextInputsOfTheWrongShape) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t K = 2 * kH + 4, G = 4 * kH + 1;
  const Flags fl = branch_flags(d);
  const Tensor slope = Tensor::full({1, 1}, 1.0, DType::float64, d);
  auto u = [&](const Shape& s, std::uint64_t seed) { return Var(Tensor::uniform(s, d, seed, -1.0, 1.0, DType::float64)); };
  LayerGates gates(Var::param(Tensor::uniform({K, G}, d, 191, -0.5, 0.5, DType::float64)), 2, kB, kH, false);
  const Var bh = u({kB, kH}, 192);
  const NextInputs bad{&gates, 1, true, Var(), Var(), u({kB, kH + 1}, 193), Var(), Var()};
  try {
    gates.cell_step(0, bh, Var(), bh, Var(), Var(), bh, fl.z, Tensor(), slope, false, bad);
    ADD_FAILURE() << "no Error for a next h of the wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the next step's h"), std::string::npos) << e.what();
  }
  const NextInputs late{&gates, 2, true, Var(), Var(), bh, Var(), Var()};  // step 2 of a 2-step layer
  EXPECT_THROW(gates.cell_step(0, bh, Var(), bh, Var(), Var(), bh, fl.z, Tensor(), slope, false, late), Error);
  EXPECT_EQ(gates.cell_step(0, bh, Var(), bh, Var(), Var(), bh, fl.z, Tensor(), slope, false).size(), 3u);
  const NextInputs again{&gates, 0, true, Var(), Var(), bh, Var(), Var()};  // step 0 has run
  EXPECT_THROW(gates.cell_step(1, bh, Var(), bh, Var(), Var(), bh, fl.z, Tensor(), slope, false, again), Error);
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
  compare_networks(
      d, 37, [](NetworkConfig& b) { b.fused_cell = false; },
      [](HmlstmNetwork& na, HmlstmNetwork& nb, const Var& la, const Var& lb, DType dt, const std::string& what) {
        const double tol = dt == DType::float64 ? 1e-11 : 2e-5;
        EXPECT_NEAR(la.item(), lb.item(), tol * std::fabs(lb.item())) << what;
        EXPECT_EQ(na.boundary_flags(), nb.boundary_flags()) << what;
        const auto names = na.param_names();
        for (std::size_t k = 0; k < names.size(); ++k)
          EXPECT_LE(array_error(na.params()[k].grad(), nb.params()[k].grad(), ErrorScale::largest), tol)
              << what << " " << names[k];
      });
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

// ---- Autocast (gates.hpp): products of rounded operands, everything else float32 ------------------

// Forward: under Autocast each gate product is the float32 product of the operands rounded to 16 bits
// (the inputs here are 0/1-scaled, so rounding the gate-input rows is rounding the inputs); the plain
// float32 gates differ from them by far more, so a layer that ignored Autocast fails.
TEST_P(GatesTest, AutocastGatesAreTheProductsOfTheRoundedOperands) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t H = 24, B = 5, K = 3 * H + 4, G = 4 * H + 1;
  auto rounded = [](const Tensor& x, DType h) { return x.to(h).to(DType::float32); };
  for (DType h : {DType::bfloat16, DType::float16}) {
    const Tensor w = Tensor::randn(Shape{K, G}, d, 51) * 0.2;
    std::vector<Tensor> in;  // below, zb, h, z, above
    for (int i = 0; i < 5; ++i)
      in.push_back(i == 1 || i == 3 ? (Tensor::uniform(Shape{B, 1}, d, 60 + i) > 0.3).to(DType::float32)
                                    : Tensor::randn(Shape{B, H}, d, 60 + i));
    std::vector<Tensor> got;
    {
      Autocast ac(h);
      LayerGates gates(Var::param(w), 1, B, H, /*has_above=*/true);
      for (const Var& v : gates.step(0, in[0], in[1], in[2], in[3], in[4])) got.push_back(v.value());
    }
    LayerGates exact(Var(rounded(w, h)), 1, B, H, true);
    const std::vector<Var> want = exact.step(0, rounded(in[0], h), in[1], rounded(in[2], h), in[3], rounded(in[4], h));
    LayerGates plain(Var(w), 1, B, H, true);
    const std::vector<Var> unrounded = plain.step(0, in[0], in[1], in[2], in[3], in[4]);
    double apart = 0.0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].dtype(), DType::float32) << k;
      EXPECT_LE(array_error(got[k], want[k].value(), ErrorScale::largest), kSameResultTolFloat)
          << dtype_name(h) << " gate " << k;
      apart = std::max(apart, array_error(got[k], unrounded[k].value(), ErrorScale::largest));
    }
    EXPECT_GT(apart, 3 * kSameResultTolFloat) << dtype_name(h) << ": Autocast changed nothing";
  }
}

// The network under Autocast: float32 parameters get float32 gradients; mixed and reverse mode agree
// (their products see the same rounded operands); the loss and gradients stay near the float32
// network's without equalling them; and the GPU gives the CPU's answer.
TEST_P(GatesTest, AutocastNetworkAgreesAcrossModesAndStaysNearFloat32) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  NetworkConfig base = tiny(d, DType::float32, CellMode::mixed);
  base.hidden = 32;
  base.batch = 8;
  base.seq = 7;
  const Tensor tokens = random_tokens(base.seq, base.batch, base.vocab, 71);
  for (DType h : {DType::bfloat16, DType::float16}) {
    NetworkConfig ac = base;
    ac.autocast = h;
    const ModeComparison cmp = compare_modes(ac, tokens);
    EXPECT_TRUE(cmp.ok) << dtype_name(h) << ": " << cmp.message;
    HmlstmNetwork n16(ac), n32(base);
    n32.load_params_from(n16);
    Var l16 = n16.loss(tokens), l32 = n32.loss(tokens);
    l16.backward();
    l32.backward();
    const double rel = std::fabs(l16.item() - l32.item()) / std::fabs(l32.item());
    EXPECT_GT(rel, 0.0) << dtype_name(h);
    EXPECT_LT(rel, h == DType::bfloat16 ? 1e-2 : 2e-3) << dtype_name(h);
    const auto names = n16.param_names();
    for (std::size_t k = 0; k < names.size(); ++k) {
      ASSERT_EQ(n16.params()[k].grad().dtype(), DType::float32) << names[k];
      EXPECT_LE(array_error(n16.params()[k].grad(), n32.params()[k].grad(), ErrorScale::largest),
                h == DType::bfloat16 ? 0.1 : 2e-2)
          << dtype_name(h) << " " << names[k];
    }
    if (d.is_cuda()) {
      NetworkConfig cpu = ac;
      cpu.device = Device::cpu();
      HmlstmNetwork nc(cpu);
      Var lc = nc.loss(tokens.to(Device::cpu()));
      lc.backward();
      EXPECT_NEAR(l16.item(), lc.item(), 1e-4 * std::fabs(lc.item())) << dtype_name(h);
      for (std::size_t k = 0; k < names.size(); ++k)
        EXPECT_LE(array_error(n16.params()[k].grad().to(Device::cpu()), nc.params()[k].grad(), ErrorScale::largest),
                  float32_products_tolerance(1e-3, h))
            << dtype_name(h) << " GPU vs CPU " << names[k];
    }
  }
}

TEST_P(GatesTest, AutocastNeedsAFloat32NetworkWithStackedGates) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  NetworkConfig f64 = tiny(d, DType::float64);
  f64.autocast = DType::bfloat16;
  EXPECT_THROW({ HmlstmNetwork n(f64); }, Error);
  NetworkConfig unstacked = tiny(d, DType::float32);
  unstacked.autocast = DType::float16;
  unstacked.stacked_weight_grad = false;
  EXPECT_THROW({ HmlstmNetwork n(unstacked); }, Error);
  NetworkConfig odd = tiny(d, DType::float32);
  odd.autocast = DType::float64;
  EXPECT_THROW({ HmlstmNetwork n(odd); }, Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, GatesTest, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         device_name_param);
