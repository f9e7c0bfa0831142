"""One command-line convention: --store, kebab-case, defaults in --help, --print-config and dotted
overrides for sweep/eval/demo, errors on stderr with exit code 2, a demo that keeps foreign folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from demoscale.__main__ import main as demoscale_main
from demoscale.conventions import ConfigError, apply_overrides, dataclass_from_dict, split_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_SWEEP = REPO_ROOT / "configs" / "sweeps" / "demo.yaml"


def test_dotted_overrides_are_taken_before_positionals_and_typed() -> None:
    rest, overrides = split_overrides(["ckpt", "--a.b", "[1, 2]", "--c.d=0.5", "--e", "x"])
    assert rest == ["ckpt", "--e", "x"] and overrides == {"a.b": [1, 2], "c.d": 0.5}
    assert apply_overrides({"a": {"z": 1}}, {"a.b": 2, "new.key": "v"}, "f") == {
        "a": {"z": 1, "b": 2}, "new": {"key": "v"}
    }  # fmt: skip
    with pytest.raises(ConfigError, match="f: cannot set a.b: a is 3"):
        apply_overrides({"a": 3}, {"a.b": 2}, "f")


def test_one_yaml_to_dataclass_path_names_file_and_key() -> None:
    from demoscale.demo import DemoConfig
    from demoscale.ray_jobs.config import SweepConfigError, sweep_config_from_dict

    with pytest.raises(ConfigError, match=r"demo.yaml: budget: expected a mapping"):
        dataclass_from_dict(DemoConfig, {"budget": 3}, "demo.yaml")
    with pytest.raises(ConfigError, match=r"demo.yaml: unknown key\(s\) \['tragets'\]"):
        dataclass_from_dict(DemoConfig, {"tragets": 0.9}, "demo.yaml")
    sweep = yaml.safe_load(DEMO_SWEEP.read_text())
    sweep["budget"]["steps"] = "many"
    with pytest.raises(SweepConfigError, match=r"s.yaml: budget.steps: expected an integer, got 'many'"):
        sweep_config_from_dict(sweep, source="s.yaml")


def test_sweep_print_config_applies_store_and_dotted_overrides(capsys) -> None:
    argv = ["sweep", "--config", str(DEMO_SWEEP), "--store", "/data/cups.zarr", "--budget.steps", "200",
            "--set", "grid.seed=[0, 1, 2]", "--logger", "tensorboard", "--print-config"]  # fmt: skip
    assert demoscale_main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["store"] == "/data/cups.zarr" and printed["budget"]["steps"] == 200
    assert printed["grid"]["seed"] == [0, 1, 2] and printed["logger"] == "tensorboard"
    assert printed["eval"]["options"]["env_options"] == {"cameras": ["scene"]}  # untouched keys stay
    assert demoscale_main(["sweep", "--config", str(DEMO_SWEEP), "--budget.stesp", "1"]) == 2
    assert "unknown key(s) ['stesp']" in capsys.readouterr().err


def test_demo_print_config_and_overrides(capsys) -> None:
    assert (
        demoscale_main(["demo", "--quick", "--set", "target=0.8", "--budget.steps", "7", "--print-config"])
        == 0
    )
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["target"] == 0.8 and printed["budget"]["steps"] == 7
    assert printed["env_counts"] == [1, 2, 3]  # the quick section
    assert demoscale_main(["demo", "--set", "env_counts=[1, 2]"]) == 2
    assert "at least three environment counts" in capsys.readouterr().err


def test_eval_print_config_merges_file_flags_and_overrides(tmp_path: Path, capsys) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text("policy: expert\ntask: reach\nenvs: 3\nseed: 4\nenv_options: {cameras: [scene]}\n")
    argv = ["eval", "--config", str(config), "--envs", "1", "--env_options.cameras", "[wrist, scene]",
            "--image-size", "48", "--print-config"]  # fmt: skip
    assert demoscale_main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["policy"] == "expert" and printed["task"] == "reach" and printed["seed"] == 4  # the file
    assert printed["envs"] == 1 and printed["image_size"] == 48  # flags win over the file
    assert printed["env_options"] == {"cameras": ["wrist", "scene"]}  # the dotted override last
    assert demoscale_main(["eval", "--config", str(config), "--set", "envs=x"]) == 2
    assert "eval.yaml: envs: expected an integer, got 'x'" in capsys.readouterr().err


def test_demo_refuses_a_folder_it_did_not_make(tmp_path: Path, capsys) -> None:
    from demoscale.demo import MARKER, prepare_out_dir

    foreign = tmp_path / "thesis"
    (foreign / "sweep").mkdir(parents=True)
    (foreign / "sweep" / "chapter.tex").write_text("years of work")
    assert demoscale_main(["demo", "--quick", "--out", str(foreign)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (foreign / "sweep" / "chapter.tex").exists() and not (foreign / MARKER).exists()
    # A folder an earlier demo made is reused (its previous run cleared); a new one is created.
    ours = prepare_out_dir(tmp_path / "demo_out")
    (ours / "sweep").mkdir()
    assert prepare_out_dir(ours) == ours and not (ours / "sweep").exists()
    assert prepare_out_dir(foreign, overwrite=True) == foreign and not (foreign / "sweep").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["demo"],
        ["sweep"],
        ["eval"],
        ["store", "info"],
        ["ingest", "umi"],
        ["ingest", "lerobot"],
        ["store", "export"],
        ["collect", "sim"],
        ["laws", "recommend"],
        ["laws", "fit"],
        ["laws", "compare"],
        ["laws", "plot"],
        ["study"],
        ["ingest", "robomimic"],
        ["ingest", "joylo"],
        ["ingest", "umi-session"],
        ["ingest", "replay-buffer"],
        ["store", "validate"],
        ["store", "repair"],
        ["store", "label-waypoints"],
        ["eval", "import-scores"],
    ],
)
def test_help_shows_defaults_and_kebab_case_flags(command: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demoscale_main([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    flags = [word.rstrip(",") for word in text.split() if word.startswith("--")]
    primary = {flag.split("=")[0] for flag in flags}
    snake = sorted(
        f
        for f in primary
        if "_" in f and f not in {"--print_config", "--image_size", "--env_option", "--batch_size"}
    )  # fmt: skip  (older spellings kept as aliases)
    assert not snake, f"snake_case flags: {snake}"
    # (commands whose every option is a switch or is required have no default to show)
    if command not in (["store", "info"], ["sweep"], ["store", "validate"], ["store", "repair"],
                       ["store", "label-waypoints"]):  # fmt: skip
        assert "default" in text, "defaults are shown in --help"


def test_a_config_file_that_is_not_text_is_a_message(tmp_path: Path, capsys) -> None:
    binary = tmp_path / "random.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 8)
    for command in (["demo"], ["eval", "expert"], ["sweep"]):
        assert demoscale_main([*command, "--config", str(binary)]) == 2, command
        captured = capsys.readouterr()
        assert "not a YAML" in captured.err and "Traceback" not in captured.err, captured.err


def test_usage_errors_exit_2_on_stderr(tmp_path: Path, capsys) -> None:
    assert demoscale_main(["sweep", "--config", "absent.yaml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(
        "demoscale sweep: error: sweep config file not found"
    )
    # The exit code a shell sees, from a real process.
    result = subprocess.run(
        [sys.executable, "-m", "demoscale", "store", "info", "--store", str(tmp_path / "absent.zarr")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("demoscale store info: error: ") and "Traceback" not in result.stderr
