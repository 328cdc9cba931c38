"""lgip.scorers.cached: the model's cache wrapped around any scorer, as lm-eval's CachingLM wraps any model.

`CachingScorer(inner, cache)` is a PairScorer that scores through `inner` (any PairScorer) and owns what the
cache means for a run:
- the inner scorer is handed the cache as `ctx.cache`: the model's lgip.cache.ModelCache, or a NoCache with
  the same interface and nothing in it, so no scorer asks whether there is one;
- `ctx.load_weights(unless_held=entries)`: the weights are loaded unless the cache holds every one of the
  entries ({kind: [key, ...]}: "image", "text", "pair") the scorer will read (a re-run whose every entry is
  cached loads none); a scorer that learns its entries as it goes calls `ctx.load_weights()` at its first miss;
- what came from the cache: the cache's hits during the call, against the entries the scorer looked at
  (`Scored.looked`, {"texts"|"images"|"pairs": count}), said in one line and returned as `Scored.resumed`.
Where a scorer's computation is one keyed call, `ctx.cache.through(kind, keys, compute)` asks it for the
missing keys alone (lgip.scorers.text); the embedding and joint scorers look up and write as they stream.

    >>> scored = CachingScorer(EmbeddingScorer(), cache).score(ctx, request)
"""

from dataclasses import replace

from ..cache import NoCache
from .base import PairScorer

# what Scored.looked counts -> (the cache's stat of its hits, the words a line says them in)
_LOOKED = {
    "texts": ("text_hits", "texts"),
    "images": ("image_hits", "images"),
    "pairs": ("pair_hits", "image-text scores"),
}


class CachingScorer(PairScorer):
    """`inner` (any PairScorer) with the model's cache (a lgip.cache.ModelCache, or None: none) around it."""

    def __init__(self, inner, cache=None):
        self.inner, self.cache = inner, cache
        self.provides, self.gives_words = inner.provides, inner.gives_words

    def score(self, ctx, request):
        before = dict(self.cache.stats) if self.cache is not None else {}
        scored = self.inner.score(self._context(ctx), request)
        return replace(scored, resumed=self._resumed(ctx, scored.looked, before))

    def score_images(self, ctx, scored, request):
        return self.inner.score_images(self._context(ctx), scored, request)

    def score_classes(self, ctx, request):
        before = dict(self.cache.stats) if self.cache is not None else {}
        scores = self.inner.score_classes(self._context(ctx), request)
        return replace(scores, resumed=self._resumed(ctx, scores.looked, before))

    def explain(self, model, request):
        return self.inner.explain(model, request)

    def not_finite(self, images, texts):
        return self.inner.not_finite(images, texts)

    def _context(self, ctx):
        cache = self.cache if self.cache is not None else NoCache()
        plain = ctx.load_weights

        def load_weights(unless_held=None):
            """Load the weights unless `unless_held` ({kind: keys}) is every one held; True when they are loaded
            now (a scorer settles what it was given ahead again)."""
            if ctx.enc.weights_loaded or (unless_held is not None and cache.holds(unless_held)):
                return False
            plain()
            return True

        return replace(ctx, cache=cache, load_weights=load_weights)

    def _resumed(self, ctx, looked, before):
        """{what: [from the cache, looked at]} of this call, said in a line when anything came from it; None
        without a cache. A kind looked at gets its hits in the cache's stats (0 included: the run block's)."""
        if self.cache is None or not looked:
            return None
        stats, out = self.cache.stats, {}
        for what, n in looked.items():
            stat = _LOOKED[what][0]
            stats[stat] = stats.get(stat, 0)
            out[what] = [stats[stat] - before.get(stat, 0), n]
        if any(hits for hits, _ in out.values()):
            print(
                f"{ctx.enc.name}: from the cache: "
                + ", ".join(f"{hits:,} of {n:,} {_LOOKED[what][1]}" for what, (hits, n) in out.items())
                + ("" if ctx.enc.weights_loaded else " (all of them: the model's weights were not loaded)"),
                flush=True,
            )
        return out
