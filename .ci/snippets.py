#!/usr/bin/env python3
"""Each Rust snippet of the README compiles in a fresh crate with exactly
the dependency lines its section of "## Install" gives, as a new user
would paste them: the doc tests compile the same snippets with this
crate's dev-dependencies, which hide a missing feature (tower's `retry`,
say) that this crate happens to turn on.

The quick start goes with the reqwest lines; every other snippet with the
hyper-util lines (the default features). `tower-throttle = ...` becomes
this checkout (`path = ...`), with the features the line names. The
scratch crates live under the target directory and build offline, from a
copy of Cargo.lock: nothing is downloaded. A section whose lines need
crates neither the lock file nor the local registry cache holds cannot
be resolved offline; it is reported as not checked (and fails the run
under SNIPPETS_ONLINE=1, which lets cargo download).

`cargo check` type-checks each snippet as a binary of its own (no code
generation or linking: the cheap, honest version of "compiles").

Cargo unifies features: tower-throttle turns on tower's `retry` feature
itself, so a snippet using `tower::retry` compiles even when its lines
forget `"retry"`. The tower modules a snippet uses are therefore also
checked against the features its section's `tower = ...` line names.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
ONLINE = os.environ.get("SNIPPETS_ONLINE") == "1"


def code_blocks(markdown):
    """(heading, info, body) of every fenced block, under its last `## ` heading."""
    heading, blocks, open_block = "", [], None
    for line in markdown.splitlines():
        if open_block is None and line.startswith("## "):
            heading = line[3:].strip()
        fence = line.startswith("```")
        if open_block is None and fence:
            open_block = (heading, line[3:].strip(), [])
        elif open_block is not None and fence:
            blocks.append((open_block[0], open_block[1], "\n".join(open_block[2]) + "\n"))
            open_block = None
        elif open_block is not None:
            open_block[2].append(line)
    return blocks


def install_lines(blocks):
    """The `[dependencies]` lines of the Install section, by client."""
    sections = {}
    for heading, info, body in blocks:
        if heading != "Install" or info != "toml":
            continue
        if "reqwest" in body and "tower-throttle" in body:
            sections["reqwest"] = body
        elif "hyper-util" in body and "tower-throttle" in body:
            sections["hyper-util"] = body
    assert set(sections) == {"reqwest", "hyper-util"}, f"install blocks found: {sorted(sections)}"
    return sections


def local_dependency(lines):
    """`tower-throttle = ...` pointing at this checkout, features kept."""
    def replace(match):
        value = match.group(1).strip()
        features = re.search(r"features\s*=\s*(\[[^\]]*\])", value)
        extra = f", features = {features.group(1)}" if features else ""
        return f'tower-throttle = {{ path = "{ROOT.as_posix()}"{extra} }}'

    return re.sub(r"^tower-throttle\s*=\s*(.*)$", replace, lines, flags=re.M)


def snippets(blocks):
    """(section, name, code) of every Rust snippet outside Install."""
    found = []
    for heading, info, body in blocks:
        if not info.startswith("rust") or heading == "Install":
            continue
        section = "reqwest" if heading == "Quick start" else "hyper-util"
        name = re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")
        found.append((section, f"{name}_{len(found)}", body))
    return found


# tower's modules behind a feature of the same name (ServiceExt is `util`'s).
TOWER_FEATURES = {
    "balance", "buffer", "discover", "filter", "hedge", "limit", "load", "load_shed",
    "make", "ready_cache", "reconnect", "retry", "spawn_ready", "steer", "timeout", "util",
}


def tower_features_missing(lines, programs):
    """The tower features the snippets use that `lines` do not name."""
    named = re.search(r"^tower\s*=.*features\s*=\s*\[([^\]]*)\]", lines, flags=re.M)
    named = set(re.findall(r'"([^"]+)"', named.group(1))) if named else set()
    used = set()
    for _, code in programs:
        used |= {module.replace("_", "-") for module in re.findall(r"\btower::(\w+)", code)
                 if module in TOWER_FEATURES}
        if re.search(r"\bServiceExt\b", code):
            used.add("util")
    return sorted(used - named)


def check(section, lines, programs):
    missing = tower_features_missing(lines, programs)
    if missing:
        print(f"FAILED: {section}: the snippets use tower's {missing}, which its tower line does not name",
              file=sys.stderr)
        return False
    crate = TARGET / "snippets" / section
    if crate.exists():
        shutil.rmtree(crate / "src", ignore_errors=True)
    (crate / "src" / "bin").mkdir(parents=True, exist_ok=True)
    (crate / "Cargo.toml").write_text(
        "[package]\n"
        f'name = "snippets-{section}"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
        "[workspace]\n\n" + local_dependency(lines)
    )
    shutil.copy(ROOT / "Cargo.lock", crate / "Cargo.lock")
    for name, code in programs:
        (crate / "src" / "bin" / f"{name}.rs").write_text(code)
    command = ["cargo", "check", "--bins", "--quiet", "--manifest-path", str(crate / "Cargo.toml")]
    if not ONLINE:
        command.append("--offline")
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET))
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    names = ", ".join(name for name, _ in programs)
    if result.returncode == 0:
        print(f"ok: {section} ({names})")
        return True
    unresolved = "failed to select a version" in result.stderr or "no matching package" in result.stderr or (
        "offline" in result.stderr and "download" in result.stderr
    )
    if unresolved and not ONLINE:
        first = next((line for line in result.stderr.splitlines() if line.startswith("error")), "")
        print(f"not checked: {section} ({names}): its lines need crates that are not here offline: {first}")
        return True
    print(f"FAILED: {section} ({names})\n{result.stderr}", file=sys.stderr)
    return False


def main():
    blocks = code_blocks((ROOT / "README.md").read_text())
    lines = install_lines(blocks)
    by_section = {}
    for section, name, code in snippets(blocks):
        by_section.setdefault(section, []).append((name, code))
    ok = all(check(section, lines[section], programs) for section, programs in sorted(by_section.items()))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
