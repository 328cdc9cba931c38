"""Two output folders of the same run compared file by file: byte for byte, else (JSON, JSONL, the
markdown, the CSV, the page with its embedded CSV) with what a second run changes masked: times made
(`created`, ISO timestamps), durations (`seconds`, `seconds_by_phase`, "<n>.<n> s"), the lookahead's
timings and run_all's recorded output mtimes. A refactor that must leave every output as it was
(the house issue) is checked with it:

    python run_all.py --DATA=demo && cp -r demo /tmp/before      # on the old commit
    python run_all.py --DATA=demo                                 # on the new one, in the same folder
    python benchmarks/compare_outputs.py /tmp/before demo

Prints a line per file that is not byte-identical and the counts; exits 1 when any differs. With --fields
(after the folders), a JSON or JSONL file that differs also gets a line per differing field (list indices as *):
how many values differ, and for numbers the largest difference relative to the larger magnitude.
"""

import json
import os
import re
import sys

a, b = sys.argv[1], sys.argv[2]
FIELDS = "--fields" in sys.argv[3:]
VOLATILE = {
    "created",
    "seconds",
    "seconds_by_phase",
    "lookahead",
    "elapsed_s",
    "wall_s",
    "outputs",
}  # (outputs: mtimes)


def scrub(o):
    if isinstance(o, dict):
        return {k: ("<t>" if k in VOLATILE else scrub(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [scrub(v) for v in o]
    return o


def text_scrub(s):
    import base64

    def uri(m):  # an embedded CSV: its times masked too
        body = base64.b64decode(m.group(2)).decode()
        return m.group(1) + text_scrub(body)

    s = re.sub(r"(data:text/csv;base64,)([A-Za-z0-9+/=]+)", uri, s)
    s = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", "<time>", s)
    s = re.sub(r"\d+\.\d+ s\b", "<s>", s)
    return s


def field_diffs(x, y, path="", out=None):
    """{field path: [values that differ, largest relative difference of numbers]} between two scrubbed values."""
    out = {} if out is None else out
    if isinstance(x, dict) and isinstance(y, dict):
        for k in dict.fromkeys(list(x) + list(y)):
            if k not in x or k not in y:
                out.setdefault(f"{path}.{k} (only in {'b' if k not in x else 'a'})", [0, 0.0])[0] += 1
            else:
                field_diffs(x[k], y[k], f"{path}.{k}", out)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for u, v in zip(x, y):
            field_diffs(u, v, f"{path}[*]", out)
    elif x != y:
        entry = out.setdefault(path or ".", [0, 0.0])
        entry[0] += 1
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        if numbers and max(abs(x), abs(y)) > 0:
            entry[1] = max(entry[1], abs(x - y) / max(abs(x), abs(y)))
    return out


def say_fields(f, xa, xb):
    for path, (n, rel) in field_diffs(xa, xb).items():
        print(f"    {path}: {n} differ" + (f", largest relative difference {rel:.2e}" if rel else ""))


files = sorted(set(os.listdir(a)) | set(os.listdir(b)))
same = masked = differ = 0
for f in files:
    pa, pb = os.path.join(a, f), os.path.join(b, f)
    if os.path.isdir(pa) or os.path.isdir(pb):
        continue
    if not (os.path.exists(pa) and os.path.exists(pb)):
        print("ONLY IN", a if os.path.exists(pa) else b, f)
        differ += 1
        continue
    ba, bb = open(pa, "rb").read(), open(pb, "rb").read()
    if ba == bb:
        same += 1
        continue
    ok = False
    if f.endswith(".json"):
        ok = scrub(json.loads(ba)) == scrub(json.loads(bb))
    elif f.endswith(".jsonl"):
        ok = [scrub(json.loads(l)) for l in ba.splitlines() if l.strip()] == [
            scrub(json.loads(l)) for l in bb.splitlines() if l.strip()
        ]
    elif f.endswith((".md", ".html", ".csv")):
        ok = text_scrub(ba.decode()) == text_scrub(bb.decode())
    if ok:
        masked += 1
        print("same but times:", f)
    else:
        differ += 1
        print("DIFFERS:", f)
        if FIELDS and f.endswith(".json"):
            say_fields(f, scrub(json.loads(ba)), scrub(json.loads(bb)))
        elif FIELDS and f.endswith(".jsonl"):
            rows = [[scrub(json.loads(line)) for line in x.splitlines() if line.strip()] for x in (ba, bb)]
            say_fields(f, *rows)
print(f"{same} byte-identical, {masked} identical but for times, {differ} differ")
sys.exit(1 if differ else 0)
