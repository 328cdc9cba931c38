"""lgip.report.factors: what predicts robustness (LGIP_SPEC.md section 12, "Factors"), from the rows of
one input's metrics and each model's `model_card`: `<stem>__LGIP_factors.metrics.json`.

- outcomes: every headline figure present (OUTCOMES: the metrics' name, and the report row's key it
  is read from: the table's figure, run_lgip_images.py's `image_sensitivity_pos_rate` included; where
  the rows have no such column, from any evaluation's per-model dict that has it at its top);
- numeric factors (NUMERIC) log10 params_total, log10 samples_seen, image_size: per outcome Spearman's
  rho over the models having both values (average ranks for ties: lgip.scoring.spearman), `n`, and
  `rho_ci95`, the 2.5 / 97.5 percentiles of rho over `resamples` resamples of those models with
  replacement (`numpy.random.default_rng(seed).integers(0, n, (resamples, n))`, drawn afresh for each
  factor and outcome; a resample with a constant column is skipped, `resamples_used` counts the
  others); n < 4: rho None;
- categorical factors (CATEGORICAL) family, training_data, loss: per level (in the models' order;
  None is the level "unknown") `n` models and the outcome's mean; two known levels are compared
  (the difference of their means) only when both have n >= 2;
- controlled pairs: two models with the same architecture and different training data, or the same
  training data and family and different params_total (every field named known: None is never
  "the same" nor "different"), each outcome's difference a - b with its paired bootstrap interval over
  images from `<stem>__LGIP_comparisons.metrics.json` (section 9) where the evaluation of the
  outcome compared the pair there, else the difference of the figures without interval, said.

    >>> f = compute_factors(rows, metrics, comparisons, resamples=1000, seed=0)
    >>> f["numeric"]["log10_params_total"]["sensitivity_pos_rate"]
    {'n': 4, 'rho': 0.4, 'rho_ci95': [-0.8, 1.0], 'resamples_used': 873}
"""

import json
import math

from ..errors import InputError
from ..scoring import spearman
from ..outputs import atomic_open
from .evaluations import EVALUATIONS, SCRIPTS

OUTCOMES = (  # (name in the metrics, key in a report row, header, digits, better)
    ("sensitivity_pos_rate", "pos_rate", "Pos. rate ↑", 3, "high"),
    ("grounded_pos_rate", "grounded_pos_rate", "Grounded pos. ↑", 3, "high"),
    ("invariance_error_mean", "invariance_error", "Inv. error ↓", 4, "low"),
    ("invariance_error_rel", "invariance_error_rel", "Inv. rel. ↓", 3, "low"),
    ("i2t_recall@1", "retrieval_i2t_recall@1", "I2T R@1 ↑", 3, "high"),
    ("i2t_flip_top1_rate", "retrieval_i2t_flip_top1_rate", "Flip top\u20111 ↓", 3, "low"),
    ("localization_acc", "localization_acc", "Loc. acc. ↑", 3, "high"),
    ("image_sensitivity_pos_rate", "image_pos_rate", "Image pos. ↑", 3, "high"),
)
OUTCOME = {o[0]: o for o in OUTCOMES}
OUTCOME_SOURCE = {
    "i2t_recall@1": "retrieval",
    "i2t_flip_top1_rate": "retrieval",
    "localization_acc": "explain",
    "image_sensitivity_pos_rate": "images",
}  # the evaluation whose paired comparisons have an outcome
# (the others: the evaluation the table's headline figures come from)
NUMERIC = (
    ("log10_params_total", "params_total", True),
    ("log10_samples_seen", "samples_seen", True),
    ("image_size", "image_size", False),
)  # (factor, its card field, taken as log10)
CATEGORICAL = ("family", "training_data", "loss")
MIN_RHO_MODELS = 4  # fewer models: rho None
MIN_LEVEL_MODELS = 2  # two levels are compared only when both have this many models
UNKNOWN = "unknown"  # a level that is None on the card


def _raw_value(metrics, tag, name):
    """`name` at the top of model `tag`'s per-model dict in the first evaluation that has it (an
    outcome the report's rows do not carry), checked: a finite number, or None."""
    for e in EVALUATIONS:
        for m in metrics.get(e.key, ()):
            if m.get("model_tag") == tag and m.get(name) is not None:
                v = m[name]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise InputError(
                        f"{SCRIPTS[e.key]}'s metrics: model {tag}: field '{name}' is {v!r}, not a finite number"
                    )
                return v
    return None


def outcome_values(rows, metrics):
    """{model: {outcome: value}} of the OUTCOMES each model has (the row's figure; where the rows
    have no such column at all, the metrics' own field). Models of several score kinds (LGIP_SPEC.md
    13): no invariance_error_mean (in each kind's own units), invariance_error_rel compares them."""
    from .rows import mixed_kinds

    units = ("invariance_error_mean",) if mixed_kinds(rows) else ()
    out = {}
    for r in rows:
        values = {}
        for name, key, *_ in OUTCOMES:
            if name in units:
                continue
            v = r.get(key) if key in r else _raw_value(metrics, r["model"], name)
            if v is not None:
                values[name] = v
        out[r["model"]] = values
    return out


def _ranks(v):
    import numpy as np

    u, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[inverse]  # average ranks: a tie shares the mean of its positions


def rho(xs, ys):
    """Spearman's rho of paired values: the Pearson correlation of their average ranks (ties share
    their mean rank), lgip.scoring.spearman's (the same to 1e-12) with the ranks vectorised, for the
    resamples; None for a constant side or fewer than 2 pairs."""
    import numpy as np

    if len(xs) < 2:
        return None
    rx, ry = _ranks(np.asarray(xs, dtype=np.float64)), _ranks(np.asarray(ys, dtype=np.float64))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return round(float(np.corrcoef(rx, ry)[0, 1]), 12)


def rho_interval(xs, ys, resamples, seed):
    """(rho_ci95, resamples used): the 2.5 / 97.5 percentiles of rho over `resamples` resamples of the
    pairs with replacement (numpy.random.default_rng(seed).integers(0, n, (resamples, n))), a resample
    with a constant column skipped; (None, 0) when none is left or resamples is 0."""
    import numpy as np

    if not resamples:
        return None, 0
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(xs), size=(resamples, len(xs)))
    values = [v for v in (rho(xs[d], ys[d]) for d in draws) if v is not None]
    if not values:
        return None, 0
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)], len(values)


def factor_value(card, factor):
    """A model's value of numeric factor `factor` (NUMERIC) from its card: log10 of the count, or the
    size; None where the card does not say."""
    field, log = next((f, log) for name, f, log in NUMERIC if name == factor)
    v = (card or {}).get(field)
    return None if v is None else (math.log10(v) if log else v)


def numeric_factor(rows, values, factor, outcome, resamples, seed):
    """{n, rho, rho_ci95, resamples_used} of one numeric factor against one outcome, over the models
    having both."""
    pairs = [(factor_value(r.get("_card"), factor), values[r["model"]].get(outcome)) for r in rows]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    n = len(pairs)
    out = {"n": n, "rho": None, "rho_ci95": None, "resamples_used": 0}
    if n >= MIN_RHO_MODELS:
        xs, ys = zip(*pairs)
        out["rho"] = spearman(xs, ys)
        if out["rho"] is not None:
            out["rho_ci95"], out["resamples_used"] = rho_interval(xs, ys, resamples, seed)
    return out


def categorical_factor(rows, values, factor, outcome):
    """{"levels": [{level (None: unknown), n, mean}], "compared": [{a, b, n_a, n_b, diff}]} of one
    categorical factor against one outcome: each level's models having the outcome, in the rows'
    order; known levels with n >= MIN_LEVEL_MODELS compared pairwise (mean a - mean b)."""
    levels = {}
    for r in rows:
        y = values[r["model"]].get(outcome)
        if y is not None:
            levels.setdefault((r.get("_card") or {}).get(factor), []).append(y)
    out = [{"level": level, "n": len(ys), "mean": sum(ys) / len(ys)} for level, ys in levels.items()]
    known = [lv for lv in out if lv["level"] is not None and lv["n"] >= MIN_LEVEL_MODELS]
    compared = [
        {"a": a["level"], "b": b["level"], "n_a": a["n"], "n_b": b["n"], "diff": a["mean"] - b["mean"]}
        for i, a in enumerate(known)
        for b in known[i + 1 :]
    ]
    return {"levels": out, "compared": compared}


def controlled_reason(ca, cb):
    """Why two cards make a controlled pair (LGIP_SPEC.md 12), as (rule, sentence), or None: the same
    architecture and different training data; or the same training data and family and different
    params_total. A field that is None on either card satisfies neither."""
    a, b = ca or {}, cb or {}

    def known(field):
        return a.get(field) is not None and b.get(field) is not None

    if (
        known("architecture")
        and known("training_data")
        and a["architecture"] == b["architecture"]
        and a["training_data"] != b["training_data"]
    ):
        return "training_data", (
            f"same architecture {a['architecture']}, training data {a['training_data']} vs {b['training_data']}"
        )
    if (
        known("training_data")
        and known("family")
        and known("params_total")
        and a["training_data"] == b["training_data"]
        and a["family"] == b["family"]
        and a["params_total"] != b["params_total"]
    ):
        return "params_total", (
            f"same training data {a['training_data']} and family {a['family']}, "
            f"{a['params_total'] / 1e6:.1f}M vs {b['params_total'] / 1e6:.1f}M parameters"
        )
    return None


def _paired(comparisons, script, a, b, outcome, va, vb):
    """The paired comparison of a and b (either order) for `outcome` by `script`, overall, as
    (diff a - b, [lo, hi] or None, its file), or None; one whose values are not the figures' (an
    earlier run's) is not used."""
    for c in comparisons:
        if (
            c["script"] != script
            or c["figure"] != outcome
            or c.get("flip_type") is not None
            or {c["a"], c["b"]} != {a, b}
        ):
            continue
        sign = 1.0 if c["a"] == a else -1.0
        mine = (va, vb) if sign > 0 else (vb, va)
        if any(
            v is not None and m is not None and abs(v - m) > 1e-9 for v, m in zip((c["a_value"], c["b_value"]), mine)
        ):
            continue
        ci = None if c["lo"] is None else sorted([sign * c["lo"], sign * c["hi"]])
        return sign * c["diff"] if c["diff"] is not None else va - vb, ci, c["file"]
    return None


def controlled_pairs(rows, values, comparisons):
    """[{a, b, rule, why, outcomes: {outcome: {a_value, b_value, diff, diff_ci95, from, note}}}] for every
    controlled pair of models (rows order: a before b)."""
    out = []
    for i, ra in enumerate(rows):
        for rb in rows[i + 1 :]:
            reason = controlled_reason(ra.get("_card"), rb.get("_card"))
            if reason is None:
                continue
            a, b = ra["model"], rb["model"]
            diffs = {}
            for name, *_ in OUTCOMES:
                va, vb = values[a].get(name), values[b].get(name)
                if va is None or vb is None:
                    continue
                src = OUTCOME_SOURCE.get(name) or (
                    ra.get("headline_source") if ra.get("headline_source") == rb.get("headline_source") else None
                )
                found = _paired(comparisons, SCRIPTS.get(src), a, b, name, va, vb) if src else None
                if found:
                    diffs[name] = {
                        "a_value": va,
                        "b_value": vb,
                        "diff": found[0],
                        "diff_ci95": found[1],
                        "from": found[2],
                        "note": None if found[1] is not None else "no interval in its paired comparison (BOOTSTRAP=0)",
                    }
                else:
                    diffs[name] = {
                        "a_value": va,
                        "b_value": vb,
                        "diff": va - vb,
                        "diff_ci95": None,
                        "from": None,
                        "note": "no paired comparison of this pair for this figure: the difference of the "
                        "figures, no interval",
                    }
            out.append({"a": a, "b": b, "rule": reason[0], "why": reason[1], "outcomes": diffs})
    return out


def weights_of(row):
    """The weights a row's model runs (its card's source, architecture and pretrained weights), or None when the
    card does not tell them (then the row is a model of its own)."""
    card = row.get("_card") or {}
    if card.get("pretrained") is None:
        return None
    return (card.get("source"), card.get("architecture"), str(card.get("pretrained")))


def one_per_weights(rows):
    """(the rows the statistics count: one per set of weights, the first in the models' order; {a row left out:
    the row it shares its weights with}): a model scored two ways (two score kinds) is one model there."""
    first, same = {}, {}
    for r in rows:
        key = weights_of(r)
        if key is not None and key in first:
            same[r["model"]] = first[key]
        elif key is not None:
            first[key] = r["model"]
    return [r for r in rows if r["model"] not in same], same


def compute_factors(rows, metrics, comparisons, resamples=1000, seed=0):
    """The factors of one input's models (the module's docstring): {"outcomes", "models", "numeric",
    "categorical", "controlled_pairs", "settings"}; report.py adds "input" and "run" and writes it. A set of
    weights counts once (one_per_weights): its other rows are listed with `same_weights_as` and left out of the
    statistics."""
    values = outcome_values(rows, metrics)
    outcomes = [name for name, *_ in OUTCOMES if any(name in v for v in values.values())]
    # (a model that reads no image, LGIP_SPEC.md 15, is a text-prior control, not one of the zoo: listed, not counted)
    every, (rows, same) = rows, one_per_weights([r for r in rows if r.get("reads_images", True)])
    return {
        "outcomes": outcomes,
        "models": [
            {
                "model": r["model"],
                "label": r["label"],
                "card": r.get("_card"),
                "factors": {
                    **{f: factor_value(r.get("_card"), f) for f, _, _ in NUMERIC},
                    **{f: (r.get("_card") or {}).get(f) for f in CATEGORICAL},
                },
                "outcomes": {o: values[r["model"]].get(o) for o in outcomes},
                "score_kind": r.get("score_kind"),
                "same_weights_as": same.get(r["model"]),
                **({} if r.get("reads_images", True) else {"reads_images": False}),
            }
            for r in every
        ],
        "numeric": {
            f: {o: numeric_factor(rows, values, f, o, resamples, seed) for o in outcomes} for f, _, _ in NUMERIC
        },
        "categorical": {f: {o: categorical_factor(rows, values, f, o) for o in outcomes} for f in CATEGORICAL},
        "controlled_pairs": controlled_pairs(rows, values, comparisons),
        "settings": {
            "resamples": resamples,
            "seed": seed,
            "min_models_rho": MIN_RHO_MODELS,
            "min_models_level": MIN_LEVEL_MODELS,
        },
    }


def write_factors(path, data, files=None):
    """The factors file: `data` as JSON (a dict: "input", what `factors` returns, "run" = report.py's
    provenance); files: the lgip.outputs.OutputSet it belongs to (None: written at once)."""
    with (files.open if files else atomic_open)(path) as f:
        f.write(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
