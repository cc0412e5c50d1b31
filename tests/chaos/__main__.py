"""``python -m tests.chaos``: run the chaos harness and print its figures."""

from __future__ import annotations

import argparse
import sys

from azurite.launcher import account

from .harness import ChaosConfig, run
from .queue_mode import QueueChaosConfig, run_queue
from .token_mode import TokenChaosConfig, run_tokens


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
    parser.add_argument(
        "--long-share", type=float, default=0.06, help="share of chunks of one key, to split"
    )
    parser.add_argument("--long-max", type=int, default=150, help="most messages of a long chunk")
    parser.add_argument(
        "--retain-share", type=float, default=0.05, help="share of dispatches that retain a key"
    )
    parser.add_argument(
        "--max-failures", type=int, default=6, help="a message's own failures before giving up"
    )
    parser.add_argument(
        "--evolve-at",
        type=float,
        default=0.5,
        help="share of the run after which the evolved state class processes (>1: never)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=3600.0,
        help="most seconds of settling after the last new message; then the run stops",
    )
    parser.add_argument(
        "--transport",
        choices=["wire", "sdk", "mixed"],
        default="wire",
        help="the workers' runner (mixed: wire on even workers, the SDK on odd ones)",
    )
    parser.add_argument(
        "--mode",
        choices=["broker", "queue", "tokens"],
        default="broker",
        help="broker: a simulated broker over a shuffled log (every fault point); queue: "
        "Azurite's Queue service, consumers with short locks, killed worker processes; "
        "tokens: key-to-key messages with tokens, retention, every credit again at the end",
    )
    parser.add_argument(
        "--outages", type=int, default=1, help="queue mode: Table service outages (it alone stops)"
    )
    parser.add_argument(
        "--outage-seconds", type=float, default=10.0, help="queue mode: how long each outage lasts"
    )
    parser.add_argument(
        "--hostile", type=float, default=0.02, help="queue mode: share of texts that are hostile"
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="broker mode: the OpenTelemetry SDK behind every worker, each delivery in its own "
        "trace (outputs are compared without their trace headers)",
    )
    args = parser.parse_args(argv)
    if args.mode == "tokens":
        tokens_config = TokenChaosConfig(
            seed=args.seed, duration=args.duration or 60.0, threads=args.threads
        )
        with account() as connection_string:
            token_report = run_tokens(tokens_config, connection_string)
        print(token_report.table())
        return 1 if token_report.violations else 0
    if args.mode == "queue":
        queue_config = QueueChaosConfig(
            seed=args.seed,
            duration=args.duration or 60.0,
            processes=args.processes,
            keys=args.keys,
            restarts=args.restarts,
            outages=args.outages,
            outage_seconds=args.outage_seconds,
            hostile=args.hostile,
        )
        queue_report = run_queue(queue_config)
        print(queue_report.table())
        return 1 if queue_report.violations else 0
    config = ChaosConfig(
        seed=args.seed,
        duration=args.duration,
        messages=args.messages,
        threads=args.threads,
        processes=args.processes,
        keys=args.keys,
        restarts=args.restarts,
        chunk=args.chunk,
        long_share=args.long_share,
        long_max=args.long_max,
        retain_share=args.retain_share,
        max_failures=args.max_failures,
        transport=args.transport,
        evolve_at=args.evolve_at,
        settle=args.settle,
        tracing=args.tracing,
    )
    report = run(config)
    print(report.table())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
