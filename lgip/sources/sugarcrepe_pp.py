"""lgip.sources.sugarcrepe_pp: SugarCrepe++ (Sri-Harsha/scpp, data CC BY 4.0; images: COCO val2017),
LGIP_SPEC.md section 10. Five files, read in this order, each a JSON list of {"id", "filename",
"caption", "caption2", "negative_caption"}. Each item is its own caption slot (the same caption
text may fill several slots of a record): `orig_captions` gets `caption`, `same_caps[i]` =
[`caption2`], `diff_caps[i]` = `diff_caps_<type>[i]` = [`negative_caption`]. Its ITT accuracy is
`robust_pos_rate`, its TOT accuracy `text_only_rate` (lgip.controls).

    >>> items = list(read("data/scpp/data"))  # Item(type="replace_att", own_slot=True, paraphrases=[caption2], ...)
"""

from .base import Item, read_source_json, text_field

FILES = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
URL = "https://github.com/Sri-Harsha/scpp (data/)"


def read(folder):
    for stem in FILES:
        data, path = read_source_json(folder, stem + ".json", list)
        for k, item in enumerate(data):
            where = f"{path}: item {k}" + (
                f" (id {item.get('id')!r})" if isinstance(item, dict) and "id" in item else ""
            )
            yield Item(
                stem,
                text_field(item, "filename", where),
                text_field(item, "caption", where),
                negatives=[text_field(item, "negative_caption", where)],
                paraphrases=[text_field(item, "caption2", where)],
                where=where,
                own_slot=True,
            )
