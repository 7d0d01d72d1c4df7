#!/bin/bash
# TEST ONLY (tests/lab_box.py): the supervisor of one native systemd unit in a lab box node host,
# where systemd is not PID 1. The box's systemctl (systemctl.sh) starts it in a session of its own
# for `systemctl start UNIT` and kills that session for `stop`. It does what systemd does for a
# simple service, as far as the units our packages ship use it (systemd.service(5), systemd.exec(5)):
# - the unit file where systemd finds it (/etc/systemd/system before /lib/systemd/system and
#   /usr/lib/systemd/system), then its drop-ins NAME.service.d/*.conf from those directories in
#   file-name order (the same name in /etc wins);
# - ExecStart=: an empty assignment resets the list, the last command runs; ExecStartPre= first;
# - EnvironmentFile= (a leading "-": optional) and Environment= set variables; in the command,
#   $NAME splits into words and ${NAME} stays one word;
# - Restart=always | on-failure | no, RestartSec= (default 100 ms, as systemd's).
# Its state goes to /run/labs-k8s-box/units/UNIT.state: running, auto-restart, failed, inactive.
set -u
unit=$1
state_file=/run/labs-k8s-box/units/$unit.state
dirs=(/etc/systemd/system /lib/systemd/system /usr/lib/systemd/system)
file=""
for dir in "${dirs[@]}"; do
    if [[ -f $dir/$unit && ! -L $dir/$unit ]]; then file=$dir/$unit; break; fi
done
[[ -n $file ]] || { echo "unit-run: $unit: no unit file" >&2; echo failed >"$state_file"; exit 1; }
declare -A dropins=()
for dir in "${dirs[@]}"; do
    for conf in "$dir/$unit.d"/*.conf; do
        [[ -f $conf ]] || continue
        [[ -n ${dropins[${conf##*/}]:-} ]] || dropins[${conf##*/}]=$conf
    done
done
files=("$file")
while read -r name; do
    [[ -n $name ]] && files+=("${dropins[$name]}")
done < <(printf '%s\n' "${!dropins[@]}" | sort)

exec_start="" restart=no restart_sec=0.1 pre=() env_files=() envs=()
for f in "${files[@]}"; do
    while IFS= read -r line; do
        case $line in
        ExecStart=) exec_start="" ;;
        ExecStart=*) exec_start=${line#ExecStart=} ;;
        ExecStartPre=*) pre+=("${line#ExecStartPre=}") ;;
        EnvironmentFile=*) env_files+=("${line#EnvironmentFile=}") ;;
        Environment=*) envs+=("${line#Environment=}") ;;
        Restart=*) restart=${line#Restart=} ;;
        RestartSec=*) restart_sec=${line#RestartSec=}; restart_sec=${restart_sec%s} ;;
        esac
    done <"$f"
done

declare -A vars=()
# Environment="A=1" "B=2" or Environment=A=1 B=2
for assignment in "${envs[@]}"; do
    eval "set -- $assignment"
    for pair in "$@"; do vars[${pair%%=*}]=${pair#*=}; done
done
for env_file in "${env_files[@]}"; do
    optional=0
    [[ $env_file == -* ]] && { optional=1; env_file=${env_file#-}; }
    if [[ ! -r $env_file ]]; then
        ((optional)) && continue
        echo "unit-run: $unit: failed to load environment file $env_file" >&2
        echo failed >"$state_file"
        exit 1
    fi
    while IFS= read -r line; do
        [[ $line =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
        # The name first: the quote match below replaces BASH_REMATCH.
        name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
        if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then value=${BASH_REMATCH[1]}; fi
        vars[$name]=$value
    done <"$env_file"
done

# command LINE: the words of a command line with $NAME and ${NAME} expanded as systemd does.
command_words() {
    local word words=() name
    read -r -a raw <<<"$1"
    for word in "${raw[@]}"; do
        if [[ $word =~ ^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$ ]]; then
            words+=("${vars[${BASH_REMATCH[1]}]:-}")
        elif [[ $word =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
            name=${BASH_REMATCH[1]}
            # shellcheck disable=SC2206 # word splitting is what systemd does for $NAME
            [[ -z ${vars[$name]:-} ]] || words+=(${vars[$name]})
        else
            words+=("$word")
        fi
    done
    printf '%s\0' "${words[@]}"
}

child=""
trap '[[ -n $child ]] && kill -TERM "$child" 2>/dev/null; wait; echo inactive >"$state_file"; exit 0' TERM INT
[[ -n $exec_start ]] || { echo "unit-run: $unit has no ExecStart=" >&2; echo failed >"$state_file"; exit 1; }
while :; do
    echo "$(date -u +%FT%TZ) unit-run: starting $unit"
    for line in "${pre[@]}"; do
        # A leading "-": the command's failure is ignored (systemd.service, "Command lines").
        mapfile -d '' -t cmd < <(command_words "${line#-}")
        "${cmd[@]}" || [[ $line == -* ]] || echo "unit-run: ExecStartPre failed: $line"
    done
    # Its executable prefixes ("-", "@", ":", "+", "!", "!!": systemd.service(5), "Command lines")
    # change privileges or failure handling only; a host runs everything as root.
    mapfile -d '' -t cmd < <(command_words "$(sed -E 's/^[-@:+!]+//' <<<"$exec_start")")
    echo running >"$state_file"
    # The unit's variables are its process's environment too (systemd.exec, Environment=).
    (for name in "${!vars[@]}"; do export "$name=${vars[$name]}"; done; exec "${cmd[@]}") &
    child=$!
    wait "$child"
    rc=$?
    child=""
    echo "$(date -u +%FT%TZ) unit-run: $unit exited $rc"
    case $restart in
    always) ;;
    on-failure) ((rc != 0)) || break ;;
    *) break ;;
    esac
    echo auto-restart >"$state_file"
    sleep "$restart_sec"
done
if ((rc == 0)); then echo inactive >"$state_file"; else echo failed >"$state_file"; fi
