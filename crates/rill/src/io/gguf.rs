//! The GGUF format (versions 2 and 3): a little-endian header, typed metadata, a tensor
//! table, then the tensor data at an aligned offset.
//!
//! ```text
//! "GGUF" | version: u32 | tensors: u64 | metadata entries: u64
//! metadata entry: key: string | type: u32 | value          (string = u64 length + UTF-8)
//! tensor entry:   name: string | dims: u32 | ne[dims]: u64 | type: u32 | offset: u64
//! padding to `general.alignment` (default 32) | data
//! ```
//!
//! [`Gguf::open`] memory-maps the file and checks everything before anything is read: every
//! length and count against the bytes left (so a lying count allocates nothing large and
//! reads nothing out of range), nesting depth of arrays, UTF-8 of strings, duplicate keys
//! and names, the alignment, every tensor's element count (overflow is an error), type,
//! block divisibility, alignment of its offset and its byte range against the data, and
//! the ranges together (no two overlap). After that every tensor read stays inside the
//! file by construction.
//!
//! GGUF lists a tensor's dimensions innermost first (`ne[0]` varies fastest); rill's
//! [`GgufTensor::shape`] is the row-major shape, outermost first.

use std::collections::HashMap;
use std::path::Path;

use super::safetensors::Bytes;
use crate::array::Array;
use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{on_device, target_stream};
use crate::quant::{self, QuantFormat};
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;

const LOAD: &str = "gguf::load";
const GET: &str = "gguf::get";

/// Alignment of the data section when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Array values nest at most this deep (the format uses one level; more is refused).
const MAX_DEPTH: usize = 4;
/// Dimensions of a tensor at most (GGML's own limit).
const MAX_DIMS: u32 = 4;

/// A tensor's element type in a GGUF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// A block-quantized format rill reads.
    Quant(QuantFormat),
    /// Any other type code: listed, sized when its block size is known, not loadable.
    Other(u32),
}

impl GgmlType {
    /// The type of a GGUF type code.
    pub fn from_code(code: u32) -> GgmlType {
        match code {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Quant(QuantFormat::Q4_0),
            3 => GgmlType::Quant(QuantFormat::Q4_1),
            8 => GgmlType::Quant(QuantFormat::Q8_0),
            30 => GgmlType::BF16,
            c => GgmlType::Other(c),
        }
    }

    /// The type's GGUF code.
    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Quant(QuantFormat::Q4_0) => 2,
            GgmlType::Quant(QuantFormat::Q4_1) => 3,
            GgmlType::Quant(QuantFormat::Q8_0) => 8,
            GgmlType::BF16 => 30,
            GgmlType::Other(c) => c,
        }
    }

    /// Values per block and bytes per block (1 value for the plain float types), or
    /// `None` for a type code whose layout rill does not know.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Quant(f) => Some((quant::BLOCK, f.block_bytes())),
            GgmlType::Other(c) => other_block(c),
        }
    }

    /// The type's name as GGUF tools write it.
    pub fn name(self) -> String {
        match self {
            GgmlType::F32 => "F32".into(),
            GgmlType::F16 => "F16".into(),
            GgmlType::BF16 => "BF16".into(),
            GgmlType::Quant(f) => f.name().into(),
            GgmlType::Other(c) => match OTHER.iter().find(|o| o.0 == c) {
                Some(o) => o.1.into(),
                None => format!("type {c}"),
            },
        }
    }
}

/// Type codes rill lists but does not load: (code, name, values per block, bytes per block).
const OTHER: &[(u32, &str, usize, usize)] = &[
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
];

fn other_block(code: u32) -> Option<(usize, usize)> {
    OTHER.iter().find(|o| o.0 == code).map(|o| (o.2, o.3))
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// The items of an array (all of one type in the file).
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v as f64),
            Value::I16(v) => Some(v as f64),
            Value::I32(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    /// The items of an array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One tensor as the table describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    name: String,
    shape: Vec<usize>,
    ty: GgmlType,
    /// Byte offset from the start of the data section.
    offset: usize,
    nbytes: usize,
}

impl GgufTensor {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The row-major shape (outermost first; the file lists it the other way round).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }
    /// The number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes in the file.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }
    /// Byte offset from the start of the data section.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// An opened GGUF file: its checked header and its (mapped) bytes.
///
/// A mapped file must not be truncated or rewritten by another process while it is open.
pub struct Gguf {
    source: String,
    bytes: Bytes,
    version: u32,
    alignment: u64,
    data_start: usize,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensor>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("source", &self.source)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn io_err(op: &'static str, source: &str, msg: impl Into<String>) -> Error {
    Error::Io { op, path: source.to_string(), msg: msg.into() }
}

/// Memory-maps and checks a GGUF file (see the module docs); reads no tensor data.
pub fn load(path: impl AsRef<Path>) -> Result<Gguf> {
    Gguf::open(path)
}

impl Gguf {
    /// Memory-maps and checks a GGUF file; reads no tensor data.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let (source, bytes) = Bytes::map(LOAD, path.as_ref(), 24, "a GGUF header")?;
        Gguf::parse(source, bytes)
    }

    /// Checks a GGUF file held in memory (`name` is used in messages).
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Gguf> {
        Gguf::parse(name.to_string(), Bytes::Owned(bytes))
    }

    fn parse(source: String, bytes: Bytes) -> Result<Gguf> {
        let h = parse(bytes.as_slice()).map_err(|m| io_err(LOAD, &source, m))?;
        let meta_index = h.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let index = h.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Gguf {
            source,
            bytes,
            version: h.version,
            alignment: h.alignment,
            data_start: h.data_start,
            metadata: h.metadata,
            meta_index,
            tensors: h.tensors,
            index,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// The data section's alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// The metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }
    /// One metadata value, if the file has it.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }
    /// A metadata value that must be there: an error naming the key otherwise.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.value(key).ok_or_else(|| io_err(GET, &self.source, format!("no metadata entry {key:?}")))
    }
    /// A required non-negative integer entry (of any integer width).
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| io_err(GET, &self.source, format!("metadata {key:?} is {v:?}, not a non-negative integer")))
    }
    /// A required numeric entry.
    pub fn require_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| io_err(GET, &self.source, format!("metadata {key:?} is {v:?}, not a number")))
    }
    /// A required string entry.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| io_err(GET, &self.source, format!("metadata {key:?} is {v:?}, not a string")))
    }
    /// The file's path (or the name given to [`Gguf::from_bytes`]), as messages show it.
    pub fn source(&self) -> &str {
        &self.source
    }
    /// The tensors, in table order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }
    /// One tensor's table entry, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    fn lookup(&self, name: &str) -> Result<&GgufTensor> {
        self.tensor(name).ok_or_else(|| io_err(GET, &self.source, format!("no tensor named {name:?}")))
    }

    /// The raw bytes of one tensor, straight from the file.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.lookup(name)?;
        let at = self.data_start + t.offset;
        // In range: `parse` checked `data_start + offset + nbytes <= file length`.
        Ok(&self.bytes.as_slice()[at..at + t.nbytes])
    }

    /// One tensor's values as f32 on the host (dequantized or widened), row-major.
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.lookup(name)?;
        let b = self.bytes(name)?;
        let mut out = vec![0f32; t.numel()];
        match t.ty {
            GgmlType::F32 => out.iter_mut().zip(b.chunks_exact(4)).for_each(|(o, c)| {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }),
            GgmlType::F16 => out.iter_mut().zip(b.chunks_exact(2)).for_each(|(o, c)| {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }),
            GgmlType::BF16 => out.iter_mut().zip(b.chunks_exact(2)).for_each(|(o, c)| {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }),
            GgmlType::Quant(f) => quant::dequantize(f, b, &mut out)?,
            GgmlType::Other(_) => {
                return Err(io_err(
                    GET,
                    &self.source,
                    format!("tensor {name:?} has type {}, which rill does not read", t.ty.name()),
                ));
            }
        }
        Ok(out)
    }

    /// One tensor as an f32 array on the target stream (the current
    /// [`with_stream`](crate::with_stream) override, else the default device).
    pub fn get(&self, name: &str) -> Result<Array> {
        let stream = target_stream(&[])?;
        self.get_on(name, &stream)
    }

    /// One tensor as an f32 array (dequantized or widened) on `stream`.
    pub fn get_on(&self, name: &str, stream: &Stream) -> Result<Array> {
        crate::runtime::lifecycle::check_running()?;
        let t = self.lookup(name)?;
        let values = self.to_f32(name)?;
        let mut buf = CpuBuffer::alloc(DType::F32, values.len())?;
        buf.typed_mut::<f32>().copy_from_slice(&values);
        let host = Array::from_storage(
            Storage::contiguous(Buffer::Cpu(buf), DType::F32, &t.shape),
            Device::cpu().default_stream()?,
        );
        Ok(on_device(&host, stream))
    }
}

struct Header {
    version: u32,
    alignment: u64,
    data_start: usize,
    metadata: Vec<(String, Value)>,
    tensors: Vec<GgufTensor>,
}

/// A bounds-checked little-endian reader: every read fails instead of passing the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

type Parse<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
    fn take(&mut self, n: usize, what: &str) -> Parse<&'a [u8]> {
        if n > self.left() {
            return Err(format!("truncated: {what} at byte {} needs {n} bytes, {} left", self.at, self.left()));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Parse<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A count of items each at least `min` bytes long, checked against the bytes left.
    fn count(&mut self, what: &str, min: usize) -> Parse<usize> {
        let at = self.at;
        let n = self.u64(what)?;
        let max = (self.left() / min.max(1)) as u64;
        if n > max {
            return Err(format!("{what} at byte {at} is {n}, more than the {} bytes left can hold", self.left()));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Parse<String> {
        let at = self.at;
        let n = self.count(what, 1)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| format!("{what} at byte {at} is not UTF-8"))
    }
}

/// Smallest encoded size of a value of type `ty` (for bounding counts), or an error.
fn min_size(ty: u32) -> Parse<usize> {
    Ok(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return Err(format!("unknown metadata value type {ty}")),
    })
}

fn value(c: &mut Cursor<'_>, ty: u32, depth: usize) -> Parse<Value> {
    Ok(match ty {
        0 => Value::U8(c.arr::<1>("u8")?[0]),
        1 => Value::I8(c.arr::<1>("i8")?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.arr("u16")?)),
        3 => Value::I16(i16::from_le_bytes(c.arr("i16")?)),
        4 => Value::U32(c.u32("u32")?),
        5 => Value::I32(i32::from_le_bytes(c.arr("i32")?)),
        6 => Value::F32(f32::from_le_bytes(c.arr("f32")?)),
        7 => match c.arr::<1>("bool")?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => return Err(format!("bool at byte {} is {b}, not 0 or 1", c.at - 1)),
        },
        8 => Value::String(c.string("string")?),
        9 => {
            if depth >= MAX_DEPTH {
                return Err(format!("arrays nested deeper than {MAX_DEPTH} at byte {}", c.at));
            }
            let item = c.u32("array item type")?;
            let n = c.count("array length", min_size(item)?)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(value(c, item, depth + 1)?);
            }
            Value::Array(v)
        }
        10 => Value::U64(c.u64("u64")?),
        11 => Value::I64(i64::from_le_bytes(c.arr("i64")?)),
        12 => Value::F64(f64::from_le_bytes(c.arr("f64")?)),
        _ => return Err(format!("unknown metadata value type {ty} at byte {}", c.at - 4)),
    })
}

fn parse(b: &[u8]) -> Parse<Header> {
    let mut c = Cursor { b, at: 0 };
    let magic = c.arr::<4>("magic")?;
    if &magic != b"GGUF" {
        return Err(format!("not a GGUF file: starts with {magic:02x?}, not \"GGUF\""));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version}; rill reads versions 2 and 3"));
    }
    // A tensor entry is at least 8 + 4 + 4 + 8 bytes, a metadata entry 8 + 4 + 1.
    let n_tensors = c.count("tensor count", 24)?;
    let n_meta = c.count("metadata count", 13)?;
    let mut metadata = Vec::with_capacity(n_meta);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..n_meta {
        let key = c.string("metadata key")?;
        let ty = c.u32("metadata value type")?;
        let v = value(&mut c, ty, 0).map_err(|m| format!("metadata {key:?}: {m}"))?;
        if !seen.insert(key.clone()) {
            return Err(format!("metadata key {key:?} appears twice"));
        }
        metadata.push((key, v));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => *a as u64,
        Some((_, v)) => return Err(format!("general.alignment is {v:?}; it must be a u32 power of two")),
    };

    struct Raw {
        name: String,
        ne: Vec<u64>,
        ty: GgmlType,
        offset: u64,
    }
    let mut raw = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::new();
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        let dims = c.u32("tensor dimensions")?;
        if dims > MAX_DIMS {
            return Err(format!("tensor {name:?} has {dims} dimensions, more than {MAX_DIMS}"));
        }
        let ne = (0..dims).map(|_| c.u64("tensor dimension")).collect::<Parse<Vec<u64>>>()?;
        let ty = GgmlType::from_code(c.u32("tensor type")?);
        let offset = c.u64("tensor offset")?;
        if !names.insert(name.clone()) {
            return Err(format!("tensor name {name:?} appears twice"));
        }
        raw.push(Raw { name, ne, ty, offset });
    }
    let table_end = c.at as u64;
    let data_start = table_end.div_ceil(alignment) * alignment;
    let file = b.len() as u64;
    if !raw.is_empty() && data_start > file {
        return Err(format!("truncated: the data section starts at byte {data_start}, past the end ({file} bytes)"));
    }
    let data_len = file.saturating_sub(data_start);

    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        let name = &r.name;
        let mut n: u64 = 1;
        for &d in &r.ne {
            n = n.checked_mul(d).ok_or_else(|| format!("tensor {name:?}: dimensions {:?} overflow", r.ne))?;
        }
        let Some((per, bytes)) = r.ty.block() else {
            return Err(format!("tensor {name:?} has type code {}, whose layout rill does not know", r.ty.code()));
        };
        let ne0 = r.ne.first().copied().unwrap_or(1);
        if ne0 % per as u64 != 0 {
            return Err(format!(
                "tensor {name:?}: its rows of {ne0} values are not whole blocks of {per} ({})",
                r.ty.name()
            ));
        }
        let nbytes =
            (n / per as u64).checked_mul(bytes as u64).ok_or_else(|| format!("tensor {name:?}: its size overflows"))?;
        if r.offset % alignment != 0 {
            return Err(format!("tensor {name:?}: offset {} is not a multiple of the alignment {alignment}", r.offset));
        }
        match r.offset.checked_add(nbytes) {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(format!(
                    "tensor {name:?}: bytes [{}, +{nbytes}) pass the end of the {data_len}-byte data section",
                    r.offset
                ));
            }
        }
        let shape = r.ne.iter().rev().map(|&d| d as usize).collect::<Vec<_>>();
        // In range of usize: every extent is at most the file length.
        tensors.push(GgufTensor { name: r.name, shape, ty: r.ty, offset: r.offset as usize, nbytes: nbytes as usize });
    }
    let mut order: Vec<&GgufTensor> = tensors.iter().filter(|t| t.nbytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].nbytes > w[1].offset {
            return Err(format!("tensors {:?} and {:?} overlap", w[0].name, w[1].name));
        }
    }
    Ok(Header { version, alignment, data_start: data_start as usize, metadata, tensors })
}

/// Writes a GGUF v3 file's bytes: `metadata` entries, then `tensors` as (name, row-major
/// shape, type, raw bytes) with the data aligned to [`DEFAULT_ALIGNMENT`]. For tests and
/// tools that make small files; the bytes of each tensor must match its shape and type.
pub fn to_bytes(metadata: &[(&str, Value)], tensors: &[(&str, &[usize], GgmlType, &[u8])]) -> Result<Vec<u8>> {
    const OP: &str = "gguf::to_bytes";
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn code(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }
    fn put(out: &mut Vec<u8>, v: &Value) -> Result<()> {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => string(out, s),
            Value::Array(items) => {
                let item = items.first().map_or(4, code);
                if items.iter().any(|i| code(i) != item) {
                    return Err(Error::invalid(OP, "an array's items must all have one type"));
                }
                out.extend_from_slice(&item.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for i in items {
                    put(out, i)?;
                }
            }
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
        Ok(())
    }
    let align = DEFAULT_ALIGNMENT as usize;
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut out, k);
        out.extend_from_slice(&code(v).to_le_bytes());
        put(&mut out, v)?;
    }
    let mut offset = 0usize;
    for (name, shape, ty, data) in tensors {
        let Some((per, bytes)) = ty.block() else {
            return Err(Error::invalid(OP, format!("tensor {name:?}: unknown layout of {}", ty.name())));
        };
        let n: usize = shape.iter().product();
        if shape.last().copied().unwrap_or(1) % per != 0 || n / per * bytes != data.len() {
            return Err(Error::invalid(
                OP,
                format!("tensor {name:?}: {} bytes do not hold shape {shape:?} of {}", data.len(), ty.name()),
            ));
        }
        string(&mut out, name);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&ty.code().to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += data.len().div_ceil(align) * align;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(align) * align, 0);
    }
    Ok(out)
}
