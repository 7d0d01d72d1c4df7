"""The committed `labs` stack's config for tests: one loader, built on components/tools/offline.py.

`namespace()` is the `labs-k8s:` namespace of Pulumi.labs.yaml as the engine would pass it
(`stack_config`: placeholder ssh.publicKey, preflight off), as plain data a test may edit;
`make_lab_config*` validate it into a LabConfig after a merge or an arbitrary change.
The session-wide, unchanged config is conftest's `lab_config` fixture.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from components.config import NAMESPACE, LabConfig, load_lab_config
from components.tools.offline import stack_config


def namespace() -> dict[str, Any]:
    """The `labs-k8s:` keys of Pulumi.labs.yaml (without the private key), a fresh copy per call."""
    config, _ = stack_config("labs")
    prefix = f"{NAMESPACE}:"
    raw = {key[len(prefix) :]: value for key, value in config.items() if key.startswith(prefix)}
    raw.pop("sshPrivateKey", None)
    # stack_config hands structured values over as JSON text: decoding them makes new objects.
    return {key: json.loads(value) if value.startswith(("{", "[")) else value for key, value in raw.items()}


def make_lab_config_with(
    change: Callable[[dict[str, Any]], None] | None = None, **merge: Mapping[str, Any]
) -> LabConfig:
    """The stack's lab config after `merge` (as in `make_lab_config`), then `change(namespace)`."""
    raw = namespace()
    for key, value in merge.items():
        raw[key] = {**raw.get(key, {}), **value}
    if change is not None:
        change(raw)
    return load_lab_config(raw)


def make_lab_config(**merge: Mapping[str, Any]) -> LabConfig:
    """The stack's lab config; each argument merges into that top-level key: kubernetes={"version": "1.30.4"}."""
    return make_lab_config_with(None, **merge)


def public_key(comment: str = "ops@labs", seed: int = 0) -> str:
    """A well-formed ssh-ed25519 line (length-prefixed type and 32-byte key), no ssh-keygen needed.

    Nobody holds a private half; `seed` makes distinct keys, `comment` the free text after them.
    """
    kind = b"ssh-ed25519"
    body = bytes((seed + i) % 256 for i in range(32))
    blob = len(kind).to_bytes(4, "big") + kind + len(body).to_bytes(4, "big") + body
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"
