"""Duration tables on disk: round trips, old tables, and one UserError per bad latency."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hints.errors import UserError
from hints.outputs import DiskError
from hints.tasks import PipelineShape
from runtime.durations.tables import (
    check_destination,
    duration_rows,
    durations_frame_rows,
    load_durations,
    write_durations,
)
from runtime.durations.variability import Durations, VariabilityModel, sample_durations


def make_durations(stages: int, microbatches: int, split: bool, seed: int = 0) -> Durations:
    """Distinct durations and latencies everywhere a message goes (0 where none does)."""
    model = VariabilityModel(workload="language", jitter=0.2, comm_latency=0.001, comm_jitter=0.5)
    table = sample_durations(model, PipelineShape(stages, 1, microbatches), seed)
    if split:  # I and W recorded separately; B is their sum, as a recorded split table loads it
        table.input_grad = [[b * 0.6 for b in row] for row in table.backward]
        table.weight_grad = [[b * 0.4 for b in row] for row in table.backward]
        table.backward = [[i + w for i, w in zip(ri, rw)] for ri, rw in zip(table.input_grad, table.weight_grad)]
    return table


def assert_same(loaded: Durations, written: Durations) -> None:
    assert loaded.forward == written.forward
    assert loaded.backward == written.backward
    assert loaded.send_forward == written.send_forward
    assert loaded.send_backward == written.send_backward
    assert loaded.input_grad == written.input_grad
    assert loaded.weight_grad == written.weight_grad


def write_frame(path, rows: list[dict]) -> None:
    frame = pl.DataFrame(rows)
    if str(path).endswith(".parquet"):
        frame.write_parquet(path)
    else:
        frame.write_csv(path)


# -- round trips -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".pq"])
@pytest.mark.parametrize("split", [False, True])
def test_round_trip_with_latencies(tmp_path, suffix, split):
    table = make_durations(3, 4, split)
    path = tmp_path / f"d{suffix}"
    assert write_durations(path, [(None, table)]) == 3 * 4 * (3 if split else 2)
    assert_same(load_durations(path, 3, 4), table)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary left behind


@settings(max_examples=40)
@given(stages=st.integers(1, 4), microbatches=st.integers(1, 5), split=st.booleans(), seed=st.integers(0, 10**6),
       csv=st.booleans())
def test_round_trip_property(tmp_path_factory, stages, microbatches, split, seed, csv):
    table = make_durations(stages, microbatches, split, seed)
    path = tmp_path_factory.mktemp("rt") / ("d.csv" if csv else "d.parquet")
    write_durations(path, [(None, table)])
    assert_same(load_durations(path, stages, microbatches), table)


def test_several_iterations_in_one_table(tmp_path):
    tables = [(it, make_durations(2, 3, False, seed=it)) for it in (1, 2, 5)]
    path = tmp_path / "d.csv"
    write_durations(path, tables)
    assert pl.read_csv(path).columns == ["iteration", "stage", "kind", "microbatch", "duration", "latency"]
    for it, table in tables:
        assert_same(load_durations(path, 2, 3, iteration=it), table)
    assert_same(load_durations(path, 2, 3), tables[0][1])  # default: the first
    with pytest.raises(UserError, match="no iteration 3"):
        load_durations(path, 2, 3, iteration=3)


def test_rows_carry_latency_only_for_senders():
    table = make_durations(2, 1, split=True)
    rows = {(r["stage"], r["kind"]): r["latency"] for r in duration_rows(table, iteration=4)}
    assert rows[(0, "F")] == table.send_forward[0][0] and rows[(1, "I")] == table.send_backward[1][0]
    assert rows[(1, "F")] is None and rows[(0, "I")] is None and rows[(0, "W")] is None and rows[(1, "W")] is None
    assert all(r["iteration"] == 4 for r in duration_rows(table, iteration=4))
    assert "latency" not in duration_rows(table, latency=False)[0]


def test_writing_without_latency_gives_an_old_table(tmp_path):
    table = make_durations(2, 2, False)
    path = tmp_path / "d.parquet"
    write_durations(path, [(None, table)], latency=False)
    assert pl.read_parquet(path).columns == ["stage", "kind", "microbatch", "duration"]
    loaded = load_durations(path, 2, 2, comm_latency=0.25)
    assert loaded.forward == table.forward and loaded.send_forward == [[0.25, 0.25], [0.0, 0.0]]


# -- old tables ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_old_four_column_tables_load_as_before(tmp_path, suffix):
    table = make_durations(3, 2, False)
    path = tmp_path / f"old{suffix}"
    frame = pl.DataFrame(durations_frame_rows(table), schema=["stage", "kind", "microbatch", "duration"],
                         orient="row")
    frame.write_parquet(path) if suffix == ".parquet" else frame.write_csv(path)
    loaded = load_durations(path, 3, 2, comm_latency=0.5)
    assert loaded.forward == table.forward and loaded.backward == table.backward
    assert loaded.send_forward == [[0.5, 0.5], [0.5, 0.5], [0.0, 0.0]]
    assert loaded.send_backward == [[0.0, 0.0], [0.5, 0.5], [0.5, 0.5]]


# -- latency errors ------------------------------------------------------------------


def rows_2x1(**latencies) -> list[dict]:
    """A 2-stage, 1-microbatch table; ``latencies`` by task text (default: 0.1 for senders, empty otherwise)."""
    defaults = {"0F0": 0.1, "1F0": None, "0B0": None, "1B0": 0.2}
    defaults.update(latencies)
    return [{"stage": int(t[0]), "kind": t[1], "microbatch": 0, "duration": 1.0, "latency": lat}
            for t, lat in defaults.items()]


def test_latency_column_loads_per_message(tmp_path):
    path = tmp_path / "d.csv"
    write_frame(path, rows_2x1())
    loaded = load_durations(path, 2, 1)
    assert loaded.send_forward == [[0.1], [0.0]] and loaded.send_backward == [[0.0], [0.2]]
    write_frame(path, rows_2x1(**{"1F0": 0.0, "0B0": 0}))  # a sender of nothing may say 0
    assert load_durations(path, 2, 1).send_forward == [[0.1], [0.0]]


@pytest.mark.parametrize("latencies,row,message", [
    ({"0F0": -0.5}, 2, "latency of 0F0 must be a number >= 0, got -0.5"),
    ({"1B0": float("nan")}, 5, "latency of 1B0 must be a number >= 0, got nan"),
    ({"0B0": 0.3}, 4, "task 0B0 sends nothing, so its latency must be empty or 0, got 0.3"),
    ({"1F0": 0.3}, 3, "task 1F0 sends nothing"),
    ({"0F0": None}, 2, "no latency for task 0F0, which sends a message"),
    ({"1B0": None}, 5, "no latency for task 1B0, which sends a message"),
])
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_latency_errors_name_the_row_and_task(tmp_path, latencies, row, message, suffix):
    path = tmp_path / f"bad{suffix}"
    write_frame(path, rows_2x1(**latencies))
    with pytest.raises(UserError) as caught:
        load_durations(path, 2, 1)
    assert str(caught.value).startswith(f"{path}: row {row}: ") and message in str(caught.value)


@pytest.mark.parametrize("cells,message", [
    (("1.0,0.1", "1.0,soon"), r"row 3: latency of 1F0 must be a number >= 0, got 'soon'"),
    (("1.0,0.1", "1.0,nan"), r"row 3: latency of 1F0 must be a number >= 0, got nan"),
    (("1.0,0.1", "inf,"), r"row 3: duration of 1F0 must be a number >= 0, got inf"),
    (("1.0,0.1", "abc,"), r"row 3: duration of 1F0 must be a number >= 0, got 'abc'"),
])
def test_text_in_a_number_column_names_its_own_row(tmp_path, cells, message):
    # One odd cell makes polars read the whole CSV column as text; the error still names that cell's row.
    path = tmp_path / "bad.csv"
    path.write_text(f"stage,kind,microbatch,duration,latency\n0,F,0,{cells[0]}\n1,F,0,{cells[1]}\n"
                    "0,B,0,1.0,\n1,B,0,1.0,0.2\n")
    with pytest.raises(UserError, match=message):
        load_durations(path, 2, 1)


def test_latency_column_and_comm_latency_are_ambiguous(tmp_path):
    path = tmp_path / "d.csv"
    write_frame(path, rows_2x1())
    with pytest.raises(UserError, match=r"holds latencies .* `comm_latency` 0.5 would be ambiguous") as caught:
        load_durations(path, 2, 1, comm_latency=0.5)
    assert caught.value.where == str(path)


def test_split_table_reads_the_gradient_latency_from_i(tmp_path):
    rows = [{"stage": k, "kind": kind, "microbatch": 0, "duration": 1.0, "latency": lat}
            for k, kind, lat in [(0, "F", 0.1), (1, "F", None), (0, "I", None), (0, "W", None), (1, "I", 0.3),
                                 (1, "W", None)]]
    path = tmp_path / "split.csv"
    write_frame(path, rows)
    loaded = load_durations(path, 2, 1)
    assert loaded.send_backward == [[0.0], [0.3]] and loaded.input_grad == [[1.0], [1.0]]
    write_frame(path, rows[:-2] + [{"stage": 1, "kind": "I", "microbatch": 0, "duration": 1.0, "latency": None},
                                   rows[-1]])
    with pytest.raises(UserError, match=r"row 6: no latency for task 1I0, which sends a message"):
        load_durations(path, 2, 1)
    write_frame(path, rows + [{"stage": 1, "kind": "B", "microbatch": 0, "duration": 2.0, "latency": 0.9}])
    with pytest.raises(UserError, match=r"row 8: latency of 1B0 \(0.9\) differs from that of 1I0 \(0.3\)"):
        load_durations(path, 2, 1)


def test_error_rows_count_in_the_whole_file_not_the_iteration(tmp_path):
    good = [dict(r, iteration=0) for r in rows_2x1()]
    bad = [dict(r, iteration=1) for r in rows_2x1(**{"0B0": 0.7})]
    path = tmp_path / "d.csv"
    write_frame(path, good + bad)
    assert load_durations(path, 2, 1, iteration=0).send_forward == [[0.1], [0.0]]
    with pytest.raises(UserError, match=r"\(iteration 1\): row 8: task 0B0 sends nothing"):
        load_durations(path, 2, 1, iteration=1)


# -- writing errors ------------------------------------------------------------------


@pytest.mark.parametrize("make,message", [
    (lambda d: d / "missing" / "d.csv", "no such directory"),
    (lambda d: (d / "dir.csv").mkdir() or d / "dir.csv", "is a directory"),
    (lambda d: d / "d.json", "unknown extension '.json'"),
    (lambda d: d / "d", "no extension: a duration table is .csv, .parquet or .pq"),
])
def test_bad_destinations_are_one_user_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(UserError, match=message) as caught:
        write_durations(path, [(None, make_durations(2, 1, False))])
    assert caught.value.where == str(path) and "\n" not in str(caught.value)


def test_check_destination_names_the_format(tmp_path):
    assert check_destination(tmp_path / "a.CSV") == "csv"
    assert check_destination(tmp_path / "a.pq") == "parquet"


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "d.csv"
    path.write_text("old contents\n")

    def broken(self, target, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_csv", broken)
    with pytest.raises(DiskError, match="d.csv: the disk is full"):  # the machine's fault, named: exit 1
        write_durations(path, [(None, make_durations(2, 1, False))])
    assert path.read_text() == "old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]
