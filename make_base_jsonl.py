"""make_base_jsonl: build the base JSONL (`lgip_coco_native5_train2017.jsonl`) from COCO captions.

Step 0 of the pipeline. Reads the official COCO `annotations/captions_train2017.json`
({"images": [{"id", "file_name", ...}], "annotations": [{"id", "image_id", "caption"}]}) and
writes one record per chosen image: {"image_id", "image_path", "orig_captions"}.
  - an image is eligible when it has at least CAPTIONS_PER_IMAGE captions and (with
    CHECK_IMAGES) its file exists under IMAGE_DIR and is not empty (a folder or a zero-byte
    file counts as missing);
  - orig_captions = its first CAPTIONS_PER_IMAGE captions by annotation id, kept verbatim
    (no stripping: the published base kept the COCO text as is);
  - eligible images are ordered by image id; when there are more than N_IMAGES,
    random.Random(SEED).sample(eligible, N_IMAGES) picks them, and they are written in
    image-id order;
  - image_path is relative to the output file's folder, with forward slashes.
Annotations naming an image id absent from "images", with an empty or blank caption, or repeating
an earlier annotation's id (the first is kept) are skipped and counted. Prints what it skipped and
why; writes `<OUTPUT_JSONL>.meta.json` (settings, versions, counts).
  python make_base_jsonl.py --N_IMAGES=40000 --SEED=42
"""
import os
import random

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
ANNOTATIONS_JSON = os.path.join(_HERE, "annotations", "captions_train2017.json")  # path to COCO captions_train2017.json
IMAGE_DIR = os.path.join(_HERE, "train2017", "train2017")  # folder holding the COCO images (file_name is relative to it)
OUTPUT_JSONL = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # output path of the base JSONL
N_IMAGES = 40000  # int >= 0: images to write (seeded sample when more are eligible); None = all eligible
SEED = 42  # int: seed of random.Random used to choose the N_IMAGES images
CHECK_IMAGES = True  # True: skip images whose file is missing under IMAGE_DIR; False: do not look at the image folder
CAPTIONS_PER_IMAGE = 5  # int >= 1: captions kept per image (images with fewer are skipped)
CONFIG = common.configure(globals())

_SHOW_SKIPPED = 10  # image ids listed per skip reason in the report


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def check_settings():
    if N_IMAGES is not None and not (_is_int(N_IMAGES) and N_IMAGES >= 0):
        raise common.InputError(f"N_IMAGES must be an int >= 0 or None, got {N_IMAGES!r}")
    if not (_is_int(CAPTIONS_PER_IMAGE) and CAPTIONS_PER_IMAGE >= 1):
        raise common.InputError(f"CAPTIONS_PER_IMAGE must be an int >= 1, got {CAPTIONS_PER_IMAGE!r}")
    if not isinstance(CHECK_IMAGES, bool):
        raise common.InputError(f"CHECK_IMAGES must be True or False, got {CHECK_IMAGES!r}")


def load_coco(path):
    """The parsed annotations file: a dict with the lists 'images' and 'annotations'."""
    if not os.path.exists(path):
        raise common.InputError(
            f"{path}: no such file. Download the COCO 2017 train/val annotations "
            f"(annotations_trainval2017.zip from cocodataset.org) and put captions_train2017.json in "
            f"{os.path.join(_HERE, 'annotations')}/, or pass --ANNOTATIONS_JSON=<path>")
    data = common.read_json(path)  # (a byte-order mark at its start is fine)
    if not isinstance(data, dict):
        raise common.InputError(f"{path}: expected a JSON object with 'images' and 'annotations', "
                                f"got {type(data).__name__}")
    for key in ("images", "annotations"):
        if key not in data:
            raise common.InputError(f"{path}: missing field {key!r} (is this a COCO captions file?)")
        if not isinstance(data[key], list):
            raise common.InputError(f"{path}: field {key!r} is {type(data[key]).__name__}, expected a list")
    return data


def index_images(images, path):
    """{image id: file_name}, checking each entry."""
    files = {}
    for i, img in enumerate(images):
        where = f"{path}: images[{i}]"
        if not isinstance(img, dict):
            raise common.InputError(f"{where}: expected an object, got {type(img).__name__}")
        for field, ok, kind in (("id", _is_int, "an int"), ("file_name", lambda v: isinstance(v, str), "a string")):
            if field not in img:
                raise common.InputError(f"{where}: missing field {field!r}")
            if not ok(img[field]):
                raise common.InputError(f"{where}: field {field!r} is {type(img[field]).__name__}, expected {kind}")
        if img["id"] in files:
            raise common.InputError(f"{where}: duplicate image id {img['id']}")
        files[img["id"]] = img["file_name"]
    return files


def _check_annotation(ann, i, path):
    """Raise InputError naming the annotation and its bad field (called only for a bad one)."""
    if not isinstance(ann, dict):
        raise common.InputError(f"{path}: annotations[{i}]: expected an object, got {type(ann).__name__}")
    where = f"{path}: annotations[{i}] (id {ann.get('id', '?')!r})"
    for field, ok, kind in (("id", _is_int, "an int"), ("image_id", _is_int, "an int"),
                            ("caption", lambda v: isinstance(v, str), "a string")):
        if field not in ann:
            raise common.InputError(f"{where}: missing field {field!r}")
        if not ok(ann[field]):
            raise common.InputError(f"{where}: field {field!r} is {type(ann[field]).__name__}, expected {kind}")


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
        raise common.InputError(
            f"{image_dir}: image folder not found (expected COCO layout train2017/train2017/*.jpg beside the "
            f"scripts); pass --IMAGE_DIR=<folder>, or --CHECK_IMAGES=False to write records without checking")
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


def select(files, by_image, stats, skipped):
    """Eligible image ids in id order, then the seeded choice of N_IMAGES of them (in id order)."""
    exists = image_exists_fn(IMAGE_DIR) if CHECK_IMAGES else None
    eligible = []
    for image_id in sorted(files):
        if len(by_image[image_id]) < CAPTIONS_PER_IMAGE:
            skipped["too_few_captions"].append(image_id)
        elif exists is not None and not exists(files[image_id]):
            skipped["image_missing"].append(image_id)
        else:
            eligible.append(image_id)
    stats["images_in_file"] = len(files)
    stats["eligible"] = len(eligible)
    stats["skipped_too_few_captions"] = len(skipped["too_few_captions"])
    stats["skipped_image_missing"] = len(skipped["image_missing"])
    if N_IMAGES is not None and len(eligible) > N_IMAGES:
        return sorted(random.Random(SEED).sample(eligible, N_IMAGES))
    return eligible


def relative_path_fn(out_dir):
    """file_name -> relpath(IMAGE_DIR/file_name, out_dir) with '/', the folder part computed once."""
    rel_dir = os.path.relpath(IMAGE_DIR, start=out_dir).replace(os.sep, "/")
    prefix = "" if rel_dir == "." else rel_dir + "/"

    def relative(file_name):
        if "/" in file_name or os.sep in file_name or file_name in (".", ".."):
            return os.path.relpath(os.path.join(IMAGE_DIR, file_name), start=out_dir).replace(os.sep, "/")
        return prefix + file_name
    return relative


def make_record(image_id, image_path, captions):
    captions = sorted(captions, key=lambda ac: ac[0])[:CAPTIONS_PER_IMAGE]  # stable: ties keep file order
    return {"image_id": image_id, "image_path": image_path, "orig_captions": [c for _, c in captions]}


def report(stats, skipped, dropped, seconds):
    name = os.path.basename(__file__)
    print(f"{name}: {stats['images_in_file']} images in file, {stats['annotations']} annotations, "
          f"{stats['eligible']} eligible, {stats['written']} written")
    print(f"  skipped (fewer than {CAPTIONS_PER_IMAGE} captions): {stats['skipped_too_few_captions']} images"
          + _examples(skipped["too_few_captions"]))
    check = "" if CHECK_IMAGES else " (not checked: CHECK_IMAGES=False)"
    print(f"  skipped (image file missing, empty or a folder){check}: {stats['skipped_image_missing']} images"
          + _examples(skipped["image_missing"]))
    print(f"  skipped annotations with an unknown image id: {stats['annotations_unknown_image']}"
          + _examples(dropped["unknown_image"], "annotation ids"))
    for key, what in (("blank_caption", "an empty or blank caption"),
                      ("repeated_id", "the id of an earlier annotation (the first one is kept)")):
        if stats["annotations_" + key]:
            print(f"  skipped annotations with {what}: {stats['annotations_' + key]}"
                  + _examples(dropped[key], "annotation ids"))
    if N_IMAGES is not None and stats["eligible"] < N_IMAGES:
        print(f"  note: only {stats['eligible']} eligible images, fewer than N_IMAGES={N_IMAGES}: wrote them all")
    rate = stats["written"] / max(seconds, 1e-9)
    print(f"  {seconds:.2f} s ({rate:,.0f} records/s) -> {OUTPUT_JSONL}")


def _examples(ids, what="image ids"):
    if not ids:
        return ""
    more = ", ..." if len(ids) > _SHOW_SKIPPED else ""
    return f"; first {what}: {', '.join(str(i) for i in ids[:_SHOW_SKIPPED])}{more}"


def main():
    check_settings()
    common.refuse_overwriting_input(OUTPUT_JSONL, ANNOTATIONS_JSON)
    stale = common.remove_stale_temps(OUTPUT_JSONL)
    if stale:
        print(f"removed {len(stale)} temp file(s) a killed earlier run left for {os.path.basename(OUTPUT_JSONL)}")
    stats = {}
    skipped = {"too_few_captions": [], "image_missing": []}
    with common.Timer() as timer:
        data = load_coco(ANNOTATIONS_JSON)
        files = index_images(data["images"], ANNOTATIONS_JSON)
        by_image, dropped = group_captions(data["annotations"], files, ANNOTATIONS_JSON, stats)
        del data
        chosen = select(files, by_image, stats, skipped)
        relative = relative_path_fn(os.path.dirname(os.path.abspath(OUTPUT_JSONL)))
        with common.atomic_open(OUTPUT_JSONL) as out:
            for image_id in chosen:
                rec = make_record(image_id, relative(files[image_id]), by_image[image_id])
                out.write(common.dump_jsonl_line(rec))
        stats["written"] = len(chosen)
    meta = common.provenance(__file__, CONFIG)
    meta.update(input=os.path.abspath(ANNOTATIONS_JSON), image_dir=os.path.abspath(IMAGE_DIR),
                output=os.path.abspath(OUTPUT_JSONL), counts=stats,
                skipped_examples={"too_few_captions": skipped["too_few_captions"][:_SHOW_SKIPPED],
                                  "image_missing": skipped["image_missing"][:_SHOW_SKIPPED],
                                  **{f"{k}_annotation_ids": v[:_SHOW_SKIPPED] for k, v in dropped.items()}},
                seconds=round(timer.seconds, 3))
    common.write_json(OUTPUT_JSONL + ".meta.json", meta)
    report(stats, skipped, dropped, timer.seconds)


if __name__ == "__main__":
    common.run_main(main)
