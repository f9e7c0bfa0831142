"""Windows, padding, determinism, the torch Dataset with DataLoader workers, and the DataModule."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from demoscale.datasets import EpisodeDataModule, EpisodeDataset, EpisodeStore, WindowSampler
from demoscale.datasets.torch_data import EpochShuffleSampler, split_episodes

OFFSETS = {"camera0_rgb": [-2, 0], "robot0_eef_pos": [-3, -1, 0]}


def test_windows_pad_at_both_edges(small_store: EpisodeStore, kit) -> None:
    sampler = WindowSampler(small_store.location, OFFSETS, ["action", "robot0_eef_pos"], horizon=4)
    assert len(sampler) == small_store.n_frames
    episode = kit.make_episode(2, 7)  # episode 2 starts at frame 11 and has 7 frames
    first = sampler.sample(11)
    assert first["episode_index"] == 2 and first["frame_index"] == 0
    assert first["obs_is_pad"]["robot0_eef_pos"].tolist() == [True, True, False]
    np.testing.assert_array_equal(first["obs"]["robot0_eef_pos"], episode["robot0_eef_pos"][[0, 0, 0]])
    assert first["obs"]["camera0_rgb"].shape == (2, *kit.image_shape)
    assert first["obs"]["camera0_rgb"].dtype == np.uint8
    np.testing.assert_array_equal(first["obs"]["camera0_rgb"][0], first["obs"]["camera0_rgb"][1])
    assert first["action_is_pad"].tolist() == [False] * 4
    expected = np.concatenate([episode["action"], episode["robot0_eef_pos"]], axis=1)
    np.testing.assert_array_equal(first["action"], expected[:4])
    assert first["action"].dtype == np.float32 and first["action"].shape == (4, 7)

    last = sampler.sample(17)  # frame 6, the last of episode 2
    assert last["frame_index"] == 6
    assert last["action_is_pad"].tolist() == [False, True, True, True]
    np.testing.assert_array_equal(last["action"], expected[[6, 6, 6, 6]])
    assert last["obs_is_pad"]["robot0_eef_pos"].tolist() == [False, False, False]
    np.testing.assert_array_equal(last["obs"]["robot0_eef_pos"], episode["robot0_eef_pos"][[3, 5, 6]])
    decoded = small_store.read("camera0_rgb", 11 + 4, 11 + 7)
    np.testing.assert_array_equal(last["obs"]["camera0_rgb"], decoded[[0, 2]])


def test_batched_reads_equal_single_reads(small_store: EpisodeStore) -> None:
    sampler = WindowSampler(small_store, OFFSETS, ["action"], horizon=3, episodes=[1, 4, 5])
    assert len(sampler) == 6 + 9 + 10
    indices = [24, 0, 13, 5, 5]
    batch = sampler.sample_many(indices)
    for row, index in enumerate(indices):
        single = sampler.sample(index)
        np.testing.assert_array_equal(batch["action"][row], single["action"])
        for key in OFFSETS:
            np.testing.assert_array_equal(batch["obs"][key][row], single["obs"][key])
    assert set(batch["episode_index"].tolist()) <= {1, 4, 5}


def test_samples_are_deterministic_and_pickle_without_handles(small_store: EpisodeStore) -> None:
    dataset = EpisodeDataset(small_store.location, OFFSETS, ["action"], horizon=5)
    _ = dataset[3]
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.sampler._store is None
    for index in (0, 7, len(dataset) - 1):
        a, b = dataset[index], clone[index]
        assert torch.equal(a["action"], b["action"])
        assert torch.equal(a["obs"]["camera0_rgb"], b["obs"]["camera0_rgb"])
    shuffle = EpochShuffleSampler(50, seed=3)
    first = list(shuffle)
    assert first == list(EpochShuffleSampler(50, seed=3)) and sorted(first) == list(range(50))
    shuffle.set_epoch(1)
    assert list(shuffle) != first


def test_split_is_by_episode_and_disjoint() -> None:
    train, val = split_episodes(range(20), 0.25, seed=1)
    assert len(val) == 5 and len(train) == 15 and not set(train) & set(val)
    assert split_episodes(range(20), 0.25, seed=1) == (train, val)
    assert split_episodes([4, 9], 0.1, seed=0)[1] != []  # at least one validation episode


def test_dataloader_workers_cover_an_epoch_once_without_validation_leaks(small_store: EpisodeStore) -> None:
    module = EpisodeDataModule(
        small_store.location,
        obs_offsets={"camera0_rgb": [-1, 0]},
        action_keys=["action"],
        horizon=4,
        batch_size=4,
        num_workers=2,
        val_fraction=0.34,
        seed=5,
        episodes=[0, 1, 2, 3, 4, 5],
    )
    module.setup("fit")
    assert len(module.val_episodes) == 2 and not set(module.val_episodes) & set(module.train_episodes)
    seen = []
    for batch in module.train_dataloader():
        assert batch["obs"]["camera0_rgb"].shape[1:] == (2, 32, 40, 3)
        assert batch["action"].shape[1:] == (4, 4)
        seen += list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    assert len(seen) == len(set(seen)) == len(module.train_dataset)
    assert not {episode for episode, _ in seen} & set(module.val_episodes)
    val_seen = {int(e) for batch in module.val_dataloader() for e in batch["episode_index"]}
    assert val_seen == set(module.val_episodes)
    assert module.action_dim == 4
    assert module.action_stats()["mean"].shape == (4,)


def test_datamodule_from_yaml_with_lightning_cli(small_store: EpisodeStore, tmp_path) -> None:
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringModel

    config = tmp_path / "data.yaml"
    config.write_text(
        f"""
data:
  store: {small_store.location}
  obs_offsets: {{camera0_rgb: [-1, 0], robot0_eef_pos: [0]}}
  action_keys: [action]
  horizon: 8
  batch_size: 2
  episodes: [0, 2, 4]
  val_fraction: 0.0
trainer:
  logger: false
  enable_checkpointing: false
  default_root_dir: {tmp_path}
"""
    )
    cli = LightningCLI(BoringModel, EpisodeDataModule, run=False, args=["--config", str(config)])
    module = cli.datamodule
    assert isinstance(module, EpisodeDataModule)
    assert module.train_episodes == [0, 2, 4] and module.val_episodes == []
    assert module.obs_offsets == {"camera0_rgb": [-1, 0], "robot0_eef_pos": [0]}
    batch = next(iter(module.train_dataloader()))
    assert batch["action"].shape == (2, 8, 4)
    assert module.val_dataloader() == []


def test_bad_window_specs_are_rejected(small_store: EpisodeStore) -> None:
    from demoscale.datasets import StoreError

    with pytest.raises(StoreError, match="unknown key 'nope'"):
        WindowSampler(small_store, {"nope": [0]}, ["action"], 4)
    with pytest.raises(StoreError, match="not low_dim"):
        WindowSampler(small_store, {}, ["camera0_rgb"], 4)
    with pytest.raises(StoreError, match="episode indices"):
        WindowSampler(small_store, {}, ["action"], 4, episodes=[99])
