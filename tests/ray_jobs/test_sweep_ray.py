"""Sweeps on a real local Ray with the real trainer: grid rows, a killed worker, resuming, a cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from demoscale.ray_jobs import RESULT_COLUMNS, SweepError, run_sweep
from demoscale.ray_jobs.cli import main as sweep_main
from demoscale.ray_jobs.results import ResultsFolder

KILLED = "tiny-e2-o1-d3-s0"


def _attempts(output: Path, trial: str) -> list[dict]:
    return [
        json.loads(line) for line in (output / "trials" / trial / "attempts.jsonl").read_text().splitlines()
    ]


def _assert_resumed_from_checkpoint(output: Path, trial: str) -> None:
    """The second attempt started from last.ckpt and trained on from step 2 instead of redoing it
    (the injected kill comes from inside training, right after the step-2 checkpoint)."""
    attempts = _attempts(output, trial)
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["resume_from"] is None
    assert attempts[1]["resume_from"].endswith("checkpoints/last.ckpt")
    assert (output / "trials" / trial / "fault_injected.json").exists()
    checkpoints = output / "trials" / trial / "checkpoints"
    second_start = attempts[1]["started"]
    assert (checkpoints / "step0000002.ckpt").stat().st_mtime < second_start  # written once, by attempt 1
    assert (checkpoints / "step0000004.ckpt").stat().st_mtime > second_start


# In the default suite on purpose: the CI check of the sweep (about a minute on 2 idle cores).
def test_grid_sweep_survives_a_killed_worker(sweep_files) -> None:
    """2x2 grid: 4 rows with the grid's axis values, once each; the killed trial resumed from its checkpoint."""
    sweep = dict(sweep_files["sweep"], fault_injection={"kill_after_first_checkpoint": [KILLED]})
    result = run_sweep(sweep)
    output = sweep_files["output"]
    assert result.failed == [] and sorted(result.ran) == sorted(result.planned)
    rows = result.results
    assert list(rows.columns) == RESULT_COLUMNS
    assert len(rows) == 4 and rows["trial_id"].is_unique
    assert sorted(zip(rows["n_envs"], rows["demos_per_pair"], strict=True)) == [
        (1, 2),
        (1, 3),
        (2, 2),
        (2, 3),
    ]
    assert (rows["n_objects"] == 1).all() and (rows["seed"] == 0).all()
    assert (rows["total_demos"] == rows["n_envs"] * rows["demos_per_pair"]).all()
    assert (rows["train_steps"] == 4).all() and (rows["samples_seen"] == 32).all()
    assert rows["score"].between(0, 1).all() and (rows["n_rollouts"] == 0).all()
    # Checkpoints are recorded relative to the sweep folder (the table travels with it).
    assert all(
        c == f"trials/{t}/checkpoints/last.ckpt"
        for t, c in zip(rows["trial_id"], rows["checkpoint"], strict=True)
    )
    assert all(Path(ResultsFolder(str(output)).resolve(c)).exists() for c in rows["checkpoint"])
    assert (output / "results.parquet").exists() and (output / "rollouts.csv").exists()
    _assert_resumed_from_checkpoint(output, KILLED)
    # The killed trial's row says it took a second attempt (its wall time is that attempt's).
    assert dict(zip(rows["trial_id"], rows["attempts"], strict=True)) == {
        trial: (2 if trial == KILLED else 1) for trial in rows["trial_id"]
    }


@pytest.mark.slow
def test_resume_runs_only_unfinished_trials(tmp_path: Path, sweep_files) -> None:
    """A trial that dies with no retries left has no row; --resume runs it alone, from its checkpoint."""
    sweep = dict(sweep_files["sweep"], retries=0, fault_injection={"kill_after_first_checkpoint": [KILLED]})
    first = run_sweep(sweep)
    assert first.failed == [KILLED] and len(first.results) == 3
    rows_before = first.results.set_index("trial_id")
    with pytest.raises(SweepError, match="--resume"):
        run_sweep(sweep)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert sweep_main(["--config", str(path), "--resume"]) == 0
    results = run_sweep(sweep, resume=True)  # nothing left: no trial runs, Ray is not even started
    assert results.ran == [] and sorted(results.skipped) == sorted(results.planned)
    rows = results.results.set_index("trial_id")
    assert len(rows) == 4 and rows.index.is_unique
    for trial in rows_before.index:  # finished rows untouched
        assert rows.loc[trial, "wall_time_s"] == rows_before.loc[trial, "wall_time_s"]
    _assert_resumed_from_checkpoint(sweep_files["output"], KILLED)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _stop_process_group(leader: subprocess.Popen) -> None:
    """SIGTERM the group led by ``leader`` (what ``ray start --block`` started), then SIGKILL what is left."""
    os.killpg(leader.pid, signal.SIGTERM)
    try:
        leader.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(leader.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    leader.wait(timeout=20)


@pytest.mark.slow
def test_sweep_joins_a_cluster_started_with_ray_start(sweep_files, monkeypatch) -> None:
    """``ray start --head`` on loopback, ``--address 127.0.0.1:PORT``; then stop only that cluster.

    ``ray stop`` would stop every Ray process on the machine, so the head runs with ``--block`` in
    its own process group and a private temp dir: stopping it means signalling that group, and the
    temp dir (named in every one of its processes' command lines) shows that nothing was left.
    """
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray_cluster_test_")
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen(
        [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
         f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
                time.sleep(0.5)
        # `ray start` turns token authentication on; the driver then has to present the token too.
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        sweep = dict(sweep_files["sweep"], grid={"n_envs": [1], "demos_per_pair": [2]})
        result = run_sweep(sweep, address=f"127.0.0.1:{port}")
        assert result.failed == [] and result.results["trial_id"].tolist() == ["tiny-e1-o1-d2-s0"]
        assert _processes_mentioning(temp_dir), "the cluster must still be up: a driver only disconnects"
    finally:
        _stop_process_group(head)
    deadline = time.monotonic() + 30
    while _processes_mentioning(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_mentioning(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_sweep_logger_flag_tracks_every_trial_as_a_run_of_the_sweep_group(sweep_files, tmp_path) -> None:
    """``demoscale sweep --logger tensorboard``: group = the sweep's name, run = the trial id."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep = dict(sweep_files["sweep"], grid={"n_envs": [1, 2], "demos_per_pair": [2]})
    sweep["budget"] = dict(sweep["budget"], steps=2)
    training = str(sweep_files["training"])
    sweep["policies"] = {"tiny": {"config": training, "overrides": {"trainer.log_every_n_steps": 1}}}
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep))
    assert sweep_main(["--config", str(config), "--logger", "tensorboard"]) == 0
    group = sweep_files["output"] / "tracking" / "tensorboard" / "test"
    assert sorted(p.name for p in group.iterdir()) == ["tiny-e1-o1-d2-s0", "tiny-e2-o1-d2-s0"]
    for run in group.iterdir():
        events = EventAccumulator(str(run))
        events.Reload()
        assert "train/loss" in events.Tags()["scalars"], run
