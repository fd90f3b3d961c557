#!/usr/bin/env python3
"""scripts/clang-tidy-cached: a clean unit is remembered, and a change to anything clang-tidy reads runs it again.

make lint trusts the cache to skip clang-tidy, so a key that misses an input would hide a finding. Each step
changes one input of a small project in a temporary directory: a header the unit includes (its code, then
a comment only), the configuration, a header's own .clang-tidy, the compile command. The script's log
(GPUGUARD_TIDY_CACHE_LOG) tells "ran" from "remembered"; where a change is a finding, clang-tidy's own
report shows it. The cache's failures fall back to clang-tidy: a unit that does not preprocess, one with no
compile command, a cache directory that cannot be written.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
wrapper = os.path.join(root, "scripts", "clang-tidy-cached")
failures = []
checked = 0


def check(condition, message):
    global checked
    checked += 1
    if not condition:
        failures.append(message)
        print("FAIL:", message)


with tempfile.TemporaryDirectory() as project:
    cache = os.path.join(project, "cache")
    trail = os.path.join(project, "cache.log")
    unit = os.path.join(project, "unit.cpp")

    def write(name, text):
        os.makedirs(os.path.dirname(os.path.join(project, name)), exist_ok=True)
        with open(os.path.join(project, name), "w", encoding="utf-8") as f:
            f.write(text)

    def commands(extra=""):
        write("compile_commands.json", json.dumps([{
            "directory": project, "file": unit,
            "command": f"c++ -std=c++17 {extra} -I{project}/inc -o unit.o -c {unit}"}]))

    def tidy(cache_dir=cache):
        """clang-tidy-cached's exit status, its output, and what its log says it did."""
        open(trail, "w", encoding="utf-8").close()
        env = dict(os.environ, GPUGUARD_TIDY_CACHE_DIR=cache_dir, GPUGUARD_TIDY_CACHE_LOG=trail)
        run = subprocess.run([wrapper, f"-p={project}", "-quiet", unit], env=env, capture_output=True,
                             text=True, check=False)
        with open(trail, encoding="utf-8") as f:
            did = f.read().split()
        return run.returncode, run.stdout + run.stderr, did[0] if len(did) == 2 and did[1] == unit else did

    def entries():
        return [os.path.join(d, n) for d, _, names in os.walk(cache) for n in names]

    naming = ("Checks: '-*,modernize-use-override,readability-identifier-naming'\nWarningsAsErrors: '*'\n"
              "HeaderFilterRegex: '.*'\nCheckOptions:\n  - {key: readability-identifier-naming.FunctionCase, "
              "value: lower_case}\n")
    clean_header = "struct Base { virtual ~Base() = default; virtual void f(); };\n" \
                   "struct Derived : Base { void f() override; };\nvoid do_thing();\n"
    write(".clang-tidy", naming)
    write("inc/shapes.hpp", clean_header)
    write("unit.cpp", '#include "shapes.hpp"\nvoid Derived::f() {}\n')
    commands()

    rc, out, did = tidy()
    check(rc == 0 and did == "ran" and len(entries()) == 1,
          f"an empty cache runs clang-tidy, and remembers the clean unit: {rc} {did} {out}")
    rc, out, did = tidy()
    check(rc == 0 and out == "" and did == "remembered",
          f"the same unit again is remembered, clang-tidy not run: {rc} {did} {out}")

    write("inc/shapes.hpp", clean_header.replace("void f() override;", "virtual void f();"))
    for _ in range(2):
        rc, out, did = tidy()
        check(rc != 0 and did == "ran" and "shapes.hpp" in out and "modernize-use-override" in out,
              f"a changed header runs clang-tidy, whose finding is reported every time: {rc} {did} {out}")
    write("inc/shapes.hpp", "// a comment is content too (NOLINT lives in comments)\n" + clean_header)
    rc, out, did = tidy()
    check(did == "ran", f"a header changed only in a comment runs clang-tidy: {rc} {did} {out}")
    write("inc/shapes.hpp", clean_header)
    rc, out, did = tidy()
    check(rc == 0 and did == "remembered", f"the header as it was is remembered again: {rc} {did} {out}")

    write(".clang-tidy", naming.replace("-*,", "-*,bugprone-*,"))
    rc, out, did = tidy()
    check(did == "ran", f"a changed configuration runs clang-tidy: {rc} {did} {out}")
    write(".clang-tidy", naming.replace("'.*'", "'none/'"))
    rc, out, did = tidy()
    check(did == "ran", f"a header filter that no longer selects the header runs clang-tidy: {rc} {did} {out}")
    write(".clang-tidy", naming)

    write("inc/.clang-tidy", "InheritParentConfig: true\nCheckOptions:\n"
          "  - {key: readability-identifier-naming.FunctionCase, value: CamelCase}\n")
    rc, out, did = tidy()
    check(rc != 0 and did == "ran" and "do_thing" in out,
          f"a .clang-tidy beside a header (the naming check reads it) runs clang-tidy, which reports it: "
          f"{rc} {did} {out}")
    os.remove(os.path.join(project, "inc/.clang-tidy"))

    commands("-DVARIANT=1")
    rc, out, did = tidy()
    check(did == "ran", f"a changed compile command runs clang-tidy: {rc} {did} {out}")
    commands()
    rc, out, did = tidy()
    check(rc == 0 and did == "remembered", f"everything as it was is remembered: {rc} {did} {out}")

    write("unit.cpp", '#include "shapes.hpp"\nvoid Derived::f() {}\n#include "missing.hpp"\n')
    rc, out, did = tidy()
    check(rc != 0 and did == "ran" and "missing.hpp" in out,
          f"a unit that does not preprocess (no key) runs clang-tidy, which says why: {rc} {did} {out}")
    write("unit.cpp", '#include "shapes.hpp"\nvoid Derived::f() {}\n')
    write("compile_commands.json", "[]")
    rc, out, did = tidy()
    check(did == "ran", f"a unit with no compile command runs clang-tidy: {rc} {did} {out}")
    commands()

    write("not-a-directory", "")
    rc, out, did = tidy(cache_dir=os.path.join(project, "not-a-directory", "cache"))
    check(rc == 0 and did == "ran" and "cannot remember" in out and "Traceback" not in out,
          f"a cache that cannot be written: clang-tidy's result all the same, and why: {rc} {did} {out}")

    env = dict(os.environ, GPUGUARD_TIDY_CACHE_DIR=cache, GPUGUARD_TIDY_CACHE="off",
               GPUGUARD_TIDY_CACHE_LOG=trail)
    open(trail, "w", encoding="utf-8").close()
    subprocess.run([wrapper, f"-p={project}", "-quiet", unit], env=env, capture_output=True, check=False)
    with open(trail, encoding="utf-8") as f:
        check(f.read().startswith("ran "), "GPUGUARD_TIDY_CACHE=off runs clang-tidy")

    kept = entries()
    # The clean states: as first written, the header with a comment, bugprone's configuration, the filter
    # that selects no header, the command with VARIANT; the others had findings or no key.
    check(len(kept) == 5, f"one entry for each clean state of the project: {kept}")
    old = time.time() - 31 * 86400
    for path in kept:
        os.utime(path, (old, old))
    env = dict(os.environ, GPUGUARD_TIDY_CACHE_DIR=cache)
    subprocess.run([wrapper, "--prune", "30"], env=env, check=True, capture_output=True)
    check(not entries(), "--prune 30 removes entries unused for 31 days")

if failures:
    sys.exit(1)
print(f"clang-tidy-cached: {checked} checks passed")
