"""lgip.sources: other benchmarks read as LGIP records (LGIP_SPEC.md section 10), for import_benchmark.py.
One module per source's format, each a `read(folder)` yielding lgip.sources.base.Item; the registry
below names them. The next benchmark is one module and one line here.

    >>> records, missing = build_records(SOURCES["sugarcrepe"].read("data/sugar-crepe"), ImageFinder(dirs), out_dir)
"""

from . import rococo, sugarcrepe, sugarcrepe_pp
from .base import ImageFinder, Item, build_records, coco_id

SOURCES = {"sugarcrepe": sugarcrepe, "sugarcrepe++": sugarcrepe_pp, "rococo": rococo}  # SOURCE -> its module

__all__ = ["ImageFinder", "Item", "SOURCES", "build_records", "coco_id"]
