#!/usr/bin/env bash
# First-boot readiness of a clone: wait for cloud-init, and fail with cloud-init's own
# error text rather than a bare timeout. Every later remote step on this VM depends on it.
# Usage: wait-for-cloud-init.sh <timeout-seconds> <expected-hostname>
set -euo pipefail

timeout_seconds=${1:-900}
expected_hostname=${2:-}

set +e
timeout "$timeout_seconds" cloud-init status --wait >/dev/null
status=$?
set -e

if (( status == 124 )); then
  echo "cloud-init did not finish within ${timeout_seconds}s on $(hostname); its status:" >&2
  cloud-init status --long >&2 || true
  exit 1
fi
if (( status != 0 )); then
  echo "cloud-init failed on $(hostname) (exit ${status}):" >&2
  cloud-init status --long >&2 || true
  # The failing module's own message is what the user needs.
  grep -E 'WARNING|ERROR|Traceback' /var/log/cloud-init.log 2>/dev/null | tail -n 20 >&2 || true
  exit 1
fi
if [[ -n $expected_hostname && $(hostname) != "$expected_hostname" ]]; then
  # A wrong name means the guestinfo of another VM, or a template that was not sealed.
  echo "this VM calls itself $(hostname), expected ${expected_hostname}: check guestinfo.metadata" >&2
  exit 1
fi
echo "cloud-init done on $(hostname)"
