#!/usr/bin/env bash
# The GPU machine's runs, from the repository root (through the device tool; the peers'
# wheels carried in .whl: torchao, heavyball, gfloat, array_api_compat, more_itertools).
#
#   bash benchmarks/run_gpu.sh tests   the test suite on the GPU: every test under tests/
#                                      (kernels compiled on CUDA against the PyTorch path,
#                                      torch.compile, CUDA graphs, CPU == CUDA, the hardware
#                                      presets on CUDA; two-GPU tests where there are two),
#                                      8 pytest-xdist workers where xdist is installed
#   bash benchmarks/run_gpu.sh bench   every benchmark script (rows, JSON logs), then check.py
#   bash benchmarks/run_gpu.sh         both
#
# Environment:
#   GPU_TESTS="tests/kernels ..."      what pytest runs (default: tests)
#   BENCHES="bench_cast bench_optim"   which scripts run (default: all below)
#   BENCH_ARGS="--only bf16*,copy*"    options every script takes (harness.py's)
#   BENCH_ARGS_bench_cast="..."        options for one script (its own, e.g. --gfloat-log2n)
#   BASELINE_SRC=path/to/src           run each script again right after, on that source tree
#                                      (PYTHONPATH; --tag baseline --ours-only), then
#                                      compare.py: before and after in one call
#   BENCH_COMMIT, BASELINE_COMMIT      the commits the rows record (no .git travels)
#
# Under $OUT (at most 8 files come back): gpu_tests.log, bench.log (every script's
# output), summary.txt (check.py on this run's rows, then compare.py), results.tar.gz:
# rows/ (this run's rows, <capability>.csv), baseline/ (the baseline's) and the JSON logs.
# Then, here: tar xzf results.tar.gz -C out/gpu && python benchmarks/rows.py merge
# out/gpu/rows && python benchmarks/report.py (the committed rows and RESULTS.md).
# Exit status: pytest's, or 1 where check.py finds a FAIL.
set -u
OUT=${OUT:-/tmp/out}
RESULTS=${RESULTS:-/tmp/bench-results}
mkdir -p "$OUT" "$RESULTS"
. "$(dirname "$0")/gpu_stages.sh"
install_carried_wheels
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0
set -f  # patterns in BENCH_ARGS (--only bf16*) reach the scripts as written

if [ "${1:-all}" != bench ]; then
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    # shellcheck disable=SC2086  # word splitting wanted: options and paths
    # -v: each test's outcome on a line of its own as it ends, so that the names of the
    # failures survive a run cut short (a cut xdist run prints no summary)
    PYTHONPATH=/tmp/site:src python3 -m pytest -v -rf --tb=short -p no:cacheprovider \
        $workers ${GPU_TESTS:-tests} >"$OUT/gpu_tests.log" 2>&1
    status=$?
    grep -a -E "^(\[gw[0-9]+\] \[ *[0-9]+%\] )?(FAILED|ERROR) " "$OUT/gpu_tests.log" | sort -u | head -n 40
    tail -n 3 "$OUT/gpu_tests.log"
fi

if [ "${1:-all}" != tests ]; then
    for bench in ${BENCHES:-bench_cast bench_optim bench_host bench_launch bench_stream_floor bench_blocks bench_nn bench_model bench_gaussws bench_cpu}; do
        own="BENCH_ARGS_$bench"
        started=$SECONDS
        # shellcheck disable=SC2086
        BENCH_COMMIT=${BENCH_COMMIT:-} PYTHONPATH=/tmp/site:src python3 "benchmarks/$bench.py" \
            --out "$RESULTS" --results "$RESULTS/rows" ${BENCH_ARGS:-} ${!own:-} \
            >>"$OUT/bench.log" 2>&1
        echo "$bench: exit $? after $((SECONDS - started)) s"
        if [ -n "${BASELINE_SRC:-}" ]; then
            started=$SECONDS
            # shellcheck disable=SC2086
            BENCH_COMMIT=${BASELINE_COMMIT:-baseline} PYTHONPATH="/tmp/site:$BASELINE_SRC" \
                python3 "benchmarks/$bench.py" --out "$RESULTS" --tag baseline --ours-only \
                --results "$RESULTS/baseline" \
                ${BENCH_ARGS:-} ${!own:-} >>"$OUT/bench.log" 2>&1
            echo "$bench (baseline $BASELINE_SRC): exit $? after $((SECONDS - started)) s"
        fi
    done
    python3 benchmarks/check.py "$RESULTS/rows" >"$OUT/summary.txt" 2>&1 || status=1
    if [ -n "${BASELINE_SRC:-}" ]; then
        python3 benchmarks/compare.py "$RESULTS/baseline" "$RESULTS/rows" >>"$OUT/summary.txt" 2>&1
    fi
    tar czf "$OUT/results.tar.gz" -C "$RESULTS" .
    cat "$OUT/summary.txt"
fi
exit $status
