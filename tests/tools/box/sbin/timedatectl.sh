#!/bin/bash
# TEST ONLY (tests/lab_box.py): timedatectl in a lab box node host. The real one asks
# systemd-timedated over D-Bus, and neither runs in a host (systemd is not PID 1, init.sh); nor has
# the host a clock of its own to discipline: it shares the machine's. `set-ntp` is recorded, as
# the box's systemctl records systemd-timesyncd; `show`/`status` report what was set.
set -u
echo "$(date -u +%FT%TZ) timedatectl $*" >>/var/log/labs-k8s-box-systemctl.log
state=/var/lib/labs-k8s-box/ntp
mkdir -p "${state%/*}"
case ${1:-status} in
set-ntp)
    case ${2:-} in
    true | yes | 1 | on) echo yes >"$state" ;;
    false | no | 0 | off) echo no >"$state" ;;
    *) echo "Failed to parse NTP setting '${2:-}'" >&2; exit 1 ;;
    esac ;;
show) echo "NTP=$(cat "$state" 2>/dev/null || echo no)"; echo "NTPSynchronized=yes" ;;
status) echo "System clock synchronized: yes"; echo "NTP service: $(sed 's/yes/active/;s/no/inactive/' "$state" 2>/dev/null || echo inactive)" ;;
*) echo "timedatectl (lab box stand-in): $1 is not modelled" >&2; exit 1 ;;
esac
