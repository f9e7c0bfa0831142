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


def run_in_terminal(
    argv: list[str], timeout: float, columns: int = 160, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``argv`` with stdin/stdout/stderr on a real pseudo-terminal; return (exit code, output).

    What a user sees in an interactive terminal: ``isatty()`` is true, so live displays draw.
    """
    import fcntl
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(
        argv,
        stdin=terminal_fd,
        stdout=terminal_fd,
        stderr=terminal_fd,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), **(env or {})},
        close_fds=True,
        start_new_session=True,
    )
    os.close(terminal_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                process.kill()
                tail = b"".join(chunks)[-3000:].decode("utf-8", "replace")
                raise TimeoutError(f"{argv} still running after {timeout} s; its last output:\n{tail}")
            ready, _, _ = select.select([main_fd], [], [], 0.5)
            if ready:
                try:
                    data = os.read(main_fd, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    data = b""
                if not data and process.poll() is not None:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
    finally:
        os.close(main_fd)
    return process.wait(), b"".join(chunks).decode("utf-8", "replace")


def _hold_writer_lock(location: str, held, release) -> None:
    from demoscale.datasets import writer_lock

    with writer_lock(location):
        held.set()
        release.wait(120)


class LockHolder:
    """Another (forked) process holding a store's writer lock from entering the block until
    :meth:`release` or the end of the block; ``pid`` is that process's id."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._held, self._release = context.Event(), context.Event()
        self._process = context.Process(
            target=_hold_writer_lock, args=(os.fspath(location), self._held, self._release)
        )

    def __enter__(self) -> LockHolder:
        self._process.start()
        self.pid = self._process.pid
        assert self._held.wait(30), "the holding process never took the lock"
        return self

    def release(self) -> None:
        self._release.set()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
        self._process.join(30)


@pytest.fixture()
def lock_holder() -> type[LockHolder]:
    """:class:`LockHolder`: ``with lock_holder(store) as holder:`` another process holds the lock."""
    return LockHolder


@pytest.fixture()
def terminal():
    """:func:`run_in_terminal`, for tests of what commands show in an interactive terminal."""
    return run_in_terminal


# The default demo's eight trials as the README reports them ("The demo, and what it shows"): unseen
# score and success rate per (training environments, seed), 60 rollouts each.
DEMO_TRIALS = {
    1: ((0.23, 0.17), (0.17, 0.07)),
    4: ((0.51, 0.41), (0.38, 0.35)),
    16: ((0.76, 0.60), (0.63, 0.52)),
    32: ((0.71, 0.72), (0.62, 0.63)),
}


@pytest.fixture
def demo_shaped_results(tmp_path: Path) -> Path:
    """A results.csv shaped like the default demo's sweep output, rebuilt from the README's numbers."""
    import pandas as pd

    rows = []
    for n_envs, (scores, success_rates) in DEMO_TRIALS.items():
        for seed, (score, success_rate) in enumerate(zip(scores, success_rates, strict=True)):
            rows.append({
                "trial_id": f"diffusion-e{n_envs}-o1-d6-s{seed}", "policy": "diffusion", "n_envs": n_envs,
                "n_objects": 1, "n_pairs": n_envs, "demos_per_pair": 6, "total_demos": 6 * n_envs,
                "seed": seed, "score": score, "success_rate": success_rate, "n_rollouts": 60,
            })  # fmt: skip
    folder = tmp_path / "demo_sweep"
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)
    return folder / "results.csv"
