// case_broadcast.cpp: the `broadcast` category. One call of a functor of functors.hpp (combos.hpp) on
// arguments of random broadcast-compatible shapes, each Var or Tensor argument made by a chain of
// shape ops, values and gradients (through backward, summed over broadcast dimensions and back
// through the chains to the leaves) compared with the double reference; float32/float64, store /
// recompute / automatic partials, constant Vars, one Var passed twice, backward run twice.
#include <map>
#include <sstream>

#include "combos.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "harness.hpp"
#include "reference_functions.hpp"

namespace fuzz {

using dualcast::DType;
using dualcast::Partials;
using dualcast::Tensor;
using dualcast::Var;

void run_broadcast_case(Rng& r, const Options& opt, Report& rep) {
  static const std::vector<Combo> combos = all_combos();
  const Combo& c = r.pick(combos);
  const bool single = r.chance(0.5);
  const DType dt = single ? DType::float32 : DType::float64;
  const Partials policy = r.pick(std::vector<Partials>{Partials::store, Partials::recompute, Partials::automatic});
  const int n = static_cast<int>(c.kinds.size());
  const int m = fuzzref::family_outputs(c.family);
  const std::int64_t cap = draw_numel_cap(r, opt);
  const Dims out = random_shape(r, r.uniform_int(0, 8), cap);
  const int value_mode = r.uniform_int(0, 2);  // normal, grid (ties), or a mix per argument

  std::vector<Leaf> leaves;
  std::vector<ExprP> exprs(static_cast<std::size_t>(n));
  std::vector<double> numbers(static_cast<std::size_t>(n), 0.0);
  std::vector<int> var_slots;
  for (int k = 0; k < n; ++k) {
    const auto sk = static_cast<std::size_t>(k);
    const char kind = c.kinds[sk];
    LeafSpec spec;
    spec.single = single;
    spec.how = value_mode == 0 ? Values::normal
               : value_mode == 1 ? Values::grid
                                 : (r.chance(0.5) ? Values::grid : Values::normal);
    if (kind == 'N') {
      numbers[sk] = draw_values(r, 1, spec.how, 0, 0, single)[0];
      continue;
    }
    if (kind == 'V') {
      if (!var_slots.empty() && r.chance(0.15)) {  // the same Var in two positions
        exprs[sk] = exprs[static_cast<std::size_t>(r.pick(var_slots))];
        var_slots.push_back(k);
        continue;
      }
      spec.param = r.chance(0.85);
      var_slots.push_back(k);
    } else {
      const int t = r.uniform_int(0, 3);
      if (t <= 1) spec.how = Values::flags;
      spec.mask = t == 0;  // a uint8 mask, converted by broadcast
    }
    exprs[sk] = make_expr(r, broadcast_operand(r, out), r.uniform_int(0, opt.budget.max_depth), spec,
                          leaves, cap);
  }

  // ---- the reference -----------------------------------------------------------------------------
  std::vector<fuzzref::Array> args(static_cast<std::size_t>(n));
  std::vector<const fuzzref::Array*> ptrs;
  for (int k = 0; k < n; ++k) {
    const auto sk = static_cast<std::size_t>(k);
    args[sk] = c.kinds[sk] == 'N' ? fuzzref::from_values({}, {numbers[sk]}) : evaluate(exprs[sk], leaves);
    ptrs.push_back(&args[sk]);
  }
  Dims shape;
  std::vector<Dims> shapes;
  for (const auto& a : args) shapes.push_back(a.shape);
  fuzzref::broadcast_shape(shapes, shape);
  std::vector<fuzzref::Array> adj(static_cast<std::size_t>(m));  // no adjoint: an empty Array
  std::vector<bool> has_adj(static_cast<std::size_t>(m), false);
  const int forced = r.uniform_int(0, m - 1);
  for (int j = 0; j < m; ++j)
    if (j == forced || r.chance(0.6)) {
      adj[static_cast<std::size_t>(j)] = random_adjoint(r, shape, single);
      has_adj[static_cast<std::size_t>(j)] = true;
    }
  const fuzzref::MapResult ref = fuzzref::map(fuzzref::family_fn(c.family, n), m, ptrs, &adj);
  std::vector<fuzzref::Array> want = leaf_grads(leaves);
  bool any_param = false;
  for (const int k : var_slots) {
    backprop(exprs[static_cast<std::size_t>(k)], ref.grad[static_cast<std::size_t>(k)], want);
    any_param = any_param || reads_param(exprs[static_cast<std::size_t>(k)], leaves);
  }
  const bool direct = m == 1 && r.chance(0.5);  // backward(adjoint) on the output itself
  const bool twice = r.chance(0.15);            // backward twice (retain_graph): gradients add up

  std::ostringstream what;
  what << c.functor << "<" << c.kinds << "> " << (single ? "float32" : "float64") << " "
       << dualcast::partials_name(policy) << " out " << dims_str(shape) << (direct ? " direct" : " loss")
       << (twice ? " twice" : "") << ":";
  for (int k = 0; k < n; ++k) {
    const auto sk = static_cast<std::size_t>(k);
    what << " #" << k << "=";
    if (c.kinds[sk] == 'N') what << numbers[sk];
    else what << describe(exprs[sk]);
  }
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].param || leaves[i].mask) what << " leaf" << i << (leaves[i].param ? ":param" : ":mask");
  rep.what = what.str();

  // ---- dualcast, on every device ---------------------------------------------------------------------
  std::vector<Outcome> outcomes(opt.devices.size());
  for (std::size_t di = 0; di < opt.devices.size(); ++di) {
    const dualcast::Device dev = opt.devices[di];
    Outcome& oc = outcomes[di];
    const std::string pre = std::string(dev_label(dev)) + ": ";
    on_device(rep, dev, [&] {
      const std::vector<Var> vars = make_leaf_vars(leaves, dt, dev);
      const std::vector<Tensor> tensors = make_leaf_tensors(leaves, dt, dev);
      BroadcastArgs a;
      a.vars.resize(static_cast<std::size_t>(n));
      a.tensors.resize(static_cast<std::size_t>(n));
      a.numbers = numbers;
      std::map<const Expr*, Var> memo;
      for (int k = 0; k < n; ++k) {
        const auto sk = static_cast<std::size_t>(k);
        if (c.kinds[sk] == 'V') a.vars[sk] = eval_var(exprs[sk], vars, memo);
        if (c.kinds[sk] == 'T') a.tensors[sk] = eval_tensor(exprs[sk], tensors);
      }
      const std::vector<Var> outs = c.run(policy, a);
      for (int j = 0; j < m; ++j) {
        const Var& o = outs[static_cast<std::size_t>(j)];
        const std::string label = pre + "output " + std::to_string(j);
        if (o.shape().vec() != shape) {
          rep.fail(label + ": shape " + o.shape().str() + ", want " + dims_str(shape));
          return;
        }
        const std::vector<double> got = o.value().to_vector<double>();
        check_close(rep, label, got, ref.out[static_cast<std::size_t>(j)], single);
        oc.add("output " + std::to_string(j), got, nullptr);
      }
      if (!any_param) {
        if (outs[0].requires_grad()) rep.fail(pre + "output requires a gradient but no argument does");
        return;
      }
      if (!outs[0].requires_grad()) {
        rep.fail(pre + "output does not require a gradient");
        return;
      }
      if (direct) {
        const Tensor g = to_tensor(adj[0], dt, dev);
        outs[0].backward(g, /*retain_graph=*/twice);
        if (twice) outs[0].backward(g);
      } else {
        Var loss;
        for (int j = 0; j < m; ++j) {
          const auto sj = static_cast<std::size_t>(j);
          if (!has_adj[sj]) continue;
          const Var term = dualcast::sum(outs[sj] * Var(to_tensor(adj[sj], dt, dev)));
          loss = loss.defined() ? loss + term : term;
        }
        loss.backward(/*retain_graph=*/twice);
        if (twice) loss.backward();
      }
      check_leaf_grads(rep, oc, leaves, vars, want, twice ? 2.0 : 1.0, single, pre);
    });
  }
  check_devices(rep, opt.devices, outcomes, single);
}

}  // namespace fuzz
