"""``run_sweep``: plan the grid, skip finished trials, run the rest on Ray Tune, write the table."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pandas as pd
import yaml
from demoscale.ray_jobs.cluster import ray_session
from demoscale.ray_jobs.config import SweepConfig, TrialResources, load_sweep_config, sweep_config_from_dict
from demoscale.ray_jobs.grid import plan_trials
from demoscale.ray_jobs.results import ResultsFolder
from demoscale.ray_jobs.trial import TrialRuntime, finished_trial, tune_trainable


class SweepError(RuntimeError):
    """A sweep that cannot start (existing results without --resume, unreadable store, ...)."""


@dataclass
class SweepResult:
    """What a sweep did: where it wrote, the tables, and which trials ran, were skipped or failed."""

    output: str
    results: pd.DataFrame
    rollouts: pd.DataFrame
    planned: list[str]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)  # finished, row taken from the trial's folder
    wall_time_s: float = 0.0

    @property
    def results_csv(self) -> str:
        return self.output.rstrip("/") + "/results.csv"


def _as_config(config: SweepConfig | dict | str | os.PathLike) -> SweepConfig:
    if isinstance(config, SweepConfig):
        return config
    if isinstance(config, dict):
        return sweep_config_from_dict(config)
    return load_sweep_config(config)


def _absolute(location: str) -> str:
    return location if "://" in location else os.path.abspath(location)


def _load_episodes(store: str) -> pd.DataFrame:
    from demoscale.datasets import EpisodeStore

    try:
        return EpisodeStore.open(store).episodes
    except Exception as err:  # the store's own errors already name key and episode
        raise SweepError(f"cannot open the sweep's store {store}: {err}") from err


def _write_json(output: str, name: str, payload: Any) -> None:
    with fsspec.open(output.rstrip("/") + "/" + name, "w") as handle:
        handle.write(payload if isinstance(payload, str) else json.dumps(payload, indent=1, default=str))


def run_sweep(
    config: SweepConfig | dict | str | os.PathLike,
    address: str | None = None,
    storage: str | None = None,
    resume: bool = False,
    *,
    train_fn: Callable[..., Any] | None = None,
    evaluate_fn: Callable[..., Any] | None = None,
    stream: Any = None,
) -> SweepResult:
    """Run a sweep: one Tune trial per grid point (subset -> train -> evaluate), a row per trial.

    ``config``: a ``SweepConfig``, its dict, or the path of a sweep YAML. ``address``: None or
    ``"local"`` for a private local Ray, ``"auto"``/``HOST:PORT``/``ray://HOST:PORT`` for a cluster.
    ``storage``: the output folder (path or fsspec URL), overriding ``config.output``.
    ``resume``: run only trials without a row in the existing ``results.csv``, after taking the rows
    of trials that finished but never reached the table (a driver killed in between) from their
    folders; without it, an output folder that already has results is refused. ``train_fn``/``evaluate_fn`` replace
    ``demoscale.policies.train``/``demoscale.eval.evaluate`` (same signatures).
    Every check that can fail (config, store, feasibility of the grid, existing results) runs before
    Ray starts.
    """
    started = time.perf_counter()
    config = _as_config(config)
    output = _absolute(storage or config.resolve(config.output))
    store = config.resolve(config.store)
    episodes = _load_episodes(store)
    planned = plan_trials(config, episodes, store)

    folder = ResultsFolder(output)
    finished = folder.finished_trial_ids()
    # Trials that finished while the driver was gone (killed after the trial, before its row).
    left_behind = {
        point["trial_id"]: done
        for point in planned
        if point["trial_id"] not in finished and (done := finished_trial(output, point)) is not None
    }
    if (finished or left_behind) and not resume:
        raise SweepError(
            f"{output} already holds results for {len(finished | set(left_behind))} trial(s); pass --resume "
            "(resume=True) to run only the unfinished ones, or choose another output folder"
        )
    for trial_id, (row, rollouts) in left_behind.items():
        folder.add_trial(row, rollouts)
        finished.add(trial_id)
    pending = [point for point in planned if point["trial_id"] not in finished]
    skipped = [point["trial_id"] for point in planned if point["trial_id"] in finished]
    _write_json(output, "sweep.yaml", yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))
    _write_json(
        output, "plan.json", [{k: v for k, v in p.items() if k != "episode_indices"} for p in planned]
    )

    ran: list[str] = []
    failed: list[str] = []
    if pending:
        ran, failed = _run_on_tune(
            config, pending, output, address, train_fn, evaluate_fn, stream, len(skipped), folder
        )
    return SweepResult(
        output=output,
        results=folder.results(),
        rollouts=folder.rollouts(),
        planned=[p["trial_id"] for p in planned],
        ran=ran,
        skipped=skipped,
        failed=failed,
        recovered=sorted(left_behind),
        wall_time_s=time.perf_counter() - started,
    )


def trial_placement(resources: TrialResources) -> Any:
    """What Tune reserves for one trial (a ``PlacementGroupFactory``).

    One worker: one bundle of ``{cpu, gpu}``, in which the trial's own process trains (what a
    ``{"cpu", "gpu"}`` resource dict gives). ``workers: N``: an empty head bundle (the trial's
    process only coordinates and evaluates) and N bundles of ``{cpu, gpu}``, one per training rank,
    packed onto as few machines as possible; Tune starts the trial only when all N fit.
    """
    from ray.tune import PlacementGroupFactory

    bundle = {"CPU": float(resources.cpu), "GPU": float(resources.gpu)}
    if resources.workers <= 1:
        return PlacementGroupFactory([bundle])
    return PlacementGroupFactory([{}] + [dict(bundle) for _ in range(resources.workers)], strategy="PACK")


@contextmanager
def _quiet_tune() -> Iterator[None]:
    """Tune's own console output and its TensorBoard/CSV/JSON loggers off; our live table instead."""
    settings = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}
    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_on_tune(
    config: SweepConfig,
    pending: list[dict[str, Any]],
    output: str,
    address: str | None,
    train_fn: Callable[..., Any] | None,
    evaluate_fn: Callable[..., Any] | None,
    stream: Any,
    n_skipped: int,
    folder: ResultsFolder,
) -> tuple[list[str], list[str]]:
    from demoscale.ray_jobs.reporter import LiveTable, ResultsWriter
    from ray import tune

    runtime = TrialRuntime(config=config, output=output, train_fn=train_fn, evaluate_fn=evaluate_fn)
    trainable = tune.with_resources(
        tune.with_parameters(tune_trainable, runtime=runtime),
        lambda params: trial_placement(config.trial_resources(params["point"]["policy"])),
    )
    writer = ResultsWriter(folder)
    live = LiveTable(total=len(pending), skipped=n_skipped, stream=stream)

    def name_of(trial: Any) -> str:
        return trial.config["point"]["trial_id"]

    with _quiet_tune(), ray_session(address, num_cpus=config.num_cpus):
        tuner = tune.Tuner(
            trainable,
            param_space={"point": tune.grid_search(pending)},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=config.max_concurrent_trials,
                trial_name_creator=name_of,
                trial_dirname_creator=name_of,
                # A finished trial's worker (torch, the simulator already imported) takes the next one.
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                storage_path=output.rstrip("/") + "/tune",
                failure_config=tune.FailureConfig(max_failures=config.retries),
                callbacks=[writer, live],
                verbose=0,
            ),
        )
        try:
            tuner.fit()
        finally:
            live.close()
    return writer.written, sorted(writer.failed)
