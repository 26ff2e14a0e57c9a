#!/usr/bin/env python3
"""The imports between forewarn's modules, from the code's own paths.

Reads every `crate::...` path in src/ outside test modules and comments,
maps it to the module file that defines it, and prints:
  - each circle of files that import each other (none expected);
  - each circle of the top-level modules (src/agent, src/api, ...): one
    that imports another which imports it back (none expected);
  - with --long N, each function outside tests longer than N lines.
Exits 1 when a circle is found. Usage: python3 hack/module-graph.py [--long 80]
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def module_of(path: Path) -> tuple:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def code_lines(path: Path):
    """The lines outside `#[cfg(test)] mod ...` blocks, comments stripped."""
    lines = path.read_text().split("\n")
    out, skip_indent = [], None
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if line.startswith(" " * skip_indent + "}") and indent == skip_indent:
                skip_indent = None
            continue
        if stripped.startswith("#[cfg(test)]") and i + 1 < len(lines) and lines[i + 1].strip().startswith("mod "):
            skip_indent = indent
            if lines[i + 1].rstrip().endswith(";"):
                skip_indent = None
            continue
        out.append((i + 1, re.sub(r"//.*", "", line)))
    return out


def main() -> int:
    files = {module_of(p): p for p in SRC.rglob("*.rs")
             if not p.name.endswith("tests.rs") and p.parent.name != "tests"}
    edges = {}
    for mod, path in files.items():
        targets = set()
        # `super::` is the parent module of this file's module (a file's own
        # items are reached without it).
        parent = "crate" + "".join("::" + x for x in mod[:-1])
        for _, line in code_lines(path):
            line = re.sub(r"(?<![:\w])super::", parent + "::", line)
            for m in re.finditer(r"crate((?:::[a-z_][a-z0-9_]*)+)", line):
                parts = tuple(m.group(1).strip(":").split("::"))
                while parts and parts not in files:
                    parts = parts[:-1]
                if parts and parts != mod:
                    targets.add(parts)
            # `use crate::a::{b, c}` lists: each name under the prefix
            for m in re.finditer(r"crate((?:::[a-z_][a-z0-9_]*)+)::\{([^}]*)\}", line):
                base = tuple(m.group(1).strip(":").split("::"))
                for name in re.findall(r"[a-z_][a-z0-9_]*", m.group(2)):
                    if base + (name,) in files and base + (name,) != mod:
                        targets.add(base + (name,))
        edges[mod] = targets

    def circles(graph):
        index, low, stack, on, out = {}, {}, [], set(), []
        counter = [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph.get(v, ()):
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
        for v in list(graph):
            if v not in index:
                visit(v)
        return out

    def top(mod):
        """The top-level module a module belongs to (`lib` for the crate root)."""
        return "src/" + (mod[0] if mod else "lib")

    found = 0
    for name, key in (("files", lambda m: m),
                      ("top-level modules", top)):
        graph = {}
        for a, bs in edges.items():
            for b in bs:
                ka, kb = key(a), key(b)
                if ka != kb:
                    graph.setdefault(ka, set()).add(kb)
        for c in circles(graph):
            found += 1
            shown = [("src/" + "/".join(x) if isinstance(x, tuple) else x) for x in c]
            print(f"circle of {name}: {' <-> '.join(shown)}")
    print(f"{len(files)} modules, {sum(len(v) for v in edges.values())} imports, {found} circle(s)")

    if "--long" in sys.argv:
        limit = int(sys.argv[sys.argv.index("--long") + 1])
        for mod, path in sorted(files.items()):
            lines = dict(code_lines(path))
            text = path.read_text().split("\n")
            for no, line in sorted(lines.items()):
                m = re.match(r"^(\s*)(pub(\([a-z]+\))? )?(async )?(const )?fn (\w+)", line)
                if not m:
                    continue
                ind, j = m.group(1), no - 1
                while j < len(text) and not text[j].rstrip().endswith(("{", ";")):
                    j += 1
                if j >= len(text) or text[j].rstrip().endswith(";"):
                    continue
                k = j + 1
                while k < len(text) and not (text[k].startswith(ind + "}") and len(text[k]) - len(text[k].lstrip()) == len(ind)):
                    k += 1
                if k - no + 2 > limit:
                    print(f"{k - no + 2:5} lines  {path.relative_to(ROOT)}:{no} {m.group(6)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
