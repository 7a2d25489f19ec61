"""The executor's handler registry: wrappers nest in the order installed, and the worker's order is
fault check, computation, data parallelism's count, then the injected delay."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hints.tasks import B, F, I, Task, W
from runtime.exec.handlers import HandlerTable, InjectedFault, delay_after, inject_faults
from runtime.run.dp import GradientReducer
from runtime.run.worker import _install_injections


def _table(events: list) -> HandlerTable:
    def handler(kind):
        def run(iteration, task, tid):
            events.append(("run", str(task)))
            return (kind,)

        return run

    return HandlerTable({kind: handler(kind) for kind in (F, B, I, W)})


def _named(name: str, events: list):
    def wrapper(handler):
        def wrapped(iteration, task, tid):
            events.append(("enter", name))
            out = handler(iteration, task, tid)
            events.append(("leave", name))
            return out

        return wrapped

    return wrapper


def test_the_last_wrapper_installed_runs_outermost():
    events: list = []
    table = _table(events)
    table.wrap(_named("inner", events), "inner")
    table.wrap(_named("outer", events), "outer", kinds=(B,))
    assert table.layers(B) == ["outer", "inner"]
    assert table.layers(F) == ["inner"]
    assert table[B](0, Task.parse("1B0"), 3) == (B,)
    assert events == [("enter", "outer"), ("enter", "inner"), ("run", "1B0"), ("leave", "inner"), ("leave", "outer")]


def test_injected_fault_fires_on_its_task_and_iteration_only():
    events: list = []
    table = _table(events)
    table.wrap(inject_faults((Task.parse("1F2"), 1), None), "fault")
    table[F](0, Task.parse("1F2"), 0)  # another iteration
    table[F](1, Task.parse("1F1"), 0)  # another task
    with pytest.raises(InjectedFault, match=r"injected failure in task 1F2 of iteration 1 \(`fail_at`\)"):
        table[F](1, Task.parse("1F2"), 0)
    assert events == [("run", "1F2"), ("run", "1F1")]  # the failing task never ran


def test_delay_gets_the_time_the_task_took():
    seen = []
    table = _table([])
    table.wrap(delay_after(lambda iteration, task, elapsed: seen.append((iteration, str(task), elapsed)) or 0.0),
               "delay")
    table[W](4, Task.parse("0W1"), 0)
    assert [(i, t) for i, t, _ in seen] == [(4, "0W1")] and seen[0][2] >= 0.0


@pytest.mark.parametrize("kind", [B, W])
def test_worker_order_fault_then_work_then_dp_then_delay(kind):
    """A stage's last backward task writes its weight gradients: W where its backward is split, B where not
    (a hint may split some stages and not others), so the reducer counts both."""
    events: list = []
    table = _table(events)
    reducer = GradientReducer({}, None, 2, microbatches=2)
    reducer.begin_iteration()
    reducer.left = {0: 2}
    reducer.task_done = lambda task: events.append(("dp", str(task)))
    reducer.install(table)
    noise = SimpleNamespace(extra=lambda iteration, task, elapsed: events.append(("delay", str(task))) or 0.0)
    config = SimpleNamespace(fault=lambda name: (Task.parse("0B1"), 0) if name == "hang_at" else None)
    _install_injections(SimpleNamespace(handlers=table), config, noise)
    assert table.layers(B) == table.layers(W) == ["fault", "delay", "dp"]
    assert table.layers(I) == ["fault", "delay"]
    task = Task(0, kind, 0)
    table[kind](0, task, 0)
    assert events == [("run", str(task)), ("dp", str(task)), ("delay", str(task))]


def test_no_fault_wrapper_without_faults():
    table = _table([])
    config = SimpleNamespace(fault=lambda name: None)
    _install_injections(SimpleNamespace(handlers=table), config, SimpleNamespace(extra=lambda *a: 0.0))
    assert table.layers(F) == ["delay"]
