"""Errors that reach a user as one line.

Every package raises :class:`UserError` (or a subclass) for bad input: a hint
file that does not parse, a shape that does not fit a hint, a negative
duration. The CLI prints ``error: <where>: <what>`` and exits with code 2;
anything else is a bug and is reported as such. This module sits at the bottom
of the import graph so ``runtime``, ``profiler`` and ``rrfp_cli`` can all use it.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input, explained in one line.

    ``where`` names the place (a file, ``file: rank 2``, an option such as
    ``--memory-budget``); ``what`` says what is wrong there.
    """

    def __init__(self, what: str, where: str | None = None) -> None:
        self.what = what
        self.where = where
        super().__init__(f"{where}: {what}" if where else what)

    def located(self, where: str) -> "UserError":
        """The same error with ``where`` prefixed by an outer location (e.g. a file name)."""
        inner = f"{where}: {self.where}" if self.where else where
        return type(self)(self.what, inner)


class HintError(UserError):
    """A hint order (built-in, file or imported) is malformed or does not fit the shape.

    Subclasses keep ``UserError``'s constructor so :meth:`UserError.located` can rebuild them.
    """
