#!/bin/sh
# TEST ONLY (tests/test_firstboot_qemu.py): PID 1 of a QEMU clone of the template, named on the
# kernel line with init=. It stands in for the one thing QEMU cannot do, VMware's guestinfo
# backdoor: it hands the clone's guestinfo.* values, which the test put into QEMU's fw_cfg as a
# systemd drop-in, to systemd as DefaultEnvironment, then becomes systemd. ds-identify (a
# generator) and every cloud-init unit then see cloud-init's own VMX_GUESTINFO_* variables: the
# environment transport of DataSourceVMware (cloud-init 22.4), which decodes exactly what
# `vmware-rpctool info-get guestinfo.*` returns on vSphere. The real template never runs this.
# The initramfs has mounted /proc, /sys and /run (a tmpfs) and moved them into the root.
set -u

dropin=/sys/firmware/qemu_fw_cfg/by_name/opt/labs-k8s/guestinfo/raw
modprobe qemu_fw_cfg 2>/dev/null || echo "firstboot-guestinfo-init: modprobe qemu_fw_cfg failed" >/dev/console
if [ -r "$dropin" ]; then
    mkdir -p /run/systemd/system.conf.d
    cat "$dropin" >/run/systemd/system.conf.d/50-labs-k8s-guestinfo.conf
else
    echo "firstboot-guestinfo-init: no $dropin: this clone has no guestinfo" >/dev/console
fi
exec /lib/systemd/systemd "$@"
