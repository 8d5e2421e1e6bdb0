"""ConfigMaps in change correlation (docs/security.md, section 6): the chart value
``rbac.changeCorrelation.configMaps`` both grants ``list`` on ConfigMaps and tells the
operator to use it (``--correlate-configmaps``, a flag its own parser accepts); by default
neither, so the operator never asks for what it may not read."""

from __future__ import annotations

from typing import Any

from cachescale.commands.main import build_parser
from tests.chart.chart_helpers import Manifest, render, render_error

FLAG = "--correlate-configmaps"


def args(manifests: list[Manifest]) -> list[str]:
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def lists_configmaps(manifests: list[Manifest]) -> bool:
    return any(
        "configmaps" in rule.get("resources", []) and "list" in rule.get("verbs", [])
        for m in manifests
        if m["kind"] in ("ClusterRole", "Role")
        for rule in m.get("rules") or []
    )


def test_by_default_configmaps_are_neither_granted_nor_listed() -> None:
    manifests = render({})
    assert FLAG not in args(manifests)
    assert not lists_configmaps(manifests)
    assert build_parser().parse_args(args(manifests)).correlate_configmaps is False


def test_the_value_grants_list_and_turns_the_flag_on_together() -> None:
    for values in (
        {"rbac": {"changeCorrelation": {"configMaps": True}}},
        {
            "watchNamespaces": ["llm"],
            "rbac": {"namespaced": True, "changeCorrelation": {"configMaps": True}},
        },
    ):
        manifests = render(values)
        rendered = args(manifests)
        assert rendered.count(FLAG) == 1, rendered
        assert lists_configmaps(manifests), values
        assert build_parser().parse_args(rendered).correlate_configmaps is True


def test_config_maps_must_be_a_boolean() -> None:
    values: dict[str, Any] = {"rbac": {"changeCorrelation": {"configMaps": "yes"}}}
    assert "configMaps" in render_error(values)
