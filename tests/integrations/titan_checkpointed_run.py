"""A torchtitan run (0.2.2 or 0.3.0, whichever is installed) of the tiny model under
nvfp4 with SRAdamW on DEVICE (the CPU where not given; cuda: under torch's deterministic
algorithms, so that attention's backward sums in one order) that saves full DCP
checkpoints (model, optimizer, LR scheduler, data loader, train state) every INTERVAL
steps and at the last, resumed from the checkpoint LOAD if given (the test of
`test_torchtitan_common.py` runs it, alone or under ``torchrun``):

    python titan_checkpointed_run.py DUMP_FOLDER STEPS INTERVAL [LOAD] [DEVICE]
"""

from __future__ import annotations

import sys

from stochround.integrations.torchtitan import run_training, titan_config


def main(dump_folder: str, steps: str, interval: str, load: str = "", device: str = "cpu") -> None:
    config = titan_config(
        "nvfp4",
        flavor="tiny",
        optimizer="SRAdamW",
        steps=int(steps),
        seq_len=32,
        local_batch_size=1,
        dump_folder=dump_folder,
        deterministic=device == "cuda",
    )
    checkpoint = config.checkpoint
    checkpoint.enable = True
    checkpoint.interval = int(interval)
    checkpoint.last_save_model_only = False  # the last save a full one too, to compare
    checkpoint.keep_latest_k = 0
    if load:
        checkpoint.initial_load_path = load
        checkpoint.initial_load_model_only = False  # the whole training state
    run_training(config, device, {})


if __name__ == "__main__":
    main(*sys.argv[1:])
