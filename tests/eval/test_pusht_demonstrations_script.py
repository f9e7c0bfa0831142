"""``benchmarks/pusht_demonstrations.py`` on the real PushT replay buffer: the demonstrations scored
as the evaluator scores a policy. Its held replay must agree with ``evaluate("expert", ...)``
rollout for rollout, and the recorded scheme can never beat it. Real pymunk rollouts, ~20 s."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest


def test_demonstrations_are_scored_as_the_evaluator_scores_their_replay(
    tmp_path: Path, run_benchmark, pusht_replay_path: Path
) -> None:
    from demoscale.eval import evaluate

    record = tmp_path / "record"
    run_benchmark(
        "pusht_demonstrations.py", str(pusht_replay_path), "--episodes", "4", "--record", str(record),
        "--json", str(tmp_path / "out.json"),
    )  # fmt: skip
    episodes = pd.read_csv(record / "rollouts.csv").set_index("episode")
    assert list(episodes.index) == [0, 1, 2, 3]
    # The recorded actions retrace the recorded states.
    assert (episodes["max_state_deviation_px"] < 0.01).all()
    assert (episodes["final_coverage"] <= episodes["recorded_max_coverage"]).all()
    assert (episodes["recorded_max_coverage"] <= episodes["held_max_coverage"]).all()
    result = evaluate(
        "expert", "pusht", split="train", n_envs=4, video_episodes=0,
        env_options={"replay_path": str(pusht_replay_path), "images": False}, progress=False,
    )  # fmt: skip
    rollouts = result.rollouts.set_index("env_id")
    for episode, row in episodes.iterrows():
        assert row["held_max_coverage"] == pytest.approx(rollouts.loc[episode, "raw_max_coverage"], abs=1e-9)
    summary = json.loads((record / "summary.json").read_text())
    rows = {(row["policy"], row["metric"]): row for row in summary["headline"]}
    held = rows[("human demonstrations, last action held to 300 steps", "success_rate")]
    assert held["value"] == pytest.approx(result.summary["success_rate"])
    assert held["n_rollouts"] == 4 and held["split"] == "train" and held["task"] == "pusht"
    coverage = rows[("human demonstrations, recorded frames", "mean_max_coverage")]
    expected = (episodes["recorded_max_coverage"] / 0.95).clip(upper=1.0).mean()
    assert coverage["value"] == pytest.approx(expected)
    assert coverage["ci_low"] <= coverage["value"] <= coverage["ci_high"]
    assert (record / "figure.png").stat().st_size > 0
    assert "human demonstrations, recorded frames | 4 |" in (record / "README.md").read_text()
