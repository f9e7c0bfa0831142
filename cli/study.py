"""``demoscale study``: the Data Scaling Laws study in simulation, end to end, and its advice carried out.

Four sub-studies, each a Ray sweep over nested subsets of its own store of scripted demonstrations:

- **objects**: one training environment, 1..N objects; evaluated on unseen objects in that environment;
- **environments**: one object, 1..N environments; evaluated on unseen environments with that object;
- **pairs**: environment k with object k, 1..N pairs; evaluated on unseen environments with unseen objects;
- **demonstrations**: a fixed number of pairs, a growing number of demos per pair (same evaluation).

Then, per axis, the study's log-log fit of the gap (with r and intervals), the saturating fit and
their comparison; a joint law over pairs and demos per pair; the demonstrations axis tested for
saturation; the pairs axis repeated at a multiple of the training steps (compute is not a hidden
variable); a sequential rollout allocation replayed on the fixed one (how many rollouts it saves, and
what that does to the exponents and the recommendation); and finally the recommended plan for the
target (from the pairs law and the cost model) and an alternative of equal cost, each collected on
fresh training ids, trained with the same recipe and evaluated on unseen pairs, against the predicted
interval. Each stage is one call into the package that owns it; this module sequences them, makes
every stage resumable (``--resume``) and writes the report.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from demoscale import DEFAULT_CONFIDENCE
from demoscale.demo import CONFIGS_DIR, _Stages

STUDY_CONFIG = CONFIGS_DIR / "study.yaml"
AXES = ("n_objects", "n_envs", "n_pairs", "demos_per_pair")
AXIS_WORDS = {
    "n_objects": "objects (one environment)",
    "n_envs": "environments (one object)",
    "n_pairs": "environment-object pairs",
    "demos_per_pair": "demonstrations per pair",
}
# What each sub-study evaluates on: (environment split, object split, pairing).
EVAL_SPLITS = {
    "n_objects": ("train", "unseen", "grid"),
    "n_envs": ("unseen", "train", "grid"),
    "n_pairs": ("unseen", "unseen", "unique"),
    "demos_per_pair": ("unseen", "unseen", "unique"),
}
# Fresh training ids for the executed plans: beyond every id a sub-study collected.
VALIDATION_ID_OFFSET = 1000


@dataclass
class SequentialRule:
    """The sequential rollout allocation measured against the fixed one (see ``eval.sequential_stop``)."""

    halfwidth: float = 0.07
    min_episodes: int = 20
    round_size: int = 8
    scale: str = "score"  # or "log-gap", where the laws are fitted (eval.interval_width)
    # Rollouts added after the stopping rule, a round at a time, to the pairs trials whose noise most
    # blurs the recommendation (scaling.next_round at the recommended plan's count).
    extra_rollouts: int = 0
    extra_to: str = "targeted"  # or "uniform": to the trial with the fewest rollouts (the control arm)


EXTRA_POLICIES = ("targeted", "uniform")
_SCALE_WORDS = {"score": "its score", "log-gap": "its log gap log(1 - score)"}


@dataclass
class StudyConfig:
    """What the study runs; the defaults users run are in ``configs/study.yaml``."""

    task: str = "reach"
    image_size: int = 64
    cameras: list[str] = field(default_factory=lambda: ["scene"])
    policy_config: str = "tabletop_tiny.yaml"
    train_overrides: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(
        default_factory=lambda: {"rule": "fixed", "steps": 1000, "checkpoint_every_steps": 500}
    )
    seeds: list[int] = field(default_factory=lambda: [0])
    counts: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    demos_per_pair: int = 6
    demo_counts: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    demo_axis_pairs: int = 8
    eval_settings: int = 20
    eval_episodes: int = 60
    sequential: SequentialRule = field(default_factory=SequentialRule)
    compute_axis: str = "n_pairs"
    compute_factor: float = 2.0
    target: float = 0.8
    validation_seeds: list[int] = field(default_factory=lambda: [0, 1])
    validation_confidence: float = 0.8
    confidence: float = DEFAULT_CONFIDENCE
    cost_env: float = 25.0
    cost_object: float = 10.0
    cost_demo: float = 1.0
    cost_unit: str = "$"
    trial_cpus: float = 1.0
    collect_workers: int = 2

    def __post_init__(self) -> None:
        for name in ("counts", "demo_counts"):
            if len(set(getattr(self, name))) < 3:
                raise ValueError(f"{name} needs at least three values for a fit, got {getattr(self, name)}")
        if self.compute_axis not in AXES:
            raise ValueError(f"compute_axis must be one of {AXES}, got {self.compute_axis!r}")
        if self.demo_axis_pairs > max(self.counts):
            raise ValueError(
                f"demo_axis_pairs {self.demo_axis_pairs} exceeds the largest count {max(self.counts)}"
            )


def load_study_config(
    quick: bool = False, path: str | Path = STUDY_CONFIG, overrides: dict[str, Any] | None = None
) -> StudyConfig:
    """The ``default`` section of the study YAML, the ``quick`` section on top when asked, the dotted
    ``overrides`` last. Raises ``ConfigError`` naming file and key."""
    from demoscale.conventions import ConfigError, apply_overrides, dataclass_from_dict, read_yaml

    sections = read_yaml(path, "study config")
    if not isinstance(sections.get("default"), dict):
        raise ConfigError(f"{path}: needs a 'default' section (and optionally 'quick')")
    values = dict(sections["default"])
    if quick:
        for key, value in (sections.get("quick") or {}).items():
            values[key] = {**values[key], **value} if isinstance(value, dict) and key in values else value
    values = apply_overrides(values, overrides or {}, str(path))
    return dataclass_from_dict(StudyConfig, values, str(path))


# --- data -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreSpec:
    """One store the study collects: ``n_envs`` x ``n_objects`` (grid or unique pairs) of demos."""

    name: str
    n_envs: int
    n_objects: int
    pairing: str
    demos_per_pair: int
    offset: int = 0

    @property
    def n_episodes(self) -> int:
        pairs = self.n_envs if self.pairing == "unique" else self.n_envs * self.n_objects
        return pairs * self.demos_per_pair


def study_stores(config: StudyConfig) -> dict[str, StoreSpec]:
    """The three stores of the sub-studies (the pairs store also serves the demonstrations axis)."""
    n = max(config.counts)
    return {
        "objects": StoreSpec("objects", 1, n, "grid", config.demos_per_pair),
        "envs": StoreSpec("envs", n, 1, "grid", config.demos_per_pair),
        "pairs": StoreSpec("pairs", n, n, "unique", max(config.demos_per_pair, max(config.demo_counts))),
    }


def build_store(config: StudyConfig, spec: StoreSpec, out: Path) -> Path:
    """Collect and ingest one store (skipped when it is already whole: a resumed study keeps it)."""
    from demoscale.collect.umi import ingest_umi
    from demoscale.datasets import EpisodeStore, StoreError
    from demoscale.eval.collect_sim import collect_sim

    store = out / "stores" / f"{spec.name}.zarr"
    try:
        if EpisodeStore.open(store).n_episodes == spec.n_episodes:
            print(f"  store {spec.name}: {spec.n_episodes} episodes already collected", flush=True)
            return store
    except StoreError:
        pass
    raw = out / "raw" / spec.name
    for stale in (raw, store):
        if stale.exists():
            shutil.rmtree(stale)
    collect_sim(
        config.task,
        n_envs=spec.n_envs,
        n_objects=spec.n_objects,
        demos_per_pair=spec.demos_per_pair,
        out_dir=raw,
        workers=config.collect_workers,
        image_size=config.image_size,
        env_offset=spec.offset,
        object_offset=spec.offset,
        env_options={"cameras": list(config.cameras)},
        pairing=spec.pairing,
        progress=False,
    )
    ingest_umi(raw, store, progress=False)
    print(f"  store {spec.name}: {spec.n_episodes} episodes -> {store}", flush=True)
    return store


# --- sweeps ---------------------------------------------------------------------------------------
def eval_spec(config: StudyConfig, axis: str) -> dict[str, Any]:
    """The evaluation of one sub-study's trials: the same unseen settings for all of its trials."""
    env_split, object_split, pairing = EVAL_SPLITS[axis]
    n = config.eval_settings
    n_envs, n_objects = (1, n) if axis == "n_objects" else (n, 1) if axis == "n_envs" else (n, n)
    return {
        "mode": "rollouts",
        "task": config.task,
        "split": "unseen",
        "n_envs": n_envs,
        "n_objects": n_objects,
        "episodes": config.eval_episodes,
        "seed": 0,
        "options": {
            "env_split": env_split,
            "object_split": object_split,
            "pairing": pairing,
            "env_options": {"cameras": list(config.cameras)},
            "confidence": config.confidence,
            "video_episodes": 0,
            "progress": False,
        },
    }


def sweep_config(
    config: StudyConfig,
    name: str,
    store: Path,
    output: Path,
    grid: dict[str, Any],
    eval_axis: str,
    seeds: list[int] | None = None,
    steps_factor: float = 1.0,
) -> dict[str, Any]:
    """One sub-study's sweep as a sweep-config dict (see ``configs/sweeps/``)."""
    budget = dict(config.budget)
    if steps_factor != 1.0:
        budget = {
            **budget,
            **{k: int(math.ceil(budget[k] * steps_factor)) for k in ("steps", "max_steps") if budget.get(k)},
        }
    return {
        "name": f"study-{name}",
        "store": str(store),
        "output": str(output),
        "policies": {
            "diffusion": {
                "config": str(CONFIGS_DIR / config.policy_config),
                "overrides": dict(config.train_overrides),
            }
        },
        "grid": {"policy": ["diffusion"], **grid, "seed": list(seeds or config.seeds)},
        "eval": eval_spec(config, eval_axis),
        "budget": budget,
        "resources": {"cpu": config.trial_cpus},
        "retries": 1,
    }


def substudy_sweeps(config: StudyConfig, stores: dict[str, Path], out: Path) -> dict[str, dict[str, Any]]:
    """Sub-study name -> its sweep config: the four axes and the compute-sensitivity repeat."""
    d = config.demos_per_pair
    grids = {
        "n_objects": ("objects", {"n_envs": [1], "n_objects": list(config.counts), "demos_per_pair": [d]}),
        "n_envs": ("envs", {"n_envs": list(config.counts), "n_objects": [1], "demos_per_pair": [d]}),
        "n_pairs": ("pairs", {"n_pairs": list(config.counts), "demos_per_pair": [d]}),
        "demos_per_pair": (
            "pairs",
            {"n_pairs": [config.demo_axis_pairs], "demos_per_pair": list(config.demo_counts)},
        ),
    }
    sweeps = {
        axis: sweep_config(config, axis, stores[store], out / "sweeps" / axis, grid, axis)
        for axis, (store, grid) in grids.items()
    }
    store, grid = grids[config.compute_axis]
    name = f"{config.compute_axis}_x{config.compute_factor:g}_steps"
    sweeps[name] = sweep_config(
        config, name, stores[store], out / "sweeps" / name, grid, config.compute_axis,
        steps_factor=config.compute_factor,
    )  # fmt: skip
    return sweeps


def run_sweeps(sweeps: dict[str, dict[str, Any]], resume: bool, address: str | None) -> dict[str, Path]:
    """Run each sweep (only its unfinished trials when resuming); name -> its output folder."""
    from demoscale.ray_jobs import run_sweep

    done = {}
    for name, sweep in sweeps.items():
        output = Path(sweep["output"])
        finished = (output / "results.csv").exists()
        print(f"  sweep {name}: {'resuming' if finished else 'starting'} -> {output}", flush=True)
        run_sweep(sweep, address=address, resume=resume and finished)
        done[name] = output
    return done


# --- analysis -------------------------------------------------------------------------------------
def _tables(folder: Path) -> tuple[Any, Any]:
    import pandas as pd

    return pd.read_csv(folder / "results.csv"), pd.read_csv(folder / "rollouts.csv")


def axis_fits(results: Any, rollouts: Any, axis: str, confidence: float) -> dict[str, Any]:
    """The paper's log-log fit, the saturating fit and their comparison on one axis."""
    from demoscale.scaling import compare_laws, fit_law

    loglog = fit_law(results, axis=axis, method="loglog", rollouts=rollouts, confidence=confidence)
    fits = {"loglog": loglog}
    try:
        fits["saturating"] = fit_law(
            results, axis=axis, method="saturating", rollouts=rollouts, confidence=confidence
        )
    except (ValueError, RuntimeError) as error:  # too few points or no convergence: say so
        fits["saturating_error"] = str(error)
    comparison = compare_laws(results, axis=axis, methods=("loglog", "saturating"), rollouts=rollouts,
                              confidence=confidence)  # fmt: skip
    comparable = (
        comparison[comparison["same_data"].fillna(False).astype(bool)]
        if "same_data" in comparison
        else comparison
    )
    preferred, evidence = "loglog", "only the log-log law could be fitted"
    if "aicc" in comparable and comparable["aicc"].notna().sum() >= 2:
        # compare_laws indexes its rows by the law's name.
        best_law, other_law = comparable["aicc"].idxmin(), comparable["aicc"].idxmax()
        best, other = comparable.loc[best_law], comparable.loc[other_law]
        preferred = str(best_law)
        evidence = (
            f"AICc {best['aicc']:.1f} ({best_law}) against {other['aicc']:.1f} ({other_law}); "
            f"leave-one-out RMSE of the log gap {best['loo_rmse']:.3f} against {other['loo_rmse']:.3f}"
        )
    low, high = loglog.conf_int["alpha"]
    return {
        "fits": fits,
        "comparison": comparison,
        "summary": {
            "alpha": float(loglog.params["alpha"]),
            "alpha_ci": [float(low), float(high)],
            "beta": float(loglog.params["beta"]),
            "r": None if loglog.r is None else float(loglog.r),
            "n_trials": int(loglog.n_points),
            "preferred_law": preferred,
            "evidence": evidence,
        },
    }


def sequential_replay(
    tables: dict[str, tuple[Any, Any]], rule: SequentialRule, confidence: float
) -> tuple[dict[str, tuple[Any, Any]], dict[str, Any]]:
    """Each trial's rollouts cut where the sequential rule would have stopped, and what it saved."""
    from demoscale.eval import sequential_stop

    cut: dict[str, tuple[Any, Any]] = {}
    kept: dict[str, dict[str, int]] = {}
    used = total = 0
    for name, (results, rollouts) in tables.items():
        kept[name] = {}
        for trial_id in results["trial_id"]:
            scores = _trial_rollouts(rollouts, trial_id)["score"].tolist()
            n = sequential_stop(scores, rule.halfwidth, rule.min_episodes, rule.round_size, confidence,
                                rule.scale)  # fmt: skip
            kept[name][trial_id] = n
            used, total = used + n, total + len(scores)
        cut[name] = _cut_tables(results, rollouts, kept[name], confidence)
    return cut, {"rollouts_fixed": int(total), "rollouts_sequential": int(used),
                 "saved_fraction": 1.0 - used / total if total else 0.0, **asdict(rule),
                 "kept": kept}  # fmt: skip


def _trial_rollouts(rollouts: Any, trial_id: str) -> Any:
    return rollouts[rollouts["trial_id"] == trial_id].sort_values("rollout_index")


def _cut_tables(results: Any, rollouts: Any, kept: dict[str, int], confidence: float) -> tuple[Any, Any]:
    """The results and rollouts tables with each trial's first ``kept[trial]`` rollouts only."""
    import pandas as pd
    from demoscale.eval.rollout import mean_interval

    rows, prefixes = results.copy(), []
    for index, row in rows.iterrows():
        prefix = _trial_rollouts(rollouts, row["trial_id"]).iloc[: kept[row["trial_id"]]]
        prefixes.append(prefix)
        low, high = mean_interval(prefix["score"].to_numpy(), confidence)
        rows.loc[index, ["score", "score_ci_low", "score_ci_high", "n_rollouts"]] = (
            float(prefix["score"].mean()), low, high, len(prefix),
        )  # fmt: skip
        rows.loc[index, "success_rate"] = float(prefix["success"].mean())
    return rows, pd.concat(prefixes, ignore_index=True)


def targeted_replay(
    tables: dict[str, tuple[Any, Any]],
    cut: dict[str, tuple[Any, Any]],
    saving: dict[str, Any],
    config: StudyConfig,
) -> tuple[dict[str, tuple[Any, Any]], dict[str, Any]]:
    """After the stopping rule, ``config.sequential.extra_rollouts`` more rollouts (replayed from
    the recorded ones) to the pairs trials, a round at a time (:func:`extra_rollouts`), aimed at the
    recommended plan's count. Returns the new cut tables and the saving with the extras counted."""
    rule = config.sequential
    kept = {name: dict(counts) for name, counts in saving["kept"].items()}
    results, rollouts = tables["n_pairs"]
    at = choose_plans(config, cut["n_pairs"])[1].n_pairs
    kept["n_pairs"], given = extra_rollouts(
        results, rollouts, kept["n_pairs"], at, rule.extra_rollouts, rule.round_size, rule.extra_to
    )
    new_cut = dict(cut)
    new_cut["n_pairs"] = _cut_tables(results, rollouts, kept["n_pairs"], config.confidence)
    used = sum(sum(counts.values()) for counts in kept.values())
    total = saving["rollouts_fixed"]
    return new_cut, {**saving, "kept": kept, "extra_given": given, "extra_at_n_pairs": int(at),
                     "rollouts_sequential": int(used),
                     "rollouts_stopping_rule": saving["rollouts_sequential"],
                     "saved_fraction": 1.0 - used / total if total else 0.0}  # fmt: skip


def extra_rollouts(
    results: Any,
    rollouts: Any,
    kept: dict[str, int],
    at: float,
    extra: int,
    round_size: int,
    policy: str = "targeted",
) -> tuple[dict[str, int], dict[str, int]]:
    """``extra`` more of each trial's recorded rollouts beyond ``kept``, a round at a time: to the
    trial whose rollout noise most blurs the log-log law's prediction at count ``at``
    (``scaling.next_round``, recomputed after every round), or with ``policy="uniform"`` to the
    trial with the fewest so far (the control arm). Returns (new counts, rollouts given per trial)."""
    from demoscale.scaling import next_round

    if policy not in EXTRA_POLICIES:
        raise ValueError(f"extra rollouts policy {policy!r}: expected one of {', '.join(EXTRA_POLICIES)}")
    trials = list(results["trial_id"])
    recorded = {t: _trial_rollouts(rollouts, t)["score"].to_numpy() for t in trials}
    counts = [float(c) for c in results["n_pairs"]]
    kept, given, left = dict(kept), {}, int(extra)
    while left > 0:
        eligible = [kept[t] < len(recorded[t]) for t in trials]
        if not any(eligible):
            break
        if policy == "targeted":
            choice = next_round(counts, [recorded[t][: kept[t]] for t in trials], at, round_size, eligible)
        else:
            choice = min((i for i, ok in enumerate(eligible) if ok), key=lambda i: kept[trials[i]])
        trial = trials[choice]
        step = min(round_size, left, len(recorded[trial]) - kept[trial])
        kept[trial] += step
        given[trial] = given.get(trial, 0) + step
        left -= step
    return kept, given


def joint_fit(pairs: tuple[Any, Any], demos: tuple[Any, Any], confidence: float) -> Any:
    """The two-factor law over pairs and demos per pair, from both sub-studies on the pairs store."""
    import pandas as pd
    from demoscale.scaling import fit_law

    results = pd.concat(
        [pairs[0].assign(trial_id="pairs:" + pairs[0]["trial_id"]),
         demos[0].assign(trial_id="demos:" + demos[0]["trial_id"])], ignore_index=True,
    )  # fmt: skip
    rollouts = pd.concat(
        [pairs[1].assign(trial_id="pairs:" + pairs[1]["trial_id"]),
         demos[1].assign(trial_id="demos:" + demos[1]["trial_id"])], ignore_index=True,
    )  # fmt: skip
    results = results.drop_duplicates(subset=["n_pairs", "demos_per_pair", "seed"])
    rollouts = rollouts[rollouts["trial_id"].isin(results["trial_id"])]
    return fit_law(results, axis="n_pairs", method="joint", rollouts=rollouts, confidence=confidence)


# --- the recommendation, carried out ----------------------------------------------------------------
@dataclass
class PlanToRun:
    """A dataset to collect on fresh ids and train on: ``n_pairs`` unique pairs x ``demos_per_pair``."""

    label: str
    n_pairs: int
    demos_per_pair: int
    cost: float

    def describe(self, unit: str) -> str:
        return f"{self.n_pairs} pairs x {self.demos_per_pair} demos ({unit}{self.cost:,.0f})"


def plan_cost(config: StudyConfig, n_pairs: int, demos_per_pair: int) -> float:
    """The cost model: a new environment and a new object per pair, and every demonstration."""
    return n_pairs * (config.cost_env + config.cost_object) + n_pairs * demos_per_pair * config.cost_demo


def choose_plans(config: StudyConfig, pairs: tuple[Any, Any]) -> tuple[Any, PlanToRun, PlanToRun, str]:
    """(the recommendation, the recommended plan, the equal-cost alternative, what was asked).

    The recommendation comes from the pairs law and the cost model (``demoscale laws recommend``).
    When the target is not established within the trusted range, the plan is the one the decision
    calls the best in range (say so). The alternative spends the same on half the pairs with the
    demos per pair that cost allows (more demos instead of more diversity)."""
    from demoscale.scaling import recommend_budget

    recommendation = recommend_budget(
        pairs[0], target=config.target, cost_env=config.cost_env, cost_object=config.cost_object,
        cost_demo=config.cost_demo, cost_unit=config.cost_unit, confidence=config.confidence,
        axis="n_pairs", rollouts=pairs[1],
    )  # fmt: skip
    chosen = recommendation.plan or recommendation.best_in_range
    asked = (
        f"the cheapest plan reaching {config.target:g} at {config.confidence:.0%}"
        if recommendation.plan is not None
        else f"the best plan in the trusted range ({config.target:g} is {recommendation.status})"
    )
    n_pairs = int(chosen.n_pairs) if chosen is not None else max(config.counts)
    demos = (
        int(chosen.demos_per_pair or config.demos_per_pair) if chosen is not None else config.demos_per_pair
    )
    recommended = PlanToRun("recommended", n_pairs, demos, plan_cost(config, n_pairs, demos))
    alt_pairs = max(1, n_pairs // 2)
    budget_left = recommended.cost - alt_pairs * (config.cost_env + config.cost_object)
    alt_demos = (
        max(demos, int(round(budget_left / (alt_pairs * config.cost_demo)))) if config.cost_demo else demos
    )
    alternative = PlanToRun("alternative", alt_pairs, alt_demos, plan_cost(config, alt_pairs, alt_demos))
    return recommendation, recommended, alternative, asked


def predicted_interval(recommendation: Any, n_pairs: int, level: float) -> dict[str, float]:
    """The deciding law's predicted score at ``n_pairs`` with its ``level`` interval (for the log-log
    law the OLS prediction interval of a new trial, otherwise the bootstrap interval)."""
    fit = recommendation.fit
    kind = "prediction" if fit.method == "loglog" else "bootstrap"
    prediction = fit.predict([n_pairs], interval=kind, confidence=level)
    return {"predicted": float(prediction.score[0]), "predicted_low": float(prediction.low[0]),
            "predicted_high": float(prediction.high[0]), "interval": kind, "level": level}  # fmt: skip


def run_plan(config: StudyConfig, plan: PlanToRun, out: Path, resume: bool, address: str | None) -> Any:
    """Collect the plan's data on fresh training ids, train with the same recipe, evaluate on unseen
    pairs; the results table (one row per seed)."""
    from demoscale.ray_jobs import run_sweep

    spec = StoreSpec(f"plan_{plan.label}", plan.n_pairs, plan.n_pairs, "unique", plan.demos_per_pair,
                     offset=VALIDATION_ID_OFFSET + (0 if plan.label == "recommended" else 500))  # fmt: skip
    store = build_store(config, spec, out)
    output = out / "sweeps" / f"plan_{plan.label}"
    grid = {"n_pairs": [plan.n_pairs], "demos_per_pair": [plan.demos_per_pair]}
    sweep = sweep_config(
        config, f"plan-{plan.label}", store, output, grid, "n_pairs", seeds=config.validation_seeds
    )
    finished = (output / "results.csv").exists()
    return run_sweep(sweep, address=address, resume=resume and finished).results


def plan_difference(out: Path, confidence: float) -> tuple[float, float, float]:
    """The recommended plan's mean score minus the alternative's, with a bootstrap interval over
    seeds and rollouts (from the plans' recorded rollouts in ``out/sweeps/plan_*``)."""
    import pandas as pd
    from demoscale.scaling.bootstrap import mean_difference_interval

    def per_seed(label: str) -> list[Any]:
        rollouts = pd.read_csv(out / "sweeps" / f"plan_{label}" / "rollouts.csv")
        return [group["score"].to_numpy(float) for _, group in rollouts.groupby("trial_id", sort=True)]

    return mean_difference_interval(per_seed("recommended"), per_seed("alternative"), confidence)


# --- the whole study --------------------------------------------------------------------------------
@dataclass
class StudyReport:
    out_dir: Path
    summary: dict[str, Any]


def run_study(
    out_dir: str | Path = "study_out",
    quick: bool = False,
    config: StudyConfig | None = None,
    resume: bool = False,
    address: str | None = None,
) -> StudyReport:
    """Run the study and write its report folder; returns the summary (also ``summary.json``).

    ``resume`` keeps every store already collected and every trial already finished (a study killed
    at any point continues where it was); without it, an existing folder is started afresh."""
    config = config or load_study_config(quick=quick)
    out = Path(out_dir).resolve()
    if out.exists() and not resume:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    stages = _Stages(["collect", "sweeps", "fit", "sequential", "validate", "report"])
    started = time.perf_counter()

    specs = study_stores(config)
    with stages.run("collect", ", ".join(f"{s.name} {s.n_episodes} demos" for s in specs.values())):
        stores = {name: build_store(config, spec, out) for name, spec in specs.items()}
    sweeps = substudy_sweeps(config, stores, out)
    with stages.run("sweeps", f"{sum(_n_trials(s) for s in sweeps.values())} trials in {len(sweeps)} sweeps"):
        folders = run_sweeps(sweeps, resume, address)
    tables = {name: _tables(folder) for name, folder in folders.items()}

    with stages.run("fit", "log-log and saturating laws per axis, the joint law, the compute check"):
        analysis = {axis: axis_fits(*tables[axis], axis, config.confidence) for axis in AXES}
        compute_name = next(name for name in tables if name.endswith("_steps"))
        compute = axis_fits(*tables[compute_name], config.compute_axis, config.confidence)
        try:
            joint = joint_fit(tables["n_pairs"], tables["demos_per_pair"], config.confidence)
        except (ValueError, RuntimeError) as error:
            joint = str(error)
        plots = _plots(analysis, compute, config, out / "plots")
    with stages.run(
        "sequential",
        f"stop once the interval of {_SCALE_WORDS[config.sequential.scale]} is within "
        f"+-{config.sequential.halfwidth:g}",
    ):
        cut, saving = sequential_replay({a: tables[a] for a in AXES}, config.sequential, config.confidence)
        if config.sequential.extra_rollouts > 0:
            cut, saving = targeted_replay(tables, cut, saving, config)
        saving.pop("kept")
        sequential = {axis: axis_fits(*cut[axis], axis, config.confidence)["summary"] for axis in AXES}
        recommendation_full = choose_plans(config, tables["n_pairs"])
        recommendation_cut = choose_plans(config, cut["n_pairs"])
    with stages.run("validate", "the recommended plan and an equal-cost alternative, collected and trained"):
        recommendation, recommended, alternative, asked = recommendation_full
        prediction = predicted_interval(recommendation, recommended.n_pairs, config.validation_confidence)
        achieved = run_plan(config, recommended, out, resume, address)
        alternative_results = run_plan(config, alternative, out, resume, address)

    validation = {
        "asked": asked,
        "plan": asdict(recommended),
        **prediction,
        "achieved": float(achieved["score"].mean()),
        "achieved_per_seed": [float(v) for v in achieved["score"]],
        "inside_interval": bool(
            prediction["predicted_low"] <= achieved["score"].mean() <= prediction["predicted_high"]
        ),
        "alternative_plan": asdict(alternative),
        "alternative_achieved": float(alternative_results["score"].mean()),
        "alternative_per_seed": [float(v) for v in alternative_results["score"]],
    }
    validation["recommended_beats_alternative"] = validation["achieved"] > validation["alternative_achieved"]
    difference, low, high = plan_difference(out, config.confidence)
    validation.update(difference=difference, difference_ci=[low, high], difference_level=config.confidence)
    total = time.perf_counter() - started
    with stages.run("report", "summary.json, report.md, figures"):
        summary = _summary(config, analysis, compute, joint, saving, sequential, recommendation,
                           recommendation_cut[0], validation, tables, stages.seconds, total)  # fmt: skip
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
        (out / "recommendation.txt").write_text(recommendation.summary() + "\n")
        (out / "report.md").write_text(_report(config, summary, analysis, recommendation, plots, out))
    print(f"\ndemoscale study finished in {total / 60:.1f} min. Report: {out / 'report.md'}", flush=True)
    return StudyReport(out, summary)


def _n_trials(sweep: dict[str, Any]) -> int:
    grid = sweep["grid"]
    sizes = len(grid.get("n_pairs") or []) or len(grid["n_envs"]) * len(grid["n_objects"])
    return sizes * len(grid["demos_per_pair"]) * len(grid["seed"])


def _plots(
    analysis: dict[str, Any], compute: dict[str, Any], config: StudyConfig, folder: Path
) -> list[Path]:
    """One figure per axis (both laws), the overview of all four, and the compute check."""
    from demoscale.scaling import plot_fits

    def fits_of(entry: dict[str, Any]) -> list[Any]:
        return [f for k, f in entry["fits"].items() if not k.endswith("_error")]

    written = plot_fits([(axis, fits_of(analysis[axis])) for axis in AXES], folder, name="study_overview",
                        confidence=config.confidence, separate=True, target=config.target)  # fmt: skip
    written += plot_fits(
        [(config.compute_axis, [analysis[config.compute_axis]["fits"]["loglog"]]),
         (config.compute_axis, [compute["fits"]["loglog"]])],
        folder, name="compute_check", confidence=config.confidence, separate=False,
        titles=[f"{config.budget.get('steps')} steps", f"x{config.compute_factor:g} steps"],
    )  # fmt: skip
    return written


def _headline(config: StudyConfig, tables: dict[str, tuple[Any, Any]]) -> list[dict[str, Any]]:
    """Rows of the results-record format: the largest point of each axis, on its unseen split."""
    rows = []
    for axis in AXES:
        results = tables[axis][0]
        largest = results[results[axis] == results[axis].max()]
        for _, row in largest.iterrows():
            rows.append({
                "task": config.task, "policy": f"diffusion policy ({config.policy_config})",
                "split": "unseen", "metric": "score", "value": float(row["score"]),
                "ci_low": float(row["score_ci_low"]), "ci_high": float(row["score_ci_high"]),
                # The trial's wall time (training and its evaluation), on a core shared with another trial.
                "n_rollouts": int(row["n_rollouts"]), "train_minutes": float(row["wall_time_s"]) / 60,
                "axis": axis, "axis_value": int(row[axis]), "seed": int(row["seed"]),
            })  # fmt: skip
    return rows


def _summary(config, analysis, compute, joint, saving, sequential, recommendation, recommendation_cut,
             validation, tables, seconds, total) -> dict[str, Any]:  # fmt: skip
    import os
    import platform
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    widths = {
        axis: {"fixed": float(analysis[axis]["summary"]["alpha_ci"][1] - analysis[axis]["summary"]["alpha_ci"][0]),
               "sequential": float(sequential[axis]["alpha_ci"][1] - sequential[axis]["alpha_ci"][0])}
        for axis in AXES
    }  # fmt: skip
    return {
        "name": "study",
        "task": config.task,
        "command": "demoscale study --out docs/results/study",
        "commit": commit.stdout.strip() or None,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },  # fmt: skip
        "budget_rule": dict(config.budget),
        "axes": {axis: analysis[axis]["summary"] for axis in AXES},
        "demos_saturation": analysis["demos_per_pair"]["summary"],
        "joint": joint
        if isinstance(joint, str)
        else {
            "equation": joint.equation_text(),
            "params": joint.params,
            "n_trials": joint.n_points,
        },  # fmt: skip
        "compute_sensitivity": {
            "axis": config.compute_axis,
            "steps": config.budget.get("steps"),
            "factor": config.compute_factor,
            "alpha": analysis[config.compute_axis]["summary"]["alpha"],
            "alpha_ci": analysis[config.compute_axis]["summary"]["alpha_ci"],
            "alpha_more_steps": compute["summary"]["alpha"],
            "alpha_more_steps_ci": compute["summary"]["alpha_ci"],
        },
        "sequential": {
            **saving,
            "alpha_ci_widths": widths,
            "axes": sequential,
            "recommendation_fixed": _plan_words(recommendation),
            "recommendation_sequential": _plan_words(recommendation_cut),
        },  # fmt: skip
        "rollouts_saved_fraction": saving["saved_fraction"],
        "recommendation": {"status": recommendation.status, "message": recommendation.message},
        "validation": validation,
        "stage_seconds": dict(seconds),
        "wall_minutes": total / 60,
        "headline": _headline(config, tables),
    }


def _plan_words(recommendation: Any) -> dict[str, Any]:
    plan = recommendation.plan or recommendation.best_in_range
    return {"status": recommendation.status,
            "n_pairs": None if plan is None else int(plan.n_pairs),
            "expected_score": None if plan is None else float(plan.expected_score)}  # fmt: skip


def _validation_text(v: dict[str, Any], cost_unit: str) -> str:
    """The report's account of the plans carried out (``summary["validation"]``)."""
    inside = "inside" if v["inside_interval"] else "outside"
    beats = "beats" if v["recommended_beats_alternative"] else "does not beat"
    low, high = v["difference_ci"]
    # A difference whose interval holds zero is a tie, whichever plan scored higher.
    tie = "; the interval holds zero: a tie within the noise" if low <= 0 <= high else ""
    return f"""We ran {v["asked"]}: **{v["plan"]["n_pairs"]} pairs x {v["plan"]["demos_per_pair"]} demos**
({cost_unit}{v["plan"]["cost"]:,.0f}), collected on fresh training ids, trained and evaluated as above.
Predicted score {v["predicted"]:.3f}, {v["level"]:.0%} {v["interval"]} interval [{v["predicted_low"]:.3f}, {v["predicted_high"]:.3f}];
**achieved {v["achieved"]:.3f}** (seeds {", ".join(f"{s:.3f}" for s in v["achieved_per_seed"])}): {inside} the interval.
The equal-cost alternative, **{v["alternative_plan"]["n_pairs"]} pairs x {v["alternative_plan"]["demos_per_pair"]} demos**
({cost_unit}{v["alternative_plan"]["cost"]:,.0f}), achieved {v["alternative_achieved"]:.3f}: the recommendation {beats} it
(difference {v["difference"]:+.3f}, {v["difference_level"]:.0%} interval [{v["difference_ci"][0]:+.3f}, {v["difference_ci"][1]:+.3f}]
over seeds and rollouts{tie})."""


def _report(config: StudyConfig, summary: dict[str, Any], analysis, recommendation, plots, out: Path) -> str:
    """The two-minute read for a PI."""
    import os

    pct = f"{config.confidence:.0%}"
    rows = [
        "| axis | alpha | " + pct + " interval | r | preferred law | evidence |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for axis in AXES:
        s = summary["axes"][axis]
        r = "-" if s["r"] is None else f"{s['r']:.2f}"
        rows.append(f"| {AXIS_WORDS[axis]} | {s['alpha']:.3f} | [{s['alpha_ci'][0]:.3f}, {s['alpha_ci'][1]:.3f}] "
                    f"| {r} | {s['preferred_law']} | {s['evidence']} |")  # fmt: skip
    v = summary["validation"]
    c = summary["compute_sensitivity"]
    q = summary["sequential"]
    pngs = [p for p in plots if str(p).endswith(".png")]
    figures = "\n".join(f"![{p.stem}]({os.path.relpath(p, out)})" for p in pngs[:1])
    joint = summary["joint"]
    joint_text = joint if isinstance(joint, str) else f"`{joint['equation']}` ({joint['n_trials']} trials)"
    per_axis_trials = {axis: int(summary["axes"][axis]["n_trials"]) for axis in AXES}
    extras = ""
    if q.get("extra_given"):
        extras = (
            f" That count includes {sum(q['extra_given'].values())} rollouts added after the rule ({q['extra_to']}), a round "
            f"at a time, to the pairs trials whose noise most blurs the law's prediction at {q['extra_at_n_pairs']} pairs: "
            + ", ".join(f"{trial} +{n}" for trial, n in q["extra_given"].items())
            + "."
        )
    budget = config.budget
    rule = (
        f"a fixed {budget.get('steps')} training steps"
        if budget.get("rule", "fixed") == "fixed"
        else f"steps that grow with the data ({budget})"
    )
    return f"""# The data-scaling study, in simulation

**Question:** how much more data, and of what kind? Task `{config.task}` (simulated tabletop,
{config.image_size} px {", ".join(config.cameras)} camera), scripted demonstrations, the diffusion policy of
`configs/{config.policy_config}`, trained with one rule for every trial: **{rule}** (the
compute check below repeats the {AXIS_WORDS[config.compute_axis]} axis at x{config.compute_factor:g} the steps).
Each trial is scored on {config.eval_episodes} rollouts in unseen settings ({config.eval_settings} of them); every
interval is at {pct} unless said otherwise. Wall time: **{summary["wall_minutes"]:.1f} minutes**.

## Exponents: gap `1 - score = beta * x^alpha` (the paper's log-log OLS)
{chr(10).join(rows)}

Trials per axis: {per_axis_trials}. {figures}

- **Demonstrations:** preferred law `{summary["demos_saturation"]["preferred_law"]}` — {summary["demos_saturation"]["evidence"]}.
- **Joint law** over pairs and demos per pair: {joint_text}.
- **Compute is not hidden:** on {AXIS_WORDS[c["axis"]]}, alpha = {c["alpha"]:.3f} [{c["alpha_ci"][0]:.3f}, {c["alpha_ci"][1]:.3f}]
  at {c["steps"]} steps and {c["alpha_more_steps"]:.3f} [{c["alpha_more_steps_ci"][0]:.3f}, {c["alpha_more_steps_ci"][1]:.3f}]
  at x{c["factor"]:g} the steps.

## The recommendation, carried out
{recommendation.status.upper()}: {recommendation.message}

{_validation_text(v, config.cost_unit)}

## Cheaper evaluation
Sequential allocation (stop a trial once the interval of {_SCALE_WORDS[q.get("scale", "score")]} is within +-{q["halfwidth"]:g}, at least
{q["min_episodes"]} rollouts, in rounds of {q["round_size"]}), replayed on the recorded rollouts: {q["rollouts_sequential"]}
rollouts instead of {q["rollouts_fixed"]} (**{q["saved_fraction"]:.0%} saved**).{extras} Widths of the alpha intervals, fixed ->
sequential: {", ".join(f"{AXIS_WORDS[a]} {w['fixed']:.3f} -> {w['sequential']:.3f}" for a, w in q["alpha_ci_widths"].items())}.
Recommendation with all rollouts: {q["recommendation_fixed"]}; with the sequential ones: {q["recommendation_sequential"]}.

## The decision summary (`demoscale laws recommend` on the pairs sub-study)
```
{recommendation.summary()}
```

Files: `summary.json`, `sweeps/<axis>/results.csv|rollouts.csv`, `plots/`, `recommendation.txt`.
"""


def build_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import add_config_arguments, make_parser

    parser = make_parser(
        "demoscale study",
        "The Data Scaling Laws study in simulation: objects, environments, pairs and demonstrations\n"
        "sub-studies on a Ray sweep each, their laws, and the recommended plan carried out.\n"
        "Any setting of the study YAML can be overridden: --set target=0.7 --budget.steps 500;\n"
        "--print-config shows the result without running it.",
    )
    parser.add_argument("--out", default="study_out", help="report folder (removed first unless --resume)")
    parser.add_argument("--quick", action="store_true", help="a reduced study for tests (a few minutes)")
    parser.add_argument("--resume", action="store_true", help="keep collected stores and finished trials")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a private local Ray)")
    add_config_arguments(
        parser, "study YAML; --quick puts its 'quick' section on top", default=str(STUDY_CONFIG)
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from demoscale.conventions import EXIT_OK, ConfigError, config_yaml, error, parse_with_overrides

    parser = build_parser()
    args, overrides = parse_with_overrides(parser, argv)
    try:
        config = load_study_config(quick=args.quick, path=args.config, overrides=overrides)
    except (ConfigError, ValueError) as err:
        return error("study", err)
    if args.print_config:
        print(config_yaml(config), end="")
        return EXIT_OK
    print("demoscale study:", json.dumps(asdict(config)), flush=True)
    run_study(args.out, quick=args.quick, config=config, resume=args.resume, address=args.address)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
