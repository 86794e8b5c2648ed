"""What a new user naturally tries next (#27): each gets the right behaviour or a clear
error, never a raw traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.cli import main
from tests.utils import DATA

pytestmark = pytest.mark.inprocess


def test_fidelity_finds_the_reference_from_another_folder(checkpoints, tmp_path, monkeypatch, capsys):
    """The manifest's source is stored absolute, so `prune fidelity` run elsewhere finds it."""
    shutil.copytree(checkpoints["opensearch"], tmp_path / "ck")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--model", "ck", "--out", "ex", "-q"]) == 0
    manifest = json.loads((tmp_path / "ex" / "manifest.json").read_text())
    assert manifest["source"]["checkpoint"] == str((tmp_path / "ck").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code = main(
        [
            "fidelity",
            "--model",
            str(tmp_path / "ex"),
            "--data",
            str(DATA / "squad-dev-prune.jsonl"),
            "--limit",
            "2",
            "--no-progress",
            "-q",
        ]
    )
    assert code == 0, capsys.readouterr().err


def test_fidelity_without_its_reference_says_to_pass_it(exported, tmp_path, capsys):
    """An export whose source has moved (or an older manifest with a relative path)."""
    folder = tmp_path / "ex"
    shutil.copytree(exported["opensearch"], folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["source"]["checkpoint"] = "build/test-checkpoints/opensearch"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code = main(
        ["fidelity", "--model", str(folder), "--data", str(DATA / "squad-dev-prune.jsonl"), "--limit", "1"]
    )
    err = capsys.readouterr().err
    assert (
        code == 2 and "'build/test-checkpoints/opensearch'" in err and "pass --reference CHECKPOINT" in err
    ), err


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["eval", "--data", str(DATA / "squad-dev-rag.jsonl")],
            "record 1 lacks context, sentences, labels: not a sentence-labelled prune file (each line holds question, "
            "context, sentences, labels); it looks like a RAG file (for prune eval --rag-data, prune bench --data)",
        ),
        (
            [
                "eval",
                "--data",
                str(DATA / "squad-dev-prune.jsonl"),
                "--rag-data",
                str(DATA / "squad-dev-prune.jsonl"),
            ],
            "record 1 lacks passages, gold: not a RAG file (each line holds question, passages, gold); it looks like "
            "a sentence-labelled prune file (for prune eval --data, prune fidelity --data)",
        ),
        (
            ["bench", "--data", str(DATA / "squad-dev-prune.jsonl")],
            "record 1 lacks passages, gold: not a RAG file",
        ),
    ],
)
def test_a_swapped_data_file_is_named_for_what_it_is(args, message, exported, capsys):
    code = main(
        [*args, "--model", str(exported["opensearch"]), "-q"]
        if args[0] != "bench"
        else [*args, "--model", str(exported["opensearch"]), "--int8", str(exported["opensearch"]), "-q"]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_an_int8_export_under_quiet_prints_nothing(checkpoints, tmp_path):
    """ONNX Runtime's advice to pre-process before quantizing and its embedding-fusion note
    are expected here: -q shows neither (nor anything else but errors)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "export",
            "--model",
            str(checkpoints["opensearch"]),
            "--out",
            str(tmp_path / "q"),
            "--precision",
            "int8",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "", proc.stderr


def test_a_checkpoint_given_as_an_exported_model_says_how_to_export_it(checkpoints):
    from engine.errors import ModelLoadError
    from engine.pruner import Pruner

    ck = checkpoints["opensearch"]
    with pytest.raises(ModelLoadError) as err:
        Pruner.load(ck)
    msg = str(err.value)
    assert "is a checkpoint, not an exported model" in msg and f"--out {ck.name}-onnx" in msg
    assert "--backend torch" in msg and "overwrite=" not in msg


def test_progress_counts_are_plural_only_when_they_should_be(pruners, capsys):
    import io
    from engine.batchfile import run_file

    lines = '{"question": "q?", "passages": ["A."]}\n{"question": 5, "passages": ["A."]}\n'
    run_file(pruners["opensearch"][0], io.StringIO(lines), io.StringIO(), progress=True)
    err = capsys.readouterr().err
    assert "2 lines, 1 error, 1 passage in " in err, err
