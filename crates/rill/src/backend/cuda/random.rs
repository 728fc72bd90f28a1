//! Random arrays: the CPU's counter-based generator (`backend/cpu/random.rs`) ported
//! bit for bit: threefry-2x32 with 20 rounds on counter `i` (normal: `2i` and `2i + 1`),
//! the same bits→float mapping, computed in double with explicitly rounded operations
//! (`__dadd_rn`/`__dmul_rn`, so no FMA contraction changes a result). Uniform and
//! Bernoulli values equal the CPU's exactly; normal values may differ in the last bit
//! (CUDA's `log`/`cos`/`sqrt` against the host's libm).

use crate::backend::Storage;
use crate::backend::cpu::random::next_down;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Distribution;

use super::buffer::{cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::nvrtc::{self, grid_for};
use super::source::{PRELUDE, ctype, load, store_float};

const THREEFRY: &str = r#"
__device__ __forceinline__ u32 rotl32(u32 x, u32 r) { return (x << r) | (x >> (32u - r)); }
__device__ __forceinline__ void threefry(u32 k0, u32 k1, u64 i, u32& x0, u32& x1) {
    const u32 rot[8] = {13u, 15u, 26u, 6u, 17u, 29u, 16u, 24u};
    u32 ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
    x0 = (u32)i + ks[0];
    x1 = (u32)(i >> 32) + ks[1];
#pragma unroll
    for (u32 g = 0; g < 5u; ++g) {
#pragma unroll
        for (u32 r = 0; r < 4u; ++r) {
            x0 += x1;
            x1 = rotl32(x1, rot[(g % 2u) * 4u + r]) ^ x0;
        }
        u32 s = g + 1u;
        x0 += ks[s % 3u];
        x1 += ks[(s + 1u) % 3u] + s;
    }
}
__device__ __forceinline__ double u24(u32 w) { return (double)(w >> 8) * (1.0 / 16777216.0); }
__device__ __forceinline__ double u53(u32 x0, u32 x1) {
    return (double)((((u64)x0 << 32) | (u64)x1) >> 11) * (1.0 / 9007199254740992.0);
}
"#;

/// A new contiguous storage of random values (see the module docs).
pub(crate) fn random(
    cs: &GpuStream<'_>,
    shape: &[usize],
    dtype: DType,
    key: [u32; 2],
    dist: Distribution,
) -> Result<Storage> {
    let t = ctype(dtype);
    let (tag, body, a, b, c) = match dist {
        Distribution::Uniform { low, high } => {
            if !dtype.is_float() {
                return Err(Error::dtype("uniform", dtype, "random uniform values need a float dtype"));
            }
            let round = crate::backend::cpu::random::round_to;
            let (lo, hi) = (round(dtype, low), round(dtype, high));
            let u = if dtype == DType::F64 { "u53(x0, x1)" } else { "u24(x0)" };
            let st_v = store_float(dtype, "vd", true);
            let st_below = store_float(dtype, "c", true);
            let back = load(dtype, "v");
            let body = format!(
                "threefry(k0, k1, (u64)i, x0, x1); double u = {u}; \
                 double vd = __dadd_rn(a, __dmul_rn(b - a, u)); {t} v = {st_v}; \
                 if ((double)({back}) >= b) v = {st_below}; out[i] = v;"
            );
            ("uniform", body, lo, hi, next_down(dtype, hi))
        }
        Distribution::Normal { mean, std } => {
            if !dtype.is_float() {
                return Err(Error::dtype("normal", dtype, "random normal values need a float dtype"));
            }
            let st = store_float(dtype, "vd", true);
            let body = format!(
                "threefry(k0, k1, 2ull * (u64)i, x0, x1); double u1 = u53(x0, x1); \
                 threefry(k0, k1, 2ull * (u64)i + 1ull, x0, x1); double u2 = u53(x0, x1); \
                 double z = __dmul_rn(sqrt(__dmul_rn(-2.0, log(1.0 - u1))), cos(__dmul_rn(6.283185307179586, u2))); \
                 double vd = __dadd_rn(a, __dmul_rn(b, z)); out[i] = {st};"
            );
            ("normal", body, mean, std, 0.0)
        }
        Distribution::Bernoulli { p } => {
            if dtype != DType::Bool {
                return Err(Error::dtype("bernoulli", dtype, "bernoulli values are bool"));
            }
            ("bernoulli", "threefry(k0, k1, (u64)i, x0, x1); out[i] = (u8)(u53(x0, x1) < a);".to_string(), p, 0.0, 0.0)
        }
    };
    let out = new_storage(cs, dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let kname = format!("random:{tag}:{}", dtype.name());
    let src = move || {
        format!(
            r#"{PRELUDE}
{THREEFRY}
extern "C" __global__ void k_random({t}* out, i64 n, u32 k0, u32 k1, double a, double b, double c) {{
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x) {{
        u32 x0, x1;
        {body}
    }}
}}
"#
        )
    };
    let f = nvrtc::function(cs.driver(), &cs.dev, &kname, "k_random", src)?;
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let n64 = n as i64;
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&po).arg(&n64).arg(&key[0]).arg(&key[1]).arg(&a).arg(&b).arg(&c);
    // SAFETY: `out` holds n elements; the arguments match the kernel's signature.
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}
