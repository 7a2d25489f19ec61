"""Hint files (rrfp-hint/1 JSON, torch CSV), their validation errors, torch import and resolve_hint.

Conventions: shapes are written ``(p, v, m)`` = (ranks, chunks per rank,
microbatches), as in :mod:`hints.tasks`. Hand-made bad files start from a
built-in's JSON (``hint_to_json``) and change one thing, so each test shows
exactly which mistake it is about. Every validation error must be a
:class:`HintError` naming the file and, where the mistake sits in one rank's
order, that rank and the task.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from hints.errors import HintError, UserError
from hints.files.hint_json import HINT_FORMAT, hint_to_json, save_hint
from hints.files.load import load_hint, resolve_hint
from hints.files.torch_csv import save_torch_csv
from hints.orders import BUILTIN_HINTS, applicable_builtins, builtin_hint
from hints.tasks import PipelineShape, Task

# (ranks, chunks, microbatches, placement); 1f1b only fits the first, interleaved-1f1b only the second,
# zbv only the V ones.
ROUND_TRIP_SHAPES = [(4, 1, 8, "looping"), (3, 2, 6, "looping"), (2, 1, 3, "looping"), (3, 2, 6, "v"),
                     (1, 2, 3, "v")]

requires_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


def _fitting_builtins():
    """(name, shape) pairs where the built-in can be generated for the shape."""
    return [pytest.param(name, shape, id=f"{name}-p{shape[0]}v{shape[1]}m{shape[2]}-{shape[3]}")
            for shape in ROUND_TRIP_SHAPES for name in applicable_builtins(*shape[:3], placement=shape[3])]


def _write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def _load_error(path: Path) -> str:
    with pytest.raises(HintError) as info:
        load_hint(path)
    message = str(info.value)
    assert "\n" not in message, "a hint error must fit on one line"
    return message


# -- rrfp-hint/1 round trip --------------------------------------------------


@pytest.mark.parametrize("name,shape", _fitting_builtins())
def test_json_round_trip_of_every_builtin(tmp_path, name, shape):
    ranks, chunks, microbatches, placement = shape
    original = builtin_hint(name, ranks, chunks, microbatches, placement=placement)
    path = tmp_path / f"{name}.json"
    save_hint(original, path)

    loaded = load_hint(path)

    assert loaded.shape == original.shape
    assert loaded.orders == original.orders
    assert loaded.name == original.name
    assert dict(loaded.provenance) == dict(original.provenance)
    assert json.loads(path.read_text())["format"] == HINT_FORMAT
    assert json.loads(path.read_text())["placement"] == placement


def test_json_round_trip_keeps_bfw_costs(tmp_path):
    costs = [1.0, 5.0, 2.0, 5.0, 0.5, 3.0]
    original = builtin_hint("bfw", 3, 2, 6, costs)
    path = tmp_path / "bfw.json"
    save_hint(original, path)

    loaded = load_hint(path)

    assert loaded.orders == original.orders
    assert loaded.provenance["costs"] == costs
    # heaviest first, ties by index: microbatch 1 then 3 lead rank 0's forwards.
    assert [str(t) for t in loaded.orders[0][:2]] == ["0F1", "0F3"]


def test_json_file_is_the_documented_format(tmp_path):
    path = tmp_path / "h.json"
    save_hint(builtin_hint("1f1b", 2, 1, 2), path)

    data = json.loads(path.read_text())

    assert data == {
        "format": "rrfp-hint/1",
        "name": "1f1b",
        "shape": {"ranks": 2, "chunks": 1, "microbatches": 2, "split_backward": False},
        "placement": "looping",
        "orders": [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]],
        "provenance": {"generator": "1f1b"},
    }


def test_json_without_placement_is_looping_and_v_is_read(tmp_path):
    data = hint_to_json(builtin_hint("zbv", 2, 2, 4))
    assert data["placement"] == "v" and "placement" not in data["shape"]  # beside the shape, as documented
    assert load_hint(_write_json(tmp_path / "v.json", data)).shape.placement == "v"
    # The same orders read as looping (no placement key) put stage 3 on rank 1, where rank 0 lists it.
    del data["placement"]
    assert "rank 0: task 3F0 (step 3) belongs to rank 1 (stage 3 of 4, looping placement)" in \
        _load_error(_write_json(tmp_path / "looping.json", data))


@pytest.mark.parametrize("chunks", [1, 3, 4])
def test_v_file_whose_stage_count_is_not_2p(tmp_path, chunks):
    data = hint_to_json(builtin_hint("gpipe", 2, chunks, 2))
    data["placement"] = "v"
    message = _load_error(_write_json(tmp_path / "h.json", data))
    assert message == (f"{tmp_path / 'h.json'}: shape: chunks: V placement holds 2 chunks per rank (stages r and "
                       f"2p-1-r); got {chunks}")


def test_unknown_placement(tmp_path):
    data = hint_to_json(builtin_hint("gpipe", 2, 1, 2))
    data["placement"] = "zigzag"
    assert "placement 'zigzag' is not one of 'looping', 'v'" in _load_error(_write_json(tmp_path / "h.json", data))


def test_json_without_name_takes_the_file_stem(tmp_path):
    data = hint_to_json(builtin_hint("gpipe", 2, 1, 2))
    del data["name"], data["provenance"], data["placement"]
    hint = load_hint(_write_json(tmp_path / "my-order.json", data))
    assert hint.name == "my-order"
    assert dict(hint.provenance) == {}


# -- torch CSV ---------------------------------------------------------------


@pytest.mark.parametrize("name,shape", _fitting_builtins())
def test_torch_csv_round_trip_of_every_builtin(tmp_path, name, shape):
    ranks, chunks, microbatches, placement = shape
    original = builtin_hint(name, ranks, chunks, microbatches, placement=placement)
    path = tmp_path / f"{name}.csv"
    save_torch_csv(original, path)

    loaded = load_hint(path)

    assert loaded.orders == original.orders
    # The shape is inferred from the tasks, split backward and placement included; on one rank both
    # placements map every stage to rank 0, and the CSV reads as looping unless told otherwise.
    assert loaded.shape == (original.shape if ranks > 1 else replace(original.shape, placement="looping"))
    assert load_hint(path, placement).shape == original.shape
    assert loaded.name == name  # the file stem
    assert loaded.provenance["source"] == "torch-csv"


def test_torch_csv_of_a_v_order_infers_its_placement(tmp_path):
    original = builtin_hint("zbv", 3, 2, 6)
    path = tmp_path / "zbv.csv"
    save_torch_csv(original, path)
    loaded = load_hint(path)
    assert loaded.shape == original.shape and loaded.shape.placement == "v"
    assert loaded.orders == original.orders
    assert load_hint(path, "v").orders == original.orders  # stated and checked
    with pytest.raises(HintError, match="does not follow the looping placement: looping placement puts stage 3 "
                                        "on rank 0, not 2"):
        load_hint(path, "looping")


def test_torch_csv_whose_mapping_follows_neither_placement(tmp_path):
    # Stage 1 on rank 0 and stage 2 on rank 1: neither looping (1 -> rank 1) nor V (1 -> rank 1) puts it so.
    path = tmp_path / "odd.csv"
    path.write_text("0F0,1F0,1B0,0B0\n2F0,3F0,3B0,2B0\n")
    message = _load_error(path)
    assert message == (f"{path}: the stage-to-rank mapping does not follow either placement: looping placement "
                       f"puts stage 1 on rank 1, not 0; V placement puts stage 1 on rank 1, not 0")
    path.write_text("0F0,1F0,2F0,2B0,1B0,0B0\n3F0,4F0,5F0,5B0,4B0,3B0\n")  # 3 chunks: V cannot hold them
    assert "V placement needs 2p = 4 stages, not 6" in _load_error(path)


def test_torch_csv_is_one_row_per_rank_in_torch_grammar(tmp_path):
    path = tmp_path / "zb.csv"
    save_torch_csv(builtin_hint("zb", 2, 1, 2), path)
    assert path.read_text().splitlines() == [
        "0F0,0F1,0I0,0W0,0I1,0W1",
        "1F0,1I0,1F1,1I1,1W0,1W1",
    ]


def test_torch_csv_skips_comm_actions_and_empty_cells(tmp_path):
    # What torch's compute_comms lowering looks like, with idle cells and FSDP/DDP actions mixed in.
    path = tmp_path / "lowered.csv"
    path.write_text(
        "0F0,0SEND_F0,,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD\n"
        ",1RECV_F0,1F0,1B0,1SEND_B0,1UNSHARD,1RECV_F1,1F1,1B1,1SEND_B1,1RESHARD,1REDUCE_GRAD,\n"
    )

    loaded = load_hint(path)

    assert loaded.shape == PipelineShape(2, 1, 2)
    assert loaded.orders == builtin_hint("1f1b", 2, 1, 2).orders


def test_torch_csv_with_a_bad_cell_names_rank_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1X0,1F1,1B1\n")
    message = _load_error(path)
    assert str(path) in message
    assert "rank 1, column 1" in message
    assert "'1X0'" in message


def test_torch_csv_validates_like_json(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F0,1B1\n")
    message = _load_error(path)
    assert str(path) in message and "rank 1" in message and "1F0" in message
    assert "twice" in message


# -- validation errors -------------------------------------------------------


@pytest.fixture
def one_f_one_b_json():
    """1f1b for p=2, v=1, m=2: rank 0 [0F0 0F1 0B0 0B1], rank 1 [1F0 1B0 1F1 1B1]."""
    return hint_to_json(builtin_hint("1f1b", 2, 1, 2))


@pytest.fixture
def zero_bubble_json():
    """zb for p=2, v=1, m=2: rank 1 [1F0 1I0 1F1 1I1 1W0 1W1]."""
    return hint_to_json(builtin_hint("zb", 2, 1, 2))


def _broken(tmp_path, data, edit) -> tuple[Path, str]:
    data = copy.deepcopy(data)
    edit(data)
    path = _write_json(tmp_path / "hint.json", data)
    return path, _load_error(path)


def test_duplicate_task(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][1][2] = "1F0"  # 1F1 replaced by a second 1F0

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message == f"{path}: rank 1: task 1F0 appears twice (steps 0 and 2)"


def test_missing_task(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d["orders"][1].remove("1B1"))
    assert message == f"{path}: rank 1: task 1B1 missing"


def test_several_missing_tasks_are_counted(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d["orders"][0].clear())
    assert message == f"{path}: rank 0: task 0F0 and 3 more missing"


def test_task_on_the_wrong_rank(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][0][0], d["orders"][1][0] = d["orders"][1][0], d["orders"][0][0]

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert str(path) in message
    assert "rank 0: task 1F0 (step 0) belongs to rank 1" in message


def test_task_outside_the_shape_stage(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][0][1] = "2F1"

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message.startswith(f"{path}: rank 0: task 2F1 (step 1) is outside the shape")
    assert "2 ranks x 1 chunks, 2 microbatches" in message


def test_task_outside_the_shape_microbatch(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][1][3] = "1B7"

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message.startswith(f"{path}: rank 1: task 1B7 (step 3) is outside the shape")


def test_split_kind_in_a_full_backward_shape_is_outside(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][1][1] = "1I0"

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message.startswith(f"{path}: rank 1: task 1I0 (step 1) is outside the shape")


def test_backward_before_its_forward(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][1][0], d["orders"][1][1] = "1B0", "1F0"

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message == f"{path}: rank 1: task 1B0 (step 0) comes before its forward 1F0 (step 1)"


def test_weight_gradient_before_input_gradient(tmp_path, zero_bubble_json):
    def edit(d):
        order = d["orders"][1]
        i, w = order.index("1I0"), order.index("1W0")
        order[i], order[w] = order[w], order[i]

    path, message = _broken(tmp_path, zero_bubble_json, edit)
    assert str(path) in message and "rank 1" in message
    assert "task 1W0 comes before 1I0" in message


def test_unknown_top_level_key(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d.update(oders=[]))
    assert message.startswith(f"{path}: unknown key 'oders'")


def test_unknown_shape_key(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d["shape"].update(stages=2))
    assert message.startswith(f"{path}: shape: unknown key 'stages'")


def test_wrong_format(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d.update(format="rrfp-hint/3"))
    assert message == f"{path}: format is 'rrfp-hint/3'; this rrfp reads 'rrfp-hint/1' and 'rrfp-hint/2'"


def test_missing_format(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d.pop("format"))
    assert message.startswith(f"{path}: format is None")


def test_malformed_json_reports_line_and_column(tmp_path):
    path = tmp_path / "hint.json"
    path.write_text('{"format": "rrfp-hint/1",\n "orders": [}\n')
    message = _load_error(path)
    assert message.startswith(f"{path}: not valid JSON:")
    assert "line 2, column 13" in message


def test_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "hint.json"
    path.write_text("[1, 2]")
    assert _load_error(path).startswith(f"{path}: expected a JSON object")


def test_orders_count_differs_from_ranks(tmp_path, one_f_one_b_json):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d["orders"].append([]))
    assert message == f"{path}: has orders for 3 ranks but the shape has 2"


def test_non_string_task(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][1][1] = 5

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message == f"{path}: rank 1, step 1: 5 is not a task string"


def test_unparseable_task_string(tmp_path, one_f_one_b_json):
    def edit(d):
        d["orders"][0][2] = "0X0"

    path, message = _broken(tmp_path, one_f_one_b_json, edit)
    assert message.startswith(f"{path}: rank 0, step 2: '0X0' is not a task")


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2"])
def test_bad_shape_number(tmp_path, one_f_one_b_json, value):
    path, message = _broken(tmp_path, one_f_one_b_json, lambda d: d["shape"].update(ranks=value))
    assert message.startswith(f"{path}: shape: shape ranks: must be a whole number >= 1")


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    assert _load_error(path) == f"{path}: no such file"


def test_hint_error_is_a_user_error():
    assert issubclass(HintError, UserError)


# -- torch import --------------------------------------------------------------


@requires_torch
@pytest.mark.parametrize("ranks, microbatches", [(4, 8), (2, 4), (3, 5), (8, 16)])
def test_torch_1f1b_equals_builtin(ranks, microbatches):
    from hints.files.torch_import import import_torch_schedule

    imported = import_torch_schedule("1F1B", ranks, microbatches)
    builtin = builtin_hint("1f1b", ranks, 1, microbatches)

    assert imported.shape == builtin.shape
    assert imported.orders == builtin.orders
    # [Note: torch single-stage numbering]: torch numbers the last rank's forwards 1..m.
    last = ranks - 1
    assert imported.provenance["renumbered"] == [
        f"{last}F{mb + 1}->{last}F{mb}" for mb in range(microbatches)
    ]
    assert imported.provenance["source"] == "torch.distributed.pipelining.Schedule1F1B"


@requires_torch
@pytest.mark.parametrize("name", ["GPipe", "ScheduleGPipe", "gpipe"])
def test_torch_gpipe_equals_builtin(name):
    from hints.files.torch_import import import_torch_schedule

    imported = import_torch_schedule(name, 4, 8)
    assert imported.orders == builtin_hint("gpipe", 4, 1, 8).orders
    assert "renumbered" not in imported.provenance


@requires_torch
@pytest.mark.parametrize("chunks", [2, 3])
@pytest.mark.parametrize("ranks, microbatches", [(4, 8), (2, 4), (4, 12)])
def test_torch_interleaved_1f1b_equals_builtin(ranks, microbatches, chunks):
    from hints.files.torch_import import import_torch_schedule

    imported = import_torch_schedule("Interleaved1F1B", ranks, microbatches, chunks)
    builtin = builtin_hint("interleaved-1f1b", ranks, chunks, microbatches)
    assert imported.shape == builtin.shape
    assert imported.orders == builtin.orders


@requires_torch
@pytest.mark.parametrize("chunks", [2, 3])
def test_torch_looped_bfs_equals_breadth_first(chunks):
    from hints.files.torch_import import import_torch_schedule

    imported = import_torch_schedule("LoopedBFS", 4, 8, chunks)
    assert imported.orders == builtin_hint("bf", 4, chunks, 8).orders


@requires_torch
@pytest.mark.parametrize("ranks, microbatches", [(4, 8), (2, 4), (4, 12)])
def test_torch_interleaved_zero_bubble_equals_zb(ranks, microbatches):
    from hints.files.torch_import import import_torch_schedule

    imported = import_torch_schedule("InterleavedZeroBubble", ranks, microbatches, 2)
    builtin = builtin_hint("zb", ranks, 2, microbatches)
    assert imported.shape == builtin.shape
    assert imported.shape.split_backward
    assert imported.orders == builtin.orders


@requires_torch
@pytest.mark.parametrize("name", ["ZBVZeroBubble", "ScheduleZBVZeroBubble"])
@pytest.mark.parametrize("ranks,microbatches", [(1, 3), (2, 3), (4, 8), (4, 5), (3, 12), (8, 32)])
def test_torch_zbv_equals_builtin(name, ranks, microbatches):
    from hints.files.torch_import import import_torch_schedule

    imported = import_torch_schedule(name, ranks, microbatches)  # V schedules default to 2 chunks
    builtin = builtin_hint("zbv", ranks, 2, microbatches)
    assert imported.shape == builtin.shape == PipelineShape(ranks, 2, microbatches, True, "v")
    assert imported.orders == builtin.orders


@requires_torch
def test_torch_dualpipev_is_imported_in_a_v():
    from hints.files.torch_import import import_torch_schedule
    from runtime.sched.simulator import check_completes

    hint = import_torch_schedule("DualPipeV", 4, 8, 2)
    assert hint.shape == PipelineShape(4, 2, 8, True, "v")
    # [Note: DualPipeV as rrfp tasks]: overlapped pairs run in turn, full backwards become I then W.
    assert hint.provenance["overlapped_pairs_run_in_turn"] > 0
    assert hint.provenance["full_backwards_split"] > 0
    rank3 = [str(t) for t in hint.orders[3]]
    assert rank3[:4] == ["3F0", "4F0", "3F1", "4F1"]  # rank p-1 holds both stages of the turn
    check_completes(hint)


@requires_torch
@pytest.mark.parametrize("name,chunks,placement,match", [
    ("ZBVZeroBubble", 3, None, "ZBV requires exactly 2 stages per rank"),
    ("DualPipeV", 2, "looping", "does not follow the looping placement"),
    ("Interleaved1F1B", 2, "v", "does not follow the v placement"),
])
def test_torch_import_checks_the_placement(name, chunks, placement, match):
    from hints.files.torch_import import import_torch_schedule

    with pytest.raises(HintError, match=match):
        import_torch_schedule(name, 4, 8, chunks, placement)


@requires_torch
def test_torch_unknown_schedule():
    from hints.files.torch_import import import_torch_schedule

    with pytest.raises(HintError, match=r"unknown torch schedule 'NoSuchSchedule'; supported: 1F1B"):
        import_torch_schedule("NoSuchSchedule", 4, 8)


@requires_torch
def test_torch_chunk_count_must_fit_the_schedule_class():
    from hints.files.torch_import import import_torch_schedule

    with pytest.raises(HintError, match="one stage per rank"):
        import_torch_schedule("1F1B", 4, 8, 2)
    with pytest.raises(HintError, match="several stages per rank"):
        import_torch_schedule("Interleaved1F1B", 4, 8, 1)


# -- resolve_hint ----------------------------------------------------------------


def test_resolve_builtin_name():
    hint = resolve_hint("1f1b", 4, None, 8)
    assert hint.orders == builtin_hint("1f1b", 4, 1, 8).orders
    assert resolve_hint("bf", 3, 2, 6).shape == PipelineShape(3, 2, 6)


def test_resolve_builtin_needs_a_shape():
    with pytest.raises(HintError, match="needs `ranks` and `microbatches`"):
        resolve_hint("1f1b")


def test_resolve_file_path(tmp_path):
    original = builtin_hint("interleaved-1f1b", 2, 2, 4)
    path = tmp_path / "i.json"
    save_hint(original, path)

    assert resolve_hint(str(path)).orders == original.orders
    # Shape arguments that are given must agree with the file; ones left out are free.
    assert resolve_hint(str(path), 2, 2, 4).orders == original.orders
    assert resolve_hint(str(path), None, None, 4).orders == original.orders


def test_resolve_csv_path(tmp_path):
    original = builtin_hint("zb", 3, 1, 4)
    path = tmp_path / "zb.csv"
    save_torch_csv(original, path)
    assert resolve_hint(str(path), 3, 1, 4).orders == original.orders


@requires_torch
def test_resolve_torch_schedule():
    hint = resolve_hint("torch:GPipe", 4, None, 8)
    assert hint.orders == builtin_hint("gpipe", 4, 1, 8).orders
    assert hint.name == "torch-gpipe"


def test_resolve_unknown_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HintError, match="unknown hint 'nosuch'") as info:
        resolve_hint("nosuch", 4, 1, 8)
    for builtin in BUILTIN_HINTS:
        assert builtin in str(info.value)


def test_resolve_placement(tmp_path):
    assert resolve_hint("zbv", 2, None, 4).shape.placement == "v"  # zbv's own placement, 2 chunks
    assert resolve_hint("gpipe", 2, None, 4, placement="v").shape == PipelineShape(2, 2, 4, placement="v")
    with pytest.raises(HintError, match=r"zbv places stages in a V .*; it has no looping order"):
        resolve_hint("zbv", 2, 2, 4, placement="looping")
    with pytest.raises(HintError, match=r"zb places stages in a loop .*; it has no v order"):
        resolve_hint("zb", 2, 2, 4, placement="v")
    with pytest.raises(UserError, match=r"^`chunks`: V placement holds 2 chunks per rank \(stages r and 2p-1-r\); "
                                         r"got 1$"):
        resolve_hint("zbv", 2, 1, 4)
    path = tmp_path / "v.json"
    save_hint(builtin_hint("zbv", 2, 2, 4), path)
    with pytest.raises(HintError, match="the file is for placement v but `placement` looping was asked"):
        resolve_hint(str(path), placement="looping")


@pytest.mark.parametrize(
    "ranks, chunks, microbatches, label",
    [(4, None, 16, "microbatches"), (2, None, 8, "ranks"), (None, 2, None, "chunks")],
)
def test_resolve_file_whose_shape_disagrees(tmp_path, ranks, chunks, microbatches, label):
    path = tmp_path / "h.json"
    save_hint(builtin_hint("1f1b", 4, 1, 8), path)
    with pytest.raises(HintError) as info:
        resolve_hint(str(path), ranks, chunks, microbatches)
    message = str(info.value)
    assert message.startswith(f"{path}: the file is for {label} ")
    assert f"but `{label}` " in message  # the input, by its library name


def test_task_parse_and_text_agree():
    for text in ("0F0", "12B3", "3I10", "7W2"):
        assert str(Task.parse(text)) == text
