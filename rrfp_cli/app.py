"""The ``rrfp`` console script: one typer app, one module per command.

``main`` is the only place that turns exceptions into exit codes:
:class:`hints.errors.UserError` -> one ``error:`` line on stderr and exit 2;
anything else -> one ``internal error`` line and exit 1, with the traceback
only when ``RRFP_DEBUG=1``. Commands import torch (and polars) lazily so
``rrfp --help``, ``rrfp hints`` and ``rrfp simulate`` stay fast.
"""

from __future__ import annotations

import os
import sys

import typer

from hints.errors import UserError
from rrfp_cli import cmd_hints, cmd_run, cmd_simulate, cmd_trace, cmd_tune

app = typer.Typer(
    name="rrfp",
    help="Runtime-Readiness-First Pipeline: pipeline-parallel training that runs the best ready task.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(cmd_hints.app, name="hints")
app.add_typer(cmd_trace.app, name="trace")
app.command("simulate")(cmd_simulate.simulate)
app.command("run")(cmd_run.run)
app.command("tune-hint")(cmd_tune.tune_hint)


def main(argv: list[str] | None = None) -> None:
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="rrfp")  # standalone: click handles usage errors and exits
    except UserError as err:
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        sys.stderr.write(f"error: {err}\n")
        details = getattr(err, "details", "")
        if details:
            sys.stderr.write(details.rstrip() + "\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as err:  # a bug: say so in one line unless debugging
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        sys.stderr.write(f"internal error: {type(err).__name__}: {err} (rerun with RRFP_DEBUG=1 for a traceback)\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
