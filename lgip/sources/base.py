"""lgip.sources.base: what every outside benchmark's reader shares (LGIP_SPEC.md section 10): the
`Item` a reader yields, the checks that name file, item and field, COCO images found under both
namings, and the items grouped into LGIP records.

    >>> items = [Item("replace_att", "000000000009.jpg", "A red bus.", negatives=["A blue bus."],
    ...               where="add_att.json: item 0")]
    >>> records, missing = build_records(items, ImageFinder(["/coco/val2017"]), out_dir="/data")
    >>> records[0]
    {'image_id': 9, 'image_path': '../coco/val2017/000000000009.jpg', 'orig_captions': ['A red bus.'],
     'same_caps': {}, 'diff_caps': {'0': ['A blue bus.']}, 'diff_caps_replace_att': {'0': ['A blue bus.']}}
"""

import os
import re
import sys
from dataclasses import dataclass, field

from ..errors import InputError
from ..records import read_json

_COCO_ID = re.compile(r"(\d{6,12})\.(?:jpg|jpeg|png)$", re.IGNORECASE)


@dataclass
class Item:
    """One benchmark item: its type, its image (file name as the source writes it), its caption,
    the negatives and paraphrases of that caption, and where it was read (for messages). `own_slot`:
    the caption fills a caption slot of its own (SugarCrepe++), not the slot of an equal text."""

    type: str
    image: str
    caption: str
    negatives: list = field(default_factory=list)
    paraphrases: list = field(default_factory=list)
    where: str = ""
    own_slot: bool = False


def read_source_json(folder, name, kind):
    """The parsed JSON file `folder/name`: InputError naming it when missing, not JSON, or not of
    `kind` (dict or list), with what to pass."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise InputError(
            f"{path}: no such file (SOURCE_DIR must be the benchmark's folder of JSON files, "
            f"as its repository has them)"
        )
    twice = []

    def pairs(items):  # (json keeps the last of a key written twice, as the benchmarks' own loaders read it: said)
        seen = set()
        for k, _ in items:
            if k in seen:
                twice.append(k)
            seen.add(k)
        return dict(items)

    data = read_json(path, object_pairs_hook=pairs)
    if not isinstance(data, kind):
        raise InputError(
            f"{path}: expected a JSON {'object' if kind is dict else 'list'} of items, got {type(data).__name__}"
        )
    if twice:
        shown = ", ".join(repr(k) for k in twice[:5]) + (", ..." if len(twice) > 5 else "")
        print(
            f"warning: {path}: {len(twice)} key(s) written twice in one object ({shown}): JSON keeps the last of "
            f"each, as the benchmark's own loader reads it; the earlier ones are left out",
            file=sys.stderr,
            flush=True,
        )
    return data, path


def text_field(item, name, where, kind=str):
    """item[name], a non-empty string (or a `kind`); InputError naming file, item and field."""
    if not isinstance(item, dict):
        raise InputError(f"{where}: expected an object, got {type(item).__name__}")
    if name not in item:
        raise InputError(f"{where}: missing field {name!r}")
    value = item[name]
    if not isinstance(value, kind) or (kind is str and not value.strip()):
        what = "a non-empty string" if kind is str else f"a {kind.__name__}"
        raise InputError(f"{where}: field {name!r} must be {what}, got {value!r}"[:300])
    return value


def coco_id(name):
    """The COCO image id of a file name under either naming (000000391895.jpg,
    COCO_val2014_000000391895.jpg, a folder before it), or None."""
    m = _COCO_ID.search(os.path.basename(name))
    return int(m.group(1)) if m else None


class ImageFinder:
    """Images looked up in `dirs`, in order, under the name the source gives and both COCO namings
    (2017: 000000391895.jpg; 2014: COCO_val2014_/COCO_train2014_000000391895.jpg): a picture of
    val2014 lies in train2017 or val2017. Each folder is listed once."""

    def __init__(self, dirs):
        if isinstance(dirs, str):
            dirs = [dirs]
        self.dirs = [os.path.abspath(d) for d in dirs]
        self._listing = {}

    def names(self, image):
        base = os.path.basename(image)
        i = coco_id(image)
        extra = [] if i is None else [f"{i:012d}.jpg", f"COCO_val2014_{i:012d}.jpg", f"COCO_train2014_{i:012d}.jpg"]
        return list(dict.fromkeys([image, base] + extra))

    def _entries(self, folder):
        if folder not in self._listing:
            try:
                self._listing[folder] = {e.name for e in os.scandir(folder) if e.is_file()}
            except OSError:
                self._listing[folder] = set()
        return self._listing[folder]

    def find(self, image):
        """The absolute path of the image, or None."""
        for d in self.dirs:
            for name in self.names(image):
                if "/" in name:
                    path = os.path.join(d, name)
                    if os.path.isfile(path):
                        return path
                elif name in self._entries(d):
                    return os.path.join(d, name)
        return None


def build_records(items, finder, out_dir):
    """LGIP records from items (LGIP_SPEC.md section 10): a record per image in order of first
    appearance; `orig_captions` its distinct captions in order of first appearance (an `own_slot`
    item's caption always a slot of its own); `diff_caps[i]` every negative of caption i in source
    order and `diff_caps_<type>[i]` those of one type; `same_caps[i]` its paraphrases ({} when the
    source has none). Returns (records, missing): the images found in no folder are not written,
    {image: number of items} of them."""
    records, by_image, missing = [], {}, {}
    for it in items:
        if it.image in missing:
            missing[it.image] += 1
            continue
        rec = by_image.get(it.image)
        if rec is None:
            path = finder.find(it.image)
            if path is None:
                missing[it.image] = 1
                continue
            rel = os.path.relpath(path, out_dir).replace(os.sep, "/")
            rec = {
                "image_id": coco_id(it.image),
                "image_path": rel,
                "orig_captions": [],
                "same_caps": {},
                "diff_caps": {},
            }
            by_image[it.image] = rec
            records.append(rec)
        caps = rec["orig_captions"]
        i = len(caps) if it.own_slot or it.caption not in caps else caps.index(it.caption)
        if i == len(caps):
            caps.append(it.caption)
        key = str(i)
        if it.paraphrases:
            rec["same_caps"].setdefault(key, []).extend(it.paraphrases)
        if it.negatives:
            rec["diff_caps"].setdefault(key, []).extend(it.negatives)
            rec.setdefault("diff_caps_" + it.type, {}).setdefault(key, []).extend(it.negatives)
    return records, missing
