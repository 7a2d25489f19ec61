"""Help screens: every ``rrfp`` app and command is built with :class:`App`, which prints help as plain text.

[Note: help screens]
typer's default help reads every help text as rich markup and lays the options out as a table: a literal
``[default 20]`` is a markup tag and vanishes, ``A:B:`` becomes an emoji (``:b:``), and at 80 columns the
table squeezes the help column until a long word (a file name, a list of choices) is cut with "…". ``App``
turns typer's rich help off (``rich_markup_mode=None``): click's formatter prints help texts as written,
wraps them at the terminal's width (at most 80 columns) at spaces, never inside a word, and adds each option's
default as ``[default: X]``. :class:`PanelledGroup` lists each command with its whole first sentence, and
:class:`PanelledCommand` keeps the grouping the rich panels gave: one section per
``rich_help_panel``, after ``Arguments`` and ``Options``. Options whose default is decided later (``None``
resolved from a hint, a config file or the workload) say their default in their help text, in the same
``[default: X]`` form where it is one value. tests/inproc/test_help.py checks every screen at 80 columns.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

ARGUMENTS = "Arguments"
OPTIONS = "Options"


# Stands for "-" while click wraps a help text, so a line never breaks inside --torch-csv or pretrain-packed.
_UNBROKEN_HYPHEN = "\u2011"


class _Formatter(typer.Context.formatter_class):
    """click's help formatter, wrapping at spaces only."""

    def write_text(self, text: str) -> None:
        super().write_text(text.replace("-", _UNBROKEN_HYPHEN))

    def write_dl(self, rows, *args, **kwargs) -> None:
        super().write_dl([(term, text.replace("-", _UNBROKEN_HYPHEN)) for term, text in rows], *args, **kwargs)

    def getvalue(self) -> str:
        return super().getvalue().replace(_UNBROKEN_HYPHEN, "-")


class _Context(typer.Context):
    formatter_class = _Formatter


class PanelledCommand(TyperCommand):
    """A command whose plain help lists its options in sections, one per ``rich_help_panel``."""

    context_class = _Context

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {ARGUMENTS: [], OPTIONS: []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                panel = ARGUMENTS
            else:
                panel = getattr(param, "rich_help_panel", None) or OPTIONS
            sections.setdefault(panel, []).append(record)
        for title, rows in sections.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class PanelledGroup(TyperGroup):
    """A group whose help lists each command with its whole first sentence (click cuts it to fit with "...")."""

    context_class = _Context

    def format_commands(self, ctx, formatter) -> None:
        rows = [(name, command.get_short_help_str(limit=len(command.help or "") + 1))
                for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class App(typer.Typer):
    """``typer.Typer`` with plain help ([Note: help screens]) for itself and every command registered on it."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("rich_markup_mode", None)
        kwargs.setdefault("cls", PanelledGroup)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any):
        return super().command(name, cls=cls or PanelledCommand, **kwargs)
