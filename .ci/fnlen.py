#!/usr/bin/env python3
"""Production functions longer than a limit (default 150 lines), from their `fn` line to the
closing brace. Test code (`#[cfg(test)] mod ... { }` to the end of the file, `tests/`, `benches/`,
files named `tests.rs` or `testing.rs`) does not count.

    python3 .ci/fnlen.py src shards/src           # list the long ones; exit 1 if any
    python3 .ci/fnlen.py --limit 100 --top 10 src # the ten longest, over 100 lines
    python3 .ci/fnlen.py --limit 100 --allow .ci/fnlen_allow.txt src shards/src

With `--allow FILE`, the functions FILE lists (`LINES PATH fn NAME`, as this script prints them,
without the line number) may stay over the limit, but never grow past the length written there;
an entry whose function is now within the limit (or gone) must be taken off, so the list only
shrinks. Exit 1 on anything else over the limit, on growth, and on a stale entry.
"""
import os
import re
import sys

FN = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def strip(line):
    """The line without string literals and comments (enough for counting braces)."""
    line = re.sub(r'b?"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, l in enumerate(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", l) and i + 1 < len(lines) and re.match(r"\s*(pub(\(crate\))? )?mod \w+ \{", lines[i + 1]):
            lines = lines[:i]
            break
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            code = strip(lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body (trait method)
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                yield m.group(1), i + 1, j - i + 1
                break
            j += 1
        i += 1


def allowed(path):
    """The allow-list: (path, fn name) -> most lines."""
    out = {}
    for raw in open(path, encoding="utf-8"):
        line = raw.split("#")[0].strip()
        if not line:
            continue
        n, where, _fn, name = line.split()
        out[(where, name)] = int(n)
    return out


def main():
    args = sys.argv[1:]
    limit, top, allow = 150, None, None
    if "--allow" in args:
        k = args.index("--allow")
        allow = allowed(args[k + 1])
        del args[k : k + 2]
    if "--limit" in args:
        k = args.index("--limit")
        limit = int(args[k + 1])
        del args[k : k + 2]
    if "--top" in args:
        k = args.index("--top")
        top = int(args[k + 1])
        del args[k : k + 2]
    found = []
    for root in args or ["src"]:
        for d, _, files in os.walk(root):
            for f in files:
                if not f.endswith(".rs") or f in ("tests.rs", "testing.rs"):
                    continue
                path = os.path.join(d, f)
                for name, line, n in functions(path):
                    if n > limit:
                        found.append((n, f"{path}:{line}", name))
    found.sort(reverse=True)
    if allow is not None:
        sys.exit(check_allowed(found, allow, limit))
    for n, where, name in found[:top] if top else found:
        print(f"{n:5} lines  {where}  fn {name}")
    if found and top is None:
        sys.exit(1)


def check_allowed(found, allow, limit):
    """Exit status of an allow-list check; prints what fails it."""
    bad = 0
    seen = set()
    for n, where, name in found:
        key = (where.rsplit(":", 1)[0], name)
        seen.add(key)
        most = allow.get(key)
        if most is None:
            print(f"{n:5} lines  {where}  fn {name}: over {limit} lines (split it)")
            bad = 1
        elif n > most:
            print(f"{n:5} lines  {where}  fn {name}: grew past its allowed {most} lines")
            bad = 1
    for (path, name), most in sorted(allow.items()):
        if (path, name) not in seen:
            print(f"{path} fn {name}: within {limit} lines now (or gone): take it off the list")
            bad = 1
    return bad


if __name__ == "__main__":
    main()
