"""common: what the LGIP scripts share, in one import (`import common`).

The scripts read top to bottom like recipes over these names. The machinery that makes them fast
lives behind them in the lgip/ package, one module per concern. Each module imports only modules
above it in this list, so it can be read, and changed, knowing only those:

  errors, util          InputError / ModelError / ConfigError / OutputError; progress, timing, atomic files
                        (an output that cannot be written: which, why, what to do), output names
  accelerations         the off switch of every acceleration (ACCELERATIONS_OFF in the scripts)
  settings              the rules of the settings the scripts share (BOOTSTRAP, MODELS, DEVICE, ...), checked
                        before any work
  cli                   --NAME=value overrides of a script's constants; run_main and its exit codes
  demo                  the bundled demo: its data, its model, the words every output made with them carries
  records               reading every JSON/JSONL input (a UTF-8 byte-order mark is fine) and validating
                        records (file:line and field in every error)
  sources/              other benchmarks (SugarCrepe, SugarCrepe++, RoCOCO) read as LGIP records (import_benchmark.py)
  results               the list files (one dict per model) merged under a lock: a run replaces its models' rows
  method, generate      word lists, paraphrases, flips (LGIP_SPEC.md 2-3); the generators' loop
  tokens                token tables shared by models that tokenize alike
  models/               everything about a model (a package, lgip/models/__init__.py lists its modules):
                        the Encoder interface; where a model's files come from (hub); exact faster tower
                        forwards, prefix-tree packs, CLIP ids fast, preprocessing split for the device;
                        one loader per spec type (openclip, transformers, python); the registry
                        (spec "type" -> loader, preparer, key encoder; PUBLISHED_MODELS)
  device, cache, pixel_memory
                        device-side tables and cosines; the embedding cache on disk; decoded pixels
                        kept for later models
  images, texts         images decoded in workers and encoded beside the texts; the published calls,
                        deduplicated and batched (TextBank)
  lookahead             the later models' tokenizing and decoding, done while a model runs
  scoring, scorefile    pairs, means and bootstrap intervals (the metrics); the *.scores.jsonl files
  controls              is it the image? text-prior controls, hard positives, paired model comparisons
  retrieval             recall over galleries of records, with the flips among the captions (LGIP_SPEC.md 7)
  batch                 a run over many models: ON_MODEL_ERROR's skips, progress over models
  alterations, image_side
                        the image side (LGIP_SPEC.md 11): images altered in the loader's workers (paraphrases
                        jpeg, downscale, crop, hflip; flips mix, patch), their pairs, text-to-image search
                        with the altered images in the gallery (run_lgip_images.py)
  scorers               the seam: what scores one model's pairs (`PairScorer`, asked with a `ScoreRequest`:
                        data), what it gives back (`Scored`); `embeddings` (a dual encoder's cosines) and `joint`
                        (a model that scores a pair jointly, LGIP_SPEC.md 13), each a module
  evaluation            ModelRun (one model over one JSONL, torchrun sharding) and run_evaluation
  entry                 a script's run(**constants): its command line's run, callable from Python
  attribution, explain  word attribution of a text's similarity (LGIP_SPEC.md 8): plain tower forwards
                        keeping attention probabilities, token and word scores, changed and blamed words;
                        explain_flips.py's flips, lines and localization accuracy (`from lgip import explain`)
  trackers, export, compare
                        TRACKERS (W&B, MLflow, TensorBoard); the per-pair scores as one flat table (EXPORT, `lgip
                        export`) and what an evaluation does with its rows (write_results); two runs paired over the
                        images both scored (`lgip compare`)
  pipeline              run_all's steps: each script's run() in run_all's process, run again only when an input, the
                        script or the settings changed (recorded beside its output)

Where a record goes, in an evaluation: `records.load_records` reads and validates it;
`evaluation.run_evaluation` runs each model of MODELS through the script's `evaluate(run)`; its
`published_calls` registers the record's texts as the published calls (`texts.TextBank.add_call`)
and its pairs (`scoring.Pairs`); `ModelRun.score` hands them to the model's scorer as a request (`scorers`:
the seam; a dual encoder's `EmbeddingScorer`), which has the TextBank tokenize (`tokens`), batch or pack
(`prefix_packs`) and encode them through the model's Encoder (`models`), cached (`cache`), while
`images.RecordImages` decodes and encodes the record's image beside them; the pairs get their
cosines (`device.cosines`) and come back in a `scorers.Scored`; `evaluate` turns them into metrics with intervals
(`scoring`) and writes the score file (`scorefile`); run_evaluation adds the run block and the script writes
the metrics JSON (`lgip.outputs.write_json`; the list of all models merged into the one there by
`results.write_rows`).

Example (an evaluation script):
    CONFIG = common.configure(globals())   # applies --NAME=value from sys.argv
    def published_calls(records, ks, calls) -> the pairs    # the texts to score, as data
    def evaluate(run):                     # one model: its scored pairs -> its figures
        inv, sens = run.score(*run.pairs(published_calls)).pairs
    def run(**constants):                  # the command line's run, and a call from Python
        with common.script_call(globals(), constants) as config:
            return common.run_evaluation(__file__, config, ("same_caps", "diff_caps"), evaluate, summary)
"""

from contextlib import closing

from lgip.accelerations import NAMES as ACCELERATIONS
from lgip.cli import configure, parse_value, run_main
from lgip.scorers import leave_out
from lgip.console import detail, fit, quiet
from lgip.controls import (
    Comparisons,
    hard_positive_figures,
    prior_figures,
    prior_values,
    relative_figures,
    relative_terms,
)
from lgip.demo import ABOUT_MODEL as DEMO_ABOUT, DEMO_JSONL, DEMO_MODEL, demo_block, demo_message, say_demo
from lgip.entry import script_call
from lgip.models.encoder import PROTOCOLS, SIGLIP_TEXT_LENGTH, resolve_device, resolve_dtype
from lgip.errors import ConfigError, InputError, ModelError, Terminated
from lgip.evaluation import (
    ModelRun,
    eval_run_info,
    evaluate_models,
    forget_token_tables,
    is_main_process,
    run_evaluation,
    swap_process_state,
    write_comparisons,
)
from lgip.generate import SkipRecord, run_generator
from lgip.models.hub import check_models, require_models
from lgip.models.hub import describe as describe_model_problems
from lgip.images import encode_record_images, open_rgb
from lgip.image_side import ImageSide, check_kinds, check_seed, image_flip_positives, save_examples
from lgip.lookahead import Lookahead
from lgip.method import (
    COLORS,
    FLIP_TYPES,
    NUMBER_WORDS,
    OBJECTS,
    add_typed_flips,
    advanced_paraphrases,
    cap_sample,
    infer_flip_type,
    simple_paraphrases,
    typed_flips,
)
from lgip.models import PUBLISHED_MODELS, load_model
from lgip.models.zoo import shard
from lgip.models.cards import model_card
from lgip.batch import ModelLoop
from lgip.pipeline import (
    Step,
    blockers,
    check_step_settings,
    reason_to_run,
    new_run,
    run_step,
    say_report,
    script_settings,
    select_steps,
    show,
    step_setting_hint,
)
from lgip.pixel_memory import forget_pixels
from lgip.records import caption_texts, dump_jsonl_line, flip_types, iter_records, load_records, read_json
from lgip.results import write_rows
from lgip.retrieval import Gallery, check_gallery_size, retrieval_compared, retrieval_figures, search_galleries
from lgip.scorefile import PerModel, ScoreSidecar
from lgip.scoring import Pairs, add_ci, mean_or_none
from lgip.settings import check_settings, require_int
from lgip.device import cosines
from lgip.texts import TextBank
from lgip.util import Timer, default_num_workers, file_sha256, fmt, package_versions, provenance
from lgip.outputs import OutputSet, atomic_open, refuse_overwriting_input, remove_stale_temps, write_json
from lgip.filenames import blind_file, default_output, metrics_path, score_file
from lgip.export import write_results
from lgip.trackers import finetune_logger as track_steps

__all__ = [
    "ACCELERATIONS",
    "COLORS",
    "Comparisons",
    "ConfigError",
    "DEMO_ABOUT",
    "DEMO_JSONL",
    "DEMO_MODEL",
    "FLIP_TYPES",
    "Gallery",
    "ImageSide",
    "InputError",
    "Lookahead",
    "ModelError",
    "ModelLoop",
    "ModelRun",
    "NUMBER_WORDS",
    "OBJECTS",
    "OutputSet",
    "PROTOCOLS",
    "PUBLISHED_MODELS",
    "Pairs",
    "PerModel",
    "SIGLIP_TEXT_LENGTH",
    "ScoreSidecar",
    "SkipRecord",
    "Step",
    "Terminated",
    "TextBank",
    "Timer",
    "add_ci",
    "add_typed_flips",
    "advanced_paraphrases",
    "atomic_open",
    "blind_file",
    "blockers",
    "cap_sample",
    "caption_texts",
    "check_gallery_size",
    "check_kinds",
    "check_models",
    "check_seed",
    "check_settings",
    "check_step_settings",
    "configure",
    "cosines",
    "default_num_workers",
    "default_output",
    "demo_block",
    "demo_message",
    "detail",
    "fit",
    "describe_model_problems",
    "closing",
    "dump_jsonl_line",
    "encode_record_images",
    "file_sha256",
    "eval_run_info",
    "evaluate_models",
    "is_main_process",
    "leave_out",
    "flip_types",
    "fmt",
    "hard_positive_figures",
    "forget_pixels",
    "forget_token_tables",
    "image_flip_positives",
    "infer_flip_type",
    "iter_records",
    "load_model",
    "load_records",
    "mean_or_none",
    "metrics_path",
    "model_card",
    "open_rgb",
    "package_versions",
    "parse_value",
    "prior_figures",
    "prior_values",
    "relative_figures",
    "relative_terms",
    "provenance",
    "quiet",
    "read_json",
    "reason_to_run",
    "refuse_overwriting_input",
    "remove_stale_temps",
    "require_int",
    "require_models",
    "resolve_device",
    "resolve_dtype",
    "retrieval_compared",
    "retrieval_figures",
    "run_evaluation",
    "run_generator",
    "run_main",
    "new_run",
    "run_step",
    "save_examples",
    "say_demo",
    "say_report",
    "script_call",
    "script_settings",
    "score_file",
    "search_galleries",
    "select_steps",
    "shard",
    "show",
    "step_setting_hint",
    "simple_paraphrases",
    "swap_process_state",
    "track_steps",
    "typed_flips",
    "write_comparisons",
    "write_json",
    "write_results",
    "write_rows",
]
