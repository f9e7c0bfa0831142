"""Auxiliary state targets of the diffusion policy: store keys it learns to predict from what it
observes, never reads at inference (a simulator's object pose, predicted from the camera)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_tabletop_store, tiny_config
from demoscale.datasets import EpisodeDataset, EpisodeStore, StoreError, WindowSampler
from demoscale.policies.config_utils import from_plain
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import DiffusionPolicy, policy_statistics, state_target_slot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The synthetic store's image shows a bright square at the end effector's x, y: a policy that sees
# only the image and the gripper can learn that position from the pixels.
SEES_THE_SQUARE = {
    "obs_offsets": {"camera0_rgb": [-1, 0], "robot0_gripper_width": [0]},
    "action_representation": "absolute",
    "state_targets": {"robot0_eef_pos": [0, 1]},
}


def _config(store, tmp_path, **overrides) -> DiffusionConfig:
    settings = tiny_config(store, tmp_path)["model"]["init_args"]["policy"]
    return from_plain(DiffusionConfig, {**settings, **SEES_THE_SQUARE, **overrides})


def test_the_sampler_carries_the_current_frame_of_target_keys(tabletop_store) -> None:
    sampler = WindowSampler(
        tabletop_store, {"camera0_rgb": [-1, 0]}, ["action"], 4, target_keys=["robot0_eef_pos"]
    )
    store = EpisodeStore.open(tabletop_store)
    batch = sampler.sample_many(np.array([0, 5, 30]))
    for row, index in enumerate([0, 5, 30]):
        episode = int(batch["episode_index"][row])
        frame = int(store.episode_starts[episode]) + int(batch["frame_index"][row])
        expected = store.read("robot0_eef_pos", frame, frame + 1)
        np.testing.assert_array_equal(batch["targets"]["robot0_eef_pos"][row], expected)
        assert sampler.sample(index)["targets"]["robot0_eef_pos"].shape == (1, 3)
    assert "targets" not in WindowSampler(tabletop_store, {"camera0_rgb": [0]}, ["action"], 4).sample(0)
    with pytest.raises(StoreError, match="target key 'camera0_rgb' is image"):
        WindowSampler(tabletop_store, {"robot0_eef_pos": [0]}, ["action"], 4, target_keys=["camera0_rgb"])
    with pytest.raises(StoreError, match="unknown key 'object0_pose'"):
        WindowSampler(tabletop_store, {"robot0_eef_pos": [0]}, ["action"], 4, target_keys=["object0_pose"])


def test_the_head_learns_from_the_image_what_the_policy_does_not_observe(tmp_path) -> None:
    path = build_tabletop_store(tmp_path / "tabletop.zarr", n_episodes=3)
    config = _config(path, tmp_path, state_target_hidden_dims=[64])
    store = EpisodeStore.open(path)
    stats = policy_statistics(store, config)
    np.testing.assert_allclose(
        stats[state_target_slot("robot0_eef_pos")]["min"], np.ravel(store.stats("robot0_eef_pos")["min"])[:2]
    )
    torch.manual_seed(0)
    policy = DiffusionPolicy(config, store.features, stats)
    dataset = EpisodeDataset(
        str(path), config.obs_offsets, config.action_keys, config.horizon, target_keys=config.target_keys
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    history: list[dict[str, float]] = []
    while len(history) < 40:
        for batch in loader:
            losses = policy.compute_losses(batch)
            assert torch.allclose(losses["loss"], losses["action_loss"] + losses["state_loss"])
            optimizer.zero_grad()
            losses["loss"].backward()
            optimizer.step()
            history.append({k: float(v) for k, v in losses.items()})
    first = np.mean([h["state_loss"] for h in history[:3]])
    last = np.mean([h["state_loss"] for h in history[-3:]])
    assert last < 0.5 * first, [round(h["state_loss"], 4) for h in history]

    # Inference reads only the observations; the head's estimate comes back in the store's units.
    policy.eval()
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    assert policy.predict_action(batch["obs"]).shape == (4, config.horizon, 7)
    estimate = policy.predict_state_targets(batch["obs"])["robot0_eef_pos"]
    truth = batch["targets"]["robot0_eef_pos"][:, 0, :2]
    assert estimate.shape == (4, 2)
    span = float((truth.max() - truth.min()).clamp_min(1e-3))
    assert float((estimate - truth).abs().mean()) < span  # in metres, not normalised units

    # Without targets in the batch the loss says what is missing.
    del batch["targets"]
    policy.train()
    with pytest.raises(KeyError, match="target_keys"):
        policy.compute_losses(batch)


def test_training_through_lightning_serves_the_targets(tabletop_store, tmp_path) -> None:
    from demoscale.policies import load_policy, train

    # The rotation is observed only so that --near has a two-entry key to measure from.
    observed = {**SEES_THE_SQUARE["obs_offsets"], "robot0_eef_rot_axis_angle": [0]}
    config = tiny_config(tabletop_store, tmp_path / "run", **{**SEES_THE_SQUARE, "obs_offsets": observed})
    config["trainer"]["max_steps"] = 2
    config["checkpoint"]["every_n_train_steps"] = 2
    result = train(config)
    policy = load_policy(result.checkpoint_path)
    assert "robot0_eef_pos" not in policy.obs_offsets
    assert policy.network.state_head is not None

    # benchmarks/state_target_errors.py compares the head's estimates with the store's record.
    out = tmp_path / "errors.json"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "state_target_errors.py"
    done = subprocess.run(
        [sys.executable, str(script), str(result.checkpoint_path), "--store", str(tabletop_store),
         "--threads", "1", "--near", "robot0_eef_rot_axis_angle", "--near-bins", "1000", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (errors,) = json.loads(out.read_text())["results"]
    assert errors["frames"] == EpisodeStore.open(tabletop_store).n_frames
    entries = [row["entry"] for row in errors["rows"]]
    assert entries[:3] == ["0", "1", "0,1 (distance)"]
    bins = [row for row in errors["rows"] if row["entry"].startswith("robot0_eef_rot_axis_angle")]
    assert {row["entry"].split()[1] for row in bins} <= {"0-1000", ">=1000"} and bins
    assert sum(row["frames"] for row in bins) == errors["frames"]
    assert all(0.0 < row["median"] <= row["p90"] for row in errors["rows"])
    assert "robot0_eef_pos" in done.stdout
    refused = subprocess.run(
        [sys.executable, str(script), str(result.checkpoint_path), "--store", str(tabletop_store),
         "--near", "robot0_gripper_width"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode != 0 and "needs x and y" in refused.stderr


def test_the_denoiser_conditioned_on_the_targets_sees_the_store_in_training_and_the_head_at_inference(
    tabletop_store, tmp_path
) -> None:
    store = EpisodeStore.open(tabletop_store)
    dataset = EpisodeDataset(
        str(tabletop_store), SEES_THE_SQUARE["obs_offsets"], ["action"], 4, target_keys=["robot0_eef_pos"]
    )
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    moved = {**batch, "targets": {"robot0_eef_pos": batch["targets"]["robot0_eef_pos"] + 0.05}}

    def action_losses(policy: DiffusionPolicy) -> list[float]:
        losses = []
        for sample in (batch, moved):
            torch.manual_seed(0)  # the same crops, noise and timesteps for both
            losses.append(float(policy.compute_losses(sample)["action_loss"]))
        return losses

    for condition in (False, True):
        config = _config(
            tabletop_store, tmp_path, horizon=4, n_action_steps=2, state_target_condition=condition
        )
        torch.manual_seed(0)
        policy = DiffusionPolicy(config, store.features, policy_statistics(store, config))
        with_store, with_moved = action_losses(policy)
        # Teacher forcing: only the conditioned denoiser reads the store's targets.
        assert (with_store != with_moved) == condition
        policy.eval()
        features = policy.encode_features(batch["obs"])
        cond = policy.encode(batch["obs"])
        if not condition:
            torch.testing.assert_close(cond, features)
            continue
        # At inference the head's estimate takes the targets' place, so the head steers the action.
        assert cond.shape[-1] == features.shape[-1] + 2
        torch.testing.assert_close(cond[:, -2:], policy.state_head(features))
        generator = torch.Generator().manual_seed(1)
        before = policy.predict_action(batch["obs"], generator=generator)
        with torch.no_grad():
            policy.state_head[-1].bias.add_(1.0)
        after = policy.predict_action(batch["obs"], generator=generator.manual_seed(1))
        assert not torch.allclose(before, after)


def test_settings_that_cannot_work_are_refused(tabletop_store, tmp_path) -> None:
    with pytest.raises(ValueError, match="needs state_targets"):
        _config(tabletop_store, tmp_path, state_targets={}, state_target_condition=True).validate()
    with pytest.raises(ValueError, match="state_target_condition_noise"):
        _config(tabletop_store, tmp_path, state_target_condition_noise=-0.1).validate()
    with pytest.raises(ValueError, match="which the policy observes"):
        _config(tabletop_store, tmp_path, state_targets={"robot0_gripper_width": [0]}).validate()
    with pytest.raises(ValueError, match="cannot be combined"):
        _config(tabletop_store, tmp_path, waypoint_head=True).validate()
    with pytest.raises(ValueError, match="indices must be distinct"):
        _config(tabletop_store, tmp_path, state_targets={"robot0_eef_pos": []}).validate()
    store = EpisodeStore.open(tabletop_store)
    missing = _config(tabletop_store, tmp_path, state_targets={"object0_pose": [0, 1]})
    with pytest.raises(KeyError, match=r"state targets \['object0_pose'\].*object_state=true"):
        DiffusionPolicy(missing, store.features)
    beyond = _config(tabletop_store, tmp_path, state_targets={"robot0_eef_pos": [3]})
    with pytest.raises(ValueError, match="does not index the low-dim feature"):
        DiffusionPolicy(beyond, store.features)


def test_the_condition_oracle_acts_on_the_truth_and_rolls_out(tabletop_store, tmp_path, monkeypatch) -> None:
    """``benchmarks/condition_oracle.py``: the conditioned denoiser told the true targets (plus
    noise) instead of the head's estimate; in real reach rollouts beside the head's own run."""
    from demoscale.policies import load_policy, train

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))
    from condition_oracle import oracle_policy

    # Pose-only observations (no image), so that the reach task's environment can roll it out; the
    # end effector's position is the target, which every tabletop environment reports.
    observed = {"robot0_eef_rot_axis_angle": [0], "robot0_gripper_width": [0]}
    settings = {**SEES_THE_SQUARE, "obs_offsets": observed, "state_target_condition": True}
    config = tiny_config(tabletop_store, tmp_path / "run", horizon=4, n_action_steps=2, **settings)
    config["trainer"]["max_steps"] = 2
    config["checkpoint"]["every_n_train_steps"] = 2
    checkpoint = train(config).checkpoint_path
    policy = load_policy(checkpoint)
    oracle = oracle_policy(policy, noise=0.0)
    assert oracle.obs_offsets == {**observed, "robot0_eef_pos": [0]}
    rng = np.random.default_rng(0)
    windows = {key: rng.uniform(-0.2, 0.2, (3, len(o), 3 if "rot" in key else 1)).astype(np.float32)
               for key, o in observed.items()}  # fmt: skip
    windows["robot0_eef_pos"] = rng.uniform(-0.2, 0.2, (3, 1, 3)).astype(np.float32)
    told = oracle.predict_action_batch(windows, seed=0)
    # The head no longer steers the action; the truth does (its x, y entries, the targets).
    with torch.no_grad():
        policy.network.state_head[-1].bias.add_(1.0)
    np.testing.assert_allclose(oracle.predict_action_batch(windows, seed=0), told, rtol=1e-5, atol=1e-6)
    moved = {**windows, "robot0_eef_pos": windows["robot0_eef_pos"] + np.float32(0.1)}
    assert not np.allclose(oracle.predict_action_batch(moved, seed=0), told)
    noisy = oracle_policy(policy, noise=0.05)
    assert not np.allclose(noisy.predict_action_batch(windows, seed=0), told)

    record = tmp_path / "record"
    done = subprocess.run(
        [sys.executable, str(benchmarks / "condition_oracle.py"), str(checkpoint), "--task", "reach",
         "--split", "train", "--envs", "1", "--episodes", "1", "--noise-mm", "head", "0",
         "--json", str(tmp_path / "out.json"), "--record", str(record), "--policy", "tiny"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [row["condition"] for row in rows] == ["the head's estimate", "the truth + 0 mm noise"]
    assert {row["checkpoint"] for row in rows} == {f"{Path(checkpoint).parent.parent.name}/last.ckpt"}
    summary = json.loads((record / "summary.json").read_text())
    assert [row["policy"] for row in summary["headline"]] == [
        "tiny; conditioned on the head's estimate",
        "tiny; conditioned on the truth + 0 mm noise",
    ]
    assert all(row["n_rollouts"] == 1 and row["split"] == "train" for row in summary["headline"])

    unconditioned = tiny_config(
        tabletop_store,
        tmp_path / "plain",
        horizon=4,
        n_action_steps=2,
        **{**settings, "state_target_condition": False},
    )
    unconditioned["trainer"]["max_steps"] = 2
    unconditioned["checkpoint"]["every_n_train_steps"] = 2
    plain = train(unconditioned).checkpoint_path
    with pytest.raises(ValueError, match="not conditioned"):
        oracle_policy(load_policy(plain), noise=0.0)
    refused = subprocess.run(
        [sys.executable, str(benchmarks / "condition_oracle.py"), str(checkpoint), str(plain), "--task", "reach",
         "--noise-mm", "0", "--json", str(tmp_path / "refused.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode != 0 and "not conditioned" in refused.stderr
    assert not (tmp_path / "refused.json").exists()  # refused before any rollout
    with pytest.raises(ValueError, match="must be >= 0"):
        oracle_policy(policy, noise=-1.0)


def test_targets_relative_to_an_observed_reference(tabletop_store, tmp_path) -> None:
    """``state_target_reference``: the head learns the targets minus the reference's current value
    (statistics of that difference over the store) and gives its estimates back absolute."""
    reference = "robot0_eef_rot_axis_angle"  # observed, 3 entries: stands in for the gripper's position
    observed = {**SEES_THE_SQUARE["obs_offsets"], reference: [-1, 0]}
    config = _config(
        tabletop_store, tmp_path, obs_offsets=observed, horizon=4, n_action_steps=2,
        state_target_reference=reference, state_target_condition=True,
    )  # fmt: skip
    config.validate()
    store = EpisodeStore.open(tabletop_store)
    stats = policy_statistics(store, config)
    n = store.n_frames
    relative = store.read("robot0_eef_pos", 0, n)[:, :2] - store.read(reference, 0, n)[:, :2]
    slot = state_target_slot("robot0_eef_pos")
    np.testing.assert_allclose(stats[slot]["min"], relative.min(0), rtol=1e-6)
    np.testing.assert_allclose(stats[slot]["max"], relative.max(0), rtol=1e-6)
    policy = DiffusionPolicy(config, store.features, stats).eval()
    dataset = EpisodeDataset(str(tabletop_store), observed, ["action"], 4, target_keys=["robot0_eef_pos"])
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    now = batch["obs"][reference][:, 1, :2]
    expected = policy.normalizer.normalize(slot, batch["targets"]["robot0_eef_pos"][..., :2] - now[:, None])
    torch.testing.assert_close(policy.normalized_targets(batch), expected.flatten(1))
    # The estimate is the head's relative vector put back where the reference is.
    head = policy.state_head(policy.encode_features(batch["obs"]))
    absolute = policy.normalizer.unnormalize(slot, head[:, None])[:, 0] + now
    torch.testing.assert_close(policy.predict_state_targets(batch["obs"])["robot0_eef_pos"], absolute)

    with pytest.raises(ValueError, match="needs state_targets"):
        _config(tabletop_store, tmp_path, state_targets={}, state_target_reference=reference).validate()
    with pytest.raises(ValueError, match="must be observed at offset 0"):
        _config(tabletop_store, tmp_path, state_target_reference=reference).validate()
    too_short = _config(tabletop_store, tmp_path, state_target_reference="robot0_gripper_width")
    too_short.validate()
    with pytest.raises(ValueError, match="more than the reference"):
        DiffusionPolicy(too_short, store.features)


def test_the_error_splits_into_a_bias_per_episode_and_a_scatter_about_it(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from state_target_errors import _bias_and_scatter

    error = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 5.0], [0.0, 5.0], [9.0, 9.0]])
    episode_of = np.array([0, 0, 1, 1, 1])
    kept = np.array([True, True, True, True, False])  # the last frame is near the object: left out
    bias, scatter = _bias_and_scatter("object0_pose", error, episode_of, kept)
    assert (bias["entry"], bias["episodes"], bias["median"]) == (
        "bias per episode",
        2,
        3.5,
    )  # |(2, 0)|, |(0, 5)|
    assert (scatter["entry"], scatter["median"]) == ("scatter about the bias", 0.5)  # 1 and 0
    assert _bias_and_scatter("object0_pose", error, episode_of, np.zeros(5, dtype=bool)) == []
