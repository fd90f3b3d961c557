#!/usr/bin/env python3
# Where a process's memory lives, from /proc/PID/smaps: its own program's pages, OpenSSL's, the C++ and C
# runtimes', every other library's, the heap, and anonymous mappings (other malloc arenas, thread stacks,
# what a program maps for itself). RSS beside PSS (shared pages divided among the processes that map them)
# and private pages (this process's alone), in kB (bench/nginx_floor.sh, issue 45).
#   memory_groups.py PID LABEL  ->  one line per group: LABEL GROUP RSS PSS PRIVATE
import os
import sys


def group_of(path, program):
    name = os.path.basename(path)
    if not path:
        return "anonymous"
    if path == "[heap]":
        return "heap"
    if path.startswith("["):
        return "kernel ([stack], [vdso], [vvar])"
    if path == program:
        return "the program"
    if name.startswith(("libssl.", "libcrypto.")):
        return "OpenSSL"
    if name.startswith(("libstdc++.", "libgcc_s.", "libm.")):
        return "C++ runtime"
    if name.startswith(("libc.", "ld-linux")):
        return "C library"
    if name.endswith(".so") or ".so." in name:
        return "other libraries"
    return "other files"


def main():
    pid, label = sys.argv[1], sys.argv[2]
    program = os.readlink(f"/proc/{pid}/exe")
    totals = {}
    group = None
    with open(f"/proc/{pid}/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                group = group_of(fields[5] if len(fields) > 5 else "", program)
                totals.setdefault(group, [0, 0, 0])
            elif fields[0] == "Rss:":
                totals[group][0] += int(fields[1])
            elif fields[0] == "Pss:":
                totals[group][1] += int(fields[1])
            elif fields[0] in ("Private_Clean:", "Private_Dirty:"):
                totals[group][2] += int(fields[1])
    for name, (rss, pss, private) in sorted(totals.items(), key=lambda item: -item[1][0]):
        print(f"{label}\t{name}\t{rss}\t{pss}\t{private}")
    rss, pss, private = (sum(values[i] for values in totals.values()) for i in range(3))
    print(f"{label}\ttotal\t{rss}\t{pss}\t{private}")


if __name__ == "__main__":
    main()
