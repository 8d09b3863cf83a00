"""The distribution as a user gets it: ``python -m build`` makes a wheel and an sdist that
``twine check --strict`` accepts; the wheel, installed with its ``demo`` extra into a fresh
virtualenv, runs ``singleton --version`` and ``singleton demo`` from a temporary directory, with
no source tree on ``sys.path``.

Building and installing fetch from the package index (setuptools for the isolated build, the
dependencies for the virtualenv): this is the path ``pip install singleton-election[demo]``
takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import singleton

ROOT = Path(__file__).resolve().parents[3]
DIST = "singleton-election"

pytestmark = pytest.mark.slow


def _run(
    argv: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert out.returncode == 0, f"{argv}: {out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out)
    return out


@pytest.fixture(scope="module")
def fresh_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv with nothing but the wheel and its ``demo`` extra."""
    home = tmp_path_factory.mktemp("venv")
    venv = home / "venv"
    _run([sys.executable, "-m", "virtualenv", "-q", str(venv)], cwd=home)
    (wheel,) = dist.glob("*.whl")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, f"{wheel}[demo]"], cwd=home)
    yield venv


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SINGLETON_", "PYTHON"))}
    return env


def test_twine_check_strict_passes(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    version = singleton.__version__
    assert names == [
        f"singleton_election-{version}-py3-none-any.whl",
        f"singleton_election-{version}.tar.gz",
    ]
    out = _run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())], dist
    )
    assert out.stdout.count("PASSED") == 2, out.stdout


def test_the_wheel_holds_both_packages_and_no_tests(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    assert "singleton/py.typed" in files and "listeners/py.typed" in files
    assert "singleton/stdlog.py" in files and "listeners/elasticsearch/sync.py" in files
    assert not [f for f in files if f.startswith(("tests/", "bench/", "docs/"))]
    metadata = zipfile.ZipFile(wheel).read(
        f"singleton_election-{singleton.__version__}.dist-info/METADATA"
    )
    assert b"Provides-Extra: elasticsearch" in metadata and b"Provides-Extra: demo" in metadata


def test_version_from_the_installed_wheel(fresh_venv: Path, tmp_path: Path) -> None:
    out = _run([str(fresh_venv / "bin" / "singleton"), "--version"], tmp_path, env=_clean_env())
    assert out.stdout.strip() == f"singleton {singleton.__version__}"
    where = _run(
        [
            str(fresh_venv / "bin" / "python"),
            "-c",
            "import singleton, listeners; print(singleton.__file__, listeners.__file__)",
        ],
        tmp_path,
        env=_clean_env(),
    )
    assert str(ROOT) not in where.stdout and str(fresh_venv) in where.stdout, where.stdout


def test_demo_from_the_installed_wheel(fresh_venv: Path, tmp_path: Path) -> None:
    argv = [str(fresh_venv / "bin" / "singleton"), "demo", "--duration", "15", "--replicas", "2"]
    out = _run([*argv, "--quiet", "--workdir", str(tmp_path / "demo")], tmp_path, 300, _clean_env())
    text = out.stdout + out.stderr
    assert str(ROOT) not in text.replace(str(tmp_path), ""), "the source tree leaked into the run"
    assert "verdict: PASS" in text, text[-2000:]
