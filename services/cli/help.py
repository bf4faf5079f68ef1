"""Help that reads like a command line's, not like Python: `FILE`, `INTEGER`, `[jit|reference]`
instead of typer's `<path>`, `<int range>`, `<bool>`.

Typer 0.26-0.28 (click vendored as `typer._click`) label every parameter with its type's
name in angle brackets. `PlainHelpGroup`, the `cep` app's group class, walks every command
below it once (including the `--help` option each command makes when asked) and gives each
parameter without an explicit `metavar` click's classic label instead: flags none, paths
PATH, integers INTEGER, floats FLOAT, text TEXT, choices `[a|b]`; arguments show their
name in capitals in the usage line (`QUERY_FILE`, not `{query_file}`). pyproject.toml pins
typer to these versions. Docstrings wrapped at the source's line length are joined into
paragraphs, so that help wraps at the terminal's width, not at both.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from typer.core import TyperGroup

_PLAIN = {"path": "PATH", "int": "INTEGER", "int range": "INTEGER", "float": "FLOAT",
          "float range": "FLOAT", "str": "TEXT", "bool": "", "datetime": "DATETIME"}


def plain_label(typed: str | None) -> str | None:
    """typer's `<list[Path]>`-style label -> click's `PATH`-style label."""
    if typed is None:
        return None
    label = typed.strip()
    if label.startswith("[") and label.endswith("]"):
        return label
    if label.startswith("<") and label.endswith(">"):
        label = label[1:-1]
    while label.lower().startswith("list[") and label.endswith("]"):
        label = label[5:-1]  # a repeatable option takes one value per use
    if "|" in label:
        return f"[{label}]"
    return _PLAIN.get(label.lower(), label.upper())


def unwrap(text: str) -> str:
    """Paragraphs (blank-line separated) of `text` each on one line."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def plain_help(command: Any) -> None:
    """Plain labels for every parameter of `command` and of the commands below it."""
    if isinstance(getattr(command, "help", None), str):
        command.help = unwrap(command.help)
    for param in getattr(command, "params", []):
        _plain_param(param)
    _plain_help_option(command)
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)


def _plain_param(param: Any) -> None:
    if getattr(param, "_plain_help", False):
        return
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""  # flags take no value: no label
    kind = param.type
    if hasattr(kind, "get_metavar"):
        plain = copy.copy(kind)  # click's types can be shared: label this parameter's own

        def get_metavar(param: Any, ctx: Any, kind: Any = kind) -> str | None:
            shown = kind.get_metavar(param=param, ctx=ctx)
            return plain_label(shown if shown is not None else f"<{kind.name}>")

        plain.get_metavar = get_metavar
        param.type = plain
    if getattr(param, "param_type_name", "") == "argument" and param.metavar is None:

        # usage: QUERY_FILE, not {query_file}
        def make_metavar(ctx: Any, usage: bool = False, param: Any = param) -> str:
            name = (param.name or "").upper() + ("..." if param.nargs != 1 else "")
            return f"[{name}]" if usage and not param.required else name

        param.make_metavar = make_metavar
    param._plain_help = True


def _plain_help_option(command: Any) -> None:
    make = getattr(command, "get_help_option", None)
    if make is None or getattr(command, "_plain_help", False):
        return

    def get_help_option(ctx: Any, make: Any = make) -> Any:
        option = make(ctx)
        if option is not None:
            _plain_param(option)
        return option

    command.get_help_option = get_help_option
    command._plain_help = True


class PlainHelpGroup(TyperGroup):
    """The `cep` group: help shows click-style labels (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_help(self)
