"""The targets table at the head of the report: each target of the issues
that set one, with the measured figure, and met or missed by how much."""

from __future__ import annotations

from _report_format import Record, find, num


def targets(records: list[Record]) -> list[str]:
    """The issue's targets, each with the measured ratio and the margin."""
    rows = []

    def add(what: str, goal: str, measured: float | None) -> None:
        """A row for ``goal`` as the table shows it: "≤ 1.15x", "≥ 0.5x", "≤ 0.2"."""
        if measured is None:
            rows.append(f"| {what} | {goal} | not measured | - |")
            return
        bound = float(goal[2:].removesuffix("x"))
        ok = measured <= bound if goal.startswith("≤") else measured >= bound
        margin = measured / bound - 1
        shown = f"{abs(margin):.0%}" if abs(margin) >= 0.01 else f"{abs(margin):.1%}"
        verdict = "met" if ok else f"**missed by {shown}**"
        rows.append(f"| {what} | {goal} | {num(measured)} | {verdict} |")

    def ratio(name: str) -> float | None:
        found = find(records, name)
        return found[0]["ratio"] if found else None

    def value(name: str) -> float | None:
        found = find(records, name)
        return found[0]["value"] if found else None

    add("engine write vs raw calls (time)", "≤ 1.15x", ratio("stream.write"))
    add("engine read vs raw calls (time)", "≤ 1.10x", ratio("stream.read"))
    for kind in ("new", "duplicate"):
        growth = find(records, f"handlers.load_state.{kind}.growth")
        span = (
            f"{growth[0]['params']['from_versions']:,} → {growth[0]['params']['to_versions']:,}"
            if growth
            else ""
        )
        add(
            f"load_state ({kind} message) growth {span}",
            "≤ 1.3x",
            value(f"handlers.load_state.{kind}.growth"),
        )
        if growth:
            replay = num(growth[0]["peer_value"])
            rows.append(
                f"| replay growth ({kind}) {span}, for comparison | linear | {replay} | - |"
            )
    add(
        "process_batch with opentelemetry-api alone vs its tracing calls bypassed (throughput)",
        "≥ 0.98x",
        ratio("tracing.process_batch.api_only"),
    )
    add(
        "process_batch round trips per message",
        "≤ 0.2",
        value("handlers.process_batch.round_trips"),
    )
    for kind in ("new", "revisited"):
        add(
            f"requests per message, one message per key ({kind} keys, header cache)",
            "≤ 1.0",
            value(f"keys.requests.{kind}"),
        )
    add(
        "task body: 10,000 keys x 1 vs 10 keys x 1,000 (throughput)",
        "≥ 0.5x",
        ratio("task.keys.scaling"),
    )
    add(
        "task body at 10,000 keys x 1 vs Azurite's ceiling (hand-built $batch, 8 threads)",
        "≥ 0.5x",
        ratio("task.keys.ceiling"),
    )
    add(
        "task body through a 5 ms proxy: 8 keys in flight vs one at a time",
        "≥ 6x",
        ratio("task.latency.concurrency"),
    )
    add(
        "client CPU per key-batch $batch (3 entities): wire vs the default TableClient",
        "≤ 0.2x",
        ratio("client.cpu_per_batch.wire"),
    )
    add(
        "client CPU of a 1,000-row read: the engine on the wire vs the SDK's range query",
        "≤ 0.3x",
        ratio("client.cpu_per_read.wire"),
    )
    add(
        "client CPU per request: TableConfig's vs the default client",
        "≤ 0.5x",
        ratio("client.cpu_per_request"),
    )
    for r in find(records, "storage.compression.bytes"):
        add(
            f"compressed state ({r['params']['state']}) vs uncompressed (bytes per message)",
            "≤ 0.5x",
            r["ratio"],
        )
    bounded = sorted(
        find(records, "storage.retention.rows_per_key"), key=lambda r: r["params"]["batch"]
    )
    if bounded:
        # Bounded: the second half of the batches adds no rows per key.
        last, middle = bounded[-1], bounded[len(bounded) // 2]
        verdict = "met" if last["value"] <= middle["value"] else "**missed**"
        rows.append(
            f"| rows per key after {last['params']['batch']} micro-batches, keep_last="
            f"{last['params']['keep_last']} (no retention: {num(last['peer_value'])}) "
            f"| bounded | {num(last['value'])} | {verdict} |"
        )
    add(
        "Spark pipeline vs raw batch inserts (throughput)",
        "≥ 0.5x",
        ratio("spark.pipeline.vs_ceiling"),
    )
    add(
        "queue consumer with its defaults, 1 message per key, vs a bare receive-and-delete "
        "loop (throughput)",
        "≥ 0.5x",
        ratio("queue.consumer"),
    )
    add("Spark queue source vs the file source, demo workload", "≥ 0.5x",
        ratio("spark.queue_source"))  # fmt: skip
    add("Spark queue source vs a QueueConsumer with as many threads", "≥ 0.8x",
        ratio("spark.queue_source.vs_consumer"))  # fmt: skip
    add("a task's peak memory, 100,000 keys x 1 vs 1,000 keys x 1", "≤ 1.5x",
        ratio("task.memory.peak"))  # fmt: skip
    pipeline = ratio("spark.pipeline")
    if pipeline is not None:
        rows.append(
            "| Spark pipeline vs Spark's own state (per-key state + dropDuplicates, demo "
            f"workload) | measured, explained below | {num(pipeline)} | - |"
        )
    return ["| target | goal | measured | verdict |", "|---|---|---|---|", *rows]
