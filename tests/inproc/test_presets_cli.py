"""Workload presets through the CLI and the cost-table script, in this process ([Note: the two CLI runners]):
rrfp simulate --describe, --workload PRESET with --cost-table, the split's price, examples/cost_table.py's
tables and its bad input. The presets themselves: tests/unit/test_presets.py."""

from __future__ import annotations

import json

import pytest

from runtime.durations.presets import PRESETS, load_cost_table
from runtime.durations.variability import VariabilityModel, describe_workload
from tests.helpers.cli import one_error_line, run_cli, run_script

SCRIPT = "examples/cost_table.py"


def rrfp(cwd, *args):
    return run_cli(cwd, *args)


def write(path, text):
    path.write_text(text)
    return path


def test_describe_prints_every_preset_and_json(tmp_path):
    proc = rrfp(tmp_path, "simulate", "--describe")
    assert proc.returncode == 0, proc.stderr
    for name in ("uniform", "legacy-language", "legacy-multimodal", *PRESETS):
        assert name in proc.stdout
    data = json.loads(rrfp(tmp_path, "simulate", "--describe", "--workload", "vlm-mixed", "-m", "300",
                           "--seed", "4", "--json").stdout)
    [row] = data["describe"]
    assert row == describe_workload(VariabilityModel(workload="vlm-mixed"), 300, 4) | {"encoder_cv": row["encoder_cv"]}
    assert row["microbatches"] == 300 and row["cost_cv"] > 0.5


def test_simulate_compare_with_a_preset_and_a_cost_table(tmp_path):
    data = json.loads(rrfp(tmp_path, "simulate", "-p", "4", "-m", "8", "--workload", "vlm-mixed", "--compare",
                           "--json").stdout)
    assert data["rows"] and data["source"]["workload"] == "vlm-mixed"
    write(tmp_path / "c.csv", "text_tokens,tiles\n100,0\n900,5\n")
    data = json.loads(rrfp(tmp_path, "simulate", "-p", "2", "-m", "4", "--workload", "sft-chat", "--cost-table",
                           "c.csv", "--json").stdout)
    assert data["source"]["model"]["cost_table"] == "c.csv" and data["makespan"] > 0


def test_cli_bad_input_is_one_line(tmp_path):
    write(tmp_path / "bad.csv", "text_tokens,frames\n10,-1\n")
    line = one_error_line(rrfp(tmp_path, "simulate", "-p", "2", "-m", "4", "--workload", "vlm-mixed",
                               "--cost-table", "bad.csv"))
    assert line == "error: bad.csv: row 2, column frames: must be a whole number >= 0, got '-1'"
    write(tmp_path / "good.csv", "text_tokens\n10\n")
    line = one_error_line(rrfp(tmp_path, "simulate", "-p", "2", "-m", "4", "--cost-table", "good.csv"))
    assert "preset" in line
    line = one_error_line(rrfp(tmp_path, "simulate", "--describe", "--workload", "vlm-imaginary"))
    assert "vlm-imaginary" in line
    assert "no such file" in one_error_line(rrfp(tmp_path, "simulate", "-p", "2", "-m", "4", "--workload",
                                                 "sft-chat", "--cost-table", "missing.csv"))


def test_cost_table_script_reads_llava_and_chat_records(tmp_path):
    records = [
        {"conversations": [{"from": "human", "value": "<image>\n" + "a" * 400}, {"from": "gpt", "value": "b" * 400}],
         "image": "x.jpg", "image_sizes": [[896, 448]]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "c" * 96}],
         "text_tokens": 40},
        {"conversations": [{"from": "human", "value": "<video>"}], "video": "v.mp4", "duration": 100.0},
        {"text": "d" * 40, "image": ["a.jpg", "b.jpg"]},
    ]
    source = tmp_path / "s.jsonl"
    source.write_text("\n".join(map(json.dumps, records)) + "\n")
    done = run_script(tmp_path, SCRIPT, str(source), "--out", str(tmp_path / "c.csv"))
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines == ["text_tokens,images,tiles,frames", "202,1,3,0", "40,0,0,0", "2,0,0,64", "10,2,10,0"]
    table = load_cost_table(tmp_path / "c.csv")
    assert len(table.rows) == 4
    done = run_script(tmp_path, SCRIPT, str(source), "--pack", "64", "--out", str(tmp_path / "p.csv"))
    assert done.returncode == 0, done.stderr
    packed = load_cost_table(tmp_path / "p.csv")  # the documents column adds up to each row's text_tokens
    assert len(packed.rows) == (202 + 40 + 2 + 10) // 64 and all(row[0] == 64 for row in packed.rows)
    (tmp_path / "bad.jsonl").write_text("{\"text\": 1}\nnot json\n")
    done = run_script(tmp_path, SCRIPT, str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "b.csv"))
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "line 2" in done.stderr


@pytest.mark.parametrize("lines, args, where", [
    (['{"text_tokens": 5, "image": ["a"], "image_sizes": [[0, 4]]}'], [], "line 1"),
    (['{"text": "x"}', '{"text_tokens": -3}'], [], "line 2"),
    (['{"text": "x", "image": ["a"], "image_sizes": "ab"}'], [], "line 1"),
    (['{"text": "x"}'], ["--chars-per-token", "0"], "--chars-per-token"),
    (['{"text": "x"}'], ["--out-missing"], "--out"),
    (['{"text": "x"}'], ["--out-dir"], "--out"),
    (None, [], "cannot read"),
])
def test_cost_table_script_bad_input_is_one_error_line_and_keeps_its_input(tmp_path, lines, args, where):
    source = tmp_path / "s.jsonl"
    if lines is not None:
        source.write_text("\n".join(lines) + "\n")
    out = {"--out-missing": tmp_path / "no" / "c.csv", "--out-dir": tmp_path}.get(args[0] if args else "",
                                                                                   tmp_path / "c.csv")
    args = [a for a in args if not a.startswith("--out")]
    done = run_script(tmp_path, SCRIPT, str(source), *args, "--out", str(out))
    assert done.returncode == 2 and done.stderr.startswith("error: ") and where in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert (lines is None) != source.exists()  # the input is never touched
    assert not (tmp_path / "c.csv").exists() and not list(tmp_path.glob(".cost_table.*"))


def test_simulate_charges_the_presets_split_unless_told(tmp_path):
    def simulated(*extra) -> dict:
        proc = run_cli(tmp_path, "simulate", "-p", "4", "-m", "8", "--policy", "fixed", "--hint", "zb",
                       "--workload", "vlm-mixed", "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    default, free, given = simulated(), simulated("--split-overhead", "1"), simulated("--split-overhead", "1.06")
    assert default["source"]["model"]["split_overhead"] == 1.06
    assert free["source"]["model"]["split_overhead"] == 1.0
    assert default["makespan"] == given["makespan"] > free["makespan"]
