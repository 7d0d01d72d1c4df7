#!/bin/bash
# TEST ONLY (tests/lab_box.py): udevadm in a lab box node host, where no udevd runs (systemd is not
# PID 1, and a udevd in a host would act on the machine's devices). The device nodes a host has are
# made by the box (host-boot.sh), so there is nothing to settle or reload: each call is recorded and
# succeeds; anything else is refused, so a step that needs more is seen failing.
set -u
echo "$(date -u +%FT%TZ) udevadm $*" >>/var/log/labs-k8s-box-systemctl.log
case "${1:-} ${2:-}" in
"settle "* | "control --reload" | "control --reload-rules" | "trigger "*) exit 0 ;;
*) echo "udevadm (lab box stand-in): $* is not modelled" >&2; exit 1 ;;
esac
