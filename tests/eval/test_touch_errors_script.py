"""``benchmarks/touch_errors.py`` on the scripted expert: at the shelf its base stands still, it
touches the object every time and never knocks it off the board. The figures the script reports for
policies are read against these. Real MuJoCo rollouts with point clouds, ~15 s."""

from __future__ import annotations

import json
from pathlib import Path


def test_the_expert_stands_still_at_the_shelf_and_touches(tmp_path: Path, run_benchmark) -> None:
    out = tmp_path / "touch_errors.json"
    result = run_benchmark("touch_errors.py", "expert", "--rollouts", "2", "--json", str(out))
    assert "| expert | 1.00 | 1.00 |" in result.stdout
    expert = json.loads(out.read_text())["policies"]["expert"]
    assert expert["rollouts"] == 2 and expert["success_rate"] == 1.0
    assert expert["base_forward_at_shelf_median"] < 0.05  # m/s: decelerating, then still
    assert expert["object_left_board_rate"] == 0.0
    assert expert["closest_hand_mm_failures_median"] is None  # no misses
    for rollout in expert["per_rollout"]:
        assert rollout["closest_hand_mm"] <= 0.5 and rollout["stages"] == [True, True, True]
        assert rollout["steps"] < 100  # the expert touches in about 60 steps
