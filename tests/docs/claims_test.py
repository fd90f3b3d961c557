#!/usr/bin/env python3
"""The docs may claim only what tests show. README.md and docs/*.md name the tests
behind their guarantees as `fixture:NAME` (a case under tests/fixtures/admission), `e2e:NAME` (a scenario
of the end-to-end harness) or `test:"NAME"` (a Catch2 test case or a ctest entry). This fails when:
- a named test does not exist;
- a row of docs/security.md's table of what the webhook covers, or of docs/audit.md's doors, names no test;
- a policy key documented in docs/policy.md names no test in its section, or a key the code accepts is
  not documented there;
- an alert of the chart has no runbook entry in docs/operations.md, or an entry names no alert;
- operations.md's alert table misses a rule of the chart's monitoring.yaml, lists one it lacks, or gives
  another severity.
Usage: claims_test.py SOURCE_DIR"""
import os
import re
import subprocess
import sys

root = sys.argv[1]
read = lambda *parts: open(os.path.join(root, *parts), encoding="utf-8").read()
failures = []

fixtures = set(os.listdir(os.path.join(root, "tests", "fixtures", "admission")))
scenarios = set()
for name in os.listdir(os.path.join(root, "e2e")):
    if name.endswith(".go"):
        scenarios.update(re.findall(r'^\s*\{"([a-z0-9/-]+)", "', read("e2e", name), re.M))
tests = set()
for directory, _, files in os.walk(os.path.join(root, "tests")):
    for name in files:
        text = open(os.path.join(directory, name), encoding="utf-8", errors="replace").read()
        if name.endswith(".cpp"):
            # A long name is written as adjacent literals, as clang-format breaks it: they are one name.
            literal = r'"(?:[^"\\]|\\.)*"'
            for name_literals in re.findall(r'TEST_CASE\(\s*((?:' + literal + r'\s*)+)', text):
                tests.add("".join(part[1:-1] for part in re.findall(literal, name_literals)))
        elif name == "CMakeLists.txt":
            tests.update(re.findall(r'add_test\(NAME "([^"]+)"', text))
reference = re.compile(r'`(fixture|e2e):([a-z0-9/-]+)`|`test:"([^"]+)"`')


def check_references(doc, text):
    found = 0
    for kind, name, test in reference.findall(text):
        found += 1
        if kind == "fixture" and name not in fixtures:
            failures.append(f"{doc}: fixture:{name} is not a case under tests/fixtures/admission")
        elif kind == "e2e" and name not in scenarios:
            failures.append(f"{doc}: e2e:{name} is not a scenario in e2e/")
        elif test and test not in tests:
            failures.append(f'{doc}: test:"{test}" is not a test case or ctest entry under tests/')
    return found


# Every doc: a test it names exists.
for doc in ["README.md"] + sorted("docs/" + name for name in os.listdir(os.path.join(root, "docs")) if name.endswith(".md")):
    check_references(doc, read(doc))

audit = read("docs", "audit.md").split("## Doors and the tests that show them", 1)[1].split("\n## ", 1)[0]
for row in [line for line in audit.splitlines() if line.startswith("| ") and not line.startswith("| what ")]:
    if not reference.search(row.split("|")[-2]):
        failures.append(f"docs/audit.md: the row '{row[:70]}...' names no test in its last column")

security = read("docs", "security.md")
table = security.split("## What the webhook covers, and the tests that show it", 1)[1].split("\n## ", 1)[0]
rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| how ")]
if len(rows) < 8:
    failures.append(f"docs/security.md: the coverage table has {len(rows)} rows; it should list every door")
for row in rows:
    if not reference.search(row.split("|")[-2]):
        failures.append(f"docs/security.md: the row '{row[:70]}...' names no test in its last column")

policy = read("docs", "policy.md")
keys_in_code = set(re.findall(r'"([a-zA-Z]+)"', read("src", "policy", "policy.cpp").split("kKeys[] = {", 1)[1].split("};", 1)[0]))
sections = dict(re.findall(r"^### `([a-zA-Z]+)`\n(.*?)(?=^### |^## |\Z)", policy, re.M | re.S))
for key in sorted(keys_in_code - set(sections)):
    failures.append(f"docs/policy.md: the key {key} that the code accepts has no section")
for key in sorted(set(sections) - keys_in_code):
    failures.append(f"docs/policy.md: documents a key {key} that the code does not accept")
for key, text in sections.items():
    if not reference.search(text):
        failures.append(f"docs/policy.md: the section on {key} names no test")

# Every alert the chart ships has a runbook entry in docs/operations.md (what it means, the first command,
# the fix), and every entry is an alert the chart ships.
templates = os.path.join(root, "charts", "gpuguard", "templates")
alerts = set()
for name in os.listdir(templates):
    alerts.update(re.findall(r"^\s*- alert: (\w+)$", read("charts", "gpuguard", "templates", name), re.M))
runbook = read("docs", "operations.md").split("\n## Runbook\n", 1)
entries = dict(re.findall(r"^### (\w+)\n(.*?)(?=^### |^## |\Z)", runbook[1], re.M | re.S)) if len(runbook) == 2 else {}
if len(alerts) < 10:
    failures.append(f"charts/gpuguard/templates: only {len(alerts)} alerts found; the pattern no longer matches")
for alert in sorted(alerts - set(entries)):
    failures.append(f"docs/operations.md: the alert {alert} has no runbook entry")
for alert in sorted(set(entries) - alerts):
    failures.append(f"docs/operations.md: a runbook entry for {alert}, which the chart does not ship")
for alert, text in entries.items():
    for part in ("*Means:*", "*First:*", "*Fix:*"):
        if part not in text:
            failures.append(f"docs/operations.md: the runbook entry for {alert} has no {part}")
    # The first command is pasted into a shell: it must at least parse there (e2e:node/audit runs them).
    first = re.search(r"\*First:\* `([^`]+)`", text)
    if first and subprocess.run(["bash", "-n", "-c", first[1]], capture_output=True).returncode != 0:
        failures.append(f"docs/operations.md: the first command of {alert} is not valid shell: {first[1]}")

# The alert table in docs/operations.md's monitoring section lists exactly the rules of the chart's
# monitoring.yaml (the audit's own alert is documented with the audit), each with the rule's severity.
rules = dict(re.findall(r"^\s*- alert: (\w+)$.*?^\s*severity: (\w+)$",
                        read("charts", "gpuguard", "templates", "monitoring.yaml"), re.M | re.S))
table = dict(re.findall(r"^\| `(GPUGuard\w+)` \|.*\| (\w+) \|$", runbook[0], re.M))
if len(rules) < 10:
    failures.append(f"charts/gpuguard/templates/monitoring.yaml: only {len(rules)} rules read; the pattern no longer matches")
for alert in sorted(set(rules) - set(table)):
    failures.append(f"docs/operations.md: the alert table has no row for {alert}")
for alert in sorted(set(table) - set(rules)):
    failures.append(f"docs/operations.md: the alert table has a row for {alert}, which monitoring.yaml does not ship")
for alert in sorted(set(rules) & set(table)):
    if rules[alert] != table[alert]:
        failures.append(f"docs/operations.md: the alert table says {alert} is {table[alert]}, the rule {rules[alert]}")

# kubectl logs with a selector shows ten lines a pod unless --tail is given, and takes no --field-selector:
# every such command in the docs says --tail, and none passes a field selector to logs.
for doc in ["README.md"] + [os.path.join("docs", name) for name in sorted(os.listdir(os.path.join(root, "docs")))]:
    if not doc.endswith(".md"):
        continue
    for command in re.findall(r"kubectl\b[^`|\n]*?\blogs\b[^`|\n]*", read(*doc.split("/"))):
        if re.search(r"\s-l\s|--selector", command) and "--tail" not in command:
            failures.append(f"{doc}: `{command.strip()}` shows ten lines a pod: give --tail=-1")
        if "--field-selector" in command:
            failures.append(f"{doc}: `{command.strip()}`: kubectl logs has no --field-selector")

for failure in failures:
    print("FAIL", failure)
print(f"{len(rows)} coverage rows, {len(sections)} policy keys, {len(entries)} runbook entries, "
      f"{len(table)} alert table rows checked; "
      f"{len(failures)} problems")
sys.exit(1 if failures else 0)
