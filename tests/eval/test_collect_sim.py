"""collect_sim writes real UMI zips in the Data-Scaling-Laws layout, and they ingest into a store."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import zarr
from demoscale.eval import collect_sim
from demoscale.eval.collect_sim_cli import main as collect_main


def test_collect_sim_writes_umi_zips_per_pair(tmp_path) -> None:
    result = collect_sim("push", 1, 2, 2, tmp_path / "raw", image_size=24, progress=False)
    assert result.n_demos == 4 and len(result.pairs) == 2
    assert result.expert_success_rate > 0
    for obj in (0, 1):
        pair_dir = tmp_path / "raw" / "push" / "env_0" / f"object_{obj}"
        assert (pair_dir / "count.txt").read_text().strip() == "2"
        path = pair_dir / "dataset.zarr.zip"
        with zipfile.ZipFile(path) as archive:
            assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
        from imagecodecs.numcodecs import register_codecs

        register_codecs()
        root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r", zarr_format=2)
        ends = root["meta/episode_ends"][:]
        assert ends.dtype == np.int64 and len(ends) == 2
        frames = root["data/camera0_rgb"]
        assert frames.shape == (ends[-1], 24, 24, 3) and frames.chunks == (1, 24, 24, 3)
        assert frames[0].std() > 5
        positions = root["data/robot0_eef_pos"][:]
        assert positions.shape == (ends[-1], 3) and root["data/robot0_gripper_width"].shape == (ends[-1], 1)
        # The expert moves: positions change within an episode, smoothly (<= 6 cm per step).
        steps = np.linalg.norm(np.diff(positions[: ends[0]], axis=0), axis=1)
        assert steps.max() < 0.065 and steps.sum() > 0.1


def test_collected_demos_ingest_with_env_and_object_ids(tmp_path) -> None:
    ingest = pytest.importorskip("demoscale.collect").ingest_umi
    from demoscale.datasets import EpisodeStore

    collect_sim("pick_place", 2, 1, 1, tmp_path / "raw", image_size=24, progress=False)
    ingest(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    store = EpisodeStore.open(tmp_path / "store.zarr")
    assert store.n_episodes == 2
    pairs = set(zip(store.episodes["env_id"], store.episodes["object_id"], strict=True))
    assert pairs == {("0", "0"), ("1", "0")}
    assert set(store.episodes["task"]) == {"pick_place"}
    episode = store.episode(0)
    assert episode["action"].shape == (len(episode["robot0_eef_pos"]), 7)
    # action = the next frame's pose and width
    assert np.allclose(episode["action"][:-1, :3], episode["robot0_eef_pos"][1:], atol=1e-6)
    assert episode["robot0_gripper_width"].min() == 0.0  # the gripper closed on the object


def test_collect_cli(tmp_path, capsys) -> None:
    out = tmp_path / "raw"
    code = collect_main(
        ["sim", "--task", "push", "--envs", "1", "--objects", "1", "--demos-per-pair", "1", "--out", str(out),
         "--image-size", "24", "--cameras", "scene", "--json"]
    )  # fmt: skip
    assert code == 0
    assert '"demos": 1' in capsys.readouterr().out
    assert (out / "push" / "env_0" / "object_0" / "dataset.zarr.zip").exists()
    assert collect_main(["sim", "--task", "fly", "--envs", "1", "--objects", "1", "--demos-per-pair", "1",
                         "--out", str(out)]) == 2  # fmt: skip
    assert "unknown task 'fly'" in capsys.readouterr().err  # errors go to stderr


def test_unique_pairing_gives_each_environment_its_own_object(tmp_path) -> None:
    result = collect_sim("push", 2, 2, 1, tmp_path / "raw", image_size=24, progress=False, pairing="unique")
    assert sorted((p.env_id, p.object_id) for p in result.pairs) == [(0, 0), (1, 1)]
    assert sorted(p.name for p in (tmp_path / "raw" / "push").glob("env_*/object_*")) == [
        "object_0",
        "object_1",
    ]
    with pytest.raises(ValueError, match="as many objects as environments"):
        collect_sim("push", 2, 1, 1, tmp_path / "other", pairing="unique", progress=False)


def test_every_task_names_the_ingest_format_its_demos_are_written_in() -> None:
    from demoscale.collect import FORMATS
    from demoscale.eval import get_task, task_names

    formats = {name: get_task(name).source_format for name in task_names()}
    assert set(formats.values()) <= set(FORMATS), formats
    assert formats["touch_shelf"] == formats["fetch_shelf"] == "joylo" and formats["reach"] == "umi"


def test_action_noise_perturbs_the_executed_motion(tmp_path, capsys) -> None:
    """UMI labels are the next recorded pose, so noise injected into the executed commands shows in
    the recorded motion; the same seed gives the same noise; per-dimension noise moves only its
    dimension."""
    from imagecodecs.numcodecs import register_codecs

    register_codecs()

    def recorded(name: str, *noise: str) -> dict[str, np.ndarray]:
        out = tmp_path / name
        argv = ["sim", "--task", "reach", "--envs", "1", "--objects", "1", "--demos-per-pair", "1",
                "--out", str(out), "--image-size", "16", "--action-noise", *noise]  # fmt: skip
        assert collect_main(argv) == 0
        path = out / "reach" / "env_0" / "object_0" / "dataset.zarr.zip"
        root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r", zarr_format=2)
        return {key: root[f"data/robot0_{key}"][:] for key in ("eef_pos", "gripper_width")}

    def jerk(values: np.ndarray) -> float:
        return float(np.abs(np.diff(values, n=2, axis=0)).mean())

    clean, noisy = recorded("clean", "0"), recorded("noisy", "0.005")
    np.testing.assert_array_equal(noisy["eef_pos"], recorded("again", "0.005")["eef_pos"])
    assert jerk(noisy["eef_pos"]) > 2 * jerk(clean["eef_pos"]) and jerk(noisy["eef_pos"]) > 0.002
    # Noise on the gripper width alone (the last of 7 dimensions): the pose moves as without noise.
    width_only = recorded("width", *["0"] * 6, "0.01")
    np.testing.assert_allclose(width_only["eef_pos"], clean["eef_pos"], atol=1e-4)
    assert np.abs(np.diff(width_only["gripper_width"][:, 0])).max() > 0.002
    capsys.readouterr()
    with pytest.raises(ValueError, match="action_noise must be >= 0"):
        collect_sim("reach", 1, 1, 1, tmp_path / "bad", progress=False, action_noise=-0.01)
    with pytest.raises(ValueError, match="reach actions have 7 dimensions"):
        collect_sim("reach", 1, 1, 1, tmp_path / "bad", progress=False, action_noise=[0.01, 0.01])


def test_noise_phases_need_an_expert_that_reports_its_phase() -> None:
    from demoscale.eval.collect_sim import run_expert_episode

    class Expert:  # acts, reports no phase (as PushT's replay of human episodes)
        def act(self, obs):
            return np.zeros(2)

    class Env:
        max_steps = 3

        def reset(self, seed):
            return {"state": np.zeros(2)}

        def expert(self, seed):
            return Expert()

        def step(self, action):
            return {"state": np.asarray(action)}

        def success(self):
            return False

    with pytest.raises(ValueError, match="needs an expert that reports its phase; Expert does not"):
        run_expert_episode(Env(), seed=0, action_noise=1.0, noise_phases=["push"])
    episode, _ = run_expert_episode(Env(), seed=0, action_noise=1.0)  # every step: no phase needed
    assert np.abs(episode["state"][1:]).min() > 0
