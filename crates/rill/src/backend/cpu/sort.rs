//! Sort, argsort and top-k of each row of the last axis (`Primitive::Sort`).
//!
//! Every backend orders a row by the same unsigned key per value, then by position, so the
//! order is stable and identical on the CPU and the GPU (`backend/cuda/sort.rs` computes
//! the same keys):
//!
//! * floats (f16 and bf16 widened to f32 first, exactly): a NaN becomes the one quiet NaN
//!   `0x7FC0_0000` (f64: `0x7FF8_0000_0000_0000`) and `-0.0` becomes `0.0`; the bits `u`
//!   map to `!u` when the sign is set, else to `u | sign`. So every NaN is equal to the
//!   others and above `+inf`;
//! * signed integers: the bits with the sign bit flipped; unsigned (and bool): the bits;
//! * descending: the key's complement (the order of the keys reversed, positions still
//!   ascending among equal keys).
//!
//! Rows are sorted as (key, position) pairs, unique, so an unstable sort gives the stable
//! order; a top-k selects its `k` pairs first (`select_nth_unstable`) and sorts only them.

use half::{bf16, f16};

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::primitives::SortSpec;
use crate::shape::numel;

/// A value's ascending sort key (see the module docs).
pub(crate) trait SortKey: Element {
    fn sort_key(self) -> u64;
}

fn f32_key(f: f32) -> u64 {
    let f = if f.is_nan() {
        f32::from_bits(0x7FC0_0000)
    } else if f == 0.0 {
        0.0
    } else {
        f
    };
    let u = f.to_bits();
    (if u >> 31 == 1 { !u } else { u | 0x8000_0000 }) as u64
}

impl SortKey for f32 {
    fn sort_key(self) -> u64 {
        f32_key(self)
    }
}
impl SortKey for f16 {
    fn sort_key(self) -> u64 {
        f32_key(self.to_f32())
    }
}
impl SortKey for bf16 {
    fn sort_key(self) -> u64 {
        f32_key(self.to_f32())
    }
}
impl SortKey for f64 {
    fn sort_key(self) -> u64 {
        let f = if self.is_nan() {
            f64::from_bits(0x7FF8_0000_0000_0000)
        } else if self == 0.0 {
            0.0
        } else {
            self
        };
        let u = f.to_bits();
        if u >> 63 == 1 { !u } else { u | (1 << 63) }
    }
}
impl SortKey for i32 {
    fn sort_key(self) -> u64 {
        (self as u32 ^ 0x8000_0000) as u64
    }
}
impl SortKey for i64 {
    fn sort_key(self) -> u64 {
        self as u64 ^ (1 << 63)
    }
}
impl SortKey for u32 {
    fn sort_key(self) -> u64 {
        self as u64
    }
}
impl SortKey for u8 {
    fn sort_key(self) -> u64 {
        self as u64
    }
}

/// `Sort` of `x` along its last axis into a new contiguous storage of `shape`.
pub(crate) fn sort(x: &Storage, spec: &SortSpec, shape: &[usize]) -> Result<Storage> {
    let d = x.dtype;
    crate::with_dtype!(d, T => run::<T>(x, spec, shape, d))
}

fn run<T: SortKey>(x: &Storage, spec: &SortSpec, shape: &[usize], d: DType) -> Result<Storage> {
    let out_dtype = if spec.indices { DType::I64 } else { d };
    let n_out = numel(shape);
    let mut buf = CpuBuffer::alloc(out_dtype, n_out)?;
    let n = x.layout.shape.last().copied().unwrap_or(1);
    let kout = shape.last().copied().unwrap_or(1);
    if n_out == 0 {
        return Ok(Storage::contiguous(Buffer::Cpu(buf), out_dtype, shape));
    }
    let src = strided::contiguous::<T>(x);
    let src: &[T] = &src;
    let flip = if spec.descending { u64::MAX } else { 0 };
    // Rows per parallel piece: about PAR_CHUNK elements of input.
    let per = (PAR_CHUNK / n.max(1)).max(1);
    // The first `kout` (key, position) pairs of row `r`, in order.
    let order = |r: usize, pairs: &mut Vec<(u64, u32)>| {
        let row = &src[r * n..(r + 1) * n];
        pairs.clear();
        pairs.extend(row.iter().enumerate().map(|(i, v)| (v.sort_key() ^ flip, i as u32)));
        if kout < n {
            if kout > 0 {
                pairs.select_nth_unstable(kout - 1);
            }
            pairs.truncate(kout);
        }
        pairs.sort_unstable();
    };
    if spec.indices {
        par::chunks(buf.typed_mut::<i64>(), kout * per, |c, o| {
            let mut pairs = Vec::with_capacity(n);
            for (j, orow) in o.chunks_mut(kout).enumerate() {
                order(c * per + j, &mut pairs);
                for (q, &(_, i)) in orow.iter_mut().zip(&pairs) {
                    *q = i as i64;
                }
            }
        });
    } else {
        par::chunks(buf.typed_mut::<T>(), kout * per, |c, o| {
            let mut pairs = Vec::with_capacity(n);
            for (j, orow) in o.chunks_mut(kout).enumerate() {
                let r = c * per + j;
                order(r, &mut pairs);
                for (q, &(_, i)) in orow.iter_mut().zip(&pairs) {
                    *q = src[r * n + i as usize];
                }
            }
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), out_dtype, shape))
}
