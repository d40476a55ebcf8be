"""--stage-map: other engines' range names mapped onto the six stages and `step`."""

import json

import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.errors import DdprofError
from ddprof.load import load
from ddprof.stage_map import StageMap
from engine.stages import DOMAIN, STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import Export

SGLANG_TOML = """
tokens = "decode_tokens"
[ranges]
decode_step = "step"
draft_extend = "draft"
build_tree = "tree_build"
target_verify = "verify"
"""


def sglang_like() -> Export:
    """Ranges in the default NVTX domain (torch.cuda.nvtx style), none in `ddtree`."""
    export = Export()
    for start in (0, 100):
        export.range("decode_step", start, start + 90, domain=None)
        export.range("draft_extend", start, start + 20, domain=None)
        export.range("build_tree", start + 20, start + 30, domain=None)
        export.range("target_verify", start + 30, start + 80, domain=None)
        export.range("target_verify", start + 40, start + 50, domain="CCCL")
        export.mark("decode_tokens", start + 90, 4, domain=None)
    return export


def test_default_map_is_the_engine_contract():
    default = StageMap.default()
    assert default.domain == DOMAIN and default.tokens == TOKENS_MARK
    assert default.ranges == {STEP: STEP, **{s: s for s in STAGES}}


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_stage_map_reads_another_engines_ranges(tmp_path, suffix):
    path = tmp_path / f"sglang{suffix}"
    if suffix == ".toml":
        path.write_text(SGLANG_TOML)
    else:
        path.write_text(json.dumps({"tokens": "decode_tokens", "ranges": {
            "decode_step": "step", "draft_extend": "draft", "build_tree": "tree_build", "target_verify": "verify"}}))
    stage_map = StageMap.from_file(path)
    trace = load(sglang_like().write(tmp_path / "run.sqlite"))
    summary = breakdown(attribute(trace, stage_map), stage_map)
    assert summary["steps"] == 2 and summary["tokens"] == 8
    crit = {s["stage"]: round(s["crit_ms"] * 1e6) for s in summary["stages"]}
    # Without a domain the map reads every domain: the CCCL `target_verify` nests in the engine's one.
    assert crit == {"draft": 40, "tree_build": 20, "verify": 100, "accept": 0, "kv_compact": 0, "sampling": 0}
    assert next(s for s in summary["stages"] if s["stage"] == "verify")["count"] == 4
    assert summary["stage_map"] == str(path) and summary["domain"] is None


def test_a_domain_in_the_map_keeps_other_domains_out(tmp_path):
    export = sglang_like()
    export.range("decode_step", 300, 400, domain="sglang")
    export.range("target_verify", 310, 350, domain="sglang")
    path = tmp_path / "map.toml"
    path.write_text('domain = "sglang"\n' + SGLANG_TOML)
    stage_map = StageMap.from_file(path)
    attribution = attribute(load(export.write(tmp_path / "run.sqlite")), stage_map)
    assert attribution.steps.height == 1
    assert attribution.stage_ranges.select("stage", "start", "end").rows() == [("verify", 310, 350)]
    assert attribution.tokens is None  # the marks are in the default domain: none is counted, tok/s is unknown


@pytest.mark.parametrize("text, message", [
    ("ranges = [", "stage map is not valid TOML"),
    ("[ranges]\nfwd = 'forward'", "range 'fwd' maps to 'forward', not one of step, draft"),
    ("[ranges]\nfwd = 'verify'", "maps no range to 'step'"),
    ("domian = 'x'\n[ranges]\nfwd = 'step'", r"unknown stage map keys \['domian'\]"),
    ("domain = 3\n[ranges]\nfwd = 'step'\nv = 'verify'", "stage map `domain` must be a string"),
    ("tokens = 'n'", "needs a `ranges` table"),
    ("[ranges]\nfwd = 'step'", "maps no range to a stage"),
    ("tokens = 3\n[ranges]\nfwd = 'step'\nv = 'verify'", "stage map `tokens` must be a string"),
])
def test_bad_stage_maps_are_one_line_errors_naming_the_file(tmp_path, text, message):
    path = tmp_path / "map.toml"
    path.write_text(text)
    with pytest.raises(DdprofError, match=message) as caught:
        StageMap.from_file(path)
    assert str(path) in str(caught.value)


def test_missing_stage_map_and_json_that_is_not_an_object(tmp_path):
    with pytest.raises(DdprofError, match="stage map not found"):
        StageMap.from_file(tmp_path / "nope.json")
    path = tmp_path / "map.json"
    path.write_text("[1, 2]")
    with pytest.raises(DdprofError, match="must be an object"):
        StageMap.from_file(path)
    path.write_text('{"ranges": {"fwd": "step", "target_verify": "draft", "target_verify": "verify"}}')
    with pytest.raises(DdprofError, match="'target_verify' appears twice"):  # json.loads kept the last silently
        StageMap.from_file(path)
    path.write_text('{"domain": null, "ranges": {"fwd": "step", "v": "verify"}}')
    assert StageMap.from_file(path).domain is None  # null, like no domain: any
    upper = tmp_path / "MAP.TOML"
    upper.write_text("[ranges]\nfwd = 'step'\nv = 'verify'")
    assert StageMap.from_file(upper).ranges == {"fwd": "step", "v": "verify"}


def test_no_mapped_step_in_the_trace_names_the_map(tmp_path):
    path = tmp_path / "map.toml"
    path.write_text('domain = "vllm"\n[ranges]\nexecute_model = "step"\nsample = "sampling"')
    export = Export()
    export.range("execute_model", 0, 10, domain=None)
    with pytest.raises(DdprofError, match=r"no step ranges \('execute_model'\) in NVTX domain 'vllm' "
                                          r"\(stage map .*map.toml\) \(domains with ranges: <default>\)"):
        attribute(load(export.write(tmp_path / "run.sqlite")), StageMap.from_file(path))
