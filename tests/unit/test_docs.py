"""Every `prune` command the README and docs/ show exists: full commands in code blocks parse
with the real argument parser, and every option named in an inline `prune ...` span is one
of that subcommand's options. Every `python -m` module they name exists, and every relative
link points at a file in the repository."""

import re
import shlex
from importlib.util import find_spec
from pathlib import Path

import pytest

from engine.cli import build_parser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_block_lines(text: str):
    code, pending = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            code, pending = not code, ""
            continue
        if code:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield pending + line
            pending = ""


def _command(line: str) -> list[str] | None:
    line = re.sub(r"^\s*(\$ )?([A-Z_]+=\S+ )*", "", line)
    if not line.startswith("prune ") or re.match(r"prune [\w-]+: ", line):  # "prune api: ..." is output
        return None
    words = shlex.split(line, comments=True)
    for stop in ("|", ">", "&&", ";", "&"):
        if stop in words:
            words = words[: words.index(stop)]
    return words[1:]


def _commands():
    for page in PAGES:
        for line in _code_block_lines(page.read_text()):
            words = _command(line)
            if words:
                yield pytest.param(words, id=f"{page.name}:{' '.join(words)[:60]}")


@pytest.mark.parametrize("words", list(_commands()))
def test_documented_command_parses(words):
    parser = build_parser()
    try:
        parser.parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"prune {' '.join(words)} does not parse (exit {exc.code})")


def _subcommand_options() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}


def test_inline_commands_name_real_options():
    options = _subcommand_options()
    bad = []
    for page in PAGES:
        for span in re.findall(r"`(prune [^`]+)`", page.read_text()):
            words = span.split()
            if len(words) < 2:
                continue
            if words[1] not in options:
                if not words[1].startswith("-"):
                    bad.append(f"{page.name}: `{span}`: no subcommand {words[1]}")
                continue
            for w in words[2:]:
                for opt in w.split("=")[0].rstrip(",.;)").split("/"):  # `--input/--output`
                    opt = opt if opt.startswith("-") or not w.startswith("--") else "--" + opt
                    if opt.startswith("--") and opt not in options[words[1]]:
                        bad.append(f"{page.name}: `{span}`: prune {words[1]} has no {opt}")
    assert not bad, "\n".join(bad)


def test_documented_modules_and_links_exist():
    bad = []
    for page in PAGES:
        text = page.read_text()
        for mod in re.findall(r"python -m ([\w.]+)", text):
            if mod not in ("pip", "venv", "pytest") and find_spec(mod) is None:
                bad.append(f"{page.name}: python -m {mod}: no such module")
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if "://" not in link and not (page.parent / link).exists():
                bad.append(f"{page.name}: link {link}: no such file")
    assert not bad, "\n".join(bad)


def test_markdown_tables_are_well_formed():
    """In every page and committed report, a table's header, separator and rows have the
    same number of columns (a short separator renders as no table at all)."""
    import re

    pages = (
        sorted(ROOT.glob("docs/*.md"))
        + sorted(ROOT.glob("benchmarks/results/**/*.md"))
        + [ROOT / "README.md"]
    )
    bad = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i in range(1, len(lines)):
            if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i].strip()) and lines[i - 1].lstrip().startswith(
                "|"
            ):
                width = lines[i].strip().count("|")
                header = lines[i - 1].strip().replace("\\|", "").count("|")
                if header != width:
                    bad.append(
                        f"{page.relative_to(ROOT)}:{i}: header {header - 1} columns, separator {width - 1}"
                    )
    assert not bad, "\n".join(bad)


def test_recorded_commands_paste_into_a_shell():
    """A report's command line (the line after `Command:`) has its shell characters quoted,
    so it runs as recorded when pasted (reports write it with shlex.join)."""
    import re

    bad = []
    for page in sorted(ROOT.glob("benchmarks/results/**/*.md")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"Command:\s*\n\s*```\n(.+?)\n```|Command: `(.+?)`", text):
            command = m.group(1) or m.group(2)
            bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", command)
            if re.search(r"[*?()\[\]{}|&;<>`]", bare):
                bad.append(f"{page.relative_to(ROOT)}: {command}")
    assert not bad, "\n".join(bad)


#: the flags whose value a documented command reads from the disk, and those it writes
READS = (
    "--model",
    "--data",
    "--rag-data",
    "--input",
    "--reference",
    "--int8",
    "--fp16",
    "--ov-int8",
    "--bench",
    "--model-repository",
    "--passages-file",
    "--context-file",
    "--checkpoint",
    "--calibration",
    "--gate-data",
    "--rag",
    "--prune-data",
    "--peer-python",
    "--tokenizer",
    "--encoder",
)
WRITES = ("--out", "--output", "--db")
LOCAL = ("build/", "tests/", "examples/", "benchmarks/", "deploy/", "docs/", "./", "../", "~/", "/")


def _reads_and_writes(line: str) -> tuple[list[str], list[str]] | None:
    """(paths read, paths written) of a `prune` or `python -m` command line, None for others."""
    line = re.sub(r"^\s*(\$ )?([A-Z_]+=\S+ )*", "", line)
    if not line.startswith(("prune ", "python -m ", "python3 -m venv ")):
        return None
    words = shlex.split(line, comments=True)
    if words[:3] == ["python3", "-m", "venv"]:
        return [], [w for w in words[3:] if not w.startswith("-")][:1]
    pairs = list(zip(words, words[1:]))
    return [v for f, v in pairs if f in READS], [v for f, v in pairs if f in WRITES]


def test_documented_commands_read_files_a_fresh_clone_has():
    """What a code block's command reads (--data, --model, ...) is in the repository, or an
    earlier command of the same page writes it (or a folder above it), or a venv a page makes:
    a new user who runs a page's commands in order from a fresh clone finds every file.
    Placeholders (CHECKPOINT, docs.jsonl: no folder), `default` and hub ids (org/name) pass;
    nothing points outside the clone (`../shared/...`)."""
    venvs = {
        w
        for page in PAGES
        for line in _code_block_lines(page.read_text())
        for w in ((_reads_and_writes(line) or ([], []))[1] if "venv" in line else [])
    }
    bad = [
        f"{page.name}: names ../shared/, which a clone does not have"
        for page in PAGES
        if "../shared/" in page.read_text()
    ]
    for page in PAGES:
        made = set(venvs)
        for line in _code_block_lines(page.read_text()):
            found = _reads_and_writes(line)
            if found is None:
                continue
            reads, writes = found
            for path in reads:
                if path.startswith(("../", "/")):  # outside the clone (there may be one here)
                    bad.append(f"{page.name}: {line.strip()[:80]}...: reads {path}, outside a clone")
                elif (
                    path.startswith(LOCAL)
                    and not (ROOT / path).exists()
                    and not any(path == m or path.startswith(m.rstrip("/") + "/") for m in made)
                ):
                    bad.append(f"{page.name}: {line.strip()[:80]}...: reads {path}, which nothing made")
            made.update(writes)
    assert not bad, "\n".join(bad)


def test_the_cpu_set_up_names_the_pinned_torch_on_its_cpu_index():
    """A CPU set-up stays CPU-only on a plain index (pypi.org, whose Linux torch wheels pull the
    CUDA libraries): the README and docs/installing.md install the pinned torch from PyTorch's CPU
    index first, at the version pyproject pins (a pin moved without them fails here)."""
    pins = re.findall(r'"(torch==[^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert len(pins) == 1, pins
    line = f"pip install {pins[0]} --index-url https://download.pytorch.org/whl/cpu"
    for page in ("README.md", "docs/installing.md"):
        assert line in (ROOT / page).read_text(), f"{page} does not say `{line}`"


def test_the_readme_reads_in_two_minutes():
    """First contact only (#61): the README's prose, outside its commands, outputs and tables,
    is at most 550 words (about two minutes); details live on the docs pages it links."""
    prose, fenced = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("|"):
            prose.append(line)
    words = len(" ".join(prose).split())
    assert words <= 550, (
        f"the README's prose is {words} words; move what is not first contact to its docs page"
    )


def test_the_capacity_examples_pasted_output(capsys, monkeypatch):
    """docs/scaling.md's `prune capacity` run on a committed bench.json: what it pastes is
    what the command prints now, line for line (no model: it is arithmetic)."""
    from engine.cli import main

    block = next(
        b
        for b in _fenced_blocks((ROOT / "docs" / "scaling.md").read_text())
        if b and b[0].startswith("$ prune capacity ")
    )
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(block[0][2:])[1:]) == 0
    assert capsys.readouterr().out.splitlines() == block[1:]


def _fenced_blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of `text`, each as its lines."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is not None:
                blocks.append(current)
            current = None if current is not None else []
        elif current is not None:
            current.append(line)
    return blocks


def _defaults(family: str) -> dict[str, float]:
    """A family's defaults as `/info` gives them: the threshold a call runs with, the
    threshold without the lexical fusion, the passage margin."""
    from engine.pipeline.families import FAMILIES
    from engine.pipeline.inputs import CallOptions

    rules = FAMILIES[family].rules
    resolved = rules.resolve(CallOptions())
    return {
        "threshold": resolved.threshold,
        "alone": rules.threshold_at(0.0),
        "margin": resolved.passage_margin,
    }


#: Every default a page states in prose, and where it comes from in the code: (page, a pattern
#: whose groups are the stated figures, what each group must equal). A page reworded so a
#: pattern no longer matches fails too: the claim is then moved here with it.
DOCUMENTED_DEFAULTS = [
    (
        "milvus.md",
        r"e\.g\. ([\d.]+) for the default model with its lexical fusion, ([\d.]+) for\s+OpenSearch's",
        [("embedding", "threshold"), ("opensearch", "threshold")],
    ),
    ("families.md", r"\| `provence` \|[^\n]*\| threshold ([\d.]+) \(", [("provence", "threshold")]),
    ("families.md", r"\| `xprovence` \|[^\n]*\| threshold ([\d.]+) \(", [("xprovence", "threshold")]),
    ("families.md", r"\| `opensearch` \|[^\n]*\| threshold ([\d.]+) \(", [("opensearch", "threshold")]),
    (
        "families.md",
        r"\| `embedding` \|[^\n]*\| threshold ([\d.]+) fused \(([\d.]+) with `lexical_weight 0`[^\n]*"
        r"best reranking score minus ([\d.]+)",
        [("embedding", "threshold"), ("embedding", "alone"), ("embedding", "margin")],
    ),
    (
        "integrations.md",
        r"threshold=([\d.]+)` and its passage gate `passage_margin=([\d.]+)`",
        [("embedding", "threshold"), ("embedding", "margin")],
    ),
    (
        "integrations.md",
        r"the default threshold \(([\d.]+) fused; ([\d.]+) for the model alone",
        [("embedding", "threshold"), ("embedding", "alone")],
    ),
]


@pytest.mark.parametrize(
    "page, pattern, sources", DOCUMENTED_DEFAULTS, ids=[f"{p}:{s[0][0]}" for p, _, s in DOCUMENTED_DEFAULTS]
)
def test_the_docs_defaults_are_the_codes(page, pattern, sources):
    """docs/milvus.md once said 0.87 (the model alone) where /info gives 0.83: a default a
    page states is the one the code resolves."""
    found = re.search(pattern, (ROOT / "docs" / page).read_text())
    assert found, f"{page}: the claim {pattern!r} is gone; update DOCUMENTED_DEFAULTS with the page"
    stated = [float(g) for g in found.groups()]
    assert stated == [_defaults(family)[what] for family, what in sources], (page, found.group(0))


#: where each page says what an LLMLingua-2 checkpoint's --precision auto tries (the paragraph)
LINGUA_AUTO_CLAIMS = [
    ("families.md", "`prune export` without `--precision` is `--precision auto` here too"),
    ("precisions.md", "An LLMLingua-2 checkpoint's auto chooses"),
    ("precisions.md", "An LLMLingua-2 checkpoint's `auto` (`export/lingua_auto.py`) has"),
]


@pytest.mark.parametrize(
    "page, start", LINGUA_AUTO_CLAIMS, ids=[f"{p}:{s[:30]}" for p, s in LINGUA_AUTO_CLAIMS]
)
def test_the_docs_name_lingua_autos_candidates_as_the_code_tries_them(page, start):
    """docs/families.md said fp16 and OpenVINO were not candidates of LLMLingua-2's auto, where the
    export tries OpenVINO's bf16 (export/lingua_auto.py): each page's paragraph names fp32, INT8 and
    ov-bf16 as candidates, and says nothing of the precisions the code does not try (NOT_TRIED)
    before it says they are not candidates."""
    from export.lingua_auto import NOT_TRIED

    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    paragraph = " ".join(text[text.index(start) :].split("\n\n")[0].split())
    tried = re.split(r"[Nn]ot candidates", paragraph)[0]
    for name in ("fp32", "INT8", "ov-bf16"):
        assert name in tried, (page, name, tried)
    for name in NOT_TRIED:  # fp16, ov-int8, ov-int8-bf16
        assert not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", tried), (page, name, tried)


def test_the_system_packages_ci_installs_are_documented_with_their_command():
    """.ci/run installs the Debian packages two tests need (libb64-0d for perf_analyzer's
    rehearsal, chromium for the page's browser tests); a fresh machine without it had only a
    skip to go by: docs/installing.md and docs/development.md give the apt-get command for each,
    and each test's skip names it."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    packages = re.findall(r"apt-get install -y -q (\S+)", ci)
    assert {"libb64-0d", "chromium"} <= set(packages), packages
    for page in ("installing.md", "development.md"):
        text = " ".join((ROOT / "docs" / page).read_text(encoding="utf-8").split())
        commands = [c.split() for c in re.findall(r"apt-get install ([\w .-]+)", text)]
        missing = [p for p in packages if not any(p in c for c in commands)]
        assert not missing, (page, missing)
    skips = "".join(
        (ROOT / "tests" / f).read_text(encoding="utf-8")
        for f in ("packaging/test_perf_analyzer.py", "server/test_page.py")
    )
    assert all(f"apt-get install {p}" in skips for p in packages), packages
