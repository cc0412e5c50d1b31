"""load_state (id row + point reads) agrees with the seed's replay of the whole stream."""

from __future__ import annotations

import random
from typing import Any

from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor
from handlers._store import StoredVersion
from handlers.examples import shooting_range
from streamstone_py import Stream


def replay_load(p: Processor[Any], key: str, message_id: str) -> tuple[Any, int, bool]:
    """The seed's LoadState: read the stream from the start, stop at the message's own version."""
    state = p.handler.encode_state(p.handler.initial_state())
    version = 0
    partition = p.store.partition(key)
    start = 1
    while True:
        page = Stream.read(partition, start_version=start, slice_size=1000)
        for event in page.events:
            if event.id == message_id:
                return p.handler.decode_state(state), version, True
            state = StoredVersion.from_event(event).state
            version = event.version
        if page.is_end_of_stream:
            return p.handler.decode_state(state), version, False
        start = page.events[-1].version + 1


def test_load_state_agrees_with_replay_on_random_histories(table: TableClient, game: str) -> None:
    rng = random.Random(20261121)
    for history in range(6):
        key = f"{game}-{history}"
        p = Processor(shooting_range, table, InMemoryPublisher())
        pool = [Message(f"h{history}-r{n}", key, "StartNewRound") for n in range(3)]
        pool += [
            Message(f"h{history}-f{n}", key, "FireAt", {"position": rng.randrange(100)})
            for n in range(30)
        ]
        delivered: list[Message] = []
        for _ in range(rng.randrange(10, 40)):
            batch = [rng.choice(pool) for _ in range(rng.randrange(1, 6))]
            delivered += batch
            p.process_batch(key, batch)
        probes = {m.id for m in delivered} | {f"h{history}-never-{n}" for n in range(3)}
        for message_id in sorted(probes):
            loaded = p.load_state(key, message_id)
            found = (loaded.state, loaded.version, loaded.is_duplicate)
            assert found == replay_load(p, key, message_id), (history, message_id)
