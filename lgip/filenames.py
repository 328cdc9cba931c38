"""lgip.filenames: the output-name contract. Every evaluation writes `<input stem>__<suffix>` beside
its input, or in the OUTPUT_DIR in force; report.py and run_all.py find the outputs by the same
names (`metrics_path`), so a script and its readers never disagree on where a file is.

    >>> metrics_path("data/x_with_perturb.jsonl", "LGIP_ALL.metrics.json")
    'data/x_with_perturb__LGIP_ALL.metrics.json'
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
