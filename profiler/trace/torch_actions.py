"""The pipeline tasks and messages of one rank's torch profiler trace (:mod:`profiler.trace.kineto`).

torch.distributed.pipelining names its work in three ways, and we read all three:

* ``_PipelineScheduleRuntime`` (every multi-stage schedule, and the single-stage ones it runs) wraps each
  action in ``record_function("PP:" + str(action))``: compute ``PP:2F0``, ``PP:1B3``, ``PP:0I2``,
  ``PP:0W2``, DualPipeV's ``PP:(0F3;3B1)OVERLAP_F_B``, messages ``PP:0SEND_F0``, ``PP:2RECV_B1``, and
  FSDP's ``UNSHARD`` / ``RESHARD`` / ``REDUCE_GRAD`` (ignored);
* ``ScheduleGPipe`` writes ``Forward {i}`` / ``Backward {i}`` around a microbatch's receive, compute and
  send;
* ``Schedule1F1B`` writes nothing ([Note: tasks without annotations]).

[Note: compute and the wait for inputs]
    An action's range opens before its inputs have arrived: torch posts the receive (its own ``RECV``
    action, or inside ``Forward i``) and waits for it inside the compute action, and the wait records no
    operator. A task's compute therefore starts at its first operator that is not communication and ends
    with the range; the time before it is the task's ``wait_ns``. On CUDA the range's
    ``gpu_user_annotation`` twin (the span of the kernels it launched) is the task's compute, as the
    CUDA events of an rrfp run are.

[Note: tasks without annotations]
    ``Schedule1F1B`` (torch 2.13) records only its operators. Between two sends or receives a rank runs one
    microbatch's forward (then, on the last stage, its loss) or one microbatch's backward, and each pass
    issues microbatches in index order. So we cut the step's top-level operators at every message and at
    every switch between forward operators and autograd's backward nodes
    (``autograd::engine::evaluate_function: ...``); a forward run counts only if one of its operators
    recorded an autograd node (a ``fwdbwd`` flow starts in it), and starts at the first such operator,
    which leaves out the input split, the optimizer and ``zero_grad``. The k-th forward run is ``F k``
    and the k-th backward run ``B k``. A task's wait is the gap since the rank last ran an operator or
    posted a message; its input arrived when the last receive posted before it completed (capped at its
    start); its output left with the first send posted after it.

Messages: a ``SEND`` / ``RECV`` action (or a send or receive inside a task's range) carries one
``gloo:send`` / ``gloo:recv`` (``nccl:...`` on NCCL) range from its posting to its completion: the
message's send and arrival times. Message sizes are not in the trace (0 bytes).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from profiler.trace.kineto import ANNOTATION, CPU_OP, GPU_ANNOTATION, Event, RankFile

_COMPUTE = re.compile(r"PP:(\d+)([FBIW])(\d+)$")
_OVERLAP = re.compile(r"PP:\((\d+)F(\d+);(\d+)B(\d+)\)OVERLAP_F_B$")
_MESSAGE = re.compile(r"PP:(\d+)(SEND|RECV)_([FB])(\d+)$")
_GPIPE = re.compile(r"(Forward|Backward) (\d+)$")
_COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms", "mpi:", "ucc:")
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"
_IGNORED_PREFIXES = ("Optimizer.", "ProfilerStep#", "PP:", "Forward ", "Backward ")


@dataclass
class RawTask:
    """One task as the trace shows it: ``stage``/``kind``/``microbatch``, compute span, wait before it."""

    stage: int
    kind: str  # F, B, I, W
    microbatch: int
    start_ns: int
    end_ns: int
    wait_ns: int | None
    recv_end_ns: int | None = None  # unannotated / GPipe: when its remote input arrived
    send: tuple[int, int] | None = None  # unannotated / GPipe: its output's (posted, completed)


@dataclass
class RawMessage:
    """One ``SEND``/``RECV`` action: ``stage`` sends (or receives for) ``kind`` ``microbatch``."""

    stage: int
    direction: str  # SEND or RECV
    kind: str  # F (activations) or B (gradients)
    microbatch: int
    start_ns: int
    end_ns: int  # the send's completion / the arrival (the comm range's end), else the action's end


@dataclass
class StepActions:
    tasks: list[RawTask]
    messages: list[RawMessage]
    annotated: bool  # PP: or Forward/Backward names (else cut by [Note: tasks without annotations])


def stages_named(name: str) -> tuple[int, ...]:
    """The model stages a ``PP:`` action names (compute, overlapped pair, message); () for any other range."""
    for pattern, groups in ((_COMPUTE, (1,)), (_OVERLAP, (1, 3)), (_MESSAGE, (1,))):
        match = pattern.match(name)
        if match:
            return tuple(int(match[g]) for g in groups)
    return ()


def comm_kind(name: str) -> str | None:
    """``send`` / ``recv`` for a communication range or operator, else None."""
    if not name.startswith(_COMM_PREFIXES):
        return None
    lower = name.lower()
    return "send" if "send" in lower else "recv" if "recv" in lower else None


class RankEvents:
    """One rank's events indexed by thread, for the children of a range."""

    def __init__(self, profile: RankFile) -> None:
        self.profile = profile
        self.by_tid: dict = {}
        for event in profile.events:
            if event.cat != GPU_ANNOTATION:
                self.by_tid.setdefault(event.tid, []).append(event)
        self.starts = {tid: [e.start_ns for e in events] for tid, events in self.by_tid.items()}
        self.gpu: dict[str, list[Event]] = {}
        for event in profile.events:
            if event.cat == GPU_ANNOTATION:
                self.gpu.setdefault(event.name, []).append(event)
        self.gpu_used: dict[str, int] = {}
        self.flows = profile.flow_starts

    def inside(self, outer: Event) -> list[Event]:
        """The events of ``outer``'s thread that start within it (``outer`` itself excluded)."""
        events, starts = self.by_tid[outer.tid], self.starts[outer.tid]
        lo = bisect.bisect_left(starts, outer.start_ns)
        hi = bisect.bisect_right(starts, outer.end_ns)
        return [e for e in events[lo:hi] if e is not outer]

    def compute_span(self, action: Event) -> tuple[int, int, int | None]:
        """[Note: compute and the wait for inputs]: ``(start, end, wait)`` of a compute range."""
        gpu = self.gpu_twin(action)
        if gpu is not None:
            return gpu.start_ns, gpu.end_ns, None
        first = next((e.start_ns for e in self.inside(action)
                      if e.end_ns <= action.end_ns and comm_kind(e.name) is None), action.start_ns)
        return first, action.end_ns, first - action.start_ns

    def gpu_twin(self, action: Event) -> Event | None:
        """The k-th ``gpu_user_annotation`` of the k-th CPU range of that name (CUDA traces)."""
        twins = self.gpu.get(action.name)
        if not twins:
            return None
        k = self.gpu_used.get(action.name, 0)
        self.gpu_used[action.name] = k + 1
        return twins[k] if k < len(twins) else None

    def comm(self, action: Event, kind: str) -> Event | None:
        """The first ``kind`` communication posted within ``action``: its range (posting to completion) if the
        trace has one, else its operator (the posting)."""
        found = [e for e in self.inside(action) if comm_kind(e.name) == kind]
        chosen = [e for e in found if e.cat == ANNOTATION] or found
        return chosen[0] if chosen else None

    def forward_run(self, start: int, end: int) -> bool:
        """Whether a forward operator in ``[start, end]`` recorded an autograd node (a ``fwdbwd`` flow)."""
        k = bisect.bisect_left(self.flows, start)
        return k < len(self.flows) and self.flows[k] <= end


def step_actions(events: RankEvents, step: Event, stage_of_rank: int) -> StepActions:
    """The tasks and messages of one ``ProfilerStep`` range; ``stage_of_rank`` names a single-stage rank's
    stage where the trace does not (GPipe's names, 1F1B)."""
    tasks: list[RawTask] = []
    messages: list[RawMessage] = []
    annotated = False
    for event in events.inside(step):
        if event.cat != ANNOTATION:
            continue
        name = event.name
        match = _COMPUTE.match(name)
        if match:
            annotated = True
            start, end, wait = events.compute_span(event)
            tasks.append(RawTask(int(match[1]), match[2], int(match[3]), start, end, wait))
            continue
        match = _OVERLAP.match(name)
        if match:
            annotated = True
            tasks += _overlapped(events, event, match)
            continue
        match = _MESSAGE.match(name)
        if match:
            annotated = True
            comm = events.comm(event, match[2].lower())
            messages.append(RawMessage(int(match[1]), match[2], match[3], int(match[4]), event.start_ns,
                                       comm.end_ns if comm is not None else event.end_ns))
            continue
        match = _GPIPE.match(name)
        if match:
            annotated = True
            start, end, wait = events.compute_span(event)
            task = RawTask(stage_of_rank, match[1][0], int(match[2]), start, end, wait)
            received, sent = events.comm(event, "recv"), events.comm(event, "send")
            task.recv_end_ns = received.end_ns if received is not None else None
            task.send = (sent.start_ns, sent.end_ns) if sent is not None else None
            tasks.append(task)
    if not annotated:
        tasks = _cut_unannotated(events, step, stage_of_rank)
    return StepActions(tasks, messages, annotated)


def _overlapped(events: RankEvents, action: Event, match) -> list[RawTask]:
    """DualPipeV's ``OVERLAP_F_B``: the forward's operators, then the backward's, in one range (torch runs them
    in turn); cut where autograd's first backward node starts. On CUDA the device span is cut in the same
    proportion."""
    inner = [e for e in events.inside(action) if e.end_ns <= action.end_ns and comm_kind(e.name) is None]
    first = inner[0].start_ns if inner else action.start_ns
    cut = next((e.start_ns for e in inner if e.name.startswith(_BACKWARD_PREFIX)), action.end_ns)
    forward = (int(match[1]), int(match[2]))
    backward = (int(match[3]), int(match[4]))
    gpu = events.gpu_twin(action)
    if gpu is not None:
        share = (cut - first) / max(1, action.end_ns - first)
        middle = gpu.start_ns + round(share * (gpu.end_ns - gpu.start_ns))
        return [RawTask(forward[0], "F", forward[1], gpu.start_ns, middle, None),
                RawTask(backward[0], "B", backward[1], middle, gpu.end_ns, None)]
    return [RawTask(forward[0], "F", forward[1], first, cut, first - action.start_ns),
            RawTask(backward[0], "B", backward[1], cut, action.end_ns, 0)]


def _cut_unannotated(events: RankEvents, step: Event, stage: int) -> list[RawTask]:
    """[Note: tasks without annotations]"""
    runs: list[dict] = []
    last_recv_end: int | None = None
    previous_end = step.start_ns  # when the rank last did something: a task's wait is the gap since
    extendable = False  # no message since the last run began: a run of the same kind continues it
    for event in _top_level(events, step):
        kind = comm_kind(event.name)
        if kind is not None:
            extendable = False  # a message's posting ends its operator; its range lasts to its completion
            previous_end = max(previous_end, event.end_ns if event.cat == CPU_OP else event.start_ns)
            if kind == "recv":
                last_recv_end = event.end_ns if last_recv_end is None else max(last_recv_end, event.end_ns)
            elif runs and event.start_ns >= runs[-1]["end"]:
                sent = runs[-1]["send"]  # a send's range (to its completion) beats its operator (the posting)
                if sent is None or (sent[2] == CPU_OP and event.cat == ANNOTATION and event.start_ns <= sent[1]):
                    runs[-1]["send"] = (event.start_ns, event.end_ns, event.cat)
            continue
        if event.name.startswith(_IGNORED_PREFIXES):
            previous_end = max(previous_end, event.end_ns)
            continue
        which = "B" if event.name.startswith(_BACKWARD_PREFIX) else "F"
        if extendable and runs[-1]["kind"] == which:
            runs[-1]["end"] = max(runs[-1]["end"], event.end_ns)
            runs[-1]["parts"].append((event.start_ns, event.end_ns))
            previous_end = max(previous_end, event.end_ns)
            continue
        arrived = None if last_recv_end is None else min(last_recv_end, event.start_ns)
        runs.append({"kind": which, "start": event.start_ns, "end": event.end_ns, "arrived": arrived, "send": None,
                     "wait": max(0, event.start_ns - previous_end), "parts": [(event.start_ns, event.end_ns)]})
        last_recv_end, previous_end, extendable = None, max(previous_end, event.end_ns), True
    tasks, counts = [], {"F": 0, "B": 0}
    for run in runs:
        if run["kind"] == "F":  # it starts at its first operator that recorded an autograd node
            parts = run["parts"]
            first = next((k for k, (a, b) in enumerate(parts) if events.forward_run(a, b)), None)
            if first is None:
                continue  # no autograd node: the input split, the optimizer, zero_grad
            if first:  # operators before it (the input split) were work, not a wait, and not this task
                run["start"], run["wait"] = parts[first][0], max(0, parts[first][0] - parts[first - 1][1])
        sent = run["send"]
        tasks.append(RawTask(stage, run["kind"], counts[run["kind"]], run["start"], run["end"], run["wait"],
                             run["arrived"], None if sent is None else sent[:2]))
        counts[run["kind"]] += 1
    return tasks


def _top_level(events: RankEvents, step: Event) -> list[Event]:
    """The outermost events within ``step`` on every CPU thread of the rank, in start order; on the step's own
    thread, the step's direct children."""
    out = []
    for tid, thread in events.by_tid.items():
        starts = events.starts[tid]
        lo = bisect.bisect_left(starts, step.start_ns)
        hi = bisect.bisect_right(starts, step.end_ns)
        open_until = -1
        for event in thread[lo:hi]:
            if event is step or event.cat not in (ANNOTATION, CPU_OP):
                continue
            if comm_kind(event.name) is not None:
                out.append(event)  # a message's range lasts to its completion: it nests nothing
                continue
            if event.start_ns < open_until:
                continue  # nested in the previous top-level event
            out.append(event)
            open_until = event.end_ns
    out.sort(key=lambda e: (e.start_ns, -e.end_ns))
    return out
