//! The generic elementwise launcher: `out[i] = fop(in0[..], in1[..], in2[..])` over a
//! row-major output, with inputs broadcast to the output shape.
//!
//! Three kernels are generated per (function, dtypes): `k_vec` when every input is
//! contiguous and 16-byte vectors line up (aligned vector loads/stores, float4 for f32 and
//! 8 halves for f16/bf16, `VEC_UNROLL` vectors per thread with all loads issued before
//! the stores, one block step per block), `k_contig` when every input is contiguous
//! or a broadcast scalar, and `k_strided` (shape/strides passed by value, after merging
//! axes that are contiguous for every operand) otherwise.

use rustc_hash::FxHashMap as HashMap;

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, sys};

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::{Dims, Layout, Strides};
use smallvec::SmallVec;

use super::buffer::{cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::nvrtc::{self, BLOCK, grid_for};
use super::source::{MAX_DIMS, PRELUDE};

/// Vectors each thread of `k_vec` handles per block step.
const VEC_UNROLL: usize = 4;

/// The strided-layout kernel parameter (mirrors `struct Lay` in the prelude). Up to three
/// operands; a view copy (`copy.rs`) uses operand 0 for the destination, 1 for the source.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Lay {
    pub shape: [i64; MAX_DIMS],
    pub st: [[i64; MAX_DIMS]; 3],
    pub off: [i64; 3],
    pub ndim: i32,
    pub pad: i32,
}
// SAFETY: plain `repr(C)` data with the same layout as the C struct.
unsafe impl DeviceRepr for Lay {}

/// Merges the axes of `shape` for operands with `strides`: size-1 axes are dropped and
/// neighbours that are contiguous for every operand are fused. Returns (dims, strides).
pub(crate) fn merge_dims<S: AsRef<[isize]>>(shape: &[usize], strides: &[S]) -> (Dims, SmallVec<[Strides; 4]>) {
    let k = strides.len();
    let strides: SmallVec<[&[isize]; 4]> = strides.iter().map(|s| s.as_ref()).collect();
    let mut dims = Dims::new();
    let mut st: SmallVec<[Strides; 4]> = smallvec::smallvec![Strides::new(); k];
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        if let Some(last) = dims.last_mut() {
            if (0..k).all(|o| st[o][st[o].len() - 1] == strides[o][i] * d as isize) {
                *last *= d;
                for o in 0..k {
                    let l = st[o].len() - 1;
                    st[o][l] = strides[o][i];
                }
                continue;
            }
        }
        dims.push(d);
        for o in 0..k {
            st[o].push(strides[o][i]);
        }
    }
    (dims, st)
}

/// What a map computes (with the dtypes, it names the generated kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MapFn {
    Unary(crate::primitives::UnaryOp),
    Binary(crate::primitives::BinaryOp),
    Where,
    Copy,
    Cast,
}

impl MapFn {
    fn name(self) -> String {
        match self {
            MapFn::Unary(op) => format!("unary:{}", op.name()),
            MapFn::Binary(op) => format!("binary:{}", op.name()),
            MapFn::Where => "where".into(),
            MapFn::Copy => "copy".into(),
            MapFn::Cast => "cast".into(),
        }
    }
}

/// What names a map kernel on a device: (function, output dtype, input dtypes, kernel
/// variant).
type MapKey = (MapFn, DType, [Option<DType>; 3], &'static str);

/// The loaded map kernels of one device, found without formatting a key.
pub(crate) type MapFns = HashMap<MapKey, CudaFunction>;

thread_local! {
    /// The map kernel this thread launched last: (device state, key, function). A long
    /// chain of one op asks for the same kernel at every node; this finds it without the
    /// device's lock and a hash. A function stays valid for the life of the process (its
    /// module is never unloaded) and so does a device's state.
    static LAST_MAP: std::cell::Cell<Option<(usize, MapKey, sys::CUfunction)>> = const { std::cell::Cell::new(None) };
}

/// One input of a map: a storage and the C type its kernel parameter has.
pub(crate) struct In<'a> {
    pub s: &'a Storage,
    pub ctype: &'static str,
    pub size: usize,
}

impl<'a> In<'a> {
    pub fn new(s: &'a Storage, ctype: &'static str) -> In<'a> {
        In { s, ctype, size: s.dtype.size() }
    }
}

pub(crate) fn kernel_source(fsrc: &str, out_t: &str, ins: &[&str], vec: usize) -> String {
    let k = ins.len();
    let params: String = ins.iter().enumerate().map(|(i, t)| format!(", const {t}* __restrict__ a{i}")).collect();
    let sparams: String = (0..k).map(|i| format!(", i64 s{i}")).collect();
    let call = |f: &dyn Fn(usize) -> String| (0..k).map(f).collect::<Vec<_>>().join(", ");
    let contig_call = call(&|i| format!("a{i}[i * s{i}]"));
    let strided_off: String = (0..k).map(|i| format!("o{i} += c * lay.st[{i}][d]; ")).collect();
    let strided_init: String = (0..k).map(|i| format!("i64 o{i} = lay.off[{i}]; ")).collect();
    let strided_call = call(&|i| format!("a{i}[o{i}]"));
    let vec_decls: String = ins.iter().enumerate().map(|(i, t)| format!("V<{t}, VN> x{i}[UNR]; ")).collect();
    let vec_loads: String =
        ins.iter().enumerate().map(|(i, t)| format!("x{i}[u] = ((const V<{t}, VN>*)a{i})[t]; ")).collect();
    let vec_call = call(&|i| format!("x{i}[u].v[j]"));
    let tail_call = call(&|i| format!("a{i}[r]"));
    format!(
        r#"{PRELUDE}
{fsrc}
#define VN {vec}
#define UNR {VEC_UNROLL}
template <typename T, int N> struct alignas(sizeof(T) * N) V {{ T v[N]; }};
extern "C" __global__ void k_contig({out_t}* __restrict__ out{params}{sparams}, i64 n) {{
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = fop({contig_call});
}}
extern "C" __global__ void k_strided({out_t}* __restrict__ out{params}, Lay lay, i64 n) {{
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {{
        i64 r = i; {strided_init}
        for (int d = lay.ndim - 1; d >= 0; --d) {{
            i64 s = lay.shape[d]; i64 q = r / s; i64 c = r - q * s; r = q; {strided_off}
        }}
        out[i] = fop({strided_call});
    }}
}}
// Each block step covers UNR * blockDim.x consecutive vectors: every thread first issues
// its UNR vector loads per operand, then computes and stores them.
extern "C" __global__ void k_vec({out_t}* __restrict__ out{params}, i64 n) {{
    i64 nv = n / VN;
    i64 gid = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    i64 step = (i64)gridDim.x * blockDim.x * UNR;
    for (i64 base = blockIdx.x * (i64)blockDim.x * UNR + threadIdx.x; base < nv; base += step) {{
        {vec_decls}
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            i64 t = base + (i64)u * blockDim.x;
            if (t < nv) {{ {vec_loads} }}
        }}
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            i64 t = base + (i64)u * blockDim.x;
            if (t < nv) {{
                V<{out_t}, VN> o;
#pragma unroll
                for (int j = 0; j < VN; ++j) o.v[j] = fop({vec_call});
                ((V<{out_t}, VN>*)out)[t] = o;
            }}
        }}
    }}
    i64 r = nv * VN + gid;
    if (r < n) out[r] = fop({tail_call});
}}
"#
    )
}

/// Runs `fop` (defined by `fsrc`, with the parameter types of `ins`) over `shape`,
/// writing a new contiguous storage of `out_dtype`. `what`, `out_dtype` and the input
/// dtypes identify the kernel: `fsrc` runs (and a key is formatted) only the first time a
/// device needs it.
pub(crate) fn map(
    cs: &GpuStream<'_>,
    what: MapFn,
    fsrc: impl FnOnce() -> String,
    out_dtype: DType,
    ins: &[In<'_>],
    shape: &[usize],
) -> Result<Storage> {
    let out = new_storage(cs, out_dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let out_t = super::source::ctype(out_dtype);
    let out_ptr = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    // Inline arrays throughout: a launch of a small op allocates nothing on the host.
    let bases: SmallVec<[u64; 3]> = ins.iter().map(|i| cuda_of(i.s).map(|b| b.ptr()).unwrap_or(0)).collect();
    let max_size = ins.iter().map(|i| i.size).chain([out_dtype.size()]).max().unwrap_or(1);
    let vec = (16 / max_size).max(1);
    let dev = &cs.dev;
    let mut in_dtypes = [None; 3];
    for (slot, i) in in_dtypes.iter_mut().zip(ins) {
        *slot = Some(i.s.dtype);
    }
    let mut fsrc = Some(fsrc);
    // The raw handle, copied out under the lock (no reference count per launch): the
    // module stays loaded for the life of the process (see `Launch`).
    let mut get = |name: &'static str| -> Result<sys::CUfunction> {
        let memo = (what, out_dtype, in_dtypes, name);
        let here = std::sync::Arc::as_ptr(dev) as usize;
        if let Ok(Some((d, k, f))) = LAST_MAP.try_with(|c| c.get()) {
            if d == here && k == memo {
                return Ok(f);
            }
        }
        let remember = |f: sys::CUfunction| {
            let _ = LAST_MAP.try_with(|c| c.set(Some((here, memo, f))));
            f
        };
        if let Some(f) = dev.map_fns.lock().get(&memo) {
            return Ok(remember(f.cu_function()));
        }
        let types: Vec<&str> = ins.iter().map(|i| i.ctype).collect();
        // Keyed by dtype, not C type: f16/bf16 (and bool/u8) share a C type but not code.
        let dtypes: Vec<&str> = ins.iter().map(|i| i.s.dtype.name()).collect();
        let full_key = format!("{}|{}|{}|{}", what.name(), out_dtype.name(), types.join(","), dtypes.join(","));
        let f = nvrtc::function(cs.driver(), dev, &full_key, name, || {
            let f = fsrc.take().map(|f| f()).unwrap_or_default();
            kernel_source(&f, out_t, &types, vec)
        })?;
        let raw = f.cu_function();
        dev.map_fns.lock().insert(memo, f);
        Ok(remember(raw))
    };
    // No context binding here: `Launch::launch` binds when it sends a launch directly, and
    // a recorded launch needs none until its batch sends it.
    let n64 = n as i64;
    let launch_err = |e| super::backend_err("launch", e);
    let run = match addressing(ins, shape)? {
        Addressing::Run(run) => run,
        Addressing::Strided(lay) => {
            let mut b = operands(get("k_strided")?, out_ptr, &bases);
            b.arg(&lay);
            b.arg(&n64);
            // SAFETY: the arguments match the generated signature; every offset the layout
            // produces lies inside its buffer (views are checked by the op layer).
            unsafe { b.launch(cs, grid_for(n)) }.map_err(launch_err)?;
            return Ok(out);
        }
    };
    // Each operand's first element (broadcasting keeps a layout's offset).
    let ptrs: SmallVec<[u64; 3]> =
        (0..ins.len()).map(|o| bases[o] + (ins[o].s.layout.offset * ins[o].size) as u64).collect();
    let aligned = run.iter().all(|&s| s == 1)
        && ptrs.iter().zip(ins).all(|(p, i)| p % (i.size * vec) as u64 == 0)
        && out_ptr % (out_dtype.size() * vec) as u64 == 0
        && vec > 1;
    if aligned {
        let mut b = operands(get("k_vec")?, out_ptr, &ptrs);
        b.arg(&n64);
        // One block step per block: no grid-stride loop for any realistic size.
        let blocks = (n / vec).div_ceil(BLOCK as usize * VEC_UNROLL).clamp(1, 1 << 30) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the generated signature; every pointer covers n
        // elements (vector-aligned, checked above).
        unsafe { b.launch(cs, cfg) }.map_err(launch_err)?;
    } else {
        let mut b = operands(get("k_contig")?, out_ptr, &ptrs);
        for s in &run {
            b.arg(s);
        }
        b.arg(&n64);
        // SAFETY: as above; a stride-0 operand reads its one element.
        unsafe { b.launch(cs, grid_for(n)) }.map_err(launch_err)?;
    }
    Ok(out)
}

/// A launch of `f` with its first arguments: the output pointer, then each operand's.
fn operands(f: sys::CUfunction, out: u64, ptrs: &[u64]) -> Launch {
    let mut b = Launch::raw(f);
    b.arg(&out);
    for p in ptrs {
        b.arg(p);
    }
    b
}

/// How a map's kernel addresses its inputs (returned once per launch, never stored: the
/// layout stays inline rather than boxed, so a launch allocates nothing).
#[allow(clippy::large_enum_variant)]
enum Addressing {
    /// Each input is one run with this stride: 1 (contiguous in the output's order) or 0
    /// (a broadcast element).
    Run(SmallVec<[i64; 3]>),
    /// Broadcast strided layouts, with the axes merged.
    Strided(Lay),
}

fn addressing(ins: &[In<'_>], shape: &[usize]) -> Result<Addressing> {
    // The usual case needs no layout work: each input is a contiguous array of the
    // output's shape (run stride 1) or one element (a broadcast scalar, run stride 0).
    let quick: Option<SmallVec<[i64; 3]>> = ins
        .iter()
        .map(|i| {
            let l = &i.s.layout;
            match l.numel() {
                1 => Some(0),
                _ if l.shape[..] == *shape && l.is_contiguous() => Some(1),
                _ => None,
            }
        })
        .collect();
    if let Some(run) = quick {
        return Ok(Addressing::Run(run));
    }
    let lays: SmallVec<[Layout; 3]> = ins.iter().map(|i| i.s.layout.broadcast_to(shape)).collect();
    let strides: SmallVec<[&[isize]; 3]> = lays.iter().map(|l| &l.strides[..]).collect();
    let (dims, mst) = merge_dims(shape, &strides);
    // The merged view may still be one contiguous run or a scalar per operand.
    let run: Option<SmallVec<[i64; 3]>> = (0..ins.len())
        .map(|o| match dims.len() {
            0 => Some(0),
            1 if mst[o][0] == 1 || mst[o][0] == 0 => Some(mst[o][0] as i64),
            _ if mst[o].iter().all(|&s| s == 0) => Some(0),
            _ => None,
        })
        .collect();
    if let Some(run) = run {
        return Ok(Addressing::Run(run));
    }
    if dims.len() > MAX_DIMS {
        return Err(super::unsupported(
            "elementwise",
            format!("strided inputs of rank {} after merging axes (at most {MAX_DIMS})", dims.len()),
        ));
    }
    let mut lay = Lay { shape: [1; MAX_DIMS], st: [[0; MAX_DIMS]; 3], off: [0; 3], ndim: dims.len() as i32, pad: 0 };
    for (d, &s) in dims.iter().enumerate() {
        lay.shape[d] = s as i64;
        for o in 0..ins.len() {
            lay.st[o][d] = mst[o][d] as i64;
        }
    }
    for o in 0..ins.len() {
        lay.off[o] = lays[o].offset as i64;
    }
    Ok(Addressing::Strided(lay))
}

#[cfg(test)]
mod tests {
    use super::kernel_source;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn map_kernels_compile() {
        let cases: [(&str, &str, &[&str], usize); 5] = [
            (
                "float",
                "__device__ __forceinline__ float fop(float p, float q) { return p + q; }",
                &["float", "float"],
                4,
            ),
            (
                "u16",
                "__device__ __forceinline__ u16 fop(u16 p, u16 q) { return st_bf16(ld_bf16(p) + ld_bf16(q)); }",
                &["u16", "u16"],
                8,
            ),
            ("double", "__device__ __forceinline__ double fop(double p) { return -p; }", &["double"], 2),
            (
                "i32",
                "__device__ __forceinline__ i32 fop(u8 c, i32 x, i32 y) { return c ? x : y; }",
                &["u8", "i32", "i32"],
                4,
            ),
            ("u8", "__device__ __forceinline__ u8 fop(i64 x) { return (u8)(x != 0); }", &["i64"], 2),
        ];
        for (out_t, fsrc, ins, vec) in cases {
            if !check_compiles(&format!("test:map:{out_t}:{}", ins.join(",")), &kernel_source(fsrc, out_t, ins, vec)) {
                return;
            }
        }
    }
}
