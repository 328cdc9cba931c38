"""lgip.models.zoo: many models in one setting (LGIP_SPEC.md section 12): a MODELS entry
{"type": "openclip_zoo", "match": A, "tags": T} stands for every (architecture, tag) pair of
open_clip.list_pretrained() whose architecture matches A and tag matches T (fnmatch, case-sensitive),
and SHARD picks every n-th model of the expanded list for one job of a cluster's array.

    >>> [m["name"] for m in expand_zoo({"type": "openclip_zoo", "match": "ViT-B-16", "tags": "laion*"})]
    ['ViT-B-16__laion400m_e31', 'ViT-B-16__laion400m_e32', 'ViT-B-16__laion2b_s34b_b88k']
    >>> shard(list("abcdefg"), "1/3")
    ['b', 'e']
"""

import fnmatch
import os
import re

from ..errors import ConfigError, ModelError
from .encoder import check_keys

ZOO_TYPE = "openclip_zoo"
ZOO_SPEC_TYPE = "openclip"  # the type of the specs a zoo entry stands for
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@-]")


def is_zoo(spec):
    return isinstance(spec, dict) and spec.get("type") == ZOO_TYPE


def expand_zoo(spec):
    """The openclip specs of one zoo entry, in list_pretrained()'s order, each named
    `<architecture>__<tag>` (made file-safe); ModelError naming the pattern when nothing matches."""
    import open_clip

    check_keys(spec, ("type", "match", "tags", "card"), f"an {ZOO_TYPE} entry")
    match, tags = spec.get("match"), spec.get("tags", "*")
    if not isinstance(match, str) or not match or not isinstance(tags, str) or not tags:
        raise ModelError(
            f'a {ZOO_TYPE} entry needs "match" (a pattern of open_clip architectures, e.g. "ViT-B-*") '
            f'and may have "tags" (a pattern of pretrained tags, default "*"), got {spec!r}'
        )
    pairs = open_clip.list_pretrained()
    out = [
        {"name": _UNSAFE.sub("_", f"{arch}__{tag}"), "type": ZOO_SPEC_TYPE, "model_name": arch, "pretrained": tag}
        for arch, tag in pairs
        if fnmatch.fnmatchcase(arch, match) and fnmatch.fnmatchcase(tag, tags)
    ]
    if not out:
        archs = list(dict.fromkeys(a for a, _ in pairs))
        near = [a for a in archs if fnmatch.fnmatchcase(a.lower(), match.lower())] or archs[:8]
        raise ModelError(
            f"{ZOO_TYPE}: no pretrained open_clip model matches architecture {match!r} with tags {tags!r} "
            f"(case-sensitive fnmatch patterns); architectures such as: {', '.join(near[:8])} "
            f"(all {len(archs)}: open_clip.list_pretrained())"
        )
    for m in out:  # (a card the entry gives holds for each of its models)
        if isinstance(spec.get("card"), dict):
            m["card"] = dict(spec["card"])
    return out


def shard_of(value, environ=None):
    """(i, n) of a SHARD setting: None -> None; "i/n" (0 <= i < n); "slurm": i from
    SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, n from SLURM_ARRAY_TASK_COUNT."""
    environ = os.environ if environ is None else environ
    if value is None:
        return None
    if value == "slurm":
        names = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT")
        missing = [n for n in names if not str(environ.get(n, "")).strip().lstrip("-").isdigit()]
        if missing:
            raise ConfigError(
                f'SHARD is "slurm" but {", ".join(missing)} {"is" if len(missing) == 1 else "are"} not set '
                f'(run it as a job array: sbatch --array=0-7 ...), or give SHARD as "i/n"'
            )
        i = int(environ["SLURM_ARRAY_TASK_ID"]) - int(environ["SLURM_ARRAY_TASK_MIN"])
        n = int(environ["SLURM_ARRAY_TASK_COUNT"])
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(value))
        if not m:
            raise ConfigError(
                f'SHARD must be None, "i/n" (0 <= i < n: this job runs models i, i + n, ...) or "slurm", got {value!r}'
            )
        i, n = int(m.group(1)), int(m.group(2))
    if not 0 <= i < n:
        raise ConfigError(f"SHARD {value!r}: shard {i} of {n} is not one of 0..{n - 1}")
    return i, n


def shard(models, value, environ=None):
    """The models of this shard: positions i, i + n, i + 2n, ... of the expanded list."""
    got = shard_of(value, environ)
    return list(models) if got is None else list(models)[got[0] :: got[1]]
