//! (filled in by the linalg family)
