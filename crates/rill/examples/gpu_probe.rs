//! Prints a few small GPU results next to the CPU's, to localise backend bugs.
use rill::{Array, DType, Device};

fn show(name: &str, f: impl Fn() -> rill::Result<Array>) {
    let g = Device::gpu(0).unwrap().default_stream().unwrap();
    let c = Device::cpu().default_stream().unwrap();
    let gv = rill::with_stream(&g, || f().and_then(|a| a.to_f64_vec()));
    let cv = rill::with_stream(&c, || f().and_then(|a| a.to_f64_vec()));
    println!("{name:30} gpu {:?}\n{:30} cpu {:?}", gv, "", cv);
}

fn main() {
    let v = [1.0f32, 2.0, 3.0, -4.0, 5.5, 6.25];
    show("roundtrip f32", || Array::from_slice(&v, &[6]));
    show("full f32", || Array::full(&[3], 2.5, DType::F32));
    show("add scalar", || Array::from_slice(&v, &[6])?.add(1.0));
    show("add arrays", || Array::from_slice(&v, &[6])?.add(&Array::from_slice(&v, &[6])?));
    show("add broadcast", || Array::from_slice(&v, &[2, 3])?.add(&Array::from_slice(&v[..3], &[3])?));
    show("0-d exp f32", || Array::scalar(1.5f32)?.exp());
    show("cast to bf16", || Array::from_slice(&v, &[6])?.astype(DType::BF16));
    show("exp bf16", || Array::from_slice(&v, &[6])?.astype(DType::BF16)?.exp());
    show("0-d bf16", || Array::scalar(1.5f32)?.astype(DType::BF16));
    show("f64->u8", || Array::from_slice(&[0.2f64, 1.7, 300.0, -3.0], &[4])?.astype(DType::U8));
    show("f64 roundtrip", || Array::from_slice(&[0.2f64, 1.7, 300.0, -3.0], &[4]));
    show("sum", || Array::from_slice(&v, &[2, 3])?.sum(&[-1], false));
    show("matmul", || Array::from_slice(&v, &[2, 3])?.matmul(&Array::from_slice(&v, &[3, 2])?));
    show("softmax", || Array::from_slice(&v, &[2, 3])?.softmax(-1));
    show("transpose+add", || Array::from_slice(&v, &[2, 3])?.transpose(&[])?.add(1.0));
    let st = rill::runtime::stats();
    println!("{st:?}");
}
