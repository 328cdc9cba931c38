"""lgip.models.families: one record per model family (a spec's "type"), everything the rest of lgip asks of
a type: the keys its spec takes, its loader, what it can do without weights (its tokenizer and pixels ahead,
its cache keys), how it scores a pair, what its card says, which Hub files it needs. A family's module
registers its record when it is imported (lgip.models.registry imports them all), so a new type is one
module and one record, and nothing outside the family modules asks which type a spec is.

    register(Family("mine", required="loader", load=load_mine))   # in the family's own module
    family({"name": "m", "type": "mine", "loader": ...}).load(spec, protocol, device, dtype)
"""

from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import ModelError

SPEC_COMMON = ("name", "type", "card", "demo")  # every type's: its name, type, own card fields, demo marker


def _nothing(spec):
    return []


def _cosine(spec):
    return "cosine"


def _said(spec):
    return {}


def _fine(spec):
    return None


def _no(spec):
    return False


def _other(model_family):
    return "other"


@dataclass(frozen=True)
class Family:
    """A model type. Functions take the spec (and the protocol, device, dtype where said):
    load: (spec, protocol, device, dtype) -> an Encoder (lgip.models.encoder), or a JointModel for scorer "joint";
    prepare: (spec, protocol) -> Prepared (its tokenizer and pixels, no weights: the lookahead's), or None;
    keys: (spec, protocol) -> a KeyEncoder making its cache keys without weights, or None;
    cache_files: spec -> the files beyond its checkpoint whose size and mtime its cache's identity covers;
    scorer: its scorer kind (lgip.scorers.SCORERS: "embeddings", image and text embedded apart and scored by
      cosine; "joint", one model scores a pair, LGIP_SPEC.md 13), or a PairScorer class of its own;
    score_kind: spec -> what its score is (LGIP_SPEC.md 13: "cosine" for a dual encoder);
    hub_files: spec -> [(repo id, [file names, any one will do])] it needs from the Hub, [] for none, None
      when it downloads from elsewhere (lgip.models.hub);
    named: spec -> the card's fields the spec alone tells (pretrained, architecture, ...: LGIP_SPEC.md 12);
    card: (spec, model or None, Encoder or None) -> the card's fields counted on the model (built without
      weights where the family can), {} when nothing can be told;
    check: spec -> None, or ModelError naming what of its type's own settings is not valid (no file read);
    local_paths: spec -> [(field, path)] the spec names on this machine (checked to exist before any work);
    random_init: spec -> a warning when the spec builds a model with random weights, else None;
    trainable: (spec, device) -> a lgip.models.trainable.Trainable (fine-tuning, LGIP_SPEC.md 14), or None when
      the type cannot be fine-tuned;
    saved_spec: (start spec, run name, folder) -> the MODELS spec of a fine-tuned copy saved in `folder` (known
      before it is trained: run_all plans the probe of the arms with it);
    in_memory: spec -> True when the spec holds its model in memory (nothing on disk names its weights: never
      cached);
    accelerations: the switches (lgip.accelerations) that can act on what its models compute and cache: those of
      them on and not bit-exact at a run's dtype are part of its cache's identity (lgip.cache);
    code_version: lgip's version of this family's encoding or scoring code, part of its cache's identity: bump it
      with any change to what its texts, images or pairs give (a cache written before is then never read);
    about: what the type loads, in a few words (--help and errors list the types from the records);
    label: the run block's model `family` (a transformers config's model_type, or None) -> how a figure's legend
      names the model's kind (its marker's group, lgip.report.plots)."""

    type: str
    required: str  # the field a spec of the type must have
    load: Callable
    options: tuple = ()  # the fields it may have besides its required one and SPEC_COMMON's
    prepare: Optional[Callable] = None
    keys: Optional[Callable] = None
    cache_files: Optional[Callable] = None
    scorer: object = "embeddings"  # a kind's name, or a PairScorer class
    score_kind: Callable = _cosine
    hub_files: Callable = _nothing
    named: Callable = _said
    card: Optional[Callable] = None
    check: Callable = _fine
    local_paths: Callable = _nothing
    random_init: Callable = _fine
    trainable: Optional[Callable] = None
    saved_spec: Optional[Callable] = None
    in_memory: Callable = _no
    accelerations: tuple = ()
    code_version: int = 1
    about: str = ""
    label: Callable = _other

    def spec_keys(self):
        """The keys a spec of the type may have, in the order an error lists them."""
        return SPEC_COMMON[:2] + (self.required,) + self.options + SPEC_COMMON[2:]


FAMILIES = {}  # type -> Family, in the order the family modules registered them


def register(record):
    """Add a family's record (a family module calls it once, when imported); returns it."""
    if not isinstance(record, Family):
        raise TypeError(f"register takes a Family, got {type(record).__name__}")
    if not isinstance(record.scorer, (str, type)):
        raise TypeError(f"family {record.type!r}: scorer is a scorer kind's name or a PairScorer class")
    FAMILIES[record.type] = record
    return record


def describe_types(sep="\n"):
    """Every registered type with the keys its spec takes beyond "name" and "type", and what it loads: what --help
    and a spec's error say (made from the records, so a new family is listed with nothing else written)."""
    return sep.join(
        f"{t} {{{', '.join(repr(k) for k in f.spec_keys()[2:] if k not in SPEC_COMMON)}}}"
        + (f": {f.about}" if f.about else "")
        for t, f in FAMILIES.items()
    )


def known_family(spec):
    """The record of a spec's type, or None for a spec of no known type (a check elsewhere names it)."""
    return FAMILIES.get(spec.get("type")) if isinstance(spec, dict) else None


def family(spec):
    """The record of a spec's type (a dict's "type", or the type itself); an unknown type is an error
    naming the valid ones."""
    kind = spec.get("type") if isinstance(spec, dict) else spec
    if kind not in FAMILIES:
        name = f"model {spec.get('name')!r}: " if isinstance(spec, dict) and "name" in spec else ""
        raise ModelError(f"{name}unknown type {kind!r}; valid: {', '.join(FAMILIES)}")
    return FAMILIES[kind]
