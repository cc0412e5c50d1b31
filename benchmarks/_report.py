"""The report: tables, targets and PNG plots from one run's measurements (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI machines or servers
import matplotlib.pyplot as plt

Record = dict[str, Any]
ANALYSIS = Path(__file__).with_name("analysis.md")


def _find(records: list[Record], name: str, **params: Any) -> list[Record]:
    return [
        r
        for r in records
        if r["name"] == name and all(r["params"].get(k) == v for k, v in params.items())
    ]


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "<0.001"  # the results keep 3 decimals
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in params.items())


def table(records: Iterable[Record]) -> list[str]:
    lines = [
        "| measurement | work | value (median) | min-max | n | peer | peer value | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| `{r['name']}` | {_params(r['params'])} | {_num(r['value'])} {r['unit']} "
            f"| {_num(r['min'])}-{_num(r['max'])} | {r['repeats']} | {r['peer'] or '-'} "
            f"| {_num(r['peer_value'])} | {_num(r['ratio'])} |"
        )
    return lines


def _section(title: str, intro: str, image: str, records: Iterable[Record]) -> list[str]:
    """A report section: heading, what was measured, its plot, its table."""
    return [f"## {title}", "", intro, "", image, "", *table(records), ""]


def _plot(path: Path, draw: Callable[[Any], None]) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    draw(axes)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def targets(records: list[Record]) -> list[str]:
    """The issue's targets, each with the measured ratio and the margin."""
    rows = []

    def add(
        what: str, goal: str, measured: float | None, ok: Callable[[float], bool], bound: float
    ) -> None:
        if measured is None:
            rows.append(f"| {what} | {goal} | not measured | - |")
            return
        margin = measured / bound - 1
        shown = f"{abs(margin):.0%}" if abs(margin) >= 0.01 else f"{abs(margin):.1%}"
        verdict = "met" if ok(measured) else f"**missed by {shown}**"
        rows.append(f"| {what} | {goal} | {_num(measured)} | {verdict} |")

    def ratio(name: str) -> float | None:
        found = _find(records, name)
        return found[0]["ratio"] if found else None

    def value(name: str) -> float | None:
        found = _find(records, name)
        return found[0]["value"] if found else None

    add(
        "engine write vs raw calls (time)",
        "≤ 1.15x",
        ratio("stream.write"),
        lambda x: x <= 1.15,
        1.15,
    )
    add(
        "engine read vs raw calls (time)",
        "≤ 1.10x",
        ratio("stream.read"),
        lambda x: x <= 1.10,
        1.10,
    )
    for kind in ("new", "duplicate"):
        growth = _find(records, f"handlers.load_state.{kind}.growth")
        span = (
            f"{growth[0]['params']['from_versions']:,} → {growth[0]['params']['to_versions']:,}"
            if growth
            else ""
        )
        add(
            f"load_state ({kind} message) growth {span}",
            "≤ 1.3x",
            value(f"handlers.load_state.{kind}.growth"),
            lambda x: x <= 1.3,
            1.3,
        )
        if growth:
            replay = _num(growth[0]["peer_value"])
            rows.append(
                f"| replay growth ({kind}) {span}, for comparison | linear | {replay} | - |"
            )
    add(
        "process_batch round trips per message",
        "≤ 0.2",
        value("handlers.process_batch.round_trips"),
        lambda x: x <= 0.2,
        0.2,
    )
    for kind in ("new", "revisited"):
        add(
            f"requests per message, one message per key ({kind} keys, header cache)",
            "≤ 1.0",
            value(f"keys.requests.{kind}"),
            lambda x: x <= 1.0,
            1.0,
        )
    add(
        "task body: 10,000 keys x 1 vs 10 keys x 1,000 (throughput)",
        "≥ 0.5x",
        ratio("task.keys.scaling"),
        lambda x: x >= 0.5,
        0.5,
    )
    add(
        "task body at 10,000 keys x 1 vs Azurite's ceiling (hand-built $batch, 8 threads)",
        "≥ 0.5x",
        ratio("task.keys.ceiling"),
        lambda x: x >= 0.5,
        0.5,
    )
    add(
        "task body through a 5 ms proxy: 8 keys in flight vs one at a time",
        "≥ 6x",
        ratio("task.latency.concurrency"),
        lambda x: x >= 6,
        6,
    )
    add(
        "client CPU per key-batch $batch (3 entities): wire vs the default TableClient",
        "≤ 0.2x",
        ratio("client.cpu_per_batch.wire"),
        lambda x: x <= 0.2,
        0.2,
    )
    add(
        "client CPU of a 1,000-row read: the engine on the wire vs the SDK's range query",
        "≤ 0.3x",
        ratio("client.cpu_per_read.wire"),
        lambda x: x <= 0.3,
        0.3,
    )
    add(
        "client CPU per request: TableConfig's vs the default client",
        "≤ 0.5x",
        ratio("client.cpu_per_request"),
        lambda x: x <= 0.5,
        0.5,
    )
    for r in _find(records, "storage.compression.bytes"):
        add(
            f"compressed state ({r['params']['state']}) vs uncompressed (bytes per message)",
            "≤ 0.5x",
            r["ratio"],
            lambda x: x <= 0.5,
            0.5,
        )
    bounded = sorted(
        _find(records, "storage.retention.rows_per_key"), key=lambda r: r["params"]["batch"]
    )
    if bounded:
        # Bounded: the second half of the batches adds no rows per key.
        last, middle = bounded[-1], bounded[len(bounded) // 2]
        verdict = "met" if last["value"] <= middle["value"] else "**missed**"
        rows.append(
            f"| rows per key after {last['params']['batch']} micro-batches, keep_last="
            f"{last['params']['keep_last']} (no retention: {_num(last['peer_value'])}) "
            f"| bounded | {_num(last['value'])} | {verdict} |"
        )
    add(
        "Spark pipeline vs raw batch inserts (throughput)",
        "≥ 0.5x",
        ratio("spark.pipeline.vs_ceiling"),
        lambda x: x >= 0.5,
        0.5,
    )
    add(
        "queue consumer, 1 message per key, vs a bare receive-and-delete loop (throughput)",
        "≥ 0.5x",
        ratio("queue.consumer"),
        lambda x: x >= 0.5,
        0.5,
    )
    pipeline = ratio("spark.pipeline")
    if pipeline is not None:
        rows.append(
            "| Spark pipeline vs Spark's own state (per-key state + dropDuplicates, demo "
            f"workload) | measured, explained below | {_num(pipeline)} | - |"
        )
    return ["| target | goal | measured | verdict |", "|---|---|---|---|", *rows]


#: The queue consumer's sides: the bare loop, then each processor, by record suffix.
QUEUE_SIDES = (
    ("bare loop", None),
    ("consumer (wire)", ""),
    ("consumer (wire, header cache)", ".header_cache"),
    ("consumer (SDK table client)", ".sdk_table"),
)


def _queue_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The queue consumer beside the bare loop: rates, and CPU per message by part."""
    consumer = _find(records, "queue.consumer")
    if not consumer:
        return []
    sides = []  # (label, rate, client parts, servers)
    for label, suffix in QUEUE_SIDES:

        def part(split: str, bare: bool = suffix is None, suffix: str | None = suffix) -> float:
            found = _find(records, f"queue.split.{split}{suffix or ''}")
            if not found:
                return 0.0
            return float(found[0]["peer_value" if bare else "value"] or 0.0)

        rates = _find(records, f"queue.consumer{suffix or ''}")
        if not rates:
            continue
        rate = rates[0]["peer_value" if suffix is None else "value"]
        delete, process, total = part("delete.cpu"), part("process.cpu"), part("cpu")
        sides.append(
            (
                label,
                rate,
                [
                    ("client: delete", delete),
                    ("client: process_batch", process),
                    ("client: the rest", max(0.0, total - delete - process)),
                    ("Azurite Table", part("server.table")),
                    ("Azurite Queue", part("server.queue")),
                ],
            )
        )

    def draw_queue(ax: Any) -> None:
        labels = [f"{label}\n{_num(rate)} msg/s" for label, rate, _ in sides]
        left = [0.0] * len(sides)
        colors = ["#27a", "#4a7", "#9c9", "#a72", "#d96"]
        for i, color in enumerate(colors):
            widths = [parts[i][1] for _, _, parts in sides]
            ax.barh(labels, widths, left=left, color=color, label=sides[0][2][i][0])
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        ax.set_xlabel("CPU ms per message (median), client and Azurite")
        ax.set_title("queue consumer vs bare loop: CPU per message")
        ax.legend(fontsize=8)

    _plot(images / "queue.png", draw_queue)
    shown = [
        r
        for r in records
        if r["name"].startswith("queue.consumer") or r["name"].startswith("queue.split.")
    ]
    lines = _section(
        "Queue consumer vs a bare receive-and-delete loop",
        "`QueueConsumer(processor, queue, workers=8, page_size=32).run(until_empty=True)` "
        "over messages each on a key of its own (a counter handler, one output to an "
        "`InMemoryPublisher`), beside a loop that receives pages of 32 with the same SDK and "
        "deletes each page's messages over 8 threads. Every side drains the same messages, "
        "sent in rounds of `queue_depth` (Azurite's Queue service slows with the messages a "
        "queue holds), each round started on idle Azurite processes (a run during which "
        "Azurite swept its queue store is run again); the sides take turns. The consumer's "
        "processor runs on the wire runner's client; `.header_cache` adds a `HeaderCache`, "
        "`.sdk_table` puts it on the SDK's `TableClient`. `queue.split.*`: milliseconds per "
        "message, elapsed time summed over threads (receive, delete, process, process.table) "
        "or CPU (`.cpu`, the client process's `cpu`, and the Azurite processes' "
        "`server.*`), each beside the bare loop's where it has one. With Azurite on the same "
        "machine, the CPU per message of client and servers together bounds each side's rate.",
        f"![queue consumer CPU per message]({name}/queue.png)",
        shown,
    )
    profile = [r for r in records if r["name"].startswith("queue.profile.group.")]
    functions = [r for r in records if r["name"].startswith("queue.profile.function.")]
    if profile:
        p = profile[0]["params"]
        lines += [
            f"One consumer run profiled (cProfile on every thread, timed by each thread's CPU "
            f"clock), {p['messages']:,} messages: the client's CPU by package, then its top "
            "functions.",
            "",
            "| group | share |",
            "|---|---|",
            *(f"| {r['params']['group']} | {r['value']:.1%} |" for r in profile),
            "",
            "| function | share |",
            "|---|---|",
            *(f"| `{r['params']['function']}` | {r['value']:.1%} |" for r in functions),
            "",
        ]
    return lines


def render(result: dict[str, Any], docs: Path, name: str) -> Path:
    records: list[Record] = result["measurements"]
    images = docs / name
    images.mkdir(parents=True, exist_ok=True)
    m = result["machine"]
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{'make bench-quick' if result['quick'] else 'make bench'}` "
        f"(`python benchmarks/run_all.py{' --quick' if result['quick'] else ''}`) on "
        f"{result['date']}, in {result['minutes']} minutes; raw figures in "
        f"`benchmarks/results/{result['date']}{'-quick' if result['quick'] else ''}.json`. "
        "Every value is the median of its repeats (n), with min-max; every peer was "
        "measured in the same run, beside it, on the same input, against the same Azurite; "
        "ratio = value / peer. Absolute figures belong to this machine; compare ratios.",
        *(
            f" `{r['script']}` was run again on {r['started'][:16].replace('T', ' ')} UTC "
            f"({r['minutes']} minutes, `run_all.py --rerun`): its figures, and their peers, "
            "come from that run."
            for r in result.get("reruns", [])
        ),
        "",
        "| machine | |",
        "|---|---|",
        f"| cores | {m['cores']} ({m['cpu']}) |",
        f"| memory | {m['memory_gib']} GiB |",
        f"| platform | {m['platform']} |",
        f"| versions | Python {m['python']}, {m['java']}, Node {m['node']}, "
        f"Azurite {m['azurite']}, "
        f"azure-data-tables {m['azure-data-tables']}, PySpark {m['pyspark']} |",
        "",
        "## Targets",
        "",
        *targets(records),
        "",
    ]
    if ANALYSIS.exists() and not result["quick"]:
        out += [ANALYSIS.read_text().strip(), ""]

    out += [
        "## Engine vs raw azure-data-tables calls",
        "",
        "The ceiling is the raw SDK doing the same rows by hand.",
        "",
        *table(r for r in records if r["name"] in ("stream.write", "stream.read")),
        "",
    ]

    loads = [
        r
        for r in records
        if r["name"] in ("handlers.load_state.new", "handlers.load_state.duplicate")
    ]
    if loads:

        def draw_loads(ax: Any) -> None:
            for kind, style in (("new", "o-"), ("duplicate", "s-")):
                series = sorted(
                    (r["params"]["versions"], r["value"], r["peer_value"])
                    for r in loads
                    if r["name"].endswith(kind)
                )
                xs = [s[0] for s in series]
                ax.plot(xs, [s[1] for s in series], style, label=f"load_state, {kind} message")
                ax.plot(
                    xs,
                    [s[2] for s in series],
                    style[0] + "--",
                    alpha=0.5,
                    label=f"replay (the seed's approach), {kind} message",
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("stream length (versions)")
            ax.set_ylabel("latency (ms, median)")
            ax.set_title("load_state vs replay")
            ax.legend(fontsize=8)

        _plot(images / "load_state.png", draw_loads)
        out += [
            "## load_state latency vs stream length",
            "",
            f"![load_state vs replay]({name}/load_state.png)",
            "",
            *table(
                loads
                + [
                    r
                    for r in records
                    if r["name"].startswith("handlers.load_state.") and r["name"].endswith("growth")
                ]
            ),
            "",
        ]

    handlers = [
        r
        for r in records
        if r["name"]
        in (
            "handlers.process",
            "handlers.process_batch",
            "handlers.process_batch.vs_naive",
            "handlers.outbox",
            "handlers.process.round_trips",
            "handlers.process_batch.round_trips",
            "handlers.outbox.round_trips",
        )
    ]
    if handlers:
        naive = _find(records, "handlers.process")[0]["peer_value"]
        bars = [("naive (no de-dup)", naive)] + [
            (label, _find(records, n)[0]["value"])
            for label, n in (
                ("process", "handlers.process"),
                ("process_batch", "handlers.process_batch"),
                ("outbox", "handlers.outbox"),
            )
        ]

        def draw_handlers(ax: Any) -> None:
            ax.bar(
                [b[0] for b in bars], [b[1] for b in bars], color=["#999", "#4a7", "#27a", "#a72"]
            )
            ax.set_ylabel("messages/s (median)")
            ax.set_title("handler throughput: the cost of exactly-once")

        _plot(images / "handlers.png", draw_handlers)
        out += _section(
            "Handlers: throughput and round trips, beside a naive handler",
            "The naive handler reads its state row, applies the message and writes the row back: "
            "no message ids, no versions, so a duplicate changes the state twice.",
            f"![handler throughput]({name}/handlers.png)",
            handlers,
        )

    spark = [r for r in records if r["name"].startswith("spark.")]
    if spark:
        out += ["## The Spark pipeline", "", *table(spark), ""]

    keys = _find(records, "handlers.scaling.keys")
    if keys:

        def draw_keys(ax: Any) -> None:
            series = sorted((r["params"]["keys"], r["value"], r["min"], r["max"]) for r in keys)
            xs = [s[0] for s in series]
            ax.errorbar(
                xs,
                [s[1] for s in series],
                yerr=[[s[1] - s[2] for s in series], [s[3] - s[1] for s in series]],
                fmt="o-",
                capsize=3,
            )
            ax.set_xscale("log")
            ax.set_xlabel("keys (same number of messages)")
            ax.set_ylabel("messages/s (median, min-max)")
            ax.set_title("process_batch throughput vs number of keys")

        _plot(images / "keys.png", draw_keys)
        out += [
            "## Scaling: keys",
            "",
            f"![throughput vs keys]({name}/keys.png)",
            "",
            *table(keys),
            "",
        ]

    many = [r for r in records if r["name"].startswith(("keys.", "task.", "client."))]
    throughput = _find(records, "task.keys.throughput")
    if many:
        out += ["## Many keys, few messages each", ""]
    if throughput:

        def draw_throughput(ax: Any) -> None:
            for delay in sorted({r["params"]["delay_ms_each_way"] for r in throughput}):
                series = sorted(
                    (r["params"]["keys"], r["value"])
                    for r in throughput
                    if r["params"]["delay_ms_each_way"] == delay
                )
                label = f"{delay:g} ms each way" if delay else "no added latency"
                ax.plot([s[0] for s in series], [s[1] for s in series], "o-", label=label)
            ax.set_xscale("log")
            ax.set_xlabel("keys (same number of messages)")
            ax.set_ylabel("messages/s")
            ax.set_title("task body (8 keys in flight, header cache) vs number of keys")
            ax.legend()

        _plot(images / "many_keys.png", draw_throughput)
        out += [f"![task throughput vs keys]({name}/many_keys.png)", ""]
    if many:
        out += [*table(many), ""]

    sizes = _find(records, "handlers.storage_bytes")
    if sizes:

        def draw_sizes(ax: Any) -> None:
            series = sorted((r["params"]["state_bytes"], r["value"]) for r in sizes)
            xs = [s[0] for s in series]
            ax.plot(xs, [s[1] for s in series], "o-", label="stored bytes per message")
            ax.plot(xs, xs, "--", alpha=0.5, label="the state's own size")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("encoded state size (bytes)")
            ax.set_ylabel("bytes per processed message")
            ax.legend(fontsize=8)
            ax.set_title("storage per message vs state size")

        _plot(images / "storage_bytes.png", draw_sizes)
        out += [
            "## Storage per message vs state size",
            "",
            "Azure's entity-size formula summed over every row of the key's partition "
            "(events, id rows, header), divided by the messages processed.",
            "",
            f"![bytes per message]({name}/storage_bytes.png)",
            "",
            *table(sizes),
            "",
        ]

    codec = [r for r in records if r["name"].startswith("storage.codec.")]
    compressed = [r for r in records if r["name"].startswith("storage.compression.")]
    if compressed:

        def draw_compression(ax: Any) -> None:
            series = [r for r in compressed if r["name"] == "storage.compression.bytes"]
            labels = [r["params"]["state"] for r in series]
            xs = range(len(series))
            ax.bar([x - 0.2 for x in xs], [r["peer_value"] for r in series], 0.4, label="as is")
            ax.bar([x + 0.2 for x in xs], [r["value"] for r in series], 0.4, label="zlib")
            ax.set_xticks(list(xs), labels)
            ax.set_yscale("log")
            ax.set_xlabel("state size (encoded)")
            ax.set_ylabel("stored bytes per message")
            ax.set_title("compressed states: storage per message")
            ax.legend()

        _plot(images / "compression.png", draw_compression)
        out += _section(
            "Compressed states",
            "A portfolio dataclass (positions of symbols, accounts, quantities, prices and "
            "dates), one trade per message, 5 messages to a batch. First the codecs on the "
            'encoded state alone, then the runtime with `compression="zlib"` beside the '
            "same messages stored as they are.",
            f"![compressed states]({name}/compression.png)",
            codec + compressed,
        )

    retention = [r for r in records if r["name"].startswith("storage.retention.")]
    if retention:
        by_batch = sorted(
            (r["params"]["batch"], r["value"], r["peer_value"])
            for r in retention
            if r["name"] == "storage.retention.rows_per_key"
        )

        def draw_retention(ax: Any) -> None:
            xs = [b[0] for b in by_batch]
            ax.plot(xs, [b[2] for b in by_batch], "o-", label="no retention")
            ax.plot(xs, [b[1] for b in by_batch], "s-", label="keep_last=4 in the job")
            ax.set_xlabel("micro-batch")
            ax.set_ylabel("rows per key (mean of a sample)")
            ax.set_title("storage per key over micro-batches")
            ax.legend()

        _plot(images / "retention.png", draw_retention)
        shown = [r for r in retention if r["name"] != "storage.retention.rows_per_key"]
        shown += [
            r
            for r in retention
            if r["name"] == "storage.retention.rows_per_key"
            and r["params"]["batch"] in (1, 2, 3, by_batch[-1][0])
        ]
        out += _section(
            "Retention inside the job",
            "The task body (`process_partition`) over micro-batches of 2 messages per key, "
            "with `keep_last=4`, and with `keep_last=4, retain_at_least=8` (a key is cut "
            "once 8 versions can go), beside the same batches without retention (each "
            "batch runs all three, rotating which goes first).",
            f"![rows per key over micro-batches]({name}/retention.png)",
            shown,
        )

    out += _queue_section(records, images, name)

    asyncs = _find(records, "stream.write.async")
    if asyncs:
        out += ["## Async engine vs sync", "", *table(asyncs), ""]

    groups = [r for r in records if r["name"].startswith("profile.task.group.")]
    functions = [r for r in records if r["name"].startswith("profile.task.function.")]
    if groups:
        p = groups[0]["params"]
        out += [
            "## Profile of the task body",
            "",
            f"cProfile over `process_partition` (what each Spark task runs), one key at a time, "
            f"on {p['rows']:,} rows of {p['keys']:,} keys, {p['task_seconds']} s; internal time "
            "grouped by package.",
            "",
            "| group | share | seconds |",
            "|---|---|---|",
            *(
                f"| {r['params']['group']} | {r['value']:.1%} | {r['params']['seconds']} |"
                for r in groups
            ),
            "",
            "| function | share |",
            "|---|---|",
            *(f"| `{r['params']['function']}` | {r['value']:.1%} |" for r in functions),
            "",
        ]

    report = docs / f"{name}.md"
    report.write_text("\n".join(out))
    return report
