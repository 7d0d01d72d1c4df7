"""labs-k8s: `pulumi up --stack labs` builds the whole lab. See README.md and docs/architecture.md."""

import pulumi

from components.lab import Lab
from components.preflight import run_preflight
from components.stack_config import read_stack_inputs

# Validation and preflight raise before any resource is registered.
inputs = read_stack_inputs()
run_preflight(inputs)
lab = Lab("labs-k8s", inputs)

pulumi.export("apiEndpoint", lab.api_endpoint)
pulumi.export("kubeconfig", lab.cluster.kubeconfig)
pulumi.export("nodes", lab.node_table)
pulumi.export("templateUuid", lab.template.uuid)
pulumi.export("templateName", lab.template.name)
