// harness.cpp: comparisons, Expr evaluation with dualcast's shape ops, and the category dispatch.
#include "harness.hpp"

#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>

#include "dualcast/error.hpp"
#include "dualcast/ops/shape.hpp"

namespace fuzz {

using dualcast::DType;
using dualcast::Device;
using dualcast::Tensor;
using dualcast::Var;

namespace {

constexpr int kMaxMismatchesShown = 3;

bool same_special(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return false;
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void compare(Report& rep, const std::string& label, const std::vector<double>& got,
             const std::vector<double>& want, const std::vector<double>& mag, double rel,
             double mag_tol, const char* against) {
  if (got.size() != want.size()) {
    rep.fail(label + ": " + std::to_string(got.size()) + " numbers, " + against + " has " +
             std::to_string(want.size()));
    return;
  }
  int shown = 0;
  std::int64_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ++rep.compared;
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isfinite(g) && std::isfinite(w)) {
      const double m = mag.empty() ? 0.0 : mag[i];
      ok = std::fabs(g - w) <= rel * std::fmax(1.0, std::fabs(w)) + mag_tol * m;
    } else {
      ok = same_special(g, w);
    }
    if (ok) continue;
    ++bad;
    if (shown++ < kMaxMismatchesShown)
      first += " [" + std::to_string(i) + "] got " + num(g) + " want " + num(w) +
               (mag.empty() ? "" : " (mag " + num(mag[i]) + ")") + ";";
  }
  if (bad > 0)
    rep.fail(label + ": " + std::to_string(bad) + " of " + std::to_string(got.size()) +
             " differ from " + against + ":" + first);
}

}  // namespace

void check_close(Report& rep, const std::string& label, const std::vector<double>& got,
                 const fuzzref::Array& want, bool single) {
  compare(rep, label, got, want.v, want.mag, single ? kTolFloat : kTolDouble,
          single ? kMagTolFloat : kMagTolDouble, "the reference");
}

void check_same(Report& rep, const std::string& label, const std::vector<double>& got,
                const std::vector<double>& first, const std::vector<double>& mag, bool single) {
  compare(rep, label, got, first, mag, single ? kCrossTolFloat : kCrossTolDouble,
          single ? kMagTolFloat : kMagTolDouble, "the first device");
}

void check_devices(Report& rep, const std::vector<Device>& devices,
                   const std::vector<Outcome>& outcomes, bool single) {
  if (outcomes.size() < 2) return;
  const Outcome& base = outcomes[0];
  for (std::size_t d = 1; d < outcomes.size(); ++d) {
    const Outcome& o = outcomes[d];
    if (o.labels != base.labels) {
      std::string mine, theirs;
      for (const auto& l : o.labels) mine += " '" + l + "'";
      for (const auto& l : base.labels) theirs += " '" + l + "'";
      rep.fail(std::string(dev_label(devices[d])) + " produced other results than " +
               dev_label(devices[0]) + " (a step failed on one of them):" + mine + " against" + theirs);
      continue;
    }
    for (std::size_t k = 0; k < o.labels.size(); ++k)
      check_same(rep, std::string(dev_label(devices[d])) + " vs " + dev_label(devices[0]) + " " +
                          o.labels[k],
                 o.numbers[k], base.numbers[k], base.mags[k], single);
  }
}

Tensor make_tensor(const Leaf& leaf, DType dtype, Device device) {
  const dualcast::Shape shape(leaf.shape);
  if (leaf.mask) {
    std::vector<std::uint8_t> v(leaf.values.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint8_t>(leaf.values[i]);
    return Tensor::from_vector(shape, v, device);
  }
  if (dtype == DType::float32) {
    std::vector<float> v(leaf.values.begin(), leaf.values.end());
    return Tensor::from_vector(shape, v, device);
  }
  return Tensor::from_vector(shape, leaf.values, device);
}

std::vector<Var> make_leaf_vars(const std::vector<Leaf>& leaves, DType dtype, Device device) {
  std::vector<Var> vars;
  for (const Leaf& l : leaves) {
    Tensor t = make_tensor(l, dtype, device);
    vars.push_back(l.param ? Var::param(t) : Var(t));
  }
  return vars;
}

std::vector<Tensor> make_leaf_tensors(const std::vector<Leaf>& leaves, DType dtype, Device device) {
  std::vector<Tensor> ts;
  for (const Leaf& l : leaves) ts.push_back(make_tensor(l, dtype, device));
  return ts;
}

Var eval_var(const ExprP& e, const std::vector<Var>& leaves, std::map<const Expr*, Var>& memo) {
  if (auto it = memo.find(e.get()); it != memo.end()) return it->second;
  Var r;
  switch (e->kind) {
    case Expr::leaf: r = leaves[static_cast<std::size_t>(e->leaf_id)]; break;
    case Expr::permute: r = dualcast::permute(eval_var(e->kids[0], leaves, memo), e->perm); break;
    case Expr::transpose: r = dualcast::transpose(eval_var(e->kids[0], leaves, memo)); break;
    case Expr::slice:
      r = dualcast::slice(eval_var(e->kids[0], leaves, memo), e->axis, e->start, e->stop);
      break;
    case Expr::reshape: r = dualcast::reshape(eval_var(e->kids[0], leaves, memo), e->spec); break;
    case Expr::concat: {
      std::vector<Var> xs;
      for (const auto& k : e->kids) xs.push_back(eval_var(k, leaves, memo));
      r = dualcast::concat(xs, e->axis);
      break;
    }
    case Expr::split:
      r = dualcast::split(eval_var(e->kids[0], leaves, memo), e->axis, e->sizes)[static_cast<std::size_t>(e->piece)];
      break;
    case Expr::broadcast_to:
      r = dualcast::broadcast_to(eval_var(e->kids[0], leaves, memo), dualcast::Shape(e->shape));
      break;
  }
  memo[e.get()] = r;
  return r;
}

Tensor eval_tensor(const ExprP& e, const std::vector<Tensor>& leaves) {
  switch (e->kind) {
    case Expr::leaf: return leaves[static_cast<std::size_t>(e->leaf_id)];
    case Expr::permute: return dualcast::permute(eval_tensor(e->kids[0], leaves), e->perm);
    case Expr::transpose: return dualcast::transpose(eval_tensor(e->kids[0], leaves));
    case Expr::slice: return dualcast::slice(eval_tensor(e->kids[0], leaves), e->axis, e->start, e->stop);
    case Expr::reshape: return dualcast::reshape(eval_tensor(e->kids[0], leaves), e->spec);
    case Expr::concat: {
      std::vector<Tensor> xs;
      for (const auto& k : e->kids) xs.push_back(eval_tensor(k, leaves));
      return dualcast::concat(xs, e->axis);
    }
    case Expr::split:
      return dualcast::split(eval_tensor(e->kids[0], leaves), e->axis, e->sizes)[static_cast<std::size_t>(e->piece)];
    case Expr::broadcast_to:
      return dualcast::broadcast_to(eval_tensor(e->kids[0], leaves), dualcast::Shape(e->shape));
  }
  return {};
}

fuzzref::Array random_adjoint(Rng& r, const Dims& s, bool single) {
  return fuzzref::from_values(s, draw_values(r, fuzzref::numel(s), Values::normal, 0, 0, single));
}

Tensor to_tensor(const fuzzref::Array& a, DType dtype, Device device) {
  Leaf l;
  l.shape = a.shape;
  l.values = a.v;
  return make_tensor(l, dtype, device);
}

void check_leaf_grads(Report& rep, Outcome& out, const std::vector<Leaf>& leaves,
                      const std::vector<Var>& vars, const std::vector<fuzzref::Array>& want,
                      double times, bool single, const std::string& prefix) {
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!leaves[i].param) continue;
    // The Outcome's label has no device prefix: check_devices matches labels across devices.
    const std::string what = "grad of leaf" + std::to_string(i);
    const std::string label = prefix + what;
    if (!vars[i].has_grad()) {
      rep.fail(label + ": no gradient after backward");
      continue;
    }
    fuzzref::Array w = want[i];
    for (auto& v : w.v) v *= times;
    for (auto& m : w.mag) m *= times;
    const std::vector<double> got = vars[i].grad().to_vector<double>();
    check_close(rep, label, got, w, single);
    out.add(what, got, &w);
  }
}

bool reads_param(const ExprP& e, const std::vector<Leaf>& leaves) {
  if (e->kind == Expr::leaf) return leaves[static_cast<std::size_t>(e->leaf_id)].param;
  for (const auto& k : e->kids)
    if (reads_param(k, leaves)) return true;
  return false;
}

std::int64_t draw_numel_cap(Rng& r, const Options& opt) {
  return r.chance(opt.large_chance) ? opt.large_numel : opt.budget.max_numel;
}

Report run_case(Rng& r, const Options& opt) {
  Report rep;
  rep.category = static_cast<Category>(r.uniform_int(0, kCategoryCount - 1));
  try {
    switch (rep.category) {
      case Category::broadcast: run_broadcast_case(r, opt, rep); break;
      case Category::elementwise: run_elementwise_case(r, opt, rep); break;
      case Category::reduce: run_reduce_case(r, opt, rep); break;
      case Category::shape: run_shape_case(r, opt, rep); break;
    }
  } catch (const std::exception& e) {
    rep.fail(std::string("unexpected exception: ") + e.what());
  }
  return rep;
}

}  // namespace fuzz
