"""lgip.records: the JSONL records (LGIP_SPEC.md section 1): reading and validating them,
with errors that name file, line and field; the published output line format.

    >>> records = load_records("x_with_perturb.jsonl", per_caption_fields=("same_caps", "diff_caps"))
    >>> line, rec = records[0]; caption_texts(rec, "diff_caps", 0)
    ['A blue bus parked ...']
"""
import json
import os

from .errors import InputError
from .util import gc_paused


def _expect_str_list(value, where, field):
    if not isinstance(value, list):
        raise InputError(f"{where}: field {field!r} is {type(value).__name__}, expected a list of strings")
    for j, s in enumerate(value):
        if not isinstance(s, str):
            raise InputError(f"{where}: field '{field}[{j}]' is {type(s).__name__}, expected a string")


def validate_record(rec, where, per_caption_fields=()):
    """Check the fields the scripts read; `where` is "file:line". per_caption_fields: names of
    required {caption index: [texts]} fields; "prefix*" checks every field with that prefix;
    "combined_caps" (optional) holds lists of {"text", "combined_type"} objects."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for field in ("image_path", "orig_captions"):
        if field not in rec:
            raise InputError(f"{where}: missing field {field!r}")
    if not isinstance(rec["image_path"], str):
        raise InputError(f"{where}: field 'image_path' is {type(rec['image_path']).__name__}, expected a string")
    _expect_str_list(rec["orig_captions"], where, "orig_captions")
    for pattern in per_caption_fields:
        # "diff_caps_*": every field with that prefix, however many (none is fine)
        fields = [f for f in rec if f.startswith(pattern[:-1])] if pattern.endswith("*") else [pattern]
        for field in fields:
            block = rec.get(field)
            if block is None:
                if field == "combined_caps":
                    continue
                raise InputError(f"{where}: missing field {field!r} (run the generator first)")
            if not isinstance(block, dict):
                raise InputError(f"{where}: field {field!r} is {type(block).__name__}, expected an object keyed by caption index")
            for key, items in block.items():
                if field == "combined_caps":
                    _expect_combined(items, where, f"{field}.{key}")
                else:
                    _expect_str_list(items, where, f"{field}.{key}")


def _expect_combined(items, where, field):
    if not isinstance(items, list):
        raise InputError(f"{where}: field {field!r} is {type(items).__name__}, expected a list of objects")
    for j, item in enumerate(items):
        for name in ("text", "combined_type"):
            if not isinstance(item, dict) or not isinstance(item.get(name), str):
                raise InputError(f"{where}: field '{field}[{j}].{name}' is missing or not a string")


def iter_records(path, per_caption_fields=()):
    """Stream (line number, record) from a JSONL file, validating each record.

    Blank lines are skipped (as the published code does); anything else that is not a
    valid record raises InputError naming `path:line` and the field.
    """
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            validate_record(rec, where, per_caption_fields)
            yield lineno, rec


def dump_jsonl_line(rec):
    """The published output format: default separators, non-ASCII kept."""
    return json.dumps(rec, ensure_ascii=False) + "\n"


def load_records(path, per_caption_fields=()):
    """All records of an evaluation input, validated: [(line number, record)]."""
    with gc_paused():
        return list(iter_records(path, per_caption_fields))


def caption_texts(rec, field, i):
    """The texts of `rec[field]` for caption i ([] when the caption has none)."""
    return rec.get(field, {}).get(str(i), [])


def image_paths(records, image_root):
    return [os.path.join(image_root, rec["image_path"]) for _, rec in records]
