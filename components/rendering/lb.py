"""The balancer pair: HAProxy + Keepalived configs and the `lb-setup` step. Pure: config in, text out.

A Pulumi component ships `balancer_files(cfg, balancer, vrrp_password)` to each balancer with
`step_bundle("lb-setup", files, SETUP_SCRIPT)` over `sudo bash -s`. docs/load-balancers.md
explains the choices and the measured failover times behind the numbers below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.config import LabConfig, Node
from components.rendering import INTERRUPTED_DPKG_FILE, interrupted_dpkg_script, read_file, render_template

APISERVER_PORT = 6443
# The VIP's port that reaches SSH on the first healthy control plane (the cluster-wide steps).
CONTROL_PLANE_SSH_PORT = 2222
# HAProxy checks each apiserver with GET /healthz over TLS (seed 004: HTTP checks, not TCP).
HEALTH_CHECK_URI = "/healthz"
HEALTH_CHECK_INTER = "2s"
HEALTH_CHECK_FALL = 3
HEALTH_CHECK_RISE = 2
RETRIES = 3
TIMEOUT_CONNECT = "3s"
TIMEOUT_CHECK = "2s"
# Long enough for a silent watch / `kubectl logs -f`; the apiserver ends watches after 30-60 min.
TIMEOUT_LONG = "1h"

# HAProxy's own liveness endpoint on loopback, polled by the Keepalived check script.
MONITOR_PORT = 8404
MONITOR_URI = "/haproxy-healthz"

# Keepalived. The first balancer is MASTER. Priorities: the BACKUP's skew time
# (256 - priority) / 256 s is how long it waits after a priority-0 advert (HAProxy dead on the
# MASTER, which goes to FAULT) and adds to 3 x advert_int when the MASTER vanishes.
MASTER_PRIORITY = 250
BACKUP_PRIORITY = 200
SCRIPT_USER = "keepalived_script"
CHECK_INTERVAL_SECONDS = 1
CHECK_TIMEOUT_SECONDS = 1
CHECK_FALL = 2
CHECK_RISE = 2
# VRRPv2 PASS authentication carries 8 octets; Keepalived silently ignores the rest.
VRRP_PASSWORD_LENGTH = 8
_VRRP_PASSWORD = re.compile(r"^[A-Za-z0-9]+$")

SETUP_SCRIPT = "setup-balancer.sh"
STEP_NAME = "lb-setup"


@dataclass(frozen=True)
class BalancerPaths:
    """Paths written into the rendered files. The defaults are the balancers' own; the
    network-namespace lab runs two balancers on one machine and points these elsewhere."""

    stats_socket: str = "/run/haproxy/admin.sock"
    check_script: str = "/etc/keepalived/check_apiserver.sh"


PRODUCTION_PATHS = BalancerPaths()


def vrrp_auth_pass(vrrp_password: str) -> str:
    """The `auth_pass` Keepalived will use: the first 8 characters of the secret.

    Keepalived compares only 8 characters (VRRPv2 PASS authentication) and would silently drop
    the rest, so the truncation is done here, explicitly, the same way on both balancers.
    The secret must have at least 8 characters (so all 8 are used) of [A-Za-z0-9] (nothing that
    needs quoting in keepalived.conf). Generate it e.g. with pulumi_random's
    RandomPassword(length=16, special=False).
    """
    if len(vrrp_password) < VRRP_PASSWORD_LENGTH:
        raise ValueError(
            f"the VRRP password has {len(vrrp_password)} characters; Keepalived uses exactly "
            f"{VRRP_PASSWORD_LENGTH}, so give at least {VRRP_PASSWORD_LENGTH} (longer ones are truncated)"
        )
    if not _VRRP_PASSWORD.match(vrrp_password):
        raise ValueError("the VRRP password may contain only letters and digits (A-Z, a-z, 0-9)")
    return vrrp_password[:VRRP_PASSWORD_LENGTH]


def balancer_role(cfg: LabConfig, balancer: Node) -> tuple[str, int]:
    """(Keepalived initial state, priority) of a balancer: the first one listed is MASTER."""
    names = [b.name for b in cfg.balancers]
    if balancer.name not in names:
        raise ValueError(f"{balancer.name!r} is not one of the lab's balancers {names}")
    if names.index(balancer.name) == 0:
        return "MASTER", MASTER_PRIORITY
    return "BACKUP", BACKUP_PRIORITY


def render_haproxy_cfg(cfg: LabConfig, *, paths: BalancerPaths = PRODUCTION_PATHS) -> str:
    """/etc/haproxy/haproxy.cfg: the same on every balancer."""
    return render_template(
        "lb/haproxy.cfg.j2",
        balancer_names=", ".join(b.name for b in cfg.balancers),
        vip=cfg.load_balancer.vip,
        port=APISERVER_PORT,
        ssh_port=CONTROL_PLANE_SSH_PORT,
        control_planes=cfg.control_planes,
        stats_socket=paths.stats_socket,
        retries=RETRIES,
        timeout_connect=TIMEOUT_CONNECT,
        timeout_long=TIMEOUT_LONG,
        timeout_check=TIMEOUT_CHECK,
        health_uri=HEALTH_CHECK_URI,
        check_inter=HEALTH_CHECK_INTER,
        check_fall=HEALTH_CHECK_FALL,
        check_rise=HEALTH_CHECK_RISE,
        monitor_port=MONITOR_PORT,
        monitor_uri=MONITOR_URI,
    )


def render_keepalived_conf(
    cfg: LabConfig,
    balancer: Node,
    vrrp_password: str,
    *,
    paths: BalancerPaths = PRODUCTION_PATHS,
    script_weight: int | None = None,
) -> str:
    """/etc/keepalived/keepalived.conf of one balancer.

    `script_weight=None` (the shipped mode): a failing HAProxy check puts the instance into
    FAULT. A negative weight instead lowers the priority by that much; it exists so that
    bench/lb_failover.py can measure both modes.
    """
    state, priority = balancer_role(cfg, balancer)
    if script_weight is not None and not -253 <= script_weight <= 253:
        raise ValueError(f"script_weight {script_weight} is outside Keepalived's -253..253")
    return render_template(
        "lb/keepalived.conf.j2",
        balancer=balancer,
        state=state,
        priority=priority,
        peers=[b for b in cfg.balancers if b.name != balancer.name],
        interface=cfg.network.interface,
        router_id=cfg.load_balancer.vrrp_router_id,
        advert_int=cfg.load_balancer.advert_int_seconds,
        auth_pass=vrrp_auth_pass(vrrp_password),
        vip=cfg.load_balancer.vip,
        prefix_length=cfg.prefix_length,
        script_user=SCRIPT_USER,
        check_script=paths.check_script,
        check_interval=CHECK_INTERVAL_SECONDS,
        check_timeout=CHECK_TIMEOUT_SECONDS,
        check_fall=CHECK_FALL,
        check_rise=CHECK_RISE,
        script_weight=script_weight,
    )


def render_check_script(cfg: LabConfig) -> str:
    """/etc/keepalived/check_apiserver.sh: is the local HAProxy serving the apiserver frontend?"""
    return render_template(
        "lb/check_apiserver.sh.j2",
        vip=cfg.load_balancer.vip,
        port=APISERVER_PORT,
        monitor_port=MONITOR_PORT,
        monitor_uri=MONITOR_URI,
    )


def render_setup_script() -> str:
    """The step's entrypoint (a plain script: everything that varies is in the other files)."""
    return read_file(f"lb/{SETUP_SCRIPT}")


def balancer_files(cfg: LabConfig, balancer: Node, vrrp_password: str) -> dict[str, str]:
    """Everything the `lb-setup` step needs on one balancer, flat name -> text.

    Ship it with `step_bundle(STEP_NAME, files, SETUP_SCRIPT)`. keepalived.conf holds the VRRP
    password: treat the dict (and the bundle) as secret.
    """
    return {
        "haproxy.cfg": render_haproxy_cfg(cfg),
        "keepalived.conf": render_keepalived_conf(cfg, balancer, vrrp_password),
        "check_apiserver.sh": render_check_script(cfg),
        SETUP_SCRIPT: render_setup_script(),
        INTERRUPTED_DPKG_FILE: interrupted_dpkg_script(),
    }


def vrrp_failover_bound(advert_int_seconds: int, backup_priority: int = BACKUP_PRIORITY) -> float:
    """VRRP master-down interval: 3 x advert_int + skew, skew = (256 - priority) / 256 s."""
    return 3 * advert_int_seconds + (256 - backup_priority) / 256
