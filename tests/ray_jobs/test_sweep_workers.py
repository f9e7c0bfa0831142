"""Trials trained by several workers: the config, what Tune reserves, and a real 2-worker trial.

The real trial runs on a private local Ray with 2 CPUs: a one-worker and a two-worker trial of the
same tiny policy in one sweep. The two-worker trial's ranks are Ray actors of their own, in the
bundles of the trial's placement group, training one Lightning DDP run (gloo).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from demoscale.policies import load_policy
from demoscale.ray_jobs import RESULT_COLUMNS, SweepConfigError, run_sweep, sweep_config_from_dict
from demoscale.ray_jobs.sweep import trial_placement


def _two_policies(sweep_files, **two: object) -> dict:
    training = str(sweep_files["training"])
    return dict(
        sweep_files["sweep"],
        grid={"n_envs": [2], "n_objects": [1], "demos_per_pair": [3], "seed": [0]},
        policies={"one": {"config": training}, "two": {"config": training, "resources": two}},
    )


def test_workers_are_a_resources_setting_per_sweep_or_per_policy(sweep_files) -> None:
    config = sweep_config_from_dict(_two_policies(sweep_files, cpu=1, workers=2))
    assert config.resources.workers == 1  # the default stays one worker
    assert config.trial_resources("one") == config.resources
    assert (config.trial_resources("two").workers, config.trial_resources("two").cpu) == (2, 1.0)
    for bad, message in (
        ({"workers": 0}, "workers must be >= 1"),
        ({"workers": 2, "gpu": 0.5}, "gpu must be 0 or 1"),
        ({"workers": 2, "cpu": 0}, "cpu must be > 0"),
        ({"worker": 2}, "unknown key"),
    ):
        with pytest.raises(SweepConfigError, match=message):
            sweep_config_from_dict(_two_policies(sweep_files, **bad))
    with pytest.raises(SweepConfigError, match=r"resources: workers must be >= 1"):
        sweep_config_from_dict(dict(sweep_files["sweep"], resources={"workers": 0}))


def test_tune_reserves_every_worker_of_a_trial_at_once() -> None:
    from demoscale.ray_jobs.config import TrialResources

    one = trial_placement(TrialResources(cpu=2, gpu=0.25))
    assert one.bundles == [{"CPU": 2.0, "GPU": 0.25}] and not one.head_bundle_is_empty
    four = trial_placement(TrialResources(cpu=4, gpu=1, workers=4))
    # An empty head bundle (the trial's process only coordinates) and one bundle per rank.
    assert four.head_bundle_is_empty and four.bundles == [{"CPU": 4.0, "GPU": 1.0}] * 4
    assert four.strategy == "PACK"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_a_two_worker_trial_trains_on_two_ranks_inside_a_sweep(sweep_files) -> None:
    result = run_sweep(_two_policies(sweep_files, cpu=1, workers=2))
    output = sweep_files["output"]
    assert result.failed == [] and sorted(result.ran) == ["one-e2-o1-d3-s0", "two-e2-o1-d3-s0"]
    rows = result.results.set_index("trial_id")
    assert list(result.results.columns) == RESULT_COLUMNS
    one, two = (_read(output / "trials" / f"{name}-e2-o1-d3-s0" / "row.json") for name in ("one", "two"))
    # The same row, field for field and type for type, as a one-worker trial's.
    assert one.keys() == two.keys()
    assert {k: type(v) for k, v in one.items()} == {k: type(v) for k, v in two.items()}
    assert rows.loc["two-e2-o1-d3-s0", "train_steps"] == rows.loc["one-e2-o1-d3-s0", "train_steps"] == 4
    # Micro-batch 8 on each of two ranks: twice the samples of the one-worker trial per step.
    assert rows.loc["one-e2-o1-d3-s0", "samples_seen"] == 32
    assert rows.loc["two-e2-o1-d3-s0", "samples_seen"] == 64
    assert 0 < rows.loc["two-e2-o1-d3-s0", "score"] <= 1

    trained = _read(output / "trials" / "two-e2-o1-d3-s0" / "train_result.json")
    ranks = trained["workers"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    assert all(rank["world_size"] == 2 and rank["steps"] == 4 for rank in ranks)
    assert all(rank["batches"] == 4 and rank["samples"] == 32 for rank in ranks)  # both trained
    trial_process = _read_attempts(output / "trials" / "two-e2-o1-d3-s0")[0]["pid"]
    assert len({rank["pid"] for rank in ranks} | {trial_process}) == 3  # two processes of their own
    assert "workers" not in _read(output / "trials" / "one-e2-o1-d3-s0" / "train_result.json")

    for trial in rows.index:
        checkpoint = Path(output) / rows.loc[trial, "checkpoint"]
        assert checkpoint.name == "last.ckpt" and checkpoint.parent.parent.name == trial
        policy = load_policy(checkpoint)
        actions = policy.predict_action({"robot0_eef_pos": np.zeros((1, 3), np.float32)}, seed=0)
        assert actions.shape == (4, 3) and np.isfinite(actions).all()


def _read_attempts(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "attempts.jsonl").read_text().splitlines()]
