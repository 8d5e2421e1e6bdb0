"""Tenancy: unsalted tenants are named, the prefixes tenants share are counted (never
quoted), and a non-cryptographic hash shared by tenants is warned about."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cachescale.audit.replay import replay
from cachescale.audit.result import build_result
from cachescale.exit_codes import ExitCode
from tests.audit.helpers import cli, corpus

SYSTEM = list(range(1000, 1040))  # 2 full blocks of 16, and 8 tokens more
DOCS = list(range(2000, 2024))  # SYSTEM + DOCS: exactly 4 blocks


def records() -> list[dict[str, Any]]:
    """Tenants a and b share the system prompt (a3 and b2 the documents too), unsalted;
    tenant c sends the same system prompt with its own salt."""
    prompts = {
        "a1": ("a", SYSTEM),
        "b1": ("b", SYSTEM),
        "a2": ("a", SYSTEM),
        "c1": ("c", SYSTEM),
        "a3": ("a", SYSTEM + DOCS),
        "b2": ("b", SYSTEM + DOCS),
    }
    return [
        {
            "conversation_id": name,
            "turn": 0,
            "prompt_token_ids": prefix + [3000 + 100 * number + k for k in range(20)],
            "tenant": tenant,
            **({"cache_salt": "salt-c"} if tenant == "c" else {}),
        }
        for number, (name, (tenant, prefix)) in enumerate(prompts.items())
    ]


def test_shared_prefixes_are_counted_per_tenant_without_content() -> None:
    data = corpus(*records())
    result = build_result(data, "x", replay(data))
    section = result["tenancy"]
    assert {key: section[key] for key in section if key != "shared_prefixes"} == {
        "tenants": 3,
        "unsalted_tenants": 2,
        "unsalted_requests": 5,
        "shared_blocks": 4,  # the system prompt's 2 blocks and the documents' 2
        "shared_requests": 5,
    }
    prefixes = section["shared_prefixes"]
    # Maximal prefixes: a3 and b2 count towards the 4-block one only.
    assert [(p["blocks"], p["tokens"], p["tenants"], p["requests"]) for p in prefixes] == [
        (2, 32, ["a", "b"], 3),
        (4, 64, ["a", "b"], 2),
    ]
    assert all(re.fullmatch("[0-9a-f]{8}", p["id"]) for p in prefixes)
    assert "1000" not in json.dumps(section)  # ids, counts and tenant names: no tokens
    assert result["notes"][0].startswith("2 of 3 tenants send requests without cache_salt")
    assert "vLLM isolates tenants only by cache_salt" in result["notes"][0]
    assert result["notes"][1].startswith(
        "prefixes shared across tenants: 2 (4 blocks, reached by 5 requests)"
    )
    assert result["warnings"] == []


def test_salted_or_single_tenant_corpora_have_no_tenancy_report() -> None:
    salted = corpus(*[{**r, "cache_salt": r["tenant"]} for r in records()])
    result = build_result(salted, "x", replay(salted, hash_algo="xxhash"))
    assert result["tenancy"]["shared_prefixes"] == []
    assert result["notes"] == []
    assert len(result["warnings"]) == 1  # the hash is still shared by three tenants
    single = corpus(*[{**r, "tenant": "a"} for r in records()])
    result = build_result(single, "x", replay(single, hash_algo="xxhash"))
    assert (result["tenancy"], result["notes"], result["warnings"]) == (None, [], [])


def test_xxhash_with_tenants_warns_in_run_and_compare(tmp_path: Path) -> None:
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records()) + "\n", encoding="utf-8")
    outs = [str(tmp_path / "base.json"), str(tmp_path / "cand.json")]
    for out in outs:
        done = cli("run", str(source), "--out", out, "--hash-algo", "xxhash")
        assert done.returncode == ExitCode.OK, done.stderr
        assert "warning: --hash-algo xxhash is not a cryptographic hash" in done.stdout
        assert "note: 2 of 3 tenants send requests without cache_salt" in done.stdout
    table = cli("compare", *outs)
    assert table.returncode == ExitCode.OK, table.stderr
    assert "note: candidate: 2 of 3 tenants send requests without cache_salt" in table.stdout
    assert "note: candidate: prefixes shared across tenants: 2" in table.stdout
    assert "warning: --hash-algo xxhash is not a cryptographic hash: with 3 tenants" in (
        table.stdout
    )
    markdown = cli("compare", *outs, "--format", "markdown").stdout
    assert "> ⚠️ --hash-algo xxhash" in markdown
    verdict = json.loads(cli("compare", *outs, "--format", "json").stdout)
    assert len(verdict["warnings"]) == 1
