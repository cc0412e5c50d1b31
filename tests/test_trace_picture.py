"""The picture of a message's trace in docs/observability.md comes from a real
run: examples/trace_picture.py, run now, draws the same bars in the same
order (their times aside) as the page shows."""

from __future__ import annotations

import re

from tests.test_docs import ROOT, example_prints

PAGE = ROOT / "docs" / "observability.md"


def _shape(lines: list[str]) -> list[str]:
    """The block's lines without its times: names, depths and sections."""
    return [re.sub(r" [\d.]+ ms :\d+, \d+$", "", line) for line in lines]


def test_the_page_s_trace_picture_is_what_a_run_draws(connection_string: str) -> None:
    drawn = example_prints("trace_picture.py", connection_string)
    shown = PAGE.read_text().split("trace picture: begin")[1].split("<!-- trace picture: end")[0]
    assert _shape(shown.splitlines()[1:]) == _shape(drawn)
    assert _shape(drawn)[5:] == [
        "    section receive",
        "    receive trace-picture",
        "    section process",
        "    process ShootingRange",
        "    · process_batch ShootingRange",
        "    · · submit_transaction tracepicture",
        "    · publish ShootingRange",
        "    section delete",
        "    delete trace-picture",
        "```",
    ]
