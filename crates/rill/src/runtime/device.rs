//! Devices and the process-wide default device.

use std::fmt;

use crate::error::Result;
use crate::runtime::stream::Stream;
use crate::sync::Mutex;

/// Kind of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Gpu,
}

/// A device: the CPU, or GPU number `i`. A small `Copy` value; creating one allocates
/// nothing (asking for a GPU initialises its backend once per process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    kind: DeviceKind,
    ordinal: usize,
}

static DEFAULT_DEVICE: Mutex<Device> = Mutex::new(Device { kind: DeviceKind::Cpu, ordinal: 0 });

impl Device {
    /// The host CPU.
    pub const fn cpu() -> Device {
        Device { kind: DeviceKind::Cpu, ordinal: 0 }
    }
    /// GPU number `ordinal`. An error (never a panic) when rill was built without CUDA,
    /// or no driver or no such device is found.
    pub fn gpu(ordinal: usize) -> Result<Device> {
        crate::runtime::lifecycle::check_running()?;
        crate::backend::open_gpu(ordinal)?;
        Ok(Device { kind: DeviceKind::Gpu, ordinal })
    }
    /// GPU 0 when one is usable, else the CPU.
    pub fn best() -> Device {
        Device::gpu(0).unwrap_or(Device::cpu())
    }
    /// Number of usable GPUs (0 without a driver).
    pub fn gpu_count() -> usize {
        crate::backend::gpu_count()
    }
    /// The kind of device.
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }
    /// The device number within its kind (0 for the CPU).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// True for a GPU.
    pub fn is_gpu(&self) -> bool {
        self.kind == DeviceKind::Gpu
    }
    /// The one process-wide default stream of this device, created on first use.
    pub fn default_stream(&self) -> Result<Stream> {
        crate::runtime::stream::default_stream(*self)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => write!(f, "cpu"),
            DeviceKind::Gpu => write!(f, "gpu:{}", self.ordinal),
        }
    }
}

/// The process-wide default device (the CPU unless set). It is the same for every thread
/// and task; use [`crate::with_stream`] or [`crate::WithStream`] to override it in a scope.
pub fn default_device() -> Device {
    *DEFAULT_DEVICE.lock()
}

/// Sets the process-wide default device and returns the previous one.
pub fn set_default_device(device: Device) -> Device {
    std::mem::replace(&mut *DEFAULT_DEVICE.lock(), device)
}
