"""TP coordination from a trace: how long after its leader decided each follower started a task.

Read from every member's decisions and transfers (``member_decisions``, ``member_transfers``), not only the TP
leaders' that the other analyses read; [Note: TP coordination] in runtime.exec.tp_follow is the protocol measured.
"""

from __future__ import annotations

import statistics

import polars as pl

from profiler.analysis.windows import iteration_windows
from profiler.trace.reader import TraceFrames


def follow_latency(frames: TraceFrames) -> tuple[pl.DataFrame, pl.DataFrame]:
    """TP coordination ([Note: TP coordination] in runtime.exec.tp_follow), from every rank's decisions.

    Returns ``(per_decision, per_rank)``. Per follower decision: ``follow_ns`` (the follower started the task
    this long after its leader decided it), ``delivery_ns`` (until the DECISION arrived) and ``after_arrival_ns``
    (from its arrival to the start: the follower's own inputs, or a task still running). Per rank: the
    medians and 90th percentiles of those on followers, and on leaders the time spent posting decisions
    (``announce``), also as a share of the median iteration makespan. Empty frames for a trace without TP.
    """
    decisions = frames.member_decisions.filter(pl.col("index").is_not_null())
    per_decision = (decisions.filter(pl.col("tp_rank") > 0)
                    .select("rank", "pipe_rank", "tp_rank", "dp_rank", "iteration", "index", "chosen",
                            (pl.col("time_ns") - pl.col("leader_ns")).alias("follow_ns"),
                            (pl.col("decision_arrived_ns") - pl.col("leader_ns")).alias("delivery_ns"),
                            (pl.col("time_ns") - pl.col("decision_arrived_ns")).alias("after_arrival_ns"))
                    .sort("iteration", "pipe_rank", "index", "rank"))
    makespans = iteration_windows(frames).get_column("makespan_ns").to_list()
    makespan = statistics.median(makespans) if makespans else None
    iterations = max(1, decisions.get_column("iteration").n_unique())
    lag = _input_lag(frames)
    rows = []
    for (rank,), group in decisions.group_by(["rank"], maintain_order=True):
        first = group.row(0, named=True)
        row = {"rank": rank, "pipe_rank": first["pipe_rank"], "tp_rank": first["tp_rank"],
               "dp_rank": first["dp_rank"], "decisions": group.height}
        if first["tp_rank"] == 0:
            announce = group.get_column("announce_ns")
            per_iteration = announce.sum() / iterations
            row.update(announce_us=announce.median() / 1e3, announce_p90_us=announce.quantile(0.9) / 1e3,
                       announce_share=per_iteration / makespan if makespan else None)
        else:
            mine = per_decision.filter(pl.col("rank") == rank)
            for name in ("follow", "delivery", "after_arrival"):
                column = mine.get_column(f"{name}_ns")
                row[f"{name}_us"] = column.median() / 1e3
                if name == "follow":
                    row["follow_p90_us"] = column.quantile(0.9) / 1e3
            row["input_lag_us"] = lag.get(rank)
        rows.append(row)
    columns = {"rank": pl.Int64, "pipe_rank": pl.Int64, "tp_rank": pl.Int64, "dp_rank": pl.Int64,
               "decisions": pl.Int64, "announce_us": pl.Float64, "announce_p90_us": pl.Float64,
               "announce_share": pl.Float64, "follow_us": pl.Float64, "follow_p90_us": pl.Float64,
               "delivery_us": pl.Float64, "after_arrival_us": pl.Float64, "input_lag_us": pl.Float64}
    per_rank = pl.DataFrame(rows, schema=columns) if rows else pl.DataFrame(schema=columns)
    return per_decision, per_rank.sort("dp_rank", "pipe_rank", "tp_rank")


def _input_lag(frames: TraceFrames) -> dict[int, float]:
    """Per follower rank: the median of (its copy of an input arrived) - (its leader's copy arrived), in us.

    [Note: every member receives its own inputs] in runtime.exec.tp_follow: were the leader to receive alone and
    forward, a follower's input would come one transport hop after the leader's; this says how the own
    copies compare (negative: before the leader's).
    """
    transfers = frames.member_transfers.filter(pl.col("recv_end_ns").is_not_null())
    if not transfers.height:
        return {}
    grid = {rank: (m.get("pipe_rank", rank), m.get("tp_rank", 0), m.get("dp_rank", 0))
            for rank, m in frames.member_meta.items()}
    leader_of = {rank: next((r for r, g in grid.items() if g[0] == pipe and g[1] == 0 and g[2] == dp), None)
                 for rank, (pipe, tp, dp) in grid.items() if tp > 0}
    arrivals = {(row[0], row[1], row[2]): row[3]
                for row in transfers.select("dst", "iteration", "producer", "recv_end_ns").iter_rows()}
    lags: dict[int, list[int]] = {}
    for (dst, iteration, producer), arrived in arrivals.items():
        leader = leader_of.get(dst)
        theirs = arrivals.get((leader, iteration, producer)) if leader is not None else None
        if theirs is not None:
            lags.setdefault(dst, []).append(arrived - theirs)
    return {rank: statistics.median(values) / 1e3 for rank, values in lags.items()}
