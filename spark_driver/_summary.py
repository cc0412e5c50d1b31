"""What a run reports: its figures as a table and an exit status, and the
persisted rows they were computed from."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final, NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ._settings import JobSettings
from ._tasks._executor import OUTCOME, OUTPUT, RETENTION, TASK

__all__ = ["UNSETTLED_EXIT", "JobResult", "Summary", "Unsettled"]

#: How many abandoned or faulted messages the summary shows.
SHOWN_UNSETTLED: Final = 5


class Unsettled(NamedTuple):
    """An abandoned or faulted message, as the summary shows it."""

    status: str
    key: str
    message_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Summary:
    """The figures of one run, computed from the outcome and output rows it wrote."""

    messages_in: int
    processed: int
    duplicates: int
    new_outputs: int
    reemitted_outputs: int
    dead_lettered: int
    abandoned: int
    faulted: int
    conflicts_retried: int
    #: Versions removed by the job's own retention (``keep_last``/``retain_for``).
    versions_removed: int = 0
    #: Storage requests (HTTP, retries included) of the task attempts whose rows
    #: were kept; the outbox's dispatch marks after the commit are not counted.
    requests: int = 0
    # Not figures (not in the summary's JSON): what the table adds below them.
    #: The first abandoned or faulted messages, by key and message id.
    unsettled: tuple[Unsettled, ...] = field(default=(), compare=False)
    #: Keys retention ran for and removed nothing from (the run's own versions stay).
    retained_nothing: int = field(default=0, compare=False)
    #: Of the abandoned messages, those the handler failed on (not only held
    #: back behind one): the handler needs a look before they are delivered again.
    handler_failures: int = field(default=0, compare=False)
    #: Lines on the input the summary adds at its end (a file written to after
    #: a stream took it).
    notes: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of(
        cls, outcomes: DataFrame, outputs: DataFrame, results: DataFrame | None = None
    ) -> Summary:
        """One aggregation over the outcome rows, and a count of the output rows.

        An output row is new when its source message (``source_key``,
        ``source_message_id``) was stored by this run (``completed``), and
        re-emitted when its source is a duplicate here: the message was stored
        before this run's attempt (by an earlier run, a failed task attempt or
        a micro-batch that crashed before its commit), so the same output, same
        id and content, may have been written before, or may never have been
        committed anywhere. The retention and request figures come from the
        tasks' ``results``.
        """
        status = F.col("status")

        def count(name: str) -> Any:
            return F.sum((status == name).cast("long"))

        row = outcomes.agg(
            F.count(F.lit(1)).alias("messages_in"),
            count("completed").alias("processed"),
            count("duplicate").alias("duplicates"),
            count("dead_lettered").alias("dead_lettered"),
            count("abandoned").alias("abandoned"),
            count("faulted").alias("faulted"),
            F.sum("conflicts").alias("conflicts_retried"),
        ).first()
        assert row is not None
        figures: dict[str, Any] = {k: int(v or 0) for k, v in row.asDict().items()}
        stored = (
            outcomes.where(status == "completed")
            .select(F.col("key").alias("_key"), F.col("message_id").alias("_source"))
            .distinct()
        )
        split = (
            outputs.join(
                stored,
                (outputs["source_key"] == stored["_key"])
                & (outputs["source_message_id"] == stored["_source"]),
                "left",
            )
            .agg(
                F.count(F.lit(1)).alias("all"),
                F.count("_source").alias("new"),
            )
            .first()
        )
        assert split is not None
        total, new = int(split["all"]), int(split["new"])
        removed = requests = nothing = failures = 0
        if results is not None:
            kind = F.col("kind")
            retention = kind == RETENTION
            summed = results.agg(
                F.sum(F.when(retention, F.col("version"))),
                F.sum(F.when(kind == TASK, F.col("requests"))),
                F.sum(
                    (retention & (F.col("version") == 0) & F.col("reason").isNull()).cast("long")
                ),
                F.sum(((kind == OUTCOME) & (F.col("cause") == "failed")).cast("long")),
            ).first()
            assert summed is not None
            removed, requests, nothing, failures = (int(v or 0) for v in summed)
        unsettled: tuple[Unsettled, ...] = ()
        if figures["abandoned"] or figures["faulted"]:
            first = (
                outcomes.where(status.isin("abandoned", "faulted"))
                .orderBy("key", "message_id")
                .select("status", "key", "message_id", "reason")
                .limit(SHOWN_UNSETTLED)
                .collect()
            )
            unsettled = tuple(Unsettled(*(str(v) for v in row)) for row in first)
        return cls(
            new_outputs=new,
            reemitted_outputs=total - new,
            versions_removed=removed,
            requests=requests,
            unsettled=unsettled,
            retained_nothing=nothing,
            handler_failures=failures,
            **figures,
        )

    def figures(self) -> dict[str, int]:
        """The figures by name, as the summary's JSON row holds them."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.compare}

    @property
    def outputs(self) -> int:
        """Every output row written: new and re-emitted."""
        return self.new_outputs + self.reemitted_outputs

    @property
    def exit_status(self) -> int:
        """0 if every message is settled (completed, duplicate or dead-lettered),
        else :data:`UNSETTLED_EXIT` (some must be delivered again)."""
        return UNSETTLED_EXIT if self.abandoned or self.faulted else 0

    def table(self, output: str | None = None, queue: tuple[str, int] | None = None) -> str:
        """The summary as a readable two-column table, then what needs a word:
        the first abandoned or faulted messages with their reasons (and where
        ``output`` keeps them all), what to do about them (``queue``: the
        input queue's name and the receive that poisons, when it redelivers
        them itself), and a retention that removed nothing."""
        labels = {
            "messages_in": "messages in",
            "processed": "processed (new version stored)",
            "duplicates": "duplicates (no change)",
            "new_outputs": "output messages, new",
            "reemitted_outputs": "output messages, re-emitted",
            "dead_lettered": "dead-lettered",
            "abandoned": "abandoned (handler error)",
            "faulted": "faulted (in doubt)",
            "conflicts_retried": "conflicts retried",
            "versions_removed": "versions removed (retention)",
            "requests": "storage requests",
        }
        width = max(len(v) for v in labels.values())
        lines = [
            f"  {labels[name]:<{width}}  {value:>10,}" for name, value in self.figures().items()
        ]
        rule = "  " + "-" * (width + 12)
        return "\n".join([rule, *lines, rule, *self._notes(output, queue)])

    def advice(self, queue: tuple[str, int] | None = None) -> str:
        """What to do about the abandoned or faulted messages, for this input."""
        fix = self.handler_failures > 0
        if queue is not None:
            name, most = queue
            return (
                f"exit status {UNSETTLED_EXIT}; queue {name!r} delivers each again by itself "
                f"after its backoff, and poisons one still failing on receive {most}"
                + (": fix the handler before then" if fix else "")
            )
        if fix:
            return f"exit status {UNSETTLED_EXIT}: fix the handler, then deliver the input again"
        return f"exit status {UNSETTLED_EXIT}: deliver the input again, which is safe"

    def _notes(self, output: str | None, queue: tuple[str, int] | None) -> list[str]:
        notes: list[str] = []
        count = self.abandoned + self.faulted
        if count:
            shown = len(self.unsettled)
            which = f"the first {shown} of {count}" if shown < count else f"all {count}"
            if count == 1:
                which = "the one"
            plural = "s" if count > 1 else ""
            notes.append(f"  {which} abandoned or faulted message{plural} ({self.advice(queue)}):")
            for status, key, message_id, reason in self.unsettled:
                line = " ".join(reason.split())
                line = line if len(line) <= 300 else line[:300] + "..."
                notes.append(f"    {status} {message_id!r} of key {key!r}: {line}")
            where = f"{output}/outcomes" if output else "the outcomes"
            notes.append(f"  every one, with its reason: {where} (status abandoned or faulted)")
        if self.retained_nothing:
            notes.append(
                f"  retention removed nothing from {self.retained_nothing:,} keys: the versions "
                "a run touches always stay (its duplicates' too), so rerunning the same input "
                "removes none; a later run with newer messages does"
            )
        notes.extend(f"  {note}" for note in self.notes)
        return notes


#: The columns of the output rows written: the output, its source, its times
#: and its headers (the trace context it was published in among them).
_OUTPUT_COLUMNS: Final = (
    "message_id", "key", "type", "body", "source_message_id", "source_key", "due", "produced",
    "headers",
)  # fmt: skip

#: The exit status of a run that left messages abandoned or faulted.
UNSETTLED_EXIT: Final = 3


@dataclass(frozen=True)
class JobResult:
    """The persisted rows of one run: release them with :meth:`unpersist`."""

    results: DataFrame
    outputs: DataFrame
    outcomes: DataFrame
    settings: JobSettings
    partitions: int

    @classmethod
    def of(cls, results: DataFrame, settings: JobSettings, partitions: int) -> JobResult:
        """The outputs and outcomes of the tasks' ``results`` rows (persisted)."""
        kind = F.col("kind")
        outputs = (
            results.where(kind == OUTPUT).select(*_OUTPUT_COLUMNS).dropDuplicates(["message_id"])
        )
        # A dead letter's body column holds its raw input, to fix and send again.
        outcomes = results.where(kind == OUTCOME).select(
            "message_id", "key", "type", "status", "version", "reason", "conflicts",
            F.col("body").alias("raw"),
        )  # fmt: skip
        return cls(results, outputs, outcomes, settings, partitions)

    @property
    def dead_letters(self) -> DataFrame:
        return self.outcomes.where(F.col("status") == "dead_lettered")

    @property
    def retention(self) -> DataFrame:
        """One row per key the job's retention ran for: ``key``, ``removed`` and
        ``reason`` (why nothing was removed: skipped or failed; else null)."""
        return self.results.where(F.col("kind") == RETENTION).select(
            "key", F.col("version").alias("removed"), "reason"
        )

    def unpersist(self) -> None:
        self.results.unpersist()
