#!/usr/bin/env python3
"""scripts/clang-tidy-cached: a clean unit is remembered, and a change to anything clang-tidy reads runs it again.

make lint trusts the cache to skip clang-tidy, so a key that misses an input would hide a finding. Each step
changes one input of a small project in a temporary directory: a header the unit includes (its code, then
a comment only), the configuration, a header's own .clang-tidy, the compile command, a header that only a
second compile command of the unit includes, a header that only clang-tidy's parse includes
(__clang_analyzer__). The script's log (GPUGUARD_TIDY_CACHE_LOG) tells "ran" from "remembered"; where a
change is a finding, clang-tidy's own report shows it. The cache's failures fall back to clang-tidy: a unit
that does not preprocess, one with no compile command, options other than run-clang-tidy's, a cache
directory that cannot be written. Last, the same project in two other clones of the script: one hits the
first's entry, the other, whose path the header filter selects, runs clang-tidy and reports its finding.
"""
import shutil
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


def environment(**settings):
    """This process's environment without the script's own settings, which would change what it does."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("GPUGUARD_TIDY_") and k != "CLANG_TIDY"}
    return dict(kept, **settings)


with tempfile.TemporaryDirectory() as project:
    cache = os.path.join(project, "cache")
    trail = os.path.join(project, "cache.log")
    unit = os.path.join(project, "unit.cpp")

    def write(name, text):
        os.makedirs(os.path.dirname(os.path.join(project, name)), exist_ok=True)
        with open(os.path.join(project, name), "w", encoding="utf-8") as f:
            f.write(text)

    def commands(extra="", second=False, output="-o unit.o"):
        entries = [{"directory": project, "file": unit,
                    "command": f"c++ -std=c++17 {extra} -I{project}/inc {output} -c {unit}"}]
        if second:  # the unit in a second target, built with VARIANT
            entries.append({"directory": project, "file": unit,
                            "command": f"c++ -std=c++17 -DVARIANT -I{project}/inc -o variant.o -c {unit}"})
        write("compile_commands.json", json.dumps(entries))

    def tidy(cache_dir=cache, options=()):
        """clang-tidy-cached's exit status, its output, and what its log says it did."""
        open(trail, "w", encoding="utf-8").close()
        run = subprocess.run([wrapper, f"-p={project}", "-quiet"] + list(options) + [unit],
                             env=environment(GPUGUARD_TIDY_CACHE_DIR=cache_dir, GPUGUARD_TIDY_CACHE_LOG=trail),
                             capture_output=True, text=True, check=False)
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

    write("unit.cpp", '#include "shapes.hpp"\nvoid Derived::f() {}\n'
          '#ifdef VARIANT\n#include "variant.hpp"\n#endif\n'
          '#ifdef __clang_analyzer__\n#include "analyzed.hpp"\n#endif\n')
    write("inc/variant.hpp", "void variant();\n")
    write("inc/analyzed.hpp", "void analyzed();\n")
    commands(second=True)
    rc, out, did = tidy()
    check(rc == 0 and did == "ran", f"a unit with two compile commands, clean: {rc} {did} {out}")
    rc, out, did = tidy()
    check(rc == 0 and did == "remembered", f"a unit with two compile commands is remembered: {rc} {did} {out}")
    write("inc/variant.hpp", "void Variant();\n")
    rc, out, did = tidy()
    check(rc != 0 and did == "ran" and "Variant" in out,
          f"a header only the second command includes runs clang-tidy, which reports it: {rc} {did} {out}")
    write("inc/variant.hpp", "void variant();\n")
    write("inc/analyzed.hpp", "void Analyzed();\n")
    rc, out, did = tidy()
    check(rc != 0 and did == "ran" and "Analyzed" in out,
          f"a header only clang-tidy's parse includes (__clang_analyzer__) runs clang-tidy: {rc} {did} {out}")
    write("inc/analyzed.hpp", "void analyzed();\n")
    write("unit.cpp", '#include "shapes.hpp"\nvoid Derived::f() {}\n')

    commands(output="-ounit.o")
    rc, out, did = tidy()
    write("inc/shapes.hpp", "void Joined();\n" + clean_header)
    rc, out, did = tidy()
    check(rc != 0 and did == "ran" and "Joined" in out and not os.path.exists(os.path.join(project, "unit.o")),
          f"a command with -ounit.o joined: the key still covers the header, nothing written: {rc} {did} {out}")
    write("inc/shapes.hpp", clean_header)
    commands()

    for options in (["--enable-check-profile"], ["--dump-config"], ["-extra-arg=-DVARIANT"]):
        did_all = [tidy(options=options)[2] for _ in range(2)]
        check(did_all == ["ran", "ran"],
              f"{options[0]}, not an option run-clang-tidy passes, runs clang-tidy: {did_all}")

    write("not-a-directory", "")
    rc, out, did = tidy(cache_dir=os.path.join(project, "not-a-directory", "cache"))
    check(rc == 0 and did == "ran" and "cannot remember" in out and "Traceback" not in out,
          f"a cache that cannot be written: clang-tidy's result all the same, and why: {rc} {did} {out}")

    env = environment(GPUGUARD_TIDY_CACHE_DIR=cache, GPUGUARD_TIDY_CACHE="off", GPUGUARD_TIDY_CACHE_LOG=trail)
    open(trail, "w", encoding="utf-8").close()
    subprocess.run([wrapper, f"-p={project}", "-quiet", unit], env=env, capture_output=True, check=False)
    with open(trail, encoding="utf-8") as f:
        check(f.read().startswith("ran "), "GPUGUARD_TIDY_CACHE=off runs clang-tidy")

    kept = entries()
    # The clean states: as first written, the header with a comment, bugprone's configuration, the filter
    # that selects no header, the command with VARIANT, the unit with two commands, the joined -o; the
    # others had findings or no key.
    check(len(kept) == 7, f"one entry for each clean state of the project: {kept}")
    old = time.time() - 31 * 86400
    for path in kept:
        os.utime(path, (old, old))
    write("cache/notes.txt", "")
    os.utime(os.path.join(cache, "notes.txt"), (old, old))
    subprocess.run([wrapper, "--prune", "30"], env=environment(GPUGUARD_TIDY_CACHE_DIR=cache), check=True,
                    capture_output=True)
    check(entries() == [os.path.join(cache, "notes.txt")],
          f"--prune 30 removes entries unused for 31 days, and nothing that is not an entry: {entries()}")

def clone_and_tidy(clone_root, cache):
    """A project at clone_root with its own copy of the script, which runs clang-tidy on it through the cache:
    (exit status, what the log says it did, output)."""
    files = {
        ".clang-tidy": "Checks: '-*,readability-identifier-naming'\nWarningsAsErrors: '*'\n"
                       "HeaderFilterRegex: 'src/'\nCheckOptions:\n"
                       "  - {key: readability-identifier-naming.FunctionCase, value: lower_case}\n",
        "lib/named.hpp": "void BadlyNamed();\n",
        "unit.cpp": '#include <cstddef>\n#include "lib/named.hpp"\nvoid unit() {}\n',
    }
    source = os.path.join(clone_root, "unit.cpp")
    files["compile_commands.json"] = json.dumps([{
        "directory": clone_root, "file": source,
        "command": f"c++ -std=c++17 -I{clone_root} -DROOT=\"{clone_root}\" -o unit.o -c {source}"}])
    for name, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(clone_root, name)), exist_ok=True)
        with open(os.path.join(clone_root, name), "w", encoding="utf-8") as f:
            f.write(text)
    os.makedirs(os.path.join(clone_root, "scripts"))
    script = shutil.copy(wrapper, os.path.join(clone_root, "scripts"))
    trail = os.path.join(clone_root, "cache.log")
    run = subprocess.run([script, f"-p={clone_root}", "-quiet", source],
                         env=environment(GPUGUARD_TIDY_CACHE_DIR=cache, GPUGUARD_TIDY_CACHE_LOG=trail),
                         capture_output=True, text=True, check=False)
    with open(trail, encoding="utf-8") as f:
        return run.returncode, f.read().split()[0], run.stdout + run.stderr


with tempfile.TemporaryDirectory() as clones, tempfile.TemporaryDirectory(dir="/var/tmp") as elsewhere:
    # Three clones whose projects differ only in where they are: the second's path sorts after /usr, where
    # the system headers are, the others' before it. The header filter selects src/, which is in the third
    # clone's path alone: only there is the header's finding clang-tidy's to report.
    first, second, third = (clone_and_tidy(path, os.path.join(clones, "cache")) for path in (
        os.path.join(clones, "first"), os.path.join(elsewhere, "second"), os.path.join(clones, "src", "third")))
    check(first[:2] == (0, "ran"), f"the first clone runs clang-tidy, clean there: {first}")
    check(second[:2] == (0, "remembered"), f"the second clone, elsewhere, hits the first's entry: {second}")
    check(third[0] != 0 and third[1] == "ran" and "BadlyNamed" in third[2],
          f"the clone whose path the header filter selects runs clang-tidy, which reports the header: {third}")

if failures:
    sys.exit(1)
print(f"clang-tidy-cached: {checked} checks passed")
