"""Closed-loop rollout evaluation with confidence intervals, rollout tables and videos.

``evaluate`` rolls a policy out on ``n_envs`` x ``n_objects`` (environment, object) pairs of a
split, ``episodes`` rollouts in all (round-robin over the pairs). Several environments are stepped in lockstep in one process
so that policy inference is batched; ``workers`` > 1 spreads the rollouts over processes.

A policy observes a window of past observations given by its ``obs_offsets`` (frame offsets <= 0;
before the first frame the first observation repeats, as in training), predicts a chunk of
absolute actions and executes its first ``n_action_steps`` before planning again. A rollout ends
when the task succeeds or after the task's ``max_steps``.

Outputs (when ``out_dir`` is given): ``rollouts.csv`` (one row per rollout: rollout_index,
env_id, object_id, seed, stage_1..stage_n, stage_score, max_stage_score, score, success, steps),
``summary.json`` (mean normalised score and success rate, each with a Wilson interval at
``confidence``, by default ``demoscale.DEFAULT_CONFIDENCE``; n_rollouts, ...) and
``videos/rollout_<k>.mp4`` for the first ``video_episodes`` rollouts (H.264 with the step, the
stages reached and success drawn on; see :mod:`demoscale.eval.video`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from demoscale import DEFAULT_CONFIDENCE
from demoscale.eval.ids import env_ids, object_ids, pair_ids
from demoscale.eval.tasks import TaskDefinition, get_task

DEFAULT_BATCH = 8


class SpecMismatchError(ValueError):
    """A policy's observation/action spec does not match the task it is evaluated on."""


def wilson_interval(successes: float, n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (``(nan, nan)`` when ``n`` is 0).

    ``(p + z^2/2n -/+ z * sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``z`` the two-sided normal
    quantile; the same numbers as statsmodels' ``proportion_confint(method="wilson")``."""
    if n <= 0:
        return float("nan"), float("nan")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Rounding can put an end a hair past p at p = 0 or 1.
    return float(min(max(0.0, centre - half), p)), float(max(min(1.0, centre + half), p))


def mean_interval(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Interval for the mean of scores in [0, 1]: the Wilson interval of ``sum(values)`` successes
    out of ``len(values)`` (``(nan, nan)`` when empty).

    For 0/1 scores this is the success-rate interval itself. For staged scores it is conservative,
    since a score in [0, 1] with mean p has a variance of at most p(1 - p), the Bernoulli one. Unlike
    a t interval it does not collapse to a point when every rollout scores the same (all 0 or all 1
    is the common case for a weak or a strong policy): 60 rollouts that all succeed give [0.96, 1] at
    90%, not [1, 1]."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return float("nan"), float("nan")
    if ((values < 0) | (values > 1)).any():
        raise ValueError(
            f"scores must lie in [0, 1] for a score interval, got {values.min()}..{values.max()}"
        )
    return wilson_interval(float(values.sum()), len(values), confidence)


def summarise(
    rollouts: pd.DataFrame, confidence: float = DEFAULT_CONFIDENCE, metrics: Sequence[str] = ()
) -> dict[str, Any]:
    """Mean score and success rate over ``rollouts``, each with a Wilson interval at ``confidence``;
    for each task metric column ``m`` in ``metrics`` (values in [0, 1]), ``mean_m`` with
    ``mean_m_ci_low/high`` (the same interval as the score's)."""
    n = len(rollouts)
    extra: dict[str, Any] = {}
    for name in metrics:
        values = rollouts[name].to_numpy(dtype=float) if n and name in rollouts else np.array([])
        low, high = mean_interval(values, confidence)
        extra[f"mean_{name}"] = float(values.mean()) if len(values) else float("nan")
        extra[f"mean_{name}_ci_low"], extra[f"mean_{name}_ci_high"] = low, high
    successes = int(rollouts["success"].sum()) if n else 0
    score_low, score_high = mean_interval(rollouts["score"].to_numpy() if n else [], confidence)
    success_low, success_high = wilson_interval(successes, n, confidence)
    return {
        "n_rollouts": n,
        "score": float(rollouts["score"].mean()) if n else float("nan"),
        "score_ci_low": score_low,
        "score_ci_high": score_high,
        "successes": successes,
        "success_rate": successes / n if n else float("nan"),
        "success_ci_low": success_low,
        "success_ci_high": success_high,
        **extra,
        "confidence": confidence,
    }


@dataclass
class EvalResult:
    """``rollouts``: one row per rollout; ``summary``: aggregate numbers; ``out_dir`` if written."""

    rollouts: pd.DataFrame
    summary: dict[str, Any]
    out_dir: str | None = None


# --- policies --------------------------------------------------------------------------------
# An actor drives the environments of one batch: ``start(slot, env, seed)`` when a rollout begins
# in a slot, then ``chunks(slots, histories, seed)``, the next actions of each slot given its
# observations so far (one for the expert, ``n_action_steps`` for a policy). ``evaluate`` steps many
# environments with one; a diagnostic that steps its own environment uses the same object, so that
# a window is built one way everywhere.
class ExpertActor:
    """The task's scripted expert, one per environment, acting every step."""

    name = "expert"
    n_action_steps = 1
    obs_offsets: dict[str, list[int]] = {}

    def __init__(self) -> None:
        self.experts: dict[int, Any] = {}

    def start(self, slot: int, env, seed: int) -> None:
        self.experts[slot] = env.expert(seed)

    def chunks(self, slots: list[int], histories: Mapping[int, list[dict]], seed: int) -> list[np.ndarray]:
        return [self.experts[s].act(histories[s][-1])[None] for s in slots]


class PolicyActor:
    """A learned policy: batched windows in, chunks of absolute actions out.

    With the policy's ``inference_delay`` d > 0, the rollout simulates a robot that keeps moving
    while the next chunk is computed: each chunk is acted on from its action d, at step t + d for an
    observation at step t, and until then the previous chunk's actions [n, n + d) run (n =
    ``n_action_steps``). The first chunk of a rollout runs from its action 0 (the robot waits for it).

    With the policy's ``temporal_ensemble`` set (a decay, ACT's temporal ensembling), the policy
    predicts a chunk at every step and the executed action is the weighted mean of every stored
    chunk's prediction for that step (:class:`~demoscale.policies.inference.TemporalEnsembler`:
    weight ``exp(-decay * age)``, age 0 the newest chunk; 0 is the plain mean, a negative decay
    favours older chunks). It replans every step, so it takes no ``n_action_steps`` and no delay.

    With the policy's ``chunk_samples`` k > 1, each replan samples k chunks per slot (one batch of k
    times the windows) and keeps the one most coherent with the slot's previous chunk
    (:func:`~demoscale.policies.inference.most_coherent`, weights ``coherence_decay ** i``); the
    first chunk of a rollout is the first sample.
    """

    def __init__(self, policy, name: str) -> None:
        self.policy = policy
        self.name = name
        self.n_action_steps = max(1, int(getattr(policy, "n_action_steps", 1)))
        self.inference_delay = int(getattr(policy, "inference_delay", 0))
        decay = getattr(policy, "temporal_ensemble", None)
        self.temporal_ensemble = None if decay is None else float(decay)
        if self.temporal_ensemble is not None:
            self.n_action_steps = 1  # one action per prediction
        self.chunk_samples = int(getattr(policy, "chunk_samples", 1))
        self.coherence_decay = float(getattr(policy, "coherence_decay", 0.5))
        if self.inference_delay or self.temporal_ensemble is not None:
            from demoscale.policies.base import check_execution

            check_execution(
                int(policy.horizon), self.n_action_steps, self.inference_delay, self.temporal_ensemble
            )
        if self.chunk_samples != 1:
            from demoscale.policies.base import check_chunk_selection

            check_chunk_selection(
                self.chunk_samples, self.coherence_decay, self.n_action_steps, int(policy.horizon),
                self.temporal_ensemble,
            )  # fmt: skip
        self.previous: dict[int, np.ndarray | None] = {}  # slot -> its last chunk (delay, chunk_samples)
        self.ensemblers: dict[int, Any] = {}  # slot -> its chunks (temporal ensembling)
        self.obs_offsets = {k: [int(o) for o in v] for k, v in policy.obs_offsets.items()}
        bad = {k: v for k, v in self.obs_offsets.items() if any(o > 0 for o in v)}
        if bad:
            raise SpecMismatchError(f"observation offsets must be <= 0 (past frames) for rollouts, got {bad}")

    def start(self, slot: int, env, seed: int) -> None:
        self.previous[slot] = None
        if self.temporal_ensemble is not None:
            from demoscale.policies.inference import TemporalEnsembler

            self.ensemblers[slot] = TemporalEnsembler(self.temporal_ensemble)

    def _select(self, slots: list[int], candidates: np.ndarray) -> np.ndarray:
        """Per slot, the candidate chunk most coherent with the slot's previous chunk (which ran
        ``n_action_steps`` steps ago: every replan follows that many executed actions)."""
        from demoscale.policies.inference import most_coherent

        chosen = []
        for slot, options in zip(slots, candidates, strict=True):
            previous = self.previous.get(slot)
            shift = self.n_action_steps
            chosen.append(
                options[
                    0 if previous is None else most_coherent(options, previous, shift, self.coherence_decay)
                ]
            )
        return np.stack(chosen)

    def window(self, history: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The policy's observation window at the end of ``history`` (frames before the first
        repeat it, as in training)."""
        last = len(history) - 1
        return {
            key: np.stack([history[max(0, last + o)][key] for o in offsets])
            for key, offsets in self.obs_offsets.items()
        }

    def chunks(self, slots: list[int], histories: Mapping[int, list[dict]], seed: int) -> list[np.ndarray]:
        windows = [self.window(histories[s]) for s in slots]
        k = self.chunk_samples
        if k > 1:
            windows = [w for w in windows for _ in range(k)]  # k candidates per slot, side by side
        batch = {key: np.stack([w[key] for w in windows]) for key in self.obs_offsets}
        if hasattr(self.policy, "predict_action_batch"):
            actions = np.asarray(self.policy.predict_action_batch(batch, seed=seed))
        else:
            actions = np.stack([np.asarray(self.policy.predict_action(w)) for w in windows])
        if k > 1:
            actions = self._select(slots, actions.reshape(len(slots), k, *actions.shape[1:]))
        if self.temporal_ensemble is not None:
            out = []
            for slot, chunk in zip(slots, actions, strict=True):
                step = len(histories[slot]) - 1  # the step this chunk's first action is for
                self.ensemblers[slot].add(step, chunk)
                out.append(self.ensemblers[slot].action(step)[None])
            return out
        n, delay = self.n_action_steps, self.inference_delay
        out = []
        for slot, chunk in zip(slots, actions, strict=True):
            previous, self.previous[slot] = self.previous.get(slot), chunk
            if delay and previous is not None:  # the previous chunk runs on until this one arrives
                out.append(np.concatenate([previous[n : n + delay], chunk[delay:n]]))
            else:
                out.append(chunk[:n])
        return out


def actor_for(policy: Any, device: str = "cpu") -> ExpertActor | PolicyActor:
    """The actor for ``"expert"``, a checkpoint path or a loaded policy."""
    if isinstance(policy, str) and policy == "expert":
        return ExpertActor()
    if isinstance(policy, str | os.PathLike):
        from demoscale.policies import load_policy

        return PolicyActor(load_policy(policy, device=device), name=os.fspath(policy))
    if not hasattr(policy, "obs_offsets") or not (
        hasattr(policy, "predict_action") or hasattr(policy, "predict_action_batch")
    ):
        raise TypeError(
            f"policy must be 'expert', a checkpoint path or a Policy, got {type(policy).__name__}"
        )
    return PolicyActor(policy, name=type(policy).__name__)


def policy_image_size(policy) -> int | None:
    """The square image size a loaded policy was trained on (from its feature spec), if any."""
    for key, spec in getattr(policy, "features", {}).items():
        spec = spec if isinstance(spec, Mapping) else vars(spec)
        if key in getattr(policy, "obs_offsets", {}) and spec.get("kind") == "image":
            return int(spec["shape"][0])
    return None


def recorded_capture(policy) -> dict[str, dict[str, Any]]:
    """Observed image (or point-cloud) key -> what produced its training data (the feature spec's
    ``source``: task, camera, image size, environment options), for the keys that recorded it.

    A policy that observes no recorded image (e.g. only the simulator's object state) gets the
    record of the store's other images: one collection wrote them all, so their task and options
    (``object_state`` among them) are the ones its observations came from."""
    captured: dict[str, dict[str, Any]] = {}
    others: dict[str, dict[str, Any]] = {}
    for key, spec in getattr(policy, "features", {}).items():
        spec = spec if isinstance(spec, Mapping) else vars(spec)
        if spec.get("kind") in ("image", "point_cloud") and spec.get("source"):
            observed = key in getattr(policy, "obs_offsets", {})
            (captured if observed else others)[key] = dict(spec["source"])
    return captured or others


def _describe(key: str, source: Mapping[str, Any]) -> str:
    return (
        f"{key!r} was recorded by the {source.get('camera')!r} camera of task {source.get('task')!r} "
        f"at {source.get('image_size')} px"
    )


def apply_capture(
    recorded: Mapping[str, Mapping[str, Any]],
    task: str | None,
    image_size: int | None,
    env_options: Mapping[str, Any] | None,
    policy_name: str = "the policy",
) -> tuple[str | None, int | None, dict[str, Any]]:
    """The evaluation's (task, image size, environment options): what was given, and otherwise what
    the policy's training images were recorded with. An explicit value that contradicts the record
    (another camera, size or option) raises :class:`SpecMismatchError` naming both."""
    options = dict(env_options or {})
    if not recorded:
        return task, image_size, options
    key, source = next(iter(sorted(recorded.items())))
    recorded_options = dict(source.get("env_options") or {})
    problems = []
    for name, value in options.items():
        if name in recorded_options and _plain(value) != recorded_options[name]:
            problems.append(f"{name}={_plain(value)!r} (recorded: {recorded_options[name]!r})")
    recorded_size = source.get("image_size")
    if image_size is not None and recorded_size is not None and int(image_size) != int(recorded_size):
        problems.append(f"image size {image_size} (recorded: {recorded_size})")
    if problems:
        raise SpecMismatchError(
            f"{policy_name}: {_describe(key, source)}, but the evaluation asks for "
            + "; ".join(problems)
            + ". Leave these options out to evaluate as recorded, or give the recorded values."
        )
    recorded_task = source.get("task")
    if task is not None and recorded_task and task != recorded_task:
        import warnings

        warnings.warn(
            f"{policy_name} was trained on task {recorded_task!r}, evaluated on {task!r}", stacklevel=3
        )
    return (
        task or recorded_task,
        image_size if image_size is not None else recorded_size,
        {**recorded_options, **options},
    )


def check_capture(recorded: Mapping[str, Mapping[str, Any]], env, policy_name: str = "the policy") -> None:
    """Raise :class:`SpecMismatchError` if ``env`` renders a recorded key with another camera."""
    cameras = env.image_cameras() if callable(getattr(env, "image_cameras", None)) else {}
    problems = [
        f"{_describe(key, source)}; the evaluation renders it with the {cameras[key]!r} camera"
        for key, source in sorted(recorded.items())
        if key in cameras and source.get("camera") and cameras[key] != source["camera"]
    ]
    if problems:
        camera_list = " ".join(str(recorded[k]["camera"]) for k in sorted(recorded))
        raise SpecMismatchError(
            f"{policy_name}: " + "; ".join(problems) + f" (evaluate with --cameras {camera_list}, or "
            "leave --cameras out to use the recorded cameras)"
        )


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


def check_spec(actor, definition: TaskDefinition, observation: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`SpecMismatchError` if the policy cannot act in the task (before any rollout)."""
    if isinstance(actor, ExpertActor):
        return
    policy = actor.policy
    problems = []
    for key in actor.obs_offsets:
        if key not in observation:
            problems.append(
                f"the policy observes {key!r}, which task {definition.name!r} does not provide "
                f"(it provides {sorted(observation)})"
            )
            continue
        spec = policy.features.get(key) if hasattr(policy, "features") else None
        spec = spec if spec is None or isinstance(spec, Mapping) else vars(spec)
        if spec is not None and tuple(spec["shape"]) != tuple(np.shape(observation[key])):
            problems.append(
                f"{key!r}: the policy expects shape {tuple(spec['shape'])}, the task gives "
                f"{tuple(np.shape(observation[key]))}"
            )
    action_dim = getattr(policy, "action_dim", None)
    if action_dim is not None and int(action_dim) != definition.action_dim:
        problems.append(
            f"the policy predicts {action_dim}-dim actions, task {definition.name!r} takes "
            f"{definition.action_dim}"
        )
    if problems:
        raise SpecMismatchError(
            f"policy {actor.name} does not fit task {definition.name!r}: " + "; ".join(problems)
        )


# --- rollouts --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RolloutJob:
    rollout_index: int
    env_id: int
    object_id: int
    seed: int
    video: bool


def _caption(env):
    from demoscale.eval.video import FrameCaption

    return FrameCaption(
        step=int(env.steps), stages=tuple(bool(d) for d in env.stages()), success=bool(env.success())
    )


def _task_metrics(env) -> dict[str, float]:
    """The environment's own per-rollout measures (``SimEnv.metrics``), if it has any."""
    metrics = getattr(env, "metrics", None)
    return dict(metrics()) if callable(metrics) else {}


def _run_batch(
    actor,
    definition: TaskDefinition,
    jobs: Sequence[RolloutJob],
    image_size: int,
    env_options: dict,
    max_steps: int,
    video_dir: Path | None,
    seed: int,
) -> list[dict[str, Any]]:
    envs = [definition.make_env(j.env_id, j.object_id, image_size=image_size, **env_options) for j in jobs]
    try:
        histories = {i: [env.reset(job.seed)] for i, (env, job) in enumerate(zip(envs, jobs, strict=True))}
        for i, (env, job) in enumerate(zip(envs, jobs, strict=True)):
            actor.start(i, env, job.seed)
        check_spec(actor, definition, histories[0][0])
        queues: dict[int, list[np.ndarray]] = {i: [] for i in histories}
        frames = {i: [env.render()] for i, (env, job) in enumerate(zip(envs, jobs, strict=True)) if job.video}
        # What the video overlay says on each frame: the step, the stages reached, success.
        captions = {i: [_caption(envs[i])] for i in frames}
        active = {i for i, env in enumerate(envs) if not env.success()}
        step = 0
        while active and step < max_steps:
            need = sorted(i for i in active if not queues[i])
            if need:
                for i, chunk in zip(need, actor.chunks(need, histories, seed + step), strict=True):
                    queues[i] = list(chunk)
            for i in sorted(active):
                histories[i].append(envs[i].step(queues[i].pop(0)))
                if i in frames:
                    frames[i].append(envs[i].render())
                    captions[i].append(_caption(envs[i]))
                if envs[i].success() or envs[i].steps >= max_steps:
                    active.discard(i)
            step += 1
        rows = []
        for i, (env, job) in enumerate(zip(envs, jobs, strict=True)):
            stages = env.stages()
            stage_score = env.stage_score()
            row = {
                "rollout_index": job.rollout_index,
                "env_id": job.env_id,
                "object_id": job.object_id,
                "seed": job.seed,
                **{f"stage_{k + 1}": bool(done) for k, done in enumerate(stages)},
                "stage_score": stage_score,
                "max_stage_score": env.n_stages,
                "score": stage_score / env.n_stages,
                "success": bool(env.success()),
                "steps": int(env.steps),
                **{name: float(value) for name, value in _task_metrics(env).items()},
            }
            if i in frames and video_dir is not None:
                video_dir.mkdir(parents=True, exist_ok=True)
                from demoscale.eval.video import write_video

                path = video_dir / f"rollout_{job.rollout_index}.mp4"
                row["video"] = str(write_video(path, frames[i], definition.rate_hz, captions[i]))
            rows.append(row)
        return rows
    finally:
        for env in envs:
            env.close()


def _run_jobs(
    policy_ref,
    task: str,
    jobs: list[RolloutJob],
    image_size: int,
    env_options: dict,
    max_steps: int,
    video_dir: str | None,
    seed: int,
    batch_size: int,
    device: str,
    progress: bool = False,
) -> list[dict[str, Any]]:
    actor = actor_for(policy_ref, device=device)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    if not progress and torch is not None:
        torch.set_num_threads(1)  # worker processes share the cores: one thread each
    definition = get_task(task)
    rows: list[dict[str, Any]] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=f"eval {task}", unit="rollout", disable=not progress)
    try:
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start : start + batch_size]
            rows += _run_batch(
                actor,
                definition,
                batch,
                image_size,
                env_options,
                max_steps,
                Path(video_dir) if video_dir else None,
                seed + start,
            )
            bar.update(len(batch))
    finally:
        bar.close()
        if threads is not None:
            # Run in the caller's process (no workers), an evaluation must not leave it on one
            # thread: a learning curve trains its next variant after evaluating the last one.
            torch.set_num_threads(threads)
    return rows


def _rollout_seed(seed: int, env_id: int, object_id: int, episode: int) -> int:
    return int(np.random.default_rng([0xE7A1, int(seed), env_id, object_id, episode]).integers(0, 2**31 - 1))


def evaluate(
    policy,
    task: str | None = None,
    split: str = "unseen",
    n_envs: int | None = None,
    n_objects: int = 1,
    episodes: int | None = None,
    workers: int = 1,
    out_dir: str | os.PathLike | None = None,
    seed: int = 0,
    video_episodes: int = 2,
    image_size: int | None = None,
    env_options: dict | None = None,
    max_steps: int | None = None,
    batch_size: int = DEFAULT_BATCH,
    device: str = "cpu",
    progress: bool = True,
    pairing: str = "grid",
    confidence: float = DEFAULT_CONFIDENCE,
    env_split: str | None = None,
    object_split: str | None = None,
    stop_halfwidth: float | None = None,
    min_episodes: int | None = None,
    stop_scale: str = "score",
) -> EvalResult:
    """Roll ``policy`` out on the first ``n_envs`` (default: the task's ``eval_envs``) x
    ``n_objects`` pairs of ``split``.

    ``env_split`` and ``object_split`` (default: ``split``) choose the environment and object id
    ranges apart, e.g. unseen objects in a training environment (``env_split="train",
    object_split="unseen"``), as the objects sub-study of the Data Scaling Laws study evaluates.
    ``stop_halfwidth`` makes the evaluation sequential: rollouts run in rounds of ``batch_size``
    (times ``workers``), in the usual round-robin order, and stop once at least ``min_episodes``
    (default: one per pair) have run and the score interval's half-width is at most
    ``stop_halfwidth`` (:func:`sequential_stop`, on ``stop_scale``: ``"score"`` or ``"log-gap"``);
    ``episodes`` is then the most that may run.

    ``policy`` is a checkpoint path (loaded with ``demoscale.policies.load_policy``), an already
    loaded Policy, or ``"expert"`` (the task's scripted expert). ``pairing`` is ``"grid"`` (every
    environment x object) or ``"unique"`` (environment k with object k, as ``collect_sim`` pairs
    them; evaluates a policy on exactly its training pairs). ``episodes`` is the total number of
    rollouts, spread round-robin over the pairs (rollout i runs on pair ``i % n_pairs``; default one
    per pair); use a multiple of the pair count for a balanced evaluation. ``confidence`` is the
    level of the summary's intervals.
    A policy whose training images recorded what produced them (the feature spec's ``source``, see
    :func:`recorded_capture`) is evaluated with the same task, camera, image size and environment
    options unless they are given; given ones that contradict the record raise
    :class:`SpecMismatchError`. Otherwise the image size defaults to the policy's training size (96
    for the expert). A policy whose observation keys/shapes or action size do not fit the task
    raises :class:`SpecMismatchError` before any rollout; unknown tasks and ids outside the
    documented ranges raise too.
    """
    actor = actor_for(policy, device=device)
    recorded = recorded_capture(actor.policy) if isinstance(actor, PolicyActor) else {}
    task, image_size, env_options = apply_capture(recorded, task, image_size, env_options, actor.name)
    if task is None:
        raise ValueError(
            "no task given and the policy's training data did not record one: pass the task "
            "(--task on the command line)"
        )
    definition = get_task(task)
    n_envs = definition.eval_envs if n_envs is None else n_envs
    if min(n_envs, n_objects) < 1 or (episodes is not None and episodes < 1):
        raise ValueError("n_envs, n_objects and episodes must all be >= 1")
    envs, objects = env_ids(env_split or split, n_envs), object_ids(object_split or split, n_objects)
    pairs = pair_ids(envs, objects, pairing)
    episodes = len(pairs) if episodes is None else episodes
    if image_size is None:
        image_size = (policy_image_size(actor.policy) if isinstance(actor, PolicyActor) else None) or 96
    env_options = dict(env_options or {})
    if (
        definition.images_optional
        and isinstance(actor, PolicyActor)
        and not set(actor.obs_offsets) & set(definition.image_keys)
    ):
        env_options.setdefault("images", False)  # nothing to draw for a policy that sees no image
    max_steps = int(max_steps or definition.max_steps)
    # Check the spec on one environment before anything long runs.
    probe = definition.make_env(envs[0], objects[0], image_size=image_size, **env_options)
    try:
        check_capture(recorded, probe, actor.name)
        check_spec(actor, definition, probe.reset(0))
    finally:
        probe.close()

    jobs = _round_robin_jobs(pairs, episodes, seed, video_episodes)
    video_dir = str(Path(out_dir) / "videos") if out_dir is not None and video_episodes > 0 else None
    started = time.perf_counter()
    policy_ref = (
        policy if isinstance(actor, ExpertActor) or isinstance(policy, str | os.PathLike) else actor.policy
    )
    settings = (image_size, env_options, max_steps, video_dir, seed, batch_size, device)
    if stop_halfwidth is None:
        rows = _run_rollouts(policy_ref, definition.name, jobs, settings, workers, progress)
    else:
        minimum = len(pairs) if min_episodes is None else int(min_episodes)
        rows = _run_until_narrow(
            policy_ref,
            definition.name,
            jobs,
            settings,
            workers,
            stop_halfwidth,
            minimum,
            confidence,
            stop_scale,
        )
    wall = time.perf_counter() - started
    rollouts = pd.DataFrame(rows).sort_values("rollout_index").reset_index(drop=True)
    summary = {
        "task": definition.name,
        "split": split,
        "policy": actor.name,
        "n_envs": n_envs,
        "n_objects": n_objects,
        "episodes": len(rollouts),
        "episodes_planned": episodes,
        **summarise(rollouts, confidence, metrics=definition.metrics),
        "mean_steps": float(rollouts["steps"].mean()),
        "image_size": image_size,
        "env_options": _plain(env_options),
        "seed": seed,
        "wall_time_s": wall,
        "env_ids": envs,
        "object_ids": objects,
        "env_split": env_split or split,
        "object_split": object_split or split,
        "stop_halfwidth": stop_halfwidth,
        "stop_scale": stop_scale,
    }
    written = _write_record(out_dir, rollouts, summary) if out_dir is not None else None
    return EvalResult(rollouts=rollouts, summary=summary, out_dir=written)


def _write_record(out_dir: str | os.PathLike, rollouts: pd.DataFrame, summary: dict[str, Any]) -> str:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rollouts.to_csv(out / "rollouts.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return str(out)


def _run_until_narrow(
    policy_ref: Any,
    task: str,
    jobs: list[RolloutJob],
    settings: tuple,
    workers: int,
    halfwidth: float,
    min_episodes: int,
    confidence: float,
    scale: str = "score",
) -> list[dict[str, Any]]:
    """Sequential evaluation: ``jobs`` in rounds of one batch per worker, in their round-robin
    order, until :func:`sequential_stop` says the score interval is narrow enough (or none are left)."""
    batch_size = settings[5]
    round_size = max(1, batch_size * max(1, workers))
    rows: list[dict[str, Any]] = []
    while len(rows) < len(jobs):
        batch = jobs[len(rows) : len(rows) + round_size]
        rows += sorted(
            _run_rollouts(policy_ref, task, batch, settings, workers, progress=False),
            key=lambda row: row["rollout_index"],
        )
        scores = [row["score"] for row in rows]
        if sequential_stop(scores, halfwidth, min_episodes, round_size, confidence, scale) <= len(rows):
            break
    return rows


def _run_rollouts(
    policy_ref: Any, task: str, jobs: list[RolloutJob], settings: tuple, workers: int, progress: bool
) -> list[dict[str, Any]]:
    """Run ``jobs`` in this process (environments in lockstep) or spread over ``workers`` processes."""
    if workers <= 1:
        return _run_jobs(policy_ref, task, jobs, *settings, progress=progress)
    shares = [jobs[w::workers] for w in range(workers) if jobs[w::workers]]
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_run_jobs, policy_ref, task, share, *settings) for share in shares]
        return [row for future in futures for row in future.result()]


STOP_SCALES = ("score", "log-gap")


def interval_width(low: float, high: float, scale: str = "score") -> float:
    """Width of a score interval on the scale a stopping rule judges it: the score itself, or the log
    optimality gap ``log(1 - score)`` that the scaling laws are fitted in (a gap near 0 counts as
    1e-3, so an interval that reaches a perfect score is as wide as it can be)."""
    if scale == "score":
        return high - low
    if scale == "log-gap":
        return math.log(max(1.0 - low, 1e-3)) - math.log(max(1.0 - high, 1e-3))
    raise ValueError(f"stop scale {scale!r}: expected one of {', '.join(STOP_SCALES)}")


def sequential_stop(
    scores: Sequence[float],
    halfwidth: float,
    min_episodes: int,
    round_size: int,
    confidence: float = DEFAULT_CONFIDENCE,
    scale: str = "score",
) -> int:
    """How many of ``scores`` (rollout scores in the order they ran) a sequential evaluation uses:
    the first multiple of ``round_size`` (or the end) at which at least ``min_episodes`` have run and
    the score interval (:func:`mean_interval`) is at most ``2 * halfwidth`` wide on ``scale``
    (:func:`interval_width`: ``"score"``, or ``"log-gap"``, where the laws are fitted: a low score
    is then known well enough sooner than a high one); ``len(scores)`` when it never narrows that far.

    The same rule decides when :func:`evaluate` stops, so applying it to a fixed allocation's
    recorded rollouts gives exactly what the sequential evaluation would have run (the rollouts are
    seeded by their index, whatever runs after them).
    """
    interval_width(0.0, 0.0, scale)  # an unknown scale fails before any rollout is judged
    scores = list(scores)
    n = 0
    while n < len(scores):
        n = min(len(scores), n + max(1, round_size))
        if n < min_episodes:
            continue
        low, high = mean_interval(scores[:n], confidence)
        if interval_width(low, high, scale) <= 2 * halfwidth:
            return n
    return len(scores)


def _round_robin_jobs(
    pairs: list[tuple[int, int]], episodes: int, seed: int, video_episodes: int
) -> list[RolloutJob]:
    """Rollout i runs on pair ``i % n_pairs``, its ``i // n_pairs``-th episode; the first
    ``video_episodes`` rollouts are filmed."""
    jobs = []
    for index in range(episodes):
        e, o = pairs[index % len(pairs)]
        episode = index // len(pairs)
        jobs.append(RolloutJob(index, e, o, _rollout_seed(seed, e, o, episode), index < video_episodes))
    return jobs
