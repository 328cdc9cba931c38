"""lgip.classification: classification beside the probe (LGIP_SPEC.md 16, run_lgip_classification.py): zero-shot
accuracy under distribution shift, calibration before and after temperature scaling, out-of-distribution detection
and shape bias, for every scorer that gives class scores (lgip.scorers: "class_scores"), dual encoders and joint
models alike. Its modules, each importing only those above it:

  benchmark   the source "clip_benchmark": CLIP_benchmark's builder, its root checked first (it downloads the
              ImageNet family by itself), a webdataset's shards read by member, a dataset of no files by index
  datasets    DATASETS read and checked before any model loads (a bad one: an InputError naming the dataset,
              the file and line or field, and what to do); the sources "folder", "jsonl" and "shapes" (the
              shapes world's held-out images, and its out-of-distribution glyphs); `ImageSet`, what the loop
              classifies (a clip_benchmark set: benchmark's, its class names given replaced)
  figures     the figures, pure functions of class scores and labels (formulas in their docstrings): accuracy,
              NLL, ECE, the temperature split and fit, OOD scores, AUROC / FPR@95 / AUPR-in, shape bias,
              bootstrap intervals, paired comparisons, effective robustness
  rows        one model's class scores made into its row's figures and its JSONL lines; the paired comparisons
  run         the loop over MODELS: each model's class scores (ModelRun.score_classes), its row and its JSONL
              lines
"""
