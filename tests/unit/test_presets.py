"""Workload presets (runtime.durations.presets): measured statistics, legacy names, cost tables, the split's price.
Through rrfp simulate and examples/cost_table.py: tests/inproc/test_presets_cli.py; an emulated run of a preset:
tests/multiproc/test_run.py."""

from __future__ import annotations

import pytest

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.presets import PRESETS, load_cost_table
from runtime.durations.variability import VariabilityModel, describe_workload, sample_durations, sample_microbatches

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


def test_an_emulated_preset_draws_as_many_samples_as_its_simulation():
    from runtime.config import RunConfig

    for name, preset in PRESETS.items():
        assert RunConfig(workload="emulated", emulate=name).samples == preset.samples
    assert RunConfig(workload="emulated", emulate="multimodal").samples == 2  # legacy models: as before
    assert RunConfig(workload="gpt").samples == 2
    assert RunConfig(workload="emulated", emulate="vlm-mixed", samples=3).samples == 3  # a flag or TOML wins


# -- the split backward's price per workload ([Note: split backward cost by preset]) ----------------


@pytest.mark.parametrize("workload, expected", [
    ("pretrain-packed", 1.05), ("sft-chat", 1.05), ("legacy-language", 1.05), ("language", 1.05),
    ("vlm-mixed", 1.06), ("vlm-video", 1.06), ("legacy-multimodal", 1.06), ("multimodal", 1.06),
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
    from runtime.config import RunConfig, run_shape
    from runtime.workloads.make import make_workload

    def charged(**flags) -> float:
        config = RunConfig(workload="emulated", ranks=2, microbatches=2, **flags)
        return make_workload(config, run_shape(config)).variability().split_overhead

    assert RunConfig().split_overhead is None  # "the --emulate model's own"
    assert charged(emulate="vlm-mixed") == 1.06
    assert charged(emulate="sft-chat") == 1.05
    assert charged(emulate="uniform") == 1.0
    assert charged(emulate="vlm-mixed", split_overhead=1.0) == 1.0
    assert charged(emulate="sft-chat", split_overhead=1.8) == 1.8
