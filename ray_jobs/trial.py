"""One trial: train on the planned subset (resuming from the last checkpoint), evaluate, report.

The trial runs inside a Ray worker. Its working folder ``<output>/trials/<trial_id>/`` is a
function of the trial id alone, so a retried trial (Tune's ``max_failures``) and a resumed sweep
(``--resume``) both find the checkpoints an earlier attempt wrote there and continue from the last.

What a finished trial leaves there, each file written whole (temporary file + rename), in order:
``train_result.json`` once training is done (its checkpoint, steps and metrics), then
``rollouts.json``, then ``row.json`` last. A driver killed after a trial finished but before the
results table got its row loses nothing: ``--resume`` takes the row from ``row.json``
(:func:`finished_trial`), and an attempt that finds its training already done (``train_result.json``,
or a ``last.ckpt`` already at the step budget) does not train again for nothing.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demoscale.ray_jobs.config import SweepConfig

# Keys of the training config that a trial sets (dotted paths understood by demoscale.policies.train).
EPISODES_KEY = "data.episodes"
STORE_KEY = "data.store"
MAX_STEPS_KEY = "trainer.max_steps"
SEED_KEY = "seed_everything"
ROOT_DIR_KEY = "trainer.default_root_dir"
CKPT_EVERY_KEY = "checkpoint.every_n_train_steps"
CKPT_DIR_KEY = "checkpoint.dirpath"
CKPT_PATH_KEY = "ckpt_path"

LAST_CHECKPOINT = "last.ckpt"
# How often a trial sends its training progress to the sweep's live display.
PROGRESS_EVERY_S = 5.0
ROW_FILE = "row.json"
ROLLOUTS_FILE = "rollouts.json"
TRAIN_RESULT_FILE = "train_result.json"
# Row fields that identify the grid point a trial folder's results belong to.
_POINT_FIELDS = ("trial_id", "policy", "n_envs", "n_objects", "demos_per_pair", "seed", "train_steps")


@dataclass
class TrialRuntime:
    """What every trial of one sweep shares; travels to the workers through the object store."""

    config: SweepConfig
    output: str  # absolute path or URL of the sweep's output folder
    train_fn: Callable[..., Any] | None = None  # default: demoscale.policies.train
    evaluate_fn: Callable[..., Any] | None = None  # default: demoscale.eval.evaluate


def trial_dir(output: str, trial_id: str) -> str:
    return output.rstrip("/") + "/trials/" + trial_id


def last_checkpoint(folder: str) -> str | None:
    """The trial's ``checkpoints/last.ckpt`` if an earlier attempt wrote one, else None.

    Training saves ``step*.ckpt`` and then refreshes ``last.ckpt``; resuming goes through
    ``ckpt_path="last"``, which Lightning resolves to that file in the checkpoint folder.
    """
    path = Path(folder) / "checkpoints" / LAST_CHECKPOINT
    return str(path) if path.is_file() and path.stat().st_size > 0 else None


def _write_json(path: Path, payload: Any) -> None:
    """Write a JSON file whole or not at all (a kill never leaves a torn file to be recovered)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(payload, default=str, indent=1))
    os.replace(temporary, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def finished_trial(output: str, point: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """(row, rollouts) a finished trial left in its folder for this grid point, or None.

    A row counts only if it belongs to the same point (policy, axes, seed and step budget), so a
    changed sweep reruns its points. Folders from before ``rollouts.json`` existed give their
    evaluation's ``eval/rollouts.csv``.
    """
    folder = trial_dir(output, point["trial_id"])
    if "://" in folder and not folder.startswith("file://"):
        return None
    local = Path(folder.removeprefix("file://"))
    row = _read_json(local / ROW_FILE)
    if not isinstance(row, dict) or any(
        str(row.get(field)) != str(point.get(field)) for field in _POINT_FIELDS if field in point
    ):
        return None
    rollouts = _read_json(local / ROLLOUTS_FILE)
    if not isinstance(rollouts, list):
        rollouts = []
        legacy = local / "eval" / "rollouts.csv"
        if legacy.exists():
            import pandas as pd

            rollouts = pd.read_csv(legacy, dtype={"env_id": str, "object_id": str}).to_dict("records")
            for index, rollout in enumerate(rollouts):
                rollout.setdefault("rollout_index", index)
    return row, rollouts


def _checkpoint_step(path: Path) -> int | None:
    """The global step a checkpoint was saved at (read safely), or None if it cannot be read."""
    from demoscale.policies import CheckpointError, load_checkpoint

    try:
        return int(load_checkpoint(path)["global_step"])
    except (CheckpointError, FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def _finished_checkpoint(folder: Path, max_steps: int, resources: Any) -> dict[str, Any] | None:
    """The training record of a ``last.ckpt`` already at ``max_steps`` whose result was never
    recorded (the attempt died between the final checkpoint and the record), or None.

    Training is done: the checkpoint holds the final weights, so the trial evaluates it instead of
    resuming (which would train 0 steps and log nothing). The record is written, as after training.
    """
    from demoscale.policies import CheckpointError, load_checkpoint

    last = last_checkpoint(str(folder))
    if last is None:
        return None
    try:
        checkpoint = load_checkpoint(last)
        steps = int(checkpoint["global_step"])
        batches = int(checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"])
        batch_size = int(checkpoint["datamodule_hyper_parameters"]["batch_size"])
    except (CheckpointError, FileNotFoundError, KeyError, TypeError, ValueError):
        return None  # damaged or foreign: _prepare_resume decides
    if steps < max_steps:
        return None
    record = {
        "checkpoint_path": last,
        "steps": steps,
        # batches per rank x micro-batch x ranks, as TrainResult counts them
        "samples_seen": batches * batch_size * max(1, int(resources.workers)),
        "metrics": {},
        "recovered_from_checkpoint": True,
    }
    _write_json(folder / TRAIN_RESULT_FILE, record)
    return record


def _prepare_resume(folder: Path, max_steps: int) -> str | None:
    """What training should resume from: ``"last"``, a step checkpoint's path, or None (from scratch).

    Called when no finished training is on record (nor, for rollout scoring, in ``last.ckpt``: see
    :func:`_finished_checkpoint`). A ``last.ckpt`` already at ``max_steps`` whose result was never
    recorded cannot be resumed (0 steps, no validation metric, which offline scoring needs), nor can
    one torn by a kill while it was written: training then resumes from the newest readable step
    checkpoint before the end (resuming is exact: the same weights and metrics as an uninterrupted
    run); the checkpoints after it are removed so that Lightning writes them again under their
    own names.
    """
    last = last_checkpoint(str(folder))
    if last is None:
        return None
    step = _checkpoint_step(Path(last))
    if step is not None and step < max_steps:
        return "last"
    checkpoints = folder / "checkpoints"
    earlier = []
    for path in checkpoints.glob("*.ckpt"):
        if path.name != LAST_CHECKPOINT:
            saved = _checkpoint_step(path)
            if saved is not None and saved < max_steps:
                earlier.append((saved, path))
    start = max(earlier)[1] if earlier else None
    for path in checkpoints.glob("*.ckpt"):
        if path != start:
            path.unlink()
    return str(start) if start is not None else None


def _attr(obj: Any, *names: str, default: Any = None) -> Any:
    """First present field among ``names`` of a dataclass/object or a mapping."""
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if not isinstance(obj, dict) and hasattr(obj, name):
            return getattr(obj, name)
    return default


def _kill_after_first_checkpoint(folder: str, marker: Path, stop: threading.Event) -> None:
    """Testing aid: once a whole checkpoint is on disk, mark the attempt and SIGKILL this worker.

    "Whole": ``last.ckpt`` reads back (a file that merely exists may still be being written; a kill
    then tears it, and the retry resumes from the step checkpoint instead, which is a different
    case from the one this aid stages)."""

    def watch() -> None:
        while not stop.is_set():
            path = last_checkpoint(folder)
            if path is not None and _checkpoint_step(Path(path)) is not None:
                marker.write_text(
                    json.dumps({"killed_at": time.time(), "checkpoint": last_checkpoint(folder)})
                )
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True, name="fault-injection").start()


def _log_attempt(folder: Path, entry: dict[str, Any]) -> int:
    """Append this attempt to ``attempts.jsonl``; return its 1-based number."""
    log = folder / "attempts.jsonl"
    previous = log.read_text().splitlines() if log.exists() else []
    entry = {**entry, "attempt": len(previous) + 1}
    with open(log, "a") as handle:
        handle.write(json.dumps(entry) + "\n")
    return entry["attempt"]


def offline_score(loss: float) -> float:
    """Validation loss -> a score in (0, 1]: ``exp(-loss)``; for small losses ``1 - score ~ loss``."""
    return float(math.exp(-max(float(loss), 0.0)))


def run_trial(
    point: dict[str, Any], runtime: TrialRuntime, progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Train and evaluate one grid point; returns ``{"score", "row", "rollouts"}``.

    ``progress`` receives the training's progress (steps, loss, samples/s, ETA) every
    ``PROGRESS_EVERY_S`` seconds while the default trainer runs."""
    config = runtime.config
    started = time.perf_counter()
    folder = trial_dir(runtime.output, point["trial_id"])
    local = "://" not in folder or folder.startswith("file://")
    local_folder = Path(folder.removeprefix("file://")) if local else None
    if local_folder is not None:
        local_folder.mkdir(parents=True, exist_ok=True)
    done = finished_trial(runtime.output, point)
    if done is not None:  # finished in an earlier attempt whose report never reached the driver
        row, rollouts = done
        return {"score": float(row["score"]), "row": row, "rollouts": rollouts}
    max_steps = int(point["train_steps"])
    recorded = _recorded_training(local_folder, max_steps) if local_folder is not None else None
    resume_from = None
    attempt = 1
    if local_folder is not None:
        if recorded is None and config.eval.mode != "offline":  # offline scores need training's val metric
            recorded = _finished_checkpoint(local_folder, max_steps, config.trial_resources(point["policy"]))
        if recorded is None:
            resume_from = _prepare_resume(local_folder, max_steps)
        attempt = _log_attempt(
            local_folder,
            {
                "started": time.time(),
                "resume_from": last_checkpoint(str(local_folder)) if resume_from == "last" else resume_from,
                "training_done": recorded is not None,
                "pid": os.getpid(),
            },
        )
    if recorded is not None:  # training finished in an earlier attempt: evaluate what it left
        trained = recorded
    else:
        overrides = _training_overrides(config, point, folder, resume_from, runtime.output)
        trained = _train(point, runtime, overrides, local_folder, progress)
    checkpoint = str(_attr(trained, "checkpoint_path"))
    score, outcome, rollouts = _evaluate(point, runtime, trained, checkpoint, folder)
    row = {
        **{field: point[field] for field in _ROW_FIELDS_OF_POINT},
        "score": score,
        **outcome,
        "env_ids": list(point["env_ids"]),
        "object_ids": list(point["object_ids"]),
        "train_steps": int(_attr(trained, "steps", default=point["train_steps"])),
        "samples_seen": int(_attr(trained, "samples_seen", default=0)),
        "wall_time_s": time.perf_counter() - started,
        "attempts": attempt,
        "checkpoint": relative_to_output(checkpoint, runtime.output),
    }
    if local_folder is not None:
        # Rollouts first, the row last: a row on disk means the trial is finished and whole.
        _write_json(local_folder / ROLLOUTS_FILE, rollouts)
        _write_json(local_folder / ROW_FILE, row)
    return {"score": score, "row": row, "rollouts": rollouts}


def relative_to_output(path: str, output: str) -> str:
    """``path`` relative to the sweep's output folder when it lies inside it, else as it is.

    The results table travels (copied into a record, synced from a cluster's bucket): a path relative
    to the folder that holds the table stays true wherever the folder goes, an absolute one names
    the machine that wrote it. ``ResultsFolder.resolve`` turns it back into a full path or URL."""
    prefix = output.rstrip("/") + "/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    resolved, root = Path(path), Path(output)
    if "://" not in output and resolved.is_absolute() and root.is_absolute():
        try:
            return resolved.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return path


# Fields of a results row copied from the grid point as they are.
_ROW_FIELDS_OF_POINT = (
    "trial_id",
    "policy",
    "n_envs",
    "n_objects",
    "n_pairs",
    "demos_per_pair",
    "total_demos",
    "seed",
)


def _recorded_training(folder: Path, max_steps: int) -> dict[str, Any] | None:
    """The training an earlier attempt finished and recorded (its checkpoint still there), or None."""
    recorded = _read_json(folder / TRAIN_RESULT_FILE)
    if (
        isinstance(recorded, dict)
        and int(recorded.get("steps", -1)) >= max_steps
        and Path(str(recorded.get("checkpoint_path", ""))).is_file()
    ):
        return recorded
    return None


def _training_overrides(
    config: SweepConfig, point: dict[str, Any], folder: str, resume_from: str | None, output: str
) -> dict[str, Any]:
    """The policy's overrides plus what the trial sets: store, subset, steps, seed and folders."""
    overrides = {
        **config.policies[point["policy"]].overrides,
        STORE_KEY: config.resolve(config.store),
        EPISODES_KEY: list(point["episode_indices"]),
        MAX_STEPS_KEY: int(point["train_steps"]),
        SEED_KEY: int(point["seed"]),
        ROOT_DIR_KEY: folder,
        CKPT_EVERY_KEY: int(config.budget.checkpoint_every_steps),
        CKPT_DIR_KEY: folder + "/checkpoints",
    }
    if config.logger:
        # group = the sweep, run = the trial; one tracking folder for the whole sweep.
        overrides.update(
            logger=config.logger,
            logger_group=config.name,
            run_name=point["trial_id"],
            logger_dir=output.rstrip("/") + "/tracking",
        )
    if resume_from:
        overrides[CKPT_PATH_KEY] = resume_from
    return overrides


def _train(
    point: dict[str, Any],
    runtime: TrialRuntime,
    overrides: dict[str, Any],
    local_folder: Path | None,
    progress: Callable[[dict[str, Any]], None] | None,
) -> Any:
    """Train (the sweep's trainer, default ``demoscale.policies.train``) and record the result in the
    trial folder, so that a later attempt does not train again."""
    config = runtime.config
    policy_config = config.resolve(config.policies[point["policy"]].config)
    stop_watching = threading.Event()
    injected = config.fault_injection.kill_after_first_checkpoint
    resources = config.trial_resources(point["policy"])
    kill_marker = None
    if local_folder is not None and injected and ("*" in injected or point["trial_id"] in injected):
        marker = local_folder / "fault_injected.json"
        if not marker.exists():
            if runtime.train_fn is None and resources.workers <= 1:
                kill_marker = marker  # killed from inside training, at a known step (_train_here)
            else:
                _kill_after_first_checkpoint(str(local_folder), marker, stop_watching)
    ranks: list[dict[str, Any]] | None = None
    try:
        if resources.workers > 1:
            from demoscale.ray_jobs.workers import train_on_workers

            trained, ranks = train_on_workers(
                policy_config,
                overrides,
                resources.workers,
                resources.cpu,
                resources.gpu,
                train_fn=runtime.train_fn,
                progress=progress,
            )
        else:
            trained = _train_here(runtime, policy_config, overrides, progress, kill_marker)
    except SystemExit as err:  # the Lightning CLI exits on bad arguments; fail the trial, not the worker
        raise RuntimeError(
            f"trial {point['trial_id']}: training with {policy_config} exited ({err.code}); "
            f"overrides: {sorted(overrides)}"
        ) from None
    finally:
        stop_watching.set()
    if local_folder is not None:
        record = {
            "checkpoint_path": str(_attr(trained, "checkpoint_path")),
            "steps": int(_attr(trained, "steps", default=point["train_steps"])),
            "samples_seen": int(_attr(trained, "samples_seen", default=0)),
            "metrics": dict(_attr(trained, "metrics", default={}) or {}),
        }
        if ranks is not None:  # what each rank trained on (world size, samples, batches, process)
            record["workers"] = ranks
        _write_json(local_folder / TRAIN_RESULT_FILE, record)
    return trained


def _train_here(
    runtime: TrialRuntime,
    policy_config: str,
    overrides: dict[str, Any],
    progress: Callable[[dict[str, Any]], None] | None,
    kill_marker: Path | None = None,
) -> Any:
    """One worker: train in this process (the trial's), reporting progress to the sweep.

    ``kill_marker`` (fault injection): at the start of the first batch after a checkpoint was saved,
    write the marker and SIGKILL this process. Checkpoints are saved in the training thread at the
    end of a batch, so the kill always comes after a whole ``last.ckpt`` and before the next one."""
    train_fn, train_kwargs = runtime.train_fn, {}
    if train_fn is None:
        import lightning as L
        from demoscale.policies import train as train_fn

        callbacks: list[Any] = []
        if progress is not None:
            from demoscale.policies.callbacks import TrainingProgress

            class ProgressToSweep(TrainingProgress):
                def report(self, snapshot: dict[str, Any]) -> None:
                    progress(snapshot)

            callbacks.append(ProgressToSweep(every_s=PROGRESS_EVERY_S))
        if kill_marker is not None:
            folder = str(kill_marker.parent)

            class KillAfterFirstCheckpoint(L.Callback):
                def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
                    checkpoint = last_checkpoint(folder)
                    if checkpoint is not None:
                        kill_marker.write_text(
                            json.dumps({"killed_at": time.time(), "checkpoint": checkpoint})
                        )
                        os.kill(os.getpid(), signal.SIGKILL)

            callbacks.append(KillAfterFirstCheckpoint())
        if callbacks:
            train_kwargs["callbacks"] = callbacks
    return train_fn(policy_config, overrides=overrides, **train_kwargs)


def _evaluate(
    point: dict[str, Any], runtime: TrialRuntime, trained: Any, checkpoint: str, folder: str
) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """(score, the row's interval and rollout-count columns, rollouts) of the trained checkpoint:
    rolled out in simulation, or (offline mode) ``exp(-validation metric)`` without rollouts."""
    spec = runtime.config.eval
    if spec.mode == "offline":
        metrics = _attr(trained, "metrics", default={}) or {}
        if spec.metric not in metrics:
            raise KeyError(
                f"trial {point['trial_id']}: offline evaluation needs metric '{spec.metric}' from training, "
                f"which reported {sorted(metrics)}"
            )
        nan = float("nan")
        outcome = dict.fromkeys(("score_ci_low", "score_ci_high", "success_rate", "success_ci_low"), nan)
        outcome.update(success_ci_high=nan, confidence=nan, n_rollouts=0)
        return offline_score(float(metrics[spec.metric])), outcome, []
    evaluate_fn = runtime.evaluate_fn
    if evaluate_fn is None:
        from demoscale.eval import evaluate as evaluate_fn
    evaluated = evaluate_fn(
        checkpoint,
        task=spec.task,
        split=spec.split,
        n_envs=spec.n_envs,
        n_objects=spec.n_objects,
        episodes=spec.episodes,
        workers=spec.workers,
        out_dir=folder + "/eval",
        seed=spec.seed,
        **spec.options,
    )
    frame = _attr(evaluated, "rollouts")
    rollouts = [] if frame is None else frame.reset_index(drop=True).to_dict("records")
    for index, rollout in enumerate(rollouts):
        rollout["rollout_index"] = index
    summary = _attr(evaluated, "summary", default={}) or {}
    outcome = {
        # the score interval and the level of both (absent from evaluators that do not give them)
        **{
            key: float(summary.get(key, float("nan")))
            for key in ("score_ci_low", "score_ci_high", "confidence")
        },
        **{key: float(summary[key]) for key in ("success_rate", "success_ci_low", "success_ci_high")},
        "n_rollouts": int(summary.get("n_rollouts", len(rollouts))),
    }
    return float(summary["score"]), outcome, rollouts


def tune_trainable(params: dict[str, Any], runtime: TrialRuntime) -> None:
    """The Tune function trainable: progress reports while training (``{"progress": {...}}``), then one
    final report carrying the score, the row and its rollouts."""
    from ray import tune

    def report_progress(progress: dict[str, Any]) -> None:
        tune.report({"progress": progress})

    outcome = run_trial(params["point"], runtime, progress=report_progress)
    tune.report({"score": outcome["score"], "row": outcome["row"], "rollouts": outcome["rollouts"]})
