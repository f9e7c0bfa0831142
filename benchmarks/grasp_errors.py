"""Where a pick_place policy's grasp goes wrong: its pose at the first close, against the object's.

    python benchmarks/grasp_errors.py CHECKPOINT [CHECKPOINT ...] --rollouts 32
    python benchmarks/grasp_errors.py expert --rollouts 32

Each policy is rolled out on the task's training pairs (or ``--split unseen``). At the first step
whose commanded gripper width falls below ``--close-width`` (the moment it decides to grasp), the
script records how far the commanded and the actual gripper centre are from the object's centre
(horizontally), the commanded height, and the gripper's yaw against the expert's grasp yaw (the
object's narrow side). Rollouts are split by whether the object was lifted (stage 1). The scripted
expert is the reference: what a grasp that works looks like. With ``--store`` each policy is also
measured open loop on the demonstrations it learned from (``offline_errors``). A table on screen, JSON to
``benchmarks/results/grasp_errors.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import numpy as np
from report import add_json_option, checkpoint_label, emit_json, open_loop_chunks


def _grasp_yaw_error(env: Any, eef_rotvec: np.ndarray) -> float:
    """Degrees between the gripper's yaw and the nearest grasp yaw across the object's narrow side
    (period pi for a capsule, pi/2 otherwise: the expert's own rule)."""
    period = np.pi if env.object.family == "capsule" else np.pi / 2
    error = (float(eef_rotvec[2]) - env.object_yaw + period / 2) % period - period / 2
    return float(np.degrees(error))


def rollout(
    actor: Any, definition: Any, env_id: int, object_id: int, seed: int, args: argparse.Namespace
) -> dict:
    """One rollout with ``actor`` (:func:`demoscale.eval.rollout.actor_for`: the expert or a policy,
    windows built as ``evaluate`` builds them); the gripper's errors at its first close (None where it
    never closed)."""
    env = definition.make_env(env_id, object_id, image_size=args.image_size, **args.env_options)
    try:
        history = [env.reset(seed)]
        actor.start(0, env, seed)
        queue: list[np.ndarray] = []
        at_close: dict[str, Any] | None = None
        while env.steps < definition.max_steps and not env.success():
            if not queue:
                queue = list(actor.chunks([0], {0: history}, seed=seed + env.steps)[0])
            action = queue.pop(0)
            if at_close is None and action[6] < args.close_width:
                target = env.object_pos
                at_close = {
                    "step": env.steps,
                    "command_xy_mm": 1000 * float(np.linalg.norm(action[:2] - target[:2])),
                    "command_to_start_xy_mm": 1000
                    * float(np.linalg.norm(action[:2] - env.initial_object_pos[:2])),
                    "object_moved_mm": 1000 * float(np.linalg.norm(target[:2] - env.initial_object_pos[:2])),
                    "gripper_xy_mm": 1000 * float(np.linalg.norm(env.eef_pos[:2] - target[:2])),
                    "command_z_mm": 1000 * float(action[2]),
                    "yaw_error_deg": _grasp_yaw_error(env, history[-1]["robot0_eef_rot_axis_angle"]),
                }
            history.append(env.step(action))
        return {"lifted": bool(env.stages()[0]), "success": bool(env.success()), "close": at_close}
    finally:
        env.close()


def offline_errors(
    policy: Any, store_path: str, every: int, ahead: int, close_width: float
) -> dict[str, Any]:
    """How closely the policy reproduces its demonstrations, open loop: on every ``every``-th episode
    of ``store_path``, the horizontal distance (mm) between the action the policy predicts ``ahead``
    steps into its chunk and the demonstration's, on the 8 frames before the demonstration closes the
    gripper and on the others. Small here and large in rollouts means the policy drifts off its
    demonstrations' states, not that it cannot fit them."""
    from demoscale.datasets.store import EpisodeStore

    store = EpisodeStore.open(store_path)
    before_close: list[float] = []
    elsewhere: list[float] = []
    for _, actions, predicted in open_loop_chunks(policy, store, every):
        n = len(actions)
        close = int(np.argmax(actions[:, 6] < close_width))
        for t in range(n):
            j = min(ahead, n - 1 - t)
            error = 1000 * float(np.linalg.norm(predicted[t, j, :2] - actions[t + j, :2]))
            (before_close if close - 8 <= t <= close else elsewhere).append(error)
    return {
        "episodes": len(range(0, store.n_episodes, every)),
        "ahead": ahead,
        "before_close_xy_mm": statistics.median(before_close),
        "elsewhere_xy_mm": statistics.median(elsewhere),
    }


def summarise(rows: list[dict]) -> dict[str, Any]:
    """Medians of the close-time errors, over lifted and not-lifted rollouts apart."""
    out: dict[str, Any] = {
        "rollouts": len(rows),
        "success_rate": sum(r["success"] for r in rows) / len(rows),
        "lift_rate": sum(r["lifted"] for r in rows) / len(rows),
        "never_closed": sum(r["close"] is None for r in rows),
    }
    for label, lifted in (("lifted", True), ("not_lifted", False)):
        closes = [r["close"] for r in rows if r["lifted"] == lifted and r["close"] is not None]
        out[label] = {"n": len(closes)}
        for key in (
            "command_xy_mm",
            "command_to_start_xy_mm",
            "object_moved_mm",
            "gripper_xy_mm",
            "command_z_mm",
        ):
            out[label][key] = statistics.median(c[key] for c in closes) if closes else None
        out[label]["abs_yaw_error_deg"] = (
            statistics.median(abs(c["yaw_error_deg"]) for c in closes) if closes else None
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", help="checkpoint paths, or 'expert'")
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--split", choices=["train", "unseen"], default="train")
    parser.add_argument("--pairs", type=int, default=16, help="environment k with object k, k < PAIRS")
    parser.add_argument("--seed", type=int, default=1000, help="first rollout seed")
    parser.add_argument("--close-width", type=float, default=0.02, help="metres: a command below it closes")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--cameras", nargs="+", default=["scene"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--store", default=None, help="also measure each policy open loop on this store's demos"
    )
    parser.add_argument("--store-every", type=int, default=8, help="every n-th episode of --store")
    add_json_option(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")

    import torch
    from demoscale.eval import ids
    from demoscale.eval.rollout import actor_for
    from demoscale.eval.tasks import get_task

    torch.set_num_threads(args.threads)
    args.env_options = {"cameras": list(args.cameras)}
    definition = get_task("pick_place")
    pairs = ids.pair_ids(
        ids.env_ids(args.split, args.pairs), ids.object_ids(args.split, args.pairs), "unique"
    )
    results: dict[str, Any] = {}
    for name in args.policies:
        actor = actor_for(name)
        rows = [
            rollout(actor, definition, *pairs[k % len(pairs)], args.seed + k, args)
            for k in range(args.rollouts)
        ]
        results[name] = summarise(rows)
        if args.store and name != "expert":
            results[name]["open_loop"] = offline_errors(
                actor.policy, args.store, args.store_every, 4, args.close_width
            )
    header = (
        "| policy | success | lifted | n | command xy mm | gripper xy mm | command z mm | abs yaw error deg |"
    )
    print(header)
    print("|" + " --- |" * 8)
    for name, summary in results.items():
        for label in ("lifted", "not_lifted"):
            part = summary[label]
            cells = [
                part.get(k) for k in ("command_xy_mm", "gripper_xy_mm", "command_z_mm", "abs_yaw_error_deg")
            ]
            print(
                f"| {checkpoint_label(name)} ({label}) | {summary['success_rate']:.2f} | {summary['lift_rate']:.2f} "
                f"| {part['n']} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |"
            )
    for name, summary in results.items():
        if "open_loop" in summary:
            loop = summary["open_loop"]
            print(
                f"{checkpoint_label(name)} open loop on its demos ({loop['episodes']} episodes, action "
                f"{loop['ahead']} steps ahead): {loop['before_close_xy_mm']:.1f} mm before the close, "
                f"{loop['elsewhere_xy_mm']:.1f} mm elsewhere"
            )
    emit_json(
        "grasp_errors", {"split": args.split, "rollouts": args.rollouts, "policies": results}, args.json
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
