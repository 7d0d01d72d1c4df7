#!/usr/bin/env bash
# System packages the test suite needs, from Debian only. Run as root by `make test`;
# on a machine where it cannot run (not root, not Debian) the tests that need these
# tools skip with a reason, and fail under CI=true.
#
# haproxy, keepalived, openssh-server and cloud-init are packaged as system services: Debian's
# maintainer scripts enable them for the next boot (deb-systemd-helper). The tests only run them as
# programs (their own instances, in namespaces). So this script says so before installing,
# and afterwards stops and disables the services of the packages it installed, and disables cloud-init
# at boot with /etc/cloud/cloud-init.disabled (cloud-init's own switch, read by its systemd
# generator): on a workstation it must never run at the next boot and, say, regenerate the
# SSH host keys. sshd likewise gets /etc/ssh/sshd_not_to_be_run, Debian's own switch (ssh.service's
# ConditionPathExists, /etc/init.d/ssh's check_for_no_start in openssh 1:9.2p1-2): an sshd the
# tests did not start never listens on this machine's interfaces. sshd itself does not read it,
# so the tests' own sshd (tests/test_real_ssh.py, in namespaces, `sshd -D -f`) still runs.
# Packages that were already installed are left as they were.
#
# LABS_K8S_TEST_PACKAGES (tests only) replaces the package list.
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
  # the vCenter trust test: update-ca-certificates in a private mount namespace
  ca-certificates util-linux
  # golden template: boot media and a real Debian rootfs for the seal script
  xorriso isolinux syslinux-common mtools dosfstools debootstrap sudo
  # first boot of the sealed template: clones in QEMU (TCG) with PVSCSI and VMXNET3, reached over SSH
  qemu-system-x86 qemu-utils e2fsprogs fdisk openssh-client
  # the impostor proof: real sshd's behind the real pulumi-command, in network namespaces
  openssh-server
  # the lab in a box's signed apt repositories of stand-in packages (tests/box_repo.py): dpkg-deb
  # builds them, apt-ftparchive (apt-utils) writes their indices and Release, gpg signs them
  apt-utils gnupg
  # tests/test_interrupted_dpkg.py: strace kills dpkg at an exact point of a package's install
  strace
  # the node's real programs (tests/kube_programs.py): flanneld needs cgo, pause is a static C
  # program (kubernetes' build/pause/linux/pause.c)
  gcc libc6-dev
  # vcsim and the Pulumi toolchain are built with the machine's own Go from Go modules
  # (tests/tools/build_vcsim.sh, build_toolchain.sh): never Debian's golang-go (1.19, too old).
)

if [[ -n ${LABS_K8S_TEST_PACKAGES:-} ]]; then
  read -r -a packages <<<"$LABS_K8S_TEST_PACKAGES"
fi
# Services that come with a package and that the tests never need running.
declare -A package_services=(
  [haproxy]="haproxy.service"
  [keepalived]="keepalived.service"
  [openssh-server]="ssh.service ssh.socket"
  [cloud-init]="cloud-init-local.service cloud-init.service cloud-config.service cloud-final.service cloud-init-hotplugd.socket"
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if (( ${#missing[@]} == 0 )); then
  echo "install-test-deps: all ${#packages[@]} packages present"
  exit 0
fi

quieted=()
for package in "${missing[@]}"; do
  if [[ -n ${package_services[$package]:-} ]]; then quieted+=("$package"); fi
done
if (( ${#quieted[@]} > 0 )); then
  echo "install-test-deps: installing ${quieted[*]} on this machine. The tests only run them as programs:" \
    "their services will be stopped and disabled right after, and cloud-init and sshd disabled at boot" \
    "(/etc/cloud/cloud-init.disabled, /etc/ssh/sshd_not_to_be_run). To leave this machine alone, run make test in a container" \
    "(.github/workflows/test.yml uses debian:bookworm, privileged)." >&2
fi

# Installing haproxy/keepalived/openssh-server must not start them on this machine: the tests start their
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

# Not at the next boot either. `systemctl disable` works with or without a running systemd
# (it edits the *.wants links); without systemctl at all (a bare container) nothing starts them.
for package in "${quieted[@]}"; do
  for unit in ${package_services[$package]}; do
    if ! command -v systemctl >/dev/null; then
      continue
    elif [[ -d /run/systemd/system ]]; then
      systemctl disable --now --quiet "$unit"
    else
      systemctl disable --quiet "$unit"
    fi
  done
  if [[ $package == cloud-init ]]; then
    mkdir -p /etc/cloud
    touch /etc/cloud/cloud-init.disabled
  fi
  if [[ $package == openssh-server ]]; then
    touch /etc/ssh/sshd_not_to_be_run
  fi
  echo "install-test-deps: $package: services disabled (${package_services[$package]})" >&2
done
