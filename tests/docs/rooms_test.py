#!/usr/bin/env python3
"""The rooms of docs/architecture.md, held to the code: every folder under src/ is a room, and its arrows are
the #include lines of its sources and of its public headers (include/gpuguard/<room>/). This fails when:
- the arrows make a cycle (a room reaches itself through others), naming each include that closes it;
- a folder under src/ or include/gpuguard/ has no row in architecture.md's table of rooms, or a row names a
  folder that is not there.
Usage: rooms_test.py SOURCE_DIR"""
import collections
import os
import re
import sys

root = sys.argv[1]
failures = []
include = re.compile(r'^\s*#\s*include\s*"([^"]+)"')

rooms = sorted(set(os.listdir(os.path.join(root, "src"))) | set(os.listdir(os.path.join(root, "include", "gpuguard"))))
rooms = [r for r in rooms if os.path.isdir(os.path.join(root, "src", r)) or os.path.isdir(os.path.join(root, "include", "gpuguard", r))]


def room_of_include(target, including_dir):
    if target.startswith("gpuguard/"):
        return target.split("/")[1]
    first = target.split("/")[0]
    if "/" in target and first in rooms and os.path.exists(os.path.join(root, "src", target)):
        return first
    return None  # a sibling header, or generated code (nri/v1alpha1/api.pb.h): no arrow between rooms


arrows = collections.defaultdict(lambda: collections.defaultdict(list))
for room in rooms:
    for top in (os.path.join(root, "src", room), os.path.join(root, "include", "gpuguard", room)):
        for directory, _, files in os.walk(top):
            for name in files:
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        match = include.match(line)
                        target = match and room_of_include(match.group(1), directory)
                        if target and target != room:
                            arrows[room][target].append(f"{os.path.relpath(path, root)}:{number}")

# A cycle exists exactly where some room reaches itself; each is reported once, from its smallest room.
reported = set()
for start in rooms:
    stack = [(start, [start])]
    while stack:
        at, path = stack.pop()
        for target in arrows[at]:
            if target == start:
                cycle = path + [start]
                key = frozenset(path)
                if key not in reported:
                    reported.add(key)
                    where = [arrows[a][b][0] for a, b in zip(cycle, cycle[1:])]
                    failures.append(" -> ".join(cycle) + " (" + "; ".join(where) + ")")
            elif target not in path and target > start:
                stack.append((target, path + [target]))

with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
    table = set(re.findall(r"^\| `src/([a-z0-9_]+)` \|", f.read(), re.M))
for room in rooms:
    if room not in table:
        failures.append(f"docs/architecture.md: the folder src/{room} (or include/gpuguard/{room}) has no row in the rooms table")
for room in sorted(table - set(rooms)):
    failures.append(f"docs/architecture.md: the rooms table has a row for src/{room}, which is not a folder")

for failure in failures:
    print("FAIL", failure)
count = sum(len(targets) for targets in arrows.values())
print(f"{len(rooms)} rooms, {count} arrows between them; {len(failures)} failures")
if count < 30:
    print("FAIL too few arrows: the include pattern no longer matches how the sources include")
    sys.exit(1)
sys.exit(1 if failures else 0)
