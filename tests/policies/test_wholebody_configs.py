"""The shipped whole-body configs train on demonstrations the whole-body simulator wrote (JoyLo HDF5
ingested into a store) and the checkpoints predict action chunks of the task's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from demoscale.collect import ingest_joylo
from demoscale.datasets import EpisodeStore
from demoscale.eval import collect_sim
from demoscale.policies import load_policy, train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fetch_shelf_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fetch_shelf")
    collect_sim("fetch_shelf", 1, 1, 2, root / "raw", progress=False)
    ingest_joylo(root / "raw", root / "store.zarr", progress=False)
    return root / "store.zarr"


@pytest.mark.parametrize("name", ["wbvima_sim.yaml", "diffusion_wholebody_sim.yaml"])
def test_shipped_wholebody_config_trains_and_predicts(name, fetch_shelf_store, tmp_path):
    result = train(
        CONFIGS / name,
        {
            "data.store": str(fetch_shelf_store),
            "data.batch_size": 8,
            "data.num_workers": 0,
            "model.init_args.global_batch_size": 8,
            "trainer.max_steps": 2,
            "trainer.limit_val_batches": 1,
            "trainer.val_check_interval": 2,
            "trainer.enable_progress_bar": False,
            "trainer.default_root_dir": str(tmp_path / "run"),
            "checkpoint.every_n_train_steps": 2,
        },
    )
    assert result.steps == 2 and np.isfinite(result.metrics["val/loss"])
    policy = load_policy(result.checkpoint_path, num_inference_steps=2)
    store = EpisodeStore.open(fetch_shelf_store)
    episode = store.episode(0)
    window = {
        key: episode[key][[max(5 + offset, 0) for offset in offsets]]
        for key, offsets in policy.obs_offsets.items()
    }
    chunk = policy.predict_action(window, seed=0)
    assert chunk.shape == (policy.horizon, 21) and np.all(np.isfinite(chunk))
