//! yuma (in progress: not yet wired).
