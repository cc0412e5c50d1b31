"""``python -m tests.chaos``: run the chaos harness and print its figures."""

from __future__ import annotations

import argparse
import sys

from .harness import ChaosConfig, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--duration", type=float, help="seconds of new messages (then it settles)")
    parser.add_argument(
        "--messages", type=int, default=2000, help="distinct messages, without --duration"
    )
    parser.add_argument("--threads", type=int, default=2, help="worker threads")
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keys", type=int, default=12, help="keys per strategy")
    parser.add_argument("--chunk", type=int, default=24, help="most deliveries per chunk")
    parser.add_argument(
        "--restarts", type=int, default=1, help="Azurite restarts, spread over the run"
    )
    args = parser.parse_args(argv)
    config = ChaosConfig(
        seed=args.seed,
        duration=args.duration,
        messages=args.messages,
        threads=args.threads,
        processes=args.processes,
        keys=args.keys,
        restarts=args.restarts,
        chunk=args.chunk,
    )
    report = run(config)
    print(report.table())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
