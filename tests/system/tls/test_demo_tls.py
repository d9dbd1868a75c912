"""``python -m lockd.demo --tls``: the three scenes end to end over mTLS (lockd, the proxy, the
proxy's JWKS fetch and every worker), with certificates made for the run and removed after."""

from __future__ import annotations

from tests.system.demo.demo_support import assert_story, marked_processes, run_demo


def test_demo_plays_all_three_scenes_over_mtls(tmp_path):
    run = run_demo(["--tls"], tmp_path)
    assert run.returncode == 0, run.output()
    assert_story(run.report)
    assert run.report["tls"] is True
    assert run.report["lockd_url"].startswith("https://127.0.0.1:")
    assert run.report["proxy_url"].startswith("https://127.0.0.1:")
    assert "over mTLS" in run.stdout.splitlines()[0]
    assert "409 stale_token" in run.stdout and "PASSED" in run.stdout
    assert marked_processes(run.marker) == []
    assert list(run.scratch.iterdir()) == [], "certificates and keys are removed with the rest"
