"""A torchtitan 0.3.0 run of the tiny model under a recipe with torch's AdamW on the CPU
for STEPS steps, tensor parallel over TP ranks under the SPMD backend BACKEND, the rows
in DUMP_FOLDER (a test of `test_torchtitan.py` runs it under ``torchrun``):

    python titan_parallel_run.py DUMP_FOLDER RECIPE STEPS TP BACKEND
"""

from __future__ import annotations

import sys

from stochround.integrations.torchtitan import run_training, titan_config


def main(dump_folder: str, recipe: str, steps: str, tp: str, backend: str) -> None:
    config = titan_config(
        recipe, flavor="tiny", steps=int(steps), seq_len=32, local_batch_size=2,
        dump_folder=dump_folder,
    )  # fmt: skip
    config.parallelism.tensor_parallel_degree = int(tp)
    config.parallelism.spmd_backend = backend  # type: ignore[attr-defined]
    run_training(config, "cpu", {})


if __name__ == "__main__":
    main(*sys.argv[1:])
