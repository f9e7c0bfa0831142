"""Fixtures of the evaluation tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_benchmark() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``benchmarks/<script>`` with arguments in a real process (MuJoCo on EGL unless set), and
    fail with its output unless it exits 0 (``check=False``: return whatever it exits with)."""

    def run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "benchmarks" / script), *args],
            cwd=REPO_ROOT,
            env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check:
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        return result

    return run
