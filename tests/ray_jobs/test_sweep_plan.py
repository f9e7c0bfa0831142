"""Sweep planning without Ray: config checks, grid ids, budgets, subsets, feasibility, results table."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import fsspec
import pandas as pd
import pytest
import yaml
from demoscale.datasets import EpisodeStore
from demoscale.ray_jobs import (
    RESULT_COLUMNS,
    ClusterConnectionError,
    InfeasibleGridError,
    ResultsFolder,
    SweepConfigError,
    load_sweep_config,
    plan_trials,
    run_sweep,
    sweep_config_from_dict,
    train_steps,
)
from demoscale.ray_jobs.cli import main as sweep_main
from demoscale.ray_jobs.config import BudgetRule


def test_yaml_config_and_relative_paths(tmp_path: Path, sweep_files, monkeypatch) -> None:
    sweep = dict(sweep_files["sweep"], store="data/store.zarr", policies={"tiny": {"config": "train.yaml"}})
    path = tmp_path / "configs" / "sweeps" / "sweep.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(sweep))
    monkeypatch.chdir(tmp_path / "configs")
    config = load_sweep_config(path)
    assert config.eval.mode == "offline" and config.eval.metric == "val/loss"
    assert config.grid.policy == ["tiny"]
    assert config.resolve(config.store) == str(tmp_path / "configs" / "data/store.zarr")  # working folder
    assert config.resolve("s3://bucket/store.zarr") == "s3://bucket/store.zarr"
    path.write_text(yaml.safe_dump(dict(sweep, base_dir="../..")))  # the file's own base, relative to it
    assert load_sweep_config(path).resolve("data/store.zarr") == str(tmp_path / "data/store.zarr")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"grid": {"n_envs": [1], "n_pairs": [2]}}, "exactly one of 'n_envs'"),
        ({"grid": {"n_envs": [0]}}, "grid.n_envs values must be positive"),
        ({"grid": {"n_envs": [1], "policy": ["nope"]}}, "grid.policy names ['nope']"),
        ({"eval": {"mode": "rollouts"}}, "eval.task is required"),
        ({"budget": {"rule": "flops"}}, "budget.rule must be"),
        ({"budget": {"stepz": 3}}, "budget: unknown key(s) ['stepz']"),
        ({"retrys": 3}, "unknown key(s) ['retrys']"),
    ],
)
def test_config_errors_name_the_key(sweep_files, change, message) -> None:
    with pytest.raises(SweepConfigError) as info:
        sweep_config_from_dict({**sweep_files["sweep"], **change}, source="my_sweep.yaml")
    assert message in str(info.value) and "my_sweep.yaml" in str(info.value)


def test_budget_rule_scales_with_data_and_is_clamped() -> None:
    assert train_steps(BudgetRule(rule="fixed", steps=123), n_frames=10_000, batch_size=64) == 123
    rule = BudgetRule(rule="epochs", epochs=2, min_steps=10, max_steps=1000)
    assert train_steps(rule, n_frames=640, batch_size=64) == 20
    assert train_steps(rule, n_frames=64, batch_size=64) == 10  # floor
    assert train_steps(rule, n_frames=10**6, batch_size=64) == 1000  # ceiling


def test_plan_has_deterministic_ids_nested_subsets_and_budgets(sweep_files, sweep_store: Path) -> None:
    sweep = dict(sweep_files["sweep"], budget={"rule": "epochs", "epochs": 1, "min_steps": 1})
    sweep["grid"] = {"n_envs": [1, 2], "n_objects": [1, 2], "demos_per_pair": [2], "seed": [0, 1]}
    config = sweep_config_from_dict(sweep)
    episodes = EpisodeStore.open(sweep_store).episodes
    plan = plan_trials(config, episodes, str(sweep_store))
    assert [p["trial_id"] for p in plan] == [
        p["trial_id"] for p in plan_trials(config, episodes, str(sweep_store))
    ]
    assert len({p["trial_id"] for p in plan}) == 8
    by_id = {p["trial_id"]: p for p in plan}
    small, large = by_id["tiny-e1-o1-d2-s0"], by_id["tiny-e2-o2-d2-s0"]
    assert set(small["episode_indices"]) < set(large["episode_indices"])
    assert (large["n_pairs"], large["total_demos"], len(large["env_ids"]), len(large["object_ids"])) == (
        4,
        8,
        2,
        4,
    )
    lengths = episodes.set_index("episode_index")["length"]
    assert large["n_frames"] == int(lengths.loc[large["episode_indices"]].sum())
    # epochs rule: one epoch of the subset at the training config's batch size of 8
    assert large["train_steps"] == -(-large["n_frames"] // 8)


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        ({"n_envs": [1, 3]}, "largest feasible n_envs is 2"),
        ({"n_envs": [2], "n_objects": [3]}, "largest feasible n_objects is 2"),
        ({"n_envs": [1], "demos_per_pair": [2, 5]}, "largest feasible demos_per_pair is 3"),
        ({"n_pairs": [5]}, "largest feasible n_pairs is 4"),
    ],
)
def test_infeasible_grid_fails_before_ray_starts(sweep_files, grid, expected) -> None:
    import ray

    sweep = dict(sweep_files["sweep"], grid=grid)
    with pytest.raises(InfeasibleGridError) as info:
        run_sweep(sweep)
    assert expected in str(info.value)
    assert not ray.is_initialized()
    assert not (sweep_files["output"] / "results.csv").exists()


def test_cli_reports_an_infeasible_grid(tmp_path: Path, sweep_files, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(dict(sweep_files["sweep"], grid={"n_envs": [4]})))
    assert sweep_main(["--config", str(path)]) == 2
    assert "largest feasible n_envs is 2" in capsys.readouterr().err


def test_unreachable_address_fails_fast_naming_it(sweep_files) -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.perf_counter()
    with pytest.raises(ClusterConnectionError) as info:
        run_sweep(sweep_files["sweep"], address=f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(info.value)
    assert time.perf_counter() - started < 30
    assert not (sweep_files["output"] / "results.csv").exists()


def _row(trial_id: str, score: float) -> dict:
    return {
        "trial_id": trial_id, "policy": "p", "n_envs": 2, "n_objects": 1, "n_pairs": 2, "demos_per_pair": 3,
        "total_demos": 6, "seed": 0, "score": score, "score_ci_low": 0.05, "score_ci_high": 0.95,
        "success_rate": score, "success_ci_low": 0.1, "success_ci_high": 0.9, "confidence": 0.9, "n_rollouts": 2, "env_ids": ["3", "7"], "object_ids": ["11"], "train_steps": 4,
        "samples_seen": 32, "wall_time_s": 1.5, "attempts": 1, "checkpoint": "c.ckpt",
    }  # fmt: skip


def test_results_table_lives_at_an_fsspec_url() -> None:
    # A cluster sweep writes its table to object storage; fsspec's in-memory filesystem is a real
    # non-local backend that runs here.
    url = f"memory://sweep-{uuid.uuid4().hex[:12]}/out"
    table = ResultsFolder(url)
    table.add_trial(_row("a", 0.5), [])
    table.add_trial(_row("b", 0.25), [])
    reopened = ResultsFolder(url)
    assert sorted(reopened.results()["trial_id"]) == ["a", "b"]
    fs, root = fsspec.core.url_to_fs(url)
    assert {Path(p).name for p in fs.ls(root, detail=False)} >= {"results.csv", "results.parquet"}


def test_results_table_adds_replaces_and_never_duplicates(tmp_path: Path) -> None:
    table = ResultsFolder(str(tmp_path / "out"))
    rollouts = [
        {
            "env_id": "1000",
            "object_id": "2000",
            "seed": 0,
            "score": 1.0,
            "success": True,
            "steps": 9,
            "stage_0": 1.0,
        },
        {
            "env_id": "1001",
            "object_id": "2000",
            "seed": 1,
            "score": 0.0,
            "success": False,
            "steps": 20,
            "stage_0": 0.0,
        },
    ]
    table.add_trial(_row("a", 0.5), [dict(r, rollout_index=i) for i, r in enumerate(rollouts)])
    table.add_trial(
        _row("b", 0.25),
        [
            {
                "env_id": 1002,
                "object_id": 2001,
                "seed": 0,
                "score": 0.0,
                "success": False,
                "steps": 5,
                "rollout_index": 0,
            }
        ],
    )  # ints, as evaluate gives
    table.add_trial(_row("a", 0.75), [dict(rollouts[0], rollout_index=0)])  # a retried/rerun trial replaces
    results = table.results()
    assert list(results.columns) == RESULT_COLUMNS
    assert sorted(results["trial_id"]) == ["a", "b"]
    assert results.set_index("trial_id").loc["a", "score"] == 0.75
    assert results.set_index("trial_id").loc["a", "env_ids"] == '["3", "7"]'
    parquet = pd.read_parquet(tmp_path / "out" / "results.parquet")
    pd.testing.assert_frame_equal(parquet.reset_index(drop=True), results, check_dtype=False)
    stored = table.rollouts()
    assert list(stored.columns[:8]) == [
        "trial_id",
        "rollout_index",
        "env_id",
        "object_id",
        "seed",
        "score",
        "success",
        "steps",
    ]
    assert stored["env_id"].tolist() == ["1002", "1000"] and "stage_0" in stored
    assert pd.read_parquet(tmp_path / "out" / "rollouts.parquet")["object_id"].tolist() == ["2001", "2000"]
    assert table.finished_trial_ids() == {"a", "b"}
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_fixed_budget_does_not_need_a_batch_size(tmp_path: Path, sweep_files, sweep_store: Path) -> None:
    (tmp_path / "bare.yaml").write_text("trainer: {max_steps: 1}\n")
    sweep = dict(sweep_files["sweep"], policies={"bare": {"config": str(tmp_path / "bare.yaml")}})
    episodes = EpisodeStore.open(sweep_store).episodes
    plan = plan_trials(sweep_config_from_dict(sweep), episodes, str(sweep_store))
    assert [p["train_steps"] for p in plan] == [4, 4, 4, 4]
    epochs = dict(sweep, budget={"rule": "epochs", "epochs": 1})
    with pytest.raises(SweepConfigError, match="needs a batch size"):
        plan_trials(sweep_config_from_dict(epochs), episodes, str(sweep_store))


@pytest.mark.parametrize(
    "path",
    sorted((Path(__file__).resolve().parents[2] / "configs" / "sweeps").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_shipped_sweep_configs_load_and_name_existing_training_configs(path: Path) -> None:
    config = load_sweep_config(path)
    for name, policy in config.policies.items():
        assert Path(config.resolve(policy.config)).is_file(), (name, policy.config)
    assert set(config.grid.policy or config.policies) <= set(config.policies)


def test_checkpoints_are_recorded_relative_to_the_sweep_folder(tmp_path: Path) -> None:
    from demoscale.ray_jobs.trial import relative_to_output

    out = tmp_path / "sweep"
    (out / "trials" / "t1" / "checkpoints").mkdir(parents=True)
    checkpoint = out / "trials" / "t1" / "checkpoints" / "last.ckpt"
    checkpoint.write_bytes(b"")
    assert relative_to_output(str(checkpoint), str(out)) == "trials/t1/checkpoints/last.ckpt"
    # The same folder reached through a link (as a cluster mount or a symlinked runs/ gives it):
    # no common prefix, the same files.
    link = tmp_path / "linked"
    link.symlink_to(out)
    assert relative_to_output(str(checkpoint), str(link)) == "trials/t1/checkpoints/last.ckpt"
    assert ResultsFolder(str(link)).resolve("trials/t1/checkpoints/last.ckpt") == str(
        link / "trials" / "t1" / "checkpoints" / "last.ckpt"
    )
    # Outside the folder, or on another filesystem, the path stays as it is.
    elsewhere = tmp_path / "elsewhere.ckpt"
    assert relative_to_output(str(elsewhere), str(out)) == str(elsewhere)
    assert relative_to_output("s3://bucket/a.ckpt", "s3://bucket/sweep") == "s3://bucket/a.ckpt"
    assert relative_to_output("s3://bucket/sweep/trials/a.ckpt", "s3://bucket/sweep") == "trials/a.ckpt"
