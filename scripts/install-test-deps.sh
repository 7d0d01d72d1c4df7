#!/usr/bin/env bash
# System packages the test suite needs, from Debian only. Run as root by `make test`;
# on a machine where it cannot run (not root, not Debian) the tests that need these
# tools skip with a reason, and fail under CI=true.
set -euo pipefail

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "install-test-deps: not root on Debian; skipping system packages" >&2
  exit 0
fi

packages=(
  # load balancers, run for real in network namespaces
  haproxy keepalived iproute2 openssl curl procps psmisc jq
  # remote scripts and cloud-config
  shellcheck cloud-init debconf
  # golden template: boot media and a real Debian rootfs for the seal script
  xorriso isolinux syslinux-common mtools dosfstools debootstrap sudo
  # vcsim, built from Debian's govmomi sources (tests/tools/build_vcsim.sh)
  golang-go golang-github-vmware-govmomi-dev dpkg-dev
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if (( ${#missing[@]} == 0 )); then
  echo "install-test-deps: all ${#packages[@]} packages present"
  exit 0
fi

# Installing haproxy/keepalived must not start them on this machine: the tests start their
# own instances inside namespaces. policy-rc.d tells invoke-rc.d to leave services alone.
created_policy=false
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
  created_policy=true
fi
trap '[[ $created_policy == true ]] && rm -f /usr/sbin/policy-rc.d' EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-test-deps: installed ${missing[*]}"
