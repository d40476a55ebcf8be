"""The committed H200 pages of the graphed engine say what their evidence says today: each quotes its
A/B files' current verdicts (serving and decode steps) and shows one pair of runs, both graphed (and
overlapped, with batched prefill, on the overlapped engine's pages). Their exports are
not committed (tests/data holds a trimmed one), so a page cannot be remade here; this catches a page
left behind by a changed result file or headline."""

import html
import re
from pathlib import Path

import pytest

from ddprof.ab_results import read_ab

ROOT = Path(__file__).resolve().parents[2]
GRAPHED, OVERLAPPED = "CUDA graphs", "CUDA graphs, overlapped, batched prefill"
PAGES = {  # page -> the A/B files it was made with (README: "Dashboards"), how its runs ran
    "h200-k2-layer.html": (("builder_ab_k2_c32_graphs.json", "cuda_graphs_ab_k2_c32.json"), GRAPHED),
    "h200-small-graphs.html": (("builder_ab_small_c64_graphs.json", "cuda_graphs_ab_small_c64.json"), GRAPHED),
    "h200-k2-layer-overlap.html": (("builder_ab_k2_c32_overlap.json", "overlap_ab_k2_c32_gpu.json"), OVERLAPPED),
    "h200-small-overlap.html": (("builder_ab_small_c64_overlap.json", "overlap_ab_small_c64_gpu.json"), OVERLAPPED),
}


def _ci(paired) -> str:
    low, high = paired.ci
    return f"95% CI {low:.2f}-{high:.2f}"


@pytest.mark.parametrize("page, evidence, execution", [(page, *made) for page, made in PAGES.items()])
def test_a_graphed_page_quotes_its_ab_files_and_shows_its_runs_only(page, evidence, execution):
    text = (ROOT / "dashboards" / page).read_text(encoding="utf-8")
    headline = html.unescape(re.search(r'<p class="headline" id="headline">(.*?)</p>', text).group(1))
    for name in evidence:
        ab = read_ab(ROOT / "benchmarks" / "results" / name)
        assert (f"serving {ab.serving.median:.2f}x (paired A/B of {ab.serving.rounds} rounds, {_ci(ab.serving)}), "
                f"decode steps {ab.decode.median:.2f}x ({_ci(ab.decode)}) ({name})") in headline
    table = re.search(r'<table class="runs">(.*?)</table>', text).group(1)
    cells = re.findall(r"<td>(CUDA graphs[^<]*|eager[^<]*)</td>", table)
    assert cells == [execution, execution]  # one pair, both run that way
