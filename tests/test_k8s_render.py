"""The kubeadm documents, the Flannel manifest and the step file maps, as rendered text."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from dataclasses import replace
from typing import Any

import pytest
import yaml

from components.rendering import k8s, step_bundle
from tests.labs import make_lab_config
from tests.requirements import require_tool
from tests.shell_harness import TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY, TEST_TOKEN

# ------------------------------------------------------------------ kubeadm API field lists
# From the kubeadm configuration API reference (kubeadm-config.v1beta3 / v1beta4), i.e. the
# json tags of cmd/kubeadm/app/apis/kubeadm/v1beta{3,4}/types.go. A dict is an object with
# exactly these keys, [x] a list of x, None a value not descended into (scalars, maps,
# core/v1 types such as taints).

MAP = None
TYPE_META = {"apiVersion": None, "kind": None}
BOOTSTRAP_TOKEN = {"token": None, "description": None, "ttl": None, "expires": None, "usages": None, "groups": None}
API_ENDPOINT = {"advertiseAddress": None, "bindPort": None}
PATCHES = {"directory": None}
HOST_PATH_MOUNT = {"name": None, "hostPath": None, "mountPath": None, "readOnly": None, "pathType": None}
IMAGE_META = {"imageRepository": None, "imageTag": None}
EXTERNAL_ETCD = {"endpoints": None, "caFile": None, "certFile": None, "keyFile": None}
NETWORKING = {"serviceSubnet": None, "podSubnet": None, "dnsDomain": None}
FILE_DISCOVERY = {"kubeConfigPath": None}
BOOTSTRAP_TOKEN_DISCOVERY = {
    "token": None,
    "apiServerEndpoint": None,
    "caCertHashes": None,
    "unsafeSkipCAVerification": None,
}

# v1beta3: extraArgs and kubeletExtraArgs are maps; timeouts sit in apiServer and discovery.
_NODE_REGISTRATION_V1BETA3 = {
    "name": None,
    "criSocket": None,
    "taints": None,
    "kubeletExtraArgs": MAP,
    "ignorePreflightErrors": None,
    "imagePullPolicy": None,
}
_COMPONENT_V1BETA3 = {"extraArgs": MAP, "extraVolumes": [HOST_PATH_MOUNT]}
V1BETA3 = {
    "InitConfiguration": {
        **TYPE_META,
        "bootstrapTokens": [BOOTSTRAP_TOKEN],
        "nodeRegistration": _NODE_REGISTRATION_V1BETA3,
        "localAPIEndpoint": API_ENDPOINT,
        "certificateKey": None,
        "skipPhases": None,
        "patches": PATCHES,
    },
    "ClusterConfiguration": {
        **TYPE_META,
        "etcd": {
            "local": {
                **IMAGE_META,
                "dataDir": None,
                "extraArgs": MAP,
                "serverCertSANs": None,
                "peerCertSANs": None,
            },
            "external": EXTERNAL_ETCD,
        },
        "networking": NETWORKING,
        "kubernetesVersion": None,
        "controlPlaneEndpoint": None,
        "apiServer": {**_COMPONENT_V1BETA3, "certSANs": None, "timeoutForControlPlane": None},
        "controllerManager": _COMPONENT_V1BETA3,
        "scheduler": _COMPONENT_V1BETA3,
        "dns": IMAGE_META,
        "certificatesDir": None,
        "imageRepository": None,
        "featureGates": MAP,
        "clusterName": None,
    },
    "JoinConfiguration": {
        **TYPE_META,
        "nodeRegistration": _NODE_REGISTRATION_V1BETA3,
        "caCertPath": None,
        "discovery": {
            "bootstrapToken": BOOTSTRAP_TOKEN_DISCOVERY,
            "file": FILE_DISCOVERY,
            "tlsBootstrapToken": None,
            "timeout": None,
        },
        "controlPlane": {"localAPIEndpoint": API_ENDPOINT, "certificateKey": None},
        "skipPhases": None,
        "patches": PATCHES,
    },
}

# v1beta4: extraArgs lists of {name, value}, extraEnvs, timeouts in one struct, dryRun,
# dns/proxy disabled, encryptionAlgorithm, certificate validity periods, imagePullSerial.
ARG = {"name": None, "value": None}
ENV_VAR = {"name": None, "value": None, "valueFrom": None}
TIMEOUTS = {
    "controlPlaneComponentHealthCheck": None,
    "kubeletHealthCheck": None,
    "kubernetesAPICall": None,
    "etcdAPICall": None,
    "tlsBootstrap": None,
    "discovery": None,
    "upgradeManifests": None,
}
_NODE_REGISTRATION_V1BETA4 = {
    "name": None,
    "criSocket": None,
    "taints": None,
    "kubeletExtraArgs": [ARG],
    "ignorePreflightErrors": None,
    "imagePullPolicy": None,
    "imagePullSerial": None,
}
_COMPONENT_V1BETA4 = {"extraArgs": [ARG], "extraVolumes": [HOST_PATH_MOUNT], "extraEnvs": [ENV_VAR]}
V1BETA4 = {
    "InitConfiguration": {
        **TYPE_META,
        "bootstrapTokens": [BOOTSTRAP_TOKEN],
        "dryRun": None,
        "nodeRegistration": _NODE_REGISTRATION_V1BETA4,
        "localAPIEndpoint": API_ENDPOINT,
        "certificateKey": None,
        "skipPhases": None,
        "patches": PATCHES,
        "timeouts": TIMEOUTS,
    },
    "ClusterConfiguration": {
        **TYPE_META,
        "etcd": {
            "local": {
                **IMAGE_META,
                "dataDir": None,
                "extraArgs": [ARG],
                "extraEnvs": [ENV_VAR],
                "serverCertSANs": None,
                "peerCertSANs": None,
            },
            "external": EXTERNAL_ETCD,
        },
        "networking": NETWORKING,
        "kubernetesVersion": None,
        "controlPlaneEndpoint": None,
        "apiServer": {**_COMPONENT_V1BETA4, "certSANs": None},
        "controllerManager": _COMPONENT_V1BETA4,
        "scheduler": _COMPONENT_V1BETA4,
        "dns": {**IMAGE_META, "disabled": None},
        "proxy": {"disabled": None},
        "certificatesDir": None,
        "imageRepository": None,
        "featureGates": MAP,
        "clusterName": None,
        "encryptionAlgorithm": None,
        "certificateValidityPeriod": None,
        "caCertificateValidityPeriod": None,
    },
    "JoinConfiguration": {
        **TYPE_META,
        "dryRun": None,
        "nodeRegistration": _NODE_REGISTRATION_V1BETA4,
        "caCertPath": None,
        "discovery": {
            "bootstrapToken": BOOTSTRAP_TOKEN_DISCOVERY,
            "file": FILE_DISCOVERY,
            "tlsBootstrapToken": None,
        },
        "controlPlane": {"localAPIEndpoint": API_ENDPOINT, "certificateKey": None},
        "skipPhases": None,
        "patches": PATCHES,
        "timeouts": TIMEOUTS,
    },
}
# kubelet.config.k8s.io/v1beta1 KubeletConfiguration: the fields this project may set.
KUBELET_CONFIGURATION = {
    **TYPE_META,
    "cgroupDriver": None,
    "failSwapOn": None,
    "serverTLSBootstrap": None,
    "rotateCertificates": None,
    "clusterDNS": None,
    "clusterDomain": None,
}
SCHEMAS = {"kubeadm.k8s.io/v1beta3": V1BETA3, "kubeadm.k8s.io/v1beta4": V1BETA4}


def unknown_fields(value: Any, schema: Any, path: str = "") -> list[str]:
    """Every key of `value` that `schema` does not know, and every list/object shape mismatch."""
    if schema is None:
        return []
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [problem for i, item in enumerate(value) for problem in unknown_fields(item, schema[0], f"{path}[{i}]")]
    if not isinstance(value, dict):
        return [f"{path}: expected an object, got {type(value).__name__}"]
    problems = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in schema:
            problems.append(f"{where}: not a field of this kind")
        else:
            problems += unknown_fields(item, schema[key], where)
    return problems


def check_documents(text: str) -> dict[str, dict[str, Any]]:
    """Parse a kubeadm file; assert every document carries only its version's fields; return them by kind."""
    documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    by_kind: dict[str, dict[str, Any]] = {}
    for doc in documents:
        kind, api_version = doc["kind"], doc["apiVersion"]
        if api_version == "kubelet.config.k8s.io/v1beta1":
            schema = KUBELET_CONFIGURATION
        else:
            assert api_version in SCHEMAS, api_version
            schema = SCHEMAS[api_version][kind]
        assert unknown_fields(doc, schema) == [], f"{api_version} {kind}"
        assert kind not in by_kind, f"two {kind} documents"
        by_kind[kind] = doc
    return by_kind


def test_the_field_check_rejects_fields_of_the_other_version() -> None:
    # Not vacuous: a v1beta4-only field in v1beta3, a v1beta3 map where v1beta4 wants a list.
    assert unknown_fields({"timeouts": {}}, V1BETA3["InitConfiguration"]) == ["timeouts: not a field of this kind"]
    problems = unknown_fields(
        {"nodeRegistration": {"kubeletExtraArgs": {"node-ip": "1.2.3.4"}}}, V1BETA4["InitConfiguration"]
    )
    assert problems == ["nodeRegistration.kubeletExtraArgs: expected a list, got dict"]
    assert unknown_fields({"apiServer": {"timeoutForControlPlane": "4m"}}, V1BETA4["ClusterConfiguration"])


# ------------------------------------------------------------------ versions


@pytest.mark.parametrize(
    ("version", "api_version"),
    [
        ("1.30.4", "kubeadm.k8s.io/v1beta3"),
        ("1.31.0", "kubeadm.k8s.io/v1beta4"),
        ("1.36.0", "kubeadm.k8s.io/v1beta4"),
        ("1.37.1", "kubeadm.k8s.io/v1beta4"),
    ],
)
def test_every_document_has_exactly_the_fields_of_its_api_version(version: str, api_version: str) -> None:
    cfg = make_lab_config(kubernetes={"version": version})
    init = check_documents(k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    assert set(init) == {"InitConfiguration", "ClusterConfiguration", "KubeletConfiguration"}
    assert init["InitConfiguration"]["apiVersion"] == api_version
    assert init["ClusterConfiguration"]["apiVersion"] == api_version
    assert init["ClusterConfiguration"]["kubernetesVersion"] == f"v{version}"

    m02 = cfg.control_planes[1]
    join_cp = check_documents(k8s.render_control_plane_join_config(cfg, m02, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    join_worker = check_documents(k8s.render_worker_join_config(cfg, cfg.workers[0], TEST_TOKEN))
    assert join_cp["JoinConfiguration"]["apiVersion"] == api_version
    assert join_worker["JoinConfiguration"]["apiVersion"] == api_version


def test_v1beta3_uses_maps_and_its_own_timeouts() -> None:
    cfg = make_lab_config(kubernetes={"version": "1.30.4"})
    init = check_documents(k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    assert init["InitConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] == {"node-ip": "10.3.60.51"}
    assert init["ClusterConfiguration"]["apiServer"]["timeoutForControlPlane"] == "4m0s"
    assert "timeouts" not in init["InitConfiguration"]
    join = check_documents(k8s.render_worker_join_config(cfg, cfg.workers[1], TEST_TOKEN))["JoinConfiguration"]
    assert join["discovery"]["timeout"] == "5m0s"
    assert join["nodeRegistration"]["kubeletExtraArgs"] == {"node-ip": "10.3.60.55"}


def test_v1beta4_uses_name_value_lists_and_the_timeouts_struct() -> None:
    cfg = make_lab_config()
    init = check_documents(k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    assert init["InitConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] == [
        {"name": "node-ip", "value": "10.3.60.51"}
    ]
    assert init["InitConfiguration"]["timeouts"] == {"controlPlaneComponentHealthCheck": "4m0s"}
    assert "timeoutForControlPlane" not in init["ClusterConfiguration"]["apiServer"]
    join = check_documents(k8s.render_worker_join_config(cfg, cfg.workers[0], TEST_TOKEN))["JoinConfiguration"]
    assert "timeout" not in join["discovery"]
    assert join["timeouts"] == {"discovery": "5m0s", "tlsBootstrap": "5m0s"}


# ------------------------------------------------------------------ contents


def test_init_configuration_describes_the_ha_cluster() -> None:
    cfg = make_lab_config()
    docs = check_documents(k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    init, cluster = docs["InitConfiguration"], docs["ClusterConfiguration"]

    assert init["bootstrapTokens"][0]["token"] == TEST_TOKEN
    assert init["bootstrapTokens"][0]["ttl"] == "24h0m0s"
    assert set(init["bootstrapTokens"][0]["usages"]) == {"signing", "authentication"}
    assert init["certificateKey"] == TEST_CERTIFICATE_KEY
    assert init["localAPIEndpoint"] == {"advertiseAddress": "10.3.60.51", "bindPort": 6443}
    assert init["nodeRegistration"]["name"] == "labs-k8s-m01"
    assert init["nodeRegistration"]["criSocket"] == "unix:///run/containerd/containerd.sock"

    assert cluster["controlPlaneEndpoint"] == "10.3.60.100:6443"
    assert cluster["clusterName"] == "labs-k8s"
    assert cluster["networking"]["podSubnet"] == "10.244.0.0/16"
    assert cluster["networking"]["serviceSubnet"] == "10.96.0.0/12"
    assert cluster["etcd"]["local"]["dataDir"] == "/var/lib/etcd"
    assert docs["KubeletConfiguration"]["cgroupDriver"] == "systemd"

    sans = cluster["apiServer"]["certSANs"]
    expected = {"10.3.60.100", "localhost", "127.0.0.1"}
    for node in cfg.control_planes:
        expected |= {node.name, str(node.ip), f"{node.name}.labs.local"}
    assert set(sans) == expected
    # The balancers pass TLS through and never terminate it: a name of theirs in the certificate
    # would only let one of them pose as the API (issue 50).
    assert not {"labs-k8s-lb01", "10.3.60.50", "labs-k8s-lb02", "10.3.60.56"} & set(sans)
    assert len(sans) == len(set(sans))
    assert not {str(w.ip) for w in cfg.workers} & set(sans)


def test_pod_and_service_cidrs_come_from_the_config() -> None:
    cfg = make_lab_config(kubernetes={"podCidr": "10.200.0.0/16", "serviceCidr": "10.100.0.0/16"})
    cluster = check_documents(k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))["ClusterConfiguration"]
    assert cluster["networking"] == {
        "podSubnet": "10.200.0.0/16",
        "serviceSubnet": "10.100.0.0/16",
        "dnsDomain": "cluster.local",
    }


# ------------------------------------------------------------------ Secrets at rest and the audit log (issue 50)

AT_REST_FLAGS = {
    "encryption-provider-config": "/etc/kubernetes/encryption/config.yaml",
    "audit-policy-file": "/etc/kubernetes/audit/policy.yaml",
    "audit-log-path": "/var/log/kubernetes/audit/audit.log",
    "audit-log-maxage": "30",
    "audit-log-maxbackup": "5",
    "audit-log-maxsize": "100",
}


@pytest.mark.parametrize("version", ["1.30.4", "1.36.0"])
def test_the_api_server_encrypts_secrets_and_keeps_a_rotated_audit_log(version: str) -> None:
    """kube-apiserver gets the encryption configuration and the audit flags (v1beta3 map or v1beta4
    list), with each file's directory mounted into its static pod: the configurations read-only."""
    cfg = make_lab_config(kubernetes={"version": version})
    for worker_refresh in (TEST_CERTIFICATE_KEY, None):
        api_server = check_documents(k8s.render_init_config(cfg, TEST_TOKEN, worker_refresh))["ClusterConfiguration"][
            "apiServer"
        ]
        extra = api_server["extraArgs"]
        args = extra if isinstance(extra, dict) else {arg["name"]: arg["value"] for arg in extra}
        assert args == AT_REST_FLAGS
        mounts = {v["hostPath"]: v for v in api_server["extraVolumes"]}
        for path, writable in (
            ("/etc/kubernetes/encryption", False),
            ("/etc/kubernetes/audit", False),
            ("/var/log/kubernetes/audit", True),
        ):
            assert mounts[path]["mountPath"] == path
            assert mounts[path]["readOnly"] is not writable, path
        assert mounts["/etc/kubernetes/encryption"]["pathType"] == "Directory"  # the step wrote it first


def test_the_encryption_configuration_is_secretbox_with_identity_last() -> None:
    config = yaml.safe_load(k8s.render_encryption_config(TEST_ENCRYPTION_KEY))
    assert (config["apiVersion"], config["kind"]) == ("apiserver.config.k8s.io/v1", "EncryptionConfiguration")
    (resource,) = config["resources"]
    assert resource["resources"] == ["secrets"]
    first, last = resource["providers"]
    assert first == {"secretbox": {"keys": [{"name": "labs-k8s-1", "secret": TEST_ENCRYPTION_KEY}]}}
    assert last == {"identity": {}}  # reads what was written before encryption was on, writes nothing


def test_the_encryption_key_is_the_random_ids_32_bytes_in_base64() -> None:
    hex_key = bytes(range(32)).hex()
    assert k8s.encryption_key_from_hex(hex_key) == base64.b64encode(bytes(range(32))).decode()
    for bad in ("ab" * 31, "zz" * 32, ""):
        with pytest.raises(ValueError) as error:
            k8s.encryption_key_from_hex(bad)
        assert not bad or bad not in str(error.value)


@pytest.mark.parametrize(
    "key", ["c2VjcmV0", base64.b64encode(b"x" * 31).decode(), base64.b64encode(b"x" * 33).decode(), ""]
)
def test_malformed_encryption_keys_are_refused_without_echoing_them(key: str) -> None:
    cfg = make_lab_config()
    with pytest.raises(ValueError) as error:
        k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, key)
    assert "32 bytes in standard base64" in str(error.value)
    if key:
        assert key not in str(error.value)


def test_the_audit_policy_logs_metadata_and_never_a_body() -> None:
    """No rule above Metadata: no request or response body, so no Secret's value, reaches the log; a
    Secret's access is always logged (its rule is first); the rest at Metadata, but noisy system reads."""
    policy = yaml.safe_load(k8s.audit_policy())
    assert (policy["apiVersion"], policy["kind"]) == ("audit.k8s.io/v1", "Policy")
    assert policy["omitStages"] == ["RequestReceived"]
    rules = policy["rules"]
    assert {rule["level"] for rule in rules} == {"None", "Metadata"}
    first = rules[0]
    assert first["level"] == "Metadata" and "verbs" not in first and "users" not in first
    assert {"group": "", "resources": ["secrets", "configmaps", "serviceaccounts/token"]} in first["resources"]
    assert rules[-1] == {"level": "Metadata"}  # everything else
    quiet = [rule for rule in rules if rule["level"] == "None"]
    for rule in quiet:  # only reads, lease renewals, probes and events go unlogged
        assert set(rule.get("verbs", ["get"])) <= {"get", "list", "watch", "update"}, rule
        if "update" in rule.get("verbs", []):
            assert rule["resources"] == [{"group": "coordination.k8s.io", "resources": ["leases"]}], rule


def test_the_encryption_key_sits_only_in_the_encryption_config_of_init_and_the_control_plane_joins() -> None:
    maps = all_file_maps()
    for step, (files, _) in maps.items():
        holding = sorted(name for name, text in files.items() if TEST_ENCRYPTION_KEY in text)
        carries = step in ("init", "join-first-cp", "join-cp")
        assert holding == ([k8s.ENCRYPTION_CONFIG_FILE] if carries else []), step
        if carries:
            assert files[k8s.ENCRYPTION_CONFIG_FILE] == k8s.render_encryption_config(TEST_ENCRYPTION_KEY)
            assert files[k8s.AUDIT_POLICY_FILE] == k8s.audit_policy()
            assert k8s.CONTROL_PLANE_FILES_LIB in files
            params = sourced(files[k8s.PARAMS_FILE])
            assert params["ENCRYPTION_CONFIG"] == AT_REST_FLAGS["encryption-provider-config"]
            assert params["AUDIT_POLICY"] == AT_REST_FLAGS["audit-policy-file"]
            assert params["AUDIT_LOG_DIR"] == "/var/log/kubernetes/audit"
    # The step removes it when it ends, like the kubeadm files (step_bundle secret_files).
    files, entrypoint = maps["join-cp"]
    bundle = step_bundle("k8s-join", files, entrypoint, secret_files=[k8s.ENCRYPTION_CONFIG_FILE, k8s.JOIN_CONFIG_FILE])
    assert f"/var/lib/labs-k8s/steps/k8s-join/{k8s.ENCRYPTION_CONFIG_FILE}" in bundle.split("\ntrap ", 1)[1]


def test_control_plane_join_has_its_own_endpoint_and_the_certificate_key() -> None:
    cfg = make_lab_config()
    m03 = cfg.control_planes[2]
    join = check_documents(k8s.render_control_plane_join_config(cfg, m03, TEST_TOKEN, TEST_CERTIFICATE_KEY))[
        "JoinConfiguration"
    ]
    assert join["discovery"]["bootstrapToken"] == {
        "apiServerEndpoint": "10.3.60.100:6443",
        "token": TEST_TOKEN,
        "caCertHashes": [k8s.CA_CERT_HASH_PLACEHOLDER],
    }
    assert join["controlPlane"] == {
        "localAPIEndpoint": {"advertiseAddress": "10.3.60.53", "bindPort": 6443},
        "certificateKey": TEST_CERTIFICATE_KEY,
    }
    assert join["nodeRegistration"]["name"] == "labs-k8s-m03"
    assert join["nodeRegistration"]["kubeletExtraArgs"] == [{"name": "node-ip", "value": "10.3.60.53"}]


def test_worker_join_has_no_control_plane_and_no_certificate_key() -> None:
    cfg = make_lab_config()
    text = k8s.render_worker_join_config(cfg, cfg.workers[1], TEST_TOKEN)
    join = check_documents(text)["JoinConfiguration"]
    assert "controlPlane" not in join
    assert TEST_CERTIFICATE_KEY not in text
    assert join["nodeRegistration"]["name"] == "labs-k8s-w02"
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "10.3.60.100:6443"


def test_join_renders_refuse_the_wrong_node() -> None:
    cfg = make_lab_config()
    # The first control plane joins too (a VM that replaced it): its JoinConfiguration is its own.
    first = check_documents(
        k8s.render_control_plane_join_config(cfg, cfg.control_planes[0], TEST_TOKEN, TEST_CERTIFICATE_KEY)
    )["JoinConfiguration"]
    assert first["controlPlane"]["localAPIEndpoint"]["advertiseAddress"] == "10.3.60.51"
    with pytest.raises(ValueError, match="control-plane"):
        k8s.render_control_plane_join_config(cfg, cfg.workers[0], TEST_TOKEN, TEST_CERTIFICATE_KEY)
    with pytest.raises(ValueError, match="worker"):
        k8s.render_worker_join_config(cfg, cfg.control_planes[1], TEST_TOKEN)


@pytest.mark.parametrize(
    "token",
    ["abcdef0123456789abcdef", "ABCDEF.0123456789abcdef", "abcde.0123456789abcdefg", "abcdef.0123456789abcde!", ""],
)
def test_malformed_tokens_are_refused_without_echoing_them(token: str) -> None:
    cfg = make_lab_config()
    with pytest.raises(ValueError) as error:
        k8s.init_files(cfg, token, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY)
    assert "[a-z0-9]{6}" in str(error.value)
    if token:
        assert token not in str(error.value)


@pytest.mark.parametrize("key", ["0f" * 31, "0F" * 32, "zz" * 32, "0f" * 33, ""])
def test_malformed_certificate_keys_are_refused_without_echoing_them(key: str) -> None:
    cfg = make_lab_config()
    with pytest.raises(ValueError) as error:
        k8s.control_plane_join_files(cfg, cfg.control_planes[1], TEST_TOKEN, key, TEST_ENCRYPTION_KEY)
    assert "64 lowercase hex" in str(error.value)
    if key:
        assert key not in str(error.value)


def test_join_args_take_only_a_ca_cert_hash() -> None:
    good = "sha256:" + "ab" * 32
    assert k8s.join_args(good + "\n") == (good,)
    with pytest.raises(ValueError):
        k8s.join_args("sha1:" + "ab" * 20)


# ------------------------------------------------------------------ flannel


def flannel_net_conf(text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kube-flannel-cfg")
    return docs, json.loads(config_map["data"]["net-conf.json"])


@pytest.mark.parametrize("pod_cidr", ["10.244.0.0/16", "10.200.0.0/16"])
def test_flannel_manifest_uses_the_pod_cidr_and_vxlan(pod_cidr: str) -> None:
    cfg = make_lab_config(kubernetes={"podCidr": pod_cidr})
    text = k8s.render_flannel_manifest(cfg)
    docs, net_conf = flannel_net_conf(text)
    assert net_conf["Network"] == pod_cidr
    assert net_conf["Backend"]["Type"] == "vxlan"
    kinds = {doc["kind"] for doc in docs}
    assert {"Namespace", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ConfigMap", "DaemonSet"} <= kinds


def test_flannel_images_are_pinned_and_the_upstream_is_recorded() -> None:
    text = k8s.render_flannel_manifest(make_lab_config())
    docs, _ = flannel_net_conf(text)
    daemonset = next(doc for doc in docs if doc["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    images = [c["image"] for c in pod["initContainers"] + pod["containers"]]
    assert len(images) == 3
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and "/" in name and tag and tag != "latest", image
        assert re.match(r"^v\d+\.\d+\.\d+", tag), image
    assert f"ghcr.io/flannel-io/flannel:{k8s.FLANNEL_VERSION}" in images
    assert ":latest" not in text
    header = text.split("\n---", 1)[0]
    assert k8s.FLANNEL_VERSION in header and k8s.FLANNEL_MANIFEST_URL in header


# ------------------------------------------------------------------ file maps and bundles


def all_file_maps() -> dict[str, tuple[dict[str, str], str]]:
    cfg = make_lab_config()
    return {
        "prepare-cp": (k8s.prepare_files(cfg, cfg.control_planes[1]), k8s.PREPARE_ENTRYPOINT),
        "prepare-worker": (k8s.prepare_files(cfg, cfg.workers[0]), k8s.PREPARE_ENTRYPOINT),
        "init": (k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY), k8s.INIT_ENTRYPOINT),
        "refresh": (
            k8s.refresh_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, cfg.control_planes[1]),
            k8s.REFRESH_ENTRYPOINT,
        ),
        "join-first-cp": (
            k8s.control_plane_join_files(
                cfg, cfg.control_planes[0], TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY
            ),
            k8s.CONTROL_PLANE_JOIN_ENTRYPOINT,
        ),
        "join-cp": (
            k8s.control_plane_join_files(
                cfg, cfg.control_planes[1], TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY
            ),
            k8s.CONTROL_PLANE_JOIN_ENTRYPOINT,
        ),
        "join-worker": (k8s.worker_join_files(cfg, cfg.workers[0], TEST_TOKEN), k8s.WORKER_JOIN_ENTRYPOINT),
        "flannel": (k8s.flannel_files(cfg), k8s.FLANNEL_ENTRYPOINT),
        "verify": (k8s.verify_files(cfg), k8s.VERIFY_ENTRYPOINT),
        "leave-worker": (k8s.leave_files(cfg.workers[1]), k8s.LEAVE_ENTRYPOINT),
        "leave-cp": (k8s.leave_files(cfg.control_planes[2]), k8s.LEAVE_ENTRYPOINT),
        "teardown-guard": (k8s.teardown_guard_files(), k8s.TEARDOWN_ENTRYPOINT),
        "kubeconfig": (k8s.kubeconfig_files(cfg, "9f" * 32), k8s.KUBECONFIG_ENTRYPOINT),
    }


@pytest.mark.parametrize("step", list(all_file_maps()))
def test_each_file_map_bundles_with_its_entrypoint_and_keeps_secrets_in_kubeadm_files(step: str) -> None:
    files, entrypoint = all_file_maps()[step]
    assert {entrypoint, k8s.LIB_FILE, k8s.PARAMS_FILE} <= set(files)
    bundle = step_bundle(f"k8s-{step}", files, entrypoint)
    assert bundle.endswith(f'exec bash ./{entrypoint} "$@"\n')
    for name, text in files.items():
        if name in (k8s.INIT_CONFIG_FILE, k8s.JOIN_CONFIG_FILE):
            continue
        assert TEST_TOKEN not in text, name
        assert TEST_TOKEN.split(".")[1] not in text, name
        assert TEST_CERTIFICATE_KEY not in text, name


def test_secrets_sit_in_the_kubeadm_files_only_where_needed() -> None:
    maps = all_file_maps()
    assert TEST_CERTIFICATE_KEY in maps["init"][0][k8s.INIT_CONFIG_FILE]
    assert TEST_CERTIFICATE_KEY in maps["refresh"][0][k8s.INIT_CONFIG_FILE]
    assert TEST_CERTIFICATE_KEY in maps["join-cp"][0][k8s.JOIN_CONFIG_FILE]
    assert TEST_CERTIFICATE_KEY not in maps["join-worker"][0][k8s.JOIN_CONFIG_FILE]
    assert "TOKEN_ID=abcdef\n" in maps["refresh"][0][k8s.PARAMS_FILE]
    assert "TOKEN_ID=abcdef\n" in maps["init"][0][k8s.PARAMS_FILE]


def sourced(params: str) -> dict[str, str]:
    """Source params.env in bash and read every variable back (arrays joined by spaces)."""
    require_tool("bash")
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=", params, flags=re.MULTILINE)
    script = params + "\n" + "\n".join(f'printf "%s\\0" "${{{name}[*]}}"' for name in names)
    out = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "-c", script], capture_output=True, text=True, check=True, env={}
    ).stdout
    return dict(zip(names, out.split("\0")[:-1], strict=True))


def test_params_are_valid_bash_with_the_configured_values() -> None:
    cfg = make_lab_config(
        mirrors={
            "aptProxy": "http://apt.labs.local:3142",
            "registryMirror": "http://registry.labs.local:5000",
            "allowInsecureRegistryMirror": True,
        },
    )
    worker = sourced(k8s.prepare_files(cfg, cfg.workers[0])[k8s.PARAMS_FILE])
    assert worker["NODE_NAME"] == "labs-k8s-w01"
    assert worker["NODE_ROLE"] == "worker"
    assert worker["K8S_VERSION"] == "1.36.0"
    assert worker["K8S_MINOR_VERSION"] == "1.36"
    assert worker["CONTAINERD_MIN_VERSION"] == "2.0"
    assert worker["CONTAINERD_VERSION"] == "2.2.1"
    assert "NTP_SERVERS" not in worker  # the node-settings step's, not this step's
    assert worker["APT_PROXY"] == "http://apt.labs.local:3142"
    assert worker["REGISTRY_MIRROR"] == "http://registry.labs.local:5000"
    assert (worker["DATA_DISK_GIB"], worker["DATA_DISK_MOUNT"], worker["DATA_DISK_UNIT"]) == (
        "50",
        "/var/lib/containerd",
        "containerd",
    )
    cp = sourced(k8s.prepare_files(cfg, cfg.control_planes[0])[k8s.PARAMS_FILE])
    assert (cp["DATA_DISK_GIB"], cp["DATA_DISK_MOUNT"], cp["DATA_DISK_LABEL"], cp["DATA_DISK_UNIT"]) == (
        "20",
        "/var/lib/etcd",
        "labs-etcd",
        "kubelet",
    )

    verify = sourced(k8s.verify_files(cfg)[k8s.PARAMS_FILE])
    assert verify["EXPECTED_NODES"].split() == [n.name for n in cfg.kubernetes_nodes]
    assert verify["CONTROL_PLANES"].split() == ["labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"]
    assert verify["VIP"] == "10.3.60.100"


# Upstream's repositories and the fingerprints of their keys: the defaults of labs-k8s:mirrors.*Repository.
UPSTREAM = (
    "https://pkgs.k8s.io",
    "https://download.docker.com",
    "DE15B14486CD377B9E876E1A234654DA9A296436",
    "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
)
MIRROR = {
    "kubernetesRepository": {
        "url": "https://artifactory.lab.local/artifactory/k8s-stable/",
        "keyFingerprint": "5A3B 1C0F 9E8D 7C6B 5A4F  3E2D 1C0B 9A8F 7E6D 5C4B",
    },
    "containerdRepository": {
        "url": "http://10.3.60.1:8081/repository/docker-debian",
        "keyFingerprint": "0123456789abcdef0123456789abcdef01234567",
    },
}


def package_step_files(cfg: Any) -> dict[str, dict[str, str]]:
    """The bundles whose scripts install packages: prepare, and the upgrades of both kinds of node."""
    return {
        "prepare": k8s.prepare_files(cfg, cfg.workers[0]),
        "upgrade-control-plane": k8s.upgrade_control_plane_files(cfg, cfg.control_planes[0]),
        "upgrade-worker": k8s.upgrade_worker_files(cfg, cfg.workers[0]),
    }


def test_the_repositories_default_to_upstreams_in_the_params() -> None:
    cfg = make_lab_config()
    files = package_step_files(cfg)
    prepare = sourced(files["prepare"][k8s.PARAMS_FILE])
    assert prepare["KUBERNETES_REPOSITORY_URL"] == "https://pkgs.k8s.io/core:/stable:"
    assert prepare["KUBERNETES_KEY_FINGERPRINT"] == "DE15B14486CD377B9E876E1A234654DA9A296436"
    assert prepare["CONTAINERD_REPOSITORY_URL"] == "https://download.docker.com/linux/debian"
    assert prepare["CONTAINERD_KEY_FINGERPRINT"] == "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    # The upgrade steps switch the Kubernetes repository to the new minor (lib.sh use_kubernetes_repository);
    # the keys are the prepare step's to install.
    for step in ("upgrade-control-plane", "upgrade-worker"):
        params = sourced(files[step][k8s.PARAMS_FILE])
        assert params["KUBERNETES_REPOSITORY_URL"] == "https://pkgs.k8s.io/core:/stable:", step
        assert "KUBERNETES_KEY_FINGERPRINT" not in params, step
    # A worker's drain and uncordon install nothing: a new repository does not make them run again.
    drain = sourced(k8s.upgrade_drain_files(cfg, cfg.workers[0])[k8s.PARAMS_FILE])
    assert not [name for name in drain if "REPOSITORY" in name or "FINGERPRINT" in name]


def test_a_mirror_and_its_key_reach_the_steps_and_upstream_is_nowhere() -> None:
    """An air-gapped site's mirror re-signs with its own key: its URLs and fingerprints are in the steps'
    params, and no line of any script they run still names upstream's repository or key."""
    cfg = make_lab_config(mirrors=MIRROR)
    files = package_step_files(cfg)
    prepare = sourced(files["prepare"][k8s.PARAMS_FILE])
    assert prepare["KUBERNETES_REPOSITORY_URL"] == "https://artifactory.lab.local/artifactory/k8s-stable"
    assert prepare["KUBERNETES_KEY_FINGERPRINT"] == "5A3B1C0F9E8D7C6B5A4F3E2D1C0B9A8F7E6D5C4B"
    assert prepare["CONTAINERD_REPOSITORY_URL"] == "http://10.3.60.1:8081/repository/docker-debian"
    assert prepare["CONTAINERD_KEY_FINGERPRINT"] == "0123456789ABCDEF0123456789ABCDEF01234567"
    for step in ("upgrade-control-plane", "upgrade-worker"):
        params = sourced(files[step][k8s.PARAMS_FILE])
        assert params["KUBERNETES_REPOSITORY_URL"] == "https://artifactory.lab.local/artifactory/k8s-stable", step
    for step, file_map in files.items():
        for name, text in file_map.items():
            code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
            assert not [line for line in code if any(upstream in line for upstream in UPSTREAM)], (step, name)


def test_no_data_disk_means_no_mount() -> None:
    cfg = make_lab_config()
    diskless = replace(cfg.workers[0], data_disk_gib=0)
    params = sourced(k8s.prepare_files(cfg, diskless)[k8s.PARAMS_FILE])
    assert (params["DATA_DISK_GIB"], params["DATA_DISK_MOUNT"], params["DATA_DISK_UNIT"]) == ("0", "", "")


def test_older_minors_accept_containerd_1_7() -> None:
    params = sourced(
        k8s.prepare_files(make_lab_config(kubernetes={"version": "1.35.2"}), make_lab_config().workers[0])[
            k8s.PARAMS_FILE
        ]
    )
    assert params["CONTAINERD_MIN_VERSION"] == "1.7"


def test_leave_refresh_and_prepare_refuse_what_they_do_not_handle() -> None:
    cfg = make_lab_config()
    with pytest.raises(ValueError, match="only Kubernetes nodes leave"):
        k8s.leave_files(cfg.balancers[0])
    with pytest.raises(ValueError, match="not a node name"):
        k8s.leave_files(replace(cfg.workers[0], name="bad name; rm -rf /"))
    with pytest.raises(ValueError, match="only Kubernetes nodes join"):
        k8s.refresh_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, cfg.balancers[0])
    with pytest.raises(ValueError, match="balancer"):
        k8s.prepare_files(cfg, cfg.balancers[0])
    # A node already removed from the config leaves by its own name, address and role.
    params = sourced(k8s.leave_files(cfg.control_planes[2])[k8s.PARAMS_FILE])
    assert (params["LEAVING_NODE"], params["LEAVING_IP"], params["LEAVING_ROLE"]) == (
        "labs-k8s-m03",
        "10.3.60.53",
        "control-plane",
    )
    refresh = sourced(k8s.refresh_files(cfg, TEST_TOKEN, None, cfg.workers[0])[k8s.PARAMS_FILE])
    assert (refresh["JOINING_NODE"], refresh["JOINING_ROLE"]) == ("labs-k8s-w01", "worker")
    init = sourced(k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY)[k8s.PARAMS_FILE])
    assert init["BALANCER_STEPS"] == "labs-k8s-lb01-lb-setup labs-k8s-lb02-lb-setup"


def test_the_kubeconfig_validity_line_is_read_back() -> None:
    line = "# labs-k8s: client certificate valid until 2027-05-01T10:00:00Z\n"
    assert k8s.kubeconfig_valid_until(line + "apiVersion: v1\n") == "2027-05-01T10:00:00Z"
    assert k8s.kubeconfig_valid_until("apiVersion: v1\n") is None


def test_rendering_is_deterministic() -> None:
    first = all_file_maps()
    second = all_file_maps()
    assert first == second
