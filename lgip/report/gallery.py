"""lgip.report.gallery: the page's galleries as plain dicts, one per flip or paraphrase of the
top lists: its image as a small JPEG `data:` URI (or why there is none), the caption and the
flip or paraphrase word by word with the words that differ marked, both similarities, the gap
(or change), the flip type, and its rank in its model's list and in the list over all models.

A word is a dict {"text", "changed"}; a later step may add keys to it (say "score" and "blamed"
from a word attribution) and to the item before the page is rendered.

    >>> _, words = word_marks("a yellow train", "a green train")
    >>> [w["text"] for w in words if w["changed"]]
    ['green']
    >>> items = gallery_items(tops, roots, labels, thumb_px=200)
    >>> items["flips"][0]["thumb"]["src"][:23], items["flips"][0]["rank_all"]
    ('data:image/jpeg;base64,', 1)
"""
import base64
import difflib
import io
import os


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
    return ([{"text": w, "changed": c} for w, c in zip(a, changed_a)],
            [{"text": w, "changed": c} for w, c in zip(b, changed_b)])


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
    from PIL import Image

    from ..images import open_rgb
    if not os.path.isfile(path):
        return {"error": "image not found", "path": path}
    try:
        img = open_rgb(path)
        img.thumbnail((px, px), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality, optimize=True)
    except Exception as e:  # any unreadable image gets a placeholder, never stops the report
        return {"error": f"unreadable image ({type(e).__name__}: {e})", "path": path}
    return {"src": "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"),
            "width": img.width, "height": img.height}


def _item(row, kind, label, roots):
    caption_words, words = word_marks(row["caption"] or "", row["text"])
    path, _ = resolve_image(row.get("image_path") or "", roots.get((row["source"], row["model"]), []))
    item = {"kind": kind, "model": row["model"], "label": label, "source": row["source"],
            "image": row["image"], "image_path": row.get("image_path"), "path": path,
            "caption": row["caption"], "caption_sim": row["caption_sim"], "caption_words": caption_words,
            "text": row["text"], "sim": row["sim"], "words": words, "rank_all": None, "rank_model": None}
    if kind == "flip":
        item.update(type=row.get("type"), gap=row["gap"])
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
            item = items.get(key) or items.setdefault(key, _item(row, kind, labels.get(row["model"], row["model"]), roots))
            item["rank_all" if model is None else "rank_model"] = rank
    return list(items.values())


def gallery_items(tops, roots, labels, thumb_px=200):
    """{"flips": [...], "paraphrases": [...]} from a TopLists; roots: {(evaluation, model): image
    folders} (lgip.report.metrics.image_roots); labels: model tag -> label. Each image is read
    and encoded once, however many items show it."""
    out = {"flips": _items(tops.flips, "flip", labels, roots),
           "paraphrases": _items(tops.paraphrases, "paraphrase", labels, roots)}
    thumbs = {}
    for item in out["flips"] + out["paraphrases"]:
        if item["path"] not in thumbs:
            thumbs[item["path"]] = thumbnail(item["path"], thumb_px)
        item["thumb"] = thumbs[item["path"]]
    return out
