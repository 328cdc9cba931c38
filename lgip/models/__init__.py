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
  openclip        its family record and loader (CLIP, OpenCLIP, EVA02-CLIP)
  dual_encoders   the records and loader of any transformers dual encoder (types "transformers" and "siglip")
  own_loader      the record and loader of a loader of one's own returning (model, preprocess, tokenizer)
  conversations, generative, image_groups
                  a generative VLM's score of a text given an image (LGIP_SPEC.md 13: the text's log-probability
                  in the chat template's conversation), plainly, with the shared prefix run once, images grouped
  itm             a BLIP / BLIP-2 image-text matching head's log-odds of a match
  joint           the records of "generative" and "itm" (a JointModel: `score(image, texts)`; lgip.scorers.joint)
  causal_lm       the record of a text-only language model (LGIP_SPEC.md 15: a blind model)
  zoo, cards      openclip_zoo entries expanded; a model's card (LGIP_SPEC.md 12)
  trainable       what fine-tuning asks of a family (LGIP_SPEC.md 14)
  families        the record of a type (`Family`), the registered records, `describe_types`
  registry        spec "type" -> its record (loader, preparer, key encoder, cache files, scorer kind); the published
                  nine (PUBLISHED_MODELS) and the named models

The room for a new model family: a module here with its loader `(spec, protocol, device, dtype) ->
Encoder` and its record, `register(Family(...))` (families), imported by the registry. A loader that
finds a model its type cannot evaluate raises lgip.errors.WrongModelType; the registry adds the valid
types to the message.

    >>> from lgip.models import load_model
    >>> enc = load_model({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"})
    >>> enc.encode_images(pixels), enc.encode_tokens(ids)
"""

from .families import FAMILIES, Family, family, known_family, register
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
    "known_family",
    "key_encoder",
    "load_model",
    "register",
]
