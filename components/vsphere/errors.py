"""The errors every vCenter call in this package raises: messages meant for the user."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class VSphereError(RuntimeError):
    """Any failure talking to vCenter, with a message meant for the user."""


class NotFoundError(VSphereError):
    """An inventory object is missing; the message names it and where we looked."""

    def __init__(self, kind: str, name: str, where: str, available: Sequence[str] = ()) -> None:
        self.kind = kind
        self.name = name
        self.where = where
        self.available = list(available)
        message = f"{kind} {name!r} not found in {where}"
        if self.available:
            shown = ", ".join(repr(a) for a in sorted(self.available)[:20])
            more = "" if len(self.available) <= 20 else f" and {len(self.available) - 20} more"
            message += f"; available: {shown}{more}"
        else:
            message += f"; there is no {kind} there at all"
        super().__init__(message)


class TaskError(VSphereError):
    """A vCenter task failed; ``fault`` is the vmodl fault vCenter returned."""

    def __init__(self, message: str, fault: Any) -> None:
        super().__init__(message)
        self.fault = fault


class AmbiguousError(VSphereError):
    """A name matches several objects; the message lists their paths."""


class VSphereTimeoutError(VSphereError, TimeoutError):
    """A wait ran out of time; the message says what we waited for."""
