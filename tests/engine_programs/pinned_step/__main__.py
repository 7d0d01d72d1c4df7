"""One remote step through the project's own connections, for the impostor proof (tests/test_real_ssh.py).

The step connects with `components.remote.connection` (a node's address, pinned to its Ed25519
key) or `cluster_connection` (the VIP's SSH port, pinned to the control planes' shared ECDSA
key) and is registered with `components.remote.command`, exactly as the lab's steps are, so the
proof covers the program's code rather than a copy. Its stdin carries a secret, which its
command writes to `$HOME/step-ran` on the host that runs it: that file exists only where a
session was opened and a command run.

With `create: no-op` the step is a leave guard's create instead: `components.remote.NO_OP_CREATE`
with a bundle on stdin larger than OpenSSH's session window (CHAN_SES_WINDOW_DEFAULT, 64 x 32 KiB:
openssh channels.h). `create: ignores-stdin` is the control: a command that ends without reading
that bundle, late enough that the client is still waiting for the window to send the rest
(tests/test_real_ssh.py).

Config (namespace `pinned-step`): `via` (`node` or `vip`), `hostKey` (the pin), `privateKey`
(secret: the client key), `stepSecret` (secret: the stdin), `dialAttempts`, `create` (`writes`,
the default, `no-op` or `ignores-stdin`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# The checkout's root (this file is tests/engine_programs/pinned_step/__main__.py): the language
# host puts only the program's own directory on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import pulumi

from components.remote import NO_OP_CREATE, cluster_connection, command, connection
from tests.labs import make_lab_config

config = pulumi.Config()
lab = make_lab_config()
via = config.require("via")
host_key = config.require("hostKey")
private_key = config.require_secret("privateKey")
dial_attempts = config.require_int("dialAttempts")
if via == "node":
    target = connection(lab, lab.control_planes[0], private_key, host_key, dial_attempts)
elif via == "vip":
    target = cluster_connection(lab, private_key, host_key, dial_attempts)
else:
    raise ValueError(f"pinned-step:via is {via!r}: node or vip")

# Beyond the server's 2 MiB window: the client cannot have sent it all before the command ends.
BUNDLE_BYTES = 3 * 1024 * 1024
step_secret = config.require_secret("stepSecret")
IGNORES_STDIN = "sleep 2"
if config.get("create") in ("no-op", "ignores-stdin"):
    create = NO_OP_CREATE if config.get("create") == "no-op" else IGNORES_STDIN
    stdin = step_secret.apply(lambda s: (s + "\n").ljust(BUNDLE_BYTES, "#"))
else:
    create, stdin = 'cat > "$HOME/step-ran"', step_secret

step = command(
    "pinned-step",
    connection=target,
    create=create,
    stdin=stdin,
    opts=pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(create="5m", update="5m", delete="5m")),
)
pulumi.export("stepId", step.id)
