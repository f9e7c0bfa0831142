"""A sweep driver killed between a finished trial and its row: nothing lost, nothing trained twice.

The fast tests make the states such a kill leaves with real trials (real training, run in this
process as a worker would); the slow test kills a real driver process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from demoscale.ray_jobs import SweepError, run_sweep
from demoscale.ray_jobs.config import sweep_config_from_dict
from demoscale.ray_jobs.grid import plan_trials
from demoscale.ray_jobs.sweep import _load_episodes
from demoscale.ray_jobs.trial import TrialRuntime, run_trial


def _points(sweep: dict) -> tuple[object, list[dict]]:
    config = sweep_config_from_dict(sweep)
    return config, plan_trials(config, _load_episodes(config.store), config.store)


@pytest.fixture
def two_trials(sweep_files) -> dict:
    return dict(
        sweep_files["sweep"], grid={"n_envs": [1], "n_objects": [1], "demos_per_pair": [2, 3], "seed": [0]}
    )


def test_resume_takes_rows_of_finished_trials_from_their_folders(two_trials, sweep_files) -> None:
    """Both trials finished on their workers, the driver died before writing either row."""
    config, points = _points(two_trials)
    output = str(sweep_files["output"])
    outcomes = {p["trial_id"]: run_trial(p, TrialRuntime(config=config, output=output)) for p in points}
    assert not (sweep_files["output"] / "results.csv").exists()
    result = run_sweep(two_trials, resume=True)  # nothing to train: Ray is not even started
    assert result.ran == [] and result.failed == [] and sorted(result.recovered) == sorted(outcomes)
    rows = result.results.set_index("trial_id")
    for trial_id, outcome in outcomes.items():
        assert rows.loc[trial_id, "score"] == pytest.approx(outcome["score"])
        assert rows.loc[trial_id, "train_steps"] == 4
    for trial_id in outcomes:  # each trial trained once: one attempt, no second training
        attempts = (sweep_files["output"] / "trials" / trial_id / "attempts.jsonl").read_text().splitlines()
        assert len(attempts) == 1
    # Without --resume, finished trials in the folder (even with no table yet) are not silently rerun.
    for table in sweep_files["output"].glob("r*.*"):
        table.unlink()
    with pytest.raises(SweepError, match="--resume"):
        run_sweep(two_trials)


def test_trial_whose_training_finished_unrecorded_is_evaluated_without_training(
    two_trials, sweep_files
) -> None:
    """last.ckpt already at max_steps, no result on record, rollout scoring: training is done, the
    trial evaluates that checkpoint (no step trained again) and completes with the same row."""
    two_trials = dict(two_trials, eval={"mode": "rollouts", "task": "reach", "n_envs": 1, "episodes": 2})
    config, points = _points(two_trials)
    output = str(sweep_files["output"])
    # The sweep's tiny store has no simulator behind it: this scorer reads the checkpoint it is given
    # (a real file) and scores its weights, so the same final weights give the same score.
    runtime = TrialRuntime(config=config, output=output, evaluate_fn=_score_of_weights)
    first = run_trial(points[0], runtime)
    folder = sweep_files["output"] / "trials" / points[0]["trial_id"]
    for name in ("row.json", "rollouts.json", "train_result.json"):
        (folder / name).unlink(missing_ok=True)  # as if the attempt died right after its final checkpoint
    checkpoints = {p.name: p.stat().st_mtime_ns for p in (folder / "checkpoints").iterdir()}
    again = run_trial(points[0], runtime)
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "checkpoints").iterdir()} == checkpoints
    assert again["row"]["train_steps"] == 4
    assert again["row"]["samples_seen"] == first["row"]["samples_seen"]
    assert again["score"] == pytest.approx(first["score"])  # the same final weights
    assert json.loads((folder / "train_result.json").read_text())["recovered_from_checkpoint"] is True
    # With the training result on record, a later attempt evaluates without training at all.
    (folder / "row.json").unlink()
    third = run_trial(points[0], runtime)
    assert third["score"] == pytest.approx(first["score"])
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "checkpoints").iterdir()} == checkpoints
    assert json.loads((folder / "attempts.jsonl").read_text().splitlines()[-1])["training_done"] is True


def _score_of_weights(checkpoint: str, **_: object) -> dict:
    from demoscale.policies import load_checkpoint

    weights = load_checkpoint(checkpoint)["state_dict"].values()
    score = float(sum(float(w.float().abs().sum()) for w in weights)) % 1.0
    summary = {"score": score, "success_rate": 0.5, "success_ci_low": 0.1, "success_ci_high": 0.9}
    return {"rollouts": None, "summary": summary}


def test_offline_trial_whose_training_finished_unrecorded_retrains_its_last_stretch(
    two_trials, sweep_files
) -> None:
    """Offline scoring needs training's validation loss, which a finished last.ckpt does not hold:
    training resumes from the step checkpoint before the end and reproduces the same score."""
    config, points = _points(two_trials)
    output = str(sweep_files["output"])
    runtime = TrialRuntime(config=config, output=output)
    first = run_trial(points[0], runtime)
    folder = sweep_files["output"] / "trials" / points[0]["trial_id"]
    for name in ("row.json", "rollouts.json", "train_result.json"):
        (folder / name).unlink(missing_ok=True)
    again = run_trial(points[0], runtime)
    assert again["row"]["train_steps"] == 4
    assert again["score"] == pytest.approx(first["score"])  # exact resume: same weights, same val/loss
    assert json.loads((folder / "attempts.jsonl").read_text().splitlines()[-1])["resume_from"].endswith(
        "step0000002.ckpt"
    )


def test_bad_yaml_tag_in_a_sweep_file_is_a_message(tmp_path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("name: !!python/object/apply:os.system ['touch pwned']\n")
    command = [sys.executable, "-m", "demoscale", "sweep", "--config", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2 and "not valid YAML" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "pwned").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # hang guard: two sweeps of two tiny trials on a loaded 2-core machine
def test_killed_driver_then_resume_gives_every_row(two_trials, sweep_files, tmp_path) -> None:
    """SIGKILL the driver the moment a trial has written its row.json; --resume completes the table."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(two_trials))
    command = [sys.executable, "-m", "demoscale", "sweep", "--config", str(path)]
    driver = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    trials = sweep_files["output"] / "trials"
    try:
        deadline = time.monotonic() + 900
        while not list(trials.glob("*/row.json")) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(trials.glob("*/row.json")), "no trial finished"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        driver.wait()
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=1500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = run_sweep(two_trials, resume=True).results
    assert sorted(rows["trial_id"]) == sorted(p["trial_id"] for p in _points(two_trials)[1])
    assert rows["score"].between(0, 1).all() and (rows["train_steps"] == 4).all()
