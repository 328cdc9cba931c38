"""lgip.report.finetune_text: the section "Fine-tuning" (LGIP_SPEC.md 14) of a report on a fine-tuning run's
held-out file: which of the report's models are fine-tuned arms (a MODELS spec naming a `<folder>/model` with
`<folder>/finetune.meta.json` beside it) and of which start, each arm's meta and train_log.jsonl read and
checked (a bad field is an InputError naming the file, the line and the field), and said: a table of the start
and its arms on the held-out images, the paired comparisons of each arm with its start and with the other arms,
a sentence per arm on whether it beat its start, and the loss curves' data (drawn by lgip.report.finetune_plot).

    >>> fine = load_finetune(metrics, [r["model"] for r in rows])   # None when no model is a fine-tuned arm
    >>> lines = finetune_lines(fine, rows, report.comparisons, found)  # {"title", "lead", "header", "rows", ...}
"""

import math
import os

from ..errors import InputError
from ..overlap import arm_folder  # (a fine-tuned arm's folder: its meta beside `<folder>/model`)
from ..records import iter_json_lines, read_json
from ..util import finite_number
from .controls_text import COMPARED_NAMES
from .evaluations import row_spec
from .fields import what_is
from .tables import interval, num

WEIGHTS = ("W_SC", "W_INV", "W_VC")
TERMS = ("loss", "loss_clip", "loss_sc", "loss_inv", "loss_vc")  # train_log.jsonl's loss terms, total first
RECALL = ("retrieval_i2t_recall@1", "retrieval_t2i_recall@1")  # the table's retrieval columns
LOWER_IS_BETTER = ("invariance_error_mean", "invariance_error_rel", "i2t_flip_top1_rate")
AGAIN = "run finetune_lgip.py again (it resumes and rewrites it)"


def model_specs(metrics):
    """{model tag: its MODELS spec}, from the run config of the metrics rows (the first row naming it)."""
    specs = {}
    for rows in metrics.values():
        for m in rows:
            spec = row_spec(m)
            if spec is not None:
                specs.setdefault(m["model_tag"], spec)
    return specs


def _count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def load_meta(path):
    """An arm's finetune.meta.json: {"status", "start" (its start's name), "steps_done", "steps", "weights"
    {W_SC, W_INV, W_VC}, "heldout_images" (or None)}; InputError naming the file and the field."""
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not finetune_lgip.py's meta (a JSON object), got {what_is(meta)}; {AGAIN}")
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}

    def field(name, ok, what):
        where, v = (f"config.{name}", config[name]) if name in config else (name, meta.get(name))
        if not ok(v):
            raise InputError(f"{path}: field '{where}' is {what_is(v)}, not {what}; {AGAIN}")
        return v

    start = meta.get("start")
    if not (isinstance(start, dict) and isinstance(start.get("name"), str) and start["name"]):
        raise InputError(f"{path}: field 'start.name' is missing or not a model name ({what_is(start)}); {AGAIN}")
    split = meta.get("split") if isinstance(meta.get("split"), dict) else {}
    images = split.get("images") if isinstance(split.get("images"), dict) else {}
    return {
        "status": field("status", lambda v: v in ("running", "done"), '"running" or "done"'),
        "start": start["name"],
        "steps_done": field("steps_done", _count, "a count of steps"),
        "steps": field("STEPS", _count, "a count of steps"),
        "weights": {w: field(w, lambda v: finite_number(v) and v >= 0, "a number >= 0") for w in WEIGHTS},
        "heldout_images": images.get("heldout") if _count(images.get("heldout")) else None,
    }


def load_wise_meta(path):
    """A WiSE-FT point's wise.meta.json (wise_ft.py's): {"alpha", "arm" (its arm's name), "start" (its start's
    name)}; InputError naming the file and the field."""
    meta = read_json(path)
    again = "run wise_ft.py again (run_all's wise_ft step)"
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not wise_ft.py's meta (a JSON object), got {what_is(meta)}; {again}")
    alpha = meta.get("alpha")
    if not (finite_number(alpha) and 0 <= alpha <= 1):
        raise InputError(f"{path}: field 'alpha' is {what_is(alpha)}, not a number from 0 to 1; {again}")
    out = {"alpha": float(alpha)}
    for key in ("arm", "start"):
        v = meta.get(key)
        if not (isinstance(v, dict) and isinstance(v.get("name"), str) and v["name"]):
            raise InputError(f"{path}: field '{key}.name' is missing or not a model name ({what_is(v)}); {again}")
        out[key] = v["name"]
    return out


def load_log(path):
    """An arm's train_log.jsonl: [{"step", "loss", "loss_clip", ...}], a term absent or null as None (a term of
    weight 0), a diverged loss (NaN, inf) kept; InputError naming the file, the line and the field. [] without it."""
    if not os.path.isfile(path):
        return []
    out = []
    for lineno, x in iter_json_lines(path):
        if not isinstance(x, dict):
            raise InputError(f"{path}: line {lineno}: not a JSON object ({what_is(x)}); {AGAIN}")
        if not _count(x.get("step")):
            raise InputError(f"{path}: line {lineno}: field 'step' is {what_is(x.get('step'))}, not a step number")
        line = {"step": x["step"]}
        for term in TERMS:
            v = x.get(term)
            if (v is None and term != "loss") or (isinstance(v, (int, float)) and not isinstance(v, bool)):
                line[term] = None if v is None else float(v)
            else:
                raise InputError(f"{path}: line {lineno}: field '{term}' is {what_is(v)}, not a number; {AGAIN}")
        out.append(line)
    return out


def load_finetune(metrics, tags):
    """The report's fine-tuned arms, in `tags`' order: {"arms": [{"model", "folder", "start", "meta", "log"}],
    "points": [{"model", "folder", "start", "arm", "alpha"}] (their WiSE-FT points, wise_ft.py's, by arm and
    alpha), "starts": [the arms' and points' starts among `tags`]}; None when no model is an arm or a point."""
    specs = model_specs(metrics)
    arms, points = [], []
    for tag in tags:
        folder = arm_folder(specs[tag]) if tag in specs else None
        if folder is not None:
            meta = load_meta(os.path.join(folder, "finetune.meta.json"))
            log = load_log(os.path.join(folder, "train_log.jsonl"))
            arms.append({"model": tag, "folder": folder, "start": meta["start"], "meta": meta, "log": log})
            continue
        folder = arm_folder(specs[tag], "wise.meta.json") if tag in specs else None
        if folder is not None:
            points.append(dict(load_wise_meta(os.path.join(folder, "wise.meta.json")), model=tag, folder=folder))
    if not arms and not points:
        return None
    points.sort(key=lambda p: (p["arm"], p["alpha"]))
    ours = arms + points
    return {"arms": arms, "points": points, "starts": [t for t in tags if any(a["start"] == t for a in ours)]}


def _lineup(fine):
    """[(tag, arm or point or None)] in the section's order: each start, its arms, each arm's WiSE-FT points by
    alpha; then the arms and points whose start (or arm) is not in the report. A start is shown once, as a start."""
    points = fine.get("points", [])
    order = []
    for s in fine["starts"]:
        order.append((s, None))
        for a in [a for a in fine["arms"] if a["start"] == s]:
            order += [(a["model"], a)] + [(p["model"], p) for p in points if p["arm"] == a["model"]]
    order += [(a["model"], a) for a in fine["arms"] if a["start"] not in fine["starts"]]
    placed = {t for t, _ in order}
    order += [(p["model"], p) for p in points if p["model"] not in placed]
    seen = set()
    return [(t, a) for t, a in order if (a is None or t not in fine["starts"]) and not (t in seen or seen.add(t))]


def _value(r, name, digits):
    return {"text": num(r.get(name), digits), "ci": interval(r, name, digits)}


def _table(fine, rows, types, retrieval):
    """The table's header and rows: each start, then its arms; the arms whose start is not in the report last."""
    by = {r["model"]: r for r in rows}
    header = ["Model", "W_SC / W_INV / W_VC", "Steps", "Pos. rate"] + types + ["Grounded pos.", "Inv. error"]
    header += ["I2T R@1", "T2I R@1"]
    out = []
    for tag, arm in _lineup(fine):
        r = by.get(tag, {})
        meta = arm.get("meta") if arm else None
        running = bool(meta and meta["status"] == "running")
        weights = (
            " / ".join(f"{meta['weights'][w]:g}" for w in WEIGHTS)
            if meta
            else f"WiSE-FT α {arm['alpha']:g}"
            if arm
            else "start"
        )
        cells = [
            {"text": weights, "ci": ""},
            {
                "text": "–" if not meta else f"{meta['steps_done']}" + (f" of {meta['steps']}" if running else ""),
                "ci": "",
            },
            _value(r, "pos_rate", 3),
            *[_value(r, f"{t}_pos_rate", 3) for t in types],
            _value(r, "grounded_pos_rate", 3),
            _value(r, "invariance_error", 4),
        ]
        for name in RECALL:
            cells.append(_value(r, name, 3) if tag in retrieval else {"text": "not run", "ci": ""})
        note = " (training not finished)" if running else ""
        out.append({"model": tag, "label": r.get("label", tag), "note": note, "cells": cells})
    return header, out


def _signed(v, digits):
    return "–" if v is None else f"{v:+.{digits}f}"


def _oriented(c, order):
    """A comparison as later − earlier in the section's order (an arm − its start): (x, y, diff, lo, hi)."""
    a, b = c["a"], c["b"]
    if order.index(a) < order.index(b):
        neg = lambda v: None if v is None else 0.0 - v  # (not -0.0)
        return b, a, neg(c["diff"]), neg(c["hi"]), neg(c["lo"])
    return a, b, c["diff"], c["lo"], c["hi"]


def _comparisons(fine, comparisons, types, labels):
    """{(x, y, figure, flip type): (diff, lo, hi)} of the section's models, and the comparisons table's rows."""
    order = [t for t, _ in _lineup(fine)]
    found = {}
    for c in comparisons:
        if c["a"] in order and c["b"] in order:
            x, y, d, lo, hi = _oriented(c, order)
            found.setdefault((x, y, c["figure"], c["flip_type"]), (d, lo, hi))
    pairs = list(dict.fromkeys((x, y) for x, y, _, _ in found))
    pairs.sort(key=lambda p: (order.index(p[0]), order.index(p[1])))
    rows = []
    for x, y in pairs:
        for figure in [f for f in COMPARED_NAMES if any(k[:3] == (x, y, f) for k in found)]:
            name, digits = COMPARED_NAMES[figure]
            cells = []
            for t in [None] + types:
                d, lo, hi = found.get((x, y, figure, t), (None, None, None))
                ci = "" if lo is None else f"[{_signed(lo, digits)}, {_signed(hi, digits)}]"
                cells.append({"text": _signed(d, digits), "ci": ci, "excludes": lo is not None and (lo > 0 or hi < 0)})
            rows.append(
                {
                    "a": x,
                    "b": y,
                    "pair": f"{labels.get(x, x)} − {labels.get(y, y)}",
                    "figure": name,
                    "better": "lower" if figure in LOWER_IS_BETTER else "higher",
                    "cells": cells,
                }
            )
    return found, rows


def _better(figure, d):
    """Whether a difference d (later − earlier) on `figure` is an improvement."""
    return (d < 0) if figure in LOWER_IS_BETTER else (d > 0)


def _interval(lo, hi, digits):
    return f"95% interval {_signed(lo, digits)} to {_signed(hi, digits)}"


def _verdict(found, arm, start, figure, what):
    """Whether `arm` beat `start` on one figure, in words, with the difference and its interval."""
    got = found.get((arm, start, figure, None))
    if got is None:
        return f"on {what}, no paired comparison with the start"
    d, lo, hi = got
    digits = COMPARED_NAMES[figure][1]
    if lo is None:
        return f"on {what}, {_signed(d, digits)} (no interval: BOOTSTRAP 0)"
    ci = _interval(lo, hi, digits)
    if lo > 0 or hi < 0:
        how = "it beat the start" if _better(figure, d) else "it did worse than the start"
        return f"on {what} {how} ({_signed(d, digits)}, {ci}, which excludes 0)"
    return f"on {what} it did not beat the start beyond resampling noise ({_signed(d, digits)}, {ci}, which contains 0)"


FIGURE_WORDS = {
    "sensitivity_pos_rate": "positive rate",
    "grounded_pos_rate": "grounded positive rate",
    "invariance_error_mean": "invariance error",
    "invariance_error_rel": "relative invariance error",
    "i2t_recall@1": "image-to-text R@1",
    "i2t_flip_top1_rate": "flip top-1 rate",
    "localization_acc": "localization accuracy",
    "image_sensitivity_pos_rate": "image positive rate",
}  # a compared figure in a sentence


def _beyond_noise(found, x, y, skip=()):
    """Each figure (all flips) on which x − y's interval excludes 0, in words: "image positive rate fell
    (-0.009, 95% interval -0.017 to -0.001: worse)"; None when x and y were not compared."""
    figures = [k[2] for k in found if k[:2] == (x, y) and k[3] is None]
    if not figures:
        return None
    out = []
    for figure in figures:
        d, lo, hi = found[(x, y, figure, None)]
        if figure in skip or lo is None or not (lo > 0 or hi < 0):
            continue
        digits = COMPARED_NAMES.get(figure, (figure, 4))[1]
        side = "better" if _better(figure, d) else "worse"
        word = FIGURE_WORDS.get(figure, figure)
        out.append(f"{word} {'rose' if d > 0 else 'fell'} ({_signed(d, digits)}, {_interval(lo, hi, digits)}: {side})")
    return out


def finetune_lines(fine, rows, comparisons, paths):
    """The section's words and tables (None without fine-tuned arms): {"title", "lead", "header", "rows" (each
    {"model", "label", "note", "cells"}), "comparisons": {"header", "rows"}, "comparisons_lead", "sentences":
    [{"model", "text"}], "held_out", "notes"}. `paths`: the evaluations found (retrieval's absence: "not run")."""
    if fine is None:
        return None
    types = list(dict.fromkeys(t for r in rows for t in r.get("_types") or ()))
    labels = {r["model"]: r["label"] for r in rows}
    retrieval = {r["model"] for r in rows if "retrieval" in paths and any(r.get(k) is not None for k in RECALL)}
    header, table = _table(fine, rows, types, retrieval)
    found, comp_rows = _comparisons(fine, comparisons, types, labels)
    sentences, notes = [], []
    for arm in fine["arms"]:
        tag, start = f"`{arm['model']}`", arm["start"]
        late = " (training not finished)" if arm["meta"]["status"] == "running" else ""
        if not arm["log"]:
            notes.append(f"{tag}: no train_log.jsonl lines in `{arm['folder']}`: no loss curve.")
        bad = [x["step"] for x in arm["log"] if not all(math.isfinite(x[t]) for t in TERMS if x[t] is not None)]
        if bad:
            notes.append(f"{tag}: a loss is not finite from step {bad[0]} (training diverged).")
        if start not in fine["starts"]:
            notes.append(
                f"{tag}{late} was fine-tuned from `{start}`, which this report does not include: "
                "evaluate them in one run to compare them."
            )
            continue
        said = [
            _verdict(found, arm["model"], start, f, w)
            for f, w in (("sensitivity_pos_rate", "positive rate"), ("invariance_error_mean", "invariance error"))
        ]
        said += _beyond_noise(found, arm["model"], start, skip=("sensitivity_pos_rate", "invariance_error_mean")) or []
        text = f"{tag}{late} against its start `{start}`: " + "; ".join(said) + "."
        for other in [a["model"] for a in fine["arms"]]:  # (an earlier arm: the plain control, say)
            more = _beyond_noise(found, arm["model"], other) if other not in (arm["model"], start) else None
            if more is not None:
                text += (
                    f" Against `{other}`: " + ("; ".join(more) if more else "no figure beyond resampling noise") + "."
                )
        sentences.append({"model": arm["model"], "text": text})
    for p in fine.get("points", []):
        if p["start"] not in fine["starts"]:
            notes.append(f"`{p['model']}` mixes `{p['start']}`, which this report does not include, with its arm.")
            continue
        said = [
            _verdict(found, p["model"], p["start"], f, w)
            for f, w in (("sensitivity_pos_rate", "positive rate"), ("invariance_error_mean", "invariance error"))
        ]
        what = f"(WiSE-FT: (1 − {p['alpha']:g}) `{p['start']}` + {p['alpha']:g} `{p['arm']}`)"
        sentences.append({"model": p["model"], "text": f"`{p['model']}` {what} against its start: " + "; ".join(said)})
        sentences[-1]["text"] += "."
    lineup = [t for t, _ in _lineup(fine)]
    sentences.sort(key=lambda x: lineup.index(x["model"]))
    if not comp_rows:
        notes.append(
            "No paired comparison of the arms with their start: they are made for the models evaluated "
            "together in one run (run_all.py's FINETUNE evaluates the start and every arm in one)."
        )
    images = {a["meta"]["heldout_images"] for a in fine["arms"]} - {None}
    n = images.pop() if len(images) == 1 else None
    n = "held-out images" if n is None else f"{n} held-out image{'s' if n != 1 else ''}"
    notes.insert(
        0,
        "Each arm's steps, weights and losses from `finetune.meta.json` and `train_log.jsonl` in "
        + ", ".join(f"`{os.path.basename(a['folder'])}/`" for a in fine["arms"])
        + "."
        + (
            " Each WiSE-FT point's start, arm and α from `wise.meta.json` in "
            + ", ".join(f"`{os.path.basename(p['folder'])}/`" for p in fine["points"])
            + "."
            if fine.get("points")
            else ""
        ),
    )
    return {
        "title": "Fine-tuning",
        "lead": (
            "Fine-tuned copies (arms) of a start model (`finetune_lgip.py`, LGIP_SPEC.md 14) beside their start, "
            "on the held-out file. W_SC, W_INV, W_VC: the weights of the flips as hard negatives, the paraphrase "
            "invariance term and the mixed images as hard negatives (0 / 0 / 0: the plain control); Steps: the "
            "steps trained; WiSE-FT α: an arm's weights mixed with its start's, (1 − α) start + α arm (`wise_ft.py`, "
            "LGIP_SPEC.md 16); then the same figures as the results table, 95% intervals over the held-out images."
        ),
        "header": header,
        "rows": table,
        "comparisons": {"header": ["Arm − reference", "Figure", "all"] + types, "rows": comp_rows},
        "comparisons_lead": (
            "The paired comparisons (the same resampled images for both models): each arm − its start, and a "
            "later arm − an earlier one; **bold**: the 95% interval excludes 0 (a difference beyond resampling "
            "noise on these images)."
        ),
        "sentences": sentences,
        "held_out": (
            f"The result is the figures above, on the {n} that no arm trained on (the split is by "
            "image); the training losses below are on the train images: they say that training ran as set, not "
            "that an arm probes better."
        ),
        "notes": notes,
    }
