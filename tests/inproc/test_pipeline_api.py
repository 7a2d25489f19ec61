"""rrfp.ReadyPipeline refuses stages it was not given to hold, and a ``group=`` this rank is not in, in one process
(a gloo group of one). Driven from a training script on 2 ranks: tests/multiproc/test_pipeline_api.py; on a
process group of a larger job: tests/multiproc/test_pipeline_group.py."""

from __future__ import annotations

import pytest

from runtime.run.launch import free_port


@pytest.fixture
def world_of_one():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ready_pipeline_needs_torch_distributed_first():
    from hints.errors import UserError
    from rrfp import ReadyPipeline

    with pytest.raises(UserError, match="init_process_group first"):
        ReadyPipeline({0: None}, None, microbatches=2)


def test_ready_pipeline_refuses_stages_of_another_rank(world_of_one):
    from hints.errors import UserError
    from rrfp import ReadyPipeline

    with pytest.raises(UserError, match=r"^ReadyPipeline: pipeline rank 0 holds model stages \[0\] of .*, but was "
                                        r"given \[1\]$"):
        ReadyPipeline({1: None}, None, microbatches=2)


def test_ready_pipeline_takes_a_group_or_a_1d_mesh_of_its_own_rank(world_of_one):
    # The stage check comes after the group is resolved: reaching it, in pipeline ranks, means the group was taken.
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hints.errors import UserError
    from rrfp import ReadyPipeline

    for group in (dist.new_group([0]), DeviceMesh("cpu", [0])):
        with pytest.raises(UserError, match=r"pipeline rank 0 \(global rank 0\) holds model stages \[0\]"):
            ReadyPipeline({1: None}, None, microbatches=2, group=group)


@pytest.mark.parametrize("group, message", [
    ("non-member", r"^ReadyPipeline: group= is GroupMember.NON_GROUP_MEMBER: global rank 0 is not in the group "
                   r"\(what dist.new_group returns to the ranks it leaves out\)"),
    ("a string", r"^ReadyPipeline: group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh, got str$"),
    ("2-D mesh", r"^ReadyPipeline: group= must be a process group or a 1-D DeviceMesh, got a 2-D DeviceMesh"),
])
def test_ready_pipeline_refuses_a_group_it_cannot_be_a_pipeline_of(world_of_one, group, message):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hints.errors import UserError
    from rrfp import ReadyPipeline

    given = {"non-member": dist.GroupMember.NON_GROUP_MEMBER, "a string": "pp",
             "2-D mesh": DeviceMesh("cpu", [[0]], mesh_dim_names=("dp", "pp"))}[group]
    with pytest.raises(UserError, match=message):
        ReadyPipeline({0: None}, None, microbatches=2, group=given)
