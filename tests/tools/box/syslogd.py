#!/usr/bin/python3
"""TEST ONLY (tests/lab_box.py): the node host's syslog, in place of journald's /dev/log.

A host has no journald (systemd is not PID 1 there), so what daemons send to syslog (HAProxy's
session log lines, Keepalived's state changes, sshd's) went nowhere. This reads the datagram
sockets a Debian host offers them, /dev/log and HAProxy's chroot copy /var/lib/haproxy/dev/log
(Debian's haproxy package has rsyslog listen there: /etc/rsyslog.d/49-haproxy.conf), and appends
each message, time-stamped by the host, to /var/log/labs-k8s-box-syslog.log.
"""

import os
import selectors
import socket
import time

LOG = "/var/log/labs-k8s-box-syslog.log"
SOCKETS = ("/dev/log", "/var/lib/haproxy/dev/log")


def main() -> None:
    selector = selectors.DefaultSelector()
    for path in SOCKETS:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        os.chmod(path, 0o666)
        selector.register(sock, selectors.EVENT_READ)
    with open(LOG, "a", buffering=1, encoding="utf-8", errors="replace") as out:
        while True:
            for key, _ in selector.select():
                message = key.fileobj.recv(65536).decode("utf-8", "replace").rstrip("\n\0")
                now = time.time()
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
                out.write(f"{stamp} {message}\n")


if __name__ == "__main__":
    main()
