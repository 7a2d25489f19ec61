"""The transport's one error type, at the bottom of :mod:`runtime.comm` so every layer can raise it.

Import order inside the package (nothing imports upward): ``errors`` -> ``frames`` -> ``inbox`` ->
``links`` -> ``sockets``, ``nccl``, ``bootstrap`` -> ``transport``; ``clock`` and ``grid`` stand apart.
"""

from __future__ import annotations


class TransportError(RuntimeError):
    """A link broke or delivered something unexpected."""
