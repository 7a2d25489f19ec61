"""Typed, validated configuration of ``rrfp run``, and what follows from it alone (its hint name and shape).

One :class:`RunConfig` describes a training job. It comes from CLI flags
and/or a TOML file whose keys are the flag names without the leading dashes
(``memory-budget = "2x"``); flags win over the file. Every field is checked
here, before any rank starts, and unknown TOML keys are errors (with a
suggestion), so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from hints.errors import UserError, input_name, render_inputs
from hints.files.load import hint_or_baseline, hint_shape
from hints.tasks import PLACEMENTS, PipelineShape, Task
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.ranges import NUMBER_RANGES, check_number
from runtime.durations.unknown import Unknown
from runtime.durations.variability import VariabilityModel, check_split_overhead
from runtime.sched.budget import MemoryBudget
from runtime.sched.rules import P2P_MODES, ArbiterRule, Policy, check_p2p, rule_for

RUN_WORKLOADS = ("gpt", "multimodal", "emulated")  # or a user's factory, "package.module:factory"
EMULATE_MODELS = WORKLOAD_NAMES  # runtime.durations.presets: uniform, the presets, the legacy models and their aliases
POLICIES = tuple(policy.value for policy in Policy)  # from the arbiter's rule table
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
EMULATED_WIDTH = 32  # the emulated workload's layer (runtime.workloads.builtin), which --tp splits


def default_samples(workload: str, emulate: str) -> int:
    """Samples per microbatch unless told: an emulated preset draws as many as the simulator's preset does
    (``Preset.samples``: vlm-mixed 1, sft-chat 4, ...), so a run and its simulation share one spread; the
    real models and the legacy emulated models 2."""
    from runtime.durations.presets import PRESETS, canonical

    preset = PRESETS.get(canonical(emulate)) if workload == "emulated" and isinstance(emulate, str) else None
    return preset.samples if preset is not None else 2


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``rrfp run`` job needs. Field names are the flags with ``_`` for ``-``."""

    workload: str = "gpt"
    ranks: int = 2  # pipeline ranks (the model has ranks x chunks stages); "stages" in files is its older name
    chunks: int | None = None  # None: 1, or 2 under V placement (runtime.config.run_shape)
    microbatches: int = 8
    placement: str | None = None  # looping or v; None: the hint's own (hints.files.load.hint_placement)
    tp: int = 1
    dp: int = 1
    hint: str | None = None  # None: 1f1b (interleaved-1f1b with chunks >= 2, zbv under V placement)
    policy: str = "ready"
    lookahead: bool | None = None  # ready policy: None = the hint's default (runtime.sched.rules.rule_for)
    p2p: str = "async"  # fixed policy: "blocking" waits for peers as Megatron does ([Note: blocking p2p] in runtime.sched.fixed_order)
    memory_budget: str = "1f1b"
    iters: int = 5
    seed: int = 0
    lr: float = 1e-3
    # model size (gpt, multimodal)
    hidden: int = 64
    heads: int = 4
    layers_per_stage: int = 1
    vocab: int = 128
    samples: int | None = None  # per microbatch; None: an emulated preset's own, else 2 (default_samples)
    seq_len: int | None = None  # gpt: fixed sequence length (default: variable, see runtime.workloads.builtin)
    # emulated workload: durations from the simulator's variability models
    emulate: str = "multimodal"
    forward_time: float = 0.020
    backward_ratio: float = 2.0
    # emulated split backward: I + W = split_overhead x B; None: the --emulate model's own figure
    # ([Note: split backward cost by preset] in runtime.durations.presets)
    split_overhead: float | None = None
    # variability injected into any workload (emulated: part of the sampled durations)
    jitter: float = 0.0
    straggler_prob: float = 0.0
    straggler_slowdown: float = 4.0
    comm_latency: float = 0.0
    comm_jitter: float = 0.0
    # emulated only: variability no scheduler knows beforehand ([Note: unknown variability], KIND=LEVEL,...)
    unknown: str = ""
    delay: dict[str, float] = field(default_factory=dict)  # task text -> extra seconds, e.g. {"1B0": 0.3}
    # faults, for testing failure handling
    fail_at: str | None = None  # raise inside this task: "1F2" (first iteration) or "1F2@3" (iteration 3)
    hang_at: str | None = None  # never return from this task (same form)
    # process setup
    nproc: int | None = None  # default stages * tp * dp
    device: str = "auto"
    backend: str = "auto"
    timeout: float = 60.0  # seconds without progress before a rank reports a stall and stops
    trace: bool = True  # write a Perfetto trace (trace.pftrace in the run directory)
    trace_iters: str | None = None  # "A:B": trace iterations A..B-1 only (either side may be empty)
    out: str | None = None  # default runs/<timestamp>-<workload>
    # checkpoints (runtime.run.checkpoint)
    checkpoint_every: int | None = None  # write a checkpoint after every K iterations
    skip_nonfinite: bool = False  # a NaN/inf loss skips the optimizer step instead of stopping the run

    def __post_init__(self) -> None:
        for name in ("hint", "out", "trace_iters", "fail_at", "hang_at"):  # a TOML file may give any type
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise UserError(f"must be a string, got {value!r}", _flag(name))
        if self.samples is None:
            object.__setattr__(self, "samples", default_samples(self.workload, self.emulate))
        if isinstance(self.memory_budget, int) and not isinstance(self.memory_budget, bool):
            object.__setattr__(self, "memory_budget", str(self.memory_budget))  # TOML slots: memory-budget = 6
        if not isinstance(self.memory_budget, str):
            raise UserError(f"must be 1f1b, a multiple such as 2x, or slots, got {self.memory_budget!r}",
                            "`memory_budget`")
        MemoryBudget.parse(self.memory_budget)  # checked under every policy: a typo is never ignored
        if not is_factory_path(self.workload):
            _check_choice("workload", self.workload, RUN_WORKLOADS + ("package.module:factory",))
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("emulate", self.emulate, EMULATE_MODELS)
        _check_choice("device", self.device, DEVICES)
        _check_choice("backend", self.backend, BACKENDS)
        if self.placement is not None:
            _check_choice("placement", self.placement, PLACEMENTS)
        for name in ("ranks", "microbatches", "iters", "hidden", "heads", "layers_per_stage",
                     "vocab", "samples", "tp", "dp"):
            _check_int(name, getattr(self, name), 1)
        if self.chunks is not None:
            _check_int("chunks", self.chunks, 1)
        _check_int("seed", self.seed, 0)
        if self.nproc is not None:
            _check_int("nproc", self.nproc, 1)
        if self.checkpoint_every is not None:
            _check_int("checkpoint_every", self.checkpoint_every, 1)
        if not isinstance(self.skip_nonfinite, bool):
            raise UserError(f"must be true or false, got {self.skip_nonfinite!r}", "`skip_nonfinite`")
        if self.seq_len is not None:
            _check_int("seq_len", self.seq_len, 1)
            if self.seq_len > 128:
                raise UserError(f"at most 128 (the position table), got {self.seq_len}", "`seq_len`")
        _check_number("lr", self.lr, 0.0)
        for name in NUMBER_RANGES:  # [Note: number ranges] in runtime.durations.ranges
            if name != "task_overhead":
                check_number(name, getattr(self, name))
        _check_number("timeout", self.timeout, 0.001)
        if self.split_overhead is not None:
            check_split_overhead(self.split_overhead, "`split_overhead`")
            if self.workload != "emulated":  # a real model's split backward costs what it costs
                raise UserError("prices the emulated workload's split backward; use `workload` emulated (a real "
                                "model's split costs what it measures)", "`split_overhead`")
        if not isinstance(self.unknown, str):
            raise UserError(f"must be KIND=LEVEL pairs joined by commas, got {self.unknown!r}", "`unknown`")
        Unknown.parse(self.unknown)
        if self.unknown.strip() and self.workload != "emulated":
            raise UserError("draws into the emulated workload's durations; use --workload emulated (or rrfp "
                            "simulate)", "`unknown`")
        if self.hidden % self.heads:  # blamed on heads: the width is the model's size, heads split it
            raise UserError(f"{self.heads} heads do not divide the model width `hidden` {self.hidden}: each head "
                            f"takes hidden / heads features", "`heads`")
        self._check_tp()
        if self.workload == "multimodal" and self.ranks * (self.chunks or 1) < 2:
            raise UserError("the multimodal model needs at least 2 model stages (vision, language)", "`ranks`")
        if not isinstance(self.delay, dict):
            raise UserError("must map tasks to seconds, e.g. {\"1B0\" = 0.3}", "`delay`")
        for text, seconds in self.delay.items():
            _parse_task(text, "`delay`")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                    or seconds < 0:
                raise UserError(f"{text} must take a finite number of seconds >= 0, got {seconds!r}", "`delay`")
        for name in ("fail_at", "hang_at"):
            if getattr(self, name) is not None and self.fault(name)[1] >= self.iters:
                raise UserError(f"{getattr(self, name)!r} is never reached: the run has {self.iters} iterations",
                                _flag(name))
        if not isinstance(self.trace, bool):
            raise UserError(f"must be true or false, got {self.trace!r}", "`trace`")
        if isinstance(self.lookahead, str) and self.lookahead.lower() in ("on", "off"):  # TOML, like the flag
            object.__setattr__(self, "lookahead", self.lookahead.lower() == "on")
        if self.lookahead is not None and not isinstance(self.lookahead, bool):
            raise UserError(f"must be on, off, true or false, got {self.lookahead!r}", "`lookahead`")
        self.rule()
        _check_choice("p2p", self.p2p, P2P_MODES)
        check_p2p(self.p2p, self.rule())
        if self.p2p == "blocking" and self.tp > 1:
            raise UserError("blocking is built for pipeline (and `dp`) jobs: a TP follower learns its next task "
                            "from its leader, too late to post its receives first; use `tp` 1", "`p2p`")
        if self.trace_iters is not None and self.trace_window()[0] >= self.iters:
            raise UserError(f"{self.trace_iters!r} traces nothing: the run has {self.iters} iterations "
                            f"(0..{self.iters - 1})", "`trace_iters`")
        if self.nproc is not None and self.nproc != self.world_size:
            raise UserError(f"{self.nproc} processes cannot run {self.ranks} pipeline ranks x tp {self.tp} x dp "
                            f"{self.dp} = {self.world_size} processes", "`nproc`")

    def _check_tp(self) -> None:
        """``--tp`` must split what is sharded (:mod:`runtime.workloads.tp_layers`): attention heads, or the emulated layer.

        A user's model (``package.module:factory``) says itself what it shards, which
        :func:`runtime.workloads.user.check_factory` checks before any rank starts.
        """
        if self.tp == 1 or is_factory_path(self.workload):
            return
        if self.workload == "emulated":
            if EMULATED_WIDTH % self.tp:
                raise UserError(f"{self.tp} does not divide the emulated layer's {EMULATED_WIDTH} features", "`tp`")
        elif self.heads % self.tp:
            raise UserError(f"{self.tp} does not divide the model's {self.heads} attention heads (`heads`)", "`tp`")

    def rule(self) -> ArbiterRule:
        """The arbiter rule ``policy`` and ``lookahead`` select (raises for lookahead under ``fixed``)."""
        return rule_for(self.policy, self.lookahead, self.hint)

    @cached_property
    def variability(self) -> VariabilityModel:
        """The run's duration and noise model: what the emulated workload samples its durations from
        (``--emulate`` and its knobs), and the jitter, stragglers and message latency injected into any other
        workload (:mod:`runtime.run.noise`). The one place a run's variability options become the model
        ``rrfp simulate`` uses."""
        return VariabilityModel(workload=self.emulate, forward_time=self.forward_time,
                                backward_ratio=self.backward_ratio, jitter=self.jitter,
                                straggler_prob=self.straggler_prob, straggler_slowdown=self.straggler_slowdown,
                                comm_latency=self.comm_latency, comm_jitter=self.comm_jitter, samples=self.samples,
                                split_overhead=self.split_overhead, unknown=self.unknown)

    @property
    def world_size(self) -> int:
        return self.ranks * self.tp * self.dp

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, **changes: Any) -> "RunConfig":
        return replace(self, **changes)

    def trace_window(self) -> tuple[int, int | None]:
        """``--trace-iters A:B`` as ``(A, B)``; ``B`` None means to the end."""
        return parse_window(self.trace_iters, "`trace_iters`")

    def traces(self, iteration: int) -> bool:
        start, stop = self.trace_window()
        return self.trace and iteration >= start and (stop is None or iteration < stop)

    def fault(self, name: str) -> tuple[Task, int] | None:
        """``--fail-at`` / ``--hang-at`` as ``(task, iteration)``; ``TASK`` alone means iteration 0."""
        value = getattr(self, name)
        if value is None:
            return None
        text, _, iteration = str(value).partition("@")
        if iteration and not iteration.isdigit():
            raise UserError(f"{value!r}: the iteration after @ must be a whole number", _flag(name))
        return _parse_task(text, _flag(name)), int(iteration or 0)

    def delays_by_task(self) -> dict[Task, float]:
        return {Task.parse(text): float(seconds) for text, seconds in self.delay.items()}


def is_factory_path(workload: object) -> bool:
    """``package.module:factory``: a user's model ([Note: the model protocol] in runtime.workloads.user)."""
    if not isinstance(workload, str):
        return False
    module, colon, name = workload.partition(":")
    return bool(colon) and all(part.isidentifier() for part in module.split(".")) and name.isidentifier()


def parse_window(spec: str | None, flag: str) -> tuple[int, int | None]:
    """An iteration window ``A:B`` (iterations A..B-1; either side may be left out) as ``(A, B)``.

    ``None`` is every iteration, ``(0, None)``. Used by ``--trace-iters`` and ``rrfp trace --iterations``.
    """
    if spec is None:
        return 0, None
    first, colon, last = str(spec).partition(":")
    try:
        start = int(first) if first.strip() else 0
        stop = int(last) if last.strip() else None
    except ValueError:
        start = stop = -1
    if not colon or start < 0 or (stop is not None and stop <= start):
        raise UserError(f"{spec!r} is not A:B with 0 <= A < B (either may be left out)", flag)
    return start, stop


def _flag(name: str) -> str:
    """How an error names the field ``name`` ([Note: inputs in messages] in :mod:`hints.errors`)."""
    return input_name(name)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{value!r} is not one of {', '.join(choices)}", _flag(name))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"must be a whole number >= {minimum}, got {value!r}", _flag(name))


def _check_number(name: str, value: Any, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise UserError(f"must be a finite number >= {minimum:g}, got {value!r}", _flag(name))


def _parse_task(text: Any, where: str) -> Task:
    try:
        return Task.parse(text)
    except UserError as err:
        raise UserError(err.what, where) from None


FIELD_NAMES = tuple(f.name for f in fields(RunConfig))
# Fields renamed since files were written with them: a TOML file, a run's config.json or a job.toml of an
# earlier rrfp still reads (``stages`` was the pipeline-rank count: docs/ARCHITECTURE.md's glossary).
OLDER_NAMES = {"stages": "ranks"}


class ConfigFile(dict):
    """What :func:`load_toml` read, ``{field: value}``, and where: the file and each field's key as written in
    it, so an error about a value the file gave names the file and the key, not a flag nobody typed."""

    def __init__(self, values: dict[str, Any], path: str, keys: dict[str, str]) -> None:
        super().__init__(values)
        self.path = path
        self.keys = keys  # field -> key as written (``memory-budget``, ``stages``)


def load_toml(path: str | Path) -> ConfigFile:
    """Read a config file into ``{field: value}``; keys are flag names (``memory-budget``).

    A relative ``hint`` path that names a file beside the config file is taken from there, so a job
    file and its hint can move together (``rrfp tune-hint --out DIR`` writes both).
    """
    where = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError("no such file", where) from None
    except IsADirectoryError:
        raise UserError("is a directory, not a TOML file", where) from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read: {getattr(err, 'strerror', None) or err}", where) from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"not valid TOML: {err}", where) from None
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        name = OLDER_NAMES.get(name, name)
        if name in values:
            raise UserError(f"{key!r} and its other name both given; keep {name.replace('_', '-')!r}", where)
        if name not in FIELD_NAMES:
            close = difflib.get_close_matches(name, FIELD_NAMES, n=1)
            hint = f"; did you mean {close[0].replace('_', '-')!r}?" if close else ""
            raise UserError(f"unknown key {key!r}{hint}", where)
        values[name] = value
        keys[name] = key
    hint = values.get("hint")
    if isinstance(hint, str) and not Path(hint).is_absolute():
        beside = Path(path).parent / hint  # a hint file named in a config file lives beside it (tune-hint's job.toml)
        if beside.is_file():
            values["hint"] = str(beside)
    return ConfigFile(values, where, keys)


def current_names(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration written under older field names (a ``config.json`` of an earlier run) in today's."""
    return {OLDER_NAMES.get(name, name): value for name, value in values.items()}


def build_config(file_values: dict[str, Any], flag_values: dict[str, Any], where: str = "config") -> RunConfig:
    """File values, then flags on top (flags win). A validation error names the flag, or, for a value a TOML
    file gave (:class:`ConfigFile`), the file and its key: ``run.toml: stages: must be ...``."""
    merged = {**current_names(file_values), **flag_values}
    try:
        config = RunConfig(**merged)
        if isinstance(file_values, ConfigFile):  # the shape's own checks (a V placement's chunks) in its terms too
            run_shape(config)
        return config
    except TypeError as err:  # a TOML value of the wrong structure for a dataclass field
        raise UserError(str(err), where) from None
    except UserError as err:
        if not isinstance(file_values, ConfigFile):
            raise
        raise _in_file_terms(err, file_values, flag_values) from None


def _in_file_terms(err: UserError, file: ConfigFile, flags: dict[str, Any]) -> UserError:
    """``err`` with the inputs ``file`` gave (and no flag overrode) named by their keys in the file, and the
    error placed in the file when the input it is about came from there ([Note: inputs in messages])."""
    def from_file(name: str) -> bool:
        return name in file.keys and name not in flags

    def named(name: str) -> str:
        return file.keys[name] if from_file(name) else input_name(name)

    about = re.fullmatch(r"`([a-z][a-z0-9_]*)`", err.where or "")
    if about is None or not from_file(about.group(1)):
        return err
    return type(err)(render_inputs(err.what, named), f"{file.path}: {file.keys[about.group(1)]}")


def hint_spec(config) -> str:
    """The hint a run follows: ``--hint``, else the baseline order of its chunks and placement."""
    return hint_or_baseline(config.hint, config.chunks, config.placement)


def run_shape(config) -> PipelineShape:
    """The job's shape (full backward): its placement is the one asked, else the hint's own."""
    return hint_shape(hint_spec(config), config.ranks, config.chunks, config.microbatches, config.placement)
