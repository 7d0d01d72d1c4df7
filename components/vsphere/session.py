"""Logging in to vCenter, waiting for tasks, and reading properties in bulk.

Upstream pitfall: pyVim.connect.getSslContext() silently builds an *unverified* TLS
context when no context is passed and the host is localhost/127.0.0.1/::1, so we
always pass our own context and only skip verification when asked.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyVim.connect import Disconnect, SmartConnect
from pyVmomi import vim, vmodl

from components.vsphere.errors import TaskError, VSphereError, VSphereTimeoutError

log = logging.getLogger(__name__)

GiB = 1024**3

T = TypeVar("T")


def present(value: T | None, what: str) -> T:
    """``value``, of a property that pyVmomi types as optional (the vSphere API declares most of them
    so) but that vCenter sets wherever this package reads it. A None fails as reading an attribute of
    it did before (AttributeError), only with the property named."""
    if value is None:
        raise AttributeError(f"vCenter left {what} unset")
    return value


@dataclass(frozen=True)
class Endpoint:
    """Where a ServiceInstance talks to; kept for plain HTTP calls (uploads)."""

    host: str
    port: int
    tls: ssl.SSLContext


# Keyed by the SOAP stub so it dies with the connection. Only connect() fills
# it: upload_to_datastore() must reuse the same TLS decision as the SOAP side.
_ENDPOINTS: weakref.WeakKeyDictionary[Any, Endpoint] = weakref.WeakKeyDictionary()


def _tls_context(insecure: bool, ca_file: str | None) -> ssl.SSLContext:
    # ssl.create_default_context() reads the system store (and SSL_CERT_FILE
    # per OpenSSL) but never REQUESTS_CA_BUNDLE: that variable is a convention
    # of the requests library and must not change how we trust vCenter.
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=ca_file)


def connect(
    host: str,
    user: str,
    password: str,
    port: int = 443,
    insecure: bool = False,
    ca_file: str | None = None,
) -> vim.ServiceInstance:
    """Log in to vCenter and return its ServiceInstance.

    TLS is verified against the system store (or ``ca_file``) unless
    ``insecure`` is True. We always hand pyVim an explicit context: given none,
    pyVim turns verification off for 127.0.0.1/localhost without saying so.
    """
    tls = _tls_context(insecure, ca_file)
    try:
        si = SmartConnect(host=host, port=port, user=user, pwd=password, sslContext=tls)
    except vim.fault.InvalidLogin as exc:
        raise VSphereError(
            f"vCenter {host}:{port} rejected the login for user {user!r}; check the user name and password"
        ) from exc
    except ssl.SSLCertVerificationError as exc:
        # Both pyvmomi (OpenSSL) and the vSphere provider (Go) trust the system store and
        # SSL_CERT_FILE; neither has a CA setting of its own in the stack config.
        raise VSphereError(
            f"cannot verify the TLS certificate of vCenter {host}:{port} ({exc.verify_message}): this machine "
            "does not trust the CA that signed it. Add vCenter's root CA to the system trust store "
            "(docs/runbook.md#trusting-the-vcenter-certificate: its /certs/download.zip, then "
            "update-ca-certificates), or, for a lab only: pulumi config set vsphere:allowUnverifiedSsl true"
        ) from exc
    except OSError as exc:
        raise VSphereError(f"cannot reach vCenter at {host}:{port}: {exc}") from exc
    _ENDPOINTS[si._GetStub()] = Endpoint(host=host, port=port, tls=tls)
    return si


def disconnect(si: vim.ServiceInstance) -> None:
    """Log out; errors are logged, not raised (we are usually cleaning up)."""
    try:
        Disconnect(si)
    except Exception as exc:
        log.warning("vCenter logout failed: %s", exc)


@contextlib.contextmanager
def session(
    host: str,
    user: str,
    password: str,
    port: int = 443,
    insecure: bool = False,
    ca_file: str | None = None,
) -> Iterator[vim.ServiceInstance]:
    """``with session(...) as si:`` connects and always logs out afterwards."""
    si = connect(host, user, password, port=port, insecure=insecure, ca_file=ca_file)
    try:
        yield si
    finally:
        disconnect(si)


# --------------------------------------------------------------------------
# Where vCenter is: `vsphere:vsphereServer`
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerAddress:
    host: str
    port: int = 443

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 443 else f"{host}:{self.port}"


def parse_server(value: str) -> ServerAddress:
    """`vsphere:vsphereServer` as host, host:port, [IPv6] or [IPv6]:port; the one parser for it.

    It accepts exactly what the vsphere provider can use: the provider builds
    https://<value>/sdk and hands it to Go's url.Parse (terraform-provider-vsphere config.go
    vimURL), so a URL (scheme or path) is an error here too, not something to guess around;
    spaces around the value fail there ("invalid port", "invalid character in host name"); and
    a bare IPv6 address reads as host "fd00:" with port "10", so it needs its brackets.
    """
    text = value or ""
    fix = "set vsphere:vsphereServer to the vCenter host name, optionally with :port (vcenter.example.com:443)"
    if not text.strip():
        raise VSphereError(f"vsphere:vsphereServer is empty; {fix}")
    if text != text.strip():
        raise VSphereError(
            f"vsphere:vsphereServer {value!r} has spaces around it, which the vsphere provider refuses; {fix}"
        )
    if "://" in text or "/" in text:
        raise VSphereError(f"vsphere:vsphereServer {value!r} is a URL; {fix}")
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise VSphereError(f"vsphere:vsphereServer {value!r} is not [IPv6]:port; {fix}")
        port = rest[1:]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    elif ":" in text:
        raise VSphereError(
            f"vsphere:vsphereServer {value!r} is an IPv6 address without brackets, which the "
            f"vsphere provider reads as host:port; write it as [{text}] (or [{text}]:443)"
        )
    if not host:
        raise VSphereError(f"vsphere:vsphereServer {value!r} has no host; {fix}")
    if port == "" and not text.endswith(":"):
        return ServerAddress(host)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise VSphereError(f"vsphere:vsphereServer {value!r} has no valid port ({port!r}); {fix}")
    return ServerAddress(host, int(port))


# --------------------------------------------------------------------------
# Tasks and property collection
# --------------------------------------------------------------------------


def _fault_text(error: Any) -> str:
    if error is None:
        return "unknown error"
    text = getattr(error, "msg", "") or getattr(error, "localizedMessage", "")
    fault = getattr(error, "fault", None)
    name = type(fault).__name__ if fault is not None else type(error).__name__
    return f"{name}: {text}" if text else name


def _task_state(task: vim.Task) -> tuple[Any, Any, Any]:
    """(state, error, result) of a task."""
    try:
        info = task.info
        return info.state, info.error, info.result
    except TypeError:
        # vcsim 0.24 gives FileManager tasks the FileManager as info.entity, which pyVmomi refuses
        # to parse (entity must be a ManagedEntity): read the three fields we need on their own.
        collector = vim.ServiceInstance("ServiceInstance", task._stub).RetrieveContent().propertyCollector
        spec = vmodl.query.PropertyCollector.FilterSpec(
            objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=task)],
            propSet=[
                vmodl.query.PropertyCollector.PropertySpec(
                    type=vim.Task, pathSet=["info.state", "info.error", "info.result"]
                )
            ],
        )
        fields = {p.name: p.val for o in collector.RetrieveContents([spec]) for p in o.propSet}
        return fields.get("info.state"), fields.get("info.error"), fields.get("info.result")


def wait_for_task(task: vim.Task, what: str, timeout_s: float = 600, poll_s: float = 0.5) -> Any:
    """Wait for a vCenter task; return its result or raise with the fault text."""
    deadline = time.monotonic() + timeout_s
    while True:
        state, error, result = _task_state(task)
        if state == vim.TaskInfo.State.success:
            return result
        if state == vim.TaskInfo.State.error:
            raise TaskError(f"{what} failed: {_fault_text(error)}", error)
        if time.monotonic() >= deadline:
            raise VSphereTimeoutError(f"{what} did not finish within {timeout_s:g}s (task {task._moId})")
        time.sleep(poll_s)


def collect_properties(
    si: vim.ServiceInstance,
    root: vim.ManagedEntity,
    vimtype: type,
    props: Sequence[str],
) -> list[tuple[Any, dict[str, Any]]]:
    """Read ``props`` of every ``vimtype`` object under ``root`` in one round trip.

    One PropertyCollector call over a ContainerView instead of touching
    ``obj.prop`` per object: on a big inventory that is the difference between
    one request and thousands.
    """
    content = si.RetrieveContent()
    view = present(content.viewManager, "ServiceContent.viewManager").CreateContainerView(root, [vimtype], True)
    try:
        traversal = vmodl.query.PropertyCollector.TraversalSpec(
            name="view", path="view", skip=False, type=vim.view.ContainerView
        )
        spec = vmodl.query.PropertyCollector.FilterSpec(
            objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=view, skip=True, selectSet=[traversal])],
            propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vimtype, pathSet=list(props))],
        )
        collector = content.propertyCollector
        options = vmodl.query.PropertyCollector.RetrieveOptions()
        result = collector.RetrievePropertiesEx([spec], options)
        rows: list[tuple[Any, dict[str, Any]]] = []
        seen: set[str] = set()
        while result is not None:
            for obj in result.objects:
                if obj.obj._moId in seen:
                    continue
                seen.add(obj.obj._moId)
                rows.append((obj.obj, {p.name: p.val for p in obj.propSet}))
            if not result.token:
                break
            result = collector.ContinueRetrievePropertiesEx(result.token)
        return rows
    finally:
        view.Destroy()
