"""Every option of the installed commands is explained on a docs page, by its name."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from handlers._failed._command import build_parser as poison_parser
from spark_driver._options import build_parser as spark_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _options(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:  # argparse keeps no public list of them
        found |= {o for o in action.option_strings if o.startswith("--") and o != "--help"}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


@pytest.mark.parametrize(
    ("parser", "page"),
    [(spark_parser(), "spark-pipeline.md"), (poison_parser(), "failed-messages.md")],
    ids=["streamstone-spark", "streamstone-poison"],
)
def test_every_option_of_a_command_is_on_its_page(
    parser: argparse.ArgumentParser, page: str
) -> None:
    text = (DOCS / page).read_text()
    assert sorted(o for o in _options(parser)
                  if not re.search(rf"(?<![\w-]){o}(?![\w-])", text)) == []  # fmt: skip
