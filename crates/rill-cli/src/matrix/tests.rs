use std::collections::BTreeSet;

use clap::Parser;

use super::check::{check_case, evaluate, sample, stratum, verify};
use super::*;

#[test]
fn the_matrix_covers_every_op_dtype_and_pattern() {
    let all = cases(&(4..=31).collect::<Vec<_>>());
    let mut ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "case ids are unique");
    for f in FAMILIES {
        assert!(all.iter().any(|c| c.family == f), "{f}");
    }
    assert!(all.iter().all(|c| c.bytes <= MAX_BYTES));
    let has = |prefix: &str| all.iter().any(|c| c.id.starts_with(prefix));
    for d in DTYPES {
        for op in UnaryOp::ALL {
            // Integers only where the op computes in their dtype.
            let expected = !(d.is_int() && op.needs_float());
            for tag in ["2^", "strided/"] {
                assert_eq!(has(&format!("unary/{}/{d}/{tag}", op.name())), expected, "unary {op:?} {d} {tag}");
            }
        }
        for op in BinaryOp::ALL {
            for tag in ["same", "strided", "row", "column", "scalar", "outer"] {
                let id = format!("binary/{}/{d}/{tag}/", op.name());
                assert!(has(&id), "{id}");
            }
        }
        for to in DTYPES.iter().filter(|&&t| t != d) {
            assert!(has(&format!("cast/astype/{d}/to_{to}/2^")) && has(&format!("cast/astype/{d}/to_{to}/strided/")));
        }
        for parts in 2..=8 {
            for axis in ["first", "last"] {
                let id = format!("concatenate/concatenate/{d}/{axis}/n{parts}/");
                let c = all.iter().find(|c| c.id.starts_with(&id)).unwrap_or_else(|| panic!("{id}"));
                assert_eq!(c.inputs.len(), parts);
            }
        }
        // Every permutation of 2 and 3 axes but the identity, and of 4 with axis 0 first.
        let perms: BTreeSet<Vec<usize>> = all
            .iter()
            .filter(|c| c.family == "transpose" && c.inputs[0].dtype == d)
            .filter_map(|c| c.params.perm.clone())
            .collect();
        let mut want = BTreeSet::new();
        for a in 0..4usize {
            for b in 0..4 {
                for c in 0..4 {
                    for e in 0..4 {
                        let p = [a, b, c, e];
                        for rank in 2..=4 {
                            let q = &p[..rank];
                            let valid = q.iter().all(|&x| x < rank) && BTreeSet::from_iter(q).len() == rank;
                            let moves = q.iter().enumerate().any(|(k, &x)| k != x);
                            if valid && moves && (rank < 4 || q[0] == 0) && p[rank..].iter().all(|&x| x == 0) {
                                want.insert(q.to_vec());
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(perms, want, "{d}");
    }
    for d in FLOATS {
        for fam in ["softmax", "log_softmax"] {
            assert!(has(&format!("{fam}/{fam}/{d}/last/")) && has(&format!("{fam}/{fam}/{d}/middle/")));
        }
        for tag in ["plain", "weight", "bias", "weight_bias"] {
            assert!(has(&format!("layer_norm/layer_norm/{d}/{tag}/")));
            assert_eq!(has(&format!("rms_norm/rms_norm/{d}/{tag}/")), !tag.contains("bias"));
        }
    }
    for tag in ["last", "first", "middle", "all"] {
        assert!(all.iter().any(|c| c.family == "reduce" && c.id.contains(&format!("/{tag}/"))), "{tag}");
    }
    // Matmul: each dtype (and TF32) in each form over the (M, N, K) grid, the batched
    // forms with a batch of 8 on the left and on the right or on the left only.
    for (d, tf32) in [(DType::F32, ""), (DType::F32, "/tf32"), (DType::BF16, ""), (DType::F16, "")] {
        for form in ["plain", "batched", "broadcast"] {
            for shape in ["square", "small_m", "small_n", "small_k", "small_mn", "small_mk", "small_nk"] {
                let id = format!("matmul/matmul/{d}/{form}/{shape}{tf32}/");
                let c = all.iter().find(|c| c.id.starts_with(&id)).unwrap_or_else(|| panic!("{id}"));
                let (a, b) = (&c.inputs[0].shape, &c.inputs[1].shape);
                assert_eq!(a[a.len() - 1], b[b.len() - 2], "{id}");
                assert_eq!(
                    (a.len(), b.len()),
                    [(2, 2), (3, 3), (3, 2)]
                        [["plain", "batched", "broadcast"].iter().position(|f| *f == form).unwrap()]
                );
                assert_eq!(c.params.tf32.is_some(), d == DType::F32);
            }
        }
    }
    // Sizes: the element count of every elementwise case's main input follows the size list.
    assert!(all.iter().any(|c| c.family == "unary" && numel(&c.inputs[0].shape) == 1 << 28));
    for c in all.iter().filter(|c| matches!(c.family, "unary" | "cast" | "softmax" | "transpose")) {
        let l: u32 = c.id.rsplit("2^").next().unwrap().parse().unwrap();
        assert_eq!(numel(&c.inputs[0].shape), 1 << l, "{}", c.id);
    }
    let listed: String = all.iter().map(|c| to_json(c) + "\n").collect();
    assert_eq!(ids_of(&listed), all.iter().map(|c| c.id.clone()).collect::<Vec<_>>());
    assert_eq!(parse_sizes("10:28:6"), Ok(Sizes(vec![10, 16, 22, 28])));
    assert!(parse_sizes("28:10:2").is_err() && parse_sizes("x").is_err());
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: MatrixArgs,
}

#[test]
fn the_options_parse_with_clap() {
    let a = Cli::try_parse_from([
        "matrix",
        "--check",
        "--device",
        "cpu",
        "--sizes",
        "10:14:2",
        "--family",
        "unary,matmul",
        "--sample",
        "7",
        "--seed",
        "3",
        "--filter",
        "f16",
    ])
    .unwrap()
    .args;
    assert!(a.check && !a.list);
    assert_eq!(
        (a.device, a.sizes.clone(), a.sample, a.seed),
        (Some(MatrixDevice::Cpu), Some(Sizes(vec![10, 12, 14])), Some(7), 3)
    );
    let sel = a.selected().unwrap();
    assert!(!sel.is_empty());
    assert!(sel.iter().all(|c| matches!(c.family, "unary" | "matmul") && c.id.contains("f16")));
    for bad in [&["matrix", "--family", "nope"][..], &["matrix", "--sample", "3"], &["matrix", "--sizes", "3:2:1"]] {
        assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_sample_covers_every_family_dtype_and_layout() {
    let all = cases(&[10, 14]);
    let strata: BTreeSet<String> = all.iter().map(stratum).collect();
    let s = sample(&all, strata.len(), 1);
    assert_eq!(s.len(), strata.len());
    assert_eq!(s.iter().map(|c| stratum(c)).collect::<BTreeSet<_>>(), strata);
    let ids = |s: &[&Case]| s.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&s), ids(&sample(&all, strata.len(), 1)), "seeded");
    assert_ne!(ids(&s), ids(&sample(&all, strata.len(), 2)), "another seed, another sample");
    assert_eq!(sample(&all, 2 * all.len(), 5).len(), all.len());
}

/// The checks run on the CPU; on a GPU `rill bench matrix --check --device gpu` runs them.
fn failures(all: &[&Case]) -> Vec<String> {
    all.iter()
        .filter_map(|c| check_case(c).unwrap_or_else(|e| Some(e.to_string())).map(|f| format!("{}: {f}", c.id)))
        .collect()
}

/// Every case of the matrix at 2^10, a seeded sample of 2^12 to 2^16 covering every
/// family, dtype and layout three times, and a sample of the norms and softmax over 1024
/// rows of 4096 columns (where an accumulation in one running sum per row is out of
/// tolerance in f32) equal their float64 references.
#[test]
fn a_seeded_sample_of_every_family_matches_float64() {
    let s = Device::cpu().default_stream().unwrap();
    let _g = s.enter();
    let small = cases(&[10]);
    let mid = cases(&[12, 14, 16]);
    let strata = mid.iter().map(stratum).collect::<BTreeSet<_>>().len();
    let rows: Vec<Case> = cases(&[22])
        .into_iter()
        .filter(|c| matches!(c.family, "layer_norm" | "rms_norm" | "softmax" | "log_softmax"))
        .collect();
    let mut all: Vec<&Case> = small.iter().collect();
    all.extend(sample(&mid, 3 * strata, 25));
    all.extend(sample(&rows, 12, 25));
    let f = failures(&all);
    assert!(f.is_empty(), "{} of {} cases: {:#?}", f.len(), all.len(), &f[..f.len().min(10)]);
}

/// A wrong element of any family, dtype and layout is found: one element of the result
/// moved by more than the tolerance (by one for integers, negated for bools).
#[test]
fn the_check_finds_a_wrong_element_in_every_stratum() {
    let s = Device::cpu().default_stream().unwrap();
    let _g = s.enter();
    let all = cases(&[10]);
    let strata = all.iter().map(stratum).collect::<BTreeSet<_>>().len();
    for c in sample(&all, strata, 9) {
        let (inputs, mut got) = evaluate(c).unwrap();
        assert_eq!(verify(c, &inputs, &got), None, "{}", c.id);
        let k = got.v.len() / 2;
        let g = got.v[k];
        got.v[k] = match got.dtype {
            DType::Bool => 1.0 - g,
            d if d.is_int() => g + 1.0,
            _ => g + 0.05 * g.abs().max(1.0),
        };
        assert!(verify(c, &inputs, &got).is_some(), "{}: element {k} {g} -> {}", c.id, got.v[k]);
    }
}
