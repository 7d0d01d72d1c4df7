"""A vCenter whose certificate this machine does not trust: caught by preflight, fixed one way for both clients.

vcsim serves a certificate signed by a CA made here. Without trust, preflight fails with the way to
fix it (not the old "pass ca_file or insecure=True", neither of which is a config key). The fix the
runbook documents, vCenter's root CA in the system trust store, is then applied for real inside a
private mount namespace (the machine's own store is never touched): `update-ca-certificates` with
/usr/local/share/ca-certificates and /etc/ssl/certs bind-mounted over copies. Inside it, both
pyvmomi (this program: preflight, the template build) and a Go client built exactly like the
vSphere provider's (tests/tools/vcenter_login) log in with verification on. SSL_CERT_FILE, the
per-shell alternative, is checked for both as well.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pulumi
import pytest

from components.preflight import run_preflight
from components.stack_config import StackInputs, VcenterCredentials
from components.tools.offline import REPO_ROOT
from tests.requirements import require_root, require_tool, unavailable
from tests.vcenter_pki import make_vcenter_pki

GO_MODULE = REPO_ROOT / "tests" / "tools"  # go.mod pins govmomi, as for vcsim
GO_SOURCES = [GO_MODULE / "go.mod", GO_MODULE / "go.sum", GO_MODULE / "vcenter_login" / "main.go"]
GO_CACHE = REPO_ROOT / ".cache" / "vcenter-login"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A root CA (as vCenter's VMCA would be) and a server certificate for 127.0.0.1 signed by it."""
    return make_vcenter_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def vcenter(vcsim_factory, pki, monkeypatch):
    from components import vsphere as vs

    sim = vcsim_factory(hosts=3, tls=(pki["cert"], pki["key"]))
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        vs.find_datacenter(si, sim.datacenter).vmFolder.CreateFolder("labs-k8s")
    session = vs.session
    monkeypatch.setattr(vs, "session", lambda *a, **k: session(*a, **{**k, "port": sim.port}))
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return sim


def preflight_inputs(sim, lab_config) -> StackInputs:
    from tests.test_preflight import lab_on, small_disks

    return StackInputs(
        lab=lab_on(sim, small_disks(lab_config)),
        ssh_private_key="unused",  # type: ignore[arg-type]
        vcenter=VcenterCredentials(
            server=sim.host,
            user=sim.user,
            password="unused",  # type: ignore[arg-type]
            allow_unverified_ssl=False,
            plain_password=sim.password,
        ),
    )


def test_an_untrusted_vcenter_certificate_fails_preflight_with_the_fix(vcenter, lab_config):
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(preflight_inputs(vcenter, lab_config))
    message = str(caught.value)
    assert "does not trust the CA that signed it" in message
    assert "docs/runbook.md#trusting-the-vcenter-certificate" in message
    assert "pulumi config set vsphere:allowUnverifiedSsl true" in message
    assert "ca_file" not in message and "insecure=True" not in message


def test_ssl_cert_file_is_trusted_by_pyvmomi(vcenter, lab_config, pki, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca"]))
    run_preflight(preflight_inputs(vcenter, lab_config))  # raises on any problem


def provider_login_binary() -> Path:
    """tests/tools/vcenter_login built with the govmomi module tests/tools/go.mod pins, cached."""
    found = subprocess.run(
        ["bash", "-c", f"source {GO_MODULE / 'go_env.sh'} && go_binary"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        unavailable(found.stderr.strip())
    go = found.stdout.strip()
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in GO_SOURCES)).hexdigest()[:16]
    binary = GO_CACHE / f"vcenter_login-{digest}"
    if binary.is_file():
        return binary
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0"}
    built = subprocess.run(
        [go, "build", "-trimpath", "-o", str(binary), "./vcenter_login"],
        cwd=GO_MODULE,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if built.returncode != 0:
        unavailable(f"building tests/tools/vcenter_login failed: {built.stderr[-1500:]}")
    return binary


def go_login(binary: Path, sim, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    url = f"https://{sim.user}:{sim.password}@{sim.host}:{sim.port}/sdk"
    clean = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    return subprocess.run(
        [str(binary), url], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_providers_client_distrusts_it_too_and_trusts_ssl_cert_file(vcenter, pki):
    binary = provider_login_binary()
    untrusted = go_login(binary, vcenter, {})
    assert untrusted.returncode != 0
    assert "certificate signed by unknown authority" in untrusted.stderr
    trusted = go_login(binary, vcenter, {"SSL_CERT_FILE": str(pki["ca"])})
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout.strip() == "logged in"


SYSTEM_STORE_SCRIPT = r"""
set -euo pipefail
# Private copies of the trust store, mounted over the real ones in this mount namespace only.
mount --make-rprivate /
cp -a /etc/ssl/certs "$WORK/etc-ssl-certs"
mkdir -p "$WORK/local-cas"
mount --bind "$WORK/etc-ssl-certs" /etc/ssl/certs
mount --bind "$WORK/local-cas" /usr/local/share/ca-certificates
# The runbook's steps: vCenter's root CA as a .crt in /usr/local/share/ca-certificates, then update.
cp "$CA" /usr/local/share/ca-certificates/vcenter-root-ca.crt
update-ca-certificates >/dev/null
"$PYTHON" -c "$PYVMOMI_LOGIN"
"$GO_LOGIN" "$URL"
"""

PYVMOMI_LOGIN = """
import os, sys
sys.path.insert(0, os.environ["REPO"])
from components import vsphere as vs
with vs.session(os.environ["HOST"], os.environ["USER_NAME"], os.environ["PASSWORD"], port=int(os.environ["PORT"])):
    print("pyvmomi logged in")
"""


def test_the_documented_system_store_is_trusted_by_both(vcenter, pki, tmp_path):
    require_root()
    require_tool("unshare", "update-ca-certificates")
    binary = provider_login_binary()
    system_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    before = hashlib.sha256(system_bundle.read_bytes()).hexdigest()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")},
        "WORK": str(tmp_path),
        "CA": str(pki["ca"]),
        "PYTHON": sys.executable,
        "PYVMOMI_LOGIN": PYVMOMI_LOGIN,
        "GO_LOGIN": str(binary),
        "REPO": str(REPO_ROOT),
        "HOST": vcenter.host,
        "PORT": str(vcenter.port),
        "USER_NAME": vcenter.user,
        "PASSWORD": vcenter.password,
        "URL": f"https://{vcenter.user}:{vcenter.password}@{vcenter.host}:{vcenter.port}/sdk",
    }
    result = subprocess.run(
        ["unshare", "--mount", "bash", "-c", SYSTEM_STORE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-2:] == ["pyvmomi logged in", "logged in"]
    # And the machine's own store was never changed.
    assert hashlib.sha256(system_bundle.read_bytes()).hexdigest() == before
