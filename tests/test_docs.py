"""The README's examples and the walkthrough run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("index", range(len(_python_blocks(ROOT / "README.md"))))
def test_readme_python_blocks_run(connection_string: str, index: int) -> None:
    code = _python_blocks(ROOT / "README.md")[index]
    env = dict(os.environ, STREAMSTONE_CONNECTION_STRING=connection_string)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_walkthrough_prints_each_step(connection_string: str) -> None:
    env = dict(os.environ, STREAMSTONE_CONNECTION_STRING=connection_string)
    done = subprocess.run(
        [sys.executable, "examples/stream_walkthrough.py"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "   -> version 0, properties {'Customer': 'ACME'}" in lines
    assert "   -> stream at version 2; events [1, 2]" in lines
    assert "   -> duplicate detected: event id 'msg-2'; nothing was written" in lines
    conflict = "   -> conflict detected: the stream header has changed"
    assert any(line.startswith(conflict) for line in lines)
    assert "   v3 id=msg-3 {'Type': 'Checkout'}" in lines
    assert "   -> 3 events, end of stream: True" in lines


def test_the_handler_guide_runs_top_to_bottom(connection_string: str, tmp_path: Path) -> None:
    # As a reader does: the first block saved as bank.py, the others run in order.
    module, *steps = _python_blocks(ROOT / "docs" / "handler-guide.md")
    (tmp_path / "bank.py").write_text(module)
    env = dict(
        os.environ,
        STREAMSTONE_CONNECTION_STRING=connection_string,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(steps)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WithdrawalRejected" in done.stdout
