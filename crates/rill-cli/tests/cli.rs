//! The `rill` command line: help and version of the tool and every subcommand, unknown
//! flags and benchmarks refused, clear errors for a missing model or input, and
//! `rill embed`'s outputs (a .npy file of N x D float32 in input order, JSON lines) on
//! the default model, and `rill generate`'s greedy text against transformers' tokens of
//! `llama_fixture.json` on the default language model (skipped without the models:
//! "skipped: no model"; a failure with `RILL_REQUIRE_MODEL=1`).

use std::process::{Command, Output, Stdio};

fn rill(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rill")).args(args).stdin(Stdio::null()).output().expect("run rill")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_version_and_unknown_flags() {
    let version = format!("rill {}", env!("CARGO_PKG_VERSION"));
    let out = rill(&["--version"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&version), "{}", text(&out.stdout));
    let out = rill(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for cmd in ["embed", "generate", "demo", "bench", "info"] {
        assert!(help.contains(cmd), "{cmd} in {help}");
    }
    for sub in
        [&["embed"][..], &["generate"], &["demo"], &["bench"], &["bench", "matrix"], &["bench", "generate"], &["info"]]
    {
        let mut a = sub.to_vec();
        a.push("--help");
        let out = rill(&a);
        assert!(out.status.success(), "{a:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("Usage"), "{a:?}");
        let mut a = sub.to_vec();
        a.push("--version");
        let out = rill(&a);
        assert!(out.status.success(), "{a:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains(&version[5..]), "{a:?}: {}", text(&out.stdout));
        let mut a = sub.to_vec();
        a.push("--no-such-flag");
        let out = rill(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}");
        assert!(text(&out.stderr).contains("--no-such-flag"), "{a:?}: {}", text(&out.stderr));
    }
    assert_eq!(rill(&[]).status.code(), Some(2));
    assert_eq!(rill(&["no-such-command"]).status.code(), Some(2));
    assert_eq!(rill(&["embed", "--dtype", "f8", "x"]).status.code(), Some(2));
    assert_eq!(rill(&["embed", "--batch-size", "0", "x"]).status.code(), Some(2));

    let out = rill(&["bench", "--list"]);
    assert!(out.status.success());
    let list = text(&out.stdout);
    for name in ["add", "matmul", "embed", "matrix", "generate"] {
        assert!(list.lines().any(|l| l.starts_with(name)), "{name} in {list}");
    }
    let out = rill(&["bench", "no_such_bench"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no_such_bench"));
}

#[test]
fn missing_model_and_input_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let nowhere = tmp.path().join("no model here");
    let out = rill(&["embed", "--device", "cpu", "--model", nowhere.to_str().unwrap(), "hello"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("no model here") && err.starts_with("rill: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let bad = tmp.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::write(bad.join(f), "{}").unwrap();
    }
    let out = rill(&["embed", "--device", "cpu", "--model", bad.to_str().unwrap(), "hello"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("config.json"), "{}", text(&out.stderr));

    let missing = tmp.path().join("missing.txt");
    let out = rill(&["embed", "--model", bad.to_str().unwrap(), "--input", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing.txt"), "{}", text(&out.stderr));
    // Sentences and --input together are refused by the parser.
    assert_eq!(rill(&["embed", "--input", "-", "x"]).status.code(), Some(2));
}

/// The values of a little-endian float32 `.npy` file and its shape.
fn read_npy(b: &[u8]) -> (Vec<usize>, Vec<f32>) {
    assert_eq!(&b[..6], b"\x93NUMPY");
    let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hl]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape_text = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> =
        shape_text.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
    let data: Vec<f32> = b[10 + hl..].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    (shape, data)
}

#[test]
fn embed_writes_npy_and_json_lines_in_input_order() {
    let dir = match rill::io::cache::default_model() {
        Ok(d) => d,
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_MODEL").as_deref() != Ok("1"), "RILL_REQUIRE_MODEL=1 but: {e}");
            eprintln!("skipped: no model ({e})");
            return;
        }
    };
    let model = dir.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let sentences = ["The first sentence.", "", "A third, rather longer sentence than the others."];
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, sentences.join("\n") + "\n").unwrap();
    let npy = tmp.path().join("out.npy");
    let out = rill(&[
        "embed",
        "--device",
        "cpu",
        "--model",
        model,
        "--input",
        input.to_str().unwrap(),
        "--output",
        npy.to_str().unwrap(),
        "--batch-size",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (shape, data) = read_npy(&std::fs::read(&npy).unwrap());
    assert_eq!(shape.len(), 2);
    assert_eq!(shape[0], sentences.len());
    let d = shape[1];
    assert_eq!(data.len(), sentences.len() * d);

    // The same sentences as arguments, as JSON lines: the same vectors, in input order.
    let out = rill(&["embed", "--device", "cpu", "--model", model, sentences[0], sentences[1], sentences[2]]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> =
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(lines.len(), sentences.len());
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"].as_u64(), Some(i as u64));
        let v: Vec<f32> = l["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(v.len(), d);
        let row = &data[i * d..(i + 1) * d];
        let diff = v.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "sentence {i} differs by {diff}");
        let n: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-4, "normalised: {n}");
    }
    // Different sentences give different vectors (the order is not an accident).
    assert!(data[..d].iter().zip(&data[d..2 * d]).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn generate_streams_the_greedy_text_and_reports_the_rate() {
    let path = match rill::io::cache::default_llm() {
        Ok(p) => p,
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_MODEL").as_deref() != Ok("1"), "RILL_REQUIRE_MODEL=1 but: {e}");
            eprintln!("skipped: no model ({e})");
            return;
        }
    };
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rill/tests/fixtures/llama_fixture.json");
    let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let greedy: Vec<u32> = f["greedy_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let g = rill::io::gguf::Gguf::open(&path).unwrap();
    let tok = rill::io::gguf_tokenizer::GgufTokenizer::from_gguf(&g).unwrap();
    let want = tok.decode(&greedy[..8], true).unwrap();
    let model = path.to_str().unwrap();
    let prompt = f["prompt"].as_str().unwrap();
    let out = rill(&["generate", "--device", "cpu", "--model", model, "--max-tokens", "8", prompt]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{want}\n"), "the prompt is not echoed; the text is greedy's");
    assert!(text(&out.stderr).contains("tokens/s"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("(stopped: max tokens; on cpu)"), "{}", text(&out.stderr));
    // Sampling at temperature 1 from the top 1 token is greedy decoding.
    let out = rill(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        model,
        "--max-tokens",
        "8",
        "--temperature",
        "1",
        "--top-k",
        "1",
        "--seed",
        "7",
        prompt,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{want}\n"), "top-k 1 samples the greedy tokens");
    // Bad values and a missing file: clear errors.
    let out = rill(&["generate", "--device", "cpu", "--model", model, "--temperature", "1", "--top-p", "0", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("top_p"), "{}", text(&out.stderr));
    let out = rill(&["generate", "--device", "cpu", "--model", model, "--temperature=-1", "x"]);
    assert_eq!(out.status.code(), Some(1));
    // A negative value after a space is the flag's value, refused by rill, not by the parser.
    for flag in ["--temperature", "--repetition-penalty"] {
        let out = rill(&["generate", "--device", "cpu", "--model", model, flag, "-1", "x"]);
        assert_eq!(out.status.code(), Some(1), "{flag}: {}", text(&out.stderr));
        assert!(text(&out.stderr).starts_with("rill: "), "{flag}: {}", text(&out.stderr));
    }
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.gguf");
    let out = rill(&["generate", "--device", "cpu", "--model", missing.to_str().unwrap(), "x"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with("rill: ") && err.contains("missing.gguf") && !err.contains("panicked"), "{err}");
    assert_eq!(rill(&["generate", "--max-tokens", "x", "p"]).status.code(), Some(2));

    // The benchmark: one line per figure, the ids it was asked for.
    let bench = ["bench", "generate", "--device", "cpu", "--model", model, "--reps", "1"];
    let out = rill(&[&bench[..], &["--prefill", "5,9", "--batch", "1,3", "--new-tokens", "3"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            assert!(v["seconds"].as_f64().unwrap() > 0.0, "{l}");
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    let want = ["generate:prefill:p5", "generate:prefill:p9", "generate:decode:b1:n3", "generate:decode:b3:n3"];
    assert_eq!(ids, want);
    let out = rill(&[&bench[..], &["--new-tokens", "1"]].concat());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--new-tokens"), "{}", text(&out.stderr));
}
