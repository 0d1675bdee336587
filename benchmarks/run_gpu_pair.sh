#!/usr/bin/env bash
# The NVFP4 operand kernels' GPU check after a change to them (issue 42), from the
# repository root (the peers' wheels carried in .whl, as for run_gpu.sh), in parts that
# run in the order given (all four by default):
#
#   bash benchmarks/run_gpu_pair.sh tests pair layer    # one device call
#   bash benchmarks/run_gpu_pair.sh model               # a second one
#
# - tests: their GPU tests (PAIR_TESTS: the kernels, the blocks, the layers' step routes);
# - pair: benchmarks/bench_pair.py with its variants (PAIR_ARGS: the unstaged stores), the
#   pair's floor and the separate path in the same run;
# - layer: benchmarks/bench_nn.py's 8192 x 4096 x 4096 layer step (bf16, nvfp4(), the
#   pow2 flavour, torchao's compiled emulation);
# - model: benchmarks/bench_model.py's GPT-2-small rows (MODEL_ROWS; reduce-overhead).
# Where BASELINE_SRC names another tree (a copy of the commit before the change,
# `git archive <commit> src | tar x -C scratch/base`, then scratch/base/src), layer and
# model run again on it right after (--tag baseline, its rows under baseline/, to compare,
# not to merge), so that before and after come from one machine and one call.
#
# Every stage has a time cap inside an overall DEADLINE (seconds, 560): a stage that
# overruns is cut (exit 124 in the summary) and the rest still run. Under $OUT: the logs,
# summary.txt and rows.tar.gz (the rows: `tar xzf rows.tar.gz` here, then
# `python benchmarks/rows.py merge rows` and `python benchmarks/report.py`).
set -u
OUT=${OUT:-/tmp/out}
DEADLINE=${DEADLINE:-560}
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(tests pair layer model)
ROWS="$OUT/rows"
mkdir -p "$OUT" "$ROWS"
export PYTHONUNBUFFERED=1 BENCH_COMMIT=${BENCH_COMMIT:-}
. "$(dirname "$0")/gpu_stages.sh"
install_carried_wheels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
status=0

NN_ONLY="linear_step/bf16_linear,linear_step/stochround_nvfp4,linear_step/stochround_nvfp4_pow2"
NN_ONLY="$NN_ONLY,linear_step/torchao_nvfp4_emulated"
MODEL_ROWS=${MODEL_ROWS:-bf16_compiled_cudagraphs,nvfp4_compiled_cudagraphs,nvfp4_pow2_compiled_cudagraphs}
model_only=$(echo "$MODEL_ROWS" | sed 's/\([^,]*\)/model_step_gpt2-small\/\1/g')

layer() {  # layer SRC RESULTS TAG...: the layer rows on the tree SRC, rows to RESULTS
    local src=$1 results=$2 tag=("${@:3}")
    PYTHONPATH=/tmp/site:$src stage "bench_nn ${tag[*]}" "$OUT/bench.log" 120 \
        python3 benchmarks/bench_nn.py --results "$results" --out "$OUT" --only "$NN_ONLY" \
        "${tag[@]}"
}

model() {  # model SRC RESULTS TAG...: the model rows on the tree SRC, rows to RESULTS
    local src=$1 results=$2 tag=("${@:3}")
    PYTHONPATH=/tmp/site:$src stage "bench_model ${tag[*]}" "$OUT/bench.log" 240 \
        python3 benchmarks/bench_model.py --results "$results" --out "$OUT" \
        --only "$model_only" "${tag[@]}"
}

for part in "${PARTS[@]}"; do
    case $part in
    tests)
        # -v: each test's outcome as it ends, so a run cut by its cap still names its failures
        PYTHONPATH=/tmp/site:src stage "pytest" "$OUT/gpu_tests.log" "${TESTS_CAP:-330}" \
            python3 -m pytest -v -n 12 -p no:cacheprovider ${PAIR_TESTS:-tests/kernels \
            tests/blocks tests/nn/test_step_graphs.py tests/nn/test_linear.py}
        grep -E "(FAILED|ERROR) tests/" "$OUT/gpu_tests.log" | sort -u | head -n 20
        tail -n 1 "$OUT/gpu_tests.log"
        ;;
    pair)
        PYTHONPATH=/tmp/site:src stage "bench_pair" "$OUT/bench.log" 90 \
            python3 benchmarks/bench_pair.py --results "$ROWS" --out "$OUT" \
            ${PAIR_ARGS:---unstaged}
        ;;
    layer | model)
        "$part" src "$ROWS"
        if [ -n "${BASELINE_SRC:-}" ]; then
            "$part" "$BASELINE_SRC" "$OUT/baseline" --tag baseline
        fi
        ;;
    *)
        echo "unknown part $part (tests, pair, layer, model)" | tee -a "$SUMMARY"
        status=1
        ;;
    esac
done
grep -s -E "fraction of the floor|% of the floor" -A 12 "$OUT/bench.log" | head -n 16
tar czf "$OUT/rows.tar.gz" -C "$OUT" rows $([ -d "$OUT/baseline" ] && echo baseline) &&
    rm -rf "$ROWS" "$OUT/baseline"
cat "$SUMMARY"
exit "$status"
