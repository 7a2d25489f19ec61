"""Reading torch profiler (Kineto) Chrome-JSON traces: the per-rank files of a profiled job, as plain slices.

What ``torch.profiler.profile(...).export_chrome_trace`` writes, per rank (``rank{r}_trace.json`` in
torchtitan's profile folders, optionally gzipped): top-level ``distributedInfo`` (``rank``, ``world_size``,
``backend``), ``baseTimeNanoseconds``, and ``traceEvents``, of which we keep

* complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds with nanosecond decimals) of the categories
  ``user_annotation`` (``record_function`` ranges on a CPU thread: ``ProfilerStep#N``, torch pipelining's
  ``PP:<action>``, ``Forward i`` / ``Backward i``, ``gloo:send`` / ``nccl:recv`` ...), ``cpu_op`` (aten and
  c10d operators, autograd's ``evaluate_function`` nodes) and ``gpu_user_annotation`` (on CUDA, the same
  ranges as spans of the kernels they launched, on the device's streams);
* flow starts of category ``fwdbwd`` (``"ph": "s"``): the profiler links each forward operator that
  recorded an autograd node to its backward, so a run of forward operators that starts one is model
  compute ([Note: tasks without annotations] in :mod:`profiler.trace.torch_profile`).

Times become integer nanoseconds ``round(ts * 1000)``: the profiler's own clock, the same on every rank of
one host. Anything that is not such a file is a :class:`KinetoError` naming the file (one line, exit 2).
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from hints.errors import UserError

ANNOTATION, CPU_OP, GPU_ANNOTATION = "user_annotation", "cpu_op", "gpu_user_annotation"
_KEPT = frozenset({ANNOTATION, CPU_OP, GPU_ANNOTATION})
STEP_PREFIX = "ProfilerStep#"


class KinetoError(UserError):
    """A torch profiler trace that cannot be read (the file is named in the message)."""


@dataclass(frozen=True)
class Event:
    """One complete event: ``[start_ns, end_ns]`` on thread ``tid`` (a stream on the device for GPU events)."""

    name: str
    cat: str
    start_ns: int
    end_ns: int
    tid: int | str


@dataclass
class RankFile:
    """One rank's profile: its events in start order (outer before inner at one start), its flow starts."""

    path: Path
    rank: int
    world: int
    backend: str | None
    events: list[Event]
    flow_starts: list[int] = field(default_factory=list)  # ns, sorted: forward ops that recorded autograd nodes

    def steps(self) -> dict[int, Event]:
        """Each ``ProfilerStep#N`` range on a CPU thread, by ``N``."""
        out = {}
        for event in self.events:
            if event.cat == ANNOTATION and event.name.startswith(STEP_PREFIX):
                number = event.name[len(STEP_PREFIX):]
                if number.isdigit():
                    out[int(number)] = event
        return out

    @property
    def cuda(self) -> bool:
        return any(event.cat == GPU_ANNOTATION for event in self.events)


def trace_files(inputs: list[Path]) -> list[Path]:
    """The per-rank trace files among ``inputs``: files as given, folders searched for ``*.json`` and
    ``*.json.gz`` (torchtitan: ``profile_traces/iteration_N/rank{r}_trace.json``)."""
    files: list[Path] = []
    for path in inputs:
        if not path.exists():
            raise KinetoError("no such file or directory", str(path))
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
            if not found:
                raise KinetoError("holds no torch profiler trace (*.json or *.json.gz)", str(path))
            files += found
        else:
            files.append(path)
    return files


def read_rank_file(path: Path) -> RankFile:
    """One Kineto Chrome-JSON trace (gzipped or not) as a :class:`RankFile`."""
    where = str(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise KinetoError(f"not a readable gzip file (truncated?): {err}", where) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KinetoError(f"not a JSON trace (truncated?): {err}", where) from None
    except OSError as err:
        raise KinetoError(f"cannot read: {err.strerror or err}", where) from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise KinetoError("not a torch profiler trace (no traceEvents)", where)
    info = data.get("distributedInfo")
    if not isinstance(info, dict) or type(info.get("rank")) is not int or type(info.get("world_size")) is not int:
        raise KinetoError("has no distributedInfo (rank, world_size): not a trace of a distributed job; "
                          "profile every rank of the pipeline", where)
    rank, world = info["rank"], info["world_size"]
    if not 0 <= rank < world:
        raise KinetoError(f"distributedInfo says rank {rank} of a world of {world}", where)
    events, flows = [], []
    for item in data["traceEvents"]:
        if not isinstance(item, dict):
            continue
        phase, cat = item.get("ph"), item.get("cat")
        if phase == "X" and cat in _KEPT:
            name, ts, dur = item.get("name"), item.get("ts"), item.get("dur")
            if isinstance(name, str) and _number(ts) and _number(dur) and dur >= 0:
                start = round(ts * 1000)
                events.append(Event(name, cat, start, start + round(dur * 1000), item.get("tid", 0)))
        elif phase == "s" and cat == "fwdbwd" and _number(item.get("ts")):
            flows.append(round(item["ts"] * 1000))
    events.sort(key=lambda e: (e.start_ns, -e.end_ns))
    flows.sort()
    return RankFile(path, rank, world, info.get("backend"), events, flows)


def _number(value) -> bool:
    return type(value) in (int, float)
