"""A sweep with rollout evaluation on the simulated tabletop push task, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from demoscale import DEFAULT_CONFIDENCE
from demoscale.ray_jobs import run_sweep


@pytest.mark.slow
def test_sweep_scores_by_rollouts_on_unseen_envs(tmp_path: Path) -> None:
    """Collect expert demos in simulation, ingest, sweep 2 env counts, evaluate on unseen envs."""
    from demoscale.collect.umi import ingest_umi
    from demoscale.eval import collect_sim, env_ids

    collect_sim(
        "push",
        n_envs=2,
        n_objects=1,
        demos_per_pair=2,
        out_dir=tmp_path / "raw",
        image_size=32,
        progress=False,
    )
    ingest_umi(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    training = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "logger": False, "enable_progress_bar": False,
            "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
        },
        "model": {
            "class_path": "demoscale.policies.DiffusionPolicyModule",
            "init_args": {
                "policy": {
                    "obs_offsets": {"camera0_rgb": [0], "robot0_eef_pos": [0]},
                    "action_keys": ["action"], "horizon": 4, "n_action_steps": 4,
                    "image": {"backbone": "resnet10t", "crop_fraction": 1.0, "color_jitter": [0.0, 0.0, 0.0, 0.0]},
                    "down_dims": [8, 16], "step_embed_dim": 8, "num_train_timesteps": 10, "num_inference_steps": 2,
                },
                "optimizer": {"lr": 1e-3, "warmup_steps": 1},
            },
        },
        "data": {"store": "set-by-the-sweep", "batch_size": 8, "num_workers": 0, "val_fraction": 0.0},
    }  # fmt: skip
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(training))
    sweep = {
        "store": str(tmp_path / "store.zarr"),
        "policies": {"tiny": {"config": str(tmp_path / "train.yaml")}},
        "grid": {"n_envs": [1, 2], "n_objects": [1], "demos_per_pair": [2]},
        "eval": {"task": "push", "split": "unseen", "n_envs": 2, "n_objects": 1, "episodes": 2, "options": {
            "video_episodes": 0, "progress": False, "max_steps": 20}},
        "budget": {"rule": "fixed", "steps": 2, "checkpoint_every_steps": 2},
        "num_cpus": 2,
        "output": str(tmp_path / "out"),
    }  # fmt: skip
    result = run_sweep(sweep)
    assert result.failed == []
    rows = result.results.set_index("trial_id")
    assert sorted(rows.index) == ["tiny-e1-o1-d2-s0", "tiny-e2-o1-d2-s0"]
    assert (rows["n_rollouts"] == 2).all()
    assert (
        (rows["success_ci_low"] <= rows["success_rate"]) & (rows["success_rate"] <= rows["success_ci_high"])
    ).all()
    # Both intervals at the one package-wide level, and the score's never a point (2 rollouts).
    assert (rows["confidence"] == DEFAULT_CONFIDENCE).all()
    assert ((rows["score_ci_low"] <= rows["score"]) & (rows["score"] <= rows["score_ci_high"])).all()
    assert (rows["score_ci_low"] < rows["score_ci_high"]).all()
    rollouts = result.rollouts
    assert len(rollouts) == 4 and set(rollouts["trial_id"]) == set(rows.index)
    unseen = {str(i) for i in env_ids("unseen", 2)}
    assert set(rollouts["env_id"].astype(str)) == unseen  # evaluated on held-out environments
    assert not unseen & {e for ids in rows["env_ids"] for e in yaml.safe_load(ids)}
    for trial, group in rollouts.groupby("trial_id"):
        assert group["rollout_index"].tolist() == [0, 1]
        assert rows.loc[trial, "score"] == pytest.approx(group["score"].mean())
