"""The ``rrfp`` console script: one typer app, one module per command.

``main`` is the only place that turns exceptions into exit codes:
:class:`hints.errors.UserError` and click's usage errors -> one ``error:``
line on stderr, the library's names for inputs shown as flags
(:func:`rrfp_cli.output.in_cli_terms`), and exit 2; :class:`hints.errors.Failure` (a run that failed
for a named cause) -> ``error:`` with the cause, what was kept, and exit 1;
SIGINT / SIGTERM -> ``interrupted (SIGINT)`` and exit 130 / 143 (what finished
is kept: each command writes its partial results first); anything else -> one
``internal error`` line and exit 1, with the traceback only when
``RRFP_DEBUG=1``. Commands import torch (and polars) lazily so
``rrfp --help``, ``rrfp hints`` and ``rrfp simulate`` stay fast.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading

import typer

from hints.errors import Failure, Interrupted, UserError, raise_interrupted
from rrfp_cli import cmd_bench, cmd_hints, cmd_run, cmd_simulate, cmd_trace, cmd_trace_files, cmd_tune  # noqa: F401
from rrfp_cli.helpscreen import App
from rrfp_cli.options import numbers_checked
from rrfp_cli.output import in_cli_terms

app = App(  # plain help, never cut ([Note: help screens] in rrfp_cli/helpscreen.py)
    name="rrfp",
    help="Runtime-Readiness-First Pipeline: pipeline-parallel training that runs the best ready task.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(cmd_hints.app, name="hints")
app.add_typer(cmd_trace.app, name="trace")  # cmd_trace_files adds export, merge, import to it
app.command("simulate")(cmd_simulate.simulate)
app.command("run")(cmd_run.run)
app.command("tune-hint")(cmd_tune.tune_hint)
app.command("bench")(cmd_bench.bench)


def main(argv: list[str] | None = None) -> None:
    command = typer.main.get_command(app)
    _wrap_callbacks(command, numbers_checked)  # inf, nan, numbers outside their model's range: one error line, first
    _wrap_callbacks(command, _exiting_on_interrupt)
    signal.signal(signal.SIGTERM, raise_interrupted)  # SIGTERM ends a command as Ctrl-C does: cleanly, 143
    try:
        # Not standalone: usage errors come here (one line), and typer.Exit(n) comes back as n.
        code = command.main(args=argv, prog_name="rrfp", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Abort:  # click's answer to end-of-input at a prompt
        sys.stderr.write("aborted\n")
        sys.exit(1)
    except typer.TyperException as err:  # click's usage errors: unknown option, a value out of range...
        _exit_usage_error(err)
    except (UserError, Failure) as err:
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        sys.stderr.write(f"error: {in_cli_terms(str(err))}\n")  # library terms -> flags
        details = getattr(err, "details", "")
        if details:
            sys.stderr.write(in_cli_terms(details.rstrip()) + "\n")
        sys.exit(1 if isinstance(err, Failure) else 2)
    except KeyboardInterrupt as err:  # outside a command (while parsing arguments)
        _exit_interrupted(err)
    except Exception as err:  # a bug: say so in one line unless debugging
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        sys.stderr.write(f"internal error: {type(err).__name__}: {err} (rerun with RRFP_DEBUG=1 for a traceback)\n")
        sys.exit(1)


def _exit_usage_error(err) -> None:
    """One ``error:`` line naming the command; ``rrfp`` or a group alone (``rrfp trace``) prints its help."""
    if any(cls.__name__ == "NoArgsIsHelpError" for cls in type(err).__mro__):
        sys.stdout.write(err.ctx.get_help() + "\n")  # as --help prints it (click's show() writes it to stderr)
    else:
        ctx = getattr(err, "ctx", None)
        message = " ".join(err.format_message().split())
        sys.stderr.write(f"error: {message} (see {ctx.command_path if ctx else 'rrfp'} --help)\n")
    sys.exit(getattr(err, "exit_code", 2))


def _wrap_callbacks(command, wrap) -> None:
    """Replace the callback of ``command`` and of each of its subcommands, ``c``, with ``wrap(c)``."""
    if command.callback is not None:
        command.callback = wrap(command)
    for sub in getattr(command, "commands", {}).values():
        _wrap_callbacks(sub, wrap)


def _exiting_on_interrupt(command):
    """``command``'s callback, exiting here on an interrupt inside it, with its own code (130 or 143): left to
    typer it would become a plain exit 130, whatever the signal."""
    callback = command.callback

    @functools.wraps(callback)
    def run(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except KeyboardInterrupt as err:
            _exit_interrupted(err)
    return run


def _exit_interrupted(err: KeyboardInterrupt) -> None:
    signal_name, code = (err.signal_name, err.exit_code) if isinstance(err, Interrupted) else ("SIGINT", 130)
    # Under torchrun every rank is an `rrfp run` on the same terminal: local rank 0 says it for the node, as for
    # errors ([Note: who reports under torchrun] in runtime.run.launch). A rank torchrun stops while it starts
    # (local rank 0 ended first, e.g. on a wrong world size) would otherwise print a stray line.
    if os.environ.get("LOCAL_RANK", "0") == "0":
        sys.stderr.write(f"interrupted ({signal_name})\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if threading.active_count() > 1:  # threads blocked in C (a transport's receives) would abort at exit
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
