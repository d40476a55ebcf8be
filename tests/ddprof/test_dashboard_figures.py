"""The dashboard's figures and headline on runs with known breakdowns (tests/ddprof/known_runs.py).

Every number a figure draws is checked twice: against the hand-computed answer, and against the
breakdown (ddprof.analysis) it must come from.
"""

import json

import numpy as np
import pytest
from plotly.utils import PlotlyJSONEncoder

from ddprof.attribution import OWNERS
from ddprof.dashboards.distributions import box_statistics, distributions_figure
from ddprof.dashboards.headline import headline
from ddprof.dashboards.runs import load_runs, notes, read_metadata
from ddprof.dashboards.step_share import step_share_figure
from ddprof.dashboards.throughput import PROJECTION_NAME, throughput_figure
from ddprof.dashboards.timeline import GPU_LANE, timeline_figure, window
from ddprof.errors import DdprofError
from ddprof.projection import tok_per_s_with_stage_cost_of
from engine.stages import STAGES
from tests.ddprof import known_runs
from tests.ddprof.known_runs import KERNEL, KERNEL_NAME, SHARES, STEP, STEPS, TOKENS_PER_STEP, U


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The CPU-heapq and GPU-builder known runs, same settings."""
    folder = tmp_path_factory.mktemp("known")
    return load_runs([known_runs.write(folder, "gpu"), known_runs.write(folder, "cpu")])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The known pair at concurrency 1 and 2 and budgets 8 and 16 (the same traces, relabelled by metadata)."""
    folder = tmp_path_factory.mktemp("sweep")
    paths = [known_runs.write(folder, builder, name=f"{builder}-c{c}-b{b}", meta={"concurrency": c, "budget": b})
             for b in (16, 8) for c in (2, 1) for builder in ("gpu", "cpu")]
    return load_runs(paths)


def test_bar_heights_equal_the_shares(pair):
    figure = step_share_figure(pair)
    assert [trace.name for trace in figure.data] == list(OWNERS)
    order = [run.builder for run in pair]
    for trace in figure.data:
        assert list(trace.x) == ["CPU heapq", "GPU builder"]  # the pair side by side, CPU heapq first
        for bar, height in zip(trace.x, trace.y):
            run = pair[order.index(bar)]
            assert height == pytest.approx(SHARES[run.setting("builder")][trace.name], abs=1e-12)
            expected = (run.summary["other_crit_share"] if trace.name == "other" else
                        next(s["crit_share"] for s in run.summary["stages"] if s["stage"] == trace.name))
            assert height == expected
    assert np.sum([trace.y for trace in figure.data], axis=0) == pytest.approx([1, 1])
    assert figure.layout.title.text == "Step share per stage (crit_share) · budget=8 · concurrency=2"


def test_hover_shows_ms_per_step_cpu_ms_and_gpu_ms(pair):
    tree_build = next(trace for trace in step_share_figure(pair).data if trace.name == "tree_build")
    cpu_heapq, gpu_builder = tree_build.customdata
    assert cpu_heapq[0] == pytest.approx(500 * U / 1e6)  # ms per step on the critical path
    assert cpu_heapq[1:] == ["10.00", "n/a", "CPU heapq", "n/a", "n/a"]  # no GPU activity: no gpu_ms, ops, waits
    assert gpu_builder[0] == pytest.approx(300 * U / 1e6)
    gpu_ms = STEPS * (KERNEL[1] - KERNEL[0]) / 1e6
    # One kernel launched in each step's tree_build, no waiting call.
    assert gpu_builder[1:] == [f"{STEPS * 100 * U / 1e6:.2f}", f"{gpu_ms:.2f}", "GPU builder", "1.0", "0.0"]
    assert "ms per step" in tree_build.hovertemplate and "cpu_ms" in tree_build.hovertemplate
    assert "gpu_ms" in tree_build.hovertemplate


def test_a_sweep_is_faceted_by_budget_and_concurrency(sweep):
    figure = step_share_figure(sweep)
    titles = [a.text for a in figure.layout.annotations]
    assert titles == [f"budget={b} · concurrency={c}" for b in (8, 16) for c in (1, 2)]
    assert len(figure.data) == 4 * len(OWNERS)
    for trace in figure.data:
        assert list(trace.x) == ["CPU heapq", "GPU builder"]
        assert list(trace.y) == pytest.approx([SHARES["cpu"][trace.name], SHARES["gpu"][trace.name]])
    assert sum(trace.showlegend for trace in figure.data) == len(OWNERS)  # one legend entry per stage


def test_tok_per_s_lines_per_builder_and_the_projection_beside_them(sweep):
    figure = throughput_figure(sweep)
    lines = {trace.name: trace for trace in figure.data}
    measured = [name for name in lines if "projected" not in name]
    assert sorted(measured) == ["CPU heapq · budget=16", "CPU heapq · budget=8", "GPU builder · budget=16",
                                "GPU builder · budget=8"]
    wall_s = STEPS * STEP / 1e9
    tokens = STEPS * TOKENS_PER_STEP
    for name in measured:
        assert list(lines[name].x) == [1, 2]
        assert list(lines[name].y) == pytest.approx([tokens / wall_s] * 2)
    # Freeing tree_build (500 U per step) saves 1000 U of wall; the GPU builder keeps 300/500 of it.
    projected = tokens / (wall_s - (STEPS * 500 * U / 1e9) * (1 - 300 / 500))
    for budget in (8, 16):
        line = lines[f"{PROJECTION_NAME} · budget={budget}"]
        assert list(line.x) == [1, 2] and list(line.y) == pytest.approx([projected] * 2)
        assert line.line.dash == "dash"
    assert figure.layout.yaxis.type == "linear"  # rates within 10x of each other


def test_the_projection_is_the_runs_own_what_if_when_the_costs_agree(pair):
    gpu, cpu = sorted(pair, key=lambda run: run.builder != "GPU builder")
    assert tok_per_s_with_stage_cost_of(cpu.summary, cpu.summary, "tree_build") == pytest.approx(cpu.summary["tok_per_s"])
    free = next(s for s in cpu.summary["stages"] if s["stage"] == "accept")["what_if"]["tok_per_s_if_free"]
    assert tok_per_s_with_stage_cost_of(cpu.summary, gpu.summary, "draft") == pytest.approx(cpu.summary["tok_per_s"])
    # accept costs 50 U per step in both runs: no change; a donor that never runs the stage gives "if free"
    donor = {**gpu.summary, "stages": [{**s, "crit_ms": 0.0} for s in gpu.summary["stages"]]}
    assert tok_per_s_with_stage_cost_of(cpu.summary, donor, "accept") == pytest.approx(free)


def test_timeline_lanes_hold_the_stage_ranges_and_the_gpu_lane_the_kernels(pair):
    gpu_run = next(run for run in pair if run.builder == "GPU builder")
    shown = window(gpu_run, steps=STEPS)
    assert shown.start == 0 and shown.end == STEPS * STEP
    assert shown.gpu_busy_share == pytest.approx((KERNEL[1] - KERNEL[0]) / STEP)
    figure = timeline_figure([gpu_run], steps=STEPS)
    tree_build = next(trace for trace in figure.data if trace.name == "tree_build")
    assert list(tree_build.y) == ["tree_build"] * STEPS + [GPU_LANE] * STEPS
    starts = [s * STEP / 1e6 for s in range(STEPS)]
    assert list(tree_build.base) == pytest.approx([t + 100 * U / 1e6 for t in starts] + [t + KERNEL[0] / 1e6 for t in starts])
    assert list(tree_build.x) == pytest.approx([100 * U / 1e6] * STEPS + [(KERNEL[1] - KERNEL[0]) / 1e6] * STEPS)
    assert all(KERNEL_NAME in text for text in tree_build.hovertext[STEPS:])
    lanes = {lane for trace in figure.data for lane in trace.y}
    assert lanes == {"step", *STAGES, GPU_LANE}
    assert "GPU busy 25% of the window" in figure.layout.title.text


def test_prefills_get_their_own_lane(tmp_path):
    trace = known_runs.export("cpu")
    trace.range("prefill", 990 * U, 1000 * U)  # admitting a request in step 0's last 10 U
    run = load_runs([trace.write(tmp_path / "prefill.sqlite")])[0]
    assert run.prefills.height == 1
    prefill = next(trace for trace in timeline_figure([run], steps=STEPS).data if trace.name == "prefill")
    assert list(prefill.y) == ["prefill"]
    assert list(prefill.base) == pytest.approx([990 * U / 1e6]) and list(prefill.x) == pytest.approx([10 * U / 1e6])


def test_timeline_window_is_consecutive_steps_from_the_middle(pair):
    shown = window(pair[0], steps=1)
    assert shown.steps["step_id"].to_list() == [0] and shown.stage_ranges.height == len(STAGES)
    assert window(pair[0], steps=50).steps.height == STEPS


def test_timeline_menu_switches_runs(pair):
    figure = timeline_figure(pair)
    assert [button.label for button in figure.layout.updatemenus[0].buttons] == [run.label for run in pair]
    first_run = [trace.visible for trace in figure.data]
    assert first_run.count(True) and first_run.count(False)

    def content(traces):
        return [json.dumps({key: value for key, value in trace.to_plotly_json().items() if key != "visible"},
                           cls=PlotlyJSONEncoder, sort_keys=True) for trace in traces]

    for run, button in zip(pair, figure.layout.updatemenus[0].buttons):
        mask = button.args[0]["visible"]
        assert len(mask) == len(figure.data)
        # the button shows exactly the traces of this run's own timeline, and its caption
        assert content(t for t, shown in zip(figure.data, mask) if shown) == content(timeline_figure([run]).data)
        assert button.args[1]["title.text"].endswith(f"<sub>{timeline_figure([run]).layout.title.text.split('<sub>')[1]}")


def test_a_cpu_trace_keeps_an_empty_gpu_lane(pair):
    cpu_run = next(run for run in pair if run.builder == "CPU heapq")
    figure = timeline_figure([cpu_run])
    assert GPU_LANE in {lane for trace in figure.data for lane in trace.y}
    assert "no GPU activity in this trace" in figure.layout.title.text
    stage_hovers = [text for trace in figure.data if trace.name in STAGES for text in trace.hovertext]
    assert stage_hovers and all(text.endswith("no GPU traced") for text in stage_hovers)  # not "0.000 ms waiting"


def test_distributions_agree_with_the_breakdowns_percentiles(pair):
    figure = distributions_figure(pair)
    assert [trace.name for trace in figure.data] == [run.label for run in pair]
    for trace, run in zip(figure.data, pair):
        assert list(trace.x) == list(STAGES)
        p50 = [s["per_step"]["crit_ms"]["p50"] for s in run.summary["stages"]]
        assert list(trace.median) == pytest.approx(p50)
        stats = box_statistics(run)
        assert stats["lowerfence"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["upperfence"]
    tree_build = STAGES.index("tree_build")
    cpu = next(t for t, r in zip(figure.data, pair) if r.builder == "CPU heapq")
    assert cpu.median[tree_build] == pytest.approx(500 * U / 1e6)


def test_headline_names_the_bounding_stage_of_each_run(pair, sweep):
    assert headline(pair) == ("tree_build bounds tok/s in CPU heapq (50% of step time); "
                              "verify bounds tok/s in GPU builder (50% of step time).")
    one = [run for run in pair if run.builder == "CPU heapq"]
    assert headline(one) == ("tree_build bounds tok/s in CPU heapq: 50% of step time (5 of 10 ms per step on the "
                             "critical path), at 300.00 tok/s.")
    text = headline(sweep)
    assert text.startswith("tree_build bounds tok/s in CPU heapq · c=1 · budget=8 (50% of step time), ")
    assert text.count("tree_build bounds") == 1 and text.count("verify bounds") == 1


def test_same_stage_everywhere_says_every_run(tmp_path):
    runs = load_runs([known_runs.write(tmp_path, "cpu", name="a"), known_runs.write(tmp_path, "cpu", name="b")])
    assert headline(runs) == ("tree_build bounds tok/s in every run: CPU heapq (a) (50% of step time) "
                              "and CPU heapq (b) (50%).")


def test_a_trace_without_metadata_is_labelled_by_file_name_and_said_unknown(tmp_path):
    runs = load_runs([known_runs.write(tmp_path, "cpu"), known_runs.write(tmp_path, "gpu", name="bare",
                                                                          with_meta=False)])
    assert [run.label for run in runs] == ["CPU heapq", "bare"]
    assert runs[1].builder == "unknown"
    assert any(n.startswith("bare: no bare.json beside the trace") for n in notes(runs))
    assert [trace.name for trace in throughput_figure(runs).data] == ["CPU heapq"]  # no concurrency: not placed
    x = step_share_figure(runs).data[0].x
    assert [list(level) for level in x] == [["budget=8 · concurrency=2", "no metadata"], ["CPU heapq", "bare"]]


def test_metadata_that_disagrees_with_the_trace_is_flagged(tmp_path):
    path = known_runs.write(tmp_path, "cpu", meta={"trace_steps": 99})
    assert any("counts 99 steps but the trace holds 2" in n for n in notes(load_runs([path])))


def test_unreadable_metadata_is_a_one_line_error_naming_the_file(tmp_path):
    path = known_runs.write(tmp_path, "cpu")
    path.with_suffix(".json").write_text("{not json")
    with pytest.raises(DdprofError, match=f"^{path.with_suffix('.json')}: unreadable capture metadata"):
        read_metadata(path)
    path.with_suffix(".json").write_text(json.dumps([1, 2]))
    with pytest.raises(DdprofError, match="must be a JSON object, not list"):
        load_runs([path])


@pytest.mark.parametrize("field, value, kind", [("tok_per_s", "fast", "a number"), ("concurrency", True, "a number"),
                                                ("concurrency", float("nan"), "a number"), ("builder", ["cpu"], "a string")])
def test_metadata_of_the_wrong_type_is_a_one_line_error(tmp_path, field, value, kind):
    path = known_runs.write(tmp_path, "cpu")
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**meta, field: value}))
    with pytest.raises(DdprofError, match=f"capture metadata `{field}` must be {kind} or null"):
        read_metadata(path)


def test_a_report_path_finds_the_metadata_beside_it(tmp_path):
    path = known_runs.write(tmp_path, "gpu")
    assert read_metadata(path.with_suffix(".nsys-rep"))["builder"] == "gpu"
