"""Shared fixtures. Tests use real components: stores on disk, MuJoCo, a private local Ray."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Offscreen rendering on CPU-only machines; set before anything imports mujoco.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

REPO_ROOT = Path(__file__).resolve().parents[1]
# The real PushT demonstrations live beside the repository, never inside it.
PUSHT_REPLAY = Path(
    os.environ.get("DEMOSCALE_PUSHT_ZARR", REPO_ROOT.parent / "shared/data/pusht/pusht_cchi_v7_replay.zarr")
)


# Hang guards, never speed limits (speed lives in benchmarks/). The default suite runs under
# pyproject's `timeout` (600 s per test); a slow end-to-end test gets this guard unless it declares
# its own with @pytest.mark.timeout(...). Slow tests run for minutes on a shared 2-core machine
# (the default demo 9-13 min), and a guard must only catch a hang: about 3x the longest measured run.
SLOW_TEST_HANG_GUARD_S = 3600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_HANG_GUARD_S))


@pytest.fixture(scope="session")
def pusht_replay_path() -> Path:
    """Path of the real PushT replay buffer; skips the test (with the reason) where it is absent."""
    if not (PUSHT_REPLAY / "meta" / "episode_ends").exists():
        pytest.skip(f"real PushT data not found at {PUSHT_REPLAY} (set DEMOSCALE_PUSHT_ZARR)")
    return PUSHT_REPLAY
