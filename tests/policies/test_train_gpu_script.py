"""``benchmarks/train_gpu.py``: every variant's code path on the CPU (``--cpu-smoke``), and the
no-GPU exit. About 30 s on a busy 2-core machine, most of it dynamo tracing the two compiled
variants and Lightning's set-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "train_gpu.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    # No GPU for the script, whatever the machine has: the smoke run must not measure anything real.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_a_gpu_the_script_says_so_and_exits_0() -> None:
    result = _run("--backbones", "vit_b16")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no GPU here" in result.stdout and "nothing measured" in result.stdout


def test_cpu_smoke_runs_every_variant_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "train_gpu.json"
    result = _run("--cpu-smoke", "--json", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "train_gpu_smoke" and report["smoke"] is True
    rows = {row["variant"]: row for row in report["variants"]}
    assert list(rows) == [
        "fp32",
        "bf16",
        "full_step(bf16)",
        "bf16+compile",
        "bf16+compile+cudagraphs",
        "bf16+ckpt@max",
    ]
    assert all(row["status"] == "ok" and row["samples_per_s"] > 0 for row in rows.values()), rows
    for name in ("bf16+compile", "bf16+compile+cudagraphs"):
        assert rows[name]["compiled"] == ["obs_encoder", "denoiser"]
    assert rows["bf16+compile+cudagraphs"]["compile_mode"] == "reduce-overhead"
    # The checkpointing search doubled the micro-batch up to the smoke run's cap.
    assert rows["bf16+ckpt@max"]["largest_micro_batch"] == rows["bf16+ckpt@max"]["micro_batch"] == 4
    full = rows["full_step(bf16)"]
    assert 0 <= full["data_wait_fraction"] <= 1 and full["timed_steps"] >= 1
    assert set(report["verdict"]) >= {"meets_throughput_target", "meets_data_wait_target"}
    assert "targets: >= 120 samples/s/GPU" in result.stdout  # the table on screen
