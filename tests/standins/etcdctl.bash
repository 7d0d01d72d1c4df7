# shellcheck shell=bash disable=SC2154 # STATE, ROOT, CLUSTER, SELF, ETCD_NODE come from the caller
# etcdctl in the etcd container, as `kubectl exec etcd-<node> -c etcd -- etcdctl` runs it:
# - snapshot save (etcd client/v3/snapshot/v3_snapshot.go SaveWithVersion): exactly one endpoint
#   ("snapshot must be requested to one selected node, not multiple"); it writes <path>.part, removes
#   it if the stream fails, and renames it to <path> only once the whole snapshot and its trailing
#   sha256 are in (so a complete snapshot is 32 bytes past a multiple of 512: hasChecksum). The pod's
#   /var/lib/etcd is the node's (kubeadm's etcd-data hostPath), so the file lands on the node's disk.
# - endpoint health --cluster -w json: one entry per member ($CLUSTER/etcd/<ip> holds true or false).
# Test knob: $STATE/etcd-snapshot-fails breaks the stream half-way.
etcdctl_standin() {
    local endpoints=() rest=() arg
    for arg in "$@"; do
        case $arg in
            --endpoints=*) IFS=, read -r -a endpoints <<<"${arg#*=}" ;;
            --*) ;;
            *) rest+=("$arg") ;;
        esac
    done
    case "${rest[0]:-} ${rest[1]:-}" in
        "snapshot save")
            if ((${#endpoints[@]} != 1)); then
                echo "Error: snapshot must be requested to one selected node, not multiple [${endpoints[*]}]" >&2; return 1
            fi
            local path=${rest[2]} host
            [[ $ETCD_NODE == "$SELF" ]] || { echo "stand-in: snapshot into another node's disk" >&2; return 1; }
            host=$ROOT$path
            [[ -d ${host%/*} ]] || { echo "Error: could not open $path.part (open $path.part: no such file or directory)" >&2; return 1; }
            printf '{"level":"info","msg":"created temporary db file","path":"%s.part"}\n' "$path" >&2
            head -c 4096 /dev/zero >"$host.part"
            if [[ -f $STATE/etcd-snapshot-fails ]]; then
                rm -f "$host.part"
                echo "Error: rpc error: code = Unavailable desc = error reading from server: EOF" >&2; return 1
            fi
            head -c 32 /dev/zero >>"$host.part"
            mv "$host.part" "$host"
            echo "Snapshot saved at $path" ;;
        "endpoint health")
            local member health items=""
            for member in "$CLUSTER"/etcd/*; do
                read -r health <"$member"
                items+="${items:+,}{\"endpoint\":\"https://${member##*/}:2379\",\"health\":$health,\"took\":\"9ms\"}"
            done
            printf '[%s]\n' "$items" ;;
        *) echo "stand-in etcdctl: unexpected ${rest[*]}" >&2; return 1 ;;
    esac
}
