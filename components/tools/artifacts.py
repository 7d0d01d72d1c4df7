"""Every file the program pushes to a machine, per host, for the offline `render` command.

Secrets generated at `pulumi up` time (bootstrap token, certificate key, VRRP password, the
Secrets' encryption key) do not exist offline; these files carry clearly marked placeholders in
their place (PLACEHOLDERS).
"""

from __future__ import annotations

from components.config import LabConfig, Role
from components.rendering import k8s, lb, node, read_file
from components.rendering import template as template_rendering

# Valid in form, so the same validation runs as at `up` time, and plainly not real.
PLACEHOLDERS = {
    "bootstrap token": "render.placeholder00000",
    "certificate key": "0" * 64,
    "VRRP password": "RENDERPH",
    "kubeconfig transport key": "1" * 64,
    "secrets encryption key": "A" * 43 + "=",
    "CA certificate hash": "sha256:" + "0" * 64,
}
# What `diff` shows as [secret]. The CA certificate hash is public: every joining node is given it.
SECRET_PLACEHOLDERS = {what: value for what, value in PLACEHOLDERS.items() if what != "CA certificate hash"}
TEMPLATE_FOLDER = "golden-template"
# Steps that run on whichever control plane the VIP's SSH port reaches (components/cluster.py).
CLUSTER_FOLDER = "cluster-endpoint"


def host_artifacts(lab: LabConfig) -> dict[str, dict[str, str]]:
    """{folder: {relative path: text}}: one folder per host, plus the template's install media."""
    token = PLACEHOLDERS["bootstrap token"]
    certificate_key = PLACEHOLDERS["certificate key"]
    encryption_key = PLACEHOLDERS["secrets encryption key"]
    ca_hash = PLACEHOLDERS["CA certificate hash"]
    first = k8s.first_control_plane(lab)
    out: dict[str, dict[str, str]] = {TEMPLATE_FOLDER: template_rendering.template_files(lab)}

    for host in lab.all_nodes:
        files = {f"cloud-init/{name}": text for name, text in node.node_files(lab, host).items()}
        files["steps/ready/wait-for-cloud-init.sh"] = read_file("fleet/wait-for-cloud-init.sh")
        out[host.name] = files

    for balancer in lab.balancers:
        files = lb.balancer_files(lab, balancer, PLACEHOLDERS["VRRP password"])
        out[balancer.name].update({f"steps/lb-setup/{k}": v for k, v in files.items()})

    for host in lab.kubernetes_nodes:
        out[host.name].update({f"steps/prepare/{k}": v for k, v in k8s.prepare_files(lab, host).items()})
    out[first.name].update(
        {f"steps/kubeadm-init/{k}": v for k, v in k8s.init_files(lab, token, certificate_key, encryption_key).items()}
    )
    cluster: dict[str, str] = {}
    out[CLUSTER_FOLDER] = cluster
    cluster.update({f"steps/flannel/{k}": v for k, v in k8s.flannel_files(lab).items()})
    cluster.update({f"steps/verify-cluster/{k}": v for k, v in k8s.verify_files(lab).items()})
    kubeconfig = k8s.kubeconfig_files(lab, PLACEHOLDERS["kubeconfig transport key"])
    cluster.update({f"steps/kubeconfig/{k}": v for k, v in kubeconfig.items()})
    cluster.update({f"steps/teardown-guard/{k}": v for k, v in k8s.teardown_guard_files().items()})
    for host in lab.kubernetes_nodes:
        refresh = k8s.refresh_files(lab, token, k8s.refresh_certificate_key(host, certificate_key), host)
        cluster.update({f"steps/{host.name}-refresh-join-material/{k}": v for k, v in refresh.items()})
        cluster.update({f"steps/{host.name}-leave-cluster/{k}": v for k, v in k8s.leave_files(host).items()})
        if host.role is Role.CONTROL_PLANE:
            files = k8s.control_plane_join_files(lab, host, token, certificate_key, encryption_key)
        else:
            files = k8s.worker_join_files(lab, host, token)
        out[host.name].update({f"steps/kubeadm-join/{k}": v for k, v in files.items()})
        out[host.name]["steps/kubeadm-join/ARGS"] = " ".join(k8s.join_args(ca_hash)) + "\n"
    return out
