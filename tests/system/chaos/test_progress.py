"""``make chaos`` says how long it will take and reports progress while it runs."""

from __future__ import annotations

import json

from chaos.__main__ import main
from chaos.runner import progress_line


def test_progress_line_counts_faults_and_the_workers_outcomes(tmp_path):
    log = tmp_path / "w1.jsonl"
    events = ["ack", "ack", "stale", "unknown", "acquired", "ack"]
    log.write_text("".join(json.dumps({"ev": e, "w": "w1"}) + "\n" for e in events))
    line = progress_line(61.4, 600, {"pause": 2, "kill_worker": 1}, [log, tmp_path / "gone.jsonl"])
    assert line.strip() == ("t 61/600 s · faults 3 · writes acked 3, refused stale 1, unknown 1 "
                            "(violations: judged at the end)")


def test_the_total_time_is_stated_before_any_run(capsys, monkeypatch):
    import chaos.__main__ as entry

    class Stop(Exception):
        pass

    def refuse(cfg):
        raise Stop

    monkeypatch.setattr(entry, "run", refuse)
    try:
        main(["--store", "all", "--seconds", "600"])
    except Stop:
        pass
    first = capsys.readouterr().out.splitlines()[0]
    assert "3 run(s) of 600 s" in first and "about 30 min" in first, first
