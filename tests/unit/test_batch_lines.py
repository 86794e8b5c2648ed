"""A batch file's line (`prune run --input`) is read as the Python API reads a call: its
fields other than id, question, passages and context go through `CallOptions.of`, so a
misspelt option is that line's error, not a silent default; a line that is not JSON is
faulted where it goes wrong, in the line's own columns."""

from __future__ import annotations

import io
import json

import pytest

from engine.errors import InputError
from engine.pipeline.inputs import CallOptions
from engine.batchfile import LineError, parse_line, run_file

pytestmark = pytest.mark.unit

GOOD = {"id": "a", "question": "Who built it?", "passages": ["It was built in 1923."]}


def test_a_misspelt_option_is_the_lines_error_as_in_python():
    with pytest.raises(InputError) as python:
        CallOptions.of(treshold=0.2)
    with pytest.raises(LineError) as line:
        parse_line(json.dumps({**GOOD, "treshold": 0.2}), 3)
    assert str(line.value) == str(python.value) and "unknown option 'treshold'" in str(line.value)
    assert line.value.ident == "a"  # the line's own id
    _, query = parse_line(json.dumps({**GOOD, "threshold": 0.2}), 3)
    assert query["options"].threshold == 0.2
    for typo in ("top-k", "passage_margins", "lexical_wieght", "Threshold"):
        with pytest.raises(LineError, match="unknown option"):
            parse_line(json.dumps({**GOOD, typo: 1}), 3)
    # an evaluation file's own fields are its data, not options (tests/data/*.jsonl carry them)
    _, query = parse_line(
        json.dumps({**GOOD, "answers": ["1923"], "labels": [1], "gold": 0, "source": "x"}), 3
    )
    assert query["options"] == CallOptions()


def test_a_misspelt_option_gets_an_error_record_and_the_other_lines_run():
    class Echo:
        """Answers each query with no results (the reading is what is tested)."""

        def prune_many(self, queries):
            return [[] for _ in queries]

    lines = [
        json.dumps(GOOD),
        json.dumps({**GOOD, "id": "typo", "treshold": 0.2}),
        json.dumps({**GOOD, "id": "c"}),
    ]
    sink = io.StringIO()
    stats = run_file(Echo(), io.StringIO("\n".join(lines) + "\n"), sink, progress=False)
    got = [json.loads(r) for r in sink.getvalue().splitlines()]
    assert stats["errors"] == 1 and [g["id"] for g in got] == ["a", "typo", "c"]
    assert got[1] == {"id": "typo", "line": 2, "error": got[1]["error"]}
    assert got[1]["error"].startswith("unknown option 'treshold'; the options are threshold, ")


@pytest.mark.parametrize(
    "text,where",
    [
        (
            '{"question": "q", "passages": ["a"]\n',
            "expecting ',' delimiter at column 36, the end of the line",
        ),
        (
            '{"question": "q", "passages": ["a"]\r\n',
            "expecting ',' delimiter at column 36, the end of the line",
        ),
        (
            '{"question": "q", "passages": ["a"],}\n',
            "expecting property name enclosed in double quotes at column 37",
        ),
        ('{"question": "q"} extra\n', "extra data at column 19"),
        ("{not json\n", "expecting property name enclosed in double quotes at column 2"),
        (
            '{"question": "a\tb"}\n',
            "invalid control character at column 16",
        ),  # json's own: "Invalid ... at at"
        ('{"question": "q', "unterminated string starting at column 14"),  # a last line without its newline
    ],
)
def test_a_json_error_points_at_its_column_in_the_line(text, where):
    """json's own position counts the line's newline: a line cut short was faulted at
    "line 2 column 1"."""
    with pytest.raises(LineError) as err:
        parse_line(text, 5)
    assert str(err.value) == f"not valid JSON: {where}" and err.value.ident == 5


def test_a_data_files_json_error_points_at_its_column_too(tmp_path):
    from engine.datafiles import read_jsonl

    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "q"}\n{"question": "q", "passages": ["a"]\n')
    with pytest.raises(
        ValueError,
        match=r"data.jsonl: line 2: not valid JSON: expecting ',' delimiter at column 36, "
        r"the end of the line$",
    ):
        list(read_jsonl(path))
    path.write_text('{"text": "ok"}\n\n{"text": "a\tb"}\n')  # a tab inside a string: the case
    with pytest.raises(
        ValueError, match=r"data.jsonl: line 3: not valid JSON: invalid control character at column 12$"
    ):
        list(read_jsonl(path))
