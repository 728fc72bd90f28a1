//! Shape rules of the fused neural-network primitives: `Softmax`, `LayerNorm`, `RmsNorm`.
//!
//! Each keeps its input's shape; the rules resolve the axis or check the per-column
//! arrays. Used by `ops/nn.rs` when it records the node and by `compile/shapes.rs` when
//! a shapeless replay re-derives it. They compute in `x.dtype().to_float()`.

use crate::error::{Error, Result};
use crate::shape::normalize_axis;

/// `Softmax` of `x` along `axis` (negative counts from the end; `name` is `softmax` or
/// `log_softmax`): the axis resolved, and the shape of `x`.
pub(crate) fn softmax(name: &'static str, x: &[usize], axis: isize) -> Result<(usize, Vec<usize>)> {
    Ok((normalize_axis(name, axis, x.len())?, x.to_vec()))
}

/// `LayerNorm` or `RmsNorm` (`name`) of `x` over its last axis, with optional `weight`
/// and `bias` of shape `[last dimension]`: the shape of `x`.
pub(crate) fn norm(
    name: &'static str,
    x: &[usize],
    weight: Option<&[usize]>,
    bias: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let Some(&d) = x.last() else {
        return Err(Error::shape(name, format!("needs an input with at least one axis, got shape {x:?}")));
    };
    for (what, c) in [("weight", weight), ("bias", bias)] {
        if let Some(c) = c
            && c != [d]
        {
            return Err(Error::shape(
                name,
                format!(
                    "{what} of shape {c:?} does not match the last dimension of input shape {x:?} (expected [{d}])"
                ),
            ));
        }
    }
    Ok(x.to_vec())
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, add_opt, no_rule};
use crate::array::Array;

/// `a` summed over every axis but the last (the cotangent of a per-column weight).
fn sum_rows(a: &Array) -> Result<Array> {
    if a.ndim() <= 1 {
        return Ok(a.clone());
    }
    let axes: Vec<isize> = (0..a.ndim() as isize - 1).collect();
    a.sum(&axes, false)
}

/// The normalised input `xhat` and the inverse scale (kept last axis) of a layer norm
/// (`rms`: an RMS norm) of `x`, recomputed with ops.
fn normalised(x: &Array, eps: f64, rms: bool) -> Result<(Array, Array)> {
    if rms {
        let r = x.square()?.mean(&[-1], true)?.add(eps)?.rsqrt()?;
        Ok((x.mul(&r)?, r))
    } else {
        let xc = x.sub(&x.mean(&[-1], true)?)?;
        let r = xc.square()?.mean(&[-1], true)?.add(eps)?.rsqrt()?;
        Ok((xc.mul(&r)?, r))
    }
}

/// The derivative of `xhat` applied to `v` (a cotangent already times the weight, or a
/// tangent): `r (v - mean(v) - xhat mean(v xhat))`, without the `mean(v)` for an RMS norm.
/// (The map is self-adjoint, so one formula serves both modes.)
fn through_norm(v: &Array, xhat: &Array, r: &Array, rms: bool) -> Result<Array> {
    let mut d = v.sub(&xhat.mul(&v.mul(xhat)?.mean(&[-1], true)?)?)?;
    if !rms {
        d = d.sub(&v.mean(&[-1], true)?)?;
    }
    d.mul(r)
}

/// The per-column inputs `[weight][, bias]` of a norm node.
fn columns(inputs: &[Array], has_weight: bool) -> (Option<&Array>, Option<&Array>) {
    let w = if has_weight { inputs.get(1) } else { None };
    let b = inputs.get(1 + has_weight as usize);
    (w, b)
}

/// `softmax`: `y (ct - sum(ct y))`; `log_softmax`: `ct - exp(y) sum(ct)` (along the
/// axis). The norms: the cotangents of `x`, `weight` and `bias` from `xhat` recomputed.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    let (x, y, ct) = (&g.inputs[0], g.output, g.cotangent);
    match p {
        Primitive::Softmax { axis, log } => {
            let ax = [*axis as isize];
            Ok(vec![Some(if *log {
                ct.sub(&y.exp()?.mul(&ct.sum(&ax, true)?)?)?
            } else {
                y.mul(&ct.sub(&ct.mul(y)?.sum(&ax, true)?)?)?
            })])
        }
        Primitive::LayerNorm { eps, has_weight, has_bias } => {
            let (xhat, r) = normalised(x, *eps, false)?;
            let (w, _) = columns(g.inputs, *has_weight);
            let gw = match w {
                Some(w) => ct.mul(w)?,
                None => ct.clone(),
            };
            let mut out = vec![Some(through_norm(&gw, &xhat, &r, false)?)];
            if *has_weight {
                out.push(Some(sum_rows(&ct.mul(&xhat)?)?));
            }
            if *has_bias {
                out.push(Some(sum_rows(ct)?));
            }
            Ok(out)
        }
        Primitive::RmsNorm { eps, has_weight } => {
            let (xhat, r) = normalised(x, *eps, true)?;
            let gw = match g.inputs.get(1).filter(|_| *has_weight) {
                Some(w) => ct.mul(w)?,
                None => ct.clone(),
            };
            let mut out = vec![Some(through_norm(&gw, &xhat, &r, true)?)];
            if *has_weight {
                out.push(Some(sum_rows(&ct.mul(&xhat)?)?));
            }
            Ok(out)
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

/// The forward rules: `softmax` `y (t - sum(t y))`, `log_softmax` `t - sum(exp(y) t)`,
/// the norms `d(xhat) w + xhat dw + db`.
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    let (x, y) = (&g.inputs[0], g.output);
    match p {
        Primitive::Softmax { axis, log } => {
            let Some(t) = &g.tangents[0] else { return Ok(None) };
            let ax = [*axis as isize];
            Ok(Some(if *log {
                t.sub(&y.exp()?.mul(t)?.sum(&ax, true)?)?
            } else {
                y.mul(&t.sub(&t.mul(y)?.sum(&ax, true)?)?)?
            }))
        }
        Primitive::LayerNorm { eps, has_weight, .. } | Primitive::RmsNorm { eps, has_weight } => {
            let rms = matches!(p, Primitive::RmsNorm { .. });
            let (xhat, r) = normalised(x, *eps, rms)?;
            let (w, _) = columns(g.inputs, *has_weight);
            let tw = if *has_weight { g.tangents.get(1).cloned().flatten() } else { None };
            let tb = if !rms { g.tangents.get(1 + *has_weight as usize).cloned().flatten() } else { None };
            let tx = match &g.tangents[0] {
                Some(t) => {
                    let d = through_norm(t, &xhat, &r, rms)?;
                    Some(match w {
                        Some(w) => d.mul(w)?,
                        None => d,
                    })
                }
                None => None,
            };
            let tw = tw.map(|tw| xhat.mul(&tw)).transpose()?;
            let t = add_opt(add_opt(tx, tw)?, tb)?;
            t.map(|t| super::grad::broadcast(t, y.shape())).transpose()
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}
