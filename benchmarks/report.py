"""Where a benchmark's numbers go, the same for every script in this folder.

Each script prints a table for people and writes its numbers as JSON: to
``benchmarks/results/<name>.json`` by default (ignored by git), to ``--json PATH``, or to standard
output as well with ``--json`` alone (or ``--json -``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the JSON to PATH instead of benchmarks/results/NAME.json; alone or '-': also print it",
    )


def add_env_option(parser: argparse.ArgumentParser) -> None:
    """``--env-option KEY=VALUE`` (repeatable): environment options beyond those the policy's data
    recorded, e.g. ``object_state=true`` for a state policy, whose options no camera records
    (parse with ``demoscale.eval.cli.parse_env_options``)."""
    parser.add_argument(
        "--env-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment option beyond the recorded ones (e.g. object_state=true for a state policy)",
    )


def add_rollout_options(parser: argparse.ArgumentParser) -> None:
    """Which rollouts a benchmark runs, as ``demoscale eval`` chooses them: ``--seeds`` (evaluation
    seeds), ``--envs``, ``--split``, ``--objects``, ``--pairing`` and ``--episodes``."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="evaluation seeds")
    parser.add_argument(
        "--envs", type=int, default=None, help="environments, or PushT initial states (default: the task's)"
    )
    parser.add_argument("--split", choices=["unseen", "train"], default="unseen", help="id range")
    parser.add_argument("--objects", type=int, default=1, help="objects per environment")
    parser.add_argument(
        "--pairing", choices=["grid", "unique"], default="grid", help="as demoscale eval --pairing"
    )
    parser.add_argument("--episodes", type=int, default=None, help="rollouts (default: one per pair)")


def add_record_options(parser: argparse.ArgumentParser) -> None:
    """``--record DIR`` (also write a results record there), with ``--policy`` (what the checkpoint
    is) and ``--train-minutes`` (its training time), which the record's headline rows carry."""
    parser.add_argument("--record", default=None, help="also write a results record into this folder")
    parser.add_argument("--policy", default="policy", help="what the checkpoint is, for the record")
    parser.add_argument(
        "--train-minutes", type=float, default=None, help="its training minutes, for the record"
    )


def emit_json(name: str, payload: dict[str, Any], option: str | None) -> Path:
    """Write ``payload`` (plus the machine it ran on) where ``--json`` says; returns the file."""
    payload = {
        "benchmark": name,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        **payload,
    }
    text = json.dumps(payload, indent=2, default=str)
    if option == "-":
        print(text)
    path = Path(option) if option not in (None, "-") else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(f"wrote {path}")
    return path


def checkpoint_label(name: str) -> str:
    """A checkpoint's run folder and file name for tables (``runs/x/checkpoints/last.ckpt`` ->
    ``x/last.ckpt``); ``expert`` and short names as they are."""
    path = Path(name)
    if name == "expert" or len(path.parts) < 3:
        return name
    return f"{path.parent.parent.name}/{path.name}"


def open_loop_chunks(policy: Any, store: Any, every: int) -> Iterator[tuple[int, Any, Any]]:
    """For every ``every``-th episode of ``store`` (an ``EpisodeStore``): its index, its actions
    (T, action_dim) and the chunk ``policy`` predicts at each of its frames (T, horizon, action_dim),
    from the observation windows training used (padded at the episode's start the same way)."""
    import numpy as np
    from demoscale.datasets import WindowSampler

    for index in range(0, store.n_episodes, every):
        actions = store.episode(index)["action"]
        sampler = WindowSampler(store, policy.obs_offsets, ["action"], 1, episodes=[index])
        windows = sampler.sample_many(range(len(actions)))
        yield index, actions, np.asarray(policy.predict_action_batch(windows["obs"], seed=index))
