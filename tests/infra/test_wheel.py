"""The wheel is complete: built from the sources, it holds every file of the packages (the
vendored CRD and discovery schemas, the data tables, the workloads' data and Dockerfile), and
installed into a clean virtualenv, with no checkout in reach, `park validate dev` passes using
the vendored schemas.

Offline, the clean virtualenv gets the wheel alone (``--no-deps``); its dependencies are this
environment's, reached through a ``.pth`` file (a path entry: this environment's own install
of park-gke, an editable one, is not activated by it). Built and installed by hand::

    pip wheel --no-deps --no-build-isolation -w dist .
    python -m venv --without-pip /tmp/clean
    pip --python /tmp/clean/bin/python install --no-deps dist/park_gke-*.whl
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, STACKS_DIR

pytestmark = pytest.mark.e2e

PACKAGES = ("infra", "workloads", "park_gke")  # pyproject.toml's packages.find include
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", *PACKAGES)
NOT_SHIPPED = ("__pycache__",)


def _package_files() -> set[str]:
    """Every file under the packages' folders, as paths inside the wheel."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*")
        if path.is_file()
        and not set(path.relative_to(ROOT).parts) & set(NOT_SHIPPED)
        and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built offline from a copy of the sources (the build writes beside them)."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
        else:
            shutil.copy2(origin, source / name)
    dist = tmp_path_factory.mktemp("dist")
    offline = ("--no-deps", "--no-build-isolation", "--no-index")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, "-q", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = dist.glob("park_gke-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_packages(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = sorted(_package_files() - names)
    assert not missing, f"{len(missing)} files left out of the wheel: {missing}"
    # The folders whose names hold dots (setuptools does not take them for packages).
    assert "infra/schemas/kuberay-v1.7.0/ray.io_rayjobs.yaml" in names


def test_park_validate_runs_from_the_installed_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "clean"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # No checkout in reach, for pip too: with this checkout on PYTHONPATH, pip would find its
    # park_gke.egg-info there, call the wheel installed already and install nothing.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    done = subprocess.run(
        [*install, "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "park_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # A user's project: its own stacks/ folder, no checkout, no PYTHONPATH.
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    shutil.copy2(STACKS_DIR / "Pulumi.dev.yaml", project / "stacks")

    where = subprocess.run(
        [str(python), "-c", "import infra, workloads; print(infra.__file__, workloads.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(Path(f).is_relative_to(site) for f in where), where  # the wheel's, not ours

    done = subprocess.run(
        [str(venv / "bin" / "park"), "validate", "dev"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "against vendored CRD schemas" in out and "dev: valid" in out
    assert "ok serve:" in out  # Ray Serve's own check, run by the installed workloads
