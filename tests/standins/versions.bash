# shellcheck shell=bash
# Shared by the upgrade stand-ins (tests/upgrade_harness.py prepends it): versions and the API switch.
minor_of() { local r=${1#v}; r=${r#*.}; printf '%s\n' "${r%%.*}"; }
older() { local a=${1#v} b=${2#v}; [[ $a != "$b" && $(printf '%s\n%s\n' "$a" "$b" | sort -V | head -n 1) == "$a" ]]; }
installed() { local v; v=$(cat "$STATE/dpkg/$1" 2>/dev/null) || return 1; printf 'v%s\n' "${v%%-*}"; }
api_down() { [[ -f $CLUSTER/api-down ]]; }
