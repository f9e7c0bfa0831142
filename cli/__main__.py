"""The ``demoscale`` command: a table of subcommands, each loaded only when it runs.

Every subcommand is a module exposing ``main(argv: list[str]) -> int``; the module is a thin
shell over functions users can import. Loading lazily keeps ``demoscale laws ...`` free of torch.
The flags, exit codes and config handling every command shares are in ``demoscale.conventions``:
0 success, 1 failure while running, 2 usage or input error.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help). A two-word name ("store export") is a subcommand served by
# another package's module than its first word's: it is looked up before the one-word name.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demoscale.demo", "run the whole loop in simulation: collect, ingest, sweep, fit, recommend"),
    "study": (
        "demoscale.study",
        "the data-scaling study in simulation: objects, environments, pairs, demos; the advice carried out",
    ),
    "store": ("demoscale.datasets.cli", "inspect, validate and label episode stores"),
    # The store package imports none of ours, so writing other formats lives with their readers.
    "store export": ("demoscale.collect.export_cli", "write a store as a LeRobot v3.0 dataset"),
    "ingest": (
        "demoscale.collect.ingest_cli",
        "ingest UMI, JoyLo, robomimic, replay-buffer or LeRobot data into a store",
    ),
    "collect": (
        "demoscale.eval.collect_sim_cli",
        "collect scripted demonstrations in simulation (raw formats)",
    ),
    "train": ("demoscale.policies.cli", "train policies with the Lightning CLI (fit, validate, ...)"),
    "eval": ("demoscale.eval.cli", "roll out checkpoints or experts; import real-robot score files"),
    "sweep": ("demoscale.ray_jobs.cli", "sweep training over env/object/demo counts on Ray"),
    "laws": ("demoscale.scaling.cli", "fit scaling laws, plot them, recommend a data budget"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: demoscale <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "Run 'demoscale <command> --help' for the options of one command.",
        "Exit codes: 0 success, 1 failure while running, 2 usage or input error.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        from demoscale import __version__

        print(f"demoscale {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if " ".join(argv[:2]) in COMMANDS:
        name, rest = " ".join(argv[:2]), argv[2:]
    if name not in COMMANDS:
        print(f"demoscale: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from demoscale.conventions import ConfigError, quiet_broken_pipe
    from demoscale.conventions import error as report_error

    try:
        module = importlib.import_module(COMMANDS[name][0])
        code = int(module.main(rest) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return code
    except BrokenPipeError:
        # The reader stopped reading (`demoscale store info S | head`): not an error of ours.
        return quiet_broken_pipe()
    except ConfigError as err:  # a config file, key or override a command could not use
        return report_error(name, err)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if not missing or missing == "demoscale":
            raise
        # The core install carries only what `demoscale laws` needs; say how to get the rest.
        print(
            f"demoscale {name}: needs the Python package {missing!r}, which the light install "
            "(pip install demoscale, or demoscale[laws]) leaves out; install everything with: "
            "pip install 'demoscale[full]'",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
