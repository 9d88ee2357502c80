"""Reading predictions files that come from outside: bad entries reported, good ones kept."""

import json

import pytest

from environments.predictions import read_predictions

pytestmark = pytest.mark.unit

GOOD = {"instance_id": "a__b-1", "model_name_or_path": "m", "model_patch": "diff --git a/x b/x\n"}

GARBAGE_LINES = [
    (b"not json at all", "line 2: not JSON"),
    (b"[1, 2, 3]", "line 3: an array, not a JSON object"),
    (b"42", "line 4: a number, not a JSON object"),
    (b'{"model_patch": "x"}', "line 5: no instance_id"),
    (b'{"instance_id": ["a"], "model_patch": "x"}', "line 6: instance_id must be a non-empty string, got an array"),
    (b'{"instance_id": "c__d-1", "model_patch": 7}', "line 7: model_patch must be a string or null, got a number"),
    (b'{"instance_id": "e__f-1", "model_patch": "\xff\xfe"}', "line 8: not UTF-8 (byte 0xff at column 43)"),
    (b'{"instance_id": "g__h-1", "model_pat', "line 9: not JSON"),
    (b"[" * 100_000, "line 10: "),
    (json.dumps(GOOD).encode(), "line 11: instance_id 'a__b-1' already given at line 1"),
]


def test_each_kind_of_garbage_is_reported_with_its_line_and_the_good_lines_are_kept(tmp_path):
    path = tmp_path / "preds.jsonl"
    good2 = {"instance_id": "z__z-9", "model_patch": None}
    path.write_bytes(b"\n".join([json.dumps(GOOD).encode(), *(g for g, _ in GARBAGE_LINES), b"",
                                 json.dumps(good2).encode()]))
    report = read_predictions(path)
    assert report.predictions == [GOOD, good2]
    assert len(report.errors) == len(GARBAGE_LINES)
    for err, (_, expected) in zip(report.errors, GARBAGE_LINES):
        assert err.startswith(expected), err


def test_json_files_list_or_map_and_bad_whole_files_raise_one_line(tmp_path):
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps([GOOD, 5]))
    report = read_predictions(listed)
    assert report.predictions == [GOOD] and report.errors == ["item 2: a number, not a JSON object"]
    keyed = tmp_path / "k.json"
    keyed.write_text(json.dumps({"a__b-1": GOOD}))
    assert read_predictions(keyed).predictions == [GOOD]
    for body, message in ((b"[{", "not JSON"), (b"7", "a number, not a list or object"), (b"\xff", "not UTF-8")):
        listed.write_bytes(body)
        with pytest.raises(ValueError, match=message):
            read_predictions(listed)
    with pytest.raises(OSError):
        read_predictions(tmp_path / "missing.jsonl")
