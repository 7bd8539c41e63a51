//! CUDA artifacts without a GPU: what `g4c compile` writes for a CUDA target, `g4c run` of it
//! without a driver, and what a run refuses of damaged or foreign kernel files.

use super::*;

/// `--backend cuda` without a CUDA driver is one clear line and a failure, before anything compiles.
#[test]
fn cuda_without_a_driver_fails_cleanly() {
    if g4c_runtime::backend::cuda::cuda_driver_problem().is_none() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let dir = golden_dir("tiny").join("hf");
    let out = crate::common::g4c(&[
        "run",
        dir.to_str().unwrap(),
        "--backend",
        "cuda",
        "--target",
        "t4g",
        "--prompt-ids",
        "2,17",
        "--max-new-tokens",
        "2",
    ]);
    crate::common::assert_one_line_error(&out, &["--backend cuda", "no CUDA driver"]);
}

/// `g4c compile --target t4g -o` writes an artifact with CUDA C, PTX and a cubin per entry point and
/// reports every launch's shared memory beside the limit, equal to what ptxas found; `g4c run` of
/// it without a CUDA driver fails in one line; its kernels run on the host and generate what the
/// interpreter generates from its module (a 3-token prompt through the 4-token prefill bucket, a
/// program of its own).
#[test]
fn a_t4g_artifact_holds_its_kernels() {
    let dir = golden_dir("tiny-qat").join("hf");
    let out = tempfile::tempdir().unwrap();
    let artifact = out.path().join("a.g4c");
    let (model, art) = (dir.to_str().unwrap(), artifact.to_str().unwrap());
    let compiled = crate::common::g4c(&[
        "compile",
        model,
        "--target",
        "t4g",
        "--context",
        "32",
        "--prefill-buckets",
        "4,8",
        "-o",
        art,
        "--json",
    ]);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let report: serde_json::Value = serde_json::from_slice(&compiled.stdout).unwrap();
    let kernels = &report["kernels"];
    let limit = kernels["limits"]["smem_per_block_optin"].as_u64().unwrap();
    for entry in kernels["entries"].as_array().unwrap() {
        for launch in entry["launches"].as_array().unwrap() {
            let smem = launch["smem_bytes"].as_u64().unwrap();
            assert!(smem <= limit, "{launch}");
            let dynamic = launch["dynamic_smem_bytes"].as_u64().unwrap();
            assert_eq!(launch["ptxas"]["smem_bytes"].as_u64(), Some(smem - dynamic), "{launch}");
            assert_eq!(launch["ptxas"]["spill_bytes"].as_u64(), Some(0), "{launch}");
        }
    }
    let decode = kernels["entries"].as_array().unwrap().iter().find(|e| e["entry"] == "decode").unwrap();
    let launches = decode["launches"].as_array().unwrap();
    let calls: Vec<&serde_json::Value> = launches.iter().flat_map(|l| l["calls"].as_array().unwrap()).collect();
    let preludes = calls.iter().filter(|c| c["prelude"]["reductions"].as_u64() > Some(0));
    assert!(preludes.count() > 0, "decode's norm statistics are reported in preludes");
    assert!(launches.len() < calls.len(), "a decode layer's q, k and v projections are reported in one launch");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(artifact.join("manifest.json")).unwrap()).unwrap();
    let cuda = &manifest["cuda"];
    assert_eq!(cuda["compute"], "compute_75");
    assert!(cuda["ptx_isa"].as_str().unwrap().starts_with("8."), "{cuda}");
    let entries: Vec<&str> = cuda["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(entries, ["prefill_4", "prefill", "decode"]);
    for e in cuda["entries"].as_array().unwrap() {
        for file in [&e["source"], &e["ptx"], &e["cubin"][1]] {
            assert!(artifact.join(file.as_str().unwrap()).is_file(), "{file}");
        }
    }
    let args = ["run", art, "--prompt-ids", "2,17,301", "--max-new-tokens", "6"];
    if g4c_runtime::backend::cuda::cuda_driver_problem().is_some() {
        crate::common::assert_one_line_error(&crate::common::g4c(&args), &["--backend cuda", "no CUDA driver"]);
        // `g4c bench` of it measures its kernels, so it needs the driver too.
        let bench = ["bench", art, "--prompt-len", "8", "--gen", "4", "-q"];
        crate::common::assert_one_line_error(&crate::common::g4c(&bench), &["--backend cuda", "no CUDA driver"]);
    }
    let tokens = |backend: &str| {
        let out = crate::common::g4c(&[&args[..], &["--backend", backend]].concat());
        assert!(out.status.success(), "{backend}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(tokens("cuda-host"), tokens("interp"));
    damaged_kernels_are_refused(&artifact);
}

/// A t4g artifact whose kernel files were damaged, or written by a g4c whose CUDA C differs, is
/// refused by `run` (on the host too, before anything compiles) and by `inspect --verify`, naming
/// the file.
fn damaged_kernels_are_refused(artifact: &Path) {
    // An edit as another g4c would have written it: the manifest sealed with its own digest.
    let edit_manifest = |dir: &Path, edit: &dyn Fn(&mut serde_json::Value)| {
        let path = dir.join("manifest.json");
        let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut manifest);
        let mut sealed: g4c_runtime::artifact::Manifest = serde_json::from_value(manifest).unwrap();
        sealed.digest = sealed.content_digest();
        std::fs::write(&path, serde_json::to_string(&sealed).unwrap()).unwrap();
    };
    let ptx_flipped = |dir: &Path| {
        let path = dir.join("cuda/decode.ptx");
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(path, bytes).unwrap();
    };
    // Another g4c's CUDA C, recorded with its own hash: only comparing it with this g4c's finds it.
    let source_foreign = |dir: &Path| {
        let path = dir.join("cuda/prefill.cu");
        let source = std::fs::read_to_string(&path).unwrap() + "// another g4c\n";
        std::fs::write(&path, &source).unwrap();
        let hash = blake3::hash(source.as_bytes()).to_hex().to_string();
        edit_manifest(dir, &|m| {
            *entry(m, "prefill").pointer_mut("/blake3/cuda~1prefill.cu").unwrap() = hash.clone().into()
        });
    };
    let hashes_missing = |dir: &Path| {
        edit_manifest(dir, &|m| drop(entry(m, "decode").as_object_mut().unwrap().remove("blake3").unwrap()))
    };
    type Damage<'a> = &'a dyn Fn(&Path);
    let cases: [(Damage, &[&str]); 3] = [
        (&ptx_flipped, &["cuda/decode.ptx", "does not match its content hash"]),
        (&source_foreign, &["cuda/prefill.cu", "differs from the CUDA C this g4c emits"]),
        (&hashes_missing, &["no content hash for cuda/decode", "compile it again"]),
    ];
    for (damage, needles) in cases {
        let copy = tempfile::tempdir().unwrap();
        for entry in walk(artifact) {
            let to = copy.path().join(entry.strip_prefix(artifact).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&entry, to).unwrap();
        }
        damage(copy.path());
        let dir = copy.path().to_str().unwrap();
        let run = ["run", dir, "--backend", "cuda-host", "--prompt-ids", "2,17", "--max-new-tokens", "1"];
        crate::common::assert_one_line_error(&crate::common::g4c(&run), needles);
        crate::common::assert_one_line_error(&crate::common::g4c(&["inspect", "--verify", dir]), needles);
    }
}

/// The manifest's CUDA entry point `name`.
fn entry<'a>(manifest: &'a mut serde_json::Value, name: &str) -> &'a mut serde_json::Value {
    let entries = manifest["cuda"]["entries"].as_array_mut().unwrap();
    entries.iter_mut().find(|e| e["name"] == name).unwrap()
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .flat_map(|e| match e.path().is_dir() {
            true => walk(&e.path()),
            false => vec![e.path()],
        })
        .collect()
}
