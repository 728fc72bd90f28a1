#!/usr/bin/env python3
"""Fits the coefficients of rill's branch-free f32 erf (crates/rill/src/primitives/vexp.rs).

Below 1 in magnitude: erf(x) = x * P(x^2), P of degree 6. From 1 to 4:
erf(x) = 1 - exp(-x^2) * R(1 / x), R of degree 9, fitted to erfc(x) * exp(x^2). Both are
least-squares fits on Chebyshev nodes in float64 (numpy, scipy); the script prints them as
f32 literals and the worst error of the f32 evaluation (numpy float32, Horner) in ulp.
"""
import numpy as np
from scipy.special import erf, erfc


def fit(f, a, b, deg, var):
    n = 4000
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    x = (a + b) / 2 + (b - a) / 2 * t
    c, *_ = np.linalg.lstsq(np.vander(var(x), deg + 1, increasing=True), f(x), rcond=None)
    return c.astype(np.float32)


def horner(c, v):
    p = np.full_like(v, c[-1])
    for k in c[-2::-1]:
        p = p * v + k
    return p


small = fit(lambda x: erf(x) / x, 1e-9, 1.0, 6, lambda x: x * x)
large = fit(lambda x: erfc(x) * np.exp(x * x), 1.0, 4.0, 9, lambda x: 1 / x)
for name, c in (("SMALL", small), ("LARGE", large)):
    print(f"const {name}: [f32; {len(c)}] = [{', '.join(repr(float(v)) for v in c)}];")

x = np.linspace(0, 4.5, 2_000_001).astype(np.float32)
a = np.minimum(x, np.float32(4))
with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
    s = a * horner(small, a * a)
    big = np.float32(1) - np.exp(-(a * a)) * horner(large, np.float32(1) / a)
y = np.where(a < 1, s, big).astype(np.float32)
want = erf(x.astype(np.float64))
ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
err = np.abs(y.astype(np.float64) - want) / ulp
print(f"worst {err.max():.2f} ulp at x = {x[err.argmax()]}")
