#!/usr/bin/env python3
"""Import cycles among the election crate's source files.

Reads every `.rs` file of the crate (following `mod` declarations from `lib.rs`),
resolves the `crate::`, `super::` and `self::` paths each file names, in `use`
declarations and inline, to the file that defines the module, and prints the strongly
connected components of that graph: groups of files that import each other, directly or
around a cycle. A path to a name the crate root re-exports (`crate::NodeConfig`) counts
as an import of the module it comes from. `mod x;` declarations are containment, not
imports. Test code (`#[cfg(test)]` items and the files they load) is left out unless
`--tests` is given; `--edges` also lists every import.

Usage: python3 .ci/election-imports.py [--tests] [--edges] [SRC_DIR]
(SRC_DIR defaults to election/src.)

Exits 1 when a cycle spans more than one module folder: a cycle is allowed only among
the files of one module (a type split into `impl` blocks across them).
"""

import os
import re
import sys

PATH_LITERAL = r'#\[path\s*=\s*"([^"]+)"\]\s*'
VISIBILITY = r"(?:pub(?:\([^)]*\))?\s+)?"


def strip(text):
    """Blanks comments, string and char literals, keeping the line structure."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if text[i] == "\n" else "")
                    i += 1
        elif re.match(r'r#*"', text[i:i + 10]) and not re.match(r"\w", text[i - 1:i]):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        else:
            char = r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'"
            m = re.match(char, text[i:]) if c == "'" else None
            out.append("' '" if m else c)
            i += len(m.group(0)) if m else 1
    return "".join(out)


def item_end(code, i):
    """The end of the item starting at `i`: after its `;`, or after its braced body."""
    depth = 0
    while i < len(code):
        ch = code[i]
        if ch == ";" and depth == 0:
            return i + 1
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def drop_test_items(code):
    """Blanks `#[cfg(test)]` items (a `mod x;`, a `use`, or a braced item)."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        if m.start() < i:
            continue
        end = item_end(code, m.end())
        out.append(code[i:m.start()] + "\n" * code.count("\n", m.start(), end))
        i = end
    return "".join(out) + code[i:]


def module_files(src, tests):
    """Maps module paths (tuples) to (file, code), following `mod` from lib.rs."""
    mods = {}

    def visit(path, modpath, dirpath):
        text = open(path, encoding="utf-8").read()
        code = strip(text)
        if not tests:
            code = drop_test_items(code)
        mods[modpath] = (path, code)
        decl = r"((?:#\[[^\]]*\]\s*)*)" + VISIBILITY + r"mod\s+(\w+)\s*;"
        for m in re.finditer(decl, code):
            name = m.group(2)
            if re.search(r"#\[path\s*=", m.group(1)):
                # The literal was blanked; read it from the original text.
                at = PATH_LITERAL + VISIBILITY + r"mod\s+" + name + r"\s*;"
                raw = re.search(at, text)
                child = os.path.join(os.path.dirname(path), raw.group(1))
                visit(child, modpath + (name,), os.path.dirname(child))
                continue
            flat = os.path.join(dirpath, name + ".rs")
            nested = os.path.join(dirpath, name, "mod.rs")
            if os.path.exists(flat) or os.path.exists(nested):
                child = flat if os.path.exists(flat) else nested
                visit(child, modpath + (name,), os.path.join(dirpath, name))

    visit(os.path.join(src, "lib.rs"), (), src)
    return mods


def use_paths(code):
    """Yields every path a `use` declaration names, its groups expanded."""
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        tree = re.sub(r"\s+as\s+\w+", "", m.group(1))
        yield from expand(re.sub(r"\s+", "", tree))


def expand(tree):
    brace = tree.find("{")
    if brace < 0:
        yield tree.removesuffix("::*")
        return
    prefix, body = tree[:brace], tree[brace + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    for part in filter(None, parts):
        for sub in expand(part):
            yield (prefix + sub).removesuffix("::self").removesuffix("::")


def resolve(path, here, mods, root_exports):
    """The module a path names, as a module-path tuple; None outside the crate."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base, rest = here, segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif here + (segs[0],) in mods:
        base, rest = here, segs
    else:
        return None
    cur = base
    for s in rest:
        if cur + (s,) not in mods:
            if cur == () and s in root_exports:
                return root_exports[s]
            break
        cur = cur + (s,)
    return cur


def inline_modules(code, here):
    """Splits a file's code into (module path, code) parts: each `mod x { .. }` block is
    a part of its own, so that `super::` inside it means the file's module."""
    parts, rest, i = [], [], 0
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
        if m.start() < i:
            continue
        rest.append(code[i:m.start()])
        end = item_end(code, m.end() - 1)
        parts += inline_modules(code[m.end():end - 1], here + (m.group(1),))
        i = end
    rest.append(code[i:])
    return [(here, "".join(rest))] + parts


def graph(src, tests):
    mods = module_files(src, tests)
    root_exports = {}
    for p in use_paths(mods[()][1]):
        target = resolve(p, (), mods, {})
        if target not in (None, ()):
            root_exports[p.split("::")[-1]] = target
    edges = {m: set() for m in mods}
    inline_path = r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)"
    for file_mod, (_, code) in mods.items():
        for here, part in inline_modules(code, file_mod):
            paths = list(use_paths(part))
            paths += re.findall(inline_path, re.sub(r"\buse\s+[^;]+;", "", part))
            for p in paths:
                target = resolve(p, here, mods, root_exports)
                # An inline module (`mod tests { .. }`) belongs to the file it is in.
                while target is not None and target not in mods:
                    target = target[:-1]
                if target not in (None, (), file_mod):
                    edges[file_mod].add(target)
    return mods, edges


def sccs(nodes, edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(nodes):
        if v not in index:
            connect(v)
    return out


def main():
    args = sys.argv[1:]
    rest = [a for a in args if not a.startswith("--")]
    here = os.path.dirname(os.path.abspath(__file__))
    src = rest[0] if rest else os.path.join(here, "..", "election", "src")
    mods, edges = graph(src, "--tests" in args)
    name = {m: os.path.relpath(mods[m][0], src) for m in mods}
    comps = [c for c in sccs(mods, edges) if len(c) > 1]
    inside = sum(len(edges[m] & set(c)) for c in comps for m in c)
    print(
        f"{len(mods)} files, {sum(map(len, edges.values()))} imports between them; "
        f"{sum(map(len, comps))} files in cycles, {inside} imports inside cycles"
    )
    bad = False
    for comp in sorted(comps, key=len, reverse=True):
        # A file's folder: its own module if it has child modules (a `mod.rs`, or `x.rs`
        # beside `x/`), else its parent's.
        folders = {m if any(k[:-1] == m for k in mods) else m[:-1] for m in comp}
        across = len(folders) > 1
        bad |= across
        kind = "ACROSS folders" if across else "inside one folder"
        print(f"cycle of {len(comp)} files ({kind}): " + ", ".join(name[m] for m in comp))
    if not comps:
        print("no cycles")
    if "--edges" in args:
        for m in sorted(mods):
            for t in sorted(edges[m]):
                print(f"  {name[m]} -> {name[t]}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
