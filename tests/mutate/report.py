"""What a run of ``make mutate`` found: the score of each module, the
surviving mutants that are not known to be equivalent, and the entries of
``equivalent.toml`` that match no surviving mutant any more.

An equivalent mutant changes the code without changing what it does, so no
test can kill it. ``equivalent.toml`` lists each by its module, its function
and the lines it changes (not by mutmut's number, which moves when the
function changes), with the reason it cannot change an outcome.
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.utils.format_utils import orig_function_and_class_names_from_key

from .settings import HERE, Module

#: Verdicts that count as caught: a test failed, or hung under the mutant.
CAUGHT = {"killed", "timeout", "caught by type check", "segfault"}


@dataclass(frozen=True)
class Change:
    """A mutant as ``equivalent.toml`` names it."""

    module: str
    function: str
    before: str
    after: str


def change_of(path: str, name: str) -> Change:
    """The lines the mutant ``name`` of ``path`` changes, stripped of indentation."""
    diff = get_diff_for_mutant(name, path=path).splitlines()[2:]  # past the file names
    removed = [line[1:].strip() for line in diff if line.startswith("-")]
    added = [line[1:].strip() for line in diff if line.startswith("+")]
    function, cls = orig_function_and_class_names_from_key(name)
    qualified = f"{cls}.{function}" if cls else function
    return Change(path, qualified, "\n".join(removed), "\n".join(added))


@dataclass(frozen=True)
class Equivalents:
    reasons: dict[Change, str]

    @classmethod
    def load(cls, path: Path = HERE / "equivalent.toml") -> Equivalents:
        entries = tomllib.loads(path.read_text()).get("equivalent", [])
        reasons = {}
        for entry in entries:
            change = Change(entry["module"], entry["function"], entry["before"], entry["after"])
            if not entry.get("reason", "").strip():
                raise ValueError(f"{path}: an equivalent mutant needs its reason: {change}")
            reasons[change] = entry["reason"]
        return cls(reasons)

    def __contains__(self, change: Change) -> bool:
        return change in self.reasons


def _toml(change: Change) -> str:
    """The entry to add to ``equivalent.toml`` once the mutant is shown equivalent."""
    return "\n".join(
        [
            "[[equivalent]]",
            f"module = {json.dumps(change.module)}",
            f"function = {json.dumps(change.function)}",
            f"before = {json.dumps(change.before, ensure_ascii=False)}",
            f"after = {json.dumps(change.after, ensure_ascii=False)}",
            'reason = ""',
        ]
    )


def report(
    modules: list[Module], found: list[tuple[str, str, str]], equivalents: Equivalents
) -> bool:
    """Print the new survivors, then the score of each module; true if every
    module that must have all its mutants killed has."""
    counts: dict[str, Counter[str]] = {m.path: Counter() for m in modules}
    survivors: list[tuple[str, str, str, Change]] = []
    matched: set[Change] = set()
    for path, name, status in found:
        if path not in counts:
            continue  # a module not in this run: its verdicts are not reported
        if status in CAUGHT:
            counts[path]["mypy" if status == TYPED else "killed"] += 1
            continue
        change = change_of(path, name)
        if change in equivalents:
            matched.add(change)
            counts[path]["equivalent"] += 1
            continue
        counts[path][status] += 1
        survivors.append((path, name, status, change))

    for path, name, status, change in survivors:
        print(f"\n=== {name} ({status}) in {path}")
        print(get_diff_for_mutant(name, path=path))
        print("If no test can tell it from the code, list it in tests/mutate/equivalent.toml:")
        print(_toml(change))

    stale = {c for c in equivalents.reasons if c.module in counts} - matched
    for change in sorted(stale, key=lambda c: (c.module, c.function, c.before, c.after)):
        print(
            f"\nequivalent.toml lists a mutant that did not survive (killed, or the code "
            f"changed): {change.module} {change.function}: {change.before!r} -> {change.after!r}"
        )

    print(f"\n{'module':28} {'mutants':>7} {'killed':>6} {'mypy':>5} {'equiv.':>6} {'left':>5} "
          f"{'score':>6}")  # fmt: skip
    ok = True
    for module in modules:
        c = counts[module.path]
        total = sum(c.values())
        caught = c["killed"] + c["mypy"]
        left = total - caught - c["equivalent"]
        judged = total - c["equivalent"]
        score = f"{100 * caught / judged:.1f}%" if judged else "-"
        detail = ", ".join(f"{n} {s}" for s, n in sorted(c.items()) if s not in SCORED)
        print(
            f"{module.path:28} {total:>7} {c['killed']:>6} {c['mypy']:>5} {c['equivalent']:>6} "
            f"{left:>5} {score:>6}" + (f"  ({detail})" if detail else "")
        )
        if module.all_killed and left:
            ok = False
    return ok


#: A mutant mypy --strict refuses cannot land (``make test`` runs it): caught.
TYPED = "caught by type check"
SCORED = {"killed", "mypy", "equivalent"}
