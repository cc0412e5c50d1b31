"""The seed's example handlers: ShootingRange and LeaderBoard.

ShootingRange (one state per game): ``StartNewRound`` places the target at a
random position; ``FireAt`` at the target publishes ``Hit``, elsewhere
``Missed``; after ``MAX_ATTEMPTS`` shots the target moves to a position from
``context.random()``. LeaderBoard (one state per game) counts the ``Hit`` and
``Missed`` messages ShootingRange publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._context import HandlerContext
from ._handler import handler
from ._message import Message

__all__ = ["MAX_ATTEMPTS", "LeaderBoard", "ShootingRange", "leader_board", "shooting_range"]

MAX_ATTEMPTS = 3
POSITIONS = 100


@dataclass
class ShootingRange:
    target_position: int = 0
    number_of_attempts: int = 0
    rounds: int = 0


@dataclass
class LeaderBoard:
    hits: int = 0
    misses: int = 0
    players: dict[str, int] = field(default_factory=dict)


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def shooting_range(state: ShootingRange, message: Message, ctx: HandlerContext) -> None:
    body = message.body or {}
    if message.type == "StartNewRound":
        state.rounds += 1
        state.number_of_attempts = 0
        state.target_position = ctx.random().randrange(POSITIONS)
        return
    position = body["position"]
    hit = position == state.target_position
    ctx.publish(
        "Hit" if hit else "Missed",
        {
            "game": message.key,
            "player": body.get("player", ""),
            "position": position,
            "attempt_of": message.id,
        },
    )
    if state.number_of_attempts + 1 >= MAX_ATTEMPTS:
        state.number_of_attempts = 0
        state.target_position = ctx.random().randrange(POSITIONS)
    else:
        state.number_of_attempts += 1


@handler("LeaderBoard", LeaderBoard, types=["Hit", "Missed"])
def leader_board(state: LeaderBoard, message: Message, ctx: HandlerContext) -> None:
    player = (message.body or {}).get("player", "")
    if message.type == "Hit":
        state.hits += 1
        state.players[player] = state.players.get(player, 0) + 1
    else:
        state.misses += 1
