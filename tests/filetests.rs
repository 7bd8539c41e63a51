//! Filetests, as MLIR's and Cranelift's: text files under `tests/filetests/<pass>/*.g4c`, each naming
//! a pass and a target in its header, then many small cases separated by `// -----`, each the IR in
//! and, after `// expect:`, the IR the pass must turn it into (exactly, as printed). A pass the target
//! does not run leaves its input unchanged. Every output must also parse and print back identically. `G4C_BLESS=1 make test` rewrites every expectation with
//! what the pass now prints; review it with `git diff`.
//!
//! ```text
//! // pass: cse
//! // target: cpu
//!
//! // case: equal instructions merge
//! module @m { … }
//! // expect:
//! module @m { … }
//! // -----
//! // case: …
//! ```

use crate::common::repo;
use g4c_ir::{parse_module, print_module, verify_module, Target};
use g4c_passes::pass_by_name;
use std::path::{Path, PathBuf};

const SEPARATOR: &str = "// -----";
const EXPECT: &str = "// expect:";

/// One file: its header and its cases.
struct FileTest {
    pass: String,
    target: String,
    header: String,
    cases: Vec<Case>,
}

struct Case {
    /// The case's text up to its expectation (its `// case:` line, comments and input IR).
    input: String,
    /// What follows `// expect:` up to the next separator.
    expected: String,
}

fn parse_file(path: &Path, text: &str) -> FileTest {
    let mut header = String::new();
    let mut cases: Vec<Case> = vec![];
    // The case being read: its input, then (after `// expect:`) its expected output.
    let mut current: Option<(String, Option<String>)> = None;
    for line in text.lines() {
        if line.trim() == SEPARATOR {
            let (input, expected) =
                current.take().unwrap_or_else(|| panic!("{}: `{SEPARATOR}` before a case", path.display()));
            let expected = expected.unwrap_or_else(|| panic!("{}: a case has no `{EXPECT}` line", path.display()));
            cases.push(Case { input, expected });
            continue;
        }
        match &mut current {
            None if line.starts_with("// case:") => current = Some((format!("{line}\n"), None)),
            None if cases.is_empty() => header += &format!("{line}\n"),
            None if line.trim().is_empty() => {}
            None => panic!("{}: expected `// case:` after `{SEPARATOR}`, found {line:?}", path.display()),
            Some((_, expected @ None)) if line.trim() == EXPECT => *expected = Some(String::new()),
            Some((input, None)) => *input += &format!("{line}\n"),
            Some((_, Some(expected))) => *expected += &format!("{line}\n"),
        }
    }
    let (input, expected) = current.unwrap_or_else(|| panic!("{}: no `// case:`", path.display()));
    cases.push(Case {
        input,
        expected: expected.unwrap_or_else(|| panic!("{}: a case has no `{EXPECT}` line", path.display())),
    });
    let field = |key: &str| {
        header
            .lines()
            .find_map(|l| l.strip_prefix(&format!("// {key}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("{}: the header names no `{key}`", path.display()))
    };
    FileTest { pass: field("pass"), target: field("target"), header, cases }
}

fn case_name(case: &Case) -> &str {
    case.input.lines().next().unwrap_or("").trim_start_matches("// case:").trim()
}

/// What the file's pass makes of `case`'s input, as printed.
fn run_case(test: &FileTest, case: &Case) -> Result<String, String> {
    let target = Target::by_name(&test.target)?;
    let pass = pass_by_name(&test.pass).map_err(|e| e.to_string())?;
    let mut module = parse_module(&case.input).map_err(|e| format!("input: {e}"))?;
    verify_module(&module).map_err(|e| format!("input: {e}"))?;
    if pass.is_enabled(target) {
        pass.run(&mut module, target).map_err(|e| e.to_string())?;
        verify_module(&module).map_err(|e| format!("output: {e}"))?;
    }
    let out = print_module(&module);
    let reparsed = parse_module(&out).map_err(|e| format!("the output does not parse back: {e}"))?;
    if print_module(&reparsed) != out {
        return Err("the output does not print back identically after parsing".into());
    }
    Ok(out)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if path.extension().is_some_and(|e| e == "g4c") {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn every_filetest_case_gives_its_expected_ir() {
    let bless = std::env::var_os("G4C_BLESS").is_some_and(|v| v == "1");
    let paths = files(&repo().join("tests/filetests"));
    assert!(!paths.is_empty(), "no filetests found");
    let mut failures = vec![];
    let mut cases = 0;
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let test = parse_file(&path, &text);
        let dir = path.parent().and_then(|d| d.file_name()).map(|d| d.to_string_lossy().into_owned());
        assert_eq!(
            dir.as_deref(),
            Some(test.pass.as_str()),
            "{}: a filetest lives in its pass's folder",
            path.display()
        );
        let mut blessed = vec![];
        for case in &test.cases {
            cases += 1;
            let got = run_case(&test, case);
            match &got {
                Ok(out) if out.trim_end() == case.expected.trim_end() => {}
                Ok(out) => failures.push(format!(
                    "{} ({}): expected\n{}\ngot\n{out}",
                    path.display(),
                    case_name(case),
                    case.expected
                )),
                Err(e) => failures.push(format!("{} ({}): {e}", path.display(), case_name(case))),
            }
            let expected = got.unwrap_or_else(|_| case.expected.clone());
            blessed.push(format!("{}{EXPECT}\n{}\n", case.input, expected.trim_end()));
        }
        if bless {
            let text = format!("{}{}", test.header, blessed.join(&format!("\n{SEPARATOR}\n\n")));
            std::fs::write(&path, text).unwrap();
        }
    }
    assert!(cases > 0);
    if !bless {
        assert!(
            failures.is_empty(),
            "{} filetest case(s) failed (G4C_BLESS=1 rewrites expectations):\n\n{}",
            failures.len(),
            failures.join("\n\n")
        );
    }
}
