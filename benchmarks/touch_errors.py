"""Where a touch_shelf policy's touch goes wrong: what the base and the hand do once the robot stands
at the shelf with the torso at the board's height.

    python benchmarks/touch_errors.py CHECKPOINT [CHECKPOINT ...] --rollouts 16
    python benchmarks/touch_errors.py expert --rollouts 16
    python benchmarks/touch_errors.py STATE_CHECKPOINT --env-option render=false --env-option object_state=true

Each policy is rolled out on the task's training pairs (or ``--split unseen``; environment k with
object k, k < ``--pairs``) through the rollout's own actor (windows built as ``demoscale eval``
builds them). Per rollout: success; the median forward base command (|vx|, m/s) over the steps
after the first two stages are reached (the expert stands still there, so anything well above zero
is a robot still driving into the shelf); the closest any hand came to the object (mm, MuJoCo's
geom distance, 0 or less at contact); whether the object left the board or tipped over; where the
base stood at the step the hand came closest: its yaw (the shelf faces yaw 0) and the object's
position in the base frame (forward, lateral), which locate a miss on the base rather than the arm
when they spread beyond the expert's. The scripted expert is the reference. With ``--store`` each policy is also measured open loop on the
demonstrations it learned from (``offline_errors``): where its commanded right hand goes against
where the demonstration's did. A table on screen, JSON to ``benchmarks/results/touch_errors.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import numpy as np
from report import add_env_option, add_json_option, checkpoint_label, emit_json, open_loop_chunks


def rollout(
    actor: Any,
    definition: Any,
    env_id: int,
    object_id: int,
    seed: int,
    image_size: int = 64,
    env_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One rollout of ``actor`` (:func:`demoscale.eval.rollout.actor_for`) with its touch figures, in
    an environment rendered as the policy's training data was (``image_size``, ``env_options``)."""
    env = definition.make_env(env_id, object_id, image_size=image_size, **(env_options or {}))
    try:
        history = [env.reset(seed)]
        actor.start(0, env, seed)
        queue: list[np.ndarray] = []
        closest, placement = float("inf"), (0.0, 0.0, 0.0)
        base_forward: list[float] = []
        object_left_board = False
        while env.steps < definition.max_steps and not env.success():
            if not queue:
                queue = list(actor.chunks([0], {0: history}, seed=seed + env.steps)[0])
            action = queue.pop(0)
            if all(env.stages()[:2]):
                base_forward.append(abs(float(action[0])))
            history.append(env.step(action))
            distance = env.hand_object_distance()
            if distance <= closest:
                closest, placement = distance, _object_in_base_frame(env)
            object_left_board = object_left_board or not env.object_on_board()
        return {
            "env_id": env_id,
            "success": bool(env.success()),
            "stages": [bool(s) for s in env.stages()],
            "steps": int(env.steps),
            "base_forward_at_shelf": statistics.median(base_forward) if base_forward else None,
            "closest_hand_mm": 1000 * closest,
            "base_yaw_at_closest": placement[2],
            "object_in_base_at_closest": [placement[0], placement[1]],
            "object_left_board": object_left_board,
        }
    finally:
        env.close()


def _object_in_base_frame(env: Any) -> tuple[float, float, float]:
    """(forward, lateral) of the object in the base frame (m) and the base's yaw (rad)."""
    x, y, yaw = env.base_pose()
    dx, dy = env.object_position()[:2] - np.array([x, y])
    c, s = np.cos(yaw), np.sin(yaw)
    return float(c * dx + s * dy), float(-s * dx + c * dy), float(yaw)


# The touching arm's joints and the torso's in the 21-dim whole-body action (JoyLo layout).
TORSO = slice(3, 7)
RIGHT_ARM = slice(14, 20)


def offline_errors(policy: Any, store_path: str, every: int, ahead: int, last: int = 8) -> dict[str, Any]:
    """How closely the policy reproduces its demonstrations, open loop: on every ``every``-th episode
    of ``store_path``, the distance (mm) between the right hand's grasp point under the torso and arm
    targets the policy predicts ``ahead`` steps into its chunk and under the demonstration's (forward
    kinematics of the robot, the base where the environment starts it: the distance does not depend
    on where the base is), on the ``last`` frames before the touch (the episode's end) and on the
    others. Small here and large in rollouts means the policy drifts off its demonstrations' states;
    large here means it cannot fit them."""
    from demoscale.datasets.store import EpisodeStore
    from demoscale.eval.tasks import get_task
    from demoscale.eval.wholebody.expert import ArmIK

    store = EpisodeStore.open(store_path)
    near_touch: list[float] = []
    elsewhere: list[float] = []
    for index, actions, predicted in open_loop_chunks(policy, store, every):
        n = len(actions)
        meta = store.episodes.iloc[index]
        env = get_task("touch_shelf").make_env(int(meta["env_id"]), int(meta["object_id"]), render=False)
        try:
            env.reset(0)
            kinematics = ArmIK(env, "right")
            for t in range(n):
                j = min(ahead, n - 1 - t)
                hand, _ = kinematics.forward(predicted[t, j, TORSO], predicted[t, j, RIGHT_ARM])
                demo, _ = kinematics.forward(actions[t + j, TORSO], actions[t + j, RIGHT_ARM])
                (near_touch if t >= n - last else elsewhere).append(1000 * float(np.linalg.norm(hand - demo)))
        finally:
            env.close()
    return {
        "episodes": len(range(0, store.n_episodes, every)),
        "ahead": ahead,
        "last_frames": last,
        "near_touch_hand_mm": statistics.median(near_touch),
        "elsewhere_hand_mm": statistics.median(elsewhere),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates and medians over the rollouts (the hand's distance over the failures only)."""
    at_shelf = [r["base_forward_at_shelf"] for r in rows if r["base_forward_at_shelf"] is not None]
    missed = [r["closest_hand_mm"] for r in rows if not r["success"]]
    placement = np.array([r["object_in_base_at_closest"] for r in rows])
    return {
        "rollouts": len(rows),
        "success_rate": float(np.mean([r["success"] for r in rows])),
        "reached_height_rate": float(np.mean([all(r["stages"][:2]) for r in rows])),
        "base_forward_at_shelf_median": statistics.median(at_shelf) if at_shelf else None,
        "closest_hand_mm_failures_median": statistics.median(missed) if missed else None,
        "object_left_board_rate": float(np.mean([r["object_left_board"] for r in rows])),
        "base_yaw_abs_at_closest_median": float(np.median([abs(r["base_yaw_at_closest"]) for r in rows])),
        # 10th and 90th percentiles over the rollouts: the spread of where the base stood.
        "object_forward_in_base_p10_p90": np.percentile(placement[:, 0], [10, 90]).tolist(),
        "object_lateral_in_base_p10_p90": np.percentile(placement[:, 1], [10, 90]).tolist(),
        "per_rollout": rows,
    }


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", help="checkpoint paths, or 'expert'")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--split", choices=["train", "unseen"], default="train")
    parser.add_argument("--pairs", type=int, default=16, help="environment k with object k, k < PAIRS")
    parser.add_argument("--seed", type=int, default=5000, help="first rollout seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--store", help="also measure each policy open loop on this store's demos")
    parser.add_argument("--every", type=int, default=4, help="--store: every k-th episode")
    parser.add_argument(
        "--ahead", type=int, default=0, help="--store: compare the action this far into the chunk"
    )
    add_env_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")

    import torch
    from demoscale.eval import ids
    from demoscale.eval.cli import parse_env_options
    from demoscale.eval.rollout import PolicyActor, actor_for, apply_capture, recorded_capture
    from demoscale.eval.tasks import get_task

    torch.set_num_threads(args.threads)
    definition = get_task("touch_shelf")
    pairs = ids.pair_ids(
        ids.env_ids(args.split, args.pairs), ids.object_ids(args.split, args.pairs), "unique"
    )
    results: dict[str, Any] = {}
    for name in args.policies:
        actor = actor_for(name)
        # The camera's image size and the cloud's point count the policy was trained with, as
        # `demoscale eval` applies them (the expert: the task's defaults).
        recorded = recorded_capture(actor.policy) if isinstance(actor, PolicyActor) else {}
        given = parse_env_options(args.env_option) or None
        _, image_size, env_options = apply_capture(recorded, "touch_shelf", None, given, name)
        rows = [
            rollout(actor, definition, *pairs[k % len(pairs)], args.seed + k, image_size or 64, env_options)
            for k in range(args.rollouts)
        ]
        results[name] = summarise(rows)
        if args.store and name != "expert":
            results[name]["offline_errors"] = offline_errors(actor.policy, args.store, args.every, args.ahead)
    print(
        "| policy | success | torso stage reached | base forward at the shelf m/s | closest hand mm (misses) "
        "| object left the board | base yaw at the closest, rad (median abs) "
        "| object in the base frame at the closest: forward / lateral, m (10-90%) |"
    )
    print("|" + " --- |" * 8)
    for name, summary in results.items():
        print(
            f"| {checkpoint_label(name)} | {summary['success_rate']:.2f} | {summary['reached_height_rate']:.2f} | "
            f"{_cell(summary['base_forward_at_shelf_median'], 3)} | "
            f"{_cell(summary['closest_hand_mm_failures_median'], 0)} | {summary['object_left_board_rate']:.2f} | "
            f"{summary['base_yaw_abs_at_closest_median']:.3f} | "
            "{:.2f}-{:.2f} / {:.2f}-{:.2f} |".format(
                *summary["object_forward_in_base_p10_p90"], *summary["object_lateral_in_base_p10_p90"]
            )
        )
    offline = {name: r["offline_errors"] for name, r in results.items() if "offline_errors" in r}
    if offline:
        print(
            f"\nOpen loop on {args.store}: the right hand's grasp point, predicted against demonstrated (mm)"
        )
        print("| policy | last frames before the touch | elsewhere |")
        print("| --- | --- | --- |")
        for name, errors in offline.items():
            print(
                f"| {checkpoint_label(name)} | {errors['near_touch_hand_mm']:.1f} | {errors['elsewhere_hand_mm']:.1f} |"
            )
    emit_json(
        "touch_errors", {"split": args.split, "rollouts": args.rollouts, "policies": results}, args.json
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
