"""rrfp's Python API: bring your own model, or drive the readiness-first pipeline from your own script.

* :class:`ModelContext`, :class:`PipelineModel`, :class:`Batch`: the protocol
  of a model factory, ``rrfp run --workload package.module:factory``
  ([Note: the model protocol] in :mod:`runtime.workloads.user`).
* :class:`ReadyPipeline`: one rank's share of the pipeline inside a script
  you launch yourself (:mod:`runtime.run.pipeline`).
* :func:`copy_to_group`, :func:`reduce_from_group`: the two collectives of
  Megatron-style tensor parallelism, for a factory that shards its own
  layers ([Note: tensor parallelism for a model you bring]).
* :func:`load_into_unsplit`: an ``rrfp run`` checkpoint into the unsplit
  model, on one process (:mod:`runtime.run.checkpoint`).

Names are imported on first use, so ``import rrfp`` stays cheap.
"""

from __future__ import annotations

_EXPORTS = {
    "Batch": "runtime.workloads.user",
    "ModelContext": "runtime.workloads.user",
    "PipelineModel": "runtime.workloads.user",
    "ReadyPipeline": "runtime.run.pipeline",
    "copy_to_group": "runtime.workloads.tp_layers",
    "reduce_from_group": "runtime.workloads.tp_layers",
    "load_into_unsplit": "runtime.run.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rrfp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
