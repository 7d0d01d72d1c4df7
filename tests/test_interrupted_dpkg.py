"""The balancer step cut off while dpkg installs HAProxy, then run again: the real step bundle, the
real dpkg and apt, on the template's sealed Debian rootfs (tests/firstboot.py), with Debian's real
packages from the box's snapshot of the archive (tests/apt_mirror.py) on a private loopback.

The lab in a box found it (#31, tests/test_lab_box.py powers lb02 off while dpkg's journal is not
empty): where the power-off lands decides what dpkg leaves, so there it is luck. Here strace kills
dpkg at exactly the point each case names (`--inject=…:signal=KILL`, the process dies as in a
power-off: no clean-up), and the test first checks that dpkg left the state the case is about, so a
dpkg that orders its work differently fails the test instead of testing something else:
- `unpacking`: while extracting haproxy's files, at its first touch of `/usr/sbin/haproxy.dpkg-new`
  (src/main/archives.c tarobject): Status "install reinstreq half-installed".
- `unpacked`: after dpkg journaled haproxy "unpacked" and before it cleared the reinst-required flag:
  it removes each file's `.dpkg-tmp` backup in between (src/main/unpack.c, the end of
  process_archive); the second rmdir of `/var/lib/haproxy/dev.dpkg-tmp` is there, the first is the
  extraction's. Status "install reinstreq unpacked": `dpkg --configure -a` refuses it ("package is
  in a very bad inconsistent state") and apt-get install of the others leaves it so; the step's
  retry failed this way in CI before cloudinit/node/interrupted-dpkg.sh reinstalled it (and this
  case fails so without it; `unpacking` converged before too, apt reinstalling a half-installed
  package itself, but the retry now says that it repairs it).
The retry must then converge (HAProxy and Keepalived installed and configured, `dpkg --audit`
clean, haproxy runs) and a third run change nothing.

Everything runs in private mount, network and PID namespaces (the apt mirror on their own
loopback); systemctl is a stand-in (no systemd in a chroot), as in tests/test_lb_render.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.rendering import lb, step_bundle
from components.template import CACHE_ROOT
from tests.apt_mirror import record
from tests.firstboot import sealed_rootfs
from tests.labs import make_lab_config
from tests.netns_lab import TEST_VRRP_PASSWORD
from tests.requirements import require_root, require_tool
from tests.test_lab_box import BALANCER_PACKAGES, NODE_PACKAGES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
CFG = make_lab_config()
VRRP_PASSWORD = TEST_VRRP_PASSWORD
MIRROR = "127.0.0.1:3142"

# case -> (strace's arguments that kill dpkg there, the Status dpkg leaves haproxy in)
KILL_POINTS = {
    "unpacking": (
        "-P /usr/sbin/haproxy.dpkg-new -e inject=all:signal=KILL:when=1",
        "install reinstreq half-installed",
    ),
    "unpacked": (
        "-P /var/lib/haproxy/dev.dpkg-tmp -e trace=rmdir -e inject=rmdir:signal=KILL:when=2",
        "install reinstreq unpacked",
    ),
}

SYSTEMCTL_STANDIN = textwrap.dedent("""\
    #!/bin/bash
    # systemctl stand-in (no systemd in a chroot): unit state as files under /run/standin.
    mkdir -p /run/standin
    args=(); for a in "$@"; do [[ $a == -* ]] || args+=("$a"); done
    case ${args[0]:-} in
        is-enabled) [[ -e /run/standin/enabled-${args[1]} ]] ;;
        is-active) [[ -e /run/standin/active-${args[1]} ]] ;;
        enable) touch "/run/standin/enabled-${args[1]}" ;;
        start|restart) touch "/run/standin/active-${args[1]}" ;;
        reload) [[ -e /run/standin/active-${args[1]} ]] ;;
        *) exit 0 ;;
    esac
""")

# In private mount, network and PID namespaces: the mirror on loopback, the rootfs overlaid, then
# run 0 of the bundle with dpkg killed at the case's point, and runs 1 and 2 as they are.
DRIVER = textwrap.dedent("""\
    set -u
    ip link set lo up
    ip link add {iface} type veth peer name lk8s-peer
    cd {repo}
    {python} -m tests.apt_mirror serve {snapshot} {mirror} --log {out}/mirror.log >{out}/mirror.out 2>&1 &
    for _ in $(seq 100); do grep -q MIRROR {out}/mirror.out && break; sleep 0.1; done
    mount -t overlay overlay -o lowerdir={rootfs},upperdir={work}/upper,workdir={work}/work {root}
    mount -t proc proc {root}/proc
    node_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    in_node() {{ env -i PATH=$node_path LC_ALL=C chroot {root} "$@"; }}
    strace -f -o {out}/strace.log {strace} env -i PATH=$node_path LC_ALL=C chroot {root} \\
        bash -s <{out}/bundle.sh >{out}/run0.log 2>&1
    echo $? >{out}/run0.rc
    in_node dpkg-query -W -f='${{Status}}' haproxy >{out}/killed.status 2>&1
    for run in 1 2; do
        in_node bash -s <{out}/bundle.sh >{out}/run$run.log 2>&1; echo $? >{out}/run$run.rc
    done
    in_node dpkg --audit >{out}/audit.log 2>&1; echo $? >>{out}/audit.log
    in_node dpkg-query -W -f='${{Package}} ${{Status}}\\n' haproxy keepalived >{out}/final.status 2>&1
    in_node haproxy -v >{out}/haproxy-v.log 2>&1; echo $? >{out}/haproxy-v.rc
""")


@pytest.fixture(scope="module")
def snapshot() -> Iterator[tuple[Path, Path]]:
    """(the sealed rootfs, the box's snapshot of Debian's archive for it)."""
    require_root()
    require_tool("strace", "unshare", "chroot", "ip")
    rootfs = sealed_rootfs(CFG)
    yield rootfs, record(rootfs, (*BALANCER_PACKAGES, *NODE_PACKAGES), CACHE_ROOT / "box-mirror")


def read(path: Path) -> str:
    return path.read_text() if path.exists() else f"({path.name} missing)"


@pytest.mark.parametrize("case", sorted(KILL_POINTS))
def test_a_balancer_step_cut_off_in_dpkg_converges_when_run_again(
    case: str, snapshot: tuple[Path, Path], tmp_path: Path
) -> None:
    rootfs, archive = snapshot
    strace, left_status = KILL_POINTS[case]
    work, out, root = tmp_path / "overlay", tmp_path / "out", tmp_path / "root"
    for directory in (work / "upper", work / "work", out, root):
        directory.mkdir(parents=True)
    # What the node has before the step: the stack's apt proxy (labs-k8s:mirrors.aptProxy, written
    # by cloud-init on a real node) and, here, the systemctl stand-in.
    (work / "upper/etc/apt/apt.conf.d").mkdir(parents=True)
    (work / "upper/etc/apt/apt.conf.d/90labs-k8s-proxy").write_text(f'Acquire::http::Proxy "http://{MIRROR}";\n')
    (work / "upper/usr/local/sbin").mkdir(parents=True)
    (work / "upper/usr/local/sbin/systemctl").write_text(SYSTEMCTL_STANDIN)
    (work / "upper/usr/local/sbin/systemctl").chmod(0o755)
    files = lb.balancer_files(CFG, CFG.balancers[0], VRRP_PASSWORD)
    (out / "bundle.sh").write_text(step_bundle(lb.STEP_NAME, files, lb.SETUP_SCRIPT))
    driver = DRIVER.format(
        iface=CFG.network.interface, repo=REPO, python=sys.executable, snapshot=archive, mirror=MIRROR,
        out=out, rootfs=rootfs, work=work, root=root, strace=strace,
    )  # fmt: skip
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "bash", "-c", driver],
        capture_output=True, text=True, timeout=800, check=False, env={**os.environ, "LC_ALL": "C"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = [read(out / f"run{i}.log") for i in range(3)]

    # Run 0: dpkg died where the case says, the step failed, and dpkg left what the case is about.
    assert read(out / "run0.rc").strip() != "0", runs[0][-3000:]
    assert read(out / "killed.status") == left_status, (read(out / "killed.status"), runs[0][-3000:])

    # Run 1 repairs it and converges.
    assert read(out / "run1.rc").strip() == "0", runs[1][-4000:]
    assert "reinstalling" in runs[1], runs[1][-4000:]
    assert read(out / "final.status").splitlines() == [
        "haproxy install ok installed",
        "keepalived install ok installed",
    ], read(out / "final.status")
    assert read(out / "audit.log").strip() == "0", read(out / "audit.log")
    assert read(out / "haproxy-v.rc").strip() == "0", read(out / "haproxy-v.log")
    assert (work / "upper/etc/haproxy/haproxy.cfg").read_text() == files["haproxy.cfg"]
    assert (work / "upper/etc/keepalived/keepalived.conf").read_text() == files["keepalived.conf"]

    # Run 2: nothing left to do.
    assert read(out / "run2.rc").strip() == "0", runs[2][-3000:]
    assert runs[2].strip().splitlines()[-1] == "setup-balancer: unchanged", runs[2][-3000:]
