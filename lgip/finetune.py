"""lgip.finetune: fine-tuning a dual encoder against the probe (LGIP_SPEC.md 14, after RoCOCO's SC/VC losses and
NegCLIP): the held-out split by image (`split_records`), each step's records and draws as functions of SEED, the
step and the train file alone (`step_positions`, `draw`), the loss terms (`clip_style_losses`,
`siglip_losses`, `invariance_loss`), open_clip's optimiser groups and cosine schedule. lgip.trainer runs the
loop (finetune_lgip.py's) with its settings typed (`TrainSettings`); a run resumes from `resume.pt` to what an
unbroken run gives.

    >>> held = split_records(records, 0.2, 0)                     # {image_path: True if held out}
    >>> idx = step_positions(s, n, b, seed); c, p, flips, i = draw(rec, seed, s, r, n_flips)
"""

import hashlib
import math
import random
from dataclasses import dataclass

from .errors import ConfigError


def start_spec(model):
    """MODEL (a spec or a named model) as a spec, checked before any model is looked up or loaded: a list, a zoo
    entry, a model whose scorer gives no embeddings (a joint or text scorer: nothing to contrast) and a type this
    trainer does not build are ConfigErrors saying what to do."""
    from .errors import ModelError
    from .models.families import FAMILIES, family
    from .models.registry import expand_models
    from .models.zoo import is_zoo
    from .scorers import gives
    from .settings import check_models

    if isinstance(model, (list, tuple)):
        raise ConfigError("MODEL is one model: fine-tune several by running the script once per model")
    if isinstance(model, dict) and is_zoo(model):
        raise ConfigError("MODEL is an openclip_zoo entry: name one model of it (type openclip)")
    if not isinstance(model, (str, dict)):
        raise ConfigError(f"MODEL must be a model spec or a name, got {model!r}")
    try:
        spec = expand_models([model])[0]
    except ModelError as e:
        raise ConfigError(f"MODEL: {e}") from None
    kind = family(spec).type
    if not gives(spec, ("embeddings",)):
        raise ConfigError(
            f"MODEL {spec.get('name')!r} is of type {kind!r}: it scores a pair (or a text) with no embeddings to "
            f"contrast (LGIP_SPEC.md 13); fine-tune a dual encoder"
        )
    if family(spec).trainable is None:
        trainable = ", ".join(t for t, f in FAMILIES.items() if f.trainable is not None)
        raise ConfigError(
            f"MODEL {spec.get('name')!r} is of type {kind!r}, which cannot be built for training here: give the "
            f"model as a spec of a type that can ({trainable}; a python loader's open_clip model as an openclip "
            f"spec of its weights)"
        )
    check_models([spec], "MODEL")
    return spec


def saved_spec(start, run_name, run_folder):
    """The MODELS spec finetune_lgip.py saves for a run of `start` in `run_folder` (its model/ folder): the start
    family's."""
    import os

    from .models.families import family

    return family(start).saved_spec(start, run_name, os.path.abspath(os.path.join(run_folder, "model")))


def split_records(records, fraction, seed):
    """{image_path: held out?}: the distinct image paths sorted by (sha256 hex of f"{seed}:{path}", path), the
    first floor(fraction * n + 0.5) held out."""
    images = list(dict.fromkeys(rec["image_path"] for _, rec in records))
    images.sort(key=lambda p: (hashlib.sha256(f"{seed}:{p}".encode("utf-8")).hexdigest(), p))
    h = math.floor(fraction * len(images) + 0.5)
    held = set(images[:h])
    return {p: p in held for p in images}


def step_positions(s, n, b, seed):
    """The train positions of step s: positions jB .. jB + B - 1 of default_rng([SEED, 1, e]).permutation(N),
    e = s // (N // B), j = s % (N // B)."""
    import numpy as np

    per_epoch = n // b
    e, j = divmod(s, per_epoch)
    return np.random.default_rng([seed, 1, e]).permutation(n)[j * b : (j + 1) * b].tolist()


def draw(rec, seed, s, r, n_flips):
    """Record r's draws at step s, in order (g = default_rng([SEED, 2, s, r])): its caption index (among those
    with flips, all when none has), a paraphrase (or None), its flips (up to N_FLIPS, without replacement).
    Returns (caption, paraphrase or None, [flips], caption index)."""
    import numpy as np

    g = np.random.default_rng([seed, 2, s, r])
    caps = rec["orig_captions"]
    flips_of = lambda i: (rec.get("diff_caps") or {}).get(str(i), [])
    with_flips = [i for i in range(len(caps)) if flips_of(i)] or list(range(len(caps)))
    i = with_flips[int(g.integers(len(with_flips)))]
    paras = (rec.get("same_caps") or {}).get(str(i), [])
    para = paras[int(g.integers(len(paras)))] if paras else None
    flips = flips_of(i)
    chosen = [flips[int(k)] for k in g.choice(len(flips), min(n_flips, len(flips)), replace=False)] if flips else []
    return caps[i], para, chosen, i


def mix_offset(n, seed):
    """k of the step's mixed images: record r is mixed with train record (r + k) mod N."""
    return 1 + random.Random(seed).randrange(n - 1)


def clip_style_losses(v, t, s, flips=None, mixed=None):
    """{clip, sc, vc} of a logit-scale-only model (section 14): L_clip the symmetric cross-entropy over the batch;
    L_sc the image-to-text cross-entropy with the step's flips added to the texts, minus without them; L_vc the
    text-to-image one with the mixed images added, minus without. flips / mixed None: not computed."""
    import torch

    logits = s * v @ t.T
    labels = torch.arange(len(v), device=v.device)
    ce = torch.nn.functional.cross_entropy
    out = {"clip": 0.5 * (ce(logits, labels) + ce(logits.T, labels))}
    base_i = torch.logsumexp(logits, dim=1)
    if flips is not None:
        with_flips = torch.cat([logits, s * v @ flips.T], dim=1) if len(flips) else logits
        out["sc"] = (torch.logsumexp(with_flips, dim=1) - base_i).mean()
    if mixed is not None:
        text_logits = logits.T
        with_mixed = torch.cat([text_logits, s * t @ mixed.T], dim=1)
        out["vc"] = (torch.logsumexp(with_mixed, dim=1) - torch.logsumexp(text_logits, dim=1)).mean()
    return out


def siglip_losses(v, t, s, beta, flips=None, mixed=None):
    """{clip, sc, vc} of a model with a logit bias (section 14): the pairwise sigmoid loss over the batch, the
    flips and the mixed images as negatives of every image and text of it, each summed and divided by B."""
    import torch

    b = len(v)
    z = 2 * torch.eye(b, device=v.device) - 1
    ls = torch.nn.functional.logsigmoid
    out = {"clip": -ls(z * (s * v @ t.T + beta)).sum() / b}
    if flips is not None:
        out["sc"] = -ls(-(s * v @ flips.T + beta)).sum() / b if len(flips) else v.sum() * 0
    if mixed is not None:
        out["vc"] = -ls(-(s * t @ mixed.T + beta)).sum() / b
    return out


def invariance_loss(v, t, p, q):
    """L_inv = (1/|Q|) sum over q in Q of |v_q . p_q - v_q . t_q| (0 when Q is empty): q the batch positions with
    a paraphrase, p their paraphrases' embeddings in that order."""
    if not len(q):
        return v.sum() * 0
    vq = v[q]
    return ((vq * p).sum(1) - (vq * t[q]).sum(1)).abs().mean()


def probe_loss(
    images,
    captions,
    logit_scale,
    logit_bias=None,
    flips=None,
    paraphrases=None,
    with_paraphrase=(),
    mixed=None,
    w_sc=1.0,
    w_inv=1.0,
    w_vc=1.0,
):
    """Section 14's loss for one batch, for a training loop of one's own (finetune_lgip.py's steps compute it so):
    L = L_clip + w_sc L_sc + w_inv L_inv + w_vc L_vc over L2-normalised embeddings. images, captions: [B, D], row i
    the caption of image i; flips: [F, D], the batch's flips, hard negatives of every image (L_sc); paraphrases:
    [Q, D], the paraphrases of the captions at batch positions `with_paraphrase` (L_inv); mixed: [B, D], images
    mixed with another record's, hard negatives of every caption (L_vc). logit_scale: the model's exp(logit_scale);
    logit_bias: a SigLIP model's bias (every term then the sigmoid form), None for CLIP's cross-entropy. A term of
    weight 0 or without its inputs is not computed (None). Returns (loss, {"clip", "sc", "inv", "vc"})."""
    fl, mx = (flips if w_sc else None), (mixed if w_vc else None)
    if logit_bias is not None:
        terms = siglip_losses(images, captions, logit_scale, logit_bias, flips=fl, mixed=mx)
    else:
        terms = clip_style_losses(images, captions, logit_scale, flips=fl, mixed=mx)
    inv = (
        invariance_loss(images, captions, paraphrases, list(with_paraphrase))
        if w_inv and paraphrases is not None
        else None
    )
    loss = terms["clip"]
    for w, value in ((w_sc, terms.get("sc")), (w_inv, inv), (w_vc, terms.get("vc"))):
        if w and value is not None:
            loss = loss + w * value
    return loss, {"clip": terms["clip"], "sc": terms.get("sc"), "inv": inv, "vc": terms.get("vc")}


def lr_at(s, lr, warmup, steps):
    """open_clip's cosine_lr: linear warmup to LR over WARMUP steps, then a half cosine to 0 at STEPS."""
    if s < warmup:
        return lr * (s + 1) / warmup
    span = max(1, steps - warmup)
    return lr * (1 + math.cos(math.pi * (s - warmup) / span)) / 2


def param_groups(model, weight_decay):
    """AdamW's groups, open_clip's rule: no weight decay on parameters with ndim < 2 or a name containing "bn",
    "ln", "bias" or "logit_scale"."""
    plain, decayed = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        exempt = p.ndim < 2 or any(k in name for k in ("bn", "ln", "bias", "logit_scale"))
        (plain if exempt else decayed).append(p)
    return [{"params": plain, "weight_decay": 0.0}, {"params": decayed, "weight_decay": weight_decay}]


@dataclass(frozen=True)
class TrainSettings:
    """What the fine-tuning loop (lgip.trainer) reads, typed and checked once (LGIP_SPEC.md 14: finetune_lgip.py's
    constants of the same names, upper-cased)."""

    steps: int = 500
    batch_size: int = 128
    seed: int = 0
    n_flips: int = 3
    w_sc: float = 1.0
    w_inv: float = 1.0
    w_vc: float = 0.0
    lr: float = 1e-5
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    save_every: int = 100
    keep_resume: bool = False
    run_name: str = "finetune"

    @classmethod
    def from_config(cls, config):
        """The settings of a script's CONFIG (its UPPER-case constants), each checked by the shared rules
        (lgip.settings: a ConfigError naming the setting, what it must be and the value given)."""
        from .settings import require_int, require_number

        ints = {"STEPS": 0, "BATCH_SIZE": 2, "SEED": None, "N_FLIPS": 0, "WARMUP": 0, "SAVE_EVERY": 1}
        values = {name.lower(): require_int(config, name, low) for name, low in ints.items()}
        for name in ("W_SC", "W_INV", "W_VC", "WEIGHT_DECAY"):
            values[name.lower()] = require_number(config, name, 0)
        for name in ("LR", "GRAD_CLIP"):
            values[name.lower()] = require_number(config, name, 0, strict=True)
        keep = config.get("KEEP_RESUME", False)
        if not isinstance(keep, bool):
            raise ConfigError(f"KEEP_RESUME must be True or False, got {keep!r}")
        return cls(**values, keep_resume=keep, run_name=str(config.get("RUN_NAME", "finetune")))

    def weights(self):
        """{w_sc, w_inv, w_vc}: probe_loss's weights."""
        return {"w_sc": self.w_sc, "w_inv": self.w_inv, "w_vc": self.w_vc}


def run_hash(values):
    """The resume file's identity: sha256 over the settings a run's result depends on (JSON, sorted keys)."""
    import json

    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode("utf-8")).hexdigest()


# the settings a run's result depends on: resume.pt's hash covers them (with the input's sha256 and MODEL)
HASHED = (
    "HELDOUT_FRACTION",
    "SPLIT_SEED",
    "SEED",
    "STEPS",
    "BATCH_SIZE",
    "N_FLIPS",
    "W_SC",
    "W_INV",
    "W_VC",
    "LR",
    "WARMUP",
    "WEIGHT_DECAY",
    "GRAD_CLIP",
    "DTYPE",
)
