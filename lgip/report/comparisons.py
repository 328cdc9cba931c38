"""lgip.report.comparisons: the paired model comparisons (LGIP_SPEC.md section 9) the evaluations
wrote beside their metrics (`<input stem>__LGIP_comparisons.metrics.json`), found and read, each
row checked as a metrics row is (lgip.report.fields), and which figure of a row each compares.

    >>> files, absent = comparison_files(found)
    >>> rows = [c for key, path in files for c in load_comparisons(path, key)]
"""

import os

from ..errors import InputError
from ..records import read_json
from .fields import BadField, Block, RATE, checked, what_is, block, count, fig
from .evaluations import EVALUATIONS


# --- paired model comparisons (LGIP_SPEC.md section 9): <input stem>__LGIP_comparisons.metrics.json ---

COMPARISONS_SUFFIX = "LGIP_comparisons.metrics.json"
COMPARED = {
    "sensitivity_pos_rate": "pos_rate",
    "grounded_pos_rate": "grounded_pos_rate",
    "invariance_error_mean": "invariance_error",
    "invariance_error_rel": "invariance_error_rel",
}  # a compared figure -> its name in a row (<evaluation>_<name>)
COMPARED_OWN = {
    "i2t_recall@1": "retrieval_i2t_recall@1",
    "i2t_flip_top1_rate": "retrieval_i2t_flip_top1_rate",
    "localization_acc": "localization_acc",
    "image_sensitivity_pos_rate": "image_pos_rate",
}
# ^ the figures of the evaluations with one figure of a name (section 12's outcomes) -> its key in a row


def comparison_files(found):
    """[(evaluation key, path)] of the comparisons files beside the metrics of the evaluations found
    that write them (each path once), and the paths looked at that are not there (an older run: fine)."""
    files, absent = [], []
    for e in EVALUATIONS:
        if e.comparisons and e.key in found:
            path = found[e.key][: -len(e.suffix)] + COMPARISONS_SUFFIX
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
            raise BadField(key, f"is {what_is(row.get(key)) if key in row else 'missing'}, not a non-empty string")
    figure = row["figure"]
    if row.get("flip_type") is not None and not isinstance(row["flip_type"], str):
        raise BadField("flip_type", f"is {what_is(row['flip_type'])}, not a flip type or null")
    rate = bool(RATE.search(figure))
    out = {k: row[k] for k in ("script", "a", "b", "figure")}
    out["flip_type"] = row.get("flip_type")
    for key in ("a_value", "b_value"):
        out[key] = checked(key, row.get(key), figure)
    diff = fig(Block(row), "diff", "difference")  # (finite numbers, [low, high] with low <= high)
    out["diff"], out["lo"], out["hi"] = diff["difference"], diff["difference_ci_lo"], diff["difference_ci_hi"]
    for key, v in (("diff", out["diff"]), ("diff_ci95", out["lo"]), ("diff_ci95", out["hi"])):
        if rate and v is not None and not -1.0 <= v <= 1.0:
            raise BadField(key, f"is {row[key]!r}, not a difference of two rates (within [-1, 1])")
    out["num_images"] = count(row, "num_images")
    said = row.get("excludes_zero")
    if said is not None and not isinstance(said, bool):
        raise BadField("excludes_zero", f"is {what_is(said)}, not true, false or null")
    out["excludes_zero"] = None if out["lo"] is None else bool(out["lo"] > 0 or out["hi"] < 0)
    if said is not None and out["excludes_zero"] is not None and said != out["excludes_zero"]:
        raise BadField(
            "excludes_zero",
            f"is {said!r}, but diff_ci95 {row['diff_ci95']!r} {'excludes' if out['excludes_zero'] else 'contains'} 0",
        )
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
        raise InputError(
            f"{path}: expected a list of paired comparisons ({{script, a, b, figure, flip_type, diff, "
            f"diff_ci95, ...}}), got {type(data).__name__}"
        )
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
