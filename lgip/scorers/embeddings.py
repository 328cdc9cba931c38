"""lgip.scorers.embeddings: the scorer of a dual encoder (scorer kind "embeddings"): each image and each text
embedded apart (from the cache where they are there, the weights loaded only when something is not), a pair
scored by the cosine of its two embeddings (`score_by_cosine`); altered images embedded the same way
(LGIP_SPEC.md 11), their galleries searchable; images classified by their cosines with each class's mean prompt
embedding at the model's own logit scale (LGIP_SPEC.md 16: `score_classes`).

    >>> scored = EmbeddingScorer().score(ctx, ScoreRequest([inv, sens], controls=True))
"""

import time

from ..cache import image_cache_keys
from ..controls import mark_hard_positives
from ..device import cosines, row_dots
from ..images import ImageEncoding, RecordImages
from ..texts import resolve_text_batch_size
from ..util import Timer
from .base import PROVIDES, ClassScores, ImageScores, PairScorer, Scored


def score_by_cosine(pairs, img_emb, txt_emb, rows, text_cos=False, image_sum=None):
    """Fill `pairs`' scores from embeddings: base_sim and sim (the caption's and the text's cosine with
    its image); with text_cos their texts' cosine; with image_sum = (S . t for every text row, N), the
    sum S of the N evaluated images' embeddings, the mean cosine of the caption and of the text with the
    N - 1 OTHER images (prior_base, prior: LGIP_SPEC.md section 9; NaN when N < 2). Returns `pairs`."""
    import numpy as np

    base, other = rows[np.asarray(pairs.base_slot, dtype=np.int64)], rows[np.asarray(pairs.slot, dtype=np.int64)]
    pairs.base_sim = cosines(img_emb, txt_emb, pairs.rec, base)
    pairs.sim = cosines(img_emb, txt_emb, pairs.rec, other)
    pairs.labels = np.array(pairs.label, dtype=object)
    if text_cos:
        pairs.text_cos = cosines(txt_emb, txt_emb, base, other)
    if image_sum is not None:
        text_dots, n = image_sum
        if n < 2:
            pairs.prior_base = pairs.prior = np.full(len(pairs.rec), np.nan)
        else:  # m_r . t = (S . t - v_r . t) / (N - 1): the other images' mean, v_r left out
            pairs.prior_base = (text_dots[base] - pairs.base_sim) / (n - 1)
            pairs.prior = (text_dots[other] - pairs.sim) / (n - 1)
    return pairs


class EmbeddingScorer(PairScorer):
    """A dual encoder's scores: the bank's texts and the records' images embedded apart (from the
    cache where they are there, the weights loaded only when something is not), a pair scored by
    cosine. The images decode in the loader's workers while the texts encode; the later models'
    work starts once this one's own is done (lgip.lookahead)."""

    provides = frozenset(PROVIDES)  # (every one)

    def score(self, ctx, request):
        ahead = ctx.lookahead
        waited, done_ahead = ahead.settle(ctx.enc) if ahead is not None else (0.0, None)
        # (the weights: unless the cache holds every text and image; then what was done ahead is the model's)
        if not ctx.enc.weights_loaded and ctx.load_weights(unless_held=self.entries(ctx)):
            more, done_ahead = ahead.settle(ctx.enc) if ahead is not None else (0.0, None)
            waited += more
        images = RecordImages(
            ctx.enc,
            ctx.records,
            ctx.image_root,
            ctx.image_batch_size,
            ctx.num_workers,
            ctx.mine,
            ctx.cache,
            pixel_memory_gb=ctx.pixel_memory_gb,
        )
        batch = resolve_text_batch_size(ctx.text_batch_size, ctx.enc.device)
        # The later models' tokenizing and decoding begin once this model's own are done.
        then = (lambda: ahead.start(ctx.enc, ctx.bank.calls, images.paths)) if ahead is not None else None
        try:
            txt_emb, rows = ctx.bank.encode(batch, cache=ctx.cache, beside=images, then=then)
        except BaseException as e:  # Ctrl-C, SIGTERM: the images encoded so far go to the cache too
            images.close(keep=isinstance(e, KeyboardInterrupt))
            raise
        with Timer() as t_images:
            img_emb, ok, image_report = images.finish()
        seconds = dict(lookahead_wait=waited, **ctx.bank.seconds, images_after_texts=round(t_images.seconds, 3))
        scoring_started = time.perf_counter()
        good = set(ok)
        failed = [k for k in ctx.mine if k not in good]  # records whose image could not be read
        nonfinite = self.nonfinite(ctx, ok, img_emb, txt_emb, rows)
        pairs_list = list(request.pairs)
        if failed:
            pairs_list = [p.subset([j for j, k in enumerate(p.rec) if k in good]) for p in pairs_list]
        image_sum = self.image_sum(ctx, ok, img_emb, txt_emb) if request.controls else None
        for pairs in pairs_list:
            score_by_cosine(pairs, img_emb, txt_emb, rows, text_cos=request.text_cos, image_sum=image_sum)
        for f, p in request.hard_positives:  # (here: each process has its own texts' embeddings)
            mark_hard_positives(pairs_list[f], pairs_list[p], txt_emb, rows)
        # the published scripts count a record once its image and captions encode: not one without captions
        n_samples = sum(1 for k in ok if ctx.records[k][1]["orig_captions"])
        return Scored(
            pairs=pairs_list,
            ok=ok,
            failed=failed,
            n_ok=len(ok),
            n_samples=n_samples,
            image_report=image_report,
            nonfinite=nonfinite,
            provides=self.provides,
            texts={"unique": ctx.bank.n_unique, "encoded": ctx.bank.n_encoded, "positions": dict(ctx.bank.positions)},
            image_sources={
                "decoded": images.n_decoded,
                "from_pixel_memory": images.n_remembered,
                "from_cache": images.n_cached,
            },
            image_embeddings=img_emb,
            text_embeddings=(txt_emb, rows) if request.keep_embeddings else None,
            looked={"texts": ctx.bank.n_unique, "images": len(images.paths)},
            scoring_started=scoring_started,
            prior_images="all" if request.controls else None,
            relative=self.relative(ctx, ok, img_emb, txt_emb, rows) if request.relative else None,
            seconds=seconds,
            ahead=done_ahead,
        )

    def score_images(self, ctx, scored, request):
        """The altered images embedded (decoded and altered in the loader's workers; read from the cache
        where there), the weights loaded only when one is not cached (a file that is not there needs no
        model: it is reported); an embedding that is not finite counts as an image not made."""
        items = request.items
        if not ctx.enc.weights_loaded:  # (a file that is not there has no key: it needs no model, it is reported)
            ctx.load_weights(unless_held={"image": list(image_cache_keys(items).values())})
        job = ImageEncoding(
            ctx.enc,
            items,
            ctx.image_batch_size,
            ctx.num_workers,
            desc="altered images",
            cache=ctx.cache,
            pixel_memory_gb=ctx.pixel_memory_gb,
        )
        emb, failed = job.start().finish()
        _drop_nonfinite(emb, failed, ctx.enc)
        sources = {
            "num": len(items),
            "decoded": job.n_decoded,
            "from_pixel_memory": job.n_remembered,
            "from_cache": job.n_cached,
        }
        return EmbeddedImages(emb, failed, sources, scored)

    def score_classes(self, ctx, request):
        """LGIP_SPEC.md 16's class scores of a dual encoder: each class's prompts (p.format(c=name) for the task's
        templates, encoded as the corrected protocol encodes texts: the run's model is loaded so) and each image
        embedded apart, from the cache where there (the weights loaded only when something is not), the images
        decoded in the loader's workers while the prompts encode; w_c = normalize(mean_p u_{c,p}) (OpenAI's
        recipe, CLIP_benchmark's zero_shot_classifier), cos_c = v . w_c, z_c = s cos_c with s = exp(logit_scale)
        of the model as loaded (1 without one, said), float64."""
        import torch

        ahead = ctx.lookahead
        waited, done_ahead = ahead.settle(ctx.enc) if ahead is not None else (0.0, None)
        slots = [[ctx.bank.add_call([p.format(c=c) for p in t.templates]) for c in t.classnames] for t in request.tasks]
        items = list(dict.fromkeys(x for t in request.tasks for x in t.images))
        entries = {"text": ctx.bank.cache_keys() + [SCALE_KEY], "image": list(image_cache_keys(items).values())}
        if not ctx.enc.weights_loaded and ctx.load_weights(unless_held=entries):
            more, done_ahead = ahead.settle(ctx.enc) if ahead is not None else (0.0, None)
            waited += more
        scale = ctx.cache.through("text", [SCALE_KEY], lambda todo: [[_logit_scale(ctx)]])[0][0]
        job = ImageEncoding(
            ctx.enc, items, ctx.image_batch_size, ctx.num_workers, cache=ctx.cache, pixel_memory_gb=ctx.pixel_memory_gb
        )
        then = (lambda: ahead.start(ctx.enc, ctx.bank.calls, items)) if ahead is not None else None
        try:
            batch = resolve_text_batch_size(ctx.text_batch_size, ctx.enc.device)
            txt_emb, rows = ctx.bank.encode(batch, cache=ctx.cache, beside=job, then=then)
        except BaseException as e:  # Ctrl-C, SIGTERM: the images encoded so far go to the cache too
            job.close(keep=isinstance(e, KeyboardInterrupt))
            raise
        with Timer() as t_images:
            img_emb, failed_at = job.finish()
        at = {x: j for j, x in enumerate(items)}
        s = 1.0 if scale != scale else float(torch.tensor(scale, dtype=torch.float64).exp())  # (NaN: none)
        z, cos, failed = [], [], []
        for task, task_slots in zip(request.tasks, slots):
            u = txt_emb[torch.as_tensor(rows[[q for qs in task_slots for q in qs]], device=txt_emb.device)].float()
            w = u.reshape(len(task.classnames), len(task.templates), -1).mean(dim=1)
            w = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            idx = torch.as_tensor([at[x] for x in task.images], dtype=torch.long, device=img_emb.device)
            c = (img_emb[idx].float() @ w.to(img_emb.device).T).double().cpu().numpy()
            cos.append(c)
            z.append(s * c)
            failed.append({j: failed_at[at[x]] for j, x in enumerate(task.images) if at[x] in failed_at})
        return ClassScores(
            z=z,
            cos=cos,
            failed=failed,
            logit_scale=s,
            scale_said=None if scale == scale else "it has no logit_scale: its class scores are its cosines (s = 1)",
            texts={"unique": ctx.bank.n_unique, "encoded": ctx.bank.n_encoded},
            image_sources={"decoded": job.n_decoded, "from_pixel_memory": job.n_remembered, "from_cache": job.n_cached},
            looked={"texts": ctx.bank.n_unique + 1, "images": len(items)},  # (+ 1: the logit scale's entry)
            seconds=dict(lookahead_wait=waited, **ctx.bank.seconds, images_after_texts=round(t_images.seconds, 3)),
            ahead=done_ahead,
        )

    def explain(self, model, request):
        """Word attribution through the text tower's gradients (lgip.explain, lgip.attribution)."""
        from ..explain import explain_model

        return explain_model(model, request.records, request.flips, request.sample, request.settings)

    @staticmethod
    def relative(ctx, ok, img_emb, txt_emb, rows):
        """LGIP_SPEC.md 13's denominator terms (lgip.scorers.joint's form): each readable record's captions
        with its own image ("own") and the captions of the readable record before it with the next
        record's image ("other"), from the captions' slots (TextCalls.captions). Under torchrun the next
        record's image lies on another process: every process's readable image embeddings are gathered
        (in their stored dtype: the same cosines as one process's). None for builders that register no
        captions."""
        import numpy as np
        import torch

        records, captions = ctx.records, ctx.bank.calls.captions
        mine = [k for k in ok if records[k][1]["orig_captions"]]
        if any(k not in captions for k in mine):
            return None
        if ctx.world > 1:
            every = ctx.gather({k: img_emb[k].cpu() for k in mine})
            vectors = {k: v for part in every for k, v in part.items()}
            readable = sorted(vectors)
            table = torch.stack([vectors[k] for k in readable]).to(img_emb.device) if readable else img_emb[:0]
            at = {k: j for j, k in enumerate(readable)}
        else:
            readable, table, at = mine, img_emb, {k: k for k in mine}
        if len(readable) < 2:
            return []
        place = {k: p for p, k in enumerate(readable)}
        rec, cap, kind, img, slot = [], [], [], [], []
        for k in mine:
            for i, own in enumerate(captions[k]):
                rec.append(k), cap.append(i), kind.append("own"), img.append(at[k]), slot.append(own)
            after = readable[(place[k] + 1) % len(readable)]  # (k is the record before it)
            for i in range(len(records[after][1]["orig_captions"])):
                rec.append(after), cap.append(i), kind.append("other"), img.append(at[after])
                slot.append(captions[k][i % len(captions[k])])
        values = cosines(table, txt_emb, np.asarray(img, dtype=np.int64), rows[np.asarray(slot, dtype=np.int64)])
        return list(zip(rec, cap, kind, values.tolist()))

    @staticmethod
    def entries(ctx):
        """The cache entries scoring reads: every text of the calls, every image file of this process's
        records (a file that is not there has no key: it needs no model, it is reported)."""
        import os

        paths = dict.fromkeys(os.path.join(ctx.image_root, ctx.records[k][1]["image_path"]) for k in ctx.mine)
        return {"text": ctx.bank.cache_keys(), "image": list(image_cache_keys(list(paths)).values())}

    @staticmethod
    def image_sum(ctx, ok, img_emb, txt_emb):
        """(every text row's dot with S, N): S the sum of the embeddings of the N images evaluated
        (readable, their record with captions), over every process: section 9's one vector per model."""
        import torch

        idx = [k for k in ok if ctx.records[k][1]["orig_captions"]]
        # (no image here: the text table's width, the image table's being unknown)
        total = (
            img_emb[idx].double().sum(0)
            if idx
            else torch.zeros(txt_emb.shape[1], dtype=torch.float64, device=txt_emb.device)
        )
        n = torch.tensor([float(len(idx))], dtype=torch.float64, device=total.device)
        if ctx.world > 1:
            import torch.distributed as dist

            dist.all_reduce(total)
            dist.all_reduce(n)
        return row_dots(txt_emb, total), int(n.item())

    @staticmethod
    def nonfinite(ctx, ok, img_emb, txt_emb, rows):
        """This process's embeddings that are NaN or infinite (a model that overflowed in fp16 or bf16,
        say): {"images": count, "texts": count, "first_image": (line, path), "first_text": text}.
        An unreadable image's row is NaN by design and not counted."""
        import numpy as np
        import torch

        out = {"images": 0, "texts": 0, "first_image": None, "first_text": None}
        if ok:
            at = torch.as_tensor(ok, dtype=torch.long, device=img_emb.device)
            bad = (~torch.isfinite(img_emb[at]).all(dim=1)).nonzero().flatten().tolist()
            if bad:
                line, rec = ctx.records[ok[bad[0]]]
                out.update(images=len(bad), first_image=(line, rec["image_path"]))
        if len(txt_emb):
            bad_rows = (~torch.isfinite(txt_emb).all(dim=1)).nonzero().flatten().cpu().numpy()
            if len(bad_rows):
                slots = np.flatnonzero(np.isin(np.asarray(rows), bad_rows))
                out.update(texts=len(bad_rows), first_text=ctx.bank.calls.texts[int(slots[0])] if len(slots) else None)
        return out


class EmbeddedImages(ImageScores):
    """Altered images as embeddings: a caption's score with an image is their cosine."""

    def __init__(self, emb, failed, sources, scored):
        self.embeddings, self.failed, self.sources, self.scored = emb, failed, sources, scored

    def original(self, rec, cap, slot):
        txt_emb, rows = self.scored.text_embeddings
        return cosines(self.scored.image_embeddings, txt_emb, rec, _rows(rows)[slot])

    def altered(self, item, rec, cap, slot):
        txt_emb, rows = self.scored.text_embeddings
        return cosines(self.embeddings, txt_emb, item, _rows(rows)[slot])


SCALE_KEY = "lgip:logit_scale"  # the text cache's entry of the model's logit_scale ([NaN]: none), so a cached re-run
#   needs no weights for it (no text's key has this form: a text key holds "|")


def _logit_scale(ctx):
    """The logit_scale of the model as loaded (the log of s: open_clip's, transformers' CLIP and SigLIP models'
    `logit_scale`; a loader of one's own, its model's attribute of that name), NaN when it has none."""
    import math

    ctx.load_weights()
    value = getattr(getattr(ctx.enc, "model", None), "logit_scale", None)
    if value is None:
        return math.nan
    try:
        return float(value.detach().float().reshape(-1)[0]) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, IndexError):
        return math.nan


def _rows(rows):
    import numpy as np

    return np.asarray(rows)


def _drop_nonfinite(emb, failed, enc):
    """An altered image whose embedding is NaN or infinite (the model overflowed on it) is counted
    and listed as not made, its row NaN as a failed one's: its pairs and gallery entries are left
    out, not scored as NaN. (The originals and captions: checked by lgip.evaluation.ModelRun.score.)"""
    import torch

    if not len(emb):
        return
    bad = (~torch.isfinite(emb).all(dim=1)).nonzero().flatten().tolist()
    for j in bad:
        if j not in failed:
            failed[j] = (
                f"its embedding by {enc.name} is not finite (NaN or inf): the model "
                f"overflowed on it (in {str(enc.dtype).replace('torch.', '')})"
            )
            emb[j] = float("nan")
