"""lgip.records: the JSONL records (LGIP_SPEC.md section 1): reading and validating them,
with errors that name file, line and field; the published output line format. Every JSON and
JSONL input of the scripts is read here (`iter_json_lines`, `read_json`): UTF-8 with or without a
byte-order mark at its start (Windows tools and pandas' "utf-8-sig" write one), LF or CRLF line
ends; UTF-16 or text that is not UTF-8 is an error saying so.

    >>> records = load_records("x_with_perturb.jsonl", per_caption_fields=("same_caps", "diff_caps"))
    >>> line, rec = records[0]; caption_texts(rec, "diff_caps", 0)
    ['A blue bus parked ...']
    >>> for line, value in iter_json_lines("x__LGIP_m.scores.jsonl"): ...
    >>> coco = read_json("annotations/captions_train2017.json")
"""

import json
import os

from .errors import InputError
from .util import gc_paused


def _expect_str_list(value, where, field, nonblank=False):
    if not isinstance(value, list):
        raise InputError(f"{where}: field {field!r} is {type(value).__name__}, expected a list of strings")
    for j, s in enumerate(value):
        if not isinstance(s, str):
            raise InputError(f"{where}: field '{field}[{j}]' is {type(s).__name__}, expected a string")
        if nonblank and not s.strip():
            raise InputError(
                f"{where}: field '{field}[{j}]' is {'empty' if not s else 'blank'} ({s!r}): "
                f"a caption needs text (remove it, or the record)"
            )


# the script that writes a file holding each per-caption field (named when a record lacks it)
MADE_BY = {
    "same_caps": "diff_gen_caption.py (or either fliptypes generator)",
    "diff_caps": "diff_gen_caption.py (or either fliptypes generator)",
    "diff_caps_*": "make_perturb_with_fliptypes.py or rebuttal_enhanced_perturb_with_fliptypes.py",
    "diff_caps_+": "make_perturb_with_fliptypes.py (or either fliptypes generator, or import_benchmark.py)",
    "combined_caps": "rebuttal_enhanced_perturb_with_fliptypes.py",
}


def validate_record(rec, where, per_caption_fields=()):
    """Check the fields the scripts read; `where` is "file:line". per_caption_fields: names of
    required {caption index: [texts]} fields (keys "0".."n-1" for n captions, nothing else);
    "prefix*" checks every field with that prefix (none is fine), "prefix+" likewise but at least
    one must be there (a typed flip list: diff_caps_<type>); "combined_caps" holds lists
    of {"text", "combined_type"} objects. Captions must hold text; image_path no NUL."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for field in ("image_path", "orig_captions"):
        if field not in rec:
            raise InputError(f"{where}: missing field {field!r}")
    if not isinstance(rec["image_path"], str):
        raise InputError(f"{where}: field 'image_path' is {type(rec['image_path']).__name__}, expected a string")
    if "\0" in rec["image_path"]:
        raise InputError(f"{where}: field 'image_path' contains a NUL character (\\u0000): not a file path")
    _expect_str_list(rec["orig_captions"], where, "orig_captions", nonblank=True)
    n = len(rec["orig_captions"])
    for pattern in per_caption_fields:
        # "diff_caps_*": every field with that prefix, however many (none is fine)
        fields = [f for f in rec if f.startswith(pattern[:-1])] if pattern[-1] in "*+" else [pattern]
        if pattern.endswith("+") and not fields:
            raise InputError(
                f"{where}: no field {pattern[:-1]}<type> (the flips of one type): this script reads the "
                f"output of {MADE_BY.get(pattern, 'the generator')}"
            )
        for field in fields:
            block = rec.get(field)
            if block is None:
                raise InputError(
                    f"{where}: missing field {field!r}: this script reads the output of "
                    f"{MADE_BY.get(pattern, 'the generator')}"
                )
            if not isinstance(block, dict):
                raise InputError(
                    f"{where}: field {field!r} is {type(block).__name__}, expected an object keyed by caption index"
                )
            for key, items in block.items():
                if key not in _index_keys(n):
                    raise InputError(
                        f"{where}: field {field!r} has key {key!r}, not a caption index "
                        f'("0".."{n - 1}" for this record\'s {n} captions)'
                        if n
                        else f"{where}: field {field!r} has key {key!r}, but the record has no captions"
                    )
                if field == "combined_caps":
                    _expect_combined(items, where, f"{field}.{key}")
                else:
                    _expect_str_list(items, where, f"{field}.{key}")


_INDEX_KEYS = []


def _index_keys(n):
    """{"0", ..., str(n - 1)}: the keys a per-caption field of a record with n captions may have."""
    while len(_INDEX_KEYS) <= n:
        _INDEX_KEYS.append(frozenset(str(i) for i in range(len(_INDEX_KEYS))))
    return _INDEX_KEYS[n]


def _lone_surrogate(value, field=""):
    """The field ("orig_captions[0]", "same_caps.0[1]") of the first string in `value` holding
    a lone UTF-16 surrogate (valid JSON, "\\ud800", but no text: it cannot be written as UTF-8
    nor tokenized), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return field or "(the value)"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        name = (f"{field}.{k}" if field else str(k)) if isinstance(value, dict) else f"{field}[{k}]"
        found = _lone_surrogate(k, name + " (its key)") if isinstance(k, str) else None
        found = found or _lone_surrogate(v, name)
        if found:
            return found
    return None


def _expect_combined(items, where, field):
    if not isinstance(items, list):
        raise InputError(f"{where}: field {field!r} is {type(items).__name__}, expected a list of objects")
    for j, item in enumerate(items):
        for name in ("text", "combined_type"):
            if not isinstance(item, dict) or not isinstance(item.get(name), str):
                raise InputError(f"{where}: field '{field}[{j}].{name}' is missing or not a string")


_BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def _start(path, head):
    """Bytes to skip at the start of a file: its UTF-8 byte-order mark, if any. UTF-16 and UTF-32
    (their byte-order marks) raise InputError saying how to fix the file."""
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            raise InputError(
                f"{path}: {name} text (it starts with the byte-order mark {bom.hex(' ').upper()}); save it as UTF-8"
            )
    return len(_BOM) if head.startswith(_BOM) else 0


def _decode(raw, where, of_line=False):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{where}: not UTF-8 text ({e.reason} at byte {e.start}{' of the line' if of_line else ''}); "
            f"save the file as UTF-8"
        ) from None


def check_input_file(path, kind="JSONL"):
    """InputError unless `path` is a file: "<path>: no such file" / "is a directory"."""
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a {kind} file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")


def iter_json_lines(path):
    """Stream (line number, value) from a JSONL file; blank lines are skipped. A line that is not
    JSON or not UTF-8, or holds a string with a lone surrogate ("\\ud800": valid JSON, not text),
    raises InputError naming `path:line` (and the field)."""
    check_input_file(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1:
                raw = raw[_start(path, raw) :]
            line = _decode(raw, f"{path}:{lineno}", of_line=True)
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: invalid JSON ({e.msg}: column {e.colno})") from None
            except (ValueError, RecursionError) as e:  # (a number of thousands of digits; nested thousands deep)
                raise InputError(f"{path}:{lineno}: JSON this program does not read ({_unreadable(e)})") from None
            if b"\\ud" in raw or b"\\uD" in raw:  # a surrogate escape: paired (an emoji) or lone?
                _refuse_lone_surrogates(value, f"{path}:{lineno}")
            yield lineno, value


def _refuse_lone_surrogates(value, where):
    field = _lone_surrogate(value)
    if field:
        raise InputError(
            f"{where}: field {field!r} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
            f"its pair): not text; fix or remove it"
        )


def read_json(path, object_pairs_hook=None):
    """A whole JSON file, parsed; InputError naming the file (and line and column) when it is
    missing, not UTF-8 or not JSON, and the file and field when a string holds a lone surrogate
    (valid JSON, not text: it could not be written out again). object_pairs_hook: json.loads's."""
    check_input_file(path, "JSON")
    with open(path, "rb") as f:
        data = f.read()
    text = _decode(data[_start(path, data[:4]) :], path)
    try:
        value = json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: invalid JSON ({e.msg}: line {e.lineno}, column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # (a number of thousands of digits; arrays nested thousands deep)
        raise InputError(f"{path}: JSON this program does not read ({_unreadable(e)})") from None
    if "\\ud" in text or "\\uD" in text:  # a surrogate escape: paired (an emoji) or lone?
        _refuse_lone_surrogates(value, path)
    return value


def _unreadable(e):
    return "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0].split(":")[0]


def iter_records(path, per_caption_fields=()):
    """Stream (line number, record) from a JSONL file, validating each record.

    Blank lines are skipped (as the published code does); anything else that is not a
    valid record raises InputError naming `path:line` and the field.
    """
    for lineno, rec in iter_json_lines(path):
        validate_record(rec, f"{path}:{lineno}", per_caption_fields)
        yield lineno, rec


def dump_jsonl_line(rec):
    """The published output format: default separators, non-ASCII kept."""
    return json.dumps(rec, ensure_ascii=False) + "\n"


def load_records(path, per_caption_fields=()):
    """All records of an evaluation input, validated: [(line number, record)]."""
    with gc_paused():
        return list(iter_records(path, per_caption_fields))


def flip_types(records):
    """The flip types of the records' typed lists (`diff_caps_<type>`), in order of first appearance
    (LGIP_SPEC.md section 10): LGIP's color, number, object; an imported benchmark's own types.
    >>> flip_types([(1, {"diff_caps_color": {}, "diff_caps_object": {}}), (2, {"diff_caps_number": {}})])
    ['color', 'object', 'number']
    """
    return list(dict.fromkeys(f[len("diff_caps_") :] for _, rec in records for f in rec if f.startswith("diff_caps_")))


def caption_texts(rec, field, i):
    """The texts of `rec[field]` for caption i ([] when the caption has none)."""
    return rec.get(field, {}).get(str(i), [])


def image_paths(records, image_root):
    return [os.path.join(image_root, rec["image_path"]) for _, rec in records]
