"""Per-(stage, kind) cost models: what a microbatch will cost, from what it holds.

A :class:`CostModel` predicts a task's duration from the features of its
microbatch that are known before an iteration runs: ``tokens`` (text tokens:
samples x sequence length) and ``images``. Per model stage and task kind it
is linear::

    duration(stage, kind) = a + b * tokens + c * images

``profiler.analysis.costs.fit_cost_model`` fits it on a trace; a cost-ranked hint file
carries it, so ``rrfp run`` and ``rrfp simulate`` can rank each iteration's
microbatches by predicted cost ([Note: cost-ranked hints] in
:mod:`hints.orders`). Linear in attention-free terms only: attention's
quadratic term in sequence length is left to the intercept and slope, which
is what a least-squares fit over the lengths seen gives.

Pure standard library; part of the public hint file format (``cost_model``
in ``rrfp-hint/2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hints.errors import HintError

FEATURES = ("tokens", "images")


@dataclass(frozen=True)
class CostModel:
    """``coefficients["<stage><kind>"] = (a, b_tokens, c_images)`` in seconds; see the module docstring."""

    stages: int
    coefficients: Mapping[str, tuple[float, float, float]]

    def predict(self, stage: int, kind: str, tokens: float, images: float) -> float:
        a, b, c = self.coefficients[f"{stage}{kind}"]
        return max(0.0, a + b * tokens + c * images)

    def microbatch_costs(self, features: Sequence[Mapping[str, float]]) -> list[float]:
        """Predicted compute of each microbatch, summed over stages and kinds (what ranks microbatches)."""
        costs = []
        for feature in features:
            tokens, images = float(feature.get("tokens", 0.0)), float(feature.get("images", 0.0))
            costs.append(sum(self.predict(int(key[:-1]), key[-1], tokens, images) for key in self.coefficients))
        return costs

    def to_json(self) -> dict[str, Any]:
        return {"features": list(FEATURES), "form": "a + b*tokens + c*images (seconds)",
                "stages": self.stages, "coefficients": {k: list(v) for k, v in self.coefficients.items()}}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "CostModel":
        if not isinstance(data, dict):
            raise HintError("'cost_model' must be an object", where)
        stages, coefficients = data.get("stages"), data.get("coefficients")
        if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
            raise HintError("'cost_model.stages' must be a whole number >= 1", where)
        if list(data.get("features", FEATURES)) != list(FEATURES):
            raise HintError(f"'cost_model.features' must be {list(FEATURES)}", where)
        if not isinstance(coefficients, dict) or not coefficients:
            raise HintError("'cost_model.coefficients' must map '<stage><kind>' to [a, b, c]", where)
        parsed = {}
        for key, value in coefficients.items():
            if (not isinstance(key, str) or len(key) < 2 or not key[:-1].isdigit() or key[-1] not in "FBIW"
                    or int(key[:-1]) >= stages):
                raise HintError(f"cost_model key {key!r} is not <stage><F|B|I|W> with stage < {stages}", where)
            if (not isinstance(value, list) or len(value) != 3
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                               for x in value)):
                raise HintError(f"cost_model {key}: expected three finite numbers [a, b, c]", where)
            parsed[key] = (float(value[0]), float(value[1]), float(value[2]))
        missing = [f"{k}F" for k in range(stages) if f"{k}F" not in parsed]
        if missing:
            raise HintError(f"cost_model has no coefficients for {missing[0]}", where)
        return cls(stages, parsed)


__all__ = ["FEATURES", "CostModel"]
