"""The dashboard page: one HTML file that, by default, embeds plotly's JavaScript once and opens offline.

`--plotly cdn` links plotly's CDN instead, and `--plotly FILE` a local copy of it (written once,
shared by every page that names it): pages of a few hundred kB instead of ~5 MB.
Order on the page: the headline, notes the reader must know, a table of the runs, then the four
figures. Every figure is a `div.plotly-graph-div` with the id in FIGURES.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from pathlib import Path

import plotly
import plotly.io as pio
from plotly.offline import get_plotlyjs

from ddprof.ab_results import ABResult
from ddprof.atomic import atomic_path
from ddprof.dashboards import DEFAULT_WINDOW_STEPS
from ddprof.dashboards.distributions import distributions_figure
from ddprof.dashboards.headline import bound_share, headline
from ddprof.dashboards.ranks_section import ranks_section
from ddprof.dashboards.runs import UNKNOWN, Run, notes
from ddprof.dashboards.step_share import step_share_figure
from ddprof.dashboards.throughput import throughput_figure
from ddprof.dashboards.timeline import timeline_figure
from ddprof.errors import DdprofError

FIGURES = ("step-share", "tok-per-s", "step-timeline", "per-step-distributions")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1280px; padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
p.headline { font-size: 18px; line-height: 1.45; background: #f4f6f8; border-left: 4px solid #555;
             padding: 12px 16px; }
ul.notes { color: #8a5a00; }
table.runs { border-collapse: collapse; font-size: 13px; margin: 12px 0 24px; }
table.runs th, table.runs td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
table.runs th:first-child, table.runs td:first-child { text-align: left; }
section { margin-top: 28px; }
"""


def _cell(value) -> str:
    if value is None:
        return UNKNOWN
    if isinstance(value, float):
        return f"{value:,.2f}"
    return html.escape(str(value))


def _runs_table(runs: Sequence[Run]) -> str:
    header = ("run", "trace", "builder", "execution", "concurrency", "budget", "model", "workload", "steps",
              "tokens", "decode tok/s", "bound by", "its share")
    rows = []
    for run in runs:
        s = run.summary
        cells = (run.label, run.source.name, run.builder, run.setting("execution"), run.setting("concurrency"),
                 run.setting("budget"), run.setting("model"), run.setting("workload"), s["steps"], s["tokens"],
                 s["tok_per_s"], s["bound_by"], f"{bound_share(run) * 100:.1f}%")
        rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def plotly_script(plotly_js: str, out: Path) -> str:
    """The page's <script> for plotly.js: "inline" embeds it, "cdn" links plotly's CDN (this
    plotly's version), any other value is a file path (relative to the working folder) that is
    written if missing and linked relative to the page at `out`."""
    if plotly_js == "inline":
        return f'<script type="text/javascript">{get_plotlyjs()}</script>'
    if plotly_js == "cdn":
        return f'<script src="https://cdn.plot.ly/plotly-{plotly.__version__}.min.js" charset="utf-8"></script>'
    copy = Path(plotly_js)
    if not copy.is_file() or copy.read_text(encoding="utf-8") != get_plotlyjs():
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(copy) as partial:
                partial.write_text(get_plotlyjs(), encoding="utf-8")
        except OSError as exc:
            raise DdprofError(f"{copy}: cannot write plotly.js there ({exc.strerror})") from None
    link = Path(os.path.relpath(copy.resolve(), Path(out).resolve().parent)).as_posix()
    return f'<script src="{html.escape(link)}" charset="utf-8"></script>'


def render(runs: Sequence[Run], *, evidence: Sequence[ABResult] = (), window_steps: int = DEFAULT_WINDOW_STEPS,
           title: str = "ddprof dashboard", plotly_js: str = "inline", out: Path = Path("dashboard.html")) -> str:
    """The whole page as one HTML string (`out`: where it will be written, for a linked plotly.js)."""
    figures = dict(zip(FIGURES, (step_share_figure(runs), throughput_figure(runs),
                                 timeline_figure(runs, window_steps), distributions_figure(runs)), strict=True))
    sections = "".join(
        f'<section id="section-{name}">'
        f'{pio.to_html(figure, full_html=False, include_plotlyjs=False, div_id=name, config=_PLOT_CONFIG)}'
        "</section>" for name, figure in figures.items())
    found = notes(runs)
    notes_html = ('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in found) + "</ul>") if found else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
            f"{plotly_script(plotly_js, out)}</head><body>"
            f"<h1>{html.escape(title)}</h1>"
            f'<p class="headline" id="headline">{html.escape(headline(runs, evidence))}</p>'
            f"{notes_html}{_runs_table(runs)}{ranks_section(runs)}{sections}</body></html>\n")


def default_path(traces: Sequence[Path]) -> Path:
    """dashboards/NAME.html: NAME is the trace's name, the folder several traces share, or `dashboard`."""
    traces = [Path(t) for t in traces]
    folders = {t.resolve().parent for t in traces}
    if len(traces) == 1:
        name = re.sub(r"[][*?]", "", traces[0].stem)  # a glob of per-rank reports: `run.rank*` -> run.rank
    elif len(folders) == 1:
        name = folders.pop().name
    else:
        name = "dashboard"
    return Path("dashboards") / f"{name}.html"


def prepare_dashboard_path(out: Path) -> None:
    """Check that `out` can be the page's file and create its folder, or say in one line why not (a
    sweep asks before its captures, not after)."""
    out = Path(out)
    if not out.name or out.is_dir():
        raise DdprofError(f"{str(out) or repr('')}: the dashboard must be a file path (e.g. dashboards/run.html), "
                          "not a folder")
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise DdprofError(f"{folder}: the dashboard's folder is a file")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DdprofError(f"{folder}: cannot create the dashboard's folder ({exc.strerror})") from None


def write_dashboard(runs: Sequence[Run], out: Path, **options) -> Path:
    """Write the page to `out` (creating its folder); a reader never sees half a file."""
    out = Path(out)
    prepare_dashboard_path(out)
    page = render(runs, out=out, **options)
    try:
        with atomic_path(out) as partial:
            partial.write_text(page, encoding="utf-8", errors="backslashreplace")  # a non-UTF-8 file name
    except OSError as exc:
        raise DdprofError(f"{out}: cannot write the dashboard ({exc.strerror})") from None
    return out
