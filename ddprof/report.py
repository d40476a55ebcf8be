"""How breakdown and compare results look in a terminal: rich tables and a progress bar.

Only presentation lives here; every number comes from ddprof.analysis / ddprof.compare, so the
table and `--json` can never disagree.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from collections.abc import Callable
from contextlib import contextmanager

from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ddprof.analysis import stage_row
from ddprof.dashboards.runs import INTERPRETED_NOTE, dropped_note, interpreted_gpu_builder, read_metadata
from ddprof.graphs import NO_GRAPHS, NODE_MODE


def progress_bar(*, counts: bool = False, plain: bool = False) -> Progress | PlainProgress:
    """The progress bar of every long command: on stderr (stdout stays a table or JSON), gone when
    done; `counts` shows "done/total" for counted work. When stderr is not a terminal (a log file,
    CI) it is off, or with `plain` (the minutes-long capture and sweep) plain lines instead."""
    status = Console(stderr=True)
    if plain and not status.is_terminal:
        return PlainProgress(counts=counts)
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               *([MofNCompleteColumn()] if counts else []), TimeElapsedColumn()]
    return Progress(*columns, console=status, transient=True, disable=not status.is_terminal)


def capture_progress(progress: Progress | PlainProgress, task, name: Callable[[], str]):
    """The `on_progress(phase, done, total)` of ddprof.capture for `task`, e.g. "run: loading the
    model", then "run: serving, requests done 17/128"; a phase without counts shows none."""
    def on_progress(phase: str, done: int | None, total: int | None) -> None:
        if done is None:
            progress.reset(task, description=f"{name()}: {phase}", total=None)
        else:
            progress.update(task, description=f"{name()}: {phase}, requests done", completed=done, total=total)
    return on_progress


class PlainProgress:
    """The calls of rich's Progress the commands make, as plain lines on stderr: one when a task's
    description changes, and at most one per `every_s` seconds while only its count moves. A new
    task says nothing until its first update (an argument error stays the only line on stderr)."""

    def __init__(self, *, counts: bool, every_s: float = 10.0, stream=None, clock=time.monotonic):
        self._counts, self._every_s, self._stream, self._clock = counts, every_s, stream or sys.stderr, clock
        self._tasks: list[dict] = []
        self._started = clock()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def add_task(self, description: str, total: float | None = None) -> int:
        self._tasks.append({"description": description, "completed": 0, "total": total, "said": None, "at": None})
        return len(self._tasks) - 1

    def update(self, task: int, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        state = self._tasks[task]
        state.update({key: value for key, value in (("completed", completed), ("description", description),
                                                    ("total", total)) if value is not None})  # None: unchanged
        self._say(task)

    def reset(self, task: int, *, description: str, total: float | None = None) -> None:
        self._tasks[task].update(description=description, completed=0, total=total)
        self._say(task)

    def _say(self, task: int) -> None:
        state, now = self._tasks[task], self._clock()
        if not state["description"]:
            return
        text = state["description"]
        if self._counts and state["total"]:
            text += f" {state['completed']:.0f}/{state['total']:.0f}"
        new_phase = state["said"] is None or state["said"][0] != state["description"]
        if text == (state["said"] or ("", ""))[1] or not new_phase and now - state["at"] < self._every_s:
            return
        state["said"], state["at"] = (state["description"], text), now
        print(f"[{now - self._started:6.1f} s] {text}", file=self._stream, flush=True)


@contextmanager
def phases(total: int):
    """A progress bar over `total` named phases; yields `advance(label)`."""
    with progress_bar() as progress:
        task = progress.add_task("", total=total)
        done = iter(range(total))

        def advance(label: str) -> None:  # a new phase starts: the previous ones are complete
            progress.update(task, description=label, completed=next(done, total))

        yield advance
        progress.update(task, completed=total)


def _num(value, fmt: str | None = None) -> str:
    """Numbers spanning microseconds to minutes, readable at a glance; n/a for unknown."""
    if value is None:
        return "n/a"
    if fmt:
        return fmt.format(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _pct(value) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _dropped_note(dropped: dict[str, int]) -> list[str]:
    note = dropped_note(dropped)
    return [note] if note else []


def _per_step(count: int | None, steps: int) -> str:
    return _num(None if count is None else count / steps, "{:,.1f}")


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", padding=(0, 1))
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right", no_wrap=True)
    return table


def breakdown_view(summary: dict) -> Group:
    """The headline, the per-stage tables and any warnings of one breakdown."""
    rate = _num(summary["tok_per_s"], "{:.1f} tok/s")
    bound = stage_row(summary, summary["bound_by"])
    headline = Text.assemble(
        (f"{summary['source']}\n", "bold"),
        f"{summary['steps']} steps · {_num(summary['tokens'], '{}')} tokens · {summary['wall_s']:.3f} s wall · "
        f"{rate} · ",
        "bound by ", (summary["bound_by"], "bold red"), f" ({_pct(bound['crit_share'])} of step time)"
        + ("" if summary["gpu_busy_share"] is None else f" · GPU busy {_pct(summary['gpu_busy_share'])} of step time")
        + "\n",
        (f"tok/s = decode tokens / wall; the wall holds {_pct(summary['wall']['steps']['share'])} decode steps"
         + ("" if summary["wall"]["prefill"] is None else f", {_pct(summary['wall']['prefill']['share'])} prefill")
         + _graphs_line(summary["cuda_graphs"]), "dim"))
    totals = _table("ms over all steps; crit = critical-path time the stage owns; % of step time",
                    ("stage", "count", "cpu ms", "cpu %", "gpu ms", "crit ms", "crit %"))
    detail = _table("host ms waiting on the GPU; GPU ops and CUDA graphs launched and waiting calls per step; "
                    "crit ms per step; tok/s if the stage cost 0 or only its GPU time",
                    ("stage", "wait ms", "ops/step", "graphs/step", "waits/step", "p50", "p90", "p99", "tok/s if 0",
                     "if GPU"))
    for s in summary["stages"]:
        style = "bold" if s["stage"] == summary["bound_by"] else None
        totals.add_row(s["stage"], str(s["count"]), _num(s["cpu_ms"]), _pct(s["cpu_share"]), _num(s["gpu_ms"]),
                       _num(s["crit_ms"]), _pct(s["crit_share"]), style=style)
        dist, what_if = s["per_step"]["crit_ms"], s["what_if"]
        detail.add_row(s["stage"], _num(s["wait_ms"]), _per_step(s["gpu_ops"], summary["steps"]),
                       _per_step(s["graph_launches"], summary["steps"]), _per_step(s["sync_calls"], summary["steps"]), _num(dist["p50"]), _num(dist["p90"]),
                       _num(dist["p99"]), _num(what_if["tok_per_s_if_free"]),
                       _num(what_if["tok_per_s_if_gpu_only"]), style=style)
    totals.add_row("other", "", "", "", "", _num(summary["other_crit_ms"]), _pct(summary["other_crit_share"]),
                   style="dim")
    wall = summary["wall"]
    basis = _table("the wall tok/s is over: first step start to last step end", ("wall", "ms", "% of wall"))
    for label, key in (("decode steps", "steps"), ("prefill (between steps)", "prefill"),
                       ("other between steps", "between_steps")):
        part = wall[key]
        basis.add_row(label, _num(None if part is None else part["ms"]), _pct(None if part is None else part["share"]))
    basis.add_row("wall", _num(wall["ms"]), _pct(1.0), style="bold")
    notes = []
    if summary["tokens"] is None:
        notes.append("no token marks in this trace: tokens and tok/s are n/a (a stage map's `tokens` names the mark)")
    if not summary["gpu_activity"]:
        notes.append("no GPU activity in this trace: gpu and wait are n/a")
    if summary["cuda_graphs"] and summary["cuda_graphs"]["mode"] not in (NODE_MODE, NO_GRAPHS):
        notes.append("CUDA graphs recorded as whole graphs (nsys --cuda-graph-trace=graph): a graph's gpu ms spans "
                     "its replay, idle gaps between nodes included, and its nodes are not in ops/step; capture with "
                     "--cuda-graph-trace=node for each node")
    notes += _dropped_note(summary["dropped_ranges"])
    if summary["wall"]["prefill"] is None:
        notes.append("prefill is n/a: another engine's ranges (--stage-map) name no prefill")
    return Group(headline, totals, detail, basis, *(Text(f"note: {n}", style="yellow") for n in notes))


def _graphs_line(graphs: dict | None) -> str:
    """How the trace recorded CUDA graph replays, e.g. "CUDA graphs: node trace, 120 launches, 33,720
    nodes"; nothing for a trace without GPU tracing."""
    if graphs is None:
        return ""
    if graphs["mode"] == NO_GRAPHS:
        return "\nCUDA graphs: none launched"
    counted = [f"{graphs['node_ops']:,} nodes"] * bool(graphs["node_ops"]) + [
        f"{graphs['graph_records']:,} whole-graph records"] * bool(graphs["graph_records"])
    return f"\nCUDA graphs: {graphs['mode']} trace, {graphs['launches']:,} launches, {', '.join(counted)}"


def gaps_view(result: dict) -> Group:
    """Per stage, host time in and outside CUDA calls; then the longest gaps and what followed them."""
    at_least = f"gaps >= {result['min_ms']:g} ms"
    stages = _table("host ms of each stage's innermost ranges, in and outside CUDA runtime calls",
                    ("stage", "host ms", "in calls", "outside", at_least, "their ms"))
    for s in result["stages"]:
        stages.add_row(s["stage"], _num(s["host_ms"]), _num(s["in_calls_ms"]), _num(s["outside_calls_ms"]),
                       str(s["gaps"]), _num(s["gaps_ms"]))
    longest = _table("the longest gaps: the thread ran no CUDA call; what it called and launched next",
                     ("stage", "step", "at ms", "gap ms", "next call", "next kernel"))
    longest.columns[-1].no_wrap = False
    for g in result["longest"]:
        longest.add_row(g["stage"], str(g["step_id"]), _num(g["at_ms"]), _num(g["ms"]), g["next_call"],
                        g["next_kernel"] or "n/a")
    notes = [] if result["longest"] else [f"no gap of {result['min_ms']:g} ms or more"]
    notes += _dropped_note(result["dropped_ranges"])
    return Group(Text(result["source"], style="bold"), stages, longest,
                 *(Text(f"note: {n}", style="yellow") for n in notes))


def compare_view(result: dict) -> Group:
    """Both runs' headlines, the tok/s ratio and the per-stage deltas with their intervals."""
    conf = f"{result['confidence'] * 100:.0f}%"
    lines = [Text.assemble((f"{label.upper()}: ", "bold"), f"{run['source']} · {run['steps']} steps · "
                           f"{_num(run['tok_per_s'], '{:.1f} tok/s')} · bound by ", (run["bound_by"], "bold"))
             for label, run in (("a", result["a"]), ("b", result["b"]))]
    ratio = _num(result["tok_per_s_ratio"], "{:.3f}")
    ci = result["tok_per_s_ratio_ci"]
    ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
    lines.append(Text(f"tok/s ratio B/A: {ratio}{ci_text} ({conf} CI, {result['resamples']} step resamples)"))
    with_gpu = any(row["gpu_ms_per_step_delta"] is not None for row in result["stages"])
    gpu_columns = ["gpu Δ", "ops/step A → B", "waits/step A → B"] if with_gpu else []
    table = _table(f"crit ms per step, Δ = B - A and its {conf} bootstrap CI (cpu/gpu deltas: --json)",
                   ("stage", "A", "B", "Δ", f"{conf} CI", *gpu_columns, "share A → B"))
    for row in result["stages"]:
        low, high = row["crit_ms_per_step_delta_ci"]
        gpu_cells = [_num(row["gpu_ms_per_step_delta"]),
                     f"{_num(row['a_gpu_ops_per_step'], '{:,.1f}')} → {_num(row['b_gpu_ops_per_step'], '{:,.1f}')}",
                     f"{_num(row['a_sync_calls_per_step'], '{:,.1f}')} → {_num(row['b_sync_calls_per_step'], '{:,.1f}')}"]
        table.add_row(row["stage"], _num(row["a_crit_ms_per_step"]), _num(row["b_crit_ms_per_step"]),
                      _num(row["crit_ms_per_step_delta"]), f"{_num(low)} … {_num(high)}",
                      *(gpu_cells if with_gpu else []),
                      f"{_pct(row['a_crit_share'])} → {_pct(row['b_crit_share'])}")
    notes = [f"{label.upper()} ({run['source']}): {INTERPRETED_NOTE}" for label, run in (("a", result["a"]), ("b", result["b"]))
             if interpreted_gpu_builder(read_metadata(Path(run["source"])))]
    return Group(*lines, table, *(Text(f"note: {n}", style="yellow") for n in notes),
                 *([_verdicts_table(result)] if result["verdicts"] else []))


def _verdicts_table(result: dict) -> Table:
    """The --fail-if rules: each field's change A -> B and its interval, and the verdict."""
    table = _table(f"--fail-if: a regression only where the whole {result['confidence'] * 100:.0f}% CI of the change "
                   "lies past the rule", ("rule", "A", "B", "change", "CI", "verdict"))
    for v in result["verdicts"]:
        low, high = (f"{end:+.2f}%" if end is not None else "unbounded" for end in v["change_ci_pct"])
        table.add_row(v["rule"], f"{v['a']:.6g}", f"{v['b']:.6g}", f"{v['change_pct']:+.2f}%", f"{low} … {high}",
                      Text("REGRESSION", style="bold red") if v["regression"] else Text("pass", style="green"))
    return table
