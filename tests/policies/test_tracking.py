"""Experiment tracking by one flag (--logger csv|tensorboard|wandb|mlflow) and one folder per run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import tiny_config
from demoscale.policies import train


def _tiny(store: Path, root: Path) -> dict:
    config = tiny_config(store, root)
    config["trainer"].update(
        {"max_steps": 2, "limit_val_batches": 0, "logger": False, "log_every_n_steps": 1}
    )
    return config


def test_each_training_run_gets_its_own_checkpoint_folder(tabletop_store, tmp_path) -> None:
    config = _tiny(tabletop_store, tmp_path / "runs")
    first, second = train(config), train(config)
    assert Path(first.checkpoint_path).parent.parent != Path(second.checkpoint_path).parent.parent
    assert Path(first.checkpoint_path).is_file() and Path(second.checkpoint_path).is_file()
    named = train(config, {"run_name": "baseline"})
    assert named.checkpoint_path == str(tmp_path / "runs" / "baseline" / "checkpoints" / "last.ckpt")
    # --ckpt_path last without a name continues the latest run, in its own folder.
    resumed = train(config, {"ckpt_path": "last", "trainer.max_steps": 3})
    assert resumed.steps == 3 and resumed.checkpoint_path == named.checkpoint_path
    # A root laid out before run folders (root/checkpoints/last.ckpt) still resumes in place.
    legacy = tmp_path / "legacy"
    (legacy / "checkpoints").mkdir(parents=True)
    shutil.copy(named.checkpoint_path, legacy / "checkpoints" / "last.ckpt")
    old = train(
        config, {"trainer.default_root_dir": str(legacy), "ckpt_path": "last", "trainer.max_steps": 4}
    )
    assert old.steps == 4 and Path(old.checkpoint_path).parent == legacy / "checkpoints"


def test_tensorboard_logger_writes_group_and_run(tabletop_store, tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(
        _tiny(tabletop_store, tmp_path), {"logger": "tensorboard", "logger_group": "sweepA", "run_name": "t1"}
    )
    run = tmp_path / "tensorboard" / "sweepA" / "t1"
    events = EventAccumulator(str(run))
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"], events.Tags()


@pytest.mark.slow
def test_wandb_logger_runs_offline_with_group_and_run(tabletop_store, tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(_tiny(tabletop_store, tmp_path), {"logger": "wandb", "logger_group": "sweepA", "run_name": "t1"})
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    assert list(runs[0].glob("*.wandb")), "no offline run file"

    record = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"sweepA" in record and b"t1" in record


@pytest.mark.slow
def test_mlflow_logger_writes_experiment_and_run(tabletop_store, tmp_path, monkeypatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    train(_tiny(tabletop_store, tmp_path), {"logger": "mlflow", "logger_group": "sweepA", "run_name": "t1"})
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("sweepA")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "t1" and "train/loss" in run.data.metrics
    assert os.path.isdir(tmp_path / "mlruns")
