"""Variability no scheduler can know before the iteration: ``--unknown KIND=LEVEL[,KIND=LEVEL...]``.

Sorting microbatches by their known cost (``1f1b-light``, ``bfw``, ``cp``)
takes care of the variability that is known before an iteration starts
(what each microbatch holds). What readiness is for is the rest: this module
draws it, on top of a :class:`runtime.durations.variability.VariabilityModel`
table, and says what of it a scheduler may expect.

[Note: unknown variability]
    Four kinds, each set by one level (docs/workloads.md, "Variability
    nobody knows beforehand", cites where each figure comes from):

    ``moe=L`` (L >= 1): mixture-of-experts routing imbalance. A language
        stage's expert layers last as long as their most loaded expert:
        ``L`` is the mean ratio of the most loaded expert's tokens to the
        mean, for top-k routing without a capacity limit. Per (stage,
        microbatch) the ratio is ``1 + (L - 1) X`` with ``X`` a mean-one
        lognormal of log-sd :data:`MOE_SPREAD` (each stage's router sees a
        different draw), and it stretches the :data:`MOE_SHARE` of the
        stage's forward and backward that the experts take. Encoder stages
        are dense. A microbatch's routing is known only once its router has
        run, so the expectation holds the mean ratio ``L``.
    ``cost-error=S`` (S >= 0): the cost model's error. Each microbatch's
        realized cost is its predicted cost times a mean-one lognormal of
        log-sd ``S``, on every stage alike (a microbatch mispredicted is
        mispredicted everywhere): what sorts by cost and ``cp`` read stays
        the prediction.
    ``slow-rank=Q`` (0 <= Q <= 1): transient slow ranks. Each rank, each
        iteration, with probability ``Q`` runs :data:`SLOW_RANK_SLOWDOWN`
        times slower for a contiguous window of :data:`SLOW_RANK_SPAN` of
        the microbatches (thermal throttling, a noisy neighbour, a host
        process), starting at a uniformly drawn microbatch.
    ``inter-node=S`` (S >= 0): network jitter between hosts. A transfer
        between ranks on different hosts (:data:`NODE_SIZE` ranks per host)
        takes an extra :data:`INTERNODE_LATENCY` of a stage's mean forward
        time, times a mean-one lognormal of log-sd ``S``: the tail of
        inter-node point-to-point latency.

    Each kind draws from its own seeded stream (``"{seed}:moe"`` and so on),
    so a level of 0, or a kind left out, leaves every other draw of the table
    as it was. The expectation (:meth:`Unknown.expected_factors`) is each
    kind's mean: the mean routing ratio, a mean-one error, the slow ranks'
    mean stretch, the mean extra latency. Never the draw itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hints.errors import UserError
from hints.tasks import PipelineShape

KINDS = ("moe", "cost-error", "slow-rank", "inter-node")
# Calibration (docs/workloads.md, "Variability nobody knows beforehand", gives each source).
MOE_SHARE = 0.6  # of a language stage's time in its expert layers (assumption: a Mixtral-like layer)
MOE_SPREAD = 0.5  # log-sd of the routing excess from stage to stage and microbatch to microbatch (assumption)
SLOW_RANK_SLOWDOWN = 1.5  # a slow rank's stretch while slow
SLOW_RANK_SPAN = 0.25  # of the iteration's microbatches a slow episode covers
NODE_SIZE = 8  # ranks per host
INTERNODE_LATENCY = 0.05  # of a stage's mean forward time: a 64 MB activation over 400 Gb/s against ~25 ms
SPEC_HELP = ("Variability no scheduler knows before the iteration, as KIND=LEVEL pairs joined by commas: "
             "moe=L (mean max/mean expert load, >= 1), cost-error=S (log-sd of each microbatch's cost-model "
             "error), slow-rank=Q (chance a rank runs 1.5x slower for a quarter of the iteration), inter-node=S "
             "(log-sd of the latency between hosts of 8 ranks). docs/workloads.md cites each calibration.")


@dataclass(frozen=True)
class Unknown:
    """Parsed levels of :data:`KINDS` (0, or 1 for ``moe``, is off)."""

    moe: float = 1.0
    cost_error: float = 0.0
    slow_rank: float = 0.0
    inter_node: float = 0.0

    @classmethod
    def parse(cls, spec: str | None, where: str = "`unknown`") -> "Unknown":
        """``"moe=1.5,cost-error=0.2"``; an empty spec is no unknown variability."""
        levels: dict[str, float] = {}
        for part in (spec or "").split(","):
            part = part.strip()
            if not part:
                continue
            kind, sep, value = part.partition("=")
            kind = kind.strip()
            if not sep or kind not in KINDS:
                raise UserError(f"{part!r} is not KIND=LEVEL with KIND one of {', '.join(KINDS)}", where)
            if kind in levels:
                raise UserError(f"{kind} is given twice", where)
            try:
                level = float(value)
            except ValueError:
                raise UserError(f"{kind}: {value.strip()!r} is not a number", where) from None
            if not math.isfinite(level) or level < (1.0 if kind == "moe" else 0.0) or \
                    (kind == "slow-rank" and level > 1.0):
                bounds = {"moe": ">= 1", "slow-rank": "between 0 and 1"}.get(kind, ">= 0")
                raise UserError(f"{kind} must be {bounds}, got {value.strip()}", where)
            levels[kind] = level
        return cls(**{kind.replace("-", "_"): level for kind, level in levels.items()})

    @property
    def active(self) -> bool:
        return self != Unknown()

    def spec(self) -> str:
        """The canonical spec (``""`` when nothing is on): what job files and JSON carry."""
        parts = []
        for kind in KINDS:
            level = getattr(self, kind.replace("-", "_"))
            if level != (1.0 if kind == "moe" else 0.0):
                parts.append(f"{kind}={level:g}")
        return ",".join(parts)

    # -- what a scheduler may expect ------------------------------------------------------------
    def moe_mean(self) -> float:
        """A language stage's expected stretch from routing imbalance."""
        return 1.0 + MOE_SHARE * (self.moe - 1.0)

    def slow_mean(self) -> float:
        """A task's expected stretch from slow episodes."""
        return 1.0 + self.slow_rank * SLOW_RANK_SPAN * (SLOW_RANK_SLOWDOWN - 1.0)

    def internode_mean(self, stage_forward_time: float) -> float:
        """The mean extra latency of a transfer between hosts, for a stage whose mean forward lasts that long."""
        return INTERNODE_LATENCY * stage_forward_time if self.inter_node > 0 else 0.0

    # -- the draws ----------------------------------------------------------------------------
    def compute_factors(self, shape: PipelineShape, encoder_stages: int, seed: int) -> list[list[float]] | None:
        """Per (stage, microbatch), what this iteration's unknowns stretch the task by (None: nothing)."""
        stages, m = shape.stages, shape.microbatches
        if self.moe == 1.0 and self.cost_error == 0.0 and self.slow_rank == 0.0:
            return None
        factors = [[1.0] * m for _ in range(stages)]
        if self.moe > 1.0:
            rng = random.Random(f"{seed}:moe")
            mu = -MOE_SPREAD * MOE_SPREAD / 2.0
            excess = self.moe - 1.0
            for k in range(encoder_stages, stages):
                row = factors[k]
                for i in range(m):
                    ratio = 1.0 + excess * math.exp(rng.normalvariate(mu, MOE_SPREAD))
                    row[i] *= 1.0 - MOE_SHARE + MOE_SHARE * ratio
        if self.cost_error > 0.0:
            rng = random.Random(f"{seed}:cost-error")
            mu = -self.cost_error * self.cost_error / 2.0
            errors = [math.exp(rng.normalvariate(mu, self.cost_error)) for _ in range(m)]
            for row in factors:
                for i in range(m):
                    row[i] *= errors[i]
        if self.slow_rank > 0.0:
            rng = random.Random(f"{seed}:slow-rank")
            span = max(1, round(SLOW_RANK_SPAN * m))
            for rank in range(shape.ranks):
                slow = rng.random() < self.slow_rank
                start = rng.randrange(m)  # drawn for every rank, so one rank's draw never shifts another's
                if not slow:
                    continue
                for stage in shape.stages_of_rank(rank):
                    row = factors[stage]
                    for i in range(start, min(m, start + span)):
                        row[i] *= SLOW_RANK_SLOWDOWN
        return factors

    def expected_factors(self, shape: PipelineShape, encoder_stages: int) -> list[float]:
        """Per stage, the mean of :meth:`compute_factors` (the cost error is mean one)."""
        slow = self.slow_mean()
        return [slow * (self.moe_mean() if k >= encoder_stages else 1.0) for k in range(shape.stages)]

    def crosses_hosts(self, shape: PipelineShape, stage: int) -> bool:
        """Whether stage ``stage``'s activation to ``stage + 1`` travels between hosts."""
        return shape.rank_of(stage) // NODE_SIZE != shape.rank_of(stage + 1) // NODE_SIZE

    def extra_latencies(self, shape: PipelineShape, forward_time: float, seed: int
                        ) -> tuple[list[list[float]], list[list[float]]] | None:
        """Extra seconds per (stage, microbatch) on activations sent downstream and gradients sent upstream
        (None: nothing). Index as ``Durations.send_forward`` / ``send_backward``."""
        if self.inter_node == 0.0:
            return None
        stages, m = shape.stages, shape.microbatches
        rng = random.Random(f"{seed}:inter-node")
        base, sigma = INTERNODE_LATENCY * forward_time / shape.chunks, self.inter_node
        mu = -sigma * sigma / 2.0
        forward = [[0.0] * m for _ in range(stages)]
        backward = [[0.0] * m for _ in range(stages)]
        for k in range(stages - 1):
            if self.crosses_hosts(shape, k):
                forward[k] = [base * math.exp(rng.normalvariate(mu, sigma)) for _ in range(m)]
                backward[k + 1] = [base * math.exp(rng.normalvariate(mu, sigma)) for _ in range(m)]
        return forward, backward
