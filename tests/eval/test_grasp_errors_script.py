"""``benchmarks/grasp_errors.py`` on the scripted expert: its grasps must measure as the expert is
written (closing within a few millimetres of the object's centre, aligned with its narrow side), or
the figures the script reports for policies mean nothing. Real MuJoCo rollouts, ~20 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "grasp_errors.py"


def test_the_expert_closes_on_the_object_aligned_with_its_narrow_side(tmp_path: Path) -> None:
    out = tmp_path / "grasp_errors.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "expert", "--rollouts", "3", "--json", str(out)],
        cwd=REPO_ROOT,
        env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "| expert (lifted) |" in result.stdout
    expert = json.loads(out.read_text())["policies"]["expert"]
    assert expert["rollouts"] == 3 and expert["lift_rate"] == 1.0 and expert["never_closed"] == 0
    lifted = expert["lifted"]
    assert lifted["n"] == 3
    # The expert aims within 4 mm (its grasp offset) plus a few mm of drift, at 14-20 mm height (drift aside).
    assert lifted["command_xy_mm"] < 10.0
    assert 5.0 < lifted["command_z_mm"] < 30.0
    assert lifted["object_moved_mm"] < 2.0
    assert lifted["abs_yaw_error_deg"] < 1.0
