"""What every deployed stack's state holds that the code must keep answering to.

A dynamic resource's state carries its provider as a pickle (`__provider`, written by
pulumi.dynamic's serialize_provider with dill), and the pickle names the provider class by module
and qualified name, not by value. The dynamic-provider host unpickles it for every diff, refresh
and destroy of an existing stack (pulumi/pulumi sdk/python/lib/pulumi/dynamic/__main__.py
get_provider): a class that moved or was renamed breaks every stack ever deployed with it.
"""

from __future__ import annotations

import base64
import importlib
import pickletools

import pytest
from pulumi.runtime import rpc

from components.tools.offline import OfflineRun

# (module, qualified name) of each dynamic provider, as the pickles in existing states name it.
PINNED = {
    "golden-template": ("components.template", "TemplateBuildProvider"),
    "labs-k8s-w01-clone-source": ("components.clone_source", "CloneSourceProvider"),
}


def pickled_globals(data: bytes) -> list[tuple[str, str]]:
    """The (module, name) pairs a pickle loads by reference (GLOBAL, STACK_GLOBAL)."""
    found: list[tuple[str, str]] = []
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(str(arg))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.append((strings[-2], strings[-1]))
        elif opcode.name == "GLOBAL":
            module, name = str(arg).split(" ", 1)
            found.append((module, name))
    return found


def provider_pickle(run: OfflineRun, name: str) -> bytes:
    provider = rpc.deserialize_properties(run.by_name(name).wire_inputs)["__provider"]
    if rpc.is_rpc_secret(provider):
        provider = rpc.unwrap_rpc_secret(provider)
    return base64.b64decode(provider)


@pytest.mark.parametrize("resource", sorted(PINNED))
def test_the_dynamic_providers_are_pickled_under_their_pinned_names(offline_run: OfflineRun, resource: str) -> None:
    module, qualname = PINNED[resource]
    assert (module, qualname) in pickled_globals(provider_pickle(offline_run, resource))
    provider_class = getattr(importlib.import_module(module), qualname)
    assert provider_class.__module__ == module and provider_class.__qualname__ == qualname


def test_every_dynamic_resource_uses_a_pinned_provider(offline_run: OfflineRun) -> None:
    """A new dynamic provider is a new state contract: pin it here too."""
    pinned = set(PINNED.values())
    for reg in offline_run.of_type("pulumi-python:dynamic:Resource"):
        names = {
            pair for pair in pickled_globals(provider_pickle(offline_run, reg.name)) if pair[0].startswith("components")
        }
        assert names and names <= pinned, f"{reg.name}: {names}"
