"""Property names Azurite drops without a word: the members of JavaScript's
``Object.prototype`` (``constructor``, ``toString``...; ``hasOwnProperty`` is
answered 500, after Azurite stored part of the transaction). Azure stores
them, so the engine refuses them only on the emulator's account,
``devstoreaccount1``, where a value would not read back as written."""

from __future__ import annotations

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.data.tables import TableClient

from streamstone_py import EventData, Include, Partition, Stream
from tests.helpers import S, rows

#: Each of Object.prototype's members, and where a write would carry it.
DROPPED = [
    "constructor", "__proto__", "__defineGetter__", "__defineSetter__", "__lookupGetter__",
    "__lookupSetter__", "hasOwnProperty", "isPrototypeOf", "propertyIsEnumerable",
    "toString", "toLocaleString", "valueOf",
]  # fmt: skip


def test_names_azurite_drops_are_refused_on_its_account_before_sending(
    partition: Partition,
) -> None:
    # Written, they were dropped from the row (a committed write whose answer
    # was lost was then reported as a conflict).
    assert partition.is_emulator
    for name in DROPPED:
        why = rf"{name!r} .*Azurite.*devstoreaccount1"
        with pytest.raises(ValueError, match=rf"event 'e1' property {why}"):
            S.write(Stream(partition), EventData(id="e1", properties={name: "x"}))
        with pytest.raises(ValueError, match=rf"included entity 'i' property {why}"):
            S.write(
                Stream(partition), EventData(includes=[Include.insert({"RowKey": "i", name: 1})])
            )
        with pytest.raises(ValueError, match=rf"stream header property {why}"):
            S.write(Stream(partition), EventData(stream_properties={name: True}))
        with pytest.raises(ValueError, match=rf"stream header property {why}"):
            S.provision(partition, {name: 1.5})
    assert rows(partition) == {}
    stream = S.provision(partition, {"Constructor": "x"})  # only the exact names
    with pytest.raises(ValueError, match=r"stream header property 'valueOf' .*Azurite"):
        S.set_properties(stream, {"valueOf": 1})
    S.write(stream, EventData(id="e1", properties={"toString_": "x", "ValueOf": 2}))
    assert rows(partition) == {
        "SS-HEAD": {"Version": 1, "Constructor": "x"},
        "SS-SE-0000000001": {"Version": 1, "SS_Id": "e1", "toString_": "x", "ValueOf": 2},
        "SS-UID-e1": {"Version": 1},
    }


def test_the_same_names_are_taken_for_any_other_account() -> None:
    # Nothing is sent: the check of a write on an account of the service.
    credential = AzureNamedKeyCredential("myaccount", "a2V5")
    table = TableClient("https://myaccount.table.core.windows.net", "t", credential=credential)
    partition = Partition(table, "k")
    assert not partition.is_emulator
    for name in DROPPED:
        Stream.check_write(
            Stream(partition, {name: 1}),
            EventData(
                id="e1", properties={name: "x"}, includes=[Include.insert({"RowKey": "i", name: 1})]
            ),
        )
