//! The README and the pages under `docs/` as a reader meets them: the quick
//! start is the example that CI builds and runs, the code blocks show no
//! lines hidden from rustdoc, and the links into the repository lead to
//! files that exist. (Their code blocks are compiled and run as doc tests:
//! see the end of `src/lib.rs`.)

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("a docs/ directory") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// The fenced code blocks of `markdown`: (info string, body).
fn code_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    blocks
}

#[test]
fn the_quick_start_is_the_text_of_examples_quick_start_rs() {
    let readme = read(&root().join("README.md"));
    let section = &readme[readme.find("\n## Quick start\n").expect("a Quick start section")..];
    let (info, block) = code_blocks(section)
        .into_iter()
        .next()
        .expect("a code block in it");
    assert_eq!(
        info, "rust,ignore",
        "built and run as an example, not as a doc test"
    );
    let example = read(&root().join("examples/quick_start.rs"));
    assert!(
        block == example,
        "README's quick start and examples/quick_start.rs differ:\n{block}"
    );
}

#[test]
fn code_blocks_show_no_lines_hidden_from_rustdoc() {
    for page in pages() {
        for (info, body) in code_blocks(&read(&page)) {
            if !(info.is_empty() || info.starts_with("rust")) {
                continue;
            }
            for line in body.lines() {
                let trimmed = line.trim_start();
                assert!(
                    trimmed != "#" && !trimmed.starts_with("# "),
                    "{}: a hidden line shows as text in Markdown: {line}",
                    page.display()
                );
            }
        }
    }
}

#[test]
fn links_into_the_repository_lead_to_files() {
    for page in pages() {
        let text = read(&page);
        let directory = page.parent().unwrap();
        for (start, _) in text.match_indices("](") {
            let target = &text[start + 2..];
            let target = &target[..target.find(')').unwrap()];
            let target = target.split('#').next().unwrap();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let file = directory.join(target);
            assert!(
                file.exists(),
                "{}: the link to {target} leads nowhere",
                page.display()
            );
        }
    }
}

#[test]
fn every_page_is_compiled_as_doc_tests() {
    let lib = read(&root().join("src/lib.rs"));
    for page in pages() {
        let name = page
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        assert!(
            lib.contains(&format!("include_str!(\"../{name}\")")),
            "src/lib.rs does not compile the examples of {name}"
        );
    }
}
