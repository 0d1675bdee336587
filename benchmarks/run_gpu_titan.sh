#!/usr/bin/env bash
# torchtitan runs on a GPU machine without torchtitan (issue 45), from the repository root:
# the peers' wheels in .whl and torchtitan's in .whl/titan (benchmarks/titan_wheels.txt
# says how to fetch them), Hugging Face datasets stood in for where it is missing
# (benchmarks/stand_ins), then one benchmarks/bench_titan.py run a line of RUNS, each with
# its options, e.g.
#
#   RUNS=$'--compile --log-every 10 --cases bf16 nvfp4 nvfp4_pow2
#   --flavor 100M --compile --steps 16 --profile-steps 3 --cases bf16 nvfp4' \
#       bash benchmarks/run_gpu_titan.sh
#
# (default: the first line; --gpus 1 and --out are added). Each run has a time cap (CAP,
# seconds, 240) inside an overall DEADLINE (560). Under $OUT: titan.log, summary.txt, and
# each run's folder run<N>/ (its summary-*.json, loss plot and, with --profile-steps,
# profile-*.json, whose gpu_kernels list the kernels by GPU time).
set -u
OUT=${OUT:-/tmp/out}
DEADLINE=${DEADLINE:-560}
RUNS=${RUNS:---compile --log-every 10 --cases bf16 nvfp4 nvfp4_pow2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/gpu_stages.sh"
install_carried_wheels
install_titan_wheels
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
status=0
run=0
while IFS= read -r options; do
    [ -n "${options// /}" ] || continue
    run=$((run + 1))
    # shellcheck disable=SC2086  # each line's options are words
    PYTHONPATH=/tmp/site:src:${PYTHONPATH:-} stage "run$run: $options" "$OUT/titan.log" \
        "${CAP:-240}" python3 benchmarks/bench_titan.py --gpus 1 --out "$OUT/run$run" $options
    # each run's summary, as bench_titan wrote it
    for summary in "$OUT/run$run"/summary-*.json; do
        [ -f "$summary" ] && cat "$summary"
    done | tee -a "$SUMMARY"
done <<<"$RUNS"
exit "$status"
