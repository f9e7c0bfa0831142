"""Every committed experiment (configs/experiments/*.yaml, run by benchmarks/learning_curve.py) still
describes a run the current code can start: it loads, names a task and train configs that exist,
and its collection / ingest settings are ones the collector / ingester takes. A record's command
that no longer runs is a record nobody can reproduce."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
from demoscale.collect import ingest
from demoscale.collect.replay_buffer import ingest_replay_buffer
from demoscale.eval import get_task
from demoscale.eval.collect_sim import collect_sim

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((REPO_ROOT / "configs" / "experiments").glob("*.yaml"))


def _learning_curve():
    spec = importlib.util.spec_from_file_location(
        "learning_curve", REPO_ROOT / "benchmarks" / "learning_curve.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("learning_curve", module)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules["learning_curve"])
    return sys.modules["learning_curve"]


def test_there_are_experiments() -> None:
    assert len(EXPERIMENTS) >= 10


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_config_describes_a_run_that_can_start(path: Path) -> None:
    experiment = _learning_curve().load_experiment(path)
    assert experiment.name == path.stem, "the record folder is named after the config"
    definition = get_task(experiment.task)
    for config in {experiment.train_config, *(v.train_config for v in experiment.variants if v.train_config)}:
        assert (REPO_ROOT / config).is_file(), f"{path.name}: train config {config} is missing"
    assert (experiment.ingest is None) != (experiment.collect is None), "one way to build the store"
    if experiment.collect is not None:
        accepted = set(inspect.signature(collect_sim).parameters) - {"task", "out_dir", "progress"}
        assert set(experiment.collect) <= accepted, (
            f"{path.name}: unknown collect keys {set(experiment.collect) - accepted}"
        )
        if experiment.collect.get("expert_options"):
            env = definition.make_env(0, 0, image_size=32)
            try:
                env.reset(0)
                env.expert(0, **experiment.collect["expert_options"])  # the expert takes these settings
            finally:
                env.close()
    if experiment.ingest is not None:
        spec = dict(experiment.ingest)
        assert spec.pop("format") == "replay-buffer" and spec.pop("source")
        # Its own keywords and the ingest driver's (which it passes on as **common).
        accepted = set(inspect.signature(ingest_replay_buffer).parameters) | set(
            inspect.signature(ingest).parameters
        )
        assert set(spec) <= accepted, f"{path.name}: unknown ingest keys {set(spec) - accepted}"
    for split in experiment.evals:
        assert split.split in ("train", "unseen")
