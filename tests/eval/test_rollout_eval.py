"""Rollout evaluation: tables, summaries with Wilson intervals, videos, policies and spec checks."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from demoscale import DEFAULT_CONFIDENCE
from demoscale.eval import evaluate, wilson_interval
from demoscale.eval.cli import main as eval_main
from demoscale.eval.rollout import SpecMismatchError, mean_interval


def _wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


# Reference values from statsmodels' proportion_confint(k, n, alpha=0.05, method="wilson").
WILSON_REFERENCE = {
    (0, 10): (0.0, 0.27753279986288926),
    (7, 8): (0.5291118177871466, 0.9775825085499434),
    (50, 100): (0.4038315303659956, 0.5961684696340044),
    (10, 10): (0.7224672001371106, 1.0),
}


@pytest.mark.parametrize(("k", "n"), sorted(WILSON_REFERENCE))
def test_wilson_interval_math(k: int, n: int) -> None:
    low, high = wilson_interval(k, n, confidence=0.95)
    assert (low, high) == pytest.approx(WILSON_REFERENCE[(k, n)], abs=1e-12)
    assert (low, high) == pytest.approx(_wilson_by_hand(k, n), abs=1e-9)
    assert 0 <= low <= k / n <= high <= 1
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


@pytest.mark.parametrize("outcome", [0.0, 1.0, 0.5])
def test_score_interval_keeps_its_width_when_every_rollout_agrees(outcome: float) -> None:
    """A t interval collapses to a point for 60 identical scores; the bounded-score interval does not."""
    low, high = mean_interval([outcome] * 60)
    assert low < high and low <= outcome <= high
    assert (low, high) == pytest.approx(
        _wilson_by_hand(round(60 * outcome), 60, _z(DEFAULT_CONFIDENCE)), abs=1e-12
    )
    if outcome == 1.0:
        assert 0.94 < low < 0.97  # 60 of 60 does not prove a perfect policy


def test_score_interval_of_zero_one_scores_is_the_success_interval() -> None:
    scores = [1.0] * 7 + [0.0] * 13
    assert mean_interval(scores, 0.95) == pytest.approx(wilson_interval(7, 20, 0.95), abs=1e-12)
    # Staged scores: the Wilson interval of the summed score, as wide as a Bernoulli mean's (the
    # largest variance a [0, 1] score with that mean can have), so it never under-states the spread.
    staged = [0.25, 0.5, 0.75, 1.0, 0.0] * 4
    low, high = mean_interval(staged, 0.9)
    assert (low, high) == pytest.approx(_wilson_by_hand(10, 20, _z(0.9)), abs=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mean_interval([0.5, 1.5])


class HoldPolicy:
    """A trivial learned-policy stand-in: repeats the current pose, records the windows it is given."""

    def __init__(self, image_size: int, action_dim: int = 7) -> None:
        self.obs_offsets = {"camera0_rgb": [-2, -1, 0], "robot0_eef_pos": [-1, 0]}
        self.features = {
            "camera0_rgb": {"kind": "image", "shape": [image_size, image_size, 3]},
            "robot0_eef_pos": {"kind": "low_dim", "shape": [3]},
        }
        self.action_dim = action_dim
        self.n_action_steps = 4
        self.calls: list[dict[str, tuple]] = []

    def predict_action_batch(self, windows, seed=None) -> np.ndarray:
        self.calls.append({k: v.shape for k, v in windows.items()})
        pos = windows["robot0_eef_pos"][:, -1]
        chunk = np.concatenate([pos, np.zeros((len(pos), 3)), np.full((len(pos), 1), 0.08)], axis=1)
        return np.repeat(chunk[:, None], 8, axis=1)


def test_evaluate_expert_writes_rollouts_summary_and_videos(tmp_path) -> None:
    result = evaluate("expert", "push", split="train", n_envs=2, n_objects=1, episodes=4, out_dir=tmp_path,
                      image_size=32, video_episodes=1, progress=False)  # fmt: skip
    rollouts = pd.read_csv(tmp_path / "rollouts.csv")
    assert len(rollouts) == 4 and list(rollouts["env_id"].unique()) == [0, 1]
    for column in (
        "env_id",
        "object_id",
        "seed",
        "stage_1",
        "stage_2",
        "stage_3",
        "score",
        "success",
        "steps",
    ):
        assert column in rollouts.columns
    assert rollouts["seed"].nunique() == 4
    assert ((rollouts["score"] >= 0) & (rollouts["score"] <= 1)).all()
    assert rollouts["success"].sum() >= 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    k, n = int(rollouts["success"].sum()), len(rollouts)
    assert summary["n_rollouts"] == 4 and summary["success_rate"] == pytest.approx(k / n)
    assert summary["confidence"] == DEFAULT_CONFIDENCE
    z = _z(summary["confidence"])
    assert (summary["success_ci_low"], summary["success_ci_high"]) == pytest.approx(_wilson_by_hand(k, n, z))
    assert summary["score_ci_low"] < summary["score"] <= summary["score_ci_high"]
    assert summary["score"] == pytest.approx(rollouts["score"].mean())
    videos = list((tmp_path / "videos").iterdir())
    assert len(videos) == 1 and videos[0].stat().st_size > 1000
    assert rollouts.loc[0, "video"] == str(videos[0]) and videos[0].suffix == ".mp4"
    import av  # browsers play H.264 in yuv420p; OpenCV's default mp4v they do not

    with av.open(str(videos[0])) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
        assert sum(1 for _ in container.decode(stream)) == rollouts.loc[0, "steps"] + 1
    assert result.summary["env_ids"] == [0, 1]


def test_policy_windows_chunks_and_failures_are_scored(tmp_path) -> None:
    import torch

    policy = HoldPolicy(image_size=24)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = evaluate(policy, "push", split="unseen", n_envs=2, n_objects=1, episodes=2, max_steps=9,
                          video_episodes=0, progress=False)  # fmt: skip
        # The rollouts ran on one thread; the caller gets its two back (it may train next).
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    # Both envs are batched in one call; a new chunk every 4 steps over 9 steps -> 3 calls.
    assert len(policy.calls) == 3
    assert policy.calls[0] == {"camera0_rgb": (2, 3, 24, 24, 3), "robot0_eef_pos": (2, 2, 3)}
    rollouts = result.rollouts
    assert list(rollouts["env_id"]) == [1_000_000, 1_000_001]
    assert (rollouts["steps"] == 9).all() and not rollouts["success"].any()
    assert (rollouts["score"] == 0).all()
    assert result.summary["success_ci_low"] == 0.0


def test_unique_pairing_evaluates_each_environment_with_its_own_object() -> None:
    # The pairs collect_sim(pairing="unique") trained on: environment k with object k, not the grid.
    policy = HoldPolicy(image_size=24)
    result = evaluate(policy, "push", split="train", n_envs=3, n_objects=3, pairing="unique", max_steps=2,
                      video_episodes=0, progress=False)  # fmt: skip
    assert list(zip(result.rollouts["env_id"], result.rollouts["object_id"], strict=True)) == [
        (0, 0),
        (1, 1),
        (2, 2),
    ]
    grid = evaluate(policy, "push", split="train", n_envs=3, n_objects=3, max_steps=2, video_episodes=0,
                    progress=False)  # fmt: skip
    assert len(grid.rollouts) == 9
    with pytest.raises(ValueError, match="as many objects as environments"):
        evaluate(policy, "push", split="train", n_envs=3, n_objects=2, pairing="unique", progress=False)


def test_spec_mismatch_and_bad_inputs_fail_before_rollouts(tmp_path) -> None:
    with pytest.raises(SpecMismatchError, match=r"expects shape \(96, 96, 3\)"):
        evaluate(HoldPolicy(image_size=96), "push", n_envs=1, image_size=32, progress=False)
    with pytest.raises(SpecMismatchError, match="21-dim actions"):
        evaluate(HoldPolicy(image_size=32, action_dim=21), "push", n_envs=1, progress=False)
    with pytest.raises(KeyError, match="unknown task"):
        evaluate("expert", "stack", n_envs=1)
    with pytest.raises(ValueError, match="outside the 'unseen' split"):
        evaluate("expert", "push", n_envs=10_001)


def test_eval_cli(tmp_path, capsys) -> None:
    code = eval_main(["expert", "--task", "pick_place", "--split", "train", "--envs", "1", "--episodes", "1",
                      "--image-size", "24", "--videos", "0", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    assert "success" in capsys.readouterr().out
    assert (tmp_path / "rollouts.csv").exists() and (tmp_path / "summary.json").exists()
    assert eval_main(["missing.ckpt", "--task", "push"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert eval_main(["expert", "--task", "nope"]) == 2


def test_environment_and_object_splits_are_chosen_apart() -> None:
    # The objects sub-study: unseen objects in a training environment; the environments one: the
    # training object in unseen environments.
    policy = HoldPolicy(image_size=24)
    objects = evaluate(policy, "push", env_split="train", object_split="unseen", n_envs=1, n_objects=3,
                       max_steps=2, video_episodes=0, progress=False)  # fmt: skip
    assert set(objects.rollouts["env_id"]) == {0}
    assert list(objects.rollouts["object_id"]) == [1_000_000, 1_000_001, 1_000_002]
    assert (objects.summary["env_split"], objects.summary["object_split"]) == ("train", "unseen")
    envs = evaluate(policy, "push", split="unseen", object_split="train", n_envs=2, n_objects=1,
                    max_steps=2, video_episodes=0, progress=False)  # fmt: skip
    assert list(envs.rollouts["env_id"]) == [1_000_000, 1_000_001] and set(envs.rollouts["object_id"]) == {0}


def test_sequential_stop_rule() -> None:
    from demoscale.eval import sequential_stop

    agree = [1.0] * 40
    # All rollouts succeed: the 90% interval of 20 of 20 is [0.88, 1], narrow enough at half-width 0.07.
    assert sequential_stop(agree, halfwidth=0.07, min_episodes=8, round_size=4) == 20
    assert (
        sequential_stop(agree, halfwidth=0.07, min_episodes=24, round_size=4) == 24
    )  # never before the minimum
    split = [1.0, 0.0] * 20
    assert sequential_stop(split, halfwidth=0.07, min_episodes=8, round_size=4) == 40  # p = 0.5 never narrows
    assert sequential_stop(split, halfwidth=0.2, min_episodes=8, round_size=4) == 16


def test_log_gap_scale_knows_low_scores_sooner_than_high_ones() -> None:
    """On log(1 - score), where the laws are fitted, a trial far from success is pinned down by fewer
    rollouts than one close to it; on the score scale the two mirror images need the same number."""
    from demoscale.eval import sequential_stop
    from demoscale.eval.rollout import interval_width

    low = [0.0] * 9 + [1.0]  # success 0.1 (gap 0.9), repeated
    high = [1.0] * 9 + [0.0]  # success 0.9 (gap 0.1)
    low, high = low * 10, high * 10
    rule = {"halfwidth": 0.3, "min_episodes": 10, "round_size": 10}
    assert sequential_stop(low, **rule) == sequential_stop(high, **rule)
    fast = sequential_stop(low, **rule, scale="log-gap")
    slow = sequential_stop(high, **rule, scale="log-gap")
    assert fast < slow, (fast, slow)
    assert interval_width(0.2, 0.4, "score") == pytest.approx(0.2)
    assert interval_width(0.2, 0.4, "log-gap") == pytest.approx(np.log(0.8 / 0.6))
    with pytest.raises(ValueError, match="stop scale"):
        sequential_stop(low, **rule, scale="logit")


def test_sequential_evaluation_runs_the_prefix_the_rule_chooses() -> None:
    from demoscale.eval import sequential_stop

    full = evaluate("expert", "reach", split="train", n_envs=2, episodes=16, image_size=24, batch_size=4,
                    video_episodes=0, progress=False)  # fmt: skip
    stopped = evaluate("expert", "reach", split="train", n_envs=2, episodes=16, image_size=24, batch_size=4,
                       stop_halfwidth=0.25, min_episodes=4, video_episodes=0, progress=False)  # fmt: skip
    n = sequential_stop(full.rollouts["score"].tolist(), 0.25, 4, 4)
    assert n < 16 and len(stopped.rollouts) == n and stopped.summary["episodes_planned"] == 16
    pd.testing.assert_frame_equal(stopped.rollouts, full.rollouts.iloc[:n].reset_index(drop=True))


class CountingPolicy:
    """A policy stand-in whose chunk k holds (k, index) at each index, to show which actions run."""

    def __init__(self, n_action_steps: int, inference_delay: int, horizon: int = 8) -> None:
        self.obs_offsets = {"state": [0]}
        self.horizon, self.n_action_steps, self.inference_delay = horizon, n_action_steps, inference_delay
        self.calls = 0

    def predict_action_batch(self, windows, seed=None) -> np.ndarray:
        chunk = np.stack([np.full(self.horizon, self.calls), np.arange(self.horizon)], axis=1)
        self.calls += 1
        return np.repeat(chunk[None], len(windows["state"]), axis=0)


def _executed(policy: CountingPolicy, steps: int) -> list[tuple[int, int]]:
    """(chunk, index) of each executed action over ``steps`` control steps of one rollout."""
    from demoscale.eval.rollout import PolicyActor

    actor = PolicyActor(policy, "counting")
    actor.start(0, None, 0)
    history = {0: [{"state": np.zeros(2)}]}
    executed: list[tuple[int, int]] = []
    while len(executed) < steps:
        executed += [(int(a[0]), int(a[1])) for a in actor.chunks([0], history, seed=0)[0]]
    return executed[:steps]


def test_inference_delay_acts_on_each_chunk_from_the_step_it_arrives() -> None:
    # No delay: chunk k's first n actions, at steps k*n .. k*n + n - 1.
    assert _executed(CountingPolicy(4, 0), 8) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    # Delay 3: chunk k (observed at step 4k) acts from step 4k + 3 at its index 3; the previous chunk
    # runs on meanwhile, time-aligned (its indices 4-6 at steps 4k .. 4k + 2); the first chunk, for
    # which the robot waits, from index 0.
    assert _executed(CountingPolicy(4, 3), 12) == [
        (0, 0), (0, 1), (0, 2), (0, 3),
        (0, 4), (0, 5), (0, 6), (1, 3),
        (1, 4), (1, 5), (1, 6), (2, 3),
    ]  # fmt: skip
    # A delay as long as the executed part: the robot only ever acts on the previous chunk.
    assert _executed(CountingPolicy(4, 4), 12)[4:] == [
        (0, 4),
        (0, 5),
        (0, 6),
        (0, 7),
        (1, 4),
        (1, 5),
        (1, 6),
        (1, 7),
    ]
    # A new rollout in the slot starts again from index 0 of its first chunk.
    policy = CountingPolicy(4, 2)
    _executed(policy, 8)
    assert _executed(policy, 4) == [(2, 0), (2, 1), (2, 2), (2, 3)]


def test_inference_delay_must_fit_in_the_chunk() -> None:
    from demoscale.eval.rollout import PolicyActor
    from demoscale.policies.diffusion.config import DiffusionConfig

    with pytest.raises(ValueError, match="inference_delay 5 must be in 0..n_action_steps=4"):
        PolicyActor(CountingPolicy(4, 5), "counting")
    with pytest.raises(ValueError, match="n_action_steps \\+ inference_delay <= horizon=8"):
        PolicyActor(CountingPolicy(6, 3), "counting")
    with pytest.raises(ValueError, match="inference_delay"):
        DiffusionConfig(horizon=16, n_action_steps=8, inference_delay=9).validate()


def _ensembled(policy: CountingPolicy, steps: int) -> list[tuple[float, float]]:
    """The executed (chunk, index) means over ``steps`` steps of one rollout with temporal ensembling."""
    from demoscale.eval.rollout import PolicyActor

    actor = PolicyActor(policy, "counting")
    actor.start(0, None, 0)
    history = {0: [{"state": np.zeros(2)}]}
    executed = []
    for _ in range(steps):
        (chunk,) = actor.chunks([0], history, seed=0)
        assert chunk.shape == (1, 2)  # one action per prediction
        executed.append((float(chunk[0, 0]), float(chunk[0, 1])))
        history[0].append({"state": np.zeros(2)})  # the step was taken
    return executed


def test_temporal_ensembling_averages_every_chunk_that_covers_the_step() -> None:
    # Chunk k is predicted at step k; at step t the chunks k = t-7 .. t (8-action chunks) cover it,
    # chunk k with its action t - k. The plain mean (decay 0): mean chunk number and mean index.
    policy = CountingPolicy(4, 0)
    policy.temporal_ensemble = 0.0
    executed = _ensembled(policy, 12)
    assert executed[0] == (0.0, 0.0)
    assert executed[2] == pytest.approx((1.0, 1.0))  # chunks 0, 1, 2 at indices 2, 1, 0
    assert executed[10] == pytest.approx((6.5, 3.5))  # chunks 3..10: chunk 2 no longer reaches step 10
    # A steep decay keeps only the newest chunk, as replanning every step would.
    policy = CountingPolicy(4, 0)
    policy.temporal_ensemble = 50.0
    assert np.allclose(_ensembled(policy, 5), [(t, 0.0) for t in range(5)])
    # A new rollout in the slot forgets the previous rollout's chunks.
    policy = CountingPolicy(4, 0)
    policy.temporal_ensemble = 0.0
    _ensembled(policy, 6)
    assert _ensembled(policy, 1) == [(6.0, 0.0)]


def test_temporal_ensembling_refuses_an_inference_delay() -> None:
    from demoscale.eval.rollout import PolicyActor

    policy = CountingPolicy(4, 2)
    policy.temporal_ensemble = 0.0
    with pytest.raises(ValueError, match="does not combine with an inference delay"):
        PolicyActor(policy, "counting")


class CandidatePolicy:
    """A policy stand-in whose chunks are constant: call c's candidate j (of each window's k) holds
    ``values[c][j]`` (slot 1 adds 100), to show which candidate the actor keeps."""

    def __init__(self, values: list[list[float]], n_action_steps: int = 4, horizon: int = 8) -> None:
        self.obs_offsets = {"state": [0]}
        self.horizon, self.n_action_steps, self.inference_delay = horizon, n_action_steps, 0
        self.values, self.calls = values, 0
        self.chunk_samples, self.coherence_decay = len(values[0]), 0.5

    def predict_action_batch(self, windows, seed=None) -> np.ndarray:
        k, rows = self.chunk_samples, len(windows["state"])
        values = np.asarray(self.values[self.calls], float)
        self.calls += 1
        flat = np.concatenate([values + 100 * (row // k) for row in range(0, rows, k)])
        return np.repeat(flat[:, None, None], self.horizon, axis=1)


def test_chunk_samples_keep_the_candidate_nearest_the_previous_chunk() -> None:
    from demoscale.eval.rollout import PolicyActor

    # The first chunk is the first sample (3); then the nearest to the chunk before: 2.5, then 2.2.
    policy = CandidatePolicy([[3, 7, 1, 8], [10, 2.5, 4, -5], [0, 2.2, 6, 3.3]])
    actor = PolicyActor(policy, "candidates")
    for slot in (0, 1):
        actor.start(slot, None, 0)
    history = {0: [{"state": np.zeros(2)}], 1: [{"state": np.zeros(2)}]}
    executed = {0: [], 1: []}
    for _ in range(3):
        for slot, chunk in zip([0, 1], actor.chunks([0, 1], history, seed=0), strict=True):
            assert chunk.shape == (4, 1)  # n_action_steps of the kept candidate
            executed[slot] += chunk[:, 0].tolist()
    assert executed[0] == [3.0] * 4 + [2.5] * 4 + [2.2] * 4
    assert executed[1] == [103.0] * 4 + [102.5] * 4 + [102.2] * 4  # each slot against its own chunk
    # A new rollout in the slot starts again from the first sample.
    policy.values.append([9, 0, 0, 0])
    actor.start(0, None, 0)
    assert actor.chunks([0], {0: history[0]}, seed=0)[0][:, 0].tolist() == [9.0] * 4


def test_most_coherent_weighs_the_nearest_shared_steps_most() -> None:
    from demoscale.policies.inference import most_coherent

    previous = np.zeros((8, 2))
    # Shifted by 6, candidates share 2 steps with it: A is off at the first, B at the second.
    a = np.zeros((8, 2))
    a[0] = 1.0
    b = np.zeros((8, 2))
    b[1] = 1.0
    assert most_coherent(np.stack([a, b]), previous, shift=6, decay=0.5) == 1
    assert most_coherent(np.stack([b, a]), previous, shift=6, decay=0.5) == 0
    with pytest.raises(ValueError, match="shares no step"):
        most_coherent(np.stack([a, b]), previous, shift=8)


def test_chunk_samples_refuse_settings_they_cannot_serve() -> None:
    from demoscale.eval.rollout import PolicyActor

    policy = CandidatePolicy([[0.0, 1.0]], n_action_steps=8)
    with pytest.raises(ValueError, match="needs chunks that overlap"):
        PolicyActor(policy, "candidates")
    policy = CandidatePolicy([[0.0, 1.0]])
    policy.temporal_ensemble = 0.0
    with pytest.raises(ValueError, match="does not combine with temporal ensembling"):
        PolicyActor(policy, "candidates")
    policy = CandidatePolicy([[0.0, 1.0]])
    policy.coherence_decay = 0.0
    with pytest.raises(ValueError, match="coherence_decay must be in"):
        PolicyActor(policy, "candidates")
