"""lgip.overlap: did a model see the probe's images in training? Every evaluation's per-model row says so as
`images_seen_overlap` where there is a question (absent where there is none, so such rows are as before):

- a fine-tuned arm of section 14 (a spec naming `<folder>/model` with `<folder>/finetune.meta.json` beside it:
  finetune_lgip.py's outputs, and the WiSE-FT points saved as arms are) is counted exactly from its split files:
  {"status": "counted", "count", "fraction", "probed_images", "train_file"}, the probed images (the distinct images
  of the input's records with captions, each `image_path` resolved against its file's image folder) that lie in
  the arm's train side (0 on its held-out file; every image when it trained on the whole input, HELDOUT_FRACTION 0);
- a model whose card says it saw COCO's images (`images_seen` naming COCO, not LAION-COCO, or `training_data`
  "COCO"; lgip.models.finetunes' named models say so), probed on a COCO input (its records carry an int `image_id`
  and none `synthetic_image`): {"status": "unknown", "images_seen": its card's text, "input": "COCO"}: lgip ships
  no split's image ids, so whether the probed images are among them cannot be counted.

    >>> overlap_of(spec, card, records, image_root)        # None: no question; else the row's field
    >>> overlap_text(row["images_seen_overlap"])           # the console's and the page's words
"""

import json
import os
import re

from .errors import InputError
from .records import iter_json_lines

# COCO's images by name (COCO, MS-COCO, MSCOCO), not LAION-COCO's (LAION images with generated captions)
COCO_TEXT = re.compile(r"(?<!LAION-)(?<!LAION )\b(?:MS-?)?COCO\b", re.IGNORECASE)


def is_coco_input(records):
    """True when every record carries an int `image_id` and none `synthetic_image` (the demo's are marked)."""
    return bool(records) and all(
        type(rec.get("image_id")) is int and not rec.get("synthetic_image") for _, rec in records
    )


def saw_coco(card):
    """The text saying a model saw COCO's images (its card's `images_seen`, else its `training_data` "COCO"),
    else None."""
    card = card if isinstance(card, dict) else {}
    seen = card.get("images_seen")
    if isinstance(seen, str) and COCO_TEXT.search(seen):
        return seen
    data = card.get("training_data")
    return data if isinstance(data, str) and COCO_TEXT.fullmatch(data.strip()) else None


def arm_folder(spec, meta="finetune.meta.json"):
    """The training folder of a fine-tuned arm's spec (`local-dir:<folder>/model` or a model_id `<folder>/model`,
    with `<folder>/finetune.meta.json`; meta "wise.meta.json": a WiSE-FT point's folder), else None."""
    if not isinstance(spec, dict):
        return None
    where = spec.get("model_name") if isinstance(spec.get("model_name"), str) else spec.get("model_id")
    if not isinstance(where, str) or not where:
        return None
    path = os.path.normpath(where[len("local-dir:") :] if where.startswith("local-dir:") else where)
    folder = os.path.dirname(path)
    return folder if os.path.basename(path) == "model" and os.path.isfile(os.path.join(folder, meta)) else None


def train_file(folder):
    """The file an arm trained on, from its finetune.meta.json: its split's train side (beside the split's input),
    or the whole input when it trained on every record (HELDOUT_FRACTION 0: no split). InputError naming the meta
    and the field when it says neither."""
    meta_path = os.path.join(folder, "finetune.meta.json")
    with open(meta_path, encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except ValueError as e:
            raise InputError(f"{meta_path}: not JSON ({e}); run finetune_lgip.py again") from None
    split = meta.get("split") if isinstance(meta, dict) else None
    config = meta.get("config") if isinstance(meta, dict) and isinstance(meta.get("config"), dict) else {}
    if isinstance(split, dict):
        files, source = split.get("files"), split.get("input")
        if isinstance(files, dict) and isinstance(files.get("train"), str) and isinstance(source, str):
            return os.path.join(os.path.dirname(source), os.path.basename(files["train"]))
        raise InputError(f"{meta_path}: field 'split.files.train' (or 'split.input') is missing; run it again")
    if config.get("HELDOUT_FRACTION") == 0 and isinstance(config.get("JSONL_PATH"), str):
        path = config["JSONL_PATH"]
        beside = os.path.join(os.path.dirname(os.path.abspath(folder)), os.path.basename(path))
        return path if os.path.isabs(path) or not os.path.isfile(beside) else beside
    raise InputError(f"{meta_path}: field 'split' is missing (and HELDOUT_FRACTION is not 0); run it again")


def _image(root, image_path):
    return os.path.normcase(os.path.normpath(os.path.join(root, image_path)))


def probed_images(records, image_root):
    """The distinct images of the records with captions, resolved against the input's image folder."""
    return {_image(image_root, rec["image_path"]) for _, rec in records if rec.get("orig_captions")}


def trained_images(path):
    """The distinct images of a train file's records (resolved against its folder, as finetune_lgip reads them)."""
    root = os.path.dirname(os.path.abspath(path))
    return {
        _image(root, rec["image_path"])
        for _, rec in iter_json_lines(path)
        if isinstance(rec, dict) and isinstance(rec.get("image_path"), str)
    }


def _arm_of_wise(spec):
    """The arm a WiSE-FT point was mixed from (its wise.meta.json's `arm`): its images are the arm's, else None."""
    folder = arm_folder(spec, "wise.meta.json")
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, "wise.meta.json"), encoding="utf-8") as f:
            arm = json.load(f).get("arm")
    except (OSError, ValueError, AttributeError):
        return None
    return arm if isinstance(arm, dict) else None


def overlap_of(spec, card, records, image_root):
    """The row's `images_seen_overlap` (module docstring), or None when there is no question."""
    folder = arm_folder(spec) or arm_folder(_arm_of_wise(spec))
    if folder is not None:
        path = train_file(folder)
        if not os.path.isfile(path):
            return {"status": "unknown", "images_seen": f"its train side {path}, which is not there"}
        probed = probed_images(records, image_root)
        count = len(probed & trained_images(path))
        return {
            "status": "counted",
            "count": count,
            "fraction": count / len(probed) if probed else None,
            "probed_images": len(probed),
            "train_file": os.path.abspath(path),
        }
    seen = saw_coco(card)
    if seen is not None and is_coco_input(records):
        return {"status": "unknown", "images_seen": seen, "input": "COCO"}
    return None


def overlap_text(flag):
    """The flag in words (the console's line and the page beside the figures); '' for no flag."""
    if not isinstance(flag, dict):
        return ""
    if flag.get("status") == "counted":
        n, k, frac = flag.get("probed_images"), flag.get("count"), flag.get("fraction")
        share = f" ({100 * frac:.1f}%)" if isinstance(frac, (int, float)) else ""
        return f"images seen in training: {k} of {n} probed images{share} in its train side"
    coco = " and this input is COCO" if flag.get("input") == "COCO" else ""
    return f"images seen in training: unknown: it saw {flag.get('images_seen')}{coco}"
