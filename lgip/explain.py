"""lgip.explain: explain_flips.py's machinery (LGIP_SPEC.md section 8): which flips to explain, each
flip and its caption attributed to their words through lgip.attribution, the explain file's lines,
localization accuracy with its intervals, and CLIP4DM's F-CLIPScore with its misalignment
detection (average precision of captions against flips, by s and by F, with intervals over records).

Every function takes the script's settings in force as `cfg` (the dict its CONFIG holds:
JSONL_PATH, IMAGE_ROOT, TOP_K, TEMPLATE, LAYERS, TEXT_BATCH_SIZE, IMAGE_BATCH_SIZE, NUM_WORKERS,
UNSUPPORTED, BOOTSTRAP, BOOTSTRAP_SEED), so the script stays a recipe and a call from Python sees
the same numbers.

    >>> flips = all_flips(records)                      # [(record position, caption index, flip, type), ...]
    >>> flips[0]
    (0, 0, 'A blue bus parked on the side of the street.', 'color')
    >>> m = explain_model(enc, records, flips, sample={0, 5}, cfg=CONFIG)   # writes <stem>__LGIP_explain_<model>.jsonl
    >>> m["localization_acc"], m["chance"]
"""

import os

import numpy as np

from .attribution import (
    align_words,
    attribute,
    blamed_word,
    changed_words,
    check_tower,
    in_fp32,
    pad_ids,
    similarity,
    text_tower,
    token_namer,
    word_scores,
)
from .errors import ModelError
from .images import encode_record_images
from .method import FLIP_TYPES, infer_flip_type
from .records import caption_texts, flip_types, read_json
from .scorefile import read_flip_gaps
from .scoring import add_ci, mean_or_none
from .filenames import metrics_path, score_file


def all_flips(records):
    """(record position, caption index, flip, flip type) of every flip in file order: the typed
    lists when the records have them, else diff_caps typed by the word lists ("other" if none)."""
    flips = []
    for k, (_, rec) in enumerate(records):
        typed = [f[len("diff_caps_") :] for f in rec if f.startswith("diff_caps_")]
        for i, caption in enumerate(rec["orig_captions"]):
            if typed:
                flips += [(k, i, f, t) for t in typed for f in caption_texts(rec, "diff_caps_" + t, i)]
            else:
                flips += [(k, i, f, infer_flip_type(caption, f) or "other") for f in caption_texts(rec, "diff_caps", i)]
    return flips


def top_k(records, flips, name, cfg):
    """({flip index} of the model's TOP_K most preferred flips in its score file of this input, the file or None)."""
    for evaluation in ("fliptypes", "multi"):
        path = score_file(cfg["JSONL_PATH"], evaluation, name)
        if cfg["TOP_K"] and os.path.isfile(path):
            where = {(records[k][0], i, f): j for j, (k, i, f, _) in reversed(list(enumerate(flips)))}
            gaps = sorted(
                (gap, where[(line, i, f)]) for line, i, f, gap in read_flip_gaps(path) if (line, i, f) in where
            )
            return {j for _, j in gaps[: cfg["TOP_K"]]}, path
    return set(), None


def score_protocol(path, cfg):
    """The PROTOCOL a score file's evaluation ran with, from the metrics file beside it; None when unknown."""
    for suffix in ("LGIP_fliptypes.metrics.json", "LGIP_ALL.metrics.json"):
        try:
            for m in read_json(metrics_path(cfg["JSONL_PATH"], suffix)):
                if m.get("scores_file") == os.path.basename(path):
                    return m["run"]["config"]["PROTOCOL"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def attribute_texts(enc, tower, keys, embs, cfg):
    """{(record, text): (s, Alignment, token scores)} for each (record position, text); None where
    the tokens cannot be put on the text's words."""
    import torch

    aligned = align_words(enc.tokenize, [text for _, text in keys], cfg["TEMPLATE"])
    out = {key: None for key, al in zip(keys, aligned) if al is None}
    todo = [(key, al) for key, al in zip(keys, aligned) if al is not None]
    size = cfg["TEXT_BATCH_SIZE"]
    for start in range(0, len(todo), size):
        batch = todo[start : start + size]
        ids = pad_ids(enc, [al.ids for _, al in batch])
        if start == 0:
            enc.info = dict(enc.info, attribution_embedding_diff=check_tower(tower, ids))
        s, scores = attribute(tower, ids, torch.stack([embs[k] for (k, _), _ in batch]), cfg["LAYERS"])
        for r, (key, al) in enumerate(batch):
            out[key] = (float(s[r]), al, scores[r, al.token_pos].tolist())
    return out


def similarities(enc, tower, keys, embs, cfg):
    """{(record, text): cos(image, text)} of the texts as written, as LGIP scores them (a TEMPLATE
    run's gap, and its detected / preferred split, are LGIP's)."""
    import torch

    out, size = {}, cfg["TEXT_BATCH_SIZE"]
    for start in range(0, len(keys), size):
        batch = keys[start : start + size]
        ids = pad_ids(enc, enc.tokenize([text for _, text in batch]))
        out.update(zip(batch, similarity(tower, ids, torch.stack([embs[k] for k, _ in batch])).tolist()))
    return out


def explain(enc, tower, records, flips, drawn, cfg):
    """The explain file's lines, the flips left out {why: count}, and the unreadable images' report."""
    root = cfg["IMAGE_ROOT"] or os.path.dirname(os.path.abspath(cfg["JSONL_PATH"]))
    names = token_namer(enc)
    embs, ok, failed = encode_record_images(
        enc, records, root, cfg["IMAGE_BATCH_SIZE"], cfg["NUM_WORKERS"], indices=sorted({flips[j][0] for j in drawn})
    )
    ok = set(ok)
    keep = [j for j in sorted(drawn) if flips[j][0] in ok]
    keys = list(
        dict.fromkeys(
            key for j in keep for k, i, f, _ in [flips[j]] for key in ((k, records[k][1]["orig_captions"][i]), (k, f))
        )
    )
    done = attribute_texts(enc, tower, keys, embs, cfg)
    written = similarities(enc, tower, keys, embs, cfg) if cfg["TEMPLATE"] else None
    lines, skipped = (
        [],
        {
            "image_unreadable": len(drawn) - len(keep),
            "tokens_not_on_words": 0,
            "no_scored_changed_word": 0,
            "not_one_word_replaced": 0,
        },
    )
    for j in keep:
        k, i, flip, flip_type = flips[j]
        line, rec = records[k]
        caption = rec["orig_captions"][i]
        if done[(k, caption)] is None or done[(k, flip)] is None:
            skipped["tokens_not_on_words"] += 1
            continue
        (s_cap, cal, cap_scores), (s_flip, al, scores) = done[(k, caption)], done[(k, flip)]
        words = word_scores(scores, al.token_word, len(al.words))
        changed = changed_words(caption, flip)
        if len(changed) != 1 or len(caption.split()) != len(flip.split()):  # (section 10: one word replaced by one)
            skipped["not_one_word_replaced"] += 1
            continue
        if any(words[w] is None for w in changed):
            skipped["no_scored_changed_word"] += 1
            continue
        blamed = blamed_word(words)
        cap_words = word_scores(cap_scores, cal.token_word, len(cal.words))
        sims = {"sim_caption": s_cap, "sim_flip": s_flip}
        if written is not None:  # LGIP's gap, as written; the template's similarities, attributed, beside it
            sims = {
                "sim_caption": written[(k, caption)],
                "sim_flip": written[(k, flip)],
                "sim_caption_template": s_cap,
                "sim_flip_template": s_flip,
            }
        lines.append(
            {
                "line": line,
                "image_path": rec["image_path"],
                "caption_index": i,
                "caption": caption,
                "flip": flip,
                "flip_type": flip_type,
                "drawn": drawn[j],
                **sims,
                "gap": sims["sim_caption"] - sims["sim_flip"],
                "tokens": names([al.ids[p] for p in al.token_pos]),
                "token_words": al.token_word,
                "token_scores": scores,
                "words": al.words,
                "word_scores": words,
                "changed": changed,
                "blamed": blamed,
                "hit": blamed in changed,
                "caption_words": cal.words,
                "caption_word_scores": cap_words,
                "fclipscore": fclipscore(words, s_flip),
                "caption_fclipscore": fclipscore(cap_words, s_cap),
            }
        )
    return lines, skipped, failed


def fclipscore(word_scores, s):
    """CLIP4DM's F-CLIPScore (its main.py, most_negative mode; LGIP_SPEC.md section 8): the most negative
    word score (the blamed word's) times (1 - s / 2.5), s the text's attributed cosine with its image;
    None for a text with no scored word.
    >>> round(fclipscore([0.02, -0.04, None], 0.25), 6)
    -0.036
    """
    scored = [w for w in word_scores if w is not None]
    return min(scored) * (1.0 - s / 2.5) if scored else None


def average_precision(scores, positive, weights=None):
    """Average precision of ranking the positives first by score, as scikit-learn's
    average_precision_score computes it: over the distinct scores, highest first, the sum of each
    threshold's recall step times its precision (no interpolation; tied scores are one threshold).
    `weights`: per item, or [resamples, items] for many weightings at once (a bootstrap's draw counts).
    None (or NaN per weighting) when there is no positive or no negative.
    >>> average_precision([0.9, 0.8, 0.8, 0.1], [True, False, True, False])   # 0.5 * 1 + 0.5 * 2/3
    0.8333333333333333
    """
    scores, positive = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    w = np.ones((1, len(scores))) if weights is None else np.atleast_2d(np.asarray(weights, dtype=np.float64))
    order = np.argsort(-scores, kind="mergesort")
    s, p, w = scores[order], positive[order], w[:, order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1] if len(s) else np.array([], dtype=np.int64)
    tp, fp = np.cumsum(w * p, axis=1)[:, last], np.cumsum(w * ~p, axis=1)[:, last]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall = tp / tp[:, -1:] if len(last) else tp
        ap = np.sum(np.diff(np.concatenate([np.zeros((len(w), 1)), recall], axis=1), axis=1) * precision, axis=1)
    ap = np.where((tp[:, -1] > 0) & (fp[:, -1] > 0), ap, np.nan) if len(last) else np.full(len(w), np.nan)
    if weights is None or np.ndim(weights) == 1:
        return None if np.isnan(ap[0]) else float(ap[0])
    return ap


def detection(lines, cfg):
    """Misalignment detection (LGIP_SPEC.md section 8): the captions of the explained flips (each
    distinct record and caption once: positives) against the flips (negatives), ranked by s (CLIPScore:
    the attributed cosine) and by F (F-CLIPScore): detection_ap_clipscore, detection_ap_fclipscore and
    their difference detection_ap_gain (F minus s), each with its interval over records (the same
    resampled records for both); None with a single class."""
    from .scoring import bootstrap_draws

    items = {}
    for x in (
        lines
    ):  # (a caption once, by its text: one written in two slots of a record is attributed once; its flips each once)
        s_cap = x.get("sim_caption_template", x["sim_caption"])
        items.setdefault(("caption", x["line"], x["caption"]), (x["line"], True, s_cap, x["caption_fclipscore"]))
        items[("flip", len(items))] = (x["line"], False, x.get("sim_flip_template", x["sim_flip"]), x["fclipscore"])
    keep = [v for v in items.values() if v[3] is not None]
    block = {
        "detection_num_captions": sum(1 for v in keep if v[1]),
        "detection_num_flips": sum(1 for v in keep if not v[1]),
    }
    names = ("detection_ap_clipscore", "detection_ap_fclipscore", "detection_ap_gain")
    if not keep:
        return dict(block, **{k: None for n in names for k in (n, n + "_ci95")})
    rec, positive = np.array([v[0] for v in keep]), np.array([v[1] for v in keep])
    by_s, by_f = np.array([v[2] for v in keep]), np.array([v[3] for v in keep])
    ap_s, ap_f = average_precision(by_s, positive), average_precision(by_f, positive)
    block.update(zip(names, (ap_s, ap_f, None if ap_s is None or ap_f is None else ap_f - ap_s)))
    cis = {n: None for n in names}
    if cfg["BOOTSTRAP"] and block["detection_ap_gain"] is not None:
        used, where = np.unique(rec, return_inverse=True)
        draws = bootstrap_draws(len(used), cfg["BOOTSTRAP"], cfg["BOOTSTRAP_SEED"])
        stats = {}
        for start in range(0, len(draws), 100):  # (memory: 100 resamples x items at a time)
            w = draws[start : start + 100][:, where].astype(np.float64)
            for n, ap in (
                ("detection_ap_clipscore", average_precision(by_s, positive, w)),
                ("detection_ap_fclipscore", average_precision(by_f, positive, w)),
            ):
                stats.setdefault(n, []).append(ap)
        stats = {n: np.concatenate(v) for n, v in stats.items()}
        stats["detection_ap_gain"] = stats["detection_ap_fclipscore"] - stats["detection_ap_clipscore"]
        for n, v in stats.items():
            v = v[np.isfinite(v)]  # (a resample that drew one class only)
            cis[n] = [float(q) for q in np.quantile(v, [0.025, 0.975])] if len(v) else None
    for n in names:  # each figure's interval right after it
        block[n + "_ci95"] = cis[n]
    return {
        k: block[k]
        for k in ("detection_num_captions", "detection_num_flips") + tuple(x for n in names for x in (n, n + "_ci95"))
    }


def detection_line(m):
    """CLIP4DM's claim, tested on one model, in words: does F-CLIPScore separate captions from flips
    better than CLIPScore, by how much, with the interval of the difference."""
    ap_s, ap_f, gain, ci = (
        m.get(k)
        for k in ("detection_ap_clipscore", "detection_ap_fclipscore", "detection_ap_gain", "detection_ap_gain_ci95")
    )
    if gain is None:
        return "misalignment detection: n/a (needs explained flips and their captions)"
    verdict = "beats" if gain > 0 else "does not beat"
    where = ""
    if ci is not None:
        where = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" + (
            "; the interval excludes 0" if ci[0] > 0 or ci[1] < 0 else "; the interval includes 0"
        )
    return (
        f"misalignment detection (captions vs flips): AP by F-CLIPScore {ap_f:.3f}, by CLIPScore {ap_s:.3f}: "
        f"F {verdict} s by {gain:+.3f}{where}"
    )


def localization(lines, cfg):
    """localization_acc (with its interval) over all these lines, those the model detects (gap > 0)
    and those it prefers (gap <= 0); chance: the mean share of a flip's words that changed."""
    hit = np.array([line["hit"] for line in lines], dtype=np.float64)
    gap, idx = np.array([line["gap"] for line in lines]), np.arange(len(lines))
    boot = cfg["BOOTSTRAP"], cfg["BOOTSTRAP_SEED"]
    block = {"count": len(lines), "localization_acc": mean_or_none(hit)}
    add_ci(block, "localization_acc", idx, hit, *boot)
    for name, sel in (("detected", gap > 0), ("preferred", gap <= 0)):
        block[f"localization_acc_{name}"] = mean_or_none(hit[sel])
        add_ci(block, f"localization_acc_{name}", idx[sel], hit[sel], *boot)
        block[f"num_{name}"] = int(sel.sum())
    block["chance"] = mean_or_none([len(line["changed"]) / len(line["words"]) for line in lines])
    return block


def localization_compared(lines):
    """[(figure, each explained flip's record line, its value)]: the per-flip values of localization_acc,
    which models are compared on (LGIP_SPEC.md sections 9 and 12: resampling images, a flip with its
    record's image)."""
    return [
        (
            "localization_acc",
            np.array([x["line"] for x in lines], dtype=np.int64),
            np.array([x["hit"] for x in lines], dtype=bool),
        )
    ]


def type_order(records, lines):
    """The flip types of the lines, in the input's order (its diff_caps_<type> lists' first
    appearance: LGIP's color, number, object; a benchmark's own), then any other (untyped input)."""
    present = {x["flip_type"] for x in lines}
    known = [t for t in flip_types(records) + list(FLIP_TYPES) if t in present]
    return list(dict.fromkeys(known + sorted(present)))


def explain_path(cfg, name):
    """The explain file of model `name`: one line per flip explained, beside the metrics."""
    return metrics_path(cfg["JSONL_PATH"], f"LGIP_explain_{name}.jsonl")


def explain_model(enc, records, flips, sample, cfg):
    """One model's metrics (with its image report and family, for the run block, and `_lines`, its explain
    file's lines, which the caller writes); {"unsupported": why} for a family word attribution cannot explain
    (UNSUPPORTED "skip")."""
    try:
        tower = text_tower(getattr(enc, "model", None))  # an unsupported family: named, with the supported ones
    except ModelError as e:
        if cfg["UNSUPPORTED"] == "stop":
            raise
        return {"model_tag": enc.name, "num_flips": 0, "unsupported": str(e), "image_report": {}, "family": None}
    top, score_file = top_k(records, flips, enc.name, cfg)
    protocol = score_file and score_protocol(score_file, cfg)
    if protocol not in (None, "corrected"):
        print(
            f"{enc.name}: note: its TOP_K flips are those {os.path.basename(score_file)} scores lowest, under "
            f"PROTOCOL={protocol!r}; they are explained as the corrected protocol encodes them",
            flush=True,
        )
    drawn = {j: ["random"] * (j in sample) + ["top_k"] * (j in top) for j in sample | top}
    with in_fp32(enc) as cast:  # (a model in memory runs in its own dtype: in fp32 here, then back)
        lines, skipped, failed = explain(enc, tower, records, flips, drawn, cfg)
    if cast:
        enc.info = dict(enc.info, attribution_in_fp32_from=cast)
    block = localization(lines, cfg)
    return {
        "model_tag": enc.name,
        "num_flips": block.pop("count"),
        **block,
        "_compared": localization_compared(lines),
        **detection(lines, cfg),
        "by_flip_type": {
            ft: dict(localization(typed, cfg), **detection(typed, cfg))
            for ft in type_order(records, lines)
            for typed in [[x for x in lines if x["flip_type"] == ft]]
        },
        "num_random": sum("random" in x["drawn"] for x in lines),
        "num_top_k": sum("top_k" in x["drawn"] for x in lines),
        "skipped": skipped,
        "explain_file": os.path.basename(explain_path(cfg, enc.name)),
        "_lines": lines,  # (one per flip: the caller writes them to explain_file)
        "score_file": score_file and os.path.basename(score_file),
        "score_file_protocol": protocol,
        "image_report": failed,
        "family": tower.family,
    }
