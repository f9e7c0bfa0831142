"""Control-loop rate of asynchronous vs synchronous hierarchical execution, on the same policy.

Both modes run the same policy on the same environment, alternately, ``--repeats`` times; the table
gives the median control rate of each and their ratio (async / sync). The environment either replays
a stored episode with ``--step-cost-s`` of sleep per step (standing in for the robot executing the
action), or, with ``--task``, is a simulated task run as a robot of ``--control-hz`` (each control
step takes at least its period, as on hardware); success is then reported with a Wilson interval,
and ``--pairs N`` runs repeat r on environment and object r mod N (the task's training pairs).

Without ``--checkpoint`` a small WB-VIMA network with random weights is built on a synthetic JoyLo
store (timing does not depend on the weights).

    python benchmarks/executor.py [--checkpoint CKPT] [--store STORE | --task fetch_shelf [--env-option K=V]]
                                  [--steps 32 --step-cost-s 0.1 --repeats 3 --threads 1] [--json [PATH]]
    python benchmarks/executor.py --checkpoint CKPT --task touch_shelf --control-hz 10 --steps 150 \
                                  --pairs 16 --repeats 16          # the whole-body comparison
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from report import add_json_option, emit_json

JOYLO_PARTS = (
    ("mobile_base", 3),
    ("torso", 4),
    ("left_arm", 6),
    ("left_gripper", 1),
    ("right_arm", 6),
    ("right_gripper", 1),
)


def synthetic_joylo_store(path: Path, n_points: int, length: int = 64) -> Path:
    """One JoyLo-layout episode of smooth random motion and a random point cloud."""
    from demoscale.datasets import EpisodeStore, FeatureSpec

    rng = np.random.default_rng(0)
    features = {
        "action": FeatureSpec(kind="low_dim", shape=(21,)),
        "proprio": FeatureSpec(kind="low_dim", shape=(21,)),
        "pointcloud_xyz": FeatureSpec(kind="point_cloud", shape=(n_points, 3), dtype="float32"),
        "pointcloud_rgb": FeatureSpec(kind="point_cloud", shape=(n_points, 3), dtype="uint8"),
        "pointcloud_mask": FeatureSpec(kind="point_cloud", shape=(n_points,), dtype="bool"),
        **{f"action_{name}": FeatureSpec(kind="low_dim", shape=(dim,)) for name, dim in JOYLO_PARTS},
    }
    store = EpisodeStore.create(path, features)
    action = np.cumsum(rng.normal(0, 0.02, (length, 21)), axis=0).astype(np.float32)
    data = {
        "action": action,
        "proprio": action,
        "pointcloud_xyz": rng.uniform(-1, 1, (length, n_points, 3)).astype(np.float32),
        "pointcloud_rgb": rng.integers(0, 256, (length, n_points, 3), dtype=np.uint8),
        "pointcloud_mask": np.ones((length, n_points), bool),
    }
    start = 0
    for name, dim in JOYLO_PARTS:
        data[f"action_{name}"] = action[:, start : start + dim]
        start += dim
    store.append_episode(
        data, env_id="0", object_id="0", task="bench", source="bench", source_sha256="0" * 64
    )
    return path


def random_wbvima_policy(store_path: Path, n_points: int):
    from demoscale.datasets import EpisodeStore
    from demoscale.policies.inference import Policy
    from demoscale.policies.wbvima import PointCloudInput, WBVIMAConfig, WBVIMAPolicy

    store = EpisodeStore.open(store_path)
    config = WBVIMAConfig(
        point_cloud=PointCloudInput(n_points=n_points),
        embed_dim=128,
        n_heads=4,
        down_dims=[64, 128],
        dropout=0.0,
    )
    stats = {key: store.stats(key) for key in [*config.action_keys, "proprio"]}
    torch.manual_seed(0)
    network = WBVIMAPolicy(config, store.features, stats)
    features = {key: spec.to_dict() for key, spec in store.features.items()}
    return Policy(network, {"family": "wbvima", "features": features}, "cpu", None)


def make_environment(args: argparse.Namespace, store_path: Path | None, repeat: int = 0):
    from demoscale.policies.executor import ReplayEnv

    if args.task:
        from demoscale.eval import make_env
        from demoscale.eval.cli import parse_env_options

        env_id, object_id = args.env_id, args.object_id
        if args.pairs:
            env_id = object_id = repeat % args.pairs
        return make_env(args.task, env_id, object_id, seed=0, **parse_env_options(args.env_option))
    return ReplayEnv(str(store_path), episode=0, step_cost_s=args.step_cost_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a trained checkpoint (default: random WB-VIMA weights)")
    parser.add_argument("--store", help="store whose episode 0 is replayed (default: synthetic JoyLo)")
    parser.add_argument("--task", help="simulated task to run instead of a replay (e.g. fetch_shelf)")
    parser.add_argument("--env-id", type=int, default=0)
    parser.add_argument("--object-id", type=int, default=0)
    parser.add_argument(
        "--env-option", action="append", default=[], metavar="KEY=VALUE",
        help="simulated task option (YAML value), e.g. cameras=[scene] for a scene-camera policy",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=32, help="control steps per episode")
    parser.add_argument(
        "--step-cost-s", type=float, default=0.1, help="sleep per replayed step (10 Hz robot)"
    )
    parser.add_argument(
        "--control-hz", type=float, default=0.0,
        help="simulated task: the robot's control rate (0: as fast as the simulator steps)",
    )  # fmt: skip
    parser.add_argument(
        "--pairs", type=int, default=0, help="simulated task: repeat r on env and object r mod PAIRS"
    )
    parser.add_argument("--n-points", type=int, default=256, help="points of the synthetic cloud")
    parser.add_argument("--inference-steps", type=int, help="denoising steps (default: the policy's)")
    parser.add_argument("--replan-every", type=int, help="async: control steps between replans")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    add_json_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from demoscale.policies.executor import HierarchicalExecutor, ObservationHistory
    from demoscale.policies.inference import load_policy

    with tempfile.TemporaryDirectory() as scratch:
        store_path = Path(args.store) if args.store else None
        if args.checkpoint:
            policy = load_policy(args.checkpoint)
        else:
            store_path = store_path or synthetic_joylo_store(Path(scratch) / "joylo.zarr", args.n_points)
            policy = random_wbvima_policy(store_path, args.n_points)
        if store_path is None and not args.task:
            parser.error("--checkpoint needs --store (replay) or --task (simulation)")
        if args.inference_steps:
            policy.num_inference_steps = args.inference_steps
        env = make_environment(args, store_path)
        period = 1.0 / args.control_hz if args.task and args.control_hz > 0 else 0.0
        runs: dict[str, list] = {"sync": [], "async": []}
        HierarchicalExecutor(policy, mode="sync").run(env, n_steps=2)  # warm-up (allocations, lazy init)
        window = ObservationHistory(policy.obs_offsets)
        window.push(env.reset(0))
        inference_s = []
        for _ in range(3):
            started = time.perf_counter()
            policy.predict_action(window.window())
            inference_s.append(time.perf_counter() - started)
        for repeat in range(args.repeats):
            if args.task and args.pairs and repeat:
                if callable(getattr(env, "close", None)):
                    env.close()
                env = make_environment(args, store_path, repeat)
            for mode in ("sync", "async"):
                executor = HierarchicalExecutor(
                    policy, mode=mode, seed=repeat, replan_every=args.replan_every, control_period_s=period
                )
                runs[mode].append(executor.run(env, args.steps, seed=repeat))
                print(f"  repeat {repeat}: {mode} {runs[mode][-1].control_rate_hz:.2f} Hz, "
                      f"success {runs[mode][-1].success}", flush=True)  # fmt: skip
        close = getattr(env, "close", None)
        if callable(close):
            close()

    summary = {}
    for mode, results in runs.items():
        summary[mode] = {
            "control_rate_hz_median": statistics.median(r.control_rate_hz for r in results),
            "chunks_median": statistics.median(r.chunks for r in results),
            "stalls_median": statistics.median(r.stalls for r in results),
            "success_rate": (
                float(np.mean([r.success for r in results])) if results[0].success is not None else None
            ),
        }
        if results[0].success is not None:
            from demoscale.eval.rollout import wilson_interval

            low, high = wilson_interval(sum(bool(r.success) for r in results), len(results), 0.9)
            summary[mode]["success_ci90"] = [low, high]
    ratio = summary["async"]["control_rate_hz_median"] / summary["sync"]["control_rate_hz_median"]
    report = {
        "policy": args.checkpoint or "random WB-VIMA",
        "environment": args.task or f"replay (step cost {args.step_cost_s} s)",
        "control_hz": args.control_hz if args.task else 1.0 / args.step_cost_s if args.step_cost_s else 0.0,
        "pairs": args.pairs,
        "steps": args.steps,
        "repeats": args.repeats,
        "n_action_steps": policy.n_action_steps,
        "num_inference_steps": policy.num_inference_steps,
        "chunk_inference_s_median": statistics.median(inference_s),
        "modes": summary,
        "async_over_sync_rate_ratio": ratio,
    }
    print(
        f"executor benchmark: {report['policy']} on {report['environment']}, {args.steps} steps x {args.repeats}"
    )
    print(f"{'mode':<6} {'control Hz (median)':>20} {'chunks':>7} {'stalls':>7} {'success (90% CI)':>8}")
    for mode, row in summary.items():
        success = "-" if row["success_rate"] is None else f"{row['success_rate']:.2f}"
        if "success_ci90" in row:
            success += " [{:.2f}, {:.2f}]".format(*row["success_ci90"])
        print(
            f"{mode:<6} {row['control_rate_hz_median']:>20.2f} {row['chunks_median']:>7.0f} "
            f"{row['stalls_median']:>7.0f} {success:>8}"
        )
    print(f"one chunk (slow + fast modules): {report['chunk_inference_s_median']:.3f} s (median)")
    print(f"async / sync control rate: {ratio:.2f}x")
    emit_json("executor", report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
