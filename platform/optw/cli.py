"""The ``optw`` command line: one entry point, one subcommand per concern.

Each concern contributes a module with ``register(subparsers)``; a subcommand's handler imports
heavy dependencies (torch, ray, mlflow) only when it runs, so ``optw --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: Modules that add subcommands, in help order.
COMMAND_MODULES = (
    "optw.catalog.cli",
    "optw.decode.cli",
    "optw.train.cli",
    "optw.baselines.cli",
    "optw.evaluate.cli",
    "optw.distributed.cli",
    "optw.serve.cli",
    "optw.report.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optw",
        description="Train, evaluate and serve neural solvers for the Orienteering Problem "
        "with Time Windows.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


#: Errors meant for the user (bad input, missing files, unreachable services): one line.
USER_ERRORS = (ValueError, LookupError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError, RuntimeError, TimeoutError, ConnectionError)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    name = " ".join(filter(None, (args.command, getattr(args, f"{args.command}_command", None))))
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`optw catalog list --json | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except USER_ERRORS as exc:
        if args.debug:
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        text = " ".join(str(msg).split()) if str(msg).count("\n") < 2 else str(msg).strip()
        print(f"optw {name}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
