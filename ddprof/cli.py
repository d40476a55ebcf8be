"""The `ddprof` command line: thin typer commands over ddprof's modules.

Every user-facing failure is a DdprofError, printed as one line with exit code 2 (no traceback).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
from pathlib import Path

import typer
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from rich.console import Console
from rich.table import Table

from ddprof import __version__, process_settings
from ddprof.dashboards import DEFAULT_WINDOW_STEPS
from ddprof.errors import DdprofError
from ddprof.gate import FIELDS_HELP
from ddprof.process_group import Interrupted, handle_signals
from ddprof.sweep_defaults import described
from engine import serve_defaults

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Profile DDTree speculative decoding under Nsight Systems.")
# Piped or redirected, rich would cut table cells at 80 columns; a file or pipe gets whole lines.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 1000)


@app.callback()
def _root() -> None:
    """Capture DDTree decode runs under Nsight Systems and say which stage bounds tokens/s."""


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Show the toolchain ddprof found: nsys, torch, triton, CUDA."""
    import torch
    import triton

    from ddprof.nsys import find_nsys

    try:  # a doctor lists what is missing and goes on
        nsys = find_nsys()
        found_nsys, nsys_version = str(nsys.path), nsys.version
    except DdprofError as exc:
        found_nsys, nsys_version = f"missing: {exc}", None
    facts = {
        "ddprof": __version__,
        "python": platform.python_version(),
        "nsys": found_nsys,
        "nsys_version": nsys_version,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    if as_json:
        print(json.dumps(facts))
    else:
        table = Table(show_header=False)
        for key, value in facts.items():
            table.add_row(key, str(value))
        console.print(table)
    if nsys_version is None:
        raise typer.Exit(1)  # scripts can ask `ddprof doctor` whether captures will work


def _sentence(engine_help: str) -> str:
    """An engine option's help (engine/serve_defaults.py) as ddprof's help sentences read."""
    return engine_help[0].upper() + engine_help[1:] + "."


CUDA_GRAPHS_HELP = _sentence(serve_defaults.CUDA_GRAPHS_HELP)
OVERLAP_HELP = _sentence(serve_defaults.OVERLAP_HELP)
PREFILL_TOKENS_HELP = _sentence(serve_defaults.PREFILL_TOKENS_HELP)
BATCH_INVARIANT_HELP = ("Each token's row computed as it would be alone (default; greedy DDTree then equals AR "
                        "exactly); --no-batch-invariant runs cuBLAS / MKL: faster, no longer exact.")


@app.command()
def capture(
    workload: str = typer.Option(..., help="Workload generator: chat, code, long-context or fixed."),
    concurrency: int = typer.Option(serve_defaults.DEFAULT_CONCURRENCY,
                                    help="Requests in flight at once (continuous batching)."),
    model: str = typer.Option(None, help=f"Model preset: tiny, small or k2-layer (default: "
                                         f"{serve_defaults.DEFAULT_MODEL})."),
    builder: str = typer.Option(None, help=f"Tree builder: cpu or gpu; without CUDA the gpu builder runs in "
                                           f"Triton's interpreter (default: {serve_defaults.DEFAULT_BUILDER})."),
    budget: int = typer.Option(None, help=f"DDTree node budget per step (default: {serve_defaults.DEFAULT_BUDGET})."),
    requests: int = typer.Option(None, help=f"Requests to serve (default: {serve_defaults.DEFAULT_REQUESTS})."),
    max_new_tokens: int = typer.Option(None, help="Longest answer; the workload's answer lengths are scaled to it "
                                                  f"(default: {serve_defaults.DEFAULT_MAX_NEW_TOKENS})."),
    seed: int = typer.Option(None, help=f"Workload seed (default: {serve_defaults.DEFAULT_SEED})."),
    batch_invariant: bool = typer.Option(True, "--batch-invariant/--no-batch-invariant", help=BATCH_INVARIANT_HELP),
    cuda_graphs: bool = typer.Option(None, "--cuda-graphs/--no-cuda-graphs", help=CUDA_GRAPHS_HELP,
                                     show_default=False),
    overlap: bool = typer.Option(None, "--overlap/--no-overlap", help=OVERLAP_HELP, show_default=False),
    prefill_tokens: int = typer.Option(None, help=PREFILL_TOKENS_HELP, show_default=False),
    ranks: int = typer.Option(None, help="Expert-parallel ranks, one process each (gloo on the CPU, NCCL on CUDA); "
                                         "the report holds every rank's process (default: 1)."),
    moe_layers: int = typer.Option(None, help="MoE layers after the preset's dense ones, random-weight presets "
                                              "(k2-layer) only: as deep as the ranks' memory allows (default: the "
                                              "preset's).", show_default=False),
    out: Path = typer.Option(Path("traces/run"), readable=False, help="Writes OUT.nsys-rep, OUT.sqlite and OUT.json."),
    timeout: float = typer.Option(1800, help="Give up (and leave no files) after this many seconds."),
    as_json: bool = typer.Option(False, "--json", help="Print the run's metadata as one JSON object."),
) -> None:
    """Serve a workload under Nsight Systems; write the report, its SQLite export and a JSON summary."""
    from ddprof.capture import CaptureRequest
    from ddprof.capture import capture as run_capture
    from ddprof.report import capture_progress, progress_bar

    # The engine validates its own arguments (`serve --check`) before nsys starts.
    request = CaptureRequest(workload=workload, concurrency=concurrency, out=out, model=model, builder=builder,
                             budget=budget, requests=requests, max_new_tokens=max_new_tokens, seed=seed,
                             batch_invariant=batch_invariant, cuda_graphs=cuda_graphs, overlap=overlap,
                             prefill_tokens=prefill_tokens, ranks=ranks, moe_layers=moe_layers,
                             timeout_s=timeout)

    with progress_bar(counts=True, plain=True) as progress:
        task = progress.add_task("capture: checking the arguments", total=None)
        result = run_capture(request, on_progress=capture_progress(progress, task, lambda: "capture"))
    if as_json:
        print(json.dumps({**result.meta, "files": [str(result.report), str(result.sqlite),
                                                   str(result.json_path)]}))
        return
    table = Table(show_header=False)
    for key in ("model", "moe_layers", "weights", "workload", "concurrency", "ranks", "builder", "budget", "seed",
                "requests", "cuda_graphs", "overlap", "overlap_scope", "prefill_token_budget", "prefills", "generated_tokens",
                "steps", "wall_s", "tok_per_s", "device"):
        table.add_row(key, str(result.meta.get(key)))
    console.print(table)
    console.print("tok_per_s: every generated token over the whole serving loop, prefills included "
                  "(ddprof breakdown: decode steps alone)", style="dim")
    if result.meta.get("builder") == "gpu" and str(result.meta.get("device")).startswith("cpu"):
        console.print("note: no CUDA here, so the gpu builder ran in Triton's interpreter (TRITON_INTERPRET=1): "
                      "its tree_build times are interpreter times, not a GPU's", style="yellow")
    console.print(f"trace: {result.report}\nsqlite: {result.sqlite}\nsummary: {result.json_path}")


_STAGE_MAP_HELP = "JSON/TOML file mapping another engine's NVTX range names onto step and the six stages."
_DROP_HELP = ("Leave out unclosed and cross-thread step/stage ranges, and stage ranges across a step's start or end "
              "(counted in the output), instead of failing.")


def _analyse(path: Path, stage_map_file: Path | None, drop_incomplete: bool, advance):
    """(attribution, summary) of one run: a single process through ddprof.pipeline, or the ranks of
    a report holding several processes (or a glob of per-rank reports) as their critical path."""
    from ddprof.pipeline import analyse_trace
    from ddprof.ranks import analyse_ranks, processes

    stage_map = _stage_map(stage_map_file)
    found = processes([path], stage_map, advance)
    if len(found) == 1:
        return analyse_trace(found[0].trace, stage_map, drop_incomplete=drop_incomplete, advance=advance)[1:]
    ranked = analyse_ranks(found, stage_map, drop_incomplete=drop_incomplete, advance=advance)
    return ranked.critical, ranked.summary["critical_path"]


def _stage_map(stage_map_file: Path | None):
    from ddprof.stage_map import StageMap

    return StageMap.from_file(stage_map_file) if stage_map_file else StageMap.default()


_RANKS_HELP = ("A .sqlite export or a .nsys-rep report; several (or a quoted glob, 'traces/run.rank*.sqlite'), or "
               "one holding several processes: the ranks of one run, side by side.")


@app.command()
def breakdown(
    paths: list[Path] = typer.Argument(..., readable=False, metavar="PATH...", help=_RANKS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    parquet: Path = typer.Option(None, "--parquet", readable=False, help="Also write the frames as DIR/*.parquet."),
    stage_map: Path = typer.Option(None, "--stage-map", readable=False, help=_STAGE_MAP_HELP),
    drop_incomplete: bool = typer.Option(False, "--drop-incomplete", help=_DROP_HELP),
) -> None:
    """Which decode stage bounds tokens/s: per-stage host, GPU and critical-path time (per rank,
    the critical path over the ranks and the stragglers, for several ranks)."""
    from ddprof.analysis import breakdown_frames, require_parquet_folder, write_parquet
    from ddprof.pipeline import PHASES, analyse_trace
    from ddprof.ranks import analyse_ranks, processes
    from ddprof.ranks_report import ranks_view
    from ddprof.report import breakdown_view, phases

    if parquet:
        require_parquet_folder(parquet)
    mapping = _stage_map(stage_map)
    with phases(PHASES + 1 if parquet else PHASES) as advance:
        found = processes(paths, mapping, advance)
        if len(found) > 1:
            if parquet:
                raise DdprofError(f"{found[0].source}: --parquet writes one process's frames; these reports hold "
                                  f"{len(found)} ranks (give one rank's report)")
            summary = analyse_ranks(found, mapping, drop_incomplete=drop_incomplete, advance=advance).summary
            if as_json:
                print(json.dumps(summary))
            else:
                console.print(ranks_view(summary))
            return
        trace, attribution, summary = analyse_trace(found[0].trace, mapping, drop_incomplete=drop_incomplete,
                                                    advance=advance)
        if parquet:
            advance(f"writing {parquet}")
            write_parquet(breakdown_frames(trace, attribution, summary), parquet)
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(breakdown_view(summary))


@app.command()
def gaps(
    paths: list[Path] = typer.Argument(..., readable=False, metavar="PATH...",
                                       help=_RANKS_HELP + " CUDA must have been traced."),
    min_ms: float = typer.Option(1.0, "--min-ms", help="Shortest gap that is counted and listed (ms)."),
    top: int = typer.Option(10, "--top", help="How many of the longest gaps to list."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    stage_map: Path = typer.Option(None, "--stage-map", readable=False, help=_STAGE_MAP_HELP),
    drop_incomplete: bool = typer.Option(False, "--drop-incomplete", help=_DROP_HELP),
) -> None:
    """Host time outside CUDA calls per stage, and the longest gaps with the call and kernel after each
    (per rank, for several ranks)."""
    from ddprof.gaps import host_gaps
    from ddprof.pipeline import PHASES, analyse_trace
    from ddprof.ranks import processes
    from ddprof.ranks_report import ranks_gaps_view
    from ddprof.report import gaps_view, phases

    if not min_ms >= 0:
        raise DdprofError(f"--min-ms must be 0 or more (got {min_ms})")
    if top < 1:
        raise DdprofError(f"--top must be 1 or more (got {top})")
    mapping = _stage_map(stage_map)
    with phases(PHASES + 1) as advance:
        found = processes(paths, mapping, advance)
        results = []
        for process in found:
            trace, attribution, _ = analyse_trace(process.trace, mapping, drop_incomplete=drop_incomplete,
                                                  advance=advance)
            advance("finding host gaps")
            results.append({"rank": process.rank, **host_gaps(trace, attribution, min_ms=min_ms, top=top)})
    result = results[0] if len(results) == 1 else {"ranks": results}
    if len(results) == 1:
        del result["rank"]
    if as_json:
        print(json.dumps(result))
    else:
        console.print(gaps_view(result) if len(results) == 1 else ranks_gaps_view(result))


_FAIL_IF_HELP = ("A regression rule, 'FIELD < N%' or 'FIELD > N%' (repeatable): B regresses when the whole "
                 "bootstrap CI of FIELD's change from A lies past N%, e.g. 'tok_per_s < -3%', 'verify.crit_ms > +5%'. "
                 f"Fields (breakdown --json keys; all but tok_per_s per step): {FIELDS_HELP}.")


@app.command()
def compare(
    a: Path = typer.Argument(..., readable=False, help="Run A (the baseline): .sqlite or .nsys-rep; a report of "
                                                       "several ranks, or a quoted glob of per-rank reports, is "
                                                       "compared by its critical path over the ranks."),
    b: Path = typer.Argument(..., readable=False, help="Run B: as A."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    stage_map: Path = typer.Option(None, "--stage-map", readable=False,
                                   help=_STAGE_MAP_HELP + " Applies to both runs."),
    stage_map_b: Path = typer.Option(None, "--stage-map-b", readable=False, help="A different stage map for run B."),
    resamples: int = typer.Option(2000, help="Bootstrap resamples of steps."),
    seed: int = typer.Option(0, help="Bootstrap seed."),
    drop_incomplete: bool = typer.Option(False, "--drop-incomplete", help=_DROP_HELP),
    fail_if: list[str] = typer.Option(None, "--fail-if", help=_FAIL_IF_HELP),
) -> None:
    """Per-stage deltas (ms per step, bootstrap CIs over steps) and the tok/s ratio of B over A.

    With --fail-if it is a regression gate: exit 0 when no rule flags a regression, 1 when one
    does (each named in one line), 2 on bad input or a bad rule.
    """
    from ddprof.compare import MAX_RESAMPLES
    from ddprof.compare import compare as compare_runs
    from ddprof.gate import describe, parse_rule
    from ddprof.pipeline import PHASES
    from ddprof.report import compare_view, phases

    rules = [parse_rule(text) for text in fail_if or ()]  # a bad rule fails before the traces are read
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise DdprofError(f"--resamples must be between 1 and {MAX_RESAMPLES:,} (got {resamples})")
    if seed < 0:
        raise DdprofError(f"--seed must be 0 or more (got {seed})")
    if Path(a).resolve() == Path(b).resolve() and stage_map_b in (None, stage_map):
        raise DdprofError(f"{a}: A and B are the same trace with the same stage map; there is nothing to compare")
    with phases(2 * PHASES + 1) as advance:
        run_a, summary_a = _analyse(a, stage_map, drop_incomplete, advance)
        run_b, summary_b = _analyse(b, stage_map_b or stage_map, drop_incomplete, advance)
        advance("bootstrapping")
        result = compare_runs(run_a, run_b, summary_a, summary_b, resamples=resamples, seed=seed, fail_if=rules)
    if as_json:
        print(json.dumps(result))
    else:
        console.print(compare_view(result))
    regressions = [v for v in result["verdicts"] if v["regression"]]
    for v in regressions:
        print(f"ddprof: regression: {describe(v, result['confidence'])}", file=sys.stderr)
    if regressions:
        raise typer.Exit(1)


_PLOTLY_HELP = ("Where the page gets plotly.js: inline (embedded, ~5 MB, opens offline), cdn (plotly's CDN, needs "
                "the network) or FILE (a copy written there once, linked relative to the page).")


@app.command()
def dashboard(
    inputs: list[Path] = typer.Argument(..., readable=False, metavar="TRACE_OR_AB...",
                                        help="Runs: .sqlite exports or .nsys-rep reports (NAME.json beside each, "
                                             "from ddprof capture, says what ran); and A/B result files "
                                             "(benchmarks/results/builder_ab_*.json, moe_dispatch_ab_*.json), "
                                             "the paired evidence the headline quotes."),
    out: Path = typer.Option(None, "--out", readable=False,
                             help="HTML file to write (default: dashboards/NAME.html, NAME the trace's name, the "
                                  "folder several traces share, else dashboard; an existing page is replaced, "
                                  "and the output says so)."),
    window_steps: int = typer.Option(DEFAULT_WINDOW_STEPS, help="Consecutive steps in the step timeline."),
    plotly_js: str = typer.Option("inline", "--plotly", help=_PLOTLY_HELP),
    stage_map: Path = typer.Option(None, "--stage-map", readable=False,
                                   help=_STAGE_MAP_HELP + " Applies to every trace."),
    drop_incomplete: bool = typer.Option(False, "--drop-incomplete", help=_DROP_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """One HTML page: the answer in a headline, step share, tok/s vs concurrency, step timeline, per-step distributions."""
    from ddprof.ab_results import split_inputs
    from ddprof.dashboards.page import default_path, prepare_dashboard_path, write_dashboard
    from ddprof.dashboards.runs import load_runs
    from ddprof.dashboards.terminal import describe, view
    from ddprof.pipeline import PHASES
    from ddprof.report import phases
    from ddprof.stage_map import StageMap

    if window_steps < 1:
        raise DdprofError(f"--window-steps must be at least 1 (got {window_steps})")
    traces, evidence = split_inputs(inputs)
    out = out or default_path(traces)
    prepare_dashboard_path(out)  # before the traces are read
    replaced = out.exists()
    with phases(PHASES * len(traces) + 1) as advance:
        runs = load_runs(traces, StageMap.from_file(stage_map) if stage_map else None,
                         drop_incomplete=drop_incomplete, advance=advance)
        advance(f"writing {out}")
        write_dashboard(runs, out, evidence=evidence, window_steps=window_steps, plotly_js=plotly_js)
    if as_json:
        print(json.dumps(describe(runs, out, evidence, replaced=replaced)))
    else:
        console.print(view(runs, out, evidence, replaced=replaced))


def _grid_values(flag: str, text: str | None, default: tuple, kind: type) -> tuple:
    """A comma-separated option (`1,2,4`) as a tuple of `kind`; the machine's default when not given."""
    if text is None:
        return default
    try:
        return tuple(kind(part.strip()) for part in text.split(","))
    except ValueError:
        raise DdprofError(f"{flag} {text!r}: expected comma-separated whole numbers, e.g. 1,2,4") from None


@app.command()
def sweep(
    concurrency: str = typer.Option(None, help=f"Comma-separated concurrencies (default: {described('concurrency')})."),
    builder: str = typer.Option(None, help=f"Comma-separated tree builders (default: {described('builders')}; without "
                                           "CUDA the gpu builder runs in Triton's interpreter)."),
    budget: str = typer.Option(None, help=f"Comma-separated DDTree node budgets (default: {described('budgets')})."),
    workload: str = typer.Option("chat", help="Workload generator: chat, code, long-context or fixed."),
    model: str = typer.Option(None, help=f"Model preset (default: {described('model')})."),
    requests: int = typer.Option(None, help=f"Requests per capture (default: {described('requests')})."),
    max_new_tokens: int = typer.Option(None, help=f"Longest answer per request (default: "
                                                  f"{described('max_new_tokens')})."),
    seed: int = typer.Option(0, help="Workload seed (the same for every capture)."),
    batch_invariant: bool = typer.Option(True, "--batch-invariant/--no-batch-invariant", help=BATCH_INVARIANT_HELP),
    cuda_graphs: bool = typer.Option(None, "--cuda-graphs/--no-cuda-graphs", help=CUDA_GRAPHS_HELP,
                                     show_default=False),
    overlap: bool = typer.Option(None, "--overlap/--no-overlap", help=OVERLAP_HELP, show_default=False),
    prefill_tokens: int = typer.Option(None, help=PREFILL_TOKENS_HELP, show_default=False),
    out_dir: Path = typer.Option(Path("traces/sweep"), readable=False,
                                 help="Folder for the captures (NAME.nsys-rep/.sqlite/.json)."),
    dashboard_out: Path = typer.Option(None, "--dashboard", readable=False,
                                       help="Dashboard to write (default: dashboards/<out-dir name>.html)."),
    ab: list[Path] = typer.Option(None, "--ab", readable=False, metavar="FILE",
                                  help="An A/B result file (benchmarks/results/builder_ab_*.json) the headline quotes "
                                       "beside the captures; repeatable."),
    plotly_js: str = typer.Option("inline", "--plotly", help=_PLOTLY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Capture a concurrency x builder x budget grid, then write one dashboard of all the runs."""
    from ddprof.ab_results import read_ab
    from ddprof.dashboards.terminal import describe, view
    from ddprof.report import capture_progress, progress_bar
    from ddprof.sweep import Grid, defaults, run_sweep

    machine = defaults()

    def given(value, key: str):
        return machine[key] if value is None else value

    grid = Grid(concurrency=_grid_values("--concurrency", concurrency, machine["concurrency"], int),
                builders=_grid_values("--builder", builder, machine["builders"], str),
                budgets=_grid_values("--budget", budget, machine["budgets"], int),
                model=given(model, "model"), requests=given(requests, "requests"),
                max_new_tokens=given(max_new_tokens, "max_new_tokens"), workload=workload, seed=seed,
                batch_invariant=batch_invariant, cuda_graphs=cuda_graphs, overlap=overlap,
                prefill_tokens=prefill_tokens, out_dir=out_dir)
    dashboard_out = dashboard_out or Path("dashboards") / f"{out_dir.resolve().name or 'sweep'}.html"
    evidence = [read_ab(path) for path in ab or ()]  # before the captures: a bad file must not cost a sweep
    points = grid.points()
    replaced = dashboard_out.exists()
    with progress_bar(counts=True, plain=True) as progress:
        sweep_task = progress.add_task("sweep: captures done", total=len(points))
        requests_task = progress.add_task("", total=None)

        current = [""]  # the capture under way, named in its phases

        def on_capture(index: int, total: int, request) -> None:
            current[0] = request.out.name
            progress.update(sweep_task, completed=index)
            progress.reset(requests_task, description=f"{request.out.name}: checking the arguments", total=None)

        def advance(label: str) -> None:
            progress.update(sweep_task, completed=len(points), description="sweep: captures done, writing the dashboard")
            progress.update(requests_task, description=label, total=None)

        result = run_sweep(grid, dashboard_out, on_capture=on_capture, advance=advance,
                           on_requests=capture_progress(progress, requests_task, lambda: current[0]),
                           evidence=evidence, plotly_js=plotly_js)
    if as_json:
        print(json.dumps({**describe(result.runs, result.dashboard, evidence, replaced=replaced),
                          "interpreted_gpu_builder": result.interpreted,
                          "captures": [str(c.sqlite) for c in result.captures]}))
        return
    if result.interpreted:
        console.print("note: no CUDA here, so the gpu builder ran in Triton's interpreter (TRITON_INTERPRET=1)",
                      style="yellow")
    console.print(view(result.runs, result.dashboard, evidence, replaced=replaced))


def main() -> None:
    """Console-script entry: run the app; every way it can fail is one line on stderr: bad input
    and environment (DdprofError, an OS error on a file, a usage error) exit 2, SIGINT/SIGTERM
    128 + the signal's number once everything started is stopped and removed."""
    process_settings.apply()
    sys.stdout.reconfigure(errors="backslashreplace")  # a file name that is not UTF-8, printed
    try:
        with handle_signals():
            code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        print(exc.ctx.get_help())
        code = 2
    except UsageError as exc:
        command = f" {exc.ctx.command_path.removeprefix(exc.ctx.find_root().info_name).strip()}" if exc.ctx else ""
        _fail(f"{exc.format_message()} (see: ddprof{command.rstrip()} --help)", 2)
    except DdprofError as exc:
        _fail(str(exc), 2)
    except OSError as exc:  # the one path for files the checks did not foresee (too long, a loop, ...)
        _fail(f"{exc.filename}: {exc.strerror}" if exc.filename is not None else str(exc), 2)
    except (Interrupted, KeyboardInterrupt, typer.Abort) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        _fail(f"interrupted by {signal.Signals(signum).name}; stopped what it started, removed partial files",
              128 + signum)
    process_settings.exit_now(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    print(f"ddprof: error: {' '.join(message.splitlines())}", file=sys.stderr)  # one line, whatever it quotes
    process_settings.exit_now(code)
