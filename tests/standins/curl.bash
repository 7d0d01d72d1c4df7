# shellcheck shell=bash disable=SC2154 # STATE comes from the prelude
# Stand-in for curl on an upgrade node: an apiserver answers /readyz on <host>:6443 when the test
# says so ($STATE/api/<host>: 127.0.0.1 for the local one, the VIP for the balancers); the other
# downloads are shell_harness's (the repository keys).
out=""; url=""
while (($#)); do
    case $1 in -o) out=$2; shift ;; http*) url=$1 ;; esac
    shift
done
case $url in
    https://*:6443/*) host=${url#https://}; host=${host%%:*}
        if [[ -f $STATE/api/$host ]]; then echo ok; else exit 7; fi ;;
    */gpg|*/Release.key) repo=kubernetes; [[ $url == */gpg ]] && repo=docker
        block="PGP PUBLIC KEY BLOCK-----"
        printf -- '-----BEGIN %s\nfake %s\n-----END %s\n' "$block" "$repo" "$block" >"$out" ;;
    *) exit 6 ;;
esac
