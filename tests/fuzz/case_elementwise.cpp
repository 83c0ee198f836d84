// case_elementwise.cpp: the `elementwise` category: one op of ops/elementwise.hpp (unary functions,
// + - * / pow min max hypot, fma, clamp, select, comparisons, logical ops) in its Var, Tensor and
// number overloads, on broadcast-compatible operands made by chains of shape ops; values (and, for
// Var results, gradients through backward) compared with the double reference.
#include <map>
#include <sstream>

#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "harness.hpp"
#include "reference_functions.hpp"

namespace fuzz {

using dualcast::DType;
using dualcast::Tensor;
using dualcast::Var;
using fuzzref::Binary;
using fuzzref::Unary;

namespace {

enum class Family { unary, binary, fma, clamp, select, compare, logical };

/// One drawn op: the family, which member, and per operand its kind ('V' Var, 'T' Tensor, 'N' number).
struct Op {
  Family family = Family::unary;
  int which = 0;
  std::string form;
  double lo = 0, hi = 0;  ///< clamp bounds
  [[nodiscard]] bool tensor_result() const {  // a plain Tensor result: no tape
    return family == Family::compare || family == Family::logical || form.find('V') == std::string::npos;
  }
};

const char* const kCompareNames[] = {"==", "!=", "<", "<=", ">", ">="};
const char* const kLogicalNames[] = {"logical_and", "logical_or", "logical_not"};

std::string op_name(const Op& op) {
  switch (op.family) {
    case Family::unary: return fuzzref::unary_name(static_cast<Unary>(op.which));
    case Family::binary: return fuzzref::binary_name(static_cast<Binary>(op.which));
    case Family::fma: return "fma";
    case Family::clamp: return "clamp";
    case Family::select: return "select";
    case Family::compare: return kCompareNames[op.which];
    case Family::logical: return kLogicalNames[op.which];
  }
  return "?";
}

bool compare(int which, double a, double b) {
  switch (which) {
    case 0: return a == b;
    case 1: return a != b;
    case 2: return a < b;
    case 3: return a <= b;
    case 4: return a > b;
    default: return a >= b;
  }
}

fuzzref::ElementFn reference_fn(const Op& op) {
  switch (op.family) {
    case Family::unary:
      return [u = static_cast<Unary>(op.which)](const double* x, double* y, double* d) { y[0] = fuzzref::unary(u, x[0], d); };
    case Family::binary:
      return [b = static_cast<Binary>(op.which)](const double* x, double* y, double* d) { y[0] = fuzzref::binary(b, x[0], x[1], d); };
    case Family::fma:
      return [](const double* x, double* y, double* d) {
        y[0] = x[0] * x[1] + x[2];
        d[0] = x[1];
        d[1] = x[0];
        d[2] = 1;
      };
    case Family::clamp:
      return [lo = op.lo, hi = op.hi](const double* x, double* y, double* d) {
        y[0] = x[0] < lo ? lo : (x[0] > hi ? hi : x[0]);
        d[0] = (x[0] >= lo && x[0] <= hi) ? 1.0 : 0.0;
      };
    case Family::select:
      return [](const double* x, double* y, double* d) {
        y[0] = x[0] != 0 ? x[1] : x[2];
        d[1] = x[0] != 0 ? 1.0 : 0.0;
        d[2] = 1.0 - d[1];
      };
    case Family::compare:
      return [w = op.which](const double* x, double* y, double*) { y[0] = compare(w, x[0], x[1]) ? 1 : 0; };
    case Family::logical:
      return [w = op.which](const double* x, double* y, double*) {
        y[0] = w == 0 ? (x[0] != 0 && x[1] != 0) : (w == 1 ? (x[0] != 0 || x[1] != 0) : x[0] == 0);
      };
  }
  return {};
}

// ---- calling dualcast -----------------------------------------------------------------------------

template <class A, class B>
Var binary_var(Binary b, const A& x, const B& y) {
  switch (b) {
    case Binary::add: return x + y;
    case Binary::sub: return x - y;
    case Binary::mul: return x * y;
    case Binary::div: return x / y;
#define FUZZ_CALL(fn, ...) \
  case Binary::fn: return dualcast::fn(x, y);
    DUALCAST_BINARY_FUNCTIONS(FUZZ_CALL)
#undef FUZZ_CALL
  }
  throw std::logic_error("fuzz: no such binary Var form");
}

template <class A, class B>
Tensor binary_tensor(Binary b, const A& x, const B& y) {
  switch (b) {
    case Binary::add: return x + y;
    case Binary::sub: return x - y;
    case Binary::mul: return x * y;
    case Binary::div: return x / y;
    case Binary::pow:
      if constexpr (std::is_same_v<A, Tensor> && !std::is_same_v<B, Tensor>) return dualcast::pow(x, y);
      break;
    default: break;
  }
  throw std::logic_error("fuzz: no such binary Tensor form");
}

/// fn(x) for a Var or a Tensor x.
template <class X>
X unary_call(Unary u, const X& x) {
  switch (u) {
#define FUZZ_CALL(fn) \
  case Unary::fn: return dualcast::fn(x);
    DUALCAST_UNARY_FUNCTIONS(FUZZ_CALL)
#undef FUZZ_CALL
    case Unary::neg: return -x;
  }
  return x;
}

template <class A, class B>
Tensor compare_call(int which, const A& a, const B& b) {
  switch (which) {
    case 0: return a == b;
    case 1: return a != b;
    case 2: return a < b;
    case 3: return a <= b;
    case 4: return a > b;
    default: return a >= b;
  }
}

/// Operands by position: vars[i] / tensors[i] / nums[i] as op.form[i] says.
struct Operands {
  std::vector<Var> vars;
  std::vector<Tensor> tensors;
  std::vector<double> nums;
};

Var call_var(const Op& op, const Operands& o) {
  const auto& v = o.vars;
  const auto& n = o.nums;
  const std::string& f = op.form;
  switch (op.family) {
    case Family::unary: return unary_call(static_cast<Unary>(op.which), v[0]);
    case Family::binary: {
      const auto b = static_cast<Binary>(op.which);
      if (f == "VV") return binary_var(b, v[0], v[1]);
      if (f == "VN") return binary_var(b, v[0], n[1]);
      return binary_var(b, n[0], v[1]);
    }
    case Family::fma: return dualcast::fma(v[0], v[1], v[2]);
    case Family::clamp: return dualcast::clamp(v[0], op.lo, op.hi);
    case Family::select:
      if (f == "TVV") return dualcast::select(o.tensors[0], v[1], v[2]);
      if (f == "TVN") return dualcast::select(o.tensors[0], v[1], n[2]);
      return dualcast::select(o.tensors[0], n[1], v[2]);
    default: break;
  }
  throw std::logic_error("fuzz: no Var form");
}

Tensor call_tensor(const Op& op, const Operands& o) {
  const auto& t = o.tensors;
  const auto& n = o.nums;
  const auto& v = o.vars;
  const std::string& f = op.form;
  switch (op.family) {
    case Family::unary: return unary_call(static_cast<Unary>(op.which), t[0]);
    case Family::binary: {
      const auto b = static_cast<Binary>(op.which);
      if (f == "TT") return binary_tensor(b, t[0], t[1]);
      if (f == "TN") return binary_tensor(b, t[0], n[1]);
      return binary_tensor(b, n[0], t[1]);
    }
    case Family::clamp: return dualcast::clamp(t[0], op.lo, op.hi);
    case Family::select: return dualcast::select(t[0], t[1], t[2]);
    case Family::compare:
      if (f == "TT") return compare_call(op.which, t[0], t[1]);
      if (f == "TN") return compare_call(op.which, t[0], n[1]);
      if (f == "NT") return compare_call(op.which, n[0], t[1]);
      if (f == "VV") return compare_call(op.which, v[0], v[1]);
      if (f == "VN") return compare_call(op.which, v[0], n[1]);
      return compare_call(op.which, n[0], v[1]);
    case Family::logical:
      if (op.which == 2) return dualcast::logical_not(t[0]);
      return op.which == 0 ? dualcast::logical_and(t[0], t[1]) : dualcast::logical_or(t[0], t[1]);
    default: break;
  }
  throw std::logic_error("fuzz: no Tensor form");
}

// ---- drawing a case ------------------------------------------------------------------------------------

Op draw_op(Rng& r) {
  Op op;
  op.family = static_cast<Family>(r.uniform_int(0, 6));
  switch (op.family) {
    case Family::unary:
      op.which = r.uniform_int(0, fuzzref::kUnaryCount - 1);
      op.form = r.chance(0.75) ? "V" : "T";
      break;
    case Family::binary: {
      op.which = r.uniform_int(0, fuzzref::kBinaryCount - 1);
      const auto b = static_cast<Binary>(op.which);
      if (b == Binary::min || b == Binary::max || b == Binary::hypot) op.form = r.pick(std::vector<std::string>{"VV", "VN", "NV"});
      else if (b == Binary::pow) op.form = r.pick(std::vector<std::string>{"VV", "VN", "NV", "TN"});
      else op.form = r.pick(std::vector<std::string>{"VV", "VN", "NV", "TT", "TN", "NT"});
      break;
    }
    case Family::fma: op.form = "VVV"; break;
    case Family::clamp:
      op.form = r.chance(0.75) ? "V" : "T";
      op.lo = 0.25 * r.uniform_int(-8, 4);
      op.hi = op.lo + 0.25 * r.uniform_int(0, 8);
      break;
    case Family::select: op.form = r.pick(std::vector<std::string>{"TVV", "TVN", "TNV", "TTT"}); break;
    case Family::compare:
      op.which = r.uniform_int(0, 5);
      op.form = r.pick(std::vector<std::string>{"TT", "TN", "NT", "VV", "VN", "NV"});
      break;
    case Family::logical:
      op.which = r.uniform_int(0, 2);
      op.form = op.which == 2 ? "T" : "TT";
      break;
  }
  return op;
}

/// How operand i of op draws its values (domains keep functions and derivatives well conditioned).
LeafSpec operand_spec(Rng& r, const Op& op, int i, bool single) {
  LeafSpec s;
  s.single = single;
  s.how = r.chance(0.5) ? Values::grid : Values::normal;
  auto range = [&](double lo, double hi) {
    s.how = Values::range;
    s.lo = lo;
    s.hi = hi;
  };
  switch (op.family) {
    case Family::unary: {
      const auto u = static_cast<Unary>(op.which);
      double lo, hi;
      fuzzref::unary_domain(u, lo, hi);
      if (u == Unary::abs || u == Unary::relu) s.how = Values::grid;  // exact zeros: the kinks
      else if (u == Unary::cbrt) range(0.125, 3);
      else range(lo, hi);
      break;
    }
    case Family::binary: {
      const auto b = static_cast<Binary>(op.which);
      if (b == Binary::div && i == 1) range(0.5, 3);
      if (b == Binary::pow) i == 0 ? range(0.25, 2) : range(-2, 2);
      if (b == Binary::min || b == Binary::max || b == Binary::hypot) s.how = Values::grid;
      break;
    }
    case Family::select:
      if (i == 0) {
        s.how = Values::flags;
        s.mask = r.chance(0.5);
      }
      break;
    case Family::compare:
      if (r.chance(0.3)) {
        s.how = Values::flags;
        s.mask = op.form[static_cast<std::size_t>(i)] == 'T' && r.chance(0.7);
      }
      break;
    case Family::logical:
      s.how = Values::flags;
      s.mask = r.chance(0.6);
      break;
    default: break;
  }
  return s;
}

/// A number operand: from the operand's domain, or one of a few values that tell a truncating
/// comparison from a correct one.
double draw_number(Rng& r, const Op& op, const LeafSpec& s) {
  double v = draw_values(r, 1, s.how == Values::flags ? Values::grid : s.how, s.lo, s.hi, s.single)[0];
  if (op.family == Family::compare && r.chance(0.5))
    v = r.pick(std::vector<double>{-1.0, -0.5, 0.0, 0.3, 0.5, 1.0, 1.5, 2.0, 255.5, 256.0});
  return s.single ? static_cast<double>(static_cast<float>(v)) : v;
}

}  // namespace

void run_elementwise_case(Rng& r, const Options& opt, Report& rep) {
  const Op op = draw_op(r);
  const bool single = r.chance(0.5);
  const DType dt = single ? DType::float32 : DType::float64;
  const std::int64_t cap = draw_numel_cap(r, opt);
  const Dims out = random_shape(r, r.uniform_int(0, 8), cap);
  const auto n = op.form.size();
  std::vector<Leaf> leaves;
  std::vector<ExprP> exprs(n);
  std::vector<double> nums(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    LeafSpec s = operand_spec(r, op, static_cast<int>(i), single);
    if (op.form[i] == 'N') {
      nums[i] = draw_number(r, op, s);
      continue;
    }
    if (op.form[i] == 'V') {
      s.param = r.chance(0.85);
      s.mask = false;
    }
    exprs[i] = make_expr(r, broadcast_operand(r, out), r.uniform_int(0, opt.budget.max_depth), s, leaves, cap);
  }
  const double lo = single ? static_cast<double>(static_cast<float>(op.lo)) : op.lo;
  Op ref_op = op;
  ref_op.lo = lo;

  // ---- the reference -----------------------------------------------------------------------------
  std::vector<fuzzref::Array> args(n);
  std::vector<const fuzzref::Array*> ptrs;
  for (std::size_t i = 0; i < n; ++i) {
    args[i] = op.form[i] == 'N' ? fuzzref::from_values({}, {nums[i]}) : evaluate(exprs[i], leaves);
    ptrs.push_back(&args[i]);
  }
  std::vector<Dims> shapes;
  for (const auto& a : args) shapes.push_back(a.shape);
  Dims shape;
  fuzzref::broadcast_shape(shapes, shape);
  const bool tape = !op.tensor_result();
  std::vector<fuzzref::Array> adj{random_adjoint(r, shape, single)};
  const fuzzref::MapResult ref = fuzzref::map(reference_fn(ref_op), 1, ptrs, tape ? &adj : nullptr);
  std::vector<fuzzref::Array> want = leaf_grads(leaves);
  bool any_param = false;
  for (std::size_t i = 0; i < n; ++i)
    if (tape && op.form[i] == 'V') {
      backprop(exprs[i], ref.grad[i], want);
      any_param = any_param || reads_param(exprs[i], leaves);
    }
  const bool direct = r.chance(0.5);

  std::ostringstream what;
  what << op_name(op) << "(" << op.form << ") " << (single ? "float32" : "float64") << " out "
       << dims_str(shape) << (direct ? " direct" : " loss") << ":";
  if (op.family == Family::clamp) what << " lo=" << op.lo << " hi=" << op.hi;
  for (std::size_t i = 0; i < n; ++i)
    what << " #" << i << "=" << (op.form[i] == 'N' ? std::to_string(nums[i]) : describe(exprs[i]));
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
      Operands o;
      o.vars.resize(n);
      o.tensors.resize(n);
      o.nums = nums;
      std::map<const Expr*, Var> memo;
      for (std::size_t i = 0; i < n; ++i) {
        if (op.form[i] == 'V') o.vars[i] = eval_var(exprs[i], vars, memo);
        if (op.form[i] == 'T') o.tensors[i] = eval_tensor(exprs[i], tensors);
      }
      const bool mask_result = op.family == Family::compare || op.family == Family::logical;
      Var result = tape ? call_var(op, o) : Var(call_tensor(op, o));
      const Tensor& value = result.value();
      const DType want_dtype = mask_result ? DType::uint8 : dt;
      if (value.shape().vec() != shape || value.dtype() != want_dtype) {
        rep.fail(pre + "result " + value.str() + ", want shape " + dims_str(shape) + " " +
                 dualcast::dtype_name(want_dtype));
        return;
      }
      const std::vector<double> got = value.to_vector<double>();
      check_close(rep, pre + "value", got, ref.out[0], single);
      oc.add("value", got, nullptr);
      if (!tape) return;
      if (!any_param) {
        if (result.requires_grad()) rep.fail(pre + "result requires a gradient but no operand does");
        return;
      }
      if (!result.requires_grad()) {
        rep.fail(pre + "result does not require a gradient");
        return;
      }
      const Tensor g = to_tensor(adj[0], dt, dev);
      if (direct) result.backward(g);
      else dualcast::sum(result * Var(g)).backward();
      check_leaf_grads(rep, oc, leaves, vars, want, 1.0, single, pre);
    });
  }
  check_devices(rep, opt.devices, outcomes, single);
}

}  // namespace fuzz
