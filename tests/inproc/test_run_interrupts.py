"""One interrupt, one shutdown ([Note: one interrupt, one shutdown] in runtime/run/launch.py): the launcher's and
a rank's handlers turn the first SIGINT / SIGTERM into ``Interrupted`` and ignore every later one, so a second
Ctrl-C (or the agent's SIGTERM after the terminal's SIGINT) cannot cut short what the first one started. End to
end on real ranks: tests/multiproc/test_repeated_interrupts.py.
"""

from __future__ import annotations

import json
import signal

import pytest

from hints.errors import Interrupted
from runtime.comm.errors import TransportError
from runtime.run import health
from runtime.run.launch import _FirstSignal
from runtime.run.worker import RankContext, interrupted_once, report_failure

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture
def reached():
    """The signals that reached the handlers in place before the code under test (``rrfp``'s own, in the CLI:
    a ``KeyboardInterrupt`` that would cut the shutdown short); SIGINT / SIGTERM are as before once it ends."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    signals: list[int] = []
    for s in SIGNALS:
        signal.signal(s, lambda signum, frame: signals.append(signum))
    yield signals
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("first, later", [(signal.SIGINT, signal.SIGINT), (signal.SIGINT, signal.SIGTERM),
                                          (signal.SIGTERM, signal.SIGINT)])
def test_the_launcher_stops_on_the_first_signal_and_ignores_the_rest_until_it_exits(reached, first, later):
    signals = _FirstSignal()
    with pytest.raises(Interrupted) as caught:
        with signals:
            signal.raise_signal(first)
            signal.raise_signal(later)  # during the agent's shutdown of the ranks
    assert caught.value.signum == first and signals.received == first
    # after the launch returned: rrfp run keeps what finished, then exits; a signal now must change nothing
    for _ in range(3):
        signal.raise_signal(later)
    assert reached == []
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in SIGNALS)


def test_without_a_signal_the_launcher_restores_the_handlers(reached):
    before = {s: signal.getsignal(s) for s in SIGNALS}
    with _FirstSignal():
        pass
    assert {s: signal.getsignal(s) for s in SIGNALS} == before
    signal.raise_signal(signal.SIGINT)
    assert reached == [signal.SIGINT]


def test_a_rank_raises_on_its_first_signal_only(reached):
    for s in SIGNALS:
        signal.signal(s, interrupted_once)
    with pytest.raises(Interrupted) as caught:
        signal.raise_signal(signal.SIGINT)  # the terminal's Ctrl-C
    assert caught.value.signum == signal.SIGINT
    # the agent's SIGTERM, and more Ctrl-C, while the rank writes its report and closes its trace
    for later in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.raise_signal(later)
        except Interrupted:
            pytest.fail(f"a later {later.name} cut the rank's shutdown short")


def test_a_failed_rank_writes_its_report_whole_through_the_agents_sigterm(reached, tmp_path, monkeypatch):
    """[Note: a failed rank's report is written whole] in runtime/run/worker.py: the agent's SIGTERM lands while
    a rank writes the report of the transport error its neighbour's failure caused; the report is still
    written whole, so the diagnosis does not take this rank for one that died without a report, and the
    SIGTERM then stops the rank as it would have."""
    for s in SIGNALS:
        signal.signal(s, interrupted_once)
    write = health.write_text

    def sigterm_then_write(path, text):
        signal.raise_signal(signal.SIGTERM)  # the agent, which saw the failed rank exit
        write(path, text)

    monkeypatch.setattr(health, "write_text", sigterm_then_write)
    ctx = RankContext(0, 3, 0, "cpu", tmp_path)
    ctx.current.update(job="ready-1f1b@1f1b", iteration=2)
    try:
        raise TransportError("rank 0: the link from rank 1 closed")
    except TransportError as err:
        with pytest.raises(Interrupted) as caught:  # once the report is on disk
            report_failure(ctx, err, health.Watchdog(10.0, lambda seconds: None, lambda: None))
    assert caught.value.signum == signal.SIGTERM
    report = json.loads((tmp_path / "failures" / "rank0-error.json").read_text())
    assert report["kind"] == "transport" and report["iteration"] == 2 and "closed" in report["error"]
    signal.raise_signal(signal.SIGINT)  # and later ones change nothing: one interrupt, one shutdown
    assert reached == []


def test_without_an_interrupt_a_failed_rank_keeps_its_handlers(reached, tmp_path):
    for s in SIGNALS:
        signal.signal(s, interrupted_once)
    ctx = RankContext(0, 3, 0, "cpu", tmp_path)
    report_failure(ctx, RuntimeError("boom"), health.Watchdog(10.0, lambda seconds: None, lambda: None))
    assert json.loads((tmp_path / "failures" / "rank0-error.json").read_text())["kind"] == "error"
    assert all(signal.getsignal(s) is interrupted_once for s in SIGNALS)  # a later SIGTERM still stops it


# [Note: a library's own SIGINT handler] in runtime/run/launch.py: the launcher's shutdown turns metrics.jsonl into
# metrics.parquet with polars while later Ctrl-Cs are ignored. In a fresh interpreter (polars not yet imported):
# ignore interrupts as the shutdown does, then write metrics.parquet over and over while SIGINTs arrive.
SHUTDOWN_UNDER_CTRL_C = """
import json, os, signal, sys, threading
from pathlib import Path
from runtime.run import launch
from runtime.run.metrics import salvage_metrics
if sys.argv[1] == "as-launch-does":
    launch._import_signal_handling_libraries()
launch._ignore_interrupts()  # the first interrupt's shutdown: later ones change nothing
out = Path(sys.argv[2])
rows = "".join(json.dumps({"iteration": k, "loss": 0.5, "wall_seconds": 0.1, "note": "x" * 50}) + "\\n"
               for k in range(50_000))
def burst():  # until the end: Ctrl-C held down
    while True:
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(0.002)
threading.Thread(target=burst, daemon=True).start()
try:
    for _ in range(6):
        (out / "metrics.jsonl").write_text(rows)
        salvage_metrics(out)
except KeyboardInterrupt:
    print("cut short")
    sys.exit(1)
print("kept", (out / "metrics.parquet").stat().st_size > 0)
"""


@pytest.mark.parametrize("order", ["as-launch-does", "polars-imported-late"])
def test_a_later_ctrl_c_cannot_cut_the_shutdowns_parquet_short(tmp_path, order):
    import subprocess
    import sys

    from tests.helpers.cli import child_env

    done = subprocess.run([sys.executable, "-c", SHUTDOWN_UNDER_CTRL_C, order, str(tmp_path)], env=child_env(),
                          capture_output=True, text=True, timeout=120)
    if order == "as-launch-does":
        assert done.returncode == 0 and done.stdout == "kept True\n", done.stderr
    else:  # what the launcher did before: the test can tell (polars' handler still works this way)
        assert done.returncode == 1 and done.stdout == "cut short\n", done.stderr
