"""`ddprof sweep`'s machine-sized grid defaults, apart from ddprof.sweep (which loads polars and
plotly) so `ddprof sweep --help` can print them. On a CPU the GPU builder runs interpreted, so the
grid stays small enough for minutes on two cores."""

CPU_DEFAULTS = dict(concurrency=(1, 2, 4), builders=("cpu", "gpu"), budgets=(8,), model="tiny", requests=8,
                    max_new_tokens=16)
GPU_DEFAULTS = dict(concurrency=(1, 8, 32), builders=("cpu", "gpu"), budgets=(8, 32), model="small", requests=64,
                    max_new_tokens=64)


def described(key: str) -> str:
    """A default as --help shows it: "1,2,4 on a CPU; 1,8,32 on a GPU" (once when both agree)."""
    cpu, gpu = (",".join(map(str, d[key])) if isinstance(d[key], tuple) else str(d[key])
                for d in (CPU_DEFAULTS, GPU_DEFAULTS))
    return cpu if cpu == gpu else f"{cpu} on a CPU; {gpu} on a GPU"
