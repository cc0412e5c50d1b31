"""``make demo-tokens`` as written: the replay after retention creates money
without tokens, and none with them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tokens_demo_prints_the_money_created_out_of_nothing(connection_string: str) -> None:
    env = dict(os.environ, STREAMSTONE_CONNECTION_STRING=connection_string)
    done = subprocess.run(
        [sys.executable, "examples/tokens_demo.py"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    pattern = (
        r"(with|without) tokens: 10000 before, 10000 after the transfers, (\d+) after "
        r"the replay: (\d+) created out of nothing"
    )
    found = {m[1]: (int(m[2]), int(m[3])) for line in lines if (m := re.fullmatch(pattern, line))}
    assert found["with"] == (10000, 0)
    replayed, created = found["without"]
    assert created == replayed - 10000 > 0
