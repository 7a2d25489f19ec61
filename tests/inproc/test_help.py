"""Every help screen of every command and subcommand, on a terminal 80 columns wide ([Note: help screens] in
rrfp_cli/helpscreen.py): each option's help is there whole (every word of it, unbroken: nothing cut with "…" or
"...", no word split at a hyphen), every option with a default shows it, and nothing is mangled as rich markup
(a ``[default 20]`` dropped as a tag, ``A:B:`` turned into an emoji) or leaks an internal Python name."""

from __future__ import annotations

import dataclasses
import re

import pytest
import typer
from rich.cells import cell_len

from rrfp_cli.app import app
from tests.helpers.cli import run_cli

WIDTH = 80


def _screens() -> list[tuple[tuple[str, ...], object]]:
    """``(path, click command)`` for the root, every group and every command."""
    found = []

    def walk(command, path: tuple[str, ...]) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


SCREENS = _screens()


def _option_blocks(screen: str) -> dict[str, str]:
    """Each option's row and the indented lines under it, joined into one line, by each of its names."""
    blocks: dict[str, str] = {}
    names: list[str] = []
    for line in screen.splitlines():
        if re.match(r"  -", line):
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            names = re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", head)
            for name in names:
                blocks[name] = " ".join(line.split())
        elif names and line.startswith("   "):
            for name in names:
                blocks[name] += " " + line.strip()
        else:
            names = []
    return blocks


def _shows_a_default(param) -> bool:
    """Whether click has a default to show for ``param`` (a flag that is off, or an empty text, has none)."""
    if param.param_type_name != "option" or param.name == "help" or param.default in (None, "", ()):
        return False
    return not (param.is_flag and not param.secondary_opts and not param.default)


@pytest.mark.parametrize("path, command", SCREENS, ids=[" ".join(p) or "rrfp" for p, _ in SCREENS])
def test_help_screen_at_80_columns(tmp_path, path, command):
    done = run_cli(tmp_path, *path, "--help", columns=WIDTH)
    assert done.returncode == 0 and done.stderr == "", done
    screen = done.stdout
    words = set(screen.split())

    wide = [line for line in screen.splitlines() if cell_len(line) > WIDTH]
    assert not wide, f"lines wider than {WIDTH} columns:\n" + "\n".join(wide)
    assert "…" not in screen, screen

    # Every word of every help text is on the screen, whole: nothing cut off, nothing split at a hyphen.
    texts = [(param.opts[0] if param.opts else param.name, param.help) for param in command.params
             if getattr(param, "help", None)]
    texts.append(("the command", (command.help or "").partition("\f")[0]))
    for name, sub in getattr(command, "commands", {}).items():
        texts.append((name, sub.get_short_help_str(limit=len(sub.help or "") + 1)))
    for owner, text in texts:
        lost = [word for word in text.split() if word not in words]
        assert not lost, f"{owner}: {lost} cut or broken on the screen:\n{screen}"

    # Nothing rendered as markup: no emoji or other character the texts do not have, no markup left raw.
    sources = " ".join(text for _, text in texts)
    foreign = {char for char in screen if ord(char) > 127 and char not in sources
               and not "\u2500" <= char <= "\u257f"}  # box drawing: a panel's frame, if help is ever drawn so
    assert not foreign, f"characters no help text has (rich's emoji codes?): {foreign}\n{screen}"
    assert not re.search(r"\\\[|\[/?(bold|dim|italic|red|green|blue|cyan|yellow|magenta|link)\b|``", screen), screen

    # No internal names: a module path of the code, or a module constant (profiler.bench.matrix.WORKLOADS).
    internal = re.findall(r"\b(?:hints|runtime|profiler|rrfp_cli)\.[a-z_]+\b|\b[a-z_]+\.[A-Z][A-Z_]{2,}\b", screen)
    assert not internal, f"internal names on the help screen: {internal}\n{screen}"

    # Every option with a default shows it.
    blocks = _option_blocks(screen)
    for param in command.params:
        if _shows_a_default(param):
            block = blocks.get(param.opts[0], "")
            assert "[default: " in block, f"{param.opts[0]} has a default and does not show it:\n{block or screen}"


def test_run_help_shows_every_default_of_run_config(tmp_path):
    """``rrfp run``'s options are all None (a flag wins over --config, which wins over RunConfig's defaults), so
    click has no default to show: each help text says RunConfig's, and it must be there."""
    from runtime.config import RunConfig

    defaults = {field.name: getattr(RunConfig(), field.name) for field in dataclasses.fields(RunConfig)}
    command = typer.main.get_command(app).commands["run"]
    blocks = _option_blocks(run_cli(tmp_path, "run", "--help", columns=WIDTH).stdout)
    missing = [param.opts[0] for param in command.params
               if param.param_type_name == "option" and defaults.get(param.name) not in (None, "", {})
               and "[default: " not in blocks.get(param.opts[0], "")]
    assert not missing, f"rrfp run --help does not show the default of {missing}"
