"""SSH host keys the program owns: seed bytes in, OpenSSH key text out.

Every remote step pins the host key it expects (pulumi-command 1.2.1 `connection.hostKey`:
provider/pkg/provider/remote/connection.go `SSHConfig` checks it with `ssh.FixedHostKey` and offers
only that key's algorithm; without it, `ssh.InsecureIgnoreHostKey`). So the program must know each
host's public key before the first step: it makes the keys itself, from random seeds kept as
secrets in the stack's state (`random.RandomId`), and hands them to the VM through cloud-init.

- each VM: an Ed25519 key (the 32-byte seed is the private key, RFC 8032);
- the control planes: one shared ECDSA P-256 key besides, which every control plane presents on
  the VIP's SSH port (HAProxy sends a connection to whichever is healthy, so they must share it).
  An ECDSA client offers only `ecdsa-sha2-nistp256`, so sshd answers with that key, never with
  the node's own Ed25519 key.
Never RSA: pulumi-command's RSA host key algorithm is `ssh-rsa` (SHA-1), which OpenSSH 9.2
(Debian 12) refuses by default.

The conversion is `cryptography`'s own (no home-made encoding). Pure: bytes in, text out.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

SEED_BYTES = 32
# The order n of P-256 (SEC 2, 2.4.2): an ECDSA private key is a scalar in [1, n - 1].
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


@dataclass(frozen=True)
class HostKey:
    """One host key in the forms cloud-init (`ssh_keys`) and pulumi-command (`hostKey`) take."""

    kind: str  # cloud-init's key type: "ed25519" or "ecdsa"
    private_openssh: str  # the private key file, OpenSSH format
    public_openssh: str  # "<algorithm> <base64>", as in authorized_keys and known_hosts


def _seed(seed_hex: str) -> bytes:
    seed = bytes.fromhex(seed_hex)
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a host key seed is {SEED_BYTES} bytes, not {len(seed)}")
    return seed


_OPENSSH_MAGIC = b"openssh-key-v1\0"


def _fixed_checkint(private_text: str) -> str:
    """The same OpenSSH private key with a check value derived from its public key.

    `cryptography` fills the private section's two equal "checkint" words with os.urandom(4)
    (hazmat/primitives/serialization/ssh.py `_serialize_ssh_private_key`), so the same seed would
    give another file, another user-data and another step bundle on every run: a diff in every
    preview. For an unencrypted key the words only have to be equal (OpenSSH PROTOCOL.key: they
    check a decryption), so a value derived from the key keeps the file a function of the seed."""
    lines = private_text.strip().splitlines()
    begin, body, end = lines[0], lines[1:-1], lines[-1]
    data = bytearray(base64.b64decode("".join(body)))
    if not data.startswith(_OPENSSH_MAGIC):
        raise ValueError("not an OpenSSH private key")
    offset = len(_OPENSSH_MAGIC)

    def skip_string() -> bytes:
        nonlocal offset
        (length,) = struct.unpack_from(">I", data, offset)
        value = bytes(data[offset + 4 : offset + 4 + length])
        offset += 4 + length
        return value

    cipher, _kdf, _kdf_options = skip_string(), skip_string(), skip_string()
    if cipher != b"none":
        raise ValueError("an encrypted OpenSSH private key")
    (count,) = struct.unpack_from(">I", data, offset)
    offset += 4
    public_blob = b"".join(skip_string() for _ in range(count))
    offset += 4  # the private section's length
    check = hashlib.sha256(b"labs-k8s checkint\0" + public_blob).digest()[:4]
    data[offset : offset + 8] = check + check
    encoded = base64.b64encode(bytes(data)).decode()
    width = len(body[0])
    return "\n".join([begin, *(encoded[i : i + width] for i in range(0, len(encoded), width)), end]) + "\n"


def _openssh(private: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey, kind: str) -> HostKey:
    private_text = _fixed_checkint(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ).decode()
    )
    public_text = (
        private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    )
    return HostKey(kind, private_text, public_text)


def ed25519_host_key(seed_hex: str) -> HostKey:
    """The Ed25519 key of a 32-byte seed (hex, as `RandomId.hex`)."""
    return _openssh(ed25519.Ed25519PrivateKey.from_private_bytes(_seed(seed_hex)), "ed25519")


def ecdsa_host_key(seed_hex: str) -> HostKey:
    """The ECDSA P-256 key of a 32-byte seed (hex): the seed as a scalar, reduced into [1, n - 1]
    (the bias of a 256-bit value mod n is below 2^-128)."""
    scalar = int.from_bytes(_seed(seed_hex), "big") % (_P256_ORDER - 1) + 1
    return _openssh(ec.derive_private_key(scalar, ec.SECP256R1()), "ecdsa")


def known_hosts_line(host: str, port: int, public_openssh: str) -> str:
    """One known_hosts line (ssh(8) "SSH_KNOWN_HOSTS FILE FORMAT"): `[host]:port` off port 22."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {public_openssh}"
