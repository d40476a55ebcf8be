"""The `ddprof` command line: thin typer commands over ddprof's modules.

Every user-facing failure is a DdprofError, printed as one line with exit code 2 (no traceback).
"""

from __future__ import annotations

import json
import platform
import sys

import typer
from rich.console import Console
from rich.table import Table

from ddprof import __version__
from ddprof.errors import DdprofError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Profile DDTree speculative decoding under Nsight Systems.")
console = Console()


@app.callback()
def _root() -> None:
    """Capture DDTree decode runs under Nsight Systems and say which stage bounds tokens/s."""


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Show the toolchain ddprof found: nsys, torch, triton, CUDA."""
    import torch
    import triton

    from ddprof.nsys import find_nsys

    nsys = find_nsys()
    facts = {
        "ddprof": __version__,
        "python": platform.python_version(),
        "nsys": str(nsys.path),
        "nsys_version": nsys.version,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    if as_json:
        print(json.dumps(facts))
        return
    table = Table(show_header=False)
    for key, value in facts.items():
        table.add_row(key, str(value))
    console.print(table)


def main() -> None:
    """Console-script entry: run the app, turning DdprofError into one line and exit code 2."""
    try:
        app()
    except DdprofError as exc:
        print(f"ddprof: error: {exc}", file=sys.stderr)
        sys.exit(2)
