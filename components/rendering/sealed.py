"""Sealed step bundles: a bundle that carries a secret runs only on a host that proves it is the VM.

pulumi-command 1.2.1 accepts any SSH host key (`ssh.InsecureIgnoreHostKey()` in
provider/pkg/provider/remote/connection.go, `SShConfig`) and sends a step's stdin in one go, so the
program cannot check whom it reached before the bundle is gone. Instead, each VM gets a random
*node key* through vCenter (guestinfo `NODE_KEY_GUESTINFO`, set in its extraConfig over vCenter's
TLS API, never on the node network), and a bundle with a secret in it is encrypted to the node keys
of the hosts meant to run it: the node for a node step, every control plane for a step through the
VIP. Its plain front (cloudinit/node/unseal-step.sh) reads the key from guestinfo, decrypts and runs
the real bundle, or stops naming the node and the reason. A host that answers for the address
without being the VM gets ciphertext only.

The format is `openssl enc -aes-256-cbc -pbkdf2 -md sha256` ("Salted__", salt, CBC data; key and IV
from PBKDF2-HMAC-SHA256: openssl apps/enc.c), which the Debian 12 nodes' openssl 3.0 decrypts with
nothing else installed. Salts and the bundle key are derived from the contents (HMAC), so the same
bundle seals to the same text: an unchanged step stays unchanged in `pulumi preview`.

Pure: text in, text out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from cryptography.hazmat.primitives import hashes, padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from components.rendering import read_file, step_bundle

NODE_KEY_GUESTINFO = "guestinfo.labs-k8s.node-key"
NODE_KEY_LENGTH = 32  # characters of [A-Za-z0-9]: about 190 bits
UNSEAL_SCRIPT = "node/unseal-step.sh"
UNSEAL_ENTRYPOINT = "unseal-step.sh"
RECIPIENTS_FILE = "sealed-recipients"
PAYLOAD_FILE = "sealed-bundle"
DIGEST_FILE = "sealed-sha256"
PROVE_FILE = "sealed-prove"
PROOF_PREFIX = "labs-k8s-proof "
# Must match unseal-step.sh. The keys are random, not passwords: the iterations only cost time.
PBKDF2_ITERATIONS = 10000
_SALT_MAGIC = b"Salted__"


def key_id(node_key: str) -> str:
    """What the bundle names a recipient by: a hash of its key, not the key."""
    return hashlib.sha256(f"labs-k8s node key id\n{node_key}\n".encode()).hexdigest()[:16]


def _key_iv(password: str, salt: bytes) -> tuple[bytes, bytes]:
    derived = PBKDF2HMAC(algorithm=hashes.SHA256(), length=48, salt=salt, iterations=PBKDF2_ITERATIONS).derive(
        password.encode()
    )
    return derived[:32], derived[32:]


def encrypt(password: str, plaintext: bytes) -> str:
    """What `openssl enc -aes-256-cbc -pbkdf2 -iter N -md sha256 -a -A -pass ...` prints, one line.
    The salt comes from the password and the text: deterministic, never reused for other text."""
    salt = hmac.new(password.encode(), b"salt\0" + plaintext, hashlib.sha256).digest()[:8]
    key, iv = _key_iv(password, salt)
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plaintext) + padder.finalize()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    data = _SALT_MAGIC + salt + encryptor.update(padded) + encryptor.finalize()
    return base64.b64encode(data).decode()


def decrypt(password: str, text: str) -> bytes:
    """The inverse of `encrypt` (and of openssl's own output)."""
    data = base64.b64decode(text)
    if not data.startswith(_SALT_MAGIC):
        raise ValueError("not openssl enc data")
    key, iv = _key_iv(password, data[8:16])
    decryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
    padded = decryptor.update(data[16:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(padded) + unpadder.finalize()


def seal(step: str, bundle: str, recipients: Mapping[str, str], prove: bool = False) -> str:
    """`bundle` (a step_bundle) sealed to `recipients` (host name -> node key): a step bundle of
    its own whose entrypoint, unseal-step.sh, decrypts and runs it on one of those hosts only.
    `prove`: the front ends the answer (stdout) with a proof line only such a host can compute."""
    if not recipients:
        raise ValueError(f"{step}: a sealed bundle needs at least one recipient")
    for name, node_key in recipients.items():
        if len(node_key) < NODE_KEY_LENGTH or not node_key.isalnum():
            raise ValueError(f"{step}: the node key of {name} is not a {NODE_KEY_LENGTH}-character key")
    plaintext = bundle.encode()
    material = "\0".join(f"{name}\0{key}" for name, key in sorted(recipients.items())).encode()
    bundle_key = hmac.new(material, b"bundle key\0" + plaintext, hashlib.sha256).hexdigest()
    lines = [
        f"{name} {key_id(node_key)} {encrypt(node_key, bundle_key.encode())}" for name, node_key in recipients.items()
    ]
    files = {
        UNSEAL_ENTRYPOINT: read_file(UNSEAL_SCRIPT),
        RECIPIENTS_FILE: "".join(f"{line}\n" for line in lines),
        PAYLOAD_FILE: encrypt(bundle_key, plaintext) + "\n",
        DIGEST_FILE: hashlib.sha256(plaintext).hexdigest() + "\n",
    }
    if prove:
        files[PROVE_FILE] = "the answer ends with a proof line (unseal-step.sh)\n"
    return step_bundle(step, files, UNSEAL_ENTRYPOINT, (step,))


def _bundle_file(sealed: str, name: str) -> str:
    """A file of a step bundle (rendering.step_bundle's heredocs), decoded."""
    marker = f"/{name} <<'LABS_K8S_EOF'\n"
    start = sealed.index(marker) + len(marker)
    end = sealed.index("\nLABS_K8S_EOF", start)
    return base64.b64decode(sealed[start:end].replace("\n", "")).decode()


def recipients_of(sealed: str) -> list[str]:
    """The host names a sealed bundle is meant for."""
    return [line.split()[0] for line in _bundle_file(sealed, RECIPIENTS_FILE).splitlines()]


def _bundle_key(sealed: str, node_key: str) -> str:
    for line in _bundle_file(sealed, RECIPIENTS_FILE).splitlines():
        _name, wanted, wrapped = line.split()
        if wanted == key_id(node_key):
            return decrypt(node_key, wrapped).decode()
    raise ValueError("this node key is not among the bundle's recipients")


def unseal(sealed: str, node_key: str) -> str:
    """The bundle inside `sealed`, for the holder of `node_key` (tests and tooling)."""
    return decrypt(_bundle_key(sealed, node_key), _bundle_file(sealed, PAYLOAD_FILE).strip()).decode()


def proof(sealed: str, node_key: str, answer: str) -> str:
    """The proof line unseal-step.sh prints after `answer` (its stdout, trailing newlines dropped)."""
    digest = hashlib.sha256(f"labs-k8s proof\n{_bundle_key(sealed, node_key)}\n".encode() + answer.encode())
    return PROOF_PREFIX + digest.hexdigest()


def verified_answer(step: str, sealed: str, node_key: str, stdout: str) -> str:
    """The answer of a proving step (stdout as pulumi-command returns it), once its proof line shows
    that the host that answered could open the bundle: an impostor can print anything, but not this."""
    answer, _, last = stdout.rpartition("\n")
    if not last.startswith(PROOF_PREFIX):
        raise ValueError(
            f"{step}: the answer has no proof that a host of {', '.join(recipients_of(sealed))} gave it: "
            'another machine may answer for the address (docs/cluster.md, "Host identity"); not used'
        )
    if not hmac.compare_digest(last, proof(sealed, node_key, answer.rstrip("\n"))):
        raise ValueError(
            f"{step}: the answer's proof is wrong: it did not come from a host of "
            f'{", ".join(recipients_of(sealed))} (docs/cluster.md, "Host identity"); not used'
        )
    return answer
