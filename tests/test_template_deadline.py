"""The template build is bounded inside its provider.

Pulumi's Python dynamic-provider host never reads a create's timeout (pulumi sdk/python/lib/pulumi/
dynamic/__main__.py `DynamicResourceProviderServicer.Create` calls `provider.create(props)` and
nothing else), so `customTimeouts.create` on the template has no effect: a phase that hangs would
hold `pulumi up` for ever. These tests stall one phase and expect the create to give up on its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from components import template as template_module
from components import vsphere
from components.template import TemplateBuildError, TemplateBuildProvider


class _Login:
    @contextlib.contextmanager
    def session(self) -> Any:
        yield object()


def _props(offline_run: Any, build_timeout_s: float) -> dict[str, Any]:
    props = dict(offline_run.by_name("golden-template").plain_inputs)
    props["buildTimeoutSeconds"] = build_timeout_s
    return props


def _create_in_thread(provider: TemplateBuildProvider, props: dict[str, Any]) -> tuple[threading.Thread, dict]:
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = provider.create(props)
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


def test_a_build_phase_that_hangs_fails_the_create_at_the_builds_deadline(offline_run, monkeypatch):
    """The upload to the datastore stalls (a datastore that stops answering): the create fails after
    buildTimeoutMinutes + BUILD_OVERHEAD_MINUTES, naming both, instead of never returning."""
    release = threading.Event()
    monkeypatch.setattr(template_module, "BUILD_OVERHEAD_MINUTES", 0.02, raising=False)  # 1.2 s
    monkeypatch.setattr(TemplateBuildProvider, "_login", lambda self, props: _Login())
    monkeypatch.setattr(vsphere, "find_datacenter", lambda si, name: object())
    monkeypatch.setattr(vsphere, "find_vm", lambda si, name, dc=None: None)
    monkeypatch.setattr(TemplateBuildProvider, "_upload_media", staticmethod(lambda si, spec: release.wait(120)))
    provider = TemplateBuildProvider()
    started = time.monotonic()
    thread, outcome = _create_in_thread(provider, _props(offline_run, 1))
    thread.join(30)
    try:
        assert not thread.is_alive(), "create did not return: the build is not bounded"
    finally:
        release.set()
    assert time.monotonic() - started < 10
    error = outcome.get("error")
    assert isinstance(error, TemplateBuildError), outcome
    message = str(error)
    assert "did not finish within" in message and "buildTimeoutMinutes" in message
    assert "the next `pulumi up` deletes it and builds the template again" in message


def test_a_build_that_fails_in_time_fails_with_its_own_error(offline_run, monkeypatch):
    monkeypatch.setattr(TemplateBuildProvider, "_login", lambda self, props: _Login())

    def no_datacenter(si: Any, name: str) -> Any:
        raise TemplateBuildError(f"no datacenter {name}")

    monkeypatch.setattr(vsphere, "find_datacenter", no_datacenter)
    with pytest.raises(TemplateBuildError, match="no datacenter"):
        TemplateBuildProvider().create(_props(offline_run, 60))


def test_the_engines_create_timeout_is_the_providers_own_limit(offline_run):
    build = offline_run.by_name("golden-template")
    minutes = build.plain_inputs["buildTimeoutSeconds"] / 60 + template_module.BUILD_OVERHEAD_MINUTES
    assert build.custom_timeouts["create"] == f"{minutes:g}m"
