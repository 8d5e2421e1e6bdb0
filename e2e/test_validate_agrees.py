"""`cachescale validate` pinned to the real API server, document by document.

Every CacheScalingPolicy in examples/ (the valid ones and examples/invalid/), every
mutated policy of tests/api/mutations.py and a few YAML spellings that only text can
carry (``1.0e400``, ``yes``, a key written twice) go to the API server that runs the
chart's CRD, as ``kubectl apply --dry-run=server`` (the user's own command, so kubectl's
YAML-to-JSON step is part of the verdict), and through ``cachescale validate``.

The rule: whatever the server (or kubectl on its way there) refuses, validate refuses.
Validate may be stricter only for the classes in :data:`STRICTER`, each one a rule the
CRD cannot express, with the reason; an entry that no longer applies fails the test too.

Speed: all documents go to kubectl as one multi-document stream. kubectl stops reading a
stream at the first document it cannot turn into JSON (an infinite number), so that one
is sent alone and the stream goes on after it: some forty kubectl runs, about five
seconds on two cores. Validate runs in process on the same text, and once more as the real
command over a folder that holds every document as its own file.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cachescale.api.policy import KIND
from cachescale.api.validation import check_text, load_documents
from e2e.harness.cluster import REPO, Cluster
from e2e.harness.release import Release
from tests.api.mutations import FULL_POLICY, STRICTER_THAN_THE_SERVER, mutated_policies

EXAMPLES = REPO / "examples"


@dataclass(frozen=True)
class Case:
    """One document: where it comes from, and its YAML text as both sides read it."""

    name: str
    """metadata.name it is sent under (unique, so kubectl's answer can be matched)."""
    origin: str
    """The example file, the mutation's id, or the text edit."""
    text: str


STRICTER: dict[str, str] = {
    **STRICTER_THAN_THE_SERVER,
    "text:duplicate-key": (
        "a key written twice in one mapping: kubectl's YAML-to-JSON step keeps the last "
        "value without a word, so the server never sees the first; validate refuses the "
        "file, since one of the two values the author wrote is silently lost"
    ),
}
"""Documents validate rejects and the API server accepts, by origin: why each is right."""


def _full_policy_edits() -> list[tuple[str, str, str]]:
    """``(id, line in FULL_POLICY's text, its replacement)``: spellings a dict cannot hold."""
    return [
        ("whole-float-int", "maxReplicas: 4", "maxReplicas: 4.0"),
        ("exponent-int", "maxReplicas: 4", "maxReplicas: 4e0"),
        ("exponent-big", "maxReplicas: 4", "maxReplicas: 1e3"),
        ("exponent-huge-int", "maxReplicas: 4", "maxReplicas: 1e25"),
        ("hex-int", "maxReplicas: 4", "maxReplicas: 0x4"),
        ("octal-int", "maxReplicas: 4", "maxReplicas: 04"),
        ("underscore-int", "maxReplicas: 4", "maxReplicas: 1_0"),
        ("quoted-int", "maxReplicas: 4", "maxReplicas: '4'"),
        ("duplicate-key", "maxReplicas: 4", "maxReplicas: 4\n    maxReplicas: 3"),
        ("overflow-float", "gpuSecondsPer1kRequests: 900.0", "gpuSecondsPer1kRequests: 1.0e400"),
        ("nan-float", "gpuSecondsPer1kRequests: 900.0", "gpuSecondsPer1kRequests: .nan"),
        ("yes-bool", "manageMaxNumSeqs: true", "manageMaxNumSeqs: yes"),
        ("on-bool", "manageMaxNumSeqs: true", "manageMaxNumSeqs: on"),
        ("tilde-null", "mode: Advise", "mode: ~"),
        ("weights-above-gpu", "weightsGiB: 16.0", "weightsGiB: 500"),
        ("window-huge", "window: 5m", "window: 99999999999h"),
        ("window-compound", "window: 5m", "window: 1h30m"),
        ("window-seconds", "window: 5m", "window: 300s"),
        ("window-spaced", "window: 5m", "window: 5 m"),
    ]


def _cases(namespace: str) -> list[Case]:
    """Every document, named ``aNNN`` and put in ``namespace`` (neither changes a verdict:
    the CRD does not check names, and the namespace must exist for the server to answer)."""
    sources: list[tuple[str, dict[str, Any], tuple[str, str] | None]] = []
    for path in sorted(
        [*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("stack/*.yaml"), *EXAMPLES.glob("invalid/*.yaml")]
    ):
        documents = load_documents(path.read_text(encoding="utf-8"))
        for index, document in enumerate(documents, start=1):
            if isinstance(document, dict) and document.get("kind") == KIND:
                sources.append((f"{path.relative_to(REPO)}#{index}", document, None))
    sources.extend((origin, policy, None) for origin, policy in mutated_policies())
    sources.extend(
        (f"text:{origin}", copy.deepcopy(FULL_POLICY), (line, replacement))
        for origin, line, replacement in _full_policy_edits()
    )
    cases = []
    for index, (origin, document, edit) in enumerate(sources):
        name = f"a{index:03d}"
        document["metadata"] = {"name": name, "namespace": namespace}
        text = yaml.safe_dump(document, sort_keys=False)
        if edit is not None:
            assert text.count(edit[0] + "\n") == 1, edit
            text = text.replace(edit[0] + "\n", edit[1] + "\n")
        cases.append(Case(name, origin, text))
    return cases


_ACCEPTED = re.compile(r"/(a\d{3}) (?:created|configured|unchanged) \(server dry run\)")
_REFUSED = re.compile(r'"(a\d{3})" is (?:invalid|forbidden): (.*)')


def _apply(cluster: Cluster, texts: list[str]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin="---\n".join(texts))


def server_verdicts(cluster: Cluster, cases: list[Case]) -> tuple[dict[str, str], int]:
    """``{name: ""}`` when the server accepts the document, else ``{name: why}``; and how
    many kubectl runs it took."""
    verdicts: dict[str, str] = {}
    remaining = cases
    runs = 0
    while remaining:
        runs += 1
        applied = _apply(cluster, [case.text for case in remaining])
        verdicts.update((name, "") for name in _ACCEPTED.findall(applied.stdout))
        verdicts.update(_REFUSED.findall(applied.stderr))
        left = [case for case in remaining if case.name not in verdicts]
        if not left:
            break
        # The first document without an answer is the one kubectl could not read (or one
        # whose error does not name it): alone, its exit code is its verdict.
        runs += 1
        alone = _apply(cluster, [left[0].text])
        verdicts[left[0].name] = (
            "" if alone.returncode == 0 else f"kubectl: {alone.stderr.strip() or '?'}"
        )
        remaining = left[1:]
    return verdicts, runs


def test_validate_rejects_whatever_the_api_server_rejects(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    cases = _cases(namespace)
    started = time.monotonic()
    server, runs = server_verdicts(cluster, cases)
    seconds = time.monotonic() - started
    offline = {case.name: check_text(case.text).problems for case in cases}

    missed = [
        f"{case.origin}: server: {server[case.name]}"
        for case in cases
        if server[case.name] and not offline[case.name]
    ]
    stricter = {
        case.origin: offline[case.name][0].message
        for case in cases
        if offline[case.name] and not server[case.name]
    }
    agreed = sum(bool(server[case.name]) == bool(offline[case.name]) for case in cases)
    refused = sum(bool(server[case.name]) for case in cases)
    print(
        f"{len(cases)} documents, {refused} refused by the API server (or kubectl), "
        f"{agreed} verdicts agreed, {len(stricter)} stricter in validate; "
        f"{runs} kubectl runs, {seconds:.1f}s"
    )
    assert sum(not case.origin.startswith(("examples/", "text:")) for case in cases) >= 100
    assert missed == [], "the API server refused, cachescale validate accepted:\n" + "\n".join(
        missed
    )
    assert stricter.keys() == STRICTER.keys(), (
        f"validate rejects, the API server accepts: {stricter}; documented: {list(STRICTER)}"
    )

    # The README's validate section states these numbers; keep it true.
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    stated = f"{len(cases)} documents", f"All {refused} that", f"of the {len(cases) - refused} it"
    assert all(words in readme for words in stated), f"README.md should say {stated}"

    # The examples say what they are: the server takes every valid one, and refuses each
    # file of examples/invalid/ (p99-below-p95.yaml holds a fine policy beside its bad one).
    examples = [case for case in cases if case.origin.startswith("examples/")]
    accepted = {case.origin for case in examples if not server[case.name]}
    refused_files = {case.origin.split("#")[0] for case in examples if server[case.name]}
    assert {o for o in accepted if not o.startswith("examples/invalid/")} == {
        case.origin for case in examples if not case.origin.startswith("examples/invalid/")
    }
    assert refused_files == {str(p.relative_to(REPO)) for p in EXAMPLES.glob("invalid/*.yaml")}

    # The real command, once, over a folder holding every document as its own file.
    for case in cases:
        (tmp_path / f"{case.name}.yaml").write_text(case.text, encoding="utf-8")
    command = subprocess.run(
        [sys.executable, "-m", "cachescale.commands.main", "validate", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in command.stderr, command.stderr
    assert command.returncode == 1, command.stderr
    valid = set(re.findall(r"/(a\d{3})\.yaml: valid$", command.stdout, re.MULTILINE))
    rejected = set(re.findall(r"/(a\d{3})\.yaml: ", command.stderr))
    assert valid == {name for name, problems in offline.items() if not problems}
    assert rejected == {name for name, problems in offline.items() if problems}
