//! Index checks that need no host wait: a kernel reading an index array (`take`, the
//! scatters and `take_along_axis`) checks its own indices and leaves the first bad
//! position (and its value) in host-mapped memory ([`report_source`]); the batch's
//! completion reads it and fails the node's storage, and everything computed from it,
//! with `Error::Index`.
//!
//! - Each device has a slab of [`SLOTS`] check slots, made once and kept for the
//!   process: per slot two device words (the worst bad position, encoded so that
//!   `atomicMax` keeps the first one, and a count of finished blocks; both zero between
//!   uses: the kernel's last block resets them) and two host-mapped words (position,
//!   value) the last block writes only when an index was bad.
//! - A checked node's storage gets its own fence (a *check fence*), signalled from the
//!   batch fence's completion with the slot's verdict. A node reading a storage that carries
//!   pending checks (made earlier in the batch, or a check fence still open from an
//!   earlier batch on any stream) gets a fence that waits for the batch and every one of
//!   those checks and takes the first error among them; a check fence already failed
//!   fails the node at once. Nodes that read nothing checked keep the plain batch fence.
//! - A check fence is marked as one (`Fence::new_check`), so a reader asks its input's
//!   fence, without a lock, whether it is a check still open; a count of open check
//!   fences lets nodes skip even that while no check is pending anywhere.
//!
//! Nothing here calls the driver after the slab is made: the completions only read host
//! memory and signal fences, on the completion worker's thread.

use std::mem::ManuallyDrop;

use smallvec::SmallVec;

use crate::backend::{Fence, Storage};
use crate::error::{Error, Result};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use crate::sync::{Arc, Mutex};

use super::driver::GpuStream;

/// Check slots per device: index checks pending at once, beyond which a kernel's indices
/// are checked with a host wait first (`take::check_now`).
pub(crate) const SLOTS: usize = 4096;

/// "No bad index" in a slot's position word.
pub(crate) const NONE: u64 = u64::MAX;

struct Slab {
    /// Device address of `2 * SLOTS` words (zero between uses).
    dev: u64,
    /// Address of `2 * SLOTS` host-mapped words (the same on host and device: UVA).
    host: usize,
    free: Mutex<Vec<u32>>,
}

static SLABS: Mutex<Vec<Option<Arc<Slab>>>> = Mutex::new(Vec::new());
/// Check fences made and not yet signalled (read without a lock on the hot path).
static OPEN_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Check fences ever signalled with an error: until one is, no input fence is looked at.
static FAILED: AtomicUsize = AtomicUsize::new(0);

fn open() -> Arc<Fence> {
    OPEN_COUNT.fetch_add(1, SeqCst);
    Fence::new_check()
}

/// Signals a check fence and counts it closed.
fn finish(f: &Arc<Fence>, r: Result<()>) {
    if r.is_err() {
        FAILED.fetch_add(1, SeqCst);
    }
    f.signal(r);
    OPEN_COUNT.fetch_sub(1, SeqCst);
}

/// The device's slab, made on first use (`None`: the device has no unified addressing,
/// so host-mapped memory has no common address; indices are then checked with a host
/// wait).
fn slab(cs: &GpuStream<'_>) -> Result<Option<Arc<Slab>>> {
    let mut g = SLABS.lock();
    let o = cs.dev.ordinal;
    if g.len() <= o {
        g.resize(o + 1, None);
    }
    if let Some(s) = &g[o] {
        return Ok(Some(s.clone()));
    }
    let err = |e| super::backend_err("take", e);
    let ctx = cs.dev.ctx(cs.driver());
    use cudarc::driver::sys;
    let uva = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING).map_err(err)?;
    if uva == 0 {
        return Ok(None);
    }
    let t = cs.dev.transfer(cs.driver());
    // Kept for the process (never freed: a slot may be in use until the very end).
    let words = ManuallyDrop::new(t.alloc_zeros::<u64>(2 * SLOTS).map_err(err)?);
    let dev = cudarc::driver::DevicePtr::device_ptr(&*words, t).0;
    t.synchronize().map_err(err)?; // once per device: the zeros are there for every stream
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // SAFETY: the words are written below before any kernel or host read uses them.
    let mut pinned = ManuallyDrop::new(unsafe { ctx.alloc_pinned_with_flags::<u64>(2 * SLOTS, flags) }.map_err(err)?);
    let host = pinned.as_mut_ptr().map_err(err)? as usize;
    for i in 0..2 * SLOTS {
        // SAFETY: inside the allocation of 2 * SLOTS words.
        unsafe { std::ptr::write_volatile((host as *mut u64).add(i), NONE) };
    }
    let free = Mutex::new((0..SLOTS as u32).rev().collect());
    let s = Arc::new(Slab { dev, host, free });
    g[o] = Some(s.clone());
    Ok(Some(s))
}

/// One node's check slot, held until its verdict is read.
pub(crate) struct Slot {
    slab: Arc<Slab>,
    i: u32,
}

impl Slot {
    /// A free slot of `cs`'s device, its host words reset (`None`: none free, or no slab).
    pub(crate) fn get(cs: &GpuStream<'_>) -> Result<Option<Slot>> {
        let Some(slab) = slab(cs)? else { return Ok(None) };
        let Some(i) = slab.free.lock().pop() else { return Ok(None) };
        let s = Slot { slab, i };
        // SAFETY: the slot's two host words; no kernel uses a free slot.
        unsafe {
            std::ptr::write_volatile(s.host_words(), NONE);
            std::ptr::write_volatile(s.host_words().add(1), 0);
        }
        std::sync::atomic::fence(SeqCst); // visible before the launch that uses them
        Ok(Some(s))
    }
    /// Device address of the slot's two device words.
    pub(crate) fn dev(&self) -> u64 {
        self.slab.dev + self.i as u64 * 16
    }
    /// Device (and host) address of the slot's two host-mapped words.
    pub(crate) fn host(&self) -> u64 {
        self.host_words() as u64
    }
    fn host_words(&self) -> *mut u64 {
        (self.slab.host + self.i as usize * 16) as *mut u64
    }
    /// The first bad position and its index value, once the kernel finished.
    fn read(&self) -> Option<i64> {
        // SAFETY: the slot's host words; the kernel that writes them has finished.
        let (p, v) =
            unsafe { (std::ptr::read_volatile(self.host_words()), std::ptr::read_volatile(self.host_words().add(1))) };
        (p != NONE).then_some(v as i64)
    }
    fn release(self) {
        self.slab.free.lock().push(self.i);
    }
}

/// Pending checks of one storage (their fences, in the order met).
pub(crate) type Conds = SmallVec<[Arc<Fence>; 2]>;

/// The checks of one batch (held by `exec.rs`'s `BatchRun`).
pub(crate) struct Batch {
    fence: Arc<Fence>,
    /// Buffers made in this batch that carry pending checks (by address: the batch's
    /// results keep them alive until it is sealed, so no address is reused meanwhile).
    tainted: Vec<(usize, Conds)>,
    /// The check fences of this batch's index-checking nodes.
    local: Vec<Arc<Fence>>,
    /// Fences combining several checks, made while sealing (one per distinct set).
    joined: Vec<(Conds, Arc<Fence>)>,
    /// Set when the batch enqueued work but recorded no event: slots are then not reused.
    abandoned: Arc<AtomicBool>,
}

fn buf_key(s: &Storage) -> usize {
    Arc::as_ptr(&*s.buffer) as usize
}

fn add(c: &mut Conds, f: &Arc<Fence>) {
    if !c.iter().any(|g| Arc::ptr_eq(g, f)) {
        c.push(f.clone());
    }
}

impl Batch {
    pub(crate) fn new(fence: Arc<Fence>) -> Batch {
        Batch {
            fence,
            tainted: Vec::new(),
            local: Vec::new(),
            joined: Vec::new(),
            abandoned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The pending checks a node reading `inputs` inherits; an error when one of them
    /// already failed.
    pub(crate) fn inputs(&self, inputs: &[&Storage]) -> Result<Conds> {
        let mut c = Conds::new();
        let (open, failed) = (OPEN_COUNT.load(SeqCst) > 0, FAILED.load(SeqCst) > 0);
        if self.tainted.is_empty() && !open && !failed {
            return Ok(c);
        }
        for s in inputs {
            if let Some((_, t)) = self.tainted.iter().find(|(k, _)| *k == buf_key(s)) {
                for f in t {
                    add(&mut c, f);
                }
                continue;
            }
            let Some(f) = &s.fence else { continue };
            if open && f.is_open_check() {
                add(&mut c, f);
            } else if failed && f.is_signalled() {
                f.result()?;
            }
        }
        Ok(c)
    }

    /// Records that `out` (a result of this batch) carries `conds`.
    pub(crate) fn taint(&mut self, out: &Storage, conds: &Conds) {
        if conds.is_empty() {
            return;
        }
        let k = buf_key(out);
        match self.tainted.iter_mut().find(|(b, _)| *b == k) {
            Some((_, t)) => conds.iter().for_each(|f| add(t, f)),
            None => self.tainted.push((k, conds.clone())),
        }
    }

    /// Registers the index check of the node `op` whose result is `out`: its verdict is
    /// read from `slot` when the batch's work is complete, as `Error::Index` of `axis` and
    /// `size`.
    pub(crate) fn watch(&mut self, out: &Storage, slot: Slot, op: &'static str, axis: usize, size: usize) {
        let cf = open();
        let (batch, mine, abandoned) = (self.fence.clone(), cf.clone(), self.abandoned.clone());
        self.fence.on_done(Box::new(move || {
            let r = match batch.result() {
                // The kernel may not have run to its end: the slot is not reused.
                Err(e) => Err(e),
                Ok(()) if abandoned.load(SeqCst) => Err(Error::backend(op, "the batch recorded no event")),
                Ok(()) => {
                    let bad = slot.read();
                    slot.release();
                    match bad {
                        Some(index) => Err(Error::Index { op, index, axis, size }),
                        None => Ok(()),
                    }
                }
            };
            finish(&mine, r);
        }));
        let mut c = Conds::new();
        c.push(cf.clone());
        self.local.push(cf);
        self.taint(out, &c);
    }

    /// The fence a sealed result of this batch carries: the batch's, or one that also
    /// waits for the result's pending checks.
    pub(crate) fn fence_for(&mut self, s: &Storage) -> Arc<Fence> {
        let k = buf_key(s);
        let Some((_, c)) = self.tainted.iter().find(|(b, _)| *b == k) else { return self.fence.clone() };
        // A node's own check is signalled after the batch fence: it stands for both.
        if c.len() == 1 && self.local.iter().any(|f| Arc::ptr_eq(f, &c[0])) {
            return c[0].clone();
        }
        if let Some((_, f)) = self.joined.iter().find(|(j, _)| same(j, c)) {
            return f.clone();
        }
        let mut parts: Conds = SmallVec::new();
        parts.push(self.fence.clone());
        parts.extend(c.iter().cloned());
        let f = all_of(&parts);
        self.joined.push((c.clone(), f.clone()));
        f
    }

    /// Called when the batch enqueued work but has no event: the checks' slots are
    /// then not reused (the kernels may still be running when the fence is signalled).
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, SeqCst);
    }
}

/// CUDA C of `rill_report(bad, words, host, idx)`, for a kernel whose indices (of C type
/// `it`) are checked through a slot: `words` and `host` are the slot's (both null: no
/// report). Every thread of every block calls it last with `bad`, the lowest bad index
/// position it saw (all ones: none). The first bad position of the grid survives in the
/// device word as the largest `NONE - position`; the grid's last block
/// (threadFenceReduction's pattern) publishes it and its index value to the host words
/// and leaves both device words zero for the slot's next use.
pub(crate) fn report_source(it: &str) -> String {
    format!(
        r#"
__device__ __forceinline__ void rill_report(u64 bad, u64* words, u64* host, const {it}* idx) {{
    const u64 NONE = 0xffffffffffffffffull;
    if (words == 0) return;
    if (bad != NONE) atomicMax(words, NONE - bad);
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(words + 1, 1ull) == (u64)gridDim.x - 1;
    __syncthreads();
    if (last && threadIdx.x == 0) {{
        u64 w = atomicAdd(words, 0ull);
        if (w != 0) {{
            u64 p = NONE - w;
            host[1] = (u64)(i64)idx[p];
            host[0] = p;
            __threadfence_system();
        }}
        words[0] = 0;
        words[1] = 0;
    }}
}}
"#
    )
}

fn same(a: &Conds, b: &Conds) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

/// A check fence signalled once every one of `parts` is, with the first error among
/// them in their order.
fn all_of(parts: &Conds) -> Arc<Fence> {
    let out = open();
    struct Join {
        left: AtomicUsize,
        parts: Mutex<Vec<Option<Arc<Fence>>>>,
        out: Arc<Fence>,
    }
    let j = Arc::new(Join {
        left: AtomicUsize::new(parts.len()),
        parts: Mutex::new(parts.iter().cloned().map(Some).collect()),
        out: out.clone(),
    });
    for p in parts {
        let j = j.clone();
        p.on_done(Box::new(move || {
            if j.left.fetch_sub(1, SeqCst) == 1 {
                // Every part is signalled: the first error in order, and the parts let go.
                let ps = std::mem::take(&mut *j.parts.lock());
                let r = ps.iter().flatten().map(|f| f.result()).find(Result::is_err).unwrap_or(Ok(()));
                finish(&j.out, r);
            }
        }));
    }
    out
}
