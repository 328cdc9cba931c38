"""lgip.scorers.text: the scorer of a text-only model (scorer kind "text": type "causal_lm", LGIP_SPEC.md 15):
a pair's caption and text each scored alone, no image read, so its figures are a blind model's (what a text
prior alone gives). Each unique text is scored once.

    >>> scored = TextScorer().score(ctx, ScoreRequest([para, flips]))   # base_sim = s(caption), sim = s(text)
"""

import json
import time

from .base import PairScorer, Scored


def _key(text):
    return "lm|" + json.dumps(text, ensure_ascii=False)


class TextScorer(PairScorer):
    """Scores of a model that reads the text alone: scores only, every record counted as read."""

    provides = frozenset({"scores"})
    gives_words = "it reads no image and gives"

    def score(self, ctx, request):
        import numpy as np

        texts = ctx.bank.calls.texts
        pairs_list = list(request.pairs)
        wanted = list(dict.fromkeys(t for p in pairs_list for t in [texts[b] for b in p.base_slot] + list(p.text)))
        started, encoded = time.perf_counter(), []

        def compute(todo):  # (the texts the cache does not hold: a cached re-run loads no weights)
            ctx.load_weights()
            encoded.extend(wanted[p] for p in todo)
            return [[v] for v in ctx.enc.score_texts([wanted[p] for p in todo], _batch(ctx.text_batch_size))]

        rows = ctx.cache.through("text", [_key(t) for t in wanted], compute)
        scores = {t: row[0] for t, row in zip(wanted, rows)}
        seconds = {"text_scores": round(time.perf_counter() - started, 3)}
        for pairs in pairs_list:
            pairs.base_sim = np.array([scores[texts[b]] for b in pairs.base_slot], dtype=np.float64)
            pairs.sim = np.array([scores[t] for t in pairs.text], dtype=np.float64)
            pairs.labels = np.array(pairs.label, dtype=object)
        bad = [t for t in wanted if not np.isfinite(scores[t])]
        ok = list(ctx.mine)
        return Scored(
            pairs=pairs_list,
            ok=ok,
            failed=[],
            n_ok=len(ok),
            n_samples=sum(1 for k in ok if ctx.records[k][1]["orig_captions"]),
            image_report={"num_failed_images": 0, "failed_images": []},
            texts={"unique": len(wanted), "encoded": len(encoded), "positions": {}},
            nonfinite={"images": 0, "texts": len(bad), "first_image": None, "first_text": bad[0] if bad else None},
            provides=self.provides,
            looked={"texts": len(wanted)},
            scoring_started=time.perf_counter(),
            seconds=seconds,
        )

    def not_finite(self, images, texts):
        return f"{texts} text scores are"


def _batch(size):
    return size if isinstance(size, int) and size > 0 else 32
