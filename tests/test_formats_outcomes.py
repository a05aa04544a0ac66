"""Outcomes side files: JSON, JSONL, CSV, SWE-bench reports; errors name file, record and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceops.errors import InputError
from traceops.formats import load_outcomes
from traceops.schema import Outcome

FIXTURES = Path(__file__).parent / "fixtures" / "formats" / "outcomes"


def test_swebench_report_marks_listed_ids() -> None:
    table = load_outcomes(FIXTURES / "swebench_report.json")
    assert table == {
        "django__django-16255": Outcome(success=True, reward=1.0),
        "django__django-10999": Outcome(success=False, reward=0.0),
        "sympy__sympy-20590": Outcome(success=False, reward=0.0),
    }


def test_results_summary_csv_and_jsonl() -> None:
    summary = load_outcomes(FIXTURES / "mini_swe_agent_results.json")
    assert summary["django__django-16255"].success is True
    assert summary["django__django-10999"].success is False
    csv_table = load_outcomes(FIXTURES / "outcomes.csv")
    assert csv_table["retail_001"] == Outcome(success=True, reward=1.0)
    assert csv_table["retail_002"] == Outcome(success=False, reward=0.0)
    assert csv_table["retail_003"] == Outcome(success=False, reward=0.5)  # reward only: success = reward >= 1
    jsonl = load_outcomes(FIXTURES / "outcomes.jsonl")
    assert jsonl == {"retail_001": Outcome(success=True, reward=1.0),
                     "retail_002": Outcome(success=False, reward=0.0)}


def test_mapping_and_record_list(tmp_path: Path) -> None:
    mapping = tmp_path / "m.json"
    mapping.write_text('{"a": true, "b": 0.5, "c": {"resolved": "no"}}')
    assert load_outcomes(mapping) == {"a": Outcome(success=True, reward=1.0),
                                      "b": Outcome(success=False, reward=0.5),
                                      "c": Outcome(success=False, reward=0.0)}
    records = tmp_path / "r.json"
    records.write_text('[{"task_id": 7, "success": 1}]')
    assert load_outcomes(records) == {"7": Outcome(success=True, reward=1.0)}


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("missing.json", None, "does not exist"),
    ("empty.json", "  \n", "empty"),
    ("bad.json", '{"a": ', "malformed JSON"),
    ("noid.jsonl", '{"resolved": true}\n', "field 'id'"),
    ("badbool.csv", "instance_id,resolved\nx,maybe\n", "record 2, field 'resolved'"),
    ("nothing.jsonl", '{"id": "x"}\n', "no outcome"),
])
def test_errors_name_the_problem(tmp_path: Path, name: str, text: str | None, expected: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(InputError) as error:
        load_outcomes(path)
    assert expected in str(error.value) and name in str(error.value)
