"""Checkpoints of ``rrfp run``: model and optimizer state per stage, RNG states and data position.

A checkpoint is one directory, ``<job dir>/checkpoints/step-<NNNNNNNN>``, where
``step`` is the number of iterations it has trained (the run resumes at
iteration ``step``). It holds the files of ``torch.distributed.checkpoint``
(DCP: ``.metadata`` and one ``__<rank>_0.distcp`` per rank) and a manifest,
``rrfp-checkpoint.json``, that says which job it belongs to.

[Note: checkpoint keys]
    Every rank saves, in one collective ``dcp.save``:

    * ``model.stage<k>.<parameter>``: each model stage's parameters and
      buffers, named by *model stage*, not by rank, so a key means the same
      thing whatever rank held it;
    * ``optim.state.stage<k>.<parameter>.<field>`` and
      ``optim.param_groups.stage<k>.<parameter>.<field>``: the optimizer's
      state in torch's flattened form (``flatten_optimizer_state_dict``),
      again one key per parameter;
    * ``rng.rank<r>``: this process's RNG states (torch CPU and CUDA, Python's
      ``random``, and the runtime's injected-noise stream), one entry per
      global rank;
    * ``progress``: the data position, ``{"step": N}``, the same on every rank.

    With ``--tp`` a model or optimizer key holds the *whole* tensor and each
    TP member writes its shard of it: :class:`RankCheckpointer` presents a
    sharded parameter (and its optimizer moments) to DCP as a ``DTensor``
    over the member's TP group, ``Shard`` on the layout's dimension
    (:data:`runtime.workloads.tp_layers.BLOCK_LAYOUT`). A layout of ``pieces > 1`` (``qkv``:
    each member holds its rows of q, of k and of v) is not one contiguous
    block of the whole tensor, so its key is the whole tensor viewed as
    ``(pieces, rows / pieces, ...)`` along that dimension
    (:func:`checkpoint_shape`), where each member's share is one block.
    Unsharded parameters (norms, embeddings, row-parallel biases) are the
    same on every member of a group and are plain tensors, saved once.
    With ``--dp`` every replica holds the same keys (and the same shards);
    DCP's planner keeps one writer per key and offset (its
    ``dedup_save_plans``), so a checkpoint of ``dp`` replicas is the size
    of one. Only ``rng.rank<r>`` stays per process.

[Note: atomic checkpoints]
    Ranks write into ``checkpoints/.tmp-step-<N>``; when the collective save
    has returned on rank 0 every rank's file is complete (DCP gathers their
    write results before it writes ``.metadata``), so rank 0 writes the
    manifest last and renames the directory to ``step-<N>``, then deletes
    older checkpoints. A rename is atomic, so a directory named ``step-*``
    with a manifest is always whole; a crash at any point leaves the previous
    checkpoint in place, and :func:`latest` ignores temporary directories
    (rank 0 clears them before the first iteration of the next attempt).
    Checkpoints are written after the end-of-iteration all-gather, which no
    rank passes when the loss was NaN or infinite ([Note: non-finite losses]
    in :mod:`runtime.run.health`), so no checkpoint holds a step taken on one.

[Note: a checkpoint the disk refuses]
    A save the disk refuses (full, over quota, read-only) ends the run as any
    refused output does ([Note: a full disk under rrfp run] in
    :mod:`rrfp_cli.cmd_run`): a :class:`hints.outputs.DiskError` naming the
    file and the disk, raised on every rank, since DCP hands every rank the
    same per-rank failures. torch's serializer reports a refused ``write`` of
    a tensor only as a position mismatch, so the streams DCP writes through
    keep the ``OSError`` and raise it in its place
    (:func:`_refusal_naming_writer`); the manifest is written whole
    (:func:`hints.outputs.write_text`). Any other failed save is a
    :class:`hints.errors.Failure` naming the rank (DCP's own exception is a
    ``BaseException`` that passes every ``except Exception``). Either way rank
    0 removes the partial directory (every rank's writes ended before the
    save failed) and, as [Note: atomic checkpoints] has it, the last complete
    checkpoint stays.

:func:`check_resumable` runs before any rank starts: it refuses a directory
without a checkpoint, or a checkpoint of another shape (stages, chunks,
microbatches, tp, dp), workload or model (parameter names and sizes, read
from DCP's metadata and compared with the model built on the ``meta``
device), with one ``UserError``.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hints.errors import UserError

FORMAT = "rrfp-checkpoint/1"
MANIFEST = "rrfp-checkpoint.json"
FOLDER = "checkpoints"
SHAPE_FIELDS = ("ranks", "chunks", "microbatches", "placement", "tp", "dp")
# What makes the model and its data stream: resuming with another value would train another model.
MODEL_FIELDS = ("workload", "hidden", "heads", "layers_per_stage", "vocab", "samples", "seq_len", "emulate", "seed")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def latest(job_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a job directory (None if it has none)."""
    folder = Path(job_dir) / FOLDER
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith("step-") and (p / MANIFEST).is_file()]
    except OSError:
        return None
    return max(candidates, key=lambda p: p.name, default=None)


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"unreadable checkpoint manifest: {err}", str(path)) from None
    if manifest.get("format") != FORMAT:
        raise UserError(f"not an {FORMAT} checkpoint (format {manifest.get('format')!r})", str(path))
    if isinstance(manifest.get("shape"), dict) and "stages" in manifest["shape"]:  # written before "ranks"
        manifest["shape"]["ranks"] = manifest["shape"].pop("stages")
    return manifest


def _shape(config) -> dict[str, Any]:
    """The job's shape as run: chunks and placement resolved (a config may leave them to the hint)."""
    from runtime.config import run_shape

    shape = run_shape(config)
    resolved = {"ranks": shape.ranks, "chunks": shape.chunks, "microbatches": shape.microbatches,
                "placement": shape.placement}
    return {name: resolved.get(name, getattr(config, name, None)) for name in SHAPE_FIELDS}


def manifest_for(config, step: int) -> dict[str, Any]:
    return {"format": FORMAT, "step": step, "time": time.time(), "shape": _shape(config),
            "model": {name: getattr(config, name) for name in MODEL_FIELDS}}


def check_resumable(config, run_dir: str | Path, flag: str = "`resume`") -> Path:
    """The checkpoint ``config`` resumes from in ``run_dir``; ``UserError`` if there is none or it does not fit."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a directory", flag)
    path = latest(run_dir)
    if path is None:
        raise UserError(f"{run_dir} holds no checkpoint (run with `checkpoint_every` K to write them)", flag)
    manifest = read_manifest(path)
    for group, here in (("shape", _shape(config)), ("model", {name: getattr(config, name) for name in MODEL_FIELDS})):
        saved = manifest.get(group, {})
        differ = [f"{name} {saved.get(name)!r} there, {value!r} here" for name, value in here.items()
                  if saved.get(name) != value]
        if differ:
            raise UserError(f"{path.name} is a checkpoint of another {group}: {'; '.join(differ)}", flag)
    _check_parameters(config, path, flag)
    if manifest["step"] >= config.iters:
        raise UserError(f"{path.name} has already trained {manifest['step']} iterations and the run has "
                        f"{config.iters}; give `iters` > {manifest['step']}", flag)
    return path


def _check_parameters(config, path: Path, flag: str) -> None:
    """Every parameter of the model built from ``config`` is in the checkpoint with its size, and no other."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from runtime.config import run_shape
    from runtime.workloads.make import make_workload

    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    saved = {key[len("model."):]: tuple(meta.size) for key, meta in metadata.items()
             if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    workload = make_workload(config, run_shape(config))
    expected = {}
    with torch.device("meta"):
        for stage in range(run_shape(config).stages):
            module = workload.build_stage(stage)
            whole = {name: tensor.shape for name, tensor in module.state_dict().items()}
            layouts = _layouts(module, config.tp)  # shards the module in place: after `whole` was read
            for name, size in whole.items():
                shape = checkpoint_shape(size, layouts[name]) if name in layouts else size
                expected[f"{stage_key(stage)}.{name}"] = tuple(shape)
    missing = sorted(expected.keys() - saved.keys())
    extra = sorted(saved.keys() - expected.keys())
    resized = sorted(k for k in expected.keys() & saved.keys() if expected[k] != saved[k])
    if missing or extra or resized:
        what = (f"{len(missing)} parameters missing (e.g. {missing[0]})" if missing
                else f"{len(extra)} parameters this model lacks (e.g. {extra[0]})" if extra
                else f"{resized[0]} is {list(saved[resized[0]])} there, {list(expected[resized[0]])} here")
        raise UserError(f"{path.name} is a checkpoint of another model: {what}", flag)


def stage_key(stage: int) -> str:
    return f"stage{stage}"


def load_into_unsplit(checkpoint: str | Path, stages) -> int:
    """Load a checkpoint's model into the unsplit model, on one process; returns the step it was taken after.

    [Note: loading a checkpoint into the unsplit model] ``checkpoint`` is a
    ``checkpoints/step-<N>`` directory, or a run (job) directory, whose latest
    checkpoint is read. ``stages`` holds one whole (unsharded) module per
    model stage, indexed by model stage (a list, or a dict stage -> module):
    what the factory builds when given every stage, or the built-in
    workload's ``build_stage(k)``. Key ``model.stage<k>.<name>`` goes to
    ``stages[k]``'s ``<name>`` ([Note: checkpoint keys]); a key of a TP run
    already holds the whole tensor, and the ``(pieces, rows / pieces, ...)``
    view of a ``pieces > 1`` layout (``qkv``) is reshaped back into the
    parameter's shape, its rows in the unsplit order (q, then k, then v). No
    process group is needed (DCP reads with ``no_dist``); optimizer state,
    RNG states and the data position are not read. A directory that is not a
    checkpoint, or whose parameters do not match ``stages`` (missing, extra or
    resized), is a ``UserError`` naming the key.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    given = Path(checkpoint)
    path = given if (given / MANIFEST).is_file() else latest(given)
    if path is None:
        raise UserError("neither an rrfp checkpoint (no rrfp-checkpoint.json) nor a run directory holding one",
                        str(given))
    step = int(read_manifest(path)["step"])
    modules = dict(stages) if isinstance(stages, dict) else dict(enumerate(stages))
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    saved = {key[len("model."):]: meta for key, meta in metadata.items()
             if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    targets = {f"{stage_key(stage)}.{name}": tensor for stage, module in sorted(modules.items())
               for name, tensor in module.state_dict().items()}
    missing, extra = sorted(targets.keys() - saved.keys()), sorted(saved.keys() - targets.keys())
    if missing or extra:
        what = (f"model.{missing[0]} is not in it ({len(missing)} parameters missing)" if missing
                else f"it holds model.{extra[0]}, which the model lacks ({len(extra)} such)")
        raise UserError(f"not a checkpoint of this model: {what}", str(path))
    for key, target in targets.items():
        size = tuple(saved[key].size)
        pieces_view = len(size) == target.dim() + 1 and torch.Size(size).numel() == target.numel()
        if size != tuple(target.shape) and not pieces_view:
            raise UserError(f"not a checkpoint of this model: model.{key} is {list(size)} there, "
                            f"{list(target.shape)} here", str(path))
    state = {f"model.{key}": torch.empty(saved[key].size, dtype=saved[key].properties.dtype) for key in targets}
    with warnings.catch_warnings():  # DCP warns that it assumes one process: it is told so
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=FileSystemReader(str(path)), no_dist=True)
    with torch.no_grad():
        for key, target in targets.items():
            target.copy_(state[f"model.{key}"].reshape(target.shape))  # a (pieces, rows, ...) view is row-major
    return step


def _layouts(module, tp: int) -> dict[str, tuple[int, int]]:
    """The sharded parameters of a (meta) stage under ``--tp tp`` ({} without TP)."""
    if tp == 1:
        return {}
    from runtime.workloads.tp_layers import TPShard, shard_stage, sharded_layouts

    return sharded_layouts(shard_stage(module, TPShard(0, tp, None)))


def checkpoint_shape(shape, layout: tuple[int, int]) -> list[int]:
    """The shape a parameter of ``shape`` (whole) sharded with ``layout`` has in a checkpoint
    ([Note: checkpoint keys]): the whole shape, with the sharded dimension split into ``(pieces, rows)``
    when the layout has several pieces."""
    dim, pieces = layout
    shape = list(shape)
    return shape[:dim] + [pieces, shape[dim] // pieces] + shape[dim + 1:] if pieces > 1 else shape


class TPSharding:
    """How one TP member's shards appear in a checkpoint ([Note: checkpoint keys]).

    ``layouts`` maps ``stage<k>.<parameter>`` to its layout (:func:`runtime.workloads.tp_layers.sharded_layouts`),
    ``group`` is the member's TP group, ``size`` its size.
    """

    def __init__(self, layouts: dict[str, tuple[int, int]], group, size: int, device_type: str) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        self.layouts, self.size = layouts, size
        self.mesh = DeviceMesh.from_group(group, device_type)

    def as_global(self, local, layout: tuple[int, int]):
        """``local`` (this member's shard) as a DTensor of the whole tensor, sharing ``local``'s storage."""
        import torch
        from torch.distributed.tensor import DTensor, Shard

        dim, pieces = layout
        view = local.unflatten(dim, (pieces, local.shape[dim] // pieces)) if pieces > 1 else local
        dim = dim + 1 if pieces > 1 else dim
        shape = list(view.shape)
        shape[dim] *= self.size
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(view, self.mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape),
                                  stride=stride)

    def wrap(self, model: dict, optim: dict) -> tuple[dict, dict]:
        """Copies of the two state dicts with every sharded tensor as :meth:`as_global` (the same storage,
        so a load into the copies lands in the originals). A tensor that is a DTensor already (a user's TP
        plan, and its optimizer moments) is one: DCP saves it as it is."""
        from runtime.workloads.tp_layers import is_dtensor

        model = {key: self.as_global(value, self.layouts[key]) if key in self.layouts and not is_dtensor(value)
                 else value for key, value in model.items()}
        wrapped = {}
        for key, value in optim.items():
            group, _, rest = key.partition(".")  # "state.<parameter>.<field>" or "param_groups...."
            parameter, _, field = rest.rpartition(".")
            layout = self.layouts.get(parameter) if group == "state" and not is_dtensor(value) else None
            sharded = layout is not None and getattr(value, "dim", lambda: 0)() > layout[0]
            wrapped[key] = self.as_global(value, layout) if sharded else value
        return model, wrapped

    @staticmethod
    def unwrap(original: dict, seen: dict) -> dict:
        """After a load into :meth:`wrap`'s copy: its values, with each DTensor's place taken by the plain
        tensor it shares storage with."""
        from torch.distributed.tensor import DTensor

        return {key: original[key] if isinstance(value, DTensor) else value for key, value in seen.items()}


class RankCheckpointer:
    """One rank's side of saving and loading ([Note: checkpoint keys], [Note: atomic checkpoints]).

    ``modules`` maps model stage -> module (this rank's chunks), ``optimizer``
    holds their parameters, ``streams`` names extra ``random.Random`` streams
    of this rank whose state must survive (the runtime's injected noise).
    ``group``: the process group of the collective save and load (None: the
    default group). ``sharding``: with ``--tp``, how this member's shards
    map onto whole tensors (None without TP).
    """

    def __init__(self, job_dir: str | Path, rank: int, modules: dict, optimizer, streams: dict[str, random.Random],
                 group=None, sharding: TPSharding | None = None) -> None:
        import torch

        self.folder = Path(job_dir) / FOLDER
        self.rank, self.optimizer, self.streams, self.group = rank, optimizer, streams, group
        self.sharding = sharding
        self.model = torch.nn.ModuleDict({stage_key(k): m for k, m in sorted(modules.items())})

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state to restore into (plain tensors), and what DCP sees of it (TP shards as whole tensors)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model, optim = get_state_dict(self.model, self.optimizer,
                                      options=StateDictOptions(flatten_optimizer_state_dict=True))
        state = {"model": model, "optim": optim, f"rng.rank{self.rank}": self._rng_state(), "progress": {"step": 0}}
        if self.sharding is None:
            return state, state
        seen_model, seen_optim = self.sharding.wrap(model, optim)
        return state, {**state, "model": seen_model, "optim": seen_optim}

    def _rng_state(self) -> dict[str, Any]:
        import torch

        state = {"torch": torch.get_rng_state(), "python": random.getstate(),
                 **{f"stream.{name}": rng.getstate() for name, rng in self.streams.items()}}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def clear_partial(self) -> None:
        """Rank 0, before the first iteration: remove what a crash mid-write left ([Note: atomic checkpoints])."""
        if self.rank == 0 and self.folder.is_dir():
            for partial in self.folder.glob(".tmp-*"):
                shutil.rmtree(partial, ignore_errors=True)

    def save_if_due(self, step: int, config) -> float | None:
        """After ``step`` iterations: save if ``--checkpoint-every`` divides ``step``; the seconds it took."""
        if step % config.checkpoint_every:
            return None
        began = time.perf_counter()
        self.save(step, config)
        return time.perf_counter() - began

    def save(self, step: int, config) -> Path:
        """Collective: every rank calls it after the same iteration. Returns the checkpoint's path.

        A save the disk refuses is a :class:`hints.outputs.DiskError` naming the file and the disk, on every rank;
        any other failed save a :class:`hints.errors.Failure` naming the rank whose write failed. Either way the
        partial directory is removed and the last complete checkpoint stays ([Note: a checkpoint the disk
        refuses]).
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        from hints.outputs import DiskError, write_text

        final = self.folder / step_name(step)
        partial = self.folder / f".tmp-{step_name(step)}"
        _, state = self._state()
        state["progress"]["step"] = step
        began = time.perf_counter()
        try:
            with _object_collectives():
                dcp.save(state, storage_writer=_refusal_naming_writer(partial), process_group=self.group)
            seconds = time.perf_counter() - began
            if self.rank == 0:
                write_text(partial / MANIFEST,
                           json.dumps({**manifest_for(config, step), "save_seconds": seconds}, indent=1) + "\n")
        except CheckpointException as err:
            failed = _save_failed(err, step)  # before the partial files go: what is free is what the save found
            self._discard(partial)
            raise failed from None
        except DiskError:
            self._discard(partial)
            raise
        if self.rank == 0:
            _fsync_dir(partial)
            if final.exists():  # the same step written by an earlier attempt that resumed before it
                shutil.rmtree(final)
            os.rename(partial, final)
            _fsync_dir(self.folder)
            for older in self.folder.glob("step-*"):
                if older.name < final.name:
                    shutil.rmtree(older, ignore_errors=True)
        return final

    def _discard(self, partial: Path) -> None:
        """Rank 0, after a failed save: remove what it left (every rank's writes ended before the save failed)."""
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)

    def load(self, path: Path) -> int:
        """Collective: restore model, optimizer and RNG states from ``path``; returns the step to resume at."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state, seen = self._state()
        with _object_collectives():
            dcp.load(seen, checkpoint_id=str(path), process_group=self.group)
        if self.sharding is not None:  # shards were read into `state`'s tensors, other values into `seen`
            seen = {**seen, **{group: TPSharding.unwrap(state[group], seen[group]) for group in ("model", "optim")}}
        set_state_dict(self.model, self.optimizer, model_state_dict=seen["model"],
                       optim_state_dict=seen["optim"],
                       options=StateDictOptions(flatten_optimizer_state_dict=True))
        rng = seen[f"rng.rank{self.rank}"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        for name, stream in self.streams.items():
            stream.setstate(rng[f"stream.{name}"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
        return int(seen["progress"]["step"])


def _save_failed(err, step: int) -> Exception:
    """The error a failed ``dcp.save`` is raised as, the same on every rank (DCP hands every rank the same
    per-rank failures): a :class:`hints.outputs.DiskError` when a rank's write was refused by its disk, else a
    :class:`hints.errors.Failure` naming the first rank whose write failed ([Note: a checkpoint the disk refuses])."""
    from hints.errors import Failure
    from hints.outputs import is_disk_error, write_error

    failures = sorted(err.failures.items())
    for _, (failure, _) in failures:
        cause = failure
        while cause is not None and not (isinstance(cause, OSError) and is_disk_error(cause)):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            return write_error(cause, cause.filename or "a checkpoint file")
    rank, (failure, _) = failures[0] if failures else (-1, (err, None))
    return Failure(f"checkpoint {step_name(step)} was not written: rank {rank}: {type(failure).__name__}: {failure}")


def _refusal_naming_writer(path: Path):
    """DCP's file system writer for ``path``, whose files report a refused write as the ``OSError`` it was.

    torch's serializer, writing a tensor into a file object, reports a failed ``write`` only as a position
    mismatch ("unexpected pos 704 vs 598"): the ``OSError`` (``ENOSPC``) is lost. Each stream here keeps the
    first ``OSError`` its ``write`` raised and raises it, with the file's name, in place of what the serializer
    made of it ([Note: a checkpoint the disk refuses])."""
    from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

    class RefusalNamingFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path, mode):
            try:
                with super().create_stream(path, mode) as stream:
                    watched = _WatchedStream(stream, path)
                    try:
                        yield watched
                    except Exception:
                        if watched.refused is not None:
                            raise watched.refused from None
                        raise
            except OSError as err:
                if err.filename is None:  # a flush or fsync at the end: the file is this one
                    raise OSError(err.errno, err.strerror, str(path)) from None
                raise

    writer = FileSystemWriter(str(path))
    writer.fs = RefusalNamingFileSystem()
    return writer


class _WatchedStream:
    """A file object that keeps the first ``OSError`` its ``write`` raised (:func:`_refusal_naming_writer`)."""

    def __init__(self, stream, path) -> None:
        self._stream, self._path = stream, path
        self.refused: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._stream.write(data)
        except OSError as err:
            if self.refused is None:
                self.refused = OSError(err.errno, err.strerror, str(self._path))
            raise

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (a new file, a rename) durable before the next step depends on them."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _object_collectives():
    """Let DCP's object collectives run where numpy is not installed.

    [Note: DCP without numpy] ``dcp.save`` and ``dcp.load`` exchange their
    plans with ``gather_object`` / ``broadcast_object_list``, whose receiving
    side turns a byte tensor back into bytes with ``tensor.numpy()``. rrfp
    does not depend on numpy, so when it is missing, for the duration of a
    save or a load, that one conversion reads the tensor's storage instead
    (the same bytes). With numpy installed nothing is changed.
    """
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    else:
        yield
        return
    import torch.distributed.distributed_c10d as c10d

    original = c10d._tensor_to_object

    def tensor_to_object(tensor, tensor_size, group):
        data = bytes(tensor.cpu().clone().untyped_storage())[:tensor_size]  # a view: its own bytes only
        return c10d._unpickler(io.BytesIO(data)).load()

    c10d._tensor_to_object = tensor_to_object
    try:
        yield
    finally:
        c10d._tensor_to_object = original
