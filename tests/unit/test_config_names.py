"""A field's older name still reads: files written before the glossary (``stages`` was the pipeline-rank count)."""

from __future__ import annotations

import json

import pytest

from hints.errors import UserError
from runtime.config import build_config, load_toml
from runtime.run.checkpoint import FORMAT, MANIFEST, read_manifest


def test_a_toml_file_may_say_ranks_or_its_older_name_stages(tmp_path):
    new, old, both = tmp_path / "new.toml", tmp_path / "old.toml", tmp_path / "both.toml"
    new.write_text("ranks = 3\nmicrobatches = 6\n")
    old.write_text("stages = 3\nmicrobatches = 6\n")
    both.write_text("stages = 3\nranks = 3\n")
    assert build_config(load_toml(new), {}).ranks == build_config(load_toml(old), {}).ranks == 3
    with pytest.raises(UserError, match="other name both given; keep 'ranks'"):
        load_toml(both)


def test_a_config_json_of_an_earlier_run_resumes_under_todays_names():
    config = build_config({"workload": "gpt", "stages": 4, "microbatches": 8}, {"iters": 9})
    assert (config.ranks, config.microbatches, config.iters) == (4, 8, 9)


def test_a_checkpoint_manifest_of_an_earlier_run_reads_its_shape_as_ranks(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": 2, "shape": {"stages": 2, "chunks": 1}}))
    assert read_manifest(tmp_path)["shape"] == {"ranks": 2, "chunks": 1}
