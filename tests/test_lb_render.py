"""The balancer pair's rendered files: real `haproxy -c` / `keepalived -t`, key directives,
shellcheck, the check script against a real HAProxy, and setup-balancer.sh run twice.

Runtime behaviour (failover) is in test_lb_netns.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.config import LabConfig, LabConfigError, load_lab_config
from components.rendering import CLOUDINIT_DIR, INTERRUPTED_DPKG_FILE, STEP_ROOT, bundle_files, lb, step_bundle
from tests.labs import namespace
from tests.netns_lab import TEST_VRRP_PASSWORD, ensure_script_user
from tests.requirements import require_root, require_tool

LB_DIR = CLOUDINIT_DIR / "lb"


# --------------------------------------------------------------------------- configs


def _five_control_planes() -> dict[str, Any]:
    raw = namespace()
    raw["nodes"]["controlPlanes"]["hosts"] += [
        {"name": "labs-k8s-m04", "ip": "10.3.60.57"},
        {"name": "labs-k8s-m05", "ip": "10.3.60.58"},
    ]
    return raw


def _single_balancer() -> dict[str, Any]:
    raw = namespace()
    raw["nodes"]["balancers"]["hosts"] = raw["nodes"]["balancers"]["hosts"][:1]
    raw["loadBalancer"]["allowSingleBalancer"] = True
    return raw


def _other_lab() -> dict[str, Any]:
    """Another segment, interface, VRID and advert interval: nothing may be hard-coded."""
    raw = namespace()
    raw["network"] = {
        **raw["network"],
        "cidr": "192.168.7.0/25",
        "gateway": "192.168.7.1",
        "dnsServers": ["192.168.7.1"],
        "interface": "ens224",
    }
    for role, base in (("balancers", 10), ("controlPlanes", 20), ("workers", 30)):
        for i, host in enumerate(raw["nodes"][role]["hosts"]):
            host["ip"] = f"192.168.7.{base + i}"
    raw["loadBalancer"] = {"vip": "192.168.7.100", "vrrpRouterId": 7, "advertIntSeconds": 2}
    return raw


VARIANTS = {
    "labs": namespace,
    "five-control-planes": _five_control_planes,
    "single-balancer": _single_balancer,
    "other-lab": _other_lab,
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> LabConfig:
    return load_lab_config(VARIANTS[request.param]())


@pytest.fixture
def labs(lab_config: LabConfig) -> LabConfig:
    return lab_config


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Traversable by keepalived_script (pytest's tmp_path is 0700 under /tmp/pytest-of-root).
    path = Path(tempfile.mkdtemp(prefix="lk8s-lb-render-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- validators


def haproxy_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)


def keepalived_check(config: Path, interface: str) -> subprocess.CompletedProcess[str]:
    """`keepalived -t` in a private network namespace that has the config's interface (a veth:
    `-t` rejects an interface that does not exist). `unshare --pid --fork` works around the
    2.2.7 bug that makes `-t` kill itself when script_user is set (see setup-balancer.sh)."""
    script = (
        f"ip link add {interface} type veth peer name lk8s-peer && exec unshare --pid --fork keepalived -t -f {config}"
    )
    return subprocess.run(["unshare", "--net", "bash", "-c", script], capture_output=True, text=True, timeout=30)


def _write_keepalived(cfg: LabConfig, workdir: Path, balancer_index: int = 0, **kwargs: Any) -> Path:
    """The rendered keepalived.conf, with only the check script's path moved into workdir."""
    check = workdir / "check_apiserver.sh"
    check.write_text(lb.render_check_script(cfg))
    check.chmod(0o755)
    conf = workdir / f"keepalived-{balancer_index}.conf"
    paths = lb.BalancerPaths(check_script=str(check))
    conf.write_text(
        lb.render_keepalived_conf(cfg, cfg.balancers[balancer_index], TEST_VRRP_PASSWORD, paths=paths, **kwargs)
    )
    return conf


def _need_daemons() -> None:
    require_root()
    require_tool("haproxy", "keepalived", "ip", "unshare")
    ensure_script_user(lb.SCRIPT_USER)


# --------------------------------------------------------------------------- real validation


@pytest.mark.integration
def test_haproxy_accepts_the_rendered_config(variant: LabConfig, workdir: Path) -> None:
    require_tool("haproxy")
    config = workdir / "haproxy.cfg"
    config.write_text(lb.render_haproxy_cfg(variant))  # production paths: `-c` opens no socket
    result = haproxy_check(config)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[WARNING]" not in output and "[ALERT]" not in output, output


@pytest.mark.integration
def test_haproxy_check_rejects_a_broken_config(labs: LabConfig, workdir: Path) -> None:
    require_tool("haproxy")
    config = workdir / "haproxy.cfg"
    config.write_text(lb.render_haproxy_cfg(labs).replace("balance roundrobin", "balance no-such-algorithm"))
    assert haproxy_check(config).returncode != 0


@pytest.mark.integration
def test_keepalived_accepts_the_rendered_configs(variant: LabConfig, workdir: Path) -> None:
    _need_daemons()
    for index in range(len(variant.balancers)):
        config = _write_keepalived(variant, workdir, index)
        result = keepalived_check(config, variant.network.interface)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{variant.balancers[index].name}: {output}"
        assert "WARNING" not in output, output


@pytest.mark.integration
def test_keepalived_check_rejects_what_would_not_run(labs: LabConfig, workdir: Path) -> None:
    _need_daemons()
    config = _write_keepalived(labs, workdir)
    (workdir / "check_apiserver.sh").unlink()  # the check script is missing
    result = keepalived_check(config, labs.network.interface)
    assert result.returncode != 0, result.stderr
    config = _write_keepalived(labs, workdir)
    result = keepalived_check(config, "ens999")  # the interface does not exist
    assert result.returncode != 0, result.stderr


# --------------------------------------------------------------------------- directives


def _section(text: str, header: str) -> str:
    match = re.search(rf"^{re.escape(header)}\n((?:[ \t]+.*\n|\n)*)", text, re.MULTILINE)
    assert match, f"no section {header!r}"
    return match.group(1)


def test_haproxy_is_l4_passthrough_with_https_health_checks(variant: LabConfig) -> None:
    text = lb.render_haproxy_cfg(variant)
    vip = variant.load_balancer.vip
    assert re.search(r"^\s+mode tcp$", _section(text, "defaults"), re.MULTILINE)
    frontend = _section(text, "frontend kube-apiserver")
    assert re.search(rf"^\s+bind {re.escape(str(vip))}:6443$", frontend, re.MULTILINE)
    assert "ssl" not in frontend and "crt" not in frontend  # never TLS termination
    assert "mode http" not in frontend
    backend = _section(text, "backend kube-apiserver")
    assert "balance roundrobin" in backend
    assert "option httpchk" in backend
    assert "http-check send meth GET uri /healthz" in backend
    assert "http-check expect status 200" in backend
    assert re.search(r"default-server check check-ssl verify none inter 2s fall 3 rise 2\b", backend)
    assert "option redispatch" in backend
    assert re.search(r"^\s+retries [1-9]$", text, re.MULTILINE)
    for timeout in ("client", "server", "tunnel"):
        assert re.search(rf"^\s+timeout {timeout} 1h$", text, re.MULTILINE), timeout
    servers = re.findall(r"^\s+server (\S+) (\S+)$", backend, re.MULTILINE)
    assert servers == [(n.name, f"{n.ip}:6443") for n in variant.control_planes]
    assert re.search(r"^\s+stats socket /run/haproxy/admin\.sock mode 660 level admin\b", text, re.MULTILINE)
    monitor = _section(text, "frontend haproxy-monitor")
    assert f"bind 127.0.0.1:{lb.MONITOR_PORT}" in monitor and f"monitor-uri {lb.MONITOR_URI}" in monitor

    # The cluster-wide steps' SSH: the first control plane whose apiserver is healthy.
    ssh = _section(text, "listen control-plane-ssh")
    assert re.search(rf"^\s+bind {re.escape(str(vip))}:{lb.CONTROL_PLANE_SSH_PORT}$", ssh, re.MULTILINE)
    assert "balance first" in ssh and "option redispatch 1" in ssh
    # One check sequence: sshd's banner on port 22, then the apiserver's /healthz over TLS.
    checks = re.findall(r"^\s+(tcp-check .+)$", ssh, re.MULTILINE)
    assert checks == [
        "tcp-check connect port 22",
        r"tcp-check expect rstring ^SSH-2\.0-",
        "tcp-check connect port 6443 ssl",
        rf'tcp-check send "GET /healthz HTTP/1.1\r\nHost: {vip}\r\nConnection: close\r\n\r\n"',
        r"tcp-check expect rstring ^HTTP/1\.[01]\ 200",
    ]
    assert re.search(r"default-server check verify none inter 2s fall 3 rise 2$", ssh, re.MULTILINE)
    assert "shutdown-sessions" not in ssh
    assert re.findall(r"^\s+server (\S+) (\S+)$", ssh, re.MULTILINE) == [
        (n.name, f"{n.ip}:22") for n in variant.control_planes
    ]


def test_keepalived_pair(labs: LabConfig) -> None:
    lb01, lb02 = labs.balancers
    first = lb.render_keepalived_conf(labs, lb01, TEST_VRRP_PASSWORD)
    second = lb.render_keepalived_conf(labs, lb02, TEST_VRRP_PASSWORD)
    for text, me, peer, state in ((first, lb01, lb02, "MASTER"), (second, lb02, lb01, "BACKUP")):
        assert re.search(rf"^\s+state {state}$", text, re.MULTILINE)
        assert re.search(rf"^\s+unicast_src_ip {me.ip}$", text, re.MULTILINE)
        assert re.search(rf"unicast_peer {{\s+{re.escape(str(peer.ip))}\s+}}", text)
        assert re.search(r"^\s+virtual_router_id 51$", text, re.MULTILINE)
        assert re.search(r"^\s+interface ens192$", text, re.MULTILINE)
        assert re.search(r"^\s+advert_int 1$", text, re.MULTILINE)
        assert re.search(r"^\s+10\.3\.60\.100/24 dev ens192$", text, re.MULTILINE)
        assert re.search(r"auth_type PASS\s+auth_pass labsk8sV$", text, re.MULTILINE)
        assert "enable_script_security" in text
        assert re.search(rf"^\s+script_user {lb.SCRIPT_USER}$", text, re.MULTILINE)
        assert 'script "/etc/keepalived/check_apiserver.sh"' in text
        assert re.search(r"track_script {\s+chk_haproxy\s+}", text)
        # FAULT mode: no weight on the check (docs/load-balancers.md has the measurements).
        assert not re.search(r"^\s+weight ", text, re.MULTILINE)
    priorities = [int(re.search(r"^\s+priority (\d+)$", t, re.MULTILINE).group(1)) for t in (first, second)]
    assert priorities[0] > priorities[1]


def test_keepalived_single_balancer_holds_the_vip_alone() -> None:
    cfg = load_lab_config(_single_balancer())
    text = lb.render_keepalived_conf(cfg, cfg.balancers[0], TEST_VRRP_PASSWORD)
    assert "unicast_peer" not in text and "unicast_src_ip" not in text
    assert re.search(r"^\s+state MASTER$", text, re.MULTILINE)
    assert "10.3.60.100/24 dev ens192" in text
    assert set(lb.balancer_files(cfg, cfg.balancers[0], TEST_VRRP_PASSWORD)) == {
        "haproxy.cfg",
        "keepalived.conf",
        "check_apiserver.sh",
        "setup-balancer.sh",
        "interrupted-dpkg.sh",
    }


def test_weight_mode_is_only_a_bench_option(labs: LabConfig) -> None:
    text = lb.render_keepalived_conf(labs, labs.balancers[0], TEST_VRRP_PASSWORD, script_weight=-60)
    assert re.search(r"^\s+weight -60$", text, re.MULTILINE)
    with pytest.raises(ValueError, match="outside"):
        lb.render_keepalived_conf(labs, labs.balancers[0], TEST_VRRP_PASSWORD, script_weight=-300)


def test_vrrp_password_is_validated_and_truncated_to_8(labs: LabConfig) -> None:
    assert lb.vrrp_auth_pass("abcdefgh") == "abcdefgh"
    assert lb.vrrp_auth_pass("abcdefghXYZ123") == "abcdefgh"
    for bad in ("short", "", "has space12", 'quote"12345', "semi;colon12"):
        with pytest.raises(ValueError):
            lb.vrrp_auth_pass(bad)
    texts = [lb.render_keepalived_conf(labs, b, "Abcdefgh12345678") for b in labs.balancers]
    assert all(re.search(r"auth_pass Abcdefgh$", t, re.MULTILINE) for t in texts)


def test_balancer_must_belong_to_the_lab(labs: LabConfig) -> None:
    with pytest.raises(ValueError, match="not one of the lab's balancers"):
        lb.render_keepalived_conf(labs, labs.control_planes[0], TEST_VRRP_PASSWORD)


def test_balancer_files_make_a_valid_step_bundle(labs: LabConfig) -> None:
    files = lb.balancer_files(labs, labs.balancers[1], TEST_VRRP_PASSWORD)
    assert set(files) == {
        "haproxy.cfg",
        "keepalived.conf",
        "check_apiserver.sh",
        lb.SETUP_SCRIPT,
        INTERRUPTED_DPKG_FILE,
    }
    assert "state BACKUP" in files["keepalived.conf"]
    bundle = step_bundle(lb.STEP_NAME, files, lb.SETUP_SCRIPT)
    assert f"exec bash ./{lb.SETUP_SCRIPT}" in bundle
    # The password travels only as keepalived.conf's text, in the bundle that is the step's secret
    # stdin (remote.py): never on the command line the bundle ends with.
    assert bundle_files(bundle) == files
    outside_files = bundle.replace(files["keepalived.conf"], "")
    assert TEST_VRRP_PASSWORD[:8] not in outside_files
    result = subprocess.run(["bash", "-n"], input=bundle, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _problem_keys(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(LabConfigError) as error:
        load_lab_config(raw)
    return [p.key for p in error.value.problems]


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda r: r["loadBalancer"].update(vip="10.3.61.100"), "loadBalancer.vip"),
        (lambda r: r["loadBalancer"].update(vip="10.3.60.51"), "loadBalancer.vip"),
        (lambda r: r["loadBalancer"].update(vrrpRouterId=256), "loadBalancer.vrrpRouterId"),
        (lambda r: r["loadBalancer"].update(advertIntSeconds=0), "loadBalancer.advertIntSeconds"),
        (lambda r: r["nodes"]["balancers"].update(hosts=r["nodes"]["balancers"]["hosts"][:1]), "nodes.balancers.hosts"),
        (
            lambda r: r["nodes"]["balancers"]["hosts"].append({"name": "labs-k8s-lb03", "ip": "10.3.60.57"}),
            "nodes.balancers.hosts",
        ),
        (lambda r: r["nodes"]["balancers"]["hosts"][1].update(ip="10.3.70.56"), "nodes.balancers.hosts[1].ip"),
    ],
    ids=[
        "vip-outside-cidr",
        "vip-is-a-node",
        "vrid-256",
        "advert-0",
        "one-balancer-no-opt-in",
        "three-balancers",
        "balancer-outside-cidr",
    ],
)
def test_broken_inputs_are_rejected_before_rendering(mutate: Any, key: str) -> None:
    raw = namespace()
    mutate(raw)
    assert key in _problem_keys(raw)


# --------------------------------------------------------------------------- shell


@pytest.mark.integration
def test_shellcheck_every_balancer_script(variant: LabConfig, workdir: Path) -> None:
    require_tool("shellcheck")
    scripts = sorted(LB_DIR.glob("*.sh"))
    assert scripts, "no scripts under cloudinit/lb"
    rendered = workdir / "check_apiserver.sh"
    rendered.write_text(lb.render_check_script(variant))
    for script in [*scripts, rendered]:
        result = subprocess.run(
            ["shellcheck", "--shell=bash", "--external-sources", "--severity=style", str(script)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"{script.name}:\n{result.stdout}"


CHECK_DRIVER = textwrap.dedent("""\
    set -u
    ip link set lo up
    ip link add {iface} type veth peer name lk8s-peer
    ip addr add {ip}/{prefix} dev {iface}
    ip link set {iface} up
    sysctl -q -w net.ipv4.ip_nonlocal_bind=1
    check() {{ setpriv --reuid={user} --regid={user} --clear-groups {check}; echo "rc=$?"; }}
    echo "== no haproxy"; check
    haproxy -db -f {workdir}/haproxy.cfg & hp=$!
    trap 'kill -CONT $hp 2>/dev/null; kill -9 $hp 2>/dev/null' EXIT
    for _ in $(seq 50); do [[ $(check 2>&1) == *rc=0* ]] && break; sleep 0.1; done
    echo "== running"; check
    kill -STOP $hp
    echo "== frozen"; check
    kill -CONT $hp
    echo "== thawed"; check
    kill -9 $hp; wait $hp 2>/dev/null
    echo "== killed"; check
    haproxy -db -f {workdir}/haproxy-novip.cfg & hp=$!
    sleep 0.5
    echo "== no vip frontend"; check
""")


@pytest.mark.integration
def test_check_script_tracks_a_real_haproxy(labs: LabConfig, workdir: Path) -> None:
    """Runs as the script user, like Keepalived, in a namespace without the VIP (the BACKUP's
    view): passes while HAProxy serves, fails when it is gone, frozen, or lacks the VIP frontend."""
    _need_daemons()
    require_tool("setpriv", "ss")
    paths = lb.BalancerPaths(stats_socket=str(workdir / "admin.sock"))
    config = lb.render_haproxy_cfg(labs, paths=paths)
    (workdir / "haproxy.cfg").write_text(config)
    (workdir / "haproxy-novip.cfg").write_text(config.replace(f"bind {labs.load_balancer.vip}:6443", "bind :16443"))
    check = workdir / "check_apiserver.sh"
    check.write_text(lb.render_check_script(labs))
    check.chmod(0o755)
    driver = CHECK_DRIVER.format(
        iface=labs.network.interface,
        ip=labs.balancers[1].ip,
        prefix=labs.prefix_length,
        user=lb.SCRIPT_USER,
        check=check,
        workdir=workdir,
    )
    result = subprocess.run(
        ["unshare", "--net", "bash", "-c", driver],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    out = result.stdout
    blocks = dict(re.findall(r"== (.+?)\n(.*?)(?=\n== |\Z)", out, re.DOTALL))
    assert "rc=1" in blocks["no haproxy"] and "does not accept" in blocks["no haproxy"], out
    assert blocks["running"].strip() == "rc=0", out
    assert "rc=1" in blocks["frozen"] and "did not answer" in blocks["frozen"], out
    assert blocks["thawed"].strip() == "rc=0", out
    assert "rc=1" in blocks["killed"], out
    assert "rc=1" in blocks["no vip frontend"] and "nothing listens" in blocks["no vip frontend"], out


# --------------------------------------------------------------------------- setup-balancer.sh

SYSTEMCTL_STUB = textwrap.dedent("""\
    #!/usr/bin/env bash
    # systemctl stand-in: records calls, keeps enabled/active state as files.
    echo "systemctl $*" >> "$STUB_LOG"
    args=(); for a in "$@"; do [[ $a == --* ]] || args+=("$a"); done
    verb=${args[0]}; unit=${args[1]:-}
    case $verb in
        is-enabled) [[ -e $STUB_STATE/enabled-$unit ]] ;;
        is-active) [[ -e $STUB_STATE/active-$unit ]] ;;
        enable) touch "$STUB_STATE/enabled-$unit" ;;
        start|restart) touch "$STUB_STATE/active-$unit" ;;
        reload) [[ -e $STUB_STATE/active-$unit ]] ;;
        *) echo "unexpected systemctl $*" >&2; exit 1 ;;
    esac
""")

SETUP_DRIVER = textwrap.dedent("""\
    set -u
    ip link add {iface} type veth peer name lk8s-peer
    for d in /etc/haproxy /etc/keepalived /etc/sysctl.d; do mount --bind "{root}$d" "$d"; done
    export PATH="{stubs}:$PATH" STUB_LOG="{out}/systemctl.log" STUB_STATE="{out}/state"
    sysctl -q -w net.ipv4.ip_nonlocal_bind=0
    for run in 1 2; do
        echo "--- run $run" >> "$STUB_LOG"
        bash -s < "{out}/bundle.sh" > "{out}/run$run.log" 2>&1; echo $? > "{out}/run$run.rc"
    done
    sysctl -n net.ipv4.ip_nonlocal_bind > "{out}/sysctl"
    echo "--- run 3" >> "$STUB_LOG"
    bash -s < "{out}/bad-bundle.sh" > "{out}/run3.log" 2>&1; echo $? > "{out}/run3.rc"
""")


@pytest.mark.integration
def test_setup_balancer_is_idempotent_and_never_installs_a_bad_config(labs: LabConfig, workdir: Path) -> None:
    """The real step bundle (as `sudo bash -s` gets it) in private mount + network namespaces:
    /etc/haproxy, /etc/keepalived and /etc/sysctl.d are bind-mounted copies, systemctl is a stub."""
    _need_daemons()
    require_tool("unshare", "mount", "dpkg-query")
    root = workdir / "root"
    shutil.copytree("/etc/haproxy", root / "etc/haproxy", symlinks=True)
    (root / "etc/keepalived").mkdir(parents=True)
    (root / "etc/sysctl.d").mkdir(parents=True)
    stubs = workdir / "stubs"
    stubs.mkdir()
    (stubs / "systemctl").write_text(SYSTEMCTL_STUB)
    (stubs / "systemctl").chmod(0o755)
    out = workdir / "out"
    (out / "state").mkdir(parents=True)
    steps = workdir / "steps"
    files = lb.balancer_files(labs, labs.balancers[0], TEST_VRRP_PASSWORD)
    (out / "bundle.sh").write_text(step_bundle(lb.STEP_NAME, files, lb.SETUP_SCRIPT).replace(STEP_ROOT, str(steps)))
    bad = {**files, "haproxy.cfg": files["haproxy.cfg"].replace("balance roundrobin", "balance bogus")}
    (out / "bad-bundle.sh").write_text(step_bundle(lb.STEP_NAME, bad, lb.SETUP_SCRIPT).replace(STEP_ROOT, str(steps)))
    driver = SETUP_DRIVER.format(iface=labs.network.interface, root=root, stubs=stubs, out=out)
    result = subprocess.run(
        ["unshare", "--mount", "--net", "bash", "-c", driver],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LC_ALL": "C"},
    )
    assert result.returncode == 0, result.stderr
    run1, run2, run3 = ((out / f"run{i}.log").read_text() for i in (1, 2, 3))
    assert (out / "run1.rc").read_text().strip() == "0", run1
    assert (out / "run2.rc").read_text().strip() == "0", run2

    # First run: everything put in place, validated, services enabled and started.
    assert (root / "etc/haproxy/haproxy.cfg").read_text() == files["haproxy.cfg"]
    assert (root / "etc/keepalived/keepalived.conf").read_text() == files["keepalived.conf"]
    assert (root / "etc/keepalived/check_apiserver.sh").read_text() == files["check_apiserver.sh"]
    assert oct((root / "etc/keepalived/keepalived.conf").stat().st_mode & 0o777) == "0o640"
    assert oct((root / "etc/keepalived/check_apiserver.sh").stat().st_mode & 0o777) == "0o755"
    assert "net.ipv4.ip_nonlocal_bind = 1" in (root / "etc/sysctl.d/60-labs-k8s-balancer.conf").read_text()
    assert (out / "sysctl").read_text().strip() == "1"
    calls = (out / "systemctl.log").read_text().split("--- run ")
    assert "systemctl start haproxy" in calls[1] and "systemctl start keepalived" in calls[1]
    assert "systemctl enable" in calls[1]

    # Second run: nothing to do, says so, touches no service.
    assert run2.strip().splitlines()[-1] == "setup-balancer: unchanged", run2
    assert "updated" not in run2 and "created" not in run2
    assert not re.search(r"systemctl (enable|start|restart|reload)", calls[2]), calls[2]

    # A config HAProxy rejects leaves the live one and the service alone.
    assert (out / "run3.rc").read_text().strip() != "0", run3
    assert "rejected" in run3, run3
    assert (root / "etc/haproxy/haproxy.cfg").read_text() == files["haproxy.cfg"]
    assert not list(root.rglob("*.labs-k8s-new"))
    assert not re.search(r"systemctl (start|restart|reload) haproxy", calls[3]), calls[3]
