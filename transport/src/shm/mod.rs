//! Shared-memory fabric (being built).
