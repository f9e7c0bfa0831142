"""What a policy conditioned on its own state estimates does when told the truth instead.

A diffusion policy with ``state_target_condition`` (``policies/README.md``) is a pose estimator (its
state-target head) and a state policy (its denoiser) in one network; at inference the denoiser acts
on the head's estimate. This script rolls the same checkpoint out with the denoiser conditioned on
the simulator's true values of the targets instead (the environment must report them: a store
collected with ``object_state``), blurred by Gaussian noise of each ``--noise-mm`` standard
deviation (in thousandths of the store's unit, millimetres for positions in metres; drawn afresh at
every prediction, as in training), and beside them on the head's own estimate (``head``). The gap
between ``head`` and ``0`` is what perfect perception would be worth to this policy; the curve over
the noise levels says how precise an estimate it needs.

    python benchmarks/condition_oracle.py CKPT [CKPT ...] --split train --envs 16 --objects 16 --pairing unique
        --episodes 64 [--noise-mm 0 5 10 20] [--seeds 0] [--threads 1] [--record docs/results/NAME]

Several checkpoints are each rolled out on their own (rows per checkpoint and condition). A table
on screen, JSON to ``benchmarks/results/condition_oracle.json`` (``--json PATH``);
``--record DIR`` writes ``rollouts.csv``, ``summary.json`` (``headline`` rows, one per condition)
and ``README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from report import add_json_option, add_record_options, add_rollout_options, checkpoint_label, emit_json

ROOT = Path(__file__).resolve().parents[1]
HEAD = "head"


def oracle_policy(policy: Any, noise: float, seed: int = 0) -> Any:
    """``policy`` (a loaded conditioned diffusion policy) acting on the true targets plus Gaussian
    noise of std ``noise`` (store units) instead of its head's estimate. The returned policy also
    observes the target keys (their current frame), which the rollout's environment must report."""
    import torch
    from demoscale.policies.inference import Policy

    network = policy.network
    config = network.config
    if not getattr(config, "state_target_condition", False):
        raise ValueError(
            "the checkpoint's denoiser is not conditioned on state targets (state_target_condition)"
        )
    if noise < 0:
        raise ValueError(f"noise {noise} must be >= 0")

    class OracleCondition(Policy):
        def __init__(self) -> None:
            self.__dict__.update(policy.__dict__)
            self.obs_offsets = {**policy.obs_offsets, **{key: [0] for key in config.state_targets}}
            self.generator = torch.Generator().manual_seed(seed)

        def predict_action_batch(
            self, obs_windows: dict[str, np.ndarray], seed: int | None = None
        ) -> np.ndarray:
            obs = self._to_tensors(obs_windows, batched=True)
            targets = {}
            for key, indices in config.state_targets.items():
                value = obs[key].float().clone()
                value[..., indices] += noise * torch.randn(
                    (*value.shape[:-1], len(indices)), generator=self.generator
                )
                targets[key] = value
            generator = None if seed is None else torch.Generator(self.device).manual_seed(seed)
            with torch.no_grad():
                features = network.encode_features(obs)
                told = network.normalized_targets({"targets": targets, "obs": obs}).to(features.dtype)
                condition = torch.cat([features, told], dim=-1)
                actions = network.act_from_condition(condition, obs, self.num_inference_steps, generator)
            return actions.float().cpu().numpy()

    return OracleCondition()


def _condition(noise_mm: str) -> str:
    return "the head's estimate" if noise_mm == HEAD else f"the truth + {float(noise_mm):g} mm noise"


def write_record(
    out: Path, args: argparse.Namespace, rows: list[dict[str, Any]], rollouts: Any, minutes: float
) -> None:
    """The results record of one run (see the module note)."""
    import torch
    from demoscale.eval.rollout import wilson_interval

    out.mkdir(parents=True, exist_ok=True)
    rollouts.to_csv(out / "rollouts.csv", index=False)
    headline, pooled = [], []
    for (checkpoint, noise_mm), group in rollouts.groupby(["checkpoint", "condition"], sort=False):
        successes, n = int(group["success"].sum()), len(group)
        low, high = wilson_interval(successes, n)
        pooled.append({"checkpoint": checkpoint, "condition": _condition(noise_mm), "noise_mm": noise_mm,
                       "n_rollouts": n, "success_rate": successes / n, "success_ci": [low, high]})  # fmt: skip
        what = args.policy if len(args.checkpoints) == 1 else f"{args.policy} {checkpoint_label(checkpoint)}"
        headline.append({"task": args.task, "policy": f"{what}; conditioned on {_condition(noise_mm)}",
                         "split": args.split, "metric": "success_rate", "value": successes / n, "ci_low": low,
                         "ci_high": high, "n_rollouts": n, "train_minutes": args.train_minutes})  # fmt: skip
    command = shlex.join(["python", "benchmarks/condition_oracle.py", *sys.argv[1:]])
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    summary = {
        "name": out.name, "task": args.task, "checkpoints": args.checkpoints, "command": command, "commit": commit,
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": args.threads},
        "eval_minutes": round(minutes, 2), "train_minutes": args.train_minutes, "per_seed": rows,
        "pooled": pooled, "headline": headline,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    lines = [f"# {out.name}", "", f"{args.policy}: each checkpoint's denoiser conditioned on its head's "
             "estimate of the targets or on the simulator's true values plus noise.", "",
             "```bash", command, "```", "",
             f"Commit `{commit}`; {os.cpu_count()} CPUs, {args.threads} torch thread(s); evaluation "
             f"{minutes:.1f} min (no training).", "",
             "| checkpoint | condition | rollouts | success (90% Wilson) |", "| --- | --- | --- | --- |"]  # fmt: skip
    for p in pooled:
        lines.append(f"| `{p['checkpoint']}` | {p['condition']} | {p['n_rollouts']} | {p['success_rate']:.2f} "
                     f"[{p['success_ci'][0]:.2f}, {p['success_ci'][1]:.2f}] |")  # fmt: skip
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/summary.json, rollouts.csv, README.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="conditioned diffusion checkpoints, each on its own")
    parser.add_argument("--task", default=None, help="default: the task the checkpoint's data recorded")
    parser.add_argument(
        "--noise-mm", nargs="+", default=[HEAD, "0", "5", "10", "20"],
        help=f"'{HEAD}' (the head's estimate, the policy as trained) or a noise std on the true targets, "
        "in thousandths of the store's unit",
    )  # fmt: skip
    add_rollout_options(parser)
    parser.add_argument("--threads", type=int, default=1)
    add_record_options(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    for value in args.noise_mm:
        if value != HEAD and not (value.replace(".", "", 1).isdigit()):
            raise SystemExit(f"--noise-mm {value!r}: '{HEAD}' or a number >= 0")

    import pandas as pd
    import torch
    from demoscale.eval import evaluate
    from demoscale.policies import load_policy

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows, frames = [], []
    # An unconditioned checkpoint is refused before anything runs.
    if any(value != HEAD for value in args.noise_mm):
        for checkpoint in args.checkpoints:
            try:
                oracle_policy(load_policy(checkpoint), 0.0)
            except ValueError as error:
                raise SystemExit(f"{checkpoint}: {error}") from None
    for checkpoint, noise_mm, seed in product(args.checkpoints, args.noise_mm, args.seeds):
        policy = load_policy(checkpoint)
        if noise_mm != HEAD:
            policy = oracle_policy(policy, float(noise_mm) / 1000.0, seed)
        result = evaluate(
            policy, task=args.task, split=args.split, n_envs=args.envs, n_objects=args.objects,
            pairing=args.pairing, episodes=args.episodes, seed=seed, batch_size=50,
            video_episodes=0, progress=False,
        )  # fmt: skip
        summary = result.summary
        args.task = args.task or summary["task"]
        row = {"checkpoint": checkpoint_label(checkpoint), "condition": _condition(noise_mm), "seed": seed,
               "rollouts": summary["episodes"], "success": round(summary["success_rate"], 3),
               "score": round(summary["score"], 3)}  # fmt: skip
        rows.append(row)
        frames.append(result.rollouts.assign(checkpoint=checkpoint, condition=noise_mm, eval_seed=seed))
        print("  ".join(f"{key} {value}" for key, value in row.items()), flush=True)
    minutes = (time.perf_counter() - started) / 60
    print("\n| checkpoint | condition | seed | rollouts | success | score |\n|" + " --- |" * 6)
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")
    emit_json("condition_oracle", {"checkpoints": args.checkpoints, "rows": rows}, args.json)
    if args.record:
        write_record(Path(args.record), args, rows, pd.concat(frames, ignore_index=True), minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
