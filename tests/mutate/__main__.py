"""``python -m tests.mutate`` (``make mutate``): mutation testing of the core
modules against an Azurite of its own; see docs/reliability.md."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from azurite.launcher import CONNECTION_STRING_ENV, account

from . import report, settings, tool

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutate", description=__doc__)
    parser.add_argument(
        "mutants",
        nargs="*",
        help="test these mutants again, whatever their verdict (globs of mutmut's names, "
        "e.g. 'streamstone_py._writes.*')",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="PATH",
        help="mutate this module of modules.toml alone (repeatable), e.g. handlers/_batch/_fold.py",
    )
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument(
        "--fresh", action="store_true", help="forget every verdict: start from new mutants"
    )
    parser.add_argument("--debug", action="store_true", help="show mutmut's and pytest's output")
    args = parser.parse_args(argv)

    os.chdir(ROOT)  # mutmut works in the current directory, and writes mutants/ there
    if args.fresh:
        shutil.rmtree("mutants", ignore_errors=True)
    started = time.monotonic()
    everything = settings.load_modules()
    modules = everything
    if args.only:
        unknown = set(args.only) - {m.path for m in everything}
        if unknown:
            parser.error(f"not in tests/mutate/modules.toml: {', '.join(sorted(unknown))}")
        modules = [m for m in everything if m.path in args.only]
    equivalents = report.Equivalents.load()
    # Every module stays mutated (mutmut keeps the mutants of those it mutates
    # only); those of this run are tested.
    tool.configure(everything, debug=args.debug)
    with account(queues=True) as connection_string:
        # Every pytest that mutmut starts inherits it: the tests' fixtures use
        # this Azurite instead of starting their own.
        os.environ[CONNECTION_STRING_ENV] = connection_string
        tool.run(
            everything,
            modules,
            args.jobs,
            lambda path, name: report.change_of(path, name) in equivalents,
            tuple(args.mutants),
        )
    ok = report.report(modules, list(tool.verdicts()), equivalents)
    print(f"\nmake mutate: {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
