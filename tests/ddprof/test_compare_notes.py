"""`ddprof compare` says when a run's GPU builder ran in Triton's interpreter (a CPU capture), so
a 0.1x tok/s ratio is not read as the kernel's."""

from tests.ddprof import known_runs
from tests.ddprof.test_dashboard_cli import ddprof


def test_an_interpreted_gpu_builder_run_is_named_under_the_comparison(tmp_path):
    on_cpu = {"device": "cpu: x86_64 (2 cores)"}
    cpu, gpu = known_runs.write(tmp_path, "cpu", meta=on_cpu), known_runs.write(tmp_path, "gpu", meta=on_cpu)
    done = ddprof("compare", cpu, gpu, "--resamples", "10")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert f"note: B ({gpu}): captured on a CPU, so the GPU builder's Triton kernel ran in Triton's interpreter" in text
    assert "note: A" not in text
    on_gpu = known_runs.write(tmp_path, "gpu", name="real-gpu")  # device "cuda: hand-built"
    done = ddprof("compare", cpu, on_gpu, "--resamples", "10")
    assert done.returncode == 0 and "interpreter" not in done.stdout
