"""`ddprof dashboard` as a user runs it: the file it writes, --json, the default path, bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import plotly
from plotly.offline import get_plotlyjs

from ddprof.dashboards.page import FIGURES
from tests.ddprof import known_runs
from tests.ddprof.test_ab_results import write_ab

ROOT = Path(__file__).resolve().parents[2]


def ddprof(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)


def test_json_names_the_page_its_headline_and_each_runs_numbers(tmp_path):
    traces = [known_runs.write(tmp_path, "gpu"), known_runs.write(tmp_path, "cpu")]
    out = tmp_path / "pages" / "pair.html"
    done = ddprof("dashboard", *traces, "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["dashboard"] == str(out)
    assert result["headline"].endswith("tree_build bounds tok/s in CPU heapq (50% of step time); "
                                       "verify bounds tok/s in GPU builder (50% of step time).")
    assert result["headline"].startswith("GPU builder / CPU heapq tok/s: tiny c=2: 1.00x from single captures")
    assert result["replaced"] is False and result["ab_results"] == []
    assert [(r["label"], r["bound_by"], r["bound_by_crit_share"], r["steps"]) for r in result["runs"]] == [
        ("CPU heapq", "tree_build", 0.5, 2), ("GPU builder", "verify", 0.5, 2)]
    page = out.read_text()
    assert page.count(get_plotlyjs()[:500]) == 1  # plotly's JavaScript, embedded once
    assert "<script src=" not in page and 'src="http' not in page  # opens offline
    for name in FIGURES:
        assert f'id="{name}"' in page
    assert [p.name for p in out.parent.iterdir()] == ["pair.html"]  # no partial file left behind


def test_the_default_page_is_named_after_the_folder_of_the_traces(tmp_path):
    folder = tmp_path / "sweep-42"
    folder.mkdir()
    traces = [known_runs.write(folder, "cpu"), known_runs.write(folder, "gpu")]
    done = ddprof("dashboard", *traces, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dashboards" / "sweep-42.html").is_file()
    assert "tree_build bounds tok/s in CPU heapq" in done.stdout and "dashboards/sweep-42.html" in done.stdout
    done = ddprof("dashboard", traces[0], cwd=tmp_path)
    assert (tmp_path / "dashboards" / "known-cpu.html").is_file()
    assert "replaced" not in done.stdout
    done = ddprof("dashboard", traces[1], traces[0], cwd=tmp_path)  # the same folder again: said, not silent
    assert done.returncode == 0, done.stderr
    assert "dashboards/sweep-42.html (replaced the page that was there; --out names another)" in done.stdout


def test_ab_result_files_are_evidence_the_headline_quotes(tmp_path):
    traces = [known_runs.write(tmp_path, "gpu"), known_runs.write(tmp_path, "cpu")]
    ab = write_ab(tmp_path / "builder_ab_tiny_c2.json", [1.0, 1.1, 0.9])
    moe = ROOT / "benchmarks" / "results" / "moe_dispatch_ab_small_c64.json"
    graphs = ROOT / "benchmarks" / "results" / "cuda_graphs_ab_small_c64.json"
    done = ddprof("dashboard", *traces, ab, moe, graphs, "--out", tmp_path / "x.html", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(a["benchmark"], a["b_over_a"], a["execution"], a["rounds"]) for a in result["ab_results"]] == [
        ("builder_ab", "gpu/cpu", "eager", 3), ("moe_dispatch_ab", "sorted/per-expert", "eager", 8),
        ("cuda_graphs_ab", "graphs/eager", None, 6)]
    assert [a["decode_median_ratio"] is None for a in result["ab_results"]] == [True, True, False]
    decode = json.loads(graphs.read_text())["paired_decode_graphs_over_eager"]["median"]
    assert result["ab_results"][2]["decode_median_ratio"] == decode
    assert result["ab_results"][2]["decode_ci95"][0] <= decode <= result["ab_results"][2]["decode_ci95"][1]
    assert "execution: CUDA graphs / eager tok/s, small c=64 (GPU builder): serving 1.34x" in result["headline"]
    assert [r["execution"] for r in result["runs"]] == ["eager", "eager"]
    assert "tiny c=2: 1.00x, paired A/B of 3 rounds" in result["headline"]
    assert "moe dispatch: sorted / per-expert tok/s, small c=64 (GPU builder, eager): 1.12x, paired A/B of 8 rounds" in result["headline"]
    assert [r["label"] for r in result["runs"]] == ["CPU heapq", "GPU builder"]  # A/B files are not runs
    done = ddprof("dashboard", ab, "--out", tmp_path / "y.html")
    assert done.returncode == 2 and "no traces given" in done.stderr and done.stderr.count("\n") == 1
    not_ab = tmp_path / "known-cpu.json"  # a capture's metadata is not an A/B
    done = ddprof("dashboard", traces[0], not_ab, "--out", tmp_path / "y.html")
    assert done.returncode == 2 and done.stderr.startswith(f"ddprof: error: {not_ab}: not an A/B result file")


def test_plotly_js_inline_cdn_or_a_shared_file(tmp_path):
    trace = known_runs.write(tmp_path, "cpu")
    inline = tmp_path / "inline.html"
    assert ddprof("dashboard", trace, "--out", inline).returncode == 0
    cdn = tmp_path / "cdn.html"
    assert ddprof("dashboard", trace, "--out", cdn, "--plotly", "cdn").returncode == 0
    assert f'<script src="https://cdn.plot.ly/plotly-{plotly.__version__}.min.js"' in cdn.read_text()
    linked = tmp_path / "pages" / "linked.html"
    done = ddprof("dashboard", trace, "--out", linked, "--plotly", tmp_path / "js" / "plotly.min.js")
    assert done.returncode == 0, done.stderr
    assert '<script src="../js/plotly.min.js"' in linked.read_text()
    assert (tmp_path / "js" / "plotly.min.js").read_text() == get_plotlyjs()
    assert get_plotlyjs()[:500] not in linked.read_text() and get_plotlyjs()[:500] not in cdn.read_text()
    assert linked.stat().st_size < inline.stat().st_size / 10


def test_a_missing_trace_is_one_line_and_exit_code_2(tmp_path):
    done = ddprof("dashboard", tmp_path / "nope.sqlite", "--out", tmp_path / "x.html")
    assert done.returncode == 2
    assert done.stderr.strip() == f"ddprof: error: {tmp_path / 'nope.sqlite'}: no such file"
    assert not (tmp_path / "x.html").exists()


def test_bad_options_are_one_line_errors(tmp_path):
    trace = known_runs.write(tmp_path, "cpu")
    done = ddprof("dashboard", trace, "--window-steps", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "ddprof: error: --window-steps must be at least 1 (got 0)"
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    done = ddprof("dashboard", trace, "--out", blocker / "page.html")
    assert done.returncode == 2
    assert done.stderr.strip() == f"ddprof: error: {blocker}: the dashboard's folder is a file"
    for out in (tmp_path, ""):
        done = ddprof("dashboard", trace, "--out", out)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "the dashboard must be a file path" in done.stderr
    done = ddprof("dashboard", trace, tmp_path / "." / trace.name, "--out", tmp_path / "x.html")
    assert done.returncode == 2 and "given more than once" in done.stderr


def test_a_window_longer_than_the_run_shows_the_whole_run(tmp_path):
    trace = known_runs.write(tmp_path, "cpu")
    done = ddprof("dashboard", trace, "--out", tmp_path / "x.html", "--window-steps", "99999999999999999999")
    assert done.returncode == 0, done.stderr


def test_same_named_traces_in_two_folders_get_distinct_labels(tmp_path):
    traces = []
    for folder, kind in (("a", "cpu"), ("b", "gpu")):
        (tmp_path / folder).mkdir()
        traces.append(known_runs.write(tmp_path / folder, kind, name="run", with_meta=False))  # labelled by file name
    done = ddprof("dashboard", *traces, "--out", tmp_path / "x.html", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["label"] for r in json.loads(done.stdout)["runs"]] == [f"run ({tmp_path / 'a'})", f"run ({tmp_path / 'b'})"]
