"""lgip.report.classification_text: the section "Classification" (LGIP_SPEC.md 16) of a report: the metrics of
run_lgip_classification.py found beside the report's JSONL (`<N>__LGIP_classification.metrics.json`), every field the
report reads checked (a bad one an InputError naming the file, the model and the field's dotted path), each model's
per-image file read for the id set's reliability diagram (`<N>__LGIP_classification_<model_tag>.jsonl`: `conf`,
`pred`, `label`; the confidence at T* is its `ood_score` where the OOD score is msp), the effective robustness of each
shift set across the models (section 16's probit fit), and the section's words: a table per dataset with intervals,
the OOD detection table, each model against the first (with FINETUNE: each arm and WiSE-FT point against its start),
and the notes. The figures are lgip.report.classification_plot's.

    >>> found = load_classification(classification_file("x.jsonl"), chosen)     # None when it did not run
    >>> er = effective_robustness_all(found["rows"])                               # {shift set: fit or None}
    >>> lines = classification_lines(found, er, labels, fine)                      # {"title", "lead", "tables", ...}
"""

import os

from ..errors import InputError
from ..filenames import default_output, metrics_path
from ..records import iter_json_lines, read_json
from ..util import finite_number
from .evaluations import _check_model
from .fields import BadField, Block, block, count, what_is
from .tables import interval, num

SUFFIX = "LGIP_classification.metrics.json"
ROLES = {"id": "in-distribution", "shift": "distribution shift", "ood": "out-of-distribution", "cue_conflict": ""}
ROLES["cue_conflict"] = "cue conflict (shape against texture)"
AGAIN = "run run_lgip_classification.py again (it rewrites it)"
BINS = 15  # the ECE's bins (section 16): bin b holds confidences in (b/15, (b+1)/15], bin 0 also those <= 1/15
RATES = ("acc1", "acc5", "mean_per_class_recall", "ece", "ece_t", "conf_mean", "conf_mean_t")
LOSSES = ("nll", "nll_t")
COMPARED = {"acc1": ("Acc@1", "higher"), "ece_t": ("ECE (T*)", "lower"), "auroc": ("AUROC", "higher")}


def classification_file(jsonl_path):
    """The classification metrics of `jsonl_path` (run_lgip_classification.py's JSONL_PATH; else of its
    `_with_fliptypes.jsonl` beside it), in the OUTPUT_DIR in force; None when there are none."""
    for p in (jsonl_path, default_output(jsonl_path, "_with_fliptypes.jsonl")):
        path = metrics_path(p, SUFFIX)
        if os.path.isfile(path):
            return path
    return None


def per_image_file(path, tag):
    """A model's per-image file beside its metrics file: `<N>__LGIP_classification_<model_tag>.jsonl`."""
    return path[: -len(".metrics.json")] + f"_{tag}.jsonl"


def _checked(field, v, low=0.0, high=1.0, above=False):
    """v: None or a finite number within [low, high] (high None: no bound; above: > low); BadField naming `field`."""
    if v is None:
        return None
    if not finite_number(v):
        raise BadField(field, f"is {what_is(v)}, not a finite number")
    if (v <= low if above else v < low) or (high is not None and v > high):
        bound = f"> {low:g}" if above else f">= {low:g}" if high is None else f"within [{low:g}, {high:g}]"
        raise BadField(field, f"is {v!r}, not a number {bound}")
    return float(v)


def _number(b, key, low=0.0, high=1.0, above=False):
    """b[key], checked (_checked)."""
    return _checked(b.where + key, b.get(key), low, high, above)


def _figure(b, key, high=1.0):
    """{key, key_ci_lo, key_ci_hi} from b[key] and b[key + "_ci95"] (null, or [low, high] within the range)."""
    out = {key: _number(b, key, 0.0, high), key + "_ci_lo": None, key + "_ci_hi": None}
    ci = b.get(key + "_ci95")
    if ci is None:
        return out
    where = b.where + key + "_ci95"
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        raise BadField(where, f"is {what_is(ci)}, not [low, high] or null")
    lo, hi = (_checked(where, v, 0.0, high) for v in ci)
    if lo is None or hi is None or lo > hi:
        raise BadField(where, f"is {ci!r}, not [low, high] with low <= high")
    return dict(out, **{key + "_ci_lo": lo, key + "_ci_hi": hi})


def _dataset(b):
    role = b.get("role")
    if role not in ROLES:
        raise BadField(b.where + "role", f"is {what_is(role)}, not one of {', '.join(map(repr, ROLES))}")
    if not isinstance(b.get("source"), str):
        raise BadField(b.where + "source", f"is {what_is(b.get('source'))}, not a source's name")
    out = {"role": role, "source": b["source"]}
    for key in ("num_classes", "n", "n_test", "n_unreadable"):
        out[key] = count(b, key)
    unreadable = b.get("unreadable")
    if unreadable is not None and not isinstance(unreadable, list):
        raise BadField(b.where + "unreadable", f"is {what_is(unreadable)}, not a list of paths or indices")
    out["unreadable"] = unreadable or []
    if role != "ood":
        for key in RATES:
            out.update(_figure(b, key))
        for key in LOSSES:
            out.update(_figure(b, key, high=None))
    return out


def _comparison(c, where):
    c = Block(c) if isinstance(c, dict) else c
    if not isinstance(c, dict):
        raise BadField(where, f"is {what_is(c)}, not an object")
    c.where = where + "."
    for key in ("a", "b", "dataset", "figure"):
        if not isinstance(c.get(key), str):
            raise BadField(c.where + key, f"is {what_is(c.get(key))}, not a name")
    diff = c.get("diff")
    if diff is not None and not finite_number(diff):
        raise BadField(c.where + "diff", f"is {what_is(diff)}, not a finite number")
    ci = c.get("diff_ci95")
    ok = ci is None or (
        isinstance(ci, (list, tuple)) and len(ci) == 2 and all(finite_number(v) for v in ci) and ci[0] <= ci[1]
    )
    if not ok:
        raise BadField(c.where + "diff_ci95", f"is {what_is(ci)}, not [low, high] with low <= high, or null")
    return {"a": c["a"], "b": c["b"], "dataset": c["dataset"], "figure": c["figure"], "diff": diff, "ci": ci}


def check_row(m):
    """One model's classification row as the report reads it: {"model", "score_kind", "logit_scale",
    "temperature", "datasets" {name: role, counts, figures flat with _ci_lo/_ci_hi}, "ood" {name: ...},
    "cue_conflict" {name: ...}, "comparisons", "ood_score"}; BadField for the first field it cannot use."""
    m = Block(m)
    _check_model(m, None)  # (the run block, its versions and the model card, as every evaluation's)
    kind = m.get("score_kind")
    if kind is not None and not isinstance(kind, str):
        raise BadField("score_kind", f"is {what_is(kind)}, not a score kind's name or null")
    out = {"model": m["model_tag"], "score_kind": kind}
    out["logit_scale"] = _number(m, "logit_scale", 0.0, None, above=True)
    out["temperature"] = _number(m, "temperature", 0.0, None, above=True)
    sets = block(m, "datasets")
    if not sets:
        raise BadField("datasets", "is missing or empty (no dataset was classified)")
    out["datasets"] = {name: _dataset(block(sets, name)) for name in sets}
    ood = block(m, "ood")
    out["ood"] = {}
    for name in ood:
        b = block(ood, name)
        score = b.get("ood_score")
        if not isinstance(score, str):
            raise BadField(b.where + "ood_score", f"is {what_is(score)}, not the OOD score's name")
        entry = {"ood_score": score, "n_id": count(b, "n_id"), "n_ood": count(b, "n_ood")}
        for key in ("auroc", "fpr95", "aupr_in"):
            entry.update(_figure(b, key))
        out["ood"][name] = entry
    cue = block(m, "cue_conflict")
    out["cue_conflict"] = {}
    for name in cue:
        b = block(cue, name)
        entry = {k: _number(b, k) for k in ("shape_bias", "shape_match", "texture_match")}
        out["cue_conflict"][name] = dict(entry, n=count(b, "n"), dropped=count(b, "dropped"))
    comps = m.get("comparisons")
    if comps is not None and not isinstance(comps, list):
        raise BadField("comparisons", f"is {what_is(comps)}, not a list")
    out["comparisons"] = [_comparison(c, f"comparisons[{i}]") for i, c in enumerate(comps or [])]
    settings = m.get("settings") if isinstance(m.get("settings"), dict) else {}
    scores = {e["ood_score"] for e in out["ood"].values()}
    out["ood_score"] = scores.pop() if len(scores) == 1 else settings.get("OOD_SCORE")
    return out


def read_reliability(path, dataset, with_t):
    """The id set's lines of a per-image file: {"conf", "correct", "conf_t" (the `ood_score`s when `with_t`, the
    msp at T*; None when a line has none)} as numpy arrays; InputError naming the file, the line and the field."""
    import numpy as np

    conf, correct, conf_t = [], [], []
    for lineno, x in iter_json_lines(path):
        if not isinstance(x, dict):
            raise InputError(f"{path}: line {lineno}: not a JSON object ({what_is(x)}); {AGAIN}")
        if x.get("dataset") != dataset:
            continue
        k = x.get("conf")
        if not (finite_number(k) and 0 <= k <= 1):
            raise InputError(f"{path}: line {lineno}: field 'conf' is {what_is(k)}, not a confidence in [0, 1]")
        for key in ("pred", "label"):
            v = x.get(key)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputError(f"{path}: line {lineno}: field '{key}' is {what_is(v)}, not a class index")
        conf.append(float(k))
        correct.append(x["pred"] == x["label"])
        s = x.get("ood_score")
        if with_t and conf_t is not None:
            if s is None:
                conf_t = None
            elif not (finite_number(s) and 0 <= s <= 1):
                raise InputError(f"{path}: line {lineno}: field 'ood_score' is {what_is(s)}, not msp's [0, 1]")
            else:
                conf_t.append(float(s))
    return {
        "conf": np.array(conf, dtype=np.float64),
        "correct": np.array(correct, dtype=bool),
        "conf_t": None if not with_t or conf_t is None else np.array(conf_t, dtype=np.float64),
    }


def id_set(row):
    """The name of a row's "id" dataset, or None."""
    return next((name for name, d in row["datasets"].items() if d["role"] == "id"), None)


def load_classification(path, chosen=None):
    """run_lgip_classification.py's metrics at `path` (None: it did not run, returns None), its rows whose model tag
    `chosen` keeps (a function of the tag; None: all), each checked, and each model's id-set lines of its per-image
    file: {"path", "rows", "sets" {name: role, in the files' order}, "reliability" {tag: read_reliability's dict},
    "missing" [files]}."""
    if path is None:
        return None
    data = read_json(path)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: expected a non-empty list of per-model rows with 'model_tag'; {AGAIN}")
    rows, seen = [], set()
    for i, m in enumerate(data):
        tag = m.get("model_tag") if isinstance(m, dict) else None
        if not isinstance(tag, str) or not tag:
            raise InputError(f"{path}: model #{i + 1} of {len(data)}: no 'model_tag' (a non-empty string); {AGAIN}")
        if tag in seen:
            raise InputError(f"{path}: model {tag} is listed twice; {AGAIN}")
        seen.add(tag)
        try:
            row = check_row(m)
        except BadField as bad:
            raise InputError(f"{path}: model {tag}: {bad}") from None
        if chosen is None or chosen(tag):
            rows.append(row)
    sets, reliability, missing = {}, {}, []
    for row in rows:
        for name, d in row["datasets"].items():
            sets.setdefault(name, d["role"])
        name = id_set(row)
        if name is None:
            continue
        images = per_image_file(path, row["model"])
        if not os.path.isfile(images):
            missing.append(images)
            continue
        reliability[row["model"]] = read_reliability(images, name, row["ood_score"] == "msp")
    return {"path": path, "rows": rows, "sets": sets, "reliability": reliability, "missing": missing}


def reliability_bins(conf, correct, bins=BINS):
    """Per bin of section 16's ECE (bin b holds confidences in (b/bins, (b+1)/bins], bin 0 those <= 1/bins too):
    (counts, mean confidence, accuracy; NaN where empty) and the ECE, sum over non-empty bins of (|B| / n)
    |accuracy - mean confidence|."""
    import numpy as np

    edges = np.arange(bins + 1) / bins
    b = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
    counts = np.bincount(b, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(b, weights=conf, minlength=bins) / counts
        acc = np.bincount(b, weights=correct.astype(np.float64), minlength=bins) / counts
    full = counts > 0
    ece = float(np.sum(counts[full] / max(len(conf), 1) * np.abs(acc[full] - mean_conf[full])))
    return counts, mean_conf, acc, ece


def effective_robustness_all(found):
    """{shift set: section 16's effective robustness over the rows that have it and an id set (None: fewer than 3)}
    (lgip.classification.figures.effective_robustness), for `<N>__LGIP_classification_er.metrics.json`; {} without
    a shift set."""
    from ..classification.figures import effective_robustness

    return {} if found is None else effective_robustness(found["rows"])


def _cell(d, key, digits):
    return {"text": num(d.get(key), digits), "ci": interval(d, key, digits)}


def starts_of(fine):
    """{model: the start it was fine-tuned (or WiSE-FT mixed) from} of the report's arms and points."""
    if fine is None:
        return {}
    return {a["model"]: a["start"] for a in fine["arms"] + fine.get("points", [])}


def _tables(found, er, labels):
    """A table per dataset that is not "ood": the models' figures with their intervals."""
    out = []
    for name, role in found["sets"].items():
        if role == "ood":
            continue
        rows = [(r, r["datasets"][name]) for r in found["rows"] if r["datasets"].get(name, {}).get("role") == role]
        fit = er.get(name)
        header = ["Model"] + (["T*"] if role == "id" else []) + ["Acc@1 ↑", "ECE ↓", "ECE (T*) ↓", "NLL (T*) ↓"]
        header += ["Eff. robustness ↑"] if fit else []
        header += ["Shape bias", "Shape match", "Texture match"] if role == "cue_conflict" else []
        body = []
        for r, d in rows:
            cells = [{"text": num(r["temperature"], 2), "ci": ""}] if role == "id" else []
            cells += [_cell(d, "acc1", 3), _cell(d, "ece", 3), _cell(d, "ece_t", 3), _cell(d, "nll_t", 3)]
            if fit:
                v = fit["effective_robustness"].get(r["model"])
                cells.append({"text": _signed(v), "ci": ""})
            if role == "cue_conflict":
                c = r["cue_conflict"].get(name, {})
                cells += [{"text": num(c.get(k), 3), "ci": ""} for k in ("shape_bias", "shape_match", "texture_match")]
            body.append({"model": r["model"], "label": labels.get(r["model"], r["model"]), "cells": cells})
        d0 = rows[0][1] if rows else {}
        counts = [f"{d0['num_classes']} classes" if d0.get("num_classes") is not None else None]
        counts.append(f"{d0['n']} images" if d0.get("n") is not None else None)
        if role == "id" and d0.get("n_test") is not None:
            counts.append(f"the `*_t` figures on its test half of {d0['n_test']}")
        caption = f"`{name}` ({ROLES[role]}; " + ", ".join(c for c in counts if c) + ")"
        out.append({"name": name, "role": role, "caption": caption, "header": header, "rows": body})
    return out


def _ood(found, labels):
    """The OOD detection table (each "ood" set's AUROC and FPR@95 with intervals), or None without one."""
    names = [n for n, role in found["sets"].items() if role == "ood"]
    rows = [r for r in found["rows"] if any(n in r["ood"] for n in names)]
    if not names or not rows:
        return None
    header = ["Model"] + [h for n in names for h in (f"`{n}` AUROC ↑", f"`{n}` FPR@95 ↓")]
    body = []
    for r in rows:
        cells = []
        for n in names:
            o = r["ood"].get(n, {})
            cells += [_cell(o, "auroc", 3), _cell(o, "fpr95", 3)]
        body.append({"model": r["model"], "label": labels.get(r["model"], r["model"]), "cells": cells})
    scores = sorted({o["ood_score"] for r in rows for o in r["ood"].values()})
    lead = (
        f"Out-of-distribution detection by {', '.join(f'`{s}`' for s in scores)} (the id set's images the positive "
        "class): AUROC, and FPR@95 the share of OOD images scored at least as high as the 95% of id images "
        "scored highest; 95% intervals with the id and OOD images resampled apart."
    )
    return {"lead": lead, "header": header, "rows": body}


def _signed(v, digits=3):
    return "–" if v is None else f"{round(v, digits) + 0.0:+.{digits}f}"  # (+ 0.0: no "-0.000")


def _pairs(found, reference, starts):
    """{(x, y, dataset, figure): (diff, lo, hi)} as x − y, for each model x against its start (or `reference`)."""
    against = {r["model"]: starts.get(r["model"], reference) for r in found["rows"]}
    out = {}
    for r in found["rows"]:
        for c in r["comparisons"]:
            if c["figure"] not in COMPARED:
                continue
            lo, hi = c["ci"] or (None, None)
            if against.get(c["b"]) == c["a"]:  # (the row of the earlier model: a − b, turned into b − a)
                neg = lambda v: None if v is None else 0.0 - v
                out.setdefault((c["b"], c["a"], c["dataset"], c["figure"]), (neg(c["diff"]), neg(hi), neg(lo)))
            elif against.get(c["a"]) == c["b"]:
                out.setdefault((c["a"], c["b"], c["dataset"], c["figure"]), (c["diff"], lo, hi))
    return out


def _verdict(got, what, better):
    d, lo, hi = got
    if d is None:
        return f"{what} not measured"
    if lo is None:
        return f"{what} {_signed(d)} (no interval: BOOTSTRAP 0)"
    ci = f"95% interval {_signed(lo)} to {_signed(hi)}"
    if lo > 0 or hi < 0:
        gained = (d > 0) == (better == "higher")
        return f"{what} {_signed(d)} ({ci}: {'better' if gained else 'worse'} beyond resampling noise)"
    return f"{what} {_signed(d)} ({ci}, which contains 0)"


def classification_lines(found, er, labels, fine=None, report_models=()):
    """The section's words and tables (None when run_lgip_classification.py did not run): {"title", "lead",
    "tables" [{"name", "role", "caption", "header", "rows"}], "ood", "er" [lines], "comparisons" {"header",
    "rows"}, "sentences" [{"model", "text"}], "notes", "file"}. fine: the report's fine-tuned arms (their starts are
    what each is compared with; else the first model); report_models: the tags of the report's other figures."""
    if found is None or not found["rows"]:
        return None
    starts = starts_of(fine)
    reference = found["rows"][0]["model"]
    pairs = _pairs(found, reference, starts)
    comp_rows = []
    for (x, y, dataset, figure), (d, lo, hi) in pairs.items():
        name, better = COMPARED[figure]
        ci = "" if lo is None else f"[{_signed(lo)}, {_signed(hi)}]"
        cell = {"text": _signed(d), "ci": ci, "excludes": lo is not None and (lo > 0 or hi < 0)}
        pair = f"{labels.get(x, x)} − {labels.get(y, y)}"
        comp_rows.append({"a": x, "b": y, "pair": pair, "set": dataset, "figure": name, "better": better, "cell": cell})
    order = [r["model"] for r in found["rows"]]
    comp_rows.sort(key=lambda c: (order.index(c["a"]) if c["a"] in order else len(order), c["set"]))
    sentences = []
    for r in found["rows"]:
        start = starts.get(r["model"])
        ident = id_set(r)
        if start is None or ident is None:
            continue
        said = [
            _verdict(pairs[(r["model"], start, ident, f)], f"{COMPARED[f][0]} on `{ident}`", b)
            for f, b in (("acc1", "higher"), ("ece_t", "lower"))
            if (r["model"], start, ident, f) in pairs
        ] or ["no paired comparison in the metrics (the two were not classified in one run)"]
        sentences.append(
            {"model": r["model"], "text": f"`{r['model']}` against its start `{start}`: " + "; ".join(said)}
        )
        sentences[-1]["text"] += "."
    er_lines = []
    for name, fit in er.items():
        if fit is None:
            er_lines.append(f"`{name}`: fewer than 3 models with it and an id set: no effective robustness.")
        else:
            er_lines.append(
                f"`{name}`: probit(acc shift) = {fit['slope']:.3f} probit(acc id) {fit['intercept']:+.3f}, fitted over "
                f"{len(fit['models'])} models; a model's effective robustness is its shift accuracy minus the fit's."
            )
    return {
        "title": "Classification",
        "lead": (
            "Zero-shot classification of the same models (`run_lgip_classification.py`, LGIP_SPEC.md 16): accuracy, "
            "calibration at the model's own logit scale (ECE over 15 confidence bins) and after temperature scaling "
            "(T* fitted on a seeded half of the id set; ECE (T*) and NLL (T*) on its other half), 95% bootstrap "
            "intervals over each set's images."
            + (" Each arm beside its start: what fine-tuning against the probe may have cost." if starts else "")
        ),
        "tables": _tables(found, er, labels),
        "ood": _ood(found, labels),
        "er": er_lines,
        "comparisons": {"header": ["Model − reference", "Set", "Figure", "Difference [95% CI]"], "rows": comp_rows},
        "comparisons_lead": (
            "Paired comparisons (the same resampled images for both models): each model − "
            + ("its start" if starts else f"`{reference}`")
            + "; **bold**: the 95% interval excludes 0. Every pair is in the metrics file's `comparisons`."
        ),
        "sentences": sentences,
        "notes": _notes(found, report_models),
        "file": found["path"],
    }


def _notes(found, report_models):
    notes = [f"From `{os.path.basename(found['path'])}` and each model's per-image file beside it."]
    for name in found["sets"]:
        lost = {r["model"]: r["datasets"][name]["n_unreadable"] for r in found["rows"] if name in r["datasets"]}
        lost = {t: n for t, n in lost.items() if n}
        if lost:
            n = max(lost.values())
            notes.append(
                f"`{name}`: {n} image{'s' if n != 1 else ''} unreadable, counted and not scored (listed in the metrics "
                "file's `unreadable`)."
            )
    for path in found["missing"]:
        notes.append(f"`{os.path.basename(path)}` is not there: no reliability diagram for its model.")
    for r in found["rows"]:
        got = found["reliability"].get(r["model"])
        ident = id_set(r)
        if r["temperature"] is None:
            notes.append(f"`{r['model']}`: no id set, so no temperature (T* = 1).")
        if got is None or ident is None:
            continue
        if got["conf_t"] is None:
            why = (
                "its id set's lines have no `ood_score` (the confidence at T* under the msp score)"
                if r["ood_score"] == "msp"
                else f"its `ood_score` is the confidence at T* only for the msp score (this run's: "
                f"{r['ood_score'] or 'none'})"
            )
            notes.append(
                f"`{r['model']}`: the reliability diagram at T* is not drawn: its per-image file holds the confidence "
                f"at T = 1 (`conf`), and {why}."
            )
        ece = r["datasets"][ident]["ece"]
        mine = reliability_bins(got["conf"], got["correct"])[3] if len(got["conf"]) else None
        if ece is not None and mine is not None and abs(ece - mine) > 1e-6:
            notes.append(
                f"`{r['model']}`: its per-image file gives ECE {mine:.4f} on `{ident}`, its metrics {ece:.4f}: "
                "the two files are from different runs (run run_lgip_classification.py again)."
            )
    apart = [r["model"] for r in found["rows"] if report_models and r["model"] not in report_models]
    if apart:
        notes.append(
            "Classified but not in the report's other evaluations: " + ", ".join(f"`{t}`" for t in apart) + "."
        )
    return notes
