"""Tabletop family: ids, determinism, rendering, physics and the scripted experts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from demoscale.eval import IdRangeError, env_id, env_ids, get_task, make_env, object_id, split_of
from demoscale.eval.tabletop.scene import env_params, object_params
from demoscale.eval.tasks import UnknownTaskError


def test_id_ranges_are_disjoint_and_checked() -> None:
    train, unseen = set(env_ids("train", 50)), set(env_ids("unseen", 50))
    assert not train & unseen
    assert env_id("train", 3) == 3 and env_id("unseen", 0) == 1_000_000
    assert split_of(object_id("unseen", 7)) == "unseen" and split_of(object_id("train", 7)) == "train"
    with pytest.raises(IdRangeError, match="outside the documented ranges"):
        split_of(50_000)
    with pytest.raises(IdRangeError, match="outside the 'train' split"):
        env_id("train", 10_000)
    with pytest.raises(IdRangeError, match="unknown split"):
        env_id("test", 0)
    with pytest.raises(IdRangeError):
        env_params(20_000)
    with pytest.raises(IdRangeError):
        object_params(-1)


def test_scene_and_object_parameters_are_deterministic_by_id() -> None:
    assert env_params(5) == env_params(5)
    assert object_params(1_000_004) == object_params(1_000_004)
    scenes = [env_params(i) for i in range(20)]
    assert len({(s.table_rgb1, s.light_dir) for s in scenes}) == 20
    assert len({len(s.distractors) for s in scenes}) > 1  # distractor count varies
    objects = [object_params(i) for i in range(40)]
    assert {o.family for o in objects} == {"box", "cylinder", "capsule", "composite"}
    assert len({round(o.mass, 6) for o in objects}) == 40
    assert all(2 * o.grasp_half_width < 0.07 for o in objects)  # graspable by the 8 cm gripper


def test_unknown_task_is_a_clear_error() -> None:
    with pytest.raises(UnknownTaskError, match="unknown task 'stack'.*push"):
        get_task("stack")


def test_observations_follow_the_store_keys_and_render_per_environment() -> None:
    images = []
    for eid in (0, 1, 1_000_000):
        env = make_env("push", eid, 0, seed=0, image_size=48)
        obs = env.observe()
        assert set(obs) == {
            "camera0_rgb",
            "robot0_eef_pos",
            "robot0_eef_rot_axis_angle",
            "robot0_gripper_width",
        }
        assert obs["camera0_rgb"].shape == (48, 48, 3) and obs["camera0_rgb"].dtype == np.uint8
        assert obs["robot0_gripper_width"].shape == (1,)
        assert obs["camera0_rgb"].std() > 5  # not a constant image
        images.append(obs["camera0_rgb"].astype(float))
        env.close()
    assert np.abs(images[0] - images[1]).mean() > 5
    assert np.abs(images[0] - images[2]).mean() > 5


def test_same_id_and_seed_replay_identically_and_the_scene_camera_is_selectable() -> None:
    runs = []
    for _ in range(2):
        env = get_task("push").make_env(3, 2, image_size=32, cameras=("wrist", "scene"))
        obs = env.reset(11)
        assert obs["camera1_rgb"].shape == (32, 32, 3)
        expert = env.expert(11)
        for _ in range(5):
            obs = env.step(expert.act(obs))
        runs.append((obs["camera0_rgb"], obs["robot0_eef_pos"], env.object_pos))
        env.close()
    assert np.array_equal(runs[0][0], runs[1][0])
    assert np.allclose(runs[0][1], runs[1][1]) and np.allclose(runs[0][2], runs[1][2])


def test_rendering_works_from_a_second_thread() -> None:
    # Ray Tune runs each trial of a reused worker process in a fresh thread while the previous
    # trial's thread may still be alive: a GL context current in that thread must not break
    # rendering in the new one (EGL_BAD_ACCESS).
    images, errors = [], []
    first_rendered, second_done = threading.Event(), threading.Event()

    def render_once(hold: bool) -> None:
        try:
            env = make_env("reach", 1, 1, image_size=32)
            images.append(env.reset(0)["camera0_rgb"])
            env.close()
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)
        if hold:
            first_rendered.set()
            second_done.wait(timeout=60)

    first = threading.Thread(target=render_once, args=(True,))
    first.start()
    first_rendered.wait(timeout=60)
    second = threading.Thread(target=render_once, args=(False,))
    second.start()
    second.join()
    second_done.set()
    first.join()
    assert not errors, errors
    assert len(images) == 2 and np.array_equal(images[0], images[1]) and images[0].std() > 0


def test_the_package_sets_rendering_defaults_before_any_mujoco_import() -> None:
    # wholebody/expert.py imports MuJoCo at its top; MuJoCo picks its GL backend at import time.
    env = {
        k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "LP_NUM_THREADS")
    }
    code = (
        "import os, demoscale.eval.wholebody.expert\n"
        "from mujoco.rendering.classic import gl_context\n"
        "print(gl_context.GLContext.__module__, os.environ['LP_NUM_THREADS'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["mujoco.egl", "0"]  # not GLFW, which needs a display


def test_actions_are_absolute_pose_targets_with_limits() -> None:
    env = get_task("pick_place").make_env(0, 0, render=False)
    obs = env.reset(0)
    target = obs["robot0_eef_pos"] + np.array([0.03, -0.02, -0.02])
    for _ in range(5):
        obs = env.step(np.array([*target, 0.0, 0.0, 0.3, 0.05]))
    assert np.allclose(obs["robot0_eef_pos"], target, atol=3e-3)
    assert np.allclose(obs["robot0_eef_rot_axis_angle"], [0, 0, 0.3], atol=0.02)
    assert obs["robot0_gripper_width"][0] == pytest.approx(0.05)
    obs = env.step(np.array([5.0, 0.0, 0.1, 0, 0, 0.3, 0.05]))  # far away: speed-limited, then clamped
    assert np.linalg.norm(obs["robot0_eef_pos"] - target) < 0.07
    with pytest.raises(ValueError, match="7 finite numbers"):
        env.step(np.zeros(6))
    env.close()


@pytest.mark.parametrize("task", ["reach", "push", "pick_place"])
def test_experts_succeed_on_training_ids_and_stages_are_latched(task: str) -> None:
    successes = 0
    for k in range(4):
        env = get_task(task).make_env(k, k + 1, render=False)
        env.reset(k)
        assert env.stage_score() == 0 and not env.success()
        expert = env.expert(k)
        for _ in range(env.max_steps):
            env.step(expert.act(None))
            if expert.done:
                break
        successes += env.success()
        if env.success():
            assert env.stages() == [True, True, True] and env.stage_score() == 3
        env.close()
    assert successes >= 3


def test_expert_variation_is_smooth_over_time() -> None:
    env = get_task("push").make_env(1, 1, render=False)
    env.reset(0)
    expert = env.expert(0)
    actions = []
    for _ in range(25):
        action = expert.act(None)
        env.step(action)
        actions.append(action[:3])
    steps = np.diff(np.asarray(actions), axis=0)
    # Successive command increments change gradually (no per-step jitter): the second difference
    # is small compared to the step size.
    assert np.abs(np.diff(steps, axis=0)).max() < 0.035
    # Different seeds give different (per-episode) variation on the same layout.
    first = [env.expert(seed).act(None) for seed in (1, 2)]
    assert not np.allclose(first[0], first[1])
    env.close()


def test_reach_needs_the_fingers_on_the_object() -> None:
    env = get_task("reach").make_env(2, 3, render=False)
    start = env.reset(5)
    assert np.linalg.norm(env.eef_pos[:2] - env.object_pos[:2]) > 0.03
    # Hovering in place (the start pose as the target) reaches no stage.
    hold = np.concatenate([start["robot0_eef_pos"], start["robot0_eef_rot_axis_angle"], [0.0]])
    for _ in range(10):
        env.step(hold)
    assert env.stage_score() == 0 and not env.success()
    # Straight above the object but not touching: stages 1 and 2, no success.
    above = np.concatenate([env.object_pos[:2], [env.object.height + 0.05], np.zeros(3), [0.0]])
    for _ in range(15):
        env.step(above)
    assert env.stages() == [True, True, False] and not env.success()
    env.close()
