"""CloneSource (components/clone_source.py) through the real dynamic-provider host.

The engine side is tests/provider_host.py (the `python -m pulumi.dynamic` process, driven as
step_generator.go does); the inputs are the ones the program registers under the mock engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.tools.offline import OfflineRun, run_program
from tests.provider_host import EngineResource, proxy_free_environment

NODE = "labs-k8s-w01"
SOURCE = f"{NODE}-clone-source"


def up(engine: EngineResource, run: OfflineRun) -> str:
    return engine.up(run.by_name(SOURCE).wire_inputs, run.config, run.secret_keys).op


def with_changes(lab_namespace: dict[str, Any], **sections: Any) -> OfflineRun:
    return run_program("labs", overrides={f"labs-k8s:{k}": v for k, v in {**lab_namespace, **sections}.items()})


@pytest.mark.integration
def test_a_node_keeps_its_template_until_it_gets_a_new_vm(lab_namespace):
    first = run_program("labs")
    engine = EngineResource(first.by_name(SOURCE).urn, environment=proxy_free_environment())
    assert up(engine, first) == "create"
    assert engine.state is not None
    created_id, created = engine.state.id, engine.state.plain_outputs
    assert created["template"] == first.by_name("golden-template").plain_outputs["uuid"]
    assert created_id.startswith(f"{NODE}-")

    # A second up, then a rebuilt template (a new Debian point release): the source stays.
    assert up(engine, run_program("labs")) == "same"
    template = dict(
        lab_namespace["template"],
        isoUrl=lab_namespace["template"]["isoUrl"].replace("12.12", "12.13"),
        isoSha256="0" * 64,
    )
    rebuilt = with_changes(lab_namespace, template=template)
    new_template = rebuilt.by_name("golden-template").plain_outputs["uuid"]
    assert new_template != created["template"]
    assert rebuilt.by_name(SOURCE).plain_inputs["template"] == new_template  # the program passes the new one
    assert up(engine, rebuilt) == "same"
    assert engine.state.id == created_id and engine.state.plain_outputs["template"] == created["template"]

    # The node's identity changes (its address): a new source, on the current template.
    nodes = lab_namespace["nodes"]
    nodes["workers"]["hosts"][0]["ip"] = "10.3.60.64"
    moved = with_changes(lab_namespace, template=template, nodes=nodes)
    step = engine.up(moved.by_name(SOURCE).wire_inputs, moved.config, moved.secret_keys)
    assert (step.op, step.replaces, step.delete_before_replace) == ("replace", ("identity",), False)
    assert engine.state.id != created_id
    assert engine.state.plain_outputs["template"] == new_template

    assert engine.destroy().op == "delete"
