"""The ``rrfp`` console script: one typer app, one module per command.

``main`` is the only place that turns exceptions into exit codes:
:class:`hints.errors.UserError` -> one ``error:`` line on stderr and exit 2;
SIGINT / SIGTERM -> ``interrupted (SIGINT)`` and exit 130 / 143 (what finished
is kept: each command writes its partial results first); anything else -> one
``internal error`` line and exit 1, with the traceback only when
``RRFP_DEBUG=1``. Commands import torch (and polars) lazily so
``rrfp --help``, ``rrfp hints`` and ``rrfp simulate`` stay fast.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import typer

from hints.errors import Interrupted, UserError, raise_interrupted
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
    signal.signal(signal.SIGTERM, raise_interrupted)  # SIGTERM ends a command as Ctrl-C does: cleanly, 143
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
    except KeyboardInterrupt as err:
        _exit_interrupted(err)
    except SystemExit as err:  # click turns KeyboardInterrupt into exit 130: find which signal it was
        interrupt = _interrupt_in(err)
        if interrupt is None:
            raise
        _exit_interrupted(interrupt)
    except Exception as err:  # a bug: say so in one line unless debugging
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        sys.stderr.write(f"internal error: {type(err).__name__}: {err} (rerun with RRFP_DEBUG=1 for a traceback)\n")
        sys.exit(1)


def _interrupt_in(err: BaseException) -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` (or :class:`Interrupted`) an exception was raised from, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _exit_interrupted(err: KeyboardInterrupt) -> None:
    signal_name, code = (err.signal_name, err.exit_code) if isinstance(err, Interrupted) else ("SIGINT", 130)
    sys.stderr.write(f"interrupted ({signal_name})\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if threading.active_count() > 1:  # threads blocked in C (a transport's receives) would abort at exit
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
