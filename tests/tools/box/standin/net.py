"""TEST ONLY: how the lab in a box's stand-ins talk to each other: real TCP and TLS over the box's
network, with the cluster's real certificates, so that a host powered off, a balancer gone or an
API server without its etcd is seen as the real tools see them (refused, timed out, cut off).

Errors are told apart the way Go's net/http and crypto/tls report them, since the scripts read
kubectl's and kubeadm's messages: `Unreachable.kind` is refused, timeout, eof (a TLS handshake cut
by HAProxy when no backend is up) or x509 (the server's certificate does not verify).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
KUBELET_HEALTHZ_PORT = 10248


class Unreachable(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Does something accept a TCP connection at host:port (a powered-off host: no answer)?"""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class Credentials:
    """A client's TLS identity: PEM texts (a kubeconfig's *-data, or the files it names)."""

    ca_pem: str | None = None  # None: do not verify the server (kubeadm's insecure cluster-info fetch)
    cert_pem: str | None = None
    key_pem: str | None = None
    token: str | None = None  # a bearer token (the kubelet's bootstrap token)


@contextlib.contextmanager
def tls_context(creds: Credentials) -> Iterator[ssl.SSLContext]:
    if creds.ca_pem is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cadata=creds.ca_pem)
    if creds.cert_pem and creds.key_pem:
        # ssl loads a client certificate from files only: a private directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="labs-k8s-standin-") as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_text(creds.cert_pem)
            key.write_text(creds.key_pem)
            os.chmod(key, 0o600)
            context.load_cert_chain(str(cert), str(key))
    yield context


def request(
    host: str,
    port: int,
    method: str,
    path: str,
    creds: Credentials,
    body: dict[str, Any] | None = None,
    timeout: float = 5.0,
) -> tuple[int, str]:
    """One HTTPS request; the status and body, or Unreachable."""
    headers = {"Host": f"{host}:{port}", "Connection": "close"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if creds.token:
        headers["Authorization"] = f"Bearer {creds.token}"
    with tls_context(creds) as context:
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        except ConnectionRefusedError:
            raise Unreachable("refused", f"dial tcp {host}:{port}: connect: connection refused") from None
        except ssl.SSLCertVerificationError as error:
            raise Unreachable("x509", f"tls: failed to verify certificate: {error.verify_message}") from None
        except TimeoutError:
            raise Unreachable("timeout", f"dial tcp {host}:{port}: i/o timeout") from None
        except (ssl.SSLError, ConnectionResetError, http.client.RemoteDisconnected, EOFError) as error:
            raise Unreachable("eof", f"EOF ({type(error).__name__})") from None
        except OSError as error:
            if error.errno in (113, 101):  # EHOSTUNREACH, ENETUNREACH: no ARP answer for the address
                raise Unreachable("timeout", f"dial tcp {host}:{port}: connect: no route to host") from None
            raise Unreachable("refused", f"dial tcp {host}:{port}: {error.strerror}") from None
        finally:
            connection.close()


def plain_get(host: str, port: int, path: str, timeout: float = 2.0) -> tuple[int, str] | None:
    """GET over plain HTTP (etcd's and the kubelet's local endpoints); None when nothing answers."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
