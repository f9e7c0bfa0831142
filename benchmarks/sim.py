"""Simulation throughput: physics+render steps/s for each task family, and rollouts/s.

For every registered simulated task (one per family by default, ``--tasks`` to choose) it measures,
in this one process, control steps per second at the image size (default 96x96) with the
scripted expert acting (physics, rendering of the observation cameras, expert), the same without
rendering where the family supports ``render=False``, and rollouts per second through
``demoscale.eval.evaluate`` with a trivial policy (tabletop: hold the current pose; other families:
all-zero actions), so every rollout runs to the task's step limit. Rates are given per wall-clock second and per CPU second of this process (the
per-core figure on a shared machine); medians over ``--repeats``.

    python benchmarks/sim.py [--json [PATH]] [--image-size 96] [--steps 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
from demoscale.eval import evaluate, get_task, task_names
from report import add_json_option, emit_json


class HoldPose:
    """A trivial policy: repeat the current end-effector pose (tabletop action layout)."""

    def __init__(self, action_dim: int) -> None:
        self.obs_offsets = {"robot0_eef_pos": [0], "robot0_eef_rot_axis_angle": [0]}
        self.n_action_steps = 8
        self.action_dim = action_dim

    def predict_action_batch(self, windows, seed=None) -> np.ndarray:
        pos, rot = windows["robot0_eef_pos"][:, -1], windows["robot0_eef_rot_axis_angle"][:, -1]
        chunk = np.concatenate([pos, rot, np.full((len(pos), 1), 0.08)], axis=1)
        return np.repeat(chunk[:, None], 8, axis=1)


class ZeroAction:
    """A trivial policy for any task: observes one low-dim key, outputs all-zero action chunks."""

    def __init__(self, key: str, action_dim: int) -> None:
        self.obs_offsets = {key: [0]}
        self.n_action_steps = 8
        self.action_dim = action_dim

    def predict_action_batch(self, windows, seed=None) -> np.ndarray:
        batch = len(next(iter(windows.values())))
        return np.zeros((batch, 8, self.action_dim))


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def step_rate(task: str, image_size: int, steps: int, render: bool = True) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second) with the expert acting, resets included."""
    definition = get_task(task)
    options = {} if render else {"render": False}
    env = definition.make_env(0, 0, image_size=image_size, **options)
    env.reset(0)  # first render and model build are outside the timing
    done = 0

    def run() -> None:
        nonlocal done
        episode = 0
        while done < steps:
            obs = env.reset(episode)
            expert = env.expert(episode)
            for _ in range(env.max_steps):
                obs = env.step(expert.act(obs))
                done += 1
                if getattr(expert, "done", False) or done >= steps:
                    break
            episode += 1

    wall, cpu = _timed(run)
    env.close()
    return done / wall, done / max(cpu, 1e-9)


def rollout_rate(task: str, image_size: int, n_envs: int) -> tuple[float, float]:
    definition = get_task(task)
    if definition.family == "tabletop":
        policy = HoldPose(definition.action_dim)
    else:
        policy = ZeroAction(next(iter(definition.low_dim_features)), definition.action_dim)
    holder = {}

    def run() -> None:
        holder["result"] = evaluate(policy, task, split="unseen", n_envs=n_envs, n_objects=1, episodes=n_envs,
                                    image_size=image_size, video_episodes=0, progress=False)  # fmt: skip

    wall, cpu = _timed(run)
    return n_envs / wall, n_envs / max(cpu, 1e-9)


def default_tasks() -> list[str]:
    """One task per simulated family (the first registered), skipping those that fail to load."""
    chosen, families = [], set()
    for name in task_names():
        try:
            family = get_task(name).family
        except Exception as error:  # a family whose module is not available here
            print(f"skipping {name}: {error}")
            continue
        if family not in families:
            families.add(family)
            chosen.append(name)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=None)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rollout-envs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args(argv)
    rows = []
    for task in args.tasks or default_tasks():
        definition = get_task(task)
        row = {"task": task, "family": definition.family, "image_size": args.image_size}
        measures = {
            "steps_per_s": lambda t=task: step_rate(t, args.image_size, args.steps),
            "rollouts_per_s": lambda t=task: rollout_rate(t, args.image_size, args.rollout_envs),
        }
        if definition.family == "tabletop":
            measures["physics_steps_per_s"] = lambda t=task: step_rate(t, args.image_size, args.steps, False)
        for name, measure in measures.items():
            try:
                samples = [measure() for _ in range(args.repeats)]
            except Exception as error:
                row[name] = f"failed: {error}"
                continue
            row[name] = statistics.median(s[0] for s in samples)
            row[name.replace("_per_s", "_per_cpu_s")] = statistics.median(s[1] for s in samples)
        rows.append(row)
    header = [
        "task",
        "family",
        "steps/s",
        "steps/cpu-s",
        "no-render steps/cpu-s",
        "rollouts/s",
        "rollouts/cpu-s",
    ]
    print(" | ".join(header))
    for row in rows:
        cells = [row["task"], row["family"]] + [
            f"{row[k]:.1f}" if isinstance(row.get(k), float) else str(row.get(k, "-"))
            for k in ("steps_per_s", "steps_per_cpu_s", "physics_steps_per_cpu_s", "rollouts_per_s",
                      "rollouts_per_cpu_s")
        ]  # fmt: skip
        print(" | ".join(cells))
    emit_json(
        "sim", {"config": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows}, args.json
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
