"""One rank's torch profiler events cut into tasks (profiler.trace.torch_actions), on hand-made events."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.trace.kineto import ANNOTATION, CPU_OP, Event, RankFile
from profiler.trace.torch_actions import RankEvents, stages_named, step_actions

pytestmark = pytest.mark.unit

US = 1000  # ns


def _event(name: str, start_us: int, end_us: int, cat: str = CPU_OP) -> Event:
    return Event(name, cat, start_us * US, end_us * US, 1)


def test_an_unannotated_tasks_wait_is_the_gap_since_the_rank_last_did_something():
    """[Note: tasks without annotations]: the input split (no autograd node) is no task but is work; a backward
    straight after its forward (the last stage) waited only the gap between them."""
    step = _event("ProfilerStep#1", 0, 1000, ANNOTATION)
    events = [step,
              _event("aten::split", 20, 40),  # the input split: records no autograd node
              _event("aten::linear", 100, 200),
              _event("autograd::engine::evaluate_function: AddmmBackward0", 230, 400),
              _event("c10d::send", 410, 420), _event("gloo:send", 412, 900, ANNOTATION)]
    profile = RankFile(Path("rank0.json"), 0, 1, "gloo", events, flow_starts=[110 * US])
    tasks = step_actions(RankEvents(profile), step, 0).tasks
    assert [(t.kind, t.microbatch, t.wait_ns) for t in tasks] == [("F", 0, 60 * US), ("B", 0, 30 * US)]
    assert tasks[1].send == (412 * US, 900 * US)  # the send's range (to its completion) beats its operator


def test_the_stages_a_pp_action_names():
    assert stages_named("PP:2F0") == (2,)
    assert stages_named("PP:(0F3;3B1)OVERLAP_F_B") == (0, 3)
    assert stages_named("PP:1RECV_B4") == (1,)
    assert stages_named("PP:0UNSHARD") == () and stages_named("ProfilerStep#3") == ()
