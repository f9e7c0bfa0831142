"""`demoscale sweep` in an interactive terminal (a real pseudo-terminal) and in a pipe.

The live table draws only when the output is a terminal, so a missing display dependency or a
broken redraw shows up only here (CI's output is never a terminal).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

# Hang guard, not a speed limit: each sweep of two 4-step trials takes about a minute here.
SWEEP_HANG_GUARD_S = 600


def _write_sweep(sweep: dict, folder: Path) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(dict(sweep, grid={**sweep["grid"], "demos_per_pair": [2]})))
    return path


@pytest.mark.timeout(SWEEP_HANG_GUARD_S + 120)  # the run's own guard fires first, with its output
def test_sweep_draws_its_live_table_in_a_terminal(sweep_files, tmp_path: Path, terminal) -> None:
    config = _write_sweep(sweep_files["sweep"], tmp_path)
    code, output = terminal(
        [sys.executable, "-m", "demoscale", "sweep", "--config", str(config)], timeout=SWEEP_HANG_GUARD_S
    )
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # rich's table, with the progress columns, redrawn in place (cursor movements) until both finished
    for column in ("trial", "state", "step", "loss", "samples/s", "ETA", "score"):
        assert column in output, f"column {column!r} missing from the live table:\n{output[-3000:]}"
    assert "\x1b[" in output and "2 finished" in output
    # the trials' training progress reached the table: the step cell of the 4-step budget's end
    assert "4/4" in output, f"no training progress in the live table:\n{output[-3000:]}"
    assert len(pd.read_csv(sweep_files["output"] / "results.csv")) == 2


@pytest.mark.timeout(SWEEP_HANG_GUARD_S + 120)
def test_sweep_prints_plain_lines_with_training_progress_in_a_pipe(sweep_files, tmp_path: Path) -> None:
    config = _write_sweep(sweep_files["sweep"], tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "demoscale", "sweep", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=SWEEP_HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "\x1b[" not in result.stdout, "terminal control sequences written into a pipe"
    # each trial's training progress reached the driver: the final step of its 4-step budget
    for trial in ("tiny-e1-o1-d2-s0", "tiny-e2-o1-d2-s0"):
        assert f"{trial}: training step 4/4 (100%)" in result.stdout, result.stdout[-3000:]
        assert f"{trial}: finished" in result.stdout
    assert "ETA 0s" in result.stdout and "samples/s" in result.stdout
