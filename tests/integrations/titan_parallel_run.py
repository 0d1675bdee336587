"""A torchtitan run (0.2.2 or 0.3.0, whichever is installed) of the tiny model under a
recipe with torch's AdamW on the CPU for STEPS steps of BATCH samples a data-parallel
rank, tensor parallel over TP ranks (the others' factor: FSDP2), the rows in DUMP_FOLDER
(tests of the integration run it under ``torchrun``):

    python titan_parallel_run.py DUMP_FOLDER RECIPE STEPS TP BATCH
"""

from __future__ import annotations

import sys

from stochround.integrations.torchtitan import run_training, titan_config


def main(dump_folder: str, recipe: str, steps: str, tp: str, batch: str) -> None:
    config = titan_config(
        recipe, flavor="tiny", steps=int(steps), seq_len=32, local_batch_size=int(batch),
        tensor_parallel_degree=int(tp), dump_folder=dump_folder,
    )  # fmt: skip
    run_training(config, "cpu", {})


if __name__ == "__main__":
    main(*sys.argv[1:])
