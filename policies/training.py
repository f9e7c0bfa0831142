"""``train(config, overrides)``: exactly what ``demoscale train fit --config ...`` runs, from Python."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class TrainResult:
    """What a training run produced.

    Attributes:
        checkpoint_path: the last checkpoint (``last.ckpt``) of the run.
        steps: optimizer steps taken (the trainer's ``global_step``).
        samples_seen: training samples behind the final weights (steps x global batch).
        wall_time_s: wall time of the whole call.
        metrics: the trainer's final logged metrics (``train/loss``, ``val/loss``, ...) plus
            ``perf/samples_per_s_median`` and ``perf/data_wait_fraction_median``.
    """

    checkpoint_path: str
    steps: int
    samples_seen: int
    wall_time_s: float
    metrics: dict[str, float] = field(default_factory=dict)


def _flag(key: str, value: Any) -> str:
    if isinstance(value, str):
        return f"--{key}={value}"
    # YAML flow style parses back to the same structure (lists, dicts, numbers, null, booleans). A
    # scalar is dumped as a document with an end marker ("1\n...") that a string-typed option
    # (trainer.devices is int | str | list) would keep as it is: drop the marker.
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return f"--{key}={text.removesuffix('...').strip()}"


def train_args(
    config: str | os.PathLike[str] | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> list[str]:
    """The ``demoscale train`` argument list for a config (YAML path or dict) and dotted overrides."""
    args = ["fit"]
    if isinstance(config, Mapping):
        args.append(
            "--config=" + yaml.safe_dump(dict(config), default_flow_style=True, width=1 << 30).strip()
        )
    else:
        path = Path(config)
        if not path.exists():
            raise FileNotFoundError(f"training config {path} does not exist")
        args.append(f"--config={path}")
    for key, value in (overrides or {}).items():
        args.append(_flag(key, value))
    return args


def _finish_trackers(trainer: Any) -> None:
    """Close a W&B run at the end of training: the next run of the same process (a sweep worker
    runs many trials) must start its own run, not log into this one."""
    for logger in getattr(trainer, "loggers", []):
        if type(logger).__name__ == "WandbLogger" and getattr(logger, "_experiment", None) is not None:
            logger.experiment.finish()


def train(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    callbacks: Sequence[Any] | None = None,
) -> TrainResult:
    """Train a policy with the Lightning CLI (the same code path as ``demoscale train fit``).

    Args:
        config: a YAML path or the same content as a dict.
        overrides: dotted keys -> values applied after the config, e.g.
            ``{"data.episodes": [0, 3, 5], "trainer.max_steps": 200, "trainer.default_root_dir": "out"}``.
            ``"ckpt_path": "last"`` resumes from the run's last checkpoint.
        callbacks: extra Lightning callbacks for this run (e.g. a sweep's progress reporter).
    """
    from demoscale.policies.callbacks import ThroughputLogger
    from demoscale.policies.cli import make_cli

    start = time.perf_counter()
    # The CLI reads only the given arguments, never the calling program's own command line. That
    # command line must stay as it is, though: Lightning's DDP launcher starts the other ranks by
    # running it again. Only the CLI's warning about having both is silenced.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        cli = make_cli(train_args(config, overrides), run=True, callbacks=callbacks)
    trainer = cli.trainer
    _finish_trackers(trainer)
    checkpoint = trainer.checkpoint_callback
    path = ""
    if checkpoint is not None:
        path = getattr(checkpoint, "last_model_path", "") or getattr(checkpoint, "best_model_path", "")
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1
    }
    batch_size = int(getattr(cli.datamodule, "batch_size", 0) or 0)
    samples_seen = trainer.global_step * trainer.accumulate_grad_batches * batch_size * trainer.world_size
    for callback in trainer.callbacks:
        if isinstance(callback, ThroughputLogger):
            metrics.update({f"perf/{k}": v for k, v in callback.summary.items()})
    return TrainResult(
        checkpoint_path=str(path),
        steps=int(trainer.global_step),
        samples_seen=int(samples_seen),
        wall_time_s=time.perf_counter() - start,
        metrics=metrics,
    )
