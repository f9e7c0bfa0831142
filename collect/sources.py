"""Which source files an ingest reads, and the env/object/task/operator of each.

Environment and object identity come from the directory layout of the Data-Scaling-Laws
collections, ``<task>/env_<i>/object_<j>/.../<file>`` (``env_3`` gives env_id ``"3"``); a manifest
CSV with columns ``source, env_id, object_id, task, operator`` overrides the layout per file, and
explicit values (command-line flags) override both.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from demoscale.collect.source_format import IngestError

ID_FIELDS = ("env_id", "object_id", "task", "operator")


@dataclass(frozen=True)
class SourceIds:
    env_id: str | None = None
    object_id: str | None = None
    task: str | None = None
    operator: str | None = None

    def override(self, other: SourceIds | Mapping[str, str | None] | None) -> SourceIds:
        """These ids with every non-empty field of ``other`` taking precedence."""
        if other is None:
            return self
        values = other if isinstance(other, Mapping) else other.__dict__
        return replace(
            self, **{k: str(v) for k, v in values.items() if k in ID_FIELDS and v not in (None, "")}
        )


def ids_from_layout(file: Path) -> SourceIds:
    """env/object/task read from the ``<task>/env_<i>/object_<j>/`` components of ``file``'s path.

    The ``env_<i>`` closest to the file wins; the task is the component just above it.
    """
    env_id = object_id = task = None
    parts = Path(file).resolve().parts[:-1]
    for position, part in enumerate(parts):
        if part.startswith("env_") and len(part) > len("env_"):
            env_id, object_id = part[len("env_") :], None
            task = parts[position - 1] if position > 0 and parts[position - 1] != parts[0] else None
        elif part.startswith("object_") and len(part) > len("object_") and env_id is not None:
            object_id = part[len("object_") :]
    return SourceIds(env_id=env_id, object_id=object_id, task=task)


def read_manifest(path: str | os.PathLike) -> dict[Path, SourceIds]:
    """Manifest rows keyed by resolved source path (relative paths are relative to the manifest)."""
    path = Path(path)
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise IngestError(f"manifest {path}: cannot be read: {error}") from error
    if not rows or "source" not in rows[0]:
        raise IngestError(
            f"manifest {path}: needs a header with a 'source' column (and env_id, object_id, ...)"
        )
    manifest: dict[Path, SourceIds] = {}
    for line, row in enumerate(rows, start=2):
        source = (row.get("source") or "").strip()
        if not source:
            raise IngestError(f"manifest {path}, line {line}: empty source")
        file = Path(source) if Path(source).is_absolute() else path.parent / source
        manifest[file.resolve()] = SourceIds().override({k: (row.get(k) or "").strip() for k in ID_FIELDS})
    return manifest


def resolve_sources(
    src: str | os.PathLike,
    patterns: Iterable[str],
    *,
    manifest: str | os.PathLike | None = None,
    overrides: Mapping[str, str | None] | None = None,
    what: str = "source",
) -> list[tuple[Path, SourceIds]]:
    """The source files under ``src`` (a file, or a directory searched for ``patterns``) with ids.

    Files named in the manifest but not found under ``src`` are ingested too; a manifest row naming
    a missing file is an error.
    """
    src = Path(src)
    if not src.exists():
        raise IngestError(f"{src}: no such file or directory")
    if src.is_dir() and not _is_zarr_directory(src):
        files = sorted(
            {f for pattern in patterns for f in src.rglob(pattern) if f.is_file() or _is_zarr_directory(f)}
        )
    else:
        files = [src]
    rows = read_manifest(manifest) if manifest else {}
    for file in rows:
        if not file.exists():
            raise IngestError(f"manifest {manifest}: source {file} does not exist")
        if file not in {f.resolve() for f in files}:
            files.append(file)
    if not files:
        raise IngestError(f"{src}: no {what} found (looked for {', '.join(patterns)})")
    return [(f, ids_from_layout(f).override(rows.get(f.resolve())).override(overrides)) for f in files]


def _is_zarr_directory(path: Path) -> bool:
    return path.is_dir() and (path / ".zgroup").is_file()
