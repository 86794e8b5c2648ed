"""The suite under pytest-xdist's workers (the README's `-n auto`): a session's test models
are built once for all workers (tests.utils.built_once), and once per call in one process;
a module's tests run on one worker (pyproject's `--dist`), so its fixtures are built once."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from tests.utils import built_once

pytestmark = pytest.mark.unit


class _Factory:
    """What built_once asks of pytest's tmp_path_factory, for one worker of a run."""

    def __init__(self, base: Path):
        self.base, self.made = base, 0

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:
        self.made += 1
        folder = self.base / f"{name}{self.made}"
        folder.mkdir(parents=True)
        return folder


def test_workers_build_a_session_folder_once_and_all_get_it(tmp_path, monkeypatch):
    builds: list[Path] = []

    def build(folder: Path) -> None:
        builds.append(folder)
        time.sleep(0.3)  # the other worker asks meanwhile
        (folder / "model.onnx").write_text("weights")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    got: dict[str, Path] = {}
    workers = [
        threading.Thread(
            target=lambda w=w: got.__setitem__(w, built_once(_Factory(tmp_path / w), "onnx", build))
        )
        for w in ("popen-gw0", "popen-gw1")
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(builds) == 1 and got["popen-gw0"] == got["popen-gw1"] == tmp_path / "onnx"
    assert (tmp_path / "onnx" / "model.onnx").read_text() == "weights"
    assert (
        built_once(_Factory(tmp_path / "popen-gw2"), "onnx", build) == tmp_path / "onnx" and len(builds) == 1
    )

    def broken(folder: Path) -> None:
        (folder / "half").write_text("")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError):
        built_once(_Factory(tmp_path / "popen-gw0"), "ov", broken)
    assert built_once(_Factory(tmp_path / "popen-gw1"), "ov", build) == tmp_path / "ov"  # built again, whole
    assert not (tmp_path / "ov" / "half").exists() and len(builds) == 2


def test_one_process_builds_each_time_in_a_new_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory, builds = _Factory(tmp_path), []
    a = built_once(factory, "onnx", builds.append)
    b = built_once(factory, "onnx", builds.append)
    assert builds == [a, b] and a != b


MODULE = """
import os
import re
import shlex
from pathlib import Path
import pytest

@pytest.mark.parametrize("n", range(6))
def test_where(n):
    Path(__file__).with_name("ran").joinpath(f"{Path(__file__).stem}-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_modules_tests_run_on_one_worker(tmp_path):
    """The project's addopts on two workers: each module's six tests on one worker (pytest 9.2
    silently ignores pytest-xdist 3.8's `--dist loadgroup` groups, pytest-xdist#1386, and
    spreads a module over the workers; the same must not befall the project's `--dist`)."""
    root = Path(__file__).resolve().parents[2]
    addopts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    (tmp_path / "ran").mkdir()
    for name in ("test_a", "test_b"):
        (tmp_path / f"{name}.py").write_text(MODULE)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            *shlex.split(addopts),
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    workers = {}
    for f in (tmp_path / "ran").iterdir():
        workers.setdefault(f.name.split("-")[0], set()).add(f.read_text())
    assert set(workers) == {"test_a", "test_b"} and all(len(w) == 1 for w in workers.values()), workers


CRASHING = """
import os
import re
import shlex
import signal
import time


def test_dies():
    os.kill(os.getpid(), signal.SIGKILL)


def test_waits():
    time.sleep(1)
"""


def test_a_crashed_worker_ends_the_run_and_says_how_it_died(tmp_path):
    """A worker killed mid-test (what a segfault or an outside SIGKILL does): the run ends
    there, failed (no replacement worker, which pytest-xdist 3.8 was seen waiting on forever),
    and prints the worker's pid and the signal that killed it (tests/xdist_crash.py)."""
    root = Path(__file__).resolve().parents[2]
    addopts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    (tmp_path / "test_crash.py").write_text(CRASHING)
    (tmp_path / "conftest.py").write_text("from tests.xdist_crash import pytest_testnodedown  # noqa: F401\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            *shlex.split(addopts),
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert re.search(r"\[gw\d\] worker pid \d+ killed by SIGKILL", out), out[-3000:]
    # no replacement worker goes on with the crashed worker's tests (--max-worker-restart 0)
    assert re.search(r"^1 failed in ", out, re.M) and "passed" not in out, out[-3000:]
