"""ddprof: which stage of a DDTree decode step bounds end-to-end tokens/s, from real Nsight traces."""

__version__ = "0.1.0"
