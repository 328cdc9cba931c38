"""lgip.report.extract: one model's metrics of each evaluation as flat columns (`extract_<key>`: its
figures named `<key>_<figure>`, checked by lgip.report.fields). An evaluation's extractor called with
{} gives every column it can have, all None: its CSV columns (lgip.report.evaluations.Evaluation.columns).

    >>> extract_multi({"invariance_error_mean": 0.1, "sensitivity_pos_rate": 0.6})["multi_pos_rate"]
    0.6
"""

from ..method import FLIP_TYPES
from ..retrieval import KS
from .fields import Block, CONTROLS, RELATIVE, TYPE_CONTROLS, block, count, fig, number


def enhanced_blocks(m):
    """(flip-once figures, combined figures or None, label): corrected when present, else published."""
    c = m.get("corrected")
    if isinstance(c, dict):
        return c, c.get("combined"), "corrected"
    return m, None, "published"


def extract_multi(m, types=None):
    out = {}
    out.update(fig(m, "invariance_error_mean", "multi_invariance_error", required=True))
    out.update(fig(m, RELATIVE, "multi_" + RELATIVE))
    out.update(fig(m, "sensitivity_gap_mean", "multi_gap", required=True))
    out.update(fig(m, "sensitivity_pos_rate", "multi_pos_rate", required=True))
    out["multi_num_records"] = count(m, "num_samples")
    _controls(out, Block(m), "multi_")
    return out


def _controls(out, b, prefix, keys=CONTROLS):
    """The text-prior controls and hard positives of block `b` (None where not there), as
    prefix + name; and prefix + "_controls": whether the block has them at all (an older file has not)."""
    for key, name in keys:
        out.update(fig(b, key, prefix + name))
    out[prefix + "_controls"] = any(key in b for key, _ in keys)


def types_of(b, types=None):
    """The flip types to read from per-type block `b` (a by_flip_type dict): `types` when given (the
    report's, for its columns), else LGIP's then any other the block has, in its order."""
    if types is not None:
        return list(types)
    return list(dict.fromkeys(list(FLIP_TYPES) + list(b)))


def extract_fliptypes(m, types=None):
    out = {}
    g = block(m, "global_sensitivity")
    out.update(fig(m, "invariance_error_mean", "fliptypes_invariance_error", required=True))
    out.update(fig(m, RELATIVE, "fliptypes_" + RELATIVE))
    out.update(fig(g, "gap_mean", "fliptypes_gap", required=True))
    out.update(fig(g, "pos_rate", "fliptypes_pos_rate", required=True))
    out["fliptypes_num_records"] = count(m, "num_samples")
    by_type = block(m, "by_flip_type")
    for t in types_of(by_type, types):
        b = block(by_type, t)
        out.update(fig(b, "pos_rate", f"fliptypes_{t}_pos_rate"))
        out.update(fig(b, "gap_mean", f"fliptypes_{t}_gap"))
        out[f"fliptypes_{t}_count"] = count(b, "count")
        _controls(out, b, f"fliptypes_{t}_", TYPE_CONTROLS)
    _controls(out, Block(m), "fliptypes_")
    return out


def extract_enhanced(m, types=None):
    out = {}
    corrected = m.get("corrected") is not None  # (as enhanced_blocks reads it: checked here)
    flips = block(m, "corrected") if corrected else Block(m)
    combined = block(flips, "combined") if corrected else Block()
    g = block(flips, "global_sensitivity")
    out.update(fig(m, "global_invariance_error_mean", "enhanced_invariance_error", required=True))
    out.update(fig(g, "gap_mean", "enhanced_gap", required=True))
    out.update(fig(g, "pos_rate", "enhanced_pos_rate", required=True))
    out["enhanced_num_records"] = count(block(m, "corrected"), "num_records")
    count(m, "num_samples")
    for kind in ("simple", "advanced"):
        out.update(fig(m, f"paraphrase_{kind}_inv_error_mean", f"enhanced_{kind}_invariance_error"))
    cg = block(combined, "global_sensitivity")
    out.update(fig(cg, "pos_rate", "enhanced_combined_pos_rate"))
    out.update(fig(cg, "gap_mean", "enhanced_combined_gap"))
    stats = block(flips, "error_type_stats")
    for t in types_of(stats, types):  # per type: no CI in the enhanced analysis
        b = block(block(stats, t), "overall")
        out.update(fig(b, "pos_rate", f"enhanced_{t}_pos_rate"))
        out.update(fig(b, "gap_mean", f"enhanced_{t}_gap"))
        out[f"enhanced_{t}_count"] = count(b, "count")
    return out


LOCALIZATION = ("localization_acc", "localization_acc_detected", "localization_acc_preferred")


DETECTION = ("ap_clipscore", "ap_fclipscore", "ap_gain")  # explain_flips.py's detection_<name> (LGIP_SPEC.md 8)
DETECTION_COUNTS = ("num_captions", "num_flips")


def _detection(out, b, prefix):
    """F-CLIPScore's misalignment detection of block `b` (captions against flips): the average precision
    by CLIPScore and by F-CLIPScore and F's gain, each with its interval, and the counts, as prefix + name."""
    for name in DETECTION:
        out.update(fig(b, "detection_" + name, prefix + name))
    for name in DETECTION_COUNTS:
        out[prefix + name] = count(b, "detection_" + name)


def extract_explain(m, types=None):
    out = {"localization_num_flips": count(m, "num_flips"), "localization_chance": number(m, "chance")}
    for key in LOCALIZATION:
        out.update(fig(m, key))
    for part in ("detected", "preferred"):
        out[f"localization_num_{part}"] = count(m, f"num_{part}")
    by_type = block(m, "by_flip_type")
    kinds = types_of(by_type, types)
    for t in kinds:
        b = block(by_type, t)
        out.update(fig(b, "localization_acc", f"localization_{t}_acc"))
        out[f"localization_{t}_chance"], out[f"localization_{t}_count"] = number(b, "chance"), count(b, "count")
    _detection(out, Block(m), "detection_")  # (after localization's: the columns an older CSV had come first)
    for t in kinds:
        _detection(out, block(by_type, t), f"detection_{t}_")
    return out


RETRIEVAL = (
    [f"i2t_recall@{k}" for k in KS]
    + [f"t2i_recall@{k}" for k in KS]
    + [f"i2t_flip_recall@{k}" for k in KS]
    + ["i2t_flip_top1_rate", "own_flip_preferred_rate", "t2i_paraphrase_recall@1", "t2i_paraphrase_agreement@1"]
)
RETRIEVAL_COUNTS = (
    "num_samples",
    "gallery_size",
    "num_blocks",
    "num_captions",
    "num_flips",
    "num_paraphrases",
    "num_images_with_flips",
)


def extract_retrieval(m, types=None):
    """run_lgip_retrieval.py's figures (LGIP_SPEC.md section 7), each as retrieval_<name>."""
    out = {f"retrieval_{k}": count(m, k) for k in RETRIEVAL_COUNTS}
    for key in RETRIEVAL:
        out.update(fig(m, key, f"retrieval_{key}"))
    by_type = block(m, "by_flip_type")
    for t in types_of(by_type, types):
        b = block(by_type, t)
        for key in ("i2t_flip_top1_rate", "own_flip_preferred_rate"):
            out.update(fig(b, key, f"retrieval_{t}_{key}"))
        out[f"retrieval_{t}_count"] = count(b, "count")
    return out


IMAGE_PARAPHRASE_KINDS = ("jpeg", "downscale", "crop", "hflip")  # LGIP_SPEC.md 11 (lgip.alterations: not imported, the
IMAGE_FLIP_KINDS = ("mix", "patch")  # report reads files and needs no model code)
IMAGE_FIGURES = (
    ("image_invariance_error_mean", "image_invariance_error"),
    ("image_sensitivity_gap_mean", "image_gap"),
    ("image_sensitivity_pos_rate", "image_pos_rate"),
)
IMAGE_FLIP_FIGURES = (
    ("image_sensitivity_gap_mean", "gap"),
    ("image_sensitivity_pos_rate", "pos_rate"),
    *((f"t2i_flip_recall@{k}", f"t2i_flip_recall@{k}") for k in KS),
    ("t2i_flip_top1_rate", "t2i_flip_top1_rate"),
)


def extract_images(m, types=None):
    """run_lgip_images.py's figures (LGIP_SPEC.md section 11): the three headline image figures as
    image_invariance_error, image_gap, image_pos_rate, and per kind image_<kind>_<figure> with its
    count (every kind's columns, None where the run left it out)."""
    out = {"image_num_samples": count(m, "num_samples"), "image_num_images": count(m, "num_images")}
    for key, name in IMAGE_FIGURES:
        out.update(fig(m, key, name))
    by_kind = block(m, "by_kind")
    for kind in IMAGE_PARAPHRASE_KINDS + IMAGE_FLIP_KINDS:
        b = block(by_kind, kind)
        figures = (
            IMAGE_FLIP_FIGURES if kind in IMAGE_FLIP_KINDS else (("image_invariance_error_mean", "invariance_error"),)
        )
        for key, name in figures:
            out.update(fig(b, key, f"image_{kind}_{name}"))
        out[f"image_{kind}_count"] = count(b, "count")
    return out
