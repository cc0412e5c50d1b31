"""The report's sections on what is stored: bytes per message by state size,
compressed states, retention inside the job, and tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _report_format import Record, find, plot, section, table


def storage_bytes_section(records: list[Record], images: Path, name: str) -> list[str]:
    """Stored bytes per message by the state's size."""
    sizes = find(records, "handlers.storage_bytes")
    if not sizes:
        return []

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

    plot(images / "storage_bytes.png", draw_sizes)
    return [
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


def compression_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The codecs on a state alone, then compressed states in the runtime."""
    codec = [r for r in records if r["name"].startswith("storage.codec.")]
    compressed = [r for r in records if r["name"].startswith("storage.compression.")]
    if not compressed:
        return []

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

    plot(images / "compression.png", draw_compression)
    return section(
        "Compressed states",
        "A portfolio dataclass (positions of symbols, accounts, quantities, prices and "
        "dates), one trade per message, 5 messages to a batch. First the codecs on the "
        'encoded state alone, then the runtime with `compression="zlib"` beside the '
        "same messages stored as they are.",
        f"![compressed states]({name}/compression.png)",
        codec + compressed,
    )


def retention_section(records: list[Record], images: Path, name: str) -> list[str]:
    """Rows per key over micro-batches, with and without retention."""
    retention = [r for r in records if r["name"].startswith("storage.retention.")]
    if not retention:
        return []
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

    plot(images / "retention.png", draw_retention)
    shown = [r for r in retention if r["name"] != "storage.retention.rows_per_key"]
    shown += [
        r
        for r in retention
        if r["name"] == "storage.retention.rows_per_key"
        and r["params"]["batch"] in (1, 2, 3, by_batch[-1][0])
    ]
    return section(
        "Retention inside the job",
        "The task body (`process_partition`) over micro-batches of 2 messages per key, "
        "with `keep_last=4`, and with `keep_last=4, retain_at_least=8` (a key is cut "
        "once 8 versions can go), beside the same batches without retention (each "
        "batch runs all three, rotating which goes first).",
        f"![rows per key over micro-batches]({name}/retention.png)",
        shown,
    )


def tokens_section(records: list[Record], images: Path, name: str) -> list[str]:
    """Tokens beside the same transfers without (no plot: a handful of ratios)."""
    tokens = [r for r in records if r["name"].startswith("tokens.")]
    if not tokens:
        return []
    return [
        "## Tokens: what they cost and what they save",
        "",
        "Transfers on sender keys (the `accounts` example), each sending a credit to a "
        "receiver key, with `tokens=True` beside the same without, in the same run: HTTP "
        "requests counted at the wire client for one message (`process`, header cache) and "
        "per message in the batch workload, `process_batch` throughput of senders, receivers "
        "and both, and what a sender and a receiver key store after N transfers with tokens "
        "and `keep_last=1` beside the same without tokens under a 7-day window (every "
        "version of the window kept).",
        "",
        *table(tokens),
        "",
    ]
