"""The suite under pytest-xdist's workers (the README's `-n auto`): a session's test models
are built once for all workers (tests.utils.built_once), and once per call in one process."""
from __future__ import annotations

import threading
import time
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
        time.sleep(0.3)                      # the other worker asks meanwhile
        (folder / "model.onnx").write_text("weights")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    got: dict[str, Path] = {}
    workers = [threading.Thread(target=lambda w=w: got.__setitem__(w, built_once(_Factory(tmp_path / w), "onnx", build)))
               for w in ("popen-gw0", "popen-gw1")]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(builds) == 1 and got["popen-gw0"] == got["popen-gw1"] == tmp_path / "onnx"
    assert (tmp_path / "onnx" / "model.onnx").read_text() == "weights"
    assert built_once(_Factory(tmp_path / "popen-gw2"), "onnx", build) == tmp_path / "onnx" and len(builds) == 1

    def broken(folder: Path) -> None:
        (folder / "half").write_text("")
        raise RuntimeError("export failed")
    with pytest.raises(RuntimeError):
        built_once(_Factory(tmp_path / "popen-gw0"), "ov", broken)
    assert built_once(_Factory(tmp_path / "popen-gw1"), "ov", build) == tmp_path / "ov"     # built again, whole
    assert not (tmp_path / "ov" / "half").exists() and len(builds) == 2


def test_one_process_builds_each_time_in_a_new_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory, builds = _Factory(tmp_path), []
    a = built_once(factory, "onnx", builds.append)
    b = built_once(factory, "onnx", builds.append)
    assert builds == [a, b] and a != b
