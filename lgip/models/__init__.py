"""lgip.models: everything about a model, from its spec to embeddings. One module per concern,
each importing only those above it (and lgip's own lower floor: errors, util, accelerations, tokens):

  encoder         the one small interface every loader returns (`Encoder`), `Prepared` (tokenizer and
                  pixels before the weights); protocols, dtype and device resolution, tokenizer keys
  hub             where a model's files come from (local path, Hugging Face cache, the Hub), found out
                  before anything loads
  prefix_packs    a causal text tower's texts packed as prefix trees
  towers          exact, faster forwards of the open_clip and SigLIP towers
  clip_tokenizer  open_clip's tokenizers as id lists, the CLIP BPE fast
  pixels          a model's preprocessing cut in two: uint8 geometry in workers, float arithmetic on device
  openclip        loader of type "openclip" (CLIP, OpenCLIP, EVA02-CLIP)
  transformers    loader of types "transformers" and "siglip" (any transformers dual encoder)
  python          loader of type "python" (a loader of one's own returning (model, preprocess, tokenizer))
  generative      a generative VLM's score of a text given an image (LGIP_SPEC.md 13: the text's log-probability
                  in the chat template's conversation), plainly and with the shared prefix run once
  itm             a BLIP / BLIP-2 image-text matching head's log-odds of a match
  joint           types "generative" and "itm" (a JointModel: `score(image, texts)`; lgip.scorers.joint scores with it)
  registry        spec "type" -> loader, preparer, key encoder, cache files, scorer kind; the published nine
                  (PUBLISHED_MODELS)

The room for a new model family: a module here with its loader `(spec, protocol, device, dtype) ->
Encoder` and its record, `register(Family(...))` (families), imported by the registry. A loader that
finds a model its type cannot evaluate raises lgip.errors.WrongModelType; the registry adds the valid
types to the message.

    >>> from lgip.models import load_model
    >>> enc = load_model({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"})
    >>> enc.encode_images(pixels), enc.encode_tokens(ids)
"""

from .families import FAMILIES, Family, family, register
from .registry import (
    PUBLISHED_MODELS,
    cacheable,
    key_encoder,
    load_model,
)

__all__ = [
    "FAMILIES",
    "Family",
    "PUBLISHED_MODELS",
    "cacheable",
    "family",
    "key_encoder",
    "load_model",
    "register",
]
