#!/usr/bin/env python3
"""Each program's flag table in the docs says what its --help says: the same flags, none missing and none
extra, and for a row that names one flag, the default --help prints. So that docs/webhook.md cannot lose
--memory-limit again.
Usage: flags_test.py SOURCE_DIR WEBHOOK DEVICE_PLUGIN SCHEDULER_EXTENDER NODE_ENFORCER"""
import os
import re
import subprocess
import sys

root, webhook, device_plugin, extender, enforcer = sys.argv[1:6]
failures = []


def help_flags(command):
    """--help's flags, each with its default (None when it prints none)."""
    out = subprocess.run(command + ["--help"], capture_output=True, text=True, check=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"^  --([a-z0-9-]+)(?: arg)?(?: \(=([^)]*)\))?", out, re.M)}


def doc_table(doc, heading):
    """The rows of the first table under `heading`: each row's flags (first cell) and its default (second)."""
    text = open(os.path.join(root, "docs", doc), encoding="utf-8").read()
    section = text.split(heading + "\n", 1)[1]
    rows = []
    for line in section.split("\n"):
        if rows and not line.startswith("|"):
            break
        if not line.startswith("| `--"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((re.findall(r"`--([a-z0-9-]+)`", cells[0]), cells[1].strip("`")))
    return rows


def compare(name, command, doc, heading, ignored=("help", "version")):
    flags = help_flags(command)
    rows = doc_table(doc, heading)
    documented = {f for names, _ in rows for f in names}
    for flag in sorted(set(flags) - documented - set(ignored)):
        failures.append(f"{name}: --{flag} is in --help but not in {doc}'s table under '{heading}'")
    for flag in sorted(documented - set(flags) - set(ignored)):
        failures.append(f"{name}: {doc} documents --{flag}, which --help does not have")
    for names, default in rows:
        if len(names) == 1 and flags.get(names[0]) is not None and flags[names[0]] not in default:
            failures.append(f"{name}: {doc} gives --{names[0]} the default '{default}', --help '{flags[names[0]]}'")
    return len(flags)


checked = 0
for name, command, doc, heading in [
        ("gpuguard-webhook", [webhook], "webhook.md", "## Flags"),
        ("gpuguard-device-plugin", [device_plugin], "device-plugin.md", "## Flags"),
        ("gpuguard-scheduler-extender", [extender], "scheduler.md", "### Flags"),
        ("gpuguard-node-enforcer", [enforcer], "node-enforcer.md", "## Flags"),
        ("gpuguard-webhook audit-controller", [webhook, "audit-controller"], "audit.md", "### Flags"),
        ("gpuguard-webhook arm", [webhook, "arm"], "operations.md", "### The arm hook's flags")]:
    try:
        checked += compare(name, command, doc, heading)
    except IndexError:
        failures.append(f"{name}: {doc} has no section '{heading}'")
for failure in failures:
    print("FAIL", failure)
print(f"{checked} flags of six commands checked against their docs; {len(failures)} problems")
sys.exit(1 if failures else 0)
