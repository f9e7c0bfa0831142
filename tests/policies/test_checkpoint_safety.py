"""Checkpoints are read without running code from them; hostile and damaged files are clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_config
from demoscale.conventions import ConfigError
from demoscale.policies import CheckpointError, load_checkpoint, load_policy, train


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: what a hostile checkpoint could do with any code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def trained(tabletop_store, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    config = tiny_config(tabletop_store, root / "run")
    config["trainer"].update(max_steps=2, val_check_interval=2)
    config["checkpoint"]["every_n_train_steps"] = 2
    return Path(train(config).checkpoint_path)


@pytest.fixture
def hostile(trained, tmp_path) -> tuple[Path, Path]:
    """A real checkpoint with one extra entry whose unpickling writes a marker file."""
    marker = tmp_path / "code-ran"
    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    checkpoint["extra"] = _Payload(str(marker))
    path = tmp_path / "hostile.ckpt"
    torch.save(checkpoint, path)
    return path, marker


def test_every_kind_of_real_checkpoint_loads(trained) -> None:
    checkpoint = load_checkpoint(trained)
    assert checkpoint["global_step"] == 2 and checkpoint["demoscale"]["family"] == "diffusion"
    assert load_policy(trained).horizon == 8


def test_hostile_checkpoint_is_refused_without_running_it(hostile) -> None:
    path, marker = hostile
    with pytest.raises(CheckpointError, match=r"refused: its pickle names io\.open.*could run code"):
        load_policy(path)
    assert not marker.exists()


def test_eval_refuses_a_hostile_checkpoint(hostile) -> None:
    path, marker = hostile
    command = [sys.executable, "-m", "demoscale", "eval", str(path), "--task", "reach", "--envs", "1"]
    result = subprocess.run([*command, "--episodes", "1"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "io.open" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()


def test_resuming_from_a_hostile_checkpoint_runs_no_code(hostile, tabletop_store, tmp_path) -> None:
    path, marker = hostile
    with pytest.raises(ConfigError, match=r"--ckpt_path .*hostile\.ckpt: .*io\.open"):
        train(tiny_config(tabletop_store, tmp_path / "resumed"), {"ckpt_path": str(path)})
    assert not marker.exists()
    # From the command line: a message naming the file, exit 2, no traceback, no code run.
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tabletop_store, tmp_path / "cli")))
    command = [sys.executable, "-m", "demoscale", "train", "fit", "--config", str(config)]
    result = subprocess.run([*command, "--ckpt_path", str(path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "io.open" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "random", "empty", "not-a-dict"])
def test_damaged_checkpoints_are_messages(trained, tmp_path, damage) -> None:
    path = tmp_path / f"{damage}.ckpt"
    if damage == "truncated":
        path.write_bytes(trained.read_bytes()[: trained.stat().st_size // 2])
    elif damage == "random":
        path.write_bytes(os.urandom(4096))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match=str(path)):
        load_policy(path)
    if damage == "truncated":
        command = [sys.executable, "-m", "demoscale", "eval", str(path), "--task", "reach", "--envs", "1"]
        result = subprocess.run([*command, "--episodes", "1"], capture_output=True, text=True, timeout=600)
        assert result.returncode == 2 and "not a readable checkpoint" in result.stderr
        assert "Traceback" not in result.stderr
