"""``benchmarks/grasp_errors.py`` on the scripted expert: its grasps must measure as the expert is
written (closing within a few millimetres of the object's centre, aligned with its narrow side), or
the figures the script reports for policies mean nothing. Real MuJoCo rollouts, ~20 s."""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_expert_closes_on_the_object_aligned_with_its_narrow_side(tmp_path: Path, run_benchmark) -> None:
    out = tmp_path / "grasp_errors.json"
    result = run_benchmark("grasp_errors.py", "expert", "--rollouts", "3", "--json", str(out))
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


def test_a_policy_is_rolled_out_and_measured_open_loop_on_its_store(tmp_path: Path, run_benchmark) -> None:
    """The policy path: the saved diffusion fixture (UMI layout, 32 px, untrained) acts through the
    rollout's own actor, and ``--store`` measures it open loop on real collected demos."""
    from demoscale.collect import ingest_umi
    from demoscale.eval import collect_sim

    collect_sim("pick_place", 1, 1, 1, tmp_path / "raw", image_size=32, progress=False)
    ingest_umi(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    checkpoint = REPO_ROOT / "tests" / "fixtures" / "checkpoints" / "diffusion.ckpt"
    out = tmp_path / "grasp_errors.json"
    run_benchmark(
        "grasp_errors.py",
        str(checkpoint),
        "--rollouts",
        "1",
        "--image-size",
        "32",
        "--store",
        str(tmp_path / "store.zarr"),
        "--store-every",
        "1",
        "--json",
        str(out),
    )
    measured = json.loads(out.read_text())["policies"][str(checkpoint)]
    assert measured["rollouts"] == 1
    # Every rollout is counted once: it closed (lifted or not) or it never closed.
    assert measured["lifted"]["n"] + measured["not_lifted"]["n"] + measured["never_closed"] == 1
    loop = measured["open_loop"]
    assert loop["episodes"] == 1 and loop["ahead"] == 4
    # An untrained network is far from the demonstrations (centimetres, not the millimetres of a fit).
    assert loop["before_close_xy_mm"] > 5.0 and loop["elsewhere_xy_mm"] > 5.0
