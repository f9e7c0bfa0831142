"""`demoscale study`: the four sub-studies, their laws and the recommendation carried out."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from demoscale.study import (
    AXES,
    SequentialRule,
    StudyConfig,
    axis_fits,
    choose_plans,
    eval_spec,
    load_study_config,
    plan_cost,
    plan_difference,
    sequential_replay,
    study_stores,
    substudy_sweeps,
)


def test_default_and_quick_configs_describe_the_four_substudies() -> None:
    default, quick = load_study_config(), load_study_config(quick=True)
    for config in (default, quick):
        stores = study_stores(config)
        n = max(config.counts)
        assert (stores["objects"].n_envs, stores["objects"].n_objects) == (1, n)
        assert (stores["envs"].n_envs, stores["envs"].n_objects) == (n, 1)
        assert stores["pairs"].pairing == "unique" and stores["pairs"].demos_per_pair >= max(
            config.demo_counts
        )
        sweeps = substudy_sweeps(config, {k: Path(f"{k}.zarr") for k in stores}, Path("out"))
        assert set(AXES) < set(sweeps) and len(sweeps) == 5
        assert sweeps["n_objects"]["grid"]["n_objects"] == config.counts
        assert sweeps["n_envs"]["grid"]["n_envs"] == config.counts
        assert sweeps["demos_per_pair"]["grid"]["demos_per_pair"] == config.demo_counts
        repeat = next(s for name, s in sweeps.items() if name.endswith("_steps"))
        assert repeat["budget"]["steps"] == int(np.ceil(config.budget["steps"] * config.compute_factor))
    # quick keeps the default's other keys (its train_overrides add to the default's)
    assert quick.train_overrides["trainer.enable_progress_bar"] is False
    assert quick.train_overrides["data.batch_size"] == 16


def test_each_substudy_is_evaluated_on_its_own_unseen_settings() -> None:
    config = StudyConfig()
    objects, envs, pairs = (eval_spec(config, axis) for axis in ("n_objects", "n_envs", "n_pairs"))
    assert (objects["options"]["env_split"], objects["options"]["object_split"]) == ("train", "unseen")
    assert (objects["n_envs"], objects["n_objects"]) == (1, config.eval_settings)
    assert (envs["options"]["env_split"], envs["options"]["object_split"]) == ("unseen", "train")
    assert (envs["n_envs"], envs["n_objects"]) == (config.eval_settings, 1)
    assert pairs["options"]["pairing"] == "unique" and pairs["options"]["object_split"] == "unseen"


def test_axis_fits_names_the_law_the_data_prefer() -> None:
    """Five points on a saturating law (floor 0.25): both laws fit, and the comparison picks one."""
    rng = np.random.default_rng(3)
    counts = np.array([1, 2, 4, 8, 16])
    gap = 0.25 + 0.5 * counts**-0.8
    results = pd.DataFrame({"trial_id": [f"t{n}" for n in counts], "n_objects": counts, "score": 1 - gap,
                            "n_rollouts": 400})  # fmt: skip
    rollouts = pd.concat(
        [pd.DataFrame({"trial_id": f"t{n}", "rollout_index": range(400),
                       "score": (rng.random(400) < 1 - g).astype(float)}) for n, g in zip(counts, gap, strict=True)],
        ignore_index=True,
    )  # fmt: skip
    rollouts["success"] = rollouts["score"] == 1.0
    summary = axis_fits(results, rollouts, "n_objects", 0.9)["summary"]
    assert summary["preferred_law"] in ("loglog", "saturating")
    assert "AICc" in summary["evidence"] and summary["alpha"] < 0 and summary["n_trials"] == 5


def test_sequential_replay_cuts_each_trial_where_the_rule_stops() -> None:
    rng = np.random.default_rng(0)
    results = pd.DataFrame({"trial_id": ["a", "b"], "n_pairs": [1, 2], "score": [1.0, 0.5],
                            "score_ci_low": 0.0, "score_ci_high": 1.0, "success_rate": 0.0,
                            "n_rollouts": 40})  # fmt: skip
    rollouts = pd.DataFrame({
        "trial_id": ["a"] * 40 + ["b"] * 40,
        "rollout_index": list(range(40)) * 2,
        "score": [1.0] * 40 + list(rng.integers(0, 2, 40).astype(float)),
    })  # fmt: skip
    rollouts["success"] = rollouts["score"] == 1.0
    cut, saving = sequential_replay({"n_pairs": (results, rollouts)}, SequentialRule(0.07, 8, 4), 0.9)
    rows, kept = cut["n_pairs"]
    # All 1s narrow at 20 rollouts (the 90% interval of 20/20 is [0.88, 1]); a coin never does.
    assert list(rows["n_rollouts"]) == [20, 40]
    assert (
        len(kept) == 60 and saving["rollouts_fixed"] == 80 and saving["saved_fraction"] == pytest.approx(0.25)
    )
    assert rows.loc[0, "score"] == 1.0 and rows.loc[0, "score_ci_low"] > 0.85


def test_the_alternative_plan_costs_what_the_recommendation_costs() -> None:
    config = StudyConfig()
    trials = pd.DataFrame({"trial_id": [f"t{n}" for n in config.counts], "n_pairs": config.counts,
                           "demos_per_pair": config.demos_per_pair,
                           "score": [0.2, 0.35, 0.5, 0.62, 0.72], "n_rollouts": 60})  # fmt: skip
    _, recommended, alternative, asked = choose_plans(config, (trials, None))
    assert alternative.n_pairs == max(1, recommended.n_pairs // 2)
    assert alternative.demos_per_pair > recommended.demos_per_pair  # the same money on fewer pairs
    assert abs(alternative.cost - recommended.cost) <= alternative.n_pairs * config.cost_demo
    assert recommended.cost == plan_cost(config, recommended.n_pairs, recommended.demos_per_pair)
    assert asked


def test_the_plans_difference_has_an_interval_over_seeds_and_rollouts(tmp_path: Path) -> None:
    """From the plans' rollout tables as the study writes them (one trial per seed): a difference
    whose interval holds zero is reported as a tie, one that excludes it is not."""
    from demoscale.scaling.bootstrap import mean_difference_interval
    from demoscale.study import _validation_text

    rng = np.random.default_rng(3)
    scores = {"recommended": [rng.uniform(0.6, 1.0, 60), rng.uniform(0.6, 1.0, 60)],
              "alternative": [rng.uniform(0.62, 1.0, 60), rng.uniform(0.62, 1.0, 60)]}  # fmt: skip
    for label, seeds in scores.items():
        folder = tmp_path / "sweeps" / f"plan_{label}"
        folder.mkdir(parents=True)
        pd.concat(
            [pd.DataFrame({"trial_id": f"{label}-s{seed}", "rollout_index": range(60), "score": values})
             for seed, values in enumerate(seeds)], ignore_index=True,
        ).to_csv(folder / "rollouts.csv", index=False)  # fmt: skip
    difference, low, high = plan_difference(tmp_path, 0.9)
    assert (difference, low, high) == mean_difference_interval(
        scores["recommended"], scores["alternative"], 0.9
    )
    assert difference == pytest.approx(np.mean(scores["recommended"]) - np.mean(scores["alternative"]))
    validation = {"asked": "the plan", "plan": {"n_pairs": 64, "demos_per_pair": 6, "cost": 2624.0},
                  "predicted": 0.76, "level": 0.8, "interval": "prediction", "predicted_low": 0.46,
                  "predicted_high": 0.9, "achieved": 0.81, "achieved_per_seed": [0.83, 0.79], "inside_interval": True,
                  "alternative_plan": {"n_pairs": 32, "demos_per_pair": 47, "cost": 2624.0},
                  "alternative_achieved": 0.84, "recommended_beats_alternative": False,
                  "difference": difference, "difference_ci": [low, high], "difference_level": 0.9}  # fmt: skip
    assert low < 0 < high
    assert "does not beat it" in _validation_text(validation, "$")
    assert "a tie within the noise" in _validation_text(validation, "$")
    validation["difference_ci"] = [-0.09, -0.01]
    assert "a tie" not in _validation_text(validation, "$")


def test_print_config_and_bad_keys(capsys) -> None:
    from demoscale.study import main

    assert main(["--quick", "--print-config", "--set", "target=0.7"]) == 0
    assert "target: 0.7" in capsys.readouterr().out
    assert main(["--print-config", "--set", "no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def _study(out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "demoscale", "study", "--quick", "--out", str(out), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_killed_study_resumes_and_reruns_only_unfinished_trials(tmp_path: Path) -> None:
    out = tmp_path / "study"
    first = _study(out)
    objects = out / "sweeps" / "n_objects" / "results.csv"
    deadline = time.monotonic() + 1800
    while not objects.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(2)
    assert objects.exists(), first.communicate()[0][-3000:]
    first.kill()
    first.wait()
    before = pd.read_csv(objects)
    rows_before = {p: p.stat().st_mtime for p in (out / "sweeps" / "n_objects" / "trials").glob("*/row.json")}
    resumed = _study(out, "--resume")
    log = resumed.communicate(timeout=3000)[0]
    assert resumed.returncode == 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["axes"]) == set(AXES)
    for axis in AXES:
        assert set(summary["axes"][axis]) >= {"alpha", "alpha_ci", "r", "preferred_law"}
    assert {"plan", "predicted", "predicted_low", "predicted_high", "achieved", "alternative_plan",
            "alternative_achieved", "difference", "difference_ci"} <= set(summary["validation"])  # fmt: skip
    assert 0 <= summary["rollouts_saved_fraction"] < 1 and summary["wall_minutes"] > 0
    assert summary["headline"] and (out / "report.md").exists()
    assert list((out / "plots").glob("study_overview*.png"))
    # The trials finished before the kill were not run again.
    after = pd.read_csv(objects)
    assert set(before["trial_id"]) <= set(after["trial_id"])
    for path, mtime in rows_before.items():
        assert path.stat().st_mtime == mtime
    assert "store objects: 9 episodes already collected" in log


def _pairs_tables(lengths: dict[int, int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(5)
    results = pd.DataFrame({"trial_id": [f"p{n}" for n in lengths], "n_pairs": list(lengths),
                            "demos_per_pair": 6, "score": 0.5, "score_ci_low": 0.0, "score_ci_high": 1.0,
                            "success_rate": 0.5, "n_rollouts": list(lengths.values())})  # fmt: skip
    rollouts = pd.concat(
        [pd.DataFrame({"trial_id": f"p{n}", "rollout_index": range(m), "score": rng.integers(0, 2, m).astype(float)})
         for n, m in lengths.items()], ignore_index=True,
    )  # fmt: skip
    rollouts["success"] = rollouts["score"] == 1.0
    return results, rollouts


@pytest.mark.parametrize("policy", ["targeted", "uniform"])
def test_extra_rollouts_come_from_the_recorded_ones_a_round_at_a_time(policy: str) -> None:
    from demoscale.study import extra_rollouts

    results, rollouts = _pairs_tables({1: 30, 2: 30, 4: 30, 8: 30, 16: 24})
    start = {"p1": 20, "p2": 20, "p4": 20, "p8": 20, "p16": 20}
    kept, given = extra_rollouts(results, rollouts, start, at=64, extra=28, round_size=8, policy=policy)
    assert sum(given.values()) == 28 and all(kept[t] == start[t] + given.get(t, 0) for t in start)
    assert kept["p16"] <= 24  # never beyond what was recorded
    if policy == "targeted":
        assert given["p16"] == 4  # the far end first, until its recorded rollouts run out
    else:
        assert sorted(given.values()) == [4, 8, 8, 8]  # the fewest first, in turn
    # More extras than recorded rollouts: everything is used, and no more.
    kept, given = extra_rollouts(results, rollouts, start, at=64, extra=500, round_size=8, policy=policy)
    assert kept == {"p1": 30, "p2": 30, "p4": 30, "p8": 30, "p16": 24}
    with pytest.raises(ValueError, match="policy"):
        extra_rollouts(results, rollouts, start, at=64, extra=8, round_size=8, policy="greedy")


def test_targeted_replay_counts_the_extras_in_the_saving() -> None:
    from demoscale.study import targeted_replay

    config = StudyConfig(sequential=SequentialRule(0.3, 8, 4, extra_rollouts=12))  # coins stop at 8-12
    results, rollouts = _pairs_tables({1: 40, 2: 40, 4: 40, 8: 40, 16: 40})
    tables = {"n_pairs": (results, rollouts)}
    cut, saving = sequential_replay(tables, config.sequential, 0.9)
    assert saving["rollouts_sequential"] <= 200 - 12
    new_cut, new_saving = targeted_replay(tables, cut, saving, config)
    assert sum(new_saving["extra_given"].values()) == 12
    assert new_saving["rollouts_sequential"] == saving["rollouts_sequential"] + 12
    assert new_saving["rollouts_stopping_rule"] == saving["rollouts_sequential"]
    assert new_cut["n_pairs"][0]["n_rollouts"].sum() == new_saving["rollouts_sequential"]
    assert new_saving["saved_fraction"] == pytest.approx(1 - new_saving["rollouts_sequential"] / 200)
