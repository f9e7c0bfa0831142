"""Every committed experiment (configs/experiments/*.yaml, run by benchmarks/learning_curve.py) still
describes a run the current code can start: it loads (which checks how its store is built against
what the collector, the ingester and the task's expert take), names train configs that exist, and
is named after its file. A record's command that no longer runs is a record nobody can reproduce."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((REPO_ROOT / "configs" / "experiments").glob("*.yaml"))


def _learning_curve():
    if "learning_curve" not in sys.modules:  # its dataclasses look their module up there
        spec = importlib.util.spec_from_file_location(
            "learning_curve", REPO_ROOT / "benchmarks" / "learning_curve.py"
        )
        sys.modules["learning_curve"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["learning_curve"])
    return sys.modules["learning_curve"]


def test_there_are_experiments() -> None:
    assert len(EXPERIMENTS) >= 10


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_config_describes_a_run_that_can_start(path: Path) -> None:
    experiment = _learning_curve().load_experiment(path)
    assert experiment.name == path.stem, "the record folder is named after the config"
    for config in {experiment.train_config, *(v.train_config for v in experiment.variants if v.train_config)}:
        assert (REPO_ROOT / config).is_file(), f"{path.name}: train config {config} is missing"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"collect": {"n_envs": 1, "n_objects": 1, "demos_per_pair": 1, "envs": 3}}, "collect takes"),
        ({"collect": {"n_envs": 1, "n_objects": 1, "demos_per_pair": 1, "expert_options": {"reach": 1.0}}}, "does not take"),
        ({"collect": {"n_envs": 1, "n_objects": 1, "demos_per_pair": 1, "expert_options": {"yaw_range": 2.0}}}, "yaw_range must be in"),
        ({"collect": None, "ingest": {"format": "replay-buffer", "source": "x.zarr", "image_codecs": "jpeg"}}, "ingest takes"),
        ({"collect": None, "ingest": {"format": "lerobot", "source": "x"}}, "format: replay-buffer"),
        ({"collect": None}, "exactly one of"),
    ],
)  # fmt: skip
def test_a_store_recipe_the_code_does_not_take_is_refused_at_load(
    tmp_path: Path, change: dict, message: str
) -> None:
    raw = yaml.safe_load(
        (REPO_ROOT / "configs" / "experiments" / "wholebody_touch_shelf_wide_stops.yaml").read_text()
    )
    raw.update(change)
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=message):
        _learning_curve().load_experiment(path)


def test_variants_pooled_as_seeds_must_differ_only_in_the_seed(tmp_path: Path) -> None:
    raw = yaml.safe_load(
        (REPO_ROOT / "configs" / "experiments" / "pick_place_state_targets_12k.yaml").read_text()
    )
    weight1, weight10 = raw["variants"]
    path = tmp_path / "experiment.yaml"
    # Two recipes in one group would be pooled as seeds of one policy.
    raw["variants"] = [{**weight1, "group": "recipe"}, {**weight10, "group": "recipe"}]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="share group 'recipe'.*differ in more than seed_everything"):
        _learning_curve().load_experiment(path)
    # One recipe from two seeds is what a group is for.
    seed1 = {**weight10, "name": "seed1", "overrides": {**weight10["overrides"], "seed_everything": 1}}
    raw["variants"] = [{**weight10, "group": "recipe"}, {**seed1, "group": "recipe"}]
    path.write_text(yaml.safe_dump(raw))
    assert [v.group_name for v in _learning_curve().load_experiment(path).variants] == ["recipe", "recipe"]


def test_a_rewritten_record_keeps_what_a_person_wrote_below_its_heading(tmp_path) -> None:
    learning_curve = _learning_curve()
    readme = tmp_path / "README.md"
    learning_curve.write_keeping_hand_written(readme, ["# record", "", "| old table |"])
    assert readme.read_text() == "# record\n\n| old table |\n"
    readme.write_text(readme.read_text() + "\n## What it says (written after)\n\n- the reading\n")
    learning_curve.write_keeping_hand_written(readme, ["# record", "", "| new table |"])
    text = readme.read_text()
    assert "| new table |" in text and "| old table |" not in text
    assert text.endswith("## What it says (written after)\n\n- the reading\n")
    assert text.count("## What it says") == 1
