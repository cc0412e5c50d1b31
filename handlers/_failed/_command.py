"""``streamstone-poison``: a poison queue listed, an entry shown, entries sent
back or purged, its depth for an alert; no Spark needed.

Credentials come from the environment, as for ``streamstone-spark``:
``STREAMSTONE_CONNECTION_STRING``, or ``STREAMSTONE_ACCOUNT_URL`` (or
``STREAMSTONE_QUEUE_ACCOUNT_URL``) with ``STREAMSTONE_SAS_TOKEN`` or an Azure
identity.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TextIO
from xml.etree.ElementTree import ParseError

from azure.core.exceptions import AzureError
from azure.storage.queue import QueueClient

from .._messages._envelope import json_data
from .._queues._account import QueueConfig, check_queue_name, queue_beside
from .._queues._publisher import POISON_SUFFIX
from ._select import PoisonFilter, PoisonSummary
from ._sendback import purge_poison, send_back
from ._shelf import ShelvedEntry, find_poison, not_seen, poison_depth, read_poison

__all__ = ["build_parser", "main"]

_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _duration(text: str) -> timedelta:
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 30m, 2h, 1d, 1w")
    return timedelta(**{_UNITS[found[2]]: int(found[1])})


def _queue(text: str) -> str:
    try:
        return check_queue_name(text, "the poison queue")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _filters(command: argparse.ArgumentParser) -> None:
    group = command.add_argument_group("which entries (each given narrows; repeat to add)")
    group.add_argument("--reason", action="append", default=[], metavar="GROUP",
                       help="a reason group, as `list` shows it")  # fmt: skip
    group.add_argument("--key", action="append", default=[], help="the message's key")
    group.add_argument("--type", action="append", default=[], help="the message's type")
    group.add_argument("--id", action="append", default=[],
                       help="the entry's id or the original message's id")  # fmt: skip
    group.add_argument("--older-than", type=_duration, metavar="AGE",
                       help="poisoned at least this long ago: 90s, 30m, 2h, 1d, 1w")  # fmt: skip


def _shared(parser: argparse.ArgumentParser, hold: Any, any_name: Any) -> None:
    parser.add_argument("--hold", type=_duration, default=hold, metavar="AGE",
                        help="how long entries stay hidden from other readers while one "
                        "operation reads them (default: 5m)")  # fmt: skip
    parser.add_argument("--any-name", action="store_true", default=any_name,
                        help=f"take a queue whose name does not end in {POISON_SUFFIX!r} "
                        "(operations receive its messages: never a live queue)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: one subcommand per operation."""
    parser = _Parser(
        prog="streamstone-poison",
        description="Poison queues: see failed messages, understand them, send them back once "
        "the cause is fixed (each keeps its id, so one that was in fact processed, or sent "
        "back twice, is a duplicate and changes nothing), or purge them. Credentials come "
        "from the environment: STREAMSTONE_CONNECTION_STRING, or STREAMSTONE_ACCOUNT_URL "
        "(or STREAMSTONE_QUEUE_ACCOUNT_URL) with STREAMSTONE_SAS_TOKEN or an Azure identity. "
        "Exit status: 0 done; 1 the storage service failed (run it again: it is safe); "
        "2 refused before anything was done.",
    )
    _shared(parser, timedelta(minutes=5), False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = commands.add_parser("list", help="count entries by reason, key and age")
    shown = commands.add_parser("show", help="one entry whole: reason, receives, message")
    back = commands.add_parser("send-back", help="send entries back to their queue, then delete")
    purge = commands.add_parser("purge", help="delete entries for good, after a confirmation")
    depth = commands.add_parser("depth", help="how many entries, and the oldest one's age")
    for command in (listing, shown, back, purge, depth):
        # Before the operation's name or after it: a subcommand's own default
        # would otherwise undo what was given before it.
        _shared(command, argparse.SUPPRESS, argparse.SUPPRESS)
        command.add_argument("queue", type=_queue, metavar="POISON_QUEUE",
                             help=f"the poison queue, such as orders{POISON_SUFFIX}")  # fmt: skip
    for command in (listing, shown, depth):
        command.add_argument("--json", action="store_true", help="print JSON")
    shown.add_argument("id", help="the entry's id, or the original message's id")
    _filters(back)
    _filters(purge)
    back.add_argument("--to", type=_queue, metavar="QUEUE",
                      help="send to this queue instead of the one each came from")  # fmt: skip
    back.add_argument(
        "--dry-run", action="store_true", help="print what would be sent, send nothing"
    )
    purge.add_argument("--yes", action="store_true", help="do not ask for the confirmation")
    return parser


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).isoformat(timespec="seconds")


def _entry_data(shelved: ShelvedEntry) -> dict[str, Any]:
    entry, message = shelved.entry, shelved.message
    data: dict[str, Any] = {"id": shelved.id, "poisoned_at": _when(shelved.poisoned_at)}
    if entry is not None:
        data.update(reason=entry.reason, receives=entry.dequeue_count, queue=entry.queue,
                    queue_message_id=entry.queue_message_id)  # fmt: skip
    if message is not None:
        data["message"] = {"id": message.id, "key": message.key, "type": message.type,
                           "due": message.due and _when(message.due),
                           "body": json_data(message.body)}  # fmt: skip
    if shelved.error is not None:
        data.update(error=shelved.error, text=shelved.text)
    return data


def _list(poison: QueueClient, args: argparse.Namespace, out: TextIO) -> int:
    entries = read_poison(poison, hold=args.hold)
    summary, unseen = PoisonSummary.of(entries), not_seen(poison, len(entries))
    if args.json:
        json.dump({
            "queue": poison.queue_name, "total": summary.total, "by_reason": summary.by_reason,
            "by_key": summary.by_key, "by_age": summary.by_age,
            "oldest": summary.oldest and _entry_data(summary.oldest),
            "newest": summary.newest and _entry_data(summary.newest),
            "undecodable": [_entry_data(s) for s in summary.undecodable], "not_seen": unseen,
        }, out, indent=2)  # fmt: skip
        out.write("\n")
        return 0
    unread = f" ({len(summary.undecodable)} do not read)" if summary.undecodable else ""
    out.write(f"{poison.queue_name}: {summary.total} entries{unread}\n")
    if summary.oldest and summary.newest:
        out.write(f"oldest {_when(summary.oldest.poisoned_at)}, newest "
                  f"{_when(summary.newest.poisoned_at)}\n")  # fmt: skip
    for title, counts in (("reason", summary.by_reason), ("key", summary.by_key),
                          ("age", summary.by_age)):  # fmt: skip
        if counts:
            out.write(f"by {title}:\n")
            out.writelines(f"  {n:>6}  {name}\n" for name, n in list(counts.items())[:20])
    if summary.undecodable:
        out.write("do not read (left alone; `show` gives each whole):\n")
        out.writelines(f"  {s.id}  {s.error}\n" for s in summary.undecodable)
    _unseen(poison, len(entries), unseen, out)
    return 0


def _show(poison: QueueClient, args: argparse.Namespace, out: TextIO) -> int:
    found = find_poison(poison, args.id, hold=args.hold)
    if not found:
        unseen = not_seen(poison, 0)
        held = f" ({unseen} entries held by another reader were not seen)" if unseen else ""
        print(f"streamstone-poison: no entry {args.id!r} in {poison.queue_name}{held}",
              file=sys.stderr)  # fmt: skip
        return 2
    for shelved in found:
        data = _entry_data(shelved)
        if args.json:
            json.dump(data, out, indent=2)
            out.write("\n")
            continue
        message = data.pop("message", None)
        out.writelines(f"{name:<17} {value}\n" for name, value in data.items())
        if message is not None:
            body = json.dumps(message.pop("body"), indent=2, ensure_ascii=False)
            out.writelines(f"message {name:<9} {'-' if value is None else value}\n"
                           for name, value in message.items())  # fmt: skip
            out.write(f"message body\n{body}\n")
    return 0


def _where(args: argparse.Namespace) -> PoisonFilter:
    return PoisonFilter(frozenset(args.reason), frozenset(args.key), frozenset(args.type),
                        frozenset(args.id), args.older_than)  # fmt: skip


def _send_back(poison: QueueClient, args: argparse.Namespace, out: TextIO) -> int:
    to = None if args.to is None else queue_beside(poison, args.to)
    verb = "would send" if args.dry_run else "sent"

    def said(shelved: ShelvedEntry, queue: str) -> None:  # as it goes: a failure keeps them
        assert shelved.message is not None
        out.write(f"{verb} {shelved.message.id!r} (key {shelved.message.key!r}, type "
                  f"{shelved.message.type!r}) to {queue}\n")  # fmt: skip
        out.flush()

    report = send_back(poison, _where(args), to=to, dry_run=args.dry_run, hold=args.hold,
                       on_sent=said)  # fmt: skip
    unread = sum(s.message is None for s in report.left)
    gone = "would be deleted" if report.dry_run else "deleted"
    copies = f", {len(report.copies)} copies of those {gone}" if report.copies else ""
    out.write(f"{len(report.sent)} {verb}{copies}; {len(report.left)} left in "
              f"{poison.queue_name}" + (f" ({unread} do not read: see `list`)" if unread else "")
              + "\n")  # fmt: skip
    if report.not_deleted:
        out.write(f"{len(report.not_deleted)} sent but not deleted (their hold ran out): a "
                  "later send-back sends them again, as duplicates\n")  # fmt: skip
    seen = len(report.sent) + len(report.copies) + len(report.left)
    _unseen(poison, seen, report.not_seen, out)
    return 0


def _purge(poison: QueueClient, args: argparse.Namespace, out: TextIO) -> int:
    def confirm(entries: list[ShelvedEntry]) -> bool:
        if not entries or args.yes:
            return True
        out.write(f"delete {len(entries)} entries of {poison.queue_name} for good? [y/N] ")
        out.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    report = purge_poison(poison, _where(args), confirm=confirm, hold=args.hold)
    out.write(f"{len(report.purged)} purged; {len(report.left)} left in {poison.queue_name}\n")
    _unseen(poison, len(report.purged) + len(report.left), report.not_seen, out)
    return 0


def _depth(poison: QueueClient, args: argparse.Namespace, out: TextIO) -> int:
    found = poison_depth(poison)
    age = None if found.oldest_age is None else int(found.oldest_age.total_seconds())
    if args.json:
        data = {"queue": found.queue, "depth": found.depth, "oldest_age_seconds": age,
                "hidden": found.hidden}  # fmt: skip
        out.write(json.dumps(data) + "\n")
    else:
        hidden = "" if not found.hidden else f" ({found.hidden} held by a reader, not shown)"
        out.write(f"{found.queue}: depth {found.depth}, oldest shown "
                  + ("-" if age is None else f"{age} s old") + hidden + "\n")  # fmt: skip
    return 0


def _unseen(poison: QueueClient, seen: int, unseen: int, out: TextIO) -> None:
    """Say so when entries were out of sight (another reader's, or a stopped
    send-back's, still held): they show again when their hold runs out."""
    if unseen:
        out.write(f"{poison.queue_name} counts {seen + unseen} entries, {unseen} not seen: "
                  "held by another reader, or by an operation that stopped; they show again "
                  "when that hold runs out (--hold)\n")  # fmt: skip


_OPERATIONS = {"list": _list, "show": _show, "send-back": _send_back, "purge": _purge,
               "depth": _depth}  # fmt: skip


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command; its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "to", None) and args.to.endswith(POISON_SUFFIX):
        parser.error(f"--to {args.to!r} is a poison queue: it holds entries, not messages")
    if not (args.any_name or args.queue.endswith(POISON_SUFFIX)):
        parser.error(f"{args.queue!r} does not end in {POISON_SUFFIX!r}: is it a poison "
                     "queue? (--any-name takes it)")  # fmt: skip
    # A reason or a text may hold anything, lone surrogates included: escaped, not fatal.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        poison = QueueConfig.from_env().service().get_queue_client(args.queue)
        return _OPERATIONS[args.command](poison, args, out or sys.stdout)
    except ValueError as exc:
        print(f"streamstone-poison: {exc}", file=sys.stderr)
        return 2
    except (AzureError, ParseError) as exc:  # a cut answer's XML does not parse
        # The SDK's text runs on with the request id and the answer's XML: its first line.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"streamstone-poison: the storage service failed: {first} (run it again: it is "
              "safe)", file=sys.stderr)  # fmt: skip
        return 1
