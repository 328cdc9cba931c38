"""lgip.finetune: fine-tuning a dual encoder against the probe (LGIP_SPEC.md 14, after RoCOCO's SC/VC losses and
NegCLIP): the held-out split by image (`split_records`), each step's records and draws as functions of SEED, the
step and the train file alone (`step_positions`, `draw`), the loss terms (`clip_style_losses`,
`siglip_losses`, `invariance_loss`), open_clip's optimiser groups and cosine schedule, and the saved model.
finetune_lgip.py runs the loop; a run resumes from `resume.pt` to what an unbroken run gives.

    >>> held = split_records(records, 0.2, 0)                     # {image_path: True if held out}
    >>> idx = step_positions(s, n, b, seed); c, p, flips, i = draw(rec, seed, s, r, n_flips)
"""

import hashlib
import math
import random
import time


def start_spec(model):
    """MODEL (a spec or a named model) as a spec, checked before any model is looked up or loaded: a list, a zoo
    entry, a model whose scorer gives no embeddings (a joint or text scorer: nothing to contrast) and a type this
    trainer does not build are ConfigErrors saying what to do."""
    from .errors import ConfigError, ModelError
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
    kind = spec.get("type")
    if not gives(spec, ("embeddings",)):
        raise ConfigError(
            f"MODEL {spec.get('name')!r} is of type {kind!r}: it scores a pair (or a text) with no embeddings to "
            f"contrast (LGIP_SPEC.md 13); fine-tune a dual encoder"
        )
    if kind != "openclip":  # (the trainer builds, saves and reloads open_clip models alone, for now)
        raise ConfigError(
            f"MODEL {spec.get('name')!r} is of type {kind!r}: this version fine-tunes open_clip models "
            f"(type openclip); transformers and siglip dual encoders are not supported yet"
        )
    check_models([spec], "MODEL")
    return spec


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
    flips_of = lambda i: (rec.get("diff_caps") or {}).get(str(i), [])  # noqa: E731
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


def run_hash(values):
    """The resume file's identity: sha256 over the settings a run's result depends on (JSON, sorted keys)."""
    import json

    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def openclip_save(model, folder, model_cfg, quick_gelu):
    """`folder` as an open_clip local-dir model (section 14): open_clip_config.json (its model_cfg, quick_gelu
    where the protocol forced it, the preprocess_cfg) and open_clip_pytorch_model.bin (its state_dict)."""
    import json
    import os

    import torch

    from .outputs import atomic_open

    os.makedirs(folder, exist_ok=True)
    cfg = dict(model_cfg)
    if quick_gelu:
        cfg["quick_gelu"] = True
    pre = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    preprocess = {k: pre[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in pre}
    with atomic_open(os.path.join(folder, "open_clip_config.json")) as f:
        f.write(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess}, indent=1) + "\n")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_open(os.path.join(folder, "open_clip_pytorch_model.bin"), "wb") as f:
        torch.save(state, f)
    return folder


def openclip_config(spec, kwargs):
    """(the model_cfg an open_clip spec is built with, whether QuickGELU was forced)."""
    import json
    import os

    import open_clip

    name = spec["model_name"]
    if name.startswith("local-dir:"):
        with open(os.path.join(name[len("local-dir:") :], "open_clip_config.json"), encoding="utf-8") as f:
            return json.load(f)["model_cfg"], bool(kwargs.get("force_quick_gelu"))
    return dict(open_clip.get_model_config(name) or {}), bool(kwargs.get("force_quick_gelu"))


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


class Trainer:
    """One open_clip model fine-tuned in this process (section 14): built as the evaluations build it (the
    corrected protocol), its weights and optimizer state in fp32, the forward under bf16 autocast on CUDA when
    DTYPE asks for it."""

    def __init__(self, spec, device, dtype):
        import open_clip
        import torch

        from .models.encoder import resolve_device
        from .models.openclip import openclip_create_kwargs

        self.spec, self.device = spec, resolve_device(device)
        name, pretrained, kwargs = openclip_create_kwargs(spec, "corrected")
        if name.startswith(("hf-hub:", "local-dir:")):
            pretrained = None
        self.model_cfg, self.quick_gelu = openclip_config(spec, kwargs)
        model, _, self.preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, **kwargs)
        self.model = model.to(self.device).float()
        self.tokenizer = open_clip.get_tokenizer(name)
        self.autocast = torch.device(self.device).type == "cuda" and dtype in ("auto", "bf16", "bfloat16")
        self.dtype_name = "bf16 autocast, fp32 weights" if self.autocast else "fp32"
        self._pixels = {}

    def readable(self, records, ks, root):
        """(the record indices of `ks` whose image decodes, [{line, path, error}] of the others)."""
        import os

        from .images import open_rgb

        ok, bad = [], []
        for k in ks:
            line, rec = records[k]
            path = os.path.join(root, rec["image_path"])
            try:
                open_rgb(path)
                ok.append(k)
            except OSError as e:
                bad.append({"line": line, "path": path, "error": f"{type(e).__name__}: {e}"})
        return ok, bad

    def _image(self, path):
        from .images import open_rgb

        return open_rgb(path)

    def _encode_images(self, images):
        import torch

        pixels = torch.stack([self.preprocess(img) for img in images]).to(self.device)
        return torch.nn.functional.normalize(self.model.encode_image(pixels).float(), dim=-1)

    def _encode_texts(self, texts):
        import torch

        ids = self.tokenizer(list(texts)).to(self.device)
        return torch.nn.functional.normalize(self.model.encode_text(ids).float(), dim=-1)

    def step(self, s, recs, paths, cfg, k_mix):
        """One step's loss terms and counts (not yet stepped): {loss, clip, sc, inv, vc, flips, paras, scale, bias}."""
        import contextlib

        import torch

        from .alterations import alter

        n, b = len(recs), cfg["BATCH_SIZE"]
        pos = step_positions(s, n, b, cfg["SEED"])
        draws = [draw(recs[r], cfg["SEED"], s, r, cfg["N_FLIPS"]) for r in pos]
        q = [j for j, d in enumerate(draws) if d[1] is not None]
        flips = [f for d in draws for f in d[2]]
        images = [self._image(paths[r]) for r in pos]
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()
        self.model.train()
        with ctx:
            v = self._encode_images(images)
            t = self._encode_texts([d[0] for d in draws])
            p = self._encode_texts([draws[j][1] for j in q]) if cfg["W_INV"] and q else None
            fl = None
            if cfg["W_SC"]:
                fl = self._encode_texts(flips) if flips else v.new_zeros((0, v.shape[1]))
            mixed = None
            if cfg["W_VC"]:
                made = [
                    alter(images[j], "mix", self._image(paths[(r + k_mix) % n]), cfg["SEED"], r)
                    for j, r in enumerate(pos)
                ]
                mixed = self._encode_images(made)
        scale = self.model.logit_scale.exp()
        bias = getattr(self.model, "logit_bias", None)
        if bias is not None:
            terms = siglip_losses(v, t, scale, bias, flips=fl, mixed=mixed)
        else:
            terms = clip_style_losses(v, t, scale, flips=fl, mixed=mixed)
        inv = invariance_loss(v, t, p, q) if cfg["W_INV"] else None
        loss = terms["clip"]
        for name, w, value in (
            ("sc", cfg["W_SC"], terms.get("sc")),
            ("inv", cfg["W_INV"], inv),
            ("vc", cfg["W_VC"], terms.get("vc")),
        ):
            if w:
                loss = loss + w * value
        return {
            "loss": loss,
            "clip": terms["clip"],
            "sc": terms.get("sc"),
            "inv": inv,
            "vc": terms.get("vc"),
            "flips": len(flips),
            "paras": len(q),
            "scale": float(scale.detach()),
            "bias": float(bias.detach()) if bias is not None else None,
        }

    def train(self, folder, recs, paths, cfg, digest, resume=True):
        """Steps from where resume.pt left off (when its hash is this run's) to STEPS, a train_log.jsonl line each
        (written and flushed when the step ends), resume.pt after every SAVE_EVERY-th step and the last. Returns
        the steps done."""
        import json
        import os

        import torch

        from .errors import ConfigError
        from .outputs import atomic_open

        os.makedirs(folder, exist_ok=True)
        torch.manual_seed(cfg["SEED"])
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            param_groups(self.model, cfg["WEIGHT_DECAY"]), lr=cfg["LR"], betas=(0.9, 0.98), eps=1e-6
        )
        log_path, resume_path = os.path.join(folder, "train_log.jsonl"), os.path.join(folder, "resume.pt")
        start = 0
        if resume and os.path.isfile(resume_path):
            state = torch.load(resume_path, map_location=self.device, weights_only=False)
            if state["hash"] != digest:
                differs = [k for k in state.get("settings", {}) if state["settings"][k] != cfg.get(k)]
                raise ConfigError(
                    f"{resume_path} is another run's (it differs in {', '.join(differs) or 'its input or MODEL'}): "
                    f"give another RUN_NAME or OUTPUT_DIR, or RESUME=False to start over"
                )
            self.model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            start = state["steps"]
        lines = []
        if start and os.path.isfile(log_path):
            with open(log_path, encoding="utf-8") as f:
                lines = [x for x in f if x.strip() and json.loads(x)["step"] < start]
        with open(log_path, "w", encoding="utf-8") as log:
            log.writelines(lines)
            log.flush()
            n = len(recs)
            k_mix = mix_offset(n, cfg["SEED"]) if cfg["W_VC"] and n > 1 else 1
            for s in range(start, cfg["STEPS"]):
                t0 = time.perf_counter()
                lr = lr_at(s, cfg["LR"], cfg["WARMUP"], cfg["STEPS"])
                for group in opt.param_groups:
                    group["lr"] = lr
                out = self.step(s, recs, paths, cfg, k_mix)
                opt.zero_grad(set_to_none=True)
                out["loss"].backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg["GRAD_CLIP"])
                opt.step()
                with torch.no_grad():
                    self.model.logit_scale.clamp_(0, math.log(100))
                value = lambda x: None if x is None else float(x.detach())  # noqa: E731
                line = {
                    "step": s,
                    "lr": lr,
                    "loss": value(out["loss"]),
                    "loss_clip": value(out["clip"]),
                    "loss_sc": value(out["sc"]) if cfg["W_SC"] else None,
                    "loss_inv": value(out["inv"]) if cfg["W_INV"] else None,
                    "loss_vc": value(out["vc"]) if cfg["W_VC"] else None,
                    "logit_scale": out["scale"],
                    "logit_bias": out["bias"],
                    "num_flips": out["flips"],
                    "num_paraphrases": out["paras"],
                    "grad_norm": float(grad_norm),
                    "seconds": round(time.perf_counter() - t0, 3),
                }
                log.write(json.dumps(line) + "\n")
                log.flush()
                if (s + 1) % cfg["SAVE_EVERY"] == 0 or s + 1 == cfg["STEPS"]:
                    settings = {k: cfg.get(k) for k in HASHED}
                    state = {"steps": s + 1, "model": self.model.state_dict(), "optimizer": opt.state_dict()}
                    with atomic_open(resume_path, "wb") as f:
                        torch.save(dict(state, hash=digest, settings=settings), f)
        return max(start, cfg["STEPS"])

    def save(self, folder, run_name):
        """model/ (an open_clip local-dir) and model_spec.json: the saved model's MODELS spec."""
        import json
        import os

        from .outputs import write_json

        target = os.path.abspath(os.path.join(folder, "model"))
        openclip_save(self.model.eval(), target, self.model_cfg, self.quick_gelu)
        spec = {"name": run_name, "type": "openclip", "model_name": "local-dir:" + target, "pretrained": None}
        write_json(os.path.join(folder, "model_spec.json"), spec, output=False)
        return json.loads(json.dumps(spec))
