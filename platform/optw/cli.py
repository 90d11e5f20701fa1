"""The ``optw`` command line: one entry point, one subcommand per concern.

Each concern contributes a module with ``register(subparsers)``; a subcommand's handler imports
heavy dependencies (torch, ray, mlflow) only when it runs, so ``optw --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Modules that add subcommands, in help order.
COMMAND_MODULES = (
    "optw.catalog.cli",
    "optw.decode.cli",
    "optw.train.cli",
    "optw.baselines.cli",
    "optw.evaluate.cli",
    "optw.serve.cli",
    "optw.report.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optw",
        description="Train, evaluate and serve neural solvers for the Orienteering Problem "
        "with Time Windows.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as exc:
        # Errors meant for the user (bad input, missing catalog) print one clear line.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"optw {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
