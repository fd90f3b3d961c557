#!/usr/bin/env python3
"""A path the docs or the code's comments cite is a promise that the reader will find it there. This fails when
one does not exist in the repository:
- in README.md and docs/*.md: a path from one of the repository's top-level folders (`src/nri/wire.cpp`,
  `tests/fixtures/enforcer/`), a public header as it is included (`gpuguard/nri/messages.hpp`), a bare
  backticked source or header name (`decision.hpp`: some file of the repository has that name), and a
  relative Markdown link (`[audit](audit.md)`);
- in the comments of src/, include/, tests/, fuzz/, bench/, proto/ (`//`) and of the CMake files, the
  Makefile and scripts/ (`#`): the first two of those.
`{a,b}` in a path stands for both. What lies outside the repository, or is made by a build, is named below
with its reason.
Usage: paths_test.py SOURCE_DIR"""
import os
import re
import sys

root = sys.argv[1]
failures = []
checked = 0

TOP = "src|include|tests|docs|scripts|bench|fuzz|e2e|charts|manifests|proto|certs"
top_path = re.compile(r"(?<![\w./-])(?:" + TOP + r")/[\w.{},/-]*")
header = re.compile(r"(?<![\w./-])gpuguard/[a-z_]+/[\w]+\.hpp")
bare_name = re.compile(r"`([\w-]+\.(?:hpp|cpp|proto|py|sh))`")  # .go: the names cited are mostly NVIDIA's
link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")

# Cited, and rightly, though not in the repository.
NOT_OURS = [
    (re.compile(r"^src/cli/common\.c$"), "libnvidia-container's CLI, whose sscanf the toolkit's model follows"),
    (re.compile(r"^src/cmd/"), "a path inside a peer's source tree (../shared/peers)"),
    (re.compile(r"^certs/dev"), "made by scripts/generate-dev-certs (make certs), not checked in"),
    (re.compile(r"^manifests/[\w-]+/certs"), "made at install, not checked in"),
    (re.compile(r"^e2e/\.cache"), "the harness's download and build cache"),
]


def expand(path):
    """`a/{b,c}/d` -> a/b/d, a/c/d."""
    brace = re.search(r"\{([^{}]*)\}", path)
    if not brace:
        return [path]
    return [p for choice in brace.group(1).split(",") for p in expand(path[: brace.start()] + choice + path[brace.end() :])]


names = set()
for directory, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
    names.update(files)


def exists(path):
    path = path.rstrip(".,;:")
    if any(pattern.search(path) for pattern, _ in NOT_OURS):
        return True
    return os.path.exists(os.path.join(root, path))


def check(where, text, in_doc):
    global checked
    for match in top_path.finditer(text):
        if text[match.end() : match.end() + 1] in ("<", "*"):
            continue  # a pattern, as e2e/k8s-<minor> or tests/fixtures/*/
        for path in expand(match.group(0).rstrip(".,;:")):
            if path.endswith("/") and path.count("/") == 1:
                continue  # a folder by its name alone, as prose says "tests/"
            checked += 1
            if not exists(path):
                failures.append(f"{where}: cites {path}, which does not exist")
    for token in header.findall(text):
        if not os.path.exists(os.path.join(root, "include", token)):
            failures.append(f"{where}: cites {token}, which is not under include/")
    if in_doc:
        for name in bare_name.findall(text):
            if name not in names:
                failures.append(f"{where}: cites `{name}`, and no file of the repository has that name")


def comments(path):
    """The comment text of a source file, a line each, with its line number."""
    marker = "#" if path.endswith(("CMakeLists.txt", "Makefile", ".sh", ".py", ".cmake")) or "/scripts/" in path else "//"
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            at = line.find(marker)
            if at >= 0:
                yield number, line[at:]


docs = ["README.md"] + sorted("docs/" + n for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
for doc in docs:
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        lines = f.read().splitlines()
    fenced = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        check(f"{doc}:{number}", line, in_doc=True)
        if fenced:
            continue
        for target in link.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            if not os.path.exists(os.path.normpath(os.path.join(root, os.path.dirname(doc), target))):
                failures.append(f"{doc}:{number}: links to {target}, which does not exist")

sources = [os.path.join(root, n) for n in ("CMakeLists.txt", "Makefile")]
for top in ("src", "include", "tests", "fuzz", "bench", "proto", "scripts"):
    for directory, _, files in os.walk(os.path.join(root, top)):
        for name in files:
            if name.endswith((".cpp", ".hpp", ".h", ".proto", ".sh", ".py", "CMakeLists.txt")) or top == "scripts":
                sources.append(os.path.join(directory, name))
for path in sorted(sources):
    if path == os.path.abspath(__file__):
        continue  # its own docstring names made-up paths
    for number, text in comments(path):
        check(f"{os.path.relpath(path, root)}:{number}", text, in_doc=False)

# A reader that finds next to nothing has stopped reading: the tree cites nearly 600 paths.
if checked < 500:
    failures.append(f"only {checked} cited paths found: the patterns above no longer match how paths are cited")
for failure in failures:
    print("FAIL", failure)
print(f"{len(docs)} docs and {len(sources)} source files read; {checked} cited paths checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
