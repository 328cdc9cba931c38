"""lgip.sources.sugarcrepe: SugarCrepe (RAIVNLab/sugar-crepe, MIT; images: COCO val2017), LGIP_SPEC.md
section 10. Seven files, read in this order, each a JSON object {"<id>": {"filename", "caption",
"negative_caption"}} in id order as written; the type is the file's stem. Each item is one
(caption, negative) pair, kept twice if written twice, so a type's pair count is its item count
and its positive rate is SugarCrepe's accuracy (strict sim(image, caption) > sim(image, negative)).

    >>> items = list(read("data/sugar-crepe"))      # Item(type="add_att", image="000000331352.jpg", ...)
"""

from .base import Item, read_source_json, text_field

FILES = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
URL = "https://github.com/RAIVNLab/sugar-crepe (data/)"


def read(folder):
    for stem in FILES:
        data, path = read_source_json(folder, stem + ".json", dict)
        for key, item in data.items():
            where = f"{path}: item {key!r}"
            yield Item(
                stem,
                text_field(item, "filename", where),
                text_field(item, "caption", where),
                negatives=[text_field(item, "negative_caption", where)],
                where=where,
            )
