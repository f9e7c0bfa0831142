"""House rules of docs/architecture.md, enforced: who may import whom, and a torch-free scaling."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# package -> the packages of ours it may import (docs/architecture.md, "Rules of the house")
ALLOWED: dict[str, set[str]] = {
    "datasets": set(),
    "collect": {"datasets"},
    "policies": {"datasets"},
    "eval": {"datasets", "collect", "policies"},
    "ray_jobs": {"datasets", "collect", "policies", "eval"},
    "scaling": set(),
}


def _imported_subpackages(path: Path) -> set[str]:
    """Subpackages of demoscale imported anywhere in a file (top level or inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "demoscale":
                names += [f"demoscale.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level >= 2:
            # "from ..x import y" inside a folder reaches a sibling folder: not allowed.
            found.add("<relative import beyond its package>")
        for name in names:
            parts = name.split(".")
            if parts[0] == "demoscale" and len(parts) > 1 and parts[1] in ALLOWED:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_one_way_rule(package: str) -> None:
    violations = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        # Nested subpackages may use "from .. import" within their own package; resolve generously
        # by only flagging imports of other top-level folders.
        imported = _imported_subpackages(path) - {package, "<relative import beyond its package>"}
        forbidden = imported - ALLOWED[package]
        if forbidden:
            violations.append(f"{path.relative_to(REPO_ROOT)} imports {sorted(forbidden)}")
    assert not violations, (
        f"{package} may import only {sorted(ALLOWED[package]) or 'none of ours'}:\n" + "\n".join(violations)
    )


def test_rule_checker_catches_a_violation(tmp_path: Path) -> None:
    offending = tmp_path / "bad.py"
    offending.write_text(
        "def f():\n    from demoscale.policies import train\n    import demoscale.eval.rollout\n"
    )
    assert _imported_subpackages(offending) == {"policies", "eval"}


def test_scaling_imports_without_torch_ray_or_mujoco() -> None:
    code = (
        "import sys, demoscale.scaling\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'mujoco', 'lightning') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"demoscale.scaling pulled in: {result.stdout.strip()}"


def test_dispatcher_starts_without_heavy_imports() -> None:
    code = (
        "import sys\n"
        "from demoscale.__main__ import main\n"
        "assert main(['--help']) == 0\n"
        "print('heavy=' + ','.join(m for m in ('torch', 'ray', 'mujoco') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "usage: demoscale" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "heavy="


def test_every_subpackage_is_packaged() -> None:
    """A folder with an __init__.py missing from pyproject's package list would vanish from a wheel."""
    import tomllib

    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folder_of = {folder: name for name, folder in setuptools["package-dir"].items()}
    found = set()
    for folder, name in folder_of.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / folder).parts
            found.add(".".join((name, *relative)))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def _episode_store_private_names() -> set[str]:
    """Private attributes and methods of EpisodeStore (``_root``, ``_array``, ...)."""
    tree = ast.parse((REPO_ROOT / "datasets" / "store.py").read_text())
    store_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EpisodeStore")
    names = set()
    for node in ast.walk(store_class):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_nothing_outside_datasets_reaches_into_the_store() -> None:
    """The store's internals (its zarr group ``_root`` above all) are used only inside datasets/;
    everyone else, tests included, goes through the public API (derived arrays: write_derived)."""
    private = _episode_store_private_names()
    assert {"_root", "_array"} <= private
    offenders = []
    for path in sorted(REPO_ROOT.rglob("*.py")):
        relative = path.relative_to(REPO_ROOT)
        if relative.parts[0] in {"datasets", ".venv", ".pkgroot", "build"}:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr in private:
                offenders.append(f"{relative}:{node.lineno} .{node.attr}")
    assert not offenders, "use EpisodeStore's public API:\n" + "\n".join(offenders)
