"""A policy's learning curve, measured and put on record: train once, evaluate every checkpoint.

    python benchmarks/learning_curve.py configs/experiments/pusht_state.yaml
    python benchmarks/learning_curve.py configs/experiments/pusht_state.yaml --resume   # after a kill

An experiment file (``configs/experiments/*.yaml``) names the training config and its overrides,
how to build the store (ingest a source or collect in simulation) when it is absent, the steps
whose checkpoints are evaluated, the evaluation splits, and the published numbers to compare
with. The run trains through ``demoscale.policies.train`` (the ``demoscale train fit`` code path)
and records the training wall time at each evaluated step; after training, each checkpoint is
rolled out with ``demoscale.eval.evaluate`` on every split. Evaluation time is not training time.

The record goes to ``docs/results/<name>/`` (``--out`` to change it): ``curve.csv`` (one row per
checkpoint x split: step, training minutes, score, success, task metrics, intervals),
``rollouts/step<k>_<split>.csv``, ``summary.json`` (the command, commit, machine, minutes, the
``headline`` rows of the final checkpoint, the first checkpoint that reaches each anchor),
``curve.png`` and ``README.md``. Checkpoints and logs stay under ``runs/experiments/<name>/``.
A README written again (a variant rerun, the comparison once every variant is in) keeps what
follows its ``## What it says`` heading, the reading of the numbers written by hand.

``--resume`` continues an interrupted training from its last checkpoint and skips evaluations
already written, so a run longer than a session can be finished in the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
METRIC_COLUMNS = ("score", "success_rate")


@dataclass
class EvalSplit:
    """One evaluation of every checkpoint: a split of the task's ids and how many rollouts."""

    split: str = "unseen"
    n_envs: int = 50
    n_objects: int = 1
    episodes: int | None = None
    pairing: str = "grid"
    seed: int = 0
    env_options: dict[str, Any] = field(default_factory=dict)
    name: str | None = None  # how the split is called in tables (default: ``split``)

    @property
    def label(self) -> str:
        return self.name or self.split


@dataclass
class Variant:
    """One arm of a comparison: its own policy label, training config and overrides (on top of the
    experiment's). Variants with the same ``group`` are seeds of one policy: the comparison pools
    them and bootstraps over seeds and rollouts."""

    name: str
    policy: str
    train_config: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    group: str | None = None

    @property
    def group_name(self) -> str:
        return self.group or self.name


@dataclass
class Experiment:
    name: str
    task: str
    policy: str
    train_config: str
    store: str
    checkpoints: list[int]
    evals: list[EvalSplit]
    overrides: dict[str, Any] = field(default_factory=dict)
    ingest: dict[str, Any] | None = None
    collect: dict[str, Any] | None = None
    anchors: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""
    variants: list[Variant] = field(default_factory=list)
    # The comparison's reference group (default: the first variant's) and its bootstrap level.
    reference: str | None = None
    confidence: float = 0.9

    def variant(self, arm: Variant) -> Experiment:
        """The single experiment one variant runs (no variants of its own)."""
        return dataclasses.replace(
            self,
            name=f"{self.name}/{arm.name}",
            policy=arm.policy,
            train_config=arm.train_config or self.train_config,
            overrides={**self.overrides, **arm.overrides},
            variants=[],
        )

    @property
    def max_steps(self) -> int:
        return max(self.checkpoints)


def load_experiment(path: Path) -> Experiment:
    raw = yaml.safe_load(path.read_text())
    evals = [EvalSplit(**entry) for entry in raw.pop("eval")]
    variants = [Variant(**entry) for entry in raw.pop("variants", [])]
    experiment = Experiment(evals=evals, variants=variants, **raw)
    if len({v.name for v in variants}) != len(variants):
        raise ValueError(f"{path}: variant names must be unique")
    if sorted(set(experiment.checkpoints)) != list(experiment.checkpoints) or min(experiment.checkpoints) < 1:
        raise ValueError(f"{path}: checkpoints must be increasing positive step counts")
    check_seed_groups(experiment, path)
    check_store_recipe(experiment, path)
    return experiment


def check_seed_groups(experiment: Experiment, path: Path) -> None:
    """Raise ValueError if variants pooled as seeds of one policy (one ``group``) differ in anything
    but the seed: pooling two recipes would report a mixture as one policy."""
    groups: dict[str, list[Variant]] = {}
    for arm in experiment.variants:
        groups.setdefault(arm.group_name, []).append(arm)
    for group, arms in groups.items():
        recipes = {
            (
                arm.train_config,
                yaml.safe_dump({k: v for k, v in arm.overrides.items() if k != "seed_everything"}),
            )
            for arm in arms
        }
        if len(recipes) > 1:
            names = ", ".join(arm.name for arm in arms)
            raise ValueError(
                f"{path}: variants {names} share group {group!r} (seeds of one policy) but differ in more than "
                "seed_everything; give each recipe its own group"
            )


def check_store_recipe(experiment: Experiment, path: Path) -> None:
    """Raise ValueError unless the experiment says how to build its store with settings the
    collector or ingester takes, so that a wrong key fails at load, not after other runs made the
    store or half an hour into a fresh one."""
    import inspect

    from demoscale.collect import ingest
    from demoscale.collect.replay_buffer import ingest_replay_buffer
    from demoscale.eval.collect_sim import check_expert_options, collect_sim

    if (experiment.ingest is None) == (experiment.collect is None):
        raise ValueError(f"{path}: give exactly one of 'ingest' and 'collect' (how the store is built)")
    if experiment.collect is not None:
        accepted = set(inspect.signature(collect_sim).parameters) - {"task", "out_dir", "progress"}
        unknown = set(experiment.collect) - accepted
        if unknown:
            raise ValueError(f"{path}: collect takes {sorted(accepted)}, not {sorted(unknown)}")
        if experiment.collect.get("expert_options"):
            check_expert_options(experiment.task, experiment.collect["expert_options"], image_size=32)
    else:
        spec = dict(experiment.ingest)
        if spec.pop("format", None) != "replay-buffer" or not spec.pop("source", None):
            raise ValueError(f"{path}: ingest needs format: replay-buffer and a source")
        # Its own keywords and the ingest driver's, which it passes on.
        accepted = set(inspect.signature(ingest_replay_buffer).parameters) | set(
            inspect.signature(ingest).parameters
        )
        unknown = set(spec) - accepted - {"src", "store", "common"}
        if unknown:
            raise ValueError(
                f"{path}: ingest takes {sorted(accepted - {'src', 'store', 'common'})}, not {sorted(unknown)}"
            )


def _resolve(path: str) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else ROOT / candidate


# --- the store ------------------------------------------------------------------------------------
def prepare_store(experiment: Experiment) -> Path:
    """The experiment's store, built first if absent (ingest a source or collect in simulation)."""
    store = _resolve(experiment.store)
    if (store / "meta").exists() or (store / "zarr.json").exists():
        return store
    store.parent.mkdir(parents=True, exist_ok=True)
    if experiment.ingest is not None:
        spec = dict(experiment.ingest)
        spec.pop("format")  # replay-buffer: checked at load (check_store_recipe)
        source = _resolve(spec.pop("source"))
        if not source.exists():
            raise FileNotFoundError(f"{experiment.name}: the source {source} to ingest does not exist")
        from demoscale.collect.replay_buffer import ingest_replay_buffer

        print(f"ingesting {source} -> {store}", flush=True)
        ingest_replay_buffer(source, store, progress=False, **spec)
    else:  # collect (exactly one of the two: checked at load)
        from demoscale.collect import ingest
        from demoscale.eval import get_task
        from demoscale.eval.collect_sim import collect_sim

        raw = store.parent / f"{store.stem}_raw"
        print(f"collecting {experiment.collect} -> {raw}", flush=True)
        collect_sim(experiment.task, out_dir=raw, progress=False, **experiment.collect)
        # The simulator writes the task family's raw format (UMI zips, JoyLo recordings).
        ingest(get_task(experiment.task).source_format, raw, store, progress=False)
    return store


# --- training ---------------------------------------------------------------------------------------
def _clock_callback(steps: list[int], clock_file: Path):
    """A Lightning callback writing the training wall time (accumulated over resumes) at ``steps``."""
    import lightning as L

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.times: dict[str, float] = json.loads(clock_file.read_text()) if clock_file.exists() else {}
            self.offset = max(self.times.values(), default=0.0)
            self.started = 0.0

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            step = int(trainer.global_step)
            if step in steps and str(step) not in self.times:
                self.times[str(step)] = self.offset + time.perf_counter() - self.started
                clock_file.write_text(json.dumps(self.times, indent=1))

    return StepClock()


def train(experiment: Experiment, store: Path, run_dir: Path, resume: bool) -> dict[int, float]:
    """Train to the last evaluated step (or continue); returns step -> training minutes."""
    from demoscale.policies import train as train_policy

    checkpoints = run_dir / "checkpoints"
    clock_file = run_dir / "train_clock.json"
    done = {int(k): v for k, v in json.loads(clock_file.read_text()).items()} if clock_file.exists() else {}
    if all(
        step in done and (checkpoints / f"step{step:07d}.ckpt").exists() for step in experiment.checkpoints
    ):
        return {step: seconds / 60 for step, seconds in done.items()}
    if (checkpoints / "last.ckpt").exists() and not resume:
        raise SystemExit(f"{run_dir} holds an earlier run: pass --resume to continue it, or remove it")
    every = _gcd(experiment.checkpoints)
    overrides = {
        **experiment.overrides,
        "data.store": str(store),
        "trainer.max_steps": experiment.max_steps,
        "trainer.default_root_dir": str(run_dir),
        "checkpoint.dirpath": str(checkpoints),
        "checkpoint.every_n_train_steps": every,
        "checkpoint.save_top_k": -1,
    }
    if (checkpoints / "last.ckpt").exists():
        overrides["ckpt_path"] = "last"
    clock = _clock_callback(list(experiment.checkpoints), clock_file)
    train_policy(_resolve(experiment.train_config), overrides=overrides, callbacks=[clock])
    return {int(step): seconds / 60 for step, seconds in clock.times.items()}


def _gcd(values: list[int]) -> int:
    import math

    out = 0
    for value in values:
        out = math.gcd(out, value)
    return out


# --- evaluation -------------------------------------------------------------------------------------
def evaluate_checkpoints(
    experiment: Experiment, run_dir: Path, out: Path, minutes: dict[int, float], batch_size: int
) -> list[dict[str, Any]]:
    from demoscale.eval import evaluate

    rows = []
    (out / "rollouts").mkdir(parents=True, exist_ok=True)
    for step in experiment.checkpoints:
        checkpoint = run_dir / "checkpoints" / f"step{step:07d}.ckpt"
        for spec in experiment.evals:
            cached = out / "rollouts" / f"step{step}_{spec.label}.json"
            if cached.exists():
                summary = json.loads(cached.read_text())
            else:
                started = time.perf_counter()
                result = evaluate(
                    str(checkpoint),
                    experiment.task,
                    split=spec.split,
                    n_envs=spec.n_envs,
                    n_objects=spec.n_objects,
                    episodes=spec.episodes,
                    pairing=spec.pairing,
                    seed=spec.seed,
                    env_options=spec.env_options or None,
                    video_episodes=0,
                    batch_size=batch_size,
                    progress=False,
                )
                result.rollouts.to_csv(out / "rollouts" / f"step{step}_{spec.label}.csv", index=False)
                summary = {k: v for k, v in result.summary.items() if k not in ("env_ids", "object_ids")}
                # The record names the checkpoint as the repository sees it, not as this machine does.
                summary["policy"] = os.path.relpath(checkpoint, ROOT)
                summary["eval_minutes"] = (time.perf_counter() - started) / 60
                cached.write_text(json.dumps(summary, indent=1, default=float))
            row = {
                "step": step,
                "train_minutes": round(minutes.get(step, float("nan")), 2),
                "split": spec.label,
            }
            row.update({k: v for k, v in summary.items() if isinstance(v, int | float) and k != "seed"})
            rows.append(row)
            print(_row_line(row), flush=True)
    return rows


def _row_line(row: dict[str, Any]) -> str:
    parts = [f"step {row['step']:>6} ({row['train_minutes']:5.1f} min) {row['split']:>7}:"]
    parts.append(
        f"success {row['success_rate']:.2f} [{row['success_ci_low']:.2f}, {row['success_ci_high']:.2f}]"
    )
    for key in row:
        if key.startswith("mean_") and not key.endswith(("_ci_low", "_ci_high")):
            parts.append(f"{key.removeprefix('mean_')} {row[key]:.3f}")
    parts.append(f"score {row['score']:.3f}")
    return "  ".join(parts)


# --- the record -------------------------------------------------------------------------------------
def _metric_rows(row: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """(metric name in the results record, value, ci_low, ci_high) of one curve row."""
    out = [
        ("success_rate", row["success_rate"], row["success_ci_low"], row["success_ci_high"]),
        ("score", row["score"], row["score_ci_low"], row["score_ci_high"]),
    ]
    if "mean_max_coverage" in row:
        out.append(
            (
                "mean_max_coverage",
                row["mean_max_coverage"],
                row["mean_max_coverage_ci_low"],
                row["mean_max_coverage_ci_high"],
            )
        )
    return out


def headline(experiment: Experiment, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The final checkpoint's rows in the results-record format (one per split x metric)."""
    final = [row for row in rows if row["step"] == experiment.max_steps]
    return [
        {
            "task": experiment.task,
            "policy": experiment.policy,
            "split": "train" if row["split"].startswith("train") else "unseen",
            "split_name": row["split"],
            "metric": metric,
            "value": round(float(value), 4),
            "ci_low": round(float(low), 4),
            "ci_high": round(float(high), 4),
            "confidence": row.get("confidence"),
            "n_rollouts": int(row["n_rollouts"]),
            "train_minutes": row["train_minutes"],
            "train_steps": row["step"],
        }
        for row in final
        for metric, value, low, high in _metric_rows(row)
    ]


def anchors_reached(experiment: Experiment, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each published number, the first checkpoint whose value reaches it (or None)."""
    out = []
    for anchor in experiment.anchors:
        metric, target = anchor["metric"], float(anchor["value"])
        split = anchor.get("split", "unseen")
        reached = next(
            (
                row
                for row in sorted(rows, key=lambda r: r["step"])
                if row["split"] == split and row.get(metric, float("-inf")) >= target
            ),
            None,
        )
        out.append(
            {
                **anchor,
                "reached_at_step": None if reached is None else reached["step"],
                "reached_at_train_minutes": None if reached is None else reached["train_minutes"],
            }
        )
    return out


LAST_CHECKPOINTS = 3


def interval_metrics(row: dict[str, Any]) -> list[str]:
    """The task metrics of a curve row that have an interval (means of rollouts' scores, e.g.
    mean_max_coverage); plain means such as mean_steps stay in curve.csv only."""
    return [k for k in row if k.startswith("mean_") and f"{k}_ci_low" in row]


def over_checkpoints(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per split and metric, the two aggregates the Diffusion Policy paper reports beside the final
    checkpoint: the best checkpoint (value, step, training minutes) and the mean of the last
    ``LAST_CHECKPOINTS`` evaluated checkpoints (the paper averages its last 10)."""
    out = []
    for split in dict.fromkeys(row["split"] for row in rows):
        ordered = sorted((row for row in rows if row["split"] == split), key=lambda r: r["step"])
        for metric in ("success_rate", *interval_metrics(ordered[0])):
            best = max(ordered, key=lambda r: r[metric])
            last = [float(r[metric]) for r in ordered[-LAST_CHECKPOINTS:]]
            out.append(
                {
                    "split": split,
                    "metric": metric,
                    "best": round(float(best[metric]), 4),
                    "best_step": best["step"],
                    "best_train_minutes": best["train_minutes"],
                    "mean_of_last": round(sum(last) / len(last), 4),
                    "last_checkpoints": len(last),
                }
            )
    return out


def _git_commit() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # The record being written (and the runs folder) are not changes to the code that made it.
            ["git", "status", "--porcelain", "--", ".", ":!docs/results", ":!runs"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
        return commit + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }


def plot_curve(experiment: Experiment, rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in ("mean_max_coverage", "success_rate", "score") if any(m in r for r in rows)][:2]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        low_key = "success_ci_low" if metric == "success_rate" else f"{metric}_ci_low"
        high_key = "success_ci_high" if metric == "success_rate" else f"{metric}_ci_high"
        for split in dict.fromkeys(r["split"] for r in rows):
            points = sorted((r for r in rows if r["split"] == split), key=lambda r: r["step"])
            x = [r["train_minutes"] for r in points]
            ax.plot(
                x,
                [r[metric] for r in points],
                marker="o",
                label=f"{split} ({points[0]['n_rollouts']} rollouts)",
            )
            ax.fill_between(x, [r[low_key] for r in points], [r[high_key] for r in points], alpha=0.2)
        for anchor in experiment.anchors:
            if anchor["metric"] == metric:
                ax.axhline(anchor["value"], linestyle="--", color="grey", linewidth=1)
                ax.annotate(anchor["label"], (0, anchor["value"]), fontsize=7, va="bottom", color="grey")
        ax.set_xlabel("training minutes (this machine)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    confidence = next((r.get("confidence") for r in rows if r.get("confidence")), None)
    band = f"; bands: {confidence:.0%} intervals" if confidence else ""
    fig.suptitle(f"{experiment.name}: {experiment.policy} on {experiment.task}{band}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# A record's README is rewritten whenever a variant or the comparison is written again; what a person
# wrote below this heading (the reading of the numbers) is kept.
HAND_WRITTEN_HEADING = "## What it says"


def write_keeping_hand_written(path: Path, lines: list[str]) -> None:
    """Write the generated ``lines`` to ``path``, keeping the existing file's hand-written part (from
    the first line starting with :data:`HAND_WRITTEN_HEADING` on)."""
    text = "\n".join(lines).rstrip() + "\n"
    if path.exists():
        old = path.read_text().splitlines()
        start = next((i for i, line in enumerate(old) if line.startswith(HAND_WRITTEN_HEADING)), None)
        if start is not None:
            text += "\n" + "\n".join(old[start:]).rstrip() + "\n"
    path.write_text(text)


def write_readme(
    experiment: Experiment, summary: dict[str, Any], rows: list[dict[str, Any]], out: Path
) -> None:
    lines = [f"# {experiment.name}", "", experiment.description.strip(), ""]
    lines += ["```bash", summary["command"], "```", ""]
    lines += [
        f"Commit `{summary['commit']}`; machine: {summary['machine']['cpus']} CPUs, "
        f"{summary['machine']['accelerator']}, torch {summary['machine']['torch']} with "
        f"{summary['machine']['torch_threads']} threads; training {summary['train_minutes']:.1f} min, "
        f"evaluation {summary['eval_minutes']:.1f} min.",
        "",
        "![learning curve](curve.png)",
        "",
    ]
    metric_keys = interval_metrics(rows[0])
    header = [
        "step",
        "train min",
        "split",
        "success",
        *[k.removeprefix("mean_") for k in metric_keys],
        "score",
        "n",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = [
            str(row["step"]),
            f"{row['train_minutes']:.1f}",
            row["split"],
            f"{row['success_rate']:.2f} [{row['success_ci_low']:.2f}, {row['success_ci_high']:.2f}]",
            *[f"{row[k]:.3f} [{row[k + '_ci_low']:.3f}, {row[k + '_ci_high']:.3f}]" for k in metric_keys],
            f"{row['score']:.3f}",
            str(row["n_rollouts"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if summary["anchors"]:
        lines += ["", "| published number | value | reached here at |", "| --- | --- | --- |"]
        for anchor in summary["anchors"]:
            when = (
                "not reached"
                if anchor["reached_at_step"] is None
                else f"step {anchor['reached_at_step']} ({anchor['reached_at_train_minutes']:.1f} training min)"
            )
            lines.append(f"| {anchor['label']} ({anchor['metric']}) | {anchor['value']} | {when} |")
    lines += ["", "| split | metric | final checkpoint | best checkpoint | mean of the last checkpoints |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    finals = {(r["split_name"], r["metric"]): r["value"] for r in summary["headline"]}
    for entry in summary["over_checkpoints"]:
        final = finals.get((entry["split"], entry["metric"]))
        lines.append(
            f"| {entry['split']} | {entry['metric']} | {'' if final is None else f'{final:.3f}'} | "
            f"{entry['best']:.3f} (step {entry['best_step']}, {entry['best_train_minutes']:.1f} min) | "
            f"{entry['mean_of_last']:.3f} (last {entry['last_checkpoints']}) |"
        )
    confidence = next((r.get("confidence") for r in rows if r.get("confidence")), None)
    if confidence:
        lines += [
            "",
            f"Intervals: {confidence:.0%} (Wilson for success; for scores and coverage, see eval/README.md).",
        ]
    write_keeping_hand_written(out / "README.md", lines)


# --- comparing variants ------------------------------------------------------------------------------
def _final_rollouts(experiment: Experiment, folder: Path, label: str) -> Any:
    import pandas as pd

    return pd.read_csv(folder / "rollouts" / f"step{experiment.max_steps}_{label}.csv")


def bootstrap_difference(
    arm: list[Any], reference: list[Any], metric: str, confidence: float, draws: int = 4000, seed: int = 0
) -> tuple[float, float, float]:
    """Difference of the pooled mean ``metric`` (arm minus reference) with a bootstrap interval over
    seeds and rollouts (:func:`~demoscale.scaling.bootstrap.mean_difference_interval`). ``arm`` and
    ``reference`` are lists of per-seed rollout tables."""
    from demoscale.scaling.bootstrap import mean_difference_interval

    return mean_difference_interval(
        [t[metric].to_numpy(float) for t in arm], [t[metric].to_numpy(float) for t in reference],
        confidence, draws=draws, seed=seed,
    )  # fmt: skip


def compare_variants(experiment: Experiment, out: Path, args: argparse.Namespace) -> None:
    """The comparison of the variants' final checkpoints (per split: pooled success and score with
    Wilson intervals, the difference to the reference group with a bootstrap interval over seeds
    and rollouts), as ``README.md`` and ``summary.json`` in ``out``."""
    import pandas as pd
    from demoscale.eval.rollout import mean_interval, wilson_interval

    groups: dict[str, list[Variant]] = {}
    for arm in experiment.variants:
        groups.setdefault(arm.group_name, []).append(arm)
    reference = experiment.reference or experiment.variants[0].group_name
    level = experiment.confidence
    summaries = {
        arm.name: json.loads((out / arm.name / "summary.json").read_text()) for arm in experiment.variants
    }
    rows, headline_rows = [], []
    for spec in experiment.evals:
        label = spec.label
        tables = {
            g: [_final_rollouts(experiment, out / a.name, label) for a in arms] for g, arms in groups.items()
        }
        for group, arms in groups.items():
            pooled = pd.concat(tables[group], ignore_index=True)
            n, successes = len(pooled), int(pooled["success"].sum())
            low, high = wilson_interval(successes, n, level)
            score_low, score_high = mean_interval(pooled["score"].to_numpy(float), level)
            minutes = [summaries[a.name]["train_minutes"] for a in arms]
            row = {
                "split": label, "group": group, "policy": arms[0].policy, "seeds": len(arms), "n_rollouts": n,
                "success_rate": successes / n, "success_ci": [low, high],
                "score": float(pooled["score"].mean()), "score_ci": [score_low, score_high],
                "train_minutes": sum(minutes) / len(minutes),
            }  # fmt: skip
            if group != reference:
                for metric in ("success", "score"):
                    value, d_low, d_high = bootstrap_difference(
                        tables[group], tables[reference], metric, level
                    )
                    row[f"{metric}_minus_{reference}"] = [value, d_low, d_high]
            rows.append(row)
            split = "train" if label.startswith("train") else "unseen"
            for metric, value, ci in (("success_rate", row["success_rate"], row["success_ci"]),
                                      ("score", row["score"], row["score_ci"])):  # fmt: skip
                headline_rows.append({
                    "task": experiment.task, "policy": row["policy"], "split": split, "split_name": label,
                    "metric": metric, "value": round(value, 4), "ci_low": round(ci[0], 4),
                    "ci_high": round(ci[1], 4), "confidence": level, "n_rollouts": n,
                    "train_minutes": round(row["train_minutes"], 2), "train_steps": experiment.max_steps,
                    "seeds": len(arms),
                })  # fmt: skip
    summary = {
        "name": experiment.name,
        "task": experiment.task,
        "command": " ".join(["python", "benchmarks/learning_curve.py", os.path.relpath(args.experiment, ROOT)]),
        "commit": _git_commit(),
        "machine": machine(),
        "reference": reference,
        "confidence": level,
        "variants": {a.name: {"group": a.group_name, "policy": a.policy, "overrides": a.overrides,
                              "train_config": a.train_config or experiment.train_config} for a in experiment.variants},
        "comparison": rows,
        "headline": headline_rows,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    pct = f"{level:.0%}"
    lines = [
        f"# {experiment.name}",
        "",
        experiment.description.strip(),
        "",
        "```bash",
        summary["command"],
        "```",
        "",
    ]
    lines += [f"Commit `{summary['commit']}`. Final checkpoints ({experiment.max_steps} steps) of every variant; "
              f"intervals at {pct}: Wilson for the pooled rates, bootstrap over seeds and rollouts for the "
              f"differences to `{reference}`. Each variant's learning curve is in its own folder.", ""]  # fmt: skip
    header = ["split", "policy", "seeds", "rollouts", "success", "score", f"success - {reference}",
              f"score - {reference}", "train min"]  # fmt: skip
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]

    def diff(row: dict[str, Any], metric: str) -> str:
        value = row.get(f"{metric}_minus_{reference}")
        return "" if value is None else f"{value[0]:+.2f} [{value[1]:+.2f}, {value[2]:+.2f}]"

    for row in rows:
        folder = groups[row["group"]][0].name
        cells = [
            row["split"],
            f"[{row['group']}]({folder}/)",
            str(row["seeds"]),
            str(row["n_rollouts"]),
            f"{row['success_rate']:.2f} [{row['success_ci'][0]:.2f}, {row['success_ci'][1]:.2f}]",
            f"{row['score']:.3f} [{row['score_ci'][0]:.3f}, {row['score_ci'][1]:.3f}]",
            diff(row, "success"),
            diff(row, "score"),
            f"{row['train_minutes']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    write_keeping_hand_written(out / "README.md", lines)
    print(f"wrote {out}/summary.json, README.md (comparison of {len(experiment.variants)} variants)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", help="experiment YAML (configs/experiments/)")
    parser.add_argument("--out", default=None, help="record folder (default docs/results/<name>)")
    parser.add_argument(
        "--run-dir", default=None, help="checkpoints and logs (default runs/experiments/<name>)"
    )
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run")
    parser.add_argument("--eval-batch", type=int, default=50, help="environments stepped in lockstep")
    parser.add_argument(
        "--variant", default=None, help="run only this variant (others can run beside it in another process)"
    )
    parser.add_argument(
        "--compare-only", action="store_true", help="only write the comparison of variants already run"
    )
    args = parser.parse_args(argv)

    experiment = load_experiment(Path(args.experiment))
    out = Path(args.out) if args.out else ROOT / "docs" / "results" / experiment.name
    run_dir = Path(args.run_dir) if args.run_dir else ROOT / "runs" / "experiments" / experiment.name
    if not experiment.variants:
        return run_one(experiment, out, run_dir, args)
    names = [v.name for v in experiment.variants]
    if args.variant is not None and args.variant not in names:
        raise SystemExit(f"{args.experiment}: no variant {args.variant!r}; variants: {', '.join(names)}")
    if not args.compare_only:
        prepare_store(experiment)  # once, before variants run side by side
        for arm in experiment.variants:
            if args.variant in (None, arm.name):
                run_one(experiment.variant(arm), out / arm.name, run_dir / arm.name, args)
    if all((out / v.name / "summary.json").exists() for v in experiment.variants):
        compare_variants(experiment, out, args)
    else:
        missing = [v.name for v in experiment.variants if not (out / v.name / "summary.json").exists()]
        print(f"comparison waits for the variants {', '.join(missing)}")
    return 0


def run_one(experiment: Experiment, out: Path, run_dir: Path, args: argparse.Namespace) -> int:
    """Train one experiment (or variant), evaluate its checkpoints and write its record."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    # Before evaluation, which runs its rollouts on one thread: the threads training had.
    machine_at_start = machine()
    store = prepare_store(experiment)
    minutes = train(experiment, store, run_dir, args.resume)
    rows = evaluate_checkpoints(experiment, run_dir, out, minutes, args.eval_batch)

    with open(out / "curve.csv", "w") as handle:
        columns = list(dict.fromkeys(k for row in rows for k in row))
        handle.write(",".join(columns) + "\n")
        for row in rows:
            handle.write(",".join(str(row.get(c, "")) for c in columns) + "\n")
    eval_minutes = sum(
        json.loads(p.read_text()).get("eval_minutes", 0.0) for p in (out / "rollouts").glob("*.json")
    )
    summary = {
        "name": experiment.name,
        "task": experiment.task,
        "policy": experiment.policy,
        "command": " ".join(
            ["python", "benchmarks/learning_curve.py", os.path.relpath(args.experiment, ROOT)]
            + (["--variant", experiment.name.split("/", 1)[1]] if "/" in experiment.name else [])
        ),
        "commit": _git_commit(),
        "machine": machine_at_start,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "train_minutes": max(minutes.values()),
        "eval_minutes": eval_minutes,
        "train_config": experiment.train_config,
        "overrides": experiment.overrides,
        "anchors": anchors_reached(experiment, rows),
        "headline": headline(experiment, rows),
        "over_checkpoints": over_checkpoints(rows),
        "curve": rows,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    plot_curve(experiment, rows, out / "curve.png")
    write_readme(experiment, summary, rows, out)
    print(f"wrote {out}/summary.json, curve.csv, curve.png, README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
