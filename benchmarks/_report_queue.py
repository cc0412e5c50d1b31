"""The queue consumer's section: its rate beside the bare receive-and-delete
loop, the CPU per message by part (the plot), and the profile of one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _report_format import Record, find, num, plot, section, table

#: The queue consumer's sides: the bare loop, then each processor, by record suffix.
QUEUE_SIDES = (
    ("bare loop", None),
    ("consumer (defaults: wire, its own header cache)", ""),
    ("consumer (wire, no header cache)", ".no_header_cache"),
    ("consumer (SDK table client)", ".sdk_table"),
)


def queue_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The queue consumer beside the bare loop: rates, and CPU per message by part."""
    consumer = find(records, "queue.consumer")
    if not consumer:
        return []
    sides = []  # (label, rate, client parts, servers)
    for label, suffix in QUEUE_SIDES:

        def part(split: str, bare: bool = suffix is None, suffix: str | None = suffix) -> float:
            found = find(records, f"queue.split.{split}{suffix or ''}")
            if not found:
                return 0.0
            return float(found[0]["peer_value" if bare else "value"] or 0.0)

        rates = find(records, f"queue.consumer{suffix or ''}")
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
        labels = [f"{label}\n{num(rate)} msg/s" for label, rate, _ in sides]
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

    plot(images / "queue.png", draw_queue)
    shown = [
        r
        for r in records
        if r["name"].startswith("queue.consumer") or r["name"].startswith("queue.split.")
    ]
    lines = section(
        "Queue consumer vs a bare receive-and-delete loop",
        "`QueueConsumer(processor, queue, workers=8, page_size=32).run(until_empty=True)` "
        "over messages each on a key of its own (a counter handler, one output to an "
        "`InMemoryPublisher`), beside a loop that receives pages of 32 with the same SDK and "
        "deletes each page's messages over 8 threads. Every side drains the same messages, "
        "sent in rounds of `queue_depth` (Azurite's Queue service slows with the messages a "
        "queue holds), each round started on idle Azurite processes (a run during which "
        "Azurite swept its queue store is run again); the sides take turns. The consumer's "
        "processor runs on the wire runner's client with the `HeaderCache` the consumer gives "
        "it (its default); `.no_header_cache` takes that cache away, "
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


def queue_path_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The Spark queue source's profile, Azurite's Queue service by depth, and
    a task's memory by keys (tables, no plot)."""
    parts = [
        ("profile.spark_queue.", "The Spark queue source's profile (`profile_spark_queue.py`): "
         "each part's share of the job's time, the file source's share beside; then one "
         "batch's receive and one task's deletes alone."),
        ("azurite.queue.", "Azurite's Queue service by depth (`bench_azurite_queue.py`): one "
         "request at a time on a queue kept at each depth, beside the same at 100 deep."),
        ("task.memory.", "A task's memory by keys (`bench_task_memory.py`): the task body in a "
         "fresh process, one message per key, beside the same over fewer keys."),
    ]  # fmt: skip
    lines: list[str] = []
    for prefix, intro in parts:
        shown = [r for r in records if r["name"].startswith(prefix)]
        if shown:
            lines += [intro, "", *table(shown), ""]
    return ["## The queue path, Azurite's queues and a task's memory", "", *lines] if lines else []
