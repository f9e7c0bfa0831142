"""Tune callbacks of the driver: the results-table writer and a calm live table of trials."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from demoscale.policies.progress import format_duration, format_progress
from demoscale.ray_jobs.results import ResultsFolder
from ray.tune import Callback


class ResultsWriter(Callback):
    """Adds each trial's row and rollouts to the results table the moment the trial completes."""

    def __init__(self, results: ResultsFolder) -> None:
        self.results = results
        self.written: list[str] = []
        self.failed: dict[str, str] = {}

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        if "row" not in result:
            return
        trial_id = result["row"]["trial_id"]
        try:
            self.results.add_trial(result["row"], result.get("rollouts") or [])
        except Exception as err:  # an exception here would make Tune rerun a finished trial
            message = f"could not add trial {trial_id} to {self.results.folder}: {err!r}"
            print(f"demoscale sweep: {message}", file=sys.stderr)
            self.failed[trial_id] = message
            return
        self.written.append(trial_id)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.failed[_trial_id(trial)] = str(
            getattr(trial, "error_file", None) or "see the trial's error file"
        )


def _trial_id(trial: Any) -> str:
    return str(trial.config.get("point", {}).get("trial_id", trial.trial_id))


class LiveTable(Callback):
    """A table of trials (state, training progress, score) and the best score so far.

    On a terminal it redraws in place with rich (a declared dependency; without it, or in a pipe or
    a log file, it prints plain lines instead): one line per change of state, and each running
    trial's progress (steps, loss, samples/s, ETA) at most every ``progress_every_s`` seconds.
    """

    def __init__(
        self, total: int, skipped: int = 0, stream: Any = None, progress_every_s: float = 30.0
    ) -> None:
        self.total = total
        self.skipped = skipped
        self.stream = stream or sys.stdout
        self.progress_every_s = progress_every_s
        self.state: dict[str, str] = {}
        self.scores: dict[str, float] = {}
        self.retries: dict[str, int] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self._progress_printed: dict[str, float] = {}
        self.started = time.perf_counter()
        self.live = None
        if getattr(self.stream, "isatty", lambda: False)():
            try:
                from rich.console import Console
                from rich.live import Live
            except ImportError:  # plain lines are a complete display too
                return
            self.live = Live(
                self._render(), console=Console(file=self.stream), refresh_per_second=2, transient=False
            )
            self.live.start()

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment state; terminals and rich displays stay behind.
        return {**self.__dict__, "stream": None, "live": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stream = self.stream or sys.stdout

    def _counts(self) -> dict[str, int]:
        counts = {"running": 0, "finished": 0, "failed": 0, "retrying": 0}
        for state in self.state.values():
            counts[state] += 1
        return counts

    def _best(self) -> str:
        if not self.scores:
            return "best score: -"
        best = max(self.scores, key=self.scores.get)
        return f"best score: {self.scores[best]:.3f} ({best})"

    def _summary(self) -> str:
        c = self._counts()
        pending = self.total - sum(c.values())
        return (
            f"[{time.perf_counter() - self.started:6.0f}s] trials: {c['finished']} finished, {c['running']} running, "
            f"{c['retrying']} retrying, {c['failed']} failed, {pending} pending"
            + (f", {self.skipped} already done" if self.skipped else "")
            + f" | {self._best()}"
        )

    def _progress_cells(self, trial: str) -> tuple[str, str, str, str]:
        progress = self.progress.get(trial)
        if not progress or self.state.get(trial) not in ("running", "retrying"):
            return "", "", "", ""
        step = (
            f"{progress['step']}/{progress['max_steps']}"
            if progress.get("max_steps")
            else str(progress["step"])
        )
        loss = "" if progress.get("loss") is None else f"{progress['loss']:.4g}"
        rate = f"{progress['samples_per_s']:.0f}" if progress.get("samples_per_s") else ""
        eta = "" if progress.get("eta_s") is None else format_duration(progress["eta_s"])
        return step, loss, rate, eta

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(title=self._summary(), title_justify="left")
        for column in ("trial", "state", "step", "loss", "samples/s", "ETA", "score", "retries"):
            table.add_column(column)
        for trial, state in self.state.items():
            score = self.scores.get(trial)
            table.add_row(
                trial,
                state,
                *self._progress_cells(trial),
                "" if score is None else f"{score:.3f}",
                str(self.retries.get(trial, 0)),
            )
        return table

    def _changed(self, trial: Any, state: str) -> None:
        name = _trial_id(trial)
        self.state[name] = state
        if self.live is not None:
            self.live.update(self._render(), refresh=True)
        else:
            score = self.scores.get(name)
            detail = f" score={score:.3f}" if score is not None else ""
            print(f"{name}: {state}{detail}  {self._summary()}", file=self.stream, flush=True)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._changed(trial, "running")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        progress = result.get("progress")
        if not isinstance(progress, dict):
            return
        name = _trial_id(trial)
        self.progress[name] = progress
        if self.live is not None:
            # Drawn now: a short trial's progress could otherwise change twice between refreshes.
            self.live.update(self._render(), refresh=True)
            return
        now = time.perf_counter()
        # Throttled, except the report of a finished training, which every trial prints once.
        if progress.get("done") or now - self._progress_printed.get(name, -math.inf) >= self.progress_every_s:
            self._progress_printed[name] = now
            print(f"{name}: training {format_progress(progress)}", file=self.stream, flush=True)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        name = _trial_id(trial)
        self.retries[name] = self.retries.get(name, 0) + 1
        self._changed(trial, "retrying")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        score = (trial.last_result or {}).get("score")
        if score is not None:
            self.scores[_trial_id(trial)] = float(score)
        self._changed(trial, "finished")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._changed(trial, "failed")

    def close(self) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.stop()
            self.live = None
