"""lgip.evaluation: one evaluation over the models of MODELS: `ModelRun` (one model over
one JSONL: its Encoder, cache, images and texts; records sharded across torchrun processes and
the scored pairs gathered on rank 0), `evaluate_models` (the loop the evaluation scripts share:
each model's whole row yielded for the caller to write; `run_evaluation`: all of them as a list),
and what one process keeps across its models.

    >>> results = run_evaluation(__file__, CONFIG, ("same_caps", "diff_caps"), evaluate, summary)
"""

import os
import time
from contextlib import closing
from dataclasses import replace

from .settings import setting
from . import accelerations, console
from .demo import demo_block, say_demo
from .models import prefix_packs
from .errors import InputError, Interrupted, ModelError
from .batch import ModelLoop
from .models.cards import model_card
from .overlap import overlap_of, overlap_text
from .util import Timer, provenance
from .outputs import OUTPUTS
from .filenames import metrics_path
from .records import load_records
from .models.encoder import resolve_device
from .models import cacheable, key_encoder, load_model
from .cache import ModelCache
from .memory import KEPT, forget_work, swap
from .texts import RunCalls, TextBank, TextCalls, resolve_text_batch_size
from .lookahead import Lookahead
from .scorers import Context, ImageRequest, ScoreRequest, for_gathering, gives, leave_out, merged, scorer_for
from .scorers.cached import CachingScorer
from .console import detail
from .controls import Comparisons
from .ranks import _gather, distributed, is_main_process
from .results import write_rows


def forget_token_tables():
    """Drop the shared TokenTables, the last prefix plan, the last run's calls and score-file
    layout (a fresh process's state: bench.py times tokenizing and building the pairs too)."""
    forget_work()


def swap_process_state(state=None):
    """What one process keeps across its models (lgip.memory: shared token tables, the last prefix plan,
    the last run's calls and score-file layout, remembered pixels, the cache folders it could not write,
    the output folder), taken out and replaced by `state` (None: empty, a fresh process's): a script's
    call from Python (lgip.entry), and bench.py's passes that must start fresh."""
    return swap(state)


def eval_run_info(script, config, enc, image_report, n_records, scored=None, records=None):
    """Provenance block stored in each model's metrics: settings, model details, bad inputs (and, given
    the model's lgip.scorers.Scored, how many unique texts it scored)."""
    info = provenance(script, config)
    info.update(
        model={
            "name": enc.name,
            "type": enc.type,
            "protocol": enc.protocol,
            "device": str(enc.device),
            "dtype": str(enc.dtype).replace("torch.", ""),
            **enc.info,
        },
        num_records_in_file=n_records,
        **image_report,
    )
    demo = demo_block(enc.demo, config.get("JSONL_PATH"), records)
    if demo is not None:  # (absent for an ordinary run)
        info["demo"] = demo

    if scored is not None:
        info["num_unique_texts_encoded"] = scored.texts["unique"]
    return info


def write_comparisons(script, config, paired):
    """`<stem>__LGIP_comparisons.metrics.json`: the paired differences of the run's models (LGIP_SPEC.md
    section 9), merged with an earlier run's as the list files are; a line per model pair said."""
    rows = paired.rows(os.path.basename(script), setting(config, "BOOTSTRAP"), setting(config, "BOOTSTRAP_SEED"))
    for r in rows:
        if r["flip_type"] is None:
            ci = r["diff_ci95"]
            detail(
                f"{r['a']} - {r['b']}: {r['figure']} {r['diff']:+.4f}"
                + (
                    f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" + (": the interval excludes 0" if r["excludes_zero"] else "")
                    if ci
                    else ""
                )
                if r["diff"] is not None
                else f"{r['a']} - {r['b']}: {r['figure']} n/a",
                flush=True,
            )
    detail(f"-> {write_rows(metrics_path(config['JSONL_PATH'], 'LGIP_comparisons.metrics.json'), rows)}", flush=True)


class ModelRun:
    """One model over one JSONL: its Encoder, cache, text bank and scorer (lgip.scorers).

    Under torchrun each process takes every world-th record; `score` gathers the scored pairs
    on rank 0 in record order, so the metrics equal a single process's. A re-run (its model's
    cache holds texts) starts with a KeyEncoder that only makes cache keys; the scorer loads the
    weights only when a text or an image is not in the cache.
    >>> run = ModelRun(spec, records, CONFIG)       # loads the model (or, on a re-run, its cache keys)
    >>> inv, sens = run.pairs(published_calls)      # published_calls(records, ks, calls): the pairs, as data
    >>> scored = run.score(inv, sens)               # a Scored; on ranks other than 0 its pairs are None
    """

    def __init__(self, spec, records, config, enc=None, lookahead=None):
        t0 = time.perf_counter()
        self.rank, self.world = distributed()
        self.lookahead = lookahead  # a Lookahead over the run's later models, or None
        device = config["DEVICE"]
        if self.world > 1 and resolve_device(device) == "cuda":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', self.rank))}"
        self.config, self.records, self.spec, self.device = config, records, spec, device
        cache_dir = config.get("CACHE_DIR") if cacheable(spec) else None  # (a model in memory: never cached)
        if cache_dir == "auto":  # beside the input, or in OUTPUT_DIR: nothing of a run's lands beside its input then
            cache_dir = os.path.join(
                config.get("OUTPUT_DIR") or os.path.dirname(os.path.abspath(config["JSONL_PATH"])), ".lgip_cache"
            )
        flush_s = setting(config, "CACHE_FLUSH_S")
        # A re-run may find every text and image in the cache: it starts with an Encoder that makes
        # the cache keys only, and loads the weights in score() if anything is missing. (The cache
        # is the model's either way: its folder depends on the spec, protocol and dtype alone.)
        light = key_encoder(spec, config["PROTOCOL"], device, config["DTYPE"]) if enc is None and cache_dir else None
        self.cache = ModelCache(cache_dir, light, spec, flush_s=flush_s) if light is not None else None
        if light is not None and self.cache.has_entries():
            enc = light
        self.enc = enc or load_model(spec, config["PROTOCOL"], device, config["DTYPE"])
        if cache_dir and self.cache is None:
            self.cache = ModelCache(cache_dir, self.enc, spec, flush_s=flush_s)
        self.image_root = config.get("IMAGE_ROOT") or os.path.dirname(os.path.abspath(config["JSONL_PATH"]))
        self.mine = range(self.rank, len(records), self.world)
        # The records the pairs are built over (the published calls: `pairs`). Images are read in
        # score(), beside the texts; a record whose image cannot be read is dropped there, with all
        # its pairs (the Scored's `ok` and `failed`).
        self.ok = list(self.mine)
        self.bank = TextBank(self.enc, config["NUM_WORKERS"])
        # what scores this model's pairs (lgip.scorers: its family's kind), its cache around it
        self.scorer = CachingScorer(scorer_for(spec), self.cache)
        self.scored = None  # the Scored of score(), for the run block (info) and the model card
        self.ahead = None  # what the Lookahead did ahead for this model (score(): its scorer settles it)
        self.compared = []  # (figure, flip type, rec, values) for the paired comparisons (compare)
        self._mark = time.perf_counter()
        self.seconds = {"load": round(self._mark - t0, 3)}  # where the model's time went (see info)

    @property
    def is_main(self):
        return self.rank == 0

    def pairs(self, build):
        """The Pairs of `build(records, ks, calls)`: the evaluation's published calls as data, a
        function of the records alone (ks: this process's record indices; calls: a TextCalls whose
        add_call gives a slot per text), which this model's text bank then encodes. Built by a run's
        first model and adopted by the next ones of the same process, records and shard; each model
        gets its own copies of the Pairs to score.
        >>> inv, sens = run.score(*run.pairs(published_calls)).pairs
        """
        import copy

        if not accelerations.SHARED_CALLS:
            calls = TextCalls()
            pairs = build(self.records, self.ok, calls)
            self.bank.calls = calls
            return pairs
        last = KEPT.calls[0] if KEPT.calls is not None else None
        if last is not None and last[0] is build and last[1] is self.records and last[2:] == (self.rank, self.world):
            self.bank.adopt(KEPT.calls[1])
        else:
            calls = TextCalls()
            pairs = build(self.records, self.ok, calls)
            self.bank.calls, self.bank.run_calls = calls, RunCalls(calls.copy(), pairs)
            KEPT.calls = ((build, self.records, self.rank, self.world), self.bank.run_calls)
        return [copy.copy(p) for p in self.bank.run_calls.pairs]

    def score(
        self, *pairs_list, text_cos=False, keep_embeddings=False, controls=False, hard_positives=(), relative=False
    ):
        """Score each Pairs with this model (its scorer: lgip.scorers) and return the Scored, on rank 0
        every process's merged (None on the others, where its pairs are None).
        keep_embeddings: also keep this process's text table and slot -> row map (`text_embeddings`;
        images: `image_embeddings`, by record), for figures made from the embeddings.
        controls: also each pair's mean score with the other images (LGIP_SPEC.md section 9).
        hard_positives: (flips, paraphrases) positions in pairs_list whose flips are marked as
        section 10 says (lgip.controls).
        relative: also the relative invariance error's denominator terms (LGIP_SPEC.md 13: `relative`)."""
        self.seconds["pairs"] = round(time.perf_counter() - self._mark, 3)
        request = ScoreRequest(
            list(pairs_list),
            text_cos=text_cos,
            keep_embeddings=keep_embeddings,
            controls=controls,
            hard_positives=tuple(hard_positives),
            relative=relative,
        )
        local = self.scorer.score(self.context(), request)
        self.seconds.update(local.seconds)
        self.ahead = local.ahead
        if self.world == 1:
            self._check_finite([local.nonfinite])
            self._check_usable(local.n_samples, local.image_report)
            return self._scored(local)
        gathered = _gather(for_gathering(local), self.world)
        self._check_finite([g.nonfinite for g in gathered])  # (on every rank: all stop together, or none)
        # every rank has every rank's counts (all_gather): all stop together, or none
        self._check_usable(
            sum(g.n_samples for g in gathered),
            {
                "num_failed_images": sum(g.image_report["num_failed_images"] for g in gathered),
                "failed_images": [f for g in gathered for f in g.image_report["failed_images"]],
            },
        )
        if not self.is_main:
            self._scored(local)
            return replace(local, pairs=[None] * len(local.pairs))
        return self._scored(merged(local, gathered))

    def context(self):
        """What this model's scorer works with on this process (lgip.scorers.Context)."""
        config = self.config
        return Context(
            records=self.records,
            mine=self.mine,
            image_root=self.image_root,
            bank=self.bank,
            cache=self.cache,
            lookahead=self.lookahead,
            world=self.world,
            gather=self.all_gathered,
            model=lambda: self.enc,
            load_weights=self.load_weights,
            image_batch_size=config["IMAGE_BATCH_SIZE"],
            text_batch_size=config["TEXT_BATCH_SIZE"],
            num_workers=config["NUM_WORKERS"],
            pixel_memory_gb=setting(config, "PIXEL_MEMORY_GB"),
            prior_images=setting(config, "PRIOR_IMAGES"),
        )

    def score_images(self, items, captions):
        """This process's altered images (LGIP_SPEC.md 11) scored with `captions` (a list per item) by this
        model's scorer, beside its last Scored (the captions with their originals, keep_embeddings):
        an lgip.scorers.ImageScores."""
        return self.scorer.score_images(self.context(), self.scored, ImageRequest(list(items), list(captions)))

    def score_classes(self, request):
        """This process's images of each task classified by this model's scorer (LGIP_SPEC.md 16: a
        lgip.scorers.ClassRequest): a lgip.scorers.ClassScores (its cache, weights and workers as `score`'s)."""
        return self.scorer.score_classes(self.context(), request)

    def _scored(self, scored):
        """The run's own record of its scoring (its run block reads it: `info`); `scored` returned."""
        self.scored = scored
        self._mark = time.perf_counter()
        self.seconds["scoring"] = round(self._mark - scored.scoring_started, 3)
        return scored

    def compare(self, figure, flip_type, rec, values, denominator=None):
        """Keep a figure's per-pair values (by image) for the paired comparisons of the run's models
        (lgip.controls.Comparisons; written by run_evaluation once two models are done); denominator:
        (rec, values) of a ratio's divisor (invariance_error_rel)."""
        self.compared.append((figure, flip_type, rec, values, denominator))

    def _check_finite(self, reports):
        """ModelError (before any metrics or score file is written) when an embedding of the model is
        NaN or infinite: every figure it enters would be NaN, and a NaN gap counts as not positive."""
        images, texts = sum(r["images"] for r in reports), sum(r["texts"] for r in reports)
        if not images and not texts:
            return
        first_image = next((r["first_image"] for r in reports if r["first_image"]), None)
        first_text = next((r["first_text"] for r in reports if r["first_text"]), None)
        where = "; ".join(
            w
            for w in (
                f"first image: line {first_image[0]}, {first_image[1]}" if first_image else "",
                f"first text: {first_text[:120]!r}" if first_text is not None else "",
            )
            if w
        )
        dtype = str(self.enc.dtype).replace("torch.", "")
        why = (
            f'Run in {dtype}, a model can overflow: run it with DTYPE="float32".'
            if dtype in ("float16", "bfloat16")
            else f"In {dtype} it is the model's own: NaN in its weights, or its code."
        )
        cached = (
            f" Embeddings read from the cache are checked too: remove {self.cache.dir} to encode them again."
            if self.cache is not None
            else ""
        )
        counted = self.scorer.not_finite(images, texts)
        raise ModelError(
            f"model {self.enc.name!r}: {counted} not finite "
            f"(NaN or inf; {where}), so no figure of it can be computed. {why}{cached} "
            f"No metrics were written for it."
        )

    def _check_usable(self, n_usable, image_report):
        """InputError (before any metrics or score file is written) when no record has both a
        readable image and a caption: a run of all-None metrics, exit status 0, would pass for a
        result."""
        if n_usable:
            return
        first = image_report["failed_images"][:1]
        why = f" (first: {first[0]['path']}: {first[0]['error']})" if first else ""
        raise InputError(
            f"no usable records: {len(self.records)} in {self.config['JSONL_PATH']}, "
            f"{image_report['num_failed_images']} unreadable images{why}, "
            f"{sum(1 for _, r in self.records if not r['orig_captions'])} without captions "
            f"(IMAGE_ROOT: {self.image_root}). No metrics were written."
        )

    def gathered(self, obj):
        """`obj` of every process, in rank order, on rank 0 (None on the others); [obj] alone.
        Only rank 0 receives them (a retrieval gallery's embeddings are GBs at 40,000 records)."""
        import torch.distributed as dist

        if self.world == 1:
            return [obj]
        out = [None] * self.world if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gathered(self, obj):
        """`obj` of every process, in rank order, on every process ([obj] alone): what all must agree
        on (run_lgip_images.py's readable records, which its image flips pair)."""
        return _gather(obj, self.world)

    def load_weights(self):
        """Load the weights of a run that began without them (every text and image of `score` was
        cached: see __init__) when the scorer or the script needs more than the cache holds
        (run_lgip_images.py's altered images: the cache is asked for them before); nothing when they
        are loaded."""
        if self.enc.weights_loaded:
            return
        t0 = time.perf_counter()
        self.enc = self.bank.enc = load_model(self.spec, self.config["PROTOCOL"], self.device, self.config["DTYPE"])
        self.seconds["load"] = round(self.seconds["load"] + time.perf_counter() - t0, 3)

    def release(self):
        """The model is done with: a caller's model in memory goes back in the mode it came in."""
        self.enc.release()

    def phase_done(self, name):
        """Count the time since the last phase ended as the script's own phase `name`."""
        now = time.perf_counter()
        self.seconds[name], self._mark = round(now - self._mark, 3), now

    def finished(self):
        """Called once the evaluation's metrics are made: the time since scoring (confidence
        intervals, the score file) is its last phase."""
        self.seconds["metrics_and_scores_file"] = round(time.perf_counter() - self._mark, 3)

    def info(self, script):
        scored = self.scored
        info = eval_run_info(
            script, self.config, self.enc, scored.image_report, len(self.records), scored, self.records
        )
        info["num_processes"] = self.world
        # which of lgip/accelerations.py's switches were on and ran for this model; why not, for one on that did not
        info["accelerations"], info["accelerations_not_applied"] = accelerations.applied(self.enc)
        # in order: loading the model; building the pairs; waiting for work done ahead for this model; cache
        # lookup + tokenizing; forking the tokenizers; forking the image decoders; texts (images polled between);
        # images left after; similarities (and gathering them from other processes); a script's own phases
        # (phase_done: run_lgip_retrieval's "retrieval"); confidence intervals and score file
        info["seconds_by_phase"] = self.seconds
        info["lookahead"] = self.ahead  # jobs done ahead for this model while earlier ones ran (None: no Lookahead)
        info["text_batch_size"] = resolve_text_batch_size(self.config["TEXT_BATCH_SIZE"], self.enc.device)
        # token positions of the encoded texts; computed: fewer when prefixes are shared (pack_nodes 0: no prefix packs)
        packs = self.enc.encode_packs is not None and accelerations.PREFIX_PACKS
        info["text_positions"] = dict(scored.texts["positions"], pack_nodes=prefix_packs.PACK_NODES if packs else 0)
        info["image_sources"] = (
            scored.image_sources
        )  # unique images: decoded here, from an earlier model's pixels, cached embeddings
        if self.cache is not None:
            # resumed: [from the cache, in all] of this process's unique texts and images
            info["cache"] = {"dir": self.cache.dir, **self.cache.stats, "resumed": scored.resumed}
        elif not cacheable(self.spec):
            info["cache"] = {
                "dir": None,
                "why": "a model in memory is never cached (nothing on disk names its weights)",
            }
        return info


def _interrupted(config, models, finished, per_model_files):
    """What an interrupted evaluation finished, and how to resume it."""
    current = (models[len(finished)] or {}).get("name") if len(finished) < len(models) else None
    done = (
        f"finished {len(finished)} of {len(models)} models ({', '.join(finished)})" if finished else "no model finished"
    )
    scores = " and score files" if config.get("WRITE_SCORES") else ""
    written = (
        f"their metrics{scores} are written; "
        if per_model_files and finished
        else "no metrics file was written (it is written at the end)"
        + (", the finished models' score files are; " if scores and finished else "; ")
    )
    cache = config.get("CACHE_DIR")
    held = (
        "their embeddings, and the texts and images the interrupted one had encoded, are"
        if finished
        else "the texts and images it had encoded are"
    )
    where = ".lgip_cache " + (f"in {config['OUTPUT_DIR']}" if config.get("OUTPUT_DIR") else "beside the input")
    resume = (
        f"{held} in the cache ({where if cache == 'auto' else cache}): the same "
        f"command resumes there (a finished model is read from the cache, without loading its weights)"
        if cache
        else "CACHE_DIR is None, so a re-run starts from the beginning"
    )
    return f"during model {current}; {done}; {written}{resume}."


def check_records(path, records):
    """What the run block says of the input: records without captions (skipped: they make no
    pair and the published scripts do not count them) and repeated image_path values (kept and
    counted twice, as the published scripts do: warned). InputError when the file holds no
    record at all, before any model is loaded."""
    if not records:
        raise InputError(
            f"no usable records: 0 in {path} (the file is empty or holds only blank lines). Nothing was run."
        )
    no_caps = [line for line, rec in records if not rec["orig_captions"]]
    if no_caps:
        print(
            f"warning: {path}: {len(no_caps)} record(s) without captions, skipped (lines "
            f"{', '.join(map(str, no_caps[:5]))}{', ...' if len(no_caps) > 5 else ''})",
            flush=True,
        )
    seen, dup_lines = set(), []
    for line, rec in records:
        if rec["image_path"] in seen:
            dup_lines.append(line)
        seen.add(rec["image_path"])
    if dup_lines:
        print(
            f"warning: {path}: {len(dup_lines)} record(s) repeat an earlier record's image_path (lines "
            f"{', '.join(map(str, dup_lines[:5]))}{', ...' if len(dup_lines) > 5 else ''}); they are kept and "
            f"counted again, as the published scripts do: num_samples counts them and the intervals narrow. "
            f"Remove the repeats unless meant.",
            flush=True,
        )
    return {
        "num_records_without_captions": len(no_caps),
        "records_without_captions_lines": no_caps[:20],
        "num_duplicate_image_paths": len(dup_lines),
        "duplicate_image_path_lines": dup_lines[:20],
    }


def evaluate_models(script, config, per_caption_fields, evaluate, summary, needs=(), per_model_files=False):
    """The evaluation scripts' loop, as a generator: each model of MODELS through the script's
    `evaluate(run) -> its figures` (the pairs it scores and what it makes of them), yielded on rank 0
    as a whole row (the model's card and the run block added here) for the caller to write, its
    `summary(row)` printed once the caller has it. Then every row's run block gets the models the
    run skipped (ON_MODEL_ERROR "skip": lgip.batch), and the paired comparisons are written.
    needs: what the evaluation takes from a model's scorer beyond its scores (lgip.scorers.PROVIDES:
    "embeddings" for retrieval and the image side): a model whose scorer does not give it is left out
    before any work, with a line saying why (lgip.scorers.leave_out); with none left, nothing is done.
    per_model_files: the caller writes each row as it comes (an interruption says they are written).

        >>> with closing(evaluate_models(__file__, CONFIG, FIELDS, evaluate, summary)) as rows:
        ...     for row in rows: write_model(row)
    """
    if needs:
        config = dict(config, MODELS=leave_out(config["MODELS"], needs, os.path.basename(script)))
        if not config["MODELS"]:
            return
    records = load_records(config["JSONL_PATH"], per_caption_fields)
    input_report = check_records(config["JSONL_PATH"], records)
    if config.get("CACHE_DIR"):  # said should an output not be written: the work is not lost
        OUTPUTS.resume = (
            "the embeddings encoded so far are in the cache: once there is room, the same command "
            "re-runs from it (a model whose embeddings are all there without loading its weights)"
        )
    results = []
    loop = ModelLoop(config, config["MODELS"], distributed=distributed()[1] > 1)  # (models that cannot be had: first)
    models = loop.runnable
    say_demo(models, config["JSONL_PATH"], records)
    switched = accelerations.switch_off(setting(config, "ACCELERATIONS_OFF"))
    ahead = (
        Lookahead(models[1:], config["PROTOCOL"], config["NUM_WORKERS"], setting(config, "PIXEL_MEMORY_GB"))
        if setting(config, "LOOKAHEAD") and accelerations.LOOKAHEAD and len(models) > 1
        else None
    )
    finished, paired = [], Comparisons()
    try:
        for spec in models:
            with Timer() as t, loop.model(spec) as ok:  # (ON_MODEL_ERROR "skip": a model that fails is left out)
                run = ModelRun(spec, records, config, lookahead=ahead)
                try:
                    metrics = evaluate(run)
                finally:
                    run.release()
                run.finished()
            if not ok or not run.is_main:
                continue
            row = whole_row(metrics, spec, run, script, input_report, t.seconds)
            for compared in run.compared:
                paired.add(run.enc.name, *compared, score_kind=run.enc.score_kind)
            results.append(row)
            finished.append(run.enc.name)
            yield row  # (the caller writes it: a per-model file at once)
            no_caps = input_report["num_records_without_captions"]
            context = (
                f"({run.scored.n_samples} records, {run.scored.image_report['num_failed_images']} unreadable images, "
                + (f"{no_caps} without captions (skipped), " if no_caps else "")
                + f"{t.seconds:.1f} s)"
                + (f"; {overlap_text(row['images_seen_overlap'])}" if "images_seen_overlap" in row else "")
                + loop.progress()
            )
            print("\n".join(model_lines(run.enc.name, summary(row), context)), flush=True)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted(config, models, finished, per_model_files)) from None
    finally:
        if ahead is not None:
            ahead.close()
        accelerations.restore(switched)
    if distributed()[0] == 0:
        loop.finish(results)
    if len(paired.models) >= 2:
        write_comparisons(script, config, paired)
    if distributed()[1] > 1:
        # Every rank ends here together, then leaves the group, which stops its threads (nothing
        # else holds it: see distributed()): a rank that exited with the group's threads still
        # running aborted at interpreter exit now and then ("terminate called without an active
        # exception").
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def whole_row(figures, spec, run, script, input_report, seconds):
    """One model's metrics row: the script's figures (model_tag first), then what the model is
    (`model_card`, LGIP_SPEC.md 12) and what made the row (`run`: settings, versions, the model's
    details, bad inputs, timings); `images_seen_overlap` between them where the model may have seen the probed images
    in training (lgip.overlap)."""
    figures["score_kind"] = run.enc.score_kind  # what s is (LGIP_SPEC.md 13): its units are the row's figures'
    if not run.scored.gives("images"):  # a blind model (LGIP_SPEC.md 15): a text-prior control, its card no image tower
        figures["reads_images"] = False
    if run.scored.prior_images is not None:  # the other images a text's prior score is a mean over
        figures["prior_images"] = run.scored.prior_images
    figures["model_card"] = card = model_card(spec, run.enc, run.scored.image_embeddings)
    seen = overlap_of(spec, card, run.records, run.image_root)  # (lgip.overlap: absent when there is no question)
    if seen is not None:
        figures["images_seen_overlap"] = seen
    figures["run"] = dict(run.info(script), **input_report, seconds=round(seconds, 3))
    return figures


def model_lines(name, said, context):
    """A model's result lines: `name: <said's first line> <context>` (its records, time, overlap, progress), the
    context on its own indented line where the first would reach LINE, then said's other lines indented."""
    head, *rest = said.split("\n")
    first = f"{name}: {head} {context}"
    lines = [first] if len(first) < console.LINE else [f"{name}: {head}", f"  {context}"]
    return lines + [f"  {x}" for x in rest]


def run_evaluation(script, config, per_caption_fields, evaluate, summary, needs=()):
    """evaluate_models' rows as a list on rank 0 (None on the other ranks), for a script that writes
    them once all are done (the list file).

        >>> results = run_evaluation(__file__, CONFIG, ("same_caps", "diff_caps"), evaluate, summary)
    """
    main = is_main_process()  # (asked before the loop: its end leaves torchrun's process group)
    with closing(evaluate_models(script, config, per_caption_fields, evaluate, summary, needs)) as rows:
        results = list(rows)
    if needs and not any(gives(m, needs) for m in config["MODELS"] if isinstance(m, dict)):
        return None  # (every model was left out, and said so: nothing to write)
    return results if main else None
