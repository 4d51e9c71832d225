//! In-process fabric (being built).
