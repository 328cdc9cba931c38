"""lgip.filenames: the output-name contract. Every evaluation writes `<input stem>__<suffix>` beside
its input, or in the OUTPUT_DIR in force; report.py and run_all.py find the outputs by the same
names (`metrics_path`), so a script and its readers never disagree on where a file is.

    >>> metrics_path("data/x_with_perturb.jsonl", "LGIP_ALL.metrics.json")
    'data/x_with_perturb__LGIP_ALL.metrics.json'
    >>> score_file("data/x_with_fliptypes.jsonl", "fliptypes", "b16")
    'data/x_with_fliptypes__LGIP_fliptypes_b16.scores.jsonl'
"""

import os

from .memory import KEPT


def default_output(input_path, suffix, prefix=""):
    """`<prefix><input stem><suffix>` next to the input."""
    folder, name = os.path.split(input_path)
    return os.path.join(folder, prefix + os.path.splitext(name)[0] + suffix)


def set_output_dir(config):
    """Send every `metrics_path` (a script's outputs, and where report.py and run_all look for them) to
    the script's OUTPUT_DIR; none set: beside the input. The folder is made by the first output written there
    (lgip.outputs), so a run that stops before its work leaves none behind."""
    folder = config.get("OUTPUT_DIR")
    KEPT.output_dir = os.path.abspath(folder) if folder is not None else None


def metrics_path(jsonl_path, suffix):
    """`<input stem>__<suffix>` next to the input, or in the OUTPUT_DIR in force."""
    if KEPT.output_dir is not None:
        return os.path.join(KEPT.output_dir, os.path.splitext(os.path.basename(jsonl_path))[0] + "__" + suffix)
    return default_output(jsonl_path, "__" + suffix)


# each evaluation's per-model score file (`*.scores.jsonl`, lgip.scorefile), by the evaluation's key
SCORE_FILES = {
    "multi": "LGIP_{}.scores.jsonl",  # run_lgip_multi.py
    "fliptypes": "LGIP_fliptypes_{}.scores.jsonl",  # run_lgip_by_fliptype.py
    "images": "LGIP_images_{}.scores.jsonl",  # run_lgip_images.py
    "enhanced": "ENHANCED_LGIP_{}.scores.jsonl",  # rebuttal_enhanced_lgip_by_transformation.py
}
# the blind audit's and the debiasing's files (LGIP_SPEC.md 15)
BLIND_FILES = {
    "metrics": "LGIP_blind.metrics.json",  # blind_audit.py's figures
    "gaps": "LGIP_blind.gaps.jsonl",  # blind_audit.py's gaps, a line per pair
    "debias": "LGIP_debias.metrics.json",  # debias_flips.py's figures
}


def score_file(jsonl_path, evaluation, tag, beside_input=False):
    """A model's score file of one evaluation (SCORE_FILES' key) on an input: where metrics_path puts it (or,
    beside_input, next to the input whatever OUTPUT_DIR is in force)."""
    suffix = SCORE_FILES[evaluation].format(tag)
    return default_output(jsonl_path, "__" + suffix) if beside_input else metrics_path(jsonl_path, suffix)


def blind_file(jsonl_path, which):
    """The blind audit's or the debiasing's file of an input (BLIND_FILES' key: "metrics", "gaps", "debias")."""
    return metrics_path(jsonl_path, BLIND_FILES[which])
