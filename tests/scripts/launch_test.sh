#!/usr/bin/env bash
# launch_test.sh CASE: scripts/launch's handling of its ranks, with plain programs as ranks (no GPU,
# no dualcast), for what test_distributed cannot see from inside a rank.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

count() { pgrep -fc "^$1 " || true; }

case "${1:-}" in
ranks_die_with_a_killed_launcher)
  # SIGKILL gives the launcher no chance to stop its ranks; the kernel must (PR_SET_PDEATHSIG), or a
  # rank left inside a collective keeps its GPU busy after every run that follows.
  marker="dualcast-launch-test-$$"
  python3 "$root/scripts/launch" --gpus 2 -- bash -c "exec -a $marker sleep 60" &
  launcher=$!
  for _ in $(seq 100); do [ "$(count "$marker")" = 2 ] && break; sleep 0.1; done
  [ "$(count "$marker")" = 2 ] || { echo "FAILED: the 2 ranks did not start"; kill -9 $launcher; exit 1; }
  kill -9 $launcher
  for _ in $(seq 50); do [ "$(count "$marker")" = 0 ] && break; sleep 0.1; done
  left=$(count "$marker")
  if [ "$left" != 0 ]; then
    pkill -9 -f "^$marker " || true
    echo "FAILED: $left rank(s) outlived the killed launcher"
    exit 1
  fi
  echo "PASSED: $1"
  ;;
*)
  echo "usage: launch_test.sh ranks_die_with_a_killed_launcher" >&2
  exit 2
  ;;
esac
