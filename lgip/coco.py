"""lgip.coco: the COCO captions file (`annotations/captions_train2017.json`) read into base records
(LGIP_SPEC.md section 1), make_base_jsonl.py's machinery: every entry checked (file, index and
field in each error), captions grouped by image, images checked on disk, the seeded choice.

    >>> data = load_coco("annotations/captions_train2017.json", "annotations")
    >>> files = index_images(data["images"], path)                     # {image id: file_name}
    >>> by_image, dropped = group_captions(data["annotations"], files, path, stats)
    >>> chosen = select(files, by_image, stats, skipped, CONFIG)       # image ids, in id order
    >>> make_record(9, "train2017/train2017/000000000009.jpg", by_image[9], 5)
    {'image_id': 9, 'image_path': 'train2017/train2017/000000000009.jpg', 'orig_captions': [...5 captions]}
"""

import os
import random

from .errors import InputError
from .records import read_json


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def load_coco(path, folder_hint):
    """The parsed annotations file: a dict with the lists 'images' and 'annotations'; `folder_hint`
    is the folder the message tells a user to put the file in."""
    if not os.path.exists(path):
        raise InputError(
            f"{path}: no such file. Download the COCO 2017 train/val annotations "
            f"(annotations_trainval2017.zip from cocodataset.org) and put captions_train2017.json in "
            f"{folder_hint}/, or pass --ANNOTATIONS_JSON=<path>"
        )
    data = read_json(path)  # (a byte-order mark at its start is fine)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object with 'images' and 'annotations', got {type(data).__name__}")
    for key in ("images", "annotations"):
        if key not in data:
            raise InputError(f"{path}: missing field {key!r} (is this a COCO captions file?)")
        if not isinstance(data[key], list):
            raise InputError(f"{path}: field {key!r} is {type(data[key]).__name__}, expected a list")
    return data


def index_images(images, path):
    """{image id: file_name}, checking each entry."""
    files = {}
    for i, img in enumerate(images):
        where = f"{path}: images[{i}]"
        if not isinstance(img, dict):
            raise InputError(f"{where}: expected an object, got {type(img).__name__}")
        for field, ok, kind in (("id", _is_int, "an int"), ("file_name", lambda v: isinstance(v, str), "a string")):
            if field not in img:
                raise InputError(f"{where}: missing field {field!r}")
            if not ok(img[field]):
                raise InputError(f"{where}: field {field!r} is {type(img[field]).__name__}, expected {kind}")
        if img["id"] in files:
            raise InputError(f"{where}: duplicate image id {img['id']}")
        files[img["id"]] = img["file_name"]
    return files


def _check_annotation(ann, i, path):
    """Raise InputError naming the annotation and its bad field (called only for a bad one)."""
    if not isinstance(ann, dict):
        raise InputError(f"{path}: annotations[{i}]: expected an object, got {type(ann).__name__}")
    where = f"{path}: annotations[{i}] (id {ann.get('id', '?')!r})"
    for field, ok, kind in (
        ("id", _is_int, "an int"),
        ("image_id", _is_int, "an int"),
        ("caption", lambda v: isinstance(v, str), "a string"),
    ):
        if field not in ann:
            raise InputError(f"{where}: missing field {field!r}")
        if not ok(ann[field]):
            raise InputError(f"{where}: field {field!r} is {type(ann[field]).__name__}, expected {kind}")


def group_captions(annotations, files, path, stats):
    """{image id: [(annotation id, caption)]} for known images; unknown image ids, blank captions
    and repeated annotation ids (the first kept) are counted."""
    by_image = {image_id: [] for image_id in files}
    unknown, blank, seen, repeated = [], [], set(), []
    for i, ann in enumerate(annotations):
        try:  # fast path: the checks below only look closer at a suspicious annotation
            ann_id, image_id, caption = ann["id"], ann["image_id"], ann["caption"]
        except (KeyError, TypeError):
            _check_annotation(ann, i, path)
            raise
        if type(ann_id) is not int or type(image_id) is not int or type(caption) is not str:
            _check_annotation(ann, i, path)
        if ann_id in seen:
            repeated.append(ann_id)
            continue
        seen.add(ann_id)
        captions = by_image.get(image_id)
        if captions is None:
            unknown.append(ann_id)
        elif not caption.strip():
            blank.append(ann_id)
        else:
            captions.append((ann_id, caption))
    stats["annotations"] = len(annotations)
    stats["annotations_unknown_image"] = len(unknown)
    stats["annotations_blank_caption"] = len(blank)
    stats["annotations_repeated_id"] = len(repeated)
    return by_image, {"unknown_image": unknown, "blank_caption": blank, "repeated_id": repeated}


def image_exists_fn(image_dir):
    """A fast existence test: one directory listing for plain names, a stat for nested ones. A
    folder or a zero-byte file is no image: missing."""
    if not os.path.isdir(image_dir):
        raise InputError(
            f"{image_dir}: image folder not found (expected COCO layout train2017/train2017/*.jpg beside the "
            f"scripts); pass --IMAGE_DIR=<folder>, or --CHECK_IMAGES=False to write records without checking"
        )
    entries = {e.name: e for e in os.scandir(image_dir)}

    def exists(file_name):
        if "/" in file_name or os.sep in file_name:
            path = os.path.join(image_dir, file_name)
            return os.path.isfile(path) and os.path.getsize(path) > 0
        entry = entries.get(file_name)
        try:  # (is_file follows a link to a file; stat is asked only of a chosen name)
            return entry is not None and entry.is_file() and entry.stat().st_size > 0
        except OSError:  # a dangling link
            return False

    return exists


def select(files, by_image, stats, skipped, cfg):
    """Eligible image ids in id order, then the seeded choice of N_IMAGES of them (in id order)."""
    exists = image_exists_fn(cfg["IMAGE_DIR"]) if cfg["CHECK_IMAGES"] else None
    eligible = []
    for image_id in sorted(files):
        if len(by_image[image_id]) < cfg["CAPTIONS_PER_IMAGE"]:
            skipped["too_few_captions"].append(image_id)
        elif exists is not None and not exists(files[image_id]):
            skipped["image_missing"].append(image_id)
        else:
            eligible.append(image_id)
    stats["images_in_file"] = len(files)
    stats["eligible"] = len(eligible)
    stats["skipped_too_few_captions"] = len(skipped["too_few_captions"])
    stats["skipped_image_missing"] = len(skipped["image_missing"])
    n = cfg["N_IMAGES"]
    if n is not None and len(eligible) > n:
        return sorted(random.Random(cfg["SEED"]).sample(eligible, n))
    return eligible


def relative_path_fn(image_dir, out_dir):
    """file_name -> relpath(image_dir/file_name, out_dir) with '/', the folder part computed once."""
    rel_dir = os.path.relpath(image_dir, start=out_dir).replace(os.sep, "/")
    prefix = "" if rel_dir == "." else rel_dir + "/"

    def relative(file_name):
        if "/" in file_name or os.sep in file_name or file_name in (".", ".."):
            return os.path.relpath(os.path.join(image_dir, file_name), start=out_dir).replace(os.sep, "/")
        return prefix + file_name

    return relative


def make_record(image_id, image_path, captions, per_image):
    """A base record: its first `per_image` captions by annotation id, verbatim."""
    captions = sorted(captions, key=lambda ac: ac[0])[:per_image]  # stable: ties keep file order
    return {"image_id": image_id, "image_path": image_path, "orig_captions": [c for _, c in captions]}
