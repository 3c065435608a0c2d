#!/usr/bin/env python3
"""Finds import circles between the crate's modules: modules that reach each
other through their imports, two of them (each uses the other) or more
(a -> b -> c -> a). Reads every `use` and every `crate::`/`super::` path
written inline in src/, outside comments and `#[cfg(test)] mod tests`;
exits 1 on a circle."""
import os,re,sys,itertools
root=os.path.join(os.path.dirname(os.path.abspath(__file__)),'..','src')
# map file -> module path
mods={}
for d,_,fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p=os.path.join(d,f); rel=os.path.relpath(p,root)[:-3].split('/')
        if rel[-1] in ('mod','lib'): rel=rel[:-1]
        mods[tuple(rel)]=p
def resolve(cur, path):
    # cur: module tuple of file; path: list of segments after use
    if path[0]=='crate': base=[]; rest=path[1:]
    elif path[0]=='super':
        base=list(cur); rest=path
        while rest and rest[0]=='super': base=base[:-1]; rest=rest[1:]
    elif path[0]=='self': base=list(cur); rest=path[1:]
    else: return None
    # longest prefix that is a module
    best=None
    for i in range(len(rest),-1,-1):
        cand=tuple(base+rest[:i])
        if cand in mods: best=cand; break
    return best
edges=set()
for m,p in mods.items():
    src=open(p).read()
    # strip tests module
    src=re.split(r'#\[cfg\(test\)\]\s*mod tests',src)[0]
    src=re.sub(r'//.*','',src)  # comments and doc links are not imports
    for u in re.findall(r'\buse\s+((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)',src):
        t=resolve(m,u.split('::'))
        if t and t!=m: edges.add((m,t))
    for u in re.findall(r'\b((?:crate|super)(?:::[a-z_][a-z0-9_]*)+)::',src):
        t=resolve(m,u.split('::'))
        if t and t!=m: edges.add((m,t))
    for grp in re.findall(r'\buse\s+((?:crate|super)(?:::[a-z_][a-z0-9_]*)*)::\{([^}]*)\}',src):
        base=grp[0].split('::')
        for item in grp[1].split(','):
            item=item.strip().split('::')[0].split(' ')[0]
            if not item: continue
            t=resolve(m,base+[item])
            if t and t!=m: edges.add((m,t))
def is_ancestor(a,b): return len(a)<len(b) and b[:len(a)]==a
# A parent that re-exports its child's items (`pub use child::Item`) while
# the child uses the parent's is the module tree, not a circle.
graph={}
for a,b in edges:
    if not (is_ancestor(a,b) or is_ancestor(b,a)): graph.setdefault(a,set()).add(b)
def circles_of(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index,low,stack,on,found=[{},{},[],set(),[]]
    def visit(v):
        index[v]=low[v]=len(index); stack.append(v); on.add(v)
        for w in sorted(graph.get(v,())):
            if w not in index: visit(w); low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],index[w])
        if low[v]==index[v]:
            comp=[]
            while True:
                w=stack.pop(); on.discard(w); comp.append(w)
                if w==v: break
            if len(comp)>1: found.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index: visit(v)
    return found
name=lambda m:'::'.join(m) or 'crate'
circles=circles_of(graph)
for comp in circles:
    members=set(comp)
    print('circle:',', '.join(name(m) for m in comp))
    for a,b in sorted(edges):
        if a in members and b in members and b in graph.get(a,()): print('   ',name(a),'->',name(b))
allowed=sum(1 for (a,b) in edges if (b,a) in edges and a<b and (is_ancestor(a,b) or is_ancestor(b,a)))
print(len(circles),'import circles between modules (comments, doc links and tests not counted;',
      allowed,'parent <-> child pairs allowed)')
sys.exit(1 if circles else 0)
