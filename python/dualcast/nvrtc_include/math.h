// NVRTC has no C library. Its float and double math functions are built in; dualcast's math.hpp also
// names the long double ones, in template branches never instantiated on the GPU, and needs them
// declared.
#pragma once
long double fabsl(long double);
long double cbrtl(long double);
long double cosl(long double);
long double sinl(long double);
long double tanl(long double);
long double tanhl(long double);
long double erfl(long double);
long double erfcl(long double);
long double expl(long double);
long double expm1l(long double);
long double logl(long double);
long double log1pl(long double);
long double sqrtl(long double);
long double hypotl(long double, long double);
long double powl(long double, long double);
long double fmaxl(long double, long double);
long double fminl(long double, long double);
long double fmal(long double, long double, long double);
