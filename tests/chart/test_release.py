"""`make release` (scripts/release.sh): the wheel, the sdist and the chart of one version.

The script is run for real into a temporary folder; each artefact is opened and its
version read from its own metadata (the wheel's METADATA, the sdist's PKG-INFO, the
packaged chart's Chart.yaml), so a release whose parts disagree fails here.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import yaml

from tests.chart.chart_helpers import REPO, helm_binary

VERSION = "9.8.7"
"""A version no file in the tree carries, so every artefact shows it was stamped."""


def release(out: Path) -> dict[str, Path]:
    """Run the release script into ``out``; its artefacts by kind."""
    made = subprocess.run(
        [str(REPO / "scripts" / "release.sh"), VERSION, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HELM": helm_binary(), "PYTHON": sys.executable},
    )
    assert made.returncode == 0, made.stderr
    listed = [line.split() for line in made.stdout.splitlines()]
    paths = {Path(path).name: Path(path) for path, _ in listed}
    assert all(int(size) == Path(path).stat().st_size for path, size in listed), listed
    return {
        "wheel": paths[f"cachescale-{VERSION}-py3-none-any.whl"],
        "sdist": paths[f"cachescale-{VERSION}.tar.gz"],
        "chart": paths[f"cachescale-{VERSION}.tgz"],
    }


def metadata_version(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("Version: ")]
    return line.removeprefix("Version: ")


def test_the_wheel_the_sdist_and_the_chart_carry_one_version(tmp_path: Path) -> None:
    pyproject = (REPO / "pyproject.toml").read_bytes()
    made = release(tmp_path)
    assert (REPO / "pyproject.toml").read_bytes() == pyproject, "the clone is never stamped"
    with zipfile.ZipFile(made["wheel"]) as wheel:
        info = f"cachescale-{VERSION}.dist-info"
        assert metadata_version(wheel.read(f"{info}/METADATA").decode()) == VERSION
        assert f"{info}/licenses/LICENSE" in wheel.namelist()
        init = wheel.read("cachescale/__init__.py").decode()
        assert f'__version__ = "{VERSION}"' in init
    with tarfile.open(made["sdist"]) as sdist:
        pkg_info = sdist.extractfile(f"cachescale-{VERSION}/PKG-INFO")
        assert pkg_info is not None
        assert metadata_version(pkg_info.read().decode()) == VERSION
    with tarfile.open(made["chart"]) as chart:
        meta = chart.extractfile("cachescale/Chart.yaml")
        assert meta is not None
        loaded = yaml.safe_load(io.TextIOWrapper(meta, encoding="utf-8"))
    assert (loaded["version"], loaded["appVersion"]) == (VERSION, VERSION)
