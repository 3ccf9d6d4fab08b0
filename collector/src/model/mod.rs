//! What the collector knows of each MSR at runtime: the live load table
//! (the selection index, SPEC §5), health, call legs (SPEC §9) and the
//! pooled policy's estimate (SPEC §10).
pub mod absent;
pub mod drain;
pub mod estimate;
pub mod health;
pub mod legs;
pub mod load_table;
pub mod overload;
