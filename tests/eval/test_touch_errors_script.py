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
        # It turns to face the shelf (yaw 0 up to its +-0.04 heading) and stands with the object
        # about half a metre ahead, in front of the right shoulder (0.24 m to the right).
        assert abs(rollout["base_yaw_at_closest"]) < 0.05
        forward, lateral = rollout["object_in_base_at_closest"]
        assert 0.45 < forward < 0.58 and -0.27 < lateral < -0.21
    assert expert["base_yaw_abs_at_closest_median"] < 0.05


def test_open_loop_errors_are_zero_for_the_demonstrations_and_not_for_a_policy(
    tmp_path: Path, monkeypatch
) -> None:
    """``offline_errors`` (``--store``): replaying each demonstration's own chunks puts the hand
    exactly where the demonstration did; the saved WB-VIMA fixture (untrained) does not."""
    import numpy as np
    from demoscale.collect.joylo import ingest_joylo
    from demoscale.datasets import EpisodeStore
    from demoscale.eval import collect_sim
    from demoscale.policies import load_policy

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from touch_errors import offline_errors

    # The fixture observes 24-point clouds: collect with that many.
    collect_sim("touch_shelf", 1, 1, 1, tmp_path / "raw", image_size=32, pairing="unique",
                env_options={"n_points": 24}, progress=False)  # fmt: skip
    ingest_joylo(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    store_path = str(tmp_path / "store.zarr")
    fixture = load_policy(
        Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "checkpoints" / "wbvima.ckpt"
    )

    class Replay:
        """The demonstrations' own chunks, episode after episode, as a policy would predict them."""

        obs_offsets = fixture.obs_offsets

        def __init__(self) -> None:
            self.store, self.episode, self.horizon = EpisodeStore.open(store_path), 0, fixture.horizon

        def predict_action_batch(self, batch, seed=None) -> np.ndarray:
            actions = self.store.episode(self.episode)["action"]
            self.episode += 1
            n = len(actions)
            return np.stack([actions[np.minimum(np.arange(t, t + self.horizon), n - 1)] for t in range(n)])

    replayed = offline_errors(Replay(), store_path, every=1, ahead=2)
    assert replayed["episodes"] == 1 and replayed["ahead"] == 2
    assert replayed["near_touch_hand_mm"] == 0.0 and replayed["elsewhere_hand_mm"] == 0.0
    untrained = offline_errors(fixture, store_path, every=1, ahead=0)
    assert untrained["near_touch_hand_mm"] > 5.0 and np.isfinite(untrained["elsewhere_hand_mm"])


def test_a_state_policy_is_rolled_out_with_the_options_given(tmp_path: Path, run_benchmark) -> None:
    """A policy told the object's pose records no camera: ``--env-option`` gives the options it was
    collected with, and without them the script stops on the missing observation."""
    from demoscale.collect import ingest
    from demoscale.eval import collect_sim
    from demoscale.policies import train

    options = {"render": False, "object_state": True}
    collect_sim("touch_shelf", 1, 1, 2, tmp_path / "raw", env_options=options, progress=False)
    ingest("joylo", tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    config = Path(__file__).resolve().parents[2] / "configs" / "wholebody_touch_shelf_state.yaml"
    trained = train(
        str(config),
        {"data.store": str(tmp_path / "store.zarr"), "trainer.max_steps": 2, "data.batch_size": 4,
         "model.init_args.global_batch_size": 4, "trainer.val_check_interval": 2,
         "checkpoint.every_n_train_steps": 2, "trainer.default_root_dir": str(tmp_path / "run"),
         "trainer.logger": False, "progress.every_s": 0},
    )  # fmt: skip
    out = tmp_path / "touch_errors.json"
    checkpoint = str(trained.checkpoint_path)
    flags = ["--env-option", "render=false", "--env-option", "object_state=true"]
    run_benchmark("touch_errors.py", checkpoint, "--rollouts", "1", *flags, "--json", str(out))
    (summary,) = json.loads(out.read_text())["policies"].values()
    assert summary["rollouts"] == 1
    bare = run_benchmark("touch_errors.py", checkpoint, "--rollouts", "1", check=False)
    assert bare.returncode != 0 and "object0_pose" in bare.stderr
