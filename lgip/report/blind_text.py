"""lgip.report.blind_text: the section "Is the probe blind-solvable?" (LGIP_SPEC.md 15): blind_audit.py's
metrics found beside the flips file the evaluations read, checked, and said: each text-only scorer's
acc_untied per flip type with its interval, and a sentence per type naming the scorer that tells the
caption from its flip best without the image (0.5 is chance).

    >>> audit = load_blind(blind_file("lgip_coco.jsonl"))        # None when blind_audit.py did not run
    >>> lines = blind_lines(audit)                               # {"title", "lead", "header", "rows", ...}
"""

import json
import os

from ..blind import interval_side
from ..errors import InputError
from ..filenames import blind_file as blind_metrics, default_output, metrics_path
from ..util import finite_number
from .evaluations import load_metrics

_ORDINAL = {1: "unigram", 2: "bigram", 3: "trigram"}


def blind_file(jsonl_path):
    """The blind audit's metrics for the report's input: beside its `_with_fliptypes` file (LGIP's data), else
    its own (an imported benchmark, or a flips file given itself); None when there is none."""
    for flips in (default_output(jsonl_path, "_with_fliptypes.jsonl"), jsonl_path):
        path = blind_metrics(flips, "metrics")
        if os.path.isfile(path):
            return path
    return None


def _rate(v, where):
    if v is None:
        return None
    if not (finite_number(v) and 0 <= v <= 1):
        raise InputError(f"{where}: not a rate in [0, 1]: {v!r}")
    return float(v)


def load_blind(path):
    """The audit's {"path", "types", "scorers": {name: {block: (acc_untied, [lo, hi] or None, tie_rate,
    scored)}}}, every field it uses checked (an InputError names the file and the field); None for no path."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot be read as JSON ({e}); run blind_audit.py again") from None
    types, by = (
        data.get("types") if isinstance(data, dict) else None,
        data.get("by_scorer") if isinstance(data, dict) else None,
    )
    if not isinstance(types, list) or not isinstance(by, dict) or not by:
        raise InputError(f"{path}: no `types` list or `by_scorer` dict: not blind_audit.py's metrics")
    scorers = {}
    for name, blocks in by.items():
        if not isinstance(blocks, dict) or "all" not in blocks:
            raise InputError(f"{path}: by_scorer.{name}: no block `all`")
        scorers[name] = {}
        for block, b in blocks.items():
            where = f"{path}: by_scorer.{name}.{block}"
            if not isinstance(b, dict):
                raise InputError(f"{where}: not a dict")
            ci = b.get("acc_untied_ci95")
            if ci is not None and not (isinstance(ci, list) and len(ci) == 2):
                raise InputError(f"{where}.acc_untied_ci95: not [low, high]: {ci!r}")
            scorers[name][block] = (
                _rate(b.get("acc_untied"), f"{where}.acc_untied"),
                [_rate(x, f"{where}.acc_untied_ci95") for x in ci] if ci else None,
                _rate(b.get("tie_rate"), f"{where}.tie_rate"),
                b.get("scored"),
            )
    return {"path": path, "types": [t for t in types if t != "all"], "scorers": scorers}


def load_debiased(jsonl_path, full_rows, chosen):
    """Each chosen model's positive rate (and grounded rate) on all flips and on the debiased ones, overall and
    per type, where run_lgip_by_fliptype.py evaluated `<flips stem>_debiased.jsonl` (run_all's DEBIAS): {"path",
    "types", "models": [{"model", "full": {block: (pos, grounded)}, "debiased": {...}}]}; None without it."""
    for flips in (default_output(jsonl_path, "_with_fliptypes.jsonl"), jsonl_path):
        path = metrics_path(default_output(flips, "_debiased.jsonl"), "LGIP_fliptypes.metrics.json")
        if os.path.isfile(path):
            break
    else:
        return None
    debiased = {m["model_tag"]: m for m in load_metrics(path, "fliptypes") if m["model_tag"] in chosen}
    full = {m["model_tag"]: m for m in full_rows or []}

    def rates(m):
        g = m.get("global_sensitivity") or {}
        out = {"all": _rate_block(g, m.get("grounded_pos_rate"))}
        for t, b in (m.get("by_flip_type") or {}).items():
            out[t] = _rate_block(b, b.get("grounded_pos_rate"))
        return out

    models = [
        {"model": tag, "full": rates(full[tag]), "debiased": rates(m)} for tag, m in debiased.items() if tag in full
    ]
    types = list(dict.fromkeys(t for x in models for t in x["full"] if t != "all"))
    return {"path": path, "types": types, "models": models} if models else None


def _rate_block(b, grounded):
    """{pos, ci, grounded, count} of a metrics block: its positive rate, the rate's interval (None under the
    reference protocol, which writes none), the grounded rate and the flips it counts."""
    ci = b.get("pos_rate_ci95")
    return {
        "pos": b.get("pos_rate"),
        "ci": ci if isinstance(ci, list) and len(ci) == 2 else None,
        "grounded": grounded,
        "count": b.get("count"),
    }


def describe(name):
    """What a scorer is, in words."""
    if name == "length":
        return "a word-length rule (the shorter text wins)"
    if name == "edit":
        return "a model of the generator's edit words (fit on the other images' flips)"
    if name.startswith("ngram") and name[5:].isdigit():
        n = int(name[5:])
        return f"a {_ORDINAL.get(n, f'{n}-gram')} model of the other images' captions"
    return name


def _pct(v):
    return f"{100 * v:.0f}%"


def _interval(ci):
    return f"95% interval {_pct(ci[0])} to {_pct(ci[1])}"


def type_sentences(scorers, t):
    """What the scorers say of flip type `t` (`all` for every flip): each scorer whose interval lies above 0.5
    (it solves the type) and each whose interval lies below (reliably wrong: as informative as reliably right,
    the flips carry a cue it reads backwards), else that none is told from chance; and the scorers that tie
    on every pair. scorers: {name: {block: (acc_untied, ci, tie_rate, scored)}}."""
    what = "all flips" if t == "all" else f"{t} flips"
    told = [(figs[t][0], name, figs[t][1]) for name, figs in scorers.items() if figs.get(t, (None,))[0] is not None]
    tied = [name for name, figs in scorers.items() if figs.get(t, (None,))[0] is None and figs.get(t, (None,) * 4)[3]]
    if not told:
        return [f"No scorer tells a caption from its {t} flip: every pair is a tie."]
    out = []
    above = sorted((x for x in told if interval_side(x[2]) == "above"), key=lambda x: -x[0])
    below = sorted((x for x in told if interval_side(x[2]) == "below"), key=lambda x: x[0])
    for acc, name, ci in above:
        who = describe(name)
        out.append(
            f"{who[0].upper()}{who[1:]} picks the true caption in {_pct(acc)} of {what} ({_interval(ci)}, "
            "above chance)."
        )
    for acc, name, ci in below:
        who = describe(name)
        out.append(
            f"{who[0].upper()}{who[1:]} picks the true caption in only {_pct(acc)} of {what} "
            f"({_interval(ci)}, below chance): reliably wrong, as telling as reliably right (the flips carry "
            "a cue it reads backwards)."
        )
    if not above and not below:
        acc, name, ci = max(told, key=lambda x: x[0])  # (a tie: the scorer named first, the simplest)
        interval = f" ({_interval(ci)})" if ci else ""
        out.append(
            f"No scorer is told from chance: the best, {name}, picks the true caption in {_pct(acc)} of "
            f"{what}{interval}."
        )
    if tied:
        pairs = "pair" if t == "all" else f"{t} pair"
        out.append(f"Ties on every {pairs}: {', '.join(tied)}.")
    return out


def blind_lines(audit):
    """The section's words and table (None without an audit): a row per scorer, a column per block (all, then
    each type), each cell acc_untied and its interval; a sentence per type."""
    if audit is None:
        return None
    blocks = ["all"] + audit["types"]
    rows = []
    for name, figs in audit["scorers"].items():
        cells = []
        for block in blocks:
            acc, ci, _, _ = figs.get(block, (None, None, None, None))
            cells.append(
                {"text": "n/a" if acc is None else f"{acc:.3f}", "ci": f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""}
            )
        rows.append({"label": name, "title": describe(name), "cells": cells})
    sentences = [x for t in audit["types"] or ["all"] for x in type_sentences(audit["scorers"], t)]
    side = _side_by_side(audit.get("debiased"))
    return {
        "debiased": side,
        "title": "Is the probe blind-solvable?",
        "lead": (
            "How often a scorer that never sees the image picks the caption over its flip (acc_untied: ties set "
            "apart; 0.5 is chance), per flip type, from `blind_audit.py` (LGIP_SPEC.md 15). A type a blind scorer "
            "solves can be passed by a model's text prior alone: read its positive rate beside the text-prior "
            "controls."
        ),
        "header": ["Scorer"] + blocks,
        "rows": rows,
        "sentences": sentences,
        "path": audit["path"],
    }


def _arrow(a, b, ci=None):
    """{"text": "a → b", "ci": "[lo, hi]" of b or ""}."""
    f = lambda v: "n/a" if v is None else f"{v:.3f}"
    return {"text": f"{f(a)} → {f(b)}", "ci": f"[{f(ci[0])}, {f(ci[1])}]" if ci else ""}


def _kept(full, deb):
    """ "17 of 77" from the blocks' flip counts, else None."""
    n, of = deb.get("count"), full.get("count")
    return f"{n:,} of {of:,}" if isinstance(n, int) and isinstance(of, int) else None


def _side_by_side(found):
    """The models' positive rates on all flips → on the debiased ones, the debiased rate's interval after it,
    and how many flips were kept (None without a debiased evaluation)."""
    if found is None:
        return None
    none = {"pos": None, "ci": None, "grounded": None, "count": None}
    first = found["models"][0]
    kept = {b: _kept(first["full"].get(b, none), first["debiased"].get(b, none)) for b in ["all"] + found["types"]}
    header = ["Model", "all", "grounded"] + found["types"]
    rows = []
    for x in found["models"]:
        full, deb = x["full"], x["debiased"]
        cells = [_arrow(full["all"]["pos"], deb["all"]["pos"], deb["all"]["ci"])]
        cells.append(_arrow(full["all"]["grounded"], deb["all"]["grounded"]))
        for t in found["types"]:
            a, b = full.get(t, none), deb.get(t, none)
            cells.append(_arrow(a["pos"], b["pos"], b["ci"]))
        rows.append({"model": x["model"], "cells": cells})
    by_type = ", ".join(f"{t} {kept[t]}" for t in found["types"] if kept[t])
    count = f" Kept: {kept['all']} flips" + (f" ({by_type})" if by_type else "") + "." if kept["all"] else ""
    return {
        "lead": (
            "Each model's positive rate on all flips → on the debiased flips (those the debiasing scorers cannot "
            "tell from their captions; `debias_flips.py`), the debiased rate's 95% interval over images after it; "
            "grounded: the text-prior control's (LGIP_SPEC.md 9). A rate that falls there rode on what a blind "
            f"scorer can see.{count}"
        ),
        "header": header,
        "rows": rows,
        "kept": kept,
        "path": found["path"],
    }
