"""The ``rrfp`` CLI end to end through its in-process runner ([Note: the two CLI runners] in tests/helpers/cli.py):
``rrfp_cli.app.main`` with the exit code, stdout and stderr a subprocess would give.

Every command runs with ``cwd`` a fresh ``tmp_path``. User errors must be exactly one ``error:`` line on
stderr with exit code 2 and never a traceback; ``RRFP_DEBUG`` is removed from the environment so a
developer's shell setting cannot change that. What importing the CLI imports is a subprocess's business:
tests/cli/test_lazy_imports.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hints.orders import BUILTIN_HINTS, applicable_builtins
from tests.helpers.cli import Result, run_cli


def rrfp(cwd: Path, *args: str) -> Result:
    return run_cli(cwd, *args)


def ok(cwd: Path, *args: str) -> Result:
    proc = rrfp(cwd, *args)
    assert proc.returncode == 0, f"rrfp {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
    return proc


def ok_json(cwd: Path, *args: str) -> dict:
    proc = ok(cwd, *args, "--json")
    return json.loads(proc.stdout)  # the whole of stdout is one JSON document


def user_error(cwd: Path, *args: str) -> str:
    """Run a command that must fail on bad input; return its one error line."""
    proc = rrfp(cwd, *args)
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{proc.stderr}"
    assert lines[0].startswith("error: ")
    return lines[0]


def write_hint(path: Path, ranks: int, microbatches: int, orders: list[list[str]]) -> Path:
    path.write_text(json.dumps({
        "format": "rrfp-hint/1",
        "shape": {"ranks": ranks, "chunks": 1, "microbatches": microbatches},
        "orders": orders,
    }))
    return path


ONE_F_ONE_B_P2_M2 = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


# -- hints -------------------------------------------------------------------------


def test_hints_list(tmp_path):
    out = ok(tmp_path, "hints", "list").stdout
    for name in BUILTIN_HINTS:
        assert name in out
    assert "torch:Interleaved1F1B" in out and "planned (" in out


def test_hints_list_json(tmp_path):
    data = ok_json(tmp_path, "hints", "list")
    assert [row["name"] for row in data["builtins"]] == list(BUILTIN_HINTS)
    assert {row["name"]: row["split_backward"] for row in data["builtins"]}["zb"] is True
    assert "torch:1F1B" in data["torch"]
    from runtime.sched.baselines import PLANNED

    assert data["planned"]["name"] == PLANNED


def test_hints_show(tmp_path):
    out = ok(tmp_path, "hints", "show", "1f1b", "--stages", "4", "--microbatches", "8").stdout
    assert "rank 3" in out
    rank3 = next(line for line in out.splitlines() if line.startswith("rank 3"))
    assert rank3.split("|")[1].split() == [
        "3F0", "3B0", "3F1", "3B1", "3F2", "3B2", "3F3", "3B3",
        "3F4", "3B4", "3F5", "3B5", "3F6", "3B6", "3F7", "3B7",
    ]


def test_hints_show_json(tmp_path):
    data = ok_json(tmp_path, "hints", "show", "zb", "-p", "4", "-m", "8")
    assert data["format"] == "rrfp-hint/1"
    assert data["name"] == "zb"
    assert data["shape"] == {"ranks": 4, "chunks": 1, "microbatches": 8, "split_backward": True}
    assert len(data["orders"]) == 4
    assert all(len(order) == 8 * 3 for order in data["orders"])


def test_hints_check_builtin(tmp_path):
    data = ok_json(tmp_path, "hints", "check", "interleaved-1f1b", "-p", "4", "-v", "2", "-m", "8")
    assert data["valid"] is True and data["completes"] is True
    checked = " ".join(ok(tmp_path, "hints", "check", "1f1b", "-p", "4", "-m", "8").stdout.split())
    assert checked == "ok: 1f1b (4 ranks x 1 chunks, 8 microbatches) is valid and completes under the fixed policy"


def test_hints_export_then_use_the_files(tmp_path):
    ok(tmp_path, "hints", "export", "1f1b", "-p", "4", "-m", "8", "--out", "x.json", "--torch-csv", "x.csv")
    assert json.loads((tmp_path / "x.json").read_text())["format"] == "rrfp-hint/1"
    assert len((tmp_path / "x.csv").read_text().splitlines()) == 4

    shown = ok_json(tmp_path, "hints", "show", "x.json")
    assert shown["name"] == "1f1b"
    assert "rank 3" in ok(tmp_path, "hints", "show", "x.json").stdout

    result = ok_json(tmp_path, "simulate", "--hint", "x.csv")
    assert result["hint"] == "x"
    assert result["shape"]["ranks"] == 4 and result["shape"]["microbatches"] == 8
    assert result["makespan"] == pytest.approx(0.33, abs=1e-9)


def test_hints_export_needs_a_destination(tmp_path):
    proc = rrfp(tmp_path, "hints", "export", "1f1b", "-p", "4", "-m", "8")
    assert proc.returncode == 2
    assert "--out" in proc.stderr
    assert "Traceback" not in proc.stderr
    line = user_error(tmp_path, "hints", "export", "1f1b", "-p", "4", "-m", "8")
    assert "give --out FILE.json and/or --torch-csv FILE.csv" in line
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_hint_files_fix_their_own_chunks(tmp_path):
    # --chunks is optional: a file with 2 chunks needs no -v, and a disagreeing -v is an error.
    ok(tmp_path, "hints", "export", "interleaved-1f1b", "-p", "2", "-v", "2", "-m", "4", "--out", "i.json")
    assert ok_json(tmp_path, "hints", "show", "i.json")["shape"]["chunks"] == 2
    assert ok_json(tmp_path, "simulate", "--hint", "i.json")["shape"]["chunks"] == 2
    result = rrfp(tmp_path, "simulate", "--hint", "i.json", "-v", "1")
    assert result.returncode == 2
    assert "the file is for chunks 2 but --chunks 1 was asked" in result.stderr


# -- simulate ------------------------------------------------------------------------


def test_simulate_uniform_makespan(tmp_path):
    data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8")
    # Uniform default: forward 0.01 s, backward 0.02 s, no latency: (m + p - 1) * 0.03.
    assert abs(data["makespan"] - 0.33) < 1e-9
    for key in ("busy", "idle", "bubble_fraction"):
        assert key in data
    assert data["busy"] == pytest.approx([0.24] * 4, abs=1e-12)
    assert data["idle"] == pytest.approx([0.09] * 4, abs=1e-12)
    assert data["bubble_fraction"] == pytest.approx(3 / 11, abs=1e-12)  # (p-1) / (m+p-1)


def test_simulate_the_planned_order_fixed_keeps_to_its_budget(tmp_path):
    for budget in ("1f1b", "2x"):
        data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--workload", "multimodal", "--hint", "planned",
                       "--policy", "fixed", "--memory-budget", budget)
        assert data["hint"] == f"planned @{budget}"
        slots = [4, 3, 2, 1] if budget == "1f1b" else [8, 6, 4, 2]
        assert all(peak <= slot for peak, slot in zip(data["peak_in_flight"], slots))


def test_simulate_human_output(tmp_path):
    out = ok(tmp_path, "simulate", "-p", "4", "-m", "8").stdout
    assert "makespan" in out and "330.00 ms" in out


def test_simulate_compare(tmp_path):
    data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--workload", "multimodal")
    expected = set(applicable_builtins(4, 1, 8)) | {"cp"}
    assert expected == {"gpipe", "1f1b", "bf", "bfw", "1f1b-light", "1f1b-heavy", "zb", "cp"}
    expected.add("planned @1f1b")  # [Note: planned orders]
    pairs = {(row["hint"], row["rule"]) for row in data["rows"]}
    assert pairs == {(name, rule) for name in expected for rule in ("fixed", "greedy", "lookahead")}
    assert len(data["rows"]) == 3 * len(expected)
    assert data["baseline"] == "1f1b fixed"
    slots = data["memory_budget_slots"]
    assert slots == [4, 3, 2, 1]
    baseline = next(r for r in data["rows"] if r["hint"] == "1f1b" and r["rule"] == "fixed")
    assert baseline["speedup"] == 1.0 and baseline["within_budget"]
    fixed = {r["hint"]: r["makespan"] for r in data["rows"] if r["rule"] == "fixed"}
    for row in data["rows"]:
        assert row["speedup"] == pytest.approx(baseline["makespan"] / row["makespan"])
        assert row["makespan"] >= row["lower_bound"] - 1e-12  # its family's bound
        assert row["lower_bound"] >= data["lower_bound"] - 1e-12  # at least the universal one
        assert row["makespan_over_bound"] == pytest.approx(row["makespan"] / row["lower_bound"])
        assert row["makespan_over_universal_bound"] == pytest.approx(row["makespan"] / data["lower_bound"])
        if row["hint"] in ("gpipe", "1f1b", "bf", "bfw"):
            assert row["lower_bound_family"] == "full-backward"
        if row["hint"] == "zb":
            assert row["lower_bound_family"] == "split"
        assert row["within_budget"] == all(p <= s for p, s in zip(row["peak_in_flight_per_rank"], slots))
        if row["rule"] == "fixed":
            assert row["vs_fixed_same_hint"] is None
        else:  # readiness itself: the same hint's fixed order over this row
            assert row["within_budget"]
            assert row["vs_fixed_same_hint"] == pytest.approx(fixed[row["hint"]] / row["makespan"])
    # Fixed gpipe holds every microbatch: not at equal memory with the 1f1b budget.
    assert not next(r for r in data["rows"] if r["hint"] == "gpipe" and r["rule"] == "fixed")["within_budget"]
    # The credit: the fastest fixed order and ready run that kept to the budget, and their ratio.
    within = [r for r in data["rows"] if r["within_budget"]]
    best_fixed = min((r for r in within if r["rule"] == "fixed"), key=lambda r: r["makespan"])
    best_ready = min((r for r in within if r["rule"] != "fixed"), key=lambda r: r["makespan"])
    credit = data["credit"]
    assert (credit["best_fixed"]["hint"], credit["best_ready"]["makespan"]) == (best_fixed["hint"],
                                                                               best_ready["makespan"])
    assert credit["ready_over_best_fixed"] == pytest.approx(best_fixed["makespan"] / best_ready["makespan"])


def test_simulate_compare_sorted_baselines_fill_the_budget(tmp_path):
    """At 2x the sorted 1F1Bs run again with warm-ups that fill each rank's slots, and stay within them."""
    data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--workload", "vlm-mixed",
                   "--memory-budget", "2x")
    slots = data["memory_budget_slots"]
    assert slots == [8, 6, 4, 2]
    for name in ("1f1b-light @2x", "1f1b-heavy @2x"):
        row = next(r for r in data["rows"] if r["hint"] == name and r["rule"] == "fixed")
        assert row["peak_in_flight_per_rank"] == slots and row["within_budget"]
    plain = next(r for r in data["rows"] if r["hint"] == "1f1b-light" and r["rule"] == "fixed")
    assert plain["peak_in_flight_per_rank"] == [4, 3, 2, 1]
    out = ok(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--workload", "vlm-mixed",
             "--memory-budget", "2x").stdout
    assert "Best fixed order within the budget" in " ".join(out.split())


def test_simulate_compare_table_marks_memory(tmp_path):
    out = ok(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare").stdout
    assert "at equal memory" in out and "over the budget" in out and "ready+la" in out


def test_simulate_lookahead_flags(tmp_path):
    greedy = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--lookahead", "off")
    default = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8")
    assert (greedy["rule"], greedy["lookahead"]) == ("greedy", False)
    assert (default["rule"], default["lookahead"]) == ("lookahead", True)
    fixed = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--policy", "fixed")
    assert fixed["rule"] == "fixed"


def test_simulate_blocking_p2p(tmp_path):
    # [Note: blocking p2p]: with a latency on every message, blocking 1F1B pays it after each post.
    args = ("simulate", "-p", "4", "-m", "8", "--policy", "fixed", "--comm-latency", "0.001")
    async_run = ok_json(tmp_path, *args)
    blocking = ok_json(tmp_path, *args, "--p2p", "blocking")
    assert (async_run["p2p"], blocking["p2p"]) == ("async", "blocking")
    assert blocking["makespan"] > async_run["makespan"]
    assert "1f1b under fixed with blocking p2p" in ok(tmp_path, *args, "--p2p", "blocking").stdout
    refused = rrfp(tmp_path, "simulate", "-p", "4", "-m", "8", "--p2p", "blocking")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: --p2p: blocking applies to --policy fixed only (this is ready)")
    assert len(refused.stderr.strip().splitlines()) == 1


def test_simulate_compare_blocking_rows(tmp_path):
    data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--workload", "multimodal",
                   "--jitter", "0.2", "--comm-latency", "0.001", "--p2p", "blocking")
    blocking = {r["hint"]: r for r in data["rows"] if r["p2p"] == "blocking"}
    fixed = {r["hint"]: r for r in data["rows"] if r["rule"] == "fixed" and r["p2p"] == "async"}
    assert set(blocking) | set(data["blocking_p2p_deadlocks"]) == set(fixed)
    assert "1f1b" in blocking
    for hint, row in blocking.items():
        assert row["label"] == "fixed (blocking p2p)" and fixed[hint]["label"] == "fixed"
        assert row["makespan"] >= fixed[hint]["makespan"]
    assert blocking["1f1b"]["speedup"] < 1.0  # the baseline stays async fixed 1F1B
    out = ok(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--p2p", "blocking", "--comm-latency",
             "0.001").stdout
    assert "blocking p2p" in out
    shown = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--p2p", "blocking", "--comm-latency",
                    "0.001")
    blocking_rows = [row for row in shown["rows"] if row["p2p"] == "blocking"]
    assert blocking_rows and all(f"{row['makespan'] * 1e3:.2f}" in out for row in blocking_rows)  # each is shown


def test_simulate_task_overhead(tmp_path):
    # Every task waits 1 ms after its decision: 1F1B's critical path holds 2 * (m + p - 1) tasks.
    data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--policy", "fixed", "--task-overhead", "0.001")
    assert data["makespan"] == pytest.approx(0.33 + 2 * 11 * 0.001, abs=1e-9)
    assert data["busy"] == pytest.approx([0.24] * 4, abs=1e-12)


def test_simulate_recorded_durations(tmp_path):
    rows = ["stage,kind,microbatch,duration"]
    rows += [f"{s},{k},{i},{0.01 if k == 'F' else 0.02}" for s in range(2) for k in "FB" for i in range(4)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    data = ok_json(tmp_path, "simulate", "-p", "2", "-m", "4", "--durations", "d.csv")
    assert abs(data["makespan"] - (4 + 2 - 1) * 0.03) < 1e-9
    # a recorded table keeps the split it recorded: a price for it would be silently ignored
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--durations", "d.csv", "--hint", "zb",
                      "--split-overhead", "3")
    assert "--split-overhead" in line and "recorded" in line


def test_simulate_v_placement(tmp_path):
    # zbv is a V order: --placement v and 2 chunks by default. Uniform default, F = 5 ms per chunk and
    # I = W = 5 ms: ZB-V keeps every rank busy from its start (rank r at r * 5 ms) for 6m * 5 ms.
    data = ok_json(tmp_path, "simulate", "--hint", "zbv", "-p", "4", "-m", "8", "--policy", "fixed")
    assert data["shape"] == {"ranks": 4, "chunks": 2, "microbatches": 8, "split_backward": True, "placement": "v"}
    assert data["makespan"] == pytest.approx((6 * 8 + 3) * 0.005, abs=1e-12)
    assert data["peak_in_flight"] == [8] * 4
    compared = ok_json(tmp_path, "simulate", "--placement", "v", "-p", "4", "-m", "8", "--compare")
    assert compared["baseline"] == "zbv fixed" and compared["memory_budget_slots"] == [8] * 4
    assert {row["hint"] for row in compared["rows"]} == {"gpipe", "bf", "bfw", "zbv", "cp", "planned @1f1b"}
    assert "vs ZB-V" in ok(tmp_path, "simulate", "--placement", "v", "-p", "4", "-m", "8", "--compare").stdout
    torch_zbv = ok_json(tmp_path, "simulate", "--hint", "torch:ZBVZeroBubble", "-p", "4", "-m", "8",
                        "--policy", "fixed")
    assert torch_zbv["makespan"] == data["makespan"] and torch_zbv["shape"]["placement"] == "v"


def test_v_hints_export_check_and_show(tmp_path):
    out = ok(tmp_path, "hints", "export", "zbv", "-p", "3", "-m", "6", "--out", "v.json", "--torch-csv", "v.csv")
    assert "3 ranks x 2 chunks (V), 6 microbatches" in out.stdout
    assert json.loads((tmp_path / "v.json").read_text())["placement"] == "v"
    for name in ("v.json", "v.csv"):  # the CSV's placement is inferred from its stage ids
        assert ok_json(tmp_path, "hints", "check", name)["shape"]["placement"] == "v"
    assert "5F0" in ok(tmp_path, "hints", "show", "gpipe", "--placement", "v", "-p", "3", "-m", "2").stdout


# -- bad input: one error line, exit 2 ---------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["simulate", "--hint", "zbv", "-p", "4", "-v", "3", "-m", "8"],
     "error: --chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 3"),
    (["simulate", "--placement", "v", "-p", "4", "-v", "4", "-m", "8"],
     "error: --chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 4"),
    (["simulate", "--hint", "torch:ZBVZeroBubble", "-p", "4", "-v", "1", "-m", "8"],
     "error: --chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 1"),
    (["simulate", "--hint", "zb", "--placement", "v", "-p", "4", "-m", "8"],
     "error: zb places stages in a loop (stage k on rank k % p); it has no v order"),
    (["hints", "show", "zbv", "--placement", "looping", "-p", "2", "-m", "4"],
     "error: zbv places stages in a V (rank r holds stages r and 2p-1-r); it has no looping order"),
    (["simulate", "--placement", "w", "-p", "4", "-m", "8"], "error: Invalid value for '--placement'"),
])
def test_error_v_shapes(tmp_path, args, message):
    assert user_error(tmp_path, *args).startswith(message)


def test_error_v_hint_file_with_odd_chunks(tmp_path):
    data = json.loads(ok(tmp_path, "hints", "export", "gpipe", "-p", "2", "-v", "3", "-m", "2", "--out",
                         "g.json").stdout and (tmp_path / "g.json").read_text())
    data["placement"] = "v"
    (tmp_path / "g.json").write_text(json.dumps(data))
    line = user_error(tmp_path, "simulate", "--hint", "g.json")
    # the file's key, not a flag nobody typed ([Note: inputs in messages])
    assert line == "error: g.json: shape: chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 3"


def test_error_csv_that_follows_neither_placement(tmp_path):
    (tmp_path / "odd.csv").write_text("0F0,1F0,1B0,0B0\n2F0,3F0,3B0,2B0\n")
    assert user_error(tmp_path, "simulate", "--hint", "odd.csv") == (
        "error: odd.csv: the stage-to-rank mapping does not follow either placement: looping placement puts "
        "stage 1 on rank 1, not 0; V placement puts stage 1 on rank 1, not 0")
    ok(tmp_path, "hints", "export", "zbv", "-p", "2", "-m", "4", "--torch-csv", "v.csv")
    assert user_error(tmp_path, "hints", "check", "v.csv", "--placement", "looping") == (
        "error: v.csv: the stage-to-rank mapping does not follow the looping placement: looping placement puts "
        "stage 2 on rank 0, not 1")


def test_error_malformed_json_hint(tmp_path):
    (tmp_path / "bad.json").write_text('{"format": "rrfp-hint/1",\n')
    line = user_error(tmp_path, "hints", "show", "bad.json")
    assert line.startswith("error: bad.json: not valid JSON")
    assert "line 2" in line
    line = user_error(tmp_path, "simulate", "--hint", "bad.json")
    assert line.startswith("error: bad.json: not valid JSON")


def test_error_wrong_shape_file(tmp_path):
    write_hint(tmp_path / "h.json", 2, 2, ONE_F_ONE_B_P2_M2)
    line = user_error(tmp_path, "simulate", "--hint", "h.json", "--microbatches", "4")
    assert line == "error: h.json: the file is for microbatches 2 but --microbatches 4 was asked"
    line = user_error(tmp_path, "hints", "show", "h.json", "-m", "4")
    assert "--microbatches 4" in line


def test_error_duplicate_task(tmp_path):
    orders = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F0", "1B1"]]
    write_hint(tmp_path / "dup.json", 2, 2, orders)
    line = user_error(tmp_path, "hints", "check", "dup.json")
    assert line == "error: dup.json: rank 1: task 1F0 appears twice (steps 0 and 2)"


def test_error_missing_task(tmp_path):
    orders = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1"]]
    write_hint(tmp_path / "short.json", 2, 2, orders)
    line = user_error(tmp_path, "simulate", "--hint", "short.json")
    assert line == "error: short.json: rank 1: task 1B1 missing"


def test_error_unknown_hint_name(tmp_path):
    line = user_error(tmp_path, "simulate", "-p", "4", "-m", "8", "--hint", "one-f-one-b")
    assert line.startswith("error: unknown hint 'one-f-one-b'")
    assert "1f1b" in line  # lists the built-ins
    line = user_error(tmp_path, "hints", "show", "one-f-one-b")
    assert line.startswith("error: unknown hint 'one-f-one-b'")


def _durations_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _uniform_rows() -> list[str]:
    return [f"{s},{k},{i},0.01" for s in range(2) for k in "FB" for i in range(4)]


def test_error_negative_duration(tmp_path):
    rows = _uniform_rows()
    rows[1] = "0,F,1,-0.5"
    _durations_csv(tmp_path / "neg.csv", "stage,kind,microbatch,duration", rows)
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--durations", "neg.csv")
    assert line == "error: neg.csv: row 3: duration of 0F1 must be a number >= 0, got -0.5"


def test_error_missing_durations_column(tmp_path):
    rows = [",".join(r.split(",")[i] for i in (0, 1, 3)) for r in _uniform_rows()]
    _durations_csv(tmp_path / "nocol.csv", "stage,kind,duration", rows)
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--durations", "nocol.csv")
    assert line.startswith("error: nocol.csv: missing column 'microbatch'")


def test_error_memory_budget_below_chunk_count(tmp_path):
    line = user_error(tmp_path, "simulate", "-p", "2", "-v", "2", "-m", "4", "--hint", "interleaved-1f1b",
                      "--memory-budget", "1")
    assert line.startswith("error: --memory-budget: 1 gives 1 slot(s)")
    assert "needs 2 slot(s)" in line


def test_error_unparseable_memory_budget(tmp_path):
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--memory-budget", "lots")
    assert line.startswith("error: --memory-budget: 'lots' is not a budget")


def test_error_lookahead_with_fixed_policy(tmp_path):
    line = user_error(tmp_path, "simulate", "-p", "4", "-m", "8", "--policy", "fixed", "--lookahead", "on")
    assert line.startswith("error: --lookahead: ") and "--policy ready" in line
    line = user_error(tmp_path, "simulate", "-p", "4", "-m", "8", "--compare", "--lookahead", "off")
    assert line.startswith("error: --lookahead: ")


def test_error_cp_with_durations_that_lack_a_stage(tmp_path):
    rows = [r for r in _uniform_rows() if not r.startswith("1,")]  # stage 1 missing
    _durations_csv(tmp_path / "partial.csv", "stage,kind,microbatch,duration", rows)
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--hint", "cp", "--durations", "partial.csv")
    assert line == "error: partial.csv: no duration for task 1F0"


def test_error_nan_duration(tmp_path):
    rows = _uniform_rows()
    rows[2] = "0,F,2,nan"
    _durations_csv(tmp_path / "nan.csv", "stage,kind,microbatch,duration", rows)
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--durations", "nan.csv")
    assert line.startswith("error: nan.csv: row 4: duration of 0F2 must be a number >= 0")


def test_error_negative_task_overhead(tmp_path):
    line = user_error(tmp_path, "simulate", "-p", "2", "-m", "4", "--task-overhead", "-1")
    assert "--task-overhead" in line


def test_error_simulate_without_shape(tmp_path):
    line = user_error(tmp_path, "simulate")
    assert "--ranks" in line and "--microbatches" in line


# -- deadlock report ---------------------------------------------------------------------


def test_hints_check_reports_a_deadlocking_order(tmp_path):
    # Structurally valid, but rank 1 insists on microbatch 1 first while rank 0 waits for 1B0.
    write_hint(tmp_path / "dl.json", 2, 2, [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]])
    proc = rrfp(tmp_path, "hints", "check", "dl.json")

    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error: ")
    assert "cannot complete" in lines[0]
    assert "fixed" in lines[0]
    grid = "\n".join(lines[1:])
    assert "rank 0 | 0F0" in grid
    assert ">0B0?<" in grid  # the blocked step is marked
    assert ">1F1?<" in grid
    assert "<-- step 1" in grid
    assert "0B0, which needs 1B0 (rank 1)" in grid


@pytest.mark.parametrize("flag, target, why", [
    ("--out", "nowhere/h.json", "no such directory 'nowhere'"),
    ("--out", ".", "is a directory; give a file name"),
    ("--torch-csv", "nowhere/h.csv", "no such directory 'nowhere'"),
    ("--torch-csv", "h.json", "writes torch's CSV; give a name ending in .csv"),
    ("--out", "h.csv", "writes rrfp-hint JSON; give a name ending in .json"),
])
def test_error_hints_export_where_it_cannot_write(tmp_path, flag, target, why):
    line = user_error(tmp_path, "hints", "export", "1f1b", "-p", "2", "-m", "4", flag, target)
    assert line == f"error: {flag} {target}: {why}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, line", [
    (["simulate", "-p", "0"], "error: Invalid value for '--ranks' / '-p' / '--stages': Input should be greater than or equal to 1 "
                              "(see rrfp simulate --help)"),
    (["run", "--nope"], "error: No such option: --nope (Possible options: --compare, --no-trace, --nproc) "
                        "(see rrfp run --help)"),
    (["trace", "summary"], "error: Missing argument 'RUN'. (see rrfp trace summary --help)"),
])
def test_usage_errors_are_one_line_too(tmp_path, args, line):
    assert user_error(tmp_path, *args) == line


def test_a_group_alone_prints_its_help(tmp_path):
    proc = rrfp(tmp_path, "trace")
    assert proc.returncode == 2 and "summary" in proc.stdout + proc.stderr and "error" not in proc.stderr
    # the group's own help, on stdout: its usage line and every subcommand with its one-line description
    import typer

    from rrfp_cli.app import app

    group = typer.main.get_command(app).commands["trace"]
    assert "Usage: rrfp trace [OPTIONS] COMMAND [ARGS]..." in proc.stdout and proc.stderr.strip() == ""
    commands = proc.stdout.partition("Commands:\n")[2].splitlines()
    listed = {line.split()[0] for line in commands if line.startswith("  ") and not line.startswith("   ")}
    assert set(group.commands) <= listed and len(group.commands) >= 10


def test_split_overhead_slows_a_split_hint_only_and_bad_values_are_one_line(tmp_path):
    base = ("simulate", "-p", "4", "-m", "8", "--policy", "fixed")
    free = ok_json(tmp_path, *base, "--hint", "zb")["makespan"]
    costly = ok_json(tmp_path, *base, "--hint", "zb", "--split-overhead", "1.5")["makespan"]
    assert free == pytest.approx(0.27) and costly > free  # F 10 ms, B 20 ms: W goes from 10 to 20 ms
    assert ok_json(tmp_path, *base, "--hint", "1f1b", "--split-overhead", "1.5")["makespan"] == \
        ok_json(tmp_path, *base, "--hint", "1f1b")["makespan"]  # no split, no overhead
    for bad in ("0.5", "nan"):
        assert "split-overhead" in user_error(tmp_path, *base, "--hint", "zb", "--split-overhead", bad)
    assert "--split-overhead" in user_error(tmp_path, "run", "--workload", "emulated", "--split-overhead", "0.9")


def test_hints_cp_for_a_workload_names_its_fused_stages_and_refuses_bad_knobs(tmp_path):
    """``--workload`` / ``--split-overhead`` on ``hints show|export``: cp's split follows the workload's costs
    ([Note: which stages split]); bad values are one error line, exit 2, and no file."""
    dear = ok_json(tmp_path, "hints", "show", "cp", "-p", "4", "-m", "8", "--workload", "legacy-multimodal",
                   "--split-overhead", "2")
    assert dear["shape"]["fused_stages"] == [0, 1, 2, 3]
    free = ok_json(tmp_path, "hints", "show", "cp", "-p", "4", "-m", "8", "--split-overhead", "1")
    assert 3 not in free["shape"].get("fused_stages", [])  # a free split is taken on the last stage
    assert "fused at stages 0-3" in ok(tmp_path, "hints", "export", "cp", "-p", "4", "-m", "8", "--split-overhead",
                                        "2", "--workload", "legacy-multimodal", "--out", "cp.json").stdout
    assert json.loads((tmp_path / "cp.json").read_text())["shape"]["fused_stages"] == [0, 1, 2, 3]
    assert user_error(tmp_path, "hints", "show", "cp", "-p", "4", "-m", "8", "--split-overhead", "0.5") == (
        "error: --split-overhead: must be a finite number >= 1 (I + W over B), got 0.5")
    assert user_error(tmp_path, "hints", "export", "cp", "-p", "4", "-m", "8", "--split-overhead", "nan",
                      "--out", "bad.json").startswith("error: --split-overhead: must be a finite number >= 1")
    assert user_error(tmp_path, "hints", "export", "cp", "-p", "4", "-m", "8", "--workload", "nope",
                      "--torch-csv", "bad.csv").startswith("error: Invalid value for '--workload'")
    assert not (tmp_path / "bad.json").exists() and not (tmp_path / "bad.csv").exists()


def test_simulate_auto_policy_over_iterations(tmp_path):
    data = ok_json(tmp_path, "simulate", "-p", "4", "-m", "8", "--workload", "sft-chat", "--jitter", "0.2",
                   "--policy", "auto", "--iters", "5", "--unknown", "moe=1.6")
    rows = data["iterations"]
    assert [r["iteration"] for r in rows] == list(range(5)) and rows[0]["reason"] == "nothing observed yet"
    assert data["auto_s"] == pytest.approx(sum(r["makespan_s"] for r in rows))
    assert data["ready_s"] == pytest.approx(sum(r["ready_s"] for r in rows))
    assert data["switches"] == sum(1 for a, b in zip(rows, rows[1:]) if a["rule"] != b["rule"])
    assert data["source"]["model"]["unknown"] == "moe=1.6"
    human = ok(tmp_path, "simulate", "-p", "4", "-m", "8", "--policy", "auto", "--iters", "3").stdout
    assert "always-ready" in human and "switch" in human


@pytest.mark.parametrize("args, says", [
    (("simulate", "-p", "4", "-m", "8", "--iters", "3"), "--iters: simulates iterations under --policy auto"),
    (("simulate", "-p", "4", "-m", "8", "--policy", "auto", "--compare"), "--iters"),
    (("simulate", "-p", "4", "-m", "8", "--unknown", "moe=0.5"), "--unknown: moe must be >= 1"),
    (("simulate", "-p", "4", "-m", "8", "--unknown", "spin=1"), "--unknown: 'spin=1' is not KIND=LEVEL"),
    (("tune-hint", "--workload", "sft-chat", "-p", "4", "-m", "8", "--policy", "auto", "--out", "t"), "--policy"),
    (("tune-hint", "--durations", "x.csv", "--unknown", "moe=2", "--out", "t"), "--unknown"),
    (("run", "--unknown", "moe=2"), "--unknown: draws into the emulated workload's durations"),
    (("bench", "--out", "b", "--unknown-sweep", "moe=1.3:0.5"), "--unknown-sweep: moe must be >= 1"),
    (("bench", "--out", "b", "--unknown-sweep", "moe"), "--unknown-sweep: 'moe' is not KIND=LEVEL"),
])
def test_unknown_and_auto_bad_input(tmp_path, args, says):
    assert says in user_error(tmp_path, *args)
