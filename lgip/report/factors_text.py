"""lgip.report.factors_text: "What predicts robustness" (LGIP_SPEC.md 12) as tables: the factors file's
rank correlations and level means, the controlled pairs, and their notes, for the markdown and the page.

    >>> factor_lines(compute_factors(rows, metrics, comparisons, 1000, 0))["groups"][0]["title"]
"""

import os


FACTOR_NAMES = {
    "log10_params_total": "Parameters (log10)",
    "log10_samples_seen": "Samples seen (log10)",
    "image_size": "Image size",
    "family": "family",
    "training_data": "training data",
    "loss": "loss",
}


def _models(n):
    return f"{n} model{'s' if n != 1 else ''}"


def _signed(v, digits):
    return f"{v:+.{digits}f}".replace("-", "−")


def factor_lines(factors):
    """{"lead", "header", "groups": [{"title", "rows": [{"label", "cells": [{"text", "sub"}]}]}], "pairs":
    {"header", "rows"}, "notes"} of the section "What predicts robustness" from the factors file's dict
    (lgip.report.factors.compute_factors); None without it or with fewer than two models (nothing to compare: the
    file has the one model's card and figures). A cell's `sub` is its interval and counts."""
    if factors is None or sum(1 for m in factors["models"] if not m.get("same_weights_as")) < 2:
        return None
    from .factors import CATEGORICAL, MIN_LEVEL_MODELS, MIN_RHO_MODELS, NUMERIC, OUTCOME, UNKNOWN

    outcomes = factors["outcomes"]
    header = [OUTCOME[o][2] for o in outcomes]
    digits = {o: OUTCOME[o][3] for o in outcomes}
    resamples = factors["settings"]["resamples"]
    numeric = []
    for f, card_field, _ in NUMERIC:
        cells = []
        for o in outcomes:
            st = factors["numeric"][f][o]
            ci = st["rho_ci95"]
            cells.append(
                {
                    "text": "–" if st["rho"] is None else f"ρ {_signed(st['rho'], 2)}",
                    "sub": (f"[{_signed(ci[0], 2)}, {_signed(ci[1], 2)}] · " if ci else "")
                    + _models(st["n"])
                    + (f" (under {MIN_RHO_MODELS})" if st["n"] < MIN_RHO_MODELS and st["n"] else ""),
                }
            )
        numeric.append({"label": FACTOR_NAMES[f], "title": f"{f}: the card's {card_field}", "cells": cells})
    groups = [
        {
            "title": f"Numeric: Spearman's ρ over the models with both values, [95% interval over {resamples} "
            f"resamples of the models]; under {MIN_RHO_MODELS} models none",
            "rows": numeric,
        }
    ]
    for f in CATEGORICAL:
        by_outcome = factors["categorical"][f]
        levels = list(dict.fromkeys(lv["level"] for o in outcomes for lv in by_outcome[o]["levels"]))
        rows = []
        for level in levels:
            cells = []
            for o in outcomes:
                lv = next((x for x in by_outcome[o]["levels"] if x["level"] == level), None)
                cells.append(
                    {"text": "–", "sub": ""}
                    if lv is None
                    else {"text": f"{lv['mean']:.{digits[o]}f}", "sub": _models(lv["n"])}
                )
            rows.append(
                {
                    "label": f"{FACTOR_NAMES[f]}: {UNKNOWN if level is None else level}",
                    "title": f"mean over the models whose card's {f} is "
                    + ("unknown (None)" if level is None else repr(level)),
                    "cells": cells,
                }
            )
        pairs = list(dict.fromkeys((c["a"], c["b"]) for o in outcomes for c in by_outcome[o]["compared"]))
        for a, b in pairs:
            cells = []
            for o in outcomes:
                c = next((x for x in by_outcome[o]["compared"] if (x["a"], x["b"]) == (a, b)), None)
                cells.append(
                    {"text": "–", "sub": ""}
                    if c is None
                    else {"text": _signed(c["diff"], digits[o]), "sub": f"{c['n_a']} vs {c['n_b']} models"}
                )
            rows.append(
                {
                    "label": f"{FACTOR_NAMES[f]}: {a} − {b}",
                    "title": "difference of the two levels' means",
                    "cells": cells,
                }
            )
        groups.append(
            {
                "title": f"Categorical: {FACTOR_NAMES[f]}, the mean of each level (differences only between known "
                f"levels of {MIN_LEVEL_MODELS} models or more)",
                "rows": rows,
            }
        )
    pair_rows = []
    for p in factors["controlled_pairs"]:
        cells = []
        for o in outcomes:
            d = p["outcomes"].get(o)
            if d is None:
                cells.append({"text": "–", "sub": ""})
                continue
            ci = d["diff_ci95"]
            cells.append(
                {
                    "text": _signed(d["diff"], digits[o]),
                    "sub": f"[{_signed(ci[0], digits[o])}, {_signed(ci[1], digits[o])}]"
                    + (" · excludes 0" if ci[0] > 0 or ci[1] < 0 else "")
                    if ci
                    else "no interval",
                }
            )
        pair_rows.append({"a": p["a"], "b": p["b"], "why": p["why"], "cells": cells})
    counted = [m for m in factors["models"] if not m.get("same_weights_as")]
    n = len(counted)
    cards = sum(1 for m in counted if any(v is not None for v in (m["card"] or {}).values()))
    lead = (
        f"Which property of a model goes with its figures, across the {_models(n)} here (LGIP_SPEC.md section 12, "
        "after the holistic CLIP study): each model's card (`model_card`: parameters counted, image size, training "
        "data and samples seen from its pretrained tag, family, loss; unknown where the card does not say) beside "
        "the table's figures. Numeric factors: Spearman's rank correlation ρ over the models (near +1: the larger the "
        "factor, the higher the figure). Categorical: each level's mean. Controlled pairs: two models differing in "
        "one factor only, their difference A − B with its 95% interval over images from the paired comparisons. "
        "Across a handful of models these describe those models, nothing more; `"
        f"{os.path.basename(factors.get('file') or '<stem>__LGIP_factors.metrics.json')}` has every figure."
    )
    notes = []
    twice = [m for m in factors["models"] if m.get("same_weights_as")]
    if twice:
        notes.append(
            "One set of weights is one model here: "
            + "; ".join(
                f"{m['model']} ({m.get('score_kind') or 'its score'}) has the weights of {m['same_weights_as']}"
                for m in twice
            )
            + ", so only the first is counted."
        )
    if cards < n:
        notes.append(
            f"{n - cards} of the {_models(n)} have no model card in their metrics (made before the cards): "
            "every factor unknown."
        )
    if not factors["controlled_pairs"]:
        notes.append(
            "No controlled pair: no two models have the same architecture and different training data, nor the "
            "same training data and family and a different size (a card field that is unknown matches nothing)."
        )
    elif any(d["diff_ci95"] is None for p in factors["controlled_pairs"] for d in p["outcomes"].values()):
        notes.append(
            '"no interval": the evaluation of that figure made no paired comparison of the pair (a figure it '
            "does not compare, models evaluated in different runs, or `BOOTSTRAP=0`): the difference of the "
            "figures alone."
        )
    return {
        "lead": lead,
        "header": header,
        "groups": groups,
        "pairs": {"header": ["A", "B", "Why"] + header, "rows": pair_rows},
        "notes": notes,
    }
