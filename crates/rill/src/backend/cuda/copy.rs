//! Joins and copies: `concatenate` (one kernel for up to [`CAT_MAX`] inputs), `pad`, and
//! making views contiguous (`take` is `take.rs`). They move element bits only, so their
//! kernels are keyed by element size or vector width.

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::error::Result;
use crate::shape::Layout;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::map::{Lay, merge_dims};
use super::norm::elem_ptr;
use super::nvrtc::{self, BLOCK, grid_for};
use super::source::{MAX_DIMS, PRELUDE, bits_type};

/// Copies the elements of `src` (any layout) into the view `dst` (a layout of the same
/// shape over `dst_buf`'s buffer, which the caller just allocated).
fn copy_into(cs: &GpuStream<'_>, dst_buf: &Storage, dst: &Layout, src: &Storage) -> Result<()> {
    let n = src.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (dims, st) = merge_dims(&src.layout.shape, &[&dst.strides[..], &src.layout.strides[..]]);
    if dims.len() > MAX_DIMS {
        return Err(super::unsupported("copy", format!("views of rank {} after merging axes", dims.len())));
    }
    let mut lay = Lay { shape: [1; MAX_DIMS], st: [[0; MAX_DIMS]; 3], off: [0; 3], ndim: dims.len() as i32, pad: 0 };
    for (d, &s) in dims.iter().enumerate() {
        lay.shape[d] = s as i64;
        lay.st[0][d] = st[0][d] as i64;
        lay.st[1][d] = st[1][d] as i64;
    }
    lay.off[0] = dst.offset as i64;
    lay.off[1] = src.layout.offset as i64;
    let b = bits_type(src.dtype.size());
    let key = format!("view_copy:{b}");
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_view", || {
        format!(
            r#"{PRELUDE}
extern "C" __global__ void k_view({b}* dst, const {b}* src, Lay l, i64 n) {{
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x) {{
        i64 rem = i, od = l.off[0], os = l.off[1];
        for (int d = l.ndim - 1; d >= 0; --d) {{
            i64 k = rem % l.shape[d];
            rem /= l.shape[d];
            od += k * l.st[0][d];
            os += k * l.st[1][d];
        }}
        dst[od] = src[os];
    }}
}}
"#
        )
    })?;
    let pd = super::buffer::cuda_of(dst_buf).map(|b| b.ptr()).unwrap_or(0);
    let ps = super::buffer::cuda_of(src).map(|b| b.ptr()).unwrap_or(0);
    let n64 = n as i64;
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&pd).arg(&ps).arg(&lay).arg(&n64);
    // SAFETY: both views lie inside their buffers (the destination is a sub-view of a new
    // allocation, the source a view checked by the op layer).
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(())
}

/// Inputs one concatenate launch takes (its parameter table is passed by value).
pub(crate) const CAT_MAX: usize = 16;

/// The batched concatenate kernel `k_cat` over `v`-byte vectors: block row `y` copies
/// input `y` of the table (`src`, its row length `cols` and its column `at` in the
/// output, all in vectors) into every output row.
pub(crate) fn cat_source(v: usize, wide: bool) -> String {
    let vt = super::take::vec_type(v);
    let ix = if wide { "u64" } else { "u32" };
    format!(
        r#"{PRELUDE}
struct __attribute__((aligned(16))) v16 {{ u64 a, b; }};
typedef {ix} ix;
struct Cat {{ u64 src[{CAT_MAX}]; u64 cols[{CAT_MAX}]; u64 at[{CAT_MAX}]; }};
extern "C" __global__ void __launch_bounds__({BLOCK}) k_cat({vt}* out, Cat p, ix outer, ix total) {{
    const int j = blockIdx.y;
    const {vt}* src = (const {vt}*)p.src[j];
    const ix cols = (ix)p.cols[j], at = (ix)p.at[j];
    const ix n = outer * cols;
    for (ix i = (ix)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ix)blockDim.x * gridDim.x) {{
        ix r = i / cols, c = i - r * cols;
        out[r * total + at + c] = src[i];
    }}
}}
"#
    )
}

/// Joins `xs` (all of the node dtype) along `axis` into a new contiguous storage:
/// contiguous inputs [`CAT_MAX`] at a time in one kernel, each as `outer` rows of
/// `shape[axis] * inner` elements copied as the widest vectors every row, column and
/// address allows; views through the strided copy.
pub(crate) fn concatenate(cs: &GpuStream<'_>, xs: &[Storage], axis: usize, shape: &[usize]) -> Result<Storage> {
    let out = new_storage(cs, xs[0].dtype, shape)?;
    if shape.contains(&0) {
        return Ok(out);
    }
    let full = Layout::contiguous(shape);
    let es = xs[0].dtype.size();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let total = shape[axis] * inner;
    let po = elem_ptr(&out);
    // (address, row length, column in the output), in elements.
    let mut table: Vec<(u64, usize, usize)> = Vec::with_capacity(xs.len());
    let mut at = 0usize;
    for x in xs {
        let cols = x.layout.shape[axis] * inner;
        if cols == 0 {
            continue;
        }
        if x.layout.is_contiguous() {
            table.push((elem_ptr(x), cols, at));
        } else {
            let mut v = full.clone();
            v.shape[axis] = x.layout.shape[axis];
            v.offset = at;
            copy_into(cs, &out, &v, x)?;
        }
        at += cols;
    }
    for chunk in table.chunks(CAT_MAX) {
        let mut sizes: Vec<u64> = vec![po, (total * es) as u64];
        for &(p, c, a) in chunk {
            sizes.extend([p, (c * es) as u64, (a * es) as u64]);
        }
        let v = super::take::vector_width(es, total * es, &sizes);
        let wide = outer * total * es / v >= (1usize << 31);
        let b = super::take::vec_type(v);
        let key = format!("cat:{b}:{v}:{}", if wide { 64 } else { 32 });
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_cat", || cat_source(v, wide))?;
        let mut p = [0u64; 3 * CAT_MAX];
        let mut most = 0usize;
        for (j, &(src, c, a)) in chunk.iter().enumerate() {
            p[j] = src;
            p[CAT_MAX + j] = (c * es / v) as u64;
            p[2 * CAT_MAX + j] = (a * es / v) as u64;
            most = most.max(outer * c * es / v);
        }
        let blocks = most.div_ceil(BLOCK as usize).clamp(1, cs.dev.sms.max(1) as usize * 32);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, chunk.len() as u32, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (o, t) = (outer as u64, (total * es / v) as u64);
        let _ = cs.bind();
        let mut lb = Launch::new(&f);
        lb.arg(&po).arg_slice(&p);
        if wide {
            lb.arg(&o).arg(&t);
        } else {
            lb.arg(&(o as u32)).arg(&(t as u32));
        }
        // SAFETY: every input of the table is contiguous with `outer` rows of `cols`
        // elements; each lands in columns [at, at + cols) of `out`'s `outer` rows of
        // `total`; all of them are multiples of `v` bytes, as are the addresses.
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    }
    Ok(out)
}

/// Constant padding: fills with `value`, then copies `x` into the interior.
pub(crate) fn pad(
    cs: &GpuStream<'_>,
    x: &Storage,
    widths: &[(usize, usize)],
    value: f64,
    shape: &[usize],
) -> Result<Storage> {
    let out = super::elementwise::full(cs, shape, x.dtype, value)?;
    let full = Layout::contiguous(shape);
    let offset = widths.iter().zip(&full.strides).map(|(w, &s)| w.0 * s as usize).sum();
    let v = Layout { shape: x.layout.shape.clone(), strides: full.strides.clone(), offset };
    copy_into(cs, &out, &v, x)?;
    Ok(out)
}

/// A 2-D transpose (or a batch of them) that makes a view contiguous: element
/// `[b][i][j]` of the result is `src[b * sb + i + j * sj]` (the view is unit-stride
/// along `i`, the result along `j`).
struct Tile {
    batch: usize,
    rows: usize,
    cols: usize,
    sj: i64,
    sb: i64,
}

/// The tile plan of a layout that is, after merging axes, a batch of 2-D transposes.
fn tile_plan(l: &Layout) -> Option<Tile> {
    let out = Layout::contiguous(&l.shape);
    let (dims, st) = merge_dims(&l.shape, &[&out.strides[..], &l.strides[..]]);
    let d = dims.len();
    if !(2..=3).contains(&d) || st[1][d - 2] != 1 || st[1][d - 1] == 1 {
        return None;
    }
    let batch = if d == 3 { dims[0] } else { 1 };
    let sb = if d == 3 { st[1][0] as i64 } else { 0 };
    (batch <= 65535).then_some(Tile { batch, rows: dims[d - 2], cols: dims[d - 1], sj: st[1][d - 1] as i64, sb })
}

/// The tiled transpose `k_tr` for elements of C type `b`: 32x32 tiles through shared
/// memory (a padding column against bank conflicts), 256 threads as 32 x 8.
pub(crate) fn transpose_source(b: &str) -> String {
    format!(
        r#"{PRELUDE}
extern "C" __global__ void __launch_bounds__(256) k_tr({b}* out, const {b}* src, i64 R, i64 C, i64 sj, i64 sb, i64 tiles_c) {{
    __shared__ {b} tile[32][33];
    const i64 t = blockIdx.x, ti = t / tiles_c, tj = t - ti * tiles_c;
    const i64 i0 = ti * 32, j0 = tj * 32;
    const {b}* s = src + (i64)blockIdx.y * sb;
    {b}* o = out + (i64)blockIdx.y * R * C;
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    for (int jj = ty; jj < 32; jj += 8) {{
        i64 i = i0 + tx, j = j0 + jj;
        if (i < R && j < C) tile[jj][tx] = s[i + j * sj];
    }}
    __syncthreads();
    for (int ii = ty; ii < 32; ii += 8) {{
        i64 i = i0 + ii, j = j0 + tx;
        if (i < R && j < C) o[i * C + j] = tile[tx][ii];
    }}
}}
"#
    )
}

/// A contiguous copy of `x` (`Contiguous`, and reshapes that need a copy): the tiled
/// transpose when the view is a batch of 2-D transposes, the elementwise copy otherwise.
pub(crate) fn make_contiguous(cs: &GpuStream<'_>, x: &Storage) -> Result<Storage> {
    let Some(t) = (!x.layout.is_contiguous()).then(|| tile_plan(&x.layout)).flatten() else {
        return super::elementwise::copy(cs, x);
    };
    let out = new_storage(cs, x.dtype, &x.layout.shape)?;
    if t.rows * t.cols * t.batch == 0 {
        return Ok(out);
    }
    let b = bits_type(x.dtype.size());
    let key = format!("transpose:{b}");
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_tr", || transpose_source(b))?;
    let (tr, tc) = (t.rows.div_ceil(32), t.cols.div_ceil(32));
    let tiles = tr * tc;
    if tiles >= (1usize << 31) {
        return super::elementwise::copy(cs, x);
    }
    let cfg = LaunchConfig { grid_dim: (tiles as u32, t.batch as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (po, px) = (elem_ptr(&out), elem_ptr(x));
    let (r, c, tc64) = (t.rows as i64, t.cols as i64, tc as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&po).arg(&px).arg(&r).arg(&c).arg(&t.sj).arg(&t.sb).arg(&tc64);
    // SAFETY: every (b, i, j) read is an element of the view `x` (checked by the op
    // layer); `out` is a new contiguous buffer of batch * rows * cols elements.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn concatenate_kernels_compile_for_every_width() {
        for v in [1, 2, 4, 8, 16] {
            for wide in [false, true] {
                if !check_compiles(&format!("test:cat:{v}:{wide}"), &cat_source(v, wide)) {
                    return;
                }
            }
        }
    }

    #[test]
    fn transpose_kernels_compile_for_every_element_size() {
        for b in ["u8", "u16", "u32", "u64"] {
            if !check_compiles(&format!("test:transpose:{b}"), &transpose_source(b)) {
                return;
            }
        }
    }

    #[test]
    fn tile_plans_only_batches_of_2d_transposes() {
        let c = Layout::contiguous(&[5, 7]);
        assert!(tile_plan(&c).is_none());
        let t = tile_plan(&c.permute(&[1, 0])).unwrap();
        assert_eq!((t.batch, t.rows, t.cols, t.sj, t.sb), (1, 7, 5, 7, 0));
        let c3 = Layout::contiguous(&[3, 5, 7]);
        let t = tile_plan(&c3.permute(&[0, 2, 1])).unwrap();
        assert_eq!((t.batch, t.rows, t.cols, t.sj, t.sb), (3, 7, 5, 7, 35));
        // Axes that merge: [7, 3, 5] with strides [1, 35, 7] is one 7 x 15 transpose.
        let t = tile_plan(&c3.permute(&[2, 0, 1])).unwrap();
        assert_eq!((t.batch, t.rows, t.cols, t.sj, t.sb), (1, 7, 15, 7, 0));
        // Unit stride along the result's last axis: the elementwise copy.
        assert!(tile_plan(&c3.permute(&[1, 0, 2])).is_none());
    }
}
