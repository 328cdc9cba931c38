"""lgip.models.hub: where a model's files come from (a local path, the Hugging Face cache, the Hub),
found out before a model loads, so that a missing model or an unreachable Hub stops a run at once
with one message, not after minutes of download retries (huggingface_hub retries each file five
times, ~25 s, and open_clip asks for two files per model).

The Hub is asked once per process, with a short timeout; when it cannot be reached, or
HF_HUB_OFFLINE=1 is set, the libraries are put in offline mode, so cached models load from the
cache without a request. `check_models` tells, before a run's first model, every model of the
run that cannot load.

    >>> problems = check_models(MODELS)   # {model name: what is wrong and what to do}
    >>> print("\n".join(describe(problems)))   # the same, advice that holds for several models said once
    >>> check_model(spec)                 # raises ModelError for one model
"""

import os
import sys
import time

from ..errors import ModelError
from .families import family


PROBE_TIMEOUT_S = 4.0  # seconds the Hub has to answer one request before it counts as unreachable
_HUB = {}  # "reachable": (bool, why) once asked, for the process


def endpoint():
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _env_offline():
    return os.environ.get("HF_HUB_OFFLINE", os.environ.get("TRANSFORMERS_OFFLINE", "")).strip().lower() in (
        "1",
        "on",
        "yes",
        "true",
    )


def go_offline():
    """Offline mode for huggingface_hub and transformers, imported or not: cached files are then
    used without a request, a missing one fails at once."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True
        http = sys.modules.get("huggingface_hub.utils._http")
        if http is not None and hasattr(http, "reset_sessions"):
            http.reset_sessions()  # (its sessions were made for online mode)
    hub_utils = sys.modules.get("transformers.utils.hub")
    if hub_utils is not None and hasattr(hub_utils, "_is_offline_mode"):
        hub_utils._is_offline_mode = True


def hub_status():
    """(reachable, why): HF_HUB_OFFLINE=1, or one HEAD request to the endpoint (any HTTP answer
    counts as reachable; proxies from the environment are used). Asked once per process; an
    unreachable Hub puts the libraries in offline mode."""
    if "reachable" not in _HUB:
        if _env_offline():
            _HUB["reachable"] = (False, "HF_HUB_OFFLINE=1 is set")
        else:
            import urllib.error
            import urllib.request

            t0 = time.perf_counter()
            try:
                urllib.request.urlopen(
                    urllib.request.Request(endpoint(), method="HEAD"), timeout=PROBE_TIMEOUT_S
                ).close()
                _HUB["reachable"] = (True, "")
            except urllib.error.HTTPError:  # it answered
                _HUB["reachable"] = (True, "")
            except Exception as e:  # refused, no route, no DNS, timed out
                reason = getattr(e, "reason", e)
                _HUB["reachable"] = (
                    False,
                    f"{endpoint()} cannot be reached ({type(reason).__name__}: {reason}; "
                    f"{time.perf_counter() - t0:.1f} s)",
                )
        if not _HUB["reachable"][0]:
            go_offline()
    return _HUB["reachable"]


def _cached(repo_id, filenames):
    """The first of filenames that the local Hugging Face cache holds for repo_id, or None."""
    from huggingface_hub import try_to_load_from_cache

    for name in filenames:
        path = try_to_load_from_cache(repo_id, name)
        if isinstance(path, str) and os.path.exists(path):
            return path
    return None


# open_clip's catalogue for the published models' tags, as hub_files reads it from open_clip 3.3.0 (taken
# from there and checked against it by tests/test_any_model.py): a plan (run_all's check before any step, a
# dry run) knows their files without importing open_clip, seconds of CPU; another version is asked itself
CATALOGUE_VERSION = "3.3.0"
_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
CATALOGUE = {
    ("ViT-B-16", "openai"): [("timm/vit_base_patch16_clip_224.openai", _FILES)],
    ("ViT-L-14", "openai"): [("timm/vit_large_patch14_clip_224.openai", _FILES)],
    ("ViT-L-14", "laion2b_s32b_b82k"): [("laion/CLIP-ViT-L-14-laion2B-s32B-b82K", _FILES)],
    ("ViT-H-14", "laion2b_s32b_b79k"): [("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", _FILES)],
    ("EVA02-L-14", "merged2b_s4b_b131k"): [("timm/eva02_large_patch14_clip_224.merged2b_s4b_b131k", _FILES)],
}


def _open_clip_version():
    from importlib import metadata

    try:
        return metadata.version("open_clip_torch")
    except metadata.PackageNotFoundError:
        return None


def hub_files(spec):
    """[(repo id, [file names, any one will do])] that a model spec needs from the Hub; [] when
    it needs none (local folders and files, random init, a loader of one's own, which fetches what it
    needs); None when it downloads from elsewhere (an open_clip tag hosted at a plain URL). Its family's
    record says (lgip.models.families: model_id_files, openclip_files)."""
    return family(spec).hub_files(spec)


LOCAL = (".", "/", "~")  # how a path begins, where a Hub id cannot
HUB_PREFIX = "hf-hub:"  # an open_clip "model_name" of a Hub repository; a "pretrained" of a file in one


def hub_file(pretrained):
    """(repo id, file name) of an open_clip "pretrained" naming a file in a Hub repository ("hf-hub:org/repo/file":
    a fine-tune's checkpoint that is not an open_clip model folder), else None.
    >>> hub_file("hf-hub:ytaek-oh/fsc-clip/coco_fsc-clip-ViT-B-32.pt")
    ('ytaek-oh/fsc-clip', 'coco_fsc-clip-ViT-B-32.pt')
    """
    if not isinstance(pretrained, str) or not pretrained.startswith(HUB_PREFIX):
        return None
    parts = pretrained[len(HUB_PREFIX) :].split("/")
    if len(parts) < 3 or not all(parts):
        return None
    return "/".join(parts[:2]), "/".join(parts[2:])


def local_file(pretrained):
    """The local path of an open_clip "pretrained" weights file: an "hf-hub:org/repo/file" from the Hugging Face
    cache (downloaded when the Hub can be reached; offline, the cached copy), anything else as given."""
    where = hub_file(pretrained)
    if where is None:
        return pretrained
    from huggingface_hub import hf_hub_download

    hub_status()  # (an unreachable Hub: offline mode, the cached copy used without a request)
    return hf_hub_download(*where)


def model_id_files(spec):
    """A transformers model's files: its config and its weights (one of their names), unless its model_id is a
    local folder or path."""
    model_id = str(spec.get("model_id", ""))
    if os.path.isdir(model_id) or model_id.startswith(LOCAL):
        return []
    weights = ["model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json"]
    return [(model_id, ["config.json"]), (model_id, weights)]


def model_id_paths(spec):
    """[("model_id", path)] for a model_id that is a local path (it begins as a path does, or is a folder)."""
    model_id = spec.get("model_id")
    return [("model_id", model_id)] if isinstance(model_id, str) and model_id.startswith(LOCAL) else []


def openclip_paths(spec):
    """The local paths of an open_clip spec: a local-dir: folder, a checkpoint file as "pretrained"."""
    name, pretrained = spec.get("model_name"), spec.get("pretrained")
    paths = (
        [("model_name", name[len("local-dir:") :])] if isinstance(name, str) and name.startswith("local-dir:") else []
    )
    checkpoint = (".bin", ".pt", ".pth", ".safetensors", ".ckpt")
    if (
        isinstance(pretrained, str)
        and not pretrained.startswith(HUB_PREFIX)
        and (pretrained.startswith(LOCAL) or "/" in pretrained or pretrained.endswith(checkpoint))
    ):
        paths.append(("pretrained", pretrained))
    return paths


def openclip_files(spec):
    """An open_clip model's files: an hf-hub: repository's config and weights, a file in a Hub repository as
    "pretrained" ("hf-hub:org/repo/file", lgip.models.checkpoints), a tag's file as open_clip's catalogue hosts it
    (CATALOGUE for the published tags), none for a local folder, a file or random init."""
    name, pretrained = str(spec.get("model_name", "")), spec.get("pretrained")
    weights = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    if hub_file(pretrained) is not None and not name.startswith("local-dir:"):
        repo, filename = hub_file(pretrained)
        return [(repo, [filename])]
    if name.startswith("hf-hub:"):
        repo = name[len("hf-hub:") :]
        return [(repo, ["open_clip_config.json"]), (repo, weights)]
    if name.startswith("local-dir:") or not pretrained or os.path.isfile(str(pretrained)):
        return []
    if (name, pretrained) in CATALOGUE and _open_clip_version() == CATALOGUE_VERSION:
        return [(repo, list(files)) for repo, files in CATALOGUE[(name, pretrained)]]
    import open_clip
    from open_clip import pretrained as catalogue

    hf = (open_clip.get_pretrained_cfg(name, pretrained) or {}).get("hf_hub", "")
    if not hf:
        return None
    repo, filename = os.path.split(hf)  # "org/repo/" (the default file) or "org/repo/file", as open_clip reads it
    filename = filename or "open_clip_pytorch_model.bin"
    safe = list(getattr(catalogue, "_get_safe_alternatives", lambda f: [])(filename))  # tried first by open_clip
    return [(repo, safe + [filename])]


def _cache_dir():
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def local_copy_hint(spec):
    """How to point a spec at a local copy of its files (a Hub id: a folder; open_clip: a checkpoint file)."""
    if "model_id" in spec:
        return '"model_id": "/path/to/folder" (a folder saved with save_pretrained, or a Hub snapshot)'
    return '"pretrained": "/path/to/open_clip_pytorch_model.bin", or "model_name": "local-dir:/path/to/folder"'


class Unreachable(str):
    """A problem message of a model whose files are not cached while the Hub cannot be reached: its
    advice is the same for every such model, so a run says it once (`advice`)."""

    repos = ()
    why = ""


def problem(spec):
    """What keeps a model spec from loading, as one message; None when nothing is known to. A model
    not in the cache while the Hub cannot be reached gives an `Unreachable` message (the model, its
    repos, and the advice). A local path the spec names that does not exist is said first, as such."""
    for field, path in family(spec).local_paths(spec):
        if not os.path.exists(os.path.expanduser(path)):
            hub = "; a Hub id is written without a leading '.', '/' or '~'" if field == "model_id" else ""
            return f"model {spec.get('name')!r}: its {field} {path} does not exist (a local path: check it{hub})"
    files = hub_files(spec)
    if not files:
        return None
    reachable, why = hub_status()  # (asked even when all is cached: an unreachable Hub turns the libraries offline)
    missing = [(repo, names) for repo, names in files if _cached(repo, names) is None]
    if not missing:
        return None
    repos = sorted({repo for repo, _ in missing})
    if reachable:
        from huggingface_hub import file_exists

        for repo, names in missing:
            try:
                if not any(file_exists(repo, n) for n in names):
                    return (
                        f"model {spec.get('name')!r}: {repo} has none of {', '.join(names)} on the Hub ({endpoint()}); "
                        f"check the spec's name, or point it at a local copy: {local_copy_hint(spec)}"
                    )
            except Exception as e:  # a gated or private repo, a flaky network: the load says more
                return (
                    None
                    if "401" not in str(e) and "403" not in str(e)
                    else (f"model {spec.get('name')!r}: {repo} needs a Hugging Face login (huggingface-cli login): {e}")
                )
        return None
    out = Unreachable(
        f"model {spec.get('name')!r}: {', '.join(repos)} is not in the local Hugging Face cache "
        f"({_cache_dir()}) and {why}. " + advice(repos, [spec])
    )
    out.repos, out.why, out.spec = repos, why, spec
    return out


def advice(repos, specs):
    """What to do about models whose files are not cached while the Hub cannot be reached."""
    hints = sorted({local_copy_hint(s) for s in specs})
    return (
        f"Download {'it' if len(repos) == 1 else 'them'} once where there is network "
        f"(`huggingface-cli download {repos[0]}`{', ...' if len(repos) > 1 else ''}), then copy the cache here "
        f"(HF_HUB_OFFLINE=1 uses it), or point the spec at a local copy: {' / '.join(hints)}"
    )


def check_model(spec):
    """Raise ModelError naming the model and what to do when its files cannot be had."""
    message = problem(spec)
    if message is not None:
        raise ModelError(message)


def check_models(specs):
    """{model name: message} of every model of a run whose files cannot be had; printed up
    front, before the run's first model does any work."""
    return {spec.get("name"): msg for spec in specs if isinstance(spec, dict) for msg in [problem(spec)] if msg}


def describe(problems):
    """The problems of check_models as lines, the advice for unreachable models said once: the
    models listed with their repos, then why and what to do."""
    far = [m for m in problems.values() if isinstance(m, Unreachable)]
    lines = [m for m in problems.values() if not isinstance(m, Unreachable)]
    if far:
        repos = sorted({r for m in far for r in m.repos})
        lines += [f"model {m.spec.get('name')!r} needs {', '.join(m.repos)}" for m in far]
        lines.append(
            f"{'it is' if len(repos) == 1 else 'they are'} not in the local Hugging Face cache "
            f"({_cache_dir()}), and {far[0].why}."
        )
        lines.append(advice(repos, [m.spec for m in far]))
    return lines


def require_models(specs):
    """Stop (ModelError) naming every model of a run whose files cannot be had, before any work."""
    problems = check_models(specs)
    if problems:
        raise ModelError(
            f"{len(problems)} of {len(specs)} models cannot be loaded, so nothing was run:\n  "
            + "\n  ".join(describe(problems))
        )
