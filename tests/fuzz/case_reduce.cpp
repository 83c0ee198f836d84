// case_reduce.cpp: the `reduce` category: sum, mean, amax over all elements, one axis or any list of
// axes (any order, negative entries, the empty list), with and without keepdims, and sum_to to any
// shape that broadcasts to the input; Var forms (gradients through backward, amax's ties split) and
// Tensor forms, on inputs made by chains of shape ops. A maximum over an empty dimension must be a
// dualcast::Error after which the library keeps working.
#include <map>
#include <sstream>

#include "dualcast/error.hpp"
#include "dualcast/ops/reduce.hpp"
#include "harness.hpp"

namespace fuzz {

using dualcast::DType;
using dualcast::Tensor;
using dualcast::Var;
using fuzzref::Reduce;

namespace {

enum class Form { all, one_axis, axes, sum_to };

const char* kind_name(Reduce k) { return k == Reduce::sum ? "sum" : (k == Reduce::mean ? "mean" : "amax"); }

template <class X>
X call(Reduce kind, Form form, const X& x, int axis, const std::vector<int>& axes, bool keepdims,
       const Dims& target) {
  switch (form) {
    case Form::all:
      return kind == Reduce::sum ? dualcast::sum(x) : (kind == Reduce::mean ? dualcast::mean(x) : dualcast::amax(x));
    case Form::one_axis:
      return kind == Reduce::sum    ? dualcast::sum(x, axis, keepdims)
             : kind == Reduce::mean ? dualcast::mean(x, axis, keepdims)
                                    : dualcast::amax(x, axis, keepdims);
    case Form::axes:
      return kind == Reduce::sum    ? dualcast::sum(x, axes, keepdims)
             : kind == Reduce::mean ? dualcast::mean(x, axes, keepdims)
                                    : dualcast::amax(x, axes, keepdims);
    case Form::sum_to: return dualcast::sum_to(x, dualcast::Shape(target));
  }
  return x;
}

}  // namespace

void run_reduce_case(Rng& r, const Options& opt, Report& rep) {
  const bool single = r.chance(0.5);
  const DType dt = single ? DType::float32 : DType::float64;
  const std::int64_t cap = draw_numel_cap(r, opt);
  const Dims xs = random_shape(r, r.uniform_int(0, 8), cap);
  const int rk = static_cast<int>(xs.size());
  const bool on_tape = r.chance(0.75);
  LeafSpec spec;
  spec.single = single;
  spec.how = r.chance(0.5) ? Values::grid : Values::normal;  // grid: ties for amax
  spec.param = on_tape && r.chance(0.9);
  std::vector<Leaf> leaves;
  const ExprP x = make_expr(r, xs, r.uniform_int(0, opt.budget.max_depth), spec, leaves, cap);

  const auto kind = static_cast<Reduce>(r.uniform_int(0, 2));
  Form form = static_cast<Form>(r.uniform_int(0, 3));
  if (form == Form::one_axis && rk == 0) form = Form::axes;
  int axis = 0;
  std::vector<int> axes;
  const bool keepdims = r.chance(0.5);
  Dims target;
  std::vector<bool> mask(xs.size(), false);
  if (form == Form::all) mask.assign(xs.size(), true);
  if (form == Form::one_axis) {
    const int a = r.uniform_int(0, rk - 1);
    axis = r.chance(0.4) ? a - rk : a;
    mask[static_cast<std::size_t>(a)] = true;
  }
  if (form == Form::axes) {
    for (int a = 0; a < rk; ++a)
      if (r.chance(0.5)) axes.push_back(a);
    for (std::size_t i = axes.size(); i > 1; --i) std::swap(axes[i - 1], axes[static_cast<std::size_t>(r.uniform(0, static_cast<std::int64_t>(i) - 1))]);
    for (int& a : axes) {
      mask[static_cast<std::size_t>(a)] = true;
      if (r.chance(0.4)) a -= rk;
    }
  }
  if (form == Form::sum_to) target = broadcast_operand(r, xs);

  // ---- the reference -----------------------------------------------------------------------------
  const fuzzref::Array xv = evaluate(x, leaves);
  bool expect_error = false;
  fuzzref::Array want;
  fuzzref::Gather to_target;
  if (form == Form::sum_to) {
    to_target = fuzzref::broadcast_map(target, xs);
    want = fuzzref::scatter_add(xv, to_target, target);
  } else if (form == Form::axes && axes.empty()) {
    want = xv;  // an empty list reduces nothing
  } else {
    if (kind == Reduce::amax)
      for (std::size_t d = 0; d < xs.size(); ++d) expect_error = expect_error || (mask[d] && xs[d] == 0);
    if (kind == Reduce::amax && form == Form::all && fuzzref::numel(xs) == 0) expect_error = true;
    if (!expect_error) want = fuzzref::reduce(xv, mask, kind, form != Form::all && keepdims);
  }
  fuzzref::Array adj, gx;
  std::vector<fuzzref::Array> want_grads = leaf_grads(leaves);
  const bool any_param = reads_param(x, leaves);
  if (!expect_error) {
    adj = random_adjoint(r, want.shape, single);
    if (form == Form::sum_to) gx = fuzzref::gather(adj, to_target);
    else if (form == Form::axes && axes.empty()) gx = adj;
    else gx = fuzzref::reduce_adjoint(xv, mask, kind, fuzzref::Array{fuzzref::reduced_shape(xs, mask, true), adj.v, adj.mag});
    backprop(x, gx, want_grads);
  }

  std::ostringstream what;
  what << (form == Form::sum_to ? "sum_to" : kind_name(kind)) << (on_tape ? " Var " : " Tensor ")
       << (single ? "float32" : "float64") << " x=" << describe(x);
  if (form == Form::one_axis) what << " axis " << axis;
  if (form == Form::axes) {
    what << " axes {";
    for (std::size_t i = 0; i < axes.size(); ++i) what << (i ? "," : "") << axes[i];
    what << "}";
  }
  if (form == Form::sum_to) what << " target " << dims_str(target);
  else if (form != Form::all) what << (keepdims ? " keepdims" : "");
  if (expect_error) what << " (expects an Error)";
  rep.what = what.str();

  std::vector<Outcome> outcomes(opt.devices.size());
  for (std::size_t di = 0; di < opt.devices.size(); ++di) {
    const dualcast::Device dev = opt.devices[di];
    Outcome& oc = outcomes[di];
    const std::string pre = std::string(dev_label(dev)) + ": ";
    on_device(rep, dev, [&] {
      std::map<const Expr*, Var> memo;
      const std::vector<Var> vars = make_leaf_vars(leaves, dt, dev);
      const Var xin = on_tape ? eval_var(x, vars, memo) : Var(eval_tensor(x, make_leaf_tensors(leaves, dt, dev)));
      if (expect_error) {
        try {
          if (on_tape) (void)call(kind, form, xin, axis, axes, keepdims, target);
          else (void)call(kind, form, xin.value(), axis, axes, keepdims, target);
          rep.fail(pre + "amax over an empty dimension returned instead of raising dualcast::Error");
        } catch (const dualcast::Error& e) {
          if (std::string(e.what()).find("amax") == std::string::npos)
            rep.fail(pre + "the Error does not name amax: " + e.what());
        }
        // The library keeps working: a plain sum of the same input.
        const fuzzref::Array s = fuzzref::reduce(xv, std::vector<bool>(xs.size(), true), Reduce::sum, false);
        check_close(rep, pre + "sum after the Error", dualcast::sum(xin.value()).to_vector<double>(), s, single);
        return;
      }
      const Var y = on_tape ? call(kind, form, xin, axis, axes, keepdims, target)
                            : Var(call(kind, form, xin.value(), axis, axes, keepdims, target));
      if (y.shape().vec() != want.shape) {
        rep.fail(pre + "result shape " + y.shape().str() + ", want " + dims_str(want.shape));
        return;
      }
      const std::vector<double> got = y.value().to_vector<double>();
      check_close(rep, pre + "value", got, want, single);
      oc.add("value", got, &want);
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
