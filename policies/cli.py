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
- each run its own folder ``<trainer.default_root_dir>/<run_name>/`` (``--run_name``, default a
  timestamp; ``--ckpt_path last`` without a run name resumes the latest run) holding
  ``checkpoints/`` and the CSV logs, unless ``checkpoint.dirpath`` is given (then the root itself);
- experiment tracking by one flag, ``--logger csv|tensorboard|wandb|mlflow`` (default csv), with
  ``--logger_group`` (W&B group, MLflow experiment, TensorBoard folder; a sweep sets its name) and
  the run name as the tracker's run; files under ``--logger_dir`` (default: the root folder). W&B
  runs offline unless ``WANDB_MODE=online``; MLflow writes to ``file:<logger_dir>/mlruns`` unless
  ``MLFLOW_TRACKING_URI`` is set. ``--logger`` replaces ``trainer.logger`` (a config's
  ``logger: false`` too); without it ``trainer.logger`` stands, and a CSV logger where it is unset;
- gradient accumulation derived from ``model.init_args.global_batch_size`` and the DataModule's
  micro-batch ``data.batch_size`` (over all devices).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from demoscale.policies.callbacks import PolicyCheckpoint, ScheduledGC, ThroughputLogger, TrainingProgress
from demoscale.policies.data import PolicyDataModule
from demoscale.policies.families import FAMILIES
from demoscale.policies.lightning_module import PolicyModule
from lightning.pytorch import Callback
from lightning.pytorch.cli import LightningCLI

LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
DEFAULT_GROUP = "demoscale"


def tracking_logger(name: str, save_dir: str, group: str, run: str) -> dict[str, Any]:
    """The ``trainer.logger`` config of one tracker: group = a sweep (or ``DEFAULT_GROUP``), run = one
    training run (a trial). Offline where the tracker has a mode for it."""
    if name == "csv":
        return {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": save_dir, "name": "logs"},
        }
    if name == "tensorboard":
        # One log folder for the group: `tensorboard --logdir <save_dir>/tensorboard` shows every run.
        return {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": os.path.join(save_dir, "tensorboard"), "name": group, "version": run},
        }
    if name == "wandb":
        return {
            "class_path": "lightning.pytorch.loggers.WandbLogger",
            "init_args": {
                "project": "demoscale",
                "group": group,
                "name": run,
                "save_dir": save_dir,
                "offline": os.environ.get("WANDB_MODE", "offline") != "online",
            },
        }
    if name == "mlflow":
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # A local folder needs no server or database (mlflow-skinny has none); MLflow 3 asks
            # for this opt-in before it writes one.
            uri = Path(save_dir, "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return {
            "class_path": "lightning.pytorch.loggers.MLFlowLogger",
            "init_args": {"experiment_name": group, "run_name": run, "tracking_uri": uri},
        }
    raise ValueError(f"--logger must be one of {', '.join(LOGGERS)}, got {name!r}")


def _new_run_name(root: str) -> str:
    """A timestamp not yet taken under ``root`` (a suffix when two runs start in the same second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name, k = stamp, 1
    while os.path.exists(os.path.join(root, name)):
        k += 1
        name = f"{stamp}-{k}"
    return name


def _latest_run(root: str) -> str | None:
    """The most recently written run under ``root`` that has ``checkpoints/last.ckpt``."""
    runs = (
        [p.parent.parent for p in Path(root).glob("*/checkpoints/last.ckpt")] if os.path.isdir(root) else []
    )
    return max(runs, key=lambda p: (p / "checkpoints" / "last.ckpt").stat().st_mtime).name if runs else None


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
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="this run's folder under trainer.default_root_dir and its name in the tracker "
            "(default: a timestamp; with --ckpt_path last: the latest run)",
        )
        parser.add_argument(
            "--logger",
            type=Literal["csv", "tensorboard", "wandb", "mlflow"] | None,
            default=None,
            help="experiment tracking; replaces trainer.logger (default: trainer.logger, else csv)",
        )
        parser.add_argument(
            "--logger_group", type=str, default=DEFAULT_GROUP, help="tracker group (a sweep's name)"
        )
        parser.add_argument(
            "--logger_dir", type=str | None, default=None, help="tracker files (default: the root folder)"
        )

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the resume checkpoint's hyperparameters right after parsing (this hook,
        # before any public one), with a raw torch.load: the file is checked safely before that.
        if self.config.get("subcommand"):
            _check_resume_checkpoint(self.config[self.config.subcommand].get("ckpt_path"))
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if "weights_only" in config and config.get("weights_only") is None:
            # Resuming (--ckpt_path) must not run code from the checkpoint: Lightning's loader then
            # uses torch.load(weights_only=True), as load_checkpoint does (policies/checkpoints.py).
            config["weights_only"] = True
        trainer = config["trainer"]
        root = trainer.get("default_root_dir") or "runs"
        checkpoint = config.get("checkpoint")
        run_dir = root
        legacy = os.path.join(root, "checkpoints", "last.ckpt")  # runs made before run folders existed
        if checkpoint is not None and not checkpoint.get("dirpath"):
            resuming = config.get("ckpt_path") == "last" and not config.get("run_name")
            if resuming and not _latest_run(root) and os.path.isfile(legacy):
                checkpoint["dirpath"] = os.path.dirname(legacy)
            else:
                # Each run its own folder; --ckpt_path last without a name continues the latest run.
                if not config.get("run_name"):
                    config["run_name"] = (resuming and _latest_run(root)) or _new_run_name(root)
                run_dir = os.path.join(root, config["run_name"])
                checkpoint["dirpath"] = os.path.join(run_dir, "checkpoints")
        run = config.get("run_name") or os.path.basename(os.path.normpath(root))
        if config.get("logger") or trainer.get("logger") in (None, True):
            name = config.get("logger") or "csv"
            save_dir = run_dir if name == "csv" else (config.get("logger_dir") or root)
            trainer["logger"] = tracking_logger(
                name, save_dir, config.get("logger_group") or DEFAULT_GROUP, run
            )
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


def _check_resume_checkpoint(ckpt_path: str | None) -> None:
    """A checkpoint file to resume from is read safely first, so that a hostile or damaged file is a
    message naming it (``ConfigError``), not a traceback from deep inside Lightning's loader."""
    if not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):
        return
    from demoscale.conventions import ConfigError
    from demoscale.policies.checkpoints import CheckpointError, load_checkpoint

    try:
        load_checkpoint(ckpt_path)
    except (CheckpointError, OSError) as err:
        raise ConfigError(f"--ckpt_path {ckpt_path}: {err}") from None


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


def store_alias(argv: list[str]) -> list[str]:
    """``--store S`` (and ``--store=S``), the name every other command gives the store, as the
    Lightning CLI's ``--data.store S``."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--store" and i + 1 < len(argv):
            out += ["--data.store", argv[i + 1]]
            i += 2
            continue
        out.append("--data.store=" + arg.removeprefix("--store=") if arg.startswith("--store=") else arg)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """``demoscale train ...``."""
    argv = store_alias(list(sys.argv[1:] if argv is None else argv))
    with warnings.catch_warnings():
        # The dispatcher hands over its arguments after the command name; sys.argv still holds the
        # name, which LightningCLI takes for a second, conflicting command line and warns about.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        make_cli(argv)
    return 0
