"""Tiny random-init image-text scorers for the tests (LGIP_SPEC.md 13's families), built offline from
their configs in a few seconds: a tokenizer trained on the fixture captions (`tokenizers`: byte-level
BPE, fast, with offsets), a LLaVA (a CLIP vision tower, a Llama language model, a chat template) and a
BLIP image-text matching model (a BERT-style tokenizer). Each is saved as a folder that
`AutoProcessor.from_pretrained` and the model class's `from_pretrained` read, as a user's Hub id
would be.

    >>> folder = tiny_llava(tmp_path / "llava")      # AutoModelForImageTextToText.from_pretrained(folder)
    >>> folder = tiny_blip_itm(tmp_path / "blip")    # BlipForImageTextRetrieval.from_pretrained(folder)
"""
import json
import os

from conftest import REFERENCE

# a chat template in the shape of LLaVA-1.5's ("USER: <image>\n... ASSISTANT: ..."): content parts
# of type image become the image token, text parts their text
LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}"
    "{% if message['role'] == 'user' %} {% else %}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def fixture_captions():
    """Every caption, paraphrase and flip text of the reference fixtures: what a tiny tokenizer learns."""
    texts = []
    for name in sorted(os.listdir(REFERENCE)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(REFERENCE, name), encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                texts += rec.get("orig_captions", [])
                for key, value in rec.items():
                    if isinstance(value, dict):
                        texts += [t for v in value.values() for t in v if isinstance(t, str)]
    return texts


def caption_tokenizer(special, bos=None, vocab_size=400):
    """A fast byte-level BPE tokenizer trained on the fixture captions, `special` tokens first (ids
    0..len - 1), every byte reachable (no unknown token), offsets as the fast tokenizers give them;
    `bos` (one of `special`) put before every text, as Llama's tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(fixture_captions() + ["Describe the image in one sentence.", "USER: ASSISTANT: Yes no"],
                            trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_llava(folder, seed=0):
    """A LLaVA-1.5-shaped LlavaForConditionalGeneration (CLIP vision tower 32 px, patch 16: 4 image
    tokens; a 2-layer Llama) with its LlavaProcessor and chat template, saved to `folder`."""
    import torch
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)
    os.makedirs(folder, exist_ok=True)
    tok = caption_tokenizer(["<unk>", "<s>", "</s>", "<pad>", "<image>"], bos="<s>")
    tok.add_special_tokens({"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=16, projection_dim=32)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                       bos_token_id=1, eos_token_id=2, pad_token_id=3)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="default", vision_feature_layer=-2, image_seq_length=4)
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).eval().save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=16,
                               vision_feature_select_strategy="default", chat_template=LLAVA_TEMPLATE,
                               num_additional_image_tokens=1)
    processor.save_pretrained(folder)
    return folder


def tiny_blip_itm(folder, seed=0):
    """A BlipForImageTextRetrieval (a 2-layer BERT-style text encoder over a 32 px, patch 16 vision
    tower, its ITM head) with a BlipProcessor whose tokenizer knows the fixture captions, saved to `folder`."""
    import torch
    from transformers import (BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor,
                              BlipTextConfig, BlipVisionConfig, BertTokenizerFast)
    os.makedirs(folder, exist_ok=True)
    words = sorted({w for t in fixture_captions() for w in t.lower().replace(".", " . ").replace(",", " , ").split()})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]"]
    vocab = specials + [w for w in words if w not in specials] + list("abcdefghijklmnopqrstuvwxyz0123456789.,!?")
    vocab = list(dict.fromkeys(vocab))
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(os.path.join(folder, "vocab.txt"), do_lower_case=True, bos_token="[DEC]",
                            additional_special_tokens=["[ENC]"])
    text = BlipTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, encoder_hidden_size=32, max_position_embeddings=64,
                          pad_token_id=0, bos_token_id=vocab.index("[DEC]"), sep_token_id=3)
    vision = BlipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=16)
    config = BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16,
                        image_text_hidden_size=32)
    torch.manual_seed(seed)
    BlipForImageTextRetrieval(config).eval().save_pretrained(folder)
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok)
    processor.save_pretrained(folder)
    return folder
