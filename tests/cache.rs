//! The executable cache: a warm run compiles nothing; damaged entries and a changed plugin make the
//! next run rebuild (and say so) instead of loading; concurrent compiles leave one valid entry each.

use crate::common::{assert_one_line_error, g4c_with_cache, golden_dir};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;

/// `g4c run` of the tiny model with `--stats`; returns (generated ids as printed, stderr).
fn run(cache: &Path, extra: &[&str]) -> (String, String) {
    let dir = golden_dir("tiny").join("hf");
    let mut args = vec!["run", dir.to_str().unwrap(), "--prompt-ids", "2,10,20", "--max-new-tokens", "4"];
    args.extend(["--prefill-buckets", "8", "--context", "64", "--stats"]);
    args.extend(extra);
    let out = g4c_with_cache(cache, &args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).trim().to_string(), stderr)
}

fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache.join("executables"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

fn cache_cmd(cache: &Path, action: &str) -> Output {
    g4c_with_cache(cache, &["cache", action])
}

#[test]
fn a_warm_run_compiles_nothing() {
    let cache = tempfile::tempdir().unwrap();
    let (cold_tokens, cold) = run(cache.path(), &[]);
    assert!(cold.contains("compile: compiled 2 of 2 entry points"), "{cold}");
    assert_eq!(entries(cache.path()).len(), 2, "one entry per entry point");
    let (warm_tokens, warm) = run(cache.path(), &[]);
    assert!(warm.contains("compile: cached (2 entry points loaded"), "{warm}");
    assert_eq!(warm_tokens, cold_tokens);
    let listed = String::from_utf8(cache_cmd(cache.path(), "ls").stdout).unwrap();
    assert!(listed.contains("2 entries") && listed.contains("@decode") && listed.contains("@prefill"), "{listed}");
}

#[test]
fn damaged_entries_are_reported_removed_and_rebuilt() {
    let cache = tempfile::tempdir().unwrap();
    let (tokens, _) = run(cache.path(), &[]);
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 2] = [
        ("checksum mismatch", |p| {
            let mut bytes = std::fs::read(p).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x01;
            std::fs::write(p, bytes).unwrap();
        }),
        ("truncated", |p| {
            let len = std::fs::metadata(p).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(p).unwrap().set_len(len - 100).unwrap();
        }),
    ];
    for (what, damage) in damages {
        let victim = entries(cache.path())[0].clone();
        damage(&victim);
        let (again, stderr) = run(cache.path(), &[]);
        assert!(stderr.contains("is corrupt") && stderr.contains(what), "{what}: {stderr}");
        assert!(stderr.contains("and was removed"), "{stderr}");
        assert!(stderr.contains("compile: compiled 1 of 2 entry points"), "{what}: {stderr}");
        assert_eq!(again, tokens, "{what}: the rebuilt executable computes the same tokens");
        assert!(cache_cmd(cache.path(), "verify").status.success(), "the rebuilt entry is valid");
    }
}

#[test]
fn verify_removes_a_damaged_entry_and_fails() {
    let cache = tempfile::tempdir().unwrap();
    run(cache.path(), &[]);
    let victim = entries(cache.path())[1].clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[60] ^= 0x80; // inside the metadata
    std::fs::write(&victim, bytes).unwrap();
    let out = cache_cmd(cache.path(), "verify");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum mismatch"));
    assert!(!victim.exists(), "verify removes what fails");
    assert!(cache_cmd(cache.path(), "verify").status.success());
    assert!(cache_cmd(cache.path(), "clear").status.success());
    assert!(entries(cache.path()).is_empty());
}

#[test]
fn a_different_plugin_binary_rebuilds_instead_of_loading() {
    let cache = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let original = g4c_runtime::backend::pjrt::find_cpu_plugin().expect("PJRT CPU plugin (run scripts/setup)");
    let copy = plugins.path().join("plugin.so");
    std::fs::copy(&original, &copy).unwrap();
    let flag = ["--plugin", copy.to_str().unwrap()];
    let (tokens, _) = run(cache.path(), &flag);
    let (_, warm) = run(cache.path(), &flag);
    assert!(warm.contains("compile: cached"), "{warm}");
    // Same code, one more byte at the end of the file: another binary as far as the cache can tell.
    std::fs::OpenOptions::new().append(true).open(&copy).unwrap().write_all(b"\0").unwrap();
    let (again, changed) = run(cache.path(), &flag);
    assert!(changed.contains("cached only for another environment (plugin_hash"), "{changed}");
    assert!(changed.contains("compile: compiled 2 of 2 entry points"), "{changed}");
    assert_eq!(again, tokens);
    assert_eq!(entries(cache.path()).len(), 4, "entries for both plugin builds");
}

#[test]
fn concurrent_compiles_both_succeed_and_leave_one_valid_entry_each() {
    let cache = tempfile::tempdir().unwrap();
    let dir = golden_dir("tiny").join("hf");
    let args = ["compile", dir.to_str().unwrap(), "--prefill-len", "8", "--context", "64", "-q"];
    let spawn =
        || std::process::Command::new(env!("CARGO_BIN_EXE_g4c")).env("G4C_CACHE_DIR", cache.path()).args(args).output();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    for out in [&a, &b] {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let files: Vec<String> = std::fs::read_dir(cache.path().join("executables"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 2, "one entry per entry point and no temporaries: {files:?}");
    let verified = cache_cmd(cache.path(), "verify");
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stderr));
    assert!(String::from_utf8_lossy(&verified.stdout).contains("2 entries verified"));
}

#[test]
fn a_cache_that_cannot_be_written_costs_a_warning_not_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let (tokens, stderr) = run(&not_a_dir, &[]);
    assert!(stderr.contains("warning: @decode was compiled but not cached"), "{stderr}");
    let (expected, _) = run(tmp.path(), &[]);
    assert_eq!(tokens, expected);
}

#[test]
fn compiling_into_a_cache_that_cannot_be_written_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let dir = golden_dir("tiny").join("hf");
    let out = g4c_with_cache(&not_a_dir, &["compile", dir.to_str().unwrap(), "--prefill-len", "8", "--context", "64"]);
    // Said once, before anything is compiled.
    assert_one_line_error(&out, &["executable cache", "cannot be written", "without -o"]);
}

/// `compile` without `-o` needs to write the cache only for what it does not hold: a warm cache it
/// cannot write is enough, a cold one is refused before anything is compiled.
#[test]
fn compiling_into_a_warm_cache_needs_no_write() {
    let cache = tempfile::tempdir().unwrap();
    let dir = golden_dir("tiny").join("hf");
    let compile = |context: &str| {
        g4c_with_cache(cache.path(), &["compile", dir.to_str().unwrap(), "--prefill-len", "8", "--context", context])
    };
    let warmed = compile("64");
    assert!(warmed.status.success(), "{}", String::from_utf8_lossy(&warmed.stderr));
    // The write check's file name taken by a directory: the check fails as it would for a cache
    // on a read-only file system (which a test running as root cannot make).
    std::fs::create_dir(cache.path().join("executables/writable")).unwrap();
    let warm = compile("64");
    assert!(warm.status.success(), "{}", String::from_utf8_lossy(&warm.stderr));
    assert_one_line_error(&compile("32"), &["executable cache", "cannot be written", "without -o"]);
}
