"""lgip.scorers: what scores one model's pairs, behind one seam. The room for a new kind of scorer.

The evaluation loop (lgip.evaluation.ModelRun) hands a model's scorer a request that is data (`ScoreRequest`:
the Pairs, the extras wanted; `ImageRequest`: altered images and their captions) and a small context
(`Context`: the records, the text bank, the cache, workers, a way to load the weights); the scorer returns a
`Scored` (its timings in it: it never writes into the run) or an `ImageScores`. Nothing outside this package
and the family records (lgip.models.families) asks what kind of model it has: a step asks what a scorer
gives (`gives`, PROVIDES), and a family names its scorer kind (Family.scorer).

  base        the interface: PairScorer, ScoreRequest, ImageRequest, ExplainRequest, ClassRequest, Context, Scored,
              ImageScores, ClassScores
  embeddings  "embeddings": a dual encoder's (image and text embedded apart, a pair scored by their cosine)
  joint       "joint": a model that scores a pair jointly (LGIP_SPEC.md 13: generative VLMs, ITM heads)
  text        "text": a model that reads the text alone (LGIP_SPEC.md 15: type causal_lm), a blind model
  cached      CachingScorer: the model's cache wrapped around any scorer (lm-eval's CachingLM's place)

A new kind: a module with a PairScorer subclass and a line below registering it (`register_scorer`), or a
family record whose `scorer` is the class itself (tests/test_families.py: a text-only scorer).

    >>> scored = CachingScorer(scorer_for(spec), cache).score(ctx, ScoreRequest([inv, sens], controls=True))
"""

from ..models import known_family
from .base import (  # noqa: F401 (the seam's types)
    PROVIDES,
    ClassRequest,
    ClassScores,
    ClassTask,
    Context,
    ExplainRequest,
    ImageRequest,
    ImageScores,
    PairScorer,
    Scored,
    ScoreRequest,
    for_gathering,
    merged,
)

SCORERS = {}  # scorer kind (a family's Family.scorer) -> its PairScorer class


def register_scorer(kind, cls):
    """Name a PairScorer class as scorer kind `kind` (a scorer's module calls it once); returns the class."""
    if not (isinstance(cls, type) and issubclass(cls, PairScorer)):
        raise TypeError(f"scorer {kind!r} must be a PairScorer subclass, got {cls!r}")
    SCORERS[kind] = cls
    return cls


from .embeddings import EmbeddingScorer, score_by_cosine  # noqa: E402,F401 (after SCORERS: they register)
from .joint import JointScorer  # noqa: E402
from .text import TextScorer  # noqa: E402
from .cached import CachingScorer  # noqa: E402,F401

register_scorer("embeddings", EmbeddingScorer)
register_scorer("joint", JointScorer)
register_scorer("text", TextScorer)


def scorer_class(spec):
    """The PairScorer class for a model spec, by its family's scorer (lgip.models.families): a kind named
    in SCORERS, or the class itself. A spec of no known type: a dual encoder's (its type's error comes
    where the model is loaded)."""
    kind = known_family(spec)
    named = kind.scorer if kind is not None else "embeddings"
    if isinstance(named, type):
        return named
    if named not in SCORERS:
        raise ValueError(f"family {kind.type!r}: unknown scorer {named!r}; valid: {', '.join(SCORERS)}")
    return SCORERS[named]


def scorer_for(spec):
    """A PairScorer for a model spec (scorer_class's)."""
    return scorer_class(spec)()


def gives(spec, what):
    """True when a spec's scorer gives every one of `what` (PROVIDES), known before any model loads."""
    return all(n in scorer_class(spec).provides for n in what)


def leave_out(models, needs, script):
    """The models of MODELS whose scorer gives what the step needs (LGIP_SPEC.md 13: a model without
    embeddings is left out of retrieval, word attribution and the image side's galleries), a line said
    for each one left out. A step left with none says so in a line of its own (the caller then writes
    nothing and exits 0)."""
    kept = []
    for spec in models:
        cls = scorer_class(spec) if isinstance(spec, dict) else None
        missing = [n for n in needs if cls is not None and n not in cls.provides]
        if missing:
            print(
                f"{script}: model {spec.get('name')!r} (type {spec.get('type')!r}) is left out: {cls.gives_words} "
                f"no {', '.join(missing)}, which this step needs",
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
