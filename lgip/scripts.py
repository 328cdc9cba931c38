"""lgip.scripts: the checkout's scripts from a project of one's own, without editing sys.path.

After `pip install --no-build-isolation -e <checkout>` only the `lgip` package is importable; the
scripts (run_lgip_multi.py, ...) and their common.py stay in the checkout, where this module loads
them, so that no name of ours (common, report, run_all, ...) sits in sys.modules where a module of
the user's own may be: while a script loads, our names replace the user's, which come back after.
    >>> from lgip.scripts import run_lgip_multi             # or lgip.scripts.load("run_lgip_multi")
    >>> rows = run_lgip_multi.run(JSONL_PATH=..., MODELS=[{"name": "epoch3", "type": "python",
    ...                                                    "loader": (model, preprocess, tokenizer)}])
An editable install is needed: a plain `pip install .` copies the package without the scripts.
"""

import importlib
import os
import sys

from .errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: the scripts' folder
SCRIPTS = (
    "diff_gen_caption",
    "make_perturb_with_fliptypes",
    "rebuttal_enhanced_perturb_with_fliptypes",
    "make_base_jsonl",
    "run_lgip_multi",
    "run_lgip_by_fliptype",
    "rebuttal_enhanced_lgip_by_transformation",
    "run_lgip_retrieval",
    "explain_flips",
    "run_lgip_images",
    "run_lgip_classification",
    "import_benchmark",
    "blind_audit",
    "debias_flips",
    "finetune_lgip",
    "wise_ft",
    "make_shapes_jsonl",
    "siglip_sanity_check",
    "report",
    "run_all",
)
_OURS = ("common",) + SCRIPTS  # the top-level names the scripts import one another by
_LOADED = {}  # name -> our module (kept here, not in sys.modules under its bare name)


def load(name):
    """The script `name` of the checkout as a module (its constants, `run(**constants)`), loaded once."""
    if name in _LOADED:
        return _LOADED[name]
    if name not in SCRIPTS:
        import difflib

        close = difflib.get_close_matches(name, SCRIPTS, n=1)
        raise ConfigError(
            f"no script {name!r} in lgip.scripts"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; the scripts: {', '.join(SCRIPTS)}"
        )
    if not os.path.isfile(os.path.join(ROOT, name + ".py")):
        raise ConfigError(
            f"{name}.py is not beside the lgip package ({ROOT}): install the checkout editable "
            f"(pip install --no-build-isolation -e <checkout>), so the scripts stay where they are"
        )
    theirs = {n: sys.modules.pop(n) for n in _OURS if n in sys.modules}
    sys.modules.update(_LOADED)  # (a script importing another gets the copy already loaded)
    sys.path.insert(0, ROOT)
    try:
        importlib.import_module(name)
    finally:
        sys.path.remove(ROOT)
        for n in _OURS:
            module = sys.modules.pop(n, None)
            if module is not None:
                _LOADED.setdefault(n, module)
        sys.modules.update(theirs)
    return _LOADED[name]


def __getattr__(name):  # from lgip.scripts import run_lgip_multi
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return load(name)
    except ConfigError as e:
        raise AttributeError(str(e)) from None
