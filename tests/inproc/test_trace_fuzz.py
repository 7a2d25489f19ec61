"""Every `rrfp trace` subcommand on random, truncated, bit-flipped and spliced traces: exit 0, or exit 2 with one
`error:` line; never a traceback or an internal error."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cli import TRACE_COMMANDS, run_cli
from tests.helpers.trace_builder import MISALIGNED, build_run

EXAMPLES = int(os.environ.get("RRFP_FUZZ_EXAMPLES", "12"))


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    run = build_run(tmp_path_factory.mktemp("fuzz") / "run", **MISALIGNED, iterations=2, period_us=200,
                    steps={0: (116, 120, 130), 1: (93, 97, 130)})
    return (run / "trace.pftrace").read_bytes()


def _damaged(data, valid: bytes) -> bytes:
    choice = data.draw(st.sampled_from(["random", "truncate", "flip", "splice", "drop"]))
    if choice == "random":
        return data.draw(st.binary(min_size=0, max_size=512))
    if choice == "truncate":
        return valid[: data.draw(st.integers(0, len(valid)))]
    if choice == "flip":
        position = data.draw(st.integers(0, len(valid) - 1))
        return valid[:position] + bytes([valid[position] ^ data.draw(st.integers(1, 255))]) + valid[position + 1:]
    if choice == "drop":  # a run of bytes cut out of the middle
        start = data.draw(st.integers(0, len(valid) - 1))
        return valid[:start] + valid[start + data.draw(st.integers(1, 200)):]
    return data.draw(st.binary(max_size=64)) + valid[data.draw(st.integers(0, len(valid))):]


@pytest.mark.parametrize("command", sorted(TRACE_COMMANDS) + ["merge"])
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_every_subcommand_survives_damaged_traces(tmp_path_factory, valid, command, data):
    root = tmp_path_factory.getbasetemp() / f"fuzz-{command}"
    run = root / "run"
    (run / "trace").mkdir(parents=True, exist_ok=True)
    blob = _damaged(data, valid)
    if command == "merge":  # the damaged bytes as one rank's file, merged with a whole one
        (run / "trace" / "rank0.pftrace").write_bytes(blob)
        (run / "trace" / "rank1.pftrace").write_bytes(valid)
        args = ["merge", run, "--out", root / "merged.pftrace", "--force"]
    else:
        (run / "trace.pftrace").write_bytes(blob)
        extra = TRACE_COMMANDS[command]({"run": run / "trace.pftrace", "dir": root})
        args = [command, run / "trace.pftrace", *extra] + (["--force"] if command in ("export", "timeline") else [])
    for json_mode in ([], ["--json"]):
        done = run_cli(root, "trace", *args, *json_mode)
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done
        if done.returncode != 0:
            errors = [line for line in done.stderr.strip().splitlines() if line.startswith("error: ")]
            assert done.returncode == 2 and len(errors) == 1, done
