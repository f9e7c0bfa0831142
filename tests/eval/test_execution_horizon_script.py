"""``benchmarks/execution_horizon.py`` on the saved pose-only diffusion fixture (4-step chunks, reach):
every combination of executed actions, inference delay and temporal ensembling that fits the chunk
runs, the others are named and skipped, and the record pools each setting. Real MuJoCo rollouts, ~20 s."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "diffusion_waypoint.ckpt"


def test_settings_that_fit_the_chunk_run_and_are_recorded(tmp_path: Path, run_benchmark) -> None:
    record = tmp_path / "record"
    result = run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--split", "train", "--envs", "1",
        "--episodes", "1", "--n-action-steps", "2", "--inference-delays", "0", "2", "3", "--threads", "1",
        "--temporal-ensembles", "off", "0",
        "--json", str(tmp_path / "out.json"), "--record", str(record), "--policy", "fixture",
    )  # fmt: skip
    # 2 executed + delay 3 needs 5 actions of a 4-action chunk (and a delay beyond the executed part).
    assert "skipped: 2 executed with delay 3" in result.stdout
    # Temporal ensembling replans every step: it runs once, without a delay, with one action per chunk.
    assert "skipped: temporal ensembling with delay 2" in result.stdout
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    settings = [(row["n_action_steps"], row["inference_delay"], row["temporal_ensemble"]) for row in rows]
    assert settings == [(2, 0, "off"), (1, 0, 0.0), (2, 2, "off")]
    summary = json.loads((record / "summary.json").read_text())
    pooled = [(p["n_action_steps"], p["inference_delay"], p["temporal_ensemble"]) for p in summary["pooled"]]
    assert pooled == [(2, 0, None), (1, 0, 0.0), (2, 2, None)]
    assert {row["policy"] for row in summary["headline"]} == {
        "fixture; 2 actions executed per chunk, delay 0, 4 denoising steps, noise scale 1",
        "fixture; ensembled every step (decay 0), 4 denoising steps, noise scale 1",
        "fixture; 2 actions executed per chunk, delay 2, 4 denoising steps, noise scale 1",
    }
    readme = (record / "README.md").read_text()
    assert "| 2 actions executed per chunk, delay 2 | 4 | 1 | 1 (0) |" in readme
    assert "| ensembled every step (decay 0) | 4 | 1 | 1 (0) |" in readme


def test_noise_scales_are_settings_of_the_record(tmp_path: Path, run_benchmark) -> None:
    """The fixture predates the setting: it loads with the training noise (1) and runs at 0 too."""
    record = tmp_path / "record"
    run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--split", "train", "--envs", "1",
        "--episodes", "1", "--n-action-steps", "2", "--noise-scales", "1", "0", "--threads", "1",
        "--json", str(tmp_path / "out.json"), "--record", str(record), "--policy", "fixture",
    )  # fmt: skip
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [row["noise_scale"] for row in rows] == [1.0, 0.0]
    summary = json.loads((record / "summary.json").read_text())
    assert [p["noise_scale"] for p in summary["pooled"]] == [1.0, 0.0]
    assert "fixture; 2 actions executed per chunk, delay 0, 4 denoising steps, noise scale 0" in {
        row["policy"] for row in summary["headline"]
    }
    bad = run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--noise-scales", "-1", check=False
    )
    assert bad.returncode != 0 and "noise_scale must be a finite number >= 0" in bad.stderr


def test_chunk_samples_are_settings_of_the_record(tmp_path: Path, run_benchmark) -> None:
    """Candidates kept by coherence need chunks that overlap: 4 executed of 4 is skipped, named."""
    record = tmp_path / "record"
    result = run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--split", "train", "--envs", "1",
        "--episodes", "1", "--n-action-steps", "2", "4", "--chunk-samples", "1", "3", "--threads", "1",
        "--json", str(tmp_path / "out.json"), "--record", str(record), "--policy", "fixture",
    )  # fmt: skip
    assert "skipped: 4 executed with 3 chunk samples" in result.stdout
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [(row["n_action_steps"], row["chunk_samples"]) for row in rows] == [(2, 1), (2, 3), (4, 1)]
    summary = json.loads((record / "summary.json").read_text())
    assert [p["chunk_samples"] for p in summary["pooled"]] == [1, 3, 1]
    assert "fixture; 2 actions executed per chunk, delay 0, the most coherent of 3 (decay 0.5), 4 denoising steps, noise scale 1" in {
        row["policy"] for row in summary["headline"]
    }  # fmt: skip
    bad = run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--chunk-samples", "0", check=False
    )
    assert bad.returncode != 0 and "chunk_samples must be an integer >= 1" in bad.stderr
    # A bad decay ends the run before anything rolls out, even where no setting would use it.
    bad = run_benchmark(
        "execution_horizon.py", str(FIXTURE), "--task", "reach", "--coherence-decay", "1.5", check=False
    )
    assert bad.returncode != 0 and "coherence_decay must be in (0, 1]" in bad.stderr


def test_several_checkpoints_roll_out_as_one_ensemble(tmp_path: Path, run_benchmark) -> None:
    """The fixture with a copy of itself denoises exactly as the fixture alone (same rollout, same
    score); checkpoints that cannot be averaged exit with the reason."""
    import shutil

    copy = tmp_path / "copy.ckpt"
    shutil.copy(FIXTURE, copy)
    common = ["--task", "reach", "--split", "train", "--envs", "1", "--episodes", "1", "--n-action-steps", "2",
              "--threads", "1"]  # fmt: skip
    run_benchmark("execution_horizon.py", str(FIXTURE), *common, "--json", str(tmp_path / "one.json"))
    run_benchmark(
        "execution_horizon.py", str(FIXTURE), str(copy), *common, "--json", str(tmp_path / "two.json"),
        "--record", str(tmp_path / "record"),
    )  # fmt: skip
    one = json.loads((tmp_path / "one.json").read_text())
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["checkpoint"] == f"{FIXTURE} {copy}"
    assert two["rows"] == one["rows"]
    assert json.loads((tmp_path / "record" / "summary.json").read_text())["checkpoint"] == f"{FIXTURE} {copy}"
    wbvima = FIXTURE.parent / "wbvima.ckpt"
    bad = run_benchmark("execution_horizon.py", str(FIXTURE), str(wbvima), *common, check=False)
    assert bad.returncode != 0 and "do not make an ensemble" in bad.stderr and "wbvima.ckpt" in bad.stderr
