"""The hot path's telemetry check (``lockd.server.app._telemetry_on``): it answers what FastAPI's
``NativeTelemetry.enabled()`` answers, asking it only when OpenTelemetry could have a provider
(a global provider set, or a variable that would load one), so a provider installed at any
time still sends every request through FastAPI's instrumented stack."""

from __future__ import annotations

import sys

import pytest

from lockd.server import app as app_mod
from lockd.server.app import create_app

_SIGNALS = [(module, provider, variable) for module, provider, variable in app_mod._OTEL_GLOBALS]


class _Provider:
    """Stands for an SDK provider: not one of the deferred proxies FastAPI ignores."""


def test_no_provider_anywhere_is_off_without_asking_fastapi(monkeypatch) -> None:
    app = create_app()
    native = app._native_telemetry
    assert native.enabled() is False
    assert app_mod._no_provider(native.config) is True
    monkeypatch.setattr(type(native), "enabled", lambda self: pytest.fail("asked"))
    assert app_mod._telemetry_on(app) is False


@pytest.mark.parametrize(("module", "provider", "variable"), _SIGNALS)
def test_a_global_provider_set_later_turns_it_on(monkeypatch, module, provider, variable) -> None:
    app = create_app()
    assert app_mod._telemetry_on(app) is False
    monkeypatch.setattr(sys.modules[module], provider, _Provider())
    assert app_mod._no_provider(app._native_telemetry.config) is False
    assert app_mod._telemetry_on(app) is True
    assert app._native_telemetry.enabled() is True


@pytest.mark.parametrize(("module", "provider", "variable"), _SIGNALS)
def test_a_variable_naming_a_provider_defers_to_fastapi(monkeypatch, module, provider,
                                                        variable) -> None:
    app = create_app()
    monkeypatch.setenv(getattr(sys.modules[module], variable), "some_provider")
    assert app_mod._no_provider(app._native_telemetry.config) is False
    asked = []
    monkeypatch.setattr(type(app._native_telemetry), "enabled",
                        lambda self: asked.append(1) or True)
    assert app_mod._telemetry_on(app) is True and asked == [1]


@pytest.mark.parametrize("key", ["tracer_provider", "meter_provider", "logger_provider"])
def test_a_provider_in_fastapis_config_defers_to_fastapi(key) -> None:
    app = create_app()
    assert app_mod._no_provider({**app._native_telemetry.config, key: _Provider()}) is False
