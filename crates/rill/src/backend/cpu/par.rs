//! Parallel loops, on the runtime's worker pool and nowhere else.
//!
//! Every parallel loop of rill (the CPU kernels, the fused CPU loop, `gemm`'s threading)
//! goes through this module; `clippy.toml` forbids rayon's parallel iterators, `join`,
//! `scope`, `spawn`, its pools and gemm's rayon parallelism everywhere else. The reason:
//! rayon runs a parallel loop on the pool of the calling thread, and a thread of no pool
//! gets rayon's global pool, started on first use: threads that `stats()` does not count,
//! `RILL_CPU_THREADS` does not bound and `shutdown` does not stop.
//!
//! So a loop is split across threads only when it is called on one of the pool's own
//! threads (where the CPU streams' kernels run), and runs on the calling thread
//! otherwise: a one-element scalar made while an op is built, a host fallback of a GPU
//! batch run by a blocking `eval`'s own thread, the crate's unit tests. Handing such a
//! loop to the pool (`install`) would make a small one pay a round trip to another
//! thread, and a large one wait behind whatever the pool is running. The pieces are the
//! same either way, so a result never depends on where its loop ran.

#![allow(clippy::disallowed_methods)]

use rayon::prelude::*;

use crate::runtime::pool;

/// True when a loop of `pieces` pieces is split across the pool's threads.
fn split(pieces: usize) -> bool {
    pieces > 1 && pool::on_pool_thread()
}

/// Calls `f(i, piece)` for the `i`-th piece of `chunk` elements of `out` (the last may be
/// shorter).
pub(crate) fn chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if split(out.len().div_ceil(chunk)) {
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, o)| f(i, o));
    }
}

/// [`chunks`] where a task takes at least `min` pieces (pieces too small to be worth a
/// task of their own, such as short rows).
pub(crate) fn chunks_min<T: Send>(out: &mut [T], chunk: usize, min: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if split(out.len().div_ceil(chunk.saturating_mul(min))) {
        out.par_chunks_mut(chunk).with_min_len(min).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, o)| f(i, o));
    }
}

/// Calls `f(out_piece, src_piece)` for the `i`-th piece of `out` (`out_chunk` elements)
/// and of `src` (`src_chunk` elements), as long as both have pieces.
pub(crate) fn zip<T: Send, U: Sync>(
    out: &mut [T],
    out_chunk: usize,
    src: &[U],
    src_chunk: usize,
    f: impl Fn(&mut [T], &[U]) + Sync,
) {
    if split(out.len().div_ceil(out_chunk)) {
        out.par_chunks_mut(out_chunk).zip(src.par_chunks(src_chunk)).for_each(|(o, s)| f(o, s));
    } else {
        out.chunks_mut(out_chunk).zip(src.chunks(src_chunk)).for_each(|(o, s)| f(o, s));
    }
}

/// [`chunks`] with scratch state made by `init`, once per task (once in all when the loop
/// runs on the calling thread).
pub(crate) fn chunks_init<T: Send, S>(
    out: &mut [T],
    chunk: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, &mut [T]) + Sync,
) {
    if split(out.len().div_ceil(chunk)) {
        out.par_chunks_mut(chunk).enumerate().for_each_init(&init, |s, (i, o)| f(s, i, o));
    } else {
        let mut s = init();
        out.chunks_mut(chunk).enumerate().for_each(|(i, o)| f(&mut s, i, o));
    }
}

/// `[f(0), f(1), .., f(n - 1)]`, in that order whatever ran them.
pub(crate) fn map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    if split(n) { (0..n).into_par_iter().map(&f).collect() } else { (0..n).map(f).collect() }
}

/// What to pass `gemm` as its parallelism: the pool's threads for a large product on a
/// pool thread, none elsewhere (gemm's rayon threading, like any rayon loop, would run on
/// the global pool there).
pub(crate) fn gemm_parallelism(large: bool) -> gemm::Parallelism {
    let threads = pool::num_threads();
    if large && threads > 1 && pool::on_pool_thread() {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off the pool every loop runs on the calling thread, and its pieces are the ones
    /// the pool would get.
    #[test]
    fn off_the_pool_loops_run_here_in_the_same_pieces() {
        assert!(!pool::on_pool_thread());
        let me = std::thread::current().id();
        let mut out = vec![0usize; 10];
        chunks(&mut out, 4, |i, o| {
            assert_eq!(std::thread::current().id(), me);
            o.fill(i);
        });
        assert_eq!(out, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
        chunks_min(&mut out, 3, 2, |i, o| o.fill(10 + i));
        assert_eq!(out, [10, 10, 10, 11, 11, 11, 12, 12, 12, 13]);
        let src: Vec<usize> = (0..20).collect();
        zip(&mut out, 5, &src, 10, |o, s| o.fill(s[0]));
        assert_eq!(out, [0, 0, 0, 0, 0, 10, 10, 10, 10, 10]);
        let inits = crate::sync::atomic::AtomicUsize::new(0);
        let init = || inits.fetch_add(1, crate::sync::atomic::Ordering::Relaxed);
        chunks_init(&mut out, 2, init, |_, i, o| o.fill(i));
        assert_eq!(out, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(inits.into_inner(), 1);
        assert_eq!(map(4, |i| (i * i, std::thread::current().id())), (0..4).map(|i| (i * i, me)).collect::<Vec<_>>());
        assert!(matches!(gemm_parallelism(true), gemm::Parallelism::None));
    }

    /// On the pool the same loops split across its threads, never leave them, and give
    /// the same values.
    #[test]
    fn on_the_pool_loops_match() {
        let got = pool::run_on_pool(|| {
            let mut out = vec![0usize; 1000];
            chunks(&mut out, 7, |i, o| {
                assert!(pool::on_pool_thread());
                o.fill(i)
            });
            let m = map(100, |i| {
                assert!(pool::on_pool_thread());
                i * 3
            });
            (out, m)
        });
        let Some((out, m)) = got else { return }; // the pool is stopped (another test shut down)
        assert!(out.iter().enumerate().all(|(k, &v)| v == k / 7));
        assert_eq!(m, (0..100).map(|i| i * 3).collect::<Vec<_>>());
    }
}
