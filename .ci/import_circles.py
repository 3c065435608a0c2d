#!/usr/bin/env python3
"""Finds import circles between the crate's modules: modules that reach each
other through their imports, two of them (each uses the other) or more
(a -> b -> c -> a). Reads every `use` and every `crate::`/`super::` path
written inline in src/, outside comments and `#[cfg(test)] mod tests`;
exits 1 on a circle.

A path is resolved to the module that *defines* the item it names: a name
a module only imports (`pub use other::Item`, or a plain `use` that its
children reach as `super::Item`) is followed to where it is defined, so a
circle through a re-export is seen. An edge between a module and one of its
ancestors is left out only when the item is really defined there (the
module tree: a parent re-exports its children's items, a child uses its
parent's)."""
import os, re, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')

# module path (tuple) -> file
mods = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'):
            continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)[:-3].split('/')
        if rel[-1] in ('mod', 'lib'):
            rel = rel[:-1]
        mods[tuple(rel)] = p

USE = re.compile(r'\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);')
DEF = re.compile(r'\b(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)')


def source(p):
    src = open(p).read()
    src = re.split(r'#\[cfg\(test\)\]\s*mod tests', src)[0]
    return re.sub(r'//.*', '', src)  # comments and doc links are not imports


def split_top(s):
    """Splits `s` at the commas outside braces."""
    parts, depth, cur = [], 0, ''
    for c in s:
        if c == '{':
            depth += 1
        elif c == '}':
            depth -= 1
        if c == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def parse_use(text):
    """`a::{b, c::D as E}` -> [(bound name, path segments)]; handles `as`."""
    out = []
    text = re.sub(r'\s+as\s+', ' as ', text)

    def walk(tree, prefix):
        tree = tree.strip()
        if '{' in tree:
            head, _, body = tree.partition('{')
            body = body[:body.rindex('}')]
            head = tuple(s for s in head.strip().split('::') if s)
            for part in split_top(body):
                walk(part, prefix + head)
            return
        path, _, alias = tree.partition(' as ')
        segments = prefix + tuple(s.strip() for s in path.split('::') if s.strip())
        if not segments:
            return
        if segments[-1] == '*':
            out.append((None, segments[:-1]))
            return
        if segments[-1] == 'self':
            segments = segments[:-1]
        out.append((alias.strip() or segments[-1], segments))

    walk(text, ())
    return out


srcs = {m: source(p) for m, p in mods.items()}
defs = {m: set(DEF.findall(s)) for m, s in srcs.items()}
# module -> bound name -> (module it was written in, path); module -> globs
imports, globs = {}, {}
for m, s in srcs.items():
    for text in USE.findall(s):
        for name, path in parse_use(text):
            if name is None:
                globs.setdefault(m, []).append(path)
            else:
                imports.setdefault(m, {})[name] = path


def absolute(cur, path):
    """The crate-relative segments of `path` written in module `cur`, or None
    for a path outside the crate."""
    if not path:
        return None
    first = path[0]
    if first == 'crate':
        return list(path[1:])
    if first == 'super':
        base, rest = list(cur), list(path)
        while rest and rest[0] == 'super':
            base, rest = base[:-1], rest[1:]
        return base + rest
    if first == 'self':
        return list(cur) + list(path[1:])
    # A 2018 path from the module itself: a child module or an item here.
    if tuple(cur) + (first,) in mods or first in defs.get(tuple(cur), ()):
        return list(cur) + list(path)
    return None


def defining(segments, seen=None):
    """The module that defines what crate-relative `segments` name."""
    seen = seen or set()
    key = tuple(segments)
    if key in seen:
        return None
    seen.add(key)
    module = None
    for i in range(len(segments), -1, -1):
        if tuple(segments[:i]) in mods:
            module, rest = tuple(segments[:i]), segments[i:]
            break
    if module is None:
        return None
    if not rest or rest[0] in defs.get(module, ()):
        return module
    imported = imports.get(module, {}).get(rest[0])
    if imported is not None:
        target = absolute(module, imported)
        if target is None:
            return module  # an outside item, re-exported: this module's
        return defining(target + list(rest[1:]), seen) or module
    for glob in globs.get(module, ()):
        target = absolute(module, glob)
        if target is None:
            continue
        found = defining(target + list(rest), seen)
        if found is not None:
            return found
    return module


def resolve(cur, path):
    target = absolute(cur, path)
    return None if target is None else defining(target)


def is_ancestor(a, b):
    return len(a) < len(b) and b[:len(a)] == a


edges = set()
for m, s in srcs.items():
    paths = []
    for text in USE.findall(s):
        paths += [path for _, path in parse_use(text)]
    paths += [tuple(u.split('::')) for u in re.findall(r'\b((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', s)]
    for path in paths:
        if path and path[0] not in ('crate', 'super', 'self') and absolute(m, path) is None:
            continue
        t = resolve(m, path)
        if t and t != m:
            edges.add((m, t))

# Between a module and its ancestor, an edge to an item the other one
# defines is the module tree, not a circle: a parent re-exports its
# children's items, a child uses its parent's. Paths through a re-export
# were resolved to the module that defines the item above, so what such an
# edge hides is only the tree.
graph = {}
for a, b in edges:
    if not (is_ancestor(a, b) or is_ancestor(b, a)):
        graph.setdefault(a, set()).add(b)


def circles_of(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def name(m):
    return '::'.join(m) or 'crate'


circles = circles_of(graph)
for comp in circles:
    members = set(comp)
    print('circle:', ', '.join(name(m) for m in comp))
    for a, b in sorted(edges):
        if a in members and b in members and b in graph.get(a, ()):
            print('   ', name(a), '->', name(b))
allowed = sum(1 for (a, b) in edges if (b, a) in edges and a < b and (is_ancestor(a, b) or is_ancestor(b, a)))
print(len(circles), 'import circles between modules, re-exports resolved to the module that defines the item',
      '(comments, doc links and tests not counted;', allowed, 'parent <-> child pairs allowed)')
sys.exit(1 if circles else 0)
