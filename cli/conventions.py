"""One command-line convention for every ``demoscale`` subcommand.

- **Exit codes**: 0 success; 1 failure while running (a check that fails, failed trials, an error
  of the environment); 2 usage or input error (flags, config files and keys, paths and data files
  the user gave; fix the input and run again). Errors go to stderr as ``demoscale CMD: error: ...``.
- **Flags** are kebab-case (``--image-size``); older snake_case spellings stay as aliases. The one
  exception is ``train``, whose flags are the Lightning CLI's dotted names (``--trainer.max_steps``).
- **The store** is ``--store PATH`` everywhere (``store info PATH`` keeps the positional form).
- **Defaults** are shown in ``--help`` (:class:`HelpFormatter`).
- **Configs**: commands with a configuration (``demo``, ``sweep``, ``eval``) take ``--config FILE``
  (YAML), dotted overrides (``--budget.steps 200`` or ``--set budget.steps=200``, values read as
  YAML), and ``--print-config`` (print the resolved configuration as YAML and exit), as ``train``
  does; YAML becomes a typed dataclass through :func:`dataclass_from_dict`, which names the file and
  the key of anything unknown or mistyped.

This module imports only the standard library (and PyYAML where a config is read), so the light
``demoscale laws`` install can use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class ConfigError(ValueError):
    """A configuration (file, override or key) that cannot be used; the message names which."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless it is None/False or the help already states one) and keeps
    the description's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS, [], ()) or "default" in text.lower():
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        if isinstance(action.default, list | tuple):
            return f"{text} (default: {' '.join(str(v) for v in action.default)})"
        return text + " (default: %(default)s)"


def make_parser(prog: str, description: str | None = None, **kwargs: Any) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` that follows the convention (defaults in ``--help``)."""
    return argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=HelpFormatter, **kwargs
    )


def error(command: str, message: object, code: int = EXIT_USAGE) -> int:
    """Print ``demoscale COMMAND: error: MESSAGE`` to stderr; return ``code`` (for ``return error(...)``)."""
    print(f"demoscale {command}: error: {message}", file=sys.stderr)
    return code


# --- the store ---------------------------------------------------------------------------------
def add_store_argument(parser: argparse.ArgumentParser, help: str, positional_alias: bool = False) -> None:
    """``--store PATH`` (and, for commands that always took it so, a positional alias)."""
    if positional_alias:
        parser.add_argument("store_positional", nargs="?", metavar="STORE", help="same as --store")
    parser.add_argument("--store", default=None, help=help)


def resolve_store(
    parser: argparse.ArgumentParser, args: argparse.Namespace, required: bool = True
) -> str | None:
    """The one store of ``args`` (``--store`` or the positional alias); a usage error for none or two."""
    positional = getattr(args, "store_positional", None)
    if positional and args.store and positional != args.store:
        parser.error(f"two stores given: {positional} and --store {args.store}")
    store = args.store or positional
    if required and not store:
        parser.error("the store is required: --store PATH")
    return store


# --- configs -----------------------------------------------------------------------------------
def add_config_arguments(
    parser: argparse.ArgumentParser, config_help: str, default: str | None = None
) -> None:
    """``--config FILE``, ``--set KEY=VALUE`` (repeatable) and ``--print-config``; dotted flags such
    as ``--budget.steps 200`` are read by :func:`parse_with_overrides`."""
    parser.add_argument("--config", default=default, help=config_help)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (dotted, e.g. budget.steps=200; VALUE is YAML); the same as "
        "--KEY VALUE (e.g. --budget.steps 200)",
    )
    parser.add_argument(
        "--print-config",
        "--print_config",
        dest="print_config",
        action="store_true",
        help="print the resolved configuration as YAML and exit",
    )


def _yaml_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def split_overrides(argv: Sequence[str] | None) -> tuple[list[str], dict[str, Any]]:
    """(``argv`` without its dotted flags, those flags as ``{"a.b": value}``): ``--a.b VALUE`` and
    ``--a.b=VALUE`` (values read as YAML). Taken out before argparse sees them, so that a value is
    never mistaken for a positional argument."""
    argv = list(argv or [])
    rest: list[str] = []
    overrides: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        name = token.split("=", 1)[0]
        if token == "--":
            rest += argv[index:]
            break
        if name.startswith("--") and "." in name and not name.startswith("--set"):
            key, sep, value = token[2:].partition("=")
            if not sep:
                if index + 1 >= len(argv):
                    raise ConfigError(f"{token} needs a value")
                value = argv[index + 1]
                index += 1
            overrides[key] = _yaml_value(value)
        else:
            rest.append(token)
        index += 1
    return rest, overrides


def parse_with_overrides(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse ``argv``; dotted flags (``--a.b VALUE`` / ``--a.b=VALUE``) and ``--set a.b=VALUE`` become
    ``{"a.b": value}`` overrides (values read as YAML). Anything else unknown is a usage error."""
    try:
        rest, overrides = split_overrides(argv)
    except ConfigError as err:
        parser.error(str(err))
    args = parser.parse_args(rest)
    for item in getattr(args, "set", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--set takes KEY=VALUE, got {item!r}")
        overrides[key.strip()] = _yaml_value(value)
    return args, overrides


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``data`` with each dotted ``key: value`` of ``overrides`` set (nested dicts created as needed).
    Keys may be written with dashes (``--image-size``) or underscores."""
    import copy

    result = copy.deepcopy(dict(data))
    for dotted, value in overrides.items():
        parts = [p.replace("-", "_") for p in dotted.split(".")]
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    f"{where}: cannot set {dotted}: {'.'.join(parts[: depth + 1])} is {child!r}, not a mapping"
                )
            node = child
        node[parts[-1]] = value
    return result


def read_yaml(path: str | os.PathLike, what: str = "config") -> dict[str, Any]:
    """A YAML mapping from ``path``; a :class:`ConfigError` naming the file otherwise."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a YAML {what} file (not UTF-8 text)") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read: {err.strerror or err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {what} must be a mapping of keys to values, got {type(data).__name__}")
    return data


def _check_type(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against a field's type hint (nested dataclasses built); ints pass for floats."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {hint}")
    if dataclasses.is_dataclass(hint):
        return dataclass_from_dict(hint, value, where)
    if origin in (list, Sequence, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return [_check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        _, item = typing.get_args(hint) or (str, Any)
        return {k: _check_type(v, item, f"{where}.{k}") for k, v in value.items()}
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def dataclass_from_dict(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from plain data: every key known, every value of its field's type
    (nested dataclasses, lists and dicts of them included). ``where`` (file, then key path) starts
    every error message."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    missing = sorted(
        name
        for name, f in fields.items()
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    values = {key: _check_type(value, hints[key], f"{where}: {key}" if ": " not in where else f"{where}.{key}")
              for key, value in data.items()}  # fmt: skip
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


def config_yaml(config: Any) -> str:
    """A dataclass (or plain data) as YAML, in field order: what ``--print-config`` prints."""
    import yaml

    data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


# --- output ------------------------------------------------------------------------------------
def quiet_broken_pipe() -> int:
    """After a reader closed stdout (``demoscale store info S | head``): silence the interpreter's
    final flush and return the exit code (0: the reader chose to stop reading)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_OK
