"""The chaos harness: many workers, duplicated and late deliveries, crashes and storage faults.

Run it with ``make chaos`` (or ``python -m tests.chaos --help``); a short
fixed-seed run is part of ``make test`` (``test_chaos.py``).
"""
