#!/usr/bin/env python3
"""The module graph of a crate, read from its source: an edge `a -> b` for every `crate::b` path
written in module `a` (at the depth given, default: top-level modules), and the cycles among them.

    python3 .ci/modgraph.py src            # the shoal crate
    python3 .ci/modgraph.py shards/src     # the engine crate
    python3 .ci/modgraph.py src --depth 2  # one level deeper (kafka::handlers, groups::offsets, ...)
    python3 .ci/modgraph.py --check src    # also: every edge points down the layer order written in
                                           # the crate's `lib.rs` layout doc (top layer first); exit 1
                                           # on a cycle, an edge pointing up, or a module the doc lacks
    python3 .ci/modgraph.py --check --quiet src   # the same without listing the edges (CI)

The layout doc's entries are its lines `//! - [`name`]` or `//! - `name``, in order.

With --check, every room (a folder module, `dir/mod.rs`) is checked the same way one level down:
its children's uses of each other (`super::x`, `crate::room::x`, `self::x`, grouped or not) must
point down the order its own `mod.rs` layout doc writes, with no cycle; a room whose children use
each other must write that order (an entry for every child that uses or is used by another).
"""
import os
import re
import sys


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def written_order(root):
    """The top-level modules in the order the crate's layout doc lists them (top layer first)."""
    src = open(os.path.join(root, "lib.rs"), encoding="utf-8").read()
    return re.findall(r"^//! - \[?`([a-z_][a-z0-9_]*)`\]?", src, re.M)


def check_order(root, edges, mods):
    """The problems with the written order: modules it lacks, names it has twice, edges pointing up.
    Only the library's modules (declared in lib.rs) count: a binary's own modules sit above it."""
    order = written_order(root)
    lib = open(os.path.join(root, "lib.rs"), encoding="utf-8").read()
    mods = mods & set(re.findall(r"^(?:pub(?:\([a-z]+\))? )?mod ([a-z_][a-z0-9_]*);", lib, re.M))
    pos = {m: i for i, m in enumerate(order)}
    problems = [f"{m}: listed twice in the layout" for m in sorted({m for m in order if order.count(m) > 1})]
    problems += [f"{m}: a module missing from the layout in {root}/lib.rs" for m in sorted(mods - set(pos))]
    problems += [f"{m}: in the layout but not a module" for m in order if m not in mods]
    for a, b in sorted(edges):
        if a in pos and b in pos and pos[a] > pos[b]:
            problems.append(f"{a} -> {b}: uses a module listed above it")
    return problems


PATH = re.compile(r"\b(crate|self|super(?:::super)*)::((?:[a-z_][a-z0-9_]*::)*)(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def strip(src):
    """A file's code without its test module and comments."""
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", src)
    if m:
        src = src[: m.start()]
    return re.sub(r"//[^\n]*", "", src)


def used_paths(me, is_mod, src):
    """The module paths a file at module path `me` names (absolute, as lists of names)."""
    out = []
    for base, middle, last in PATH.findall(strip(src)):
        if base == "crate":
            start = []
        elif base == "self":
            start = list(me)
        else:
            ups = base.count("super")
            # In `x/mod.rs` (module x), `super` is x's parent, as in `x.rs`.
            start = list(me[: len(me) - ups]) if ups <= len(me) else None
            if start is None:
                continue
        prefix = start + [p for p in middle.split("::") if p]
        if last.startswith("{"):
            for part in last[1:-1].split(","):
                first = part.strip().split("::")[0].strip()
                if first:
                    out.append(prefix + [first])
        else:
            out.append(prefix + [last])
    return out


def room_problems(root):
    """The rooms' problems: for each folder module, its children's edges against its written order."""
    files = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".rs"):
                path = os.path.join(d, f)
                files[path] = module_of(root, path)
    problems = []
    for d, _, fs in os.walk(root):
        mod_rs = os.path.join(d, "mod.rs")
        if d == root or not os.path.exists(mod_rs):
            continue
        room = module_of(root, mod_rs)
        children = {m[len(room)] for m in files.values() if len(m) > len(room) and m[: len(room)] == room}
        edges = set()
        for path, me in files.items():
            if len(me) <= len(room) or me[: len(room)] != room:
                continue
            src = open(path, encoding="utf-8").read()
            for t in used_paths(me, path.endswith("mod.rs"), src):
                if len(t) > len(room) and t[: len(room)] == room and t[len(room)] in children:
                    a, b = me[len(room)], t[len(room)]
                    if a != b:
                        edges.add((a, b))
        if not edges:
            continue
        name = "::".join(room)
        doc = open(mod_rs, encoding="utf-8").read()
        order = re.findall(r"^//! - \[?`([a-z_][a-z0-9_]*)`\]?", doc, re.M)
        order = [m for m in order if m in children]
        if not order:
            problems.append(f"{name}: its modules use each other; write their order in {mod_rs}'s layout doc")
            continue
        pos = {m: i for i, m in enumerate(order)}
        for m in sorted({x for e in edges for x in e} - set(pos)):
            problems.append(f"{name}::{m}: a module missing from the layout in {mod_rs}")
        for a, b in sorted(edges):
            if a in pos and b in pos and pos[a] > pos[b]:
                problems.append(f"{name}::{a} -> {name}::{b}: uses a module listed above it")
    return problems


def main():
    args = sys.argv[1:]
    check = "--check" in args
    if check:
        args.remove("--check")
    quiet = "--quiet" in args
    if quiet:
        args.remove("--quiet")
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
    for a, b in sorted(edges) if not quiet else []:
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
    if check:
        if depth != 1:
            sys.exit("--check reads the top-level layout only (--depth 1)")
        problems = check_order(root, edges, files_mods) + room_problems(root)
        for p in problems:
            print("  layering: " + p)
        if out or problems:
            sys.exit(1)
        print("the written layer order holds, in the crate and in each room")


if __name__ == "__main__":
    main()
