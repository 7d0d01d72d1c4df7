# shellcheck shell=bash disable=SC2154 # STATE, ROOT, CLUSTER, SELF, VIP come from the prelude
# Stand-in for kubeadm's upgrade workflow, phase by phase, with its failure points
# (cmd/kubeadm/app/cmd/upgrade/{plan,apply,node}.go, cmd/kubeadm/app/cmd/phases/upgrade/{apply,node}/*.go):
# - the configuration comes from the kubeadm-config ConfigMap: no API, no upgrade;
# - preflight health (phases/upgrade/health.go CheckClusterHealth): every control-plane Node Ready and
#   every static pod manifest on disk;
# - version policy (phases/upgrade/policy.go EnforceVersionPolicies): one minor at a time and never above
#   kubeadm's own minor (mandatory); a patch above kubeadm's own, or a target minor below kubeadm's, only
#   with --force; without --yes it asks, and with nobody to answer it stops (InteractivelyConfirmAction in
#   cmd/kubeadm/app/cmd/util/cmdutil.go);
# - control-plane (phases/upgrade/staticpods.go): etcd, kube-apiserver, kube-controller-manager,
#   kube-scheduler in turn, each old manifest backed up under /etc/kubernetes/tmp; a component that does
#   not come back rolls back every manifest moved so far (rollbackOldManifests); equal manifests are
#   skipped; the certificates are renewed, admin.conf's included;
# - apply then runs upload-config (kubeadm-config kubernetesVersion), kubelet-config, bootstrap-token and
#   the addons (CoreDNS, kube-proxy); `upgrade node` runs control-plane (to the ConfigMap's version, and
#   only where kube-apiserver.yaml exists: newNodeData in cmd/upgrade/node.go), kubelet-config,
#   and on a control plane the addons, which both commands skip until no kube-apiserver runs another
#   version (cmd/phases/upgrade/addons.go shouldUpgradeAddons; UnupgradedControlPlaneInstances in
#   app/phases/upgrade/postupgrade.go compares the kube-apiserver pods' images).
# Test knobs in $STATE: kubeadm-crash-after=<phase> kills it right after that phase (an SSH drop, an
# OOM: what earlier phases wrote stays, nothing is rolled back); kubeadm-fail-component=<component>
# makes that component not come back (kubeadm rolls back); kubeadm-manual-config puts a "yes" in plan's
# MANUAL UPGRADE REQUIRED column; pause-<minor> is the pause image tag `config images list` names.
fail() { printf '%s\n' "$*" >&2; exit 1; }
crash_after() {
    if [[ $(cat "$STATE/kubeadm-crash-after" 2>/dev/null) == "$1" ]]; then
        echo "stand-in: kubeadm killed after its $1 phase" >&2
        exit 137
    fi
}
cluster_version() { cat "$CLUSTER/version"; }
etcd_tag() { if (($(minor_of "$1") >= 34)); then echo 3.6.6-0; else echo 3.5.24-0; fi; }
MANIFESTS=$ROOT/etc/kubernetes/manifests
health_checks() {
    local node bad=()
    for node in "$CLUSTER"/nodes/*; do
        [[ $(cat "$node/role") == control-plane && $(cat "$node/ready") != True ]] && bad+=("${node##*/}")
    done
    ((${#bad[@]} == 0)) || fail "[ERROR ControlPlaneNodesReady]: there are NotReady control-planes in the cluster: [${bad[*]}]"
    local component
    for component in etcd kube-apiserver kube-controller-manager kube-scheduler; do
        [[ -f $MANIFESTS/$component.yaml ]] ||
            fail "[ERROR StaticPodManifest]: The control plane seems to be Static Pod-hosted, but some of the manifests don't seem to exist on disk."
    done
}
renew_admin_conf() {
    local admin=$ROOT/etc/kubernetes/admin.conf n
    [[ -f $admin ]] || return 0
    n=$(($(cat "$STATE/renewals" 2>/dev/null || echo 0) + 1))
    echo "$n" >"$STATE/renewals"
    sed -i "s/^\( *client-certificate-data:\).*/\1 renewed-$n/" "$admin"
    echo "[upgrade/staticpods] Renewing admin.conf certificate"
}
static_pod_upgrade() {
    local version=$1 stamp backup component tag current moved=()
    stamp=$(date +%Y-%m-%d-%H-%M-%S)
    backup=$ROOT/etc/kubernetes/tmp/kubeadm-backup-manifests-$stamp
    mkdir -p "$backup"
    for component in etcd kube-apiserver kube-controller-manager kube-scheduler; do
        tag=$version
        [[ $component == etcd ]] && tag=$(etcd_tag "$version")
        current=$(awk '$1 == "image:" {print $2; exit}' "$MANIFESTS/$component.yaml")
        if [[ ${current##*:} == "$tag" ]]; then
            echo "[upgrade/staticpods] Current and new manifests of $component are equal, skipping upgrade"
            continue
        fi
        cp "$MANIFESTS/$component.yaml" "$backup/"
        moved+=("$component")
        sed -i "s#^\( *image:\).*#\1 registry.k8s.io/$component:$tag#" "$MANIFESTS/$component.yaml"
        echo "[upgrade/staticpods] Moved new manifest to \"/etc/kubernetes/manifests/$component.yaml\" and backed up old manifest to \"${backup#"$ROOT"}/$component.yaml\""
        if [[ $(cat "$STATE/kubeadm-fail-component" 2>/dev/null) == "$component" ]]; then
            for current in "${moved[@]}"; do
                cp "$backup/$current.yaml" "$MANIFESTS/$current.yaml"
                awk '$1 == "image:" {print $2; exit}' "$MANIFESTS/$current.yaml" >"$CLUSTER/pods/$current-$SELF/image"
            done
            fail "[upgrade/apply] FATAL: couldn't upgrade control plane. kubeadm has tried to recover everything into the earlier state. Errors faced: static Pod hash for component $component on Node $SELF did not change after 5m0s: timed out waiting for the condition"
        fi
        echo "registry.k8s.io/$component:$tag" >"$CLUSTER/pods/$component-$SELF/image"
        echo "[upgrade/staticpods] Component \"$component\" upgraded successfully!"
    done
    renew_admin_conf
}
write_kubelet_config() {
    mkdir -p "$ROOT/var/lib/kubelet"
    printf '# kubelet configuration of the cluster at %s (kubelet-config ConfigMap)\n' "$1" >"$ROOT/var/lib/kubelet/config.yaml"
    echo "[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!"
}
upgrade_addons() {
    local version=$1 pod
    for pod in "$CLUSTER"/pods/kube-apiserver-*; do
        [[ $(cat "$pod/image") == *":$version" ]] || { echo "[upgrade/addon] Skipping the addon/coredns and addon/kube-proxy phases: not all control plane instances are at $version"; return 0; }
    done
    echo "$version" >"$CLUSTER/addons"
    echo "[upgrade/addon] Applied essential addon: CoreDNS"
    echo "[upgrade/addon] Applied essential addon: kube-proxy"
}
kubeconfig=""; force=0; yes=0; positional=()
while (($#)); do
    case $1 in
        --kubeconfig) kubeconfig=$2; shift ;;
        --kubeconfig=*) kubeconfig=${1#*=} ;;
        -f|--force) force=1 ;;
        -y|--yes) yes=1 ;;
        -o) shift ;;
        --kubernetes-version) positional+=("$2"); shift ;;
        -*) ;;
        *) positional+=("$1") ;;
    esac
    shift
done
case "${positional[0]:-} ${positional[1]:-}" in
    "version ") installed kubeadm || fail "kubeadm: command not found" ;;
    "config images")
        version=${positional[3]:-$(installed kubeadm)}
        pause=$(cat "$STATE/pause-$(minor_of "$version")" 2>/dev/null || echo 3.10.1)
        printf '%s\n' "registry.k8s.io/kube-apiserver:$version" "registry.k8s.io/coredns/coredns:v1.13.1" \
            "registry.k8s.io/pause:$pause" "registry.k8s.io/etcd:$(etcd_tag "$version")" ;;
    "upgrade plan"|"upgrade apply")
        verb=${positional[1]}
        [[ -f $ROOT/etc/kubernetes/admin.conf ]] || fail "couldn't create a Kubernetes client from file \"/etc/kubernetes/admin.conf\""
        api_down && fail "[upgrade/config] FATAL: unable to fetch the kubeadm-config ConfigMap: Get \"https://$VIP:6443/api/v1/namespaces/kube-system/configmaps/kubeadm-config\": dial tcp: connect: connection refused"
        current=$(cluster_version)
        kubeadm_version=$(installed kubeadm)
        target=${positional[2]:-$kubeadm_version}
        echo "[upgrade/preflight] Running preflight checks"
        echo "[upgrade] Running cluster health checks"
        health_checks
        echo "[upgrade/versions] Cluster version: $current"
        echo "[upgrade/versions] kubeadm version: $kubeadm_version"
        if [[ $verb == plan ]]; then
            printf 'Upgrade to the latest stable version:\n\nCOMPONENT                 NODE      CURRENT   TARGET\nkube-apiserver            %s   %s   %s\n\n' "$SELF" "$current" "$target"
            printf 'You can now apply the upgrade by executing the following command:\n\n\tkubeadm upgrade apply %s\n\n' "$target"
            manual=no
            [[ -f $STATE/kubeadm-manual-config ]] && manual=yes
            printf 'API GROUP                 CURRENT VERSION   PREFERRED VERSION   MANUAL UPGRADE REQUIRED\n'
            printf 'kubeproxy.config.k8s.io   v1alpha1          v1alpha1            %s\n' "$manual"
            printf 'kubelet.config.k8s.io     v1beta1           v1beta1             no\n\n'
            exit 0
        fi
        echo "[upgrade/preflight] You have chosen to upgrade the cluster version to \"$target\""
        if (($(minor_of "$target") > $(minor_of "$current") + 1)); then
            fail "[upgrade/preflight] FATAL: the version argument is invalid due to these fatal errors: Specified version to upgrade to \"$target\" is too high; kubeadm can upgrade only 1 minor version at a time"
        fi
        if (($(minor_of "$target") < $(minor_of "$current") - 1)); then
            fail "[upgrade/preflight] FATAL: the version argument is invalid due to these fatal errors: Specified version to downgrade to \"$target\" is too low; kubeadm can downgrade only 1 minor version at a time"
        fi
        if older "$kubeadm_version" "$target"; then
            if (($(minor_of "$target") > $(minor_of "$kubeadm_version"))); then
                fail "[upgrade/preflight] FATAL: Specified version to upgrade to \"$target\" is at least one minor release higher than the kubeadm minor release. Such an upgrade is not supported"
            fi
            ((force)) || fail "[upgrade/preflight] FATAL: Specified version to upgrade to \"$target\" is higher than the kubeadm version \"$kubeadm_version\". Upgrade kubeadm first using the tool you used to install kubeadm. Can be bypassed if you pass the --force flag"
        fi
        if (($(minor_of "$kubeadm_version") > $(minor_of "$target") && ! force)); then
            fail "[upgrade/preflight] FATAL: Kubeadm version $kubeadm_version can only be used to upgrade to Kubernetes version 1.$(minor_of "$kubeadm_version"). Can be bypassed if you pass the --force flag"
        fi
        ((yes || force)) || fail "[upgrade] Are you sure you want to proceed? [y/N]: won't proceed; the user didn't answer (Y|y) in order to continue"
        echo "[upgrade/preflight] Pulling images required for setting up a Kubernetes cluster"
        crash_after preflight
        echo "[upgrade/control-plane] Upgrading your static Pod-hosted control plane to version \"$target\" (timeout: 5m0s)..."
        static_pod_upgrade "$target"
        crash_after control-plane
        echo "[upgrade/upload-config] Storing the configuration used in ConfigMap \"kubeadm-config\" in the \"kube-system\" Namespace"
        echo "$target" >"$CLUSTER/version"
        crash_after upload-config
        write_kubelet_config "$target"
        crash_after kubelet-config
        echo "[upgrade/bootstrap-token] Configuring bootstrap token and cluster-info RBAC rules"
        upgrade_addons "$target"
        echo "[upgrade] SUCCESS! A control plane node of your cluster was upgraded to \"$target\"."
        ;;
    "upgrade node")
        kubeconfig=${kubeconfig:-/etc/kubernetes/kubelet.conf}
        [[ -f $ROOT$kubeconfig ]] || fail "couldn't create a Kubernetes client from file \"$kubeconfig\""
        api_down && fail "unable to fetch the kubeadm-config ConfigMap: dial tcp $VIP:6443: connect: connection refused"
        version=$(cluster_version)
        echo "[upgrade/preflight] Running pre-flight checks"
        if [[ -f $MANIFESTS/kube-apiserver.yaml ]]; then
            echo "[upgrade/control-plane] Upgrading your Static Pod-hosted control plane instance to version \"$version\"..."
            static_pod_upgrade "$version"
        else
            echo "[upgrade/control-plane] Skipping phase. Not a control plane node."
        fi
        crash_after control-plane
        write_kubelet_config "$version"
        crash_after kubelet-config
        [[ -f $MANIFESTS/kube-apiserver.yaml ]] && upgrade_addons "$version"
        echo "[upgrade] The upgrade for this node was successfully completed!"
        ;;
    *) fail "stand-in kubeadm: unexpected arguments ${positional[*]}" ;;
esac
