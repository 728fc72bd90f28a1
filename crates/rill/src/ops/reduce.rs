//! (filled in by the reduce family)
