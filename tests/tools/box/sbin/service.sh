#!/bin/bash
# TEST ONLY (tests/lab_box.py): service(8) in a lab box node host, where systemd is not PID 1:
# `service NAME ACTION` is `systemctl ACTION NAME`, as /usr/sbin/service itself does on a systemd
# host (init-system-helpers), through the box's systemctl (tests/tools/box/sbin/systemctl.sh).
set -u
[[ $# -ge 2 ]] || { echo "usage: service NAME ACTION" >&2; exit 2; }
exec /usr/local/sbin/systemctl "$2" "$1"
