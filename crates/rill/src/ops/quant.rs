//! Block-quantized weight matrices ([`QMatrix`]) and the ops that read them in place:
//! [`qmatmul`] (`x @ wᵀ` from the packed blocks, `Primitive::QuantMatmul`) and
//! [`dequantize_packed`] (packed rows to floats, `Primitive::Dequantize`). The shape rules
//! live in `primitives/quant.rs`, the kernels in `backend/cpu/quant.rs` and
//! `backend/cuda/quant.rs`.

use crate::array::Array;
use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::io::gguf::{GgmlType, Gguf};
use crate::ops::{on_device, prepare, target_stream};
use crate::primitives::{Primitive, quant as rule};
use crate::quant::{self, BLOCK, QuantFormat};
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::shape::checked_size;

/// A weight matrix of `rows` (N, output features) by `cols` (K, input features) kept in
/// its packed block format: `data` is a u8 array `[N, K / 32 * format.block_bytes()]`
/// whose row `n` holds the blocks of output feature `n` (the layout of a GGUF `[K, N]`
/// tensor, byte for byte). [`qmatmul`] reads the blocks where they are; nothing
/// dequantizes the whole matrix unless [`QMatrix::dequantize`] is asked to.
///
/// A `QMatrix` is a cheap handle (the bytes are one evaluated array); clones share them.
#[derive(Clone, Debug)]
pub struct QMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    data: Array,
}

const FROM_GGUF: &str = "QMatrix::from_gguf";
const FROM_PACKED: &str = "QMatrix::from_packed";
const QUANTIZE: &str = "QMatrix::quantize";
const QMATMUL: &str = "qmatmul";
const DEQUANTIZE: &str = "dequantize";

fn float_dtype(op: &'static str, what: &str, d: DType) -> Result<()> {
    if rule::float_ok(d) { Ok(()) } else { Err(Error::dtype(op, d, format!("{what} must be f32, bf16 or f16"))) }
}

/// Bytes of a `rows` x `cols` matrix of `format`, checking `cols` is whole blocks.
fn matrix_bytes(op: &'static str, format: QuantFormat, rows: usize, cols: usize) -> Result<(usize, usize)> {
    if !cols.is_multiple_of(BLOCK) {
        return Err(Error::shape(
            op,
            format!("K = {cols} input features is not a multiple of the {BLOCK}-value block of {}", format.name()),
        ));
    }
    let row = cols / BLOCK * format.block_bytes();
    let total = row
        .checked_mul(rows)
        .ok_or_else(|| Error::shape(op, format!("{rows} x {cols} values of {} overflow", format.name())))?;
    Ok((row, total))
}

impl QMatrix {
    /// A 2-D quantized tensor of a GGUF file (GGUF shape `[K, N]`: `ne[0] = K` input
    /// features, row-major `[N, K]`), its packed bytes copied unchanged to `stream`'s
    /// device (the copy is done when this returns). F32, F16 and BF16 tensors are not
    /// packed: they are an error here; read them with [`Gguf::get_on`].
    pub fn from_gguf(g: &Gguf, name: &str, stream: &Stream) -> Result<QMatrix> {
        let t = g
            .tensor(name)
            .ok_or_else(|| Error::invalid(FROM_GGUF, format!("the file has no tensor named {name:?}")))?;
        let format = match t.ggml_type() {
            GgmlType::Quant(f) => f,
            other => {
                return Err(Error::invalid(
                    FROM_GGUF,
                    format!(
                        "tensor {name:?} is {}, not a block-quantized format (Q4_0, Q4_1, Q8_0); \
                         read float tensors with Gguf::get_on",
                        other.name()
                    ),
                ));
            }
        };
        let &[rows, cols] = t.shape() else {
            return Err(Error::shape(
                FROM_GGUF,
                format!("tensor {name:?} has shape {:?}; a QMatrix is 2-D [N, K]", t.shape()),
            ));
        };
        QMatrix::from_bytes(format, rows, cols, g.bytes(name)?, stream)
    }

    /// A matrix from packed host bytes (`rows` rows of `cols / 32` blocks each, row-major),
    /// copied to `stream`'s device (done when this returns).
    pub fn from_bytes(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8], stream: &Stream) -> Result<QMatrix> {
        crate::runtime::lifecycle::check_running()?;
        let (row, total) = matrix_bytes(FROM_PACKED, format, rows, cols)?;
        if bytes.len() != total {
            return Err(Error::invalid(
                FROM_PACKED,
                format!(
                    "a {rows} x {cols} {} matrix takes {total} bytes ({row} a row), got {}",
                    format.name(),
                    bytes.len()
                ),
            ));
        }
        let buf = CpuBuffer::from_slice(bytes)?;
        let host = Array::from_storage(
            Storage::contiguous(Buffer::Cpu(buf), DType::U8, &[rows, row]),
            Device::cpu().default_stream()?,
        );
        let data = on_device(&host, stream);
        data.eval()?;
        Ok(QMatrix { format, rows, cols, data })
    }

    /// A matrix from a u8 array of packed rows `[N, K / 32 * block_bytes]` already where
    /// it should be (for example rows gathered from a larger `QMatrix`'s data).
    pub fn from_packed(format: QuantFormat, data: &Array) -> Result<QMatrix> {
        if data.dtype() != DType::U8 {
            return Err(Error::dtype(FROM_PACKED, data.dtype(), "packed blocks are a u8 array"));
        }
        let &[rows, row] = data.shape() else {
            return Err(Error::shape(
                FROM_PACKED,
                format!("packed rows must be 2-D [N, row bytes], got {:?}", data.shape()),
            ));
        };
        let cols = rule::dequantize(FROM_PACKED, format, &[row])?[0];
        Ok(QMatrix { format, rows, cols, data: data.clone() })
    }

    /// Quantizes a float matrix `w [N, K]` (f32, bf16 or f16; `K` a multiple of 32) into
    /// `format` with the formats' reference rounding ([`quant::quantize`]), on `w`'s
    /// device. This evaluates `w` and quantizes on the host: a load-time conversion.
    pub fn quantize(w: &Array, format: QuantFormat) -> Result<QMatrix> {
        float_dtype(QUANTIZE, "the weight", w.dtype())?;
        let &[rows, cols] = w.shape() else {
            return Err(Error::shape(QUANTIZE, format!("the weight must be 2-D [N, K], got {:?}", w.shape())));
        };
        matrix_bytes(QUANTIZE, format, rows, cols)?;
        let stream = target_stream(&[w])?;
        let values = w.astype(DType::F32)?.to_vec::<f32>()?;
        let bytes = quant::quantize(format, &values)?;
        QMatrix::from_bytes(format, rows, cols, &bytes, &stream)
    }

    /// The matrix as floats `[N, K]` of `dtype` (f32, bf16 or f16), computed on the data's
    /// device (a `Dequantize` node).
    pub fn dequantize(&self, dtype: DType) -> Result<Array> {
        dequantize_packed(&self.data, self.format, dtype)
    }

    /// Rows `ids` (an integer array of any shape) dequantized to `dtype`: shape
    /// `ids.shape() + [K]`. Only the chosen rows are read (a token embedding lookup).
    pub fn rows_of(&self, ids: &Array, dtype: DType) -> Result<Array> {
        let picked = self.data.take(ids, 0)?;
        dequantize_packed(&picked, self.format, dtype)
    }

    /// The same matrix on `stream`'s device (the bytes copied when it is another device;
    /// done when this returns).
    pub fn to_stream(&self, stream: &Stream) -> Result<QMatrix> {
        let data = on_device(&self.data, stream);
        data.eval()?;
        Ok(QMatrix { data, ..self.clone() })
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }
    /// N, the number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// K, the number of columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// `[N, K]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
    /// The packed bytes, u8 `[N, K / 32 * block_bytes]`.
    pub fn data(&self) -> &Array {
        &self.data
    }
    /// Bytes of packed data.
    pub fn nbytes(&self) -> usize {
        self.data.size()
    }
    /// The device the bytes live on.
    pub fn device(&self) -> Device {
        self.data.device()
    }
}

/// `x @ wᵀ` for `x [..., K]` (f32, bf16 or f16) and a quantized `w` of `N` rows by `K`
/// columns: `[..., N]` in `x`'s dtype, accumulated in f32. The kernels read `w`'s packed
/// blocks and dequantize one block at a time in registers (never the whole matrix).
///
/// The op runs on the target stream (the current [`with_stream`](crate::with_stream)
/// override, else the default stream of `w`'s device); `x` is moved there when it lives
/// elsewhere, but `w` never is: a weight on another device is an error (move it once with
/// [`QMatrix::to_stream`]).
///
/// Errors: `x` not f32/bf16/f16, `x` 0-d, `x`'s last axis not `K`, `w` on another device.
pub fn qmatmul(x: &Array, w: &QMatrix) -> Result<Array> {
    float_dtype(QMATMUL, "x", x.dtype())?;
    if w.data.dtype() != DType::U8 {
        return Err(Error::dtype(QMATMUL, w.data.dtype(), "the packed weight must be u8"));
    }
    if x.shape().last() != Some(&w.cols) {
        return Err(Error::shape(
            QMATMUL,
            format!(
                "x of shape {:?} does not end in the weight's K = {} (weight [N, K] = {:?})",
                x.shape(),
                w.cols,
                w.shape()
            ),
        ));
    }
    let shape = rule::qmatmul(QMATMUL, w.format, x.shape(), w.data.shape())?;
    let dtype = x.dtype();
    checked_size(QMATMUL, &shape, dtype)?;
    let stream = target_stream(&[&w.data, x])?;
    if w.data.device() != stream.device() {
        return Err(Error::invalid(
            QMATMUL,
            format!(
                "the weight lives on {} but the op runs on {}; move it once with QMatrix::to_stream",
                w.data.device(),
                stream.device()
            ),
        ));
    }
    let x = prepare(x, dtype, &stream);
    Ok(Array::from_op(Primitive::QuantMatmul { format: w.format }, vec![x, w.data.clone()], shape, dtype, stream))
}

/// Packed blocks `bytes` (u8 `[..., B * block_bytes]`) as floats `[..., B * 32]` of `dtype`
/// (f32, bf16 or f16), on the bytes' device.
pub fn dequantize_packed(bytes: &Array, format: QuantFormat, dtype: DType) -> Result<Array> {
    float_dtype(DEQUANTIZE, "the output dtype", dtype)?;
    if bytes.dtype() != DType::U8 {
        return Err(Error::dtype(DEQUANTIZE, bytes.dtype(), "packed blocks are a u8 array"));
    }
    let shape = rule::dequantize(DEQUANTIZE, format, bytes.shape())?;
    checked_size(DEQUANTIZE, &shape, dtype)?;
    let stream = target_stream(&[bytes])?;
    let b = on_device(bytes, &stream);
    Ok(Array::from_op(Primitive::Dequantize { format }, vec![b], shape, dtype, stream))
}
