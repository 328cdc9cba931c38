"""lgip.trainer: the fine-tuning loop (LGIP_SPEC.md 14) over any family that can train (its record's `trainable`:
open_clip, transformers CLIP-style, SigLIP): a step's records, draws and loss terms (lgip.finetune's functions),
AdamW with open_clip's groups and schedule, the gradient clipped, the logit scale clamped, `train_log.jsonl` a line
a step, `resume.pt`, and, under torchrun, each rank encoding its slice of the batch with the features gathered in
rank order, so that W ranks x B/W give what one process gives with B.

    >>> trainer = Trainer(spec, "cpu", "auto")                  # rank and world size from torchrun's environment
    >>> done = trainer.train(folder, records, paths, TrainSettings(), digest, hashed); spec = trainer.save(folder, "x")
"""

import json
import math
import os
import time

from .finetune import draw, lr_at, mix_offset, param_groups, probe_loss, step_positions


def world():
    """(rank, world size) of this process: torchrun's (torch.distributed initialised, gloo on CPU, nccl on CUDA),
    or (0, 1)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return 0, 1
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() and os.environ.get("LGIP_GLOO") != "1" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def barrier(size):
    if size > 1:
        import torch.distributed as dist

        dist.barrier()


def _gather(x, size):
    """x of every rank, concatenated in rank order, with gradient (torch.distributed.nn.functional.all_gather)."""
    if size == 1:
        return x
    import torch
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()))


def readable(records, ks, root):
    """(the record indices of `ks` whose image decodes, [{line, path, error}] of the others)."""
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


class Trainer:
    """One dual encoder fine-tuned (section 14): built by its family's `trainable` (the corrected protocol's
    preprocessing and tokenization), weights and optimizer state in fp32, the forward under bf16 autocast on CUDA
    when DTYPE asks for it; under torchrun this process is one rank of the batch."""

    def __init__(self, spec, device, dtype):
        import torch

        from .models.encoder import resolve_device
        from .models.families import family

        self.rank, self.size = world()
        device = resolve_device(device)
        if self.size > 1 and torch.device(device).type == "cuda" and torch.device(device).index is None:
            device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        self.spec, self.device = spec, device
        self.towers = family(spec).trainable(spec, device)
        self.model = self.towers.model
        self.autocast = torch.device(device).type == "cuda" and dtype in ("auto", "bf16", "bfloat16")
        self.dtype_name = "bf16 autocast, fp32 weights" if self.autocast else "fp32"

    def _images(self, images):
        import torch

        return torch.nn.functional.normalize(self.towers.encode_images(images).float(), dim=-1)

    def _texts(self, texts):
        import torch

        return torch.nn.functional.normalize(self.towers.encode_texts(list(texts)).float(), dim=-1)

    def _batch_texts(self, texts, at, rows, keep, width):
        """The batch's texts of one kind (paraphrases, flips) in one process's order: this rank's `texts` encoded;
        under torchrun put at rows `at` of a (rows, d) block, zeros elsewhere (every rank's block one shape), the
        blocks gathered with gradient in rank order, and the rows `keep` of them taken."""
        import torch

        out = self._texts(texts) if texts else torch.zeros((0, width), device=self.device)
        if self.size == 1:
            return out
        block = torch.zeros((rows, width), device=self.device)
        if texts:
            block = block.index_put((torch.tensor(at, dtype=torch.long, device=self.device),), out)
        return _gather(block, self.size)[torch.tensor(keep, dtype=torch.long, device=self.device)]

    def forward_context(self):
        """bf16 autocast on CUDA where DTYPE asks for it, else nothing."""
        import contextlib

        import torch

        return torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()

    def step(self, s, recs, paths, cfg, k_mix):
        """One step's loss terms and counts (not yet stepped): {loss, clip, sc, inv, vc, flips, paras, scale, bias}.
        Every rank draws the whole batch (its counts), encodes its slice [kB/W, (k+1)B/W), and gathers."""

        from .alterations import alter
        from .images import open_rgb

        n, b, size = len(recs), cfg.batch_size, self.size
        pos = step_positions(s, n, b, cfg.seed)
        draws = [draw(recs[r], cfg.seed, s, r, cfg.n_flips) for r in pos]
        lo, hi = self.rank * b // size, (self.rank + 1) * b // size
        mine = draws[lo:hi]
        images = [open_rgb(paths[r]) for r in pos[lo:hi]]
        self.model.train()
        with self.forward_context():
            v_own = self._images(images)
            width = v_own.shape[1]
            v, t = _gather(v_own, size), _gather(self._texts([d[0] for d in mine]), size)
            p = q = None
            if cfg.w_inv:  # (each rank's paraphrases at their batch positions: q, the batch's, kept)
                own = [j for j, d in enumerate(mine) if d[1] is not None]
                q = [j for j, d in enumerate(draws) if d[1] is not None]
                p = self._batch_texts([mine[j][1] for j in own], own, hi - lo, q, width)
            fl = None
            if cfg.w_sc:  # (each rank's flips first in its block of (B/W) N_FLIPS rows; the valid ones kept)
                own = [f for d in mine for f in d[2]]
                counts = [sum(len(d[2]) for d in draws[k * b // size : (k + 1) * b // size]) for k in range(size)]
                per = (b // size) * cfg.n_flips
                keep = [k * per + j for k in range(size) for j in range(counts[k])]
                fl = self._batch_texts(own, range(len(own)), per, keep, width)
            mixed = None
            if cfg.w_vc:
                made = [
                    alter(images[j], "mix", open_rgb(paths[(r + k_mix) % n]), cfg.seed, r)
                    for j, r in enumerate(pos[lo:hi])
                ]
                mixed = _gather(self._images(made), size)
        scale = self.model.logit_scale.exp()
        bias = getattr(self.model, "logit_bias", None)
        loss, terms = probe_loss(
            v, t, scale, bias, flips=fl, paraphrases=p, with_paraphrase=q or (), mixed=mixed, **cfg.weights()
        )
        return {
            "loss": loss,
            **terms,
            "flips": sum(len(d[2]) for d in draws),
            "paras": sum(d[1] is not None for d in draws),
            "scale": float(scale.detach().reshape(-1)[0]),
            "bias": float(bias.detach().reshape(-1)[0]) if bias is not None else None,
        }

    def _average_gradients(self, params):
        """Each parameter's gradient averaged over the ranks (what DDP does): with every rank's loss the whole
        batch's, and the gather's backward summing over ranks, the average is the one-process gradient."""
        if self.size == 1:
            return
        import torch
        import torch.distributed as dist

        for prm in params:
            if prm.grad is None:
                prm.grad = torch.zeros_like(prm)
            dist.all_reduce(prm.grad)
            prm.grad.div_(self.size)

    def train(self, folder, recs, paths, cfg, digest, hashed, resume=True, on_line=None):
        """Steps from where resume.pt left off (when its hash is this run's: `digest`, over the settings `hashed`
        {NAME: value}, kept in it to say which differ) to cfg.steps (a lgip.finetune.TrainSettings), a
        train_log.jsonl line each (rank 0; written and flushed when the step ends, then handed to `on_line`:
        lgip.trackers), resume.pt after every save_every-th step and the last (finetune_lgip.py removes it once the
        model is saved, unless keep_resume). Returns the steps done."""
        import torch

        from .errors import ConfigError
        from .outputs import atomic_open
        from .util import _NoBar, progress_bar

        os.makedirs(folder, exist_ok=True)
        torch.manual_seed(cfg.seed)
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
        log_path, resume_path = os.path.join(folder, "train_log.jsonl"), os.path.join(folder, "resume.pt")
        start = 0
        if resume and os.path.isfile(resume_path):
            state = torch.load(resume_path, map_location=self.device, weights_only=False)
            if state["hash"] != digest:
                differs = [k for k in state.get("settings", {}) if state["settings"][k] != hashed.get(k)]
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
        barrier(self.size)  # (every rank has read resume.pt and the log before rank 0 rewrites them)
        log = open(log_path, "w", encoding="utf-8") if self.rank == 0 else None
        bar = progress_bar(cfg.steps - start, desc=f"{cfg.run_name}: steps", unit="step", min_total=50)
        bar = bar if self.rank == 0 else _NoBar()
        try:
            if log:
                log.writelines(lines)
                log.flush()
            n = len(recs)
            k_mix = mix_offset(n, cfg.seed) if cfg.w_vc and n > 1 else 1
            for s in range(start, cfg.steps):
                t0 = time.perf_counter()
                lr = lr_at(s, cfg.lr, cfg.warmup, cfg.steps)
                for group in opt.param_groups:
                    group["lr"] = lr
                out = self.step(s, recs, paths, cfg, k_mix)
                opt.zero_grad(set_to_none=True)
                out["loss"].backward()
                self._average_gradients(params)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                opt.step()
                with torch.no_grad():
                    self.model.logit_scale.clamp_(0, math.log(100))
                if log:
                    line = self._line(s, lr, out, cfg, grad_norm, t0)
                    log.write(json.dumps(line) + "\n")
                    log.flush()
                    if on_line is not None:
                        on_line(line)
                    terms = ("loss", "loss_clip", "loss_sc", "loss_inv", "loss_vc")
                    bar.set_postfix({k[5:] or k: f"{line[k]:.3f}" for k in terms if line[k] is not None}, refresh=False)
                    bar.update(1)
                if self.rank == 0 and ((s + 1) % cfg.save_every == 0 or s + 1 == cfg.steps):
                    state = {"steps": s + 1, "model": self.model.state_dict(), "optimizer": opt.state_dict()}
                    with atomic_open(resume_path, "wb") as f:
                        torch.save(dict(state, hash=digest, settings=dict(hashed)), f)
        finally:
            bar.close()
            if log:
                log.close()
        barrier(self.size)
        return max(start, cfg.steps)

    @staticmethod
    def _line(s, lr, out, cfg, grad_norm, t0):
        value = lambda x: None if x is None else float(x.detach())
        return {
            "step": s,
            "lr": lr,
            "loss": value(out["loss"]),
            "loss_clip": value(out["clip"]),
            "loss_sc": value(out["sc"]) if cfg.w_sc else None,
            "loss_inv": value(out["inv"]) if cfg.w_inv else None,
            "loss_vc": value(out["vc"]) if cfg.w_vc else None,
            "logit_scale": out["scale"],
            "logit_bias": out["bias"],
            "num_flips": out["flips"],
            "num_paraphrases": out["paras"],
            "grad_norm": float(grad_norm),
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def save(self, folder, run_name):
        """model/ (the start's type: an open_clip local-dir, or a transformers save_pretrained folder) and
        model_spec.json: the saved model's MODELS spec (rank 0 writes; every rank returns it)."""
        from .outputs import write_json

        target = os.path.abspath(os.path.join(folder, "model"))
        self.model.eval()
        spec = self.towers.save(target, run_name, self.rank == 0)
        if self.rank == 0:
            write_json(os.path.join(folder, "model_spec.json"), spec, output=False)
        barrier(self.size)
        return json.loads(json.dumps(spec))
