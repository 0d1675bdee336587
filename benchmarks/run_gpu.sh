#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, run the GPU tests (kernels
# compiled on CUDA, torch.compile, CUDA graphs, CPU == CUDA), then the rounding benchmark.
# Usage there: bash benchmarks/run_gpu.sh   (logs and tables under $OUT)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_random.py \
    ${GPU_TESTS_EXTRA:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
python3 benchmarks/bench_round.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_round.log" | tail -60
