//! clasp (in progress: not yet wired).
