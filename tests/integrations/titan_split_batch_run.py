"""A torchtitan 0.2.2 run of the tiny model on DEVICE (the CPU where not given; cuda: one
GPU a process, the float32 model as on the CPU) with a global batch of GLOBAL
samples, LOCAL a rank a micro-batch (one process: LOCAL < GLOBAL accumulates gradients;
under ``torchrun``: FSDP2 over the ranks), under RECIPE with SWITCHES (a JSON object),
gradients clipped at MAX_NORM, reading the files of DATA, starting from the model of the
DCP checkpoint SEED and saving its model at the last step; with STEPS 0 it writes SEED's
checkpoint instead (the model as one process initialises it: torchtitan's seed
checkpoint, which makes a sharded run start from the same weights).  The test of
`test_torchtitan_v0_2.py` runs it:

    python titan_split_batch_run.py DUMP RECIPE SWITCHES STEPS LOCAL GLOBAL MAX_NORM DATA SEED \\
        [DEVICE]
"""

from __future__ import annotations

import json
import sys

from torchtitan.train import Trainer

from stochround.integrations.torchtitan import run_training, titan_config
from stochround.integrations.torchtitan.cpu_device import cpu_trainer
from stochround.integrations.torchtitan.launch import single_process_env


def main(
    dump: str, recipe: str, switches: str, steps: str, local: str, global_: str,
    max_norm: str, data: str, seed: str, device: str = "cpu",
) -> None:  # fmt: skip
    config = titan_config(
        recipe, switches=json.loads(switches), flavor="tiny", steps=max(1, int(steps)),
        seq_len=32, local_batch_size=int(local), dump_folder=dump,
    )  # fmt: skip
    config.training.global_batch_size = int(global_)
    config.training.max_norm = float(max_norm)
    config.training.dataset_path = data
    config.optimizer.implementation = "for-loop"
    checkpoint = config.checkpoint
    checkpoint.enable = True
    checkpoint.interval = max(1, int(steps))
    if int(steps) == 0:
        checkpoint.create_seed_checkpoint = True
        config.training.mixed_precision_param = "float32"  # as run_training on the CPU
        with single_process_env(), cpu_trainer():
            trainer = Trainer(config)
            trainer.checkpointer.save(curr_step=0, last_step=True)
            trainer.close()
        return
    checkpoint.initial_load_path = seed
    checkpoint.initial_load_model_only = True
    # both runs compare bits: the float32 model on a GPU too (FSDP2's default casts the
    # parameters to bf16 for its compute, which one process without FSDP2 does not)
    config.training.mixed_precision_param = "float32"
    if device == "cuda":  # attention's backward and scatter-adds: their deterministic forms
        config.debug.deterministic = True
        config.debug.deterministic_warn_only = True
    run_training(config, device, {})


if __name__ == "__main__":
    main(*sys.argv[1:])
