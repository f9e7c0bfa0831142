"""The results table: ``results.csv|parquet`` (one row per trial) and ``rollouts.csv|parquet``.

Rows are added one trial at a time, as each trial finishes, by the single driver process. Each
write replaces the whole file through a temporary file and a rename, so a sweep killed at any
moment leaves either the old or the new table, never a torn one. Rows are keyed by ``trial_id``:
adding a trial that is already present replaces its row (and its rollouts) instead of duplicating.
The folder may be any fsspec URL.
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import fsspec
import pandas as pd

# One schema for every results table (sweeps here, a lab's score files in eval.scores): the shape
# demoscale.scaling reads.
from demoscale.eval.scores import RESULT_COLUMNS, ROLLOUT_COLUMNS


def _join(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name


class ResultsFolder:
    """The sweep's output folder: reads and atomically rewrites its two tables (``results`` and
    ``rollouts``, each as CSV and Parquet). What ``demoscale.scaling`` reads them into is its own
    ``ResultsTable``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.fs, self.root = fsspec.core.url_to_fs(folder)
        self.fs.makedirs(self.root, exist_ok=True)

    def path(self, name: str) -> str:
        return _join(self.root, name)

    def resolve(self, recorded: str) -> str:
        """A path from a table (a trial's ``checkpoint``) as a full path or URL: the tables store
        paths inside the folder relative to it, so that the folder can be moved or copied."""
        if "://" in recorded or recorded.startswith("/"):
            return recorded
        return _join(self.folder, recorded)

    def _read_csv(self, name: str, columns: list[str]) -> pd.DataFrame:
        path = self.path(name)
        if not self.fs.exists(path):
            return pd.DataFrame(columns=columns)
        with self.fs.open(path, "rb") as handle:
            # ids are strings even when they look like numbers ("3"); keep them so.
            return pd.read_csv(
                handle,
                dtype={"trial_id": str, "env_id": str, "object_id": str, "env_ids": str, "object_ids": str},
            )

    def results(self) -> pd.DataFrame:
        """The results table as stored (empty, with its columns, when there is none yet)."""
        return self._read_csv("results.csv", RESULT_COLUMNS)

    def rollouts(self) -> pd.DataFrame:
        return self._read_csv("rollouts.csv", ROLLOUT_COLUMNS)

    def finished_trial_ids(self) -> set[str]:
        """Trial ids that already have a row: a resumed sweep skips them."""
        return set(self.results()["trial_id"].astype(str))

    def _write(self, frame: pd.DataFrame, stem: str) -> None:
        for suffix in ("csv", "parquet"):
            final = self.path(f"{stem}.{suffix}")
            temporary = self.path(f".{stem}.{suffix}.{uuid.uuid4().hex}.tmp")
            buffer = io.BytesIO()
            if suffix == "csv":
                frame.to_csv(buffer, index=False)
            else:
                frame.to_parquet(buffer, index=False)
            with self.fs.open(temporary, "wb") as handle:
                handle.write(buffer.getvalue())
            self.fs.mv(temporary, final)

    def add_trial(self, row: dict[str, Any], rollouts: list[dict[str, Any]]) -> None:
        """Add (or replace) one trial's row and its rollouts; both tables are rewritten atomically.

        Rollouts are written first: a crash between the two writes leaves rollouts without a row,
        which a resumed sweep recomputes and replaces, never a row without its rollouts.
        """
        trial = str(row["trial_id"])
        encoded = dict(row)
        for key in ("env_ids", "object_ids"):
            if not isinstance(encoded.get(key), str):
                encoded[key] = json.dumps([str(v) for v in encoded.get(key) or []])
        new_row = pd.DataFrame([{column: encoded.get(column) for column in RESULT_COLUMNS}])
        new_rollouts = pd.DataFrame(rollouts)
        if len(new_rollouts):
            new_rollouts["trial_id"] = trial
            for key in ("env_id", "object_id"):  # ids are strings everywhere (evaluate may give ints)
                if key in new_rollouts:
                    new_rollouts[key] = new_rollouts[key].astype(str)
            ordered = [c for c in ROLLOUT_COLUMNS if c in new_rollouts] + sorted(
                c for c in new_rollouts if c not in ROLLOUT_COLUMNS
            )
            new_rollouts = new_rollouts[ordered]
        old_rollouts = self.rollouts()
        old_rollouts = old_rollouts[old_rollouts["trial_id"].astype(str) != trial]
        frames = [f for f in (old_rollouts, new_rollouts) if len(f)]
        all_rollouts = (
            pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ROLLOUT_COLUMNS)
        )
        self._write(all_rollouts, "rollouts")
        old = self.results()
        old = old[old["trial_id"].astype(str) != trial]
        frames = [f for f in (old, new_row) if len(f)]
        self._write(pd.concat(frames, ignore_index=True)[RESULT_COLUMNS], "results")
