"""Asynchronous hierarchical execution of a policy: slow module, fast module and control loop in threads.

A policy splits into a **slow** module (observation encoder, and the waypoint head when present:
observation window -> condition) and a **fast** module (the diffusion action head: condition + latest
observation window -> action chunk). In ``async`` mode each runs in its own thread and publishes to a
latest-value buffer; the control loop (the caller's thread) keeps stepping the environment with the
newest chunk, indexed by how many control steps have passed since the observation it was computed
from, while the next chunk is being computed. It waits only when no chunk covers the current step.
In ``sync`` mode the loop runs slow then fast inline every ``n_action_steps`` steps (the usual
receding-horizon execution), which is the baseline the benchmark compares against.

Works with every policy family: the slow/fast interface ``encode(obs) -> condition`` and
``act_from_condition(condition, obs, steps, generator) -> chunk`` is part of the family contract
(:mod:`demoscale.policies.base`), with or without a waypoint head. An episode ends after ``n_steps`` control steps or as soon as the environment reports success
(as in ``demoscale.eval.evaluate``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch


class SteppableEnv(Protocol):
    """What the executor drives: ``reset(seed) -> obs`` and ``step(action) -> obs`` (store keys)."""

    def reset(self, seed: int) -> dict[str, np.ndarray]: ...

    def step(self, action: np.ndarray) -> dict[str, np.ndarray]: ...


class LatestValue:
    """A thread-safe single-slot buffer: writers replace the value, readers wait for a newer one."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._value: Any = None
        self._version = 0
        self._closed = False

    def put(self, value: Any) -> None:
        with self._condition:
            self._value = value
            self._version += 1
            self._condition.notify_all()

    def get(self) -> tuple[int, Any]:
        with self._condition:
            return self._version, self._value

    def wait_newer(self, version: int, timeout: float | None = None) -> tuple[int, Any]:
        """Block until the version exceeds ``version`` (or the buffer is closed / the timeout passes)."""
        with self._condition:
            self._condition.wait_for(lambda: self._version > version or self._closed, timeout)
            return self._version, self._value

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


@dataclass
class ExecutionResult:
    """What one executed episode measured.

    Attributes:
        mode: ``async`` or ``sync``.
        steps: control steps executed (fewer than asked when the episode succeeded early);
            wall_time_s: their wall time.
        control_rate_hz: steps / wall time.
        step_period_s: per-step wall times of the control loop.
        chunks: action chunks computed; slow_updates: conditions computed by the slow module.
        stalls: control steps that had to wait for a chunk (no chunk covered the step).
        success: ``env.success()`` at the end (the episode stops at the first success), when the
            environment has it.
    """

    mode: str
    steps: int
    wall_time_s: float
    control_rate_hz: float
    step_period_s: list[float] = field(default_factory=list)
    chunks: int = 0
    slow_updates: int = 0
    stalls: int = 0
    success: bool | None = None


def split_policy(
    policy: Any,
) -> tuple[
    Callable[[dict[str, torch.Tensor]], Any],
    Callable[[Any, dict[str, torch.Tensor], torch.Generator], torch.Tensor],
]:
    """(slow, fast) callables of a loaded :class:`~demoscale.policies.inference.Policy`.

    ``slow(obs) -> condition``; ``fast(condition, obs, generator) -> (1, horizon, action_dim)``.
    """
    network = policy.network
    steps = policy.num_inference_steps

    def fast(condition: Any, obs: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        return network.act_from_condition(condition, obs, steps, generator)

    return network.encode, fast


class ObservationHistory:
    """Keeps the last frames of each observed key and builds the policy's observation window."""

    def __init__(self, obs_offsets: Mapping[str, list[int]]):
        self.obs_offsets = {key: list(offsets) for key, offsets in obs_offsets.items()}
        depth = max(-min(offsets) for offsets in self.obs_offsets.values()) + 1
        self.frames: deque[dict[str, np.ndarray]] = deque(maxlen=depth)

    def reset(self) -> None:
        self.frames.clear()

    def push(self, obs: Mapping[str, np.ndarray]) -> None:
        self.frames.append({key: np.asarray(obs[key]) for key in self.obs_offsets})

    def window(self) -> dict[str, np.ndarray]:
        """key -> (n_offsets, *shape); frames before the first repeat it (as the sampler pads)."""
        frames = list(self.frames)
        out = {}
        for key, offsets in self.obs_offsets.items():
            out[key] = np.stack([frames[max(0, len(frames) - 1 + offset)][key] for offset in offsets])
        return out


class HierarchicalExecutor:
    """Run a loaded policy on an environment, synchronously or with slow/fast threads.

    Args:
        policy: a :class:`~demoscale.policies.inference.Policy` (``load_policy``).
        mode: ``async`` (threads + latest-value buffers) or ``sync`` (inline, every n_action_steps).
        n_action_steps: actions executed per chunk in sync mode (default: the policy's).
        replan_every: async: the fast module computes a new chunk once this many control steps have
            passed since the newest chunk's observation (default: half of n_action_steps).
        slow_every: async: the slow module recomputes its condition every this many control steps
            (default: n_action_steps); the fast module always reads the latest condition.
        control_period_s: hold the control loop to this period (0: as fast as it goes).
        seed: seed of the denoising noise.
    """

    def __init__(
        self,
        policy: Any,
        mode: Literal["async", "sync"] = "async",
        n_action_steps: int | None = None,
        control_period_s: float = 0.0,
        seed: int = 0,
        replan_every: int | None = None,
        slow_every: int | None = None,
    ):
        if mode not in ("async", "sync"):
            raise ValueError(f"executor mode must be 'async' or 'sync', got {mode!r}")
        self.policy = policy
        self.mode = mode
        self.n_action_steps = int(n_action_steps or policy.n_action_steps)
        self.control_period_s = float(control_period_s)
        self.replan_every = int(replan_every or max(1, self.n_action_steps // 2))
        self.slow_every = int(slow_every or self.n_action_steps)
        if not 1 <= self.replan_every <= policy.horizon:
            raise ValueError(f"replan_every must be in 1..horizon={policy.horizon}, got {self.replan_every}")
        self.seed = seed
        self.slow, self.fast = split_policy(policy)
        self.history = ObservationHistory(policy.obs_offsets)

    def _tensors(self, window: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return self.policy._to_tensors(window, batched=False)

    def run(self, env: SteppableEnv, n_steps: int, seed: int = 0) -> ExecutionResult:
        """Execute one episode from ``env.reset(seed)``: up to ``n_steps`` control steps, fewer when the
        environment reports success (``env.success()``) earlier."""
        self.history.reset()
        self.history.push(env.reset(seed))
        generator = torch.Generator().manual_seed(self.seed)
        success = getattr(env, "success", None)
        succeeded = success if callable(success) else lambda: False
        with torch.inference_mode():
            if self.mode == "sync":
                result = self._run_sync(env, n_steps, generator, succeeded)
            else:
                result = self._run_async(env, n_steps, generator, succeeded)
        result.success = bool(success()) if callable(success) else None
        return result

    def _tick(self, started: float, periods: list[float]) -> float:
        if self.control_period_s > 0:
            remaining = self.control_period_s - (time.perf_counter() - started)
            if remaining > 0:
                time.sleep(remaining)
        now = time.perf_counter()
        periods.append(now - started)
        return now

    def _run_sync(
        self, env: SteppableEnv, n_steps: int, generator: torch.Generator, succeeded: Callable[[], bool]
    ) -> ExecutionResult:
        periods: list[float] = []
        chunk, chunk_start, chunks = None, 0, 0
        begin = last = time.perf_counter()
        executed = 0
        for step in range(n_steps):
            if chunk is None or step - chunk_start >= self.n_action_steps:
                obs = self._tensors(self.history.window())
                chunk = self.fast(self.slow(obs), obs, generator)[0].float().cpu().numpy()
                chunk_start, chunks = step, chunks + 1
            self.history.push(env.step(chunk[step - chunk_start]))
            last = self._tick(last, periods)
            executed += 1
            if succeeded():
                break
        wall = time.perf_counter() - begin
        return ExecutionResult(
            "sync", executed, wall, executed / wall, periods, chunks=chunks, slow_updates=chunks
        )

    def _run_async(
        self, env: SteppableEnv, n_steps: int, generator: torch.Generator, succeeded: Callable[[], bool]
    ) -> ExecutionResult:
        observations, conditions, chunks = LatestValue(), LatestValue(), LatestValue()
        errors: list[BaseException] = []
        counts = {"slow": 0, "fast": 0}

        def guarded(loop: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    with torch.inference_mode():
                        loop()
                except BaseException as error:  # surfaced in the control loop
                    errors.append(error)
                    for buffer in (observations, conditions, chunks):
                        buffer.close()

            return run

        def slow_loop() -> None:
            seen, last_step = 0, None
            while not observations.closed:
                seen, value = observations.wait_newer(seen)
                if observations.closed:
                    return
                step, window = value
                if last_step is not None and step - last_step < self.slow_every:
                    continue
                conditions.put((step, self.slow(self._tensors(window))))
                counts["slow"] += 1
                last_step = step

        def fast_loop() -> None:
            conditions.wait_newer(0)  # the first condition
            seen, last_step = 0, None
            while not observations.closed:
                seen, value = observations.wait_newer(seen)
                if observations.closed:
                    return
                step, window = value
                # Replan once part of the newest chunk has been executed; the control loop keeps
                # executing its remaining actions meanwhile (it stalls only past the chunk's end).
                if last_step is not None and step - last_step < self.replan_every:
                    continue
                _, (_, condition) = conditions.get()
                chunk = self.fast(condition, self._tensors(window), generator)[0].float().cpu().numpy()
                chunks.put((step, chunk))
                counts["fast"] += 1
                last_step = step

        threads = [threading.Thread(target=guarded(loop), daemon=True) for loop in (slow_loop, fast_loop)]
        for thread in threads:
            thread.start()
        periods: list[float] = []
        stalls, executed = 0, 0
        begin = last = time.perf_counter()
        try:
            observations.put((0, self.history.window()))
            version = 0
            for step in range(n_steps):
                version, value = chunks.get()
                while value is None or step - value[0] >= len(value[1]):
                    stalls += 1
                    version, value = chunks.wait_newer(version, timeout=60.0)
                    if errors:
                        raise RuntimeError("executor thread failed") from errors[0]
                    if chunks.closed:
                        raise RuntimeError("executor stopped")
                chunk_start, chunk = value
                self.history.push(env.step(chunk[step - chunk_start]))
                observations.put((step + 1, self.history.window()))
                last = self._tick(last, periods)
                executed += 1
                if succeeded():
                    break
        finally:
            for buffer in (observations, conditions, chunks):
                buffer.close()
            for thread in threads:
                thread.join(timeout=60.0)
        if errors:
            raise RuntimeError("executor thread failed") from errors[0]
        wall = time.perf_counter() - begin
        return ExecutionResult(
            "async",
            executed,
            wall,
            executed / wall,
            periods,
            chunks=counts["fast"],
            slow_updates=counts["slow"],
            stalls=stalls,
        )


class ReplayEnv:
    """An environment that replays the observations of one stored episode and records the actions.

    Useful to run the executor without a simulator (timing, wiring); ``step_cost_s`` adds a sleep
    per step standing in for the time the hardware takes to execute an action.
    """

    def __init__(self, store: Any, episode: int = 0, step_cost_s: float = 0.0):
        from demoscale.datasets import EpisodeStore

        self.store = store if isinstance(store, EpisodeStore) else EpisodeStore.open(store)
        self.frames = self.store.episode(episode)
        self.length = len(next(iter(self.frames.values())))
        self.step_cost_s = step_cost_s
        self.actions: list[np.ndarray] = []
        self._t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {key: values[min(self._t, self.length - 1)] for key, values in self.frames.items()}

    def reset(self, seed: int = 0) -> dict[str, np.ndarray]:
        self._t = 0
        self.actions = []
        return self._obs()

    def step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        if self.step_cost_s > 0:
            time.sleep(self.step_cost_s)
        self.actions.append(np.asarray(action))
        self._t += 1
        return self._obs()
