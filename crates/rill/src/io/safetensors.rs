//! The safetensors format: an 8-byte little-endian header length `n`, `n` bytes of JSON
//! naming each tensor's dtype, shape and `[begin, end)` byte range within the data that
//! follows, then the data (row-major, little-endian, no holes).
//!
//! [`load`] memory-maps the file and checks the whole header before anything is read:
//! the header length against the file size, the JSON, every dtype, every shape (a product
//! that overflows is an error), every byte range against its shape and dtype and against
//! the data size, and the ranges together (sorted, they must tile the data exactly, so no
//! two overlap). After that every read stays inside the file by construction. Listing
//! names, shapes and dtypes reads no tensor data; [`Tensors::get`] copies one tensor's
//! bytes into a new array.
//!
//! The header is parsed here with serde_json rather than by the `safetensors` crate: its
//! final length check adds untrusted offsets without checking for overflow, so a lying
//! header can wrap it and reach an out-of-range slice (a panic).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::array::Array;
use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{on_device, target_stream};
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::sync::atomic::{AtomicU64, Ordering};

/// Headers larger than this are refused (the reference implementation's limit).
pub const MAX_HEADER_BYTES: usize = 100_000_000;

const LOAD: &str = "safetensors::load";
const SAVE: &str = "safetensors::save";
const GET: &str = "safetensors::get";

/// The element types of the safetensors format, with their size in bits. rill reads the
/// ones it has a [`DType`] for; the others can be listed but not loaded.
const FILE_DTYPES: &[(&str, u32, Option<DType>)] = &[
    ("BOOL", 8, Some(DType::Bool)),
    ("U8", 8, Some(DType::U8)),
    ("I8", 8, None),
    ("I16", 16, None),
    ("U16", 16, None),
    ("F16", 16, Some(DType::F16)),
    ("BF16", 16, Some(DType::BF16)),
    ("I32", 32, Some(DType::I32)),
    ("U32", 32, Some(DType::U32)),
    ("F32", 32, Some(DType::F32)),
    ("F64", 64, Some(DType::F64)),
    ("I64", 64, Some(DType::I64)),
    ("U64", 64, None),
    ("C64", 64, None),
    ("F8_E5M2", 8, None),
    ("F8_E4M3", 8, None),
    ("F8_E8M0", 8, None),
    ("F8_E4M3FNUZ", 8, None),
    ("F8_E5M2FNUZ", 8, None),
    ("F6_E2M3", 6, None),
    ("F6_E3M2", 6, None),
    ("F4", 4, None),
];

/// The file's name of a rill dtype.
fn file_name_of(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "BOOL",
        DType::U8 => "U8",
        DType::U32 => "U32",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F32 => "F32",
        DType::F64 => "F64",
    }
}

/// One tensor as the header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    file_dtype: &'static str,
    dtype: Option<DType>,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
}

impl TensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The dtype as the file spells it (`F32`, `BF16`, `I8`, ...).
    pub fn file_dtype(&self) -> &'static str {
        self.file_dtype
    }
    /// The rill dtype, or `None` for a format dtype rill has no arrays of (I8, U16, F8...).
    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The size of the data in bytes.
    pub fn nbytes(&self) -> usize {
        self.end - self.begin
    }
    /// The `[begin, end)` byte range within the data section (after the header).
    pub fn data_offsets(&self) -> (usize, usize) {
        (self.begin, self.end)
    }
}

/// A model file's bytes: memory-mapped, or held in memory (`gguf.rs` shares it).
pub(crate) enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    /// Memory-maps the file at `path` (named in errors of `op`), refusing one shorter than
    /// `min` bytes (`what` says what those bytes hold). The contract of every reader is
    /// that the file is not truncated while it is mapped.
    pub(crate) fn map(op: &'static str, path: &Path, min: u64, what: &str) -> Result<(String, Bytes)> {
        let source = path.display().to_string();
        let file = File::open(path).map_err(|e| io_err(op, &source, format!("cannot open: {e}")))?;
        let len = file.metadata().map_err(|e| io_err(op, &source, format!("cannot stat: {e}")))?.len();
        if len < min {
            return Err(io_err(op, &source, format!("truncated: {len} bytes, less than {what}")));
        }
        // SAFETY: the map is read-only and private to the value it is put in; its readers
        // document that the file must not be truncated while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err(op, &source, format!("cannot map: {e}")))?;
        Ok((source, Bytes::Mapped(map)))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An opened safetensors file: its checked header and its (mapped) bytes.
///
/// A mapped file must not be truncated or rewritten by another process while it is
/// open (the operating system then faults on access); [`save`] itself replaces files by
/// an atomic rename, which leaves an open mapping intact.
pub struct Tensors {
    source: String,
    bytes: Bytes,
    data_start: usize,
    /// In file order (by data offset).
    infos: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    metadata: Vec<(String, String)>,
}

impl std::fmt::Debug for Tensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensors").field("source", &self.source).field("tensors", &self.infos.len()).finish()
    }
}

/// Memory-maps and checks a safetensors file (see the module docs); reads no tensor data.
pub fn load(path: impl AsRef<Path>) -> Result<Tensors> {
    Tensors::open(path)
}

fn io_err(op: &'static str, source: &str, msg: impl Into<String>) -> Error {
    Error::Io { op, path: source.to_string(), msg: msg.into() }
}

impl Tensors {
    /// Memory-maps and checks a safetensors file; reads no tensor data.
    pub fn open(path: impl AsRef<Path>) -> Result<Tensors> {
        let (source, bytes) = Bytes::map(LOAD, path.as_ref(), 8, "the 8-byte header length")?;
        Tensors::parse(source, bytes)
    }

    /// Checks a safetensors file held in memory (`name` is used in messages).
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Tensors> {
        Tensors::parse(name.to_string(), Bytes::Owned(bytes))
    }

    fn parse(source: String, bytes: Bytes) -> Result<Tensors> {
        let (data_start, infos, metadata) = parse_header(bytes.as_slice()).map_err(|m| io_err(LOAD, &source, m))?;
        let index = infos.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Tensors { source, bytes, data_start, infos, index, metadata })
    }

    /// The tensors in file order (by data offset).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }
    /// The tensor names in file order.
    pub fn names(&self) -> Vec<&str> {
        self.infos.iter().map(|t| t.name.as_str()).collect()
    }
    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.infos.len()
    }
    /// True when the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }
    /// The header of one tensor, if the file has it.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.infos[i])
    }
    /// True when the file has a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }
    /// The `__metadata__` entries (string to string), in file order.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }
    /// The raw little-endian bytes of one tensor, straight from the file.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.lookup(name)?;
        // In range: parse_header checked `end <= data length` and `begin <= end`.
        Ok(&self.bytes.as_slice()[self.data_start + t.begin..self.data_start + t.end])
    }

    fn lookup(&self, name: &str) -> Result<&TensorInfo> {
        self.info(name).ok_or_else(|| io_err(GET, &self.source, format!("no tensor named {name:?}")))
    }

    /// One tensor as an array, on the target stream (the current
    /// [`with_stream`](crate::with_stream) override, else the default device), as
    /// [`Array::from_slice`] places host data.
    pub fn get(&self, name: &str) -> Result<Array> {
        let stream = target_stream(&[])?;
        self.get_on(name, &stream)
    }

    /// One tensor as an array on `stream` (and so on its device). The bytes are copied
    /// from the mapping into one aligned host buffer; for a GPU stream that buffer is the
    /// source of the host-to-device copy, which runs when the array is evaluated (see
    /// [`Tensors::load_all`] to evaluate them together).
    pub fn get_on(&self, name: &str, stream: &Stream) -> Result<Array> {
        crate::runtime::lifecycle::check_running()?;
        let t = self.lookup(name)?;
        let dtype = t.dtype.ok_or_else(|| {
            io_err(
                GET,
                &self.source,
                format!("tensor {name:?} has dtype {}, which rill has no arrays of", t.file_dtype),
            )
        })?;
        let n = crate::shape::checked_size(GET, &t.shape, dtype)?;
        let src = self.bytes(name)?;
        let mut buf = CpuBuffer::alloc(dtype, n)?;
        let dst = buf.bytes_mut();
        if dtype == DType::Bool {
            // rill's bools are 0 or 1; the format allows any non-zero byte for true.
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = (s != 0) as u8;
            }
        } else {
            dst.copy_from_slice(src);
        }
        let host = Array::from_storage(
            Storage::contiguous(Buffer::Cpu(buf), dtype, &t.shape),
            Device::cpu().default_stream()?,
        );
        Ok(on_device(&host, stream))
    }

    /// Every tensor that has a rill dtype, on `stream`, evaluated together (for a GPU
    /// stream: every host-to-device copy enqueued and finished, and the host staging
    /// buffers freed). Errors on the first tensor whose dtype rill lacks.
    pub fn load_all(&self, stream: &Stream) -> Result<HashMap<String, Array>> {
        let arrays: Vec<Array> = self.infos.iter().map(|t| self.get_on(&t.name, stream)).collect::<Result<_>>()?;
        crate::eval(&arrays)?;
        Ok(self.infos.iter().map(|t| t.name.clone()).zip(arrays).collect())
    }
}

/// The header's top-level entries, in file order, with duplicates kept (so they can be
/// refused: a JSON map would silently keep the last one).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = map.next_entry::<String, Value>()? {
                    v.push((k, val));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

type Parsed = (usize, Vec<TensorInfo>, Vec<(String, String)>);

/// Checks a whole file's header against its size; returns where the data starts, the
/// tensors sorted by offset, and the metadata. Errors are messages (the caller adds the
/// file's name).
fn parse_header(buf: &[u8]) -> std::result::Result<Parsed, String> {
    let len = buf.len();
    let Some(head) = buf.get(..8) else {
        return Err(format!("truncated: {len} bytes, less than the 8-byte header length"));
    };
    let n64 = u64::from_le_bytes(head.try_into().map_err(|_| "unreadable header length".to_string())?);
    let room = len - 8;
    if n64 > room as u64 {
        return Err(format!("the header length {n64} runs past the end of the file ({room} bytes follow it)"));
    }
    let n = n64 as usize;
    if n > MAX_HEADER_BYTES {
        return Err(format!("the header is {n} bytes, more than the limit of {MAX_HEADER_BYTES}"));
    }
    let header = std::str::from_utf8(&buf[8..8 + n]).map_err(|e| format!("the header is not UTF-8: {e}"))?;
    let Entries(entries) = serde_json::from_str(header).map_err(|e| format!("the header is not valid JSON: {e}"))?;
    let data_start = 8 + n;
    let data_len = len - data_start;

    let mut infos = Vec::with_capacity(entries.len());
    let mut metadata = Vec::new();
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(format!("the header names {name:?} twice"));
        }
        if name == "__metadata__" {
            metadata = parse_metadata(&value)?;
            continue;
        }
        infos.push(parse_tensor(name, &value, data_len)?);
    }
    // Sorted by range, the tensors must tile [0, data_len) exactly: no overlap, no gap.
    infos.sort_by_key(|t| (t.begin, t.end));
    let mut at = 0usize;
    for t in &infos {
        if t.begin != at {
            let what = if t.begin < at { "overlaps the tensor before it" } else { "leaves a gap before it" };
            return Err(format!("tensor {:?} at bytes [{}, {}) {what} (which ends at {at})", t.name, t.begin, t.end));
        }
        at = t.end;
    }
    if at != data_len {
        return Err(format!("the tensors cover {at} bytes of data but the file holds {data_len} after the header"));
    }
    Ok((data_start, infos, metadata))
}

fn parse_metadata(value: &Value) -> std::result::Result<Vec<(String, String)>, String> {
    let obj = value.as_object().ok_or("__metadata__ is not an object")?;
    obj.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(format!("__metadata__ entry {k:?} is not a string")),
        })
        .collect()
}

fn parse_tensor(name: String, value: &Value, data_len: usize) -> std::result::Result<TensorInfo, String> {
    let obj = value.as_object().ok_or_else(|| format!("tensor {name:?}: the entry is not an object"))?;
    let field = |f: &str| obj.get(f).ok_or_else(|| format!("tensor {name:?}: no {f:?} field"));
    let dtype_str = field("dtype")?.as_str().ok_or_else(|| format!("tensor {name:?}: \"dtype\" is not a string"))?;
    let &(file_dtype, bits, dtype) = FILE_DTYPES
        .iter()
        .find(|d| d.0 == dtype_str)
        .ok_or_else(|| format!("tensor {name:?}: unknown dtype {dtype_str:?}"))?;
    let uint = |v: &Value, what: &str| -> std::result::Result<usize, String> {
        v.as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| format!("tensor {name:?}: {what} {v} is not a non-negative integer that fits usize"))
    };
    let shape: Vec<usize> = field("shape")?
        .as_array()
        .ok_or_else(|| format!("tensor {name:?}: \"shape\" is not an array"))?
        .iter()
        .map(|d| uint(d, "dimension"))
        .collect::<std::result::Result<_, _>>()?;
    let offsets = field("data_offsets")?
        .as_array()
        .filter(|a| a.len() == 2)
        .ok_or_else(|| format!("tensor {name:?}: \"data_offsets\" is not an array of two integers"))?;
    let (begin, end) = (uint(&offsets[0], "offset")?, uint(&offsets[1], "offset")?);
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("tensor {name:?}: the element count of shape {shape:?} overflows"))?;
    let nbits = numel
        .checked_mul(bits as usize)
        .ok_or_else(|| format!("tensor {name:?}: the size of shape {shape:?} of {file_dtype} overflows"))?;
    if nbits % 8 != 0 {
        return Err(format!("tensor {name:?}: {numel} elements of {file_dtype} do not fill whole bytes"));
    }
    let nbytes = nbits / 8;
    if begin > end {
        return Err(format!("tensor {name:?}: data_offsets [{begin}, {end}) run backwards"));
    }
    if end > data_len {
        return Err(format!("tensor {name:?}: data_offsets [{begin}, {end}) end past the {data_len} bytes of data"));
    }
    if end - begin != nbytes {
        return Err(format!(
            "tensor {name:?}: shape {shape:?} of {file_dtype} needs {nbytes} bytes but data_offsets [{begin}, {end}) hold {}",
            end - begin
        ));
    }
    Ok(TensorInfo { name, file_dtype, dtype, shape, begin, end })
}

/// The bytes of a safetensors file holding `tensors` (evaluated, row-major, in the given
/// order). Names must be distinct and not `__metadata__`.
pub fn to_bytes(tensors: &[(&str, &Array)]) -> Result<Vec<u8>> {
    serialize(tensors, "<memory>")
}

fn serialize(tensors: &[(&str, &Array)], source: &str) -> Result<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    for (name, _) in tensors {
        if *name == "__metadata__" {
            return Err(io_err(SAVE, source, "\"__metadata__\" is reserved and cannot name a tensor"));
        }
        if !seen.insert(*name) {
            return Err(io_err(SAVE, source, format!("the tensor name {name:?} is given twice")));
        }
    }
    crate::eval(&tensors.iter().map(|(_, a)| (*a).clone()).collect::<Vec<_>>())?;
    let mut data: Vec<Vec<u8>> = Vec::with_capacity(tensors.len());
    let mut header = String::from("{");
    let mut at = 0usize;
    for (i, (name, a)) in tensors.iter().enumerate() {
        let bytes = host_bytes(a)?;
        let end = at + bytes.len();
        let name_json = serde_json::to_string(name).map_err(|e| io_err(SAVE, source, e.to_string()))?;
        let shape = a.shape().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
        if i > 0 {
            header.push(',');
        }
        let _ = write!(
            header,
            "{name_json}:{{\"dtype\":\"{}\",\"shape\":[{shape}],\"data_offsets\":[{at},{end}]}}",
            file_name_of(a.dtype())
        );
        at = end;
        data.push(bytes);
    }
    header.push('}');
    // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let mut out = Vec::new();
    out.try_reserve_exact(8 + header.len() + at)
        .map_err(|_| Error::OutOfMemory { device: "cpu".into(), bytes: 8 + header.len() + at })?;
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for d in data {
        out.extend_from_slice(&d);
    }
    Ok(out)
}

/// The elements of `a` as little-endian bytes, row-major.
fn host_bytes(a: &Array) -> Result<Vec<u8>> {
    fn le<T: crate::Element>(a: &Array) -> Result<Vec<u8>> {
        let v = a.to_vec::<T>()?;
        Ok(bytemuck::cast_slice::<T, u8>(&v).to_vec())
    }
    match a.dtype() {
        DType::Bool | DType::U8 => a.to_vec::<u8>(),
        DType::U32 => le::<u32>(a),
        DType::I32 => le::<i32>(a),
        DType::I64 => le::<i64>(a),
        DType::F16 => le::<half::f16>(a),
        DType::BF16 => le::<half::bf16>(a),
        DType::F32 => le::<f32>(a),
        DType::F64 => le::<f64>(a),
    }
}

/// Writes `tensors` to a safetensors file at `path` (see [`to_bytes`]). The file is
/// written beside `path` under a temporary name and renamed over it, so a reader never
/// sees a partial file and a mapping of the old file stays valid.
pub fn save(path: impl AsRef<Path>, tensors: &[(&str, &Array)]) -> Result<()> {
    let path = path.as_ref();
    let source = path.display().to_string();
    let bytes = serialize(tensors, &source)?;
    write_atomic(path, &bytes).map_err(|e| io_err(SAVE, &source, e))
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a fresh temporary file beside `path`, then renames it over `path`.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::result::Result<(), String> {
    let file_name = path.file_name().ok_or("the path names no file")?.to_string_lossy().into_owned();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{file_name}.{}.{n}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        f.write_all(bytes).map_err(|e| format!("cannot write: {e}"))?;
        f.sync_all().map_err(|e| format!("cannot flush: {e}"))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename {} over it: {e}", tmp.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn wrapping_offsets_are_refused() {
        // Offsets near usize::MAX that an unchecked `end + header + 8` would wrap.
        let (b, e) = (usize::MAX - 15, usize::MAX - 7);
        let h = format!(r#"{{"a":{{"dtype":"U8","shape":[8],"data_offsets":[{b},{e}]}}}}"#);
        let e = parse_header(&file(&h, &[0; 16])).unwrap_err();
        assert!(e.contains("past the"), "{e}");
    }

    #[test]
    fn overlap_and_gap_are_named() {
        let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
        assert!(parse_header(&file(h, &[0; 6])).unwrap_err().contains("overlaps"));
        let h = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#;
        assert!(parse_header(&file(h, &[0; 6])).unwrap_err().contains("gap"));
    }

    #[test]
    fn sub_byte_and_unknown_dtypes() {
        let h = r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#;
        assert!(parse_header(&file(h, &[0])).unwrap_err().contains("whole bytes"));
        let h = r#"{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(parse_header(&file(h, &[0])).unwrap_err().contains("unknown dtype"));
        let h = r#"{"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}"#;
        let (_, infos, _) = parse_header(&file(h, &[0, 0])).unwrap();
        assert_eq!(infos[0].dtype(), None);
    }
}
