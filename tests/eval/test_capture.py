"""The camera a policy saw travels simulator -> raw file -> store -> checkpoint -> evaluation.

A scene-camera policy evaluated without flags must see the scene camera (not the tabletop default,
the wrist), score exactly as with the flags given, and a contradicting camera must be refused.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml
from demoscale.datasets import EpisodeStore

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tabletop_tiny.yaml"
SCENE = {"task": "reach", "camera": "scene", "image_size": 32, "env_options": {"cameras": ["scene"]}}


@pytest.fixture(scope="module")
def scene_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(raw folder, checkpoint) of a reach policy trained for two steps on 32 px scene-camera demos."""
    from demoscale.collect.umi import ingest_umi
    from demoscale.eval import collect_sim
    from demoscale.policies import train

    root = tmp_path_factory.mktemp("capture")
    collect_sim(
        "reach", 1, 1, 2, root / "raw", image_size=32, env_options={"cameras": ["scene"]}, progress=False
    )
    ingest_umi(root / "raw", root / "store.zarr", progress=False)
    trained = train(
        str(CONFIG),
        {"data.store": str(root / "store.zarr"), "trainer.max_steps": 2, "data.batch_size": 4,
         "model.init_args.global_batch_size": 4, "trainer.val_check_interval": 2,
         "checkpoint.every_n_train_steps": 2, "trainer.default_root_dir": str(root / "run"),
         "trainer.enable_progress_bar": False, "trainer.logger": False, "progress.every_s": 0},
    )  # fmt: skip
    return root, Path(trained.checkpoint_path)


def test_the_camera_is_recorded_in_the_raw_file_the_store_and_the_checkpoint(scene_checkpoint) -> None:
    root, checkpoint = scene_checkpoint
    (zip_path,) = (root / "raw").rglob("dataset.zarr.zip")
    with zipfile.ZipFile(zip_path) as archive:
        attrs = json.loads(archive.read(".zattrs"))
    assert attrs["capture"] == {"camera0_rgb": SCENE}
    store = EpisodeStore.open(root / "store.zarr")
    assert store.features["camera0_rgb"].source == SCENE
    assert store.features["robot0_eef_pos"].source is None
    from demoscale.policies import load_policy

    assert dict(load_policy(checkpoint).features["camera0_rgb"]["source"]) == SCENE


def test_eval_defaults_to_the_recorded_camera_and_scores_as_with_the_flags(scene_checkpoint) -> None:
    from demoscale.eval import evaluate

    _, checkpoint = scene_checkpoint
    common = dict(n_envs=2, episodes=2, max_steps=6, progress=False)
    bare = evaluate(checkpoint, **common)  # no task, no camera, no image size
    assert bare.summary["task"] == "reach"
    assert bare.summary["image_size"] == 32
    assert bare.summary["env_options"] == {"cameras": ["scene"]}
    flagged = evaluate(checkpoint, "reach", image_size=32, env_options={"cameras": ["scene"]}, **common)
    columns = ["env_id", "object_id", "seed", "score", "success", "steps"]
    assert bare.rollouts[columns].equals(flagged.rollouts[columns])


def test_eval_refuses_another_camera_with_a_clear_message(scene_checkpoint, capsys) -> None:
    from demoscale.eval import evaluate
    from demoscale.eval.cli import main as eval_main
    from demoscale.eval.rollout import SpecMismatchError

    _, checkpoint = scene_checkpoint
    with pytest.raises(SpecMismatchError, match=r"'scene' camera .*cameras=\['wrist'\]"):
        evaluate(checkpoint, "reach", n_envs=1, env_options={"cameras": ["wrist"]}, progress=False)
    with pytest.raises(SpecMismatchError, match="image size 48"):
        evaluate(checkpoint, n_envs=1, image_size=48, progress=False)
    # --print-config shows the evaluation the checkpoint implies, without running it.
    assert eval_main([str(checkpoint), "--envs", "1", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["task"], printed["image_size"], printed["cameras"]) == ("reach", 32, ["scene"])
    code = eval_main([str(checkpoint), "--cameras", "wrist", "--envs", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'camera0_rgb' was recorded by the 'scene' camera of task 'reach' at 32 px" in err
    assert "Traceback" not in err


def test_eval_refuses_a_default_camera_that_differs_from_the_record(tmp_path) -> None:
    """Data recorded with the default (wrist) camera and no options: asking for the scene is refused."""
    from demoscale.eval.rollout import SpecMismatchError, check_capture
    from demoscale.eval.tabletop.tasks import ReachEnv

    wrist = {"camera0_rgb": {"task": "reach", "camera": "wrist", "image_size": 32, "env_options": {}}}
    env = ReachEnv(0, 0, image_size=32, cameras=("scene",))
    try:
        with pytest.raises(SpecMismatchError, match="--cameras wrist"):
            check_capture(wrist, env)
    finally:
        env.close()


def test_stores_without_a_record_stay_readable_and_append_refuses_another_camera(tmp_path) -> None:
    from demoscale.collect import IngestError
    from demoscale.collect.umi import ingest_umi
    from demoscale.datasets import FeatureSpec
    from demoscale.eval import collect_sim

    old = FeatureSpec.from_dict({"kind": "image", "shape": [8, 8, 3], "dtype": "uint8"})
    assert old.source is None and FeatureSpec.from_dict(old.to_dict()) == old

    collect_sim("reach", 1, 1, 1, tmp_path / "scene", image_size=32, env_options={"cameras": ["scene"]},
                progress=False)  # fmt: skip
    collect_sim("reach", 1, 1, 1, tmp_path / "wrist", image_size=32, progress=False)
    ingest_umi(tmp_path / "scene", tmp_path / "store.zarr", progress=False)
    with pytest.raises(IngestError, match="'camera': 'wrist'"):
        ingest_umi(tmp_path / "wrist", tmp_path / "store.zarr", progress=False)
