//! Sort, argsort, top-k, categorical draws and the text-generation sampler on the CPU,
//! against host references (the cases live in `sort_cases/`, shared with
//! `gpu_sort_sample.rs`), and the sampler's errors for bad settings.

mod common;
mod sort_cases;

use rill::sample::{Sampler, SamplerConfig};
use rill::{Array, DType, Device, Error};
use sort_cases::*;

#[test]
fn sort_argsort_topk_match_the_reference() {
    sort_cases(Device::cpu(), 1, 60, &[5000, 70_000]);
}

#[test]
fn topk_of_long_rows() {
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        topk_long_rows(Device::cpu(), 49_152, &[1, 50, 1024], dtype);
    }
}

#[test]
fn categorical_follows_softmax() {
    categorical_distribution(Device::cpu());
}

#[test]
fn sampler_filters_match_transformers() {
    filters_match_reference(Device::cpu(), 5, 60);
}

#[test]
fn sampler_draws_and_determinism() {
    sampler_draws(Device::cpu());
}

#[test]
fn compiled_sampler_step() {
    compiled_step_matches_eager(Device::cpu());
}

#[test]
fn sort_errors_and_edges() {
    let x = Array::from_slice(&[3.0f32, 1.0, 2.0], &[3]).unwrap();
    assert!(matches!(x.topk(4, 0), Err(Error::Shape { .. })));
    assert!(matches!(x.sort(1, false), Err(Error::Axis { .. })));
    assert!(matches!(Array::scalar(1.0f32).unwrap().argsort(0, false), Err(Error::Axis { .. })));
    let (v, i) = x.topk(0, 0).unwrap();
    assert_eq!((v.shape(), i.shape()), (&[0usize][..], &[0usize][..]));
    let e = Array::zeros(&[2, 0], DType::F32).unwrap();
    assert_eq!(e.sort(-1, true).unwrap().shape(), [2, 0]);
    assert_eq!(e.sort(0, true).unwrap().to_vec::<f32>().unwrap(), Vec::<f32>::new());
}

#[test]
fn bad_settings_are_errors() {
    let base = SamplerConfig::default();
    let bad = [
        SamplerConfig { temperature: -0.5, ..base.clone() },
        SamplerConfig { temperature: f32::NAN, ..base.clone() },
        SamplerConfig { temperature: f32::INFINITY, ..base.clone() },
        SamplerConfig { top_k: Some(0), ..base.clone() },
        SamplerConfig { top_p: Some(0.0), ..base.clone() },
        SamplerConfig { top_p: Some(1.5), ..base.clone() },
        SamplerConfig { top_p: Some(f32::NAN), ..base.clone() },
        SamplerConfig { min_p: Some(-0.1), ..base.clone() },
        SamplerConfig { min_p: Some(1.1), ..base.clone() },
        SamplerConfig { repetition_penalty: Some(0.0), ..base.clone() },
        SamplerConfig { repetition_penalty: Some(f32::NAN), ..base.clone() },
    ];
    for c in bad {
        assert!(matches!(Sampler::new(c.clone()), Err(Error::InvalidArgument { .. })), "{c:?}");
        assert!(matches!(Sampler::per_row(vec![base.clone(), c.clone()]), Err(Error::InvalidArgument { .. })), "{c:?}");
    }
    assert!(Sampler::per_row(vec![]).is_err());
    let s = Sampler::per_row(vec![base.clone(), base.clone()]).unwrap();
    let l = Array::zeros(&[3, 5], DType::F32).unwrap();
    assert!(s.sample(&l, None, 0).is_err(), "three rows, two configurations");
    let s = Sampler::new(SamplerConfig { repetition_penalty: Some(1.3), ..base.clone() }).unwrap();
    assert!(s.sample(&l, None, 0).is_err(), "a penalty without a history");
    let s = Sampler::new(base).unwrap();
    for shape in [&[5usize][..], &[2, 3, 4], &[0, 5], &[2, 0]] {
        assert!(s.sample(&Array::zeros(shape, DType::F32).unwrap(), None, 0).is_err(), "{shape:?}");
    }
    assert!(s.sample(&Array::zeros(&[2, 5], DType::I32).unwrap(), None, 0).is_err());
    let u = Array::zeros(&[3, 4], DType::F32).unwrap();
    assert!(s.sample_with(&l, None, &u).is_err(), "uniforms of another shape");
}
