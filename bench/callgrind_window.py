#!/usr/bin/env python3
# Reads the callgrind dumps of one window of load (bench/nginx_floor.sh) and prints its instructions and its
# calls into the allocator, so that both can be divided by the window's requests. callgrind_annotate gives
# the instructions but not how often a function was called; the dump's "calls=" lines do.
#   callgrind_window.py DUMP...  ->  "instructions N" and "allocations N" (malloc, calloc, realloc and the
#   aligned allocations: what a request asks of the C allocator, whoever asks)
import re
import sys

ALLOCATORS = {"malloc", "calloc", "realloc", "memalign", "posix_memalign", "aligned_alloc"}


def read(path):
    names = {}  # callgrind compresses names: "(id) name" the first time, "(id)" after
    instructions = 0
    allocations = 0
    callee = None
    with open(path, encoding="utf-8", errors="replace") as dump:
        for line in dump:
            if line.startswith("summary:"):
                instructions = int(line.split()[1])
                continue
            match = re.match(r"cfn=\((\d+)\)(?: (.*))?", line)
            if match:
                if match.group(2) is not None:
                    names[match.group(1)] = match.group(2).strip()
                callee = names.get(match.group(1), "")
                continue
            match = re.match(r"fn=\((\d+)\)(?: (.*))?", line)
            if match and match.group(2) is not None:
                names[match.group(1)] = match.group(2).strip()
                continue
            if line.startswith("calls=") and callee is not None:
                # glibc's allocator names carry no suffix; a wrapper (say "malloc'2", a recursion) does
                if callee.split("'")[0] in ALLOCATORS:
                    allocations += int(line[len("calls="):].split()[0])
                callee = None
    return instructions, allocations


def main():
    instructions = allocations = 0
    for path in sys.argv[1:]:
        i, a = read(path)
        instructions += i
        allocations += a
    print(f"instructions {instructions}")
    print(f"allocations {allocations}")


if __name__ == "__main__":
    main()
