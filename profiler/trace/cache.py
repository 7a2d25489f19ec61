"""The frames of a trace, kept beside it after the first read, so the next ``rrfp trace`` command loads them.

[Note: the frames cache]
    Decoding a trace is most of what an ``rrfp trace`` command costs on a large
    run (about 8 s of CPU per million packets here, [Note: reading fast] in
    :mod:`profiler.trace.reader`), and a user runs several commands on the
    same run: ``bubbles``, ``critical``, ``sensitivity``... So the frames a
    command decoded are kept beside the trace, in a hidden directory ``.<file>.rrfp-frames`` (``.ranks.rrfp-frames``
    in ``trace/`` for a run read from its per-rank files): one Arrow IPC file
    per frame, and ``key.json``, written last, with what the frames were read
    from. The next :func:`profiler.trace.reader.read_trace` of the same path
    loads the frames instead of the trace when the key still matches:

    * the cache's format (:data:`VERSION`, raised whenever the frames' schemas
      or the reader's rules change) and rrfp's trace schema;
    * the path as given (warnings name it) and, for each file read, its name,
      size and a BLAKE2 digest of its bytes. A trace rewritten in any way
      (``rrfp trace merge``, a resumed run, a byte changed in place) no
      longer matches, so a stale cache is never used: the trace is read
      afresh and the cache replaced. (A modification time would not do: the
      kernel stamps files with a clock of a few milliseconds, and a file
      changed twice within one tick keeps its time.) Hashing reads the file,
      about 60 ms for a million packets, against seconds to decode it.

    Only a command that succeeds writes it: ``read_trace`` loads a cache but
    never writes one; ``rrfp trace`` keeps the frames it decoded
    (:func:`keep`) once its result is out, so a command that ends in a
    bad-input error (exit 2) leaves the run directory as it found it, as
    every such error does. ``rrfp tune-hint`` and library callers read
    traces without keeping them (a library caller may call :func:`keep`).

    The cache is an optimisation and never a failure: a directory it cannot
    write (read-only, a full disk) is left without one, a cache it cannot read
    (damaged, written by another version) is ignored, and in both cases the
    trace itself is read. It is written whole ([Note: outputs written whole]
    in :mod:`hints.outputs`: built in a directory beside it and renamed into
    place), so a concurrent reader sees the old cache, the new one or none.
    Arrow IPC holds data only: loading a cache runs no code from it (unlike a
    pickle, which a shared run directory could abuse). ``RRFP_TRACE_CACHE=0``
    turns it off; ``benchmarks/trace_bench.py`` times the reader with it off
    and the cached load beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl

VERSION = 1
KEY_FILE = "key.json"
# the frames of TraceFrames, saved one IPC file each (FRAME_NAMES and the TP/DP members' frames)
SAVED_FRAMES = ("tasks", "decisions", "transfers", "counters", "iterations", "steps", "rendezvous", "members",
                "member_decisions", "member_transfers")


def enabled() -> bool:
    return os.environ.get("RRFP_TRACE_CACHE", "1") != "0"


def cache_dir(paths: list[Path]) -> Path:
    """Where the frames of a trace read from ``paths`` are kept ([Note: the frames cache])."""
    first = paths[0]
    return first.with_name(f".{first.name if len(paths) == 1 else 'ranks'}.rrfp-frames")


def cache_key(given: str, paths: list[Path], schema: str) -> dict[str, Any] | None:
    """What the frames depend on; None when a file cannot be looked at (then nothing is cached)."""
    try:
        files = [[p.name, p.stat().st_size, _digest(p)] for p in paths]
    except OSError:
        return None
    return {"version": VERSION, "schema": schema, "path": given, "files": files}


def _digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load(paths: list[Path], key: dict[str, Any], make):
    """The cached frames of ``paths`` when their key is ``key`` (``make(**fields)`` builds them), else None."""
    folder = cache_dir(paths)
    try:
        saved = json.loads((folder / KEY_FILE).read_text())
        if saved.get("key") != key:
            return None
        # read as bytes: nothing keeps the files open (or mapped) once loaded
        frames = {name: pl.read_ipc((folder / f"{name}.arrow").read_bytes()) for name in SAVED_FRAMES}
        return make(path=key["path"], meta=_int_keys(saved["meta"]), member_meta=_int_keys(saved["member_meta"]),
                    warnings=list(saved["warnings"]), packets=int(saved["packets"]), **frames)
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        return None  # absent, damaged or of another version: the trace is read instead


def keep(frames) -> None:
    """Keep frames :func:`profiler.trace.reader.read_trace` decoded with the cache on beside their trace (whole or
    not at all; silently nothing where that is refused); nothing for frames it loaded from the cache."""
    if frames.cache_entry is not None:
        paths, key = frames.cache_entry
        frames.cache_entry = None
        _save(paths, key, frames)


def _save(paths: list[Path], key: dict[str, Any], frames) -> None:
    from hints.outputs import new_directory_beside

    folder = cache_dir(paths)
    building = None
    try:
        building = new_directory_beside(folder)
        for name in SAVED_FRAMES:
            getattr(frames, name).write_ipc(building / f"{name}.arrow")
        (building / KEY_FILE).write_text(json.dumps({
            "key": key, "meta": frames.meta, "member_meta": frames.member_meta, "warnings": frames.warnings,
            "packets": frames.packets}))
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(building, folder)
        building = None
    except Exception:  # OSError, a DiskError, a value JSON cannot hold: the cache is only an optimisation
        pass
    finally:
        if building is not None:
            shutil.rmtree(building, ignore_errors=True)


def _int_keys(mapping: dict[str, Any]) -> dict[int, Any]:
    return {int(rank): value for rank, value in mapping.items()}
