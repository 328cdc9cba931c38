"""lgip.scorers.base: the seam's types. `PairScorer`, what scores the pairs of one model on this process;
`ScoreRequest`, what it is asked (plain data: the Pairs and the extras wanted; `ExplainRequest`, flips whose
words it blames); `Context`, what it works
with (the records, the text bank, the cache, the workers, a way to load the weights); `Scored`, what it
gives back, its timings included (a scorer never writes into the run); `ImageScores`, what scoring
altered images gives (LGIP_SPEC.md 11); `ClassRequest` (its `ClassTask`s) and `ClassScores`, images classified
by class names (LGIP_SPEC.md 16). `PROVIDES` names what a scorer can give beyond its scores.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

# what a scorer can give, each a step's need (lgip.scorers.leave_out: a model whose scorer lacks one is left out):
#   scores          the pairs' scores (every scorer)
#   images          its scores read the image (not a blind model: LGIP_SPEC.md 15; its card may count no image tower)
#   pair_scores     a score for any (image, text) it is handed, not only a record's own pairs
#   prior           each pair's mean score with the other images (LGIP_SPEC.md 9, 13)
#   text_cos        each pair's caption-text cosine (needs text embeddings)
#   embeddings      image and text embeddings apart (retrieval's galleries, the image side's search)
#   altered_images  altered images scored with their captions (run_lgip_images.py: score_images)
#   attributions    the words a model blames for a flip (explain_flips.py: explain)
#   class_scores    a score per class name for any image (LGIP_SPEC.md 16, run_lgip_classification.py: score_classes)
PROVIDES = (
    "scores",
    "images",
    "pair_scores",
    "prior",
    "text_cos",
    "embeddings",
    "altered_images",
    "attributions",
    "class_scores",
)


@dataclass
class ScoreRequest:
    """What one model is asked to score on this process: plain data, made by lgip.evaluation.ModelRun.score."""

    pairs: list  # the Pairs to score (lgip.scoring), each over the context's records
    text_cos: bool = False  # each pair's caption-text cosine (needs text embeddings)
    keep_embeddings: bool = False  # the text table and slot -> row map kept in the Scored (text_embeddings)
    controls: bool = False  # each pair's mean score with the other images (LGIP_SPEC.md 9; 13: PRIOR_IMAGES)
    hard_positives: tuple = ()  # (flips, paraphrases) positions in `pairs`: flips marked as section 10 says
    relative: bool = False  # the relative invariance error's denominator terms (LGIP_SPEC.md 13)


@dataclass
class ImageRequest:
    """Altered images to score (LGIP_SPEC.md 11): `items` (lgip.alterations.AlteredImage, each once) and,
    for each, the captions it is scored with."""

    items: list
    captions: list  # [[caption text, ...] per item]


@dataclass
class ExplainRequest:
    """Flips whose words a model is asked to blame (LGIP_SPEC.md 8: explain_flips.py): the input's `records`, its
    `flips` (lgip.explain.all_flips), the indices of those drawn (`sample`), and the settings it runs under
    (`settings`: explain_flips.py's constants)."""

    records: list
    flips: list
    sample: set
    settings: dict


@dataclass
class ClassTask:
    """One set of images to classify (LGIP_SPEC.md 16): `images` (this process's: an image file's path, or an item
    that makes its own image and cache key, lgip.classification.datasets), the class names and the templates (each
    with `{c}`) a dual encoder's class weights average over."""

    images: list
    classnames: list
    templates: list


@dataclass
class ClassRequest:
    """What one model is asked to classify on this process: plain data, made by run_lgip_classification.py's loop
    (lgip.classification.run). `generative_templates`: the templates a joint scorer's class score averages its
    pair scores over (GENERATIVE_TEMPLATES); a dual encoder uses each task's own."""

    tasks: list  # [ClassTask]
    generative_templates: list = field(default_factory=lambda: ["a photo of a {c}."])


@dataclass
class ClassScores:
    """What classifying gave, per task of the request, on this process (LGIP_SPEC.md 16): `z` the class scores
    [images, classes] float64 (rows of the images not read NaN), `cos` the cosines [images, classes] (a dual encoder;
    None for a joint scorer: MCM needs them), `failed` {image index: why it was not read}; `logit_scale` the model's
    own s (exp of its logit_scale as loaded; 1.0 when it has none; None for a joint scorer); `scale_said` why s is 1
    (None otherwise); the counts and timings as a Scored's."""

    z: list
    cos: list
    failed: list
    logit_scale: Optional[float]
    scale_said: Optional[str] = None
    texts: dict = field(default_factory=dict)  # {"unique", "encoded"} (a joint scorer: image-text scores)
    image_sources: dict = field(default_factory=dict)
    looked: dict = field(default_factory=dict)
    resumed: Optional[dict] = None
    seconds: dict = field(default_factory=dict)
    ahead: Any = None


@dataclass
class Context:
    """What a scorer works with on this process besides its request (lgip.evaluation.ModelRun.context)."""

    records: list  # [(line, record)] of the input
    mine: Any  # this process's record indices (torchrun: every world-th)
    image_root: str
    bank: Any  # lgip.texts.TextBank: the texts by slot (bank.calls.texts), their encoding and cache lookups
    cache: Any  # lgip.cache.ModelCache, or NoCache (its interface, nothing in it): lgip.scorers.cached's
    lookahead: Any  # lgip.lookahead.Lookahead over the run's later models, or None
    world: int  # processes (torchrun)
    gather: Callable  # obj -> every process's, in rank order, on every process
    model: Callable  # () -> the model now (a key encoder until the weights are loaded)
    load_weights: Callable  # (unless_held=None) -> True when it loads the weights now (model() then gives them):
    # not when they are loaded, nor (lgip.scorers.cached) when the cache holds every entry {kind: keys} of unless_held
    image_batch_size: int = 64
    text_batch_size: Any = "auto"
    num_workers: Optional[int] = None
    pixel_memory_gb: Any = "auto"
    prior_images: int = 3  # a joint scorer's other images per text prior (LGIP_SPEC.md 13)

    @property
    def enc(self):
        return self.model()


@dataclass
class Scored:
    """What scoring one model's pairs gave (on rank 0, every process's merged: `merged`)."""

    pairs: list  # the Pairs given, each with base_sim, sim, labels (and what was asked: text_cos, prior_*, ...)
    ok: list  # this process's records whose image was read
    failed: list  # records whose image could not be read (merged: every process's, sorted)
    n_ok: int  # records read, every process
    n_samples: int  # records read that have a caption (the published count)
    image_report: dict  # {"num_failed_images", "failed_images": [{"line", "path", "error"}]}
    texts: dict  # {"unique": texts to score, "encoded": not from the cache, "positions": {"tokens", "computed"}}
    nonfinite: dict  # this process's scores or embeddings that are NaN or inf (lgip.evaluation checks them)
    provides: frozenset  # what this scorer gives (PROVIDES)
    image_sources: dict = field(default_factory=dict)  # unique images: decoded, from pixel memory, from the cache
    image_embeddings: Any = None  # [records, dim] by record index (this process's; rows of unread records NaN)
    text_embeddings: Optional[tuple] = None  # (table, slot -> row) when asked for (keep_embeddings)
    looked: dict = field(default_factory=dict)  # {"texts"|"images"|"pairs": unique entries this call looked for}
    resumed: Optional[dict] = None  # {"texts": [from the cache, looked for], ...} (lgip.scorers.cached); None: no cache
    scoring_started: float = 0.0  # time.perf_counter() when the scoring itself began (its phase in the run block)
    prior_images: Any = None  # the other images each text's prior score is a mean over: "all" (dual encoders), an int
    # (a joint scorer's PRIOR_IMAGES, at most N - 1), None when no prior was asked for (LGIP_SPEC.md 13)
    relative: Optional[list] = None  # the relative invariance error's denominator terms as [(record, caption,
    # "own"|"other", score)] (lgip.controls.relative_terms); [] when there are none; None when not computed
    seconds: dict = field(default_factory=dict)  # where the scoring's time went, by phase (the run block's)
    ahead: Any = None  # what the Lookahead did ahead for this model (None: no Lookahead)

    def gives(self, what):
        """True when this scorer gives `what` (PROVIDES)."""
        return what in self.provides


class ImageScores:
    """Altered images scored (PairScorer.score_images): `failed` {item index: why it was not made}, `sources`
    {"num", "decoded", "from_pixel_memory", "from_cache"}; `embeddings` the altered images' [items, D] when
    the scorer embeds them (a text-to-image gallery needs them), else None, and `no_gallery` then says why
    there is no search."""

    failed: dict
    sources: dict
    embeddings: Any = None
    no_gallery: Optional[str] = None

    def original(self, rec, cap, slot):
        """s(record's own image, its caption) for the captions at (rec, cap, slot) (numpy arrays)."""
        raise NotImplementedError

    def altered(self, item, rec, cap, slot):
        """s(altered image `item`, caption) for the captions at (rec, cap, slot) (numpy arrays)."""
        raise NotImplementedError


class PairScorer(ABC):
    """What scores the pairs of one model: `score(context, request) -> Scored` for this process's
    records. `provides` (a class attribute: known before any model loads) names what its Scored can
    hold beyond the scores (PROVIDES)."""

    provides = frozenset({"scores"})  # (a kind that reads images says so: "images", PROVIDES)
    gives_words = "its scorer gives"  # how a line says what it gives ("... gives no embeddings")

    @abstractmethod
    def score(self, ctx, request):
        """Score each Pairs of `request` (a ScoreRequest) over `ctx`'s records on this process (a Context).
        Returns this process's Scored (lgip.evaluation.ModelRun.score gathers them)."""

    def score_images(self, ctx, scored, request):
        """Score altered images (an ImageRequest) with their captions, beside `scored` (the same model's
        Scored of the captions with their originals: ScoreRequest.keep_embeddings). Returns an ImageScores."""
        raise NotImplementedError(f"{type(self).__name__} scores no altered images")

    def score_classes(self, ctx, request):
        """Class scores (a ClassRequest, LGIP_SPEC.md 16) of each task's images on this process. Returns a
        ClassScores. A scorer whose `provides` has no "class_scores" has none."""
        raise NotImplementedError(f"{type(self).__name__} gives no class scores")

    def explain(self, model, request):
        """Word attribution (an ExplainRequest) with `model` loaded in fp32: the model's metrics dict, the lines
        of its explain file in "_lines" for the caller to write (lgip.explain.explain_model). A scorer without
        text embeddings has none."""
        raise NotImplementedError(f"{type(self).__name__} gives no word attribution")

    def not_finite(self, images, texts):
        """The words of the error for non-finite outputs (lgip.evaluation: ModelRun's check)."""
        return f"{images} image and {texts} text embeddings are"


def for_gathering(scored):
    """A process's Scored as it travels to rank 0: its pairs as plain state, no embeddings."""
    return replace(scored, pairs=[p.state() for p in scored.pairs], image_embeddings=None, text_embeddings=None)


def merged(local, parts):
    """The Scored of every process (`parts`, for_gathering's, in rank order) as one, on rank 0: the
    pairs in record order, the counts summed, the failed records sorted, the first 20 unreadable images
    listed. What is this process's own stays `local`'s (its records read, its embeddings: a gallery
    gathers them itself, lgip.evaluation.ModelRun.gathered)."""
    from ..scoring import Pairs

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
