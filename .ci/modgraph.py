#!/usr/bin/env python3
"""The module graph of a crate, read from its source: an edge `a -> b` for every `crate::b` path
written in module `a` (at the depth given, default: top-level modules), and the cycles among them.

    python3 .ci/modgraph.py src            # the shoal crate
    python3 .ci/modgraph.py shards/src     # the engine crate
    python3 .ci/modgraph.py src --depth 2  # one level deeper (kafka::handlers, groups::offsets, ...)
"""
import os
import re
import sys


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def main():
    args = sys.argv[1:]
    depth = 1
    if "--depth" in args:
        i = args.index("--depth")
        depth = int(args[i + 1])
        del args[i : i + 2]
    root = args[0] if args else "src"
    edges = set()
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            me = module_of(root, path)
            if not me:
                continue
            src = open(path, encoding="utf-8").read()
            # Test modules are not part of the structure.
            m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", src)
            if m:
                src = src[: m.start()]
            src = re.sub(r"//[^\n]*", "", src)
            names = set(re.findall(r"crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", src))
            # `use crate::{a, b::c}` groups.
            for group in re.findall(r"crate::\{([^}]*)\}", src):
                for part in group.split(","):
                    part = part.strip().split("::")[0].strip()
                    if re.fullmatch(r"[a-z_][a-z0-9_]*", part):
                        names.add(part)
            for n in names:
                target = n.split("::")[:depth]
                a, b = "::".join(me[:depth]), "::".join(target)
                # Only modules that exist (not items of the crate root).
                if a != b and not b.startswith(a + "::") and not a.startswith(b + "::"):
                    edges.add((a, b))
    mods = {m for e in edges for m in e}
    files_mods = set()
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                m = module_of(root, os.path.join(d, f))
                if m:
                    files_mods.add("::".join(m[:depth]))
    edges = {(a, b) for a, b in edges if b in files_mods}
    for a, b in sorted(edges):
        print(f"{a} -> {b}")
    # Strongly connected components (Tarjan) with more than one module are the cycles.
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(mods):
        if v not in index:
            visit(v)
    print(f"{len(edges)} edges; cycles: {len(out)}")
    for c in out:
        print("  cycle: " + ", ".join(c))


if __name__ == "__main__":
    main()
