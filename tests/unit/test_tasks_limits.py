"""[Note: shape limits]: a shape too large to build is refused by name before anything is built (issue 24's
fuzz: `simulate -m 1e30` never ended, `hints show -m 100000000` grew to 4 GB)."""

import pytest

from hints.errors import UserError
from hints.tasks import MAX_RANKS, MAX_TASKS, PipelineShape

pytestmark = pytest.mark.unit


def test_the_largest_reported_shape_fits_four_times():
    assert 4 * PipelineShape(256, 1, 1024).ranks * 1024 * 2 <= MAX_TASKS
    PipelineShape(256, 1, 4096)  # 2,097,152 tasks: at the limit, accepted
    PipelineShape(MAX_RANKS, 1, 1)


@pytest.mark.parametrize("shape, where, what", [
    (dict(ranks=2, chunks=1, microbatches=10**30), "`microbatches`", "tasks; rrfp takes at most 2,097,152"),
    (dict(ranks=256, chunks=1, microbatches=4097), "`microbatches`", "2,097,664 tasks"),
    (dict(ranks=256, chunks=1, microbatches=2731, split_backward=True), "`microbatches`", "2,097,408 tasks"),
    (dict(ranks=100_000, chunks=1, microbatches=4), "`ranks`", "at most 8,192, got 100,000"),
    (dict(ranks=2, chunks=65, microbatches=4), "`chunks`", "at most 64, got 65"),
])
def test_too_large_a_shape_names_its_input(shape, where, what):
    with pytest.raises(UserError) as caught:
        PipelineShape(**shape)
    assert caught.value.where == where and what in caught.value.what
