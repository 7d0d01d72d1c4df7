# shellcheck shell=bash disable=SC2154 # STATE comes from the prelude
# Stand-in for apt-mark hold/unhold/showhold.
case $1 in
    hold) shift; for p in "$@"; do grep -qxF "$p" "$STATE/held" 2>/dev/null || echo "$p" >>"$STATE/held"; echo "$p set on hold."; done ;;
    unhold) shift; for p in "$@"; do grep -vxF "$p" "$STATE/held" >"$STATE/held.new" || true; mv "$STATE/held.new" "$STATE/held"; done ;;
    showhold) sort -u "$STATE/held" 2>/dev/null || true ;;
esac
