"""Variability nobody knows beforehand ([Note: unknown variability] in runtime.durations.unknown)."""

from __future__ import annotations

import statistics

import pytest

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.unknown import (
    INTERNODE_LATENCY,
    MOE_SHARE,
    NODE_SIZE,
    SLOW_RANK_SLOWDOWN,
    SLOW_RANK_SPAN,
    Unknown,
)
from runtime.durations.variability import VariabilityModel, sample_durations

pytestmark = pytest.mark.unit


def test_parse_canonical_and_bad_specs():
    assert Unknown.parse("cost-error=0.2, moe=1.5").spec() == "moe=1.5,cost-error=0.2"
    assert Unknown.parse("") == Unknown() and not Unknown.parse(" ").active
    assert Unknown.parse("moe=1").spec() == ""  # level 1 of moe is balanced routing: off
    for bad, says in (("moe=0.9", "moe must be >= 1"), ("slow-rank=2", "between 0 and 1"),
                      ("foo=1", "is not KIND=LEVEL"), ("moe", "is not KIND=LEVEL"), ("moe=x", "is not a number"),
                      ("moe=1.2,moe=1.3", "given twice"), ("inter-node=-1", ">= 0"), ("cost-error=nan", ">= 0")):
        with pytest.raises(UserError, match=says):
            Unknown.parse(bad)
    assert VariabilityModel(unknown="cost-error=0.20").unknown == "cost-error=0.2"


@pytest.mark.parametrize("spec", ["", "moe=1", "cost-error=0", "slow-rank=0,inter-node=0"])
def test_off_leaves_every_draw_as_it_was(spec):
    shape = PipelineShape(8, 1, 16)
    plain = sample_durations(VariabilityModel(workload="sft-chat", jitter=0.2, comm_latency=0.001), shape, 4)
    same = sample_durations(VariabilityModel(workload="sft-chat", jitter=0.2, comm_latency=0.001, unknown=spec),
                            shape, 4)
    assert (same.forward, same.backward, same.send_forward, same.send_backward) == \
        (plain.forward, plain.backward, plain.send_forward, plain.send_backward)


def test_other_kinds_draw_from_their_own_streams():
    """Adding a kind changes only what that kind touches: the cost error scales every stage of a microbatch by
    one factor, so per microbatch the ratio to the table without it is the same on every stage."""
    shape = PipelineShape(4, 1, 32)
    base = sample_durations(VariabilityModel(workload="sft-chat", jitter=0.1), shape, 2)
    erred = sample_durations(VariabilityModel(workload="sft-chat", jitter=0.1, unknown="cost-error=0.3"), shape, 2)
    for i in range(32):
        ratios = {round(erred.forward[k][i] / base.forward[k][i], 9) for k in range(4)}
        ratios |= {round(erred.backward[k][i] / base.backward[k][i], 9) for k in range(4)}
        assert len(ratios) == 1
    assert len({round(erred.forward[0][i] / base.forward[0][i], 9) for i in range(32)}) > 1
    assert erred.send_forward == base.send_forward
    assert erred.expected().forward == base.expected().forward  # mean one: the expectation does not move


def test_moe_stretches_language_stages_only_and_its_mean_is_expected():
    shape = PipelineShape(4, 1, 4000)
    model = VariabilityModel(workload="vlm-mixed", unknown="moe=2")  # no jitter: the factors alone
    base = sample_durations(VariabilityModel(workload="vlm-mixed"), shape, 0)
    table = sample_durations(model, shape, 0)
    assert table.forward[0] == base.forward[0]  # stage 0 runs the image encoder: dense
    factors = [a / b for a, b in zip(table.forward[2], base.forward[2])]
    assert min(factors) > 1.0 - MOE_SHARE  # the ratio is at least 1
    assert statistics.fmean(factors) == pytest.approx(1 + MOE_SHARE * (2 - 1), rel=0.03)
    expected = table.expected()
    assert expected.forward[2][0] / base.expected().forward[2][0] == pytest.approx(1 + MOE_SHARE)
    assert expected.forward[0] == base.expected().forward[0]


def test_slow_rank_episodes_cover_a_window_of_one_ranks_stages():
    shape = PipelineShape(4, 2, 40)  # rank r holds stages r and r + 4
    base = sample_durations(VariabilityModel(), shape, 1)
    table = sample_durations(VariabilityModel(unknown="slow-rank=1"), shape, 1)
    span = round(SLOW_RANK_SPAN * 40)
    for rank in range(4):
        slow = [[table.forward[k][i] / base.forward[k][i] for i in range(40)] for k in (rank, rank + 4)]
        assert slow[0] == pytest.approx(slow[1])  # both stages of the rank, the same microbatches
        stretched = [i for i, f in enumerate(slow[0]) if f == pytest.approx(SLOW_RANK_SLOWDOWN)]
        assert 1 <= len(stretched) <= span and stretched == list(range(stretched[0], stretched[0] + len(stretched)))
        assert all(f == pytest.approx(1.0) for i, f in enumerate(slow[0]) if i not in stretched)


def test_inter_node_latency_only_between_hosts():
    shape = PipelineShape(2 * NODE_SIZE, 1, 8)
    table = sample_durations(VariabilityModel(forward_time=0.01, unknown="inter-node=1"), shape, 3)
    crossing = NODE_SIZE - 1  # stage 7 -> 8 leaves the first host
    for k in range(2 * NODE_SIZE - 1):
        if k == crossing:
            assert all(v > 0 for v in table.send_forward[k]) and all(v > 0 for v in table.send_backward[k + 1])
        else:
            assert not any(table.send_forward[k]) and not any(table.send_backward[k + 1])
    expected = table.expected()
    assert expected.send_forward[crossing][0] == pytest.approx(INTERNODE_LATENCY * 0.01)
    assert expected.send_forward[0][0] == 0.0
