#!/usr/bin/env bash
# On the GPU machine: install the carried wheels, then `tests` runs the GPU tests (every
# Triton kernel compiled on CUDA against the PyTorch path, torch.compile, CUDA graphs,
# CPU == CUDA, the hardware presets on CUDA tensors; the two-GPU tests where there are two)
# and `bench` the rounding and optimizer benchmarks and the optimizer's streaming floor; no
# argument runs both.
# Usage there: bash benchmarks/run_gpu.sh [tests|bench]   (logs and tables under $OUT)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${1:-all}" != bench ]; then
    python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_random.py \
        tests/test_optim_kernel.py tests/test_matmul_kernel.py tests/test_launch.py \
        tests/test_hardware.py tests/test_devices.py ${GPU_TESTS_EXTRA:-} 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -25
fi
if [ "${1:-all}" != tests ]; then
    python3 benchmarks/bench_round.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/bench_round.log" | tail -40
    python3 benchmarks/bench_optim.py --out "$OUT" 2>&1 | tee "$OUT/bench_optim.log" | tail -45
    python3 benchmarks/bench_stream_floor.py 2>&1 | tee "$OUT/bench_stream_floor.log" | tail -12
fi
