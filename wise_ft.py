"""wise_ft: WiSE-FT, a fine-tuned arm's weights mixed with its start's (LGIP_SPEC.md 16, run_all's FINETUNE["wise"];
after Wortsman et al.'s weight-space ensembles): every floating-point tensor of the state dict is
(1 - ALPHA) start + ALPHA arm (integer buffers the arm's), saved as finetune_lgip.py saves an arm, so every
evaluation probes it beside the start and the arm: what a repair gains against what it costs, as ALPHA moves from
the start (0) to the arm (1).

Writes the run folder `<stem>__ft_<RUN_NAME>/` beside JSONL_PATH (finetune_lgip.py's input, as its arms' folders):
`model/` (a MODELS spec of the start's type in `model_spec.json`) and `wise.meta.json` (the start, the arm, ALPHA,
the tensors mixed and taken from the arm, versions).
  python wise_ft.py --JSONL_PATH=x_with_fliptypes.jsonl --MODEL=openclip_ViT-B-16_openai \\
      --ARM=x_with_fliptypes__ft_openclip_ViT-B-16_openai__ft_lgip/model_spec.json --ALPHA=0.5
  python run_lgip_by_fliptype.py --JSONL_PATH=x_with_fliptypes__ft_heldout.jsonl --MODELS="[<start>, <arm>, <it>]"
"""

import json
import os

import common
from lgip import finetune, wise
from lgip.settings import SAFE_NAME, check_models

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # finetune_lgip.py's input:
#   the folder is named beside it as its arms' are
MODEL = "openclip_ViT-B-16_openai"  # the start the arm was fine-tuned from: one MODELS spec or a published name
ARM = None  # the fine-tuned arm: its MODELS spec (finetune_lgip.py's model_spec.json), or the path of that file
ALPHA = 0.5  # float in [0, 1]: the arm's weight (0: the start's weights, 1: the arm's)
RUN_NAME = None  # str: the model's name (its folder's too); None = "<the arm's name>__wise<ALPHA as %g>"
OUTPUT_DIR = None  # the run folder; None = <stem>__ft_<RUN_NAME>/ beside JSONL_PATH
DEVICE = "cpu"  # where the two models are built to be mixed: "cpu", "auto", "cuda", "cuda:1", ...
VERBOSE = True  # True: every line (paths written); False: the result line (run_all's default)
CONFIG = common.configure(globals())


def arm_spec():
    """ARM as a spec: a dict, or the model_spec.json it names (a run folder: its model_spec.json)."""
    if isinstance(ARM, dict):
        return ARM
    if not isinstance(ARM, str) or not ARM:
        raise common.ConfigError(
            f"ARM must be the fine-tuned arm's MODELS spec or the path of its model_spec.json, got {ARM!r}"
        )
    path = os.path.join(ARM, "model_spec.json") if os.path.isdir(ARM) else ARM
    if not os.path.isfile(path):
        raise common.InputError(f"ARM={ARM!r}: {path} is not there (run finetune_lgip.py first)")
    spec = common.read_json(path)
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise common.InputError(f"{path}: not a MODELS spec (a JSON object with a name); run finetune_lgip.py again")
    return spec


def check_config():
    if not (isinstance(ALPHA, (int, float)) and not isinstance(ALPHA, bool) and 0 <= ALPHA <= 1):
        raise common.ConfigError(f"ALPHA must be a number from 0 to 1 (the arm's weight), got {ALPHA!r}")
    start, arm = finetune.start_spec(MODEL), arm_spec()
    name = wise.wise_name(arm["name"], ALPHA) if RUN_NAME is None else RUN_NAME
    if not isinstance(name, str) or not SAFE_NAME.match(name):
        raise common.ConfigError(f"RUN_NAME must be a file-safe name (letters, digits, . _ -), got {name!r}")
    check_models([arm], "ARM")
    if arm["type"] != start["type"]:
        raise common.ConfigError(
            f"ARM {arm['name']!r} is of type {arm['type']!r} and MODEL {start['name']!r} of type {start['type']!r}: "
            "WiSE-FT mixes the weights of one architecture (give the arm's start as MODEL)"
        )
    return start, arm, name


def main():
    start, arm, name = check_config()
    folder = OUTPUT_DIR or common.default_output(JSONL_PATH, f"__ft_{name}")
    os.makedirs(folder, exist_ok=True)
    saved, counts = wise.save_wise(start, arm, float(ALPHA), folder, name, common.resolve_device(DEVICE))
    meta = dict(common.provenance(__file__, CONFIG), start=start, arm=arm, alpha=float(ALPHA), saved=saved)
    meta.update(tensors=counts, status="done")
    common.write_json(os.path.join(folder, "wise.meta.json"), meta)
    print(
        common.fit(
            f"{name}: {counts['interpolated']} tensors (1 - {ALPHA:g}) {start['name']} + {ALPHA:g} {arm['name']}"
            + (f", {counts['from_arm']} from the arm" if counts["from_arm"] else "")
            + f" -> {os.path.join(folder, 'model_spec.json')}"
        ),
        flush=True,
    )
    return json.loads(json.dumps(saved))


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the saved model's spec."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
