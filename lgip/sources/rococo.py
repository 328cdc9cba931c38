"""lgip.sources.rococo: RoCOCO's altered captions (pseulki/rococo, MIT; images: COCO val2014, the same
pictures as 2017 under other names), LGIP_SPEC.md section 10. Four files, each a JSON list of
{"image": "val2014/COCO_val2014_<id>.jpg", "caption": [n texts]}, n = 10 or 11: the first n - 5
texts are the original captions, text (n - 5) + k the altered version of original k (k = 0..4;
a sixth original has none), as RoCOCO's own loader reads them. The type is the file's stem.

    >>> items = list(read("data/rococo"))            # Item(type="same_concept", image="val2014/COCO_val2014_...", ...)
"""

from ..errors import InputError
from .base import Item, read_source_json, text_field

FILES = ("same_concept", "diff_concept", "rand_voca", "danger")
URL = "https://github.com/pseulki/rococo"


def read(folder):
    for stem in FILES:
        data, path = read_source_json(folder, stem + ".json", list)
        for k, entry in enumerate(data):
            where = f"{path}: item {k}"
            image = text_field(entry, "image", where)
            texts = text_field(entry, "caption", where, list)
            if len(texts) not in (10, 11):
                raise InputError(
                    f"{where}: field 'caption' must list 10 or 11 texts (the originals, then an altered "
                    f"version of each of the first 5), got {len(texts)}"
                )
            for j, t in enumerate(texts):
                if not isinstance(t, str) or not t.strip():
                    raise InputError(f"{where}: field 'caption' text {j} must be a non-empty string, got {t!r}"[:300])
            originals = len(texts) - 5
            for j in range(originals):  # (a sixth original, when there is one, has no altered version)
                altered = [texts[originals + j]] if j < 5 else []
                yield Item(stem, image, texts[j], negatives=altered, where=where)
