"""The token mode of the chaos harness, briefly: crashes at every token step,
copies, retention, then every credit again; no violation."""

from __future__ import annotations

from tests.chaos.token_mode import TokenChaosConfig, run_tokens


def test_a_short_token_chaos_run_has_no_violation(connection_string: str) -> None:
    config = TokenChaosConfig(seed=3, duration=3.0, crash_rate=0.05, interval=0.04)
    report = run_tokens(config, connection_string)
    print(report.table())
    assert report.violations == [], report.table()
    assert min(report.crashes, report.retains) > 0, report.table()
    assert report.transfers > 30, report.table()
    assert report.late_copies["consumed"] > 0, report.table()
