"""The report's sections on the engine, the handlers runtime, Spark and the
task body: each section's records, its plot and its table in one function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _report_format import Record, find, plot, section, table


def engine_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The engine's writes and reads beside the raw SDK's."""
    return [
        "## Engine vs raw azure-data-tables calls",
        "",
        "The ceiling is the raw SDK doing the same rows by hand.",
        "",
        *table(r for r in records if r["name"] in ("stream.write", "stream.read")),
        "",
    ]


def load_state_section(records: list[Record], images: Path, name: str) -> list[str]:
    """``load_state`` beside a replay, by stream length (log-log plot)."""
    loads = [
        r
        for r in records
        if r["name"] in ("handlers.load_state.new", "handlers.load_state.duplicate")
    ]
    if not loads:
        return []

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

    plot(images / "load_state.png", draw_loads)
    return [
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


def handlers_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The handlers' throughput and round trips beside a naive handler."""
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
    if not handlers:
        return []
    naive = find(records, "handlers.process")[0]["peer_value"]
    bars = [("naive (no de-dup)", naive)] + [
        (label, find(records, n)[0]["value"])
        for label, n in (
            ("process", "handlers.process"),
            ("process_batch", "handlers.process_batch"),
            ("outbox", "handlers.outbox"),
        )
    ]

    def draw_handlers(ax: Any) -> None:
        ax.bar([b[0] for b in bars], [b[1] for b in bars], color=["#999", "#4a7", "#27a", "#a72"])
        ax.set_ylabel("messages/s (median)")
        ax.set_title("handler throughput: the cost of exactly-once")

    plot(images / "handlers.png", draw_handlers)
    return section(
        "Handlers: throughput and round trips, beside a naive handler",
        "The naive handler reads its state row, applies the message and writes the row back: "
        "no message ids, no versions, so a duplicate changes the state twice.",
        f"![handler throughput]({name}/handlers.png)",
        handlers,
    )


def spark_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The Spark pipeline's figures (no plot)."""
    spark = [r for r in records if r["name"].startswith("spark.")]
    if not spark:
        return []
    return ["## The Spark pipeline", "", *table(spark), ""]


def keys_section(records: list[Record], images: Path, name: str) -> list[str]:
    """``process_batch`` throughput by number of keys."""
    keys = find(records, "handlers.scaling.keys")
    if not keys:
        return []

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

    plot(images / "keys.png", draw_keys)
    return [
        "## Scaling: keys",
        "",
        f"![throughput vs keys]({name}/keys.png)",
        "",
        *table(keys),
        "",
    ]


def many_keys_section(records: list[Record], images: Path, name: str) -> list[str]:
    """Many keys with few messages each: the task body's throughput by keys and
    added latency (the plot), then every ``keys.``, ``task.`` and ``client.`` record."""
    out: list[str] = []
    many = [r for r in records if r["name"].startswith(("keys.", "task.", "client."))]
    throughput = find(records, "task.keys.throughput")
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

        plot(images / "many_keys.png", draw_throughput)
        out += [f"![task throughput vs keys]({name}/many_keys.png)", ""]
    if many:
        out += [*table(many), ""]
    return out


def async_section(records: list[Record], images: Path, name: str) -> list[str]:
    """The async engine beside the sync one (no plot)."""
    asyncs = find(records, "stream.write.async")
    if not asyncs:
        return []
    return ["## Async engine vs sync", "", *table(asyncs), ""]


def task_profile_section(records: list[Record], images: Path, name: str) -> list[str]:
    """cProfile of the task body, by package and by function."""
    groups = [r for r in records if r["name"].startswith("profile.task.group.")]
    functions = [r for r in records if r["name"].startswith("profile.task.function.")]
    if not groups:
        return []
    p = groups[0]["params"]
    return [
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
