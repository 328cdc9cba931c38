"""The house (README "How it is built"): no import cycle among the project's modules, the root
holding the user's scripts only, and the scripts short enough to read as recipes."""

import ast
import os
import subprocess

from conftest import ROOT

# What the project root may hold, besides folders: the user's pipeline and its shared face.
USER_SCRIPTS = {
    "common.py",
    "diff_gen_caption.py",
    "explain_flips.py",
    "make_base_jsonl.py",
    "make_perturb_with_fliptypes.py",
    "rebuttal_enhanced_lgip_by_transformation.py",
    "rebuttal_enhanced_perturb_with_fliptypes.py",
    "report.py",
    "run_all.py",
    "run_lgip_by_fliptype.py",
    "run_lgip_multi.py",
    "run_lgip_retrieval.py",
    "siglip_sanity_check.py",
    "import_benchmark.py",
    "run_lgip_images.py",
    "run_lgip_classification.py",
    "blind_audit.py",
    "debias_flips.py",
    "finetune_lgip.py",
    "wise_ft.py",
    "make_shapes_jsonl.py",
}
OTHER_FILES = {
    "README.md",
    "requirements.txt",
    "requirements-test.txt",
    "LICENSE",
    ".gitignore",
    "pyproject.toml",
}  # (pyproject: the editable install)
RECIPE_LINES = 150  # a script that is a recipe over the package fits in about this many lines
RECIPES = ["explain_flips.py", "make_base_jsonl.py", "run_lgip_images.py"]


def project_modules():
    """{dotted name: file} of every module under lgip/."""
    mods = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "lgip")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def imports(name, path, mods):
    """The project modules `name` imports anywhere in its file (a function's lazy import too), with
    the packages whose __init__ such an import runs."""
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t:  # importing a.b.c runs a/__init__ and a/b/__init__ first
                if t in mods:
                    found.add(t)
                t = t.rpartition(".")[0]
    found.discard(name)
    # a package's own __init__ is run before its modules; it is not an import of theirs
    return {m for m in found if not name.startswith(m + ".")}


def test_no_import_cycle_among_the_projects_modules():
    mods = project_modules()
    graph = {n: imports(n, p, mods) for n, p in mods.items()}
    cycles, state = [], {}

    def visit(n, stack):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                cycles.append(" -> ".join(stack[stack.index(m) :] + [m]))
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert "lgip.models.registry" in graph and "lgip.models.dual_encoders" in graph  # the walk saw the package


def test_the_root_lists_the_users_pipeline_only():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:  # not a git checkout (an unpacked archive): what is on disk
        names = [n for n in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, n))]
    else:
        names = {p.split("/")[0] for p in tracked.stdout.split() if "/" not in p}
    stray = sorted(n for n in names if n not in USER_SCRIPTS | OTHER_FILES)
    assert not stray, f"files at the project root that are not the user's pipeline: {stray}"
    assert os.path.isfile(os.path.join(ROOT, "benchmarks", "bench.py"))


def test_scripts_read_as_recipes():
    long = {
        s: n for s in RECIPES if (n := len(open(os.path.join(ROOT, s), encoding="utf-8").readlines())) > RECIPE_LINES
    }
    assert not long, f"scripts over {RECIPE_LINES} lines (machinery belongs in lgip/): {long}"


MODULE_LINES = 600  # a module of lgip/ holds one concern: about this many lines at most (open_clip's house)


def test_no_module_of_the_package_passes_600_lines():
    """Each module of lgip/ fits its concern in about MODULE_LINES lines; one that grows past is two
    concerns (split it by what it holds, as lgip/report's modules are)."""
    long = {
        os.path.relpath(p, ROOT): n
        for p in project_modules().values()
        if (n := len(open(p, encoding="utf-8").readlines())) > MODULE_LINES
    }
    assert not long, f"modules of lgip/ over {MODULE_LINES} lines: {long}"
    assert len(project_modules()) > 40  # (the walk saw the package)


def test_no_step_asks_a_spec_its_type_and_every_type_is_described_from_its_record():
    """Issue 62: outside lgip/models/ and lgip/scorers/ (scripts and benchmarks included) no code compares a spec's
    `type` with a type's name: a step asks the scorer what it gives, a figure asks the family record for its label;
    --help and a bad spec's error list the types from the records."""
    import re

    from lgip.models import FAMILIES
    from lgip.models.families import describe_types
    from lgip.report.plots import _family

    names = "|".join(map(re.escape, list(FAMILIES) + ["openclip_zoo"]))
    test = re.compile(
        rf"""(\[["']type["']\]|get\(["']type["']\)|\.type)\s*(==|!=|in\b|not in\b)\s*[(\[]?["']({names})["']"""
        rf"""|["']({names})["']\s*(==|!=)\s*\w+(\[["']type["']\]|\.get\(["']type["']\))"""
    )
    found = []
    for folder, _, files in os.walk(ROOT):
        rel = os.path.relpath(folder, ROOT)
        if rel.startswith(("lgip/models", "lgip/scorers", "tests", ".", "shared")):
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    if test.search(line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
    described = describe_types()
    assert all(line.startswith(t + " {") for t, line in zip(FAMILIES, described.splitlines()))
    assert "causal_lm {'model_id', 'score'}" in described
    labels = {t: _family({"_type": t, "_family": None}) for t in FAMILIES}
    assert labels["openclip"] == "OpenCLIP" and labels["siglip"] == "SigLIP" and labels["itm"] == "ITM cross-encoder"
    assert _family({"_type": "transformers", "_family": "siglip2"}) == "SigLIP"
    assert _family({"_type": "not_a_type", "_family": None}) == "other"
