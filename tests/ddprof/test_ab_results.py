"""A/B result files as evidence (ddprof.ab_results): the committed ones read as the verdicts their
script wrote, serving and decode steps apart; a bad one is one line naming it."""

import json
import re
from pathlib import Path

import pytest

from ddprof.ab_results import read_ab
from ddprof.errors import DdprofError

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# benchmark -> (the field naming a row's variant, variant A, variant B), as benchmarks/serving_ab.py writes them
VARIANTS = {"builder_ab": ("builder", "cpu", "gpu"), "cuda_graphs_ab": ("execution", "eager", "graphs"),
            "prefill_ab": ("prefill", "one-by-one", "batched")}


def write_ab(path, ratios, *, decode_ratios=None, benchmark="builder_ab", **settings):
    """An A/B result file as benchmarks/serving_ab.py writes it, with these paired B/A tok/s ratios
    (and, given `decode_ratios`, decode-step ratios, whose verdict comes first in the file, as it
    would if a script wrote it first)."""
    field, a, b = VARIANTS[benchmark]
    decode = decode_ratios or [None] * len(ratios)
    rows = [row for round_, (ratio, step_ratio) in enumerate(zip(ratios, decode, strict=True)) for row in (
        {"round": round_, field: a, "tokens": 10, "steps": 5, "wall_s": 1.0, "tok_per_s": 100.0,
         **({} if step_ratio is None else {"decode_tok_per_s": 400.0})},
        {"round": round_, field: b, "tokens": 10, "steps": 5, "wall_s": 1 / ratio, "tok_per_s": 100.0 * ratio,
         **({} if step_ratio is None else {"decode_tok_per_s": 400.0 * step_ratio})})]
    verdicts = {f"paired_decode_{b}_over_{a}": {}} if decode_ratios else {}
    path.write_text(json.dumps({"benchmark": benchmark, "machine": {}, "settings": {
        "model": "tiny", "workload": "chat", "concurrency": 2, "budget": 8, "device": "cuda", **settings},
        "runs": rows, **verdicts, f"paired_{b}_over_{a}": {}}))
    return path


def test_the_committed_ab_files_read_as_their_verdicts():
    paths = sorted(RESULTS.glob("*_ab_*.json"))
    assert {path.name.rsplit("_ab_", 1)[0] for path in paths} >= {"builder", "cuda_graphs", "moe_dispatch"}
    for path in paths:
        ab, data = read_ab(path), json.loads(path.read_text())
        timed = [(ab.serving, data[f"paired_{ab.b}_over_{ab.a}"])]
        if ab.decode is not None:
            timed.append((ab.decode, data[f"paired_decode_{ab.b}_over_{ab.a}"]))
        assert (ab.decode is None) == ("decode_tok_per_s" not in data["runs"][0]), path
        for paired, verdict in timed:
            assert paired.median == pytest.approx(verdict["median"], rel=1e-12), path
            assert paired.rounds == verdict["rounds"]
            assert min(paired.ratios) == pytest.approx(verdict["min"]) and max(paired.ratios) == pytest.approx(verdict["max"])
            assert verdict["min"] <= paired.ci[0] <= paired.median <= paired.ci[1] <= verdict["max"]


def test_graphs_ab_and_builder_ab_name_their_variants_and_execution():
    graphs = read_ab(RESULTS / "cuda_graphs_ab_small_c64.json")
    assert (graphs.benchmark, graphs.a, graphs.b, graphs.names()) == (
        "cuda_graphs_ab", "eager", "graphs", ("eager", "CUDA graphs"))
    assert graphs.execution is None  # it ran both ways
    assert graphs.decode.median > graphs.serving.median > 1  # prefill (eager either way) dilutes the serving ratio
    assert read_ab(RESULTS / "builder_ab_small_c64_graphs.json").execution == "CUDA graphs"
    older = read_ab(RESULTS / "builder_ab_small_c64.json")  # no cuda_graphs, no decode timing: before either
    assert older.execution == "eager" and older.decode is None


@pytest.mark.parametrize("benchmark", VARIANTS)
def test_the_serving_verdict_is_picked_by_name_not_by_order(tmp_path, benchmark):
    # paired_decode_B_over_A comes first in the file; the verdict that names the variants is paired_B_over_A.
    path = write_ab(tmp_path / "ab.json", [1.0, 1.1, 1.2], decode_ratios=[1.5, 1.6, 1.7], benchmark=benchmark)
    _, a, b = VARIANTS[benchmark]
    assert next(key for key in json.loads(path.read_text()) if key.startswith("paired_")) == f"paired_decode_{b}_over_{a}"
    ab = read_ab(path)
    assert (ab.benchmark, ab.a, ab.b) == (benchmark, a, b)
    assert ab.serving.ratios == pytest.approx((1.0, 1.1, 1.2)) and ab.decode.ratios == pytest.approx((1.5, 1.6, 1.7))
    assert ab.decode.median == pytest.approx(1.6) and ab.decode.ci[0] <= 1.6 <= ab.decode.ci[1]


def rewrite(path, change) -> str:
    data = json.loads(path.read_text())
    change(data)
    return json.dumps(data)


def _set_run(index, key, value):
    return lambda data: data["runs"][index].__setitem__(key, value)


def _drop_from_run(index, key):
    return lambda data: data["runs"][index].pop(key)


def _valid(tmp_path, decode=True):
    return write_ab(tmp_path / "valid.json", [1.0, 1.1], decode_ratios=[1.2, 1.3] if decode else None)


@pytest.mark.parametrize("content, problem", [
    ("{not json", "unreadable A/B result"),
    ('{"benchmark": "nvtx_overhead"}', "not an A/B result file"),
    ('{"benchmark": "builder_ab", "settings": {}, "runs": []}', "needs `settings` (an object) and `runs`"),
    ('{"benchmark": "builder_ab", "settings": {}, "runs": [{"round": 0, "builder": "cpu", "tok_per_s": -1}]}',
     "`tok_per_s` (a positive number)"),
    ('{"benchmark": "builder_ab", "settings": {}, "paired_gpu_over_cpu": {}, "runs": [{"round": 0, "builder": "cpu", '
     '"tok_per_s": 1}, {"round": 0, "builder": "gpu", "tok_per_s": 1}, {"round": 1, "builder": "gpu", "tok_per_s": 1}]}',
     "round 1 lacks one of the two builders"),
    ('{"benchmark": "builder_ab", "settings": {}, "paired_decode_gpu_over_cpu": {}, "runs": [{"round": 0, "builder": '
     '"cpu", "tok_per_s": 1}, {"round": 0, "builder": "gpu", "tok_per_s": 1}]}',
     "named by its `paired_B_over_A` verdict; found builders cpu, gpu and 0 such verdicts"),
    ('{"benchmark": "cuda_graphs_ab", "settings": {}, "paired_graphs_over_eager": {}, "runs": [{"round": 0, '
     '"builder": "gpu", "tok_per_s": 1}]}', "every run needs `round` (a whole number), `execution` (a string)"),
])
def test_a_bad_ab_file_is_one_line_naming_it(tmp_path, content, problem):
    path = tmp_path / "ab.json"
    path.write_text(content)
    with pytest.raises(DdprofError, match=f"^{path}: .*{re.escape(problem)}") as raised:
        read_ab(path)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("change, problem", [
    (_set_run(1, "decode_tok_per_s", -3.0), "and `decode_tok_per_s` (a positive number)"),
    (_set_run(2, "decode_tok_per_s", "fast"), "and `decode_tok_per_s` (a positive number)"),
    (_set_run(0, "decode_tok_per_s", True), "and `decode_tok_per_s` (a positive number)"),
    (_set_run(3, "decode_tok_per_s", None), "and `decode_tok_per_s` (a positive number)"),
    (_drop_from_run(2, "decode_tok_per_s"), "run 2 lacks `decode_tok_per_s` that other runs have"),
    (lambda data: data["settings"].__setitem__("cuda_graphs", "yes"), "settings `cuda_graphs` must be true, false"),
    (lambda data: data["settings"].__setitem__("cuda_graphs", 1), "settings `cuda_graphs` must be true, false"),
])
def test_bad_decode_rates_and_executions_are_one_line_naming_the_file(tmp_path, change, problem):
    path = tmp_path / "ab.json"
    path.write_text(rewrite(_valid(tmp_path), change))
    with pytest.raises(DdprofError, match=f"^{path}: .*{re.escape(problem)}") as raised:
        read_ab(path)
    assert "\n" not in str(raised.value)


def test_non_finite_decode_rates_are_refused(tmp_path):
    path = tmp_path / "ab.json"
    path.write_text(rewrite(_valid(tmp_path), _set_run(1, "decode_tok_per_s", float("nan"))))  # json writes NaN
    with pytest.raises(DdprofError, match=f"^{path}: .*`decode_tok_per_s` \\(a positive number\\)"):
        read_ab(path)
    assert read_ab(_valid(tmp_path, decode=False)).decode is None
