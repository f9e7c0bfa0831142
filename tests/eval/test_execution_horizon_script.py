"""``benchmarks/execution_horizon.py`` on the saved pose-only diffusion fixture (4-step chunks, reach):
every combination of executed actions and inference delay that fits the chunk runs, the others are
named and skipped, and the record pools each setting. Real MuJoCo rollouts, ~15 s."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "diffusion_waypoint.ckpt"


def test_settings_that_fit_the_chunk_run_and_are_recorded(tmp_path: Path, run_benchmark) -> None:
    record = tmp_path / "record"
    result = run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--split", "train", "--envs", "1",
        "--episodes", "1", "--n-action-steps", "2", "--inference-delays", "0", "2", "3", "--threads", "1",
        "--json", str(tmp_path / "out.json"), "--record", str(record), "--policy", "fixture",
    )  # fmt: skip
    # 2 executed + delay 3 needs 5 actions of a 4-action chunk (and a delay beyond the executed part).
    assert "skipped: 2 executed with delay 3" in result.stdout
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [(row["n_action_steps"], row["inference_delay"]) for row in rows] == [(2, 0), (2, 2)]
    summary = json.loads((record / "summary.json").read_text())
    assert [(p["n_action_steps"], p["inference_delay"]) for p in summary["pooled"]] == [(2, 0), (2, 2)]
    assert {row["policy"] for row in summary["headline"]} == {
        "fixture; 2 actions executed per chunk, delay 0, 4 denoising steps",
        "fixture; 2 actions executed per chunk, delay 2, 4 denoising steps",
    }
    assert "| 2 / 2 / 4 | 1 (0) |" in (record / "README.md").read_text()
