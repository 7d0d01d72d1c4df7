#!/bin/bash
# TEST ONLY (tests/lab_box.py): PID 1 of a node host of the lab in a box, in place of systemd.
# It starts, in the order a booted clone's systemd does, what a clone runs: the hostname from
# /etc/hostname (systemd), the sysctl.d settings (systemd-sysctl), cloud-init's local stage (cloud-init-local.service, before the
# network: it writes the network config and renames the NIC by its MAC), ifupdown
# (networking.service), cloud-init's network stage (cloud-init.service: users, keys, host keys),
# sshd (ssh.service, after it), then cloud-init's config and final stages, then the enabled units. Each stage's output goes
# where journald would keep it: /var/log/labs-k8s-box-boot.log. The clone's guestinfo reaches
# cloud-init's VMware datasource as it does in the QEMU first-boot test: its VMX_GUESTINFO_*
# environment transport (tests/firstboot.py guestinfo_environment), set by the harness.
# Then it reaps orphans, as PID 1 must, until the harness kills the host.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec >>/var/log/labs-k8s-box-boot.log 2>&1
stage() {
    echo "labs-k8s-box: $*"
    "$@" || echo "labs-k8s-box: $1 exited $?"
}
hostname "$(cat /etc/hostname)"
# journald's /dev/log: the box's syslog reader (syslogd.py) keeps what daemons log (HAProxy's
# session lines, Keepalived, sshd) in /var/log/labs-k8s-box-syslog.log.
/usr/bin/python3 /usr/local/lib/labs-k8s-box/syslogd </dev/null &
ip link set lo up
# systemd-sysctl.service: /etc/sysctl.d, early (the balancer's ip_nonlocal_bind lives there).
stage sysctl --quiet --system
stage cloud-init init --local
stage ifup -a
stage cloud-init init
stage /etc/init.d/ssh start
stage cloud-init modules --mode=config
stage cloud-init modules --mode=final
# multi-user.target: every unit enabled there (the package postinsts and `systemctl enable` link
# them); on a first boot none is yet, on a power-on after the balancer step HAProxy and Keepalived
# start again as systemd would start them, and after prepare-node.sh containerd and the kubelet
# (native units, no init script: the box's systemctl runs their ExecStart=).
for unit in /etc/systemd/system/multi-user.target.wants/*.service; do
    name=$(basename "$unit" .service)
    [[ -e $unit && $name != ssh ]] || continue
    if [[ -x /etc/init.d/$name ]]; then
        stage "/etc/init.d/$name" start
    elif grep -q '^ExecStart=' "$(readlink -f "$unit")" 2>/dev/null; then
        stage systemctl start "$name.service"
    fi
done
echo "labs-k8s-box: booted"
trap 'exit 0' TERM
while :; do
    sleep 5 &
    wait $!
done
