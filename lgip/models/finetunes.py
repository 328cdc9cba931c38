"""lgip.models.finetunes: the field's compositional fine-tunes as named models (`FINETUNES`), resolvable by name in
MODELS as the published nine and "demo" are (lgip.models.registry.NAMED_MODELS), never among PUBLISHED_MODELS.

Each entry: the MODELS spec that loads it right (open_clip's architecture, where its weights come from, and
`quick_gelu` where its start's activation is known: LGIP_SPEC.md 12; a state dict does not record it), where its
weights come from (`weights`: a Hub repository, or the paper's release), its paper, and its card's facts
(`fine_tuned_from`, `fine_tuned_on`, `images_seen`), each cited in `card_sources` {field: where it is written}.
Only facts the cited releases state: a field that could not be confirmed is left out (None), never guessed, and
docs/finetunes.md lists which. A model whose weights are the paper's release (not on the Hub) is named in MODELS
with its own file: `{"name": "negclip", "pretrained": "/path/to/negclip.pth"}` (a dict naming the entry takes
the entry's spec and overrides it, lgip.models.registry.expand_models); its name alone is an error saying where
to download the file and how to give it.

    >>> FINETUNES["fsc_clip_coco_vit_b_32"].spec["pretrained"]
    'hf-hub:ytaek-oh/fsc-clip/coco_fsc-clip-ViT-B-32.pt'
    >>> card_lines("negclip")[0]
    'negclip: NegCLIP (Yuksekgonul et al., ICLR 2023)'
"""

from dataclasses import dataclass

from ..errors import ModelError

ARO = "github.com/mertyg/vision-language-models-are-bows"
FSC = "github.com/ytaek-oh/fsc-clip"
CE = "github.com/lezhang7/Enhance-FineGrained"
CLIC = "github.com/AmitPeleg/CLIC (README, model table)"
OPENAI_B32 = "OpenAI CLIP ViT-B/32 (open_clip ViT-B-32, pretrained openai)"
NEGCLIP_COCO = "COCO 2014 images, NegCLIP's training split (train_neg_clip.tsv)"


@dataclass(frozen=True)
class FineTune:
    """A named fine-tune: `spec` (the MODELS spec; its "card" the cited facts), `title` (method and paper),
    `weights` (where its weights come from), `needs_file` (the paper's release: MODELS gives the file)."""

    spec: dict
    title: str
    weights: str
    needs_file: bool = False


def _entry(name, title, weights, facts, sources, needs_file=False, **spec):
    """A FineTune whose spec's card holds the confirmed facts (None ones left out) and their citations."""
    card = {k: v for k, v in facts.items() if v is not None}
    card["card_sources"] = {k: sources[k] for k in card if k in sources}
    return FineTune({"name": name, "type": "openclip", **spec, "card": card}, title, weights, needs_file)


def _fsc(name, file, arch, start, quick, data, seen, sources_data):
    """An FSC-CLIP checkpoint of the authors' Hub repository (open_clip training checkpoints, one file each)."""
    return _entry(
        name,
        "FSC-CLIP (Oh et al., EMNLP 2024)",
        f"Hub: ytaek-oh/fsc-clip, file {file}",
        {"fine_tuned_from": start, "fine_tuned_on": data, "images_seen": seen},
        {
            "fine_tuned_from": f"{FSC} README, Model Zoo (Pretrained_Finetined, Arch) and Training Scripts "
            f"(--model {arch} --pretrained {'openai' if quick else 'datacomp_xl_s13b_b90k'})",
            "fine_tuned_on": f"{FSC} README, Training Scripts ({sources_data})",
            "images_seen": f"{FSC} README, Training Scripts ({sources_data}) and the training data layout",
        },
        model_name=arch,
        pretrained=f"hf-hub:ytaek-oh/fsc-clip/{file}",
        quick_gelu=quick,
    )


def _clic(name, repo, arch, data, seen):
    """A CLIC model of the authors' Hub repositories (open_clip folders: their open_clip_config.json builds them)."""
    source = f"{CLIC} and its Training datasets section"
    return _entry(
        name,
        "CLIC (Peleg, Singh and Hein, NeurIPS 2025)",
        f"Hub: {repo} (an open_clip folder)",
        {"architecture": arch, "fine_tuned_on": data, "images_seen": seen},
        {"architecture": f"{CLIC}: Pre-train key {arch}", "fine_tuned_on": source, "images_seen": source},
        model_name=f"hf-hub:{repo}",
        pretrained=None,
    )


LAIONCOCO = ("LAION-COCO, a 100K subset (laioncoco_100k)", "LAION-COCO 100K subset (LAION images)")
COGVLM = ("1M LAION samples relabelled by CogVLM", "1M LAION images")
REDCAPS = ("the RedCaps subset of PixelProse", "RedCaps images")

_ENTRIES = [
    _entry(
        "negclip",
        "NegCLIP (Yuksekgonul et al., ICLR 2023)",
        "the paper's release, not on the Hub: negclip.pth, Google Drive file id 1ooVVPxB-tvptgmHlIMMFGV3Cg-IrhbRZ "
        f"({ARO}, model_zoo/__init__.py)",
        {
            "fine_tuned_from": OPENAI_B32,
            "fine_tuned_on": "COCO captions with NegCLIP's hard negative captions (mscoco_with_negatives_training.csv)",
            "images_seen": NEGCLIP_COCO,
        },
        {
            "fine_tuned_from": f'{ARO} README, NegCLIP Training (--pretrained="openai" --model="ViT-B-32")',
            "fine_tuned_on": f'{ARO} README, NegCLIP Training (--train-data="./mscoco_with_negatives_training.csv")',
            "images_seen": f"{FSC} README, training data layout (coco/images/train2014, val2014, train_neg_clip.tsv: "
            "NegCLIP's COCO file)",
        },
        needs_file=True,
        model_name="ViT-B-32",
        pretrained=None,
        quick_gelu=True,
    ),
    _entry(
        "ce_clip",
        "CE-CLIP (Zhang, Awal and Agrawal, CVPR 2024)",
        "the paper's release, not on the Hub: the clip-enhanced checkpoint of Google Drive folder "
        f"1rpt_YpqSatuWTUDT9uMXkU1RUSBfWec1 ({CE} README, Checkpoints)",
        {
            "fine_tuned_from": OPENAI_B32,
            "fine_tuned_on": "COCO 2014 train captions with generated hard negatives",
            "images_seen": "COCO 2014 train images (train2014)",
        },
        {
            "fine_tuned_from": f"{CE} scripts/run_all.sh (--pretrained openai --model ViT-B-32); README SugarCrepe "
            "command (--model ViT-B-32)",
            "fine_tuned_on": f'{CE} README ("The training data is generated based on COCO 2014")',
            "images_seen": f"{CE} data/prepare_dataset.sh (train2014.zip; dataset.py --data coco_train)",
        },
        needs_file=True,
        model_name="ViT-B-32",
        pretrained=None,
        quick_gelu=True,
    ),
    _fsc(
        "fsc_clip_coco_vit_b_32",
        "coco_fsc-clip-ViT-B-32.pt",
        "ViT-B-32",
        OPENAI_B32,
        True,
        "COCO captions (NegCLIP's train_neg_clip.tsv) with FSC-CLIP's hard negatives",
        NEGCLIP_COCO,
        '--train-data="train_neg_clip"',
    ),
    _fsc(
        "fsc_clip_cc3m_vit_b_32",
        "cc3m_fsc-clip-ViT-B-32.pt",
        "ViT-B-32",
        OPENAI_B32,
        True,
        "CC-3M, a 100K subset with CoCa captions (cc3m_100k)",
        "CC-3M 100K subset",
        '--train-data="cc3m_100k" --caption-key="coca_captions"',
    ),
    _fsc(
        "fsc_clip_laioncoco_vit_b_32",
        "laioncoco_fsc-clip-ViT-B-32.pt",
        "ViT-B-32",
        OPENAI_B32,
        True,
        *LAIONCOCO,
        '--train-data="laioncoco_100k"',
    ),
    _fsc(
        "fsc_clip_laioncoco_vit_b_16",
        "laioncoco_fsc-clip-ViT-B-16.pt",
        "ViT-B-16",
        "OpenAI CLIP ViT-B/16 (open_clip ViT-B-16, pretrained openai)",
        True,
        *LAIONCOCO,
        '--train-data="laioncoco_100k"',
    ),
    _fsc(
        "fsc_clip_laioncoco_vit_l_14",
        "laioncoco_fsc-clip-ViT-L-14.pt",
        "ViT-L-14",
        "OpenAI CLIP ViT-L/14 (open_clip ViT-L-14, pretrained openai)",
        True,
        *LAIONCOCO,
        '--train-data="laioncoco_100k"',
    ),
    _fsc(
        "fsc_clip_dcxl_laioncoco_vit_b_32",
        "dcxl_fsc-clip-ViT-B-32.pt",
        "ViT-B-32",
        "DataComp-XL CLIP ViT-B/32 (open_clip ViT-B-32, pretrained datacomp_xl_s13b_b90k)",
        False,
        *LAIONCOCO,
        '--train-data="laioncoco_100k"',
    ),
    _clic("clic_vit_b_32_cogvlm", "nmndeep/CLIC-ViT-B-32-224-CogVLM", "ViT-B-32", *COGVLM),
    _clic("clic_vit_b_32_redcaps", "nmndeep/CLIC-ViT-B-32-224-PixelProse", "ViT-B-32", *REDCAPS),
    _clic("clic_vit_b_16_cogvlm", "nmndeep/CLIC-ViT-B-16-224-CogVLM", "ViT-B-16", *COGVLM),
    _clic("clic_vit_l_14_cogvlm", "nmndeep/CLIC-ViT-L-14-224-CogVLM", "ViT-L-14", *COGVLM),
    _clic("clic_vit_l_14_redcaps", "nmndeep/CLIC-ViT-L-14-224-PixelProse", "ViT-L-14", *REDCAPS),
]

FINETUNES = {e.spec["name"]: e for e in _ENTRIES}  # name -> FineTune, in the order `lgip list` shows them

# what each card field says, in the order `lgip list` prints them
CARD_WORDS = (
    ("fine_tuned_from", "fine-tuned from"),
    ("fine_tuned_on", "fine-tuned on"),
    ("images_seen", "images seen"),
)


def require_weights(spec):
    """ModelError when `spec` is a fine-tune whose weights are the paper's release and no file is given: its name
    alone cannot load (open_clip would build random weights); the error says where the file is and how to give it."""
    entry = FINETUNES.get(spec.get("name")) if isinstance(spec, dict) else None
    if entry is None or not entry.needs_file or spec.get("pretrained"):
        return
    raise ModelError(
        f"model {spec['name']!r} ({entry.title}): its weights are {entry.weights}. Download the file, then name "
        f'it with its file in MODELS: {{"name": "{spec["name"]}", "pretrained": "/path/to/the/file"}} '
        f"(docs/finetunes.md)"
    )


def card_lines(name):
    """A named fine-tune's card as `lgip list` prints it: its title, weights, spec, and each fact with its
    source (a fact not confirmed says so)."""
    entry = FINETUNES[name]
    spec = {k: v for k, v in entry.spec.items() if k not in ("name", "card")}
    card = entry.spec["card"]
    lines = [f"{name}: {entry.title}", f"  weights: {entry.weights}", f"  spec: {spec}"]
    if "architecture" in card:
        lines.append(f"  architecture: {card['architecture']} (source: {card['card_sources']['architecture']})")
    for field, words in CARD_WORDS:
        if field in card:
            lines.append(f"  {words}: {card[field]} (source: {card['card_sources'][field]})")
        else:
            lines.append(f"  {words}: not confirmed (left out of its card)")
    return lines
