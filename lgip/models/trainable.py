"""lgip.models.trainable: dual encoders built to be fine-tuned (LGIP_SPEC.md 14), for a family record's `trainable`:
the model in fp32 with every parameter trainable (its `logit_scale`, and `logit_bias` where it has one), its towers
with gradient (PIL images and texts in, features out, preprocessed and tokenized as the corrected protocol encodes
them for the evaluations), and its saving as a MODELS spec of its own type. Each family's builder lives in its own
module (lgip.models.openclip's `trainable_openclip`, lgip.models.dual_encoders' `trainable_transformers`: CLIP,
SigLIP, SigLIP 2); open_clip's saving as a local-dir is here, for the shapes world's start model too.

    >>> towers = family(spec).trainable(spec, "cpu"); v = towers.encode_images([img]); t = towers.encode_texts(["a"])
    >>> spec = towers.save("run/model", "lgip", True)
"""

import json
import os
from dataclasses import dataclass
from typing import Callable


@dataclass
class Trainable:
    """model: a torch module (parameters, state_dict, train/eval, logit_scale, logit_bias or none);
    encode_images: [PIL images] -> (n, d) features; encode_texts: [str] -> (n, d) features (both with gradient,
    not normalised); save: (folder, run name, write: bool) -> the saved model's MODELS spec (written when
    `write`: rank 0 of a torchrun)."""

    model: object
    encode_images: Callable
    encode_texts: Callable
    save: Callable


def openclip_config(spec):
    """The model_cfg an open_clip spec is built from (its activation aside: the model built says which)."""
    import open_clip

    name = spec["model_name"]
    if name.startswith("local-dir:"):
        with open(os.path.join(name[len("local-dir:") :], "open_clip_config.json"), encoding="utf-8") as f:
            return json.load(f)["model_cfg"]
    return dict(open_clip.get_model_config(name) or {})


def openclip_save(model, folder, model_cfg, quick_gelu):
    """`folder` as an open_clip local-dir model (section 14): open_clip_config.json (its model_cfg with `quick_gelu`
    true or false, always: a state dict does not record its activation, lgip.models.checkpoints; the
    preprocess_cfg) and open_clip_pytorch_model.bin (its state_dict)."""
    import torch

    from ..outputs import atomic_open

    os.makedirs(folder, exist_ok=True)
    cfg = dict(model_cfg, quick_gelu=bool(quick_gelu))
    pre = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    preprocess = {k: pre[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in pre}
    with atomic_open(os.path.join(folder, "open_clip_config.json")) as f:
        f.write(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess}, indent=1) + "\n")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_open(os.path.join(folder, "open_clip_pytorch_model.bin"), "wb") as f:
        torch.save(state, f)
    return folder
