"""lgip.demo: the bundled demo (demo/ beside the scripts): its data (12 synthetic images made for
this project, not COCO photographs, with hand-written captions), its model (a tiny random-init
open_clip CLIP that ships in demo/model: it knows nothing), and the words every output made with
either carries, so that no demo figure is ever read as a model's behaviour.

A user asks for the demo model by name: `--MODELS=demo` (or "demo" in a MODELS list). run_all.py
takes it in place of its default models only, and says so, when their weights cannot be had;
a model a user names that cannot be had stays an error.

    >>> demo_block(True, "demo/lgip_demo_with_perturb.jsonl")["message"]   # (or records marked synthetic_image)
    'Demo run: synthetic images (not COCO photographs) and a tiny random-init model that knows nothing; ...'
    >>> demo_block(False, "coco/x_with_perturb.jsonl") is None
    True
"""

import os

from .console import detail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project's folder
DEMO_DIR = os.path.join(ROOT, "demo")
DEMO_JSONL = os.path.join(DEMO_DIR, "lgip_demo.jsonl")
DEMO_MODEL_DIR = os.path.join(DEMO_DIR, "model")
DEMO_NAME = "demo"  # what a user writes in MODELS
DEMO_MODEL = {
    "name": "demo_tiny_random",
    "type": "openclip",
    "model_name": "local-dir:" + DEMO_MODEL_DIR,
    "demo": True,
    "card": {
        "architecture": "tiny CLIP (width 32, 2 layers, 64 px)",
        "family": "demo",
        "training_data": "none (random init)",
    },
}
ABOUT_MODEL = (
    "the demo model (demo/model: a tiny random-init open_clip CLIP, width 32, 2 layers, 64 px, that "
    "ships with the project and knows nothing)"
)


def is_demo_model(spec):
    return isinstance(spec, dict) and bool(spec.get("demo"))


def is_demo_input(path, records=None):
    """True for the demo's data: records marked `"synthetic_image": true` (the demo's base JSONL marks
    each of its records; the generators carry the mark into what they make, wherever it is copied),
    or, records unknown, a file in the bundled demo folder."""
    if records is not None:
        return any(rec.get("synthetic_image") is True for _, rec in records)
    try:
        return os.path.samefile(os.path.dirname(os.path.abspath(path)), DEMO_DIR)
    except (OSError, TypeError):
        return False


def demo_message(model, data):
    """One sentence for an output made with the demo model and/or on the demo data."""
    what = []
    if data:
        what.append("synthetic images (not COCO photographs)")
    if model:
        what.append("a tiny random-init model that knows nothing")
    return f"Demo run: {' and '.join(what)}; these figures show that the pipeline works, not how " + (
        "any model behaves." if model else "the models behave on real photographs."
    )


def demo_block(model, input_path, records=None):
    """The `demo` entry of an output's run block: {"model", "input", "message"}, or None for an
    ordinary run (nothing is added then)."""
    data = is_demo_input(input_path, records)
    if not model and not data:
        return None
    return {"model": bool(model), "input": data, "message": demo_message(model, data)}


def say_demo(models, input_path, records=None):
    """Print, once for a run, what of it is demo (nothing for an ordinary run); returns the block."""
    block = demo_block(any(is_demo_model(m) for m in models or []), input_path, records)
    if block is not None:
        detail(f"note: {block['message']}", flush=True)  # (run_all says it once, at the end)
    return block


# the demo's files, as run_all's generator steps make them beside its base JSONL: name -> (script, file name)
DEMO_INPUTS = {
    "perturb": ("diff_gen_caption", "lgip_demo_with_perturb.jsonl"),
    "fliptypes": ("make_perturb_with_fliptypes", "lgip_demo_with_fliptypes.jsonl"),
    "enhanced": ("rebuttal_enhanced_perturb_with_fliptypes", "rebuttal_enhanced_lgip_demo_with_fliptypes.jsonl"),
}


def demo_inputs(folder=None):
    """The bundled demo's inputs from Python, each evaluation's own: {"base": the base JSONL, "perturb":
    run_lgip_multi's, "fliptypes": run_lgip_by_fliptype's (and run_lgip_retrieval's, run_lgip_images'),
    "enhanced": the rebuttal analysis'}; a missing one is made by its generator (lgip.scripts, as run_all's
    first steps make it: the same bytes). folder: the demo copied there first (its records and images), so
    that its outputs go there; None: the checkout's demo/.
        >>> from lgip.demo import demo_inputs
        >>> rows = run_lgip_multi.run(JSONL_PATH=demo_inputs()["perturb"], MODELS=["demo"])"""
    import shutil

    from . import scripts

    base = DEMO_JSONL
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        base = os.path.join(folder, os.path.basename(DEMO_JSONL))
        if not os.path.isfile(base):
            shutil.copy(DEMO_JSONL, base)
        if not os.path.isdir(os.path.join(folder, "images")):
            shutil.copytree(os.path.join(DEMO_DIR, "images"), os.path.join(folder, "images"))
    paths = {"base": base}
    for name, (script, file) in DEMO_INPUTS.items():
        paths[name] = os.path.join(os.path.dirname(base), file)
        if not os.path.isfile(paths[name]):
            scripts.load(script).run(INPUT_JSONL=base)
    return paths
