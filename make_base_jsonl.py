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

import common
from lgip import coco

_HERE = os.path.dirname(os.path.abspath(__file__))
ANNOTATIONS_JSON = os.path.join(_HERE, "annotations", "captions_train2017.json")  # path to COCO captions_train2017.json
IMAGE_DIR = os.path.join(_HERE, "train2017", "train2017")  # folder holding the COCO images
#   (file_name is relative to it)
OUTPUT_JSONL = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # output path of the base JSONL
N_IMAGES = 40000  # int >= 0: images to write (seeded sample when more are eligible); None = all eligible
SEED = 42  # int: seed of random.Random used to choose the N_IMAGES images
CHECK_IMAGES = True  # True: skip images whose file is missing under IMAGE_DIR; False: do not look at the image folder
CAPTIONS_PER_IMAGE = 5  # int >= 1: captions kept per image (images with fewer are skipped)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
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


def report(stats, skipped, dropped, seconds):
    name = os.path.basename(__file__)
    print(
        f"{name}: {stats['images_in_file']} images in file, {stats['annotations']} annotations, "
        f"{stats['eligible']} eligible, {stats['written']} written"
    )
    print(
        f"  skipped (fewer than {CAPTIONS_PER_IMAGE} captions): {stats['skipped_too_few_captions']} images"
        + _examples(skipped["too_few_captions"])
    )
    check = "" if CHECK_IMAGES else " (not checked: CHECK_IMAGES=False)"
    print(
        f"  skipped (image file missing, empty or a folder){check}: {stats['skipped_image_missing']} images"
        + _examples(skipped["image_missing"])
    )
    print(
        f"  skipped annotations with an unknown image id: {stats['annotations_unknown_image']}"
        + _examples(dropped["unknown_image"], "annotation ids")
    )
    for key, what in (
        ("blank_caption", "an empty or blank caption"),
        ("repeated_id", "the id of an earlier annotation (the first one is kept)"),
    ):
        if stats["annotations_" + key]:
            print(
                f"  skipped annotations with {what}: {stats['annotations_' + key]}"
                + _examples(dropped[key], "annotation ids")
            )
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
        data = coco.load_coco(ANNOTATIONS_JSON, os.path.join(_HERE, "annotations"))
        files = coco.index_images(data["images"], ANNOTATIONS_JSON)
        by_image, dropped = coco.group_captions(data["annotations"], files, ANNOTATIONS_JSON, stats)
        del data
        chosen = coco.select(files, by_image, stats, skipped, CONFIG)
        if not chosen:  # (an empty base would pass for one: said before anything is written)
            raise common.InputError(
                f"no image of {ANNOTATIONS_JSON} can be written: "
                f"{len(skipped['image_missing'])} not found in IMAGE_DIR "
                f"{IMAGE_DIR}{_examples(skipped['image_missing'])}, {len(skipped['too_few_captions'])} with fewer than "
                f"{CAPTIONS_PER_IMAGE} captions; nothing was written"
            )
        relative = coco.relative_path_fn(IMAGE_DIR, os.path.dirname(os.path.abspath(OUTPUT_JSONL)))
        with common.atomic_open(OUTPUT_JSONL) as out:
            for image_id in chosen:
                rec = coco.make_record(image_id, relative(files[image_id]), by_image[image_id], CAPTIONS_PER_IMAGE)
                out.write(common.dump_jsonl_line(rec))
        stats["written"] = len(chosen)
    meta = common.provenance(__file__, CONFIG)
    meta.update(
        input=os.path.abspath(ANNOTATIONS_JSON),
        image_dir=os.path.abspath(IMAGE_DIR),
        output=os.path.abspath(OUTPUT_JSONL),
        counts=stats,
        skipped_examples={
            "too_few_captions": skipped["too_few_captions"][:_SHOW_SKIPPED],
            "image_missing": skipped["image_missing"][:_SHOW_SKIPPED],
            **{f"{k}_annotation_ids": v[:_SHOW_SKIPPED] for k, v in dropped.items()},
        },
        seconds=round(timer.seconds, 3),
    )
    common.write_json(OUTPUT_JSONL + ".meta.json", meta)
    report(stats, skipped, dropped, timer.seconds)
    return OUTPUT_JSONL


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the output's path."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
