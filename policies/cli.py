"""``demoscale train fit|validate|... --config configs/<name>.yaml`` — the Lightning CLI over the policies.

``model.class_path`` names the LightningModule of a registered policy family
(:mod:`demoscale.policies.families`), by import path or, for a registered family, by class name.

Every Trainer, model (``model.init_args.*``) and data (``data.*``) argument is settable from YAML or
flags; ``--print_config`` prints the resolved configuration. Added on top of Lightning's defaults:

- ``checkpoint.*``: a ModelCheckpoint (every ``every_n_train_steps`` optimizer steps and
  ``save_last=True``, and ``last.ckpt`` also at the final step); ``--ckpt_path last`` resumes from it;
- ``throughput.*``: :class:`~demoscale.policies.callbacks.ThroughputLogger`;
- ``gc.*``: :class:`~demoscale.policies.callbacks.ScheduledGC`;
- ``progress.*``: :class:`~demoscale.policies.callbacks.TrainingProgress` (a line on stderr every
  ``progress.every_s`` seconds: steps, loss, samples/s, ETA; 0 turns it off);
- a CSV logger under ``trainer.default_root_dir`` unless ``trainer.logger`` is set (TensorBoard
  and W&B loggers work when their packages are installed: ``--trainer.logger=TensorBoardLogger``);
- gradient accumulation derived from ``model.init_args.global_batch_size`` and the DataModule's
  micro-batch ``data.batch_size`` (over all devices).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from demoscale.policies.callbacks import PolicyCheckpoint, ScheduledGC, ThroughputLogger, TrainingProgress
from demoscale.policies.data import PolicyDataModule
from demoscale.policies.families import FAMILIES
from demoscale.policies.lightning_module import PolicyModule
from lightning.pytorch import Callback
from lightning.pytorch.cli import LightningCLI


class PolicyCLI(LightningCLI):
    """LightningCLI with demoscale's default callbacks, logger and batch-size rule."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_lightning_class_args(PolicyCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "checkpoint.every_n_train_steps": 1000,
                "checkpoint.filename": "step{step:07d}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(ThroughputLogger, "throughput")
        parser.add_lightning_class_args(ScheduledGC, "gc")
        parser.add_lightning_class_args(TrainingProgress, "progress")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config["trainer"]
        if trainer.get("logger") in (None, True):
            trainer["logger"] = {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": trainer.get("default_root_dir") or "runs", "name": "logs"},
            }
        checkpoint = config.get("checkpoint")
        if checkpoint is not None and not checkpoint.get("dirpath"):
            # One fixed folder per run (not per logger version), so that --ckpt_path last finds it.
            checkpoint["dirpath"] = os.path.join(trainer.get("default_root_dir") or "runs", "checkpoints")
        model_args = (
            config["model"].get("init_args", {}) if "init_args" in config["model"] else config["model"]
        )
        global_batch = model_args.get("global_batch_size")
        micro_batch = config["data"].get("batch_size")
        if global_batch and micro_batch:
            devices = trainer.get("devices")
            n_devices = devices if isinstance(devices, int) and devices > 0 else 1
            n_devices *= int(trainer.get("num_nodes") or 1)
            per_step = micro_batch * n_devices
            if global_batch % per_step:
                raise ValueError(
                    f"model.global_batch_size {global_batch} is not a multiple of data.batch_size {micro_batch} "
                    f"x {n_devices} device(s)"
                )
            trainer["accumulate_grad_batches"] = global_batch // per_step


def make_cli(
    argv: list[str] | None, run: bool = True, callbacks: Sequence[Callback] | None = None
) -> PolicyCLI:
    """The CLI object (``run=False`` only parses and instantiates); ``callbacks`` are added to the
    Trainer's (for callers such as a sweep trial that need hooks no config can name)."""
    # Every registered family's module is imported, so that ``model.class_path`` may name it by class
    # name alone (``WBVIMAModule``) and ``--help`` lists it.
    for family in FAMILIES.values():
        family.module_class()
    return PolicyCLI(
        PolicyModule,
        PolicyDataModule,
        subclass_mode_model=True,
        args=argv,
        run=run,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"default_root_dir": "runs", "callbacks": list(callbacks or [])},
        parser_kwargs={"prog": "demoscale train"},
        auto_configure_optimizers=False,
    )


def main(argv: list[str] | None = None) -> int:
    """``demoscale train ...``."""
    make_cli(list(sys.argv[1:] if argv is None else argv))
    return 0
