//! What a hostile tester found (issue "Hardening"), one test per finding, each failing on the code
//! before its fix: sizes and limits, temporary files, non-finite numbers, paths and environment,
//! argument errors, read-only caches, `inspect`, and messages that point the wrong way.

use crate::common::{assert_one_line_error, g4c, golden_dir};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

fn tiny() -> String {
    golden_dir("tiny").join("published").to_str().unwrap().to_string()
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A huge --max-new-tokens once wrapped the context check and generated past the context for ever.
/// Size flags are range-checked where they enter, and generation stops where the context ends.
#[test]
fn size_flags_are_range_checked_and_generation_stops_at_the_context() {
    let tiny = tiny();
    let max = "18446744073709551615";
    for (args, needles) in [
        (
            vec!["run", &tiny, "--prompt-ids", "2,17", "--context", "64", "--max-new-tokens", max],
            vec!["--max-new-tokens", "16777216", max],
        ),
        (vec!["bench", &tiny, "--gen", max], vec!["--gen", "16777216"]),
        (vec!["ir", &tiny, "--batch", max], vec!["--batch", "1024"]),
        (vec!["ir", &tiny, "--batch", "0"], vec!["--batch", "found 0"]),
        (vec!["ir", &tiny, "--context", "1k"], vec!["--context", "`1k`"]),
        (vec!["eval", &tiny, "--ids", "/dev/null", "--chunk", "0"], vec!["--chunk", "found 0"]),
        (vec!["bench", &tiny, "--prompt-len", "4,0"], vec!["--prompt-len", "found 0"]),
        (vec!["bench", &tiny, "--prompt-len", "4,8,4"], vec!["--prompt-len", "4 is given twice"]),
        (
            vec!["run", &tiny, "--prompt-ids", "2", "--context", "200000"],
            vec!["--context 200000", "max_position_embeddings"],
        ),
        (vec!["run", &tiny, "--prompt-ids", "2,3,4,5", "--context", "4"], vec!["4 tokens", "no room", "context of 4"]),
        (
            vec!["run", &tiny, "--prompt-ids", "2,3,4,5,6", "--context", "4", "--backend", "interp"],
            vec!["5 tokens", "no room", "context of 4"],
        ),
    ] {
        assert_one_line_error(&g4c(&args), &needles);
    }
    for backend in ["interp", "pjrt"] {
        let args = ["run", &tiny, "--prompt-ids", "2,17", "--context", "16", "--max-new-tokens", "100"];
        let json = json_of(&g4c(&[&args[..], &["--ignore-eos", "--json", "--backend", backend]].concat()));
        assert_eq!(json["generated_ids"].as_array().unwrap().len(), 14, "{backend}: {json}");
        assert_eq!(json["stop_reason"], "context", "{backend}");
    }
}

/// Zero generated tokens still write logits of the model's width, `[0, vocab]`, as the README says.
#[test]
fn zero_new_tokens_write_logits_of_the_vocab_width() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("logits.safetensors");
    let out = g4c(&[
        "run",
        &tiny(),
        "--prompt-ids",
        "2",
        "--max-new-tokens",
        "0",
        "--json",
        "--logits-out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(json_of(&out)["generated_ids"], serde_json::json!([]));
    let bytes = std::fs::read(&file).unwrap();
    let logits = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(logits.tensor("logits").unwrap().shape(), [0, 512]);
}

/// clap's detail (the missing arguments, possible values, "did you mean") survives the one line,
/// and `g4c` alone is a failure that prints the help.
#[test]
fn argument_errors_keep_their_detail() {
    let tiny = tiny();
    for (args, needles) in [
        (vec!["run", &tiny], vec!["not provided", "--prompt-ids"]),
        (vec!["synth"], vec!["not provided", "--preset", "--out"]),
        (vec!["run", &tiny, "--backend", "pjt"], vec!["possible values: interp, pjrt", "'pjrt'"]),
        (vec!["run", &tiny, "--tempreature", "1"], vec!["'--temperature'"]),
    ] {
        assert_one_line_error(&g4c(&args), &needles);
    }
    let out = g4c(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage: g4c"));
}

/// `g4c` run in `cwd` with HOME at `home` (where the cache goes unless `env` sets G4C_CACHE_DIR).
fn g4c_in(cwd: &Path, home: &Path, env: &[(&str, &std::ffi::OsStr)], args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"));
    command.current_dir(cwd).env("HOME", home).env_remove("XDG_CACHE_HOME").env_remove("G4C_CACHE_DIR");
    command.envs(env.iter().map(|(k, v)| (k, v))).args(args).output().expect("g4c runs")
}

/// An artifact's executables do not depend on the user's cache being writable: with a cache that
/// cannot be created, `compile -o` still writes every executable, and a run loads them.
#[test]
fn artifacts_hold_their_executables_whatever_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = tmp.path().join("artifact");
    let cache = [("G4C_CACHE_DIR", not_a_dir.as_os_str())];
    let compiled = g4c_in(
        tmp.path(),
        tmp.path(),
        &cache,
        &["compile", &tiny(), "-o", out.to_str().unwrap(), "--prefill-len", "8", "--context", "32"],
    );
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let files = std::fs::read_dir(out.join("executables")).unwrap().count();
    assert_eq!(files, 2, "prefill and decode");
    let args = ["run", out.to_str().unwrap(), "--prompt-ids", "2", "--max-new-tokens", "2", "--stats"];
    let ran = g4c_in(tmp.path(), tmp.path(), &cache, &args);
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    assert!(
        String::from_utf8_lossy(&ran.stderr).contains("compile: cached"),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// Empty variables count as unset, and a plugin named without a slash is the file in the working
/// directory, not a search of the library path.
#[test]
fn empty_variables_and_bare_plugin_names() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = std::ffi::OsStr::new("");
    let run = ["run", &tiny(), "--prompt-ids", "2", "--max-new-tokens", "1"];
    let out = g4c_in(tmp.path(), tmp.path(), &[("G4C_CACHE_DIR", empty), ("G4C_PJRT_PLUGIN", empty)], &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!tmp.path().join("executables").exists(), "G4C_CACHE_DIR=\"\" made a cache in the working directory");
    assert!(tmp.path().join(".cache/g4c/executables").is_dir(), "the cache falls back to HOME");

    let plugin = g4c_runtime::backend::pjrt::find_cpu_plugin().expect("scripts/setup installs the CPU plugin");
    let out = g4c_in(plugin.parent().unwrap(), tmp.path(), &[], &[&run[..], &["--plugin", "xla_cpu_pjrt.so"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A temporary named after a process that cannot exist (above Linux's largest pid_max), as a
/// `kill -9` leaves one.
fn plant_stale_temporary(dir: &Path, name: &str, as_dir: bool) -> std::path::PathBuf {
    let path = dir.join(format!("{}4194305-0-{name}", g4c_util::atomic::TEMP_PREFIX));
    match as_dir {
        true => std::fs::create_dir_all(path.join("executables")).unwrap(),
        false => std::fs::write(&path, b"half of it").unwrap(),
    }
    path
}

/// Temporaries of killed writers are removed by the next writer into the same directory and
/// reported by `cache ls`, removed by `cache verify`; a failed write leaves none.
#[test]
fn temporaries_do_not_pile_up() {
    let tmp = tempfile::tempdir().unwrap();
    let env = [("G4C_CACHE_DIR", tmp.path().join("cache").into_os_string())];
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let g4c = |args: &[&str]| g4c_in(tmp.path(), tmp.path(), &env, args);

    let stale_artifact = plant_stale_temporary(tmp.path(), "artifact", true);
    let out = g4c(&["compile", &tiny(), "-o", "artifact", "--prefill-len", "8", "--context", "32"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stale_artifact.exists(), "compile -o removes what a killed compile left");

    let out = g4c(&["run", &tiny(), "--prompt-ids", "2", "--max-new-tokens", "1", "--logits-out", "artifact"]);
    assert_one_line_error(&out, &["artifact"]);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().starts_with(g4c_util::atomic::TEMP_PREFIX)),
        "a failed --logits-out left {left:?}"
    );

    let cache = tmp.path().join("cache/executables");
    std::fs::create_dir_all(&cache).unwrap(); // nothing has run: the failed --logits-out was refused first
    let stale_entry = plant_stale_temporary(&cache, "x.g4cx", false);
    let ls = g4c(&["cache", "ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("writer is gone"), "{}", String::from_utf8_lossy(&ls.stdout));
    let verify = g4c(&["cache", "verify"]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
    assert!(!stale_entry.exists(), "cache verify removes temporaries of dead writers");
}

/// A CUDA target's weights are written while its kernels compile: a compile that fails beside them
/// (here NVRTC cannot be loaded) leaves neither the artifact nor its temporary directory.
#[test]
fn a_compile_that_fails_beside_its_weights_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let not_nvrtc = tmp.path().join("libnvrtc.so.12");
    std::fs::write(&not_nvrtc, "not a library").unwrap();
    let env = [("G4C_CACHE_DIR", tmp.path().join("cache").into_os_string()), ("G4C_NVRTC", not_nvrtc.into_os_string())];
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let args = ["compile", &tiny(), "--target", "t4g", "-o", "artifact", "--prefill-len", "8", "--context", "32"];
    let out = g4c_in(tmp.path(), tmp.path(), &env, &args);
    assert_one_line_error(&out, &["NVRTC", "libnvrtc.so.12"]);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    let written =
        |n: &std::ffi::OsString| n == "artifact" || n.to_string_lossy().starts_with(g4c_util::atomic::TEMP_PREFIX);
    assert!(!left.iter().any(written), "a failed compile left {left:?}");
}

/// Ctrl-C (SIGINT) or SIGTERM while `g4c compile -o` writes its artifact removes the artifact's
/// temporary directory, and the one staging its executables in the system's temporary directory,
/// before the process exits (with 128 + the signal, as the signal would have), rather than leaving
/// the first for the next write into the same directory to find and the second for good.
#[test]
fn an_interrupted_compile_leaves_nothing() {
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("artifact");
        let system_tmp = tmp.path().join("tmp");
        std::fs::create_dir(&system_tmp).unwrap();
        let args = ["compile", &tiny(), "--target", "t4g", "-o", out.to_str().unwrap(), "-q"];
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
            .env("G4C_CACHE_DIR", tmp.path().join("cache"))
            .env("TMPDIR", &system_tmp)
            .args(args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let temporary = || {
            let names = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name());
            names.into_iter().any(|n| n.to_string_lossy().starts_with(g4c_util::atomic::TEMP_PREFIX))
        };
        let started = std::time::Instant::now();
        while !temporary() {
            assert!(child.try_wait().unwrap().is_none(), "the compile ended before its artifact was begun");
            assert!(started.elapsed().as_secs() < 120, "no temporary appeared");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let killed = std::process::Command::new("kill").args([format!("-{signal}"), child.id().to_string()]).status();
        assert!(killed.unwrap().success());
        let done = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert_eq!(done.status.code(), Some(code), "{stderr}");
        // Not a terminal: no blank line before it (a terminal's echoed `^C` needs one).
        assert!(stderr.lines().last().is_some_and(|l| l.starts_with("g4c: interrupted")), "{stderr}");
        assert!(!stderr.contains("\n\ng4c: interrupted") && !stderr.starts_with('\n'), "{stderr}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.iter().all(|n| n == "cache" || n == "tmp"), "SIG{signal} left {left:?}");
        let staged: Vec<_> = std::fs::read_dir(&system_tmp).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(staged.is_empty(), "SIG{signal} left {staged:?} in the temporary directory");
    }
}

/// What cannot be removed is not reported as removed. (A directory where an entry belongs cannot
/// be removed as a file, even by root, for whom permissions would not stop it.)
#[test]
fn a_cache_that_cannot_be_emptied_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let stuck = tmp.path().join("executables/0123-4567.g4cx");
    std::fs::create_dir_all(stuck.join("inside")).unwrap();
    let cache = |action: &str| crate::common::g4c_with_cache(tmp.path(), &["cache", action]);
    assert_one_line_error(&cache("clear"), &["could not remove 1 of 1 file ", "0123-4567.g4cx"]);
    let verify = cache("verify");
    assert!(!verify.status.success());
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(stderr.contains("0 removed, 1 could not be") && !stderr.contains("was removed"), "{stderr}");
}

/// `inspect` reads the multimodal config form, and `--verify` checks everything a run relies on:
/// the executables listed in the manifest and the programs.
#[test]
fn inspect_reads_nested_configs_and_verifies_what_run_checks() {
    let tmp = tempfile::tempdir().unwrap();
    let artifact = tmp.path().join("artifact");
    let a = artifact.to_str().unwrap();
    let g4c = |args: &[&str]| crate::common::g4c_with_cache(tmp.path(), args);
    assert!(g4c(&["compile", &tiny(), "-o", a, "--prefill-len", "8", "--context", "32"]).status.success());
    let shown = String::from_utf8(g4c(&["inspect", a]).stdout).unwrap();
    assert!(shown.contains("10 layers, hidden 64, vocab 512"), "{shown}");
    assert!(g4c(&["inspect", a, "--verify"]).status.success());

    let program = artifact.join("stablehlo/decode.mlir");
    let text = std::fs::read_to_string(&program).unwrap();
    std::fs::write(&program, text.replace("stablehlo.add", "stablehlo.subtract")).unwrap();
    assert_one_line_error(&g4c(&["inspect", a, "--verify"]), &["stablehlo/decode.mlir", "differs"]);
    std::fs::write(&program, text).unwrap();

    std::fs::remove_dir_all(artifact.join("executables")).unwrap();
    assert_one_line_error(&g4c(&["inspect", a, "--verify"]), &["executables/", "is missing"]);
}

/// A NaN in a checkpoint is reported at load, naming the tensor (scanning every weight costs about
/// 0.7 s of a 30 s weight load on synthetic E2B: BENCHMARKS.md); finite weights whose activations
/// overflow give an error naming the step, not a token picked from NaN logits.
#[test]
fn non_finite_numbers_are_errors() {
    use crate::frontend_errors::rewrite;
    let key = "model.language_model.layers.3.mlp.up_proj.weight";
    let run = |dir: &Path, backend: &str| {
        let args =
            ["run", dir.to_str().unwrap(), "--prompt-ids", "2,17", "--max-new-tokens", "3", "--backend", backend];
        g4c(&args)
    };
    let nan = crate::common::published_copy("tiny");
    rewrite(nan.path(), |n, d, s, mut b| {
        if n == key {
            b[20..22].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        }
        Some((d, s, b))
    });
    let huge = crate::common::published_copy("tiny");
    rewrite(huge.path(), |n, d, s, b| {
        let big = half::bf16::from_f32(3e38).to_le_bytes();
        Some((d, s, if n.ends_with("embed_tokens.weight") { big.repeat(b.len() / 2) } else { b }))
    });
    // The per-layer embeddings (10 layers × 8 per row) are gathered on the host row by row: a NaN
    // in a row the prompt reads is an error naming its element of the table, one in a row that is
    // never read is not looked at.
    let table = "model.language_model.embed_tokens_per_layer.weight";
    let nan_in_row = |row: usize| {
        let copy = crate::common::published_copy("tiny");
        rewrite(copy.path(), |n, d, s, mut b| {
            if n == table {
                let at = (row * 80 + 3) * 2;
                b[at..at + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
            }
            Some((d, s, b))
        });
        copy
    };
    let (read, unread) = (nan_in_row(17), nan_in_row(511));
    for backend in ["interp", "pjrt"] {
        assert_one_line_error(
            &run(nan.path(), backend),
            &[key, "element 10 in ", "model.safetensors is NaN or infinite"],
        );
        assert_one_line_error(&run(huge.path(), backend), &["logits of the prefill are not finite"]);
        assert_one_line_error(
            &run(read.path(), backend),
            &[table, "element 1363 in ", "model.safetensors is NaN or infinite"],
        );
        let out = run(unread.path(), backend);
        assert!(out.status.success(), "{backend}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `g4c` that is killed (and the test failed) if it has not finished in `seconds`: for inputs that
/// once made it hang.
fn g4c_within(seconds: u64, args: &[&str]) -> std::process::Output {
    g4c_within_cache(seconds, crate::common::test_cache(), args)
}

/// `g4c_within`, its executable cache in `cache`.
fn g4c_within_cache(seconds: u64, cache: &Path, args: &[&str]) -> std::process::Output {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
        .env("G4C_CACHE_DIR", cache)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..seconds * 10 {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap();
    panic!("g4c {args:?} did not finish in {seconds} s");
}

/// Rewrites the JSON header of `dir/model.safetensors` through `edit`, keeping the data.
fn edit_header(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    edit(&mut header);
    let text = header.to_string();
    let out = [&(text.len() as u64).to_le_bytes()[..], text.as_bytes(), &bytes[8 + len..]].concat();
    std::fs::write(&path, out).unwrap();
}

/// Errors name what is wrong where the user can fix it, in a line of readable length.
#[test]
fn messages_point_at_the_cause() {
    use crate::frontend_errors::edit_config;
    const NORM: &str = "model.language_model.norm.weight";
    let broken = |edit: &dyn Fn(&Path)| {
        let dir = crate::common::published_copy("tiny");
        edit(dir.path());
        let out = g4c(&["run", dir.path().to_str().unwrap(), "--prompt-ids", "2", "--max-new-tokens", "1"]);
        (dir, out)
    };
    type Edit = Box<dyn Fn(&Path)>;
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|d| edit_header(d, |h| h[NORM]["shape"] = serde_json::json!([32]))),
            vec![NORM, "BF16 [32] (64 bytes)", "holds 128 bytes"],
        ),
        (
            Box::new(|d| {
                edit_config(d, |c| c["text_config"].as_object_mut().unwrap().remove("hidden_size").map(drop).unwrap())
            }),
            vec!["tensor problems", "more (does config.json describe this checkpoint?)"],
        ),
        (
            Box::new(|d| {
                edit_config(d, |c| c["text_config"].as_object_mut().unwrap().remove("layer_types").map(drop).unwrap())
            }),
            vec!["num_kv_shared_layers", "no `layer_types` given"],
        ),
        (
            Box::new(|d| edit_config(d, |c| c["text_config"]["hidden_size_per_layer_input"] = 0.into())),
            vec!["embed_tokens_per_layer.weight` is present", "hidden_size_per_layer_input is 0"],
        ),
        (
            Box::new(|d| {
                edit_config(d, |c| {
                    c["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 2.0.into()
                })
            }),
            vec!["partial_rotary_factor", "(0, 1]", "found 2"],
        ),
        (
            Box::new(|d| edit_config(d, |c| c["text_config"]["vocab_size"] = (1u64 << 40).into())),
            vec!["vocab_size", "at most 16777216"],
        ),
    ];
    for (edit, needles) in cases {
        let (_dir, out) = broken(&*edit);
        assert_one_line_error(&out, &needles);
        assert!(out.stderr.len() < 1000, "{} bytes of error", out.stderr.len());
    }

    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(g4c(&["synth", "--preset", "tiny", "-o", model.to_str().unwrap()]).status.success());
    let m = model.to_str().unwrap();
    assert_one_line_error(&g4c(&["run", m, "--prompt", " "]), &["prompt text is empty"]);
    assert_one_line_error(&g4c(&["run", m, "--prompt", "ba zzqx"]), &["`zzqx`", "not in the vocabulary"]);

    std::fs::remove_file(model.join("model.safetensors")).unwrap();
    let fifo = std::process::Command::new("mkfifo").arg(model.join("model.safetensors")).status().unwrap();
    assert!(fifo.success());
    assert_one_line_error(&g4c_within(30, &["run", m, "--prompt-ids", "2"]), &["model.safetensors", "FIFO"]);
}

/// Cold runs at once take turns compiling each program into the shared cache: between them every
/// program is compiled once, not once per run.
#[test]
fn concurrent_cold_runs_compile_each_program_once() {
    let cache = tempfile::tempdir().unwrap();
    let tiny = tiny();
    let args = ["run", &tiny, "--prompt-ids", "2,17", "--max-new-tokens", "2", "--context", "64", "--stats"];
    let runs: Vec<std::process::Child> = (0..4)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
                .env("G4C_CACHE_DIR", cache.path())
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let compiled: usize = runs
        .into_iter()
        .map(|run| {
            let out = run.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "{stderr}");
            match stderr.split("compile: compiled ").nth(1) {
                Some(rest) => rest.split(' ').next().unwrap().parse::<usize>().unwrap(),
                None if stderr.contains("compile: cached") => 0,
                None => panic!("no compile statistics: {stderr}"),
            }
        })
        .sum();
    assert_eq!(compiled, 2, "prefill and decode, each compiled by one of the four runs");
}

/// `--check-on-cpu` says what it checked, and its executables are cached like any others.
#[test]
fn check_on_cpu_reports_and_is_cached() {
    let cache = tempfile::tempdir().unwrap();
    let tiny = tiny();
    let args = ["compile", &tiny, "--target", "tpu-v6e", "--check-on-cpu", "--prefill-len", "8", "--context", "32"];
    let notes: Vec<String> = (0..2)
        .map(|_| {
            let out = crate::common::g4c_with_cache(cache.path(), &args);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stderr).into_owned()
        })
        .collect();
    assert!(
        notes[0].contains("--check-on-cpu: the CPU plugin accepts every entry point (compiled 2 of 2"),
        "{}",
        notes[0]
    );
    assert!(notes[1].contains("--check-on-cpu: the CPU plugin accepts every entry point (cached"), "{}", notes[1]);
}

/// A compile -o that cannot write names the artifact it was asked for (it once named a cache file).
#[test]
fn failed_artifact_writes_name_the_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let env = [("TMPDIR", not_a_dir.as_os_str())];
    let out = g4c_in(
        tmp.path(),
        tmp.path(),
        &env,
        &["compile", &tiny(), "-o", "artifact", "--context", "32", "--prefill-len", "8"],
    );
    assert_one_line_error(&out, &["artifact artifact", "staging its executables"]);
    // Writing the artifact itself fails: its parent is a file.
    let inside_a_file = not_a_dir.join("artifact");
    let out = g4c_in(tmp.path(), tmp.path(), &[], &["compile", &tiny(), "-o", inside_a_file.to_str().unwrap()]);
    assert_one_line_error(&out, &[&format!("artifact {}", inside_a_file.display())]);
}

/// Counts agree with their nouns, data sizes are in one system of units, and `-v`'s help says what
/// it does on any command.
#[test]
fn counts_units_and_help_read_right() {
    let tiny = tiny();
    let run = g4c(&["run", &tiny, "--prompt-ids", "2,17", "--max-new-tokens", "2", "--ignore-eos", "--stats"]);
    let stats = String::from_utf8_lossy(&run.stderr);
    assert!(stats.contains("prefill 2 tokens") && stats.contains("decode 1 token "), "{stats}");
    assert!(!stats.contains("GiB"), "peak memory in decimal units like every other data size: {stats}");
    let compiled = g4c(&["compile", &tiny, "--prefill-len", "8", "--context", "32"]);
    let summary = String::from_utf8_lossy(&compiled.stdout);
    assert!(summary.contains("1.5 kB KV per token") && !summary.contains("KiB"), "{summary}");
    let help = String::from_utf8_lossy(&g4c(&["synth", "--help"]).stdout).into_owned();
    assert!(help.contains("for commands that compile"), "{help}");
}

/// An output path that is not a regular file (a FIFO, a symlink, a device such as `/dev/full`) was
/// replaced by the rename that commits the written file; it is refused before any work, in one
/// line naming the flag, and left as it was.
#[test]
fn outputs_that_are_not_regular_files_are_refused_and_left_alone() {
    let tiny = tiny();
    let dir = tempfile::tempdir().unwrap();
    let (fifo, link, sub) = (dir.path().join("fifo"), dir.path().join("link"), dir.path().join("sub"));
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::os::unix::fs::symlink("elsewhere", &link).unwrap();
    std::fs::create_dir(&sub).unwrap();
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "2 4 5 6").unwrap();
    let missing = dir.path().join("missing/x");
    for (path, needle) in [
        (&fifo, "a FIFO, socket or device"),
        (&link, "a symbolic link"),
        (&sub, "is a directory"),
        (&missing, "does not exist"),
    ] {
        let path = path.to_str().unwrap();
        let run = ["run", &tiny, "--backend", "interp", "--prompt-ids", "2,4", "--max-new-tokens", "2"];
        assert_one_line_error(&g4c(&[&run[..], &["--logits-out", path]].concat()), &["--logits-out", path, needle]);
        let eval = ["eval", &tiny, "--backend", "interp", "--ids", ids.to_str().unwrap(), "--save-logits", path];
        assert_one_line_error(&g4c(&eval), &["--save-logits", path, needle]);
    }
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still one");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is still one");
}

/// A FIFO in place of a cache entry made `run`, `cache ls` and `cache verify` block for ever in
/// `open`; it is a corrupt entry now, reported and removed, and so is a directory in place of an
/// artifact's executable, which was skipped silently.
#[test]
fn entries_that_are_not_regular_files_are_corrupt_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let tiny = tiny();
    let run = ["run", &tiny, "--prompt-ids", "2,4", "--max-new-tokens", "2", "--context", "64"];
    let good = g4c_within_cache(120, &cache, &run);
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
    let entry = std::fs::read_dir(cache.join("executables")).unwrap().flatten().next().unwrap().path();
    let fifo = |path: &Path| {
        let _ = std::fs::remove_file(path);
        assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success());
    };
    fifo(&entry);
    let listed = g4c_within_cache(20, &cache, &["cache", "ls"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("FIFO"), "{listed:?}");
    let verified = g4c_within_cache(20, &cache, &["cache", "verify"]);
    assert_one_line_error_after_notes(&verified, "FIFO");
    assert!(!entry.exists(), "verify removed it");
    fifo(&entry);
    let rerun = g4c_within_cache(120, &cache, &run);
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success() && stderr.contains("FIFO") && stderr.contains("removed"), "{stderr}");
    assert_eq!(rerun.stdout, good.stdout);

    let artifact = tmp.path().join("artifact");
    let compiled =
        g4c_within_cache(120, &cache, &["compile", &tiny, "-o", artifact.to_str().unwrap(), "--context", "64"]);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let exe = std::fs::read_dir(artifact.join("executables")).unwrap().flatten().next().unwrap().path();
    std::fs::remove_file(&exe).unwrap();
    std::fs::create_dir(&exe).unwrap();
    let a = artifact.to_str().unwrap();
    let out = g4c_within_cache(120, &cache, &["run", a, "--prompt-ids", "2,4", "--max-new-tokens", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("found a directory"), "{stderr}");
    assert_eq!(out.stdout, good.stdout);
}

/// A failed command whose last line (after what it reported) is an error, and that mentions `what`.
fn assert_one_line_error_after_notes(out: &std::process::Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.trim_end().lines().last().unwrap_or("").starts_with("g4c: error:"), "{stderr}");
    assert!(stderr.contains(what), "{stderr}");
}

/// A streaming `run` ignored failed writes to stdout and exited 0; every command now ends with one
/// line saying so (`/dev/full`: no space left).
#[test]
fn a_stdout_that_cannot_be_written_is_an_error() {
    let tiny = tiny();
    let ids = ["run", &tiny, "--prompt-ids", "2,4", "--max-new-tokens", "3", "--context", "64"];
    for args in [&ids[..], &[&ids[..], &["--json"]].concat(), &["targets"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
            .env("G4C_CACHE_DIR", crate::common::test_cache())
            .args(args)
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        assert_one_line_error(&out, &["writing to stdout", "No space left"]);
    }
}

/// A ptxas that failed without an `error` line left `ptxas failed for sm_75:` and nothing after;
/// the message now says which ptxas, how it ended and what it said.
#[test]
fn a_failing_ptxas_is_quoted() {
    let tmp = tempfile::tempdir().unwrap();
    let ptxas = tmp.path().join("ptxas");
    std::fs::write(&ptxas, "#!/bin/sh\necho 'ptxas fatal : out of cheese' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&ptxas, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out_dir = tmp.path().join("t4g.g4c");
    let args = ["compile", &tiny(), "--target", "t4g", "--context", "64", "-o", out_dir.to_str().unwrap()];
    let out = g4c_in(tmp.path(), tmp.path(), &[("G4C_PTXAS", ptxas.as_os_str())], &args);
    assert_one_line_error(&out, &["ptxas failed for sm_75", "ptxas exited with exit status: 3", "out of cheese"]);
    assert!(!out_dir.exists());
}

/// `--backend cuda` on a CPU target said there was no CUDA driver and pointed at `cuda-host`, which
/// then failed for want of a kernel plan: the target is checked first, for every backend that runs
/// kernels.
#[test]
fn kernel_backends_name_the_target_before_the_driver() {
    let tiny = tiny();
    for backend in ["cuda", "cuda-host", "plan"] {
        let out = g4c(&["run", &tiny, "--backend", backend, "--prompt-ids", "2"]);
        assert_one_line_error(
            &out,
            &[&format!("--backend {backend} runs a CUDA target's kernels"), "target is cpu", "g4c targets"],
        );
    }
}

/// An artifact that lost its manifest was taken for a checkpoint without weights, and `ir` of an
/// artifact said it had no model.safetensors: both say what the directory is.
#[test]
fn artifacts_are_not_taken_for_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let artifact = tmp.path().join("tiny.g4c");
    let a = artifact.to_str().unwrap();
    let compiled = g4c(&["compile", &tiny(), "-o", a, "--context", "64", "-q"]);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    assert_one_line_error(&g4c(&["ir", a]), &["is an artifact", "reads a checkpoint", &tiny()]);
    std::fs::remove_file(artifact.join("manifest.json")).unwrap();
    for args in [vec!["run", a, "--prompt-ids", "2"], vec!["ir", a], vec!["compile", a, "-o", "x"]] {
        assert_one_line_error(&g4c(&args), &[a, "no manifest.json", "damaged artifact"]);
    }
}

/// A checkpoint run for a CUDA target on the default backend ran that target's pipeline on the
/// PJRT CPU plugin without a word; it still runs, and says what it is.
#[test]
fn another_platforms_target_on_the_cpu_plugin_says_so() {
    let tiny = tiny();
    let out = g4c(&["run", &tiny, "--target", "t4g", "--prompt-ids", "2", "--max-new-tokens", "1", "--context", "64"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("target t4g's pipeline runs on the PJRT CPU plugin") && stderr.contains("--backend cuda"),
        "{stderr}"
    );
}

/// The interpreter's values for a long prompt grow with its square; past the memory it may take it
/// aborted on a failed allocation (exit 134). The call is refused before it runs, in one line.
#[test]
fn an_interpreter_call_too_large_for_memory_is_refused_before_it_runs() {
    let ids = vec!["2"; 6000].join(",");
    let script = format!(
        "ulimit -v 1000000; exec {} run {} --backend interp --prompt-ids {ids} --max-new-tokens 1 --context 6100",
        env!("CARGO_BIN_EXE_g4c"),
        tiny()
    );
    let out = std::process::Command::new("sh").args(["-c", &script]).output().unwrap();
    assert_one_line_error(&out, &["@prefill: the interpreter would hold", "more than the", "memory available"]);
}

/// A manifest naming files outside its artifact (`/etc/passwd`, `../…`) made g4c read them, and a
/// CUDA target's manifest without its kernels passed `inspect --verify`: both are refused.
#[test]
fn a_manifest_names_only_its_own_files_and_a_cuda_target_its_kernels() {
    let tmp = tempfile::tempdir().unwrap();
    let artifact = tmp.path().join("t4g.g4c");
    let a = artifact.to_str().unwrap();
    let compiled = g4c(&["compile", &tiny(), "--target", "t4g", "-o", a, "--context", "64", "-q"]);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let manifest_path = artifact.join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(Edit, &str); 3] = [
        (|m| m["entries"][0]["program"] = "/etc/passwd".into(), "names /etc/passwd, outside the artifact"),
        (|m| m["model"]["weights"]["file"] = "../w.safetensors".into(), "names ../w.safetensors, outside"),
        (|m| m["cuda"] = serde_json::Value::Null, "lists no CUDA kernels"),
    ];
    for (edit, needle) in edits {
        let mut manifest: serde_json::Value = serde_json::from_str(&original).unwrap();
        edit(&mut manifest);
        std::fs::write(&manifest_path, manifest.to_string()).unwrap();
        assert_one_line_error(&g4c(&["inspect", a, "--verify"]), &[needle]);
    }
}
