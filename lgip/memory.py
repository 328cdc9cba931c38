"""lgip.memory: what one process keeps between a run's models and between a script's calls, in one object
(`KEPT`), so that a fresh process's state is one value (`Kept()`) and a script's call from Python runs in it
(lgip.entry, with `swap`). Each field names the module that fills it; none is a result: each is work (or a
folder, or a warning said once) a later model or call of the same process reuses."""

from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional


@dataclass
class Kept:
    output_dir: Optional[str] = None  # the OUTPUT_DIR in force (lgip.filenames); None: outputs beside the input
    calls: Optional[tuple] = None  # ((build, records, rank, world), RunCalls): the next model adopts them
    #   (lgip.evaluation.ModelRun.pairs)
    plan: Optional[tuple] = None  # ((token table, rows digest, size, packs per batch), PrefixPacks): the next model
    #   of a family reuses it (lgip.texts)
    score_layout: Optional[tuple] = None  # ((objects, values), layout): the last score file's text less its
    #   numbers, for the run's next model (lgip.scorefile; ~0.4 GB at 40,000 images)
    pixels: Any = None  # the PixelMemory: decoded pixels kept for later models (lgip.pixel_memory)
    token_tables: dict = field(default_factory=dict)  # key -> TokenTable shared by models that tokenize alike
    #   (lgip.tokens)
    unwritable: dict = field(default_factory=dict)  # cache root -> why it cannot be written: said once (lgip.cache)
    warned: set = field(default_factory=set)  # specs whose activation cannot be told: warned once
    #   (lgip.models.checkpoints)


KEPT = Kept()


def swap(new=None):
    """KEPT's fields taken out (returned, as a Kept) and replaced by `new`'s (None: a fresh process's)."""
    old = replace(KEPT)
    new = new if new is not None else Kept()
    for f in fields(Kept):
        setattr(KEPT, f.name, getattr(new, f.name))
    return old


def forget_work():
    """Drop the shared token tables, the last prefix plan, the last run's calls and score-file layout (a fresh
    process's: bench.py times tokenizing and building the pairs too); the output folder and pixels stay."""
    KEPT.token_tables, KEPT.plan, KEPT.calls, KEPT.score_layout = {}, None, None, None
