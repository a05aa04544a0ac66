"""Format detection, folder walking and every kind of bad input: one item per record, never a raise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from traceops.errors import ConfigError, InputError
from traceops.formats import FORMATS, MAX_RECORD_BYTES, Rejected, detect_format, iter_items, write_jsonl
from traceops.schema import Trajectory

FIXTURES = Path(__file__).parent / "fixtures" / "formats"
GOOD = {"task_id": "t",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def _line(record: dict) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _record(item: Trajectory | Rejected) -> int | str:
    return item.source.record if isinstance(item, Trajectory) else item.record


def test_formats_constant() -> None:
    assert FORMATS == ("auto", "openai", "tau2", "swe", "otel")


@pytest.mark.parametrize(("relative", "expected"), [
    ("openai/trajectories.jsonl", "openai"),
    ("openai/call_log.jsonl", "openai"),
    ("openai/single_call.json", "openai"),
    ("tau2/airline_results.json", "tau2"),
    ("tau2_dir/simulations/5f1c2a9e-0001.json", "tau2"),
    ("mini_swe_agent/django__django-10999.unresolved.traj.json", "swe"),
    ("swe_agent/marshmallow-code__marshmallow-1867.traj", "swe"),
    ("otel/otlp_traces.json", "otel"),
    ("otel/sdk_spans.json", "otel"),
    ("outcomes/outcomes.csv", None),
])
def test_detect_format_by_content(relative: str, expected: str | None) -> None:
    assert detect_format(FIXTURES / relative) == expected


def test_detection_does_not_rely_on_file_names(tmp_path: Path) -> None:
    for relative, name in [("tau2/airline_results.json", "a.data"),
                           ("mini_swe_agent/django__django-16255.resolved.traj.json", "b.data"),
                           ("otel/otlp_traces.json", "c.data"), ("openai/trajectories.jsonl", "d.data")]:
        shutil.copy(FIXTURES / relative, tmp_path / name)
    assert [detect_format(p) for p in sorted(tmp_path.iterdir())] == ["tau2", "swe", "otel", "openai"]


def test_mixed_folder_sorted_recursive_and_hidden_skipped(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".cache").mkdir()
    shutil.copy(FIXTURES / "openai/trajectories.jsonl", tmp_path / "b" / "chat.jsonl")
    shutil.copy(FIXTURES / "tau2/airline_results.json", tmp_path / "a_results.json")
    shutil.copy(FIXTURES / "openai/trajectories.jsonl", tmp_path / ".cache" / "old.jsonl")
    shutil.copy(FIXTURES / "openai/trajectories.jsonl", tmp_path / ".hidden.jsonl")
    items = list(iter_items([tmp_path]))
    assert [(Path(item.source.file).name, item.source.format) for item in items] == (
        [("a_results.json", "tau2")] * 2 + [("chat.jsonl", "openai")] * 3)


def test_forced_format_applies_to_every_file() -> None:
    items = list(iter_items([FIXTURES / "openai" / "trajectories.jsonl"], fmt="openai"))
    assert len(items) == 3 and all(isinstance(item, Trajectory) for item in items)
    (rejected,) = list(iter_items([FIXTURES / "otel" / "sdk_spans.json"], fmt="tau2"))
    assert isinstance(rejected, Rejected) and rejected.record == "file"


def test_missing_path_raises_before_anything_is_read(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_bytes(_line(GOOD))
    with pytest.raises(InputError) as error:
        iter_items([good, tmp_path / "nope"])  # raised at call time, not on first iteration
    assert "nope" in str(error.value)


def test_a_single_path_string_is_one_path() -> None:
    items = list(iter_items(str(FIXTURES / "openai" / "trajectories.jsonl")))
    assert len(items) == 3


def test_unknown_format_is_a_config_error_listing_valid_ones() -> None:
    with pytest.raises(ConfigError) as error:
        iter_items([FIXTURES], fmt="csv")
    assert "auto, openai, tau2, swe, otel" in str(error.value)


def test_jsonl_bad_lines_each_give_one_rejection(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        _line(GOOD)                                       # 1 ok
        + b'{"task_id": "x", "messages": [\n'             # 2 malformed
        + b"\n"                                           # 3 blank: not a record
        + b'{"task_id": "caf\xe9", "messages": []}\n'     # 4 not UTF-8
        + b'{"task_id":   "y" ,"note": "\\u00e9"}\n'         # 5 missing messages
        + _line({**GOOD, "messages": [{"role": "bot"}]})   # 6 unknown role
        + b"[1, 2]\n"                                      # 7 not an object
        + b'{"task_id": "z", "messages": [{"role": "us')  # 8 truncated last line
    items = list(iter_items([path]))
    assert [_record(item) for item in items] == [1, 2, 4, 5, 6, 7, 8]
    assert isinstance(items[0], Trajectory)
    rejected = items[1:]
    assert all(isinstance(item, Rejected) and item.file == str(path) for item in rejected)
    assert "malformed JSON" in rejected[0].reason and rejected[0].raw == '{"task_id": "x", "messages": ['
    assert "not valid UTF-8" in rejected[1].reason
    assert rejected[1].raw == '{"task_id": "caf\\xe9", "messages": []}'
    assert rejected[2].field == "messages" and rejected[2].raw == '{"task_id":   "y" ,"note": "\\u00e9"}'
    assert rejected[3].field == "messages[0].role" and "'bot'" in rejected[3].reason
    assert "JSON object" in rejected[4].reason
    assert "truncated" in rejected[5].reason and rejected[5].raw.endswith('"us')
    assert all(f"record {item.record}" in item.message() for item in rejected)


def test_truncated_and_non_utf8_documents_are_one_rejection(tmp_path: Path) -> None:
    text = (FIXTURES / "tau2" / "airline_results.json").read_text()
    truncated = tmp_path / "results.json"
    truncated.write_text(text[: len(text) // 2])
    binary = tmp_path / "run.traj"
    binary.write_bytes(b'{"history": [{"role": "user", "content": "\xff\xfe"}]}')
    items = list(iter_items([truncated, binary]))
    assert len(items) == 2 and all(isinstance(item, Rejected) for item in items)
    assert "truncated JSON" in items[0].reason and items[0].raw == text[: len(text) // 2]
    assert "not valid UTF-8" in items[1].reason and "\\xff\\xfe" in items[1].raw


def test_empty_and_unrecognized_files(tmp_path: Path) -> None:
    (tmp_path / "a_empty.jsonl").write_bytes(b"")
    (tmp_path / "b_blank.json").write_bytes(b"  \n\n ")
    (tmp_path / "c_notes.txt").write_text("hello, these are notes\n")
    (tmp_path / "d_other.json").write_text('{"rows": [1, 2, 3]}')
    items = list(iter_items([tmp_path]))
    assert len(items) == 4 and all(isinstance(item, Rejected) and item.record == "file" for item in items)
    assert ["empty" in item.reason for item in items] == [True, True, False, False]
    assert "no reader recognizes" in items[2].reason and items[2].raw == "hello, these are notes\n"
    empty_forced = list(iter_items([tmp_path / "a_empty.jsonl"], fmt="openai"))
    assert len(empty_forced) == 1 and "empty" in empty_forced[0].reason


def test_record_over_the_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    huge = {**GOOD, "messages": [{"role": "user", "content": "x" * (MAX_RECORD_BYTES + 10)}]}
    path.write_bytes(_line(GOOD) + _line(huge) + _line(GOOD))
    items = list(iter_items([path]))
    assert [type(item) for item in items] == [Trajectory, Rejected, Trajectory]
    assert _record(items[1]) == 2 and "record limit" in items[1].reason
    assert len(items[1].raw) == MAX_RECORD_BYTES


def test_collected_tau2_trajectories_are_read_back_as_openai(tmp_path: Path) -> None:
    # tau2 metadata (task_id, termination_reason) inside an OpenAI record must not look like tau2
    trajectories = [item for item in iter_items([FIXTURES / "tau2" / "airline_results.json"])]
    path = tmp_path / "collected.jsonl"
    write_jsonl(trajectories, path)
    assert detect_format(path) == "openai"
    back = list(iter_items([path]))
    assert [item.id for item in back] == [item.id for item in trajectories]


def test_a_cut_first_line_does_not_hide_the_format(tmp_path: Path) -> None:
    path = tmp_path / "rotated.log"
    path.write_bytes(b'ssages": [{"role": "user"}]}\n' + _line(GOOD) + _line(GOOD))
    assert detect_format(path) == "openai"
    items = list(iter_items([path]))
    assert [type(item) for item in items] == [Rejected, Trajectory, Trajectory]
    assert items[0].record == 1 and "malformed JSON" in items[0].reason
