// expr.hpp: how the fuzzer describes the tensors of a case, and how it draws them. Plain C++ (no
// dualcast code), shared by the reference and by the code that runs dualcast.
//
// dualcast tensors are always contiguous, so "non-contiguous inputs" are chains of shape ops: an Expr
// is a leaf (a tensor of random values) or a shape op (permute, transpose, slice, reshape, concat,
// split, broadcast_to) applied to Exprs. The generators work backwards from the shape an argument
// must have: pick an op, derive the shape its input must have, recurse. evaluate() and backprop()
// are the reference's reading of an Expr (values, and the adjoint pushed back to the leaves).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "reference.hpp"
#include "rng.hpp"

namespace fuzz {

using fuzzref::Dims;

/// How leaf values are drawn.
enum class Values {
  normal,  ///< N(0, 1)
  grid,    ///< multiples of 1/4 in [-2, 2]: ties and exact zeros are common
  flags,   ///< 0 or 1
  range,   ///< uniform in [lo, hi] (an op's domain)
};

struct Leaf {
  Dims shape;
  std::vector<double> values;  ///< already rounded to the case's dtype
  bool param = false;          ///< a Var::param (else a constant)
  bool mask = false;           ///< stored as uint8 (Tensor arguments only)
};

struct Expr;
using ExprP = std::shared_ptr<const Expr>;

struct Expr {
  enum Kind { leaf, permute, transpose, slice, reshape, concat, split, broadcast_to };
  Kind kind = leaf;
  Dims shape;                 ///< the result's shape
  int leaf_id = -1;           ///< leaf
  std::vector<ExprP> kids;    ///< inputs (concat: several)
  std::vector<int> perm;      ///< permute (entries may be negative: counted from the back)
  int axis = 0;               ///< slice, concat, split (may be negative)
  std::int64_t start = 0, stop = 0;       ///< slice bounds as passed (may be negative)
  std::vector<std::int64_t> spec;         ///< reshape target as passed (may hold one -1)
  std::vector<std::int64_t> sizes;        ///< split sizes
  int piece = 0;                          ///< split: which piece
};

/// Limits of a drawn case.
struct Budget {
  std::int64_t max_numel = 4096;  ///< elements of one tensor (an occasional large case gets more)
  int max_depth = 3;              ///< shape ops stacked on a leaf
};

// ---- shapes --------------------------------------------------------------------------------------

inline std::string dims_str(const Dims& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

/// A random shape of the given rank: sizes 0 (rarely), 1 (often), 2..7, with one longer dimension
/// now and then; the element count stays within max_numel.
inline Dims random_shape(Rng& r, int rank, std::int64_t max_numel) {
  Dims s(static_cast<std::size_t>(rank), 1);
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    const int pick = r.uniform_int(0, 99);
    std::int64_t v;
    if (pick < 3) v = 0;
    else if (pick < 33) v = 1;
    else if (pick < 90) v = r.uniform(2, 7);
    else v = r.uniform(8, 700);
    if (v > 1 && n * v > max_numel) v = std::max<std::int64_t>(1, max_numel / std::max<std::int64_t>(1, n));
    s[static_cast<std::size_t>(d)] = v;
    n *= std::max<std::int64_t>(v, 1);
  }
  return s;
}

/// A shape that broadcasts to `out`: leading dimensions dropped, others kept or set to 1.
inline Dims broadcast_operand(Rng& r, const Dims& out) {
  const int drop = r.chance(0.3) ? r.uniform_int(0, static_cast<int>(out.size())) : 0;
  Dims s(out.begin() + drop, out.end());
  for (auto& d : s)
    if (r.chance(0.35)) d = 1;
  return s;
}

/// A random shape with `n` elements (n > 0 unless the shape has a 0), of random rank <= 8.
inline Dims random_factorization(Rng& r, std::int64_t n) {
  const int rk = r.uniform_int(0, 8);
  if (n == 0) {
    Dims s = random_shape(r, std::max(rk, 1), 64);
    s[static_cast<std::size_t>(r.uniform_int(0, std::max(rk, 1) - 1))] = 0;
    return s;
  }
  if (rk == 0) return n == 1 ? Dims{} : Dims{n};
  Dims s(static_cast<std::size_t>(rk), 1);
  std::int64_t left = n;
  for (std::int64_t p = 2; p * p <= left; ++p)
    while (left % p == 0) {
      s[static_cast<std::size_t>(r.uniform_int(0, rk - 1))] *= p;
      left /= p;
    }
  if (left > 1) s[static_cast<std::size_t>(r.uniform_int(0, rk - 1))] *= left;
  return s;
}

// ---- leaves and chains ------------------------------------------------------------------------------

/// Draws leaf values and rounds them to float when the case is float32.
inline std::vector<double> draw_values(Rng& r, std::int64_t n, Values how, double lo, double hi,
                                       bool single) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    switch (how) {
      case Values::normal: x = r.normal(); break;
      case Values::grid: x = 0.25 * static_cast<double>(r.data_int(-8, 8)); break;
      case Values::flags: x = static_cast<double>(r.data_int(0, 1)); break;
      case Values::range: x = r.real(lo, hi); break;
    }
    if (single) x = static_cast<double>(static_cast<float>(x));
  }
  return v;
}

/// What new leaves of a chain look like.
struct LeafSpec {
  Values how = Values::normal;
  double lo = -3, hi = 3;
  bool single = false;  ///< float32 case
  bool param = false;
  bool mask = false;
};

inline ExprP make_leaf(Rng& r, const Dims& shape, const LeafSpec& spec, std::vector<Leaf>& leaves) {
  Leaf l;
  l.shape = shape;
  l.values = draw_values(r, fuzzref::numel(shape), spec.how, spec.lo, spec.hi, spec.single);
  l.param = spec.param;
  l.mask = spec.mask;
  leaves.push_back(std::move(l));
  auto e = std::make_shared<Expr>();
  e->shape = shape;
  e->leaf_id = static_cast<int>(leaves.size()) - 1;
  return e;
}

/// An Expr of shape `target`: a leaf, or a shape op over Exprs drawn the same way (depth levels).
inline ExprP make_expr(Rng& r, const Dims& target, int depth, const LeafSpec& spec,
                       std::vector<Leaf>& leaves, std::int64_t max_numel) {
  const int rk = static_cast<int>(target.size());
  if (depth <= 0 || r.chance(0.3)) return make_leaf(r, target, spec, leaves);
  auto e = std::make_shared<Expr>();
  e->shape = target;
  const int kind = r.uniform_int(1, 7);
  auto grow = [&](const Dims& s) {  // a child's shape must stay small enough
    return fuzzref::numel(s) <= 2 * max_numel;
  };
  switch (kind) {
    case Expr::permute: {
      if (rk == 0) break;
      std::vector<int> p(static_cast<std::size_t>(rk));
      std::iota(p.begin(), p.end(), 0);
      for (int i = rk - 1; i > 0; --i) std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(r.uniform_int(0, i))]);
      Dims child(static_cast<std::size_t>(rk));
      for (int i = 0; i < rk; ++i) child[static_cast<std::size_t>(p[static_cast<std::size_t>(i)])] = target[static_cast<std::size_t>(i)];
      e->kind = Expr::permute;
      e->perm = p;
      for (auto& v : e->perm)
        if (r.chance(0.25)) v -= rk;
      e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      return e;
    }
    case Expr::transpose: {
      if (rk < 2) break;
      Dims child = target;
      std::swap(child[static_cast<std::size_t>(rk - 1)], child[static_cast<std::size_t>(rk - 2)]);
      e->kind = Expr::transpose;
      e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      return e;
    }
    case Expr::slice: {
      if (rk == 0) break;
      const int ax = r.uniform_int(0, rk - 1);
      Dims child = target;
      const std::int64_t before = r.uniform(0, 3), after = r.uniform(0, 3);
      child[static_cast<std::size_t>(ax)] += before + after;
      if (!grow(child)) break;
      const std::int64_t size = child[static_cast<std::size_t>(ax)];
      e->kind = Expr::slice;
      e->axis = r.chance(0.3) ? ax - rk : ax;
      e->start = before;
      e->stop = before + target[static_cast<std::size_t>(ax)];
      if (r.chance(0.3) && e->start < size) e->start -= size;
      if (r.chance(0.3) && e->stop < size) e->stop -= size;
      e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      return e;
    }
    case Expr::reshape: {
      const Dims child = random_factorization(r, fuzzref::numel(target));
      e->kind = Expr::reshape;
      e->spec = target;
      if (rk > 0 && fuzzref::numel(target) > 0 && r.chance(0.3))
        e->spec[static_cast<std::size_t>(r.uniform_int(0, rk - 1))] = -1;
      e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      return e;
    }
    case Expr::concat: {
      if (rk == 0) break;
      const int ax = r.uniform_int(0, rk - 1);
      const int pieces = r.uniform_int(1, r.chance(0.1) ? 10 : 3);
      std::vector<std::int64_t> sizes(static_cast<std::size_t>(pieces), 0);
      for (std::int64_t k = 0; k < target[static_cast<std::size_t>(ax)]; ++k) ++sizes[static_cast<std::size_t>(r.uniform_int(0, pieces - 1))];
      e->kind = Expr::concat;
      e->axis = r.chance(0.3) ? ax - rk : ax;
      for (const std::int64_t s : sizes) {
        Dims child = target;
        child[static_cast<std::size_t>(ax)] = s;
        e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      }
      return e;
    }
    case Expr::split: {
      if (rk == 0) break;
      const int ax = r.uniform_int(0, rk - 1);
      const int pieces = r.uniform_int(1, r.chance(0.1) ? 11 : 4);
      e->piece = r.uniform_int(0, pieces - 1);
      for (int k = 0; k < pieces; ++k)
        e->sizes.push_back(k == e->piece ? target[static_cast<std::size_t>(ax)] : r.uniform(0, 2));
      Dims child = target;
      child[static_cast<std::size_t>(ax)] = std::accumulate(e->sizes.begin(), e->sizes.end(), std::int64_t{0});
      if (!grow(child)) break;
      e->kind = Expr::split;
      e->axis = r.chance(0.3) ? ax - rk : ax;
      e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      return e;
    }
    case Expr::broadcast_to: {
      const Dims child = broadcast_operand(r, target);
      e->kind = Expr::broadcast_to;
      e->kids.push_back(make_expr(r, child, depth - 1, spec, leaves, max_numel));
      return e;
    }
    default: break;
  }
  return make_leaf(r, target, spec, leaves);
}

inline std::string describe(const ExprP& e) {
  std::ostringstream os;
  switch (e->kind) {
    case Expr::leaf: os << "leaf" << e->leaf_id << dims_str(e->shape); return os.str();
    case Expr::permute: {
      os << "permute(" << describe(e->kids[0]) << ", {";
      for (std::size_t i = 0; i < e->perm.size(); ++i) os << (i ? "," : "") << e->perm[i];
      os << "})";
      return os.str();
    }
    case Expr::transpose: return "transpose(" + describe(e->kids[0]) + ")";
    case Expr::slice:
      os << "slice(" << describe(e->kids[0]) << ", " << e->axis << ", " << e->start << ", " << e->stop << ")";
      return os.str();
    case Expr::reshape: return "reshape(" + describe(e->kids[0]) + ", " + dims_str(e->spec) + ")";
    case Expr::concat: {
      os << "concat({";
      for (std::size_t i = 0; i < e->kids.size(); ++i) os << (i ? ", " : "") << describe(e->kids[i]);
      os << "}, " << e->axis << ")";
      return os.str();
    }
    case Expr::split:
      os << "split(" << describe(e->kids[0]) << ", " << e->axis << ", " << dims_str(e->sizes) << ")[" << e->piece << "]";
      return os.str();
    case Expr::broadcast_to: return "broadcast_to(" + describe(e->kids[0]) + ", " + dims_str(e->shape) + ")";
  }
  return "?";
}

// ---- the reference's reading of an Expr -------------------------------------------------------------

inline int norm_axis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

/// The gather an Expr of one input performs (every kind but leaf and concat).
inline fuzzref::Gather expr_map(const Expr& e) {
  const Dims& in = e.kids[0]->shape;
  const int rk = static_cast<int>(in.size());
  switch (e.kind) {
    case Expr::permute: {
      std::vector<int> p;
      for (const int v : e.perm) p.push_back(norm_axis(v, rk));
      return fuzzref::permute_map(in, p);
    }
    case Expr::transpose: {
      std::vector<int> p(static_cast<std::size_t>(rk));
      std::iota(p.begin(), p.end(), 0);
      std::swap(p[static_cast<std::size_t>(rk - 1)], p[static_cast<std::size_t>(rk - 2)]);
      return fuzzref::permute_map(in, p);
    }
    case Expr::slice: {
      const int ax = norm_axis(e.axis, rk);
      const std::int64_t size = in[static_cast<std::size_t>(ax)];
      return fuzzref::slice_map(in, ax, e.start < 0 ? e.start + size : e.start,
                                e.stop < 0 ? e.stop + size : e.stop);
    }
    case Expr::split: {
      const int ax = norm_axis(e.axis, rk);
      std::int64_t begin = 0;
      for (int k = 0; k < e.piece; ++k) begin += e.sizes[static_cast<std::size_t>(k)];
      return fuzzref::slice_map(in, ax, begin, begin + e.sizes[static_cast<std::size_t>(e.piece)]);
    }
    case Expr::reshape: return fuzzref::reshape_map(in, e.shape);
    case Expr::broadcast_to: return fuzzref::broadcast_map(in, e.shape);
    default: break;
  }
  return {};
}

inline fuzzref::Array evaluate(const ExprP& e, const std::vector<Leaf>& leaves) {
  if (e->kind == Expr::leaf) {
    const Leaf& l = leaves[static_cast<std::size_t>(e->leaf_id)];
    return fuzzref::from_values(l.shape, l.values);
  }
  if (e->kind == Expr::concat) {
    std::vector<fuzzref::Array> xs;
    for (const auto& k : e->kids) xs.push_back(evaluate(k, leaves));
    return fuzzref::concat(xs, norm_axis(e->axis, static_cast<int>(e->shape.size())));
  }
  return fuzzref::gather(evaluate(e->kids[0], leaves), expr_map(*e));
}

/// Adds the adjoint `g` of e's value into the gradients of the leaves it reads (grads[leaf_id],
/// allocated by the caller for param leaves; others ignored).
inline void backprop(const ExprP& e, const fuzzref::Array& g, std::vector<fuzzref::Array>& grads) {
  if (e->kind == Expr::leaf) {
    fuzzref::Array& acc = grads[static_cast<std::size_t>(e->leaf_id)];
    if (acc.shape != e->shape) return;  // not a parameter
    for (std::size_t i = 0; i < acc.v.size(); ++i) {
      acc.v[i] += g.v[i];
      acc.mag[i] += g.mag.empty() ? std::fabs(g.v[i]) : g.mag[i];
    }
    return;
  }
  if (e->kind == Expr::concat) {
    std::vector<Dims> shapes;
    for (const auto& k : e->kids) shapes.push_back(k->shape);
    const auto parts = fuzzref::concat_adjoint(g, shapes, norm_axis(e->axis, static_cast<int>(e->shape.size())));
    for (std::size_t i = 0; i < e->kids.size(); ++i) backprop(e->kids[i], parts[i], grads);
    return;
  }
  backprop(e->kids[0], fuzzref::scatter_add(g, expr_map(*e), e->kids[0]->shape), grads);
}

/// Gradient accumulators for the param leaves (empty shapes elsewhere, ignored by backprop). A
/// rank-0 param leaf is told apart by an accumulator with one entry.
inline std::vector<fuzzref::Array> leaf_grads(const std::vector<Leaf>& leaves) {
  std::vector<fuzzref::Array> g(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].param) g[i] = fuzzref::zeros(leaves[i].shape);
    else g[i].shape = {-1};  // never equal to a real shape
  return g;
}

}  // namespace fuzz
