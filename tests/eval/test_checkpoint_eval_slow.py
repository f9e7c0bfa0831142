"""A real trained checkpoint evaluates closed-loop (collect -> ingest -> train a few steps -> eval; slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tabletop_laptop.yaml"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # training a model on a shared 2-core machine
def test_trained_checkpoint_rolls_out(tmp_path) -> None:
    from demoscale.collect.umi import ingest_umi
    from demoscale.eval import collect_sim, evaluate
    from demoscale.eval.rollout import SpecMismatchError
    from demoscale.policies import train

    collect_sim("push", 1, 1, 2, tmp_path / "raw", image_size=64, progress=False)
    ingest_umi(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    trained = train(
        str(CONFIG),
        {"data.store": str(tmp_path / "store.zarr"), "trainer.max_steps": 2, "data.num_workers": 0,
         "data.batch_size": 4, "trainer.default_root_dir": str(tmp_path / "run"), "trainer.val_check_interval": 2,
         "checkpoint.every_n_train_steps": 2, "trainer.enable_progress_bar": False},
    )  # fmt: skip
    result = evaluate(trained.checkpoint_path, "push", n_envs=2, episodes=2, max_steps=10, out_dir=tmp_path / "eval",
                      video_episodes=1, progress=False)  # fmt: skip
    assert result.summary["image_size"] == 64  # taken from the checkpoint's feature spec
    assert len(result.rollouts) == 2 and (result.rollouts["steps"] <= 10).all()
    assert (tmp_path / "eval" / "rollouts.csv").exists()
    with pytest.raises(SpecMismatchError, match="expects shape"):
        evaluate(trained.checkpoint_path, "push", n_envs=1, image_size=32, progress=False)
