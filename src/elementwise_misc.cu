// elementwise_misc.cu: fma, clamp, select; comparisons and logical ops.
#include "elementwise_ops.hpp"

#include <type_traits>

#include "dualcast/parallel.hpp"

namespace dualcast {
using namespace detail::ew;

Var fma(const Var& a, const Var& b, const Var& c) { return apply(Fma{}, a, b, c); }

Var clamp(const Var& x, double lo, double hi) {
  DUALCAST_CHECK(lo <= hi, "clamp: lo=", lo, " exceeds hi=", hi, " (argument of shape ",
                 x.shape().str(), ")");
  return apply(Clamp{}, x, lo, hi);
}
Tensor clamp(const Tensor& x, double lo, double hi) { return clamp(Var(x), lo, hi).value(); }

Var select(const Tensor& mask, const Var& a, const Var& b) { return apply(Select{}, mask, a, b); }
Var select(const Tensor& mask, const Var& a, double b) { return apply(Select{}, mask, a, b); }
Var select(const Tensor& mask, double a, const Var& b) { return apply(Select{}, mask, a, b); }
Tensor select(const Tensor& mask, const Tensor& a, const Tensor& b) {
  return apply(Select{}, mask, Var(a), Var(b)).value();
}

// ---- comparisons --------------------------------------------------------------------------------
namespace {

enum class Cmp { eq, ne, lt, le, gt, ge, land, lor };

/// Compares elements of type T in type C: T itself for floats (a number operand is converted to T,
/// as in all mixed arithmetic), double for uint8 masks, so that `mask < 0.5` compares 0 and 1 with
/// 0.5 rather than with 0.5 truncated to an integer (and a negative number never wraps around).
template <class T, class C>
struct CompareBody {
  BroadcastIndexer<2> ix;
  const T* a;
  const T* b;
  C sa, sb;
  std::uint8_t* out;
  Cmp op;
  DUALCAST_HD void operator()(std::int64_t i) const {
    std::int64_t off[2];
    ix.offsets(i, off);
    const C x = a ? static_cast<C>(a[off[0]]) : sa;
    const C y = b ? static_cast<C>(b[off[1]]) : sb;
    bool r = false;
    switch (op) {
      case Cmp::eq: r = x == y; break;
      case Cmp::ne: r = x != y; break;
      case Cmp::lt: r = x < y; break;
      case Cmp::le: r = x <= y; break;
      case Cmp::gt: r = x > y; break;
      case Cmp::ge: r = x >= y; break;
      case Cmp::land: r = (x != C(0)) && (y != C(0)); break;
      case Cmp::lor: r = (x != C(0)) || (y != C(0)); break;
    }
    out[i] = r ? 1 : 0;
  }
};

/// An operand of a comparison: a tensor or a number.
struct Operand {
  Tensor t;
  double v = 0.0;
};

Tensor compare(const char* op_name, Cmp op, Operand a, Operand b) {
  const Tensor& ref = a.t.defined() ? a.t : b.t;
  check_defined(ref, op_name, "a");
  if (a.t.defined() && b.t.defined()) {
    DUALCAST_CHECK(a.t.device() == b.t.device(), op_name, ": arguments on different devices: ",
                   a.t.str(), " and ", b.t.str());
    if (a.t.dtype() != b.t.dtype()) {  // compare in the wider floating type
      const DType d = a.t.dtype() == DType::float64 || b.t.dtype() == DType::float64
                          ? DType::float64 : DType::float32;
      a.t = a.t.to(d);
      b.t = b.t.to(d);
    }
  }
  const Shape out_shape = a.t.defined() && b.t.defined()
                              ? broadcast_shapes(op_name, {{"a", a.t.shape()}, {"b", b.t.shape()}})
                              : ref.shape();
  Tensor out = Tensor::empty(out_shape, DType::uint8, ref.device());
  dispatch_all(ref.dtype(), op_name, [&](auto tag) {
    using T = decltype(tag);
    using C = std::conditional_t<std::is_same_v<T, std::uint8_t>, double, T>;
    CompareBody<T, C> body{};
    body.ix = make_indexer<2>(out_shape, {a.t.defined() ? a.t.shape() : Shape{},
                                          b.t.defined() ? b.t.shape() : Shape{}});
    body.a = a.t.defined() ? a.t.template data<T>() : nullptr;
    body.b = b.t.defined() ? b.t.template data<T>() : nullptr;
    if (!body.a) body.ix.access[0] = Access::scalar;
    if (!body.b) body.ix.access[1] = Access::scalar;
    const auto number = [](double v) -> C {
      if constexpr (std::is_same_v<C, T>) return static_cast<T>(v);
      else return v;
    };
    body.sa = number(a.v);
    body.sb = number(b.v);
    body.out = out.data<std::uint8_t>();
    body.op = op;
    parallel_for(ref.device(), out_shape.numel(), body);
  });
  return out;
}

}  // namespace

#define DUALCAST_DEFINE_COMPARISON(op, code)                                                       \
  Tensor operator op(const Tensor& a, const Tensor& b) { return compare(#op, code, {a}, {b}); }      \
  Tensor operator op(const Tensor& a, double b) { return compare(#op, code, {a}, {Tensor(), b}); }   \
  Tensor operator op(double a, const Tensor& b) { return compare(#op, code, {Tensor(), a}, {b}); }   \
  Tensor operator op(const Var& a, const Var& b) { return a.value() op b.value(); }               \
  Tensor operator op(const Var& a, double b) { return a.value() op b; }                           \
  Tensor operator op(double a, const Var& b) { return a op b.value(); }
DUALCAST_DEFINE_COMPARISON(==, Cmp::eq)
DUALCAST_DEFINE_COMPARISON(!=, Cmp::ne)
DUALCAST_DEFINE_COMPARISON(<, Cmp::lt)
DUALCAST_DEFINE_COMPARISON(<=, Cmp::le)
DUALCAST_DEFINE_COMPARISON(>, Cmp::gt)
DUALCAST_DEFINE_COMPARISON(>=, Cmp::ge)
#undef DUALCAST_DEFINE_COMPARISON

Tensor logical_and(const Tensor& a, const Tensor& b) { return compare("logical_and", Cmp::land, {a}, {b}); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return compare("logical_or", Cmp::lor, {a}, {b}); }
Tensor logical_not(const Tensor& a) { return compare("logical_not", Cmp::eq, {a}, {Tensor(), 0.0}); }

}  // namespace dualcast
