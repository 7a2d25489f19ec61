"""Workload presets (runtime.durations.presets): measured statistics, legacy names, cost tables, the CLI and the script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.presets import PRESETS, load_cost_table
from runtime.durations.variability import VariabilityModel, describe_workload, sample_durations, sample_microbatches
from tests.helpers.cli import REPO, run_rrfp

COUNT = 1000  # microbatches per measurement, as --describe samples by default


def measured(name: str, seed: int = 0, **knobs) -> dict:
    return describe_workload(VariabilityModel(workload=name, **knobs), COUNT, seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vlm_mixed_spread_is_in_the_documented_range(seed):
    stats = measured("vlm-mixed", seed)
    assert 1.0 <= stats["cost_cv"] <= 1.3
    assert 4.0 <= stats["heaviest_over_mean"] <= 6.0
    assert 0.25 <= stats["text_only_share"] <= 0.35  # the mix draws 30% text-only samples
    assert stats["frames_per_video"] <= 64


def test_pretrain_packed_varies_only_through_document_boundaries():
    stats = measured("pretrain-packed")
    assert stats["cost_cv"] < 0.1
    assert stats["tokens_per_microbatch"] == 8192  # packing: every sequence is full
    assert 400 <= stats["mean_document"] <= 900  # document pieces, cut at sequence ends
    specs = sample_microbatches(VariabilityModel(workload="pretrain-packed"), 50, 3)
    assert all(sum(c.spans) == 8192 for spec in specs for c in spec.contents)


def test_sft_chat_and_video_vary_more_than_packing_and_less_than_legacy_language():
    sft, video, legacy = measured("sft-chat"), measured("vlm-video"), measured("language")
    assert 0.4 <= sft["cost_cv"] <= 0.9
    assert 0.8 <= video["cost_cv"] <= 1.3 and video["text_only_share"] == 0.0
    assert legacy["heaviest_over_mean"] > 2 * sft["heaviest_over_mean"]


def test_legacy_names_are_aliases_with_identical_tables():
    shape = PipelineShape(4, 1, 16)
    for alias, name in (("language", "legacy-language"), ("multimodal", "legacy-multimodal")):
        a = sample_durations(VariabilityModel(workload=alias, jitter=0.1), shape, 7)
        b = sample_durations(VariabilityModel(workload=name, jitter=0.1), shape, 7)
        assert a.forward == b.forward and a.specs == b.specs
    assert VariabilityModel(workload="language").samples == 4  # the legacy default is unchanged


def test_presets_are_seeded_and_normalised_to_a_mean_of_one():
    model = VariabilityModel(workload="vlm-mixed", jitter=0.2)
    shape = PipelineShape(4, 1, 64)
    a, b, c = (sample_durations(model, shape, s) for s in (5, 5, 6))
    assert a.forward == b.forward and a.specs == b.specs and a.forward != c.forward
    costs = sample_durations(VariabilityModel(workload="sft-chat"), PipelineShape(2, 1, 4000), 1).microbatch_costs
    assert sum(costs) / len(costs) == pytest.approx(2.0, rel=0.05)  # two stages, each 1.0 on average


def test_features_count_every_language_model_token_and_encoder_input():
    spec = sample_microbatches(VariabilityModel(workload="vlm-mixed", samples=8), 1, 2)[0]
    features = spec.features()
    assert features["tokens"] == sum(c.text + c.visual_tokens for c in spec.contents)
    assert features["images"] == sum(c.tiles + c.frames for c in spec.contents)


def test_encoder_stages_follow_tiles_and_frames():
    model = VariabilityModel(workload="vlm-mixed")
    assert model.vision_stage_count(8) == 2 and VariabilityModel(workload="sft-chat").vision_stage_count(8) == 0
    table = sample_durations(model, PipelineShape(8, 1, 200), 0)
    for i, spec in enumerate(table.specs):
        if spec.image_count == 0:
            assert table.forward[0][i] == pytest.approx(0.010 * 0.02)  # the encoder floor


def write(path, text):
    path.write_text(text)
    return path


def test_cost_table_round_trip(tmp_path):
    path = write(tmp_path / "t.csv", "text_tokens,images,tiles,frames,documents\n"
                 "100,0,0,0,\n2000,1,5,0,\n300,0,0,32,\n8,0,0,0,3 5\n")
    table = load_cost_table(path)
    model = VariabilityModel(workload="vlm-mixed", cost_table=table)
    specs = sample_microbatches(model, 200, 0)
    drawn = {c for spec in specs for c in spec.contents}
    assert drawn == set(table.contents(PRESETS["vlm-mixed"]))  # every row, and only rows, is drawn
    assert next(c for c in drawn if c.tiles == 5).visual_tokens == 5 * 576
    assert next(c for c in drawn if c.frames == 32).visual_tokens == 32 * 196
    assert sample_microbatches(model, 200, 0) == specs


@pytest.mark.parametrize("text,message", [
    ("tokens\n1\n", "row 1: unknown column 'tokens'"),
    ("images\n1\n", "row 1: the column text_tokens is required"),
    ("text_tokens,tiles\n10,2\n12,x\n", "row 3, column tiles: must be a whole number >= 0, got 'x'"),
    ("text_tokens,documents\n10,4 5\n", "row 2, column documents: the lengths add up to 9, not text_tokens 10"),
    ("text_tokens\n", "has no samples"),
    ("text_tokens,tiles\n5\n", "row 2: 1 cells but the header names 2 columns"),
    ("text_tokens\n5\u00b2\n", "row 2, column text_tokens: must be a whole number >= 0, got '5\u00b2'"),
    ("text_tokens,documents\n3,\u00b3\n", "row 2, column documents"),
])
def test_bad_cost_tables_name_row_and_column(tmp_path, text, message):
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(UserError) as caught:
        load_cost_table(path)
    assert str(caught.value) == f"{path}: {message}" or str(caught.value).startswith(f"{path}: {message}")


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("text_tokens,images\n5,1\n".encode("utf-8-sig"))  # Excel's "CSV UTF-8"
    assert load_cost_table(path).rows[0][:2] == (5, 1)


def test_a_table_without_language_tokens_is_refused_when_the_model_is_built(tmp_path):
    table = load_cost_table(write(tmp_path / "t.csv", "text_tokens,tiles,visual_tokens\n0,3,0\n0,2,0\n"))
    with pytest.raises(UserError, match="no language-model tokens"):
        VariabilityModel(workload="vlm-mixed", cost_table=table)


def test_a_tables_hash_and_means_are_computed_once(tmp_path):
    """Sampling hashes the model (caches) and costs every microbatch against the table's means."""
    rows = "\n".join(f"{10 + i},1,{1 + i % 13}" for i in range(2000))
    table = load_cost_table(write(tmp_path / "t.csv", f"text_tokens,images,tiles\n{rows}\n"))
    assert hash(table) == hash(load_cost_table(tmp_path / "t.csv")) and table == load_cost_table(tmp_path / "t.csv")
    model = VariabilityModel(workload="vlm-mixed", cost_table=table)
    assert set(table._means) == {"vlm-mixed"}
    preset = PRESETS["vlm-mixed"]
    contents = table.contents(preset)
    assert model.preset_means() == pytest.approx((sum(map(preset.lm_cost, contents)) / 2000,
                                                  sum(c.encoder_units for c in contents) / 2000))


def test_cost_table_needs_a_preset(tmp_path):
    table = load_cost_table(write(tmp_path / "t.csv", "text_tokens\n10\n"))
    with pytest.raises(UserError, match="preset's cost model"):
        VariabilityModel(workload="language", cost_table=table)


# -- CLI (a subprocess, as test_cli.py: real exit codes and stderr) ---------------------------------


def rrfp(cwd, *args):
    return run_rrfp(cwd, *args, timeout=120)


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stdout
    return lines[0]


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
    script = str(REPO / "examples" / "cost_table.py")
    done = subprocess.run([sys.executable, script, str(source), "--out", str(tmp_path / "c.csv")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines == ["text_tokens,images,tiles,frames", "202,1,3,0", "40,0,0,0", "2,0,0,64", "10,2,10,0"]
    table = load_cost_table(tmp_path / "c.csv")
    assert len(table.rows) == 4
    done = subprocess.run([sys.executable, script, str(source), "--pack", "64", "--out", str(tmp_path / "p.csv")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    packed = load_cost_table(tmp_path / "p.csv")  # the documents column adds up to each row's text_tokens
    assert len(packed.rows) == (202 + 40 + 2 + 10) // 64 and all(row[0] == 64 for row in packed.rows)
    (tmp_path / "bad.jsonl").write_text("{\"text\": 1}\nnot json\n")
    done = subprocess.run([sys.executable, script, str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "b.csv")],
                          capture_output=True, text=True)
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
    done = subprocess.run([sys.executable, str(REPO / "examples" / "cost_table.py"), str(source), *args,
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and where in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert (lines is None) != source.exists()  # the input is never touched
    assert not (tmp_path / "c.csv").exists() and not list(tmp_path.glob(".cost_table.*"))


def test_emulated_run_with_a_preset(tmp_path):
    proc = run_rrfp(tmp_path, "run", "--workload", "emulated", "--emulate", "vlm-mixed", "--stages", "2",
                    "--microbatches", "4", "--iters", "2", "--forward-time", "0.002", "--out", "r", "--json",
                    timeout=180)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["emulate"] == "vlm-mixed"
    assert config["samples"] == PRESETS["vlm-mixed"].samples  # the simulated preset's microbatches


def test_an_emulated_preset_draws_as_many_samples_as_its_simulation():
    from runtime.config import RunConfig

    for name, preset in PRESETS.items():
        assert RunConfig(workload="emulated", emulate=name).samples == preset.samples
    assert RunConfig(workload="emulated", emulate="multimodal").samples == 2  # legacy models: as before
    assert RunConfig(workload="gpt").samples == 2
    assert RunConfig(workload="emulated", emulate="vlm-mixed", samples=3).samples == 3  # a flag or TOML wins


# -- the split backward's price per workload ([Note: split backward cost by preset]) ----------------


@pytest.mark.parametrize("workload, expected", [
    ("pretrain-packed", 1.57), ("sft-chat", 1.57), ("legacy-language", 1.57), ("language", 1.57),
    ("vlm-mixed", 1.65), ("vlm-video", 1.65), ("legacy-multimodal", 1.65), ("multimodal", 1.65),
    ("uniform", 1.0),
])
def test_each_workload_charges_its_documented_split_cost_by_default(workload, expected):
    from runtime.durations.presets import MEASURED_SPLIT_OVERHEAD, default_split_overhead

    assert expected in (*MEASURED_SPLIT_OVERHEAD.values(), 1.0)  # the measured figures, not new numbers
    assert default_split_overhead(workload) == expected
    model = VariabilityModel(workload=workload)
    assert model.split_overhead == expected
    table = sample_durations(model, PipelineShape(2, 1, 2), 0)
    assert table.split_overhead == expected
    assert VariabilityModel(workload=workload, split_overhead=1.0).split_overhead == 1.0  # explicit wins
    assert VariabilityModel(workload=workload, split_overhead=2.0).split_overhead == 2.0


def test_the_emulated_run_charges_the_emulated_presets_split_unless_told():
    from runtime.config import RunConfig
    from runtime.config import run_shape
    from runtime.workloads.make import make_workload

    def charged(**flags) -> float:
        config = RunConfig(workload="emulated", stages=2, microbatches=2, **flags)
        return make_workload(config, run_shape(config)).variability().split_overhead

    assert RunConfig().split_overhead is None  # "the --emulate model's own"
    assert charged(emulate="vlm-mixed") == 1.65
    assert charged(emulate="sft-chat") == 1.57
    assert charged(emulate="uniform") == 1.0
    assert charged(emulate="vlm-mixed", split_overhead=1.0) == 1.0
    assert charged(emulate="sft-chat", split_overhead=1.8) == 1.8


def test_simulate_charges_the_presets_split_unless_told(tmp_path):
    def simulated(*extra) -> dict:
        proc = run_rrfp(tmp_path, "simulate", "-p", "4", "-m", "8", "--policy", "fixed", "--hint", "zb",
                        "--workload", "vlm-mixed", "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    default, free, given = simulated(), simulated("--split-overhead", "1"), simulated("--split-overhead", "1.65")
    assert default["source"]["model"]["split_overhead"] == 1.65
    assert free["source"]["model"]["split_overhead"] == 1.0
    assert default["makespan"] == given["makespan"] > free["makespan"]
