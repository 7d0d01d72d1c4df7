#!/bin/bash
# TEST ONLY (tests/lab_box.py): systemctl in a node host of the lab in a box, where systemd is not
# PID 1 (tests/tools/box/init.sh). Unit state is kept on disk as systemctl keeps it: enable and
# preset link the unit into the .wants/ (or .requires/) directory of each target its [Install]
# section names (WantedBy=, RequiredBy=), disable removes those links, mask links the unit to
# /dev/null under /etc/systemd/system, and is-enabled reads the same links. Package postinsts
# (deb-systemd-helper) call it with --root=/, which is the same tree here. A service runs through
# its package's LSB init script (/etc/init.d/NAME start|stop|restart|reload|status), which Debian's
# haproxy, keepalived and openssh-server ship. A unit without one whose package ships only the
# systemd unit (kubelet, containerd) runs as systemd runs it: its ExecStart= with its
# EnvironmentFile= and Environment= (drop-ins in NAME.service.d/ included), restarted after
# RestartSec= when Restart= says so (tests/tools/box/sbin/unit-run.sh, its supervisor). A unit with
# neither (systemd-timesyncd: the box has no clock to discipline) is accepted and recorded, so a
# step that restarts it goes on; every call is logged to /var/log/labs-k8s-box-systemctl.log.
set -u
# systemd starts a unit from PID 1, not from the caller: nothing the caller holds open reaches the
# service. Without this, a daemon started from a step kept the SSH session's pipe (a script's
# `exec 3>&2`) and the session, so the step, never ended. 255 is where bash reads this script.
for fd_path in "/proc/$$/fd"/*; do
    fd=${fd_path##*/}
    if ((fd > 2 && fd != 255)); then eval "exec $fd>&-"; fi
done
echo "$(date -u +%FT%TZ) systemctl $*" >>/var/log/labs-k8s-box-systemctl.log
quiet=0
args=()
for arg in "$@"; do
    case $arg in
    --quiet | -q) quiet=1 ;;
    --no-pager | --no-legend | --plain | --all | --now) ;;
    --type=* | --root=* | --preset-mode=*) ;;
    *) args+=("$arg") ;;
    esac
done
verb=${args[0]:-}
units=("${args[@]:1}")
name_of() { local unit=${1%.service}; echo "$unit"; }
unit_of() { [[ $1 == *.* ]] && echo "$1" || echo "$1.service"; }
say() { ((quiet)) || echo "$@"; }
# Is the service running: its init script's `status` where it has one (haproxy, ssh), else its
# daemon by name (keepalived's script has no status action).
running() {
    if grep -qE '^[[:space:]]*status\)' "$2"; then "$2" status >/dev/null 2>&1; else pidof "$1" >/dev/null; fi
}
# systemd's stop of an init script's unit: ExecStop= (the script's stop), then it waits until the
# unit's processes are gone (TimeoutStopSec=, 90 s by default) and kills what is left. Init scripts
# return once they signalled the daemon (keepalived's start-stop-daemon has no --retry), so a
# `stop; start` found it still running, and its start did nothing: the service was left down.
stop_and_wait() {
    "$2" stop </dev/null >/dev/null || return 1
    local i
    for ((i = 0; i < 900; i++)); do running "$1" "$2" || return 0; sleep 0.1; done
    pkill -KILL -x "$1" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do running "$1" "$2" || return 0; sleep 0.1; done
    return 1
}
# systemctl status as systemd prints it, for what steps and a user at a node read (the Active: line,
# the main PID, exit 0 active, 3 inactive): Debian's keepalived script has no status action, so the
# script's usage was printed.
show_status() {
    local unit=$1 description=$2 active=$3 pid=${4:-} log=${5:-}
    echo "● $unit - $description"
    echo "     Loaded: loaded"
    echo "     Active: $active"
    [[ -n $pid ]] && echo "   Main PID: $pid"
    if [[ -n $log && -f $log ]]; then echo; tail -n 10 "$log"; fi
    return 0
}
# The unit's file, where systemd looks for it (the admin's directory first).
unit_file() {
    local dir
    for dir in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
        [[ -f $dir/$1 && ! -L $dir/$1 ]] && { echo "$dir/$1"; return 0; }
    done
    return 1
}
# "wants TARGET" / "requires TARGET" for each target of the unit's [Install] section.
install_targets() {
    awk -F= '/^\[/ { install = ($0 == "[Install]") }
        install && $1 ~ /^(WantedBy|RequiredBy)$/ {
            n = split($2, t, /[ \t]+/)
            for (i = 1; i <= n; i++) if (t[i] != "") print ($1 == "WantedBy" ? "wants" : "requires"), t[i]
        }' "$1"
}
# A native unit (ExecStart=, no init script), run by its supervisor unit-run.sh, whose pid and
# state (running, auto-restart, failed) it keeps under /run/labs-k8s-box/units/.
native_unit() {
    local verb=$1 unit=$2 dir=/run/labs-k8s-box/units pid state
    mkdir -p "$dir"
    pid=$(cat "$dir/$unit.pid" 2>/dev/null || true)
    state=$(cat "$dir/$unit.state" 2>/dev/null || true)
    alive() { [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }
    stop_it() {
        if alive; then
            # The supervisor's process group: the service and whatever it started in its cgroup
            # (KillMode=control-group); processes that left it (setsid) stay, as systemd's would not:
            # the kubelet's static pods are containerd's, not the kubelet's.
            kill -TERM -- "-$pid" 2>/dev/null || true
            for _ in $(seq 50); do alive || break; sleep 0.1; done
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
        rm -f "$dir/$unit.pid"
        echo inactive >"$dir/$unit.state"
    }
    start_it() {
        alive && return 0
        setsid /usr/local/sbin/unit-run "$unit" </dev/null >>"/var/log/labs-k8s-box-unit-$unit.log" 2>&1 &
        echo $! >"$dir/$unit.pid"
        pid=$!
    }
    case $verb in
    start) start_it ;;
    stop) stop_it ;;
    restart | reload-or-restart) stop_it; start_it ;;
    try-restart) if alive; then stop_it; start_it; fi ;;
    reload) alive || { echo "Job for $unit failed: the unit is not active." >&2; return 1; } ;;
    is-active)
        if alive && [[ $state == running ]]; then say active; return 0; fi
        if alive; then say activating; else say "${state:-inactive}"; fi
        return 3 ;;
    status)
        local active="inactive (dead)"
        if alive && [[ $state == running ]]; then active="active (running)"
        elif alive; then active="activating (auto-restart)"
        elif [[ $state == failed ]]; then active="failed (Result: exit-code)"; fi
        show_status "$unit" "$unit (lab box: unit-run.sh)" "$active" "$pid" "/var/log/labs-k8s-box-unit-$unit.log"
        alive && [[ $state == running ]] || return 3 ;;
    esac
}
status_code=0
case $verb in
daemon-reload | daemon-reexec) exit 0 ;;
list-units) exit 0 ;;
enable | preset | disable | mask | unmask)
    for unit in "${units[@]}"; do
        unit=$(unit_of "$unit")
        case $verb in
        mask) ln -sfn /dev/null "/etc/systemd/system/$unit" ;;
        unmask) [[ $(readlink "/etc/systemd/system/$unit" 2>/dev/null) == /dev/null ]] && rm -f "/etc/systemd/system/$unit" ;;
        *)
            file=$(unit_file "$unit") || { echo "Failed to $verb unit: Unit file $unit does not exist." >&2; status_code=1; continue; }
            while read -r kind target; do
                dir=/etc/systemd/system/$target.$kind
                if [[ $verb == disable ]]; then
                    rm -f "$dir/$unit"
                else
                    mkdir -p "$dir" && ln -sfn "$file" "$dir/$unit"
                fi
            done < <(install_targets "$file")
            ;;
        esac
    done
    exit $status_code ;;
is-enabled)
    for unit in "${units[@]}"; do
        unit=$(unit_of "$unit")
        if [[ $(readlink "/etc/systemd/system/$unit" 2>/dev/null) == /dev/null ]]; then
            say masked; status_code=1
        elif compgen -G "/etc/systemd/system/*.wants/$unit" >/dev/null || compgen -G "/etc/systemd/system/*.requires/$unit" >/dev/null; then
            say enabled
        else
            say disabled; status_code=1
        fi
    done
    exit $status_code ;;
start | stop | restart | reload | try-restart | reload-or-restart | is-active | status)
    for unit in "${units[@]}"; do
        name=$(name_of "$unit")
        script=/etc/init.d/$name
        [[ $name == sshd ]] && script=/etc/init.d/ssh
        # systemd's own daemons (ExecStart= under /lib/systemd/) need systemd as PID 1, and
        # systemd-timesyncd would set this machine's clock: the box never runs them.
        if [[ ! -x $script ]] && native=$(unit_file "$(unit_of "$unit")") && grep -q '^ExecStart=' "$native" &&
            ! grep -qE '^ExecStart=[-@:+!]*(/usr)?/lib/systemd/' "$native"; then
            native_unit "$verb" "$(unit_of "$unit")" || status_code=$?
            continue
        fi
        if [[ ! -x $script ]]; then
            case $verb in
            is-active) say inactive; status_code=3 ;;
            status) show_status "$(unit_of "$unit")" "not run in the lab box" "inactive (dead)"; status_code=3 ;;
            *) echo "$(date -u +%FT%TZ) $verb $unit: no init script, nothing runs it in the box" >>/var/log/labs-k8s-box-systemctl.log ;;
            esac
            continue
        fi
        case $verb in
        is-active)
            if running "$name" "$script"; then say active; else say inactive; status_code=3; fi ;;
        stop) stop_and_wait "$name" "$script" || status_code=1 ;;
        restart)
            stop_and_wait "$name" "$script" && "$script" start </dev/null >/dev/null || status_code=1 ;;
        try-restart)
            if running "$name" "$script"; then
                stop_and_wait "$name" "$script" && "$script" start </dev/null >/dev/null || status_code=1
            fi ;;
        reload-or-restart)
            "$script" reload >/dev/null 2>&1 ||
                { stop_and_wait "$name" "$script" && "$script" start </dev/null >/dev/null; } || status_code=1 ;;
        status)
            if running "$name" "$script"; then
                show_status "$(unit_of "$unit")" "LSB: $name (lab box: $script)" "active (running)" "$(pidof -s "$name")"
            else
                show_status "$(unit_of "$unit")" "LSB: $name (lab box: $script)" "inactive (dead)"; status_code=3
            fi ;;
        *) "$script" "$verb" </dev/null >/dev/null || status_code=1 ;;
        esac
    done
    exit $status_code ;;
*)
    echo "systemctl (lab box stand-in): $verb is not modelled" >&2
    exit 1 ;;
esac
