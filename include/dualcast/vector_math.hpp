// vector_math.hpp: on the CPU, declares the SIMD variants of the C library functions that math.hpp
// calls (glibc's libmvec), so that GCC can vectorise the CPU broadcast tiles (kernels/broadcast_cpu.cuh)
// across their lanes. Host-only; empty for nvcc's device pass, other compilers and other C libraries.
//
// glibc declares these variants itself only under -ffast-math (bits/math-vector.h), which dualcast
// cannot use (inf and NaN must keep their meaning). The redeclarations below say two things about
// each function:
//  * simd("notinbranch"): a vector variant _ZGV<isa>N<lanes>v_<name> exists in libmvec (linked through
//    libm's linker script: AS_NEEDED libmvec.so.1);
//  * const: the call has no side effect. The scalar function may set errno on a range error; the
//    vector one never does. Declaring it const is what lets GCC's if-conversion evaluate a call that
//    sits in one branch of the user's functor for every lane and select the results afterwards (GCC
//    12 if-converts only const builtins). Values are not affected; errno after these calls is.
// Both apply to every call of these functions in a translation unit that includes dualcast: a loop
// of the user's own that the compiler vectorises may call libmvec too. glibc gives libmvec's error
// bound as 4 ulp; a sweep of the AVX2 float variants over [-120, 120] plus inf, NaN, +-0 and
// overflowing arguments (2026-11-25, glibc 2.36) found at most 3.5 ulp (logf; expf 2.5, tanhf 1.0)
// against a long double reference, powf(x, 1.7) up to 6 ulp, and every special value as the scalar
// function gives it; tests/test_cpu_simd.cu checks them against the scalar path. DUALCAST_CPU_SIMD=OFF
// in CMake turns all of it off.
#pragma once

#include <math.h>

#if defined(DUALCAST_CPU_SIMD) && DUALCAST_CPU_SIMD && !defined(__CUDA_ARCH__) && \
    defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#define DUALCAST_LIBMVEC 1
#else
#define DUALCAST_LIBMVEC 0
#endif

#if DUALCAST_LIBMVEC
#define DUALCAST_VECTOR_FN __attribute__((const, simd("notinbranch")))
extern "C" {
// glibc 2.22: exp, log, sin, cos, pow (float and double).
float expf(float) noexcept DUALCAST_VECTOR_FN;
double exp(double) noexcept DUALCAST_VECTOR_FN;
float logf(float) noexcept DUALCAST_VECTOR_FN;
double log(double) noexcept DUALCAST_VECTOR_FN;
float sinf(float) noexcept DUALCAST_VECTOR_FN;
double sin(double) noexcept DUALCAST_VECTOR_FN;
float cosf(float) noexcept DUALCAST_VECTOR_FN;
double cos(double) noexcept DUALCAST_VECTOR_FN;
float powf(float, float) noexcept DUALCAST_VECTOR_FN;
double pow(double, double) noexcept DUALCAST_VECTOR_FN;
#if __GLIBC_PREREQ(2, 35)
// glibc 2.35: the rest of what math.hpp calls.
float tanhf(float) noexcept DUALCAST_VECTOR_FN;
double tanh(double) noexcept DUALCAST_VECTOR_FN;
float expm1f(float) noexcept DUALCAST_VECTOR_FN;
double expm1(double) noexcept DUALCAST_VECTOR_FN;
float log1pf(float) noexcept DUALCAST_VECTOR_FN;
double log1p(double) noexcept DUALCAST_VECTOR_FN;
float tanf(float) noexcept DUALCAST_VECTOR_FN;
double tan(double) noexcept DUALCAST_VECTOR_FN;
float cbrtf(float) noexcept DUALCAST_VECTOR_FN;
double cbrt(double) noexcept DUALCAST_VECTOR_FN;
float erff(float) noexcept DUALCAST_VECTOR_FN;
double erf(double) noexcept DUALCAST_VECTOR_FN;
float erfcf(float) noexcept DUALCAST_VECTOR_FN;
double erfc(double) noexcept DUALCAST_VECTOR_FN;
float hypotf(float, float) noexcept DUALCAST_VECTOR_FN;
double hypot(double, double) noexcept DUALCAST_VECTOR_FN;
#endif
}
#undef DUALCAST_VECTOR_FN
#endif
