"""labs-k8s: `pulumi up --stack labs` builds the whole lab. See README.md and docs/architecture.md."""

import pulumi

from components.config import LabConfigError
from components.lab import Lab
from components.preflight import run_preflight
from components.previous_state import check_control_plane_change, read_previous_state
from components.stack_config import read_stack_inputs
from components.upgrade import check_version_change

# Validation and preflight raise before any resource is registered.
inputs = read_stack_inputs()
previous = read_previous_state(inputs.lab.previous_state.unreadable)
try:
    check_control_plane_change(inputs.lab, previous)
    check_version_change(inputs.lab, previous)
except LabConfigError as error:
    raise pulumi.RunError(str(error)) from None
run_preflight(inputs)
lab = Lab("labs-k8s", inputs, previous)

pulumi.export("apiEndpoint", lab.api_endpoint)
pulumi.export("kubeconfig", lab.cluster.kubeconfig)
# Until when the kubeconfig's client certificate is valid (one year): the step re-exports it,
# renewed, when an `up` runs within 30 days of this.
pulumi.export("kubeconfigValidUntil", lab.cluster.kubeconfig_valid_until)
pulumi.export("nodes", lab.node_table)
pulumi.export("templateUuid", lab.template.uuid)
pulumi.export("templateName", lab.template.name)
