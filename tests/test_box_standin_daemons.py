"""The box's stand-in daemons listen as the Go daemons they model (tests/tools/box/standin/daemons.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).parent / "tools" / "box" / "standin"

# A listener that is not accepting (its process starved of CPU, as a box host can be while the
# CLI and other tests run), dialled 20 times with the 1 s timeout of the stand-ins' etcd peer
# probe. Prints how many dials completed.
STARVED_LISTENER = """
import socket, sys, daemons
server = getattr(daemons, sys.argv[1])(("127.0.0.1", 0), None)
port, opened = server.server_address[1], []
for _ in range(20):
    try:
        opened.append(socket.create_connection(("127.0.0.1", port), timeout=1.0))
    except OSError:
        pass
print(len(opened))
"""


@pytest.mark.parametrize("listener", ["_TCPServer", "_HTTPServer"])
def test_a_starved_daemon_still_completes_a_burst_of_dials_as_a_go_listener_does(listener: str) -> None:
    """Go's net.Listen backlog is the kernel's somaxconn (net/sock_linux.go maxListenerBacklog);
    socketserver's default is 5, after which the kernel drops SYNs and a 1 s dial to a live etcd
    member fails: the stand-in etcdctl then reports quorum lost where real etcd has none."""
    run = subprocess.run(
        [sys.executable, "-c", STARVED_LISTENER, listener],
        env={"PYTHONPATH": f"{STANDIN}:{STANDIN.parent.parent.parent}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "20"
