# shellcheck shell=bash
# Sourced, never run, by the steps that install packages (lb/setup-balancer.sh, k8s/lib.sh), which
# define log and die. It travels in their step bundles beside them.

# finish_interrupted_dpkg: what a step cut off while dpkg worked (the VM powered off, the step's
# deadline) left behind, finished, so that the step's own apt-get install can run; a no-op when
# nothing is pending. Call it after `apt-get update`: a reinstall needs the package lists.
# - Cut off between two packages, or while configuring one: `dpkg --configure -a` finishes it, as
#   apt asks ("dpkg was interrupted, you must manually run 'dpkg --configure -a'").
# - Cut off while unpacking one: dpkg left it flagged reinst-required (Status "install reinstreq
#   half-installed", or "install reinstreq unpacked" when only the clean-up after the unpack was
#   missing). `dpkg --configure -a` refuses it ("package is in a very bad inconsistent state; you
#   should reinstall it before attempting configuration", dpkg's src/main/configure.c), and apt-get
#   install of other packages leaves it so, so every later run would fail the same way: it is
#   reinstalled at the version dpkg recorded for it, the only repair dpkg accepts. Found by the lab
#   in a box (#31), reproduced by tests/test_interrupted_dpkg.py with dpkg killed at those points.
finish_interrupted_dpkg() {
    local reinstall
    # Its complaint about a reinst-required package is expected here: the reinstall below repairs
    # it, and the second `dpkg --configure -a` says whether anything else is still wrong.
    dpkg --configure -a --force-confdef --force-confold || true
    # shellcheck disable=SC2016 # ${...} are dpkg-query's fields, not shell expansions
    reinstall=$(dpkg-query -W -f='${db:Status-Eflag} ${binary:Package}=${Version}\n' |
        awk '$1 == "reinstreq" { printf "%s%s", sep, $2; sep = " " }')
    if [[ -n $reinstall ]]; then
        log "dpkg was cut off while unpacking $reinstall (an earlier run of this step): reinstalling it"
        # shellcheck disable=SC2086 # one package=version per word
        apt-get install -y -q --no-install-recommends --reinstall \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $reinstall ||
            die "reinstalling $reinstall failed: dpkg left it half unpacked and accepts only a reinstall of that version; if the repository no longer has it, remove the package on the node (dpkg --remove --force-remove-reinstreq), then run the step again"
    fi
    dpkg --configure -a --force-confdef --force-confold ||
        die "dpkg --configure -a failed: a package an earlier run of this step left half installed cannot be configured (its error is above)"
}
