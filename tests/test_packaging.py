"""The install split: the core (= `laws`) install runs `demoscale laws`; `full` carries the rest.

The fast tests read pyproject.toml and the package's imports; the slow one builds a wheel, installs
it with the `laws` extra into a fresh virtual environment and runs `demoscale laws recommend`.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
# Distributions a PI fitting a CSV should never download (torch alone is gigabytes with CUDA).
HEAVY = {"torch", "torchvision", "lightning", "ray", "mujoco", "timm", "diffusers", "opencv-python", "h5py"}
# What `demoscale laws ...` runs: the scaling folder and the command dispatcher.
LAWS_CODE = [REPO_ROOT / "scaling", REPO_ROOT / "cli" / "__init__.py", REPO_ROOT / "cli" / "__main__.py"]
PACKAGE_FOLDERS = ["cli", "collect", "datasets", "policies", "eval", "ray_jobs", "scaling"]


def _name(requirement: str) -> str:
    """Normalised distribution name of a requirement string ("ray[tune]>=2.40" -> "ray")."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


def _declared(*extras: str) -> set[str]:
    names = {_name(r) for r in PROJECT["dependencies"]}
    for extra in extras:
        names |= {_name(r) for r in PROJECT["optional-dependencies"][extra]}
    return names


def _third_party_imports(paths: list[Path]) -> dict[str, str]:
    """Top-level third-party modules imported anywhere in ``paths`` -> one file importing it."""
    found: dict[str, str] = {}
    files = [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in {"demoscale", "__future__"}:
                    found.setdefault(top, str(path.relative_to(REPO_ROOT)))
    return found


@functools.cache
def _import_names() -> dict[str, list[str]]:
    """Import name -> installed distributions providing it (reads every installed distribution's
    file list: about a second, so once per session)."""
    return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    """Distributions providing an import name (installed ones; else the name itself)."""
    provided = _import_names().get(module)
    return {_name(d) for d in provided} if provided else {_name(module)}


def test_core_install_has_nothing_heavy() -> None:
    core = _declared()
    assert not core & HEAVY, f"move to the 'full' extra: {sorted(core & HEAVY)}"
    assert _declared() == _declared("laws"), "the laws extra adds nothing to the core install"
    assert HEAVY <= _declared("full")


def test_laws_code_imports_only_the_core_install() -> None:
    core = _declared()
    missing = {
        module: where
        for module, where in _third_party_imports(LAWS_CODE).items()
        if not _distributions(module) & core
    }
    assert not missing, f"`demoscale laws` imports packages outside the core install: {missing}"


def test_every_import_of_the_package_is_declared() -> None:
    declared = _declared(*PROJECT["optional-dependencies"])
    missing = {
        module: where
        for module, where in _third_party_imports([REPO_ROOT / f for f in PACKAGE_FOLDERS]).items()
        if not _distributions(module) & declared
    }
    assert not missing, f"declare these in pyproject.toml (core or an extra): {missing}"


def test_bootstrap_installs_the_full_set() -> None:
    """scripts/demo and scripts/test run the whole loop: their install must include the heavy part."""
    install = next(
        line
        for line in (REPO_ROOT / "scripts" / "bootstrap").read_text().splitlines()
        if "pip install" in line and ".[" in line and not line.lstrip().startswith("#")
    )
    extras = re.search(r"\.\[([^\]]+)\]", install).group(1).split(",")
    assert "full" in extras and "test" in extras, install


def _wheel_and_fresh_venv(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A wheel built from a copy of the working tree (the build leaves nothing in the checkout), a
    fresh virtual environment, and the environment variables that run its commands (no PYTHONPATH:
    only what is installed in it is importable)."""
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".pkgroot", "__pycache__", "*.egg-info", "build", "dist", "demo_out", "runs"
        ),
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("demoscale-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return wheel, venv, env


@pytest.mark.slow
def test_laws_extra_in_a_fresh_venv_runs_recommend_without_torch(
    tmp_path: Path, demo_shaped_results: Path
) -> None:
    wheel, venv, env = _wheel_and_fresh_venv(tmp_path)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", f"{wheel}[laws]"],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    installed = {_name(line.split("==")[0]) for line in listed.splitlines() if "==" in line}
    assert not installed & HEAVY, f"the laws install pulled in {sorted(installed & HEAVY)}"
    site = next((venv / "lib").glob("python*/site-packages"))
    size_mb = sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 1e6
    print(f"laws install: {len(installed)} distributions, {size_mb:.0f} MB in site-packages")

    def demoscale(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "demoscale"), *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,  # not the checkout: only the installed package is importable
        )

    run = demoscale("laws", "recommend", str(demo_shaped_results), "--target", "0.9", "--cost-env", "25")
    assert run.returncode == 0, run.stderr
    assert "Decision: score >= 0.9" in run.stdout and "Plans, as increments" in run.stdout
    plot = demoscale(
        "laws", "plot", str(demo_shaped_results), "--out", str(tmp_path / "plots"), "--n-bootstrap", "50"
    )
    assert plot.returncode == 0, plot.stderr
    # A command of the full install says what to install instead of a traceback.
    train = demoscale("train", "--help")
    assert train.returncode == 1 and "demoscale[full]" in train.stderr and "Traceback" not in train.stderr


@pytest.mark.slow
def test_a_wheel_install_runs_the_quick_demo_from_another_directory(tmp_path: Path) -> None:
    """Not editable: the default configs come with the package (``demoscale.configs``), not from a
    checkout. The fresh environment gets the third-party packages from this one through a path in a
    .pth file (this environment's own editable demoscale is not activated that way)."""
    wheel, venv, env = _wheel_and_fresh_venv(tmp_path)
    python = str(venv / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True, env=env
        ).strip()
    )
    (site / "shared_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [python, "-c", "import demoscale, demoscale.demo as d; print(demoscale.__file__); print(d.DEMO_CONFIG)"],
        capture_output=True, text=True, timeout=120, env=env, cwd=elsewhere,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    package_file, demo_config = where.stdout.split()
    assert Path(package_file).is_relative_to(venv) and Path(demo_config).is_relative_to(venv), where.stdout
    out = elsewhere / "report"
    demo = subprocess.run(
        [str(venv / "bin" / "demoscale"), "demo", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=2400, env=env, cwd=elsewhere,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "demoscale demo finished" in demo.stdout
    for name in ("report.md", "results.csv", "fit.json", "recommendation.json"):
        assert (out / name).is_file(), f"{name} missing from the report folder"


def test_every_default_config_is_package_data() -> None:
    """A YAML under configs/ that no package-data pattern names would be missing from a wheel."""
    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["demoscale.configs"]
    configs = REPO_ROOT / "configs"
    shipped = {path for pattern in patterns for path in configs.glob(pattern)}
    missing = sorted(
        str(path.relative_to(configs)) for path in configs.rglob("*.yaml") if path not in shipped
    )
    assert not missing, f"add to [tool.setuptools.package-data] 'demoscale.configs': {missing}"
