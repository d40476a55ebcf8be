"""`python -m engine <subcommand>`: each subcommand module registers its own argparse parser."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from engine.errors import EngineError


def main(argv: list[str] | None = None) -> int:
    # torch's C++ warnings (c10d polling a socket while a rank waits for its peers) would add lines
    # to the engine's one-line errors; read once, when torch loads, so set before it does.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        # Imported here: loading them reads engine/assets (the tokenizer), which can fail like any input.
        from engine import generate, serve, tokenizer, train_drafter, train_target
    except EngineError as error:
        return _refuse(error)
    parser = argparse.ArgumentParser(prog="python -m engine", description="The embedded DDTree engine.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for module in (generate, serve, tokenizer, train_target, train_drafter):  # each registers its parser and `run`
        module.register(subcommands)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # what `--ranks N` runs again, once per rank
    args.command_line = "python -m engine " + shlex.join(args.argv)  # for run records
    try:
        return args.run(args)
    except EngineError as error:
        return _refuse(error)


def _refuse(error: EngineError) -> int:
    """An input problem: one line on stderr (whatever the message quotes), exit code 2."""
    print(f"engine: error: {' '.join(str(error).splitlines())}", file=sys.stderr)  # as ddprof: "ddprof: error:"
    return 2


if __name__ == "__main__":
    sys.exit(main())
