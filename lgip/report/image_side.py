"""lgip.report.image_side: the image side in the report (run_lgip_images.py, LGIP_SPEC.md section 11):
a line per model setting its image figures beside its text figures, and the altered images a model
prefers to the original for the original's own caption, streamed from the image score files and
remade for the page from what each line records (the original, the other image, SEED and r), so the
page shows the pixels the model scored, original and altered side by side.

An altered image is one (model, record, kind): of its record's captions, the one that prefers it
most (the most negative image gap, sim(image, caption) - sim(altered, caption)) and how many of
them prefer it. The top K per model and over all models are kept, as lgip.report.toplists keeps
the text side's.

    >>> files, missing = image_score_files(metrics, found)
    >>> tops = scan_altered(files, k=10)
    >>> row = tops.lists[None][0]; row["kind"], row["gap"] < 0, row["preferred"], row["captions"]
    ('mix', True, 3, 5)
    >>> items = altered_items(tops, image_roots(metrics, found), labels, seeds(metrics))
    >>> items[0]["thumb"]["src"][:23], items[0]["altered_thumb"]["src"][:23]
    ('data:image/jpeg;base64,', 'data:image/jpeg;base64,')
"""

import math
import os
from dataclasses import dataclass

from ..errors import InputError
from ..scorefile import iter_score_lines
from .gallery import image_thumbnail, resolve_image, thumbnail
from .extract import IMAGE_FLIP_KINDS, IMAGE_PARAPHRASE_KINDS
from .evaluations import SCRIPTS
from .tables import interval, num
from .toplists import TopK, image_label, in_turn, score_files

KEY = "images"  # the evaluation's key in lgip.report.EVALUATIONS
KIND_NAMES = {"mix": "another image blended in (10%)", "patch": "a patch of another image pasted in"}


@dataclass
class AlteredTops:
    lists: dict  # {model: its top rows, None: the top rows over all models}
    k: int


def image_score_files(metrics, paths):
    """[(evaluation, model, image score file)] that exist, and the missing ones."""
    return score_files(metrics, paths, evaluations=[KEY])


def _check_item(item, where):
    """An image_flips item: {"text": a flip kind, "sim": a number, "other_image_path": a path,
    "r": an int >= 0 (absent in a file from before it)}; InputError naming path:line and the field."""
    if not isinstance(item, dict):
        raise InputError(f"{where} is not an object")
    if item.get("text") not in IMAGE_FLIP_KINDS:
        raise InputError(f"{where}.text is {item.get('text')!r}, not one of {', '.join(IMAGE_FLIP_KINDS)}")
    sim = item.get("sim")
    if isinstance(sim, bool) or not isinstance(sim, (int, float)) or not math.isfinite(sim):
        raise InputError(f"{where}.sim is {sim!r}, not a finite number")
    if not isinstance(item.get("other_image_path"), str) or not item["other_image_path"]:
        raise InputError(f"{where}.other_image_path is {item.get('other_image_path')!r}, not an image path")
    r = item.get("r")
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
        raise InputError(f"{where}.r is {r!r}, not the record's index among the readable ones (an int >= 0)")


def scan_altered(files, k):
    """Stream image score files [(evaluation, model, path)] into the top k altered images each model
    prefers to their original (per model and over all models), ranked by how much the caption that
    prefers it most prefers it (-gap); models of several score kinds, each model's in turn. A record's
    lines are consecutive in a score file."""
    every = TopK(k)
    tops, kinds = {None: every}, {}
    for _, model, path in files:
        mine = tops.setdefault(model, TopK(k))
        groups, current = {}, None

        def flush():
            for (line, kind), g in groups.items():
                if g["preferred"]:
                    row = dict(g["worst"], model=model, preferred=g["preferred"], captions=g["captions"])
                    for top in (mine, every):
                        top.offer(-row["gap"], (model, line, kind), row)
            groups.clear()

        for lineno, r in iter_score_lines(path, ("line", "caption_index")):
            if r["line"] != current:
                flush()
                current = r["line"]
            base = r.get("sim")
            kinds.setdefault(model, r.get("score_kind") or "cosine")
            if base is None:
                continue
            flips = r.get("image_flips") or []
            if not isinstance(flips, list):
                raise InputError(f"{path}:{lineno}: field 'image_flips' is not a list (not an image score file)")
            for j, item in enumerate(flips):
                _check_item(item, f"{path}:{lineno}: field 'image_flips[{j}]'")
                gap = base - item["sim"]
                g = groups.setdefault((r["line"], item["text"]), {"captions": 0, "preferred": 0, "worst": None})
                g["captions"] += 1
                if gap < 0:
                    g["preferred"] += 1
                    if g["worst"] is None or gap < g["worst"]["gap"]:
                        g["worst"] = {
                            "line": r["line"],
                            "image": image_label(r),
                            "image_path": r.get("image_path"),
                            "caption_index": r["caption_index"],
                            "caption": r.get("caption"),
                            "caption_sim": base,
                            "kind": item["text"],
                            "sim": item["sim"],
                            "gap": gap,
                            "other_image_path": item["other_image_path"],
                            "r": item.get("r"),
                        }
        flush()
    lists = {key: t.rows() for key, t in tops.items()}
    if len(set(kinds.values())) > 1:  # (scores of several kinds, LGIP_SPEC.md 13: each model's in turn)
        lists[None] = in_turn([rows for m, rows in lists.items() if m is not None], k)
    return AlteredTops(lists, k)


def seeds(metrics):
    """{model: the SEED its run_lgip_images.py run made its altered images with} (0 when unrecorded)."""
    out = {}
    for m in metrics.get(KEY, ()):
        seed = ((m.get("run") or {}).get("config") or {}).get("SEED", 0)
        out[m["model_tag"]] = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    return out


def remake(path, other_path, kind, seed, r):
    """The altered image a line of an image score file scored, made again as run_lgip_images.py
    made it (lgip.alterations: the same pixels for the same SEED and r)."""
    from ..alterations import alter
    from ..images import open_rgb

    if kind == "patch" and r is None:
        raise ValueError("the score file has no 'r' (written before it): re-run run_lgip_images.py to see it")
    return alter(open_rgb(path), kind, open_rgb(other_path), seed, r or 0)


def _altered_thumb(item, seed, px):
    if not os.path.isfile(item["path"]):
        return {"error": "image not found", "path": item["path"]}
    if not os.path.isfile(item["other_path"]):
        return {"error": "other image not found", "path": item["other_path"]}
    try:
        img = remake(item["path"], item["other_path"], item["kind"], seed, item["r"])
    except Exception as e:  # a placeholder saying why, never a stopped report
        return {"error": f"not remade ({type(e).__name__}: {e})", "path": item["path"]}
    return image_thumbnail(img, px)


def altered_items(tops, roots, labels, model_seeds, thumb_px=200):
    """The page's cards: one per (model, record, kind) of the lists, with its ranks (in the list over
    all models, then its model's), the original's thumbnail (`thumb`) and the altered image's
    (`altered_thumb`, remade), each read once however many cards show it."""
    items = {}
    for model, rows in sorted(tops.lists.items(), key=lambda kv: kv[0] is not None):  # None (all models) first
        for rank, row in enumerate(rows, 1):
            key = (row["model"], row["line"], row["kind"])
            if key not in items:
                folders = roots.get((KEY, row["model"]), [])
                path, _ = resolve_image(row.get("image_path") or "", folders)
                other, _ = resolve_image(row["other_image_path"], folders)
                items[key] = dict(
                    row,
                    label=labels.get(row["model"], row["model"]),
                    source=SCRIPTS[KEY],
                    path=path,
                    other_path=other,
                    rank_all=None,
                    rank_model=None,
                )
            items[key]["rank_all" if model is None else "rank_model"] = rank
    out = list(items.values())
    originals, altered = {}, {}
    for it in out:
        if it["path"] not in originals:
            originals[it["path"]] = thumbnail(it["path"], thumb_px)
        it["thumb"] = originals[it["path"]]
        seed = model_seeds.get(it["model"], 0)
        made = (it["path"], it["other_path"], it["kind"], seed, it["r"])
        if made not in altered:
            altered[made] = _altered_thumb(it, seed, thumb_px)
        it["altered_thumb"] = altered[made]
    return out


LEAD = (
    "The same questions asked of the image (`run_lgip_images.py`, LGIP_SPEC.md section 11, after RoCOCO): does the "
    "caption's score stay put when its image is re-encoded as JPEG, halved and restored, cropped to its centre or "
    "mirrored (image invariance error, lower is better: the text side's is the paraphrases'), and drop when another "
    "image is blended in at 10% (`mix`) or pasted in as a patch (`patch`; image positive rate: the share scored below "
    "the original, 0.5 = chance, beside the flips' positive rate)? RoCOCO's text-to-image test puts the altered "
    "images in the gallery: how often one of them outranks every original for a caption."
)


def _verdict(r):
    lo, hi = r.get("image_pos_rate_ci_lo"), r.get("image_pos_rate_ci_hi")
    if lo is None or hi is None:
        return ""
    if lo > 0.5:
        return ": above chance"
    if hi < 0.5:
        return ": **below chance** (it prefers the altered images)"
    return ": **at chance level** (its interval contains 0.5: it does not tell its image from an altered one)"


def image_line(r, m):
    """One model's sentence: its image figures beside its text figures, per flip kind, and RoCOCO's
    text-to-image figure with the altered images in the gallery."""

    def fig(name, digits):
        ci = interval(r, name, digits)
        return num(r.get(name), digits) + (f" {ci}" if ci else "")

    text_inv = f" (text: {num(r['invariance_error'], 4)})" if r.get("invariance_error") is not None else ""
    text_pos = f" (text: {num(r['pos_rate'], 3)})" if r.get("pos_rate") is not None else ""
    out = f"`{r['model']}`: image invariance error {fig('image_invariance_error', 4)}{text_inv}"
    kinds = [k for k in IMAGE_FLIP_KINDS if r.get(f"image_{k}_pos_rate") is not None]
    if r.get("image_pos_rate") is None:
        note = next(
            (b.get("note") for b in (m.get("by_kind") or {}).values() if isinstance(b, dict) and b.get("note")), None
        )
        return out + "; no image flips" + (f" ({note.rstrip('.')})" if note else "") + "."
    out += f"; image positive rate {fig('image_pos_rate', 3)}{text_pos}{_verdict(r)}"
    if kinds:
        out += "; by kind " + ", ".join(f"{k} {num(r[f'image_{k}_pos_rate'], 3)}" for k in kinds)
        top1 = [k for k in kinds if r.get(f"image_{k}_t2i_flip_top1_rate") is not None]
        if top1:
            out += (
                "; with the altered images in the gallery, one of them ranks first for "
                + " and ".join(f"{num(r[f'image_{k}_t2i_flip_top1_rate'], 3)} ({k})" for k in top1)
                + " of the captions"
            )
    return out + "."


def image_side_lines(rows, metrics, paths):
    """{"lead", "lines": [{"model", "text"}], "notes"} for the markdown and the page; None without
    run_lgip_images.py's metrics."""
    if KEY not in metrics:
        return None
    by_tag = {m["model_tag"]: m for m in metrics[KEY]}
    lines = [{"model": r["model"], "text": image_line(r, by_tag[r["model"]])} for r in rows if r["model"] in by_tag]
    config = (metrics[KEY][0].get("run") or {}).get("config") or {}
    kinds = [k for k in config.get("KINDS") or (*IMAGE_PARAPHRASE_KINDS, *IMAGE_FLIP_KINDS)]
    notes = [
        f"From `{os.path.basename(paths[KEY])}` (kinds {', '.join(kinds)}; SEED {config.get('SEED', 0)}: which "
        "record lends its image, and where patch's box lies); every kind's figures, with intervals, are in the CSV "
        '(`image_<kind>_*`). The altered images the models prefer are under "Failures, with their images".'
    ]
    return {"lead": LEAD, "lines": lines, "notes": notes}


def markdown_rows(tops, max_text_chars=0):
    """(header, cells, align) of the markdown's list of the altered images preferred over all models."""
    from .tables import md_text

    header = [
        "#",
        "Model",
        "Image",
        "Kind",
        "Gap",
        "Captions preferring it",
        "Caption (the one preferring it most)",
        "Other image",
    ]
    cells = [
        [
            str(i),
            f"`{row['model']}`",
            str(row["image"]),
            row["kind"],
            f"{row['gap']:+.4f}",
            f"{row['preferred']} of {row['captions']}",
            md_text(row["caption"] or "", max_text_chars),
            f"`{os.path.basename(row['other_image_path'])}`",
        ]
        for i, row in enumerate(tops.lists.get(None, []), 1)
    ]
    return header, cells, ["r", "l", "l", "l", "r", "r", "l", "l"]
