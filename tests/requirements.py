"""Skip-or-fail for tests that need root, a daemon or a tool.

On a laptop a missing tool skips the test with the reason. Under CI (CI=true) the
same test fails instead: CI installs everything, so a missing tool there is a defect.
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Skip (laptop) or fail (CI) the calling test, always with the reason."""
    if in_ci():
        pytest.fail(f"CI=true and this test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def require_tool(*names: str) -> None:
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        unavailable(f"needs {', '.join(missing)} on PATH (make test installs it on Debian as root)")


def require_root() -> None:
    if os.geteuid() != 0:
        unavailable("needs root (network namespaces / debootstrap)")
