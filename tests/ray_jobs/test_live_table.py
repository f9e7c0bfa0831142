"""The sweep's live display on a real pseudo-terminal: rich's table when rich imports, plain lines
(with the same progress) when it does not."""

from __future__ import annotations

import os
import pty
import select
import sys
from types import SimpleNamespace

import pytest
from demoscale.ray_jobs.reporter import LiveTable


def _trial(trial_id: str) -> SimpleNamespace:
    return SimpleNamespace(
        config={"point": {"trial_id": trial_id}}, trial_id=trial_id, last_result={"score": 0.5}
    )


def _drive(table: LiveTable) -> None:
    trial = _trial("tiny-e1-o1-d2-s0")
    table.on_trial_start(0, [], trial)
    progress = {"step": 3, "max_steps": 4, "loss": 0.25, "samples_per_s": 120.0, "eta_s": 2.0}
    table.on_trial_result(0, [], trial, {"progress": progress})
    table.on_trial_complete(0, [], trial)
    table.close()


def _read_all(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture
def terminal_stream():
    main_fd, terminal_fd = pty.openpty()
    stream = os.fdopen(terminal_fd, "w", buffering=1)
    assert stream.isatty()
    yield stream, main_fd
    stream.close()
    os.close(main_fd)


def test_without_rich_a_terminal_gets_plain_lines_with_progress(terminal_stream, monkeypatch) -> None:
    stream, main_fd = terminal_stream
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich...` now raises ImportError
    table = LiveTable(total=1, stream=stream, progress_every_s=0.0)
    assert table.live is None
    _drive(table)
    output = _read_all(main_fd)
    assert "tiny-e1-o1-d2-s0: running" in output
    assert "tiny-e1-o1-d2-s0: training step 3/4" in output and "ETA" in output
    assert "tiny-e1-o1-d2-s0: finished score=0.500" in output
    assert "\x1b[" not in output  # no redraws: plain lines


def test_with_rich_a_terminal_gets_the_table_redrawn_with_progress(terminal_stream) -> None:
    pytest.importorskip("rich")
    stream, main_fd = terminal_stream
    table = LiveTable(total=1, stream=stream)
    assert table.live is not None
    _drive(table)
    output = _read_all(main_fd)
    assert "\x1b[" in output and "3/4" in output and "0.25" in output
    assert "1 finished" in output
