"""torch.distributed.pipelining's side of the comparison (:mod:`profiler.bench.external`): torch's schedules
on rrfp's own stage modules and data, in ranks of their own.

[Note: the torch adapter]
    torch splits the ``step()`` input along dim 0 into microbatches and calls the stage module with the
    tensors it received. Stage 0 is given the microbatch indices (``arange(m)``, shape ``[m, 1]``) and
    looks up ``workload.batch(iteration, index)``; the loss function is given the same indices as
    ``target``. Later stages receive only activations, yet the emulated stages need the microbatch
    index to sleep its sampled durations, so :class:`IndexedStage` records the chunk id that torch
    passes to ``forward_one_chunk`` before the module runs. Each stage's module is built by
    ``Workload.build_stage`` from the same seed as in rrfp, and each microbatch's loss is divided by
    the microbatch count with ``scale_grads=False``, exactly as rrfp does, so both runtimes compute the
    same losses and gradients; the tables print the last iteration's loss to show it. A rank of a
    multi-stage schedule holds one ``PipelineStage`` per local model stage (ids ``r, r+p`` looping;
    ``r, 2p-1-r`` in a V, where rank 0 feeds the inputs *and* computes the loss). torch's split
    backward (``I`` then ``W``, :mod:`torch.distributed.pipelining._backward`) needs nothing of the
    module: it retains the graph from ``I`` and walks it again for the weights in ``W``, as rrfp's
    executor does; the emulated stage's two sleeping autograd nodes sit on the input and on the
    weight path, so ``I`` sleeps one and ``W`` the other, in both runtimes.

[Note: static shapes]
    ``PipelineStage`` infers shapes on the first ``step()`` unless it is given example tensors; that
    dynamic inference exchanges metadata with ``send_object_list``/``recv_object_list``, which need
    numpy (absent unless the ``hf`` extra brought it: "Numpy is not available"). Each rank therefore builds its stage's
    example input and output by running stages ``0..k`` once on microbatch 0 (:func:`example_tensors`),
    and torch runs in static mode: no inference pass, no metadata messages. This relies on fixed
    shapes, which all three cases have (gpt with ``--seq-len``; emulated activations are
    ``[samples, 32]``).
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: numpy may be absent

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from hints.files.torch_import import import_torch_schedule
from runtime.config import RunConfig, run_shape
from runtime.run.launch import free_port, start_fork_server
from runtime.workloads.make import make_optimizer, make_workload


class TorchStageAdapter(nn.Module):
    """An rrfp stage module behind torch's ``module(*received_tensors)`` interface (see [Note: the torch adapter])."""

    def __init__(self, workload, stage_index: int) -> None:
        super().__init__()
        self.workload = workload
        self.stage_module = workload.build_stage(stage_index)
        self.first = stage_index == 0
        self.iteration = 0
        self.microbatch = 0  # set by IndexedStage before every forward

    def forward(self, received: torch.Tensor) -> torch.Tensor:
        if self.first:
            batch = self.workload.batch(self.iteration, int(received.reshape(-1)[0]))
            inputs = tuple(t.detach().requires_grad_(t.is_floating_point())
                           for t in self.workload.first_inputs(batch))
        else:
            batch = self.workload.batch(self.iteration, self.microbatch)
            inputs = (received,)
        (output,) = self.stage_module(inputs, batch)
        return output


def example_tensors(config: RunConfig, stage_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Example input and output of one torch stage, from running stages ``0..stage_index`` on microbatch 0.

    They give torch's ``PipelineStage`` its shapes up front (static mode; see [Note: static shapes]).
    """
    workload = make_workload(config, run_shape(config))
    received = torch.zeros(1, 1, dtype=torch.long)  # stage 0: one microbatch index
    for stage in range(stage_index + 1):
        adapter = TorchStageAdapter(workload, stage)
        output = adapter(received)
        if stage < stage_index:
            received = output.detach().requires_grad_(True)
    return received, output


class IndexedStage(PipelineStage):
    """Tells the adapter which microbatch it is about to run (torch passes it only activations)."""

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.submod.microbatch = fwd_chunk_id
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)


def torch_worker(configs: dict[str, RunConfig]) -> dict:
    """One rank of a torch launch: every schedule in turn, fresh modules each; rank 0 returns the timings."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules as torch_schedules

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    first = next(iter(configs.values()))
    dist.init_process_group("gloo", timeout=timedelta(seconds=max(120.0, 2 * first.timeout)))
    results = {}
    try:
        for name, config in configs.items():
            shape = run_shape(config)
            microbatches, last_stage = config.microbatches, shape.stages - 1
            local = [k for k in range(shape.stages) if shape.rank_of(k) == rank]
            workload = make_workload(config, shape)
            # A zero-bubble schedule's emulated W sleeps the split's price in torch as in rrfp (the worker
            # sets the same flag; [Note: split backward durations] in runtime.durations.variability).
            torch_shape = import_torch_schedule(name, config.ranks, microbatches, shape.chunks).shape
            workload.split_stages = frozenset(torch_shape.split_stages)
            adapters = {k: TorchStageAdapter(workload, k) for k in local}
            loss_adapter = adapters.get(last_stage)

            def loss_fn(output, target, workload=workload, adapter=loss_adapter):
                batch = workload.batch(adapter.iteration, int(target.reshape(-1)[0]))
                return workload.loss((output,), batch) / microbatches

            stages = []
            for k in local:
                example_input, example_output = example_tensors(config, k)
                stages.append(IndexedStage(adapters[k], k, shape.stages, torch.device("cpu"),
                                           input_args=example_input, output_args=example_output))
            schedule_class = getattr(torch_schedules, name)
            single = issubclass(schedule_class, torch_schedules.PipelineScheduleSingle)
            schedule = schedule_class(stages[0] if single else stages, microbatches, loss_fn=loss_fn,
                                      scale_grads=False)
            optimizer = make_optimizer([p for a in adapters.values() for p in a.stage_module.parameters()], config)
            indices = torch.arange(microbatches).unsqueeze(1)
            walls, losses = [], []
            for iteration in range(config.iters):
                for adapter in adapters.values():
                    adapter.iteration = iteration
                microbatch_losses: list[torch.Tensor] = []
                args = (indices,) if 0 in adapters else ()
                target = indices if loss_adapter is not None else None
                dist.barrier()
                began = time.perf_counter()
                schedule.step(*args, target=target, losses=microbatch_losses if target is not None else None,
                              return_outputs=False)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                dist.barrier()
                walls.append(time.perf_counter() - began)
                losses.append(sum(float(loss) for loss in microbatch_losses) if target is not None else float("nan"))
            loss_table = torch.tensor(losses, dtype=torch.float64)
            dist.broadcast(loss_table, src=shape.rank_of(last_stage))
            results[name] = {"walls": walls, "losses": loss_table.tolist()}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return results


def run_torch(configs: dict[str, RunConfig], stages: int, out_root: Path) -> dict:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    start_fork_server()  # torch's ranks start as rrfp's do ([Note: ranks fork from a server that has imported torch])
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=stages, run_id=f"xf-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, monitor_interval=0.1,
        start_method="forkserver", shutdown_timeout=5,
        logs_specs=DefaultLogsSpecs(log_dir=str(out_root / "torch-logs"), redirects=Std.ALL),
    )
    return elastic_launch(launch_config, torch_worker)(configs)[0]
