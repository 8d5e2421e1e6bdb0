"""The Dockerfile read against the chart (e2e/test_image.py builds the image and runs it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from typing import Any

import yaml
from packaging.version import Version

from tests.chart.chart_helpers import CHART, REPO, render
from tests.controller.process_fixture import IMAGE_ENV

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            logical.append(current.strip())
        current = ""
    pairs = []
    for line in logical:
        word, _, rest = line.partition(" ")
        pairs.append((word.upper(), rest.strip()))
    return pairs


def all_of(name: str) -> list[str]:
    return [args for word, args in instructions() if word == name]


def final_stage() -> list[tuple[str, str]]:
    pairs = instructions()
    last_from = max(i for i, (word, _) in enumerate(pairs) if word == "FROM")
    return pairs[last_from:]


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return loaded


def test_both_stages_on_one_base_slim_python_312_by_default() -> None:
    """The runtime stage runs the build stage's virtualenv, so both share the base (its
    interpreter's path); python:3.12-slim unless BASE_IMAGE names another."""
    args = dict(a.split("=", 1) for a in all_of("ARG") if "=" in a)
    assert args["BASE_IMAGE"] == "python:3.12-slim"
    bases = [a.split()[0] for a in all_of("FROM")]
    assert len(bases) == 2
    assert all(base == "${BASE_IMAGE}" for base in bases), bases


def test_runs_as_the_non_root_uid_the_chart_expects() -> None:
    users = [args for word, args in final_stage() if word == "USER"]
    assert users, "the runtime stage must set USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), "numeric uid: runAsNonRoot can only verify a number"
    assert int(user) == 10001
    assert int(group) == 10001
    chart = values()
    assert chart["podSecurityContext"]["runAsUser"] == int(user)
    assert chart["securityContext"]["runAsUser"] == int(user)
    assert any("--uid 10001" in args for word, args in final_stage() if word == "RUN")


def test_installs_the_repo_package_with_the_operator_extra() -> None:
    runs = " ".join(all_of("RUN"))
    assert re.search(r"""pip install ["']?\.\[operator\]["']?""", runs), runs
    copied = " ".join(all_of("COPY"))
    for needed in ("pyproject.toml", "README.md", "operator/"):
        assert needed in copied, needed


def test_entrypoint_and_default_command() -> None:
    (entrypoint,) = [args for word, args in final_stage() if word == "ENTRYPOINT"]
    (command,) = [args for word, args in final_stage() if word == "CMD"]
    assert json.loads(entrypoint) == ["cachescale"]
    assert json.loads(command) == ["run"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "cachescale" in pyproject["project"]["scripts"]
    assert "operator" in pyproject["project"]["optional-dependencies"]


def test_exposed_ports_are_the_chart_ports() -> None:
    (exposed,) = [args for word, args in final_stage() if word == "EXPOSE"]
    operator = values()["operator"]
    assert sorted(int(p) for p in exposed.split()) == sorted(
        [operator["healthPort"], operator["metricsPort"]]
    )


def test_the_chart_and_the_tests_run_the_operator_with_the_image_env() -> None:
    """The chart repeats the image's environment (a user's own image may lack it), and the
    tests' operator process has what changes how it runs, so the bench measures it."""
    (assignments,) = [args for word, args in final_stage() if word == "ENV"]
    image_env = dict(pair.split("=", 1) for pair in assignments.split())
    del image_env["PATH"]
    assert image_env["MALLOC_ARENA_MAX"] == "2"
    (deployment,) = [m for m in render() if m["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    chart_env = {e["name"]: e.get("value") for e in container["env"]}
    assert image_env.items() <= chart_env.items()
    assert IMAGE_ENV.items() <= image_env.items()


def test_dockerignore_keeps_the_context_to_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!operator/"} <= set(lines)


def test_chart_image_is_this_image_at_the_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    image = values()["image"]
    assert image["repository"] == "ghcr.io/cachescale/cachescale"
    assert image["tag"] == "", "the tag follows appVersion"
    (deployment,) = [m for m in render() if m["kind"] == "Deployment"]
    rendered = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert rendered == f"ghcr.io/cachescale/cachescale:{chart['appVersion']}"
    # The image built from this tree is that release (a .devN pre-release of it until then).
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert Version(pyproject["project"]["version"]).base_version == chart["appVersion"]


def chart_flags() -> set[str]:
    """Every ``--flag`` the chart's Deployment template may pass to ``cachescale run``
    (its ``args:`` list, whichever values turn each on)."""
    template = (CHART / "templates" / "deployment.yaml").read_text(encoding="utf-8")
    args = template[template.index("args:") : template.index("env:")].splitlines()
    code = "\n".join(line for line in args if not line.lstrip().startswith("#"))
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", code))


def test_chart_flags_are_the_operator_flags() -> None:
    """Every flag the chart passes is one ``cachescale run`` accepts."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cachescale.commands.main import main; main()",
            "run",
            "--help",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    flags = chart_flags()
    assert {"--metrics-port", "--health-port", "--peering", "--standalone", "--namespace"} <= flags
    accepted = set(re.findall(r"--[a-z][a-z-]*", result.stdout))
    for flag in sorted(flags):
        assert flag in accepted, f"`cachescale run` does not accept {flag}"
