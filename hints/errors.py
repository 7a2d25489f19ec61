"""Errors that reach a user as one line.

Every package raises :class:`UserError` (or a subclass) for bad input: a hint
file that does not parse, a shape that does not fit a hint, a negative
duration. The CLI prints ``error: <where>: <what>`` and exits with code 2.
A job that ran and failed for a named cause is a :class:`Failure` (exit 1);
an interrupt is :class:`Interrupted` (130 or 143); anything else is a bug and
is reported as such. This module sits at the bottom
of the import graph so ``runtime``, ``profiler`` and ``rrfp_cli`` can all use it.
"""

from __future__ import annotations

import re
from typing import Callable

# [Note: inputs in messages]
#     A message names an input its caller gave by the input's name in the library, in backticks:
#     ``memory_budget``, ``ranks``, written with :func:`input_name`, in ``where`` (the input the message is
#     about) or in ``what`` ("use `chunks` >= 2"). The library says what is wrong and where in its own
#     terms; a front end renders the names in its own (:meth:`UserError.render`): the CLI as its flags
#     (``--memory-budget``), through one table in rrfp_cli. A caller of the library reads them as they are.
_INPUT = re.compile(r"`([a-z][a-z0-9_]*)`")


def input_name(name: str) -> str:
    """How a message names the input ``name`` ([Note: inputs in messages])."""
    return f"`{name}`"


def as_flag(name: str) -> str:
    """A command-line flag for the input ``name``: its name with dashes (``memory_budget`` -> ``--memory-budget``),
    the convention rrfp's front ends follow; each keeps a table of the few that differ."""
    return "--" + name.replace("_", "-")


def render_inputs(text: str, name_of: Callable[[str], str]) -> str:
    """``text`` with every input named as ``name_of`` says ([Note: inputs in messages])."""
    return _INPUT.sub(lambda match: name_of(match.group(1)), text)


class UserError(Exception):
    """Bad input, explained in one line.

    ``where`` names the place (a file, ``file: rank 2``, an input such as
    ``memory_budget``: [Note: inputs in messages]); ``what`` says what is
    wrong there.
    """

    def __init__(self, what: str, where: str | None = None) -> None:
        self.what = what
        self.where = where
        super().__init__(f"{where}: {what}" if where else what)

    def render(self, name_of: Callable[[str], str]) -> str:
        """The message with its inputs named by ``name_of`` (a front end's names for them)."""
        return render_inputs(str(self), name_of)

    def located(self, where: str) -> "UserError":
        """The same error with ``where`` prefixed by an outer location (e.g. a file name)."""
        inner = f"{where}: {self.where}" if self.where else where
        return type(self)(self.what, inner)


class HintError(UserError):
    """A hint order (built-in, file or imported) is malformed or does not fit the shape.

    Subclasses keep ``UserError``'s constructor so :meth:`UserError.located` can rebuild them.
    """


class Failure(Exception):
    """A job that ran and failed for a cause named in one line (a rank killed, a stall, an injected fault).

    Not bad input (that is :class:`UserError`, exit 2) and not a bug: the CLI prints ``error: <message>``,
    then ``details`` (what was kept, where the reports are), and exits with code 1.
    """

    def __init__(self, message: str, details: str = "") -> None:
        self.details = details
        super().__init__(message)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM asked the process to stop; ``exit_code`` is 128 + the signal (130, 143).

    A subclass of ``KeyboardInterrupt`` so every place that keeps the best so far on Ctrl-C (the
    tuner, the progress bars) treats SIGTERM the same way.
    """

    def __init__(self, signum: int = 2) -> None:
        import signal

        self.signum = int(signum)
        try:
            self.signal_name = signal.Signals(self.signum).name
        except ValueError:
            self.signal_name = f"signal {self.signum}"
        super().__init__(self.signal_name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def raise_interrupted(signum: int, frame=None) -> None:
    """A signal handler: turn SIGINT / SIGTERM into :class:`Interrupted` in the main thread."""
    raise Interrupted(signum)
