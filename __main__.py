"""labs-k8s: `pulumi up --stack labs` builds the whole lab. See README.md and docs/architecture.md."""

import pulumi

from components.config import LabConfigError, config_warnings
from components.lab import Lab
from components.preflight import check_rules_after_up, run_preflight, vms_to_create
from components.previous_state import check_control_plane_change, read_previous_state
from components.stack_config import check_api_timeout, read_stack_inputs
from components.upgrade import check_version_change

# Validation and preflight raise before any resource is registered.
inputs = read_stack_inputs()
previous = read_previous_state(inputs.lab.previous_state.unreadable)
# Risks the config accepts only by name (a plain-http registry mirror): said at every preview and up.
for warning in config_warnings(inputs.lab):
    pulumi.log.warn(warning)
try:
    check_control_plane_change(inputs.lab, previous)
    check_version_change(inputs.lab, previous)
except LabConfigError as error:
    raise pulumi.RunError(str(error)) from None
check_api_timeout(inputs, vms_to_create(inputs.lab, previous))
run_preflight(inputs, previous)
lab = Lab("labs-k8s", inputs, previous)
check_rules_after_up(inputs, [rule.id for rule in lab.fleet.rules.values()])

pulumi.export("apiEndpoint", lab.api_endpoint)
pulumi.export("kubeconfig", lab.cluster.kubeconfig)
# Until when the kubeconfig's client certificate is valid (one year): the step re-exports it,
# renewed, when an `up` runs within 30 days of this.
pulumi.export("kubeconfigValidUntil", lab.cluster.kubeconfig_valid_until)
pulumi.export("nodes", lab.node_table)
# The host keys the steps pin, as known_hosts lines: every node, and `[VIP]:2222` for the control
# planes' shared key (docs/runbook.md, "The operator's ssh").
pulumi.export("sshKnownHosts", lab.known_hosts)
pulumi.export("templateUuid", lab.template.uuid)
pulumi.export("templateName", lab.template.name)
