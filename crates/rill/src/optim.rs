//! Optimizers written in rill ops: Adam and AdamW.
//!
//! [`Adam::update`] is the update step as ops on arrays, so it runs eagerly or inside
//! [`compile`](crate::compile()), where it becomes one kernel for any number of
//! parameters: the first moment, the second moment and the parameter become one program
//! of three outputs (an elementwise cluster), the same for every parameter of a dtype,
//! and `compile` runs one program over many tensors as one kernel (multi-tensor apply,
//! see the `compile` module docs).
//! The step-dependent numbers (the bias corrections and the learning rate) are inputs
//! ([`Adam::scalars`]), not constants, so a compiled step is traced once and replayed for
//! every step. [`AdamState`] keeps the moments and the step count and calls one compiled
//! update:
//!
//! ```
//! use rill::{Array, DType};
//! use rill::optim::{Adam, AdamState};
//! let p = vec![Array::from_slice(&[1.0f32, -2.0, 3.0], &[3])?];
//! let g = vec![Array::from_slice(&[0.5f32, 0.5, -1.0], &[3])?];
//! let mut opt = AdamState::new(Adam::adamw(1e-3, 0.01), &p)?;
//! let p = opt.step(&p, &g)?; // traced on the first step, replayed afterwards
//! assert_eq!(p[0].shape(), &[3]);
//! # Ok::<(), rill::Error>(())
//! ```
//!
//! The formulas are PyTorch's `torch.optim.Adam` / `AdamW` (without `amsgrad`): with
//! `bc1 = 1 - beta1^t` and `bc2 = 1 - beta2^t` at step `t` (from 1),
//! `m = beta1 m + (1 - beta1) g`, `v = beta2 v + (1 - beta2) g²`, and
//! `p = p - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)`. Adam adds `weight_decay p` to the
//! gradient first; AdamW multiplies the parameter by `1 - lr weight_decay` first.

use crate::array::Array;
use crate::compile::{Compiled, compile};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::scope::with_stream;

/// The hyperparameters of Adam or AdamW (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay (0: none).
    pub weight_decay: f64,
    /// Decoupled weight decay (AdamW) instead of an L2 term in the gradient (Adam).
    pub decoupled: bool,
}

/// The per-step numbers of an update, as 0-d arrays (inputs of a compiled update).
#[derive(Clone, Debug)]
pub struct Scalars {
    /// `lr / (1 - beta1^t)`.
    pub step_size: Array,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inv_sqrt_bc2: Array,
    /// `1 - lr weight_decay` (AdamW; 1 for Adam).
    pub decay: Array,
}

impl Adam {
    /// Adam with PyTorch's defaults (betas 0.9 and 0.999, eps 1e-8, no weight decay).
    pub fn new(lr: f64) -> Adam {
        Adam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: false }
    }
    /// AdamW with PyTorch's defaults and the given weight decay.
    pub fn adamw(lr: f64, weight_decay: f64) -> Adam {
        Adam { weight_decay, decoupled: true, ..Adam::new(lr) }
    }

    fn check(&self) -> Result<()> {
        let ok = self.lr.is_finite()
            && (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.eps.is_finite()
            && self.eps >= 0.0
            && self.weight_decay.is_finite();
        if ok { Ok(()) } else { Err(Error::invalid("adam", format!("invalid hyperparameters {self:?}"))) }
    }

    /// The numbers of step `t` (from 1) as 0-d arrays of `dtype` on `like`'s stream.
    pub fn scalars(&self, t: u64, dtype: DType, like: &Array) -> Result<Scalars> {
        self.check()?;
        if t == 0 {
            return Err(Error::invalid("adam", "steps count from 1"));
        }
        let t = t.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        let decay = if self.decoupled { 1.0 - self.lr * self.weight_decay } else { 1.0 };
        with_stream(&like.stream(), || {
            Ok(Scalars {
                step_size: Array::full(&[], self.lr / bc1, dtype)?,
                inv_sqrt_bc2: Array::full(&[], 1.0 / bc2.sqrt(), dtype)?,
                decay: Array::full(&[], decay, dtype)?,
            })
        })
    }

    /// One update of every parameter, in rill ops (eager, or inside `compile`): returns the
    /// new parameters, first moments and second moments. Each parameter, its gradient and
    /// its moments have one shape and one float dtype; the scalars have that dtype.
    pub fn update(
        &self,
        params: &[Array],
        grads: &[Array],
        m: &[Array],
        v: &[Array],
        s: &Scalars,
    ) -> Result<(Vec<Array>, Vec<Array>, Vec<Array>)> {
        self.check()?;
        let n = params.len();
        if grads.len() != n || m.len() != n || v.len() != n {
            return Err(Error::invalid(
                "adam",
                format!("{n} parameters, {} gradients, {} and {} moments", grads.len(), m.len(), v.len()),
            ));
        }
        let (b1, b2) = (self.beta1, self.beta2);
        let (mut ps, mut ms, mut vs) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let (p, g) = (&params[i], &grads[i]);
            for (what, x) in [("gradient", g), ("first moment", &m[i]), ("second moment", &v[i])] {
                if x.shape() != p.shape() || x.dtype() != p.dtype() {
                    return Err(Error::invalid(
                        "adam",
                        format!(
                            "parameter {i} is {:?} {}, its {what} {:?} {}",
                            p.shape(),
                            p.dtype(),
                            x.shape(),
                            x.dtype()
                        ),
                    ));
                }
            }
            if !p.dtype().is_float() {
                return Err(Error::dtype("adam", p.dtype(), "parameters must be floats"));
            }
            // Scalars of another dtype than the parameter's are converted (an array operand
            // would promote the parameter instead).
            let conv = |a: &Array| if a.dtype() == p.dtype() { Ok(a.clone()) } else { a.astype(p.dtype()) };
            let (step_size, inv_sqrt_bc2, decay) = (conv(&s.step_size)?, conv(&s.inv_sqrt_bc2)?, conv(&s.decay)?);
            let g = if !self.decoupled && self.weight_decay != 0.0 {
                g.add(&p.mul(self.weight_decay)?)?
            } else {
                g.clone()
            };
            let m1 = m[i].mul(b1)?.add(&g.mul(1.0 - b1)?)?;
            let v1 = v[i].mul(b2)?.add(&g.mul(&g)?.mul(1.0 - b2)?)?;
            let denom = v1.sqrt()?.mul(&inv_sqrt_bc2)?.add(self.eps)?;
            let base = if self.decoupled { p.mul(&decay)? } else { p.clone() };
            let p1 = base.sub(&step_size.mul(&m1)?.div(&denom)?)?;
            ps.push(p1);
            ms.push(m1);
            vs.push(v1);
        }
        Ok((ps, ms, vs))
    }

    /// The update as a compiled function of `[params.., grads.., m.., v.., step_size,
    /// inv_sqrt_bc2, decay]` returning `[params.., m.., v..]` (traced once per shapes).
    pub fn compiled(self) -> Compiled {
        compile(move |x: &[Array]| {
            if x.len() < 3 || !(x.len() - 3).is_multiple_of(4) {
                return Err(Error::invalid("adam", format!("{} inputs: 4 per parameter and 3 scalars", x.len())));
            }
            let n = (x.len() - 3) / 4;
            let s = Scalars {
                step_size: x[4 * n].clone(),
                inv_sqrt_bc2: x[4 * n + 1].clone(),
                decay: x[4 * n + 2].clone(),
            };
            let (p, m, v) = self.update(&x[..n], &x[n..2 * n], &x[2 * n..3 * n], &x[3 * n..4 * n], &s)?;
            Ok(p.into_iter().chain(m).chain(v).collect())
        })
    }
}

/// An optimizer's state: the moments, the step count, and the compiled update.
#[derive(Clone, Debug)]
pub struct AdamState {
    adam: Adam,
    step: u64,
    m: Vec<Array>,
    v: Vec<Array>,
    update: Compiled,
}

impl AdamState {
    /// Zero moments for `params` (their shapes, dtypes and streams).
    pub fn new(adam: Adam, params: &[Array]) -> Result<AdamState> {
        adam.check()?;
        let zeros = |p: &Array| with_stream(&p.stream(), || p.zeros_like());
        let m = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        let v = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        Ok(AdamState { adam, step: 0, m, v, update: adam.compiled() })
    }
    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }
    /// The first and second moments.
    pub fn moments(&self) -> (&[Array], &[Array]) {
        (&self.m, &self.v)
    }
    /// One step: returns the new parameters (lazy) and keeps the new moments.
    pub fn step(&mut self, params: &[Array], grads: &[Array]) -> Result<Vec<Array>> {
        let n = self.m.len();
        if params.len() != n || grads.len() != n {
            return Err(Error::invalid(
                "adam",
                format!("{n} parameters expected, got {} and {}", params.len(), grads.len()),
            ));
        }
        let Some(first) = params.first() else { return Ok(Vec::new()) };
        let s = self.adam.scalars(self.step + 1, first.dtype(), first)?;
        let mut inputs: Vec<Array> = Vec::with_capacity(4 * n + 3);
        inputs.extend_from_slice(params);
        inputs.extend_from_slice(grads);
        inputs.extend_from_slice(&self.m);
        inputs.extend_from_slice(&self.v);
        inputs.extend([s.step_size, s.inv_sqrt_bc2, s.decay]);
        let mut out = self.update.call(&inputs)?;
        let v = out.split_off(2 * n);
        let m = out.split_off(n);
        self.m = m;
        self.v = v;
        self.step += 1;
        Ok(out)
    }
}
