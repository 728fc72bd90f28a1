//! Reading values back to the host.

use crate::array::Array;
use crate::backend::cpu;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

impl Array {
    fn host_storage(&self) -> Result<crate::backend::Storage> {
        self.eval()?;
        let s = self.node.storage()?;
        if s.cpu().is_some() { Ok(s) } else { cpu::to_host(&s) }
    }
    /// Evaluates and copies the elements out in row-major order. `T` must be the
    /// array's dtype (`u8` or `bool` for bool arrays).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let ok = T::DTYPE == self.dtype() || (self.dtype() == DType::Bool && T::DTYPE == DType::U8);
        if !ok {
            return Err(Error::dtype(
                "to_vec",
                self.dtype(),
                format!("asked for {} values; use astype first or to_f64_vec", T::DTYPE),
            ));
        }
        let s = self.host_storage()?;
        Ok(cpu::strided::contiguous::<T>(&s).into_owned())
    }
    /// Evaluates and copies a bool array out as Rust bools.
    pub fn to_bool_vec(&self) -> Result<Vec<bool>> {
        if self.dtype() != DType::Bool {
            return Err(Error::dtype("to_bool_vec", self.dtype(), "the array is not bool"));
        }
        Ok(self.to_vec::<u8>()?.into_iter().map(|b| b != 0).collect())
    }
    /// Evaluates and copies the elements out as f64, whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let s = self.host_storage()?;
        Ok(cpu::to_f64_vec(&s))
    }
    /// The only element of a one-element array.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::shape(
                "item",
                format!("item() needs exactly one element, the shape is {:?}", self.shape()),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }
    /// The only element of a one-element array, as f64.
    pub fn item_f64(&self) -> Result<f64> {
        if self.size() != 1 {
            return Err(Error::shape(
                "item",
                format!("item() needs exactly one element, the shape is {:?}", self.shape()),
            ));
        }
        Ok(self.to_f64_vec()?[0])
    }
}
