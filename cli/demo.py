"""``demoscale demo``: the whole loop in simulation, on embedded defaults.

collect (scripted experts write UMI zips) -> ingest (episode store) -> Ray sweep over the number of
training environments (train + evaluate on unseen environments and objects) -> scaling-law fits ->
plots -> a data-collection budget. Each stage is one call into the package that owns it; this
module only sequences them, times them and writes the report.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from demoscale import DEFAULT_CONFIDENCE


def configs_dir() -> Path:
    """The default configs: the installed package's ``demoscale.configs`` (package data, so any
    install finds them from any directory), else ``configs/`` of the source tree this module is
    run from without installing (a checkout on PYTHONPATH)."""
    try:
        return Path(str(importlib.resources.files("demoscale.configs")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[1] / "configs"


CONFIGS_DIR = configs_dir()
DEMO_CONFIG = CONFIGS_DIR / "demo.yaml"


@dataclass
class DemoConfig:
    """What the demo runs; the defaults users run are in ``configs/demo.yaml``."""

    task: str = "reach"
    image_size: int = 64
    cameras: list[str] = field(default_factory=lambda: ["scene"])
    max_envs: int = 32
    demos_per_pair: int = 6
    env_counts: list[int] = field(default_factory=lambda: [1, 4, 16, 32])
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    collect_workers: int = 2
    policy_config: str = "tabletop_tiny.yaml"
    train_overrides: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(
        default_factory=lambda: {"rule": "fixed", "steps": 1000, "checkpoint_every_steps": 500}
    )
    eval_envs: int = 10
    eval_objects: int = 2
    eval_episodes_per_pair: int = 3
    trial_cpus: float = 1.0
    target: float = 0.9
    # The one level of the run: rollout intervals, law intervals, plot bands and the decision rule.
    confidence: float = DEFAULT_CONFIDENCE
    cost_env: float = 25.0
    cost_object: float = 10.0
    cost_demo: float = 1.0
    cost_unit: str = "$"

    def __post_init__(self) -> None:
        if max(self.env_counts) > self.max_envs:
            raise ValueError(f"env_counts {self.env_counts} exceed max_envs {self.max_envs}")
        if len(set(self.env_counts)) < 3:
            raise ValueError(
                f"a scaling-law fit needs at least three environment counts, got {self.env_counts}"
            )


def load_demo_config(
    quick: bool = False, path: str | os.PathLike = DEMO_CONFIG, overrides: dict[str, Any] | None = None
) -> DemoConfig:
    """The ``default`` section of the demo YAML, with the ``quick`` section on top when asked and the
    dotted ``overrides`` (``{"budget.steps": 200}``) last. Raises ``ConfigError`` naming file and key."""
    from demoscale.conventions import ConfigError, apply_overrides, dataclass_from_dict, read_yaml

    sections = read_yaml(path, "demo config")
    if not isinstance(sections.get("default"), dict):
        raise ConfigError(f"{path}: needs a 'default' section (and optionally 'quick')")
    values = dict(sections["default"])
    if quick:
        values.update(sections.get("quick") or {})
    values = apply_overrides(values, overrides or {}, str(path))
    return dataclass_from_dict(DemoConfig, values, str(path))


@dataclass
class DemoReport:
    """Where the report went and the headline numbers."""

    out_dir: Path
    stage_seconds: dict[str, float]
    fit: dict[str, Any]
    recommendation: dict[str, Any]
    n_trials: int


class _Stages:
    """Prints ``[k/n] stage ...`` lines and records how long each stage took."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.seconds: dict[str, float] = {}

    @contextmanager
    def run(self, name: str, what: str) -> Iterator[None]:
        index = self.names.index(name) + 1
        print(f"\n[{index}/{len(self.names)}] {name}: {what}", flush=True)
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start
        print(f"[{index}/{len(self.names)}] {name} done in {self.seconds[name]:.0f} s", flush=True)


def sweep_config(config: DemoConfig, store: Path, output: Path) -> dict[str, Any]:
    """The Ray sweep the demo runs, as a sweep-config dict (see ``configs/sweeps/``)."""
    return {
        "name": "demo",
        "store": str(store),
        "output": str(output),
        "policies": {
            "diffusion": {
                "config": str(CONFIGS_DIR / config.policy_config),
                "overrides": dict(config.train_overrides),
            }
        },
        "grid": {
            "policy": ["diffusion"],
            "n_envs": list(config.env_counts),
            "n_objects": [1],
            "demos_per_pair": [config.demos_per_pair],
            "seed": list(config.seeds),
        },
        "eval": {
            "mode": "rollouts",
            "task": config.task,
            "split": "unseen",
            "n_envs": config.eval_envs,
            "n_objects": config.eval_objects,
            "episodes": config.eval_envs * config.eval_objects * config.eval_episodes_per_pair,
            "seed": 0,
            # The cameras the demonstrations were recorded with: the tabletop default is the wrist.
            "options": {"env_options": {"cameras": list(config.cameras)}, "confidence": config.confidence},
        },
        "budget": dict(config.budget),
        "resources": {"cpu": config.trial_cpus},
        "retries": 1,
    }


def _collect_and_ingest(config: DemoConfig, raw_dir: Path, store: Path, stages: _Stages) -> None:
    from demoscale.collect.umi import ingest_umi
    from demoscale.eval.collect_sim import collect_sim

    with stages.run("collect", f"{config.max_envs} environments x 1 object x {config.demos_per_pair} demos"):
        # Pair i is (train environment i, train object i): one unique object per environment.
        collect_sim(
            config.task,
            n_envs=config.max_envs,
            n_objects=config.max_envs,
            demos_per_pair=config.demos_per_pair,
            out_dir=raw_dir,
            workers=config.collect_workers,
            image_size=config.image_size,
            env_options={"cameras": list(config.cameras)},
            pairing="unique",
        )
    with stages.run("ingest", f"UMI zips under {raw_dir} -> {store}"):
        ingest_umi(raw_dir, store, progress=False)


def _fit_and_recommend(config: DemoConfig, sweep_dir: Path, report_dir: Path, stages: _Stages) -> tuple:
    from demoscale.scaling import fit_law, plot_laws, recommend_budget

    results = sweep_dir / "results.csv"
    rollouts = sweep_dir / "rollouts.csv"
    level = config.confidence
    with stages.run("fit", "log-log and saturating laws of the gap 1 - score over n_envs"):
        loglog = fit_law(results, axis="n_envs", method="loglog", rollouts=rollouts, confidence=level)
        print(loglog.summary())
    with stages.run("plot", "scaling-law figure"):
        plots = plot_laws(
            results,
            report_dir / "plots",
            axes=["n_envs"],
            rollouts=rollouts,
            confidence=level,
            target=config.target,
        )
    with stages.run("recommend", f"what to add to reach {config.target:.0%} on unseen environments"):
        # The same decision summary as `demoscale laws recommend` (the law chosen by comparison).
        recommendation = recommend_budget(
            results,
            target=config.target,
            cost_env=config.cost_env,
            cost_object=config.cost_object,
            cost_demo=config.cost_demo,
            cost_unit=config.cost_unit,
            confidence=level,
            axis="n_envs",
            rollouts=rollouts,
        )
        print(recommendation.summary())
    return loglog, plots, recommendation


# Written into every report folder the demo makes: a later run may clear only folders that hold it.
MARKER = ".demoscale-demo"


class OutputFolderError(ValueError):
    """``--out`` names a folder the demo did not make (and ``--overwrite`` was not given)."""


def prepare_out_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """The report folder, made ready: created if absent; a folder an earlier demo made (it holds
    :data:`MARKER`) is reused; any other non-empty folder is refused unless ``overwrite``. Then the
    previous run's raw data, store and sweep are removed: a demo run starts from nothing."""
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists() and not overwrite:
        raise OutputFolderError(
            f"--out {out} already holds files that an earlier demo did not write; choose another folder "
            "or pass --overwrite to clear its raw/, store.zarr and sweep/ and write the report there"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(
        "This folder is a demoscale demo report; `demoscale demo --out` may clear it.\n"
    )
    for stale in (out / "raw", out / "store.zarr", out / "sweep"):
        if stale.exists():
            shutil.rmtree(stale)
    return out


def run_demo(
    out_dir: str | os.PathLike = "demo_out",
    quick: bool = False,
    config: DemoConfig | None = None,
    overwrite: bool = False,
) -> DemoReport:
    """Run the whole loop and write the report folder; returns the headline numbers.

    ``out_dir`` must be new, empty or an earlier demo's report folder unless ``overwrite``
    (:func:`prepare_out_dir`)."""
    from demoscale.ray_jobs import run_sweep

    config = config or load_demo_config(quick=quick)
    out = prepare_out_dir(out_dir, overwrite)
    raw_dir, store, sweep_dir = out / "raw", out / "store.zarr", out / "sweep"
    stages = _Stages(["collect", "ingest", "sweep", "fit", "plot", "recommend"])
    started = time.perf_counter()

    _collect_and_ingest(config, raw_dir, store, stages)
    n_trials = len(config.env_counts) * len(config.seeds)
    with stages.run(
        "sweep", f"{n_trials} trials on a local Ray: n_envs {config.env_counts} x seeds {config.seeds}"
    ):
        sweep = run_sweep(sweep_config(config, store, sweep_dir))
    for name in ("results.csv", "results.parquet", "rollouts.csv", "rollouts.parquet"):
        if (sweep_dir / name).exists():
            shutil.copy2(sweep_dir / name, out / name)
    loglog, plots, recommendation = _fit_and_recommend(config, sweep_dir, out, stages)
    total = time.perf_counter() - started

    fit = loglog.to_dict()
    (out / "fit.json").write_text(json.dumps(fit, indent=2, default=float))
    (out / "recommendation.json").write_text(json.dumps(recommendation.to_dict(), indent=2, default=float))
    videos = trial_videos(sweep_dir, out)
    (out / "report.md").write_text(
        _report_markdown(
            config, quick, sweep.results, loglog, recommendation, plots, stages.seconds, total, out, videos
        )
    )
    (out / "report.html").write_text(
        _report_html(
            config, quick, sweep.results, loglog, recommendation, plots, stages.seconds, total, out, videos
        )
    )
    print(_summary(loglog, recommendation, total, out), flush=True)
    return DemoReport(out, dict(stages.seconds), fit, recommendation.to_dict(), len(sweep.results))


def _law_line(fit: Any) -> str:
    alpha, beta = fit.params["alpha"], fit.params["beta"]
    low, high = fit.conf_int["alpha"]
    level = round(100 * fit.confidence)
    return (
        f"1 - score = {beta:.3g} * n_envs^{alpha:.3f}  (alpha {level}% CI [{low:.3f}, {high:.3f}], "
        f"r = {fit.r:.2f}, {fit.n_points} trials)"
    )


def _summary(fit: Any, recommendation: Any, total: float, out: Path) -> str:
    return "\n".join(
        [
            "",
            "=" * 72,
            f"demoscale demo finished in {total / 60:.1f} min. Report: {out / 'report.html'} "
            f"(also {out / 'report.md'})",
            f"  law:    {_law_line(fit)}",
            f"  decision ({recommendation.status}): {recommendation.message}",
            "=" * 72,
        ]
    )


def trial_videos(sweep_dir: Path, out: Path) -> dict[str, list[str]]:
    """Trial id -> its rollout videos, as paths relative to the report folder ``out``."""
    videos: dict[str, list[str]] = {}
    for trial in sorted((sweep_dir / "trials").glob("*")) if (sweep_dir / "trials").is_dir() else []:
        found = sorted((trial / "eval" / "videos").glob("rollout_*.*"), key=lambda p: (len(p.stem), p.stem))
        if found:
            videos[trial.name] = [os.path.relpath(p, out) for p in found]
    return videos


def _report_markdown(
    config: DemoConfig,
    quick: bool,
    results: Any,
    fit: Any,
    recommendation: Any,
    plots: list[Path],
    seconds: dict[str, float],
    total: float,
    out: Path,
    videos: dict[str, list[str]] | None = None,
) -> str:
    pct = f"{config.confidence:.0%}"
    rows = [
        f"| n_envs | seed | score ({pct} interval) | success rate ({pct} interval) | rollouts | videos |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    videos = videos or {}
    for _, row in results.sort_values(["n_envs", "seed"]).iterrows():
        links = " ".join(f"[{k + 1}]({path})" for k, path in enumerate(videos.get(str(row["trial_id"]), [])))
        rows.append(
            f"| {int(row['n_envs'])} | {int(row['seed'])} | {row['score']:.3f} "
            f"[{row.get('score_ci_low', float('nan')):.2f}, {row.get('score_ci_high', float('nan')):.2f}] | "
            f"{row['success_rate']:.2f} [{row['success_ci_low']:.2f}, {row['success_ci_high']:.2f}] | "
            f"{int(row['n_rollouts'])} | {links or '-'} |"
        )
    timing = "\n".join(f"| {name} | {secs:.0f} s |" for name, secs in seconds.items())
    # plot_laws writes the combined figure first, then one file per panel.
    pngs = [p for p in plots if str(p).endswith(".png")]
    figure = f"![scaling law]({pngs[0].relative_to(out)})" if pngs else ""
    return f"""# demoscale demo report{" (quick)" if quick else ""}

## What ran
- Task `{config.task}` (simulated tabletop, {config.image_size}px {", ".join(config.cameras)} camera), scripted
  expert demonstrations: {config.max_envs} training environments, one unique object each,
  {config.demos_per_pair} demos per pair, written as UMI `dataset.zarr.zip` and ingested into `store.zarr`.
- A Ray sweep: diffusion policy (`configs/{config.policy_config}`) trained on nested subsets of
  {config.env_counts} environments x seeds {config.seeds}; training budget {config.budget}.
- Each checkpoint rolled out on {config.eval_envs} unseen environments x {config.eval_objects} unseen object(s) x
  {config.eval_episodes_per_pair} episodes.

## Results (one row per trial; all rows in `results.csv`, rollouts in `rollouts.csv`)
The same report with the figure and the rollout videos playing in place: `report.html`. Videos are
H.264 mp4 with the step, the stages reached and success drawn on.
Every interval in this report is at {pct} (the demo's `confidence`): Wilson intervals for the rollouts,
bootstrap or OLS intervals for the laws, and the probability the decision asks of a plan.

{chr(10).join(rows)}

## Fitted law (the scaling-laws study's log-log fit)
{_law_line(fit)}

```
{fit.summary()}
```

{figure}

## Decision (target {config.target:.0%} on unseen environments, at {pct} confidence)
The summary `demoscale laws recommend results.csv --target {config.target:g} --cost-env {config.cost_env:g}
--cost-object {config.cost_object:g} --cost-demo {config.cost_demo:g} --cost-unit '{config.cost_unit}' --confidence {config.confidence:g}`
prints: the law chosen by model comparison, the plans as increments over the {max(config.env_counts)} environments
trained, each with its probability of reaching the target, its extrapolation factor and its cost.

```
{recommendation.summary()}
```

## Time per stage
| stage | time |
| --- | --- |
{timing}
| total | {total:.0f} s |
"""


_HTML_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; } th, td { border: 1px solid #ccc; padding: 4px 8px; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.85em; }
.videos { display: flex; flex-wrap: wrap; gap: 1em; } figure { margin: 0; }
figcaption { font-size: 0.85em; color: #555; } img.figure { max-width: 100%; }
"""


def _report_html(
    config: DemoConfig,
    quick: bool,
    results: Any,
    fit: Any,
    recommendation: Any,
    plots: list[Path],
    seconds: dict[str, float],
    total: float,
    out: Path,
    videos: dict[str, list[str]] | None = None,
) -> str:
    """The report as one HTML page (figure, tables, decision, the rollout videos playing in place);
    every file it shows is linked relative to ``out``, so the folder can be moved or served."""
    from html import escape

    pct = f"{config.confidence:.0%}"
    videos = videos or {}
    ordered = results.sort_values(["n_envs", "seed"])
    rows = []
    for _, row in ordered.iterrows():
        trial = str(row["trial_id"])
        links = " ".join(
            f'<a href="{escape(path)}">{k + 1}</a>' for k, path in enumerate(videos.get(trial, []))
        )
        cells = [
            str(int(row["n_envs"])),
            str(int(row["seed"])),
            f"{row['score']:.3f} [{row.get('score_ci_low', float('nan')):.2f}, "
            f"{row.get('score_ci_high', float('nan')):.2f}]",
            f"{row['success_rate']:.2f} [{row['success_ci_low']:.2f}, {row['success_ci_high']:.2f}]",
            str(int(row["n_rollouts"])),
        ]
        rows.append(
            "<tr>"
            + "".join(f'<td class="num">{escape(c)}</td>' for c in cells)
            + f"<td>{links or '-'}</td></tr>"
        )
    pngs = [p for p in plots if str(p).endswith(".png")]
    figure = (
        f'<img class="figure" src="{escape(os.path.relpath(pngs[0], out))}" alt="scaling-law figure">'
        if pngs
        else ""
    )
    players = []
    for _, row in ordered.iterrows():
        trial = str(row["trial_id"])
        for path in videos.get(trial, [])[:1]:  # one per trial on the page; the table links them all
            players.append(
                f'<figure><video controls muted preload="metadata" width="320" src="{escape(path)}"></video>'
                f"<figcaption>{int(row['n_envs'])} training environment(s), seed {int(row['seed'])}: "
                f"score {row['score']:.2f}</figcaption></figure>"
            )
    timing = "".join(
        f'<tr><td>{escape(name)}</td><td class="num">{secs:.0f} s</td></tr>' for name, secs in seconds.items()
    )
    title = "demoscale demo report" + (" (quick)" if quick else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>{_HTML_STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p>Task <code>{escape(config.task)}</code>, {config.image_size}px {escape(", ".join(config.cameras))} camera;
{config.max_envs} training environments with one unique object each, {config.demos_per_pair} demos per pair;
a diffusion policy (<code>configs/{escape(config.policy_config)}</code>) trained on nested subsets of
{escape(str(config.env_counts))} environments x seeds {escape(str(config.seeds))}, each checkpoint rolled out on
{config.eval_envs} unseen environments x {config.eval_objects} unseen object(s) x {config.eval_episodes_per_pair}
episodes. Every interval here is at {pct}. The same report as text: <a href="report.md">report.md</a>;
data: <a href="results.csv">results.csv</a>, <a href="rollouts.csv">rollouts.csv</a>,
<a href="fit.json">fit.json</a>, <a href="recommendation.json">recommendation.json</a>.</p>
<h2>Scaling law</h2>
{figure}
<p>{escape(_law_line(fit))}</p>
<h2>Decision (target {config.target:.0%} on unseen environments)</h2>
<pre>{escape(recommendation.summary())}</pre>
<h2>Results, one row per trial</h2>
<table><tr><th>n_envs</th><th>seed</th><th>score ({pct} interval)</th><th>success rate ({pct} interval)</th>
<th>rollouts</th><th>videos</th></tr>
{"".join(rows)}
</table>
<h2>Rollouts on unseen environments</h2>
<p>H.264 videos; the band on top shows the step, the stages reached and SUCCESS (green) once the task succeeds.</p>
<div class="videos">{"".join(players) or "<p>no videos were recorded</p>"}</div>
<h2>Fit</h2>
<pre>{escape(fit.summary())}</pre>
<h2>Time per stage</h2>
<table>{timing}<tr><td>total</td><td class="num">{total:.0f} s</td></tr></table>
</body></html>
"""


def build_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import add_config_arguments, make_parser

    parser = make_parser(
        "demoscale demo",
        "Run the whole loop in simulation: collect, ingest, Ray sweep, evaluate, fit, recommend.\n\n"
        "Any setting of the demo YAML can be overridden: --set target=0.8 --set 'env_counts=[1, 2, 4]'\n"
        "--budget.steps 500 (dotted keys also as flags); --print-config shows the result without running it.",
    )
    parser.add_argument("--out", default="demo_out", help="report folder")
    parser.add_argument("--quick", action="store_true", help="a reduced loop for CI (a few minutes)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out folder that an earlier demo did not make (its raw/, store.zarr and "
        "sweep/ are removed)",
    )
    add_config_arguments(
        parser, "demo YAML; --quick puts its 'quick' section on top", default=str(DEMO_CONFIG)
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from demoscale.conventions import EXIT_OK, ConfigError, config_yaml, error, parse_with_overrides

    parser = build_parser()
    args, overrides = parse_with_overrides(parser, argv)
    try:
        config = load_demo_config(quick=args.quick, path=args.config, overrides=overrides)
    except ConfigError as err:
        return error("demo", err)
    if args.print_config:
        print(config_yaml(config), end="")
        return EXIT_OK
    try:
        prepare_out_dir(args.out, args.overwrite)
    except OutputFolderError as err:
        return error("demo", err)
    print("demoscale demo:", json.dumps(asdict(config)), flush=True)
    run_demo(args.out, quick=args.quick, config=config, overwrite=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
