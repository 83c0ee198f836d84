#!/usr/bin/env bash
# run.sh: the install/consumer check (ctest: InstallConsumer.BuildsAgainstInstalledPackage).
# Installs a finished dualcast build into a temporary prefix, configures tests/consumer against it
# with find_package(dualcast CONFIG) (CMAKE_PREFIX_PATH = that prefix, CUDA on when the build has
# CUDA and nvcc is present), builds it and runs what it built, checking the output.
#
# usage: run.sh --cmake CMAKE --build-dir DIR [--config CFG] [--generator GEN] [--cxx CXX]
#               [--with-cuda 0|1] [--cuda-compiler NVCC] [--cuda-archs A,B] [--keep]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmake=cmake build_dir="" config=Release generator="" cxx="" with_cuda=0 nvcc="" archs="" keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cmake) cmake=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --generator) generator=$2; shift 2 ;;
    --cxx) cxx=$2; shift 2 ;;
    --with-cuda) with_cuda=$2; shift 2 ;;
    --cuda-compiler) nvcc=$2; shift 2 ;;
    --cuda-archs) archs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$build_dir" ] || { echo "run.sh: --build-dir is required" >&2; exit 2; }
[ -n "$config" ] || config=Release

work=$(mktemp -d "${TMPDIR:-/tmp}/dualcast-consumer.XXXXXX")
if [ "$keep" = 1 ]; then echo "run.sh: keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
prefix=$work/prefix

step() { echo "---- run.sh: $*"; }

step "install $build_dir -> $prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" --config "$config" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "run.sh: FAILED: cmake --install" >&2; exit 1; }
for f in include/dualcast/dualcast.hpp include/dualcast/kernels/parallel_for.cuh; do
  [ -f "$prefix/$f" ] || { echo "run.sh: FAILED: $f not installed" >&2; exit 1; }
done
config_file=$(find "$prefix" -name dualcastConfig.cmake -print -quit)
[ -n "$config_file" ] || { echo "run.sh: FAILED: dualcastConfig.cmake not installed" >&2; exit 1; }

# CUDA in the consumer only where the package has its CUDA backend and nvcc exists here.
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then nvcc=$(command -v nvcc || true); fi
use_cuda=OFF
if { [ "$with_cuda" = 1 ] || [ "$with_cuda" = ON ]; } && [ -n "$nvcc" ]; then use_cuda=ON; fi

args=(-S "$here" -B "$work/build" -DCMAKE_BUILD_TYPE="$config" -DCMAKE_PREFIX_PATH="$prefix"
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCONSUMER_WITH_CUDA=$use_cuda)
if [ -n "$generator" ]; then args+=(-G "$generator"); fi
if [ -n "$cxx" ]; then args+=(-DCMAKE_CXX_COMPILER="$cxx"); fi
if [ $use_cuda = ON ]; then
  args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  if [ -n "$archs" ]; then args+=(-DCMAKE_CUDA_ARCHITECTURES="${archs//,/;}"); fi
fi
step "configure consumer (CUDA $use_cuda)"
"$cmake" "${args[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; echo "run.sh: FAILED: configuring the consumer" >&2; exit 1; }
grep -E "^-- consumer:" "$work/configure.log" || true
# It must have found the package just installed, not some other dualcast.
grep -qF -- "from $prefix/" "$work/configure.log" ||
  { cat "$work/configure.log"; echo "run.sh: FAILED: dualcast not found in $prefix" >&2; exit 1; }

step "build consumer"
"$cmake" --build "$work/build" --config "$config" -j "$(nproc 2>/dev/null || echo 2)" \
  >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; echo "run.sh: FAILED: building the consumer" >&2; exit 1; }

find_exe() { find "$work/build" -type f -name "$1" -perm -u+x -print -quit; }

step "run consumer_host"
host_exe=$(find_exe consumer_host)
out=$("$host_exe" 2>&1) || { echo "$out"; echo "run.sh: FAILED: consumer_host exited non-zero" >&2; exit 1; }
echo "$out"
grep -q "^dualcast consumer: OK$" <<<"$out" ||
  { echo "run.sh: FAILED: consumer_host did not print its OK line" >&2; exit 1; }

if [ $use_cuda = ON ]; then
  step "run consumer_kernel"
  kernel_exe=$(find_exe consumer_kernel)
  out=$("$kernel_exe" 2>&1) || { echo "$out"; echo "run.sh: FAILED: consumer_kernel exited non-zero" >&2; exit 1; }
  echo "$out"
  grep -q "^kernel_user: cpu OK$" <<<"$out" ||
    { echo "run.sh: FAILED: consumer_kernel did not print its OK line" >&2; exit 1; }
fi
echo "run.sh: consumer built against the installed package and ran: PASS"
