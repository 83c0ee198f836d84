"""dualcast.results: the C++ text of what a generated kernel's body returns (part of dualcast.jit's
prelude): Out on dual numbers for the dual and gradient kernels, and on Num, a plain number with a
dual's rules, for the values kernels (Spec.values())."""

# What the body's results are. A dual kernel evaluates on Dual<T, K>; a values kernel
# (Spec.values(): the recompute policy's forward) on plain T, with D naming T, so that the compiler
# computes no derivative nobody stores (the C++ library's DUAL=false bodies).
DUAL_RESULT = """using D = dualcast::Dual<T, K>;

// Field by field, never as a block copy: GCC keeps such a dual in registers across the lanes of a
// CPU tile, where a struct copy is a memory reference that stops it vectorising (dual.hpp's rule).
struct Out {
  D v;
  DUALCAST_HD DUALCAST_INLINE Out(const D& d) {
    v.val = d.val;
DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) v.d[k] = d.d[k];
  }
  template <class A, std::enable_if_t<std::is_arithmetic_v<A>, int> = 0>
  DUALCAST_HD DUALCAST_INLINE Out(A a) {
    v.val = static_cast<T>(a);
DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) v.d[k] = T(0);
  }
};"""
VALUE_RESULT = """// A differentiated input as a plain number with a dual's rules, so that the values kernel computes
// exactly the values of the dual kernel: a number of another type next to it is converted to T
// first (x * 0.1 multiplies by 0.1f for float T, as Dual<float, K> does, not in double),
// comparisons and functions go through T, and partial() does not compile (a dual-only notion).
struct Num {
  T v;
};
using D = Num;
template <class S>
constexpr bool num_scalar = std::is_arithmetic_v<S>;
#define DUALCAST_NUM_BINARY(op)                                                                     \
  DUALCAST_HD DUALCAST_INLINE Num operator op(Num a, Num b) { return {a.v op b.v}; }                \
  template <class S, std::enable_if_t<num_scalar<S>, int> = 0>                                      \
  DUALCAST_HD DUALCAST_INLINE Num operator op(Num a, S s) { return {a.v op static_cast<T>(s)}; }    \
  template <class S, std::enable_if_t<num_scalar<S>, int> = 0>                                      \
  DUALCAST_HD DUALCAST_INLINE Num operator op(S s, Num a) { return {static_cast<T>(s) op a.v}; }    \
  DUALCAST_HD DUALCAST_INLINE Num& operator op##=(Num& a, Num b) { a.v = a.v op b.v; return a; }    \
  template <class S, std::enable_if_t<num_scalar<S>, int> = 0>                                      \
  DUALCAST_HD DUALCAST_INLINE Num& operator op##=(Num& a, S s) { a.v = a.v op static_cast<T>(s); return a; }
DUALCAST_NUM_BINARY(+)
DUALCAST_NUM_BINARY(-)
DUALCAST_NUM_BINARY(*)
DUALCAST_NUM_BINARY(/)
#undef DUALCAST_NUM_BINARY
DUALCAST_HD DUALCAST_INLINE Num operator+(Num a) { return a; }
DUALCAST_HD DUALCAST_INLINE Num operator-(Num a) { return {-a.v}; }
#define DUALCAST_NUM_COMPARE(op)                                                                    \
  DUALCAST_HD DUALCAST_INLINE bool operator op(Num a, Num b) { return a.v op b.v; }                 \
  template <class S, std::enable_if_t<num_scalar<S>, int> = 0>                                      \
  DUALCAST_HD DUALCAST_INLINE bool operator op(Num a, S s) { return a.v op static_cast<T>(s); }     \
  template <class S, std::enable_if_t<num_scalar<S>, int> = 0>                                      \
  DUALCAST_HD DUALCAST_INLINE bool operator op(S s, Num a) { return static_cast<T>(s) op a.v; }
DUALCAST_NUM_COMPARE(==)
DUALCAST_NUM_COMPARE(!=)
DUALCAST_NUM_COMPARE(<)
DUALCAST_NUM_COMPARE(<=)
DUALCAST_NUM_COMPARE(>)
DUALCAST_NUM_COMPARE(>=)
#undef DUALCAST_NUM_COMPARE

// The library's functions on a Num: its value through math.hpp's function of T; numbers mixed in
// are converted to T first. (Declared with math.hpp's own, which these would otherwise hide.)
DUALCAST_HD DUALCAST_INLINE T as_t(Num a) { return a.v; }
template <class S, std::enable_if_t<num_scalar<S>, int> = 0>
DUALCAST_HD DUALCAST_INLINE T as_t(S s) { return static_cast<T>(s); }
template <class... A>
constexpr bool any_num = (std::is_same_v<A, Num> || ...);
template <class... A>
constexpr bool num_args = any_num<A...> && ((std::is_same_v<A, Num> || num_scalar<A>) && ...);
#define DUALCAST_NUM_UNARY(f)                                                                       \
  using dualcast::f;                                                                                \
  DUALCAST_HD DUALCAST_INLINE Num f(Num a) { return {dualcast::f(a.v)}; }
DUALCAST_NUM_UNARY(abs)
DUALCAST_NUM_UNARY(cbrt)
DUALCAST_NUM_UNARY(cos)
DUALCAST_NUM_UNARY(erf)
DUALCAST_NUM_UNARY(exp)
DUALCAST_NUM_UNARY(expm1)
DUALCAST_NUM_UNARY(gelu)
DUALCAST_NUM_UNARY(log)
DUALCAST_NUM_UNARY(log1p)
DUALCAST_NUM_UNARY(relu)
DUALCAST_NUM_UNARY(sigmoid)
DUALCAST_NUM_UNARY(sin)
DUALCAST_NUM_UNARY(softplus)
DUALCAST_NUM_UNARY(sqrt)
DUALCAST_NUM_UNARY(tan)
DUALCAST_NUM_UNARY(tanh)
#undef DUALCAST_NUM_UNARY
#define DUALCAST_NUM_BINARY_FN(f)                                                                   \
  using dualcast::f;                                                                                \
  template <class A, class B, std::enable_if_t<num_args<A, B>, int> = 0>                            \
  DUALCAST_HD DUALCAST_INLINE Num f(A a, B b) { return {dualcast::f(as_t(a), as_t(b))}; }
DUALCAST_NUM_BINARY_FN(pow)
DUALCAST_NUM_BINARY_FN(hypot)
DUALCAST_NUM_BINARY_FN(min)
DUALCAST_NUM_BINARY_FN(max)
#undef DUALCAST_NUM_BINARY_FN
using dualcast::clamp;
template <class X, class L, class H, std::enable_if_t<num_args<X, L, H>, int> = 0>
DUALCAST_HD DUALCAST_INLINE Num clamp(X x, L lo, H hi) { return {dualcast::clamp(as_t(x), as_t(lo), as_t(hi))}; }
using dualcast::fma;
template <class A, class B, class C, std::enable_if_t<num_args<A, B, C>, int> = 0>
DUALCAST_HD DUALCAST_INLINE Num fma(A a, B b, C c) { return {dualcast::fma(as_t(a), as_t(b), as_t(c))}; }
using dualcast::select;
template <class A, class B, std::enable_if_t<num_args<A, B>, int> = 0>
DUALCAST_HD DUALCAST_INLINE Num select(bool c, A a, B b) { return {c ? as_t(a) : as_t(b)}; }
using dualcast::value;
DUALCAST_HD DUALCAST_INLINE T value(Num a) { return a.v; }
using dualcast::partial;
T partial(Num, int) = delete;  // a values kernel has no partials: the dual kernel runs instead

struct Out {
  T v;
  DUALCAST_HD DUALCAST_INLINE Out(Num n) : v(n.v) {}
  template <class A, std::enable_if_t<std::is_arithmetic_v<A>, int> = 0>
  DUALCAST_HD DUALCAST_INLINE Out(A a) : v(static_cast<T>(a)) {}
};"""
