"""lgip.report.controls_text: "Is it the image?" in words (LGIP_SPEC.md 9 and 10): each model's text-prior
line (how much of its positive rate the text alone reaches, how often its own image decides) and the
paired comparisons as table rows with what each says (an interval that excludes 0, a stale row).

    >>> prior_lines(rows, found)["lines"][0]["model"]
    'tiny_openclip'
    >>> table = comparison_rows(report.comparisons, rows)       # {"overall": [...], "by_type": [...]}
"""

import os

from ..method import FLIP_TYPES
from .comparisons import COMPARED, COMPARED_OWN
from .evaluations import EVAL_KEYS, SCRIPTS
from .tables import cell, interval, row_types


def prior_line(r, file=None):
    """A model's line in plain words: how much of its positive rate the text alone reaches (its prior
    positive rate, the same flips scored against the average other image) and how often its own image
    decides (its grounded positive rate, against 0.5); or why there is none. `file`: the metrics file
    of its figures (named when it has no controls)."""
    tag, pos, prior, grounded = (
        f"`{r['model']}`",
        r.get("pos_rate"),
        r.get("prior_pos_rate"),
        r.get("grounded_pos_rate"),
    )
    if not r.get("_controls"):
        return (
            f"{tag}: no text-prior control" + (f" in `{file}`" if file else "") + " (written before the controls, "
            "or by an evaluation without them: re-run `run_lgip_multi.py` or `run_lgip_by_fliptype.py`)."
        )
    if pos is None:
        return f"{tag}: no flip measured (no positive rate), so no text-prior control."
    if prior is None:
        return (
            f"{tag}: positive rate {pos:.3f}; no text-prior control (fewer than 2 images: no other image to average)."
        )
    if round(prior, 3) == round(pos, 3):
        head = f"of its {pos:.3f} positive rate, all ({prior:.3f}) is reached with any image: text prior"
    elif prior < pos:
        head = (
            f"of its {pos:.3f} positive rate, {prior:.3f} is reached with any image (text prior); its own images "
            f"add {pos - prior:.3f}"
        )
    else:
        head = (
            f"its {pos:.3f} positive rate is below the {prior:.3f} it reaches with any image (text prior): its own "
            f"images take {prior - pos:.3f} away"
        )
    if grounded is None:
        return f"{tag}: {head}."
    lo, hi = r.get("grounded_pos_rate_ci_lo"), r.get("grounded_pos_rate_ci_hi")
    where = (
        ""
        if lo is None or hi is None
        else "; its interval contains 0.5"
        if lo <= 0.5 <= hi
        else "; its interval lies above 0.5"
        if lo > 0.5
        else "; its interval lies below 0.5"
    )
    return (
        f"{tag}: {head}. On its own image the caption beats the flip by more than on the average image in "
        f"{cell(r, 'grounded_pos_rate', 3)} of pairs (grounded; 0.5 = the image decides nothing){where}."
    )


def prior_lines(rows, paths):
    """{"lead", "lines": [{"model", "text"}]} of the section "Is it the image?" (LGIP_SPEC.md section 9),
    a line per model (prior_line); None when no model's figures come with the controls (older files,
    or the enhanced analysis alone)."""
    if not any(r.get("_controls") for r in rows):
        return None
    heads = list(dict.fromkeys(r["headline_source"] for r in rows if r.get("_controls")))
    lead = (
        'Some flips read oddly ("purple grass", "one dogs"): a model can prefer the caption for text reasons '
        "alone. So " + " and ".join(f"`{SCRIPTS[h]}`" for h in heads) + " scored every caption-flip pair of the "
        "positive rate a second time, against the average of the OTHER images (LGIP_SPEC.md section 9). Reached "
        '"with any image" = the caption beats the flip on that average image: the prior positive rate (Prior pos., '
        "what a blind scorer gets; a positive rate near it is text prior, not grounding). Grounded pos. = share of "
        "pairs where the caption beats the flip by more on its own image than on the average one: 0.5 for a model "
        "that ignores the image, however strong its text prior; 1.0 when the image decides every pair. In the "
        'figure "Positive rate against prior positive rate", a model on the diagonal owes all of its positive '
        "rate to the text."
    )
    lines = [
        {
            "model": r["model"],
            "text": prior_line(
                r, os.path.basename(paths[r["headline_source"]]) if r.get("headline_source") in paths else None
            ),
        }
        for r in rows
    ]
    return {"lead": lead, "lines": lines}


COMPARED_NAMES = {
    "sensitivity_pos_rate": ("Pos. rate", 3),
    "grounded_pos_rate": ("Grounded pos.", 3),
    "invariance_error_mean": ("Inv. error", 4),
    "invariance_error_rel": ("Inv. rel.", 3),
    "i2t_recall@1": ("I2T R@1", 3),
    "i2t_flip_top1_rate": ("Flip top-1", 3),
    "localization_acc": ("Loc. acc.", 3),
    "image_sensitivity_pos_rate": ("Image pos.", 3),
}  # a compared figure: its name in the tables, digits
EXCLUDES = "interval excludes 0"  # (a difference beyond resampling noise on these images, nothing more)


def _stale(c, by_model):
    """True when a model's value in comparison `c` is not its figure in the table's rows (the
    comparison from an earlier run than the figures), None when that cannot be told."""
    seen = []
    for model, value in ((c["a"], c["a_value"]), (c["b"], c["b_value"])):
        r, name = by_model.get(model), COMPARED.get(c["figure"])
        if r is None or value is None:
            continue
        if name is None:  # (a figure of its own evaluation: one key in a row)
            mine = r.get(COMPARED_OWN[c["figure"]]) if c["figure"] in COMPARED_OWN and c["flip_type"] is None else None
        elif c["flip_type"] is None:
            mine = r.get(f"{c['source']}_{name}")
        elif r.get("flip_type_source") == c["source"] and name != "invariance_error":
            mine = r.get(f"{c['flip_type']}_{name}")
        else:
            continue
        if mine is not None:
            seen.append(abs(mine - value) > 1e-9)
    return any(seen) if seen else None


def comparison_rows(comparisons, rows):
    """{"overall": [...], "by_type": [...]}: the paired comparisons as table rows, each a dict with
    the evaluation's script, figure (its name), flip type, the models (tag and label) with their
    values as text, the difference and its interval as text, images, whether the interval excludes 0
    (None: no interval) and `stale` (the values are not the table's: an earlier run's); in
    EVALUATIONS, figure, flip type and file order."""
    by_model = {r["model"]: r for r in rows}
    order = list(COMPARED) + list(COMPARED_OWN)
    types = list(dict.fromkeys(row_types(rows) + list(FLIP_TYPES)))

    def key(c):
        return (
            EVAL_KEYS.index(c["source"]) if c["source"] in EVAL_KEYS else len(EVAL_KEYS),
            order.index(c["figure"]) if c["figure"] in order else len(order),
            types.index(c["flip_type"]) if c["flip_type"] in types else len(types),
        )

    out = {"overall": [], "by_type": []}
    for c in sorted(comparisons, key=key):
        name, digits = COMPARED_NAMES.get(c["figure"], (c["figure"], 4))

        def model(tag, value):
            r = by_model.get(tag)
            return {
                "tag": tag,
                "label": r["label"] if r else tag,
                "value": "–" if value is None else f"{value:.{digits}f}",
            }

        ci = interval({"d_ci_lo": c["lo"], "d_ci_hi": c["hi"]}, "d", digits)
        out["overall" if c["flip_type"] is None else "by_type"].append(
            {
                "script": c["script"],
                "figure": name,
                "flip_type": c["flip_type"],
                "a": model(c["a"], c["a_value"]),
                "b": model(c["b"], c["b_value"]),
                "diff": "–" if c["diff"] is None else f"{c['diff']:+.{digits}f}",
                "ci": ci,
                "images": c["num_images"],
                "excludes_zero": c["excludes_zero"],
                "stale": _stale(c, by_model),
                "created": c["created"],
            }
        )
    return out


def comparison_text(row):
    """What the last column of a comparison says: EXCLUDES, "—", or "— (no interval)"."""
    return EXCLUDES if row["excludes_zero"] else "—" if row["excludes_zero"] is not None else "— (no interval)"


COMPARISONS_LEAD = (
    "Each pair of models A, B evaluated in one run, on the same images: A − B with its 95% interval from "
    'resampling the images, the same drawn images for both models. "' + EXCLUDES + '": a difference '
    "beyond resampling noise on these images, nothing more (no claim about other images, settings or "
    'model sizes); "—": the interval contains 0.'
)


def comparisons_notes(table, comparisons, rows):
    """Sentences under the comparisons table: the files read, and the rows whose values are not the
    table's (an earlier run's); or, with two models or more and no comparison, why there is none."""
    notes = []
    if comparisons:
        files = list(dict.fromkeys(c["file"] for c in comparisons))
        notes.append("From " + ", ".join(f"`{f}`" for f in files) + ".")
    elif sum(1 for r in rows if r.get("_controls")) >= 2:
        notes.append(
            "No paired comparison: they are made for the models evaluated together in one run (each pair of "
            "its MODELS), by `run_lgip_multi.py` and `run_lgip_by_fliptype.py` (and `run_lgip_retrieval.py`, "
            "`explain_flips.py`, `run_lgip_images.py` for their own figures) in `<stem>__LGIP_comparisons."
            "metrics.json`."
        )
    stale = [t for t in table["overall"] + table["by_type"] if t["stale"]]
    if stale:
        notes.append(
            f"† {len(stale)} comparison{'s' if len(stale) != 1 else ''}: a model's value is not its figure in the "
            "results table: the comparison comes from an earlier run than the figures (a later run of one "
            "model replaced its row); re-run the models together to compare them again."
        )
    return notes
