"""The dashboard page in real headless Chromium: it loads offline, logs no errors and draws every figure.

This page is built from the hand-built runs (tests/ddprof/known_runs.py), whose GPU-builder run
has kernels, so the timeline's GPU lane is exercised too; test_sweep_real.py opens a page made
from real captures. Screenshots land in build/test-artifacts/.
"""

import struct

import pytest

from ddprof.ab_results import read_ab
from ddprof.attribution import OWNERS
from ddprof.dashboards.headline import headline
from ddprof.dashboards.page import FIGURES, write_dashboard
from ddprof.dashboards.runs import load_runs
from tests.ddprof import known_runs
from tests.ddprof.browser import keep_artifact, open_page
from tests.ddprof.test_ab_results import write_ab


# Per figure, the colour plotly drew each shown trace in (its full, defaulted data), by trace name.
DRAWN_COLOURS = ("Object.fromEntries(Array.from(document.querySelectorAll('div.plotly-graph-div'), gd => [gd.id, "
                 "gd._fullData.filter(t => t.visible === true).map(t => [t.name, (t.marker && t.marker.color) || (t.line && t.line.color)])]))")


def check_page(report, runs, evidence=()) -> None:
    """What every dashboard must show in a browser; shared with the real-capture test."""
    assert report.console_errors == []
    assert report.requests == []  # nothing fetched: the page is self-contained
    assert [plot["id"] for plot in report.plots] == list(FIGURES)
    for plot in report.plots:
        assert plot["svg"] > 0 and plot["width"] > 0 and plot["height"] > 0, plot
        assert plot["visible_traces"] > 0 and plot["rendered_traces"] >= plot["visible_traces"], plot
        assert plot["marks"] > 0, plot  # bars, lines, boxes actually drawn
    assert report.headline == headline(runs, evidence)


def png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("page")
    runs = load_runs([known_runs.write(folder, "cpu"), known_runs.write(folder, "gpu"),
                      known_runs.write(folder, "gpu", name="bare", with_meta=False)])
    evidence = [read_ab(write_ab(folder / "builder_ab_tiny_c2.json", [1.0, 1.1, 0.9, 1.05]))]
    return runs, evidence, write_dashboard(runs, folder / "known.html", evidence=evidence)


def test_the_page_renders_every_figure_without_errors(page, tmp_path):
    runs, evidence, html = page
    report = open_page(html, tmp_path / "dashboard-known-runs.png", evaluate={"colours": DRAWN_COLOURS})
    check_page(report, runs, evidence)
    # The headline a reader sees answers the question with the A/B, then what bounds the step.
    assert report.headline.startswith("GPU builder / CPU heapq tok/s: tiny c=2: 1.02x, paired A/B of 4 rounds, "
                                      "95% CI ")
    assert "Projected, CPU heapq with the GPU builder's tree_build cost: tiny c=2 +25.0%" in report.headline
    assert report.headline.endswith("verify bounds tok/s in GPU builder (50% of step time) and bare (50%); "
                                    "tree_build bounds tok/s in CPU heapq (50% of step time).")
    by_id = {plot["id"]: plot for plot in report.plots}
    assert by_id["step-share"]["traces"] == 7  # one per owner of step time, each with a bar per run
    assert by_id["step-share"]["marks"] >= 7 * len(runs)
    # One colour per stage on every figure that draws stages; the tok/s lines use none of them.
    drawn = report.values["colours"]
    colour_of = {}
    for figure in ("step-share", "step-timeline", "per-step-distributions"):
        for name, colour in drawn[figure]:
            if name in OWNERS:
                assert colour_of.setdefault(name, colour) == colour, (figure, name, colour)
    assert set(colour_of) == set(OWNERS) and len(set(colour_of.values())) == len(OWNERS)
    assert not {colour for _, colour in drawn["tok-per-s"]} & set(colour_of.values())
    width, height = png_size(keep_artifact(report.screenshot))
    assert width == 1400 and height > 1500  # the whole page, not just the first screen


def test_a_console_error_would_be_caught(tmp_path):
    """The check is live: a page that logs an error and throws is reported."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('broken figure'); undefinedFunction();</script></body></html>")
    report = open_page(bad, tmp_path / "bad.png")
    assert report.console_errors[0] == "console.error: broken figure"
    assert "undefinedFunction is not defined" in report.console_errors[1]
    assert report.plots == []
