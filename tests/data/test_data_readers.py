"""rlhfkit.data.readers: every format, file:line errors, and fuzzing for crash-freedom."""

from __future__ import annotations

import gzip
import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfkit.data.readers import (
    Records,
    expect_float,
    expect_messages,
    expect_text,
    read_records,
    require_fields,
)
from rlhfkit.errors import DataError, UserError


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- JSONL


def test_jsonl_reads_objects_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a"}\n\n   \n{"prompt": "b", "answer": "#### 3"}\r\n')
    records = read_records(path)
    assert records == [{"prompt": "a"}, {"prompt": "b", "answer": "#### 3"}]
    assert records.where(0) == f"{path}:1"
    assert records.where(1) == f"{path}:4"


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c",}\n')
    with pytest.raises(DataError) as err:
        read_records(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:3: invalid JSON")
    assert "\n" not in msg


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a"}\n["not", "an", "object"]\n')
    with pytest.raises(DataError, match=r"p\.jsonl:2: expected a JSON object, got a list"):
        read_records(path)


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path):
    # U+2028 is legal inside a JSON string; str.splitlines would cut the line there.
    path = write(tmp_path, "p.jsonl", '{"prompt": "a\u2028b"}\n')
    assert read_records(path) == [{"prompt": "a\u2028b"}]


def test_gzipped_jsonl(tmp_path):
    path = write(tmp_path, "p.jsonl.gz", gzip.compress(b'{"prompt": "zipped"}\n'))
    assert read_records(path) == [{"prompt": "zipped"}]


def test_invalid_utf8_names_the_line(tmp_path):
    path = write(tmp_path, "p.jsonl", b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"p\.jsonl:2: not valid UTF-8"):
        read_records(path)


def test_utf8_bom_is_tolerated(tmp_path):
    path = write(tmp_path, "p.jsonl", b'\xef\xbb\xbf{"prompt": "a"}\n')
    assert read_records(path) == [{"prompt": "a"}]


# --------------------------------------------------------------------------- JSON


def test_json_list_of_objects(tmp_path):
    path = write(tmp_path, "p.json", json.dumps([{"prompt": "a"}, {"prompt": "b"}]))
    records = read_records(path)
    assert records == [{"prompt": "a"}, {"prompt": "b"}]
    assert records.where(1) == f"{path}: record 2"


def test_json_single_object_is_refused_and_an_object_of_columns_is_a_table(tmp_path):
    path = write(tmp_path, "p.json", '{"prompt": "only"}')  # one object is not a data set
    with pytest.raises(DataError, match="p.json: expected a JSON list of records, got one object"):
        read_records(path)
    path = write(tmp_path, "c.json", '{"prompt": ["a", "b"]}')  # columns, as `datasets` reads them
    assert read_records(path) == [{"prompt": "a"}, {"prompt": "b"}]


def test_json_file_holding_json_lines_is_read_as_jsonl(tmp_path):
    path = write(tmp_path, "p.json", '{"prompt": "a"}\n{"prompt": "b"}\n')
    records = read_records(path)
    assert records == [{"prompt": "a"}, {"prompt": "b"}]
    assert records.where(1) == f"{path}:2"


def test_json_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "p.json", '[\n  {"prompt": "a"},\n  {"prompt": }\n]')
    with pytest.raises(DataError, match=r"p\.json:3: invalid JSON"):
        read_records(path)


def test_json_wrong_shapes(tmp_path):
    with pytest.raises(DataError, match="expected a JSON list of objects, got a number"):
        read_records(write(tmp_path, "a.json", "42"))
    with pytest.raises(DataError, match=r"record 2: expected a JSON object, got a string"):
        read_records(write(tmp_path, "b.json", '[{"prompt": "a"}, "b"]'))


def test_deeply_nested_json_is_a_data_error(tmp_path):
    with pytest.raises(DataError):
        read_records(write(tmp_path, "deep.jsonl", "[" * 100_000))


# --------------------------------------------------------------------------- CSV / TSV / TXT


def test_csv_with_header_and_multiline_quoted_field(tmp_path):
    text = 'prompt,answer\n"What is 2 + 2?",4\n\n"A prompt\nover two lines",5\nlast,6\n'
    path = write(tmp_path, "p.csv", text)
    records = read_records(path)
    assert records == [
        {"prompt": "What is 2 + 2?", "answer": "4"},
        {"prompt": "A prompt\nover two lines", "answer": "5"},
        {"prompt": "last", "answer": "6"},
    ]
    assert [records.where(i) for i in range(3)] == [f"{path}:2", f"{path}:4", f"{path}:6"]


def test_csv_row_with_wrong_field_count(tmp_path):
    path = write(tmp_path, "p.csv", "prompt,answer\nok,1\ntoo,many,fields\n")
    with pytest.raises(DataError, match=r"p\.csv:3: 3 fields, expected 2"):
        read_records(path)


def test_csv_duplicate_header(tmp_path):
    with pytest.raises(DataError, match=r"p\.csv:1: duplicate column name 'prompt'"):
        read_records(write(tmp_path, "p.csv", "prompt,prompt\na,b\n"))


def test_csv_header_only_is_empty(tmp_path):
    with pytest.raises(DataError, match="no records found"):
        read_records(write(tmp_path, "p.csv", "prompt,answer\n"))


def test_tsv(tmp_path):
    path = write(tmp_path, "p.tsv", "prompt\tanswer\nhello, world\t3\n")
    assert read_records(path) == [{"prompt": "hello, world", "answer": "3"}]


def test_txt_one_prompt_per_non_empty_line(tmp_path):
    path = write(tmp_path, "p.txt", "  First prompt  \n\nSecond prompt\n")
    records = read_records(path)
    assert records == [{"prompt": "First prompt"}, {"prompt": "Second prompt"}]
    assert records.where(1) == f"{path}:3"


# --------------------------------------------------------------------------- missing / empty / unknown


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_records(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("name", ["e.jsonl", "e.json", "e.txt", "e.csv"])
def test_empty_files(tmp_path, name):
    with pytest.raises(DataError, match="no records found"):
        read_records(write(tmp_path, name, "\n \n"))


def test_unsupported_extension_lists_formats(tmp_path):
    with pytest.raises(DataError, match=r"unsupported file type '\.xlsx'.*\.jsonl"):
        read_records(write(tmp_path, "p.xlsx", "x"))


def test_plain_directory_is_not_a_dataset(tmp_path):
    with pytest.raises(DataError, match="not a saved datasets folder"):
        read_records(tmp_path)


def test_data_error_is_a_user_error():
    assert issubclass(DataError, UserError)


# --------------------------------------------------------------------------- Parquet and datasets


def test_parquet_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer_value": [1, 2]}), path)
    records = read_records(path)
    assert records == [{"prompt": "a", "answer_value": 1}, {"prompt": "b", "answer_value": 2}]
    assert records.where(1) == f"{path}: row 2"


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"pip install 'rlhfkit\[data\]'"):
        read_records(write(tmp_path, "p.parquet", b"PAR1"))


def test_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}])
    ds.save_to_disk(str(tmp_path / "single"))
    assert read_records(tmp_path / "single") == [{"prompt": "a"}, {"prompt": "b"}]

    dd = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list([{"prompt": "held out"}])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert read_records(tmp_path / "dict") == [{"prompt": "a"}, {"prompt": "b"}]
    assert read_records(tmp_path / "dict", split="test") == [{"prompt": "held out"}]
    with pytest.raises(DataError, match=r"no split 'validation' \(expected one of: test, train\)"):
        read_records(tmp_path / "dict", split="validation")


def test_dataset_folder_without_datasets_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    (tmp_path / "dataset_info.json").write_text("{}")
    with pytest.raises(DataError, match=r"needs `datasets`: pip install 'rlhfkit\[data\]'"):
        read_records(tmp_path)


# --------------------------------------------------------------------------- field helpers


def test_require_fields_names_file_line_and_alternatives(tmp_path):
    path = write(tmp_path, "data.jsonl", '{"prompt": "a"}\n{"text": "b"}\n')
    records = read_records(path)
    require_fields(records[:1], [("prompt", "messages")], path)  # the first record alone passes
    with pytest.raises(DataError) as err:
        require_fields(records, [("prompt", "messages")])
    assert str(err.value) == f"{path}:2: missing field 'prompt' (expected one of: prompt, messages); found: text"


def test_require_fields_treats_null_as_missing_and_plain_lists_use_record_numbers():
    with pytest.raises(DataError, match=r"^x\.json: record 2: missing field 'response'; the record has no fields$"):
        require_fields([{"response": "ok"}, {"response": None}], ["response"], "x.json")
    require_fields([{"a": 1, "b": 2}], ["a", ("b", "c")])  # passes: returns None, raises nothing


def test_expect_helpers():
    assert expect_float("0.5", "margin", "w") == 0.5
    assert expect_float(2, "margin", "w") == 2.0
    for bad in ["abc", float("nan"), "inf", True, None, [1]]:
        with pytest.raises(DataError, match="field 'margin'"):
            expect_float(bad, "margin", "w")
    assert expect_text("hi", "prompt", "w") == "hi"
    with pytest.raises(DataError, match="non-empty"):
        expect_text("  ", "prompt", "w")
    with pytest.raises(DataError, match="must be a string, got a number"):
        expect_text(3, "prompt", "w")


def test_expect_messages_accepts_text_parts_and_rejects_bad_shapes():
    msgs = expect_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "w")
    assert msgs == [{"role": "user", "content": "hi"}]
    for bad in [[], "hello", [{"content": "no role"}], [{"role": "user", "content": 5}]]:
        with pytest.raises(DataError, match="w: field 'messages'"):
            expect_messages(bad, "w")


def test_records_subset_keeps_locations():
    recs = Records([{"a": 1}, {"a": 2}, {"a": 3}], source="f.jsonl", lines=[1, 5, 9])
    sub = recs.subset([2])
    assert sub == [{"a": 3}] and sub.where(0) == "f.jsonl:9"


# --------------------------------------------------------------------------- fuzzing

FORMATS = ["x.jsonl", "x.json", "x.csv", "x.tsv", "x.txt", "x.parquet", "x.jsonl.gz"]


def _read_or_data_error(path) -> None:
    try:
        records = read_records(path)
    except DataError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(records, list) and records
    assert all(isinstance(r, dict) for r in records)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), name=st.sampled_from(FORMATS))
def test_fuzz_random_bytes_give_records_or_data_error(tmp_path, data, name):
    path = tmp_path / name
    path.write_bytes(data)
    _read_or_data_error(path)


LINE = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ['{"prompt": "x"}', "{", "[1, 2]", '"s"', "null", "prompt,answer", 'a,"b', "1e999999", "\x00"]
    ),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, max_size=8), name=st.sampled_from(["x.jsonl", "x.json", "x.csv", "x.txt"]))
def test_fuzz_random_lines_give_records_or_data_error(tmp_path, lines, name):
    path = tmp_path / name
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    _read_or_data_error(path)
