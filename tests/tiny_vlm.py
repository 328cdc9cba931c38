"""Tiny random-init image-text scorers for the tests (LGIP_SPEC.md 13's families), built offline from
their configs in a few seconds: a tokenizer trained on the fixture captions (`tokenizers`: byte-level
BPE, fast, with offsets), a LLaVA (a CLIP vision tower, a Llama language model, a chat template), a
Qwen2-VL and a Qwen2.5-VL (multimodal rope), a Gemma 3, a LLaVA-NeXT and an Idefics3 (SmolVLM: images
in tiles), a Mllama (Llama 3.2 Vision: cross-attention), a PaliGemma (a prefix-LM) and BLIP / BLIP-2
image-text matching models (a BERT-style tokenizer). Each is saved as a folder that
`AutoProcessor.from_pretrained` and the model class's `from_pretrained` read, as a user's Hub id
would be.

    >>> folder = tiny_llava(tmp_path / "llava")      # AutoModelForImageTextToText.from_pretrained(folder)
    >>> folder = tiny_qwen2_vl(tmp_path / "qwen")    # a Qwen2-VL: multimodal rope (its deltas)
    >>> folder = tiny_gemma3(tmp_path / "gemma3")    # a Gemma 3: sliding-window layers, the BOS in its template
    >>> folder = tiny_qwen2_5_vl(tmp_path / "q25")   # a Qwen2.5-VL: the rope deltas, a windowed vision tower
    >>> folder = tiny_llava_next(tmp_path / "next")  # a LLaVA-NeXT: anyres tiles, token count by image size
    >>> folder = tiny_idefics3(tmp_path / "smol")    # an Idefics3 (SmolVLM v1): tiles framed by row/col tags
    >>> folder = tiny_mllama(tmp_path / "mllama")    # a Llama 3.2 Vision: the image by cross-attention
    >>> folder = tiny_paligemma(tmp_path / "pali")   # a PaliGemma: a prefix-LM without a chat template
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
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


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
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        fixture_captions() + ["Describe the image in one sentence.", "USER: ASSISTANT: Yes no"], trainer
    )
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _llava_parts(folder):
    """(tokenizer, CLIP vision config, Llama config) of tiny_llava and tiny_llava_next; `folder` made."""
    from transformers import CLIPVisionConfig, LlamaConfig

    os.makedirs(folder, exist_ok=True)
    tok = caption_tokenizer(["<unk>", "<s>", "</s>", "<pad>", "<image>"], bos="<s>")
    tok.add_special_tokens({"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=16,
        projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    return tok, vision, text


def tiny_llava(folder, seed=0):
    """A LLaVA-1.5-shaped LlavaForConditionalGeneration (CLIP vision tower 32 px, patch 16: 4 image
    tokens; a 2-layer Llama) with its LlavaProcessor and chat template, saved to `folder`."""
    import torch
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tok, vision, text = _llava_parts(folder)
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=4,
    )
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).eval().save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=16,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE,
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(folder)
    return folder


# Qwen2-VL's chat template's shape: each turn <|im_start|>role ... <|im_end|>, the image as
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad into the image's tokens)
QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_qwen2_vl(folder, seed=0, side=84):
    """A Qwen2VLForConditionalGeneration (a 2-block vision tower, patch 14 merged 2 x 2; a 2-layer language
    model with multimodal rope, mrope sections 2/3/3, one key-value head) with its Qwen2VLProcessor
    (images resized to side x side px: (side / 28)^2 image tokens, 9 at 84 px) and chat template, saved
    to `folder`. Its image tokens' rope positions are compressed to the image's grid, so every later
    position is shifted (the rope deltas): the trap that a reused prefix must get right."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    vision = dict(
        depth=2,
        embed_dim=32,
        hidden_size=32,
        num_heads=2,
        mlp_ratio=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
    )
    return _tiny_qwen(folder, seed, side, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor, vision)


def _tiny_qwen(folder, seed, side, config_class, model_class, processor_class, vision):
    """A Qwen2-VL-family model (tiny_qwen2_vl, tiny_qwen2_5_vl): their tokenizer, language model, image
    processor and chat template, `vision` their vision tower's config."""
    import torch
    from transformers import Qwen2TokenizerFast, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    os.makedirs(folder, exist_ok=True)
    specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    tok = Qwen2TokenizerFast(
        tokenizer_object=caption_tokenizer(specials)._tokenizer,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    config = config_class(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=256,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
            tie_word_embeddings=False,
        ),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model_class(config).eval().save_pretrained(folder)
    pixels = dict(min_pixels=side * side, max_pixels=side * side, patch_size=14, merge_size=2, temporal_patch_size=2)
    processor_class(
        image_processor=Qwen2VLImageProcessor(**pixels),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(**pixels),
        chat_template=QWEN_TEMPLATE,
    ).save_pretrained(folder)
    return folder


# Gemma 3's chat template's shape: the BOS in the template itself (so none is added again), turns of
# <start_of_turn>role ... <end_of_turn>, the image as <start_of_image> (expanded by the processor)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<start_of_image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}<end_of_turn>\n{% endfor %}"
)


def tiny_gemma3(folder, seed=0):
    """A Gemma3ForConditionalGeneration (a SigLIP tower 32 px, 4 image tokens; a 4-layer Gemma 3 whose
    sliding-window layers see 8 tokens, shorter than its conversations: the sliding-window cache is the trap)
    with its Gemma3Processor and a chat template that writes the BOS itself, saved to `folder`."""
    import torch
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        GemmaTokenizerFast,
    )

    os.makedirs(folder, exist_ok=True)
    specials = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<start_of_image>",
        "<image_soft_token>",
        "<end_of_image>",
        "<start_of_turn>",
        "<end_of_turn>",
    ]
    tok = GemmaTokenizerFast(
        tokenizer_object=caption_tokenizer(specials, bos="<bos>")._tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    config = Gemma3Config(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=256,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    torch.manual_seed(seed)
    Gemma3ForConditionalGeneration(config).eval().save_pretrained(folder)
    Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": 32, "width": 32}),
        tokenizer=tok,
        chat_template=GEMMA3_TEMPLATE,
        image_seq_length=4,
    ).save_pretrained(folder)
    return folder


def tiny_paligemma(folder, seed=0):
    """A PaliGemmaForConditionalGeneration (a SigLIP vision tower 32 px, patch 16: 4 image tokens; a 2-layer
    Gemma) with its PaliGemmaProcessor (no chat template: a prefix-LM, prompted as "caption en"), saved to
    `folder`."""
    import torch
    from transformers import (
        GemmaTokenizerFast,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
    )

    os.makedirs(folder, exist_ok=True)
    tok = GemmaTokenizerFast(
        tokenizer_object=caption_tokenizer(["<pad>", "<eos>", "<bos>", "<unk>", "<image>"])._tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=False,
        add_eos_token=False,
    )
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    config = PaliGemmaConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
            projection_dim=32,
        ),
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=256,
            model_type="gemma",
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        projection_dim=32,
        hidden_size=32,
        vocab_size=len(tok),
    )
    config.text_config.vocab_size = len(tok)
    torch.manual_seed(seed)
    PaliGemmaForConditionalGeneration(config).eval().save_pretrained(folder)
    image_processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    image_processor.image_seq_length = 4
    PaliGemmaProcessor(image_processor=image_processor, tokenizer=tok).save_pretrained(folder)
    return folder


def tiny_blip_itm(folder, seed=0):
    """A BlipForImageTextRetrieval (a 2-layer BERT-style text encoder over a 32 px, patch 16 vision
    tower, its ITM head) with a BlipProcessor whose tokenizer knows the fixture captions, saved to `folder`."""
    import torch
    from transformers import (
        BlipConfig,
        BlipForImageTextRetrieval,
        BlipImageProcessor,
        BlipProcessor,
        BlipTextConfig,
        BlipVisionConfig,
        BertTokenizerFast,
    )

    os.makedirs(folder, exist_ok=True)
    words = sorted({w for t in fixture_captions() for w in t.lower().replace(".", " . ").replace(",", " , ").split()})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]"]
    vocab = specials + [w for w in words if w not in specials] + list("abcdefghijklmnopqrstuvwxyz0123456789.,!?")
    vocab = list(dict.fromkeys(vocab))
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(
        os.path.join(folder, "vocab.txt"), do_lower_case=True, bos_token="[DEC]", additional_special_tokens=["[ENC]"]
    )
    text = BlipTextConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        encoder_hidden_size=32,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=vocab.index("[DEC]"),
        sep_token_id=3,
    )
    vision = BlipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=16
    )
    config = BlipConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16, image_text_hidden_size=32
    )
    torch.manual_seed(seed)
    BlipForImageTextRetrieval(config).eval().save_pretrained(folder)
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok)
    processor.save_pretrained(folder)
    return folder


def tiny_blip2_itm(folder, seed=0):
    """A Blip2ForImageTextRetrieval (a 32 px vision tower, a 2-layer Q-Former taking the text with 4 query
    tokens, its ITM head) with a Blip2Processor whose tokenizer knows the fixture captions, saved to
    `folder`."""
    import torch
    from transformers import (
        BertTokenizerFast,
        Blip2Config,
        Blip2ForImageTextRetrieval,
        Blip2Processor,
        BlipImageProcessor,
    )

    os.makedirs(folder, exist_ok=True)
    words = sorted({w for t in fixture_captions() for w in t.lower().replace(".", " . ").replace(",", " , ").split()})
    vocab = list(
        dict.fromkeys(
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]
            + words
            + list("abcdefghijklmnopqrstuvwxyz0123456789.,!?")
        )
    )
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(os.path.join(folder, "vocab.txt"), do_lower_case=True, bos_token="[DEC]")
    config = Blip2Config(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
        ),
        qformer_config=dict(
            vocab_size=len(vocab),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            encoder_hidden_size=32,
            max_position_embeddings=64,
            pad_token_id=0,
            use_qformer_text_input=True,
        ),
        num_query_tokens=4,
        image_text_hidden_size=16,
    )
    torch.manual_seed(seed)
    Blip2ForImageTextRetrieval(config).eval().save_pretrained(folder)
    Blip2Processor(
        image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok, num_query_tokens=None
    ).save_pretrained(folder)
    return folder


def tiny_qwen2_5_vl(folder, seed=0, side=84):
    """A Qwen2_5_VLForConditionalGeneration (Qwen2-VL's language model and rope deltas; a vision tower with
    windowed attention, one full-attention block, an MLP merger) with its Qwen2_5_VLProcessor and the chat
    template of tiny_qwen2_vl, saved to `folder`."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=32,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    return _tiny_qwen(
        folder, seed, side, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor, vision
    )


def tiny_llava_next(folder, seed=0):
    """A LlavaNextForConditionalGeneration (LLaVA-NeXT's "anyres": the image cut into tiles on a grid picked
    from its aspect, each tile's tokens unpadded to the image's shape, a newline embedding per row: the
    image's token count depends on its size) over tiny_llava's CLIP tower and Llama, with its
    LlavaNextProcessor and LLaVA's chat template, saved to `folder`."""
    import torch
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tok, vision, text = _llava_parts(folder)
    grid = [[32, 64], [64, 32], [64, 64]]
    config = LlavaNextConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_grid_pinpoints=grid,
        image_seq_length=4,
    )
    torch.manual_seed(seed)
    LlavaNextForConditionalGeneration(config).eval().save_pretrained(folder)
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_grid_pinpoints=grid
    )
    LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=16,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE,
        num_additional_image_tokens=1,
    ).save_pretrained(folder)
    return folder


# SmolVLM's (Idefics3's) chat template's shape:
# "User:<image>prompt<end_of_utterance>\nAssistant: answer<end_of_utterance>\n"
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}<end_of_utterance>\n{% endfor %}"
)


def tiny_idefics3(folder, seed=0):
    """An Idefics3ForConditionalGeneration, SmolVLM's architecture (a SigLIP-style tower 32 px; the image split
    into a grid of 32 px tiles and a global view, each tile's tokens pixel-shuffled to 4, framed by
    <row_i_col_j> and <global-img> tags: the image's token count depends on its size; a 2-layer Llama) with
    its Idefics3Processor and a SmolVLM-shaped chat template, saved to `folder`."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        PreTrainedTokenizerFast,
    )

    os.makedirs(folder, exist_ok=True)
    tags = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)] + ["<global-img>"]
    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"] + tags
    tok = PreTrainedTokenizerFast(
        tokenizer_object=caption_tokenizer(specials, bos="<|im_start|>")._tokenizer,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    config = Idefics3Config(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        text_config=dict(
            model_type="llama",
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=0,
        ),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).eval().save_pretrained(folder)
    image_processor = Idefics3ImageProcessor(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True
    )
    Idefics3Processor(
        image_processor=image_processor, tokenizer=tok, image_seq_len=4, chat_template=IDEFICS3_TEMPLATE
    ).save_pretrained(folder)
    return folder


# Llama 3.2 Vision's chat template's shape: the BOS written by the template, turns framed by header tokens
MLLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|image|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}<|eot_id|>{% endfor %}"
)


def tiny_mllama(folder, seed=0):
    """A MllamaForConditionalGeneration (Llama 3.2 Vision: one <|image|> token, the image read by
    cross-attention layers through a per-token cross_attention_mask over its tiles; a 32 px, 2-tile vision
    tower; a 3-layer language model, layer 1 cross-attending) with its MllamaProcessor and chat template,
    saved to `folder`. The cross-attention gates start at 0 in a fresh model (the image would change
    nothing): they are set to 1 here."""
    import torch
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaImageProcessor, MllamaProcessor
    from transformers import PreTrainedTokenizerFast

    os.makedirs(folder, exist_ok=True)
    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|finetune_right_pad_id|>",
        "<|image|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=caption_tokenizer(specials, bos="<|begin_of_text|>")._tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    config = MllamaConfig(
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_global_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            vision_output_dim=64,
            image_size=32,
            patch_size=16,
            max_num_tiles=2,
            intermediate_layers_indices=[0],
            supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
        ),
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            cross_attention_layers=[1],
            max_position_embeddings=256,
            rope_scaling={"rope_type": "default"},
            bos_token_id=ids["<|begin_of_text|>"],
            eos_token_id=ids["<|eot_id|>"],
            pad_token_id=ids["<|finetune_right_pad_id|>"],
        ),
        image_token_index=ids["<|image|>"],
    )
    torch.manual_seed(seed)
    model = MllamaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_gate"):
                p.fill_(1.0)
    model.save_pretrained(folder)
    MllamaProcessor(
        image_processor=MllamaImageProcessor(size={"height": 32, "width": 32}, max_image_tiles=2),
        tokenizer=tok,
        chat_template=MLLAMA_TEMPLATE,
    ).save_pretrained(folder)
    return folder


LFM2_TEMPLATE = (  # LFM2-VL's shape: the BOS, then <|im_start|>role ... <|im_end|> turns, the image as <image>
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_lfm2_vl(folder, seed=0):
    """A tiny LFM2-VL (Lfm2VlForConditionalGeneration: a SigLIP2 NaFlex tower, a 2-layer LFM2 language model whose
    first layer is a short convolution: a hybrid cache, Lfm2HybridConvCache) with its processor, whose image
    processor exists only as a fast one (Lfm2VlImageProcessorFast); saved to `folder`. The convolution's
    weights are scaled up so that a wrongly continued convolution moves the scores visibly. Its config.json
    says model_type "lfm2_vl", the name AutoConfig knows (the class writes "lfm2-vl" in transformers 4.57)."""
    import torch
    from transformers import (
        Lfm2Config,
        Lfm2VlConfig,
        Lfm2VlForConditionalGeneration,
        Lfm2VlImageProcessorFast,
        Lfm2VlProcessor,
        PreTrainedTokenizerFast,
        Siglip2VisionConfig,
    )

    os.makedirs(folder, exist_ok=True)
    special = [
        "<unk>",
        "<|startoftext|>",
        "<|im_end|>",
        "<|pad|>",
        "<image>",
        "<|image_start|>",
        "<|image_end|>",
        "<|img_thumbnail|>",
        "<|im_start|>",
    ] + [f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)]
    base = caption_tokenizer(special, bos="<|startoftext|>")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=base._tokenizer,
        unk_token="<unk>",
        bos_token="<|startoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        extra_special_tokens={
            "image_token": "<image>",
            "image_start_token": "<|image_start|>",
            "image_end_token": "<|image_end|>",
            "image_thumbnail": "<|img_thumbnail|>",
        },
    )
    vision = Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16, num_patches=64
    )
    text = Lfm2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention"],
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config = Lfm2VlConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tok.image_token_id,
        projector_hidden_size=32,
        downsample_factor=2,
    )
    torch.manual_seed(seed)
    model = Lfm2VlForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".conv." in name or "in_proj" in name:
                p.mul_(8.0)
    model.save_pretrained(folder)
    image_processor = Lfm2VlImageProcessorFast(
        do_image_splitting=False, min_image_tokens=4, max_image_tokens=16, encoder_patch_size=16, tile_size=64
    )
    Lfm2VlProcessor(image_processor=image_processor, tokenizer=tok, chat_template=LFM2_TEMPLATE).save_pretrained(folder)
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["model_type"] = "lfm2_vl"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return folder
