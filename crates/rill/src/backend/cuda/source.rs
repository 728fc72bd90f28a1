//! The CUDA C prelude shared by every generated kernel: fixed-width types, f16/bf16
//! conversions written out (no CUDA headers needed, and bit-identical to the `half`
//! crate's rounding), saturating float→integer conversions (Rust `as` semantics), and
//! the strided-layout parameter. The conversions between stored values and the types
//! they compute in (`load`, `store_float`) are those of the elementwise formulas
//! (`crate::primitives::cuda`).

use crate::dtype::DType;

// The value conversions live with the elementwise formulas that use them.
pub(crate) use crate::primitives::cuda::{load, store_float, utype};

/// Largest rank the strided kernels accept after merging axes.
pub(crate) const MAX_DIMS: usize = 8;

pub(crate) const PRELUDE: &str = r#"
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;
#define MAXD 8
struct Lay { i64 shape[MAXD]; i64 st[3][MAXD]; i64 off[3]; i32 ndim; i32 pad; };
// Every rill kernel calls this first (inserted by the compiler front end, nvrtc.rs). In
// a CUDA graph a kernel may be started while the previous one still runs (a programmatic
// edge, sm_90 and later, launch.rs); it waits here, before touching memory, until that
// kernel has finished and its writes are visible. Launched any other way it returns at once.
__device__ __forceinline__ void rill_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// A kernel whose body starts with RILL_OWN_WAIT calls rill_grid_wait() itself (the
// front end then inserts none); before it, it may only prefetch into L2, which is
// coherent, so nothing stale can be read later.
#define RILL_OWN_WAIT
__device__ __forceinline__ void rill_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}

__device__ __forceinline__ float ld_f16(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 st_f16(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ u16 st_f16_d(double d) { u16 h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ float ld_bf16(u16 b) {
    u32 u = ((u32)b) << 16;
    if ((b & 0x7fffu) > 0x7f80u) u |= 0x400000u;
    return __uint_as_float(u);
}
__device__ __forceinline__ u16 st_bf16(float f) {
    u32 x = __float_as_uint(f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // The hardware rounds to nearest even as below; only a NaN is made canonical there,
    // where the CPU keeps its payload (quieted).
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return f != f ? (u16)((x >> 16) | 0x40u) : h;
#endif
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    if ((x & 0x8000u) != 0u && (x & (3u * 0x8000u - 1u)) != 0u) return (u16)((x >> 16) + 1u);
    return (u16)(x >> 16);
}
__device__ __forceinline__ u16 st_bf16_d(double d) {
    u64 v = (u64)__double_as_longlong(d);
    u32 x = (u32)(v >> 32);
    u32 sign = x & 0x80000000u, ex = x & 0x7ff00000u, man = x & 0x000fffffu;
    if (ex == 0x7ff00000u) {
        u32 nan_bit = (man == 0u && (u32)v == 0u) ? 0u : 0x40u;
        return (u16)((sign >> 16) | 0x7f80u | nan_bit | (man >> 13));
    }
    u32 hs = sign >> 16;
    i64 he = (i64)(ex >> 20) - 1023 + 127;
    if (he >= 0xff) return (u16)(hs | 0x7f80u);
    if (he <= 0) {
        if (7 - he > 21) return (u16)hs;
        u32 m = man | 0x00100000u;
        u32 hm = m >> (14 - he);
        u32 rb = 1u << (13 - he);
        if ((m & rb) != 0u && (((m & (3u * rb - 1u)) | (u32)v) != 0u)) hm += 1u;
        return (u16)(hs | hm);
    }
    u32 hexp = ((u32)he) << 7;
    u32 hm = man >> 13;
    u32 rb = 0x1000u;
    // Sticky bits include the low word of the double: ignoring it rounds ties wrongly.
    if ((man & rb) != 0u && (((man & (3u * rb - 1u)) | (u32)v) != 0u)) return (u16)((hs | hexp | hm) + 1u);
    return (u16)(hs | hexp | hm);
}
// The derivatives of gelu, gelu_tanh and silu, for float and double (primitives/unary.rs:
// `float` gives the order of the operations, each rounded, never contracted; the
// constants are the double values converted, as there).
__device__ __forceinline__ float rn_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float rn_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float rn_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rn_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double rn_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double rn_mul(double a, double b) { return __dmul_rn(a, b); }
template <typename T> __device__ __forceinline__ T gelu_grad_t(T x) {
    T cdf = rn_mul((T)0.5, rn_add((T)1.0, erf(rn_mul(x, (T)0.70710678118654752))));
    T e = exp(-rn_mul(rn_mul((T)0.5, x), x));
    return rn_add(cdf, rn_mul(x, rn_mul(e, (T)0.39894228040143268)));
}
template <typename T> __device__ __forceinline__ T gelu_tanh_grad_t(T x) {
    T x2 = rn_mul(x, x);
    T t = tanh(rn_mul((T)0.7978845608028654, rn_add(x, rn_mul(rn_mul((T)0.044715, x), x2))));
    T du = rn_mul((T)0.7978845608028654, rn_add((T)1.0, rn_mul((T)0.134145, x2)));
    T a = rn_mul((T)0.5, rn_add((T)1.0, t));
    return rn_add(a, rn_mul(rn_mul(rn_mul((T)0.5, x), rn_sub((T)1.0, rn_mul(t, t))), du));
}
template <typename T> __device__ __forceinline__ T silu_grad_t(T x) {
    T s = (T)1.0 / rn_add((T)1.0, exp(-x));
    return rn_mul(s, rn_add((T)1.0, rn_mul(x, rn_sub((T)1.0, s))));
}
__device__ __forceinline__ u8 sat_u8(double d) { if (d != d) return 0; if (d <= 0.0) return 0; if (d >= 255.0) return 255; return (u8)d; }
__device__ __forceinline__ u32 sat_u32(double d) { if (d != d) return 0; if (d <= 0.0) return 0u; if (d >= 4294967295.0) return 4294967295u; return (u32)d; }
__device__ __forceinline__ i32 sat_i32(double d) { if (d != d) return 0; if (d <= -2147483648.0) return (i32)0x80000000u; if (d >= 2147483647.0) return 2147483647; return (i32)d; }
__device__ __forceinline__ i64 sat_i64(double d) { if (d != d) return 0; if (d <= -9223372036854775808.0) return (i64)0x8000000000000000ull; if (d >= 9223372036854775807.0) return 9223372036854775807ll; return (i64)d; }
"#;

/// The C type a dtype is stored as.
pub(crate) fn ctype(d: DType) -> &'static str {
    d.c_type()
}

/// The C type floats of this dtype compute in (f16/bf16 compute in float).
pub(crate) fn ftype(d: DType) -> &'static str {
    if d == DType::F64 { "double" } else { "float" }
}

/// The bit pattern of `value` converted to `dtype` on the host (Rust semantics), as u64.
pub(crate) fn host_bits(dtype: DType, value: f64) -> u64 {
    use crate::dtype::Element;
    let v = if dtype == DType::Bool { (value != 0.0) as u8 as f64 } else { value };
    crate::with_dtype!(dtype, T => {
        let x = T::from_f64(v);
        let mut bytes = [0u8; 8];
        bytes[..std::mem::size_of::<T>()].copy_from_slice(bytemuck::bytes_of(&x));
        u64::from_le_bytes(bytes)
    })
}

/// The unsigned C type of an element size (for copies that only move bits).
pub(crate) fn bits_type(size: usize) -> &'static str {
    match size {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}
