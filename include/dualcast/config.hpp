// config.hpp: the portability macro, version and feature macros shared by every dualcast header.
#pragma once

#define DUALCAST_VERSION_MAJOR 0
#define DUALCAST_VERSION_MINOR 1
#define DUALCAST_VERSION_PATCH 0

// DUALCAST_HD marks every function that must run both on the host and inside a CUDA kernel. Under a
// host compiler it is empty, so the same code is compiled and tested as plain C++.
#if defined(__CUDACC__)
#define DUALCAST_HD __host__ __device__
#define DUALCAST_DEVICE __device__
// Forced inline in kernels only, where a call would spill the chunk's arrays to local memory. On
// the host GCC decides as in a host-compiled file: the SIMD tiles inline all of it anyway
// (flatten), and forcing every chunk function into every CPU loop that uses it was 30% of the host
// compile of a broadcast-heavy file (docs/design.md, "Build time").
#if defined(__CUDA_ARCH__)
#define DUALCAST_INLINE __forceinline__
#else
#define DUALCAST_INLINE inline
#endif
#else
#define DUALCAST_HD
#define DUALCAST_DEVICE
#define DUALCAST_INLINE inline
#endif

// DUALCAST_WITH_CUDA is defined (to 1) by the build when the library was compiled with its CUDA
// backend. A translation unit compiled by a host compiler may still run work on the GPU through the
// library's precompiled kernels; only templates over user functions need nvcc.
#ifndef DUALCAST_WITH_CUDA
#define DUALCAST_WITH_CUDA 0
#endif

// DUALCAST_UNROLL asks every compiler to unroll a loop with a compile-time trip count (so that
// arrays indexed by it stay in registers under nvcc), without unknown-pragma warnings elsewhere.
#ifndef DUALCAST_UNROLL
#if defined(__CUDA_ARCH__) || defined(__clang__)
#define DUALCAST_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define DUALCAST_UNROLL
#elif defined(__GNUC__)
#define DUALCAST_UNROLL _Pragma("GCC unroll 16")
#else
#define DUALCAST_UNROLL
#endif
#endif

// True inside the device pass of nvcc, where host-only code must not be instantiated.
#if defined(__CUDA_ARCH__)
#define DUALCAST_DEVICE_PASS 1
#else
#define DUALCAST_DEVICE_PASS 0
#endif
