#!/usr/bin/env python3
"""values.yaml says every key is documented there: this holds it to that. Each key down to three levels
(`webhook.networkPolicy.podCIDRs`) has a comment on the line above it, but for the contents of blocks passed
to Kubernetes as they are (resources, selectors, labels, the device plugin's config) and of list items; and
every key of values.yaml is one values.schema.json describes, and the other way round.
Usage: values_test.py SOURCE_DIR"""
import json
import os
import re
import sys

root = sys.argv[1]
chart = os.path.join(root, "charts", "gpuguard")
lines = open(os.path.join(chart, "values.yaml"), encoding="utf-8").read().split("\n")
PASSED_THROUGH = {"resources", "nodeSelector", "affinity", "podAnnotations", "labels", "config", "tolerations",
                  "imagePullSecrets", "metricsFrom"}
failures, keys, stack = [], [], []
for number, line in enumerate(lines, 1):
    if line.lstrip().startswith("- "):
        continue  # a list item's fields are the item's
    match = re.match(r"^( *)([A-Za-z][A-Za-z0-9_]*):", line)
    if not match:
        continue
    indent = len(match.group(1))
    while stack and stack[-1][0] >= indent:
        stack.pop()
    path = [key for _, key in stack] + [match.group(2)]
    stack.append((indent, match.group(2)))
    if any(part in PASSED_THROUGH for part in path[:-1]):
        continue
    keys.append(".".join(path))
    above = number - 2
    while above >= 0 and not lines[above].strip():
        above -= 1
    if len(path) <= 3 and not lines[above].strip().startswith("#"):
        failures.append(f"values.yaml:{number}: {'.'.join(path)} has no comment above it")

schema = json.load(open(os.path.join(chart, "values.schema.json"), encoding="utf-8"))


def schema_keys(node, prefix):
    for key, sub in node.get("properties", {}).items():
        yield prefix + key
        if key not in PASSED_THROUGH:
            yield from schema_keys(sub, prefix + key + ".")


described = set(schema_keys(schema, "")) - {"global"}
for key in sorted(set(keys) - described):
    failures.append(f"values.schema.json does not describe {key}")
for key in sorted(described - set(keys)):
    failures.append(f"values.schema.json describes {key}, which values.yaml does not have")

for failure in failures:
    print("FAIL", failure)
print(f"{len(keys)} values keys checked; {len(failures)} problems")
sys.exit(1 if failures else 0)
