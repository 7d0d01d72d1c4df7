# shellcheck shell=bash
# The files kube-apiserver reads at start that kubeadm does not write: the EncryptionConfiguration
# (it holds the stack's key) and the audit policy, with the audit log's directory. Sourced by
# kubeadm-init.sh and join-control-plane.sh, which call install_control_plane_files before kubeadm
# can start an API server (init; a joining control plane's kubeadm-config names the same files).
#
# Parameters (params.env): ENCRYPTION_CONFIG, AUDIT_POLICY, AUDIT_LOG_DIR (paths on the node). The
# bundle carries encryption-config.yaml (root-only: the key) and audit-policy.yaml.

# install_control_plane_files: put both files in place, root-only; unchanged content is not
# rewritten. A node that holds a cluster and another key is refused: the API server would lose
# every Secret written under the old key at its next start (no key rotation yet: docs/cluster.md).
install_control_plane_files() {
    local encryption=$ROOT${ENCRYPTION_CONFIG:?} policy=$ROOT${AUDIT_POLICY:?} logs=$ROOT${AUDIT_LOG_DIR:?}
    local source=${HERE:?}/encryption-config.yaml
    [[ -s $source && -s $HERE/audit-policy.yaml ]] ||
        die "the encryption configuration or the audit policy is missing from the bundle"
    if [[ -f $encryption ]] && ! cmp -s "$source" "$encryption" && has_kubeadm_state; then
        die "${ENCRYPTION_CONFIG} on this node holds another encryption key than the stack's secrets-encryption-key: this node's API server would no longer read the Secrets in etcd. Not replacing it (no key rotation yet; docs/runbook.md, \"Secrets encrypted at rest\")"
    fi
    install -d -m 0700 "$(dirname "$encryption")" "$(dirname "$policy")" "$logs"
    write_file "$encryption" 0600 <"$source"
    write_file "$policy" 0600 <"$HERE/audit-policy.yaml"
    if ((WROTE)) && [[ -f $MANIFESTS/kube-apiserver.yaml ]]; then
        log "a new audit policy: this node's API server reads it at its next start (a restart or an upgrade)"
    fi
}
