"""Failure drills against the live lab: `python -m components drill <scenario> [--stack labs] [--dry-run]`.

- inputs.py    stack outputs and the vCenter login (`load_inputs`, or `parse_inputs` for tests)
- cluster.py   the `Cluster` interface and `KubectlCluster`, its kubectl implementation
- vcenter.py   `VCenterMachines`: power and guest addresses, through components.vsphere
- engine.py    bounds, timeline, verdict, restore-on-anything
- scenarios.py control-plane, balancer, worker, drain
- cli.py       the `drill` subcommand

See docs/drills.md. Kept free of imports so `python -m components render` does not load pyVmomi.
"""
