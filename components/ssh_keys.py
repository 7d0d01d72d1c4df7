"""The lab's SSH key pair, checked before anything is built.

The remote steps log in with `labs-k8s:sshPrivateKey` (pulumi-command, golang.org/x/crypto/ssh)
and every node trusts `labs-k8s:ssh.publicKey` (cloud-init). Two mistakes only show up after
the template build and the clones, 20-40 minutes in, as an SSH "unable to authenticate" on the
first readiness step:

- a private key protected by a passphrase. pulumi-command could take one (`privateKeyPassword`)
  and also offers an ssh-agent's keys (SSH_AUTH_SOCK), but it parses `privateKey` first and fails
  on an encrypted one before it asks any agent (pulumi-command provider/pkg/provider/remote/
  connection.go, SShConfig). This program passes no passphrase on purpose: the key already sits
  encrypted by the stack's secrets provider, a passphrase would be one more secret in every remote
  step's inputs, and the key must work from the stack alone (a teammate's checkout, the preview
  job, a later destroy), where no agent of this machine's session is;
- a private key that is not the other half of `ssh.publicKey`.

Both are decided here from the key material alone, with `cryptography` reading the same formats
x/crypto/ssh accepts (OpenSSH, PKCS#1, PKCS#8, SEC1 PEM).
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

# components/tools/offline.py puts this into its placeholder private key: `render` runs without secrets.
RENDER_PLACEHOLDER_MARK = "RENDER-PLACEHOLDER"
NEW_KEY_COMMAND = "mkdir -p -m 0700 ~/.ssh && ssh-keygen -t ed25519 -N '' -C labs-k8s -f ~/.ssh/labs-k8s"


def fingerprint(key_blob: bytes) -> str:
    """`ssh-keygen -l` style SHA256 fingerprint of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


def public_key_blob(public_key_line: str) -> bytes | None:
    """The wire blob of an `ssh-ed25519 AAAA... comment` line; None when it is not one."""
    parts = public_key_line.strip().split()
    if len(parts) < 2:
        return None
    try:
        return base64.b64decode(parts[1], validate=True)
    except ValueError:
        return None


def _load_private_key(text: str) -> PrivateKeyTypes:
    data = text.strip().encode() + b"\n"
    if b"-----BEGIN OPENSSH PRIVATE KEY-----" in data:
        return serialization.load_ssh_private_key(data, password=None)
    return serialization.load_pem_private_key(data, password=None)


def private_key_problem(private_key: str, public_key_line: str | None, stack: str) -> str | None:
    """What is wrong with the private key (alone, or against `ssh.publicKey`); None when it is usable.

    The message never quotes the private key; it shows fingerprints, which are not secret.
    """
    if RENDER_PLACEHOLDER_MARK in private_key:
        return None
    set_both = (
        f"make a key pair without a passphrase for the lab and set both halves: {NEW_KEY_COMMAND}; "
        f"pulumi config set --stack {stack} --secret labs-k8s:sshPrivateKey < ~/.ssh/labs-k8s; "
        f'pulumi config set --stack {stack} --path labs-k8s:ssh.publicKey "$(cat ~/.ssh/labs-k8s.pub)"'
    )
    try:
        key = _load_private_key(private_key)
    except TypeError:
        # cryptography: "Key is password-protected" / "Password was not given but private key is encrypted".
        return (
            "the private key is protected by a passphrase, and the remote steps get none: this program passes "
            "no privateKeyPassword to pulumi-command (the key is already encrypted in the stack, and must work "
            "from the stack alone, so an ssh-agent does not stand in; pulumi-command fails on an encrypted key "
            "before it asks one). Use a key without a passphrase for the lab only: remove it from a copy "
            f"(ssh-keygen -p -N '' -f <copy>) or {set_both}"
        )
    except (ValueError, UnsupportedAlgorithm) as error:
        return f"cannot be read as an OpenSSH or PEM private key ({error}); {set_both}"
    try:
        derived = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    except (AttributeError, ValueError) as error:
        return f"is a key type SSH cannot use ({error}); {set_both}"
    if public_key_line is None:
        return None
    wanted = public_key_blob(public_key_line)
    have = public_key_blob(derived.decode())
    if wanted is None or have is None:
        return None  # a malformed ssh.publicKey is reported by the config model, with its own fix
    if wanted != have:
        return (
            f"does not belong to labs-k8s:ssh.publicKey: the private key's public half is {fingerprint(have)}, "
            f"ssh.publicKey is {fingerprint(wanted)}, so no node would let the remote steps in. "
            f"Check with `ssh-keygen -lf ~/.ssh/<key>.pub`, or {set_both}"
        )
    return None
