//! Bootstrap key-value service (being built).
