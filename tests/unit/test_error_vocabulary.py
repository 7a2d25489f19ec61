"""Library errors name inputs in library terms, and the CLI shows every one of them as a flag it has.

[Note: inputs in messages] in hints.errors: a library message names an input by its name in backticks; the
CLI renders each as its flag. This test reads every error message the library can raise (the string
constants inside an error's constructor or a checking helper) and checks that each input it names is a
flag of some ``rrfp`` command, except the knobs only the library has.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer

from hints.errors import UserError, input_name
from rrfp_cli.app import app
from rrfp_cli.output import in_cli_terms

REPO = Path(__file__).resolve().parents[2]
ERROR_CALLS = {"UserError", "HintError", "TraceError", "ScheduleDeadlock", "Failure", "RunFailed", "RuntimeError",
               "InjectedFault", "input_name", "check_placement", "check_split_overhead", "parse_window", "_flag"}
INPUT = re.compile(r"`([a-z][a-z0-9_]*)`")
# Knobs of the library's models that no command exposes (VariabilityModel's sequence and image statistics).
LIBRARY_ONLY = {"attention", "seq_len_min", "seq_len_max", "seq_len_median", "seq_len_sigma", "images_mean",
                "text_tokens", "image_tokens", "vision_stages", "samples_per_microbatch"}


def _messages() -> dict[str, set[str]]:
    """Input names in error messages, with the files that use them."""
    found: dict[str, set[str]] = {}
    for package in ("hints", "runtime", "profiler"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                function = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if function not in ERROR_CALLS:
                    continue
                for constant in ast.walk(node):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                        for name in INPUT.findall(constant.value):
                            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def _flags() -> set[str]:
    flags: set[str] = set()

    def visit(command) -> None:
        for param in command.params:
            flags.update(opt for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            visit(sub)

    visit(typer.main.get_command(app))
    return flags


def test_every_input_a_library_error_names_is_a_flag_of_the_cli():
    messages = _messages()
    assert {"memory_budget", "ranks", "policy", "placement"} <= set(messages)  # the scan reads the library
    flags = _flags()
    missing = {name: sorted(files) for name, files in messages.items()
               if name not in LIBRARY_ONLY and in_cli_terms(input_name(name)) not in flags}
    assert missing == {}


def test_the_cli_shows_inputs_as_flags_and_the_library_as_names():
    error = UserError("use `chunks` >= 2 or `memory_budget` 2x", input_name("memory_budget"))
    assert str(error) == "`memory_budget`: use `chunks` >= 2 or `memory_budget` 2x"
    assert in_cli_terms(str(error)) == "--memory-budget: use --chunks >= 2 or --memory-budget 2x"
    assert in_cli_terms("a `` pair and `Capitalized` words stay") == "a `` pair and `Capitalized` words stay"
