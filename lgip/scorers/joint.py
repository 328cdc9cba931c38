"""lgip.scorers.joint: the scorer of a model that scores an (image, text) pair jointly (scorer kind "joint",
LGIP_SPEC.md 13: types "generative" and "itm", lgip.models.joint), beside lgip.scorers.embeddings.

Each image is scored with its own record's texts (captions, paraphrases, flips) and, for the text-prior
controls, with the texts of the PRIOR_IMAGES records before it (indices mod N over the input's readable
records with captions, in file order, whatever the torchrun split), so that a text's prior score is its
mean score with the images of the PRIOR_IMAGES records after its own. The relative invariance error's
denominator takes each image with the captions of the record before it.

Scores are cached per (image, text) (lgip.cache's "pair" entries, keyed by the image's path, size and
mtime and the text): a cached re-run loads no weights and decodes no image; a killed run resumes. Images
decode in DataLoader workers; each is decoded once, in file order, with its own texts and those of the
records before it (the model runs the image's shared prefix once for all of them: lgip.models.generative),
and again only for the few pairs that order cannot reach (the first records' wrap-around; under torchrun,
the neighbours on other processes; texts cached for some images and not others). Images are classified by the
mean pair score of each class's prompts (LGIP_SPEC.md 16: `score_classes`).
"""

import os
import sys
import time

from ..cache import PairScores
from ..controls import mark_hard_positives
from ..images import _ImageFiles
from ..util import default_num_workers, progress
from .base import ClassScores, ImageScores, PairScorer, Scored


def _as_image(img):
    return img


def _first(items):
    return items[0]


def decoded(ctx, paths):
    """(path, PIL image or None, error) for each path (a file, or an AlteredImage), in order, decoded in
    the run's worker processes."""
    import torch

    if not paths:
        return
    workers = default_num_workers() if ctx.num_workers is None else ctx.num_workers
    loader = torch.utils.data.DataLoader(
        _ImageFiles(paths, _as_image),
        batch_size=1,
        shuffle=False,
        num_workers=min(workers, len(paths)),
        collate_fn=_first,
    )
    for i, img, err in progress(loader, total=len(paths), desc=f"{ctx.enc.name}: images", unit="image", min_total=20):
        yield paths[i], img, err


class _Store(PairScores):
    """The model's pair scores (lgip.cache.PairScores: from the cache, or computed and added to it), computed
    image by image, pipelined: one image's scores are collected once the next image's work has begun."""

    def __init__(self, ctx):
        from .. import accelerations

        super().__init__(ctx.cache)
        self.ctx = ctx
        # (with JOINT_PIPELINE, one image's scores are collected after the next image's work has begun)
        # (a model running images in groups leaves a group's worth pending: they run together)
        self.depth = max(1, getattr(ctx.enc, "in_flight", 1)) if accelerations.JOINT_PIPELINE else 0
        self.pending = []  # [(path, texts, the model's pending scores, when begun)]
        self.in_flight = set()  # (path, text) of the pending scores

    def missing(self, path, texts):
        """The texts of `texts` whose score with `path` is known neither here (pending included) nor in the
        cache (looked up)."""
        return super().missing(path, [t for t in dict.fromkeys(texts) if (path, t) not in self.in_flight])

    def compute(self, path, image, texts):
        """Score `texts` (none known) against the decoded image; the model loaded at the first need. The
        scores land in `scores` (and the cache) now, or, pipelined, once the next image's work has begun
        (flush: all of them)."""
        if not texts:
            return
        if not self.ctx.enc.weights_loaded:
            self.ctx.load_weights()
        t0 = time.monotonic()
        self.pending.append((path, list(texts), self.ctx.enc.submit(image, texts), t0))
        self.in_flight.update((path, t) for t in texts)
        while len(self.pending) > self.depth:
            self._collect()

    def flush(self):
        """Every pending score into `scores` (and the cache)."""
        while self.pending:
            self._collect()

    def _collect(self):
        path, texts, pending, t0 = self.pending.pop(0)
        values = pending.result()
        self.in_flight.difference_update((path, t) for t in texts)
        self.add(path, texts, values, since=t0)


class JointScorer(PairScorer):
    """Scores of a JointModel (module docstring): scores and the text-prior controls; no embeddings."""

    provides = frozenset({"scores", "images", "pair_scores", "prior", "altered_images", "class_scores"})
    gives_words = "it scores a pair jointly and gives"

    def score(self, ctx, request):
        import numpy as np

        pairs_list, controls, relative = list(request.pairs), request.controls, request.relative
        records, texts_of_slot = ctx.records, ctx.bank.calls.texts
        ahead = ctx.lookahead
        waited, done_ahead = ahead.settle(ctx.enc) if ahead is not None else (0.0, None)
        path_of = {k: os.path.join(ctx.image_root, records[k][1]["image_path"]) for k in range(len(records))}
        own = {k: list(records[k][1]["orig_captions"]) for k in ctx.mine}
        for pairs in pairs_list:
            for k, b, s in zip(pairs.rec, pairs.base_slot, pairs.slot):
                own[k] += (texts_of_slot[b], texts_of_slot[s])
        own = {k: list(dict.fromkeys(v)) for k, v in own.items()}
        if ahead is not None:  # the later models' tokenizing and decoding, while this one scores
            ahead.start(ctx.enc, ctx.bank.calls, list(dict.fromkeys(path_of[k] for k in ctx.mine)))
        store, started = _Store(ctx), time.perf_counter()
        prior_n = ctx.prior_images if controls else 0
        with store.writing():
            failed, why, n_decoded = self._own_and_before(ctx, own, path_of, store, prior_n)
            readable = self._readable(ctx, failed)
            n = len(readable)
            j_max = min(prior_n, n - 1) if n >= 2 else 0
            n_decoded += self._neighbours(ctx, own, path_of, store, readable, j_max, relative and n >= 2)
        # (the images' decoding and the model's forwards, beside each other: one phase)
        seconds = dict(lookahead_wait=waited, pair_scores=round(time.perf_counter() - started, 3))
        scoring_started = time.perf_counter()
        ok = [k for k in ctx.mine if k not in failed]
        good = set(ok)
        if failed:
            pairs_list = [p.subset([j for j, k in enumerate(p.rec) if k in good]) for p in pairs_list]
        place = {k: p for p, k in enumerate(readable)}
        s = store.scores
        for pairs in pairs_list:
            base = [texts_of_slot[b] for b in pairs.base_slot]
            pairs.base_sim = np.array([s[(path_of[k], t)] for k, t in zip(pairs.rec, base)], dtype=np.float64)
            pairs.sim = np.array([s[(path_of[k], t)] for k, t in zip(pairs.rec, pairs.text)], dtype=np.float64)
            pairs.labels = np.array(pairs.label, dtype=object)
            if controls:
                nexts = [[path_of[readable[(place[k] + j) % n]] for j in range(1, j_max + 1)] for k in pairs.rec]
                pairs.prior_base = self._prior(s, nexts, base)
                pairs.prior = self._prior(s, nexts, pairs.text)
        for f, p in request.hard_positives:  # (no text embeddings: the text-only outcome is not known)
            mark_hard_positives(pairs_list[f], pairs_list[p], None, None)
        rel = self._relative_parts(records, own, path_of, s, readable, ctx.mine, good) if relative and n >= 2 else []
        bad = [(k, t) for (k, t) in ((k, t) for k in ok for t in own[k]) if not np.isfinite(s[(path_of[k], t)])]
        nonfinite = {"images": 0, "texts": len(bad), "first_image": None, "first_text": bad[0][1] if bad else None}
        unread = list(dict.fromkeys(path_of[k] for k in failed))
        report = {
            "num_failed_images": len(unread),
            "failed_images": [
                {"path": p, "error": failed_why}
                for p, failed_why in ((p, why.get(p, "unreadable")) for p in unread[:20])
            ],
        }
        for item in report["failed_images"]:
            print(
                f"warning: {ctx.enc.name}: skipping unreadable image {item['path']} ({item['error']})", file=sys.stderr
            )
        n_samples = sum(1 for k in ok if records[k][1]["orig_captions"])
        return Scored(
            pairs=pairs_list,
            ok=ok,
            failed=sorted(failed),
            n_ok=len(ok),
            n_samples=n_samples,
            image_report=report,
            nonfinite=nonfinite,
            provides=self.provides,
            texts={"unique": len({t for k in ok for t in own[k]}), "encoded": store.n_added, "positions": {}},
            image_sources={"decoded": n_decoded, "from_cache": len(ok) - min(len(ok), n_decoded)},
            looked={"pairs": store.n_hits + store.n_added},
            scoring_started=scoring_started,
            prior_images=j_max if controls else None,
            relative=rel,
            seconds=seconds,
            ahead=done_ahead,
        )

    def not_finite(self, images, texts):
        return f"{texts} image-text scores are"

    def score_images(self, ctx, scored, request):
        """Each altered image scored with the captions of the records it was made for (from the cache where
        there, keyed by the item's cache key; the weights loaded only when a score is not). The captions'
        scores with their originals are `scored`'s own (its first Pairs: the captions)."""
        store = _Store(ctx)
        jobs = list(zip(request.items, request.captions))
        todo = [(j, item, store.missing(item, texts)) for j, (item, texts) in enumerate(jobs)]
        todo = [(j, item, texts) for j, item, texts in todo if texts]
        failed, n = {}, 0
        with store.writing():
            for (j, item, texts), (_, img, err) in zip(todo, decoded(ctx, [item for _, item, _ in todo])):
                n += 1
                if err is not None:
                    failed[j] = err
                    continue
                store.compute(item, img, texts)
        sources = {
            "num": len(request.items),
            "decoded": n,
            "from_pixel_memory": 0,
            "from_cache": len(request.items) - n - len(failed),
        }
        return JointImages(store.scores, request.items, failed, sources, scored, ctx.records)

    def score_classes(self, ctx, request):
        """LGIP_SPEC.md 16's class scores of a joint model: z_c = the mean over GENERATIVE_TEMPLATES of section 13's
        score of (image, p.format(c=name)), float64. Each image is decoded once, in the run's workers, and scored
        with all its classes' texts in one submission (the model runs the image's shared prefix once for them:
        a class costs its own few tokens); scores cached per (image, text), so a cached re-run loads no weights."""
        import numpy as np

        templates = list(request.generative_templates)
        ahead = ctx.lookahead
        waited, done_ahead = ahead.settle(ctx.enc) if ahead is not None else (0.0, None)
        texts = [[[p.format(c=c) for p in templates] for c in t.classnames] for t in request.tasks]
        wanted = {}  # image -> its texts, every task's it is in
        for task, per_class in zip(request.tasks, texts):
            for x in task.images:
                wanted.setdefault(x, []).extend(q for qs in per_class for q in qs)
        if ahead is not None:
            ahead.start(ctx.enc, ctx.bank.calls, list(wanted))
        store, started, failed_at, n = _Store(ctx), time.perf_counter(), {}, 0
        todo = {x: store.missing(x, qs) for x, qs in wanted.items()}
        todo = {x: qs for x, qs in todo.items() if qs}
        with store.writing():
            for x, img, err in decoded(ctx, list(todo)):
                n += 1
                if err is not None:
                    failed_at[x] = err
                    continue
                store.compute(x, img, todo[x])
        z, failed = [], []
        for task, per_class in zip(request.tasks, texts):
            rows = np.full((len(task.images), len(task.classnames)), np.nan)
            for j, x in enumerate(task.images):
                if x not in failed_at:
                    rows[j] = [np.mean([store.scores[(x, q)] for q in qs], dtype=np.float64) for qs in per_class]
            z.append(rows)
            failed.append({j: failed_at[x] for j, x in enumerate(task.images) if x in failed_at})
        return ClassScores(
            z=z,
            cos=[None] * len(z),
            failed=failed,
            logit_scale=None,
            texts={"unique": len({q for qs in wanted.values() for q in qs}), "encoded": store.n_added},
            image_sources={"decoded": n, "from_cache": len(wanted) - n},
            looked={"pairs": store.n_hits + store.n_added},
            seconds=dict(lookahead_wait=waited, pair_scores=round(time.perf_counter() - started, 3)),
            ahead=done_ahead,
        )

    def _own_and_before(self, ctx, own, path_of, store, prior_n):
        """Phase one, this process's records in file order: each image with its own texts and (one process)
        those of the prior_n readable records before it. Returns (records whose image cannot be read,
        {path: why}, images decoded). An image whose own texts are all cached is not decoded (its file
        stands)."""
        records, failed, decoding, why = ctx.records, set(), [], {}
        for k in ctx.mine:
            path = path_of[k]
            if store.image_key(path) is None:
                failed.add(k)
                why[path] = "FileNotFoundError: no such file" if not os.path.exists(path) else "OSError: cannot stat"
            elif store.missing(path, own[k]):
                decoding.append(k)
        images = decoded(ctx, list(dict.fromkeys(path_of[k] for k in decoding)))
        uses = {}
        for k in decoding:  # (records sharing an image: it is decoded once and kept until its last one)
            uses[path_of[k]] = uses.get(path_of[k], 0) + 1
        got, before, n = {}, [], 0
        for k in ctx.mine:
            if k in failed:
                continue
            path = path_of[k]
            if k in decoding:
                if path not in got:
                    p, img, err = next(images)
                    n += 1
                    got[p] = (img, err)
                img, err = got[path]
                uses[path] -= 1
                if not uses[path]:
                    del got[path]
                if err is not None:
                    failed.add(k)
                    why[path] = err
                    continue
                texts = list(own[k])
                if ctx.world == 1:
                    texts += [t for r in before[-prior_n:] if prior_n for t in own[r]]
                store.compute(path, img, store.missing(path, texts))
            if records[k][1]["orig_captions"]:
                before.append(k)
        return failed, why, n

    def _readable(self, ctx, failed):
        """Every process's readable records with captions, in file order (all_gathered under torchrun)."""
        records = ctx.records
        every = set(failed)
        if ctx.world > 1:
            every = {k for part in ctx.gather(sorted(failed)) for k in part}
        return [k for k in range(len(records)) if k not in every and records[k][1]["orig_captions"]]

    def _neighbours(self, ctx, own, path_of, store, readable, j_max, relative):
        """Phase two: the pairs phase one could not reach (each of this process's records' texts with the
        images of the j_max records after it; with relative, the captions with the next image), decoded
        again where needed. Returns the images decoded."""
        place = {k: p for p, k in enumerate(readable)}
        need = {}
        for k in ctx.mine:
            if k not in place:
                continue
            for j in range(1, max(j_max, 1 if relative else 0) + 1):
                path = path_of[readable[(place[k] + j) % len(readable)]]
                texts = own[k] if j <= j_max else ctx.records[k][1]["orig_captions"]
                need.setdefault(path, []).extend(texts)
        todo = {path: store.missing(path, texts) for path, texts in need.items()}
        todo = {p: t for p, t in todo.items() if t}
        n = 0
        for path, img, err in decoded(ctx, list(todo)):
            n += 1
            if err is not None:  # (read once, not now: a file changed under the run)
                raise OSError(f"{path}: could not be read again ({err})")
            store.compute(path, img, todo[path])
        return n

    @staticmethod
    def _prior(scores, nexts, texts):
        import numpy as np

        if not nexts or not nexts[0]:
            return np.full(len(texts), np.nan)
        return np.array([sum(scores[(p, t)] for p in ps) / len(ps) for ps, t in zip(nexts, texts)], dtype=np.float64)

    @staticmethod
    def _relative_parts(records, own, path_of, scores, readable, mine, good):
        """LGIP_SPEC.md 13's denominator terms as parts ("own": s(v_r, t_i) of this process's records;
        "other": s(v_r, c), c = caption (i mod n') of the record before r, from the process that has that
        record's texts): [(r, i, kind, score)], joined on rank 0 (lgip.controls.relative_terms)."""
        place = {k: p for p, k in enumerate(readable)}
        parts = []
        for k in mine:
            if k not in place or k not in good:
                continue
            caps = records[k][1]["orig_captions"]
            parts += [(k, i, "own", scores[(path_of[k], c)]) for i, c in enumerate(caps)]
            nxt = readable[(place[k] + 1) % len(readable)]
            for i in range(len(records[nxt][1]["orig_captions"])):
                parts.append((nxt, i, "other", scores[(path_of[nxt], caps[i % len(caps)])]))
        return parts


class JointImages(ImageScores):
    """Altered images scored jointly: no embeddings, so no gallery (LGIP_SPEC.md 13)."""

    no_gallery = (
        "no text-to-image search: the model scores a pair jointly, and a gallery needs every "
        "caption scored with every image (LGIP_SPEC.md 13)"
    )

    def __init__(self, scores, items, failed, sources, scored, records):
        import numpy as np

        self.scores, self.items, self.failed, self.sources, self.records = scores, items, failed, sources, records
        own = scored.pairs[0]
        self.base_of = {(k, i): v for k, i, v in zip(own.rec, own.cap, np.asarray(own.sim).tolist())}

    def original(self, rec, cap, slot):
        import numpy as np

        return np.array([self.base_of[(k, i)] for k, i in zip(rec.tolist(), cap.tolist())], dtype=np.float64)

    def altered(self, item, rec, cap, slot):
        import numpy as np

        captions = [self.records[k][1]["orig_captions"][i] for k, i in zip(rec.tolist(), cap.tolist())]
        return np.array([self.scores[(self.items[a], c)] for a, c in zip(item.tolist(), captions)], dtype=np.float64)
