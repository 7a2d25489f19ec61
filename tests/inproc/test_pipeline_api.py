"""rrfp.ReadyPipeline refuses stages it was not given to hold, in one process (a gloo group of one). Driven from a
training script on 2 ranks: tests/multiproc/test_pipeline_api.py."""

from __future__ import annotations

import pytest

from runtime.run.launch import free_port


def test_ready_pipeline_refuses_stages_of_another_rank(tmp_path):
    import torch.distributed as dist

    from hints.errors import UserError
    from rrfp import ReadyPipeline

    with pytest.raises(UserError, match="init_process_group first"):
        ReadyPipeline({0: None}, None, microbatches=2)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(UserError, match=r"rank 0 holds model stages \[0\] of .*, but was given \[1\]"):
            ReadyPipeline({1: None}, None, microbatches=2)
    finally:
        dist.destroy_process_group()
