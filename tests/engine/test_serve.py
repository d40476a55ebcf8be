"""`python -m engine serve` end to end: the compute dtype it was given is the one it ran and recorded."""

import json

import pytest

from engine.__main__ import main


@pytest.mark.parametrize("option,dtype", [([], "float32"), (["--dtype", "bfloat16"], "bfloat16")])
def test_serve_runs_in_the_dtype_it_records(tmp_path, option, dtype):
    summary = tmp_path / "summary.json"
    assert main(["serve", "--workload", "fixed", "--model", "tiny", "--requests", "2", "--max-new-tokens", "4",
                 "--device", "cpu", "--summary", str(summary), *option]) == 0
    result = json.loads(summary.read_text())
    assert result["dtype"] == dtype and result["generated_tokens"] > 0
    assert result["moe_layers"] == 1  # tiny: 1 dense + 1 MoE layer
