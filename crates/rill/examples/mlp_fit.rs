//! Fits a small MLP (1 -> 32 -> 32 -> 1, tanh) to `y = sin(3x)` with plain gradient
//! descent, on the first GPU when there is one (else the CPU), printing the loss as it
//! goes down. The step (forward, gradient by `rill::value_and_grad`, update) is one
//! compiled function, traced once.
//!
//! `cargo run --release -p rill --example mlp_fit`

use rill::{Array, DType, Device, Result};

/// The mean squared error of the MLP with parameters `p = [w1, b1, w2, b2, w3, b3]` on
/// inputs `x` `[N, 1]` and targets `y` `[N, 1]`.
fn loss(p: &[Array], x: &Array, y: &Array) -> Result<Array> {
    let h = x.matmul(&p[0])?.add(&p[1])?.tanh()?;
    let h = h.matmul(&p[2])?.add(&p[3])?.tanh()?;
    let out = h.matmul(&p[4])?.add(&p[5])?;
    out.sub(y)?.square()?.mean(&[], false)
}

fn main() -> Result<()> {
    let device = Device::gpu(0).unwrap_or_else(|_| Device::cpu());
    let stream = device.default_stream()?;
    println!("fitting on {device:?}");
    rill::with_stream(&stream, || {
        let n = 256;
        let x = Array::linspace(-1.0, 1.0, n, DType::F32)?.reshape(&[n as isize, 1])?;
        let y = x.mul(3.0)?.sin()?;
        let key = rill::random::Key::new(0);
        let keys = key.split(3);
        let layer = |k: &rill::random::Key, i: usize, o: usize| -> Result<[Array; 2]> {
            let w = rill::random::normal(*k, &[i, o], 0.0, 1.0 / (i as f64).sqrt(), DType::F32)?;
            Ok([w, Array::zeros(&[o], DType::F32)?])
        };
        let mut params: Vec<Array> =
            [layer(&keys[0], 1, 32)?, layer(&keys[1], 32, 32)?, layer(&keys[2], 32, 1)?].concat();
        let lr = 0.2;
        // Inputs: the parameters, then x and y; outputs: the loss and the new parameters.
        let vg = rill::value_and_grad(|a: &[Array]| Ok(vec![loss(&a[..6], &a[6], &a[7])?]), &[0, 1, 2, 3, 4, 5]);
        let step = rill::compile(move |a: &[Array]| {
            let (l, g) = vg.call(a)?;
            let mut out = vec![l];
            for (p, g) in a[..6].iter().zip(&g) {
                out.push(p.sub(&g.mul(lr)?)?);
            }
            Ok(out)
        });
        let mut first = None;
        for it in 0..=2000 {
            let mut args = params.clone();
            args.extend([x.clone(), y.clone()]);
            let mut out = step.call(&args)?;
            params = out.split_off(1);
            if it % 200 == 0 {
                let l = out[0].item::<f32>()?;
                first.get_or_insert(l);
                println!("step {it:5}  loss {l:.6}");
            }
        }
        let last = loss(&params, &x, &y)?.item::<f32>()?;
        println!("loss {:.6} -> {last:.6}", first.unwrap_or(f32::NAN));
        Ok(())
    })
}
