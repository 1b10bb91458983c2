#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one pass. Run from the repository root on a GPU box:
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Writes into OUTDIR: gpu_tests.log (the real-NVML tests), gpu.json (`ups gpu --json`),
# precompute_run.json (a CUDA precompute with 4 workers), train_status.json (`ups status
# --json` of a 1-rank CUDA training run while it trains: torch and NVML memory side by side),
# train_run.json (its status at the end), doctor.json (full `ups doctor` on that data and
# cache), bench_precompute.json and bench_train.json (one JSON line each).
# Every step runs even when one before it failed; the exit code says whether any did.
set -u
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
ups() { "$py" -m ups "$@"; }
work=$(mktemp -d)
export UPS_RUNS_DIR="$work/runs" WANDB_MODE=offline PYTHONUNBUFFERED=1
failed=0
step() { echo "== $*" >&2; }
note() { echo "!! $*" >&2; failed=1; }

step "devices"
nvidia-smi -L || note "nvidia-smi failed"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"

step "real-GPU tests"
"$py" -m pytest -v -p no:cacheprovider tests/test_gpu_real.py tests/test_gpu.py "tests/test_metrics.py::test_cuda_loss_is_read_from_another_thread_without_waiting_for_the_gpu" >"$out/gpu_tests.log" 2>&1 || note "GPU tests failed"
tail -3 "$out/gpu_tests.log"

step "ups gpu"
ups gpu --json >"$out/gpu.json" || note "ups gpu failed"

step "CUDA precompute + 1-rank CUDA training"
ups data synth --task burgers1d --split train --samples 256 --root "$work/data" >/dev/null || note "synth failed"
ups launch precompute --root "$work/data" --tasks burgers1d --splits train --cache-dir "$work/cache" \
    --device cuda --num-workers 4 --json >"$out/precompute_run.json" || note "CUDA precompute failed"
run=$(ups launch train --cache-dir "$work/cache" --tasks burgers1d --config configs/train_gpu.yaml \
    --nproc 1 --steps 600 --detach --json | "$py" -c "import json,sys; print(json.load(sys.stdin)['run_id'])")
# While it trains, wait (deadline 120 s) for a status whose rank record carries GPU memory,
# then (deadline 300 s) for the run to end; it must end succeeded.
"$py" scripts/wait_train.py "$run" "$out" || note "CUDA training: see train_status.json / train_run.json"
ups doctor --json --root "$work/data" --cache-dir "$work/cache" >"$out/doctor.json" || note "ups doctor reported failures"

step "benchmarks"
"$py" scripts/bench_precompute.py --device cuda --limits --workers 1,2,4,8 >"$out/bench_precompute.json" || note "bench_precompute failed"
"$py" scripts/bench_train.py --device cuda >"$out/bench_train.json" || note "bench_train failed"
cat "$out"/bench_*.json
rm -rf "$work"
exit $failed
