"""Scripted experts succeed on >= 90% of training ids (50 episodes per task; slow)."""

from __future__ import annotations

import pytest
from demoscale.eval import evaluate


@pytest.mark.slow
@pytest.mark.parametrize("task", ["reach", "push", "pick_place"])
def test_expert_success_over_50_training_episodes(task: str, tmp_path) -> None:
    result = evaluate("expert", task, split="train", n_envs=10, n_objects=5, episodes=50, image_size=32,
                      video_episodes=0, out_dir=tmp_path, progress=False)  # fmt: skip
    print(task, {k: result.summary[k] for k in ("n_rollouts", "success_rate", "success_ci_low", "score")})
    assert result.summary["n_rollouts"] == 50
    assert result.summary["success_rate"] >= 0.9
