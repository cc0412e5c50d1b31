"""An output id given by a handler goes out with one content only, whatever
batches its key's messages come in: the second message that publishes it
with other content is refused, in the same batch, a later one, or after a
restart, on both strategies; the same content may be published again."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from azure.data.tables import TableClient

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from handlers._outcome import StrategyName


@handler("Claims", types=["Claim"])
def claims(state: dict[str, str], message: Message, ctx: HandlerContext) -> None:
    seat, by = message.body["seat"], message.body["by"]
    state[message.id] = seat
    ctx.publish("Claimed", {"seat": seat, "by": by}, id=f"claim-{seat}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _records(table: TableClient, key: str) -> dict[str, tuple[str, str]]:
    """The key's output id records: row key, and the first publisher's id and content digest."""
    rows = table.query_entities(
        "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
        parameters={"pk": key, "lo": "Claims|OI-", "hi": "Claims|OI."},
    )
    return {r["RowKey"]: (r["MessageId"], r["Digest"]) for r in rows}


@pytest.mark.parametrize("batches", ["one batch", "one batch each, restarted"])
def test_an_output_id_goes_out_with_one_content_however_the_messages_are_batched(
    table: TableClient, strategy: StrategyName, batches: str
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    claim = {
        "A": {"seat": "a1", "by": "ann"},
        "B": {"seat": "a1", "by": "bob"},  # claim-a1 with other content: refused
        "C": {"seat": "b2", "by": "cat"},
        "D": {"seat": "a1", "by": "ann"},  # claim-a1 with A's content: goes out again
    }
    messages = [Message(id, key, "Claim", body) for id, body in claim.items()]
    publisher = InMemoryPublisher()

    def processor() -> Processor[dict[str, str]]:
        return Processor(claims, table, publisher, strategy=strategy)

    if batches == "one batch":
        outcomes = processor().process_batch(key, messages)
    else:
        outcomes = [o for m in messages for o in processor().process_batch(key, [m])]

    assert [(o.message_id, o.kind, o.reason) for o in outcomes] == [
        ("A", "completed", None),
        ("B", "refused", "output id 'claim-a1' of message 'B' was published by message 'A' "
                         "with other content"),
        ("C", "completed", None),
        ("D", "completed", None),
    ]  # fmt: skip
    current = processor().current_state(key)
    assert (current.version, current.state) == (3, {"A": "a1", "C": "b2", "D": "a1"})
    assert [(m.id, m.body) for m in publisher.deliveries] == [
        ("claim-a1", claim["A"]), ("claim-b2", claim["C"]), ("claim-a1", claim["A"]),
    ]  # fmt: skip
    assert publisher.divergent == []
    sent = {m.id: m for m in publisher.deliveries}
    written = {
        f"Claims|OI-{_sha(id.encode())}": (by, _sha(sent[id].encode()))
        for id, by in [("claim-a1", "A"), ("claim-b2", "C")]
    }
    assert _records(table, key) == written
    # Retention removes a record with the version that wrote it.
    assert processor().retain(key, keep_last=1) > 0
    kept = {v.message_id for v in processor().history(key)}
    assert _records(table, key) == {k: v for k, v in written.items() if v[0] in kept}
