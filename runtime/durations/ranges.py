"""The range of every number a model of durations takes, checked in one place for every command and file.

[Note: number ranges]
A number option is finite, and lies in the range where the model still means something: a log-sd of 1e308
makes every mean-one lognormal draw 0 (so a makespan of 0), an infinite forward time a makespan of inf and a
bound ratio of nan. :data:`NUMBER_RANGES` holds those ranges by the input's library name; :func:`check_number`
is the one check. The variability model (``VariabilityModel``), ``rrfp run``'s configuration (flags and TOML
alike: ``runtime.config``) and the CLI's options (``rrfp_cli.options.numbers_checked``, which also refuses inf
and nan in every other number option of every command) all check through here, so a range is written once.
The upper bounds are sanity limits, far beyond any measured workload (docs/workloads.md): an hour per task or
message, a straggler 1000 times slower, a log-sd of 3 (the median task 1% of the mean).
"""

from __future__ import annotations

import math

from hints.errors import UserError, input_name

HOUR = 3600.0

NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "forward_time": (0.0, HOUR),  # seconds of a microbatch's forward per rank
    "backward_ratio": (0.0, 100.0),
    "jitter": (0.0, 3.0),  # log-sd of mean-one lognormal noise
    "comm_jitter": (0.0, 3.0),
    "straggler_prob": (0.0, 1.0),
    "straggler_slowdown": (1.0, 1000.0),
    "comm_latency": (0.0, HOUR),  # seconds per message
    "task_overhead": (0.0, HOUR),  # seconds of dispatch before every task
}
SPLIT_OVERHEAD_MAX = 10.0  # a split backward's I + W over B: at least 1 (it does at least the fused one's work)


def describe_range(name: str) -> str:
    low, high = NUMBER_RANGES[name]
    return f"a finite number from {low:g} to {high:g}"


def check_number(name: str, value: object, where: str | None = None) -> float:
    """``value`` as a float if it is a finite number in ``name``'s range (:data:`NUMBER_RANGES`; any finite
    number for a name not there; ``split_overhead``: 1 to :data:`SPLIT_OVERHEAD_MAX`), else a :class:`UserError` at ``where`` (default: the input ``name``) that
    says the range."""
    where = where or input_name(name)
    if name == "split_overhead":
        return _check_split_overhead(value, where)
    bounds = NUMBER_RANGES.get(name)
    wanted = describe_range(name) if bounds else "a finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"must be {wanted}, got {value!r}", where)
    if bounds and not bounds[0] <= value <= bounds[1]:
        raise UserError(f"must be {wanted}, got {value!r}", where)
    return float(value)


def _check_split_overhead(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1.0:
        raise UserError(f"must be a finite number >= 1 (I + W over B), got {value!r}", where)
    if value > SPLIT_OVERHEAD_MAX:
        raise UserError(f"must be at most {SPLIT_OVERHEAD_MAX:g} (I + W over B), got {value!r}", where)
    return float(value)
