"""make_shapes_jsonl: the shapes world, a place where a tiny model can learn (issue 51, LGIP_SPEC.md 14's demo).

Draws images of one to five glyphs of one colour (section 2's colours, numbers and object words, each object word
its own glyph) on a textured slate ground, captioned in COCO's style with those words, and writes, in OUTPUT_DIR:
`lgip_shapes_pretrain.jsonl` (a tiny CLIP learns the world there, L_clip alone), `lgip_shapes.jsonl` (base
records: make_perturb_with_fliptypes.py flips them, finetune_lgip.py fine-tunes on part and holds the rest out),
`images/` and `start_model/` (the tiny CLIP, random init). Synthetic images: every figure made on them says so.
  python make_shapes_jsonl.py
  python run_all.py --DATA=shapes        # the whole demo: world, pretraining, two arms, held-out probe, report
"""

import os

import common
from lgip import shapes

_HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT_DIR = os.path.join(_HERE, "shapes")  # the world's folder (created when missing)
N_PRETRAIN = 2000  # int >= 2: images of the pretraining part
N_MAIN = 3000  # int >= 2: images of the part fine-tuned on and probed (finetune_lgip.py splits it by image)
SEED = 0  # int: the world's images and captions, and the start model's random init
VERBOSE = True  # True: every line (paths written); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def main():
    for name in ("N_PRETRAIN", "N_MAIN"):
        common.require_int(CONFIG, name, 2)
    common.require_int(CONFIG, "SEED")
    made = shapes.make_world(OUTPUT_DIR, N_PRETRAIN, N_MAIN, SEED)
    spec = shapes.start_model(os.path.join(OUTPUT_DIR, "start_model"), SEED)
    meta = dict(common.provenance(__file__, CONFIG), start=spec, files={k: made[k] for k in ("pretrain", "main")})
    common.write_json(common.metrics_path(made["main"], "shapes.meta.json"), meta)
    print(
        f"make_shapes_jsonl.py: {made['images']} images ({N_PRETRAIN} to pretrain on, {N_MAIN} to fine-tune on "
        f"and probe) -> {common.show(OUTPUT_DIR)}",
        flush=True,
    )
    return made["main"]


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry); returns the
    main part's base JSONL."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
