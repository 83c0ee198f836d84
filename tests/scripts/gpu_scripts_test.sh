#!/usr/bin/env bash
# gpu_scripts_test.sh CASE: the GPU-machine scripts (scripts/gpu-sanitize, scripts/gpu-check's
# verification record, scripts/record-gpu-verified) on a machine without a GPU: fake GoogleTest
# binaries in a fake build directory, and a fake compute-sanitizer and nvidia-smi on PATH whose
# findings the environment chooses (FAKE_ERRORS=tool:binary, FAKE_TOOLERR=tool:binary,
# FAKE_FAIL=binary, FAKE_NODEV=binary, FAKE_SLEEP=binary, FAKE_NOCUDA=binary: no CUDA call at all). tests/CMakeLists.txt runs each case as a
# ctest (GpuScripts.*).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-scripts-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
expect() {  # expect FILE REGEX: FILE has a line matching the extended regex
  grep -qE -- "$2" "$1" || { echo "---- $1:"; cat "$1"; fail "no line matching '$2' in $1"; }
}
expect_not() {
  if grep -qE -- "$2" "$1"; then echo "---- $1:"; cat "$1"; fail "a line matches '$2' in $1"; fi
}

# ---- the fakes -------------------------------------------------------------------------------------
mkdir -p "$tmp/bin" "$tmp/build/tests" "$tmp/build/experiments/x" "$tmp/build/tests/CMakeFiles"
fake_gtest() {  # fake_gtest PATH TEST...: a binary that lists, filters and "runs" these tests
  {
    echo '#!/usr/bin/env bash'
    printf 'all=(%s)\n' "${*:2}"
    cat <<'EOS'
name=$(basename "$0") list=0 filter=""
for a in "$@"; do
  case "$a" in --gtest_list_tests) list=1 ;; --gtest_filter=*) filter=${a#--gtest_filter=} ;; esac
done
sel=()
IFS=: read -r -a negative <<<"${filter#*-}"  # the filter's negative patterns (all it uses here)
for t in "${all[@]}"; do
  keep=1
  # shellcheck disable=SC2053
  for p in "${negative[@]}"; do [[ $filter == *-* ]] && [[ $t == $p ]] && keep=0; done
  [ $keep = 1 ] && sel+=("$t")
done
if [ $list = 1 ]; then
  for t in "${sel[@]}"; do echo "${t%%.*}."; echo "  ${t#*.}"; done
  exit 0
fi
if [ -n "${GTEST_TOTAL_SHARDS:-}" ]; then  # GoogleTest's sharding: test j runs in shard j % total
  mine=()
  for j in "${!sel[@]}"; do [ $((j % GTEST_TOTAL_SHARDS)) -eq "$GTEST_SHARD_INDEX" ] && mine+=("${sel[$j]}"); done
  sel=("${mine[@]}")
fi
[ "$name" = "${FAKE_SLEEP:-}" ] && sleep 30
echo "[==========] Running ${#sel[@]} tests from 1 test suite."
[ "$name" = "${FAKE_NODEV:-}" ] && printf 'x.cu:3: Skipped\nno CUDA device\n'
echo "[==========] ${#sel[@]} tests from 1 test suite ran. (1 ms total)"
if [ "$name" = "${FAKE_FAIL:-}" ]; then
  echo "[  PASSED  ] $(( ${#sel[@]} - 1 )) tests."
  echo "[  FAILED  ] 1 test, listed below:"
  exit 1
fi
echo "[  PASSED  ] ${#sel[@]} tests."
EOS
  } >"$1"
  chmod +x "$1"
}
fake_gtest "$tmp/build/tests/test_alpha" Alpha.HostOnly Devices/A.Sum/cpu Devices/A.Sum/cuda Devices/A.Max/cuda
fake_gtest "$tmp/build/experiments/x/test_beta" Devices/B.Step/cpu Devices/B.Step/cuda
fake_gtest "$tmp/build/tests/test_cpu_only" Devices/C.Only/cpu
fake_gtest "$tmp/build/tests/CMakeFiles/test_ignored" Ignored.Test
cat >"$tmp/bin/compute-sanitizer" <<'EOS'
#!/usr/bin/env bash
case "${1:-}" in
  --help) echo "--tool --error-exitcode --print-limit --require-cuda-init --target-processes --launch-timeout"
          echo "--racecheck-num-workers --report-api-errors"; exit 0 ;;
  --version) echo "NVIDIA (R) Compute Sanitizer, Version 2099.1.0 (fake)"; exit 0 ;;
esac
tool=memcheck
while [ $# -gt 0 ]; do
  case "$1" in --tool) tool=$2; shift 2 ;; --*) shift 2 ;; *) break ;; esac
done
name=$(basename "$1")
"$@"; rc=$?
if [ "${FAKE_NOCUDA:-}" = "$name" ]; then
  echo "========= Target application terminated before first instrumented API call"; exit $rc
fi
if [ "${FAKE_TOOLERR:-}" = "$tool:$name" ]; then echo "========= Error: Device not supported"; exit 255; fi
errs=0
if [ "${FAKE_ERRORS:-}" = "$tool:$name" ]; then echo "========= Invalid __global__ write of size 4 bytes"; errs=2; fi
if [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: $errs hazards displayed ($errs errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: $errs errors"
fi
[ $errs -eq 0 ] || exit 86
exit $rc
EOS
cat >"$tmp/bin/nvidia-smi" <<'EOS'
#!/usr/bin/env bash
[ "${1:-}" = -L ] && echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-1111-2222-3333-444444444444)"
EOS
chmod +x "$tmp/bin/compute-sanitizer" "$tmp/bin/nvidia-smi"
export PATH="$tmp/bin:$PATH"
unset OUT COMPUTE_SANITIZER FAKE_ERRORS FAKE_TOOLERR FAKE_FAIL FAKE_NODEV FAKE_SLEEP FAKE_NOCUDA
sanitize() { "$root/scripts/gpu-sanitize" --build-dir "$tmp/build" --log "$tmp/sanitize.log" "$@" >"$tmp/stdout" 2>&1; }

# ---- cases -----------------------------------------------------------------------------------------
case_dry_run_lists_every_tool_on_every_gpu_test_binary() {
  sanitize --dry-run || fail "exit $? from --dry-run"
  expect "$tmp/stdout" '^  test_alpha: 3 tests$'
  expect "$tmp/stdout" '^  test_beta: 1 tests$'
  expect "$tmp/stdout" 'skipped: test_cpu_only \(no test selected\)'
  expect_not "$tmp/stdout" 'test_ignored'
  [ "$(grep -c -- '--gtest_filter=-\\\*/cpu$' "$tmp/stdout")" -eq 4 ] ||
    fail "expected 4 commands without exclusions (memcheck and synccheck x 2 binaries)"
  # the documented exclusions and environment (scripts/gpu-sanitize, "Exclusions", "Environment by tool")
  [ "$(grep -c -- '--tool racecheck .*--gtest_filter=-\\\*/cpu:\\\*ConcurrentCallers\\\*$' "$tmp/stdout")" -eq 2 ] ||
    fail "expected 2 racecheck commands excluding *ConcurrentCallers*"
  [ "$(grep -c -- '--tool initcheck .*--gtest_filter=-\\\*/cpu:\\\*CaptureRecordsTheStepAndReplayRunsIt\\\*:' "$tmp/stdout")" -eq 2 ] ||
    fail "expected 2 initcheck commands excluding the graph memcpy tests"
  [ "$(grep -c -- 'DUALCAST_CUDNN_ALGO=heuristic .*--tool racecheck ' "$tmp/stdout")" -eq 2 ] ||
    fail "expected racecheck (only) to run with cuDNN's heuristics"
  expect_not "$tmp/stdout" 'DUALCAST_CUDNN_ALGO=heuristic .*--tool (memcheck|initcheck|synccheck) '
  for t in memcheck racecheck initcheck synccheck; do
    expect "$tmp/stdout" "--tool $t --error-exitcode 86 --print-limit 30 --require-cuda-init no --target-processes all .*test_alpha"
  done
  expect "$tmp/stdout" '--tool racecheck .*--racecheck-num-workers 2 '
  expect "$tmp/stdout" '--tool memcheck .*--report-api-errors no '
  expect "$tmp/stdout" 'DUALCAST_SANITIZE=1 .*DUALCAST_TEST_DATA=.*/tests/data'
  [ ! -e "$tmp/sanitize.log" ] || fail "--dry-run ran something"
}

case_clean_run_gives_one_clean_line_per_tool() {
  sanitize --summary "$tmp/summary" || fail "exit $? from a clean run"
  for t in memcheck racecheck initcheck synccheck; do
    expect "$tmp/summary" "^sanitize $t: clean, 2 binaries, 4 tests, [0-9]+ s$"
  done
  [ "$(wc -l <"$tmp/summary")" -eq 4 ] || fail "the summary has other lines"
  expect "$tmp/stdout" '^racecheck test_alpha: clean, 3 tests, [0-9]+ s$'
  expect "$tmp/sanitize.log" '^==== synccheck test_beta: clean'
  expect "$tmp/sanitize.log" '^========= RACECHECK SUMMARY: 0 hazards'
}

case_only_the_chosen_tools_and_binaries_run() {
  sanitize --tools memcheck,synccheck --binaries 'beta$' --summary "$tmp/summary" || fail "exit $?"
  expect "$tmp/summary" '^sanitize memcheck: clean, 1 binaries, 1 tests'
  expect "$tmp/summary" '^sanitize synccheck: clean, 1 binaries, 1 tests'
  expect_not "$tmp/summary" 'racecheck|initcheck'
  "$root/scripts/gpu-sanitize" --build-dir "$tmp/build" --tools memcheck,asan >/dev/null 2>&1
  [ $? -eq 2 ] || fail "an unknown tool is not a usage error"
  COMPUTE_SANITIZER=/nonexistent/compute-sanitizer "$root/scripts/gpu-sanitize" --build-dir "$tmp/build" >"$tmp/stdout" 2>&1
  [ $? -eq 2 ] || fail "a missing compute-sanitizer is not an error of its own"
  expect "$tmp/stdout" 'is compute-sanitizer installed'
}

case_large_binaries_are_split_into_shards_that_together_run_every_test() {
  sanitize --tools memcheck --shard-size 2 --summary "$tmp/summary" || fail "exit $? from a sharded run"
  expect "$tmp/stdout" '^  test_alpha: 3 tests in 2 shards$'
  expect "$tmp/stdout" '^memcheck test_alpha\[1/2\]: clean, 2 tests, [0-9]+ s$'
  expect "$tmp/stdout" '^memcheck test_alpha\[2/2\]: clean, 1 tests, [0-9]+ s$'
  expect "$tmp/stdout" '^memcheck test_beta: clean, 1 tests, [0-9]+ s$'
  expect "$tmp/summary" '^sanitize memcheck: clean, 2 binaries, 4 tests, [0-9]+ s$'
  sanitize --tools memcheck --shard-size 1 --max-shards 2 --dry-run || fail "exit $? from --dry-run"
  [ "$(grep -c 'GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=[01] .*test_alpha ' "$tmp/stdout")" -eq 2 ] || fail "expected test_alpha in 2 shards"
  expect_not "$tmp/stdout" 'GTEST_TOTAL_SHARDS=.*test_beta '  # one test: one process
  FAKE_ERRORS=memcheck:test_alpha sanitize --tools memcheck --shard-size 2 --summary "$tmp/summary"
  [ $? -eq 1 ] || fail "a finding in a shard passed"
  expect "$tmp/summary" '^sanitize memcheck: FAILED: test_alpha\[1/2\]: 2 errors, 0 warnings; test_alpha\[2/2\]: 2 errors'
  "$root/scripts/gpu-sanitize" --build-dir "$tmp/build" --shard-size x >/dev/null 2>&1
  [ $? -eq 2 ] || fail "a bad --shard-size is not a usage error"
}

case_a_binary_without_cuda_calls_is_clean_but_a_missing_summary_otherwise_fails() {
  FAKE_NOCUDA=test_beta sanitize --summary "$tmp/summary" || fail "exit $? with a host-only binary"
  expect "$tmp/stdout" '^memcheck test_beta: clean \(no CUDA call\), 1 tests, [0-9]+ s$'
  expect "$tmp/summary" '^sanitize memcheck: clean, 2 binaries, 4 tests'
  # The same line after a failing test is no excuse.
  FAKE_NOCUDA=test_beta FAKE_FAIL=test_beta sanitize --tools memcheck --summary "$tmp/summary"
  [ $? -eq 1 ] || fail "a failing host-only binary passed"
  expect "$tmp/summary" '^sanitize memcheck: FAILED: test_beta: 1 failed tests'
}

case_sanitizer_errors_fail_their_tool_and_show_the_findings() {
  FAKE_ERRORS=initcheck:test_beta sanitize --summary "$tmp/summary" && fail "exit 0 despite errors"
  expect "$tmp/summary" '^sanitize initcheck: FAILED: test_beta: 2 errors, 0 warnings; 2 binaries, 4 tests'
  expect "$tmp/summary" '^sanitize memcheck: clean'
  expect "$tmp/stdout" '\[initcheck test_beta\] ========= Invalid __global__ write'
  FAKE_ERRORS=racecheck:test_alpha sanitize --summary "$tmp/summary" && fail "exit 0 despite hazards"
  expect "$tmp/summary" '^sanitize racecheck: FAILED: test_alpha: 2 errors, 0 warnings'
}

case_tool_errors_failed_tests_and_missing_gpus_fail() {
  FAKE_TOOLERR=memcheck:test_alpha sanitize --summary "$tmp/summary" && fail "exit 0 despite a tool error"
  expect "$tmp/summary" '^sanitize memcheck: FAILED: test_alpha: tool error: Error: Device not supported'
  FAKE_FAIL=test_alpha sanitize --summary "$tmp/summary" && fail "exit 0 despite a failing test"
  expect "$tmp/summary" '^sanitize synccheck: FAILED: test_alpha: 1 failed tests'
  FAKE_NODEV=test_beta sanitize --summary "$tmp/summary" && fail "exit 0 when the GPU was not usable"
  expect "$tmp/summary" '^sanitize memcheck: FAILED: test_beta: GPU not usable under the tool \(1 tests skipped: no CUDA device\)'
}

case_runs_past_the_budget_are_stopped_and_fail() {
  FAKE_SLEEP=test_beta sanitize --budget 6 --summary "$tmp/summary" && fail "exit 0 despite timeouts"
  expect "$tmp/summary" '^sanitize memcheck: FAILED: test_beta: (timeout after [0-9]+ s|not run \(budget of 6 s spent\))'
  expect "$tmp/summary" '^sanitize racecheck: FAILED: test_beta: '
}

record_fields() {  # the record gpu-check wrote, checked line by line
  local r=$1 result=$2
  [ "$(head -n 1 "$r")" = "commit 0123abcd4567" ] || fail "first line of $r is not the commit"
  expect "$r" '^date: 20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$'
  expect "$r" '^gpus: 1 x NVIDIA H100 80GB HBM3$'
  expect "$r" '^run: scripts/gpu-check --no-build .*--sanitize'
  expect "$r" '^checks: sanitize:memcheck,racecheck,initcheck,synccheck$'
  expect "$r" "^gpu-check: $result$"
}

case_gpu_check_sanitize_writes_the_verification_record() {
  mkdir -p "$tmp/out"
  OUT=$tmp/out "$root/scripts/gpu-check" --no-build --build-dir "$tmp/build" --sanitize --commit 0123ABCD4567 \
    --time-limit 120 >"$tmp/stdout" 2>&1 || { cat "$tmp/stdout"; fail "gpu-check exited $?"; }
  record_fields "$tmp/out/gpu-verified.txt" PASSED
  expect "$tmp/out/gpu-verified.txt" '^sanitize memcheck: clean, 2 binaries, 4 tests'
  expect "$tmp/out/gpu-verified.txt" '^build +skipped +--no-build'
  [ -s "$tmp/out/sanitize.log" ] || fail "no sanitize.log under \$OUT"
  [ "$(find "$tmp/out" -type f | wc -l)" -le 8 ] || fail "more than 8 files under \$OUT"
  FAKE_ERRORS=memcheck:test_alpha OUT=$tmp/out "$root/scripts/gpu-check" --no-build --build-dir "$tmp/build" \
    --sanitize --commit 0123abcd4567 --time-limit 120 >"$tmp/stdout" 2>&1 && fail "gpu-check passed despite errors"
  record_fields "$tmp/out/gpu-verified.txt" FAILED
  expect "$tmp/out/gpu-verified.txt" '^sanitize memcheck: FAILED: test_alpha: 2 errors'
  # The sanitizer options reach scripts/gpu-sanitize (one shard a test: test_resnet under racecheck).
  OUT=$tmp/out "$root/scripts/gpu-check" --no-build --build-dir "$tmp/build" --sanitize --commit 0123abcd4567 \
    --sanitize-tools memcheck --sanitize-shard-size 2 --time-limit 120 >"$tmp/stdout" 2>&1 ||
    { cat "$tmp/stdout"; fail "gpu-check --sanitize-shard-size exited $?"; }
  expect "$tmp/stdout" '^  test_alpha: 3 tests in 2 shards$'
  expect "$tmp/out/gpu-verified.txt" '^sanitize memcheck: clean, 2 binaries, 4 tests'
  OUT=$tmp/out "$root/scripts/gpu-check" --commit not-a-sha >"$tmp/stdout" 2>&1
  [ $? -eq 2 ] || fail "a bad --commit is not a usage error"
  expect "$tmp/stdout" "--commit: 'not-a-sha' is not a commit id"
}

case_record_gpu_verified_installs_merges_and_refuses() {
  local repo=$tmp/repo rec=$tmp/rec
  mkdir -p "$repo" "$rec"
  cp "$root/README.md" "$repo/README.md"
  # Two runs of one commit (tests + benchmarks, then the sanitizer), as gpu-check writes them.
  cat >"$rec/tests.txt" <<'EOS'
commit 0123abcd4567
date: 2026-11-23T10:00:00Z
gpus: 1 x NVIDIA H100 80GB HBM3
nvcc: release 13.0, V13.0.88
run: scripts/gpu-check --commit 0123abcd4567 (preset release, 300 s)
checks: build tests benchmarks
build        ok       170 s
tests        ok       100% tests passed, 0 tests failed out of 322; 3 skipped; 30 s
benchmarks   ok       2 binaries found, 2 with results, 40 benchmarks (0 reported errors); 90 s
gpu-check: PASSED
EOS
  # The sanitizer split over two calls by tools (--sanitize-tools): two records of one commit.
  sed -e 's/^checks: .*/checks: build sanitize:memcheck,racecheck/' -e '/^tests\|^benchmarks/d' \
      -e 's/^gpu-check: PASSED/sanitize memcheck: clean, 12 binaries, 345 tests, 200 s\nsanitize racecheck: clean, 12 binaries, 345 tests, 300 s\ngpu-check: PASSED/' \
      "$rec/tests.txt" >"$rec/sanitize.txt"
  sed -e 's/memcheck/initcheck/g' -e 's/racecheck/synccheck/g' "$rec/sanitize.txt" >"$rec/sanitize2.txt"
  "$root/scripts/record-gpu-verified" --root "$repo" "$rec/tests.txt" >"$tmp/stdout" 2>&1 || { cat "$tmp/stdout"; fail "refused a good record"; }
  [ "$(head -n 1 "$repo/docs/gpu-verified.txt")" = "commit 0123abcd4567" ] || fail "docs record does not start with the commit"
  expect "$repo/README.md" '^Last verified on the GPU: commit `0123abcd4567` on 1 x NVIDIA H100 80GB HBM3 \(2026-11-23\): tests, benchmarks passed'
  # The before-stop hook's reading of it.
  [ "$(sed -n 's/^commit \([0-9a-f]\{7,40\}\).*/\1/p' "$repo/docs/gpu-verified.txt" | head -1)" = 0123abcd4567 ] ||
    fail "the hook's sed does not find the commit"
  "$root/scripts/record-gpu-verified" --root "$repo" "$rec/sanitize.txt" >"$tmp/stdout" 2>&1 || { cat "$tmp/stdout"; fail "refused the sanitizer record"; }
  [ "$(grep -c '^gpu-check: PASSED' "$repo/docs/gpu-verified.txt")" -eq 2 ] || fail "the two runs of one commit were not kept together"
  expect "$repo/README.md" 'tests, benchmarks, compute-sanitizer \(memcheck, racecheck\) passed'
  "$root/scripts/record-gpu-verified" --root "$repo" "$rec/sanitize2.txt" >/dev/null 2>&1 || fail "refused the second sanitizer record"
  [ "$(grep -c '^gpu-check: PASSED' "$repo/docs/gpu-verified.txt")" -eq 3 ] || fail "the sanitizer's second call did not add its run"
  expect "$repo/README.md" 'tests, benchmarks, compute-sanitizer \(memcheck, racecheck, initcheck, synccheck\) passed'
  # The same kind of run again replaces the earlier one.
  "$root/scripts/record-gpu-verified" --root "$repo" "$rec/sanitize.txt" >/dev/null 2>&1 || fail "refused a repeated record"
  [ "$(grep -c '^gpu-check: PASSED' "$repo/docs/gpu-verified.txt")" -eq 3 ] || fail "a repeated run was added, not replaced"
  # Refused: a failed run, a modified tree, an unknown commit, a build-only run; docs unchanged.
  cp "$repo/docs/gpu-verified.txt" "$tmp/before"
  sed 's/^gpu-check: PASSED/gpu-check: FAILED/' "$rec/tests.txt" >"$rec/failed.txt"
  sed 's/^checks: .*/&\nnote: tree modified: uncommitted changes to tracked files were tested, not the commit alone/' "$rec/tests.txt" >"$rec/dirty.txt"
  sed 's/^commit .*/commit unknown/' "$rec/tests.txt" >"$rec/unknown.txt"
  sed 's/^checks: .*/checks: build/' "$rec/tests.txt" >"$rec/buildonly.txt"
  for bad in failed dirty unknown buildonly; do
    "$root/scripts/record-gpu-verified" --root "$repo" "$rec/$bad.txt" >"$tmp/stdout" 2>&1
    [ $? -eq 1 ] || fail "the $bad record was not refused"
    expect "$tmp/stdout" 'refused'
  done
  cmp -s "$tmp/before" "$repo/docs/gpu-verified.txt" || fail "a refused record changed docs/gpu-verified.txt"
  # Another commit replaces the record.
  sed 's/0123abcd4567/89abcdef0123/' "$rec/tests.txt" >"$rec/next.txt"
  "$root/scripts/record-gpu-verified" --root "$repo" "$rec/next.txt" >/dev/null 2>&1 || fail "refused the next commit"
  [ "$(grep -c '^gpu-check: PASSED' "$repo/docs/gpu-verified.txt")" -eq 1 ] || fail "runs of the old commit were kept"
  expect "$repo/README.md" 'commit `89abcdef0123`'
  [ "$(grep -c '^Last verified on the GPU' "$repo/README.md")" -eq 1 ] || fail "the README line was duplicated"
}

"case_${1:?usage: gpu_scripts_test.sh CASE}" || exit 1
echo "PASSED: $1"
