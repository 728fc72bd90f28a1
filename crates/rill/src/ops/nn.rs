//! (filled in by the nn family)
