#!/bin/bash
# One device call for dualcast.torch (issue 33) on a GPU machine, after the library is built
# (scripts/gpu-check --build-only; the native timing needs build/release): the Python suite on the
# GPU, workload a and b three ways (native, from PyTorch, torch.compile) in one run, the costs outside
# the kernels, Nsight Compute of the two kernels, and the PyTorch HM-LSTM training run (the dualcast
# and torch.compile cells; the eager cell is slowest and adds nothing to compare). Results go
# to $OUT/torch (or build/torch-gpu-run), one tarball's worth.
#   bash experiments/torch_elementwise/gpu_run.sh [--steps N]
set -u
steps=300
[ "${1:-}" = "--steps" ] && steps=$2
R=${OUT:-build/torch-gpu-run}/torch
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
echo "== python tests"; timeout 300 python3 python/tests/run.py > "$R/python_tests.log" 2>&1; echo "rc=$?"
grep -E "^FAIL|python tests" "$R/python_tests.log"
E=build/release/experiments/hmlstm/hmlstm_experiment
if [ -x "$E" ]; then
  echo "== workload a and b: native, from PyTorch, torch.compile"
  timeout 300 "$E" --workloads a,b --dims 4096,8192 --peers --peer-methods compile,torch_dualcast \
    --out "$R/ab" > "$R/ab.log" 2>&1; echo "rc=$?"; grep -E "^[ab] (4096|8192)" "$R/ab.log"
fi
echo "== overhead"; timeout 120 python3 experiments/torch_elementwise/overhead.py > "$R/overhead.json" 2> "$R/overhead.err"
echo "rc=$?"; tr -d '\n ' < "$R/overhead.json"; echo
echo "== ncu"
cat > "$R/ncu_a.py" <<'PY'
import sys, torch
sys.path.insert(0, "python")
from dualcast.torch import elementwise
sys.path.insert(0, "experiments/peers")
from peer_torch import DUALCAST_CELL_A
cell = elementwise(DUALCAST_CELL_A, inputs="z zb c f i g", differentiable="c f i g")
n = 8192
z, zb = [(torch.rand(n, 1, device="cuda") < 0.5).float() for _ in range(2)]
xs = [torch.randn(n, n, device="cuda", requires_grad=True) for _ in range(4)]
for _ in range(3):
    torch.autograd.grad(cell(z, zb, *xs), xs, torch.ones(n, n, device="cuda"))
torch.cuda.synchronize()
PY
timeout 120 ncu -k regex:dualcast_jit --launch-skip 4 --launch-count 2 --metrics \
  gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__inst_executed.sum \
  python3 "$R/ncu_a.py" > "$R/ncu.txt" 2>&1; echo "rc=$?"
grep -E "duration|dram__|inst_executed" "$R/ncu.txt"
echo "== PyTorch HM-LSTM, $steps steps"
timeout 400 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps "$steps" --out "$R/train.json" \
  > "$R/train.log" 2>&1; echo "rc=$?"; tail -5 "$R/train.log"
