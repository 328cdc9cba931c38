"""lgip.report.evaluations: the evaluations the report knows (`EVALUATIONS`), which of them ran on a
JSONL, their metrics files read and checked, and the report's CSV columns. One flat row per model is
built from them by lgip.report.rows.build_rows.

Each evaluation the report knows is one `Evaluation` in `EVALUATIONS`: its script, the suffix of
its metrics file, where its input lies beside a base JSONL, and how one model's metrics become
flat columns (`extract`, lgip.report.extract). A row is a plain dict, so a later evaluation (say retrieval figures)
adds an `Evaluation` whose `columns` are appended to the CSV (when it ran: `csv_columns`) and
whose figures the results table picks up by name (`lgip.report.tables.RESULT_COLUMNS`).
run_lgip_retrieval.py's recall figures (`retrieval`, every section 7 figure as `retrieval_<name>`),
explain_flips.py's word attribution (`explain`: localization accuracy per model) and
run_lgip_images.py's image side (`images`: section 11's figures as `image_<name>`) are three such.

    >>> found, looked = find_metrics("data/x.jsonl")      # {"multi": "data/x_with_perturb__LGIP_ALL.metrics.json", ...}
"""

import json
import os
from dataclasses import dataclass
from typing import Callable, Tuple

from ..errors import InputError
from ..filenames import default_output, metrics_path
from ..method import FLIP_TYPES
from ..records import read_json
from .fields import (
    BadField,
    CONTROL_FIGURES,
    FIGURES,
    RELATIVE,
    TYPE_CONTROLS,
    block,
    check_card,
    count,
    what_is,
    with_ci,
)
from .extract import (
    extract_enhanced,
    extract_explain,
    extract_fliptypes,
    extract_images,
    extract_multi,
    extract_retrieval,
    enhanced_blocks,
)


def _num_samples(m):
    return m.get("num_samples", "?")


# Settings of a run that cannot change its figures, left out when a model's rows in different
# files are compared (`mixed_settings`): where the inputs are and each evaluation's own input
# (derived from one base, so always different); how fast or how much at once (the same numbers to
# float rounding: the published calls are the method's, not the batch sizes'); where it ran (the
# dtype it resolved to is compared, as `dtype`); which files it also wrote; which other models ran
# beside (this model's own MODELS entry is compared, as `model spec`); a model it could not run.
IGNORED_SETTINGS = frozenset(
    {
        "JSONL_PATH",
        "IMAGE_ROOT",
        "NUM_WORKERS",
        "LOOKAHEAD",
        "CACHE_DIR",
        "CACHE_FLUSH_S",
        "PIXEL_MEMORY_GB",
        "ACCELERATIONS_OFF",
        "IMAGE_BATCH_SIZE",
        "TEXT_BATCH_SIZE",
        "DEVICE",
        "DTYPE",
        "WRITE_SCORES",
        "MODELS",
        "SHARD",
        "ON_MODEL_ERROR",
        "UNSUPPORTED",
    }
)


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
    columns: Tuple[
        str, ...
    ] = ()  # CSV columns of its own, after the shared ones (COLUMNS), when it ran: its extract's keys
    scores: bool = True  # writes per-pair score files (the top lists' SCORE_SOURCES)
    evaluated: Callable = _num_samples  # one model's metrics -> what it evaluated, as the inputs table says it
    fixed_dtype: bool = False  # runs every model in one dtype whatever the settings (so not compared: mixed_settings)
    controls: bool = False  # has the text-prior controls and hard positives (CONTROLS; per flip type too when typed)
    comparisons: bool = False  # writes <its input stem>__LGIP_comparisons.metrics.json (paired model comparisons)
    type_blocks: Callable = lambda m: None  # one model's metrics -> its per-flip-type blocks ({type: block}), or None


def _by_flip_type(m):
    return m.get("by_flip_type")


EVALUATIONS = [
    Evaluation(
        "multi",
        "run_lgip_multi.py",
        "LGIP_ALL.metrics.json",
        ("_with_perturb.jsonl", ""),
        extract_multi,
        "run_lgip_multi",
        controls=True,
        comparisons=True,
    ),
    Evaluation(
        "fliptypes",
        "run_lgip_by_fliptype.py",
        "LGIP_fliptypes.metrics.json",
        ("_with_fliptypes.jsonl", ""),
        extract_fliptypes,
        "run_lgip_by_fliptype",
        typed=True,
        controls=True,
        comparisons=True,
        type_blocks=_by_flip_type,
    ),
    Evaluation(
        "enhanced",
        "rebuttal_enhanced_lgip_by_transformation.py",
        "ENHANCED_LGIP_analysis.json",
        ("_with_fliptypes.jsonl", "rebuttal_enhanced_"),
        extract_enhanced,
        "enhanced analysis, corrected",
        typed=True,
        evaluated=lambda m: (m.get("corrected") or {}).get("num_records", "?"),
        type_blocks=lambda m: enhanced_blocks(m)[0].get("error_type_stats"),
    ),
    Evaluation(
        "retrieval",
        "run_lgip_retrieval.py",
        "LGIP_retrieval.metrics.json",
        ("_with_fliptypes.jsonl", ""),
        extract_retrieval,
        "run_lgip_retrieval",
        headline=False,
        columns=tuple(extract_retrieval({})),
        scores=False,
        comparisons=True,
        type_blocks=_by_flip_type,
    ),
    Evaluation(
        "explain",
        "explain_flips.py",
        "LGIP_explain.metrics.json",
        ("_with_fliptypes.jsonl", ""),
        extract_explain,
        "explain_flips",
        headline=False,
        columns=tuple(extract_explain({})),
        scores=False,
        evaluated=lambda m: f"{m.get('num_flips', '?')} flips",
        fixed_dtype=True,
        comparisons=True,
        type_blocks=_by_flip_type,
    ),
    Evaluation(
        "images",
        "run_lgip_images.py",
        "LGIP_images.metrics.json",
        ("_with_fliptypes.jsonl", ""),
        extract_images,
        "run_lgip_images",
        headline=False,
        columns=tuple(extract_images({})),
        scores=False,
        comparisons=True,
    ),
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
        return with_ci([name])

    cols = [
        "model",
        "label",
        "protocol",
        "score_kind",
        "num_records",
        "num_failed_images",
        "headline_source",
        "headline_file",
        "headline_created",
        "mixed_settings",
    ]
    for f in (
        FIGURES + CONTROL_FIGURES + (RELATIVE,)
    ):  # (the controls from the headline's evaluation, as the positive rate)
        cols += ci(f)
    cols += ["flip_type_source", "flip_type_file", "flip_type_created"]
    for t in FLIP_TYPES if types is None else types:
        cols += ci(f"{t}_pos_rate") + ci(f"{t}_gap") + [f"{t}_count"]
        for _, name in TYPE_CONTROLS:
            cols += ci(f"{t}_{name}")
    for name in ("simple_invariance_error", "advanced_invariance_error", "combined_pos_rate", "combined_gap"):
        cols += ci("enhanced_" + name)
    for key in HEADLINE_KEYS:  # each evaluation's own headline figures, whichever heads the table
        for f in FIGURES + (CONTROL_FIGURES + (RELATIVE,) if BY_KEY[key].controls else ()):
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


def _type_block(e, m):
    """One model's per-type blocks in evaluation e's metrics ({} where it has none: e.type_blocks)."""
    b = e.type_blocks(m)
    return b if isinstance(b, dict) else {}


def present_types(metrics):
    """The flip types the evaluations' per-type blocks have, in order of first appearance (over
    EVALUATIONS, their models, each block's order: the input's diff_caps_<type> order)."""
    out = {}
    for e in EVALUATIONS:
        for m in metrics.get(e.key, ()):
            out.update(dict.fromkeys(_type_block(e, m)))
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
    check_card(m)
    model, config = block(run, "model"), block(run, "config")
    versions = block(run, "versions")
    for b, key in (
        (config, "IMAGE_ROOT"),
        (config, "JSONL_PATH"),
        (model, "type"),
        (model, "protocol"),
        (model, "dtype"),
        (run, "script"),
        (run, "created"),
    ):
        if b.get(key) is not None and not isinstance(b[key], str):
            raise BadField(b.where + key, f"is {what_is(b[key])}, not a string or null")
    for name, v in versions.items():
        if not isinstance(v, str):
            raise BadField(versions.where + str(name), f"is {what_is(v)}, not a version string")
    kinds, seed = config.get("KINDS"), config.get("SEED")
    if kinds is not None and (not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds)):
        raise BadField(config.where + "KINDS", f"is {what_is(kinds)}, not a list of kinds")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadField(config.where + "SEED", f"is {what_is(seed)}, not an int (the altered images are remade from it)")
    for key in ("scores_file", "explain_file"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise BadField(key, f"is {what_is(m[key])}, not a file name or null")
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
            raise InputError(
                f"{path}: model #{i + 1} of {len(data)}: "
                + ("not an object" if not isinstance(m, dict) else "no 'model_tag' (a non-empty string)")
            )
        if tag in seen:
            raise InputError(f"{path}: model {tag} is listed twice")
        seen.add(tag)
        try:
            _check_model(m, e)
        except BadField as bad:
            raise InputError(f"{path}: model {tag}: {bad}") from None
    return data


def row_spec(m):
    """The MODELS entry of the run that made `m` (a metrics row) for its model, or None."""
    run = m.get("run") if isinstance(m.get("run"), dict) else {}
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    models = config.get("MODELS") if isinstance(config.get("MODELS"), list) else []
    return next((s for s in models if isinstance(s, dict) and s.get("name") == m.get("model_tag")), None)


def run_settings(m, e):
    """{setting: its value as JSON text} of the run that made `m`, one model's row of evaluation
    `e`, that can change its figures: its run.config less IGNORED_SETTINGS, the model's own MODELS
    entry (`model spec`) and the dtype it ran in (`dtype`, but where `e` fixes it)."""
    run = m.get("run") if isinstance(m.get("run"), dict) else {}
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    model = run.get("model") if isinstance(run.get("model"), dict) else {}
    out = {k: v for k, v in config.items() if k not in IGNORED_SETTINGS}
    spec = row_spec(m)
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
    return "; ".join(
        f"{k} " + ", ".join(f"{v} ({', '.join(name(key) for key in keys)})" for v, keys in values)
        for k, values in mixed
    )
