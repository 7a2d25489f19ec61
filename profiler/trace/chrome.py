"""An rrfp run as Chrome trace JSON, the format ``torch.profiler``'s ``export_chrome_trace`` writes: what HTA
(Holistic Trace Analysis), chrome://tracing and the Perfetto UI load.

Two layouts (:func:`write_chrome`), chosen by the destination:

* a **directory**: one file per rank, ``rank<r>_trace.json`` (torch's and torchtitan's naming), each with
  its own ``distributedInfo.rank``: the layout HTA reads (``TraceAnalysis(trace_dir=...)`` reads every
  ``.json`` of the folder, so the folder holds nothing else);
* a **file** ending in ``.json`` (or ``.json.gz``, compressed): every rank in one trace, one process per
  rank, with flow arrows from each message's send to its receive: what chrome://tracing and the
  Perfetto UI open in one go. Its ``distributedInfo`` has no ``rank``; HTA wants the directory.

Conventions (as torch's profiler writes them; ``/tmp/probes``-style traces of ``torch.distributed.pipelining``):

* top level: ``schemaVersion`` 1, ``deviceProperties`` [], ``distributedInfo`` (``backend``, ``rank``,
  ``world_size``, ``pg_count``, ``pg_config``: one default group over every rank), ``baseTimeNanoseconds``,
  ``displayTimeUnit`` ``"ms"``, ``traceEvents``, ``traceName``, and ``rrfp`` (the ranks' trace metadata).
  ``distributedInfo`` comes before ``traceEvents``: HTA finds a file's rank as the first ``"rank": N``.
* times: ``ts`` and ``dur`` in microseconds (floats, to the nanosecond), ``ts`` relative to
  ``baseTimeNanoseconds``, which is the run's first event, in ns of rank 0's clock (the clock every frame of
  :mod:`profiler.trace.reader` is in; host monotonic, not the Unix epoch: an rrfp trace holds no wall time),
  rounded down to a microsecond. Every rank's file has the same base, so ranks line up.
* ``pid`` is the rank; threads (``tid``), each named by an ``M`` ``thread_name`` event:

  ====================  ==========================================================================
  tid                   events (``ph: X``)
  ====================  ==========================================================================
  0 ``tasks``           ``ProfilerStep#<iteration>`` (``user_annotation``): the rank's iteration, from its
                        start to the end of its optimizer step and barrier when traced (torch's step
                        spans from one ``prof.step()`` to the next); inside it one ``PP:<task>`` slice per
                        task (``user_annotation``: the name torch's schedules and rrfp's ranges give it,
                        [Note: profiler ranges] in :mod:`runtime.exec.ranges`), args ``iteration``,
                        ``stage``, ``kind``, ``microbatch``, ``chunk``, ``wait_ns`` (idle before it) and
                        ``units``/``tokens``/``images`` when known; and ``Optimizer.step`` then ``barrier``
                        (``user_annotation``)
  1 ``decisions``       one slice per arbiter decision (``rrfp_decision``), from when the rank went idle to
                        the decision, named ``decide <task>``; args as the ``decisions`` frame
  2 ``rendezvous``      ``--p2p blocking``'s waits for receivers (``rrfp_wait``)
  100+d ``send -> d``   one slice per message sent to rank ``d`` (``rrfp_message``), named by its producer
  200+s ``recv <- s``   one slice per message received from rank ``s``
  ====================  ==========================================================================

  The counters (``ready set``, ``in flight``, ``activation bytes``) are ``C`` events. In the combined file
  each message also has a flow (``s`` at its send, ``f`` with ``bp: e`` at its receive, ``cat``
  ``rrfp_message``); per-rank files carry none (a flow needs both ends in one file).

TP and DP runs: the frames' pipeline slice (the TP leaders of DP replica 0, [Note: traces of TP and DP runs]
in :mod:`profiler.trace.reader`), with their global ranks and the job's world size.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable

import polars as pl

from hints.errors import UserError
from hints.outputs import Outputs
from profiler.trace.reader import TraceFrames

TASKS_TID, DECISIONS_TID, RENDEZVOUS_TID, SEND_TID, RECV_TID = 0, 1, 2, 100, 200
_TASK_ARGS = ("iteration", "stage", "kind", "microbatch", "chunk", "wait_ns", "units", "tokens", "images")
_DECISION_ARGS = ("iteration", "hint_rank", "ready", "skipped", "held_back", "deferred", "in_flight", "index",
                  "leader_ns", "decision_arrived_ns", "announce_ns")


def is_combined(path: Path) -> bool:
    """Whether ``path`` names one combined file (``.json``, ``.json.gz``) rather than a per-rank directory."""
    return not path.is_dir() and path.name.endswith((".json", ".json.gz"))


def rank_file(rank: int) -> str:
    return f"rank{rank}_trace.json"


def check_chrome_destination(path: Path, force: bool = False, flag: str | None = None) -> None:
    """Before any work: a combined file must be new (unless ``force``) in a directory that exists; a per-rank
    directory may exist (a directory), or its parent must. ``flag`` names ``path`` in errors (``--chrome``)."""
    where = f"{flag} {path}" if flag else str(path)
    if path.parent.exists() and not path.parent.is_dir():
        raise UserError(f"{str(path.parent)!r} is a file, not a directory", where)
    if not path.parent.is_dir():
        raise UserError(f"no such directory {str(path.parent)!r}", where)
    if is_combined(path):
        if path.exists() and not force:
            raise UserError("exists; pass --force to overwrite it", where)
    elif path.exists() and not path.is_dir():
        raise UserError("is a file; give a directory (one file per rank) or a name ending in .json or .json.gz "
                        "(one file)", where)


def _check_directory(path: Path, ranks: Iterable[int], force: bool, where: str) -> None:
    """A per-rank directory holds only this export's files (HTA reads every ``.json`` / ``.gz`` in it); files
    of an earlier export are replaced only with ``force``."""
    if not path.is_dir():
        return
    ours = {rank_file(rank) for rank in ranks}
    names = sorted(p.name for p in path.iterdir() if p.name.endswith((".json", ".gz")))
    others = [name for name in names if name not in ours]
    if others:
        raise UserError(f"holds {others[0]}, which HTA would read as a rank's trace; give an empty or new "
                        f"directory", where)
    if names and not force:
        raise UserError(f"already holds {names[0]}; pass --force to overwrite", where)


def write_chrome(frames: TraceFrames, path: Path, force: bool = False, flag: str | None = None,
                 outputs: Outputs | None = None) -> list[str]:
    """Write ``frames`` to ``path`` (layout by :func:`is_combined`); the files written. Files that exist are
    replaced only with ``force``; ``flag`` names ``path`` in errors (``--chrome``). Staged among a command's
    ``outputs`` when given (renamed into place with them), else written all or none here."""
    where = f"{flag} {path}" if flag else str(path)
    check_chrome_destination(path, force, flag)
    events = ChromeEvents(frames)
    combined = is_combined(path)
    if not combined:
        _check_directory(path, events.ranks, force, where)
    if outputs is None:
        with Outputs() as own:
            return write_chrome(frames, path, force, flag, own)
    if combined:
        return [str(outputs.write(path, lambda temporary: _dump(events.combined(path.name), temporary,
                                                                 path.name.endswith(".gz"))))]
    folder = outputs.directory(path)
    return [str(outputs.write(folder / rank_file(rank), lambda temporary, rank=rank: _dump(
                events.rank_trace(rank, rank_file(rank)), temporary, False))) for rank in events.ranks]


def _dump(trace: dict, temporary: Path, compress: bool) -> None:
    text = json.dumps(trace)  # ", " and ": " separators: HTA's rank pattern is '"rank":\s+(\d+)'
    if compress:
        with gzip.open(temporary, "wt") as out:
            out.write(text)
    else:
        temporary.write_text(text)


class ChromeEvents:
    """The Chrome events of a run's frames, per rank, in µs relative to one base time (module docstring)."""

    def __init__(self, frames: TraceFrames) -> None:
        self.frames = frames
        self.ranks = sorted(frames.meta)
        self.base_ns = _base_ns(frames)
        meta = frames.meta[self.ranks[0]] if self.ranks else {}
        self.world = int(meta.get("world", len(self.ranks)))
        device = str(meta.get("device", "cpu")).split(":")[0]
        self.backend = str(meta.get("backend") or ("nccl" if device == "cuda" else "gloo"))
        self.device = device

    # -- whole traces ------------------------------------------------------------------------------------------
    def rank_trace(self, rank: int, name: str) -> dict[str, Any]:
        return self._trace(self._distributed(rank), self.events(rank), name, {rank: self.frames.meta[rank]})

    def combined(self, name: str) -> dict[str, Any]:
        events = [e for rank in self.ranks for e in self.events(rank)] + self.flows()
        return self._trace(self._distributed(None), events, name, self.frames.meta)

    def _trace(self, distributed: dict, events: list[dict], name: str, meta: dict) -> dict[str, Any]:
        return {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": distributed,
                "displayTimeUnit": "ms", "baseTimeNanoseconds": self.base_ns, "traceEvents": events,
                "traceName": name, "rrfp": {str(rank): m for rank, m in meta.items()}}

    def _distributed(self, rank: int | None) -> dict[str, Any]:
        info: dict[str, Any] = {"backend": self.backend}
        if rank is not None:
            info["rank"] = rank
        info.update(world_size=self.world, pg_count=1, pg_config=[{
            "pg_name": "0", "pg_desc": "default_pg", "backend_config": f"{self.device}:{self.backend}",
            "pg_size": self.world, "ranks": list(range(self.world))}])
        return info

    # -- one rank's events -----------------------------------------------------------------------------------
    def events(self, rank: int) -> list[dict]:
        f, mine = self.frames, pl.col("rank") == rank
        threads = {TASKS_TID: "tasks", DECISIONS_TID: "decisions"}
        events = self._steps(f.iterations.filter(mine), f.steps.filter(mine), rank)
        for t in f.tasks.filter(mine).iter_rows(named=True):
            events.append(self._slice(rank, TASKS_TID, f"PP:{t['task']}", "user_annotation", t["start_ns"],
                                      t["end_ns"], _args(t, _TASK_ARGS)))
        for d in f.decisions.filter(mine).iter_rows(named=True):
            events.append(self._slice(rank, DECISIONS_TID, f"decide {d['chosen']}", "rrfp_decision",
                                      d["waited_from_ns"], d["time_ns"], _args(d, _DECISION_ARGS)))
        for r in f.rendezvous.filter(mine).iter_rows(named=True):
            threads[RENDEZVOUS_TID] = "rendezvous"
            events.append(self._slice(rank, RENDEZVOUS_TID, "rendezvous", "rrfp_wait", r["start_ns"], r["end_ns"],
                                      {"iteration": r["iteration"], "messages": r["messages"]}))
        for m in f.transfers.filter((pl.col("src") == rank) | (pl.col("dst") == rank)).iter_rows(named=True):
            args = {"iteration": m["iteration"], "sequence": m["sequence"], "bytes": m["bytes"]}
            if m["src"] == rank and m["send_start_ns"] is not None:
                threads[SEND_TID + m["dst"]] = f"send -> {m['dst']}"
                events.append(self._slice(rank, SEND_TID + m["dst"], m["producer"], "rrfp_message",
                                          m["send_start_ns"], m["send_end_ns"], args))
            if m["dst"] == rank and m["recv_start_ns"] is not None:
                threads[RECV_TID + m["src"]] = f"recv <- {m['src']}"
                events.append(self._slice(rank, RECV_TID + m["src"], m["producer"], "rrfp_message",
                                          m["recv_start_ns"], m["recv_end_ns"], args))
        for c in f.counters.filter(mine).iter_rows(named=True):
            events.append({"ph": "C", "name": c["counter"], "pid": rank, "tid": TASKS_TID,
                           "ts": self._ts(c["time_ns"]), "args": {c["counter"]: c["value"]}})
        return self._metadata(rank, threads) + events

    def _steps(self, iterations: pl.DataFrame, steps: pl.DataFrame, rank: int) -> list[dict]:
        """``ProfilerStep#N`` per iteration, the optimizer step and the barrier inside it."""
        step_of = {s["iteration"]: s for s in steps.iter_rows(named=True)}
        events = []
        for it in iterations.iter_rows(named=True):
            step = step_of.get(it["iteration"])
            end = max(it["end_ns"], step["end_ns"]) if step else it["end_ns"]
            args = {"iteration": it["iteration"], "hint": it["hint"]}
            args.update({k: it[k] for k in ("rule", "auto") if it[k] is not None})
            events.append(self._slice(rank, TASKS_TID, f"ProfilerStep#{it['iteration']}", "user_annotation",
                                      it["start_ns"], end, args))
            if step:
                events.append(self._slice(rank, TASKS_TID, "Optimizer.step", "user_annotation", step["start_ns"],
                                          step["barrier_ns"], {"iteration": it["iteration"]}))
                events.append(self._slice(rank, TASKS_TID, "barrier", "user_annotation", step["barrier_ns"],
                                          step["end_ns"], {"iteration": it["iteration"]}))
        return events

    def _metadata(self, rank: int, threads: dict[int, str]) -> list[dict]:
        def meta(name: str, tid: int, args: dict) -> dict:
            return {"ph": "M", "name": name, "ts": 0.0, "pid": rank, "tid": tid, "args": args}

        events = [meta("process_name", 0, {"name": f"rank {rank}"}),
                  meta("process_labels", 0, {"labels": self.device.upper()}),
                  meta("process_sort_index", 0, {"sort_index": rank})]
        for tid, name in sorted(threads.items()):
            events += [meta("thread_name", tid, {"name": name}), meta("thread_sort_index", tid, {"sort_index": tid})]
        return events

    def flows(self) -> list[dict]:
        """One flow per message with both ends traced: its send slice's start to its receive slice's end."""
        ranks, events = set(self.ranks), []
        whole = self.frames.transfers.drop_nulls(["send_start_ns", "recv_end_ns"])
        for flow, m in enumerate(whole.iter_rows(named=True), start=1):
            if m["src"] in ranks and m["dst"] in ranks:
                common = {"id": flow, "cat": "rrfp_message", "name": "message"}
                events.append({"ph": "s", "pid": m["src"], "tid": SEND_TID + m["dst"],
                               "ts": self._ts(m["send_start_ns"]), **common})
                events.append({"ph": "f", "bp": "e", "pid": m["dst"], "tid": RECV_TID + m["src"],
                               "ts": self._ts(m["recv_end_ns"]), **common})
        return events

    def _slice(self, rank: int, tid: int, name: str, cat: str, start_ns: int, end_ns: int, args: dict) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": self._ts(start_ns),
                "dur": (end_ns - start_ns) / 1e3, "args": args}

    def _ts(self, ns: int) -> float:
        return (ns - self.base_ns) / 1e3


def _args(row: dict, keys: tuple[str, ...]) -> dict:
    return {key: row[key] for key in keys if row.get(key) is not None}


def _base_ns(frames: TraceFrames) -> int:
    """The run's first event, rounded down to a microsecond (0 for a trace without events)."""
    firsts = [frame[column].min() for frame, column in (
        (frames.iterations, "start_ns"), (frames.tasks, "start_ns"), (frames.decisions, "waited_from_ns"),
        (frames.transfers, "send_start_ns"), (frames.transfers, "recv_start_ns"), (frames.counters, "time_ns"),
        (frames.steps, "start_ns"), (frames.rendezvous, "start_ns")) if frame.height]
    first = min((value for value in firsts if value is not None), default=0)
    return first - first % 1000
