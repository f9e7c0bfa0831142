"""How precisely a policy trained with state targets knows what it does not observe.

A diffusion policy with ``state_targets`` (``policies/README.md``) learns, beside its actions, to
predict store keys it never observes, e.g. a simulator's object pose from the camera. This script
runs each checkpoint's head (``predict_state_targets``) over every frame of a store's
demonstrations, ideally ones it was not trained on (new placements of its training pairs, or unseen
environments and objects), and compares the estimate with the store's record: per target entry the
median and 90th percentile of the absolute error, in thousandths of the store's unit (millimetres
for positions in metres), and per key the median distance over its first two entries (x, y). With
``--near KEY`` that distance is also given by how far the observed ``KEY`` (e.g. the gripper,
``robot0_eef_pos``) is from the target horizontally (bins of ``--near-bins`` mm): whether the
estimate leans on what is near the object. Per key also how the error splits over episodes: the
norm of each episode's mean x, y error (``bias per episode``, median and p90 over episodes) and the
RMS scatter about it within the episode (``scatter about the bias``), over the frames at least the
first ``--near-bins`` edge away with ``--near``: an error that stays put while the policy acts on it
(a bias) is not averaged away by acting on many frames.

    python benchmarks/state_target_errors.py CKPT [CKPT ...] --store STORE [--episodes N]
        [--near KEY] [--near-bins 20 50 100] [--batch 256] [--threads 1] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from report import add_json_option, checkpoint_label, emit_json


def target_errors(
    checkpoint: str,
    store: str,
    episodes: int | None = None,
    batch: int = 256,
    near: str | None = None,
    near_bins: tuple[float, ...] = (20.0, 50.0, 100.0),
) -> dict[str, Any]:
    """The head's errors on ``store``'s frames (the first ``episodes`` episodes, or all); with
    ``near`` (an observed key) the x, y distances also by that key's horizontal distance (mm) to the
    target, in bins split at ``near_bins``."""
    import torch
    from demoscale.datasets import EpisodeDataset, EpisodeStore
    from demoscale.policies import load_policy

    policy = load_policy(checkpoint)
    network = policy.network
    targets = dict(getattr(network.config, "state_targets", {}) or {})
    if not targets:
        raise SystemExit(f"{checkpoint}: the policy has no state_targets: nothing to compare")
    opened = EpisodeStore.open(store)
    n_episodes = opened.n_episodes
    chosen = list(range(n_episodes if episodes is None else min(episodes, n_episodes)))
    ends = np.asarray(opened.episode_ends, dtype=np.int64)
    lengths = np.diff(np.concatenate([[0], ends]))[chosen]
    episode_of = np.repeat(np.arange(len(chosen)), lengths)  # the dataset's frames, episode by episode
    config = network.config
    if near is not None and near not in config.obs_offsets:
        raise SystemExit(
            f"--near {near!r}: the policy does not observe it (observed: {sorted(config.obs_offsets)})"
        )
    if near is not None and int(np.prod(network.features[near]["shape"])) < 2:
        raise SystemExit(f"--near {near!r}: needs x and y (a key of at least two entries)")
    dataset = EpisodeDataset(
        store, config.obs_offsets, config.action_keys, config.horizon, chosen, target_keys=list(targets)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=False)
    estimates: dict[str, list[np.ndarray]] = {key: [] for key in targets}
    truths: dict[str, list[np.ndarray]] = {key: [] for key in targets}
    near_xy: list[np.ndarray] = []
    started = time.perf_counter()
    for frames in loader:
        predicted = network.predict_state_targets(frames["obs"])
        if near is not None:
            current = config.obs_offsets[near].index(0)
            near_xy.append(frames["obs"][near][:, current].float().flatten(1)[:, :2].numpy())
        for key, indices in targets.items():
            estimates[key].append(predicted[key].cpu().numpy())
            truths[key].append(frames["targets"][key].float().flatten(2)[:, 0, indices].numpy())
    rows = []
    for key, indices in targets.items():
        error = np.concatenate(estimates[key]) - np.concatenate(truths[key])
        for column, entry in enumerate(indices):
            magnitude = np.abs(error[:, column]) * 1000
            rows.append(
                {"key": key, "entry": str(entry), "median": float(np.median(magnitude)),
                 "p90": float(np.percentile(magnitude, 90))}
            )  # fmt: skip
        if len(indices) >= 2:
            distance = np.linalg.norm(error[:, :2], axis=1) * 1000
            rows.append(
                {"key": key, "entry": f"{indices[0]},{indices[1]} (distance)",
                 "median": float(np.median(distance)), "p90": float(np.percentile(distance, 90))}
            )  # fmt: skip
            far = np.ones(len(error), dtype=bool)
            if near is not None:
                truth_xy = np.concatenate(truths[key])[:, :2]
                apart = np.linalg.norm(np.concatenate(near_xy) - truth_xy, axis=1) * 1000
                far = apart >= near_bins[0]
            rows += _bias_and_scatter(key, error[:, :2] * 1000, episode_of, far)
            if near is not None:
                edges = [0.0, *near_bins, np.inf]
                for low, high in zip(edges[:-1], edges[1:], strict=True):
                    chosen_frames = (apart >= low) & (apart < high)
                    if not chosen_frames.any():
                        continue
                    span = f"{low:.0f}-{high:.0f}" if np.isfinite(high) else f">={low:.0f}"
                    rows.append(
                        {"key": key, "entry": f"{near} {span} mm", "frames": int(chosen_frames.sum()),
                         "median": float(np.median(distance[chosen_frames])),
                         "p90": float(np.percentile(distance[chosen_frames], 90))}
                    )  # fmt: skip
    return {
        "checkpoint": checkpoint,
        "store": store,
        "episodes": len(chosen),
        "frames": len(dataset),
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }


def _bias_and_scatter(key: str, error_xy: np.ndarray, episode_of: np.ndarray, kept: np.ndarray) -> list[dict]:
    """Rows of the per-episode split of the x, y error (mm) over the ``kept`` frames: the norm of
    each episode's mean error and the RMS distance of its frames from that mean."""
    biases, scatters = [], []
    for episode in np.unique(episode_of[kept]):
        frames = error_xy[kept & (episode_of == episode)]
        mean = frames.mean(axis=0)
        biases.append(float(np.linalg.norm(mean)))
        scatters.append(float(np.sqrt(((frames - mean) ** 2).sum(axis=1).mean())))
    if not biases:
        return []
    return [
        {"key": key, "entry": name, "episodes": len(values), "median": float(np.median(values)),
         "p90": float(np.percentile(values, 90))}
        for name, values in (("bias per episode", biases), ("scatter about the bias", scatters))
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--store", required=True, help="demonstrations to compare on (with the target keys)")
    parser.add_argument(
        "--episodes", type=int, default=None, help="the store's first N episodes (default all)"
    )
    parser.add_argument(
        "--near", default=None, help="an observed key: x, y errors by its horizontal distance to the target"
    )
    parser.add_argument("--near-bins", type=float, nargs="+", default=[20.0, 50.0, 100.0], help="mm")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    results = [
        target_errors(c, args.store, args.episodes, args.batch, args.near, tuple(args.near_bins))
        for c in args.checkpoints
    ]
    print(f"\nstate-target errors on {args.store} (x1000 of the store's unit: mm for metres)")
    print(f"{'checkpoint':<44} {'key':<14} {'entry':<30} {'median':>8} {'p90':>8}")
    for result in results:
        for row in result["rows"]:
            print(
                f"{checkpoint_label(result['checkpoint']):<44} {row['key']:<14} {row['entry']:<30} "
                f"{row['median']:>8.1f} {row['p90']:>8.1f}"
            )
        print(f"  ({result['frames']} frames of {result['episodes']} episodes, {result['seconds']:.1f} s)")
    emit_json("state_target_errors", {"store": args.store, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
