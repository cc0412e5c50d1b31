"""Every benchmark in one run, against one Azurite, then the report with its plots.

``python benchmarks/run_all.py [--quick]`` (``make bench`` / ``make bench-quick``)
starts Azurite once (its Table and Queue services), runs each ``bench_*.py``
script and ``profile_task.py`` against it (each prints JSON lines, the format
``_common.py`` describes), and writes:

- ``benchmarks/results/<date>.json`` (``<date>-quick.json`` for a quick run):
  the machine and every measurement;
- ``docs/benchmarks.md`` with PNG plots in ``docs/benchmarks/`` (a quick run
  writes ``docs/benchmarks-quick.md`` instead, so it never replaces the
  recorded full run).

The results file is written after each script, with ``unfinished`` naming
the scripts not yet run, so that a script that fails its checks loses no
other script's figures: ``--resume RESULTS.json`` runs those left, against a
fresh Azurite, and finishes the file (the report names the resumption).

``--rerun SCRIPT RESULTS.json`` runs one script again against a fresh Azurite
and replaces that script's records in the file (each ratio's peer is still
measured in the same run as its value); the report names the rerun and when.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from _common import ROOT, account, log

SCRIPTS = (
    "bench_stream.py",
    "bench_handlers.py",
    "bench_tracing.py",
    "bench_keys.py",
    "bench_wire.py",
    "bench_spark.py",
    "bench_storage.py",
    "bench_tokens.py",
    "bench_queue.py",
    "bench_spark_queue.py",
    "bench_azurite_queue.py",
    "bench_task_memory.py",
    "profile_task.py",
    "profile_spark_queue.py",
)


def machine() -> dict[str, Any]:
    """Cores, memory and the versions of everything that takes part."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = found.group(1).strip() if found else cpu

    def run(*args: str) -> str:
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            return "unknown"
        return (done.stdout or done.stderr).strip().splitlines()[0]

    package = json.loads((ROOT / "azurite" / "package.json").read_text())
    azurite = package["dependencies"]["azurite"]
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(memory, 1),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "java": run("java", "-version"),
        "node": run("node", "--version"),
        "azurite": azurite,
        **{name: metadata.version(name) for name in ("azure-data-tables", "pyspark", "msgpack")},
    }


def run_script(script: str, quick: bool) -> list[dict[str, Any]]:
    log(f"--- {script}{' --quick' if quick else ''}")
    args = [sys.executable, str(ROOT / "benchmarks" / script), *(["--quick"] if quick else [])]
    done = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"{script} failed (exit {done.returncode}); its checks are above; the figures "
            "before it are kept: run_all.py --resume <results file> runs the rest"
        )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return [{**r, "script": script} for r in records]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every script at its quick size")
    parser.add_argument("--render", metavar="JSON", help="only render the report of a results file")
    parser.add_argument(
        "--rerun",
        nargs=2,
        metavar=("SCRIPT", "JSON"),
        help="run one script again (its peers in the same run) and replace its records in a "
        "results file, noting when; then render the report",
    )
    parser.add_argument(
        "--resume",
        metavar="JSON",
        help="run the scripts a results file left unfinished (one failed), then the report",
    )
    args = parser.parse_args()
    if args.rerun:
        script, path = args.rerun
        if script not in SCRIPTS:
            parser.error(f"--rerun: {script!r} is not one of {', '.join(SCRIPTS)}")
        result = json.loads(Path(path).read_text())
        started = datetime.datetime.now(datetime.UTC)
        with account(queues=True) as connection_string:
            os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
            again = run_script(script, result["quick"])
        minutes = round((datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60, 1)
        kept = [r for r in result["measurements"] if r["script"] != script]
        result["measurements"] = kept + again
        result.setdefault("reruns", []).append(
            {"script": script, "started": started.isoformat(timespec="seconds"), "minutes": minutes}
        )
        Path(path).write_text(json.dumps(result, indent=1) + "\n")
        from _report import render

        suffix = "-quick" if result["quick"] else ""
        log(f"wrote {path} and {render(result, ROOT / 'docs', f'benchmarks{suffix}')}")
        return 0
    if args.render:
        from _report import render

        result = json.loads(Path(args.render).read_text())
        suffix = "-quick" if result["quick"] else ""
        log(f"wrote {render(result, ROOT / 'docs', f'benchmarks{suffix}').relative_to(ROOT)}")
        return 0
    if args.resume:
        path = Path(args.resume).resolve()
        result = json.loads(path.read_text())
        if not result.get("unfinished"):
            parser.error(f"--resume: {path} has no script left to run")
        started = datetime.datetime.now(datetime.UTC)
        result.setdefault("resumed", []).append(
            {"scripts": result["unfinished"], "started": started.isoformat(timespec="seconds")}
        )
        return run_scripts(result, path, list(result["unfinished"]))
    started = datetime.datetime.now(datetime.UTC)
    result = {
        "date": started.date().isoformat(),
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "measurements": [],
    }
    suffix = "-quick" if args.quick else ""
    path = ROOT / "benchmarks" / "results" / f"{result['date']}{suffix}.json"
    return run_scripts(result, path, list(SCRIPTS))


def run_scripts(result: dict[str, Any], path: Path, scripts: list[str]) -> int:
    """Run ``scripts`` against one Azurite, writing ``path`` after each; on
    the first that fails, stop (its checks are above) with the rest left to
    ``--resume``; at the end, the report."""
    started, before = datetime.datetime.now(datetime.UTC), result.get("minutes", 0.0)

    def save() -> None:
        elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
        result["minutes"] = round(before + elapsed, 1)
        path.write_text(json.dumps(result, indent=1) + "\n")

    path.parent.mkdir(parents=True, exist_ok=True)
    with account(queues=True) as connection_string:
        os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
        for n, script in enumerate(scripts):
            result["unfinished"] = scripts[n:]  # what --resume runs if this one fails
            save()
            result["measurements"] += run_script(script, result["quick"])
    del result["unfinished"]
    save()
    from _report import render

    suffix = "-quick" if result["quick"] else ""
    report = render(result, ROOT / "docs", f"benchmarks{suffix}")
    log(f"wrote {path.relative_to(ROOT)} and {report.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
