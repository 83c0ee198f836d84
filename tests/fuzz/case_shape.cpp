// case_shape.cpp: the `shape` category: a chain of shape ops (permute, transpose, slice, reshape,
// concat, split, broadcast_to; expr.hpp) on float32, float64 or uint8 leaves, as Tensors (values)
// or on the tape (values, and gradients through backward back to every leaf).
#include <map>
#include <sstream>

#include "harness.hpp"

namespace fuzz {

using dualcast::DType;
using dualcast::Tensor;
using dualcast::Var;

void run_shape_case(Rng& r, const Options& opt, Report& rep) {
  const int dtype_pick = r.uniform_int(0, 4);
  const bool mask = dtype_pick == 4;  // uint8: Tensor forms only
  const bool single = dtype_pick <= 1;
  const DType dt = single ? DType::float32 : DType::float64;
  const bool on_tape = !mask && r.chance(0.7);
  const std::int64_t cap = draw_numel_cap(r, opt);
  const Dims target = random_shape(r, r.uniform_int(0, 8), cap);
  LeafSpec spec;
  spec.single = single;
  spec.how = mask ? Values::flags : Values::normal;
  spec.mask = mask;
  spec.param = on_tape && r.chance(0.9);
  std::vector<Leaf> leaves;
  ExprP e;
  for (int attempt = 0; attempt < 4 && (!e || e->kind == Expr::leaf); ++attempt) {
    leaves.clear();
    e = make_expr(r, target, r.uniform_int(1, opt.budget.max_depth + 1), spec, leaves, cap);
  }

  const fuzzref::Array want = evaluate(e, leaves);
  const fuzzref::Array adj = random_adjoint(r, target, single);
  std::vector<fuzzref::Array> want_grads = leaf_grads(leaves);
  const bool any_param = reads_param(e, leaves);
  if (on_tape) backprop(e, adj, want_grads);

  std::ostringstream what;
  what << (on_tape ? "Var " : "Tensor ") << (mask ? "uint8" : (single ? "float32" : "float64")) << " "
       << describe(e);
  rep.what = what.str();

  std::vector<Outcome> outcomes(opt.devices.size());
  for (std::size_t di = 0; di < opt.devices.size(); ++di) {
    const dualcast::Device dev = opt.devices[di];
    Outcome& oc = outcomes[di];
    const std::string pre = std::string(dev_label(dev)) + ": ";
    on_device(rep, dev, [&] {
      std::map<const Expr*, Var> memo;
      const std::vector<Var> vars = on_tape ? make_leaf_vars(leaves, dt, dev) : std::vector<Var>();
      const Var y = on_tape ? eval_var(e, vars, memo) : Var(eval_tensor(e, make_leaf_tensors(leaves, dt, dev)));
      const DType want_dtype = mask ? DType::uint8 : dt;
      if (y.shape().vec() != target || y.dtype() != want_dtype) {
        rep.fail(pre + "result " + y.value().str() + ", want " + dims_str(target));
        return;
      }
      const std::vector<double> got = y.value().to_vector<double>();
      check_close(rep, pre + "value", got, want, single);
      oc.add("value", got, nullptr);
      if (!on_tape || !any_param) return;
      if (!y.requires_grad()) {
        rep.fail(pre + "result does not require a gradient");
        return;
      }
      y.backward(to_tensor(adj, dt, dev));
      check_leaf_grads(rep, oc, leaves, vars, want_grads, 1.0, single, pre);
    });
  }
  check_devices(rep, opt.devices, outcomes, single);
}

}  // namespace fuzz
