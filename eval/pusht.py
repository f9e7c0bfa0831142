"""PushT in ``gym-pusht``, observed exactly as the diffusion-policy replay buffer recorded it.

A policy trained on the ingested PushT replay buffer sees ``img`` (96x96x3 uint8, the rendered
512x512 workspace resized) and ``state`` (5: agent x, agent y, block x, block y, block angle in
[0, 2 pi)) and commands ``action`` (2: the agent's target position in the 512x512 workspace) at
10 Hz. Success is the task's own: coverage of the green goal T by the block >= 95%. The score is
staged on the best coverage reached (stages at 25/50/75/95%), so it rises smoothly with quality.
Beside it, each rollout reports the Diffusion Policy paper's measure (``max_coverage``: the
episode's maximum of ``min(coverage / 0.95, 1)``; averaged over rollouts, "mean max coverage")
and the raw maximum coverage; ``demoscale eval --task pusht`` rolls out 50 unseen initial states
by default, 300 steps each.

Ids: PushT has a single scene and object; the environment id seeds the block's random initial
pose (train and unseen ids come from the usual ranges, so they draw different initial poses); the
object id only has to be a valid id. Given the replay buffer (``replay_path``), training id k
instead starts from the initial state of recorded human episode k, and :meth:`PushTEnv.expert`
replays that episode's actions - a pipeline check that needs no learned policy.

Note on resets: the recorded block position is the pymunk body origin *after* its angle was set,
so a recorded state is restored by setting the angle first, then the position (gym-pusht's own
``reset_to_state`` applies them in the other order and shifts the block).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from demoscale.eval.ids import check_id, split_of
from demoscale.eval.tasks import TaskDefinition

SUCCESS_COVERAGE = 0.95
STAGE_COVERAGES = (0.25, 0.5, 0.75, SUCCESS_COVERAGE)
MAX_STEPS = 300
WORKSPACE = 512.0


class ReplayEpisodes:
    """Initial states and actions of the human episodes in a PushT replay buffer (dir or .zip)."""

    def __init__(self, path: str | os.PathLike) -> None:
        import zarr

        self.path = Path(path)
        if str(self.path).endswith(".zip"):
            store = zarr.storage.ZipStore(self.path, mode="r")
            root = zarr.open_group(store, mode="r")
        else:
            root = zarr.open_group(str(self.path), mode="r")
        try:
            self.episode_ends = np.asarray(root["meta/episode_ends"][:], np.int64)
            self.state = np.asarray(root["data/state"][:], np.float64)
            self.action = np.asarray(root["data/action"][:], np.float64)
        except KeyError as error:
            raise KeyError(f"{self.path}: not a PushT replay buffer (missing {error})") from error

    def __len__(self) -> int:
        return len(self.episode_ends)

    def bounds(self, episode: int) -> tuple[int, int]:
        if not 0 <= episode < len(self):
            raise IndexError(f"{self.path}: episode {episode} outside 0..{len(self) - 1}")
        start = 0 if episode == 0 else int(self.episode_ends[episode - 1])
        return start, int(self.episode_ends[episode])

    def initial_state(self, episode: int) -> np.ndarray:
        return self.state[self.bounds(episode)[0]]

    def actions(self, episode: int) -> np.ndarray:
        start, stop = self.bounds(episode)
        return self.action[start:stop]


@functools.lru_cache(maxsize=4)
def _load_replay_cached(resolved: str) -> ReplayEpisodes:
    return ReplayEpisodes(resolved)


def load_replay(path: str | os.PathLike) -> ReplayEpisodes:
    """:class:`ReplayEpisodes` of ``path``, read once per process (evaluation makes many envs)."""
    return _load_replay_cached(str(Path(path).resolve()))


class ReplayExpert:
    """Replays a recorded episode's actions, then holds the last one."""

    def __init__(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions, np.float64)
        self.t = 0
        self.done = False

    def act(self, obs: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        action = self.actions[min(self.t, len(self.actions) - 1)]
        self.t += 1
        self.done = self.t >= len(self.actions)
        return action.copy()


class PushTEnv:
    """gym-pusht behind the task interface of :mod:`demoscale.eval.tasks` (``img``/``state`` obs)."""

    task = "pusht"
    n_stages = len(STAGE_COVERAGES)
    action_dim = 2

    def __init__(
        self,
        env_id: int,
        object_id: int = 0,
        image_size: int = 96,
        replay_path: str | os.PathLike | None = None,
        max_steps: int = MAX_STEPS,
        images: bool = True,
    ) -> None:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        import gym_pusht.envs.pusht as pusht_module

        self.env_id = check_id(env_id, "environment id")
        self.object_id = check_id(object_id, "object id")
        self.max_steps = int(max_steps)
        self.image_size = int(image_size)
        self.images = bool(images)
        self._gym = pusht_module.PushTEnv(
            obs_type="state",
            render_mode="rgb_array",
            observation_width=self.image_size,
            observation_height=self.image_size,
        )
        self.replay = load_replay(replay_path) if replay_path is not None else None
        self.replay_episode: int | None = None
        if self.replay is not None and split_of(self.env_id) == "train":
            if self.env_id >= len(self.replay):
                raise ValueError(
                    f"environment id {self.env_id}: {self.replay.path} has only {len(self.replay)} episodes "
                    f"(training ids 0..{len(self.replay) - 1} start from recorded states)"
                )
            self.replay_episode = self.env_id
        self.steps = 0
        self.coverage = 0.0
        self.max_coverage = 0.0

    def _initial_state(self, seed: int) -> np.ndarray:
        if self.replay_episode is not None:
            return self.replay.initial_state(self.replay_episode)
        # The same distribution as gym-pusht's own reset, drawn from (env id, seed).
        rng = np.random.default_rng([self.env_id, self.object_id, int(seed), 5151])
        return np.array(
            [
                rng.integers(50, 450),
                rng.integers(50, 450),
                rng.integers(100, 400),
                rng.integers(100, 400),
                rng.uniform(-np.pi, np.pi),
            ],
            np.float64,
        )

    def set_state(self, state: Sequence[float]) -> None:
        """Put the agent and block at a recorded ``state`` (see the module note on the order)."""
        gym = self._gym
        state = np.asarray(state, np.float64)
        gym._setup()  # a fresh space: no contacts cached from the previous state
        gym.agent.position = [float(state[0]), float(state[1])]
        gym.block.angle = float(state[4])
        gym.block.position = [float(state[2]), float(state[3])]
        gym.space.step(gym.dt)

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Start an episode from the initial state chosen by the ids and ``seed``."""
        self._gym.reset(seed=int(seed))
        self.set_state(self._initial_state(seed))
        self.steps = 0
        self.coverage = self.max_coverage = float(self._gym._get_coverage())
        return self.observe()

    def observe(self) -> dict[str, np.ndarray]:
        """``img`` (uint8 HxWx3; unless made with ``images=False``) and ``state`` (float32, 5) as in
        the replay buffer."""
        state = np.asarray(self._gym.get_obs(), np.float32)  # obs_type "state": the recorded layout
        if not self.images:  # drawing the frame is most of a step's cost; state policies skip it
            return {"state": state}
        return {"img": np.ascontiguousarray(self._gym._render(), np.uint8), "state": state}

    def step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        """Move the agent's target to ``action`` (x, y in the 512x512 workspace) for 0.1 s."""
        action = np.asarray(action, np.float64).reshape(-1)
        if action.shape != (2,) or not np.all(np.isfinite(action)):
            raise ValueError(f"pusht expects a finite action of shape (2,), got {action.shape}")
        _, _, _, _, info = self._gym.step(np.clip(action, 0.0, WORKSPACE))
        self.steps += 1
        self.coverage = float(info["coverage"])
        self.max_coverage = max(self.max_coverage, self.coverage)
        return self.observe()

    def stages(self) -> list[bool]:
        """Whether the best coverage so far reached 25/50/75/95%."""
        return [self.max_coverage >= threshold for threshold in STAGE_COVERAGES]

    def stage_score(self) -> int:
        return int(sum(self.stages()))

    def success(self) -> bool:
        """Coverage of the goal by the block >= 95% now."""
        return self.coverage >= SUCCESS_COVERAGE

    def metrics(self) -> dict[str, float]:
        """The literature's measures of this episode so far.

        ``max_coverage``: the Diffusion Policy paper's per-rollout metric, the maximum over the
        episode of ``min(coverage / 0.95, 1)`` (its mean over rollouts is the paper's "mean max
        coverage"); ``raw_max_coverage``: the maximum coverage itself. Success (coverage >= 0.95 at
        any step, as LeRobot reports it) is :meth:`success` at the step a rollout ends on, since a
        rollout ends at its first success.
        """
        return {
            "max_coverage": min(self.max_coverage / SUCCESS_COVERAGE, 1.0),
            "raw_max_coverage": self.max_coverage,
        }

    def expert(self, seed: int) -> ReplayExpert:
        """Replays the recorded human episode this environment started from (needs ``replay_path``
        and a training id below the number of recorded episodes)."""
        if self.replay_episode is None:
            raise ValueError(
                "the pusht expert replays recorded human episodes: make the env with replay_path=... "
                "and a training environment id below the number of recorded episodes"
            )
        return ReplayExpert(self.replay.actions(self.replay_episode))

    def render(self) -> np.ndarray:
        """The observation image (uint8)."""
        return np.ascontiguousarray(self._gym._render(), np.uint8)

    def close(self) -> None:
        self._gym.close()


def make_pusht_env(env_id: int, object_id: int = 0, image_size: int = 96, **options) -> PushTEnv:
    """A PushT environment; ``options``: ``replay_path``, ``max_steps``, ``images``."""
    unknown = set(options) - {"replay_path", "max_steps", "images"}
    if unknown:
        raise TypeError(f"unknown pusht options {sorted(unknown)}; expected replay_path, max_steps, images")
    return PushTEnv(env_id, object_id, image_size=image_size, **options)


def _no_writer(directory: Path, episodes: Sequence[Mapping[str, np.ndarray]], rate_hz: float) -> list[Path]:
    raise NotImplementedError(
        "pusht demonstrations come from the recorded human replay buffer; ingest it with "
        "`demoscale ingest replay-buffer`"
    )


PUSHT = TaskDefinition(
    name="pusht",
    family="pusht",
    make_env=make_pusht_env,
    write_demos=_no_writer,
    low_dim_features={"state": (5,)},
    image_keys=("img",),
    action_dim=2,
    max_steps=MAX_STEPS,
    n_stages=len(STAGE_COVERAGES),
    description="push the T block onto the green goal (gym-pusht; success = coverage >= 95%)",
    metrics=("max_coverage", "raw_max_coverage"),
    images_optional=True,
    # 50 initial states from the unseen range, one rollout each, as the literature evaluates PushT.
    eval_envs=50,
    source_format="replay-buffer",
    extras={"success_coverage": SUCCESS_COVERAGE},
)
