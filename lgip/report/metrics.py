"""lgip.report.metrics: which evaluations ran on a JSONL, their metrics files read, and one flat
row per model (the report's CSV columns) built from them.

Each evaluation the report knows is one `Evaluation` in `EVALUATIONS`: its script, the suffix of
its metrics file, where its input lies beside a base JSONL, and how one model's metrics become
flat columns (`extract`). A row is a plain dict, so a later evaluation (say retrieval figures)
adds an `Evaluation` whose `columns` are appended to the CSV (when it ran: `csv_columns`) and
whose figures the results table picks up by name (`lgip.report.tables.RESULT_COLUMNS`).
run_lgip_retrieval.py's recall figures (`retrieval`, every section 7 figure as `retrieval_<name>`),
explain_flips.py's word attribution (`explain`: localization accuracy per model) and
run_lgip_images.py's image side (`images`: section 11's figures as `image_<name>`) are three such.

    >>> found, looked = find_metrics("data/x.jsonl")      # {"multi": "data/x_with_perturb__LGIP_ALL.metrics.json", ...}
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
import json
import os
import re
from dataclasses import dataclass
from typing import Callable, Tuple

from ..errors import InputError
from ..records import read_json
from ..retrieval import KS
from ..scoring import spearman
from ..method import FLIP_TYPES
from ..util import default_output, finite_number, metrics_path

FIGURES = ("invariance_error", "gap", "pos_rate")  # the headline figures, each with a CI
# LGIP_SPEC.md sections 9 and 10, in run_lgip_multi.py's and run_lgip_by_fliptype.py's rows: (key in
# the metrics, name in a row); each with a CI, None in an older file (written before them) or with
# fewer than 2 images (prior and grounded) or no paraphrase (the hard positives)
CONTROLS = (("prior_pos_rate", "prior_pos_rate"), ("grounded_pos_rate", "grounded_pos_rate"),
            ("prior_gap_mean", "prior_gap"), ("grounded_gap_mean", "grounded_gap"),
            ("invariance_error_prior_mean", "invariance_error_prior"),
            ("invariance_error_grounded_mean", "invariance_error_grounded"),
            ("robust_pos_rate", "robust_pos_rate"), ("text_only_rate", "text_only_rate"))
CONTROL_FIGURES = tuple(name for _, name in CONTROLS)
TYPE_CONTROLS = CONTROLS[:4] + CONTROLS[6:]  # a by_flip_type block's (no paraphrase figures)
NON_NEGATIVE = re.compile(r"(^|_)(inv_error|invariance_error)(_\w+)?_mean$")  # a metrics key of a mean of |differences|: >= 0
RATE = re.compile(r"(rate|recall|acc|chance|agreement)(@\d+)?(_detected|_preferred)?$")  # figures in [0, 1]


class BadField(ValueError):
    """A field of one model's metrics that the report cannot use: `field` (dotted), why."""

    def __init__(self, field, why):
        super().__init__(f"field '{field}' {why}")
        self.field = field


class Block(dict):
    """A block of one model's metrics that knows where it lies (`where`: 'corrected.global_sensitivity.'),
    so that a bad value in it is named by its whole path."""
    where = ""


def _what(v):
    return f"the string {v!r}" if isinstance(v, str) else f"{v!r} ({type(v).__name__})"


def block(parent, key):
    """parent[key] as a Block: {} when absent or null; BadField when it is not an object."""
    parent = parent if isinstance(parent, Block) else Block(parent or {})
    v = parent.get(key)
    if v is not None and not isinstance(v, dict):
        raise BadField(parent.where + key, f"is {_what(v)}, not an object")
    out = Block(v or {})
    out.where = parent.where + key + "."
    return out


def _value(field, v, name):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadField(field, f"is {_what(v)}, not a number")
    if not finite_number(v):  # (an int too large for a float too)
        raise BadField(field, f"is {v!r}, not a finite number"[:200])
    if RATE.search(name) and not 0.0 <= v <= 1.0:
        raise BadField(field, f"is {v!r}, not a rate within [0, 1]")
    if NON_NEGATIVE.search(field.rsplit(".", 1)[-1].removesuffix("_ci95")) and v < 0:
        raise BadField(field, f"is {v!r}, not a mean of absolute differences (>= 0)")
    return v


def number(b, key, name=None, required=False):
    """b[key]: None (null or absent: a figure not measured, e.g. no pairs) or a finite number, a
    rate within [0, 1]; BadField for NaN, Inf, a string, a rate out of range, or a `required`
    field that is not there at all."""
    b = b if isinstance(b, Block) else Block(b or {})
    if key not in b and required:
        raise BadField(b.where + key, "is missing (null where nothing was measured)")
    return _value(b.where + key, b.get(key), name or key)


def count(b, key):
    """b[key]: None or an int >= 0."""
    b = b if isinstance(b, Block) else Block(b or {})
    v = b.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise BadField(b.where + key, f"is {_what(v)}, not a count (an int >= 0)")
    return v


def fig(b, key, name=None, required=False):
    """{name: value, name_ci_lo, name_ci_hi} from b[key] and b[key + "_ci95"] (null: no interval,
    else two finite numbers, low <= high), each checked (`number`)."""
    name = name or key
    b = b if isinstance(b, Block) else Block(b or {})
    value = number(b, key, name, required)
    ci = b.get(key + "_ci95")
    if ci is None:
        lo = hi = None
    elif not isinstance(ci, (list, tuple)) or len(ci) != 2:
        raise BadField(b.where + key + "_ci95", f"is {_what(ci)}, not [low, high] or null")
    else:
        lo, hi = (_value(b.where + key + "_ci95", v, name) for v in ci)
        if (lo is None) != (hi is None) or (lo is not None and lo > hi):
            raise BadField(b.where + key + "_ci95", f"is {ci!r}, not [low, high] with low <= high")
    return {name: value, name + "_ci_lo": lo, name + "_ci_hi": hi}


def enhanced_blocks(m):
    """(flip-once figures, combined figures or None, label): corrected when present, else published."""
    c = m.get("corrected")
    if isinstance(c, dict):
        return c, c.get("combined"), "corrected"
    return m, None, "published"


def _extract_multi(m, types=None):
    out = {}
    out.update(fig(m, "invariance_error_mean", "multi_invariance_error", required=True))
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


def _extract_fliptypes(m, types=None):
    out = {}
    g = block(m, "global_sensitivity")
    out.update(fig(m, "invariance_error_mean", "fliptypes_invariance_error", required=True))
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


def _extract_enhanced(m, types=None):
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


def _extract_explain(m, types=None):
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


RETRIEVAL = ([f"i2t_recall@{k}" for k in KS] + [f"t2i_recall@{k}" for k in KS] + [f"i2t_flip_recall@{k}" for k in KS]
             + ["i2t_flip_top1_rate", "own_flip_preferred_rate", "t2i_paraphrase_recall@1", "t2i_paraphrase_agreement@1"])
RETRIEVAL_COUNTS = ("num_samples", "gallery_size", "num_blocks", "num_captions", "num_flips", "num_paraphrases", "num_images_with_flips")


def _extract_retrieval(m, types=None):
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
IMAGE_FIGURES = (("image_invariance_error_mean", "image_invariance_error"), ("image_sensitivity_gap_mean", "image_gap"),
                 ("image_sensitivity_pos_rate", "image_pos_rate"))
IMAGE_FLIP_FIGURES = (("image_sensitivity_gap_mean", "gap"), ("image_sensitivity_pos_rate", "pos_rate"),
                      *((f"t2i_flip_recall@{k}", f"t2i_flip_recall@{k}") for k in KS), ("t2i_flip_top1_rate", "t2i_flip_top1_rate"))


def _extract_images(m, types=None):
    """run_lgip_images.py's figures (LGIP_SPEC.md section 11): the three headline image figures as
    image_invariance_error, image_gap, image_pos_rate, and per kind image_<kind>_<figure> with its
    count (every kind's columns, None where the run left it out)."""
    out = {"image_num_samples": count(m, "num_samples"), "image_num_images": count(m, "num_images")}
    for key, name in IMAGE_FIGURES:
        out.update(fig(m, key, name))
    by_kind = block(m, "by_kind")
    for kind in IMAGE_PARAPHRASE_KINDS + IMAGE_FLIP_KINDS:
        b = block(by_kind, kind)
        figures = IMAGE_FLIP_FIGURES if kind in IMAGE_FLIP_KINDS else (("image_invariance_error_mean", "invariance_error"),)
        for key, name in figures:
            out.update(fig(b, key, f"image_{kind}_{name}"))
        out[f"image_{kind}_count"] = count(b, "count")
    return out


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
            out.append({"x": x, "rho": spearman(*zip(*pairs)), "n": len(pairs), "descriptive": len(pairs) < DESCRIPTIVE_BELOW})
    return out


def _num_samples(m):
    return m.get("num_samples", "?")


# Settings of a run that cannot change its figures, left out when a model's rows in different
# files are compared (`mixed_settings`): where the inputs are and each evaluation's own input
# (derived from one base, so always different); how fast or how much at once (the same numbers to
# float rounding: the published calls are the method's, not the batch sizes'); where it ran (the
# dtype it resolved to is compared, as `dtype`); which files it also wrote; which other models ran
# beside (this model's own MODELS entry is compared, as `model spec`); a model it could not run.
IGNORED_SETTINGS = frozenset({
    "JSONL_PATH", "IMAGE_ROOT",
    "NUM_WORKERS", "LOOKAHEAD", "CACHE_DIR", "CACHE_FLUSH_S", "PIXEL_MEMORY_GB", "ACCELERATIONS_OFF",
    "IMAGE_BATCH_SIZE", "TEXT_BATCH_SIZE",
    "DEVICE", "DTYPE",
    "WRITE_SCORES",
    "MODELS", "SHARD",
    "ON_MODEL_ERROR", "UNSUPPORTED",
})


@dataclass(frozen=True)
class Evaluation:
    key: str  # the name in HEADLINE, SCORE_SOURCES and the CSV's *_source columns
    script: str
    suffix: str  # its metrics file: <its input's stem>__<suffix>
    derived: Tuple[str, str]  # its input beside a base JSONL: (suffix, prefix) of the base's stem
    extract: Callable  # one model's metrics -> {column: value}
    short: str  # its name in a figure's subtitle
    headline: bool = True  # has invariance error, gap and positive rate, so can head the table
    typed: bool = False  # has figures per flip type
    columns: Tuple[str, ...] = ()  # CSV columns of its own, after the shared ones (COLUMNS), when it ran: its extract's keys
    scores: bool = True  # writes per-pair score files (the top lists' SCORE_SOURCES)
    evaluated: Callable = _num_samples  # one model's metrics -> what it evaluated, as the inputs table says it
    fixed_dtype: bool = False  # runs every model in one dtype whatever the settings (so not compared: mixed_settings)
    controls: bool = False  # has the text-prior controls and hard positives (CONTROLS; per flip type too when typed)
    comparisons: bool = False  # writes <its input stem>__LGIP_comparisons.metrics.json (paired model comparisons)


EVALUATIONS = [
    Evaluation("multi", "run_lgip_multi.py", "LGIP_ALL.metrics.json", ("_with_perturb.jsonl", ""),
               _extract_multi, "run_lgip_multi", controls=True, comparisons=True),
    Evaluation("fliptypes", "run_lgip_by_fliptype.py", "LGIP_fliptypes.metrics.json", ("_with_fliptypes.jsonl", ""),
               _extract_fliptypes, "run_lgip_by_fliptype", typed=True, controls=True, comparisons=True),
    Evaluation("enhanced", "rebuttal_enhanced_lgip_by_transformation.py", "ENHANCED_LGIP_analysis.json",
               ("_with_fliptypes.jsonl", "rebuttal_enhanced_"), _extract_enhanced, "enhanced analysis, corrected",
               typed=True, evaluated=lambda m: (m.get("corrected") or {}).get("num_records", "?")),
    Evaluation("retrieval", "run_lgip_retrieval.py", "LGIP_retrieval.metrics.json", ("_with_fliptypes.jsonl", ""),
               _extract_retrieval, "run_lgip_retrieval", headline=False, columns=tuple(_extract_retrieval({})), scores=False,
               comparisons=True),
    Evaluation("explain", "explain_flips.py", "LGIP_explain.metrics.json", ("_with_fliptypes.jsonl", ""),
               _extract_explain, "explain_flips", headline=False, columns=tuple(_extract_explain({})), scores=False,
               evaluated=lambda m: f"{m.get('num_flips', '?')} flips", fixed_dtype=True, comparisons=True),
    Evaluation("images", "run_lgip_images.py", "LGIP_images.metrics.json", ("_with_fliptypes.jsonl", ""),
               _extract_images, "run_lgip_images", headline=False, columns=tuple(_extract_images({})), scores=False,
               comparisons=True),
]
BY_KEY = {e.key: e for e in EVALUATIONS}
EVAL_KEYS = [e.key for e in EVALUATIONS]
SCRIPTS = {e.key: e.script for e in EVALUATIONS}
HEADLINE_KEYS = [e.key for e in EVALUATIONS if e.headline]
SCORE_KEYS = [e.key for e in EVALUATIONS if e.scores]


def own_columns(e, types=None):
    """Evaluation e's own CSV columns (its extract's keys) with per-type columns for `types`
    (None: LGIP's flip types, as `e.columns`)."""
    return tuple(e.extract({}, types)) if e.columns and types is not None else e.columns


def columns(types=None):
    """The CSV's columns, in order, with per-type columns for `types` (None: LGIP's color, number,
    object; a benchmark's own types otherwise: `report_types`)."""
    def ci(name):
        return [name, name + "_ci_lo", name + "_ci_hi"]
    cols = ["model", "label", "protocol", "num_records", "num_failed_images", "headline_source", "headline_file",
            "headline_created", "mixed_settings"]
    for f in FIGURES + CONTROL_FIGURES:  # (the controls from the headline's evaluation, as the positive rate)
        cols += ci(f)
    cols += ["flip_type_source", "flip_type_file", "flip_type_created"]
    for t in FLIP_TYPES if types is None else types:
        cols += ci(f"{t}_pos_rate") + ci(f"{t}_gap") + [f"{t}_count"]
        for _, name in TYPE_CONTROLS:
            cols += ci(f"{t}_{name}")
    for name in ("simple_invariance_error", "advanced_invariance_error", "combined_pos_rate", "combined_gap"):
        cols += ci("enhanced_" + name)
    for key in HEADLINE_KEYS:  # each evaluation's own headline figures, whichever heads the table
        for f in FIGURES + (CONTROL_FIGURES if BY_KEY[key].controls else ()):
            cols += ci(f"{key}_{f}")
    for e in EVALUATIONS:
        cols += list(own_columns(e, types))
    return cols


COLUMNS = columns()  # the CSV's columns of LGIP's data, in order; every row has each (None where unknown)


def csv_columns(found, types=None, extra=()):
    """columns(types) less the own columns of the evaluations not in `found` (a report without them
    writes the CSV it wrote before they existed), then `extra` (a benchmark's means over its types)."""
    absent = {c for e in EVALUATIONS if e.key not in found for c in own_columns(e, types)}
    return [c for c in columns(types) if c not in absent] + list(extra)


def _type_block(key, m):
    """One model's per-type blocks in evaluation `key`'s metrics ({} where it has none)."""
    b = (enhanced_blocks(m)[0].get("error_type_stats") if key == "enhanced" else
         m.get("by_flip_type") if key in ("fliptypes", "retrieval", "explain") else None)
    return b if isinstance(b, dict) else {}


def present_types(metrics):
    """The flip types the evaluations' per-type blocks have, in order of first appearance (over
    EVALUATIONS, their models, each block's order: the input's diff_caps_<type> order)."""
    out = {}
    for e in EVALUATIONS:
        for m in metrics.get(e.key, ()):
            out.update(dict.fromkeys(_type_block(e.key, m)))
    return list(out)


def report_types(metrics):
    """The flip types the report's per-type columns and figure show: LGIP's color, number, object
    (in that order, all three, as always) when the metrics have no other; else the types the metrics
    have, in their order (an imported benchmark's own: add_att, ..., swap_obj)."""
    present = present_types(metrics)
    return list(FLIP_TYPES) if set(present) <= set(FLIP_TYPES) else present


def find_metrics(jsonl_path):
    """{evaluation: metrics path} of the evaluations that ran on jsonl_path (or its derived
    inputs), and every path looked at."""
    found, looked = {}, []
    for e in EVALUATIONS:
        inputs = [jsonl_path, default_output(jsonl_path, *e.derived)]
        for path in (metrics_path(p, e.suffix) for p in inputs):
            looked.append(path)
            if e.key not in found and os.path.isfile(path):
                found[e.key] = path
    return found, looked


def _check_model(m, e):
    """BadField for the first field of one model's metrics the report cannot use: its figures
    (e's extract: NaN, Inf, strings, a broken interval, a headline figure missing), its counts,
    its run block and the files it names."""
    run = block(m, "run")
    count(run, "num_failed_images")
    _check_card(m)
    model, config = block(run, "model"), block(run, "config")
    versions = block(run, "versions")
    for b, key in ((config, "IMAGE_ROOT"), (config, "JSONL_PATH"), (model, "type"), (model, "protocol"),
                   (model, "dtype"), (run, "script"), (run, "created")):
        if b.get(key) is not None and not isinstance(b[key], str):
            raise BadField(b.where + key, f"is {_what(b[key])}, not a string or null")
    for name, v in versions.items():
        if not isinstance(v, str):
            raise BadField(versions.where + str(name), f"is {_what(v)}, not a version string")
    kinds, seed = config.get("KINDS"), config.get("SEED")
    if kinds is not None and (not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds)):
        raise BadField(config.where + "KINDS", f"is {_what(kinds)}, not a list of kinds")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadField(config.where + "SEED", f"is {_what(seed)}, not an int (the altered images are remade from it)")
    for key in ("scores_file", "explain_file"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise BadField(key, f"is {_what(m[key])}, not a file name or null")
    if e is not None:
        e.extract(m)


def load_metrics(path, key=None):
    """A metrics file: a list of per-model dicts, each with a model_tag, every figure the report
    reads checked (evaluation `key`, else the one whose suffix the file name has). InputError
    naming the file, the model and the field: NaN, Inf, a string for a number, an interval that
    is not [low, high], a headline figure missing; null is a figure not measured (shown as –)."""
    data = read_json(path)  # (a byte-order mark at its start is fine)
    if isinstance(data, dict):  # a single model's metrics file
        data = [data]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a list of per-model metrics with 'model_tag', got {type(data).__name__}")
    if not data:
        raise InputError(f"{path}: no model's metrics in it (an empty list); re-run the evaluation that wrote it")
    e = BY_KEY.get(key) or next((e for e in EVALUATIONS if os.path.basename(path).endswith("__" + e.suffix)), None)
    seen = set()
    for i, m in enumerate(data):
        tag = m.get("model_tag") if isinstance(m, dict) else None
        if not isinstance(tag, str) or not tag:
            raise InputError(f"{path}: model #{i + 1} of {len(data)}: "
                             + ("not an object" if not isinstance(m, dict) else "no 'model_tag' (a non-empty string)"))
        if tag in seen:
            raise InputError(f"{path}: model {tag} is listed twice")
        seen.add(tag)
        try:
            _check_model(m, e)
        except BadField as bad:
            raise InputError(f"{path}: model {tag}: {bad}") from None
    return data


def run_settings(m, e):
    """{setting: its value as JSON text} of the run that made `m`, one model's row of evaluation
    `e`, that can change its figures: its run.config less IGNORED_SETTINGS, the model's own MODELS
    entry (`model spec`) and the dtype it ran in (`dtype`, but where `e` fixes it)."""
    run = m.get("run") if isinstance(m.get("run"), dict) else {}
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    model = run.get("model") if isinstance(run.get("model"), dict) else {}
    out = {k: v for k, v in config.items() if k not in IGNORED_SETTINGS}
    models = config.get("MODELS") if isinstance(config.get("MODELS"), list) else []
    spec = next((s for s in models if isinstance(s, dict) and s.get("name") == m.get("model_tag")), None)
    if spec is not None:
        out["model spec"] = spec
    if model.get("dtype") is not None and not e.fixed_dtype:
        out["dtype"] = model["dtype"]
    return {k: json.dumps(v, sort_keys=True, ensure_ascii=False) for k, v in out.items()}


def mixed_settings(runs):
    """[(setting, [(value as JSON text, [evaluation keys])])] for each setting that differs between
    the runs that made one model's rows (`runs`: evaluation -> its row), in EVALUATIONS order; a
    setting a run does not record is compared among the others."""
    values = {}
    for e in EVALUATIONS:
        if e.key in runs:
            for k, v in run_settings(runs[e.key], e).items():
                values.setdefault(k, {}).setdefault(v, []).append(e.key)
    return [(k, list(vs.items())) for k, vs in values.items() if len(vs) > 1]


def mixed_text(mixed, name=lambda key: key):
    """'PROTOCOL "reference" (multi), "corrected" (fliptypes); ...' (name: evaluation key -> as shown)."""
    return "; ".join(f"{k} " + ", ".join(f"{v} ({', '.join(name(key) for key in keys)})" for v, keys in values)
                     for k, values in mixed)


CARD_FIELDS = ("source", "architecture", "pretrained", "family", "params_image", "params_text", "params_total",
               "embed_dim", "image_size", "context_length", "loss", "training_data", "samples_seen")  # LGIP_SPEC.md 12
CARD_NUMBERS = ("params_image", "params_text", "params_total", "embed_dim", "image_size", "context_length", "samples_seen")


def _check_card(m):
    """One model's `model_card` (LGIP_SPEC.md 12), checked: an object or absent, its counts None or
    numbers > 0, its other fields None or strings (BadField for the first that is not)."""
    card = block(m, "model_card")
    for key in CARD_FIELDS:
        v = card.get(key)
        if v is None:
            continue
        if key in CARD_NUMBERS:
            if _value(card.where + key, v, key) <= 0:
                raise BadField(card.where + key, f"is {v!r}, not a number > 0 (or null: unknown)")
        elif not isinstance(v, str):
            raise BadField(card.where + key, f"is {_what(v)}, not a string (or null: unknown)")


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
        raise InputError(f"HEADLINE={headline!r} but no {SCRIPTS[headline]} metrics were found "
                         f"(found: {', '.join(metrics) or 'none'})")
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
            row["headline_source"], row["headline_file"], row["headline_created"] = src, files.get(src), _created(runs[src])
            for f in FIGURES:
                for suffix in ("", "_ci_lo", "_ci_hi"):
                    row[f + suffix] = v.get(f"{src}_{f}{suffix}")
            row["num_records"] = v.get(f"{src}_num_records")
            for f in CONTROL_FIGURES:  # (of the same pairs as its positive rate)
                for suffix in ("", "_ci_lo", "_ci_hi"):
                    row[f + suffix] = v.get(f"{src}_{f}{suffix}")
            row["_controls"] = bool(v.get(f"{src}__controls"))  # its file has them (an older one has not)
            row["_unmeasured"] = [f for f in FIGURES if row[f] is None]  # null in its file: nothing measured
        typed = next((e.key for e in EVALUATIONS if e.typed and e.key in runs), None)
        if typed:
            row["flip_type_source"], row["flip_type_file"], row["flip_type_created"] = (typed, files.get(typed),
                                                                                       _created(runs[typed]))
            for t in types:
                for part in ("pos_rate", "gap"):
                    for suffix in ("", "_ci_lo", "_ci_hi"):
                        row[f"{t}_{part}{suffix}"] = v.get(f"{typed}_{t}_{part}{suffix}")
                row[f"{t}_count"] = v.get(f"{typed}_{t}_count")
                for _, name in TYPE_CONTROLS:
                    for suffix in ("", "_ci_lo", "_ci_hi"):
                        row[f"{t}_{name}{suffix}"] = v.get(f"{typed}_{t}_{name}{suffix}")
        run_infos = [(runs[k].get("run") or {}) for k in EVAL_KEYS if k in runs]
        head_run = (runs.get(src) or runs[next(iter(runs))]).get("run") or {}
        row["protocol"] = (head_run.get("model") or {}).get("protocol")
        row["_type"] = next(((r.get("model") or {}).get("type") for r in run_infos
                             if (r.get("model") or {}).get("type")), None)
        row["_family"] = next(((r.get("model") or {}).get("family") for r in run_infos
                               if (r.get("model") or {}).get("family")), None)  # (type transformers: clip, siglip, ...)
        row["_types"] = types
        row["_card"] = model_card([runs[k] for k in EVAL_KEYS if k in runs])
        row["_mixed"] = mixed_settings(runs)
        row["mixed_settings"] = mixed_text(row["_mixed"]) or None
        failed = [r.get("num_failed_images") for r in run_infos if r.get("num_failed_images") is not None]
        row["num_failed_images"] = max(failed) if failed else None
        if row["num_records"] is None:
            row["num_records"] = next((v.get(f"{k}_num_records") for k in EVAL_KEYS
                                       if v.get(f"{k}_num_records") is not None), None)
        rows.append(row)
    tags = short_labels([r["model"] for r in rows], labels)
    for r in rows:
        r["label"] = tags[r["model"]]
    return rows


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
            recorded = config.get("IMAGE_ROOT") or (os.path.dirname(config["JSONL_PATH"])
                                                   if config.get("JSONL_PATH") else None)
            first = image_root or recorded
            roots[(key, m["model_tag"])] = list(dict.fromkeys(r for r in (first, beside) if r))
    return roots


# --- paired model comparisons (LGIP_SPEC.md section 9): <input stem>__LGIP_comparisons.metrics.json ---

COMPARISONS_SUFFIX = "LGIP_comparisons.metrics.json"
COMPARED = {"sensitivity_pos_rate": "pos_rate", "grounded_pos_rate": "grounded_pos_rate",
            "invariance_error_mean": "invariance_error"}  # a compared figure -> its name in a row (<evaluation>_<name>)
COMPARED_OWN = {"i2t_recall@1": "retrieval_i2t_recall@1", "i2t_flip_top1_rate": "retrieval_i2t_flip_top1_rate",
                "localization_acc": "localization_acc", "image_sensitivity_pos_rate": "image_pos_rate"}
# ^ the figures of the evaluations with one figure of a name (section 12's outcomes) -> its key in a row


def comparison_files(found):
    """[(evaluation key, path)] of the comparisons files beside the metrics of the evaluations found
    that write them (each path once), and the paths looked at that are not there (an older run: fine)."""
    files, absent = [], []
    for e in EVALUATIONS:
        if e.comparisons and e.key in found:
            path = found[e.key][:-len(e.suffix)] + COMPARISONS_SUFFIX
            if path in absent or any(p == path for _, p in files):
                continue
            if os.path.isfile(path):
                files.append((e.key, path))
            else:
                absent.append(path)
    return files, absent


def _comparison(row):
    """One paired comparison's fields checked (BadField for the first that the report cannot use):
    {script, a, b, figure, flip_type, diff, lo, hi, a_value, b_value, num_images, excludes_zero, created};
    `excludes_zero` is the interval's, and must agree with the file's where that says."""
    for key in ("script", "a", "b", "figure"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise BadField(key, f"is {_what(row.get(key)) if key in row else 'missing'}, not a non-empty string")
    figure = row["figure"]
    if row.get("flip_type") is not None and not isinstance(row["flip_type"], str):
        raise BadField("flip_type", f"is {_what(row['flip_type'])}, not a flip type or null")
    rate = bool(RATE.search(figure))
    out = {k: row[k] for k in ("script", "a", "b", "figure")}
    out["flip_type"] = row.get("flip_type")
    for key in ("a_value", "b_value"):
        out[key] = _value(key, row.get(key), figure)
    diff = fig(Block(row), "diff", "difference")  # (finite numbers, [low, high] with low <= high)
    out["diff"], out["lo"], out["hi"] = diff["difference"], diff["difference_ci_lo"], diff["difference_ci_hi"]
    for key, v in (("diff", out["diff"]), ("diff_ci95", out["lo"]), ("diff_ci95", out["hi"])):
        if rate and v is not None and not -1.0 <= v <= 1.0:
            raise BadField(key, f"is {row[key]!r}, not a difference of two rates (within [-1, 1])")
    out["num_images"] = count(row, "num_images")
    said = row.get("excludes_zero")
    if said is not None and not isinstance(said, bool):
        raise BadField("excludes_zero", f"is {_what(said)}, not true, false or null")
    out["excludes_zero"] = None if out["lo"] is None else bool(out["lo"] > 0 or out["hi"] < 0)
    if said is not None and out["excludes_zero"] is not None and said != out["excludes_zero"]:
        raise BadField("excludes_zero", f"is {said!r}, but diff_ci95 {row['diff_ci95']!r} "
                                        f"{'excludes' if out['excludes_zero'] else 'contains'} 0")
    run = block(row, "run")
    out["created"] = None if run.get("created") is None else str(run["created"])
    return out


def load_comparisons(path, key=None):
    """A comparisons file: its rows checked (`_comparison`), each with `source` (the evaluation whose
    `script` wrote the row: run_lgip_multi and run_lgip_by_fliptype write into one file when they share
    an input, as on an imported benchmark; `key` for a script that is not an evaluation) and `file`;
    InputError naming the file, the row and the field."""
    by_script = {e.script: e.key for e in EVALUATIONS if e.comparisons}
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a list of paired comparisons ({{script, a, b, figure, flip_type, diff, "
                         f"diff_ci95, ...}}), got {type(data).__name__}")
    out = []
    for i, row in enumerate(data):
        where = f"{path}: row {i + 1} of {len(data)}"
        if not isinstance(row, dict):
            raise InputError(f"{where}: not an object")
        try:
            checked = _comparison(row)
        except BadField as bad:
            what = ", ".join(str(row.get(k)) for k in ("a", "b", "figure") if isinstance(row.get(k), str))
            raise InputError(f"{where}{f' ({what})' if what else ''}: {bad}") from None
        out.append(dict(checked, source=by_script.get(checked["script"], key), file=os.path.basename(path)))
    return out


# --- an imported benchmark (LGIP_SPEC.md section 10): its own types, its table ---

BENCHMARK_NAMES = {"sugarcrepe": "SugarCrepe", "sugarcrepe++": "SugarCrepe++", "rococo": "RoCOCO"}  # import_benchmark.py's SOURCE
PAIR_ACCURACY = ("sugarcrepe", "sugarcrepe++")  # benchmarks whose own accuracy is a type's positive rate (RoCOCO's is retrieval)
BENCHMARK_MEANS = (("pos_rate", "benchmark_mean_pos_rate"), ("robust_pos_rate", "benchmark_mean_robust_pos_rate"),
                   ("text_only_rate", "benchmark_mean_text_only_rate"))  # per-type figure -> its mean over the types (CSV)


def _import_meta(path):
    """import_benchmark.py's `<file>.meta.json` beside `path`, or None (absent, unreadable, or another
    script's: a generator's meta names no source)."""
    if not os.path.isfile(path + ".meta.json"):
        return None
    try:
        meta = read_json(path + ".meta.json")
    except (InputError, OSError, ValueError):
        return None
    if isinstance(meta, dict) and meta.get("script") == "import_benchmark.py" and isinstance(meta.get("source"), str):
        for key in ("items_by_type", "items_written_by_type"):  # (what the benchmark table reads of it: checked)
            v = meta.get(key)
            if v is not None and (not isinstance(v, dict) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v.values())):
                raise InputError(f"{path}.meta.json: field {key!r} is {_what(v)}, not an object of counts per type"[:300])
        for key in ("num_images", "num_images_missing"):
            v = meta.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InputError(f"{path}.meta.json: field {key!r} is {_what(v)}, not a count (an int >= 0)")
        if meta.get("source_url") is not None and not isinstance(meta["source_url"], str):
            raise InputError(f"{path}.meta.json: field 'source_url' is {_what(meta['source_url'])}, not a string")
        return meta
    return None


def benchmark_source(jsonl_path, metrics, types):
    """{"source", "name", "meta": its import_benchmark.py meta (or None), "meta_path", "accuracy": whether
    the benchmark's own accuracy is a type's positive rate (SugarCrepe's, SugarCrepe++'s)} when the report
    is about an imported benchmark: the meta beside JSONL_PATH or beside the typed evaluations' input
    says so, or the per-type figures have types that are not LGIP's (then source None, name "Benchmark");
    else None."""
    inputs = [jsonl_path] + [((m.get("run") or {}).get("config") or {}).get("JSONL_PATH")
                             for key in ("fliptypes", "multi") for m in metrics.get(key, ())]
    for path in dict.fromkeys(p for p in inputs if isinstance(p, str) and p):
        meta = _import_meta(path)
        if meta is not None:
            return {"source": meta["source"], "name": BENCHMARK_NAMES.get(meta["source"], meta["source"]),
                    "meta": meta, "meta_path": path + ".meta.json", "accuracy": meta["source"] in PAIR_ACCURACY}
    if types and not set(types) <= set(FLIP_TYPES):
        return {"source": None, "name": "Benchmark", "meta": None, "meta_path": None, "accuracy": False}
    return None


def type_mean(row, types, figure):
    """The unweighted mean over `types` of a row's per-type `figure` (as the benchmarks report their
    mean accuracy); None when a type has none."""
    values = [row.get(f"{t}_{figure}") for t in types]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def add_benchmark_means(rows):
    """Each row's benchmark_mean_<figure> (BENCHMARK_MEANS, over its `_types`); returns the CSV's extra
    columns: the positive rate's mean, and the hard positives' when some row has them by type."""
    extra = []
    for figure, name in BENCHMARK_MEANS:
        for r in rows:
            r[name] = type_mean(r, r.get("_types") or [], figure)
        if figure == "pos_rate" or any(r[name] is not None for r in rows):
            extra.append(name)
    return extra
