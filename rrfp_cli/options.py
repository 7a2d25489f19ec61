"""Option types shared by the commands, and the conversions from options to library objects.

Every command takes its shape, hint, policy and variability options from here
so names, defaults and help text agree across ``hints``, ``simulate`` and
``run``. Nothing here imports torch or polars (``runtime.sched.arbiter`` is pure
Python).
"""

from __future__ import annotations

import functools
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from hints.tasks import PLACEMENTS
from runtime.durations.presets import (
    LEGACY_ALIASES,
    MEASURED_SPLIT_OVERHEAD,
    PRESET_NAMES,
    SPLIT_OVERHEAD,
    WORKLOAD_NAMES,
)
from runtime.durations.ranges import check_number
from runtime.durations.unknown import SPEC_HELP as UNKNOWN_HELP
from runtime.sched.rules import P2P_MODES, Policy

SHAPE = "Pipeline shape"
VARIABILITY = "Variability model"


# The policies come from the arbiter's rule table (runtime.sched.rules.RULES), the one place they are defined.
PolicyChoice = Enum("PolicyChoice", {policy.value: policy.value for policy in Policy}, type=str)


# --p2p values (runtime.sched.rules.P2P_MODES); "async" is a keyword, so the functional form.
P2PChoice = Enum("P2PChoice", {mode: mode for mode in P2P_MODES}, type=str)


PlacementChoice = Enum("PlacementChoice", {placement: placement for placement in PLACEMENTS}, type=str)


class LookaheadChoice(str, Enum):
    on = "on"
    off = "off"


# Workload names come from runtime.durations.presets (presets, legacy models and their aliases language/multimodal).
WorkloadChoice = Enum("WorkloadChoice", {name: name for name in WORKLOAD_NAMES}, type=str)
WORKLOAD_METAVAR = "<workload>"  # the names are in the help text; as a type they make a line of 120 columns
WORKLOAD_HELP = (f"uniform; presets {', '.join(PRESET_NAMES)} (docs/workloads.md); "
                 f"{', '.join(LEGACY_ALIASES.values())} (aliases {', '.join(LEGACY_ALIASES)})")


Ranks = Annotated[
    Optional[int],
    typer.Option("--ranks", "-p", "--stages", min=1, help="Pipeline ranks (pipeline-parallel degree; the model has "
                 "ranks x chunks stages). --stages is its older name.", rich_help_panel=SHAPE),
]
Chunks = Annotated[
    Optional[int],
    typer.Option("--chunks", "-v", min=1, help="Model chunks per rank (virtual stages); "
                 "default 1 (2 under V placement), or what a hint file says.",
                 rich_help_panel=SHAPE),
]
Placement = Annotated[
    Optional[PlacementChoice],
    typer.Option("--placement", help="Which rank holds each model stage: looping (stage k on rank k % p) or v "
                 "(rank r holds stages r and 2p-1-r; 2 chunks). Default: the hint's own (v for zbv and "
                 "torch's V schedules, what a file says, else looping).", rich_help_panel=SHAPE),
]
Microbatches = Annotated[
    Optional[int],
    typer.Option("--microbatches", "-m", min=1, help="Microbatches per iteration.", rich_help_panel=SHAPE),
]
HintSpec = Annotated[
    str,
    typer.Option("--hint", help="Built-in hint name, a hint file (.json rrfp-hint/1 or torch .csv), "
                 "or torch:SCHEDULE (e.g. torch:Interleaved1F1B)."),
]
PolicyOpt = Annotated[
    PolicyChoice,
    typer.Option("--policy", help="fixed: run the hint order exactly; ready: best-ranked ready task; auto: ready, "
                 "and the fixed order for an iteration when replaying the last ones predicts it faster (simulate: "
                 "over --iters iterations)."),
]
LookaheadOpt = Annotated[
    Optional[LookaheadChoice],
    typer.Option("--lookahead", help="--policy ready only: on = never start a task that would delay the hint's "
                 "next task, a forward or backward already on its way; off = greedy readiness. Default: on "
                 "(per-hint defaults in docs/simulator.md)."),
]
P2POpt = Annotated[
    Optional[P2PChoice],
    typer.Option("--p2p", help="--policy fixed only: async = buffered links, a rank never waits for its peer; "
                 "blocking = Megatron's 1F1B baseline, after each task a rank posts its sends and "
                 "its next task's receives and waits until the peers took them (docs/simulator.md). "
                 "[default: async]"),
]
TaskOverhead = Annotated[
    float,
    typer.Option("--task-overhead", help="Seconds of dispatch cost before every task (calibrate it "
                 "from a run with rrfp trace sensitivity).", rich_help_panel="Variability model"),
]
MemoryBudgetOpt = Annotated[
    str,
    typer.Option("--memory-budget", help="Microbatch-chunks in flight per rank for --policy ready: "
                 "1f1b (that rank's 1F1B bound), a multiple such as 2x, or a number."),
]
Seed = Annotated[int, typer.Option("--seed", help="Seed for every sampled quantity.")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]

Workload = Annotated[
    Optional[WorkloadChoice],
    typer.Option("--workload", metavar=WORKLOAD_METAVAR, help="Duration model: " + WORKLOAD_HELP + ". Default uniform.",
                 rich_help_panel=VARIABILITY),
]
# What each knob of the variability model means (runtime.durations.variability.VariabilityModel; RunConfig's
# fields of the same names become one through RunConfig.variability): one text per knob, for every command.
VARIABILITY_HELP = {
    "forward_time": "Seconds of forward per rank for a typical microbatch.",
    "backward_ratio": "Backward time over forward time.",
    "jitter": "Log-sd of mean-one lognormal noise on every task.",
    "straggler_prob": "Chance that a task straggles.",
    "straggler_slowdown": "How many times slower a straggling task runs.",
    "comm_latency": "Seconds per cross-rank transfer.",
    "comm_jitter": "Log-sd of lognormal noise on each transfer.",
}
ForwardTime = Annotated[
    float, typer.Option("--forward-time", min=0.0, help=VARIABILITY_HELP["forward_time"], rich_help_panel=VARIABILITY),
]
BackwardRatio = Annotated[
    float, typer.Option("--backward-ratio", min=0.0, help=VARIABILITY_HELP["backward_ratio"],
                        rich_help_panel=VARIABILITY),
]
Jitter = Annotated[
    float, typer.Option("--jitter", min=0.0, help=VARIABILITY_HELP["jitter"], rich_help_panel=VARIABILITY),
]
StragglerProb = Annotated[
    float, typer.Option("--straggler-prob", min=0.0, max=1.0, help=VARIABILITY_HELP["straggler_prob"],
                        rich_help_panel=VARIABILITY),
]
StragglerSlowdown = Annotated[
    float, typer.Option("--straggler-slowdown", min=1.0, help=VARIABILITY_HELP["straggler_slowdown"],
                        rich_help_panel=VARIABILITY),
]
CommLatency = Annotated[
    float, typer.Option("--comm-latency", min=0.0, help=VARIABILITY_HELP["comm_latency"], rich_help_panel=VARIABILITY),
]
CommJitter = Annotated[
    float, typer.Option("--comm-jitter", min=0.0, help=VARIABILITY_HELP["comm_jitter"], rich_help_panel=VARIABILITY),
]
CostTableFile = Annotated[
    Optional[Path],
    typer.Option("--cost-table", help="Draw each sample from this CSV of per-sample token, tile, frame and "
                 "document counts (examples/cost_table.py writes one), costed with the --workload preset's cost "
                 "model (docs/workloads.md).", rich_help_panel=VARIABILITY),
]
def _split_defaults() -> str:
    """Each workload's default split cost, from runtime.durations.presets (one source for every help text)."""
    by_figure: dict[float, list[str]] = {}
    for name, figure in SPLIT_OVERHEAD.items():
        by_figure.setdefault(figure, []).append(name)
    measured = {figure: source for source, figure in MEASURED_SPLIT_OVERHEAD.items()}
    return "; ".join(f"{figure:g}" + (f" ({measured[figure]}, benchmarks/split_cost.py)" if figure in measured
                                      else " (a free split)") + f" for {', '.join(names)}"
                     for figure, names in by_figure.items())


SPLIT_OVERHEAD_HELP = ("A split backward's I + W over B: I = B/2, W the rest; 1 gives the free split. Default: "
                       f"the workload's own figure: {_split_defaults()}.")
SplitOverhead = Annotated[
    Optional[float], typer.Option("--split-overhead", help=SPLIT_OVERHEAD_HELP, rich_help_panel=VARIABILITY),
]
DurationsFile = Annotated[
    Optional[Path],
    typer.Option("--durations", help="Replay recorded durations: CSV or Parquet with columns "
                 "stage,kind,microbatch,duration (seconds), optional iteration and latency "
                 "(rrfp trace export --durations writes one).", rich_help_panel=VARIABILITY),
]


Unknown = Annotated[
    str, typer.Option("--unknown", help=UNKNOWN_HELP, rich_help_panel=VARIABILITY),
]


def lookahead_flag(choice: "LookaheadChoice | None") -> bool | None:
    return None if choice is None else choice is LookaheadChoice.on


def p2p_value(choice: "P2PChoice | None") -> str | None:
    return None if choice is None else choice.value


def placement_value(choice: "PlacementChoice | None") -> str | None:
    return None if choice is None else choice.value


def variability_model(
    workload: WorkloadChoice,
    forward_time: float,
    backward_ratio: float,
    jitter: float,
    straggler_prob: float,
    straggler_slowdown: float,
    comm_latency: float,
    comm_jitter: float,
    cost_table: Path | None = None,
    split_overhead: float | None = None,  # None: the workload's own (runtime.durations.presets.SPLIT_OVERHEAD)
    unknown: str = "",
):
    from runtime.durations.variability import VariabilityModel

    table = None
    if cost_table is not None:
        from runtime.durations.presets import load_cost_table

        table = load_cost_table(cost_table)
    return VariabilityModel(
        cost_table=table,
        workload=workload.value,
        forward_time=forward_time,
        backward_ratio=backward_ratio,
        jitter=jitter,
        straggler_prob=straggler_prob,
        straggler_slowdown=straggler_slowdown,
        comm_latency=comm_latency,
        comm_jitter=comm_jitter,
        split_overhead=split_overhead,
        unknown=unknown,
    )


def numbers_checked(command):
    """``command``'s callback, with every number option checked before it runs ([Note: number ranges] in
    runtime.durations.ranges): finite everywhere (typer reads ``inf`` and ``nan`` as floats), and in its range
    where the models give it one; one ``error:`` line naming the flag and the range otherwise. rrfp_cli.app
    wraps every command's callback with it, once for the whole CLI, so no command can forget it."""
    return _numbers_checked(command.callback, {param.name: _long_flag(param) for param in command.params})


# The knobs of a duration model (variability_model's); a recorded table or trace has durations of its own.
MODEL_KNOBS = ("forward_time", "backward_ratio", "jitter", "straggler_prob", "straggler_slowdown", "comm_latency",
               "comm_jitter")


def given_flags(ctx: typer.Context, names) -> list[str]:
    """The flags of the parameters ``names`` the user gave (on the command line or through an environment
    variable), in the command's order: a default (0.0, 2.0) cannot say whether it was meant, so a command that
    ignores an option in some case asks this before it refuses it."""
    def given(name: str) -> bool:  # click's ParameterSource, by name: typer vendors click (typer._click)
        source = ctx.get_parameter_source(name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    return [_long_flag(param) for param in ctx.command.params if param.name in names and given(param.name)]


def _long_flag(param) -> str:
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0] if param.opts else param.name)


def _numbers_checked(callback, flags: dict[str, str]):
    @functools.wraps(callback)
    def run(*args, **kwargs):
        for name, value in kwargs.items():
            if isinstance(value, float):
                check_number(name, value, flags.get(name, name))
        return callback(*args, **kwargs)
    return run
