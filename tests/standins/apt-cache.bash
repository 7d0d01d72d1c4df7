# shellcheck shell=bash disable=SC2154 # STATE comes from the prelude
# Stand-in for `apt-cache madison`: the Kubernetes packages of the minor the last `apt-get update`
# indexed ($STATE/repos/<v1.XX>/<package>, newest first, as madison lists them); others from $STATE/repo.
[[ $1 == madison ]] || exit 0
if [[ $2 == kubeadm || $2 == kubelet || $2 == kubectl || $2 == kubernetes-cni || $2 == cri-tools ]]; then
    list=$STATE/repos/$(cat "$STATE/apt-index" 2>/dev/null)/$2
    url="$(cat "$STATE/apt-base" 2>/dev/null)/$(cat "$STATE/apt-index" 2>/dev/null)/deb"
else
    list=$STATE/repo/$2; url=https://download.docker.com/linux/debian
fi
[[ -f $list ]] || exit 0
while read -r version; do printf ' %s | %s | %s  Packages\n' "$2" "$version" "$url"; done <"$list"
