"""lgip.report.gallery: the page's galleries as plain dicts, one per flip or paraphrase of the
top lists: its image as a small JPEG `data:` URI (or why there is none), the caption and the
flip or paraphrase word by word with the words that differ marked, both similarities, the gap
(or change), the flip's prior gap when its score file has it (whether the model prefers the flip on
the average other image too: a text prior), the flip type, and its rank in its model's list and in
the list over all models.

A word is a dict {"text", "changed"}. `attach_attributions` adds explain_flips.py's word
attribution to the flips it explained: each word's "score", "strength" (|score| over the
largest |score| of its flip) and "blamed", and the item's "attribution" (the blamed word,
whether it is the changed one, that run's similarities).

    >>> _, words = word_marks("a yellow train", "a green train")
    >>> [w["text"] for w in words if w["changed"]]
    ['green']
    >>> items = gallery_items(tops, roots, labels, thumb_px=200)
    >>> items["flips"][0]["thumb"]["src"][:23], items["flips"][0]["rank_all"]
    ('data:image/jpeg;base64,', 1)
    >>> files, missing = explain_files(metrics, found)      # the demo, run_all.py with the tiny models
    >>> attach_attributions(items["flips"], files), len(items["flips"])    # flips with an explain line
    (8, 20)
    >>> [(w["text"], round(w["score"], 4), w["blamed"]) for w in items["flips"][1]["words"]][:3]
    [('two', 0.001, False), ('dogs', 0.0067, False), ('playing', -0.0011, True)]
    >>> items["flips"][1]["attribution"]["blamed"], items["flips"][1]["attribution"]["hit"]
    ('playing', False)
"""

import base64
import difflib
import io
import os

from ..errors import InputError
from ..records import iter_json_lines
from ..util import finite_number


def word_marks(caption, text):
    """(caption words, text words): the texts split on whitespace, each word {"text", "changed"}.
    Texts of as many words are compared position by position (a flip replaces one word by one
    word: LGIP_SPEC.md 8); others by the longest matching runs of words (a paraphrase's added
    prefix, a synonym, a passive rewrite)."""
    a, b = caption.split(), text.split()
    if len(a) == len(b):
        changed_a = changed_b = [x != y for x, y in zip(a, b)]
    else:
        changed_a, changed_b = [True] * len(a), [True] * len(b)
        for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
            for j in range(block.size):
                changed_a[block.a + j] = changed_b[block.b + j] = False
    return (
        [{"text": w, "changed": c} for w, c in zip(a, changed_a)],
        [{"text": w, "changed": c} for w, c in zip(b, changed_b)],
    )


def resolve_image(image_path, roots):
    """(the first existing path of image_path under roots, or the first candidate, and whether
    it exists). An absolute image_path is taken as it is."""
    candidates = [os.path.join(root, image_path) for root in roots] or [image_path]
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path), True
    return os.path.abspath(candidates[0]), False


def thumbnail(path, px, quality=80):
    """{"src": JPEG data URI, "width", "height"} of the image at `path` fitted in px x px, as the
    model saw it (decoded and converted to RGB as the evaluations do, no EXIF rotation); or
    {"error": why, "path": path} when it cannot be read."""
    from ..images import open_rgb

    if not os.path.isfile(path):
        return {"error": "image not found", "path": path}
    try:
        return image_thumbnail(open_rgb(path), px, quality)
    except Exception as e:  # any unreadable image gets a placeholder, never stops the report
        return {"error": f"unreadable image ({type(e).__name__}: {e})", "path": path}


def image_thumbnail(img, px, quality=80):
    """{"src", "width", "height"} of a decoded RGB image (PIL) fitted in px x px, as thumbnail's."""
    from PIL import Image

    img = img.copy()
    img.thumbnail((px, px), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, optimize=True)
    return {
        "src": "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"),
        "width": img.width,
        "height": img.height,
    }


def _item(row, kind, label, roots):
    caption_words, words = word_marks(row["caption"] or "", row["text"])
    path, _ = resolve_image(row.get("image_path") or "", roots.get((row["source"], row["model"]), []))
    item = {
        "kind": kind,
        "model": row["model"],
        "label": label,
        "source": row["source"],
        "image": row["image"],
        "image_path": row.get("image_path"),
        "path": path,
        "caption": row["caption"],
        "caption_sim": row["caption_sim"],
        "caption_words": caption_words,
        "text": row["text"],
        "sim": row["sim"],
        "words": words,
        "rank_all": None,
        "rank_model": None,
    }
    if kind == "flip":
        item.update(
            type=row.get("type"), gap=row["gap"], prior_gap=row.get("prior_gap")
        )  # (None: not in its score file)
    else:
        item.update(para_kind=row.get("kind"), delta=row["delta"])
    return item


def _items(lists, kind, labels, roots):
    """One item per (model, image, caption, text) of the lists, with its ranks, in the order of
    the list over all models, then each model's."""
    items = {}
    for model, rows in sorted(lists.items(), key=lambda kv: kv[0] is not None):  # None (all models) first
        for rank, row in enumerate(rows, 1):
            key = (row["model"], row.get("image_path"), row["caption"], row["text"])
            item = items.get(key) or items.setdefault(
                key, _item(row, kind, labels.get(row["model"], row["model"]), roots)
            )
            item["rank_all" if model is None else "rank_model"] = rank
    return list(items.values())


def gallery_items(tops, roots, labels, thumb_px=200):
    """{"flips": [...], "paraphrases": [...]} from a TopLists; roots: {(evaluation, model): image
    folders} (lgip.report.image_roots); labels: model tag -> label. Each image is read
    and encoded once, however many items show it."""
    out = {
        "flips": _items(tops.flips, "flip", labels, roots),
        "paraphrases": _items(tops.paraphrases, "paraphrase", labels, roots),
    }
    thumbs = {}
    for item in out["flips"] + out["paraphrases"]:
        if item["path"] not in thumbs:
            thumbs[item["path"]] = thumbnail(item["path"], thumb_px)
        item["thumb"] = thumbs[item["path"]]
    return out


EXPLAIN_FIELDS = (
    "image_path",
    "caption",
    "flip",
    "words",
    "word_scores",
    "changed",
    "blamed",
    "hit",
    "sim_caption",
    "sim_flip",
    "gap",
)


def explain_files(metrics, paths):
    """[(model, explain file)] that exist and [(model, explain file)] that the explain_flips.py
    metrics list but that are not there."""
    files, missing = [], []
    folder = os.path.dirname(os.path.abspath(paths.get("explain", "")))
    for m in metrics.get("explain", ()):
        if m.get("explain_file"):
            path = os.path.join(folder, m["explain_file"])
            (files if os.path.isfile(path) else missing).append((m["model_tag"], path))
    return files, missing


def _check(line):
    """Why an explain line cannot colour its flip's words, or None."""
    if not isinstance(line, dict):
        return "not a JSON object"
    absent = [k for k in EXPLAIN_FIELDS if k not in line]
    if absent:
        return f"missing {', '.join(absent)} (not an explain_flips.py line)"
    for key in ("image_path", "caption", "flip"):
        if not isinstance(line[key], str):
            return f"field {key!r} is {type(line[key]).__name__}, not a string"
    for key in ("words", "word_scores", "changed"):
        if not isinstance(line[key], list):
            return f"field {key!r} is {type(line[key]).__name__}, not a list"
    if not isinstance(line["hit"], bool):
        return f"field 'hit' is {line['hit']!r}, not true or false"
    for key in ("sim_caption", "sim_flip", "gap"):
        if not finite_number(line[key]):
            return f"field {key!r} is {line[key]!r}, not a finite number"[:200]
    if not all(v is None or finite_number(v) for v in line["word_scores"]):
        return "field 'word_scores' holds a value that is not a finite number or null"
    n = len(line["words"])
    if line["words"] != line["flip"].split() or len(line["word_scores"]) != n:
        return "words and word_scores are not the flip's whitespace words"
    if not all(
        isinstance(k, int) and not isinstance(k, bool) and 0 <= k < n for k in [line["blamed"], *line["changed"]]
    ):
        return f"blamed {line['blamed']!r} or changed {line['changed']!r} is not a word index"
    return None


def _attach(item, line):
    """The line's word scores on the item's flip words (the same whitespace words: checked)."""
    words, scores = item["words"], line["word_scores"]
    scale = max((abs(v) for v in scores if v is not None), default=0.0)
    changed = set(line["changed"])
    for k, (w, v) in enumerate(zip(words, scores)):
        w.update(
            score=v,
            blamed=k == line["blamed"],
            changed=k in changed,  # (its changed words: the card's marks agree)
            strength=None if v is None else round(abs(v) / scale, 2) if scale else 0.0,
        )
    item["attribution"] = {
        "blamed": words[line["blamed"]]["text"],
        "hit": bool(line["hit"]),
        "changed": [words[k]["text"] for k in line["changed"]],
        "sim_caption": line["sim_caption"],
        "sim_flip": line["sim_flip"],
        "gap": line["gap"],
    }


def attach_attributions(flips, files):
    """Give each flip item the explain line of its model for its image path, caption and flip
    text (the same texts under two caption indices have one attribution: the first line's);
    items without one stay as they are. files: [(model, explain file)]. Returns how many got one."""
    wanted = {}
    for item in flips:
        wanted.setdefault((item["model"], item.get("image_path"), item["caption"], item["text"]), []).append(item)
    done = 0
    for model, path in files:
        for lineno, line in iter_json_lines(path):  # (a byte-order mark at its start is fine)
            why = _check(line)
            if why:
                raise InputError(f"{path}:{lineno}: {why}")
            for item in wanted.pop((model, line["image_path"], line["caption"], line["flip"]), ()):
                _attach(item, line)
                done += 1
    return done
