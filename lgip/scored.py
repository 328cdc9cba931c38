"""lgip.scored: the seam's types (lgip.scorer): `PairScorer`, what scores the pairs of one model on this
process, and `Scored`, what it gives back; `PROVIDES`, what a scorer can give beyond its scores. Its two
implementations: lgip.scorer.EmbeddingScorer (a dual encoder) and lgip.joint_scorer.JointScorer (a model
that reads a pair jointly, LGIP_SPEC.md 13).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

PROVIDES = ("scores", "prior", "text_cos", "embeddings")


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
    resumed: Optional[dict] = None  # {"texts": [from the cache, in all], "images": [...]}; None without a cache
    scoring_started: float = 0.0  # time.perf_counter() when the scoring itself began (its phase in the run block)
    prior_images: Any = None  # the other images each text's prior score is a mean over: "all" (dual encoders), an int
    # (a joint scorer's PRIOR_IMAGES, at most N - 1), None when no prior was asked for (LGIP_SPEC.md 13)
    relative: Optional[list] = None  # the relative invariance error's denominator terms as [(record, caption,
    # "own"|"other", score)] (lgip.controls.relative_terms); [] when there are none; None when not computed


class PairScorer(ABC):
    """What scores the pairs of one model: `score(run, pairs_list, ...) -> Scored` for this process's
    records. `provides` (a class attribute: known before any model loads) names what its Scored can
    hold beyond the scores (PROVIDES)."""

    provides = frozenset({"scores"})

    @abstractmethod
    def score(
        self, run, pairs_list, text_cos=False, keep_embeddings=False, controls=False, hard_positives=(), relative=False
    ):
        """Score each Pairs of `pairs_list` over `run`'s records on this process (lgip.evaluation.ModelRun:
        its records, text bank, cache, config); text_cos, keep_embeddings, controls, hard_positives and
        relative as ModelRun.score says. Returns this process's Scored (ModelRun.score gathers them)."""
