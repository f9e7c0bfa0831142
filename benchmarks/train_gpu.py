"""The GPU training recipe of the Data Scaling Laws study's policy, measured variant by variant.

The policy is ``configs/umi_vit.yaml``'s diffusion policy (two observation frames, t-3 and t; UMI
relative actions, 10-D per robot; 16-step chunks; U-Net [256, 512, 1024]) with a timm ViT-L/14
(``vit_large_patch14_dinov2`` at 224x224, the study's best encoder) and, as a second variant, the
config's ViT-B/16; random initialisation, nothing downloaded. Each variant builds the network with
the project's own code (``DiffusionPolicy`` from the config, statistics from a store) and times
forward + backward + AdamW on one GPU-resident batch of real samples:

- ``fp32`` (PyTorch's default matmul precision), ``bf16`` (autocast);
- ``bf16+compile`` (``demoscale.policies.lightning_module.compile_network``: what
  ``model.init_args.compile: true`` does) and ``bf16+compile+cudagraphs`` (mode
  ``reduce-overhead``, ``compile: reduce-overhead``);
- ``bf16+ckpt@max``: activation checkpointing (``policy.activation_checkpointing``) at the largest
  micro-batch that fits (doubling from ``--batch-size`` until out of memory or ``--max-batch``);

and then the full training step: ``demoscale.policies.train`` (Lightning, bf16-mixed, EMA) reading
a synthetic store (written here with ``EpisodeStore``, JPEG frames) through the project's
DataLoader with ``--workers`` workers, reporting samples/s and the fraction of each step spent
waiting for data (the GPU is synchronised at every step end, so a wait is time the GPU is idle).

Targets it is built to check, on an H100-class GPU: samples/s/GPU >= 2x the study's ~60 with
ViT-L, and data wait <= 5%. Per variant: samples/s, step time, peak GPU memory (allocated and
reserved), warm-up time (compilation included); reported as medians of the timed steps.

The whole run keeps within ``--budget-s`` (default 450 s, so that with start-up it ends within 8
minutes): a variant that would not fit the time left is skipped and says so, and a variant's
timed steps stop at its share of the budget. Variants run in order of importance (ViT-L first,
the full step right after plain bf16).

Without a GPU it prints that there is none and exits 0. ``--cpu-smoke`` instead runs every
variant's code path on the CPU at a tiny size (timm's ``test_vit`` at 32x32, a small U-Net,
compilation traced by dynamo with the ``eager`` backend, no CUDA graphs, the first backbone only): a test of the script, not a
measurement. Prints a table and writes JSON (``benchmarks/report.py``: ``--json [PATH]``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from report import add_json_option, emit_json

STARTED = time.monotonic()
REPO_ROOT = Path(__file__).resolve().parents[1]
UMI_CONFIG = REPO_ROOT / "configs" / "umi_vit.yaml"
STUDY_SAMPLES_PER_S = 60.0  # ViT-L, per GPU (docs: ~5e5 steps x 256 in ~75 h on 8 GPUs)
TARGETS = {"samples_per_s_per_gpu": 2 * STUDY_SAMPLES_PER_S, "data_wait_fraction": 0.05}
BACKBONES = {
    "vit_l14": ("vit_large_patch14_dinov2", {"img_size": 224}),
    "vit_b16": ("vit_base_patch16_clip_224", {}),
}
# The variants of a backbone, in the order they run: (name, precision, compile mode, checkpointing).
# A compile mode of "" means no compilation.
VARIANTS = [
    ("fp32", "fp32", None, False),
    ("bf16", "bf16", None, False),
    ("bf16+compile", "bf16", "default", False),
    ("bf16+compile+cudagraphs", "bf16", "reduce-overhead", False),
    ("bf16+ckpt@max", "bf16", None, True),
]


class Budget:
    """The run's time: what is left, and whether a step of work estimated at ``seconds`` fits."""

    def __init__(self, seconds: float) -> None:
        self.deadline = STARTED + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, seconds: float) -> bool:
        return self.left() >= seconds


# --- the policy, its data -------------------------------------------------------------------------
def policy_dict(backbone: str, args: argparse.Namespace, checkpointing: bool = False) -> dict[str, Any]:
    """``configs/umi_vit.yaml``'s policy with the chosen backbone (random init), image size and, for
    the CPU smoke run, a tiny U-Net."""
    config = yaml.safe_load(UMI_CONFIG.read_text())
    policy = copy.deepcopy(config["model"]["init_args"]["policy"])
    name, kwargs = BACKBONES[backbone] if backbone in BACKBONES else (backbone, {})
    if args.cpu_smoke:
        name, kwargs = "test_vit", {"img_size": args.image_size}
        policy.update(down_dims=[16, 32], step_embed_dim=16)
    policy["image"].update(
        backbone=name,
        backbone_kwargs=dict(kwargs),
        pretrained_path=None,
        resize=[args.image_size, args.image_size],
    )
    policy["activation_checkpointing"] = checkpointing
    return policy


def build_store(path: Path, n_episodes: int, length: int, image_size: int) -> Path:
    """A UMI-layout store (camera, end-effector pose, gripper, next-pose action) of smooth moving
    images, written with the project's ``EpisodeStore`` as JPEG frames."""
    from demoscale.datasets import EpisodeStore, FeatureSpec

    rng = np.random.default_rng(0)
    size = image_size
    features = {
        "camera0_rgb": FeatureSpec(kind="image", shape=(size, size, 3), dtype="uint8", rate_hz=20.0),
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,), units="m"),
        "robot0_eef_rot_axis_angle": FeatureSpec(kind="low_dim", shape=(3,), units="rad"),
        "robot0_gripper_width": FeatureSpec(kind="low_dim", shape=(1,), units="m"),
        "action": FeatureSpec(kind="low_dim", shape=(7,)),
    }
    store = EpisodeStore.create(path, features, image_codec="jpeg")
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
    with store.transaction():
        for episode in range(n_episodes):
            t = np.linspace(0, 1, length, dtype=np.float32)[:, None]
            pos = (rng.uniform(-0.2, 0.2, 3) + rng.uniform(-0.3, 0.3, 3) * t).astype(np.float32)
            rot = np.concatenate([0.3 * np.sin(2 * t), 0.2 * t, 0.1 + 0 * t], 1).astype(np.float32)
            grip = (0.04 + 0.03 * (t > 0.5)).astype(np.float32)
            images = np.empty((length, size, size, 3), np.uint8)
            for frame in range(length):
                images[frame, ..., 0] = (xs + 3 * frame + 20 * episode) % 256
                images[frame, ..., 1] = (ys * 0.8 + 2 * frame) % 256
                images[frame, ..., 2] = 128 + 60 * np.sin((xs + ys + frame) / 17.0)
            state = np.concatenate([pos, rot, grip], 1)
            store.append_episode(
                {
                    "camera0_rgb": images,
                    "robot0_eef_pos": pos,
                    "robot0_eef_rot_axis_angle": rot,
                    "robot0_gripper_width": grip,
                    "action": np.concatenate([state[1:], state[-1:]]),
                },
                env_id=str(episode % 4),
                object_id="0",
                source=f"train_gpu/{episode}",
                source_sha256=f"{episode:064d}",
            )
    return path


def make_policy(policy: dict[str, Any], store: Path, device: Any) -> Any:
    from demoscale.datasets import EpisodeStore
    from demoscale.policies.config_utils import from_plain
    from demoscale.policies.diffusion.config import DiffusionConfig
    from demoscale.policies.diffusion.model import DiffusionPolicy, policy_statistics

    config = from_plain(DiffusionConfig, policy)
    opened = EpisodeStore.open(store)
    return DiffusionPolicy(config, opened.features, policy_statistics(opened, config)).to(device)


def memory_batch(policy: dict[str, Any], store: Path, batch_size: int, device: Any) -> dict[str, Any]:
    """``batch_size`` real samples of the store (the DataLoader's format), moved to ``device``."""
    import torch
    from demoscale.datasets import EpisodeDataset

    dataset = EpisodeDataset(store, policy["obs_offsets"], policy["action_keys"], policy["horizon"])
    indices = [i % len(dataset) for i in range(batch_size)]
    batch = torch.utils.data.default_collate(dataset.__getitems__(indices))

    def move(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: move(item) for key, item in value.items()}
        return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value

    return move(batch)


# --- one in-memory variant ------------------------------------------------------------------------
def run_variant(
    args: argparse.Namespace,
    store: Path,
    backbone: str,
    precision: str,
    compile_mode: str | None,
    checkpointing: bool,
    batch_size: int,
    seconds: float,
) -> dict[str, Any]:
    """Time forward + backward + AdamW of one variant at one micro-batch for at most ``seconds``."""
    import torch
    from demoscale.policies.lightning_module import compile_network

    device = torch.device(args.device)
    torch.manual_seed(0)
    if compile_mode is not None:
        torch._dynamo.reset()  # every compiled variant starts cold, as a training run does
    spec = policy_dict(backbone, args, checkpointing)
    policy = make_policy(spec, store, device).train()
    compiled: list[str] = []
    if compile_mode is not None:
        mode = None if compile_mode == "default" else compile_mode
        # The smoke run traces with dynamo but generates no code (a C++ compile takes minutes here).
        compiled = compile_network(policy, mode, backend="eager" if args.cpu_smoke else None)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, fused=device.type == "cuda")
    batch = memory_batch(spec, store, batch_size, device)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    )

    graphs = compile_mode == "reduce-overhead" and device.type == "cuda"

    # What the steps use, in one place so that the variant can let go of all of it at the end.
    held = {"policy": policy, "optimizer": optimizer, "batch": batch}
    del policy, optimizer, batch

    def step() -> None:
        if graphs:  # a new iteration: the graphs' outputs of the last one may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            loss = held["policy"].compute_loss(held["batch"])
        loss.backward()
        held["optimizer"].step()
        held["optimizer"].zero_grad(set_to_none=True)

    record = {"micro_batch": batch_size, "compiled": compiled, "compile_mode": compile_mode}
    record["parameters_m"] = sum(p.numel() for p in held["policy"].parameters()) / 1e6
    try:
        record.update(time_steps(step, args.warmup, args.steps, seconds, device))
    finally:
        held.clear()
        _release(device, compiled=compile_mode is not None)
    record["samples_per_s"] = batch_size / record["step_s"]
    return record


def _release(device: Any, compiled: bool) -> None:
    """Free what a variant held (compiled graphs and CUDA graph pools included) for the next one."""
    import gc

    import torch

    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    step: Callable[[], None], warmup: int, steps: int, seconds: float, device: Any
) -> dict[str, Any]:
    """Warm-up steps (compilation, CUDA graph capture), then up to ``steps`` timed ones within
    ``seconds`` in all; median step time and peak memory."""
    import torch

    started = time.monotonic()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    _sync(device)
    warmup_s = time.monotonic() - started
    times = []
    while len(times) < steps and (not times or time.monotonic() - started < seconds):
        begin = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - begin)
    out: dict[str, Any] = {
        "warmup_s": warmup_s,
        "timed_steps": len(times),
        "step_s": statistics.median(times),
    }
    if device.type == "cuda":
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    return out


def _is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def largest_batch(args: argparse.Namespace, store: Path, backbone: str, budget: Budget) -> int | None:
    """The largest micro-batch (doubling from ``--batch-size``, capped by ``--max-batch``) whose step
    runs with activation checkpointing, by trying one warm-up step at each size."""

    fitting, size = None, args.batch_size
    probe = argparse.Namespace(**{**vars(args), "warmup": 1, "steps": 1})
    while size <= args.max_batch and budget.fits(15):
        try:
            run_variant(probe, store, backbone, "bf16", None, True, size, seconds=0)
        except Exception as error:
            if not _is_oom(error):
                raise
            break
        fitting, size = size, size * 2
    return fitting


# --- the full training step -----------------------------------------------------------------------
def full_step(
    args: argparse.Namespace, store: Path, root: Path, backbone: str, seconds: float
) -> dict[str, Any]:
    """``demoscale.policies.train`` on the store: samples/s and data-wait fraction after warm-up."""
    import lightning as L
    import torch
    from demoscale.policies import train

    device = torch.device(args.device)
    timer = _StepTimer(args.warmup, device, deadline=time.monotonic() + seconds)
    config = yaml.safe_load(UMI_CONFIG.read_text())
    config["model"]["init_args"]["policy"] = policy_dict(backbone, args)
    config["model"]["init_args"]["global_batch_size"] = args.batch_size  # no accumulation: one batch a step
    config["model"]["init_args"]["optimizer"]["warmup_steps"] = 1
    config["trainer"].update(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        max_steps=args.warmup + args.steps,
        precision="bf16-mixed",
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        log_every_n_steps=10,
    )
    config["data"].update(
        store=str(store), batch_size=args.batch_size, num_workers=args.workers, val_fraction=0.0
    )
    config["checkpoint"] = {"every_n_train_steps": 10**9, "save_last": False}
    config["progress"] = {"every_s": 0}
    L.seed_everything(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train(config, callbacks=[timer.callback()])
    if not timer.step_times:
        raise RuntimeError("no timed step: the warm-up used the whole share of the budget")
    step = statistics.median(timer.step_times)
    return {
        "micro_batch": args.batch_size,
        "workers": args.workers,
        "timed_steps": len(timer.step_times),
        "step_s": step,
        "samples_per_s": args.batch_size / step,
        "data_wait_fraction": statistics.median(timer.wait_fractions),
        "data_wait_fraction_max": max(timer.wait_fractions),
        **(
            {"peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30}
            if device.type == "cuda"
            else {}
        ),
    }


class _StepTimer:
    """Per training step after ``warmup``: the wall time from one step's end to the next's (the GPU
    synchronised at each end) and the part of it spent before the step started (data)."""

    def __init__(self, warmup: int, device: Any, deadline: float) -> None:
        self.warmup, self.device, self.deadline = warmup, device, deadline
        self.step_times: list[float] = []
        self.wait_fractions: list[float] = []
        self._last_end: float | None = None
        self._start = 0.0
        self._seen = 0

    def callback(self) -> Any:
        import lightning as L

        timer = self

        class StepTimer(L.Callback):
            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
                timer._start = time.perf_counter()

            def on_train_batch_end(
                self, trainer: Any, module: Any, outputs: Any, batch: Any, index: int
            ) -> None:
                _sync(timer.device)
                now = time.perf_counter()
                timer._seen += 1
                if timer._last_end is not None and timer._seen > timer.warmup:
                    total = now - timer._last_end
                    timer.step_times.append(total)
                    timer.wait_fractions.append(max(0.0, timer._start - timer._last_end) / total)
                timer._last_end = time.perf_counter()
                if timer.step_times and time.monotonic() > timer.deadline:
                    trainer.should_stop = True  # this variant's share of the budget is spent

        return StepTimer()


# --- the run --------------------------------------------------------------------------------------
def plan(args: argparse.Namespace) -> list[tuple[str, str, str, str | None, bool]]:
    """(kind, backbone, variant name, compile mode, checkpointing) in the order they run."""
    order: list[tuple[str, str, str, str | None, bool]] = []
    for backbone in args.backbones:
        for name, _precision, mode, checkpointing in VARIANTS:
            order.append(("memory", backbone, name, mode, checkpointing))
            if name == "bf16" and backbone == args.backbones[0] and not args.skip_full_step:
                order.append(("full_step", backbone, "full_step(bf16)", None, False))
    return order


def estimate_s(
    kind: str, mode: str | None, checkpointing: bool, step_s: float, args: argparse.Namespace
) -> float:
    """A variant's expected time, from the last measured step time (compilation guessed high)."""
    work = (args.warmup + args.steps) * step_s
    if mode is not None:
        work += 10.0 if args.cpu_smoke else 90.0
    if checkpointing:
        work += 30.0 if not args.cpu_smoke else 2.0  # the batch-size search
    if kind == "full_step":
        work += 20.0 if not args.cpu_smoke else 3.0  # DataLoader workers, Lightning set-up
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backbones", nargs="+", default=list(BACKBONES), choices=list(BACKBONES))
    parser.add_argument(
        "--batch-size", type=int, default=64, help="micro-batch of every variant (ckpt: the start)"
    )
    parser.add_argument("--max-batch", type=int, default=2048, help="upper bound of the checkpointing search")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per variant (compilation)")
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers of the full step")
    parser.add_argument("--budget-s", type=float, default=450.0, help="wall-time budget of the whole run")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--skip-full-step", action="store_true")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="every variant's code path on the CPU at a tiny size (a test)",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)

    import torch

    if args.cpu_smoke:
        args.image_size, args.batch_size, args.max_batch = 32, 2, 4
        args.steps, args.warmup, args.workers = min(args.steps, 2), min(args.warmup, 1), 0
        args.backbones = args.backbones[:1]  # the backbones differ by name only at this size
        args.device = "cpu"
        torch.set_num_threads(1)  # a shared machine: more threads than free cores spin and crawl
    elif not torch.cuda.is_available():
        print("train_gpu: no GPU here (torch.cuda.is_available() is False): nothing measured.")
        print("Run it on a CUDA machine, or with --cpu-smoke to test the script on the CPU.")
        return 0
    else:
        args.device = "cuda"
    budget = Budget(args.budget_s)
    device_name = (
        torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (smoke test, not a measurement)"
    )
    results: list[dict[str, Any]] = []
    step_s = {backbone: 0.5 for backbone in args.backbones}  # until one is measured
    with tempfile.TemporaryDirectory() as tmp:
        length = 40 if args.cpu_smoke else 100
        episodes = (
            4 if args.cpu_smoke else max(8, -(-(args.warmup + args.steps + 2) * args.batch_size // length))
        )
        store = build_store(Path(tmp) / "store.zarr", episodes, length, args.image_size)
        print(
            f"store of {episodes} x {length} frames written at {time.monotonic() - STARTED:.0f} s", flush=True
        )
        for kind, backbone, name, mode, checkpointing in plan(args):
            row: dict[str, Any] = {"backbone": backbone, "variant": name}
            estimate = estimate_s(kind, mode, checkpointing, step_s[backbone], args)
            if not budget.fits(estimate):
                row.update(status="skipped", reason=f"~{estimate:.0f} s needed, {budget.left():.0f} s left")
                results.append(row)
                continue
            share = max(5.0, min(budget.left() - 5.0, 2 * estimate))
            began = time.monotonic()
            try:
                if kind == "full_step":
                    row.update(full_step(args, store, Path(tmp) / f"run_{backbone}", backbone, share))
                elif checkpointing:
                    fitting = largest_batch(args, store, backbone, budget)
                    if fitting is None:
                        raise RuntimeError(
                            f"micro-batch {args.batch_size} does not fit even with checkpointing"
                        )
                    row["largest_micro_batch"] = fitting
                    row.update(run_variant(args, store, backbone, "bf16", None, True, fitting, share))
                else:
                    precision = "fp32" if name == "fp32" else "bf16"
                    row.update(
                        run_variant(args, store, backbone, precision, mode, False, args.batch_size, share)
                    )
                    step_s[backbone] = row["step_s"]
                row["status"] = "ok"
            except Exception as error:
                if args.cpu_smoke:
                    raise  # the smoke run is a test: every code path must work
                row.update(
                    status="oom" if _is_oom(error) else "error", reason=f"{type(error).__name__}: {error}"
                )
                traceback.print_exc(file=sys.stderr)
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            row["wall_s"] = time.monotonic() - began
            results.append(row)

    best = max((r["samples_per_s"] for r in results if r.get("status") == "ok" and r["backbone"] == "vit_l14"
                and "samples_per_s" in r and r["variant"] != "full_step(bf16)"), default=None)  # fmt: skip
    full = next((r for r in results if r["variant"] == "full_step(bf16)" and r.get("status") == "ok"), None)
    verdict = {
        "best_in_memory_vit_l14_samples_per_s": best,
        "full_step_samples_per_s": full["samples_per_s"] if full else None,
        "full_step_data_wait_fraction": full["data_wait_fraction"] if full else None,
        "meets_throughput_target": None if best is None else best >= TARGETS["samples_per_s_per_gpu"],
        "meets_data_wait_target": None
        if full is None
        else full["data_wait_fraction"] <= TARGETS["data_wait_fraction"],
    }
    print(f"device: {device_name}; torch {torch.__version__}; elapsed {time.monotonic() - STARTED:.0f} s")
    header = f"{'backbone':<9}{'variant':<25}{'batch':>6}{'samples/s':>11}{'step ms':>9}{'peak GiB':>9}{'warm-up s':>10}"
    print(header + "  status")
    for row in results:
        peak = row.get("peak_allocated_gib")
        print(
            f"{row['backbone']:<9}{row['variant']:<25}{row.get('micro_batch', ''):>6}"
            f"{_number(row.get('samples_per_s'), '.1f'):>11}{_number(row.get('step_s'), '.1f', 1000):>9}"
            f"{_number(peak, '.1f'):>9}{_number(row.get('warmup_s'), '.1f'):>10}  {row['status']}"
            + (f" ({row['reason']})" if row.get("reason") else "")
            + (f" data wait {row['data_wait_fraction']:.3f}" if "data_wait_fraction" in row else "")
        )
    print(
        f"targets: >= {TARGETS['samples_per_s_per_gpu']:.0f} samples/s/GPU with ViT-L (2x the study's "
        f"~{STUDY_SAMPLES_PER_S:.0f}), data wait <= {TARGETS['data_wait_fraction']:.0%}"
    )
    payload = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "device": device_name,
        "torch": torch.__version__,
        "smoke": bool(args.cpu_smoke),
        "targets": TARGETS,
        "verdict": verdict,
        "variants": results,
        "elapsed_s": time.monotonic() - STARTED,
    }
    emit_json("train_gpu_smoke" if args.cpu_smoke else "train_gpu", payload, args.json)
    return 0


def _number(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


if __name__ == "__main__":
    raise SystemExit(main())
