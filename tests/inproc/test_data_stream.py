"""A factory's data stream that runs out names the factory and what it must yield ([Note: the model protocol])."""

from __future__ import annotations

import pytest

from runtime.config import RunConfig, run_shape
from runtime.workloads.user import FactoryWorkload
from tests.helpers.user_models import tiny

FIVE_BATCHES = "tests.inproc.test_data_stream:five_batches"


def five_batches(ctx):
    """tests.helpers.user_models:tiny whose data stream stops after 5 microbatches."""
    model = tiny(ctx)
    model.data = [batch for _, batch in zip(range(5), model.data)]
    return model


def test_a_data_stream_that_runs_out_names_the_factory_and_the_items_it_must_yield():
    config = RunConfig(workload=FIVE_BATCHES, ranks=2, microbatches=3, iters=3)
    workload = FactoryWorkload(config, run_shape(config))
    workload.batch(0, 0)  # 3 of the 5
    with pytest.raises(RuntimeError) as err:
        workload.batch(1, 0)
    assert str(err.value) == (f"the data stream of {FIVE_BATCHES} ran out at iteration 1 (it gave 2 of 3 "
                              "microbatches): PipelineModel.data must yield iterations x microbatches = 3 x 3 = 9 items")
