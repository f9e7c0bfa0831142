"""Training-step throughput of the diffusion policy, measured side by side in one run.

1. The full training step through ``demoscale.policies.train`` (Lightning, data read from a real
   store on disk through the DataModule, EMA, logging) vs the same model's forward + backward +
   AdamW on a batch already in memory, measured in ``--repeats`` alternating pairs:
   ``overhead_ratio`` (the median of the pairs' ratios; target >= 0.9) and the median
   ``data_wait_fraction`` (target <= 0.05).
2. The effect of each throughput flag available on this machine, on in-memory batches, as a ratio
   to the fp32 baseline: bf16 autocast, channels_last, activation checkpointing, gradient
   accumulation (two half-size micro-batches per step), ``torch.compile`` (``--compile``; cold
   compilation takes about a minute and is excluded from the timing).
3. Inference latency of one action chunk (batch 1) with 16 DDIM steps.
4. The whole-body row: samples/s of one WB-VIMA training step (forward + backward + clipping +
   AdamW, in-memory batch) at the size ``configs/wbvima_sim.yaml`` trains (its policy section and
   global batch, 1,024-point clouds, two observed steps), with the point-cloud encoder's
   winners-only backward (today's training path) against differentiating through every point (the
   previous one), in ``--repeats`` alternating pairs: medians and the median of the pairs' ratios.
   ``--wbvima-only`` measures this row alone.

Prints a table and writes the numbers as JSON (``benchmarks/report.py``: ``--json [PATH]``). Medians
throughout.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from report import add_json_option, emit_json

WBVIMA_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "wbvima_sim.yaml"
# The store keys of the 21-D JoyLo action's parts (docs/formats.md section 4) and their sizes.
JOYLO_ACTION_PARTS = {
    "action_mobile_base": 3,
    "action_torso": 4,
    "action_left_arm": 6,
    "action_left_gripper": 1,
    "action_right_arm": 6,
    "action_right_gripper": 1,
}


def build_store(path: Path, n_episodes: int, length: int, image_size: int) -> Path:
    """A tabletop-layout store: camera, end-effector pose, gripper, next-pose action."""
    from demoscale.datasets import EpisodeStore, FeatureSpec

    rng = np.random.default_rng(0)
    features = {
        "camera0_rgb": FeatureSpec(kind="image", shape=(image_size, image_size, 3), dtype="uint8"),
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,)),
        "robot0_eef_rot_axis_angle": FeatureSpec(kind="low_dim", shape=(3,)),
        "robot0_gripper_width": FeatureSpec(kind="low_dim", shape=(1,)),
        "action": FeatureSpec(kind="low_dim", shape=(7,)),
    }
    store = EpisodeStore.create(path, features, image_codec="jpeg")
    for episode in range(n_episodes):
        t = np.linspace(0, 1, length, dtype=np.float32)[:, None]
        pos = (rng.uniform(-0.2, 0.2, 3) + rng.uniform(-0.3, 0.3, 3) * t).astype(np.float32)
        rot = np.concatenate([0.3 * np.sin(2 * t), 0.2 * t, 0.1 + 0 * t], 1).astype(np.float32)
        grip = (0.04 + 0.03 * (t > 0.5)).astype(np.float32)
        images = rng.integers(0, 255, (length, image_size, image_size, 3), dtype=np.uint8)
        state = np.concatenate([pos, rot, grip], 1)
        store.append_episode(
            {
                "camera0_rgb": images,
                "robot0_eef_pos": pos,
                "robot0_eef_rot_axis_angle": rot,
                "robot0_gripper_width": grip,
                "action": np.concatenate([state[1:], state[-1:]]),
            },
            env_id=str(episode),
            object_id="0",
            source=f"bench/{episode}",
            source_sha256=f"{episode:064d}",
        )
    return path


def policy_dict(args: argparse.Namespace) -> dict:
    return {
        "obs_offsets": {
            "camera0_rgb": [-1, 0],
            "robot0_eef_pos": [-1, 0],
            "robot0_eef_rot_axis_angle": [-1, 0],
            "robot0_gripper_width": [-1, 0],
        },
        "action_keys": ["action"],
        "horizon": 16,
        "n_action_steps": 8,
        "action_representation": "relative",
        "image": {"backbone": args.backbone, "crop_fraction": 0.9, "color_jitter": [0.2, 0.2, 0.2, 0.0]},
        "down_dims": args.down_dims,
        "step_embed_dim": 64,
        "num_train_timesteps": 50,
        "num_inference_steps": 16,
    }


def full_step(args: argparse.Namespace, store: Path, root: Path) -> dict:
    from demoscale.policies import train

    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": args.warmup + args.steps,
            "limit_val_batches": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "default_root_dir": str(root),
            "log_every_n_steps": 10,
        },
        "model": {
            "class_path": "demoscale.policies.DiffusionPolicyModule",
            "init_args": {"policy": policy_dict(args), "optimizer": {"warmup_steps": 10}},
        },
        "data": {
            "store": str(store),
            "batch_size": args.batch_size,
            "num_workers": args.workers,
            "val_fraction": 0.0,
        },
        "checkpoint": {"every_n_train_steps": 10**9},
        "throughput": {"log_every_n_steps": 10},
    }
    from demoscale.policies.callbacks import ThroughputLogger

    original = ThroughputLogger.on_train_batch_end
    kept: dict[str, list[float]] = {}

    def keep(self, trainer, pl_module, outputs, batch, batch_idx):  # Lightning's hook signature
        original(self, trainer, pl_module, outputs, batch, batch_idx)
        kept["samples_per_s"], kept["wait"] = self.samples_per_s, self.data_wait_fraction

    ThroughputLogger.on_train_batch_end = keep
    try:
        train(config)
    finally:
        ThroughputLogger.on_train_batch_end = original
    sps = kept["samples_per_s"][args.warmup :]
    wait = kept["wait"][args.warmup :]
    return {"samples_per_s": statistics.median(sps), "data_wait_fraction": statistics.median(wait)}


def make_policy(args: argparse.Namespace, store: Path, **overrides: Any) -> torch.nn.Module:
    from demoscale.datasets import EpisodeStore
    from demoscale.policies.config_utils import from_plain
    from demoscale.policies.diffusion.config import DiffusionConfig
    from demoscale.policies.diffusion.model import DiffusionPolicy, policy_statistics

    spec = policy_dict(args)
    image = {**spec["image"], **overrides.pop("image", {})}
    config = from_plain(DiffusionConfig, {**spec, **overrides, "image": image})
    opened = EpisodeStore.open(store)
    return DiffusionPolicy(config, opened.features, policy_statistics(opened, config))


def memory_batch(args: argparse.Namespace, store: Path, batch_size: int) -> dict:
    from demoscale.datasets import EpisodeDataset

    spec = policy_dict(args)
    dataset = EpisodeDataset(store, spec["obs_offsets"], spec["action_keys"], spec["horizon"])
    return torch.utils.data.default_collate(dataset.__getitems__(list(range(batch_size))))


def time_steps(step: Callable[[], None], warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def synthetic_samples_per_s(
    args: argparse.Namespace,
    store: Path,
    autocast: bool = False,
    accumulate: int = 1,
    compile: bool = False,
    **policy_overrides,
) -> float:
    torch.manual_seed(0)
    policy = make_policy(args, store, **policy_overrides)
    policy.train()
    if compile:
        from demoscale.policies.lightning_module import compile_network

        compile_network(policy)  # the parts compute_loss calls (Module.compile would wrap forward only)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    micro = args.batch_size // accumulate
    batches = [memory_batch(args, store, micro) for _ in range(accumulate)]

    def step() -> None:
        for batch in batches:
            context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
            with context:
                loss = policy.compute_loss(batch) / accumulate
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return args.batch_size / time_steps(step, args.warmup + (1 if compile else 0), args.steps)


def inference_latency_ms(args: argparse.Namespace, store: Path) -> float:
    policy = make_policy(args, store).eval()
    batch = memory_batch(args, store, 1)
    seconds = time_steps(lambda: policy.predict_action(batch["obs"], num_inference_steps=16), 2, args.steps)
    return 1000 * seconds


def wbvima_step(seed: int = 0) -> tuple[torch.nn.Module, Callable[[], None], int]:
    """The WB-VIMA network of ``configs/wbvima_sim.yaml`` and one training step on an in-memory batch
    of its global batch size (random clouds with 5% padding; the cost does not depend on content)."""
    from demoscale.policies.config_utils import from_plain
    from demoscale.policies.wbvima import WBVIMAConfig, WBVIMAPolicy

    settings = yaml.safe_load(WBVIMA_CONFIG.read_text())
    init_args = settings["model"]["init_args"]
    config = from_plain(WBVIMAConfig, init_args["policy"])
    n_points, steps, horizon = config.point_cloud.n_points, config.obs_window, config.horizon
    low = {"kind": "low_dim"}
    features = {
        "action": {**low, "shape": [21]},
        "proprio": {**low, "shape": [21]},
        "pointcloud_xyz": {"kind": "point_cloud", "shape": [n_points, 3]},
        "pointcloud_rgb": {"kind": "point_cloud", "shape": [n_points, 3]},
        "pointcloud_mask": {"kind": "point_cloud", "shape": [n_points]},
    }
    features.update({key: {**low, "shape": [size]} for key, size in JOYLO_ACTION_PARTS.items()})
    stats = {
        key: {"min": -np.ones(spec["shape"]), "max": np.ones(spec["shape"])}
        for key, spec in features.items()
        if spec["kind"] == "low_dim"
    }
    torch.manual_seed(seed)
    policy = WBVIMAPolicy(config, features, stats).train()
    batch_size = int(init_args["global_batch_size"])
    generator = torch.Generator().manual_seed(seed)
    batch = {
        "obs": {
            "pointcloud_xyz": torch.rand(batch_size, steps, n_points, 3, generator=generator) * 4 - 2,
            "pointcloud_rgb": torch.randint(
                0, 256, (batch_size, steps, n_points, 3), generator=generator, dtype=torch.uint8
            ),
            "pointcloud_mask": torch.rand(batch_size, steps, n_points, generator=generator) > 0.05,
            "proprio": torch.rand(batch_size, steps, 21, generator=generator) * 2 - 1,
        },
        "action": torch.rand(batch_size, horizon, 21, generator=generator) * 2 - 1,
    }
    optimizer_args = init_args["optimizer"]
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=optimizer_args["lr"], weight_decay=optimizer_args["weight_decay"]
    )
    clip = float(settings["trainer"].get("gradient_clip_val") or 0.0)

    def step() -> None:
        policy.compute_loss(batch).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return policy, step, batch_size


def wbvima_samples_per_s(args: argparse.Namespace, winner_backward: bool) -> float:
    from demoscale.policies.encoders import PointCloudEncoder

    policy, step, batch_size = wbvima_step()
    for module in policy.modules():
        if isinstance(module, PointCloudEncoder):
            module.winner_backward = winner_backward
    return batch_size / time_steps(step, args.warmup, args.steps)


def wbvima_row(args: argparse.Namespace) -> dict:
    """Today's WB-VIMA step against the dense-backward reference, in alternating pairs."""
    after, before = [], []
    for _ in range(args.repeats):
        before.append(wbvima_samples_per_s(args, winner_backward=False))
        after.append(wbvima_samples_per_s(args, winner_backward=True))
    ratios = [a / b for a, b in zip(after, before, strict=True)]
    return {
        "config": str(WBVIMA_CONFIG.relative_to(WBVIMA_CONFIG.parents[1])),
        "samples_per_s": statistics.median(after),
        "dense_backward_samples_per_s": statistics.median(before),
        "speedup": statistics.median(ratios),
        "speedup_per_repeat": ratios,
    }


def print_wbvima_row(row: dict) -> None:
    print(f"{'WB-VIMA step (' + row['config'] + ')':<34}{row['samples_per_s']:>10.1f}/s")
    print(
        f"{'  dense point-cloud backward':<34}{row['dense_backward_samples_per_s']:>10.1f}/s  "
        f"speed-up x{row['speedup']:.2f} (median of pairs: "
        f"{', '.join(f'{r:.2f}' for r in row['speedup_per_repeat'])})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backbone", default="resnet10t")
    parser.add_argument("--down-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="alternating full-step/baseline pairs")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers of the full step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile (slow to compile)")
    parser.add_argument("--wbvima-only", action="store_true", help="measure the whole-body row alone")
    add_json_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.wbvima_only:
        row = wbvima_row(args)
        print(f"{'measurement':<34}{'value':>12}")
        print_wbvima_row(row)
        config = {k: v for k, v in vars(args).items() if k != "json"}
        emit_json("train_step", {"config": config, "wbvima": row}, args.json)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        store = build_store(Path(tmp) / "bench.zarr", n_episodes=8, length=60, image_size=args.image_size)
        # Alternate the two measurements and compare pair by pair: on a shared machine the load
        # drifts between runs, and one pair alone is +-10% noise.
        fulls, baselines = [], []
        for repeat in range(args.repeats):
            fulls.append(full_step(args, store, Path(tmp) / f"run{repeat}"))
            baselines.append(synthetic_samples_per_s(args, store))
        full = {
            "samples_per_s": statistics.median(f["samples_per_s"] for f in fulls),
            "data_wait_fraction": statistics.median(f["data_wait_fraction"] for f in fulls),
        }
        baseline = statistics.median(baselines)
        ratios = [f["samples_per_s"] / b for f, b in zip(fulls, baselines, strict=True)]
        variants: dict[str, dict] = {
            "bf16_autocast": {"autocast": True},
            "channels_last": {"image": {"channels_last": True}},
            "activation_checkpointing": {"activation_checkpointing": True},
            "grad_accumulation_2x": {"accumulate": 2},
        }
        if args.compile:
            variants["torch_compile"] = {"compile": True}
        # Each flag against an fp32 run right before it, in every repeat; medians over repeats.
        flag_runs: dict[str, list[float]] = {name: [] for name in variants}
        flag_ratios: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, options in variants.items():
                reference = synthetic_samples_per_s(args, store)
                value = synthetic_samples_per_s(args, store, **options)
                flag_runs[name].append(value)
                flag_ratios[name].append(value / reference)
        flags = {name: statistics.median(values) for name, values in flag_runs.items()}
        flag_ratio = {name: statistics.median(values) for name, values in flag_ratios.items()}
        latency = inference_latency_ms(args, store)
    wbvima = wbvima_row(args)

    result = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "full_step_samples_per_s": full["samples_per_s"],
        "synthetic_samples_per_s": baseline,
        "overhead_ratio": statistics.median(ratios),
        "overhead_ratio_per_repeat": ratios,
        "data_wait_fraction": full["data_wait_fraction"],
        "flags_samples_per_s": flags,
        "flags_ratio_to_fp32": flag_ratio,
        "inference_chunk_ms_ddim16": latency,
        "wbvima": wbvima,
    }
    print(f"{'measurement':<34}{'value':>12}")
    print(f"{'full step (Lightning + store)':<34}{full['samples_per_s']:>10.1f}/s")
    print(f"{'in-memory fwd+bwd (fp32)':<34}{baseline:>10.1f}/s")
    print(
        f"{'overhead_ratio (target >= 0.9)':<34}{result['overhead_ratio']:>12.3f}  (median of pairs: "
        f"{', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(f"{'data_wait_fraction (target <= .05)':<34}{full['data_wait_fraction']:>12.3f}")
    for name, value in flags.items():
        print(f"{name:<34}{value:>10.1f}/s  x{flag_ratio[name]:.2f} vs fp32 (median of paired runs)")
    print(f"{'inference chunk, 16 DDIM steps':<34}{latency:>10.1f}ms")
    print_wbvima_row(wbvima)
    emit_json("train_step", result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
