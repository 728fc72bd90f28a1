//! (filled in by the movement family)
