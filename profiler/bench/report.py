"""``rrfp bench``'s outputs from its results (``results.json``): Markdown tables, the paper's rows, plots.

Everything here is a pure function of the results dict (:data:`profiler.bench.results.SCHEMA`), so a results
folder can be re-rendered, and the tests check the text without running anything. Figures are written
``median (p10-p90)`` over the tables (simulation) or over repetitions x iterations (real runs).
"""

from __future__ import annotations

import math
from pathlib import Path

from hints.outputs import Outputs
from profiler.bench.matrix import MATRIX_ROWS, PAPER_KIND, PAPER_ROWS, PaperRow
from profiler.draw.charts import BarChart, Bars, LineChart, Series, save_chart
from runtime.sched.baselines import PLANNED

HINT_COLOURS = {"1f1b": (31, 119, 180), "interleaved-1f1b": (140, 86, 75), "zb": (44, 160, 44),
                "bf": (255, 127, 14), "bfw": (148, 103, 189), "cp": (214, 39, 40), "tuned": (23, 190, 207),
                "1f1b-blocking": (127, 127, 127), "1f1b-light": (188, 189, 34), "1f1b-heavy": (227, 119, 194),
                "planned": (0, 95, 115)}
CAUSE_COLOURS = {"fill": (205, 205, 205), "drain": (165, 165, 165), "dependency": (120, 120, 120),
                 "budget_held": (40, 90, 200), "misalignment": (215, 35, 35), "dispatch": (20, 20, 20)}
CAUSES = ("fill", "drain", "dependency", "budget_held", "misalignment", "dispatch")


def ratio(value: dict | None) -> str:
    if not value:
        return "-"
    return f"{value['median']:.3f}x ({value['p10']:.3f}-{value['p90']:.3f})"


def number(value: dict | None, digits: int = 3) -> str:
    if not value:
        return "-"
    return f"{value['median']:.{digits}f} ({value['p10']:.{digits}f}-{value['p90']:.{digits}f})"


def peak(value) -> str:
    return "-" if value is None else f"{value:g}"


def _cells(data: dict, key: str = "cells") -> list[dict]:
    return data.get("simulation", {}).get(key, [])


def _cell(data: dict, workload: str, ranks: int, budget: str, key: str = "cells", jitter=None) -> dict | None:
    return next((c for c in _cells(data, key) if c["workload"] == workload and c["ranks"] == ranks
                 and c["budget"] == budget and (jitter is None or c["jitter"] == jitter)), None)


def _row(cell: dict | None, name: str) -> dict | None:
    return None if cell is None else next((r for r in cell["rows"] if r["row"] == name), None)


# -- Markdown ---------------------------------------------------------------------------------------


def environment_lines(data: dict) -> list[str]:
    machine, versions, settings = data["machine"], data["versions"], data["settings"]
    commit = versions.get("rrfp_commit") or "unknown"
    commit = commit[:10] + (" with uncommitted changes" if versions.get("rrfp_dirty") else "")
    tables = ", ".join(f"{t['seed']}/{t['iteration']}" for t in settings["tables"])
    return [f"Command: `{data['command']}`", "",
            f"Machine: {machine['cpu']}, {machine['cores']} cores ({machine['platform']}); CPython "
            f"{versions['python']}, torch {versions.get('torch') or 'not installed'}, rrfp {commit}; started "
            f"{data.get('started')}" + (f", {data['wall_seconds']:.0f} s" if data.get("wall_seconds") else "") + ".",
            "", f"Simulation: m = 4p microbatches, jitter {settings['jitter']:g}, tables (seed/iteration) {tables} "
            f"per cell; figures are median (p10-p90) over the tables. Ready rows use the default rule "
            f"(lookahead)."]


CREDIT = ("`vs 1F1B`: fixed 1F1B's makespan over the row's, per table. `same hint fixed`: the row's hint in "
          "fixed order, vs 1F1B. `ready/fixed`: the fixed-order makespan of the same hint over the row's (what "
          "readiness adds); `*`: that fixed order holds more than the budget, not at equal memory. `ready/best "
          "fixed`: the fastest fixed row within the budget (median; the sorted 1F1B rows `fixed-1f1b-light`/`-heavy` "
          "sort microbatches by known cost and deepen warm-ups to fill the budget; `fixed-planned` is the order the "
          "arbiter runs on the known costs within the budget, fixed) over the row's: what readiness "
          "earns over the best fixed order a user could run at that memory. `peak`: most "
          "microbatches any rank held activations for (ready row / the same hint fixed). `/bound`: makespan over "
          "the lower bound of the row's hint family (the hint's own task graph: full backwards for 1F1B-like hints, "
          "the charged split for split ones; [Note: bound per hint family] in runtime/sched/bounds.py); "
          "`/universal`: over the free-split bound that holds for every hint, for reading across families. A `-` in the fixed columns: that order cannot complete in fixed "
          "order (a tuned order made for readiness).")


def matrix_table(data: dict, workload: str, ranks: int) -> list[str]:
    budgets = data["settings"]["budgets"]
    cells = {b: _cell(data, workload, ranks, b) for b in budgets}
    if not any(cells.values()):
        return []
    first = next(c for c in cells.values() if c)
    lines = [f"#### {workload}, {ranks} ranks, {first['microbatches']} microbatches", "",
             f"Universal lower bound {number(first['lower_bound_s'], 4)} s (free split; `/bound` is over each "
             f"row's family bound); cost spread (CV of a stage's forward time across microbatches) "
             f"{number(first['cost_spread'], 2)}.", ""]
    head = "| row | hint | rule |"
    rule = "|---|---|---|"
    for b in budgets:
        head += f" vs 1F1B @{b} | same hint fixed | ready/fixed | ready/best fixed | peak @{b} | /bound |"
        rule += "---|---|---|---|---|---|"
    lines += [head, rule]
    for row in MATRIX_ROWS:
        entries = {b: _row(cells[b], row.name) for b in budgets}
        if not any(entries.values()):
            continue
        any_entry = next(e for e in entries.values() if e)
        line = f"| {row.name} | {any_entry['hint']} | {any_entry['rule']} |"
        for b in budgets:
            e = entries[b]
            if e is None:
                line += " - | - | - | - | - | - |"
                continue
            fixed = ratio(e.get("fixed_same_hint_speedup")) if "fixed_same_hint_speedup" in e else "-"
            mark = "*" if e.get("fixed_same_hint_within_budget") is False else ""
            versus = ratio(e.get("ready_over_fixed_same_hint")) + mark if "ready_over_fixed_same_hint" in e else "-"
            held = peak(e["peak_in_flight"]) + ("" if e["within_budget"] else " (over)")
            if "fixed_same_hint_peak_in_flight" in e:
                held += f" / {peak(e['fixed_same_hint_peak_in_flight'])}"
            best = ratio(e.get("ready_over_best_fixed")) if "ready_over_best_fixed" in e else "-"
            line += f" {ratio(e['speedup_vs_fixed_1f1b'])} | {fixed} | {versus} | {best} | {held} | " \
                    f"{number(e['makespan_over_bound'])} |"
        lines.append(line)
    tuned = next((e.get("tuned") for c in cells.values() if c for e in c["rows"] if e.get("tuned")), None)
    if tuned:
        lines += ["", f"ready-tuned picked {tuned['picked']}: {tuned['reason']}."]
    return lines + [""]


def variability_table(data: dict, workload: str) -> list[str]:
    cells = [c for c in _cells(data, "variability") if c["workload"] == workload]
    if not cells:
        return []
    jitters = sorted({c["jitter"] for c in cells})
    budgets = data["settings"]["budgets"]
    ranks = cells[0]["ranks"]
    spreads = {j: next(c for c in cells if c["jitter"] == j)["cost_spread"] for j in jitters}
    lines = [f"#### {workload}, {ranks} ranks: speedup over fixed 1F1B by jitter (cost spread CV)", "",
             "| row | budget | " + " | ".join(f"jitter {j:g} (CV {spreads[j]['median']:.2f})" for j in jitters) + " |",
             "|---|---|" + "---|" * len(jitters)]
    for row in MATRIX_ROWS:
        for b in budgets:
            entries = [_row(_cell(data, workload, ranks, b, "variability", j), row.name) for j in jitters]
            if not any(entries):
                continue
            cells_text = []
            for e in entries:
                if e is None:
                    cells_text.append("-")
                    continue
                text = ratio(e["speedup_vs_fixed_1f1b"])
                if e.get("ready_over_fixed_same_hint"):
                    mark = "*" if e.get("fixed_same_hint_within_budget") is False else ""
                    text += f"; ready/fixed {e['ready_over_fixed_same_hint']['median']:.3f}x{mark}"
                cells_text.append(text)
            lines.append(f"| {row.name} | {b} | " + " | ".join(cells_text) + " |")
    return lines + [""]


UNKNOWN_ROWS = ("ready-planned", "ready-1f1b-light", "ready-cp", "ready-bfw", "ready-zb")  # the ready rows the sweep
# reports; ready-planned first: ready over the best fixed order with the planned order as the hint, the fixed order
# it is credited against being (mostly) that same plan ([Note: planned orders] in runtime.sched.baselines)


def _unknown_points(data: dict, workload: str, budget: str) -> list[dict]:
    """The unknown sweep's cells of one workload and budget: none first, then each kind by level."""
    return [c for c in _cells(data, "unknown") if c["workload"] == workload and c["budget"] == budget]


def unknown_table(data: dict, workload: str) -> list[str]:
    """Per ready row and budget, readiness over the best fixed order at equal memory, at each point of the
    sweep ([Note: unknown variability] in runtime/durations/unknown.py)."""
    budgets = data["settings"]["budgets"]
    cells = {b: _unknown_points(data, workload, b) for b in budgets}
    first = next((c for b in budgets for c in cells[b]), None)
    if first is None:
        return []
    labels = [c["unknown"] or "none" for c in cells[budgets[0]]] if cells[budgets[0]] else []
    lines = [f"#### {workload}, {first['ranks']} ranks, jitter {first['jitter']:g}: ready over the best fixed order "
             f"at equal memory, by unknown variability", "",
             "| row | budget | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for name in UNKNOWN_ROWS:
        for b in budgets:
            entries = [_row(c, name) for c in cells[b]]
            if not any(entries):
                continue
            lines.append(f"| {name} | {b} | " + " | ".join(
                f"{e['ready_over_best_fixed']['median']:.3f}x" if e and e.get("ready_over_best_fixed") else "-"
                for e in entries) + " |")
    for b in budgets:
        names = [next((e["best_fixed"] for e in c["rows"] if e.get("best_fixed")), None) for c in cells[b]]
        if any(names):
            lines.append(f"| *best fixed* | {b} | " + " | ".join(n or "-" for n in names) + " |")
    return lines + [""]


def bubble_table(data: dict, workload: str) -> list[str]:
    entries = [b for b in data.get("simulation", {}).get("bubbles", []) if b["workload"] == workload]
    if not entries:
        return []
    first = entries[0]
    lines = [f"#### {workload}, {first['ranks']} ranks: where the idle time goes (share of ranks x makespan; "
             f"seed {first['seed']}, iteration {first['iteration']})", "",
             "| row | budget | busy | " + " | ".join(c.replace("_", " ") for c in CAUSES) + " |",
             "|---|---|---|" + "---|" * len(CAUSES)]
    for b in entries:
        share = b["share"]
        lines.append(f"| {b['row']} | {b['budget']} | {share['busy']:.1%} | "
                     + " | ".join(f"{share.get(c, 0.0):.1%}" for c in CAUSES) + " |")
    return lines + [""]


def real_tables(data: dict) -> list[str]:
    real = data.get("real")
    if not real or not real.get("sets"):
        return []
    lines = ["### Real runs on this machine (`rrfp run`, one launch per set, repetitions interleaved)", ""]
    for s in real["sets"]:
        what = (f"emulated {s.get('emulate') or ''}".rstrip() if s["workload"] == "emulated" else "gpt (real compute)")
        lines += [f"#### {what}, {s['ranks']} ranks, {s['microbatches']} microbatches, {s['repetitions']} repetitions "
                  f"x {s['iters'] - 1} measured iterations (1 warm-up)", ""]
        if s.get("failed"):
            lines += [f"The launch failed: {s['failed']}", ""]
            continue
        lines += ["| job | median step (p10-p90), ms | vs fixed 1F1B | ready/fixed same hint | peak (ready / fixed) |",
                  "|---|---|---|---|---|"]
        for r in s["rows"]:
            step = r["step_s"]
            held = peak(r["peak_in_flight"])
            if "fixed_same_hint_peak_in_flight" in r:
                held += f" / {peak(r['fixed_same_hint_peak_in_flight'])}"
            lines.append(f"| {r['row']} | {step['median'] * 1e3:.1f} ({step['p10'] * 1e3:.1f}-{step['p90'] * 1e3:.1f}) "
                         f"| {ratio(r['speedup_vs_fixed_1f1b'])} | {ratio(r.get('ready_over_fixed_same_hint'))} "
                         f"| {held} |")
        lines.append("")
    return lines


def external_table(data: dict) -> list[str]:
    external = data.get("external")
    if not external:
        return []
    lines = ["### External systems: torch.distributed.pipelining (`benchmarks/cross_framework.py`)", "",
             f"Command: `{external.get('command')}`; its full output: `{external.get('stdout_file')}`.", ""]
    if not external.get("measurements"):
        return lines + ["No rrfp ready bf row could be read from its output.", ""]
    lines += ["| case | budget | rrfp ready bf step | vs torch Schedule1F1B | fastest torch schedule | vs it "
              "| peak (rrfp / fastest torch) |", "|---|---|---|---|---|---|---|"]
    for m in external["measurements"]:
        lines.append(f"| {m['case']} | {m['budget']} | {m['rrfp_step_s'] * 1e3:.1f} ms | {_x(m['vs_torch_1f1b'])} | "
                     f"{m['fastest_torch']} | {_x(m['vs_fastest_torch'])} | {m['rrfp_peak_in_flight']} / "
                     f"{m['fastest_torch_peak_in_flight']} |")
    lines += ["", "cross_framework.py runs no fixed-order bf, so what readiness adds to bf at equal memory is in "
              "the simulated matrix (same hint fixed, ready/fixed)."]
    return lines + [""] + external_pairs_table(external)


def external_pairs_table(external: dict) -> list[str]:
    """Each torch schedule against the rrfp hint of its structure, fixed and ready at the schedule's memory."""
    pairs = external.get("pairs") or []
    if not pairs:
        return []
    lines = ["#### torch's schedules against rrfp on the same structure, at equal memory", "",
             "Each torch schedule beside the rrfp hint that issues its order (same chunks and placement) in fixed "
             "order and ready, the ready job's budget set to the torch schedule's own per-rank peak "
             "(cross_framework.py, [Note: equal memory pairs]); `*`: that peak is no rrfp budget, ready ran at its "
             "maximum, not at equal memory.", "",
             "| case | torch schedule | rrfp hint | torch step | rrfp fixed | rrfp ready (budget) | fixed vs torch "
             "| ready vs torch | ready/fixed | peak (torch / ready) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        mark = "" if p["equal_memory"] is not False else "*"
        chunks = f" (v={p['chunks']}{', V' if p['placement'] == 'v' else ''})" if p["chunks"] != 1 else ""
        lines.append(f"| {p['case']} | {p['torch_schedule']} | {p['hint']}{chunks} | {_ms(p['torch_step_s'])} | "
                     f"{_ms(p['fixed_step_s'])} | {_ms(p['ready_step_s'])} (@{p['ready_budget']}{mark}) | "
                     f"{_x(p['fixed_vs_torch'])} | {_x(p['ready_vs_torch'])}{mark} | {_x(p['ready_over_fixed'])}{mark} | "
                     f"{p['torch_peak_in_flight']} / {p['ready_peak_in_flight']} |")
    return lines + [""]


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _x(value) -> str:
    return "-" if value is None else f"{value:.3f}x"


# -- the paper's rows --------------------------------------------------------------------------------


def paper_ranks(data: dict, row: PaperRow) -> int | None:
    ranks = data["settings"]["ranks"]
    done = {c["ranks"] for c in _cells(data)}
    if row.ranks in done:
        return row.ranks
    return max((r for r in ranks if r in done), default=None)


def paper_table(data: dict) -> list[str]:
    """The paper's rows against every simulated preset that stands for one of its settings (PAPER_KIND); a
    preset of the other kind is `-` in a row, as in the gap sentences."""
    workloads = [w for w in data["settings"]["workloads"] if PAPER_KIND.get(w) is not None
                 and any(c["workload"] == w for c in _cells(data))]
    budgets = data["settings"]["budgets"]
    lines = ["### The paper's headline settings (RRFP, arXiv 2605.18750) and ours", "",
             "The paper's figures are citations, not measured here; ours are measured by this run. Each of our "
             "cells: speedup of the row over fixed 1F1B, median over the tables, at each budget "
             f"({', '.join(budgets)}).", "",
             "| setting | paper (cited) | ranks here | " + " | ".join(f"ours: {w}" for w in workloads) + " |",
             "|---|---|---|" + "---|" * len(workloads)]
    credit = ["", "Honest credit for the same cells: the same hint in fixed order (vs 1F1B), ready over fixed "
              "(`*`: fixed holds more than the budget), peak in flight (ready / fixed).", "",
              "| setting | workload | budget | ready vs 1F1B | same hint fixed | ready/fixed | peak | /bound | "
              "/universal |",
              "|---|---|---|---|---|---|---|---|---|"]
    sentences = []
    for paper in PAPER_ROWS:
        if paper.row == "external":
            ours = _external_cells(data, workloads)
            lines.append(f"| {paper.setting} | {paper.cited} | {ours['ranks']} | " + " | ".join(ours["cells"]) + " |")
            sentences.append(f"* {paper.setting}: {ours['sentence']}")
            continue
        ranks = paper_ranks(data, paper)
        cells = []
        for w in workloads:
            if PAPER_KIND[w] != paper.kind:
                cells.append("-")
                continue
            parts = []
            for b in budgets:
                e = _row(_cell(data, w, ranks, b), paper.row) if ranks else None
                parts.append(f"{e['speedup_vs_fixed_1f1b']['median']:.2f}x @{b}" if e else f"- @{b}")
                if e:
                    mark = "*" if e.get("fixed_same_hint_within_budget") is False else ""
                    credit.append(f"| {paper.setting} | {w} | {b} | {ratio(e['speedup_vs_fixed_1f1b'])} | "
                                  f"{ratio(e.get('fixed_same_hint_speedup'))} | "
                                  f"{ratio(e.get('ready_over_fixed_same_hint'))}{mark} | "
                                  f"{peak(e['peak_in_flight'])} / {peak(e.get('fixed_same_hint_peak_in_flight'))} | "
                                  f"{number(e['makespan_over_bound'])} ({e.get('bound_family', '?')}) | "
                                  f"{number(e.get('makespan_over_universal_bound'))} |")
            cells.append(", ".join(parts))
        lines.append(f"| {paper.setting} | {paper.cited} | {ranks if ranks else '-'} | " + " | ".join(cells) + " |")
        sentences.append(f"* {paper.setting}: {gap_sentence(data, paper, ranks)}")
    return lines + credit + ["", "Gaps:", ""] + sentences + [""]


def gap_sentence(data: dict, paper: PaperRow, ranks: int | None) -> str:
    """One sentence per matching workload, from the numbers: our best figure, our spread, the sweep's reach."""
    matching = [w for w in data["settings"]["workloads"] if PAPER_KIND.get(w) == paper.kind
                and any(c["workload"] == w for c in _cells(data))]
    if not matching or ranks is None:
        return f"no {paper.kind} workload was simulated in this run, so there is nothing to compare."
    parts = []
    for w in matching:
        best = None
        for b in data["settings"]["budgets"]:
            e = _row(_cell(data, w, ranks, b), paper.row)
            if e and (best is None or e["speedup_vs_fixed_1f1b"]["median"] > best[0]):
                best = (e["speedup_vs_fixed_1f1b"]["median"], b, _cell(data, w, ranks, b)["cost_spread"]["median"])
        if best is None:
            parts.append(f"{w}: the row {paper.row} did not run at {ranks} ranks")
            continue
        speed, budget, cv = best
        where = f"{ranks} ranks" + ("" if ranks == paper.ranks else f" (the paper: {paper.ranks}; the largest here)")
        text = (f"{w}: ours {speed:.2f}x at the {budget} budget and {where} is {speed / paper.paper:.0%} of the "
                f"paper's {paper.paper:.2f}x; our cost spread (CV of a stage's forward time across microbatches) is {cv:.2f}")
        sweep = [(c["cost_spread"]["median"], e["speedup_vs_fixed_1f1b"]["median"], c["jitter"], c["ranks"])
                 for c in _cells(data, "variability") if c["workload"] == w and c["budget"] == budget
                 for e in [_row(c, paper.row)] if e]
        if sweep:
            top = max(sweep, key=lambda s: s[1])
            text += (f"; in the variability sweep ({top[3]} ranks, {budget}) it reached at most {top[1]:.2f}x, at "
                     f"CV {top[0]:.2f} (jitter {top[2]:g})")
            reaching = sorted(s for s in sweep if s[1] >= paper.paper)
            text += (f", passing the paper's figure from CV {reaching[0][0]:.2f}" if reaching else
                     f", below the paper's figure at every spread simulated (CV up to {max(s[0] for s in sweep):.2f})")
        parts.append(text)
    return "; ".join(parts) + "."


def _external_cells(data: dict, workloads: list[str]) -> dict:
    external = data.get("external") or {}
    measured = external.get("measurements") or []
    budgets = data["settings"]["budgets"]
    variability = [m for m in measured if m["case"] != "gpt" and m["case"] != "uniform"]
    if not variability:
        why = next((n for n in data.get("notes", []) if n.startswith("external")), None) or \
            "cross_framework.py gave no readiness-with-bf row with variability"
        return {"ranks": "-", "cells": ["not measured" for _ in workloads],
                "sentence": f"not measured in this run ({why})."}
    best = max(variability, key=lambda m: m["vs_fastest_torch"] or 0)
    text = "; ".join(f"{m['case']} @{m['budget']}: {_x(m['vs_fastest_torch'])} over {m['fastest_torch']}, "
                     f"{_x(m['vs_torch_1f1b'])} over Schedule1F1B" for m in variability)
    cells = [text if PAPER_KIND.get(w) == "multimodal" else "-" for w in workloads]
    ranks = data.get("external", {}).get("command", "").split("--stages")[-1].split()[0] \
        if "--stages" in external.get("command", "") else "-"
    sentence = (f"ours {_x(best['vs_fastest_torch'])} over the fastest torch schedule ({best['fastest_torch']}, "
                f"peak {best['fastest_torch_peak_in_flight']} against rrfp's {best['rrfp_peak_in_flight']}) on the "
                f"emulated {best['case']} case at {ranks} ranks, budget {best['budget']}, is "
                f"{(best['vs_fastest_torch'] or 0) / 1.84:.0%} of the paper's 1.84x (which was measured at scale, "
                f"against a different external system).")
    del budgets
    return {"ranks": ranks, "cells": cells, "sentence": sentence}


# -- whole documents ----------------------------------------------------------------------------------


def results_markdown(data: dict) -> str:
    settings = data["settings"]
    lines = ["# rrfp bench results", ""] + environment_lines(data) + [""]
    if data.get("interrupted"):
        lines += ["**Interrupted**: what finished is below; the rest did not run.", ""]
    if data.get("notes"):
        lines += ["Notes:", ""] + [f"* {n}" for n in data["notes"]] + [""]
    lines += ["## Simulation: the matrix", "", CREDIT, ""]
    for w in settings["workloads"]:
        for r in settings["ranks"]:
            lines += matrix_table(data, w, r)
    lines += ["## Simulation: speedup against variability", ""]
    for w in settings["workloads"]:
        lines += variability_table(data, w)
    if _cells(data, "unknown"):
        lines += ["## Simulation: readiness against variability nobody knows beforehand", "",
                  "Each column adds one kind of [Note: unknown variability] (runtime/durations/unknown.py, "
                  "docs/workloads.md) to the matrix's tables; each figure is ready-X's makespan against the best "
                  "fixed order within the budget on the same tables (median).", ""]
        for w in settings["workloads"]:
            lines += unknown_table(data, w)
    lines += ["## Simulation: idle time by cause", "", "Causes as `rrfp trace bubbles` splits a trace "
              "([Note: bubble categories] in profiler/analysis/bubbles.py), on the simulator's own start and ready times.", ""]
    for w in settings["workloads"]:
        lines += bubble_table(data, w)
    lines += real_tables(data) + external_table(data) + paper_table(data)
    return "\n".join(lines).rstrip() + "\n"


def section_markdown(data: dict) -> str:
    """A section for BENCHMARKS.md: the command, machine, the headline tables at the largest rank count."""
    settings = data["settings"]
    largest = max((c["ranks"] for c in _cells(data)), default=None)
    lines = ["## One benchmark command: `rrfp bench`", ""] + environment_lines(data) + [""]
    if data.get("interrupted"):
        lines += ["This run was interrupted; only what finished is shown.", ""]
    lines += [f"The whole results folder (every rank count, the variability sweep, idle time by cause, plots) "
              f"is what the command writes; below, the largest rank count simulated ({largest}) and the real "
              f"runs. " + CREDIT, ""]
    if largest is not None:
        for w in settings["workloads"]:
            lines += matrix_table(data, w, largest)
    lines += real_tables(data) + external_table(data) + paper_table(data)
    if data.get("notes"):
        lines += ["Notes:", ""] + [f"* {n}" for n in data["notes"]] + [""]
    return "\n".join(lines).rstrip() + "\n"


# -- plots ---------------------------------------------------------------------------------------------


def _hint_colour(hint: str):
    return HINT_COLOURS.get(hint, HINT_COLOURS["tuned"])


def _speedup_series(entries_by_x: list[tuple[float, dict | None]], rows=MATRIX_ROWS) -> list[Series]:
    """Per matrix row: ready rows solid with whiskers, their hint in fixed order dashed; other fixed rows dashed."""
    series = []
    for row in rows:
        if row.name == "fixed-1f1b":
            continue
        points = [(x, _row(c, row.name)) for x, c in entries_by_x]
        points = [(x, e) for x, e in points if e]
        if not points:
            continue
        colour = _hint_colour("tuned" if row.hint == "tuned" else row.hint + ("-blocking" if row.p2p else ""))
        if row.ready:
            series.append(Series(row.name, [(x, e["speedup_vs_fixed_1f1b"]["median"]) for x, e in points],
                                 [(e["speedup_vs_fixed_1f1b"]["p10"], e["speedup_vs_fixed_1f1b"]["p90"])
                                  for _, e in points], colour=colour))
            fixed = [(x, e["fixed_same_hint_speedup"]["median"]) for x, e in points if e.get("fixed_same_hint_speedup")]
            if fixed and row.hint not in ("zb", PLANNED):  # fixed zb and fixed planned are rows of their own
                series.append(Series(f"fixed {row.hint} (same hint)", fixed, dashed=True, colour=colour))
        else:
            series.append(Series(row.name, [(x, e["speedup_vs_fixed_1f1b"]["median"]) for x, e in points],
                                 dashed=True, colour=colour))
    return series


def write_plots(data: dict, folder: Path) -> list[Path]:
    """Every chart of ``data`` in ``folder``, all or none ([Note: outputs written whole] in hints.outputs): a
    refused write is one line naming the disk or the place, and leaves the charts that were there before."""
    with Outputs() as outputs:
        return _draw_plots(data, outputs.directory(folder), outputs)


def _draw_plots(data: dict, folder: Path, outputs: Outputs) -> list[Path]:
    settings = data["settings"]
    written: list[Path] = []
    for w in settings["workloads"]:
        for b in settings["budgets"]:
            by_ranks = [(math.log2(c["ranks"]), c) for c in _cells(data) if c["workload"] == w and c["budget"] == b]
            if by_ranks:
                chart = LineChart(f"{w}, budget {b}: speedup over fixed 1F1B (median, p10-p90 whiskers)",
                                  "pipeline stages (ranks), m = 4p", "speedup", _speedup_series(by_ranks),
                                  [(math.log2(c["ranks"]), str(c["ranks"])) for _, c in by_ranks], reference=1.0)
                written += save_chart(chart, folder / f"speedup-vs-stages-{w}-{b}", outputs)
            sweep = sorted(((c["jitter"], c) for c in _cells(data, "variability")
                            if c["workload"] == w and c["budget"] == b), key=lambda item: item[0])
            if sweep:
                chart = LineChart(f"{w}, {sweep[0][1]['ranks']} ranks, budget {b}: speedup over fixed 1F1B by "
                                  f"variability", "jitter / cost spread (CV of a stage's forward time across microbatches)",
                                  "speedup", _speedup_series(sweep),
                                  [(j, f"{j:g} / {c['cost_spread']['median']:.2f}") for j, c in sweep], reference=1.0)
                written += save_chart(chart, folder / f"speedup-vs-variability-{w}-{b}", outputs)
            written += _unknown_charts(data, w, b, folder, outputs)
            bubbles = [e for e in data.get("simulation", {}).get("bubbles", []) if e["workload"] == w
                       and e["budget"] == b]
            if bubbles:
                chart = BarChart(f"{w}, {bubbles[0]['ranks']} ranks, budget {b}: idle time by cause",
                                 "share of ranks x makespan", [e["row"] for e in bubbles],
                                 [Bars(c.replace("_", " "), [e["share"].get(c, 0.0) for e in bubbles],
                                       CAUSE_COLOURS[c]) for c in CAUSES], stacked=True)
                written += save_chart(chart, folder / f"bubbles-{w}-{b}", outputs)
        largest = max((c["ranks"] for c in _cells(data) if c["workload"] == w), default=None)
        if largest is not None:
            names = [r.name for r in MATRIX_ROWS if any(_row(_cell(data, w, largest, b), r.name)
                                                        for b in settings["budgets"])]
            bars = []
            for b in settings["budgets"]:
                values = []
                for name in names:
                    e = _row(_cell(data, w, largest, b), name)
                    values.append(e["makespan_over_bound"]["median"] if e else float("nan"))
                bars.append(Bars(f"budget {b}", values))
            chart = BarChart(f"{w}, {largest} ranks: makespan over the lower bound (median)", "makespan / bound",
                             names, bars, reference=1.0)
            written += save_chart(chart, folder / f"makespan-over-bound-{w}", outputs)
    return written


__all__ = ["paper_table", "results_markdown", "section_markdown", "write_plots"]


def _unknown_charts(data: dict, workload: str, budget: str, folder: Path, outputs: Outputs) -> list[Path]:
    """Per kind of unknown variability: ready over the best fixed order at equal memory, by level (level 0 is
    the sweep's "none"), one line per reported ready row, p10-p90 whiskers."""
    cells = _unknown_points(data, workload, budget)
    none = next((c for c in cells if c["kind"] == "none"), None)
    written: list[Path] = []
    for kind in dict.fromkeys(c["kind"] for c in cells if c["kind"] != "none"):
        points = ([(0.0 if kind != "moe" else 1.0, none)] if none else []) + \
            [(c["level"], c) for c in cells if c["kind"] == kind]
        series = []
        for name in UNKNOWN_ROWS:
            entries = [(x, _row(c, name)) for x, c in points]
            entries = [(x, e["ready_over_best_fixed"]) for x, e in entries if e and e.get("ready_over_best_fixed")]
            if entries:
                series.append(Series(name, [(x, v["median"]) for x, v in entries],
                                     [(v["p10"], v["p90"]) for _, v in entries],
                                     colour=_hint_colour(name.removeprefix("ready-"))))
        if series:
            chart = LineChart(f"{workload}, {points[-1][1]['ranks']} ranks, budget {budget}: ready over the best fixed "
                              f"order at equal memory, by {kind} (median, p10-p90)", f"{kind} level",
                              "ready / best fixed", series, [(x, f"{x:g}") for x, _ in points], reference=1.0)
            written += save_chart(chart, folder / f"unknown-{kind}-{workload}-{budget}", outputs)
    return written
