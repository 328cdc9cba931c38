"""lgip.report.rows: one flat row per model (the report's CSV columns) from the evaluations' metrics
(`build_rows`): its headline figures from one evaluation (HEADLINE: the first that ran, or the one
named), its per-type figures from the first typed one, every evaluation's own columns by name, and
what the row's files were made by (their files, dates and settings that differ). Also the models'
cards merged over their files, their short labels, where their images lie, and the rank
correlations across models that the retrieval figure and text show.

    >>> rows = build_rows({k: load_metrics(p) for k, p in found.items()}, paths=found)
    >>> round(rows[0]["invariance_error"], 4), round(rows[0]["invariance_error_ci_lo"], 4), rows[0]["headline_source"]
    (0.1088, 0.0869, 'multi')
    >>> rows[0]["headline_file"], rows[0]["mixed_settings"]      # its file; settings that differ between its files
    ('x_with_perturb__LGIP_ALL.metrics.json', None)

A model's row comes from one row of each evaluation's file, and those may come from different runs
(each list file keeps the rows of the models a later run did not evaluate: lgip.results): a row
names the file of its headline and per-type figures and when that file's row was made
(`headline_file`, `headline_created`, `flip_type_file`, `flip_type_created`), and the settings
that differ between the runs that made its rows (`mixed_settings`; `_mixed` for the notes),
settings in IGNORED_SETTINGS left out.
"""

import os
import re

from ..errors import InputError
from ..method import FLIP_TYPES
from ..scoring import spearman
from .fields import CARD_FIELDS, CONTROL_FIGURES, FIGURES, RELATIVE, TYPE_CONTROLS, with_ci
from .evaluations import (
    COLUMNS,
    EVALUATIONS,
    EVAL_KEYS,
    HEADLINE_KEYS,
    SCRIPTS,
    columns,
    mixed_settings,
    mixed_text,
    report_types,
)


RETRIEVAL_AXES = ("retrieval_i2t_recall@1", "retrieval_i2t_flip_top1_rate")  # the retrieval figure's two x axes
DESCRIPTIVE_BELOW = 5  # a rank correlation over fewer models describes them, nothing more


def rank_correlations(rows):
    """Across models: Spearman's rho between the LGIP positive rate (the table's) and each of
    RETRIEVAL_AXES, over the models having both: [{"x", "rho" (None under 3 models), "n",
    "descriptive"}], [] when no model has retrieval figures."""
    out = []
    for x in RETRIEVAL_AXES:
        pairs = [(r[x], r["pos_rate"]) for r in rows if r.get(x) is not None and r.get("pos_rate") is not None]
        if pairs:
            out.append(
                {"x": x, "rho": spearman(*zip(*pairs)), "n": len(pairs), "descriptive": len(pairs) < DESCRIPTIVE_BELOW}
            )
    return out


def model_card(ms):
    """A model's card from its rows `ms` of the evaluations (in EVALUATIONS order): field by field,
    the first that is not None (an evaluation that loaded no weights may not know every field)."""
    cards = [m.get("model_card") for m in ms if isinstance(m.get("model_card"), dict)]
    return {k: next((c[k] for c in cards if c.get(k) is not None), None) for k in CARD_FIELDS}


def _created(m):
    created = (m.get("run") or {}).get("created")
    return None if created is None else str(created)


def build_rows(metrics, headline="auto", labels=None, paths=None):
    """One dict per model (CSV columns, in first-seen order over the evaluations), plus `_type`
    and `_family` (the model's loader type and, for transformers, its model type: the figures'
    markers), `_mixed` (mixed_settings), `_types` (the flip types of its per-type columns:
    report_types) and `_card` (model_card). `labels`: tag -> label overrides; `paths`: evaluation
    -> its metrics file (find_metrics), named in `headline_file` and `flip_type_file`."""
    if headline not in ("auto", *HEADLINE_KEYS):
        raise InputError(f"unknown HEADLINE {headline!r}; valid: auto, {', '.join(HEADLINE_KEYS)}")
    if headline != "auto" and headline not in metrics:
        raise InputError(
            f"HEADLINE={headline!r} but no {SCRIPTS[headline]} metrics were found "
            f"(found: {', '.join(metrics) or 'none'})"
        )
    per_model = {}
    for e in EVALUATIONS:
        for m in metrics.get(e.key, ()):
            entry = per_model.setdefault(m["model_tag"], {"values": {}, "runs": {}})
            entry["values"].update(e.extract(m))
            entry["runs"][e.key] = m
    rows = []
    files = {k: os.path.basename(p) for k, p in (paths or {}).items()}
    types = report_types(metrics)
    cols = COLUMNS if types == list(FLIP_TYPES) else columns(types)
    for tag, entry in per_model.items():
        v, runs = entry["values"], entry["runs"]
        src = headline if headline != "auto" else next((k for k in HEADLINE_KEYS if k in runs), None)
        row = dict.fromkeys(cols)
        row.update({k: val for k, val in v.items() if k in row})
        row["model"] = tag
        if src in runs:
            row["headline_source"], row["headline_file"], row["headline_created"] = (
                src,
                files.get(src),
                _created(runs[src]),
            )
            # the headline evaluation's figures and controls (of the same pairs as its positive rate)
            row.update(
                {c: v.get(f"{src}_{c}") for c in with_ci(FIGURES + CONTROL_FIGURES + (RELATIVE,)) + ["num_records"]}
            )
            row["_controls"] = bool(v.get(f"{src}__controls"))  # its file has them (an older one has not)
            row["_unmeasured"] = [f for f in FIGURES if row[f] is None]  # null in its file: nothing measured
        typed = next((e.key for e in EVALUATIONS if e.typed and e.key in runs), None)
        if typed:
            row["flip_type_source"], row["flip_type_file"], row["flip_type_created"] = (
                typed,
                files.get(typed),
                _created(runs[typed]),
            )
            per_type = with_ci(("pos_rate", "gap") + tuple(name for _, name in TYPE_CONTROLS)) + ["count"]
            row.update({f"{t}_{c}": v.get(f"{typed}_{t}_{c}") for t in types for c in per_type})
        run_infos = [(runs[k].get("run") or {}) for k in EVAL_KEYS if k in runs]
        head_run = (runs.get(src) or runs[next(iter(runs))]).get("run") or {}
        row["protocol"] = (head_run.get("model") or {}).get("protocol")
        row["_type"] = next(
            ((r.get("model") or {}).get("type") for r in run_infos if (r.get("model") or {}).get("type")), None
        )
        row["_family"] = next(
            ((r.get("model") or {}).get("family") for r in run_infos if (r.get("model") or {}).get("family")), None
        )  # (type transformers: clip, siglip, ...)
        row["_types"] = types
        # what its score s is (LGIP_SPEC.md 13; a file from before score kinds: a dual encoder's cosine)
        row["score_kind"] = next(
            (runs[k]["score_kind"] for k in EVAL_KEYS if k in runs and isinstance(runs[k].get("score_kind"), str)),
            "cosine",
        )
        row["_card"] = model_card([runs[k] for k in EVAL_KEYS if k in runs])
        # did it see the probed images in training? (lgip.overlap; None: no question)
        row["_overlap"] = next(
            (runs[k]["images_seen_overlap"] for k in EVAL_KEYS if (runs.get(k) or {}).get("images_seen_overlap")), None
        )
        row["reads_images"] = not any(runs[k].get("reads_images") is False for k in EVAL_KEYS if k in runs)
        row["_mixed"] = mixed_settings(runs)
        row["mixed_settings"] = mixed_text(row["_mixed"]) or None
        failed = [r.get("num_failed_images") for r in run_infos if r.get("num_failed_images") is not None]
        row["num_failed_images"] = max(failed) if failed else None
        if row["num_records"] is None:
            row["num_records"] = next(
                (v.get(f"{k}_num_records") for k in EVAL_KEYS if v.get(f"{k}_num_records") is not None), None
            )
        rows.append(row)
    tags = short_labels([r["model"] for r in rows], labels)
    kinds = mixed_kinds(rows)
    for r in rows:  # (the score kind beside each name where the models' scores differ in kind; a blind model marked)
        r["label"] = (
            tags[r["model"]] + (f" ({r['score_kind']})" if kinds else "") + ("" if r["reads_images"] else " [text]")
        )
    return rows


def mixed_kinds(rows):
    """True when the rows' models score in more than one kind (LGIP_SPEC.md 13): invariance error and gap
    are then in different units, and invariance_error_rel is what compares them."""
    return len({r.get("score_kind") or "cosine" for r in rows}) > 1


def short_label(tag):
    """A readable figure label for a model tag.

    >>> short_label("openclip_ViT-L-14_laion2b_s32b_b82k"), short_label("siglip_google_siglip-base-patch16-224")
    ('ViT-L-14 (laion2b)', 'siglip-base-patch16-224')
    """
    m = re.match(r"^openclip_(.+?)_(.+)$", tag)
    if m:
        pretrained = re.sub(r"_s\d+[mb]_b\d+k$", "", m.group(2))
        return f"{m.group(1)} ({pretrained})"
    m = re.match(r"^siglip2?_[^_]+_(siglip.*)$", tag)  # siglip_google_siglip-..., siglip2_google_siglip2-...
    if m:
        return m.group(1)
    return tag


def short_labels(tags, overrides=None):
    """tag -> label; automatic labels that would collide fall back to the full tag."""
    overrides = overrides or {}
    auto = {t: short_label(t) for t in tags}
    counts = {}
    for lab in auto.values():
        counts[lab] = counts.get(lab, 0) + 1
    return {t: overrides.get(t, auto[t] if counts[auto[t]] == 1 else t) for t in tags}


def image_roots(metrics, metrics_paths, image_root=None):
    """{(evaluation, model): [folders an image_path of its score file may be relative to]}:
    `image_root` when given, else the IMAGE_ROOT the evaluation recorded (else its JSONL's
    folder), then the metrics file's folder (the evaluation's outputs lie beside its input)."""
    roots = {}
    for key, ms in metrics.items():
        beside = os.path.dirname(os.path.abspath(metrics_paths[key]))
        for m in ms:
            config = (m.get("run") or {}).get("config") or {}
            recorded = config.get("IMAGE_ROOT") or (
                os.path.dirname(config["JSONL_PATH"]) if config.get("JSONL_PATH") else None
            )
            first = image_root or recorded
            roots[(key, m["model_tag"])] = list(dict.fromkeys(r for r in (first, beside) if r))
    return roots
