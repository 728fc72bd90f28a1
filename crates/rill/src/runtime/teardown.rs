//! Backend libraries whose teardown waits for rill's exit shutdown, whenever they
//! registered it.
//!
//! `exit` runs the entries of `atexit`/`__cxa_atexit` in reverse order of registration.
//! A C++ library registers the destructor of each static object when the object is first
//! constructed, which for NVRTC 13.0 can be in any compile (its first compiles register
//! five entries, at moments that depend on timing), long after rill's exit hook was
//! registered. Those destructors then run before the hook, under a pool thread still
//! compiling (SIGSEGV in `nvrtcCompileProgram`). No order of registering the hook can be
//! right for an entry registered later, so rill changes what the entry does instead:
//!
//! When rill opens a backend library it points that library's import of `__cxa_atexit`
//! (its GOT slot, resolved by the dynamic linker) at [`guarded_cxa_atexit`](elf::guarded_cxa_atexit), which
//! registers the same destructor wrapped in `run_guarded`. At exit the wrapper first
//! runs the exit shutdown (once; the first of these entries or rill's own hook does it),
//! which closes the backend gate and waits for every thread inside a backend library,
//! then the destructor. If a thread is still inside after the bounds, the destructor is
//! skipped and rill's hook ends the process with `_exit` (`lifecycle.rs`).
//!
//! Entries registered before the redirection (while the library loads, before `main`)
//! come before rill's first hook registration and run after it. Linux with glibc on
//! 64-bit ELF only; elsewhere [`guard`] redirects nothing and reports it.

#[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64", not(loom)))]
mod elf {
    use std::ffi::{CStr, c_int, c_void};

    type Dtor = unsafe extern "C" fn(*mut c_void);

    unsafe extern "C" {
        fn __cxa_atexit(f: Dtor, arg: *mut c_void, dso: *mut c_void) -> c_int;
    }

    /// The start of glibc's `struct link_map` (`<link.h>`), which `dlinfo` returns.
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *const libc::c_char,
        l_ld: *const Dyn,
    }

    #[repr(C)]
    struct Dyn {
        d_tag: i64,
        d_val: u64,
    }

    #[repr(C)]
    #[allow(dead_code)] // `r_addend` is only there for the layout
    struct Rela {
        r_offset: u64,
        r_info: u64,
        r_addend: i64,
    }

    const DT_NULL: i64 = 0;
    const DT_PLTRELSZ: i64 = 2;
    const DT_STRTAB: i64 = 5;
    const DT_SYMTAB: i64 = 6;
    const DT_RELA: i64 = 7;
    const DT_RELASZ: i64 = 8;
    const DT_JMPREL: i64 = 23;

    /// The relocation types that store a symbol's address in a pointer slot.
    fn stores_address(kind: u32) -> bool {
        #[cfg(target_arch = "x86_64")]
        return matches!(kind, 1 | 6 | 7); // R_X86_64_64, GLOB_DAT, JUMP_SLOT
        #[cfg(target_arch = "aarch64")]
        return matches!(kind, 257 | 1025 | 1026); // R_AARCH64_ABS64, GLOB_DAT, JUMP_SLOT
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = kind;
            false
        }
    }

    /// What the dynamic linker registers for a library that imports `__cxa_atexit`.
    #[repr(C)]
    struct Entry {
        f: Dtor,
        arg: *mut c_void,
    }

    /// The `__cxa_atexit` a guarded library calls: the same registration, wrapped.
    pub(super) unsafe extern "C" fn guarded_cxa_atexit(f: Dtor, arg: *mut c_void, dso: *mut c_void) -> c_int {
        // SAFETY: a plain allocation of a plain struct; freed by `run_guarded`.
        let e = unsafe { libc::malloc(size_of::<Entry>()) }.cast::<Entry>();
        if e.is_null() {
            // SAFETY: the caller's own registration, unguarded rather than lost.
            return unsafe { __cxa_atexit(f, arg, dso) };
        }
        // SAFETY: `e` is a fresh allocation of the right size and alignment (malloc's).
        unsafe { e.write(Entry { f, arg }) };
        // SAFETY: `run_guarded` takes exactly this entry; `dso` is the caller's handle, so
        // `__cxa_finalize` of that library still finds the entry.
        unsafe { __cxa_atexit(run_guarded, e.cast(), dso) }
    }

    /// A guarded library's teardown entry, run by `exit`.
    unsafe extern "C" fn run_guarded(p: *mut c_void) {
        // SAFETY: `p` is the entry `guarded_cxa_atexit` wrote; glibc runs it once.
        let e = unsafe { p.cast::<Entry>().read() };
        // SAFETY: allocated by `malloc` above.
        unsafe { libc::free(p) };
        if crate::runtime::lifecycle::before_library_teardown() {
            // SAFETY: the library's own destructor with its own argument.
            unsafe { (e.f)(e.arg) };
        }
    }

    /// The library's load base and dynamic section.
    fn link_map(handle: *mut c_void) -> Option<(usize, *const Dyn)> {
        let mut map: *const LinkMap = std::ptr::null();
        // SAFETY: `handle` came from `dlopen` and is never closed; `map` receives a pointer.
        let rc = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) };
        if rc != 0 || map.is_null() {
            return None;
        }
        // SAFETY: glibc's link map of a loaded object, valid while it stays loaded (always).
        let m = unsafe { &*map };
        if m.l_ld.is_null() { None } else { Some((m.l_addr, m.l_ld)) }
    }

    /// glibc relocates the address entries of a writable dynamic section in place; a
    /// read-only one keeps offsets from the load base.
    fn absolute(base: usize, v: u64) -> usize {
        let v = v as usize;
        if v < base { base.wrapping_add(v) } else { v }
    }

    /// The addresses of the slots through which the object at `base` with dynamic section
    /// `ld` calls `symbol`.
    ///
    /// SAFETY: `ld` is the dynamic section of an object loaded at `base`.
    unsafe fn slots(base: usize, ld: *const Dyn, symbol: &CStr) -> Vec<usize> {
        let (mut strtab, mut symtab, mut rela, mut relasz, mut jmprel, mut pltrelsz) = (0, 0, 0, 0, 0, 0);
        let mut d = ld;
        // SAFETY: the dynamic section ends with DT_NULL.
        unsafe {
            while (*d).d_tag != DT_NULL {
                let v = (*d).d_val;
                match (*d).d_tag {
                    DT_STRTAB => strtab = absolute(base, v),
                    DT_SYMTAB => symtab = absolute(base, v),
                    DT_RELA => rela = absolute(base, v),
                    DT_RELASZ => relasz = v as usize,
                    DT_JMPREL => jmprel = absolute(base, v),
                    DT_PLTRELSZ => pltrelsz = v as usize,
                    _ => {}
                }
                d = d.add(1);
            }
        }
        let mut out = Vec::new();
        if strtab == 0 || symtab == 0 {
            return out;
        }
        for (table, bytes) in [(jmprel, pltrelsz), (rela, relasz)] {
            if table == 0 {
                continue;
            }
            let n = bytes / size_of::<Rela>();
            for i in 0..n {
                // SAFETY: `n` relocations of the table the dynamic section describes.
                let r = unsafe { &*(table as *const Rela).add(i) };
                let sym = (r.r_info >> 32) as usize;
                if sym == 0 || !stores_address(r.r_info as u32) {
                    continue;
                }
                // SAFETY: a symbol index of this object's own symbol table.
                let s = unsafe { &*(symtab as *const libc::Elf64_Sym).add(sym) };
                // SAFETY: names are NUL-terminated strings of the string table.
                let name = unsafe { CStr::from_ptr((strtab + s.st_name as usize) as *const libc::c_char) };
                if name == symbol {
                    out.push(base.wrapping_add(r.r_offset as usize));
                }
            }
        }
        out
    }

    /// Where `addr` lies in the object loaded at `base`: in its RELRO segment (made
    /// read-only after relocation), in a writable segment, or neither.
    fn protection_of(base: usize, addr: usize) -> Option<bool> {
        struct Q {
            base: usize,
            addr: usize,
            found: Option<bool>,
        }
        unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, q: *mut c_void) -> c_int {
            // SAFETY: glibc passes a valid info and our `Q`.
            let (info, q) = unsafe { (&*info, &mut *q.cast::<Q>()) };
            if info.dlpi_addr as usize != q.base {
                return 0;
            }
            let (mut relro, mut writable) = (false, false);
            for i in 0..info.dlpi_phnum as usize {
                // SAFETY: `dlpi_phnum` program headers.
                let ph = unsafe { &*info.dlpi_phdr.add(i) };
                let lo = q.base.wrapping_add(ph.p_vaddr as usize);
                if !(lo..lo.wrapping_add(ph.p_memsz as usize)).contains(&q.addr) {
                    continue;
                }
                if ph.p_type == libc::PT_GNU_RELRO {
                    relro = true;
                } else if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_W != 0 {
                    writable = true;
                }
            }
            q.found = if relro {
                Some(true)
            } else if writable {
                Some(false)
            } else {
                None
            };
            1
        }
        let mut q = Q { base, addr, found: None };
        // SAFETY: `each` only reads what glibc passes.
        unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut q).cast()) };
        q.found
    }

    /// Stores `value` in the pointer slot at `slot`, lifting RELRO's write protection for
    /// the store when the slot is in that segment.
    fn store(base: usize, slot: usize, value: usize) -> bool {
        let Some(relro) = protection_of(base, slot) else { return false };
        // SAFETY: sysconf is always callable.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let start = slot & !(page - 1);
        let len = slot + size_of::<usize>() - start;
        // SAFETY: the pages of the slot, within the object's own mapping.
        if relro && unsafe { libc::mprotect(start as *mut c_void, len, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return false;
        }
        // SAFETY: an aligned pointer slot of the object's GOT, now writable. One aligned
        // word store; nothing calls through the slot yet (the library was just opened).
        unsafe { std::ptr::write_volatile(slot as *mut usize, value) };
        if relro {
            // SAFETY: as above; RELRO pages are read-only again.
            unsafe { libc::mprotect(start as *mut c_void, len, libc::PROT_READ) };
        }
        true
    }

    /// Redirects the `__cxa_atexit` imports of the library `handle`; the number of slots
    /// redirected (0 when it does not import it).
    pub(super) fn guard(handle: *mut c_void) -> usize {
        let Some((base, ld)) = link_map(handle) else { return 0 };
        let target = guarded_cxa_atexit as *const () as usize;
        // SAFETY: `ld` is the dynamic section of the object loaded at `base`.
        let found = unsafe { slots(base, ld, c"__cxa_atexit") };
        found.into_iter().filter(|&s| store(base, s, target)).count()
    }

    /// The function the library `handle` now reaches through its first `__cxa_atexit`
    /// slot, if it has one (for tests: a registration made exactly as the library makes it).
    #[cfg(test)]
    pub(super) fn registrar(
        handle: *mut c_void,
    ) -> Option<unsafe extern "C" fn(Dtor, *mut c_void, *mut c_void) -> c_int> {
        let (base, ld) = link_map(handle)?;
        // SAFETY: as in `guard`.
        let slot = *unsafe { slots(base, ld, c"__cxa_atexit") }.first()?;
        // SAFETY: a resolved GOT slot holds the address of a function of this type.
        let f = unsafe { *(slot as *const usize) };
        (f != 0).then(|| unsafe { std::mem::transmute::<usize, _>(f) })
    }
}

/// Points the `__cxa_atexit` imports of the library `handle` (from `dlopen`, never
/// closed) at rill's wrapper, so that every teardown entry the library registers from
/// now on runs rill's exit shutdown first. Returns the number of import slots redirected:
/// 0 when the library does not import `__cxa_atexit` or on a platform without this.
/// Call it before any other thread can use the library.
#[allow(dead_code)] // called by the backends that load libraries; a CPU-only build has none
pub(crate) fn guard(handle: *mut std::ffi::c_void) -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64", not(loom)))]
    {
        std::panic::catch_unwind(|| elf::guard(handle)).unwrap_or(0)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64", not(loom))))]
    {
        let _ = handle;
        0
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu", target_pointer_width = "64", not(loom)))]
mod tests {
    use std::ffi::c_void;
    use std::process::Command;

    /// The C++ runtime every Linux toolchain that links Rust has, which imports
    /// `__cxa_atexit` like NVRTC and cuBLAS do.
    fn open_cxx_runtime() -> *mut c_void {
        for name in [c"libstdc++.so.6", c"libc++.so.1"] {
            // SAFETY: a plain dlopen, kept for ever.
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE) };
            if !h.is_null() {
                return h;
            }
        }
        panic!("no C++ runtime (libstdc++.so.6 or libc++.so.1) to test the redirection on");
    }

    unsafe extern "C" fn report(_: *mut c_void) {
        // What the library's destructor sees: whether rill's shutdown already ran.
        let line = format!("teardown saw down={}\n", crate::runtime::lifecycle::is_down());
        // SAFETY: a write of a plain buffer to stdout.
        unsafe { libc::write(1, line.as_ptr().cast(), line.len()) };
    }

    /// The library the child registers through: NVRTC as rill opened it (after GPU 0
    /// initialised), or the C++ runtime, guarded here unless the test wants it unguarded.
    fn child_library() -> *mut c_void {
        if std::env::var_os("RILL_TEARDOWN_NVRTC").is_some() {
            crate::Device::gpu(0).expect("GPU 0");
            return crate::backend::library_handle("nvrtc").expect("NVRTC is loaded after GPU 0 initialised");
        }
        let h = open_cxx_runtime();
        if std::env::var_os("RILL_TEARDOWN_UNGUARDED").is_none() {
            assert!(super::guard(h) > 0, "the C++ runtime imports __cxa_atexit");
        }
        h
    }

    /// The child: start the runtime (which registers rill's exit hook), then register a
    /// teardown entry exactly as the library would, after the hook, and exit.
    #[test]
    fn child_registers_a_late_teardown_and_exits() {
        if std::env::var_os("RILL_TEARDOWN_CHILD").is_none() {
            return;
        }
        let h = child_library();
        let x = crate::Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap().mul(2.0).unwrap();
        x.eval().unwrap();
        let reg = super::elf::registrar(h).expect("a resolved __cxa_atexit slot");
        // SAFETY: the library's own registration call, with a plain destructor.
        assert_eq!(unsafe { reg(report, std::ptr::null_mut(), std::ptr::null_mut()) }, 0);
        // SAFETY: ends the test process here, running its exit handlers.
        unsafe { libc::exit(0) };
    }

    fn run_child(env: &[(&str, &str)]) -> String {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "runtime::teardown::tests::child_registers_a_late_teardown_and_exits", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("RILL_TEARDOWN_CHILD", "1")
            .envs(env.iter().copied());
        let out = c.output().unwrap();
        assert!(out.status.success(), "child failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_teardown_registered_after_the_hook_runs_after_the_shutdown() {
        let out = run_child(&[]);
        assert!(out.contains("teardown saw down=true"), "guarded: {out}");
        // The situation the redirection exists for: unguarded, the entry runs first.
        let out = run_child(&[("RILL_TEARDOWN_UNGUARDED", "1")]);
        assert!(out.contains("teardown saw down=false"), "unguarded: {out}");
    }

    /// The same through NVRTC's own import, as rill opened it (GPU only).
    #[test]
    fn an_nvrtc_teardown_registered_late_runs_after_the_shutdown() {
        if let Err(e) = crate::Device::gpu(0) {
            assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "RILL_REQUIRE_GPU=1 but no GPU: {e}");
            eprintln!("skipped: no GPU ({e})");
            return;
        }
        let out = run_child(&[("RILL_TEARDOWN_NVRTC", "1")]);
        assert!(out.contains("teardown saw down=true"), "NVRTC: {out}");
    }
}
