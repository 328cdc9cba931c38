"""lgip.scorer: the seam between the evaluation loop and what scores the pairs of one model.

A `PairScorer` takes one model's run on this process (its records, the text bank's calls, the Pairs
built from them) and returns a `Scored`: the Pairs with their scores, which records were read, what
could not be, and what else it gives (`provides`). The loop (lgip.evaluation.ModelRun.score) gathers
every process's Scored and checks it; the scripts turn its pairs into figures and never ask how a
score was made. Today's one scorer, `EmbeddingScorer`, embeds each image and each text apart and
scores a pair by their cosine; a scorer that reads a pair jointly (a generative model's likelihood,
a matching head: LGIP_SPEC.md 13) is a second implementation beside it, its scores cached per
(image, text) pair (lgip.cache's "pair" entries).

What a scorer provides (`provides`; an evaluation names what it needs: lgip.evaluation.run_evaluation):
  scores      base_sim and sim of every pair: the caption's and the text's score with the image
  prior       prior_base and prior: each pair's mean score with the other images (LGIP_SPEC.md 9)
  text_cos    the cosine of a pair's caption and text (needs text embeddings)
  embeddings  the image and text embeddings themselves (retrieval, the image side's galleries)

    >>> scored = run.score(inv, sens, controls=True)     # lgip.evaluation.ModelRun.score
    >>> inv, sens = scored.pairs
    >>> scored.n_samples, scored.image_report["num_failed_images"]
"""

import time
from dataclasses import replace

from .settings import setting
from .cache import image_cache_keys
from .controls import mark_hard_positives
from .device import cosines, row_dots
from .images import RecordImages
from .joint_scorer import JointScorer
from .models import FAMILIES
from .texts import resolve_text_batch_size
from .util import Timer

from .scored import PROVIDES, PairScorer, Scored  # noqa: F401 (the seam's types: lgip.scored)


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

    provides = frozenset(PROVIDES)

    def score(
        self, run, pairs_list, text_cos=False, keep_embeddings=False, controls=False, hard_positives=(), relative=False
    ):
        ahead = run.lookahead
        waited, run.ahead = ahead.settle(run.enc) if ahead is not None else (0.0, None)
        if not run.enc.weights_loaded and not self.all_in_cache(run):
            run.load_weights()
            more, run.ahead = ahead.settle(run.enc) if ahead is not None else (0.0, None)
            waited += more
        images = RecordImages(
            run.enc,
            run.records,
            run.image_root,
            run.config["IMAGE_BATCH_SIZE"],
            run.config["NUM_WORKERS"],
            run.mine,
            run.cache,
            pixel_memory_gb=setting(run.config, "PIXEL_MEMORY_GB"),
        )
        batch = resolve_text_batch_size(run.config["TEXT_BATCH_SIZE"], run.enc.device)
        # The later models' tokenizing and decoding begin once this model's own are done.
        then = (lambda: ahead.start(run.enc, run.bank.calls, images.paths)) if ahead is not None else None
        try:
            txt_emb, rows = run.bank.encode(batch, cache=run.cache, beside=images, then=then)
        except BaseException as e:  # Ctrl-C, SIGTERM: the images encoded so far go to the cache too
            images.close(keep=isinstance(e, KeyboardInterrupt))
            raise
        with Timer() as t_images:
            img_emb, ok, image_report = images.finish()
        resumed = self.resumed(run, len(images.paths))
        run.seconds.update(lookahead_wait=waited, **run.bank.seconds, images_after_texts=round(t_images.seconds, 3))
        scoring_started = time.perf_counter()
        good = set(ok)
        failed = [k for k in run.mine if k not in good]  # records whose image could not be read
        nonfinite = self.nonfinite(run, ok, img_emb, txt_emb, rows)
        if failed:
            pairs_list = [p.subset([j for j, k in enumerate(p.rec) if k in good]) for p in pairs_list]
        image_sum = self.image_sum(run, ok, img_emb, txt_emb) if controls else None
        for pairs in pairs_list:
            score_by_cosine(pairs, img_emb, txt_emb, rows, text_cos=text_cos, image_sum=image_sum)
        for f, p in hard_positives:  # (here: each process has its own texts' embeddings)
            mark_hard_positives(pairs_list[f], pairs_list[p], txt_emb, rows)
        # the published scripts count a record once its image and captions encode: not one without captions
        n_samples = sum(1 for k in ok if run.records[k][1]["orig_captions"])
        return Scored(
            pairs=pairs_list,
            ok=ok,
            failed=failed,
            n_ok=len(ok),
            n_samples=n_samples,
            image_report=image_report,
            nonfinite=nonfinite,
            provides=self.provides,
            texts={"unique": run.bank.n_unique, "encoded": run.bank.n_encoded, "positions": dict(run.bank.positions)},
            image_sources={
                "decoded": images.n_decoded,
                "from_pixel_memory": images.n_remembered,
                "from_cache": images.n_cached,
            },
            image_embeddings=img_emb,
            text_embeddings=(txt_emb, rows) if keep_embeddings else None,
            resumed=resumed,
            scoring_started=scoring_started,
            prior_images="all" if controls else None,
            relative=self.relative(run, ok, img_emb, txt_emb, rows) if relative else None,
        )

    @staticmethod
    def relative(run, ok, img_emb, txt_emb, rows):
        """LGIP_SPEC.md 13's denominator terms (lgip.joint_scorer's form): each readable record's captions
        with its own image ("own") and the captions of the readable record before it with the next
        record's image ("other"), from the captions' slots (TextCalls.captions). Under torchrun the next
        record's image lies on another process: every process's readable image embeddings are gathered
        (in their stored dtype: the same cosines as one process's). None for builders that register no
        captions."""
        import numpy as np
        import torch

        records, captions = run.records, run.bank.calls.captions
        mine = [k for k in ok if records[k][1]["orig_captions"]]
        if any(k not in captions for k in mine):
            return None
        if run.world > 1:
            every = run.all_gathered({k: img_emb[k].cpu() for k in mine})
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
    def all_in_cache(run):
        """True when every text of the calls and every image file of this process's records has
        its embedding in the cache (a file that is not there needs no model: it is reported)."""
        import os

        hits, n = run.bank.in_cache(run.cache)
        if hits < n:
            return False
        paths = dict.fromkeys(os.path.join(run.image_root, run.records[k][1]["image_path"]) for k in run.mine)
        index = run.cache.index("image")
        return all(key in index for key in image_cache_keys(list(paths)).values())

    @staticmethod
    def image_sum(run, ok, img_emb, txt_emb):
        """(every text row's dot with S, N): S the sum of the embeddings of the N images evaluated
        (readable, their record with captions), over every process: section 9's one vector per model."""
        import torch

        idx = [k for k in ok if run.records[k][1]["orig_captions"]]
        # (no image here: the text table's width, the image table's being unknown)
        total = (
            img_emb[idx].double().sum(0)
            if idx
            else torch.zeros(txt_emb.shape[1], dtype=torch.float64, device=txt_emb.device)
        )
        n = torch.tensor([float(len(idx))], dtype=torch.float64, device=total.device)
        if run.world > 1:
            import torch.distributed as dist

            dist.all_reduce(total)
            dist.all_reduce(n)
        return row_dots(txt_emb, total), int(n.item())

    @staticmethod
    def nonfinite(run, ok, img_emb, txt_emb, rows):
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
                line, rec = run.records[ok[bad[0]]]
                out.update(images=len(bad), first_image=(line, rec["image_path"]))
        if len(txt_emb):
            bad_rows = (~torch.isfinite(txt_emb).all(dim=1)).nonzero().flatten().cpu().numpy()
            if len(bad_rows):
                slots = np.flatnonzero(np.isin(np.asarray(rows), bad_rows))
                out.update(texts=len(bad_rows), first_text=run.bank.calls.texts[int(slots[0])] if len(slots) else None)
        return out

    @staticmethod
    def resumed(run, n_images):
        """What came from the cache, said (a re-run resumes where the last one stopped); None without one."""
        if run.cache is None:
            return None
        stats = run.cache.stats
        if stats["text_hits"] or stats["image_hits"]:
            print(
                f"{run.enc.name}: from the cache: {stats['text_hits']:,} of {run.bank.n_unique:,} texts, "
                f"{stats['image_hits']:,} of {n_images:,} images"
                + ("" if run.enc.weights_loaded else " (all of them: the model's weights were not loaded)"),
                flush=True,
            )
        return {"texts": [stats["text_hits"], run.bank.n_unique], "images": [stats["image_hits"], n_images]}


def for_gathering(scored):
    """A process's Scored as it travels to rank 0: its pairs as plain state, no embeddings."""
    return replace(scored, pairs=[p.state() for p in scored.pairs], image_embeddings=None, text_embeddings=None)


def merged(local, parts):
    """The Scored of every process (`parts`, for_gathering's, in rank order) as one, on rank 0: the
    pairs in record order, the counts summed, the failed records sorted, the first 20 unreadable images
    listed. What is this process's own stays `local`'s (its records read, its embeddings: a gallery
    gathers them itself, lgip.evaluation.ModelRun.gathered)."""
    from .scoring import Pairs

    return replace(
        local,
        pairs=[Pairs.merged([p.pairs[j] for p in parts]) for j in range(len(local.pairs))],
        failed=sorted(k for p in parts for k in p.failed),
        n_ok=sum(p.n_ok for p in parts),
        n_samples=sum(p.n_samples for p in parts),
        image_report={
            "num_failed_images": sum(p.image_report["num_failed_images"] for p in parts),
            "failed_images": [f for p in parts for f in p.image_report["failed_images"]][:20],
        },
        texts={
            "unique": sum(p.texts["unique"] for p in parts),
            "encoded": sum(p.texts["encoded"] for p in parts),
            "positions": {k: sum(p.texts["positions"].get(k, 0) for p in parts) for k in ("tokens", "computed")},
        },
        relative=None if any(p.relative is None for p in parts) else [t for p in parts for t in p.relative],
    )


SCORERS = {
    "embeddings": EmbeddingScorer,
    "joint": JointScorer,
}  # a family's scorer (lgip.models.families: Family.scorer) -> its PairScorer


def scorer_class(spec):
    """The PairScorer class for a model spec, by its family's scorer (lgip.models.families)."""
    kind = FAMILIES.get(spec.get("type"))
    return SCORERS[kind.scorer if kind is not None else "embeddings"]


def scorer_for(spec):
    """A PairScorer for a model spec (scorer_class's)."""
    return scorer_class(spec)()


def leave_out(models, needs, script):
    """The models of MODELS whose scorer gives what the step needs (LGIP_SPEC.md 13: a model without
    embeddings is left out of retrieval, word attribution and the image side's galleries), a line said
    for each one left out. A step left with none says so in a line of its own (the caller then writes
    nothing and exits 0)."""
    kept = []
    for spec in models:
        missing = [n for n in needs if isinstance(spec, dict) and n not in scorer_class(spec).provides]
        if missing:
            print(
                f"{script}: model {spec.get('name')!r} (type {spec.get('type')!r}) is left out: it scores a pair "
                f"jointly and gives no {', '.join(missing)}, which this step needs",
                flush=True,
            )
            continue
        kept.append(spec)
    if models and not kept:
        print(
            f"{script}: every model of MODELS is left out (none gives {', '.join(needs)}): nothing to do, "
            f"nothing written",
            flush=True,
        )
    return kept
