"""The dashboard's figures and headline on runs with known breakdowns (tests/ddprof/known_runs.py).

Every number a figure draws is checked twice: against the hand-computed answer, and against the
breakdown (ddprof.analysis) it must come from.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from plotly.utils import PlotlyJSONEncoder

from ddprof.ab_results import read_ab
from ddprof.attribution import OWNERS
from ddprof.dashboards.distributions import box_statistics, distributions_figure
from ddprof.dashboards.headline import headline
from ddprof.dashboards.runs import load_runs, notes, read_metadata
from ddprof.dashboards.step_share import step_share_figure
from ddprof.dashboards.palette import STAGE_COLOURS
from ddprof.dashboards.throughput import PROJECTION_NAME, log_ticks, throughput_figure
from ddprof.dashboards.timeline import GPU_LANE, timeline_figure, window
from ddprof.errors import DdprofError
from ddprof.projection import tok_per_s_with_stage_cost_of
from engine.stages import STAGES
from engine.stages import TOKENS_MARK
from tests.ddprof import known_runs
from tests.ddprof.exports import Export
from tests.ddprof.test_ab_results import write_ab
from tests.ddprof.test_graphs import handed_over
from tests.ddprof.known_runs import KERNEL, KERNEL_NAME, SHARES, STEP, STEPS, TOKENS_PER_STEP, U

ROOT = Path(__file__).resolve().parents[2]


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
    assert gpu_builder[1:] == [f"{STEPS * 100 * U / 1e6:.2f}", f"{gpu_ms:.2f}", "GPU builder", "1", "0"]  # not "1.0"
    # per-step means and whole-run totals each under their own words
    assert "per step (mean): %{customdata[0]:.3f} ms on the critical path" in tree_build.hovertemplate
    assert "whole run: %{customdata[1]} ms on the host (cpu_ms)" in tree_build.hovertemplate
    assert "(gpu_ms)" in tree_build.hovertemplate


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
    assert "log" not in figure.layout.yaxis.title.text


def test_builders_differ_by_marker_and_dash_never_by_a_stage_colour(sweep):
    figure = throughput_figure(sweep)
    stage_colours = set(STAGE_COLOURS.values())
    styles = {}
    for trace in figure.data:
        assert trace.line.color not in stage_colours and trace.marker.color not in stage_colours, trace.name
        styles.setdefault((trace.line.dash, trace.marker.symbol), set()).add(trace.name.split(" · ")[0])
    # CPU heapq, GPU builder and the projection: three styles, one kind of line each
    assert sorted(map(sorted, styles.values())) == [["CPU heapq"], [PROJECTION_NAME], ["GPU builder"]]


def test_a_log_axis_says_so_and_its_ticks_read_as_plain_numbers(tmp_path):
    """Rates two orders of magnitude apart (one 100x longer step) and concurrencies 1 and 16: both axes log."""
    slow = Export()
    slow.range("step", 0, 100 * STEP)
    for code, stage in enumerate(STAGES):
        slow.range(stage, code * 10 * STEP, (code + 1) * 10 * STEP)
    slow.mark(TOKENS_MARK, 100 * STEP - U, TOKENS_PER_STEP)
    cpu = slow.write(tmp_path / "slow.sqlite")
    known_meta = json.loads(known_runs.write(tmp_path, "cpu").with_suffix(".json").read_text())
    cpu.with_suffix(".json").write_text(json.dumps({**known_meta, "concurrency": 1, "trace_steps": 1}))
    gpu = known_runs.write(tmp_path, "gpu", name="fast", meta={"concurrency": 16})
    figure = throughput_figure(load_runs([cpu, gpu]))
    assert figure.layout.yaxis.type == "log" and figure.layout.yaxis.title.text.endswith(", log scale")
    assert figure.layout.xaxis.type == "log" and figure.layout.xaxis.title.text.endswith(", log scale")
    ticks = list(figure.layout.yaxis.tickvals)
    assert list(figure.layout.yaxis.ticktext) == [f"{tick:g}" for tick in ticks]
    rates = [y for trace in figure.data for y in trace.y]
    assert ticks[0] <= min(rates) and ticks[-1] >= max(rates) and len(ticks) <= 3 * 3 + 1


def test_log_ticks_are_1_2_5_steps_covering_the_range():
    assert log_ticks(5.3, 870) == [5, 10, 20, 50, 100, 200, 500, 1000]
    assert log_ticks(100, 1000) == [100, 200, 500, 1000]
    assert log_ticks(0.12, 3) == pytest.approx([0.1, 0.2, 0.5, 1, 2, 5])


def test_no_projection_is_drawn_from_interpreter_times(tmp_path):
    """A GPU-builder run captured on a CPU ran its kernel in Triton's interpreter: no projection."""
    runs = load_runs([known_runs.write(tmp_path, "cpu", meta={"device": "cpu: x86_64 (2 cores)"}),
                      known_runs.write(tmp_path, "gpu", meta={"device": "cpu: x86_64 (2 cores)"})])
    figure = throughput_figure(runs)
    assert [trace.name for trace in figure.data] == ["CPU heapq", "GPU builder"]
    assert "no projection" in figure.layout.annotations[0].text and "interpreter" in figure.layout.annotations[0].text


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
    assert f"steps 0–1 ({STEPS} of the run's {STEPS} steps)" in figure.layout.title.text
    assert "step 0 (1 of the run's 2 steps)" in timeline_figure([gpu_run], steps=1).layout.title.text  # not "0–0"


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


def test_distributions_are_one_plot_per_stage_in_the_stage_colour(pair):
    figure = distributions_figure(pair)
    assert [trace.name for trace in figure.data] == list(STAGES)
    assert [a.text for a in figure.layout.annotations] == list(STAGES)  # each small plot titled by its stage
    assert len({trace.yaxis for trace in figure.data}) == len(STAGES)  # each on its own scale
    for code, trace in enumerate(figure.data):
        assert trace.marker.color == STAGE_COLOURS[trace.name]
        assert list(trace.x) == [run.label for run in pair]
        p50 = [run.summary["stages"][code]["per_step"]["crit_ms"]["p50"] for run in pair]
        assert list(trace.median) == pytest.approx(p50)
    for run in pair:
        stats = box_statistics(run)
        assert stats["lowerfence"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["upperfence"]
    tree_build = figure.data[STAGES.index("tree_build")]
    cpu = [run.builder for run in pair].index("CPU heapq")
    assert tree_build.median[cpu] == pytest.approx(500 * U / 1e6)


def test_one_colour_per_stage_in_the_bars_timeline_and_distributions(pair):
    """A colour means one owner of step time on every figure; GPU ops outside every stage range are `other`."""
    gpu_run = next(run for run in pair if run.builder == "GPU builder")
    for figure in (step_share_figure(pair), timeline_figure(pair), distributions_figure(pair)):
        for trace in figure.data:
            if trace.name in OWNERS:
                assert trace.marker.color == STAGE_COLOURS[trace.name], (figure.layout.title.text, trace.name)
    assert gpu_run.builder == "GPU builder"


def test_a_gpu_op_launched_outside_every_stage_is_other_in_the_timeline_as_in_the_bars(tmp_path):
    trace = known_runs.export("gpu")
    trace.kernel(995 * U, 998 * U, launch=(991 * U, 992 * U), name="stray")  # launched after sampling ended
    run = load_runs([trace.write(tmp_path / "stray.sqlite")])[0]
    other = next(t for t in timeline_figure([run], steps=STEPS).data if t.name == "other")
    assert list(other.y) == [GPU_LANE] and other.marker.color == STAGE_COLOURS["other"]
    assert other.hovertext[0].endswith("launched outside every stage range")
    assert all(t.name != "unattributed" for t in timeline_figure([run]).data)


def test_the_timeline_draws_a_steps_gpu_work_where_it_runs_after_its_ranges(tmp_path):
    """With the host running ahead (tests/ddprof/test_graphs.py's `handed_over`): step 0's graph
    runs in step 1, step 1's past its end. The window reaches to the end of its steps' work, and
    each op's hover names the step that launched it."""
    run = load_runs([handed_over().write(tmp_path / "ahead.sqlite")])[0]
    first = window(run, steps=1)
    assert (first.start, first.end) == (0, 90)  # step 0 [0, 50), its graph until 90
    assert window(run, steps=2).end == 130
    figure = timeline_figure([run], steps=2)
    draft, verify = (next(t for t in figure.data if t.name == stage) for stage in ("draft", "verify"))
    assert list(draft.y) == ["draft", "draft", GPU_LANE, GPU_LANE]
    assert list(draft.base[2:]) == pytest.approx([60 / 1e6, 75 / 1e6])
    assert all(text.endswith("launched by draft in step 0") for text in draft.hovertext[2:])
    assert list(verify.y) == ["verify", GPU_LANE] and list(verify.base) == pytest.approx([65 / 1e6, 115 / 1e6])
    assert verify.hovertext[1].endswith("launched by verify in step 1")
    assert "GPU busy 35% of the window" in figure.layout.title.text  # (30 + 15) ns of 130


SINGLE = "tiny c=2: 1.00x from single captures, one of each (no interval: not a measured difference)"
PROJECTED = "Projected, CPU heapq with the GPU builder's tree_build cost: tiny c=2 +25.0% (tree_build 5 -> 3 ms per step)."
BOUND = "tree_build bounds tok/s in CPU heapq (50% of step time); verify bounds tok/s in GPU builder (50% of step time)."


def test_headline_answers_with_the_pairs_ratio_the_projection_and_the_bounding_stage(pair, sweep):
    # Both known runs: 6 tokens in 20 ms. Freeing 2 of tree_build's 5 ms per step: 20 / 16 = +25%.
    assert headline(pair) == f"GPU builder / CPU heapq tok/s: {SINGLE}. {PROJECTED} {BOUND}"
    one = [run for run in pair if run.builder == "CPU heapq"]
    assert headline(one) == ("tree_build bounds tok/s in CPU heapq: 50% of step time (5 of 10 ms per step on the "
                             "critical path), at 300.00 tok/s.")
    text = headline(sweep)
    assert text.count("from single captures") == 4  # one clause per pair of the 2 x 2 grid
    assert "tiny c=1 budget=8: 1.00x" in text and "tiny c=2 budget=16: 1.00x" in text
    assert text.count("tree_build bounds") == 1 and text.count("verify bounds") == 1


def test_a_matching_ab_replaces_the_single_capture_verdict(pair, tmp_path):
    ab = read_ab(write_ab(tmp_path / "builder_ab_tiny.json", [1.0, 1.1, 0.9, 1.05, 0.95]))
    assert ab.serving.median == pytest.approx(1.0) and ab.serving.rounds == 5 and ab.decode is None
    low, high = ab.serving.ci
    assert 0.9 <= low < 1.0 < high <= 1.1
    text = headline(pair, [ab])
    assert text.startswith(f"GPU builder / CPU heapq tok/s: tiny c=2: 1.00x, paired A/B of 5 rounds, 95% CI "
                           f"{low:.2f}-{high:.2f} (builder_ab_tiny.json); this page's single captures: 1.00x. ")
    assert "from single captures" not in text
    # An A/B of other settings speaks for no pair: its own clause, the pair stays a single capture.
    other = read_ab(write_ab(tmp_path / "builder_ab_c64.json", [1.2] * 3, concurrency=64))
    text = headline(pair, [other])
    assert f"{SINGLE}; tiny c=64 (eager): 1.20x, paired A/B of 3 rounds, 95% CI 1.20-1.20 (builder_ab_c64.json)." in text


def test_an_ab_that_timed_decode_steps_is_quoted_for_serving_and_decode(pair, tmp_path):
    ab = read_ab(write_ab(tmp_path / "builder_ab_tiny.json", [1.0, 1.02, 0.98], decode_ratios=[1.2, 1.25, 1.15]))
    (low, high), (decode_low, decode_high) = ab.serving.ci, ab.decode.ci
    assert decode_low > high  # the decode steps' gain, undiluted by prefill, stands clear of serving's
    assert headline(pair, [ab]).startswith(
        f"GPU builder / CPU heapq tok/s: tiny c=2: serving 1.00x (paired A/B of 3 rounds, 95% CI {low:.2f}-{high:.2f}), "
        f"decode steps 1.20x (95% CI {decode_low:.2f}-{decode_high:.2f}) (builder_ab_tiny.json); "
        "this page's single captures: 1.00x. ")


def test_a_cuda_graphs_ab_is_its_own_sentence(pair):
    ab = read_ab(ROOT / "benchmarks" / "results" / "cuda_graphs_ab_small_c64.json")
    (low, high), (decode_low, decode_high) = ab.serving.ci, ab.decode.ci
    sentence = (f"execution: CUDA graphs / eager tok/s, small c=64 (GPU builder): serving {ab.serving.median:.2f}x (paired A/B of "
                f"6 rounds, 95% CI {low:.2f}-{high:.2f}), decode steps {ab.decode.median:.2f}x (95% CI "
                f"{decode_low:.2f}-{decode_high:.2f}) (cuda_graphs_ab_small_c64.json).")
    text = headline(pair, [ab])
    assert sentence in text and text.startswith(f"GPU builder / CPU heapq tok/s: {SINGLE}. ")  # no builder pair's A/B


GRAPHED, EAGER = {"cuda_graphs": True}, {"cuda_graphs": False}


@pytest.mark.parametrize("run_meta, ab_settings, matched", [
    (GRAPHED, {"cuda_graphs": True}, True),
    (GRAPHED, {"cuda_graphs": False}, False),
    (GRAPHED, {}, False),  # an A/B file without cuda_graphs ran eager (before graphs existed)
    ({}, {"cuda_graphs": True}, False),  # so did a capture without it
    ({}, {}, True),
    (EAGER, {}, True),
    ({"cuda_graphs": None}, {"cuda_graphs": False}, True),
])
def test_an_ab_speaks_for_a_pair_only_if_both_ran_the_same_way(tmp_path, run_meta, ab_settings, matched):
    runs = load_runs([known_runs.write(tmp_path, builder, meta=run_meta) for builder in ("cpu", "gpu")])
    ab = read_ab(write_ab(tmp_path / "builder_ab_tiny.json", [1.3] * 3, **ab_settings))
    text = headline(runs, [ab])
    assert ("tiny c=2: 1.30x, paired A/B" in text) is matched
    assert (f"{SINGLE}; tiny c=2 ({ab.execution}): 1.30x, paired A/B" in text) is not matched


def test_graphed_and_eager_runs_pair_within_their_execution(tmp_path):
    paths = [known_runs.write(tmp_path, builder, name=f"{builder}-{name}", meta=meta)
             for name, meta in (("graphs", GRAPHED), ("eager", EAGER)) for builder in ("cpu", "gpu")]
    runs = load_runs(paths)
    assert [run.label for run in runs] == ["CPU heapq · CUDA graphs", "GPU builder · CUDA graphs",
                                           "CPU heapq · eager", "GPU builder · eager"]
    graphed = read_ab(write_ab(tmp_path / "builder_ab_graphs.json", [1.3] * 3, cuda_graphs=True))
    eager = read_ab(write_ab(tmp_path / "builder_ab_eager.json", [0.9] * 3))
    text = headline(runs, [eager, graphed])
    assert text.startswith("GPU builder / CPU heapq tok/s: tiny c=2 CUDA graphs: 1.30x, paired A/B of 3 rounds, 95% CI "
                           "1.30-1.30 (builder_ab_graphs.json); this page's single captures: 1.00x; tiny c=2 eager: "
                           "0.90x, paired A/B of 3 rounds, 95% CI 0.90-0.90 (builder_ab_eager.json); ")
    # One graphed CPU run and one eager GPU run of the same settings are no builder pair.
    assert "from single captures" not in headline(load_runs([paths[0], paths[3]]))


def test_interpreted_pairs_say_so_and_project_nothing(tmp_path):
    cpu_device = {"device": "cpu: x86_64 (2 cores)"}
    runs = load_runs([known_runs.write(tmp_path, "cpu", meta=cpu_device), known_runs.write(tmp_path, "gpu", meta=cpu_device)])
    text = headline(runs)
    assert "with the GPU builder in Triton's interpreter (a CPU capture: says nothing about a GPU)" in text
    assert "Projected" not in text


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
                                                ("concurrency", float("nan"), "a number"), ("builder", ["cpu"], "a string"),
                                                ("cuda_graphs", "yes", "true, false"), ("cuda_graphs", 1, "true, false")])
def test_metadata_of_the_wrong_type_is_a_one_line_error(tmp_path, field, value, kind):
    path = known_runs.write(tmp_path, "cpu")
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**meta, field: value}))
    with pytest.raises(DdprofError, match=f"capture metadata `{field}` must be {kind} or null"):
        read_metadata(path)


def test_a_report_path_finds_the_metadata_beside_it(tmp_path):
    path = known_runs.write(tmp_path, "gpu")
    assert read_metadata(path.with_suffix(".nsys-rep"))["builder"] == "gpu"
