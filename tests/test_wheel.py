"""The built wheel carries what `prune repository` needs (the python-backend templates),
and a repository written from the installed files, outside the source tree, is whole."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_templates_and_repository_works_from_it(exported, tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("prune_engine-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"triton_models/python_onnxruntime/model.py", "triton_models/python_text/model.py",
            "engine/py.typed"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = ("import sys, triton_models, engine; "
            f"assert triton_models.__file__.startswith({str(site)!r}), triton_models.__file__; "
            "from engine.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "repository", "--model", str(exported["opensearch"]),
                           "--out", "repo"], cwd=work, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for model in ("opensearch", "opensearch_text"):
        assert (work / "repo" / model / "1" / "model.py").is_file()
    assert (work / "repo" / "opensearch_text" / "1" / "tokenizer.json").is_file()
