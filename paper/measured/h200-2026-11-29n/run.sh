#!/bin/bash
# Run h200-2026-11-29n: whether dualcast._core exporting its entry point only (commit d39eeac) ends
# the crash of `import torch` after it that h200-2026-11-29m found, then test_dlpack with and without
# the loader's torch-first order. On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29n/run.sh dlpack
#   bash paper/measured/h200-2026-11-29n/run.sh loads
#     the 16-bit broadcast kernels' operands loaded as 32-bit words (kernels/broadcast.cuh) against
#     the kernels before (broadcast_before.cuh, built in a copy of the tree): workloads a and b in
#     bf16 at 4096^2 and 8192^2, two rounds each in turn, and both under Nsight Compute
#   bash paper/measured/h200-2026-11-29n/run.sh peers
#     after the change: a and b in bf16 with torch.compile of the same cells in bf16 (same run), and
#     in fp16; and a variant, not on main, whose 16-bit kernels take 16-byte packets (8 values a
#     chunk for K <= 6, built in a copy of the tree), a and b in bf16
set -u
source scripts/device-run.sh "${1:?dlpack}"
case $1 in
dlpack)
  dr_build dualcast_core
  export DUALCAST_CORE_DIR=$PWD/$B/python/dualcast PYTHONPATH=$PWD/python
  so=$(ls $DUALCAST_CORE_DIR/_core*.so)
  nm -D --defined-only "$so" > "$R/exports.txt" 2>&1; echo "exports: $(wc -l < "$R/exports.txt") ($(head -3 "$R/exports.txt" | tr '\n' ' '))"
  for order in "import ctypes; ctypes.CDLL('$so'); import torch; print(torch.ops.aten.add)" \
               "from dualcast import core; import torch; print(torch.ops.aten.add, core.available())"; do
    DUALCAST_CORE_TORCH_FIRST=0 timeout 60 python3 -X faulthandler -c "$order" > "$R/o.txt" 2>&1
    echo "rc=$? [$order] $(grep -m1 -E 'Fatal|Error' "$R/o.txt") $(tail -c 120 "$R/o.txt" | tr '\n' ' ')"
  done
  for first in 1 0; do
    DUALCAST_CORE_TORCH_FIRST=$first DUALCAST_CORE_REQUIRED=1 timeout 120 python3 -X faulthandler \
      python/tests/run.py --module test_dlpack > "$R/test_dlpack_first$first.log" 2>&1
    echo "test_dlpack torch-first=$first rc=$? at $((SECONDS - t0)) s"; grep -v "^ok" "$R/test_dlpack_first$first.log" | tail -15
  done
  dr_pack ;;
loads)
  rm -rf /tmp/base && mkdir -p /tmp/base && tar cf - --exclude=./build --exclude=./.git . | tar xf - -C /tmp/base
  cp paper/measured/h200-2026-11-29n/broadcast_before.cuh /tmp/base/kernels/broadcast.cuh
  (cd /tmp/base && cmake --preset release > "$R/configure_base.log" 2>&1 &&
     cmake --build --preset release -j8 --target hmlstm_experiment profile_broadcast > "$R/build_base.log" 2>&1) &
  cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j8 --target hmlstm_experiment profile_broadcast > "$R/build.log" 2>&1 ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  wait || true
  [ -x /tmp/base/$E ] || { echo "baseline build FAILED"; tail -30 "$R/build_base.log"; exit 1; }
  echo "built both in $((SECONDS - t0)) s"
  for round in 1 2; do
    for v in before after; do
      bin=$E; [ $v = before ] && bin=/tmp/base/$E
      timeout 90 $bin --workloads a,b --dims 4096,8192 --precision bf16 --no-graphs --reps 30 --warmup 5 \
        --out "$R/ab_${v}_$round" > "$R/ab_${v}_$round.log" 2>&1
      echo "$v round $round rc=$? at $((SECONDS - t0)) s"; grep -E "^[ab] [0-9]" "$R/ab_${v}_$round.log"
    done
  done
  for v in before after; do
    b=$B; [ $v = before ] && b=/tmp/base/$B
    timeout 100 python3 scripts/ncu-broadcast --build $b --out "$R/ncu_$v" --label bf16-$v --dtype bfloat16 \
      --configs a:4096,b:4096 > "$R/ncu_$v.log" 2>&1
    echo "ncu $v rc=$?"; tail -5 "$R/ncu_$v.log"
  done
  dr_pack ;;
peers)
  rm -rf /tmp/var && mkdir -p /tmp/var && tar cf - --exclude=./build --exclude=./.git . | tar xf - -C /tmp/var
  sed -i 's/static constexpr int V = chunk_width<T, K>;/static constexpr int V = is_half_v<S> \&\& K <= 6 ? 8 : chunk_width<T, K>;/; s/static constexpr int V = STORE ? chunk_width<T, K> : recompute_chunk_width<T, K>;/static constexpr int V = is_half_v<S> \&\& K <= 6 ? 8 : STORE ? chunk_width<T, K> : recompute_chunk_width<T, K>;/' /tmp/var/kernels/broadcast.cuh
  diff kernels/broadcast.cuh /tmp/var/kernels/broadcast.cuh > "$R/variant.diff"
  (cd /tmp/var && cmake --preset release > /dev/null 2>&1 &&
     cmake --build --preset release -j8 --target hmlstm_experiment > "$R/build_var.log" 2>&1) &
  cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j8 --target hmlstm_experiment > "$R/build.log" 2>&1 ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  wait || true
  echo "built both in $((SECONDS - t0)) s ($(wc -l < "$R/variant.diff") diff lines)"
  timeout 90 $E --workloads a,b --dims 4096,8192 --precision fp16 --no-graphs --reps 30 --warmup 5 \
    --out "$R/ab_fp16" > "$R/ab_fp16.log" 2>&1
  echo "fp16 rc=$? at $((SECONDS - t0)) s"; grep -E "^[ab] [0-9]" "$R/ab_fp16.log"
  if [ -x /tmp/var/$E ]; then
    timeout 90 /tmp/var/$E --workloads a,b --dims 4096,8192 --precision bf16 --no-graphs --reps 30 --warmup 5 \
      --out "$R/ab_bf16_variant16B" > "$R/ab_bf16_variant16B.log" 2>&1
    echo "variant (16-byte packets) bf16 rc=$? at $((SECONDS - t0)) s"; grep -E "^[ab] [0-9]" "$R/ab_bf16_variant16B.log"
  else echo "variant build FAILED"; tail -20 "$R/build_var.log"; fi
  timeout 220 $E --workloads a,b --dims 4096,8192 --precision bf16 --no-graphs --reps 30 --warmup 5 \
    --peers --peer-methods compile --out "$R/ab_bf16" > "$R/ab_bf16.log" 2>&1
  echo "bf16 with torch.compile rc=$? at $((SECONDS - t0)) s"; grep -E "^[ab] [0-9]" "$R/ab_bf16.log"
  dr_pack ;;
esac
