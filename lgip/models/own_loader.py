"""lgip.models.own_loader: a model of one's own (type "python"): a loader returning
`(model, preprocess, tokenizer)` in open_clip's convention (what `create_model_and_transforms`
and `get_tokenizer` give, CLIP_benchmark's convention too):
  model.encode_image(pixels [N, C, H, W]) -> [N, D];  model.encode_text(token ids [N, L]) -> [N, D]
  preprocess(PIL RGB image) -> tensor [C, H, W];      tokenizer(list of str) -> LongTensor [N, L]

The loader is "package.module:function" or "path/to/file.py:function", called as
`function(device=..., dtype=..., **kwargs)`; from Python it may also be the function itself, or the
triple itself (a model in memory, e.g. inside a training loop: it runs on its own device and dtype,
is put in eval mode for the run and handed back in the mode it came in; its embeddings are never
cached, since nothing on disk tells one epoch's weights from the next).

Texts are encoded as the tokenizer makes them (the plain path: a fixed-length tokenizer's rows are
batched as they are; a tokenizer that pads to its batch's longest is asked one text at a time, so
no text's ids depend on its neighbours). An exception in the user's code is reported as theirs
(ModelError naming the model, the loader and their traceback: exit status 2); a result of the
wrong type or shape is named.

    >>> enc = load_python({"name": "mine", "type": "python", "loader": "my_models.py:build",
    ...                    "kwargs": {"ckpt": "e3.pt"}}, "corrected", "cuda", torch.bfloat16)
"""

import importlib
import importlib.util
import os
import sys
import traceback

from .. import accelerations
from ..errors import ModelError
from .cards import loader_named, own_card
from .families import Family, register
from .encoder import Encoder, KeyEncoder, _normalise
from .openclip import is_openclip, openclip_encoder
from ..util import jsonable


TEXT_KEY_TAG = "py1|"  # the prefix of this family's text cache keys
_PROBE_TEXTS = ["a photo of a dog", "two red buses parked on a street near the old train station at night"]


def in_memory(spec):
    """True for a python spec whose loader is a Python object (a function or the triple), not a name."""
    return not isinstance(spec.get("loader"), str)


def loader_name(spec):
    """How the run block and messages name a spec's loader."""
    loader = spec.get("loader")
    if isinstance(loader, (tuple, list)):
        return "<(" + ", ".join(type(x).__name__ for x in loader) + ") in memory>"
    return loader if isinstance(loader, str) else str(jsonable(loader))


class UserCodeError(ModelError):
    """An exception raised in a user's loader or model: reported with their traceback."""


_HERE = os.path.dirname(os.path.abspath(__file__))


def _theirs(spec, what, e):
    tb = e.__traceback__
    while (
        tb is not None and tb.tb_next is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_HERE)
    ):
        tb = tb.tb_next  # their frames only: the ones in lgip/ that called them say nothing to them
    tb = "".join(traceback.format_exception(type(e), e, tb))
    return UserCodeError(
        f"model {spec.get('name')!r}: {what} raised {type(e).__name__} in your code "
        f"(loader {loader_name(spec)}):\n{tb.rstrip()}"
    )


def _locate(loader):
    """(module name or None, file path or None) of a "module:function" or "file.py:function"
    loader: a file is taken from the working folder; a module is searched on sys.path and in the
    working folder (a script's sys.path starts at its own folder, not the user's)."""
    where = loader.rsplit(":", 1)[0]
    if where.endswith(".py") or os.sep in where or "/" in where:
        return None, os.path.abspath(os.path.expanduser(where))
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return where, None


def loader_file(loader):
    """The file that defines a string loader (its code is part of its cache's identity), or None."""
    module, path = _locate(loader)
    if path is not None:
        return path
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return getattr(found, "origin", None)


def loader_files(spec):
    """The files a string loader's cache identity covers: its code, and the files its kwargs name
    (lgip.cache: an edited loader or checkpoint never reuses stale entries)."""
    return [loader_file(str(spec.get("loader", "")))] + [
        v for v in (spec.get("kwargs") or {}).values() if isinstance(v, str)
    ]


def _import_loader(spec):
    """The function a string loader names."""
    loader = spec["loader"]
    if ":" not in loader:
        raise ModelError(
            f"model {spec.get('name')!r}: loader {loader!r} must be 'package.module:function' or "
            f"'path/to/file.py:function'"
        )
    where, name = loader.rsplit(":", 1)
    module, path = _locate(loader)
    try:
        if path is not None:
            if not os.path.isfile(path):
                raise ModelError(
                    f"model {spec.get('name')!r}: loader file {path} does not exist (relative paths are "
                    f"taken from the working folder, {os.getcwd()})"
                )
            module_name = f"lgip_user_loader_{abs(hash(path))}"
            found = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(found)
            sys.modules[module_name] = module
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(module)
    except ModelError:
        raise
    except ModuleNotFoundError as e:
        if e.name and where.startswith(e.name):
            raise ModelError(
                f"model {spec.get('name')!r}: no module {where!r} for loader {loader!r} (is its folder "
                f"on PYTHONPATH, or give it as 'path/to/file.py:{name}')"
            ) from e
        raise _theirs(spec, f"importing {where}", e) from e
    except Exception as e:
        raise _theirs(spec, f"importing {where}", e) from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ModelError(f"model {spec.get('name')!r}: {where} has no function {name!r} (loader {loader!r})")
    return fn


def _triple(spec, device, dtype):
    """(model, preprocess, tokenizer, whether the caller gave the objects themselves)."""
    loader = spec.get("loader")
    if isinstance(loader, (tuple, list)):
        got, given = loader, True
    else:
        fn = _import_loader(spec) if isinstance(loader, str) else loader
        if not callable(fn):
            raise ModelError(
                f"model {spec.get('name')!r}: loader must be 'module:function', 'file.py:function', a "
                f"function or a (model, preprocess, tokenizer) tuple, got {type(loader).__name__}"
            )
        try:
            got = fn(device=device, dtype=dtype, **(spec.get("kwargs") or {}))
        except Exception as e:
            raise _theirs(spec, "the loader", e) from e
        given = False
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise ModelError(
            f"model {spec.get('name')!r}: loader {loader_name(spec)} must return (model, preprocess, "
            f"tokenizer), got {type(got).__name__}" + (f" of {len(got)}" if isinstance(got, (tuple, list)) else "")
        )
    model, preprocess, tokenizer = got
    wrong = [f"model.{m}" for m in ("encode_image", "encode_text") if not callable(getattr(model, m, None))]
    wrong += [n for n, f in (("preprocess", preprocess), ("tokenizer", tokenizer)) if not callable(f)]
    if wrong:
        raise ModelError(
            f"model {spec.get('name')!r}: loader {loader_name(spec)} returned no callable "
            f"{', '.join(wrong)} (open_clip's convention: model.encode_image(pixels), "
            f"model.encode_text(token_ids), preprocess(PIL image) -> tensor, tokenizer(list of str) -> "
            f"LongTensor [N, L])"
        )
    return model, preprocess, tokenizer, given


def _where(model, device, dtype):
    """(device, dtype) of the model's weights; the run's when it has none."""
    import torch

    for p in list(model.parameters()) if isinstance(model, torch.nn.Module) else []:
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device(device), dtype


def _expect(spec, what, x, dims, ints=False):
    import torch

    if (
        not torch.is_tensor(x)
        or x.dim() != dims
        or (ints and x.is_floating_point())
        or (not ints and not x.is_floating_point())
    ):
        desc = f"a tensor {tuple(x.shape)} of {x.dtype}" if torch.is_tensor(x) else type(x).__name__
        kind = "an integer tensor" if ints else "a float tensor"
        raise ModelError(
            f"model {spec.get('name')!r}: {what} gave {desc}; expected {kind} of {dims} dimensions "
            f"(loader {loader_name(spec)})"
        )
    return x


def load_python(spec, protocol, device, dtype):
    """An Encoder over a user's (model, preprocess, tokenizer); checked on probes at load."""
    import numpy as np
    import torch
    from PIL import Image

    model, preprocess, tokenizer, given = _triple(spec, device, dtype)
    device, dtype = _where(model, device, dtype)
    was_training = bool(getattr(model, "training", False))
    if is_openclip(model, tokenizer):  # a training loop's open_clip model: the accelerations of its spec twin
        enc = openclip_encoder(model.eval(), preprocess, tokenizer, device, dtype)
        enc.info = {"loader": loader_name(spec), "in_memory": in_memory(spec), "open_clip_model": True, **enc.info}
        enc.text_key_tag = TEXT_KEY_TAG  # (cache keys as python_key_encoder makes them: a re-run needs no weights)
        if given:
            enc.release = lambda: model.train(was_training)
        return enc
    if isinstance(model, torch.nn.Module):
        model.eval()

    def call(what, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            raise _theirs(spec, what, e) from e

    def token_rows(texts):
        return _expect(spec, "tokenizer(texts)", call("tokenizer(texts)", tokenizer, list(texts)), 2, ints=True)

    probe = token_rows(_PROBE_TEXTS)
    length = probe.shape[1]
    fixed = token_rows(_PROBE_TEXTS[:1]).shape[1] == length  # rows of one length whatever the batch
    # A fixed-length tokenizer's padding is taken off each text's ids (an Encoder's tokenize gives
    # them unpadded) and put back before the model sees them: it gets the rows the tokenizer makes.
    pad = _row_padding(token_rows(["", "a"]).tolist()) if fixed else None

    def tokenize(texts):
        rows = token_rows(texts) if fixed else [token_rows([t])[0] for t in texts]
        return [_unpadded(r.tolist(), pad) for r in rows]

    @torch.no_grad()
    def encode_tokens(ids, exact_length=False):  # (batches of texts of one token length: pad_length None)
        if pad is not None and ids.shape[1] < length:
            ids = torch.nn.functional.pad(ids, (0, length - ids.shape[1]), value=pad)
        out = call("model.encode_text(token_ids)", model.encode_text, ids.to(device, non_blocking=True))
        return _normalise(_expect(spec, "model.encode_text(token_ids)", out, 2))

    @torch.no_grad()
    def encode_images(pixels):  # (in the Encoder's dtype of the moment: explain_flips runs a model in memory in fp32)
        pixels = pixels.to(device=device, dtype=enc.dtype, non_blocking=True)
        return _normalise(
            _expect(
                spec, "model.encode_image(pixels)", call("model.encode_image(pixels)", model.encode_image, pixels), 2
            )
        )

    # texts batched with texts of their token length: pad_length None (padded back above)
    enc = Encoder(
        model=model,
        device=device,
        dtype=dtype,
        tokenizer=tokenizer,
        image_transform=preprocess,
        tokenize=tokenize,
        encode_tokens=encode_tokens,
        encode_images=encode_images,
        pad_id=pad if pad is not None else 0,
        pad_length=lambda call_lengths: None,
        text_key_tag=TEXT_KEY_TAG,
        tokenizer_identity=(type(tokenizer).__module__, type(tokenizer).__qualname__, fixed),
        info={
            "loader": loader_name(spec),
            "in_memory": in_memory(spec),
            "tokenizer_rows": (
                f"{length} ids, padded with {pad}"
                if pad is not None
                else f"{length} ids"
                if fixed
                else "one text at a time"
            ),
        },
        # the caller's model back in the mode it came in
        release=(lambda: model.train(was_training)) if given and isinstance(model, torch.nn.Module) else None,
    )
    # the probes, through the Encoder (its encode_images runs in the Encoder's dtype of the moment)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (97, 131, 3), dtype=np.uint8))
    pixels = _expect(spec, "preprocess(PIL image)", call("preprocess(PIL image)", preprocess, image), 3)
    d_image = encode_images(pixels[None]).shape
    d_text = encode_tokens(probe).shape
    if d_image[0] != 1 or d_text[0] != len(_PROBE_TEXTS) or d_image[1] != d_text[1]:
        raise ModelError(
            f"model {spec.get('name')!r}: encode_image gave {tuple(d_image)} for 1 image and encode_text "
            f"{tuple(d_text)} for {len(_PROBE_TEXTS)} texts; expected [N, D] with one D for both "
            f"(loader {loader_name(spec)})"
        )
    enc.not_applied = "a model of one's own: its encode_text and encode_image run as given"
    return enc


def _unpadded(ids, pad):
    """ids less the trailing run of `pad` (None: as they are)."""
    n = len(ids)
    while pad is not None and n and ids[n - 1] == pad:
        n -= 1
    return ids[:n]


def _row_padding(rows):
    """The id a fixed-length tokenizer fills its rows with after a text's end (open_clip's: 0),
    found on the rows of "" and "a": the run both end with, when what is left of them ends alike
    (their end-of-text token); None otherwise (a tokenizer padding with its end-of-text token, or
    without one: its rows are then taken whole).
    >>> _row_padding([[49406, 49407, 0, 0, 0], [49406, 320, 49407, 0, 0]]), _row_padding([[1, 9, 9], [1, 5, 9]])
    (0, None)
    """
    empty, short = (_unpadded(r, rows[1][-1]) for r in rows)
    pad = rows[1][-1]
    if rows[0][-1] != pad or not empty or not short or empty[-1] != short[-1] or len(short) <= len(empty):
        return None
    return int(pad)


def python_key_encoder(spec, protocol):
    """The cache keys of a string loader's model need nothing but the texts (no padding);
    None for a model in memory, which has no cache."""
    if in_memory(spec):
        return None
    return KeyEncoder(text_key_tag=TEXT_KEY_TAG, pad_length=lambda call_lengths: None)


def loader_paths(spec):
    """[("loader", file)] for a loader named by its file ("my_models.py:build"); a module found on sys.path is
    looked for when it loads."""
    loader = spec.get("loader")
    if not isinstance(loader, str) or ":" not in loader:
        return []
    _, path = _locate(loader)
    return [("loader", path)] if path is not None else []


PYTHON = register(
    Family(
        "python",
        required="loader",
        options=("kwargs",),
        load=load_python,
        keys=python_key_encoder,
        cache_files=loader_files,
        named=loader_named,
        card=own_card,
        local_paths=loader_paths,
        in_memory=in_memory,
        accelerations=accelerations.EMBEDDING_ONLY,
        about="a loader of your own returning (model, preprocess, tokenizer), or those objects",
    )
)
