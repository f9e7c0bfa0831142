"""Packing efficiency of the sweep driver: how much of the CPUs' time do trials actually get?

An 8-trial grid (4 env counts x 2 seeds) of short CPU-bound trials on a private 2-CPU Ray
instance, one CPU per trial. Each trial spins for ``--trial-seconds`` inside a trainer with the
``demoscale.policies.train`` signature (so what is measured is the driver: planning, Ray, Tune,
results table), then the sweep scores it offline.

    packing efficiency = sum of trial busy time / (wall time x CPUs)

reported twice: over the whole ``run_sweep`` call (Ray start and shutdown included) and over the
span from the first trial start to the last trial end (scheduling only). Target: >= 0.8.

    python benchmarks/sweep.py [--json [PATH]] [--trial-seconds 10]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from report import add_json_option, emit_json

CPUS = 2


@dataclass
class SpinResult:
    checkpoint_path: str
    steps: int
    samples_seen: int
    wall_time_s: float
    metrics: dict = field(default_factory=dict)


def spin_train(config: str, overrides: dict) -> SpinResult:
    """Busy the CPU for the configured time; leave a checkpoint and the busy span behind."""
    seconds = float(yaml.safe_load(Path(config).read_text())["spin_seconds"])
    root = Path(overrides["trainer.default_root_dir"])
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    start = time.time()
    x = 0.0
    while time.time() - start < seconds:
        for i in range(10_000):
            x += i * 1e-9
    end = time.time()
    checkpoint = root / "checkpoints" / "last.ckpt"
    checkpoint.write_text(json.dumps({"x": x}))
    (root / "busy.json").write_text(json.dumps({"start": start, "end": end}))
    return SpinResult(str(checkpoint), 1, 1, end - start, {"val/loss": 1.0 / len(overrides["data.episodes"])})


def build_store(path: Path) -> None:
    from demoscale.datasets import EpisodeStore, FeatureSpec

    features = {
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,), units="m"),
        "action": FeatureSpec(kind="low_dim", shape=(3,), units="m"),
    }
    store = EpisodeStore.create(path, features)
    for k in range(8 * 2):
        pos = np.full((10, 3), k, dtype=np.float32)
        store.append_episode(
            {"robot0_eef_pos": pos, "action": pos}, env_id=str(k // 2), object_id=str(k // 2), task="bench",
            operator="scripted", source=f"bench/{k}", source_sha256=f"{k:064d}", success=True,
        )  # fmt: skip


def measure(trial_seconds: float) -> dict:
    from demoscale.ray_jobs import run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_store(root / "store.zarr")
        (root / "spin.yaml").write_text(yaml.safe_dump({"spin_seconds": trial_seconds}))
        sweep = {
            "name": "bench", "store": str(root / "store.zarr"), "output": str(root / "out"),
            "policies": {"spin": {"config": str(root / "spin.yaml")}},
            "grid": {"n_envs": [1, 2, 4, 8], "n_objects": [1], "demos_per_pair": [2], "seed": [0, 1]},
            "eval": "offline", "budget": {"rule": "fixed", "steps": 1}, "resources": {"cpu": 1},
            "num_cpus": CPUS, "retries": 0,
        }  # fmt: skip
        started = time.perf_counter()
        result = run_sweep(sweep, train_fn=spin_train, stream=io.StringIO())
        wall = time.perf_counter() - started
        spans = [json.loads(p.read_text()) for p in (root / "out" / "trials").glob("*/busy.json")]
    busy = [s["end"] - s["start"] for s in spans]
    first, last = min(s["start"] for s in spans), max(s["end"] for s in spans)
    return {
        "trials": len(result.results),
        "cpus": CPUS,
        "trial_seconds": trial_seconds,
        "busy_total_s": sum(busy),
        "busy_median_s": statistics.median(busy),
        "wall_s": wall,
        "trial_span_s": last - first,
        "efficiency_end_to_end": sum(busy) / (wall * CPUS),
        "efficiency_scheduling": sum(busy) / ((last - first) * CPUS),
        "target": 0.8,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_json_option(parser)
    parser.add_argument("--trial-seconds", type=float, default=10.0)
    args = parser.parse_args()
    report = measure(args.trial_seconds)
    print(f"{report['trials']} trials x {report['trial_seconds']:.0f} s busy on {report['cpus']} CPUs")
    print(f"{'measure':<34}{'value':>10}")
    print(f"{'sum of trial busy time (s)':<34}{report['busy_total_s']:>10.1f}")
    print(f"{'median trial busy time (s)':<34}{report['busy_median_s']:>10.1f}")
    print(f"{'run_sweep wall time (s)':<34}{report['wall_s']:>10.1f}")
    print(f"{'first start -> last end (s)':<34}{report['trial_span_s']:>10.1f}")
    print(f"{'packing, end to end':<34}{report['efficiency_end_to_end']:>10.2f}  (target >= 0.8)")
    print(f"{'packing, scheduling only':<34}{report['efficiency_scheduling']:>10.2f}")
    emit_json("sweep", report, args.json)


if __name__ == "__main__":
    main()
