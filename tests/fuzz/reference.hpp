// reference.hpp: the fuzzer's double-precision reference for index arithmetic, written without any
// dualcast code: dense row-major arrays of doubles, NumPy broadcasting, the shape ops (as gathers:
// each output element names the input element it copies; the adjoint scatters back and adds),
// reductions over any set of axes, and an elementwise map that also computes the gradients of its
// arguments, summed over the dimensions they were broadcast along. Every loop walks plain
// coordinates; nothing is collapsed or vectorised, so it shares no shortcut with the library.
//
// Gradient arrays carry `mag`: per entry, the sum of the absolute values of the terms that were
// added into it. It is the scale of the rounding error a correct float implementation may make in
// that sum (cancellation can make the value itself much smaller), and the checker allows for it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace fuzzref {

using Dims = std::vector<std::int64_t>;

inline std::int64_t numel(const Dims& s) {
  std::int64_t n = 1;
  for (const std::int64_t d : s) n *= d;
  return n;
}
inline int rank(const Dims& s) { return static_cast<int>(s.size()); }

/// A dense row-major array; `mag` is empty or of the same size as `v`.
struct Array {
  Dims shape;
  std::vector<double> v;
  std::vector<double> mag;
};

inline Array zeros(const Dims& s) {
  const auto n = static_cast<std::size_t>(numel(s));
  return {s, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
}
inline Array from_values(const Dims& s, std::vector<double> v) {
  Array a{s, std::move(v), {}};
  a.mag.assign(a.v.size(), 0.0);
  for (std::size_t i = 0; i < a.v.size(); ++i) a.mag[i] = std::fabs(a.v[i]);
  return a;
}

/// Coordinates of flat index i in shape s (row-major); s has no zero dimension when called.
inline void unravel(std::int64_t i, const Dims& s, std::int64_t* idx) {
  for (int d = rank(s) - 1; d >= 0; --d) {
    idx[d] = i % s[static_cast<std::size_t>(d)];
    i /= s[static_cast<std::size_t>(d)];
  }
}
inline std::int64_t ravel(const std::int64_t* idx, const Dims& s) {
  std::int64_t flat = 0;
  for (int d = 0; d < rank(s); ++d) flat = flat * s[static_cast<std::size_t>(d)] + idx[d];
  return flat;
}

/// Flat index, in an array of shape `a`, of the element that output coordinates `idx` (rank r >=
/// rank(a)) read under NumPy broadcasting: `a` aligned at the back, size-1 dimensions read at 0.
inline std::int64_t broadcast_index(const std::int64_t* idx, int r, const Dims& a) {
  const int off = r - rank(a);
  std::int64_t flat = 0;
  for (int d = 0; d < rank(a); ++d) {
    const std::int64_t n = a[static_cast<std::size_t>(d)];
    flat = flat * n + (n == 1 ? 0 : idx[off + d]);
  }
  return flat;
}

/// NumPy broadcast of shapes; false when two sizes differ and neither is 1.
inline bool broadcast_shape(const std::vector<Dims>& shapes, Dims& out) {
  int r = 0;
  for (const Dims& s : shapes) r = std::max(r, rank(s));
  out.assign(static_cast<std::size_t>(r), 1);
  for (const Dims& s : shapes) {
    const int off = r - rank(s);
    for (int d = 0; d < rank(s); ++d) {
      std::int64_t& o = out[static_cast<std::size_t>(off + d)];
      const std::int64_t n = s[static_cast<std::size_t>(d)];
      if (n == o || n == 1) continue;
      if (o != 1) return false;
      o = n;
    }
  }
  return true;
}

// ---- data movement as gathers ----------------------------------------------------------------------

/// Output element i copies input element src[i]; the output has shape `shape`.
struct Gather {
  Dims shape;
  std::vector<std::int64_t> src;
};

inline Array gather(const Array& a, const Gather& g) {
  Array out{g.shape, std::vector<double>(g.src.size()), std::vector<double>(g.src.size())};
  for (std::size_t i = 0; i < g.src.size(); ++i) {
    out.v[i] = a.v[static_cast<std::size_t>(g.src[i])];
    out.mag[i] = a.mag.empty() ? std::fabs(out.v[i]) : a.mag[static_cast<std::size_t>(g.src[i])];
  }
  return out;
}

/// The adjoint of a gather: every output adjoint added to the input element it was copied from.
inline Array scatter_add(const Array& g, const Gather& m, const Dims& in_shape) {
  Array out = zeros(in_shape);
  for (std::size_t i = 0; i < m.src.size(); ++i) {
    const auto j = static_cast<std::size_t>(m.src[i]);
    out.v[j] += g.v[i];
    out.mag[j] += g.mag.empty() ? std::fabs(g.v[i]) : g.mag[i];
  }
  return out;
}

/// out[i0, .., ir-1] = in[j] with j[perm[k]] = i[k]: output dimension k is input dimension perm[k].
inline Gather permute_map(const Dims& in, const std::vector<int>& perm) {
  Gather g;
  for (const int p : perm) g.shape.push_back(in[static_cast<std::size_t>(p)]);
  const std::int64_t n = numel(g.shape);
  std::vector<std::int64_t> idx(in.size() + 1), jdx(in.size() + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    unravel(i, g.shape, idx.data());
    for (std::size_t k = 0; k < perm.size(); ++k) jdx[static_cast<std::size_t>(perm[k])] = idx[k];
    g.src.push_back(ravel(jdx.data(), in));
  }
  return g;
}

/// Elements start..stop-1 along `axis` (bounds already non-negative).
inline Gather slice_map(const Dims& in, int axis, std::int64_t start, std::int64_t stop) {
  Gather g;
  g.shape = in;
  g.shape[static_cast<std::size_t>(axis)] = stop - start;
  const std::int64_t n = numel(g.shape);
  std::vector<std::int64_t> idx(in.size() + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    unravel(i, g.shape, idx.data());
    idx[static_cast<std::size_t>(axis)] += start;
    g.src.push_back(ravel(idx.data(), in));
  }
  return g;
}

/// `in` repeated to `shape` (NumPy rules); its adjoint (scatter_add) is sum_to.
inline Gather broadcast_map(const Dims& in, const Dims& shape) {
  Gather g;
  g.shape = shape;
  const std::int64_t n = numel(shape);
  std::vector<std::int64_t> idx(shape.size() + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    unravel(i, shape, idx.data());
    g.src.push_back(broadcast_index(idx.data(), rank(shape), in));
  }
  return g;
}

/// The same elements under a new shape (row-major order kept).
inline Gather reshape_map(const Dims& in, const Dims& shape) {
  Gather g;
  g.shape = shape;
  for (std::int64_t i = 0; i < numel(in); ++i) g.src.push_back(i);
  return g;
}

/// Pieces joined along `axis`; element i of the result is element local[i] of piece piece[i].
struct ConcatMap {
  Dims shape;
  std::vector<int> piece;
  std::vector<std::int64_t> local;
};

inline ConcatMap concat_map(const std::vector<Dims>& pieces, int axis) {
  ConcatMap m;
  m.shape = pieces[0];
  std::int64_t total = 0;
  std::vector<std::int64_t> begin;
  for (const Dims& p : pieces) {
    begin.push_back(total);
    total += p[static_cast<std::size_t>(axis)];
  }
  m.shape[static_cast<std::size_t>(axis)] = total;
  const std::int64_t n = numel(m.shape);
  std::vector<std::int64_t> idx(m.shape.size() + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    unravel(i, m.shape, idx.data());
    const std::int64_t c = idx[static_cast<std::size_t>(axis)];
    int p = static_cast<int>(pieces.size()) - 1;
    while (begin[static_cast<std::size_t>(p)] > c || pieces[static_cast<std::size_t>(p)][static_cast<std::size_t>(axis)] == 0) --p;
    idx[static_cast<std::size_t>(axis)] = c - begin[static_cast<std::size_t>(p)];
    m.piece.push_back(p);
    m.local.push_back(ravel(idx.data(), pieces[static_cast<std::size_t>(p)]));
  }
  return m;
}

inline Array concat(const std::vector<Array>& xs, int axis) {
  std::vector<Dims> shapes;
  for (const Array& x : xs) shapes.push_back(x.shape);
  const ConcatMap m = concat_map(shapes, axis);
  Array out = zeros(m.shape);
  for (std::size_t i = 0; i < m.piece.size(); ++i) {
    const Array& x = xs[static_cast<std::size_t>(m.piece[i])];
    const auto j = static_cast<std::size_t>(m.local[i]);
    out.v[i] = x.v[j];
    out.mag[i] = x.mag.empty() ? std::fabs(x.v[j]) : x.mag[j];
  }
  return out;
}

/// The adjoints of concat's pieces: the result's adjoint cut along `axis`.
inline std::vector<Array> concat_adjoint(const Array& g, const std::vector<Dims>& pieces, int axis) {
  const ConcatMap m = concat_map(pieces, axis);
  std::vector<Array> out;
  for (const Dims& p : pieces) out.push_back(zeros(p));
  for (std::size_t i = 0; i < m.piece.size(); ++i) {
    Array& x = out[static_cast<std::size_t>(m.piece[i])];
    x.v[static_cast<std::size_t>(m.local[i])] = g.v[i];
    x.mag[static_cast<std::size_t>(m.local[i])] = g.mag.empty() ? std::fabs(g.v[i]) : g.mag[i];
  }
  return out;
}

// ---- reductions ------------------------------------------------------------------------------------

enum class Reduce { sum, mean, amax };

/// `in` with the masked dimensions set to 1 (keepdims) or removed.
inline Dims reduced_shape(const Dims& in, const std::vector<bool>& mask, bool keepdims) {
  Dims out;
  for (std::size_t d = 0; d < in.size(); ++d) {
    if (!mask[d]) out.push_back(in[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

/// For each input element, the flat index of the (keepdims) output it belongs to.
inline std::vector<std::int64_t> reduce_owner(const Dims& in, const std::vector<bool>& mask) {
  const Dims keep = reduced_shape(in, mask, true);
  std::vector<std::int64_t> owner;
  std::vector<std::int64_t> idx(in.size() + 1);
  for (std::int64_t i = 0; i < numel(in); ++i) {
    unravel(i, in, idx.data());
    for (std::size_t d = 0; d < in.size(); ++d)
      if (mask[d]) idx[d] = 0;
    owner.push_back(ravel(idx.data(), keep));
  }
  return owner;
}

/// sum (0 for nothing), mean (NaN for nothing) or amax (caller ensures no empty reduction; NaN
/// never occurs in fuzz data) over the masked dimensions.
inline Array reduce(const Array& x, const std::vector<bool>& mask, Reduce kind, bool keepdims) {
  const Dims keep = reduced_shape(x.shape, mask, true);
  std::int64_t n_red = 1;
  for (std::size_t d = 0; d < x.shape.size(); ++d)
    if (mask[d]) n_red *= x.shape[d];
  Array out = zeros(keep);
  if (kind == Reduce::amax) std::fill(out.v.begin(), out.v.end(), -std::numeric_limits<double>::infinity());
  const std::vector<std::int64_t> owner = reduce_owner(x.shape, mask);
  for (std::size_t i = 0; i < owner.size(); ++i) {
    const auto o = static_cast<std::size_t>(owner[i]);
    if (kind == Reduce::amax) out.v[o] = std::max(out.v[o], x.v[i]);
    else out.v[o] += x.v[i];
    out.mag[o] += std::fabs(x.v[i]);
  }
  if (kind == Reduce::mean)
    for (std::size_t o = 0; o < out.v.size(); ++o) {
      out.v[o] /= static_cast<double>(n_red);  // 0 / 0 = NaN for an empty reduction
      out.mag[o] /= static_cast<double>(n_red);
    }
  if (kind == Reduce::amax) out.mag.assign(out.v.size(), 0.0);
  out.shape = reduced_shape(x.shape, mask, keepdims);
  return out;
}

/// The gradient of reduce(x, mask, kind, keepdims) given the adjoint g of its result: the adjoint
/// copied back over the reduced dimensions (divided by the count for mean; for amax only to the
/// positions holding the maximum, split evenly over ties).
inline Array reduce_adjoint(const Array& x, const std::vector<bool>& mask, Reduce kind, const Array& g) {
  const std::vector<std::int64_t> owner = reduce_owner(x.shape, mask);
  std::int64_t n_red = 1;
  for (std::size_t d = 0; d < x.shape.size(); ++d)
    if (mask[d]) n_red *= x.shape[d];
  Array out = zeros(x.shape);
  Array mx;
  std::vector<double> ties;
  if (kind == Reduce::amax) {
    mx = reduce(x, mask, Reduce::amax, true);
    ties.assign(mx.v.size(), 0.0);
    for (std::size_t i = 0; i < owner.size(); ++i)
      if (x.v[i] == mx.v[static_cast<std::size_t>(owner[i])]) ties[static_cast<std::size_t>(owner[i])] += 1;
  }
  for (std::size_t i = 0; i < owner.size(); ++i) {
    const auto o = static_cast<std::size_t>(owner[i]);
    double s = 1.0;
    if (kind == Reduce::mean) s = 1.0 / static_cast<double>(n_red);
    if (kind == Reduce::amax) s = x.v[i] == mx.v[o] ? 1.0 / ties[o] : 0.0;
    out.v[i] = g.v[o] * s;
    out.mag[i] = std::fabs(out.v[i]);
  }
  return out;
}

// ---- elementwise map with gradients -----------------------------------------------------------------

/// f(x, y, d): x[0..n) the arguments of one element; writes y[0..m) and d[j * n + k] = d y_j / d x_k.
using ElementFn = std::function<void(const double* x, double* y, double* d)>;

/// Values of an m-output elementwise function over the NumPy broadcast of `args` (a number is a
/// rank-0 array), and, when `adj` is given (one entry per output; an empty Array = no adjoint),
/// the gradient of sum_j <adj_j, y_j> with respect to every argument, summed over the dimensions
/// that argument was broadcast along.
struct MapResult {
  Dims shape;
  std::vector<Array> out;
  std::vector<Array> grad;
};

inline MapResult map(const ElementFn& f, int m, const std::vector<const Array*>& args,
                     const std::vector<Array>* adj = nullptr) {
  const std::size_t n = args.size();
  MapResult r;
  std::vector<Dims> shapes;
  for (const Array* a : args) shapes.push_back(a->shape);
  broadcast_shape(shapes, r.shape);
  for (int j = 0; j < m; ++j) r.out.push_back(zeros(r.shape));
  if (adj)
    for (const Array* a : args) r.grad.push_back(zeros(a->shape));
  const int rk = rank(r.shape);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rk) + 1), src(n);
  std::vector<double> x(n), y(static_cast<std::size_t>(m)), d(static_cast<std::size_t>(m) * n);
  for (std::int64_t i = 0; i < numel(r.shape); ++i) {
    unravel(i, r.shape, idx.data());
    for (std::size_t k = 0; k < n; ++k) {
      src[k] = broadcast_index(idx.data(), rk, args[k]->shape);
      x[k] = args[k]->v[static_cast<std::size_t>(src[k])];
    }
    std::fill(d.begin(), d.end(), 0.0);
    f(x.data(), y.data(), d.data());
    for (int j = 0; j < m; ++j) {
      r.out[static_cast<std::size_t>(j)].v[static_cast<std::size_t>(i)] = y[static_cast<std::size_t>(j)];
      r.out[static_cast<std::size_t>(j)].mag[static_cast<std::size_t>(i)] = std::fabs(y[static_cast<std::size_t>(j)]);
    }
    if (!adj) continue;
    for (int j = 0; j < m; ++j) {
      const Array& a = (*adj)[static_cast<std::size_t>(j)];
      if (a.v.empty()) continue;
      const double aj = a.v[static_cast<std::size_t>(i)];
      for (std::size_t k = 0; k < n; ++k) {
        const double t = aj * d[static_cast<std::size_t>(j) * n + k];
        r.grad[k].v[static_cast<std::size_t>(src[k])] += t;
        r.grad[k].mag[static_cast<std::size_t>(src[k])] += std::fabs(t);
      }
    }
  }
  return r;
}

}  // namespace fuzzref
