"""What ``make mutate`` mutates and how it runs the tests: read by the driver
(``tool``), the measuring run (``lines``) and the report."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The packages copied into ``mutants/``: what the tests import besides ``tests``.
PACKAGES = ["streamstone_py", "handlers", "spark_driver"]
#: What every pytest of a run gets besides its tests: the same draws of every
#: hypothesis test in every run (a verdict must not depend on luck), and a test
#: that hangs under a mutant fails within two minutes, not the suite's five.
PYTEST_ARGS = ["-p", "no:cacheprovider", "--hypothesis-seed=0", "--timeout=120"]


@dataclass(frozen=True)
class Module:
    path: str  # streamstone_py/_writes.py
    tests: tuple[str, ...]
    all_killed: bool

    @property
    def name(self) -> str:  # streamstone_py._writes, as mutmut names a mutant's module
        return self.path.removesuffix(".py").replace("/", ".")


def load_modules(path: Path = HERE / "modules.toml") -> list[Module]:
    table = tomllib.loads(path.read_text())["modules"]
    return [
        Module(name, tuple(entry["tests"]), bool(entry.get("all_killed", False)))
        for name, entry in table.items()
    ]
