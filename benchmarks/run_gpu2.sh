#!/usr/bin/env bash
# The two-GPU machine's runs (issue 34), in one call of the device tool (under 9 minutes),
# from the repository root (the peers' wheels carried in .whl, as for run_gpu.sh):
#
#   bash benchmarks/run_gpu2.sh
#
# 1. pytest -m gpus2 over GPUS2_TESTS (the files that hold such tests): the two-GPU tests
#    (tests/distributed: the SR optimizers on
#    DTensor shards, FSDP2, DDP, DCP resumes; the lm experiment under FSDP2), NCCL;
# 2. stochround.experiments.lm_distributed on 2 GPUs at the quick sizes (LM_STEPS steps,
#    60): rows LM_ROWS ("nvfp4 bf16") with --batch-split same (must equal the single-GPU
#    run bit for bit) and nvfp4 with --batch-split split (data parallel: measured); each
#    run's single-GPU reference is trained inline by rank 0 on GPU 0 before FSDP2 starts,
#    in the same process and determinism setting (strict deterministic algorithms);
# 3. benchmarks/bench_distributed.py with 2 ranks (the fused SR AdamW step on FSDP2
#    shards, and one GPU's step beside it on each rank) and with 1 (one GPU alone).
#
# Every stage has a time cap (`cap`) inside an overall DEADLINE (seconds, 530): a stage
# that overruns is cut (exit 124 in the summary) and the rest still run.
#
# Under $OUT (5 files): gpus2_tests.log, lm.log, bench.log, results.tar.gz (the JSON files
# of lm_distributed and bench_distributed; rows/distributed.csv, bench_distributed's rows:
# `python benchmarks/rows.py merge out/gpu2/rows` here), summary.txt (printed last).
# Exit status: 1 where a stage failed, else 0.
set -u
OUT=${OUT:-/tmp/out}
RESULTS=${RESULTS:-/tmp/gpu2-results}
DEADLINE=${DEADLINE:-530}
LM_STEPS=${LM_STEPS:-60}
LM_ROWS=${LM_ROWS:-nvfp4 bf16}
mkdir -p "$OUT" "$RESULTS"
# NVLink multicast stays off (the machines' rule: it can take shared GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src BENCH_COMMIT=${BENCH_COMMIT:-}
. "$(dirname "$0")/gpu_stages.sh"
install_carried_wheels
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
nvidia-smi topo -m
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
status=0

torchrun=(python3 -m torch.distributed.run --standalone --nproc-per-node)  # then the count

stage "pytest -m gpus2" "$OUT/gpus2_tests.log" 240 \
    python3 -m pytest -q -p no:cacheprovider -m gpus2 ${GPUS2_TESTS:-tests/distributed \
    tests/kernels/test_devices.py tests/blocks/test_sharded.py tests/nn/test_fsdp.py tests/experiments/test_lm_distributed.py}
tail -n 5 "$OUT/gpus2_tests.log"

for row in $LM_ROWS; do
    lm=(-m stochround.experiments.lm_distributed --row "$row" --quick --steps "$LM_STEPS"
        --batch-split same --device cuda --out "$RESULTS")
    if ! stage "lm_distributed $row same" "$OUT/lm.log" 80 "${torchrun[@]}" 2 "${lm[@]}" &&
        grep -q "does not have a deterministic implementation" "$OUT/lm.log"; then
        # strict determinism refused an op (named in lm.log): the run without it still
        # says whether the curves agree, and the summary keeps the refusal
        stage "lm_distributed $row same, nondeterministic" "$OUT/lm.log" 80 \
            "${torchrun[@]}" 2 "${lm[@]}" --nondeterministic
    fi
done
stage "lm_distributed nvfp4 split" "$OUT/lm.log" 80 \
    "${torchrun[@]}" 2 -m stochround.experiments.lm_distributed --row nvfp4 --quick \
    --steps "$LM_STEPS" --batch-split split --device cuda --out "$RESULTS"

stage "bench_distributed 2 ranks" "$OUT/bench.log" 90 \
    "${torchrun[@]}" 2 benchmarks/bench_distributed.py --out "$RESULTS" --tag x2 \
    --results "$RESULTS/rows"
stage "bench_distributed 1 rank" "$OUT/bench.log" 60 \
    "${torchrun[@]}" 1 benchmarks/bench_distributed.py --out "$RESULTS" --tag x1 \
    --results "$RESULTS/rows"

tar czf "$OUT/results.tar.gz" -C "$RESULTS" .
python3 - "$RESULTS" >>"$SUMMARY" 2>&1 <<'EOF'
"""The short summary: each lm_distributed run's comparison, each benchmark's rows."""
import json
import sys
from pathlib import Path

folder = Path(sys.argv[1])
print(f"\n{'lm run':<28} {'bit for bit':>11} {'train max rel':>14} {'val max rel':>12} "
      f"{'final val diff':>15}")
for path in sorted(folder.glob("lm-distributed-*.json")):
    c = json.loads(path.read_text())["comparison"]
    equal = "yes" if c["train_bit_equal"] and c["validation_bit_equal"] else "no"
    print(f"{path.stem[len('lm-distributed-'):]:<28} {equal:>11} {c['train_max_relative']:>14.3g} "
          f"{c['validation_max_relative']:>12.3g} {c['final_validation_difference']:>15.3g}")
print(f"\n{'bench (tag/provider)':<28} {'median us':>10} {'ns/param':>9} {'TB/s':>7} "
      f"{'ratio':>6} target")
for path in sorted(folder.glob("bench_distributed*.json")):
    info = json.loads(path.read_text())
    for row in info["rows"]:
        print(f"{info['tag'] + '/' + row['provider']:<28} {row['median_us']:>10.1f} "
              f"{row['ns_per_param']:>9.4f} {row['tb_s']:>7.3f} "
              f"{info['per_param_ratio']:>6.3f} {'ok' if info['within_target'] else 'MISSED'}")
    print(f"  on {info.get('gpu', info['cpu'])}, world size {info['world_size']}")
EOF
cat "$SUMMARY"
exit $status
