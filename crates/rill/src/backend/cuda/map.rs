//! The generic elementwise launcher: `out[i] = fop(in0[..], in1[..], in2[..])` over a
//! row-major output, with inputs broadcast to the output shape.
//!
//! [`plan`] picks one kernel per launch from the operands' layouts after broadcasting them
//! to the output shape and merging the axes that are contiguous for every operand
//! ([`merge_dims`]); only the kernel a launch needs is generated and compiled, keyed by
//! its [`Variant`] (NVRTC time is paid per variant on first use):
//!
//! | merged layout | kernel |
//! |---|---|
//! | every operand one contiguous run or a broadcast scalar; runs and output 16-byte aligned | `k_vec`: `VN` elements per aligned vector (16 bytes of the widest dtype: float4, 8 halves), `VEC_UNROLL` vectors in flight per thread (two of 8 or 16 elements, `vec_unroll`), scalars loaded once per thread and splat (a mask in the variant) |
//! | one axis, any strides (misaligned runs, a step) | `k_contig`: `VEC_UNROLL` elements per thread, all loads first |
//! | two axes [R, C] (row, column or outer broadcasts, a column slice, a step on rows); every column stride 0 or 1, C a multiple of `VN`, row starts and output 16-byte aligned | `k_rows` (vector): a 2-D grid of tiles, operand `o` of element (r, c) at `r * sr[o] + c`, `VN` elements per vector, column-broadcast operands (column stride 0) loaded once per row item and splat (a mask in the variant); no division |
//! | two axes, any strides (misaligned rows, C not a multiple of `VN`, a transposed operand) | `k_rows` (scalar): the same tiles, one element per item at `r * sr[o] + c * sc[o]`; 32 by 32 tiles when an operand's columns lie further apart than its rows (a transposed view), so a block reuses the cache lines it reads |
//! | three to [`MAX_DIMS`] axes | `k_rows` over the last axis (vectors or elements as above), a row's start in each operand from its coordinates on the outer axes (one division per outer axis per item: per vector, not per element) |
//!
//! Before planning, a map that is not a copy follows its operands' memory order, as
//! PyTorch's elementwise ops do: when every full-size operand is dense in one axis order
//! other than row-major (a transposed array, a permuted batch), the output is allocated in
//! that order and returned as a permuted view ([`follow_order`]), so the map is one
//! contiguous pass instead of a transpose. Copies (`contiguous`, and the copies kernels
//! make of their inputs) always write row-major.
//!
//! Index arithmetic is u32 ("narrow") when every count and offset a kernel forms is below
//! 2^31 and no stride is negative; i64 otherwise.

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
use super::nvrtc::{self, BLOCK};
use super::source::{MAX_DIMS, PRELUDE};

/// Vectors (or elements, for `k_contig`) each thread handles per block step. A power of
/// two: `k_rows` splits it between a row and a column by shifts.
const VEC_UNROLL: usize = 4;
const _: () = assert!(VEC_UNROLL.is_power_of_two());

/// Vectors per thread of `k_vec` in one block step for vectors of `vn` elements: two for
/// 8 or 16 (halves, bytes), else [`VEC_UNROLL`]. Halving the work of a thread of 16-byte
/// vectors of small elements doubles the threads, which hides the latency of their
/// arithmetic (bf16 and f16 transcendentals gained about a quarter at 2^22 elements) and
/// costs streaming nothing. `RILL_MAP_UNROLL` (1, 2, 4 or 8) sets it for every width,
/// for comparing.
fn vec_unroll(vn: usize) -> usize {
    static U: crate::sync::OnceLock<Option<usize>> = crate::sync::OnceLock::new();
    let set = *U.get_or_init(|| {
        std::env::var("RILL_MAP_UNROLL")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|u| matches!(u, 1 | 2 | 4 | 8))
    });
    set.unwrap_or(if vn >= 8 { 2 } else { VEC_UNROLL })
}

/// The largest count, offset or extent a narrow (u32) kernel forms: sums of two of them
/// stay below 2^32.
const NARROW: u64 = i32::MAX as u64;

/// Most blocks a grid-stride kernel is launched with.
const MAX_BLOCKS: usize = 1 << 30;

/// The strided-layout kernel parameter (mirrors `struct Lay` in the prelude). Up to three
/// operands; a view copy (`copy.rs`) uses operand 0 for the destination, 1 for the source.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
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
        if let Some(last) = dims.last_mut()
            && (0..k).all(|o| st[o][st[o].len() - 1] == strides[o][i] * d as isize)
        {
            *last *= d;
            for o in 0..k {
                let l = st[o].len() - 1;
                st[o][l] = strides[o][i];
            }
            continue;
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

/// Which generated kernel a launch runs: each variant is a module of its own, compiled
/// the first time a launch needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Variant {
    /// `k_vec`; bit `o` of `scalar` marks operand `o` as a broadcast scalar.
    Vec { scalar: u8, wide: bool },
    /// `k_contig`: one axis, a stride per operand.
    Contig { wide: bool },
    /// `k_rows`: rows of the last axis; `vec`: `VN` elements per access, bit `o` of
    /// `scalar` marks operand `o` as constant along a row (column stride 0); `deep`: rows
    /// span several outer axes (a [`Lay`] of them), else one (a stride per operand).
    Rows { vec: bool, scalar: u8, wide: bool, deep: bool },
}

impl Variant {
    /// The kernel's function name.
    fn func(self) -> &'static str {
        match self {
            Variant::Vec { .. } => "k_vec",
            Variant::Contig { .. } => "k_contig",
            Variant::Rows { .. } => "k_rows",
        }
    }

    /// The variant's part of the module key.
    fn tag(self) -> String {
        let w = |wide: bool| if wide { "i64" } else { "u32" };
        match self {
            Variant::Vec { scalar, wide } => format!("vec:s{scalar}:{}", w(wide)),
            Variant::Contig { wide } => format!("contig:{}", w(wide)),
            Variant::Rows { vec, scalar, wide, deep } => {
                format!("rows:{}:s{scalar}:{}{}", if vec { "v" } else { "e" }, w(wide), if deep { ":deep" } else { "" })
            }
        }
    }
}

/// What names a map kernel on a device: (function, output dtype, input dtypes, kernel
/// variant).
type MapKey = (MapFn, DType, [Option<DType>; 3], Variant);

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

/// An operand as [`plan`] sees it: its layout, element size and buffer address (bytes).
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub layout: &'a Layout,
    pub size: usize,
    pub addr: u64,
}

impl Operand<'_> {
    /// The address of the operand's first element (broadcasting keeps a layout's offset).
    fn first(&self) -> u64 {
        self.addr + (self.layout.offset * self.size) as u64
    }
}

/// The kernel a launch runs and its arguments past the pointers (made once per launch,
/// never stored: the layout stays inline rather than boxed, so a launch allocates nothing).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    /// `k_vec` over `n` elements; bit `o` of `scalar`: operand `o` is one element.
    Vec { scalar: u8, n: usize, wide: bool },
    /// `k_contig` over `n` elements, operand `o` at `st[o] * i`.
    Contig { st: [i64; 3], n: usize, wide: bool },
    /// `k_rows` over `r` rows of `c` elements, operand `o` at `r * st[o][0] + c * st[o][1]`,
    /// or with `outer` at `rowstart(o, r) + c * st[o][1]`: row `r`'s coordinates on the
    /// outer axes `outer.shape[..outer.ndim]` (row-major) times the strides `outer.st[o]`;
    /// `tile`: square tiles (an operand walks its columns further apart than its rows).
    Rows { r: usize, c: usize, st: [[i64; 2]; 3], vec: bool, scalar: u8, wide: bool, tile: bool, outer: Option<Lay> },
}

impl Plan {
    pub(crate) fn variant(&self) -> Variant {
        match *self {
            Plan::Vec { scalar, wide, .. } => Variant::Vec { scalar, wide },
            Plan::Contig { wide, .. } => Variant::Contig { wide },
            Plan::Rows { vec, scalar, wide, ref outer, .. } => {
                Variant::Rows { vec, scalar, wide, deep: outer.is_some() }
            }
        }
    }
}

/// Elements per vector of a map with these operand and output element sizes: 16 bytes of
/// the widest.
pub(crate) fn vec_width(sizes: impl IntoIterator<Item = usize>, out_size: usize) -> usize {
    (16 / sizes.into_iter().chain([out_size]).max().unwrap_or(1)).max(1)
}

/// Picks the kernel for a map over `shape` (see the module doc). `out_addr` is the
/// output's buffer address (its layout is row-major).
pub(crate) fn plan(ops: &[Operand<'_>], shape: &[usize], out_size: usize, out_addr: u64) -> Result<Plan> {
    let n: usize = shape.iter().product();
    let vn = vec_width(ops.iter().map(|o| o.size), out_size);
    // The usual case needs no layout work: each input is a contiguous array of the
    // output's shape (run stride 1) or one element (a broadcast scalar, run stride 0).
    let mut st = [0i64; 3];
    let quick = ops.iter().zip(&mut st).all(|(o, s)| {
        let l = o.layout;
        *s = (l.numel() != 1) as i64;
        l.numel() == 1 || (l.shape[..] == *shape && l.is_contiguous())
    });
    if quick {
        return Ok(linear(ops, st, n, vn, out_size, out_addr));
    }
    let lays: SmallVec<[Layout; 3]> = ops.iter().map(|o| o.layout.broadcast_to(shape)).collect();
    let strides: SmallVec<[&[isize]; 3]> = lays.iter().map(|l| &l.strides[..]).collect();
    let (dims, mst) = merge_dims(shape, &strides);
    if dims.len() <= 1 {
        for (o, s) in st.iter_mut().enumerate().take(ops.len()) {
            *s = mst[o].first().map_or(0, |&s| s as i64);
        }
        return Ok(linear(ops, st, n, vn, out_size, out_addr));
    }
    if dims.len() > MAX_DIMS {
        return Err(super::unsupported(
            "elementwise",
            format!("strided inputs of rank {} after merging axes (at most {MAX_DIMS})", dims.len()),
        ));
    }
    // Rows of the last merged axis; the axes before it give each row's start.
    let nd = dims.len();
    let mut cst = [[0i64; 2]; 3];
    for (o, s) in cst.iter_mut().enumerate().take(ops.len()) {
        *s = [if nd == 2 { mst[o][0] as i64 } else { 0 }, mst[o][nd - 1] as i64];
    }
    let outer = (nd > 2).then(|| {
        let mut lay = Lay { shape: [1; MAX_DIMS], st: [[0; MAX_DIMS]; 3], off: [0; 3], ndim: (nd - 1) as i32, pad: 0 };
        for (d, &s) in dims[..nd - 1].iter().enumerate() {
            lay.shape[d] = s as i64;
            for o in 0..ops.len() {
                lay.st[o][d] = mst[o][d] as i64;
            }
        }
        lay
    });
    let r = dims[..nd - 1].iter().product();
    Ok(rows(ops, r, dims[nd - 1], cst, outer, vn, out_size, out_addr))
}

/// The plan of a map whose operands each advance by `st[o]` per element: `k_vec` when
/// every stride is 0 or 1 and every run (and the output) is vector-aligned.
fn linear(ops: &[Operand<'_>], st: [i64; 3], n: usize, vn: usize, out_size: usize, out_addr: u64) -> Plan {
    let st_k = &st[..ops.len()];
    let aligned = vn > 1
        && out_addr.is_multiple_of((out_size * vn) as u64)
        && ops.iter().zip(st_k).all(|(o, &s)| s == 0 || (s == 1 && o.first() % (o.size * vn) as u64 == 0));
    if aligned {
        let scalar = st_k.iter().enumerate().fold(0u8, |m, (o, &s)| m | (((s == 0) as u8) << o));
        return Plan::Vec { scalar, n, wide: n as u64 > NARROW };
    }
    let reach = |s: i64| (n as u64 - 1).saturating_mul(s.unsigned_abs());
    let wide = n as u64 > NARROW || st_k.iter().any(|&s| s < 0 || reach(s) > NARROW);
    Plan::Contig { st, n, wide }
}

/// The plan of a map over `r` rows of `c` elements, operand `o` at `r * st[o][0] + c *
/// st[o][1]` (or, with `outer`, a row start from the outer axes): vectors along the
/// columns when every column stride is 0 or 1 and every row start (and the output's) is
/// vector-aligned.
#[allow(clippy::too_many_arguments)]
fn rows(
    ops: &[Operand<'_>],
    r: usize,
    c: usize,
    st: [[i64; 2]; 3],
    outer: Option<Lay>,
    vn: usize,
    out_size: usize,
    out_addr: u64,
) -> Plan {
    let st_k = &st[..ops.len()];
    // Each operand's row strides: one, or one per outer axis.
    let row_strides = |o: usize| -> SmallVec<[(usize, i64); MAX_DIMS]> {
        match &outer {
            Some(l) => (0..l.ndim as usize).map(|d| (l.shape[d] as usize, l.st[o][d])).collect(),
            None => smallvec::smallvec![(r, st[o][0])],
        }
    };
    let vec = vn > 1
        && c.is_multiple_of(vn)
        && out_addr.is_multiple_of((out_size * vn) as u64)
        && ops.iter().zip(st_k).enumerate().all(|(i, (o, &[_, sc]))| {
            sc == 0
                || (sc == 1
                    && row_strides(i).iter().all(|&(_, s)| s % vn as i64 == 0)
                    && o.first() % (o.size * vn) as u64 == 0)
        });
    let scalar = if vec { st_k.iter().enumerate().fold(0u8, |m, (o, s)| m | (((s[1] == 0) as u8) << o)) } else { 0 };
    // Offsets are formed from each operand's first element: a negative stride needs i64.
    let reach = |o: usize| {
        row_strides(o).iter().fold((c as u64 - 1).saturating_mul(st[o][1].unsigned_abs()), |a, &(d, s)| {
            a.saturating_add((d as u64 - 1).saturating_mul(s.unsigned_abs()))
        })
    };
    let negative = |o: usize| st[o][1] < 0 || row_strides(o).iter().any(|&(_, s)| s < 0);
    let wide = (r as u64).saturating_mul(c as u64) > NARROW || (0..ops.len()).any(|o| negative(o) || reach(o) > NARROW);
    // The innermost row axis against the columns: a transposed operand wants square tiles.
    let tile = (0..ops.len()).any(|o| {
        let sr = row_strides(o).last().map_or(0, |&(_, s)| s);
        st[o][1].unsigned_abs() > sr.unsigned_abs().max(1)
    });
    Plan::Rows { r, c, st, vec, scalar, wide, tile, outer }
}

/// The launch shape of `k_rows` over `r` rows of `items` column items (vectors or
/// elements): (threads along a row, rows of threads, log2 of the items each thread takes
/// along its row, blocks along the rows, blocks along the columns). A thread's
/// `VEC_UNROLL` items lie along its row when rows are long, else down the column (so a
/// short row still gives a warp whole rows to read contiguously). `tile` asks for tiles
/// of up to 32 rows by 32 items, so that a transposed operand's cache lines serve the
/// whole block; with fewer rows the tile widens instead of idling threads.
fn rows_geometry(r: usize, items: usize, tile: bool) -> (u32, u32, u32, u32, u32) {
    let (bx, lgc) = if tile {
        let th = r.next_power_of_two().min(32);
        let ur = th.min(VEC_UNROLL);
        let bx = (BLOCK as usize / (th / ur)).min(items.next_power_of_two());
        (bx, (VEC_UNROLL / ur).ilog2())
    } else {
        let bx = items.next_power_of_two().min(BLOCK as usize);
        (bx, (items / bx).clamp(1, VEC_UNROLL).ilog2())
    };
    let by = BLOCK as usize / bx;
    let (uc, ur) = (1usize << lgc, VEC_UNROLL >> lgc);
    let gx = r.div_ceil(by * ur).clamp(1, MAX_BLOCKS);
    let gy = items.div_ceil(bx * uc).clamp(1, 65535);
    (bx as u32, by as u32, lgc, gx as u32, gy as u32)
}

/// Vector types of `VN` elements loaded and stored as one access of their size (up to 16
/// bytes); the union keeps the elements addressable without a copy.
const VEC_TYPES: &str = r#"
template <int B> struct RawT;
template <> struct RawT<1> { typedef u8 t; };
template <> struct RawT<2> { typedef u16 t; };
template <> struct RawT<4> { typedef u32 t; };
template <> struct RawT<8> { typedef u64 t; };
struct alignas(16) u32x4 { u32 a, b, c, d; };
template <> struct RawT<16> { typedef u32x4 t; };
template <typename T, int N> union V { T v[N]; typename RawT<sizeof(T) * N>::t raw; };
template <typename T, int N> __device__ __forceinline__ V<T, N> vld(const T* p) { V<T, N> x; x.raw = *(const typename RawT<sizeof(T) * N>::t*)p; return x; }
template <typename T, int N> __device__ __forceinline__ void vst(T* p, const V<T, N>& x) { *(typename RawT<sizeof(T) * N>::t*)p = x.raw; }
"#;

/// The source of one map kernel: `variant` of `fop` (defined by `fsrc`) with output C
/// type `out_t`, input C types `ins` and `vec` elements per vector.
pub(crate) fn kernel_source(fsrc: &str, out_t: &str, ins: &[&str], vec: usize, variant: Variant) -> String {
    let k = ins.len();
    let params: String = ins.iter().enumerate().map(|(i, t)| format!(", const {t}* __restrict__ a{i}")).collect();
    let call = |f: &dyn Fn(usize) -> String| (0..k).map(f).collect::<Vec<_>>().join(", ");
    let ix = |wide: bool| if wide { "i64" } else { "u32" };
    let unr = if matches!(variant, Variant::Vec { .. }) { vec_unroll(vec) } else { VEC_UNROLL };
    let head = format!("{PRELUDE}\n{fsrc}\n#define VN {vec}\n#define UNR {unr}\n{VEC_TYPES}");
    let body = match variant {
        Variant::Vec { scalar, wide } => {
            let is_s = |i: usize| scalar & (1 << i) != 0;
            let ix = ix(wide);
            let splat: String = ins
                .iter()
                .enumerate()
                .filter(|&(i, _)| is_s(i))
                .map(|(i, t)| format!("const {t} sc{i} = a{i}[0]; "))
                .collect();
            let decls: String = ins
                .iter()
                .enumerate()
                .filter(|&(i, _)| !is_s(i))
                .map(|(i, t)| format!("V<{t}, VN> x{i}[UNR]; "))
                .collect();
            let loads: String = ins
                .iter()
                .enumerate()
                .filter(|&(i, _)| !is_s(i))
                .map(|(i, t)| format!("x{i}[u] = vld<{t}, VN>(a{i} + t * VN); "))
                .collect();
            let vcall = call(&|i| if is_s(i) { format!("sc{i}") } else { format!("x{i}[u].v[j]") });
            let tcall = call(&|i| if is_s(i) { format!("sc{i}") } else { format!("a{i}[r]") });
            format!(
                r#"// Each block step covers UNR * blockDim.x consecutive vectors: every thread first issues
// its UNR vector loads per operand, then computes and stores them. Scalars are read once.
extern "C" __global__ void k_vec({out_t}* __restrict__ out{params}, {ix} n) {{
    {splat}
    {ix} nv = n / VN;
    {ix} step = ({ix})gridDim.x * blockDim.x * UNR;
    for ({ix} base = ({ix})blockIdx.x * blockDim.x * UNR + threadIdx.x; base < nv; base += step) {{
        {decls}
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            {ix} t = base + ({ix})u * blockDim.x;
            if (t < nv) {{ {loads} }}
        }}
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            {ix} t = base + ({ix})u * blockDim.x;
            if (t < nv) {{
                V<{out_t}, VN> ov;
#pragma unroll
                for (int j = 0; j < VN; ++j) ov.v[j] = fop({vcall});
                vst<{out_t}, VN>(out + t * VN, ov);
            }}
        }}
    }}
    {ix} r = nv * VN + ({ix})blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n) out[r] = fop({tcall});
}}
"#
            )
        }
        Variant::Contig { wide } => {
            let ix = ix(wide);
            let sparams: String = (0..k).map(|i| format!(", {ix} st{i}")).collect();
            let decls: String = ins.iter().enumerate().map(|(i, t)| format!("{t} x{i}[UNR]; ")).collect();
            let loads: String = (0..k).map(|i| format!("x{i}[u] = a{i}[i * st{i}]; ")).collect();
            let ucall = call(&|i| format!("x{i}[u]"));
            format!(
                r#"extern "C" __global__ void k_contig({out_t}* __restrict__ out{params}{sparams}, {ix} n) {{
    {ix} step = ({ix})gridDim.x * blockDim.x * UNR;
    for ({ix} base = ({ix})blockIdx.x * blockDim.x * UNR + threadIdx.x; base < n; base += step) {{
        {decls}
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            {ix} i = base + ({ix})u * blockDim.x;
            if (i < n) {{ {loads} }}
        }}
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            {ix} i = base + ({ix})u * blockDim.x;
            if (i < n) out[i] = fop({ucall});
        }}
    }}
}}
"#
            )
        }
        Variant::Rows { vec, scalar, wide, deep } => rows_source(out_t, ins, &params, vec, scalar, wide, deep),
    };
    format!("{head}{body}")
}

/// The body of `k_rows` (see [`kernel_source`]): `vec` walks `VN`-element vectors along a
/// row (operands of `scalar` read one element per row), else single elements; `deep`
/// finds a row's start in each operand from its coordinates on the outer axes of `rl`.
fn rows_source(out_t: &str, ins: &[&str], params: &str, vec: bool, scalar: u8, wide: bool, deep: bool) -> String {
    let k = ins.len();
    let ix = if wide { "i64" } else { "u32" };
    let is_s = |i: usize| vec && scalar & (1 << i) != 0;
    let call = |f: &dyn Fn(usize) -> String| (0..k).map(f).collect::<Vec<_>>().join(", ");
    let rparams: String = if deep { ", Lay rl".to_string() } else { (0..k).map(|i| format!(", {ix} sr{i}")).collect() };
    let cparams: String = if vec { String::new() } else { (0..k).map(|i| format!(", {ix} sc{i}")).collect() };
    let decls: String = ins
        .iter()
        .enumerate()
        .map(|(i, t)| if vec && !is_s(i) { format!("V<{t}, VN> x{i}[UNR]; ") } else { format!("{t} x{i}[UNR]; ") })
        .collect();
    // Each operand's row start: a stride times the row, or the sum over the outer axes.
    let starts = if deep {
        let zero: String = (0..k).map(|i| format!("{ix} p{i} = 0; ")).collect();
        let acc: String = (0..k).map(|i| format!("p{i} += q * ({ix})rl.st[{i}][d]; ")).collect();
        format!(
            "{zero}{{ {ix} rem = r; for (int d = rl.ndim - 1; d >= 0; --d) {{ {ix} s = ({ix})rl.shape[d]; {ix} w = rem / s; {ix} q = rem - w * s; rem = w; {acc}}} }} "
        )
    } else {
        (0..k).map(|i| format!("{ix} p{i} = r * sr{i}; ")).collect()
    };
    let loads: String = (0..k)
        .map(|i| match (vec, is_s(i)) {
            (true, true) => format!("x{i}[u] = a{i}[p{i}]; "),
            (true, false) => format!("x{i}[u] = vld<{}, VN>(a{i} + p{i} + t * VN); ", ins[i]),
            _ => format!("x{i}[u] = a{i}[p{i} + t * sc{i}]; "),
        })
        .collect();
    let store = if vec {
        let vcall = call(&|i| if is_s(i) { format!("x{i}[u]") } else { format!("x{i}[u].v[j]") });
        format!(
            "V<{out_t}, VN> ov;\n#pragma unroll\n                    for (int j = 0; j < VN; ++j) ov.v[j] = fop({vcall});\n                    vst<{out_t}, VN>(out + r * C + t * VN, ov);"
        )
    } else {
        format!("out[r * C + t] = fop({});", call(&|i| format!("x{i}[u]")))
    };
    let per = if vec { "VN" } else { "1" };
    format!(
        r#"// A 2-D grid of tiles over R rows of C elements: no division per element. Each thread
// takes UNR items (vectors, or elements) of its tile, `1 << lgc` of them along its row
// and the rest down its column, issues all their loads first, then computes and stores.
extern "C" __global__ void k_rows({out_t}* __restrict__ out{params}{rparams}{cparams}, {ix} R, {ix} C, int lgc) {{
    const {ix} nc = C / {per};
    const int uc = 1 << lgc;
    const {ix} rt = ({ix})blockDim.y * (UNR >> lgc);
    const {ix} ct = ({ix})blockDim.x * uc;
    for ({ix} r0 = ({ix})blockIdx.x * rt + threadIdx.y; r0 < R; r0 += ({ix})gridDim.x * rt) {{
        for ({ix} c0 = ({ix})blockIdx.y * ct + threadIdx.x; c0 < nc; c0 += ({ix})gridDim.y * ct) {{
            {decls}
#pragma unroll
            for (int u = 0; u < UNR; ++u) {{
                {ix} r = r0 + ({ix})(u >> lgc) * blockDim.y;
                {ix} t = c0 + ({ix})(u & (uc - 1)) * blockDim.x;
                if (r < R && t < nc) {{ {starts}{loads} }}
            }}
#pragma unroll
            for (int u = 0; u < UNR; ++u) {{
                {ix} r = r0 + ({ix})(u >> lgc) * blockDim.y;
                {ix} t = c0 + ({ix})(u & (uc - 1)) * blockDim.x;
                if (r < R && t < nc) {{
                    {store}
                }}
            }}
        }}
    }}
}}
"#
    )
}

/// The axis order a map's output follows (outermost first, size-1 axes leading) when it
/// is not row-major: every operand of the full shape (no broadcast axis) is dense in that
/// one order, a permutation of row-major with positive strides, and none is row-major.
/// `None` otherwise (a contiguous operand, a stepped or overlapping view, operands dense
/// in different orders, fewer than two axes).
pub(crate) fn follow_order<'a>(layouts: impl IntoIterator<Item = &'a Layout>, shape: &[usize]) -> Option<Dims> {
    let nd = shape.len();
    // An empty map has nothing to order (and a size-0 axis is in neither group below).
    if nd < 2 || shape.contains(&0) {
        return None;
    }
    let mut order: Option<Dims> = None;
    for l in layouts {
        if l.shape[..] != *shape {
            continue;
        }
        // Checked first: the common operand, and full (no axis is empty here).
        if l.is_contiguous() {
            return None;
        }
        if (0..nd).any(|a| shape[a] > 1 && l.strides[a] == 0) {
            continue; // broadcast along an axis: it does not vote
        }
        let mut axes: Dims = (0..nd).filter(|&a| shape[a] > 1).collect();
        if axes.iter().any(|&a| l.strides[a] <= 0) {
            return None;
        }
        axes.sort_by_key(|&a| std::cmp::Reverse(l.strides[a]));
        let mut want = 1isize;
        for &a in axes.iter().rev() {
            if l.strides[a] != want {
                return None;
            }
            want *= shape[a] as isize;
        }
        match &order {
            Some(o) if *o != axes => return None,
            _ => order = Some(axes),
        }
    }
    let axes = order?;
    Some((0..nd).filter(|&a| shape[a] == 1).chain(axes).collect())
}

/// Runs `fop` (defined by `fsrc`, with the parameter types of `ins`) over `shape`,
/// writing a new storage of `out_dtype`: row-major, or in the operands' own axis order
/// ([`follow_order`]) unless `what` is a copy. `what`, `out_dtype`, the input dtypes and
/// the kernel variant identify the kernel: `fsrc` runs (and a key is formatted) only the
/// first time a device needs it.
pub(crate) fn map(
    cs: &GpuStream<'_>,
    what: MapFn,
    fsrc: impl FnOnce() -> String,
    out_dtype: DType,
    ins: &[In<'_>],
    shape: &[usize],
) -> Result<Storage> {
    let order = if what == MapFn::Copy { None } else { follow_order(ins.iter().map(|i| &i.s.layout), shape) };
    let Some(perm) = order else {
        return map_row_major(cs, what, fsrc, out_dtype, ins, shape);
    };
    // The same map over the axes in memory order: every full operand is contiguous there.
    let phys: Dims = perm.iter().map(|&a| shape[a]).collect();
    let views: SmallVec<[Storage; 3]> =
        ins.iter().map(|i| i.s.with_layout(i.s.layout.broadcast_to(shape).permute(&perm))).collect();
    let pins: SmallVec<[In<'_>; 3]> =
        views.iter().zip(ins).map(|(s, i)| In { s, ctype: i.ctype, size: i.size }).collect();
    let out = map_row_major(cs, what, fsrc, out_dtype, &pins, &phys)?;
    let mut inverse: Dims = smallvec::smallvec![0; perm.len()];
    for (j, &a) in perm.iter().enumerate() {
        inverse[a] = j;
    }
    let layout = out.layout.permute(&inverse);
    Ok(out.with_layout(layout))
}

/// [`map`] with a row-major output.
fn map_row_major(
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
    let ops: SmallVec<[Operand<'_>; 3]> = ins
        .iter()
        .map(|i| Operand { layout: &i.s.layout, size: i.size, addr: cuda_of(i.s).map(|b| b.ptr()).unwrap_or(0) })
        .collect();
    let plan = plan(&ops, shape, out_dtype.size(), out_ptr)?;
    let variant = plan.variant();
    let vec = vec_width(ins.iter().map(|i| i.size), out_dtype.size());
    let dev = &cs.dev;
    let mut in_dtypes = [None; 3];
    for (slot, i) in in_dtypes.iter_mut().zip(ins) {
        *slot = Some(i.s.dtype);
    }
    // The raw handle, copied out under the lock (no reference count per launch): the
    // module stays loaded for the life of the process (see `Launch`).
    let func = {
        let memo = (what, out_dtype, in_dtypes, variant);
        let here = std::sync::Arc::as_ptr(dev) as usize;
        let remember = |f: sys::CUfunction| {
            let _ = LAST_MAP.try_with(|c| c.set(Some((here, memo, f))));
            f
        };
        match LAST_MAP.try_with(|c| c.get()) {
            Ok(Some((d, k, f))) if d == here && k == memo => f,
            _ => {
                let known = dev.map_fns.lock().get(&memo).map(|f| f.cu_function());
                match known {
                    Some(f) => remember(f),
                    None => {
                        let types: Vec<&str> = ins.iter().map(|i| i.ctype).collect();
                        // Keyed by dtype, not C type: f16/bf16 (and bool/u8) share a C type but not code.
                        let dtypes: Vec<&str> = ins.iter().map(|i| i.s.dtype.name()).collect();
                        let full_key = format!(
                            "{}|{}|{}|{}|{}",
                            what.name(),
                            out_dtype.name(),
                            types.join(","),
                            dtypes.join(","),
                            variant.tag()
                        );
                        let f = nvrtc::function(cs.driver(), dev, &full_key, variant.func(), || {
                            kernel_source(&fsrc(), out_t, &types, vec, variant)
                        })?;
                        let raw = f.cu_function();
                        dev.map_fns.lock().insert(memo, f);
                        remember(raw)
                    }
                }
            }
        }
    };
    // No context binding here: `Launch::launch` binds when it sends a launch directly, and
    // a recorded launch needs none until its batch sends it.
    let mut b = Launch::raw(func);
    b.arg(&out_ptr);
    for o in &ops {
        b.arg(&o.first());
    }
    let steps = |items: usize, unr: usize| {
        let blocks = items.div_ceil(BLOCK as usize * unr).clamp(1, MAX_BLOCKS) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    };
    let cfg = match &plan {
        Plan::Vec { n, wide, .. } => {
            index_arg(&mut b, *wide, *n as i64);
            // One block step per block: no grid-stride loop for any realistic size.
            steps(n / vec, vec_unroll(vec))
        }
        Plan::Contig { st, n, wide } => {
            for &s in &st[..ins.len()] {
                index_arg(&mut b, *wide, s);
            }
            index_arg(&mut b, *wide, *n as i64);
            steps(*n, VEC_UNROLL)
        }
        Plan::Rows { r, c, st, vec: v, wide, tile, outer, .. } => {
            match outer {
                Some(lay) => {
                    b.arg(lay);
                }
                None => st[..ins.len()].iter().for_each(|s| index_arg(&mut b, *wide, s[0])),
            }
            if !v {
                st[..ins.len()].iter().for_each(|s| index_arg(&mut b, *wide, s[1]));
            }
            index_arg(&mut b, *wide, *r as i64);
            index_arg(&mut b, *wide, *c as i64);
            let items = if *v { c / vec } else { *c };
            let (bx, by, lgc, gx, gy) = rows_geometry(*r, items, *tile);
            b.arg(&(lgc as i32));
            LaunchConfig { grid_dim: (gx, gy, 1), block_dim: (bx, by, 1), shared_mem_bytes: 0 }
        }
    };
    // SAFETY: the arguments match the generated signature of the plan's variant; every
    // offset the plan produces lies inside its operand's buffer (views are checked by the
    // op layer, and the plan only regroups the view's own offsets), and vector accesses
    // are only planned on aligned addresses.
    unsafe { b.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

/// Adds an index argument of a kernel: i64 when `wide`, else u32 (the plan checked it fits).
fn index_arg(b: &mut Launch, wide: bool, v: i64) {
    if wide {
        b.arg(&v);
    } else {
        b.arg(&(v as u32));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    /// A small deterministic generator (xorshift), for the backend's generated tests.
    pub(crate) struct Gen(pub u64);
    impl Gen {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The element offset operand `o` reads for output element `i`, from its layout.
    fn true_offset(l: &Layout, shape: &[usize], i: usize) -> i64 {
        let b = l.broadcast_to(shape);
        let mut r = i;
        let mut off = b.offset as i64;
        for d in (0..shape.len()).rev() {
            off += (r % shape[d]) as i64 * b.strides[d] as i64;
            r /= shape[d];
        }
        off
    }

    /// The element offsets (from each operand's buffer start) the planned kernel reads for
    /// each output element, computed as the kernel computes them; narrow plans are checked
    /// to stay below 2^31 at every step.
    fn planned_offsets(p: &Plan, ops: &[Operand<'_>], n: usize) -> Vec<Vec<i64>> {
        let first: Vec<i64> = ops.iter().map(|o| o.layout.offset as i64).collect();
        let narrow = |wide: bool, v: i64| {
            assert!(wide || (0..=NARROW as i64).contains(&v), "{p:?}: narrow index {v} out of range");
            v
        };
        (0..n)
            .map(|i| {
                (0..ops.len())
                    .map(|o| match p {
                        Plan::Vec { scalar, wide, .. } => {
                            narrow(*wide, i as i64);
                            if scalar & (1 << o) != 0 { first[o] } else { first[o] + i as i64 }
                        }
                        Plan::Contig { st, wide, .. } => first[o] + narrow(*wide, i as i64 * st[o]),
                        Plan::Rows { c, st, wide, vec, scalar, .. } => {
                            let (r, col) = ((i / c) as i64, (i % c) as i64);
                            narrow(*wide, i as i64);
                            if *vec {
                                // Column strides the vector kernel assumes: 0 (masked) or 1.
                                assert_eq!(st[o][1], (scalar & (1 << o) == 0) as i64, "{p:?}");
                            }
                            first[o] + narrow(*wide, narrow(*wide, row_start(p, o, r)) + narrow(*wide, col * st[o][1]))
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Where row `r` of a `Rows` plan starts in operand `o` (from its first element), as
    /// the kernel forms it: a stride times the row, or the outer coordinates' sum.
    fn row_start(p: &Plan, o: usize, r: i64) -> i64 {
        let Plan::Rows { st, outer, .. } = p else { unreachable!() };
        match outer {
            None => r * st[o][0],
            Some(l) => {
                let (mut rem, mut at) = (r, 0);
                for d in (0..l.ndim as usize).rev() {
                    at += (rem % l.shape[d]) * l.st[o][d];
                    rem /= l.shape[d];
                }
                assert_eq!(rem, 0, "{p:?}: row {r} past the outer axes");
                at
            }
        }
    }

    /// The claims a plan's vector accesses rest on: aligned first elements and output.
    fn check_alignment(p: &Plan, ops: &[Operand<'_>], vn: usize, out_size: usize, out_addr: u64) {
        if let Plan::Vec { scalar, .. } = p {
            assert_eq!(out_addr % (out_size * vn) as u64, 0, "{p:?}");
            for (o, op) in ops.iter().enumerate() {
                if scalar & (1 << o) == 0 {
                    assert_eq!(op.first() % (op.size * vn) as u64, 0, "{p:?}: operand {o}");
                }
            }
        }
        if let Plan::Rows { r, c, vec: true, scalar, .. } = p {
            // Every vector the kernel reads or writes starts on a 16-byte boundary.
            assert_eq!(c % vn, 0, "{p:?}");
            for row in 0..*r as u64 {
                assert_eq!((out_addr + row * (c * out_size) as u64) % (out_size * vn) as u64, 0, "{p:?}");
                for (o, op) in ops.iter().enumerate() {
                    if scalar & (1 << o) == 0 {
                        let at = op.first() as i64 + row_start(p, o, row as i64) * op.size as i64;
                        assert_eq!(at % (op.size * vn) as i64, 0, "{p:?}: operand {o} row {row}");
                    }
                }
            }
        }
    }

    /// One generated operand layout for output `shape`: full, a slice at an offset, a
    /// transposed or stepped view, or a broadcast (size-1 axes, fewer axes, a scalar).
    fn operand_layout(g: &mut Gen, shape: &[usize]) -> Layout {
        let nd = shape.len();
        match g.below(8) {
            0 => Layout::contiguous(shape),
            1 => {
                // A contiguous block at an offset of 0..3 elements (misaligned for vectors).
                let mut l = Layout::contiguous(shape);
                l.offset = g.below(4);
                l
            }
            2 if nd >= 2 => {
                // A transposed contiguous array (last two axes swapped).
                let mut t: Vec<usize> = shape.to_vec();
                t.swap(nd - 1, nd - 2);
                let mut perm: Vec<usize> = (0..nd).collect();
                perm.swap(nd - 1, nd - 2);
                Layout::contiguous(&t).permute(&perm)
            }
            3 => {
                // A stepped slice: every other element of the last axis, rows padded.
                let mut big: Vec<usize> = shape.to_vec();
                if let Some(l) = big.last_mut() {
                    *l = *l * 2 + 1;
                }
                let mut l = Layout::contiguous(&big);
                if let Some(s) = l.strides.last_mut() {
                    *s *= 2;
                }
                l.shape = shape.iter().copied().collect();
                l.offset = g.below(2);
                l
            }
            4 => {
                // Size-1 axes where the output has others (broadcast), each kept with p=1/2.
                let s: Vec<usize> = shape.iter().map(|&d| if g.below(2) == 0 { 1 } else { d }).collect();
                let mut l = Layout::contiguous(&s);
                l.offset = g.below(2);
                l
            }
            6 if nd >= 1 => {
                // A column slice of wider rows (a pitch of 1..8 extra elements, so rows
                // start aligned for vectors only now and then).
                let mut big: Vec<usize> = shape.to_vec();
                big[nd - 1] += 1 + g.below(8);
                let mut l = Layout::contiguous(&big);
                l.shape = shape.iter().copied().collect();
                l.offset = g.below(2);
                l
            }
            5 => {
                // Fewer leading axes (a row, or the last k axes).
                let k = g.below(nd + 1);
                Layout::contiguous(&shape[nd - k..])
            }
            _ => Layout::contiguous(&[]),
        }
    }

    fn shape(g: &mut Gen) -> Vec<usize> {
        let nd = 1 + g.below(4);
        (0..nd)
            .map(|_| match g.below(6) {
                0 => 1,
                1 => 1 + g.below(3),
                2 => 8,
                3 => 16 + g.below(3),
                _ => 1 + g.below(40),
            })
            .collect()
    }

    /// Every generated layout: the plan reads exactly the elements the layouts name, its
    /// vector accesses are aligned and its narrow arithmetic fits.
    #[test]
    fn plan_addresses_what_the_layouts_name() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let mut seen: HashMap<String, usize> = HashMap::default();
        let sizes = [1usize, 2, 4, 8];
        for case in 0..4000 {
            let shape = shape(&mut g);
            let n: usize = shape.iter().product();
            let k = 1 + g.below(3);
            let lays: Vec<Layout> = (0..k).map(|_| operand_layout(&mut g, &shape)).collect();
            let size = sizes[g.below(4)];
            let out_size = if g.below(4) == 0 { 1 } else { size };
            // Buffer bases are 256-aligned except now and then (a suballocation).
            let addrs: Vec<u64> = (0..k).map(|_| 1 << 20 | if g.below(8) == 0 { size as u64 } else { 0 }).collect();
            let ops: Vec<Operand<'_>> =
                lays.iter().zip(&addrs).map(|(l, &a)| Operand { layout: l, size, addr: a }).collect();
            let out_addr = 1u64 << 24;
            let p = plan(&ops, &shape, out_size, out_addr).unwrap();
            let vn = vec_width(ops.iter().map(|o| o.size), out_size);
            *seen.entry(format!("{:?}", p.variant())).or_default() += 1;
            check_alignment(&p, &ops, vn, out_size, out_addr);
            let got = planned_offsets(&p, &ops, n);
            for (i, offs) in got.iter().enumerate() {
                for (o, &off) in offs.iter().enumerate() {
                    assert_eq!(
                        off,
                        true_offset(&lays[o], &shape, i),
                        "case {case}: shape {shape:?} operand {o} {:?} element {i}: {p:?}",
                        lays[o]
                    );
                }
            }
        }
        println!("{seen:?}");
        let rows = |vec: bool| if vec { "Rows { vec: true" } else { "Rows { vec: false" };
        let mut kinds = vec![("Vec", None), ("Contig", None)];
        for (vec, deep) in [(true, false), (true, true), (false, false), (false, true)] {
            kinds.push((rows(vec), Some(deep)));
        }
        for (v, deep) in kinds {
            let hit = |k: &String| k.starts_with(v) && deep.is_none_or(|d| k.contains(&format!("deep: {d}")));
            assert!(seen.keys().any(hit), "no case planned {v} (deep {deep:?}): {seen:?}");
        }
    }

    fn op(l: &Layout, size: usize) -> Operand<'_> {
        Operand { layout: l, size, addr: 1 << 20 }
    }

    /// The patterns named in the module doc get their kernels.
    #[test]
    fn plan_picks_the_kernel_of_each_pattern() {
        let out = 1u64 << 24;
        for n in [1usize, 3, 4, 7, 1000, 1 << 20] {
            let full = Layout::contiguous(&[n]);
            let scalar = Layout::contiguous(&[]);
            let one = Layout::contiguous(&[1]);
            let mut sliced = Layout::contiguous(&[n]);
            sliced.offset = 1;
            // A one-element operand is a scalar too.
            let f = (n == 1) as u8;
            for size in [1, 2, 4, 8] {
                let p = plan(&[op(&full, size), op(&scalar, size)], &[n], size, out).unwrap();
                assert_eq!(p, Plan::Vec { scalar: 0b10 | f, n, wide: false }, "[{n}] op []");
                let p = plan(&[op(&one, size), op(&full, size)], &[n], size, out).unwrap();
                assert_eq!(p.variant(), Variant::Vec { scalar: 0b01 | f << 1, wide: false }, "[1] op [{n}]");
                let p = plan(&[op(&full, size)], &[n], size, out).unwrap();
                assert_eq!(p.variant(), Variant::Vec { scalar: f, wide: false });
                if n == 1 {
                    continue;
                }
                // A misaligned run (a slice from element 1).
                let p = plan(&[op(&sliced, size), op(&full, size)], &[n], size, out).unwrap();
                assert_eq!(p, Plan::Contig { st: [1, 1, 0], n, wide: false });
                // A stepped 1-d view.
                let mut step = Layout::contiguous(&[2 * n]);
                step.strides[0] = 2;
                step.shape[0] = n;
                let p = plan(&[op(&step, size)], &[n], size, out).unwrap();
                assert_eq!(p.variant(), Variant::Contig { wide: false });
                // A reversed view is wide (negative stride).
                let mut rev = Layout::contiguous(&[n]);
                rev.strides[0] = -1;
                rev.offset = n - 1;
                let p = plan(&[op(&rev, size)], &[n], size, out).unwrap();
                assert_eq!(p.variant(), Variant::Contig { wide: n > 1 });
            }
        }
        // Past 2^31 elements the arithmetic is i64.
        let big = Layout::contiguous(&[1 << 31]);
        assert_eq!(plan(&[op(&big, 1)], &[1 << 31], 1, out).unwrap().variant(), Variant::Vec { scalar: 0, wide: true });
        // A misaligned output (never from `new_storage`, but planned for) takes no vectors.
        let full = Layout::contiguous(&[64]);
        assert_eq!(plan(&[op(&full, 4)], &[64], 4, out + 4).unwrap().variant(), Variant::Contig { wide: false });
    }

    /// Two-axis layouts get `k_rows`: vectors when every column stride is 0 or 1 and rows
    /// are aligned, elements otherwise; narrow unless a count, a reach or a stride forbids.
    #[test]
    fn plan_picks_rows_for_two_axes() {
        let out = 1u64 << 24;
        let rows =
            |ops: &[Operand<'_>], shape: &[usize], out_size: usize, out: u64| match plan(ops, shape, out_size, out)
                .unwrap()
            {
                Plan::Rows { vec, scalar, wide, tile, st, .. } => (vec, scalar, wide, tile, st),
                p => panic!("{shape:?}: {p:?}"),
            };
        for size in [1usize, 2, 4, 8] {
            let vn = 16 / size;
            for (r, c) in [(3usize, 16usize), (1000, 64), (1 << 18, 4096), (2, 1 << 20), (1 << 20, 16)] {
                let full = Layout::contiguous(&[r, c]);
                let row = Layout::contiguous(&[c]);
                let col = Layout::contiguous(&[r, 1]);
                let one_row = Layout::contiguous(&[1, c]);
                let sh = [r, c];
                // Row, column and outer broadcasts: vectors, the column operand splat per row.
                assert_eq!(
                    rows(&[op(&full, size), op(&row, size)], &sh, size, out),
                    (true, 0, false, false, [[c as i64, 1], [0, 1], [0, 0]])
                );
                assert_eq!(
                    rows(&[op(&full, size), op(&col, size)], &sh, size, out),
                    (true, 0b10, false, false, [[c as i64, 1], [1, 0], [0, 0]])
                );
                assert_eq!(
                    rows(&[op(&col, size), op(&one_row, size)], &sh, size, out),
                    (true, 0b01, false, false, [[1, 0], [0, 1], [0, 0]])
                );
                // `where` with a column condition and row values.
                let cond = Layout::contiguous(&[r, 1]);
                let got = rows(&[op(&cond, 1), op(&row, size), op(&row, size)], &sh, size, out);
                assert_eq!((got.0, got.1, got.2), (true, 0b001, false));
                // A column slice of wider rows: vectors only when the row pitch is a whole vector.
                for (pitch, ok) in [(c + vn, vn > 1), (c + 1, false)] {
                    let mut slice = Layout::contiguous(&[r, pitch]);
                    slice.shape[1] = c;
                    assert_eq!(rows(&[op(&slice, size)], &sh, size, out).0, ok, "pitch {pitch}");
                }
                // A step on the outer axis (every other row).
                let mut step = Layout::contiguous(&[2 * r, c]);
                step.shape[0] = r;
                step.strides[0] *= 2;
                assert_eq!(rows(&[op(&step, size)], &sh, size, out).0, vn > 1);
                // A transposed operand: elements, square tiles.
                let t = Layout::contiguous(&[c, r]).permute(&[1, 0]);
                assert_eq!(
                    rows(&[op(&t, size)], &sh, size, out),
                    (false, 0, false, true, [[1, r as i64], [0, 0], [0, 0]])
                );
                // A misaligned output or first element: elements.
                if vn > 1 {
                    assert!(!rows(&[op(&full, size), op(&row, size)], &sh, size, out + size as u64).0);
                    let mut off = Layout::contiguous(&[r, 1]);
                    off.offset = 1;
                    // A column operand is read one element per row: its alignment does not matter.
                    assert!(rows(&[op(&full, size), op(&off, size)], &sh, size, out).0);
                    let mut off = Layout::contiguous(&[c]);
                    off.offset = 1;
                    assert!(!rows(&[op(&full, size), op(&off, size)], &sh, size, out).0);
                }
            }
            // Columns not a multiple of the vector: elements, still narrow.
            for c in [7usize, 1000003] {
                let full = Layout::contiguous(&[5, c]);
                let row = Layout::contiguous(&[c]);
                let got = rows(&[op(&full, size), op(&row, size)], &[5, c], size, out);
                assert_eq!((got.0, got.2, got.3), (vn == 1, false, false), "C {c}");
            }
            // A reversed row order is wide (negative stride); so is a count past 2^31.
            let mut flip = Layout::contiguous(&[8, 64]);
            flip.strides[0] = -64;
            flip.offset = 7 * 64;
            assert!(rows(&[op(&flip, size)], &[8, 64], size, out).2);
            let big = Layout::contiguous(&[1 << 16, 1]);
            assert!(rows(&[op(&big, size)], &[1 << 16, 1 << 15], size, out).2);
            let fits = Layout::contiguous(&[1 << 15, 1]);
            assert!(!rows(&[op(&fits, size)], &[1 << 15, 1 << 15], size, out).2);
            // A transposed operand whose reach passes 2^31 (a stride of 2^31 columns) is wide.
            let mut tall = Layout::contiguous(&[4, 2]);
            tall.strides[1] = 1 << 31;
            tall.strides[0] = 1;
            assert!(rows(&[op(&tall, size)], &[4, 2], size, out).2);
        }
        // Three axes: rows of the last, their starts from the outer two (vectors here).
        let a = Layout::contiguous(&[4, 1, 8]);
        let b = Layout::contiguous(&[4, 6, 8]);
        let p = plan(&[op(&a, 4), op(&b, 4)], &[4, 6, 8], 4, out).unwrap();
        assert_eq!(p.variant(), Variant::Rows { vec: true, scalar: 0, wide: false, deep: true });
        let Plan::Rows { r: 24, c: 8, outer: Some(l), .. } = p else { panic!("{p:?}") };
        assert_eq!((l.ndim, &l.shape[..2], &l.st[0][..2], &l.st[1][..2]), (2, &[4, 6][..], &[8, 0][..], &[48, 8][..]));
        // A batch of row swaps (`[0, 2, 1, 3]` of a contiguous array) reads whole rows.
        let t = Layout::contiguous(&[3, 5, 7, 16]).permute(&[0, 2, 1, 3]);
        let p = plan(&[op(&t, 2)], &[3, 7, 5, 16], 2, out).unwrap();
        assert_eq!(p.variant(), Variant::Rows { vec: true, scalar: 0, wide: false, deep: true });
    }

    /// A map follows its operands' memory order only when every full operand is dense in
    /// the same non-row-major order; the order is a permutation of the axes that makes
    /// each such operand row-major.
    #[test]
    fn follow_order_finds_a_shared_dense_order() {
        let t2 = Layout::contiguous(&[7, 5]).permute(&[1, 0]);
        assert_eq!(follow_order([&t2], &[5, 7]).as_deref(), Some(&[1, 0][..]));
        // A batch of transposes, and a permuted 4-axis array at an offset.
        let t3 = Layout::contiguous(&[3, 7, 5]).permute(&[0, 2, 1]);
        assert_eq!(follow_order([&t3], &[3, 5, 7]).as_deref(), Some(&[0, 2, 1][..]));
        let mut p4 = Layout::contiguous(&[4, 3, 6, 5]).permute(&[2, 0, 3, 1]);
        p4.offset = 9;
        let order = follow_order([&p4], &[6, 4, 5, 3]).unwrap();
        assert!(p4.permute(&order).is_contiguous(), "{order:?}");
        // Size-1 axes lead; broadcast operands (a row, a scalar) do not vote.
        let t1 = Layout::contiguous(&[7, 1, 5]).permute(&[2, 1, 0]);
        let row = Layout::contiguous(&[1, 1, 7]);
        let scalar = Layout::contiguous(&[]);
        let order = follow_order([&t1, &row, &scalar], &[5, 1, 7]).unwrap();
        assert_eq!(&order[..], &[1, 2, 0]);
        assert!(t1.permute(&order).is_contiguous());
        // A broadcast view of the full shape (stride 0 on an axis) does not vote either.
        let spread = Layout::contiguous(&[1, 7]).broadcast_to(&[5, 7]);
        assert_eq!(follow_order([&spread, &t2], &[5, 7]).as_deref(), Some(&[1, 0][..]));
        // Two operands transposed alike agree; mixed with a row-major one, row-major wins.
        assert_eq!(follow_order([&t2, &t2], &[5, 7]).as_deref(), Some(&[1, 0][..]));
        let c = Layout::contiguous(&[5, 7]);
        assert_eq!(follow_order([&t2, &c], &[5, 7]), None);
        assert_eq!(follow_order([&c, &t2], &[5, 7]), None);
        assert_eq!(follow_order([&c], &[5, 7]), None);
        // Different dense orders, a stepped view, a reversed view, one axis: row-major.
        let other = Layout::contiguous(&[3, 5, 7]).permute(&[1, 0, 2]).permute(&[1, 0, 2]);
        assert_eq!(follow_order([&t3, &Layout::contiguous(&[5, 3, 7]).permute(&[1, 0, 2])], &[3, 5, 7]), None);
        assert_eq!(follow_order([&other], &[3, 5, 7]), None);
        let mut step = Layout::contiguous(&[14, 5]).permute(&[1, 0]);
        step.strides[1] *= 2;
        step.shape[1] = 7;
        assert_eq!(follow_order([&step], &[5, 7]), None);
        let mut rev = t2.clone();
        rev.strides[0] = -1;
        rev.offset = 4;
        assert_eq!(follow_order([&rev], &[5, 7]), None);
        assert_eq!(follow_order([&Layout::contiguous(&[9])], &[9]), None);
        // Only broadcast operands: nothing to follow.
        assert_eq!(follow_order([&row, &scalar], &[5, 1, 7]), None);
        // An empty array: nothing to order.
        let empty = Layout::contiguous(&[3, 0, 2]).permute(&[2, 1, 0]);
        assert_eq!(follow_order([&empty], &[2, 0, 3]), None);
    }

    /// Simulates `k_rows`'s loops on the host: how often each (row, item) is visited.
    fn rows_visits(r: usize, items: usize, (bx, by, lgc, gx, gy): (u32, u32, u32, u32, u32)) -> Vec<u32> {
        let mut seen = vec![0u32; r * items];
        let (uc, ur) = (1usize << lgc, VEC_UNROLL >> lgc);
        let (rt, ct) = (by as usize * ur, bx as usize * uc);
        for (bxi, byi) in (0..gx as usize).flat_map(|x| (0..gy as usize).map(move |y| (x, y))) {
            for (tx, ty) in (0..bx as usize).flat_map(|x| (0..by as usize).map(move |y| (x, y))) {
                let mut r0 = bxi * rt + ty;
                while r0 < r {
                    let mut c0 = byi * ct + tx;
                    while c0 < items {
                        for u in 0..VEC_UNROLL {
                            let (rr, t) = (r0 + (u >> lgc) * by as usize, c0 + (u & (uc - 1)) * bx as usize);
                            if rr < r && t < items {
                                seen[rr * items + t] += 1;
                            }
                        }
                        c0 += gy as usize * ct;
                    }
                    r0 += gx as usize * rt;
                }
            }
        }
        seen
    }

    /// `k_rows`'s launch shape: whole blocks of `BLOCK` threads, a warp reading whole short
    /// rows, a grid within the device's limits, every item visited once (also when the
    /// grid is smaller than the work and the kernel loops).
    #[test]
    fn rows_geometry_covers_every_item_once() {
        assert_eq!(rows_geometry(1 << 26, 1, false), (1, 256, 0, 1 << 16, 1));
        assert_eq!(rows_geometry(1 << 26, 2, false), (2, 128, 0, 1 << 17, 1));
        assert_eq!(rows_geometry(2, 1 << 24, false), (256, 1, 2, 2, 1 << 14));
        assert_eq!(rows_geometry(1 << 16, 4096, true), (32, 8, 0, 1 << 11, 128));
        // A transposed view of few rows: the tile widens (2 rows of 512 items).
        assert_eq!(rows_geometry(2, 1 << 20, true), (256, 1, 1, 1, 1 << 11));
        assert_eq!(rows_geometry(8, 1 << 20, true), (128, 2, 0, 1, 1 << 13));
        assert_eq!(rows_geometry(1 << 20, 4, true), (4, 64, 0, 1 << 12, 1));
        assert_eq!(rows_geometry(1 << 20, 7, false), (8, 32, 0, 1 << 13, 1));
        assert_eq!(rows_geometry(1 << 20, 512, false).2, 1);
        let (_, _, _, gx, gy) = rows_geometry(1, usize::MAX >> 8, false);
        assert_eq!((gx, gy), (1, 65535));
        let (_, _, _, gx, _) = rows_geometry(usize::MAX >> 8, 1, false);
        assert_eq!(gx as usize, MAX_BLOCKS);
        for (r, items) in [(1usize, 1usize), (3, 7), (5, 300), (37, 33), (2, 2000), (300, 1), (9, 1025)] {
            for tile in [false, true] {
                let g = rows_geometry(r, items, tile);
                assert_eq!(g.0 * g.1, BLOCK, "{g:?}");
                assert!(rows_visits(r, items, g).iter().all(|&v| v == 1), "{r}x{items} {g:?}");
                // A grid of one block (or two) loops over the rest.
                for (gx, gy) in [(1, 1), (2, 1), (1, 2)] {
                    let small = (g.0, g.1, g.2, gx, gy);
                    assert!(rows_visits(r, items, small).iter().all(|&v| v == 1), "{r}x{items} {small:?}");
                }
            }
        }
    }

    /// The `fop` of each test map: (output C type, input C types, source).
    fn fops() -> Vec<(&'static str, Vec<&'static str>, String)> {
        use crate::dtype::ALL_DTYPES;
        use crate::primitives::{BinaryOp, UnaryOp};
        let mut v = Vec::new();
        for d in ALL_DTYPES {
            let t = d.c_type();
            if d.is_float() {
                v.push((t, vec![t], crate::backend::cuda::elementwise::unary_source(UnaryOp::Exp, d)));
            }
            v.push((t, vec![t, t], crate::backend::cuda::elementwise::binary_source(BinaryOp::Add, d)));
            v.push(("u8", vec![t, t], crate::backend::cuda::elementwise::binary_source(BinaryOp::Less, d)));
            v.push((t, vec!["u8", t, t], crate::backend::cuda::elementwise::where_source(d)));
        }
        v
    }

    /// Every variant a launch may need, for every dtype (unary, binary, predicate, where).
    fn variants(k: usize) -> Vec<Variant> {
        let mut v = Vec::new();
        for wide in [false, true] {
            v.push(Variant::Contig { wide });
            for deep in [false, true] {
                v.push(Variant::Rows { vec: false, scalar: 0, wide, deep });
            }
            for scalar in 0..(1u8 << k) {
                v.push(Variant::Vec { scalar, wide });
                for deep in [false, true] {
                    v.push(Variant::Rows { vec: true, scalar, wide, deep });
                }
            }
        }
        v
    }

    /// Every generated variant of unary, binary, predicate and `where` maps on every dtype
    /// compiles for sm_90 (when NVRTC loads).
    #[test]
    fn map_kernels_compile() {
        for (out_t, ins, fsrc) in fops() {
            let vec = 16 / ins.iter().chain([&out_t]).map(|t| c_size(t)).max().unwrap();
            // One module per fop with every variant renamed apart: fewer NVRTC calls.
            let mut src = String::new();
            for (i, v) in variants(ins.len()).into_iter().enumerate() {
                let s = kernel_source(&fsrc, out_t, &ins, vec, v);
                let body = &s[s.find("extern \"C\"").or_else(|| s.find("// Each")).unwrap()..];
                let body = body.replace(&format!("void {}(", v.func()), &format!("void {}_{i}(", v.func()));
                if i == 0 {
                    src.push_str(&s[..s.find("extern \"C\"").unwrap()]);
                }
                src.push_str(&body);
            }
            if !check_compiles(&format!("test:map:{out_t}:{}:{}", ins.join(","), &fsrc[..fsrc.len().min(60)]), &src) {
                return;
            }
        }
    }

    fn c_size(t: &str) -> usize {
        match t {
            "u8" => 1,
            "u16" => 2,
            "float" | "i32" | "u32" => 4,
            _ => 8,
        }
    }
}
