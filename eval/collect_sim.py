"""Scripted demonstrations in simulation, written in the task family's raw source format.

The simulator "collects" the way hardware would: each (environment, object) pair's demonstrations
go to ``<out_dir>/<task>/env_<i>/object_<j>/`` (for tabletop tasks one UMI ``dataset.zarr.zip``
holding the pair's demos, plus the Data-Scaling-Laws ``count.txt``), and ``demoscale ingest``
brings them into a store from there, reading env/object ids from the directory layout.

By default only successful expert demonstrations are kept (an expert that fails is retried with a
new episode seed, up to ``max_attempts_per_demo`` times per demo); ``keep_failed=True`` keeps every
attempted episode instead.

``action_noise`` > 0 injects noise into the demonstrations, as DART does (Laskey et al., 2017): the
robot executes the expert's command plus Gaussian noise (in action units; one standard deviation for
every dimension, or one per dimension). A policy trained on such demos has seen states off the
expert's path and the way back, which is what its own small errors lead it into in closed loop.
How far off depends on the expert: one that reads the simulator's state (the whole-body experts'
base driving) corrects from wherever the noise left it, so errors can build up before they are
corrected; one that follows its own planned path of absolute targets (the tabletop experts, the
whole-body joints) is put back on the path by its next command, so the demos stay within one noise
draw of it. A format that records the commands (JoyLo) keeps the expert's clean command as the
label; one whose actions are the next recorded pose (UMI) labels the executed, noisy motion.
``noise_phases`` injects the noise only while the expert is in one of the named phases (its
``phase`` attribute: the whole-body experts' ``drive``, ``reach``, ``gripper``, ``hold``, ``tuck``;
the tabletop experts' ``approach``, ``push``, ``close``, ...), e.g. off the path while the base
drives and on it while the hand touches.

``expert_options`` go to the task's expert (``env.expert(seed, **expert_options)``): the
whole-body experts take the half-widths of where their base stops at the shelf (``standoff_range``,
``lateral_range``, ``yaw_range``), so demonstrations can reach from the spread of places a
policy's own base stops at, not only from the expert's own few centimetres.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.eval.ids import env_ids, object_ids, pair_ids
from demoscale.eval.tasks import capture_sources, get_task


@dataclass
class PairResult:
    """What one (environment, object) pair produced."""

    env_id: int
    object_id: int
    directory: str
    demos: int
    attempts: int
    successes: int
    frames: int
    files: list[str] = field(default_factory=list)


@dataclass
class CollectResult:
    """Summary of a :func:`collect_sim` run."""

    task: str
    out_dir: str
    pairs: list[PairResult]

    @property
    def n_demos(self) -> int:
        return sum(p.demos for p in self.pairs)

    @property
    def expert_success_rate(self) -> float:
        attempts = sum(p.attempts for p in self.pairs)
        return sum(p.successes for p in self.pairs) / attempts if attempts else float("nan")


def make_expert(env, seed: int, expert_options: Mapping[str, Any] | None = None):
    """``env.expert(seed, **expert_options)``; options the task's expert does not take are refused
    by name (ValueError)."""
    if not expert_options:
        return env.expert(seed)
    try:
        return env.expert(seed, **expert_options)
    except TypeError as error:
        raise ValueError(
            f"expert_options {sorted(expert_options)}: the {env.task} expert does not take them ({error})"
        ) from None


def check_expert_options(
    task: str,
    expert_options: Mapping[str, Any],
    env_id: int = 0,
    object_id: int = 0,
    image_size: int = 96,
    env_options: Mapping[str, Any] | None = None,
) -> None:
    """Raise ValueError unless ``task``'s expert takes ``expert_options`` (names and values), by
    building it once on one pair."""
    env = get_task(task).make_env(env_id, object_id, image_size=image_size, **(env_options or {}))
    try:
        env.reset(0)
        make_expert(env, 0, expert_options)
    finally:
        env.close()


def run_expert_episode(
    env,
    seed: int,
    action_noise: float | Sequence[float] = 0.0,
    noise_phases: Sequence[str] | None = None,
    expert_options: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], bool]:
    """Run the scripted expert for one episode; returns (time-major observations + ``action``, success).

    Frames are the observations before every action plus the final one; the expert's commanded
    actions are returned under ``action`` (the last frame repeats the last command). With
    ``action_noise`` > 0 (one standard deviation for every action dimension, or one per dimension)
    the environment executes each command plus Gaussian noise (drawn from ``seed``), and ``action``
    still holds the commands (see the module docstring). ``noise_phases`` restricts the noise to the
    steps whose action the expert made in one of these phases (its ``phase`` attribute, e.g. the
    whole-body experts' ``"drive"``); experts without one raise ValueError. ``expert_options`` go to
    ``env.expert`` (see the module docstring).
    """
    scale = noise_scale(action_noise)
    phases = None if noise_phases is None else set(noise_phases)
    noise = np.random.default_rng([int(seed), 0x0DA127])
    obs = env.reset(seed)
    expert = make_expert(env, seed, expert_options)
    if phases is not None and not hasattr(expert, "phase"):
        raise ValueError(
            f"noise_phases {sorted(phases)} needs an expert that reports its phase; "
            f"{type(expert).__name__} does not (the whole-body and tabletop experts do)"
        )
    frames = [obs]
    actions = []
    for _ in range(env.max_steps):
        action = expert.act(obs)
        if scale is None or (phases is not None and expert.phase not in phases):
            executed = action
        elif scale.size not in (1, np.size(action)):
            raise ValueError(
                f"action_noise has {scale.size} standard deviations; the action has {np.size(action)} dimensions"
            )
        else:
            executed = action + noise.normal(0.0, 1.0, np.shape(action)) * scale
        obs = env.step(executed)
        frames.append(obs)
        actions.append(np.asarray(action, dtype=np.float32))
        if getattr(expert, "done", False):
            break
    actions.append(actions[-1])
    episode = {key: np.stack([frame[key] for frame in frames]) for key in frames[0]}
    episode["action"] = np.stack(actions)
    return episode, bool(env.success())


def noise_scale(action_noise: float | Sequence[float]) -> np.ndarray | None:
    """``action_noise`` as an array of standard deviations (``None`` when it is all zero)."""
    scale = np.atleast_1d(np.asarray(action_noise, dtype=float))
    if scale.ndim != 1 or not np.isfinite(scale).all() or (scale < 0).any():
        raise ValueError(
            f"action_noise must be >= 0 (one value or one per action dimension), got {action_noise}"
        )
    return scale if scale.any() else None


def _pair_seed(seed: int, env_id: int, object_id: int, attempt: int) -> int:
    return int(np.random.default_rng([int(seed), env_id, object_id, attempt]).integers(0, 2**31 - 1))


def collect_pair(
    task: str,
    env_id: int,
    object_id: int,
    demos: int,
    out_dir: str | os.PathLike,
    seed: int = 0,
    image_size: int = 96,
    keep_failed: bool = False,
    max_attempts_per_demo: int = 3,
    env_options: dict | None = None,
    action_noise: float | Sequence[float] = 0.0,
    noise_phases: Sequence[str] | None = None,
    expert_options: Mapping[str, Any] | None = None,
) -> PairResult:
    """Collect ``demos`` demonstrations of one pair and write them in the task's raw format
    (``action_noise``, ``noise_phases``, ``expert_options``: see the module docstring and
    :func:`run_expert_episode`)."""
    definition = get_task(task)
    env = definition.make_env(env_id, object_id, image_size=image_size, **(env_options or {}))
    episodes, attempts, successes = [], 0, 0
    # What rendered each image key travels with the files, so a policy trained on them is later
    # evaluated with the same camera, image size and options (demoscale eval CHECKPOINT).
    capture = capture_sources(env, definition.name, image_size, env_options)
    try:
        while len(episodes) < demos and attempts < demos * max_attempts_per_demo:
            episode, success = run_expert_episode(
                env, _pair_seed(seed, env_id, object_id, attempts), action_noise, noise_phases, expert_options
            )
            attempts += 1
            successes += success
            if success or keep_failed:
                episodes.append(episode)
    finally:
        env.close()
    directory = Path(out_dir) / task / f"env_{env_id}" / f"object_{object_id}"
    files: list[Path] = []
    if episodes:
        directory.mkdir(parents=True, exist_ok=True)
        if capture:
            files = definition.write_demos(directory, episodes, definition.rate_hz, capture=capture)
        else:
            files = definition.write_demos(directory, episodes, definition.rate_hz)
        (directory / "count.txt").write_text(f"{len(episodes)}\n")
    return PairResult(
        env_id=env_id,
        object_id=object_id,
        directory=str(directory),
        demos=len(episodes),
        attempts=attempts,
        successes=successes,
        frames=sum(len(e["action"]) for e in episodes),
        files=[str(f) for f in files],
    )


def _collect_pair_star(kwargs: dict) -> PairResult:
    return collect_pair(**kwargs)


def collect_sim(
    task: str,
    n_envs: int,
    n_objects: int,
    demos_per_pair: int,
    out_dir: str | os.PathLike,
    workers: int = 1,
    split: str = "train",
    seed: int = 0,
    image_size: int = 96,
    keep_failed: bool = False,
    env_offset: int = 0,
    object_offset: int = 0,
    env_options: dict | None = None,
    progress: bool = True,
    pairing: str = "grid",
    action_noise: float | Sequence[float] = 0.0,
    noise_phases: Sequence[str] | None = None,
    expert_options: Mapping[str, Any] | None = None,
) -> CollectResult:
    """Collect scripted demos on the first ``n_envs`` x ``n_objects`` ids of ``split``.

    Writes ``<out_dir>/<task>/env_<i>/object_<j>/`` per pair (see the module docstring) and returns
    a :class:`CollectResult`. Only successful demos are kept unless ``keep_failed``. ``workers`` > 1
    collects pairs in parallel processes. ``env_options`` go to the task's ``make_env`` (for
    tabletop tasks, e.g. ``{"cameras": ["scene"]}``).
    ``pairing="grid"`` collects every environment x object pair; ``pairing="unique"`` gives each
    environment its own object (pair k = environment k, object k; needs ``n_envs == n_objects``),
    the data-scaling-laws study's recommended layout. ``action_noise`` > 0 perturbs every executed
    expert command by Gaussian noise of that standard deviation (DART; see the module docstring),
    in every step or, with ``noise_phases``, only while the expert is in one of those phases.
    ``expert_options`` go to the task's expert (checked on the first pair before anything runs).
    """
    from tqdm.auto import tqdm

    definition = get_task(task)  # unknown task: error before anything runs
    if min(n_envs, n_objects, demos_per_pair) < 1:
        raise ValueError("n_envs, n_objects and demos_per_pair must all be >= 1")
    scale = noise_scale(action_noise)
    if scale is not None and scale.size not in (1, definition.action_dim):
        raise ValueError(
            f"action_noise has {scale.size} standard deviations; {task} actions have {definition.action_dim} dimensions"
        )
    envs = env_ids(split, n_envs + env_offset)[env_offset:]
    objects = object_ids(split, n_objects + object_offset)[object_offset:]
    pairs = pair_ids(envs, objects, pairing)
    jobs = [
        dict(
            task=definition.name,
            env_id=e,
            object_id=o,
            demos=demos_per_pair,
            out_dir=str(out_dir),
            seed=seed,
            image_size=image_size,
            keep_failed=keep_failed,
            env_options=env_options,
            action_noise=action_noise,
            noise_phases=list(noise_phases) if noise_phases is not None else None,
            expert_options=dict(expert_options) if expert_options else None,
        )
        for e, o in pairs
    ]
    if expert_options:  # a wrong option: said now, not once per worker after the pool started
        check_expert_options(definition.name, expert_options, *pairs[0], image_size, env_options)
    results: list[PairResult] = []
    bar = tqdm(total=len(jobs) * demos_per_pair, desc=f"collect {task}", unit="demo", disable=not progress)
    if workers <= 1:
        for job in jobs:
            results.append(collect_pair(**job))
            bar.update(demos_per_pair)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for result in pool.map(_collect_pair_star, jobs):
                results.append(result)
                bar.update(demos_per_pair)
    bar.close()
    short = [r for r in results if r.demos < demos_per_pair]
    if short:
        listed = ", ".join(f"env {r.env_id}/object {r.object_id}: {r.demos}" for r in short[:5])
        print(f"warning: {len(short)} pair(s) got fewer than {demos_per_pair} successful demos ({listed})")
    return CollectResult(task=definition.name, out_dir=str(out_dir), pairs=results)


def summary_lines(result: CollectResult, envs: Sequence[int] | None = None) -> list[str]:
    """Human-readable lines describing a collection."""
    return [
        f"task {result.task}: {result.n_demos} demos in {len(result.pairs)} pairs under {result.out_dir}",
        f"expert success rate {result.expert_success_rate:.3f} "
        f"({sum(p.successes for p in result.pairs)}/{sum(p.attempts for p in result.pairs)} attempts)",
    ]
